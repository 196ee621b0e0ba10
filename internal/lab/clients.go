package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/internal/cpulist"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/tap"
	"github.com/taproce/taproce/verbs/abi"
)

// The lab's verbs steps run the taproce binary as separate client
// processes inside the host namespaces, as applications would run, each
// talking to the lab's appliance through its control socket.

// client is a client process in a host's namespace.
type client struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	mu   sync.Mutex
	done chan error
}

// startClient runs `binary args...` in host h's namespace with the lab's
// socket.
func (l *Lab) startClient(ctx context.Context, binary string, h *Host, args ...string) (*client, error) {
	return l.startClientEnv(ctx, append(os.Environ(), "TAPROCE_SOCKET="+l.Socket), binary, h, args...)
}

// startClientEnv runs `binary args...` in host h's namespace with the
// environment env.
func (l *Lab) startClientEnv(ctx context.Context, env []string, binary string, h *Host, args ...string) (*client, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.Namespace, binary}, args...)...)
	cmd.Env = env
	c, err := runClient(cmd, l.clientCPUs)
	if err != nil {
		return nil, fmt.Errorf("lab: %s %s: %w", binary, strings.Join(args, " "), err)
	}
	return c, nil
}

// runClient starts cmd on the processors cpus holds (nil: anywhere),
// collecting its output, killed if this process dies.
func runClient(cmd *exec.Cmd, cpus *cpulist.Set) (*client, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c := &client{cmd: cmd, done: make(chan error, 1)}
	cmd.Stdout = &lockedWriter{c: c}
	cmd.Stderr = &lockedWriter{c: c}
	if err := startOn(cmd, cpus); err != nil {
		return nil, err
	}
	go func() { c.done <- cmd.Wait() }()
	return c, nil
}

// startOn starts cmd on the processors cpus holds (nil: where this
// process runs): it forks from a thread pinned to them for the moment,
// and a new process inherits its parent thread's mask.
func startOn(cmd *exec.Cmd, cpus *cpulist.Set) error {
	if cpus == nil {
		return cmd.Start()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var prev cpulist.Set
	if err := unix.SchedGetaffinity(0, &prev); err != nil {
		return fmt.Errorf("lab: sched_getaffinity: %w", err)
	}
	if err := unix.SchedSetaffinity(0, cpus); err != nil {
		return fmt.Errorf("lab: run a client on processors %s: %w", cpulist.Format(*cpus), err)
	}
	err := cmd.Start()
	if rerr := unix.SchedSetaffinity(0, &prev); rerr != nil {
		return errors.Join(err, fmt.Errorf("lab: sched_setaffinity: %w", rerr))
	}
	return err
}

type lockedWriter struct{ c *client }

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	return w.c.out.Write(p)
}

// output returns what the client printed so far.
func (c *client) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// wait waits for the client to end, killing it after timeout.
func (c *client) wait(timeout time.Duration) error {
	select {
	case err := <-c.done:
		return err
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill() // by PID, the one this lab started
		<-c.done
		return fmt.Errorf("no end after %v", timeout)
	}
}

// waitListen waits until something listens on TCP port port in the
// network namespace ns (the client is a server there), or the client
// ends, or timeout passes.
func (c *client) waitListen(ns string, port int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if ok, err := netnsutil.Listening(netnsutil.Path(ns), port); err != nil {
			return fmt.Errorf("lab: %w", err)
		} else if ok {
			return nil
		}
		select {
		case err := <-c.done:
			c.done <- err
			return fmt.Errorf("ended before it listened on port %d (%v)", port, err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening on port %d after %v", port, timeout)
		}
	}
}

// lastLine returns the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// exchangePort is the TCP port on which the `taproce pingpong` and
// `taproce perf` servers the lab runs listen for their out-of-band
// exchange: both tools' default, perftest's and ibv_rc_pingpong's 18515.
const exchangePort = 18515

// serverStart is how long pair waits for a server to listen.
const serverStart = 20 * time.Second

