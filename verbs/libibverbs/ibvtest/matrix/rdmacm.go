package matrix

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// CMProgram is one of rdmacm-utils' programs as a server and its client,
// which find each other through the RDMA CM by the server's address (the
// address of its port, which the CM resolves to the device) and port:
// they take no device and exchange nothing over TCP.
type CMProgram struct {
	// Name is the run's name: the server's program.
	Name string
	// Server and Client are the two command lines, program first;
	// {ADDR} stands for the server's address, {PORT} for its port.
	Server, Client []string
	// ServerStays: the server serves until it is killed (cmtime loops on
	// its events for ever); its end says nothing of the run.
	ServerStays bool
	// Timeout bounds the run.
	Timeout time.Duration

	srvSays, cliSays []string
	cliCount         map[string]int // lines the client must print so many times
	cliNever         []string       // what the client must not print: a connection that failed
}

// CMPrograms returns rdmacm-utils' programs the table runs: rping's 100
// ping-pongs by RDMA READ and WRITE, each verified (-V); ucmatose's RC and
// udaddy's UD (SIDR) data transfers; rdma_server and rdma_client on
// synchronous IDs (rdma_create_ep, rdma_get_request); cmtime's 100
// connections. Each is judged by its exit status and its own report.
func CMPrograms() []CMProgram {
	const t = 60 * time.Second
	return []CMProgram{
		{Name: "rping", Server: []string{"rping", "-s", "-a", "{ADDR}", "-p", "{PORT}", "-C", "100", "-V", "-v"},
			Client:   []string{"rping", "-c", "-a", "{ADDR}", "-p", "{PORT}", "-C", "100", "-V", "-v"},
			cliCount: map[string]int{"ping data: rdma-ping-": 100}, Timeout: t},
		{Name: "ucmatose", Server: []string{"ucmatose", "-p", "{PORT}"}, Client: []string{"ucmatose", "-s", "{ADDR}", "-p", "{PORT}"},
			srvSays: []string{"data transfers complete", "return status 0"}, cliSays: []string{"data transfers complete", "return status 0"}, Timeout: t},
		// udaddy's -p is the port space; it serves on port 7174.
		{Name: "udaddy", Server: []string{"udaddy"}, Client: []string{"udaddy", "-s", "{ADDR}"},
			srvSays: []string{"data transfers complete", "return status 0"}, cliSays: []string{"data transfers complete", "return status 0"}, Timeout: t},
		{Name: "rdma_server", Server: []string{"rdma_server", "-s", "{ADDR}", "-p", "{PORT}"}, Client: []string{"rdma_client", "-s", "{ADDR}", "-p", "{PORT}"},
			srvSays: []string{"rdma_server: end 0"}, cliSays: []string{"rdma_client: end 0"}, Timeout: t},
		{Name: "cmtime", Server: []string{"cmtime", "-b", "{ADDR}", "-p", "{PORT}"}, Client: []string{"cmtime", "-s", "{ADDR}", "-p", "{PORT}", "-c", "100"},
			cliSays: []string{"connect      :", "disconnect   :"}, ServerStays: true, Timeout: t,
			// cmtime counts a connection rejected or unreachable as done
			// and exits 0, printing the event; its table then times
			// nothing of it.
			cliNever: []string{"event: ", "failure "}},
	}
}

// UsesPort reports whether the program takes the port it is given (udaddy
// serves on its fixed port 7174).
func (p CMProgram) UsesPort() bool { return strings.Contains(strings.Join(p.Server, " "), "{PORT}") }

// Commands returns the server's and the client's command lines, program
// first, for a server at addr:port.
func (p CMProgram) Commands(addr string, port int) (server, client []string) {
	r := strings.NewReplacer("{ADDR}", addr, "{PORT}", strconv.Itoa(port))
	sub := func(a []string) []string {
		out := make([]string, len(a))
		for i, x := range a {
			out[i] = r.Replace(x)
		}
		return out
	}
	return sub(p.Server), sub(p.Client)
}

// Judge returns nil when the run passed by the programs' own verdict:
// both exited 0 (a server that stays: killed after its client ended) and
// said what they must.
func (p CMProgram) Judge(srv, cli Result) error {
	var errs []error
	if srv.Err != nil && !p.ServerStays {
		errs = append(errs, fmt.Errorf("server: %w: %s", srv.Err, lastLines(srv.Out, 3)))
	}
	if cli.Err != nil {
		errs = append(errs, fmt.Errorf("client: %w: %s", cli.Err, lastLines(cli.Out, 3)))
	}
	for _, w := range p.cliSays {
		if !strings.Contains(cli.Out, w) {
			errs = append(errs, fmt.Errorf("the client did not say %q: %s", w, lastLines(cli.Out, 3)))
		}
	}
	for _, w := range p.srvSays {
		if !strings.Contains(srv.Out, w) {
			errs = append(errs, fmt.Errorf("the server did not say %q: %s", w, lastLines(srv.Out, 3)))
		}
	}
	for _, w := range p.cliNever {
		if strings.Contains(cli.Out, w) {
			errs = append(errs, fmt.Errorf("the client said %q: %s", w, lastLines(cli.Out, 3)))
		}
	}
	for w, n := range p.cliCount {
		if got := strings.Count(cli.Out, w); got != n {
			errs = append(errs, fmt.Errorf("the client said %q %d times, want %d", w, got, n))
		}
	}
	return errors.Join(errs...)
}

// PerftestCM returns every perftest tool's run with -R between ports like
// p — the connection, and the exchange of addresses and keys, through the
// RDMA CM (perftest connects a first RC QP of its own for the exchange,
// then the test's) — at one size, and the SEND tools' again over UD,
// whose QPs perftest joins through SIDR. Their client names the server's
// port address (Command's host), which the CM resolves; -p is the CM's
// port.
func PerftestCM(p Port) []Run {
	var runs []Run
	add := func(t Tool, o Options) {
		r := perftestRun(t, o, p, p.IPv4GID)
		r.Args, r.CM = append([]string{"-R"}, r.Args...), true
		runs = append(runs, r)
	}
	for _, t := range Tools {
		add(t, t.Combinations()[0])
	}
	for _, t := range Tools {
		if t.Verb == Send {
			add(t, Options{Conn: "UD"})
		}
	}
	return runs
}
