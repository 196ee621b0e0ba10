// Package matrix is the one table of the unmodified Debian programs that
// taproce's libibverbs.so.1 is tested with: rdma-core's ibv_devices,
// ibv_devinfo and four pingpong examples, and every perftest 4.5 tool with
// every option of the matrix it accepts. The table is generated, not
// listed: perftest's runs are the cross product of its tools, connection
// types, atomic operations and modes, less what perftest's own parser
// refuses (Refusal, which a test checks against the binaries), and each
// tool once more at every other GID the ports have; the pingpong runs
// are each tool at every GID index and size the ports offer. Each run
// carries its verdict, read from the programs' own exit statuses and
// output (Judge). Beside it are rdmacm-utils' programs and perftest with
// -R (CMPrograms, PerftestCM), and UCX's ucx_perftest (UCXRuns).
//
// Two places run the table: verbs/libibverbs/ibvtest between the two
// devices of an in-process appliance on a fake wire (no root needed), and
// internal/lab between two lab namespaces over TAPs and a veth (as root).
package matrix

import (
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Run is one run of a Debian program: a server and its client (Pair), or
// one program on its own.
type Run struct {
	// Tool is the program, as Debian installs it on the PATH.
	Tool string
	// Package is the Debian package that has it (scripts/setup installs
	// it).
	Package string
	// Args are the arguments both sides take, besides the device, the
	// TCP port and the client's host (Command adds those).
	Args []string
	// Pair: a server and a client that connects to it; else one program.
	Pair bool
	// CM: the pair connects through the RDMA CM (perftest's -R): the
	// client's host is the server's port address, which the CM resolves,
	// and the server is ready once its CM listens, not a TCP socket.
	CM bool
	// Timeout bounds the run; the programs are killed after it.
	Timeout time.Duration
	// check reads the verdict from both sides' output, the exit statuses
	// being zero.
	check func(srv, cli Result) error
}

// Name reads as the command line without the device, port and host:
// "ib_write_bw -x 1 -F -c UC -q 4 -s 65536 -n 100".
func (r Run) Name() string { return strings.Join(append([]string{r.Tool}, r.Args...), " ") }

// Command returns the arguments (after the program's name) of the side
// on device dev: listening on, or connecting to, TCP port port (0: the
// program's default, 18515), and for a client the server's host.
// ibv_devices takes no device.
func (r Run) Command(dev string, port int, host string) []string {
	var args []string
	if r.Tool != "ibv_devices" {
		args = append(args, "-d", dev)
	}
	if r.Pair && port != 0 {
		args = append(args, "-p", strconv.Itoa(port))
	}
	args = append(args, r.Args...)
	if r.Pair && host != "" {
		args = append(args, host)
	}
	return args
}

// Result is how one side of a run ended.
type Result struct {
	// Device is the device the side ran on.
	Device string
	// Out is its standard output and error.
	Out string
	// Err is its exit (nil: status 0).
	Err error
}

// Judge returns nil when the run passed by the programs' own verdict:
// every side exited 0 and printed what the run expects of it. For a
// single program only cli counts.
func (r Run) Judge(srv, cli Result) error {
	var errs []error
	if r.Pair && srv.Err != nil {
		errs = append(errs, fmt.Errorf("server: %w: %s", srv.Err, lastLines(srv.Out, 3)))
	}
	if cli.Err != nil {
		errs = append(errs, fmt.Errorf("client: %w: %s", cli.Err, lastLines(cli.Out, 3)))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return r.check(srv, cli)
}

// lastLines returns the last n non-empty lines of s, joined by " | ".
func lastLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "-----") {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Program is one of Debian's programs the table runs.
type Program struct {
	Name    string
	Package string // the Debian package that has it
}

// Programs returns every program the table runs.
func Programs() []Program {
	var ps []Program
	for _, r := range Info() {
		ps = append(ps, Program{r.Tool, r.Package})
	}
	for _, t := range pingpongTools {
		ps = append(ps, Program{t.name, "ibverbs-utils"})
	}
	for _, t := range Tools {
		ps = append(ps, Program{t.Name(), "perftest"})
	}
	seen := map[string]bool{}
	for _, p := range CMPrograms() {
		for _, side := range [][]string{p.Server, p.Client} {
			if !seen[side[0]] {
				seen[side[0]] = true
				ps = append(ps, Program{side[0], "rdmacm-utils"})
			}
		}
	}
	return ps
}

// NeedPrograms skips the test unless every program of the table is on
// the PATH, naming the first missing one and its package.
func NeedPrograms(t testing.TB) {
	t.Helper()
	for _, p := range Programs() {
		if _, err := exec.LookPath(p.Name); err != nil {
			t.Skipf("needs Debian's %s (%s; scripts/setup installs it): %v", p.Name, p.Package, err)
		}
	}
}

// Port is what the table needs to know of the ports the programs run
// between, as ibv_devinfo -v reports them (ParseDevinfo).
type Port struct {
	// GIDs are the indices of the GID table's entries in use.
	GIDs []int
	// IPv4GID is the index of the IPv4 GID (::ffff:a.b.c.d), which
	// perftest's runs use (-x).
	IPv4GID int
	// ActiveMTU is the port's active MTU in bytes: a UD message's
	// largest size.
	ActiveMTU int
}

var (
	gidRe = regexp.MustCompile(`(?m)^\s*GID\[\s*(\d+)\]:\s+(\S+?),\s+(.+)$`)
	mtuRe = regexp.MustCompile(`(?m)^\s*active_mtu:\s+(\d+) \(\d+\)`)
)

// ParseDevinfo reads a port's GIDs and active MTU from ibv_devinfo -v's
// output for one device.
func ParseDevinfo(out string) (Port, error) {
	p := Port{IPv4GID: -1}
	for _, m := range gidRe.FindAllStringSubmatch(out, -1) {
		i, _ := strconv.Atoi(m[1])
		p.GIDs = append(p.GIDs, i)
		if strings.HasPrefix(m[2], "::ffff:") && p.IPv4GID < 0 {
			p.IPv4GID = i
		}
	}
	m := mtuRe.FindStringSubmatch(out)
	if m == nil || len(p.GIDs) == 0 || p.IPv4GID < 0 {
		return p, fmt.Errorf("matrix: no active_mtu, GIDs or IPv4 GID in ibv_devinfo -v's output:\n%s", out)
	}
	p.ActiveMTU, _ = strconv.Atoi(m[1])
	return p, nil
}

// Info returns the runs of rdma-core's device tools, one program on its
// own: ibv_devices lists the device, ibv_devinfo -v reports it as rxe
// reports its own (an active Ethernet port whose GIDs are RoCE v2).
func Info() []Run {
	return []Run{
		{Tool: "ibv_devices", Package: "ibverbs-utils", Timeout: 30 * time.Second, check: checkDevices},
		{Tool: "ibv_devinfo", Package: "ibverbs-utils", Args: []string{"-v"}, Timeout: 30 * time.Second, check: checkDevinfo},
	}
}

func checkDevices(_, cli Result) error {
	for _, line := range strings.Split(cli.Out, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == cli.Device && len(f[1]) == 16 {
			return nil
		}
	}
	return fmt.Errorf("ibv_devices does not list %s with its GUID:\n%s", cli.Device, cli.Out)
}

func checkDevinfo(_, cli Result) error {
	for _, want := range []string{"hca_id:\t" + cli.Device + "\n", "transport:\t\t\tInfiniBand (0)", "state:\t\t\tPORT_ACTIVE (4)", "link_layer:\t\tEthernet"} {
		if !strings.Contains(cli.Out, want) {
			return fmt.Errorf("ibv_devinfo -v lacks %q:\n%s", want, cli.Out)
		}
	}
	gids := gidRe.FindAllStringSubmatch(cli.Out, -1)
	if len(gids) == 0 {
		return fmt.Errorf("ibv_devinfo -v lists no GID:\n%s", cli.Out)
	}
	for _, g := range gids {
		if g[3] != "RoCE v2" {
			return fmt.Errorf("GID %s is %q, want RoCE v2:\n%s", g[1], g[3], cli.Out)
		}
	}
	_, err := ParseDevinfo(cli.Out)
	return err
}

// pingpongTool is one of rdma-core's pingpong examples and what of its
// options the table varies.
type pingpongTool struct {
	name string
	// ud: its message may be no larger than the active MTU, and 2048
	// (its default) may be too large.
	ud bool
	// flags are its options besides -g, -s, -n and -c, each run once on
	// its own.
	flags []string
}

var pingpongTools = []pingpongTool{
	{name: "ibv_rc_pingpong", flags: []string{"-e", "-N"}},
	{name: "ibv_uc_pingpong", flags: []string{"-e"}},
	{name: "ibv_ud_pingpong", ud: true, flags: []string{"-e"}},
	{name: "ibv_srq_pingpong", flags: []string{"-e"}},
}

// pingpongIters is each pingpong run's -n.
const pingpongIters = 100

// Pingpong returns the runs of rdma-core's pingpong examples between
// ports like p: each tool at every GID index the port has and at a small,
// the default and a large message (UD: a small and the active MTU's),
// and with each of its other options (-e: sleep on completion events; -N,
// ibv_rc_pingpong's work request API) at the IPv4 GID and the default
// size; every run checking what it received (-c).
func Pingpong(p Port) []Run {
	var runs []Run
	for _, t := range pingpongTools {
		sizes := []int{1, 4096, 65536}
		def := 4096
		if t.ud {
			sizes, def = []int{1, p.ActiveMTU}, p.ActiveMTU
		}
		add := func(gid, size int, flag ...string) {
			args := append([]string{"-g", strconv.Itoa(gid), "-s", strconv.Itoa(size), "-n", strconv.Itoa(pingpongIters), "-c"}, flag...)
			runs = append(runs, Run{Tool: t.name, Package: "ibverbs-utils", Args: args, Pair: true, Timeout: 60 * time.Second,
				check: checkPingpong(size, pingpongIters)})
		}
		for _, gid := range p.GIDs {
			for _, size := range sizes {
				add(gid, size)
			}
		}
		for _, f := range t.flags {
			add(p.IPv4GID, def, f)
		}
	}
	return runs
}

var (
	itersRe = regexp.MustCompile(`(?m)^(\d+) iters in [0-9.]+ seconds = [0-9.]+ usec/iter$`)
	bytesRe = regexp.MustCompile(`(?m)^(\d+) bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec$`)
)

// checkPingpong: both sides print their result lines, for the bytes and
// iterations asked for, and neither reports invalid data (-c prints
// "invalid data in page N" and still exits 0). ibv_srq_pingpong counts
// the exchanges of all its QPs; the others size × iterations × 2 bytes.
func checkPingpong(size, iters int) func(srv, cli Result) error {
	return func(srv, cli Result) error {
		for _, side := range []struct {
			name string
			r    Result
		}{{"server", srv}, {"client", cli}} {
			out := side.r.Out
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "invalid data") {
					return fmt.Errorf("%s: %s", side.name, strings.TrimSpace(line))
				}
			}
			m, b := itersRe.FindStringSubmatch(out), bytesRe.FindStringSubmatch(out)
			if m == nil || b == nil {
				return fmt.Errorf("%s: no result lines: %s", side.name, lastLines(out, 3))
			}
			n, _ := strconv.Atoi(m[1])
			nb, _ := strconv.Atoi(b[1])
			if n < iters || n%iters != 0 || nb != 2*size*n {
				return fmt.Errorf("%s: %d iters, %d bytes, want %d iters (or a multiple) of %d bytes each way: %s", side.name, n, nb, iters, size, m[0])
			}
		}
		return nil
	}
}