// pair runs a server in host b — the taproce pingpong or perf server,
// listening on TCP port port for its out-of-band exchange — and, once it
// listens, a client in host a that connects to b's kernel address; it
// returns both outputs. A server whose client failed is stopped at once.
func (l *Lab) pair(ctx context.Context, binary string, a, b *Host, server, clientArgs []string, port int, timeout time.Duration) (srvOut, cliOut string, err error) {
	return l.pairEnv(ctx, append(os.Environ(), "TAPROCE_SOCKET="+l.Socket), binary, a, b, server, clientArgs, port, timeout)
}

// pairEnv is pair with the environment env for both processes.
func (l *Lab) pairEnv(ctx context.Context, env []string, binary string, a, b *Host, server, clientArgs []string, port int, timeout time.Duration) (srvOut, cliOut string, err error) {
	return l.pairEnvs(ctx, env, env, binary, a, b, server, clientArgs, port, timeout)
}

// pairEnvs is pair with the environment srvEnv for the server, cliEnv
// for the client.
func (l *Lab) pairEnvs(ctx context.Context, srvEnv, cliEnv []string, binary string, a, b *Host, server, clientArgs []string, port int, timeout time.Duration) (srvOut, cliOut string, err error) {
	srv, err := l.startClientEnv(ctx, srvEnv, binary, b, server...)
	if err != nil {
		return "", "", err
	}
	if err := srv.waitListen(b.Namespace, port, serverStart); err != nil {
		_ = srv.wait(time.Millisecond)
		return srv.output(), "", fmt.Errorf("server did not start: %w: %s", err, lastLine(srv.output()))
	}
	cli, err := l.startClientEnv(ctx, cliEnv, binary, a, append(clientArgs, b.KernelAddrs[0].Addr().String())...)
	if err != nil {
		_ = srv.wait(time.Millisecond)
		return srv.output(), "", err
	}
	cerr := cli.wait(timeout)
	srvTimeout := timeout
	if cerr != nil {
		srvTimeout = time.Second // it may wait for a client that is gone
	}
	serr := srv.wait(srvTimeout)
	if cerr != nil {
		return srv.output(), cli.output(), fmt.Errorf("client: %w: %s", cerr, lastLine(cli.output()))
	}
	if serr != nil {
		return srv.output(), cli.output(), fmt.Errorf("server: %w: %s", serr, lastLine(srv.output()))
	}
	return srv.output(), cli.output(), nil
}

var itersRe = regexp.MustCompile(`(\d+) iters in ([0-9.]+) seconds = ([0-9.]+) usec/iter`)
var bytesRe = regexp.MustCompile(`(\d+) bytes in ([0-9.]+) seconds = ([0-9.]+) Mbit/sec`)

// verbsSteps runs the lab's client processes between the first two hosts:
// each lists its device, then RC and UD pingpong as ibv_rc_pingpong and
// ibv_ud_pingpong run them — UD, under the lab's faults, waiting a bounded
// time for each datagram and counting the lost ones, as UD never
// retransmits one.
func verbsSteps(ctx context.Context, l *Lab, binary string) []Step {
	a, b := l.Hosts[0], l.Hosts[1]
	var steps []Step
	for _, h := range []*Host{a, b} {
		start := time.Now()
		c, err := l.startClient(ctx, binary, h, "devices")
		s := Step{Name: fmt.Sprintf("verbs client in %s lists its device", h.Namespace)}
		if err == nil {
			err = c.wait(10 * time.Second)
			out := c.output()
			s.OK = err == nil && strings.Contains(out, h.Device)
			s.Detail = strings.Join(strings.Fields(lastLine(out)), " ")
		}
		if err != nil {
			s.Detail = err.Error()
		}
		s.Took = time.Since(start)
		steps = append(steps, s)
	}
	steps = append(steps, l.pingpongStep(ctx, binary, "RC pingpong (ibv_rc_pingpong's protocol)",
		[]string{"-g", "1", "-n", "1000", "-s", "4096", "-c"}, false))
	ud := []string{"-t", "ud", "-g", "1", "-n", "1000", "-s", "1024"}
	if l.faults.what == "" {
		steps = append(steps, l.pingpongStep(ctx, binary, "UD pingpong (ibv_ud_pingpong's protocol)", ud, false))
	} else {
		wait := l.faults.udWait()
		steps = append(steps, l.pingpongStep(ctx, binary,
			fmt.Sprintf("UD pingpong (ibv_ud_pingpong's protocol, %v for each datagram)", wait),
			append(ud, "--timeout", fmt.Sprint(wait.Milliseconds())), true))
	}
	return steps
}

