package matrix

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// UCXTool is UCX's perftest and the Debian package that has it.
var UCXTool = Program{Name: "ucx_perftest", Package: "ucx-utils"}

// ucxTransports are the UCX_TLS settings the UCX runs take: RC with UD
// only to set up connections (UCP's wireup needs a transport that reaches
// an interface; "ud_verbs:aux" keeps it from carrying data), and UD alone.
var ucxTransports = []struct{ name, tls string }{
	{"rc_verbs", "rc_verbs,ud_verbs:aux"},
	{"ud_verbs", "ud_verbs"},
}

// UCXRun is one run of UCX 1.13's ucx_perftest: a server and its client,
// which exchange their addresses over TCP (the server's -p port) and run
// one test, either through UCP on the transport UCX_TLS selects or on a
// UCT transport itself. Both sides run through `taproce exec`, which
// gives UCX the /sys/class/infiniband and /dev/infiniband it looks for.
type UCXRun struct {
	// Name reads "rc_verbs/tag_bw", "uct rc_verbs/put_bw -D zcopy".
	Name string
	// UCT: the run drives the UCT transport rc_verbs directly (-x, -d).
	// ucx_perftest's client sends its parameters to the server, the UCT
	// device among them, and the server opens that device, not its own:
	// the run needs a device of the client's name on both sides, as the
	// appliance's two devices in one namespace are, and as two lab
	// namespaces, each with only its own device, are not.
	UCT bool
	// tls is UCX_TLS ("" for UCT runs); lane the transport whose lane
	// the client's log must show on its device ("" for UCT runs, which
	// have no UCP endpoint).
	tls, lane string
	// args are the client's, the test's, which the server takes from
	// it.
	args []string
}

// UCXRuns returns the ucx_perftest runs: over RC and over UD, tag
// matching bandwidth and latency, UCP put bandwidth and get latency, each
// 1000 messages of 4 KiB; and UCT's own RDMA WRITE and READ over rc_verbs,
// 1000 of 64 KiB.
func UCXRuns() []UCXRun {
	var runs []UCXRun
	for _, tr := range ucxTransports {
		for _, test := range []string{"tag_bw", "tag_lat", "ucp_put_bw", "ucp_get"} {
			runs = append(runs, UCXRun{Name: tr.name + "/" + test, tls: tr.tls, lane: tr.name,
				args: []string{"-t", test, "-n", "1000", "-s", "4096"}})
		}
	}
	for _, test := range [][]string{{"put_bw", "-D", "zcopy"}, {"get", "-D", "zcopy"}} {
		runs = append(runs, UCXRun{Name: "uct rc_verbs/" + strings.Join(test, " "), UCT: true,
			args: append(append([]string{"-t"}, test...), "-n", "1000", "-s", "65536")})
	}
	return runs
}

// Env returns the environment of the side on device dev's port 1:
// UCX_TLS and UCX_NET_DEVICES select the transport and the device
// (UCT runs name them with -x and -d instead), UCX_LOG_LEVEL=info has UCX
// log each endpoint's lanes, and UCX_IB_GID_INDEX=0 the GID.
//
// The GID: UCX 1.13 drops every UD packet that arrived over IPv4 on a
// device that does not tell the packet's IP version in the work
// completion's sl (rxe does not, nor does taproce, as rxe): it then
// takes the IPv4 header for an IPv6 one and the destination for a GID of
// nobody's. On rxe as on taproce, its UD (and RC's wireup over UD) works
// with the IPv6 GID, index 0, and times out with the IPv4 one it prefers
// (index 1).
func (r UCXRun) Env(dev string) []string {
	if r.UCT {
		return []string{"UCX_IB_GID_INDEX=0"}
	}
	return []string{"UCX_TLS=" + r.tls, "UCX_NET_DEVICES=" + dev + ":1", "UCX_IB_GID_INDEX=0", "UCX_LOG_LEVEL=info"}
}

// Server returns the server's arguments (after ucx_perftest) on device
// dev, listening on TCP port port.
func (r UCXRun) Server(dev string, port int) []string {
	args := []string{"-p", strconv.Itoa(port)}
	if r.UCT {
		args = append(args, "-x", "rc_verbs", "-d", dev+":1")
	}
	return args
}

// Client returns the client's arguments (after ucx_perftest) on device
// dev, connecting to the server at host, port port (host "": the caller
// appends it).
func (r UCXRun) Client(dev string, port int, host string) []string {
	args := append(r.Server(dev, port), r.args...)
	if host != "" {
		args = append(args, host)
	}
	return args
}

// Judge returns nil when the run passed by ucx_perftest's own verdict —
// both sides exited 0, the client printed its "Final:" line — and, from
// UCX's log, the client's endpoint has a lane of the transport asked for
// on the client's device (cli.Device).
func (r UCXRun) Judge(srv, cli Result) error {
	var errs []error
	if srv.Err != nil {
		errs = append(errs, fmt.Errorf("server: %w: %s", srv.Err, lastLines(srv.Out, 3)))
	}
	if cli.Err != nil {
		errs = append(errs, fmt.Errorf("client: %w: %s", cli.Err, lastLines(cli.Out, 3)))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if !strings.Contains(cli.Out, "\nFinal: ") {
		errs = append(errs, fmt.Errorf("the client printed no final result: %s", lastLines(cli.Out, 3)))
	}
	if lane := "(" + r.lane + "/" + cli.Device + ":1)"; r.lane != "" && !strings.Contains(cli.Out, lane) {
		errs = append(errs, fmt.Errorf("the client's log shows no lane %s", lane))
	}
	return errors.Join(errs...)
}