// udWait is how long the lab's UD pingpong waits for each datagram under
// faults before it counts it as lost: far longer than a round trip of
// the lab's (well under a millisecond, and the impairment's delay at the
// four ports a round trip crosses).
func (f faults) udWait() time.Duration { return 50*time.Millisecond + 4*f.delay }

var datagramsRe = regexp.MustCompile(`(?m)^datagrams: (\d+) sent, (\d+) received, (\d+) lost`)

// pingpongStep runs `taproce pingpong args` between the first two hosts
// and reports its result line; with counted, a bounded UD pingpong
// (--timeout), also the datagrams of both sides, sent and lost.
func (l *Lab) pingpongStep(ctx context.Context, binary, name string, args []string, counted bool) Step {
	a, b := l.Hosts[0], l.Hosts[1]
	start := time.Now()
	srvArgs := append([]string{"pingpong", "-d", b.Device}, args...)
	cliArgs := append([]string{"pingpong", "-d", a.Device}, args...)
	srvOut, out, err := l.pair(ctx, binary, a, b, srvArgs, cliArgs, exchangePort, 60*time.Second)
	s := Step{Name: fmt.Sprintf("%s %s → %s", name, a.Namespace, b.Namespace), Took: time.Since(start)}
	m, n := itersRe.FindStringSubmatch(out), bytesRe.FindStringSubmatch(out)
	switch {
	case err != nil:
		s.Detail = err.Error()
		return s
	case m == nil || n == nil:
		s.Detail = "no result line: " + lastLine(out)
		return s
	}
	s.OK = true
	s.Detail = fmt.Sprintf("%s iters, %s µs/iter, %s Mbit/s", m[1], m[3], n[3])
	if !counted {
		return s
	}
	d, ok := parseDatagrams(srvOut, out)
	if !ok {
		s.OK = false
		s.Detail += "; no datagrams line: " + lastLine(srvOut) + " | " + lastLine(out)
		return s
	}
	s.Detail += "; " + d.String() + " (" + l.faults.what + ")"
	// Whatever arrives counts, as long as the loss is what the faults
	// explain: at least 90 % of what they let through, as the exchange.
	s.OK = float64(d.received) >= 0.9*l.faults.delivery*float64(d.sent)
	return s
}

// datagrams counts a bounded UD pingpong's datagrams, both sides
// together.
type datagrams struct{ sent, received int }

// String reads "1968 of 1990 datagrams, 22 lost".
func (d datagrams) String() string {
	return fmt.Sprintf("%d of %d datagrams, %d lost", d.received, d.sent, d.sent-d.received)
}

// parseDatagrams adds up the datagrams lines of a bounded UD pingpong's
// two sides; every datagram one side sent and the other did not count
// was lost (or later than the wait).
func parseDatagrams(outs ...string) (datagrams, bool) {
	var d datagrams
	for _, out := range outs {
		m := datagramsRe.FindStringSubmatch(out)
		if m == nil {
			return d, false
		}
		sent, _ := strconv.Atoi(m[1])
		received, _ := strconv.Atoi(m[2])
		d.sent += sent
		d.received += received
	}
	return d, true
}

// executable returns the taproce executable the lab's client
// processes run: binary unless it is "" or "-" (none), this process's own
// otherwise (which is taproce outside tests).
func executable(binary string) (string, error) {
	if binary != "" && binary != "-" {
		return binary, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("lab: the taproce binary: %w", err)
	}
	return self, nil
}

// appPlace runs the lab's process on the processors its appliance takes
// — CPUs, and as many at once as Procs and Poll choose (appliance.Place),
// as `taproce run` runs the appliance — until the returned function puts
// it back. The appliance shares the lab's process, so only the phases
// where clients use it apply it.
func (l *Lab) appPlace() (restore func(), err error) {
	r, err := appliance.Place(l.Poll, l.Procs, l.CPUs)
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	return func() {
		if err := r(); err != nil {
			l.Logger.Warn("lab: putting the process back on its processors", "err", err)
		}
	}, nil
}

// serveClients serves the lab's appliance on its control socket while the
// client processes run the verbs checks and the perf runs (binary "-":
// none), then Debian's programs on taproce's libibverbs.so.1 (found as
// findLibrary says, libDir naming its directory), on the processors the
// appliance takes, and keeps serving until stop is called, so that a lab
// left up (--keep) takes clients of its own. The placement ends with the
// runs.
func (l *Lab) serveClients(ctx context.Context, binary, libDir string) (steps []Step, stop func()) {
	stop = func() {}
	if binary == "" {
		var err error
		if binary, err = executable(""); err != nil {
			return []Step{{Name: "verbs clients", Detail: err.Error()}}, stop
		}
	}
	if err := l.App.Control().Listen(); err != nil {
		return []Step{{Name: "verbs clients: control socket " + l.Socket, Detail: err.Error()}}, stop
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- l.App.Serve(sctx) }()
	stop = func() { cancel(); <-done }
	if binary == "-" {
		return nil, stop
	}
	restore, err := l.appPlace()
	if err != nil {
		return []Step{{Name: "verbs clients: the appliance's processors", Detail: err.Error()}}, stop
	}
	defer restore()
	steps = verbsSteps(ctx, l, binary)
	lib, s := findLibrary(ctx, libDir, binary)
	l.lib = lib
	steps = append(steps, s, l.debianPingpong(ctx, lib))
	l.perfConf = l.currentConfig()
	ps, rows := perfSteps(ctx, l, binary)
	ds, drows := l.debianPerfSteps(ctx, lib)
	l.perf = withDebian(rows, drows)
	return append(append(steps, ps...), ds...), stop
}

// perfConfig is the configuration the lab's perf runs ran in. The perf
// table states it because the figures depend on it as much as on the
// code: the MTU alone sets how many packets, and so TAP writes, a
// message takes.
type perfConfig struct {
	mtu, pathMTU int
	superFrames  bool
	poll         appliance.PollMode
	// procs is how many processors the appliance ran on (GOMAXPROCS),
	// cpus which ones ("": any).
	procs       int
	cpus        string
	localSwitch bool
	// faults names the faults on the links ("" for none).
	faults string
}

// currentConfig returns the configuration the appliance runs in now.
func (l *Lab) currentConfig() perfConfig {
	offloaded := false
	if t, ok := l.Hosts[0].Port.Device().(*tap.Tap); ok {
		offloaded = t.Offloaded()
	}
	return perfConfig{
		mtu: l.MTU, pathMTU: abi.MTUForNetdev(l.MTU).Bytes(), superFrames: offloaded,
		poll: l.Poll, procs: runtime.GOMAXPROCS(0), cpus: l.CPUs, localSwitch: l.LocalSwitch, faults: l.faults.what,
	}
}

// measuredMTU is the MTU of the configuration the performance figures
// are measured in (scripts/bench, BenchmarkLabSpeed: Speed), with
// super-frames and the lab's default poll mode, processors and wire.
const measuredMTU = 9000

// onOff spells a setting.
func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// String reads "MTU 1500 (RoCE path MTU 1024), super-frames on, poll
// adaptive, appliance on 2 processors, local switch off".
func (c perfConfig) String() string {
	where := fmt.Sprintf("appliance on %d processors", c.procs)
	if c.procs == 1 {
		where = "appliance on 1 processor"
	}
	if c.cpus != "" {
		where += fmt.Sprintf(" (cpus %s, the clients on the others)", c.cpus)
	}
	s := fmt.Sprintf("MTU %d (RoCE path MTU %d), super-frames %s, poll %v, %s, local switch %s",
		c.mtu, c.pathMTU, onOff(c.superFrames), c.poll, where, onOff(c.localSwitch))
	if c.faults != "" {
		s += ", " + c.faults
	}
	return s
}

// notes says why the figures of this configuration differ from the
// measured ones, if they may: one sentence per difference.
func (c perfConfig) notes() []string {
	var n []string
	if c.mtu < measuredMTU || !c.superFrames {
		n = append(n, fmt.Sprintf("At MTU %d a 64 KiB message is %d RoCE packets of %d bytes, where TCP over the same veth hands the kernel 64 KiB at a time (GSO/GRO): the bandwidth figures are not the measured ones, which are at MTU %d with super-frames (write_bw about 1.0x TCP or more, scripts/bench). Run taproce lab --mtu %d for them.",
			c.mtu, (65536+c.pathMTU-1)/c.pathMTU, c.pathMTU, measuredMTU, measuredMTU))
	}
	if c.localSwitch {
		n = append(n, "With --local-switch the ports' traffic crossed in memory, not the veth that TCP crossed.")
	}
	if c.faults != "" {
		n = append(n, fmt.Sprintf("Under the lab's faults (%s) the figures measure retransmission, not the path.", c.faults))
	}
	return n
}

// perfRun is one `taproce perf` run of the lab: a test at a message size.
type perfRun struct {
	test  string
	size  int
	iters int
}

// perfRow is what the lab's perftest-style table shows of a run.
type perfRow struct {
	run perfRun
	// like, for a row of one of Debian's perftest programs, is the
	// taproce perf test it runs like; notRun says that it could not run
	// here (detail says why).
	like   string
	notRun bool
	ok     bool
	bw     float64 // MB/sec (2^20 bytes), bandwidth tests
	rate   float64 // Mpps
	lat    float64 // typical (median) µs, latency tests
	detail string
}

// labPerfRuns are the perftest runs of the lab, between the first two
// hosts' client processes.
var labPerfRuns = []perfRun{
	{"write_bw", 65536, 2000}, {"read_bw", 65536, 2000}, {"send_bw", 65536, 2000},
	{"atomic_bw", 8, 2000}, {"send_lat", 2, 1000}, {"write_lat", 2, 1000}, {"read_lat", 2, 1000},
}

// perfSteps runs taproce perf server and client processes for each of
// labPerfRuns and returns a step per run plus the table's rows.
func perfSteps(ctx context.Context, l *Lab, binary string) ([]Step, []perfRow) {
	a, b := l.Hosts[0], l.Hosts[1]
	var steps []Step
	var rows []perfRow
	for _, r := range labPerfRuns {
		start := time.Now()
		row := l.perfPair(ctx, binary, r)
		s := Step{Name: fmt.Sprintf("perf %s %d B %s → %s", r.test, r.size, a.Namespace, b.Namespace), OK: row.ok, Took: time.Since(start), Detail: row.detail}
		steps = append(steps, s)
		rows = append(rows, row)
	}
	return steps, rows
}

// perfPair runs r between the first two hosts — a `taproce perf` server in
// the second, its client in the first — and returns the client's figures;
// a run that failed has ok false and says why in detail.
func (l *Lab) perfPair(ctx context.Context, binary string, r perfRun) perfRow {
	a, b := l.Hosts[0], l.Hosts[1]
	args := []string{"perf", r.test, "-x", "1", "-s", fmt.Sprint(r.size), "-n", fmt.Sprint(r.iters), "--json"}
	srv := append(append([]string{}, args...), "-d", b.Device)
	cli := append(append([]string{}, args...), "-d", a.Device)
	_, out, err := l.pair(ctx, binary, a, b, srv, cli, exchangePort, 120*time.Second)
	row := perfRow{run: r}
	if err != nil {
		row.detail = err.Error()
		return row
	}
	row.ok, row.bw, row.rate, row.lat, row.detail = parsePerfJSON(out)
	return row
}

// parsePerfJSON reads the client's --json line.
func parsePerfJSON(out string) (ok bool, bw, rate, lat float64, detail string) {
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var r struct {
			Iters uint64 `json:"iterations"`
			BW    *struct {
				Avg     float64 `json:"average"`
				MsgRate float64 `json:"msg_rate_mpps"`
				Unit    string  `json:"unit"`
			} `json:"bw"`
			Lat *struct {
				Typical float64 `json:"t_typical_usec"`
				Avg     float64 `json:"t_avg_usec"`
			} `json:"lat"`
		}
		if json.Unmarshal([]byte(line), &r) != nil || r.Iters == 0 {
			continue
		}
		switch {
		case r.BW != nil:
			return true, r.BW.Avg, r.BW.MsgRate, 0, fmt.Sprintf("%d iterations, %.2f %s, %.4f Mpps", r.Iters, r.BW.Avg, r.BW.Unit, r.BW.MsgRate)
		case r.Lat != nil:
			return true, 0, 0, r.Lat.Typical, fmt.Sprintf("%d iterations, typical %.2f µs, average %.2f µs", r.Iters, r.Lat.Typical, r.Lat.Avg)
		}
	}
	return false, 0, 0, 0, "no result: " + lastLine(out)
}

// tcpRuns is how many runs of TCP over the lab's veth the perf table's
// baseline is the median of: single runs swing by a factor of two on a
// small machine, as Speed (SpeedOptions.TCPRuns) found.
const tcpRuns = 5

// printPerf prints the perftest-style table of the lab's runs, with the
// configuration they ran in and TCP over the same veth, measured in the
// same run, as the baseline; then why its figures may differ from the
// measured ones.
func printPerf(w io.Writer, rows []perfRow, tcp float64, conf perfConfig) {
	if len(rows) == 0 {
		return
	}
	const rule = "---------------------------------------------------------------------------------------"
	fmt.Fprintln(w, "\n"+rule)
	title := " taproce perf between the lab's client processes (perftest's columns; 1 MB = 2^20 bytes)"
	if slices.ContainsFunc(rows, func(r perfRow) bool { return r.like != "" }) {
		title = " taproce perf, and Debian's perftest (ib_*) on taproce's libibverbs, between the lab's\n client processes (perftest's columns; 1 MB = 2^20 bytes)"
	}
	fmt.Fprintln(w, title)
	fmt.Fprintln(w, wrap("at "+conf.String(), len(rule)))
	fmt.Fprintln(w, rule)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, " test\t#bytes\t#iterations\tBW average[MB/sec]\tMsgRate[Mpps]\tt_typical[usec]\t")
	for _, r := range rows {
		if r.notRun {
			fmt.Fprintf(tw, " %s\t%d\t%d\tnot run\t\t\t\n", r.run.test, r.run.size, r.run.iters)
			continue
		}
		if !r.ok {
			fmt.Fprintf(tw, " %s\t%d\t%d\tFAILED\t\t\t\n", r.run.test, r.run.size, r.run.iters)
			continue
		}
		if r.lat > 0 {
			fmt.Fprintf(tw, " %s\t%d\t%d\t\t\t%.2f\t\n", r.run.test, r.run.size, r.run.iters, r.lat)
			continue
		}
		fmt.Fprintf(tw, " %s\t%d\t%d\t%.2f\t%.6f\t\t\n", r.run.test, r.run.size, r.run.iters, r.bw, r.rate)
	}
	if tcp > 0 {
		fmt.Fprintf(tw, " TCP (same veth, median of %d)\t\t\t%.2f\t\t\t\n", tcpRuns, tcp/(1<<20))
	}
	tw.Flush()
	fmt.Fprintln(w, rule)
	for _, n := range append(debianNotes(rows), conf.notes()...) {
		fmt.Fprintln(w, wrap(n, len(rule)))
	}
}

// debianNotes says what the rows of Debian's programs are, and why those
// that did not run did not.
func debianNotes(rows []perfRow) []string {
	var ran []string
	var notes []string
	for _, r := range rows {
		switch {
		case r.like == "":
		case r.notRun:
			notes = append(notes, r.run.test+": "+r.detail+".")
		default:
			ran = append(ran, fmt.Sprintf("%s (as %s)", r.run.test, r.like))
		}
	}
	if len(ran) > 0 {
		notes = append([]string{"Debian's " + strings.Join(ran, ", ") + " ran unmodified on taproce's libibverbs.so.1, each in the row after the taproce perf test of the same size and iterations."}, notes...)
	}
	return notes
}

// wrap breaks s into lines of at most width characters at spaces, each
// indented by one space as the table's lines are.
func wrap(s string, width int) string {
	var b strings.Builder
	n := 0
	for _, word := range strings.Fields(s) {
		if n > 0 && n+1+len(word) > width {
			b.WriteByte('\n')
			n = 0
		}
		b.WriteByte(' ')
		b.WriteString(word)
		n += 1 + len(word)
	}
	return b.String()
}
