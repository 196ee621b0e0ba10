package interop

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/internal/perf"
)

// This file runs `taproce perf` (the module's command, built for the
// test) against perftest's ib_* programs in the VM, both ways: the tool as
// server in the VM and `taproce perf` as its client, and the other way
// round, at path MTU 1024 and 4096. `taproce perf` runs in the namespace
// of the bridge (ip netns exec) on an appliance with one port on the
// bridge, serving verbs on a socket of its own; the out-of-band exchange
// goes between the VM and the namespace kernel's HostIP, the RoCE traffic
// between rxe0 and the port's GID ::ffff:10.99.0.14.

// perfAddr is the address of the appliance's port; its netdev MTU is
// jumboMTU, so its active path MTU is 4096 and both sides pick the path
// MTU with -m.
var perfAddr = netip.MustParsePrefix("10.99.0.14/24")

const perfPortName = "taproce14"

// perfRig is the appliance and the built command.
type perfRig struct {
	bin, sock string
	// lib, when set, is the directory of taproce's libibverbs.so.1: the
	// rig then runs Debian's perftest programs on it instead of taproce
	// perf (lib_test.go).
	lib  string
	app  *appliance.Appliance
	nic  *appliance.NIC
	wire *wireTally // the NAKs on the port's wire
}

// rigConfig is what sets a perfRig's port apart: the impairment of the
// frames it sends.
type rigConfig struct {
	egress impair.Spec
}

// rigSnap is a rig's counters at one moment, and the count of frames
// the VM's TAP could not take (vmDropsOK false when it could not be read).
type rigSnap struct {
	stats     transport.Stats
	port      appliance.PortStats
	wire      wireCounts
	vmDrops   uint64
	vmDropsOK bool
}

// snap takes the rig's counters.
func (r *perfRig) snap() rigSnap {
	s := rigSnap{stats: r.nic.Engine().Stats(), port: r.nic.Port().Stats(), wire: r.wire.counts()}
	n, err := tapTxDropped(peerName)
	s.vmDrops, s.vmDropsOK = n, err == nil
	return s
}

// settled is snap once the port has been quiet a while (at most a few
// seconds): under loss, a run's last packets may still be on their way
// when the tools end, rxe retransmitting to the QP taproce destroyed and
// the lingering QP answering it (transport.Engine.Close), and rxe counts
// them in the run.
func (r *perfRig) settled() rigSnap {
	const quietFor, atMost = 250 * time.Millisecond, 3 * time.Second
	end := time.Now().Add(atMost)
	last, since := r.nic.Engine().Stats(), time.Now()
	for time.Since(since) < quietFor && time.Now().Before(end) {
		time.Sleep(10 * time.Millisecond)
		if s := r.nic.Engine().Stats(); s.Sent != last.Sent || s.Received != last.Received {
			last, since = s, time.Now()
		}
	}
	return r.snap()
}

// end is snap at the end of a run of c: settled under loss.
func (r *perfRig) end(c perfCase) rigSnap {
	if c.loss != 0 {
		return r.settled()
	}
	return r.snap()
}

// vmDropped returns how many frames the VM's TAP could not take between
// s0 and s1.
func vmDropped(s0, s1 rigSnap) uint64 {
	if !s0.vmDropsOK || !s1.vmDropsOK {
		return 0
	}
	return s1.vmDrops - s0.vmDrops
}

// buildPerfTool builds the module's command into a temporary directory.
func buildPerfTool(t *testing.T) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "taproce")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building taproce: %v\n%s", err, out)
	}
	return bin
}

// newPerfRig opens the appliance with its port on the bridge, serving
// verbs until the end of the test. The port's capture feeds the rig's
// wireTally, which counts the NAKs each way.
func newPerfRig(t *testing.T, cfg rigConfig) *perfRig {
	t.Helper()
	r := &perfRig{bin: buildPerfTool(t), sock: filepath.Join(t.TempDir(), "taproce.sock")}
	quiet := slog.New(slog.DiscardHandler)
	var err error
	if r.app, err = appliance.New(appliance.Options{Socket: r.sock, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	pc := appliance.PortConfig{Namespace: Namespace, Netns: netnsutil.Path(Namespace), Name: perfPortName,
		Addrs: []netip.Prefix{perfAddr}, MTU: jumboMTU, Egress: cfg.egress, Logger: quiet}
	r.wire = newWireTally(perfAddr.Addr())
	var out io.Writer = r.wire
	if dir := os.Getenv(CaptureDirEnv); dir != "" {
		// The same capture to a file too, for a person to read.
		f, err := os.Create(filepath.Join(dir, "interop-perf-"+strings.ReplaceAll(t.Name(), "/", "-")+".pcap"))
		if err != nil {
			r.app.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		out = io.MultiWriter(r.wire, f)
	}
	if pc.Capture, err = capture.NewWriter(out); err != nil {
		r.app.Close()
		t.Fatal(err)
	}
	r.wire.flush = pc.Capture.Flush
	r.nic, err = r.app.AddPort(pc)
	if err != nil {
		r.app.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
		r.app.Close()
	})
	if err := netnsutil.AttachToBridge(netnsutil.Path(Namespace), perfPortName, Bridge); err != nil {
		close(done)
		t.Fatal(err)
	}
	r.nic.Port().Station().Announce()
	if err := r.app.Control().Listen(); err != nil {
		close(done)
		t.Fatal(err)
	}
	go func() { done <- r.app.Serve(ctx) }()
	return r
}

// startServer starts `taproce perf ARGS` as a server writing to out and
// returns once it listens; the channel gives its exit.
func (r *perfRig) startServer(ctx context.Context, t *testing.T, out *bytes.Buffer, args ...string) <-chan error {
	t.Helper()
	cmd := r.command(ctx, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	if err := waitListening(ctx, perf.DefaultPort); err != nil {
		cmd.Process.Kill()
		<-waited
		t.Fatalf("taproce perf server: %v\n%s", err, out.String())
	}
	return waited
}

// reach fails the test unless the rig's port resolves the VM's MAC within
// a minute.
func (r *perfRig) reach(t *testing.T, p *Peer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := r.nic.Resolve(ctx, p.IP); err != nil {
		t.Fatalf("the port does not reach the VM: %v", err)
	}
}

// command returns `taproce perf ARGS` in the bridge's namespace, or with
// a lib the program ARGS on it.
func (r *perfRig) command(ctx context.Context, args ...string) *exec.Cmd {
	head := []string{r.bin, "perf"}
	if r.lib != "" {
		head = []string{"env", "LD_LIBRARY_PATH=" + r.lib}
	}
	return r.inNamespace(ctx, append(head, args...)...)
}

// inNamespace returns the command ARGS as a client process of the rig's
// appliance, in the bridge's namespace.
func (r *perfRig) inNamespace(ctx context.Context, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", Namespace}, args...)...)
	c.Env = append(os.Environ(), "TAPROCE_SOCKET="+r.sock)
	c.WaitDelay = 5 * time.Second
	return c
}

// args are the arguments of command for a run of c, a client when peer
// is given.
func (r *perfRig) args(c perfCase, mtu, size int, peer ...string) []string {
	if r.lib == "" {
		return append(c.ourArgs(mtu, size), peer...)
	}
	return append(append([]string{c.tool}, c.libArgs(mtu, size)...), peer...)
}

// parse reads a run's output: taproce perf's JSON lines, or perftest's
// result line on the lib.
func (r *perfRig) parse(c perfCase, size int, out string) ([]perf.Result, error) {
	if r.lib == "" {
		return parseOurs(out)
	}
	return parseLib(c, size, out)
}

// clientOutput runs `taproce perf ARGS` as a client of a server in the VM
// that may not listen yet, and returns its output: again while it cannot
// connect (it gives up after a second, as perftest's client gives up at
// once), up to 100 times 0.2 s apart, as vmConnectRetry runs perftest's.
func (r *perfRig) clientOutput(ctx context.Context, args ...string) ([]byte, error) {
	for i := 1; ; i++ {
		out, err := r.command(ctx, args...).CombinedOutput()
		refused := strings.Contains(string(out), "couldn't connect") || strings.Contains(string(out), "Couldn't connect")
		if err == nil || !refused || i == 100 || ctx.Err() != nil {
			return out, err
		}
		select {
		case <-ctx.Done():
			return out, err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitListening waits until a socket listens on TCP port in Namespace.
func waitListening(ctx context.Context, port int) error {
	for {
		ok, err := netnsutil.Listening(netnsutil.Path(Namespace), port)
		if err != nil {
			return fmt.Errorf("interop: %w", err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("interop: nothing listens on port %d in %s: %w", port, Namespace, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// perfCase is a perftest program and the sizes it runs at; loss is the
// share of the frames each side loses on the way out (0 for none); n,
// when not 0, the iterations of every run, and depth, when not 0, both
// sides' send queue depth (-t; else the tools' default, 128 for the
// bandwidth tests).
type perfCase struct {
	tool     string
	atomic   string
	sizes    []int
	loss     float64
	n, depth int
}

// iters is the number of iterations of a run at size.
func (c perfCase) iters(size int) int {
	if c.n != 0 {
		return c.n
	}
	if c.loss != 0 {
		return lossIters(size)
	}
	return perfIters(size)
}

// record is the results entry of a run at mtu and size, before its
// outcome is known.
func (c perfCase) record(role string, mtu, size int) PerfResult {
	return PerfResult{Tool: c.tool, Atomic: c.atomic, Taproce: role, MTU: mtu, Size: size, Iters: c.iters(size), Loss: c.loss}
}

func (c perfCase) name() string {
	if c.atomic != "" {
		return c.tool + "-" + c.atomic
	}
	return c.tool
}

func (c perfCase) test() perf.Test {
	t, err := perf.ParseTest(c.tool)
	if err != nil {
		panic(err)
	}
	return t
}

// perfIters keeps the runs short: the VM moves about 10 MB/s.
func perfIters(size int) int {
	switch {
	case size >= 1<<20:
		return 5
	case size >= 64<<10:
		return 10
	}
	return 20
}

// perfSizes are the message sizes: one packet, exactly four at path MTU
// 1024 (one at 4096), many, and 1 MiB.
var perfSizes = []int{2, 4096, 65536, 1 << 20}

func perfCases() []perfCase {
	var cs []perfCase
	for _, tool := range []string{"ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_write_lat", "ib_read_lat", "ib_send_lat"} {
		cs = append(cs, perfCase{tool: tool, sizes: perfSizes})
	}
	for _, tool := range []string{"ib_atomic_bw", "ib_atomic_lat"} {
		for _, a := range []string{"CMP_AND_SWAP", "FETCH_AND_ADD"} {
			cs = append(cs, perfCase{tool: tool, atomic: a, sizes: []int{8}})
		}
	}
	return cs
}

// vmArgs are the perftest options of a run.
func (c perfCase) vmArgs(mtu, size int) string {
	s := fmt.Sprintf("-d rxe0 -x 1 -F -m %d -n %d", mtu, c.iters(size))
	for _, a := range c.depthArgs() {
		s += " " + a
	}
	if c.atomic != "" {
		return s + " -A " + c.atomic
	}
	return s + fmt.Sprintf(" -s %d", size)
}

// ourArgs are `taproce perf`'s.
func (c perfCase) ourArgs(mtu, size int) []string {
	a := append([]string{c.tool, "-m", strconv.Itoa(mtu), "-n", strconv.Itoa(c.iters(size)), "--json"}, c.depthArgs()...)
	if c.atomic != "" {
		return append(a, "-A", c.atomic)
	}
	return append(a, "-s", strconv.Itoa(size))
}

// depthArgs are the options that set the send queue depth: -t, when the
// case has a depth.
func (c perfCase) depthArgs() []string {
	if c.depth == 0 {
		return nil
	}
	return []string{"-t", strconv.Itoa(c.depth)}
}

// perftestLine is the result line of a perftest program's output.
type perftestLine struct {
	size, iters int
	fields      []float64 // BW: peak, average, rate; latency: min, max, typical, avg, stdev, 99%, 99.9%
	mtu         int
	// untimed: perftest could not measure its CPU's clock (the linear fit
	// of cycles against gettimeofday that get_cpu_mhz makes came out with
	// r² < 0.9, which a VM under emulation on a busy host can give), so it
	// took the clock as 0 and its figures are 0, infinite or NaN.
	untimed bool
}

// untimedMark is what perftest prints when its clock measurement fails.
const untimedMark = "Correlation coefficient r^2:"

// parsePerftest finds the result line and the MTU in perftest's output;
// a read or atomic latency server has only the MTU.
func parsePerftest(out string) (*perftestLine, error) {
	l := perftestLine{untimed: strings.Contains(out, untimedMark)}
	lines := strings.Split(out, "\n")
	if strings.Contains(out, "Latency Test") && !strings.Contains(out, " #bytes") &&
		(strings.Contains(out, "RDMA_Read") || strings.Contains(out, "Atomic")) && strings.Contains(out, "Waiting for client") {
		for _, s := range lines {
			if v, ok := strings.CutPrefix(s, " Mtu             : "); ok {
				l.mtu, _ = strconv.Atoi(strings.TrimSuffix(v, "[B]"))
			}
		}
		return &l, nil
	}
	for i, s := range lines {
		if v, ok := strings.CutPrefix(s, " Mtu             : "); ok {
			l.mtu, _ = strconv.Atoi(strings.TrimSuffix(v, "[B]"))
		}
		if !strings.HasPrefix(s, " #bytes") || i+1 >= len(lines) {
			continue
		}
		f := strings.Fields(lines[i+1])
		if len(f) < 5 {
			return nil, fmt.Errorf("result line %q", lines[i+1])
		}
		var err error
		if l.size, err = strconv.Atoi(f[0]); err != nil {
			return nil, fmt.Errorf("result line %q: %w", lines[i+1], err)
		}
		if l.iters, err = strconv.Atoi(f[1]); err != nil {
			return nil, fmt.Errorf("result line %q: %w", lines[i+1], err)
		}
		for _, x := range f[2:] {
			// perftest prints a standard deviation it cannot compute
			// (rounding takes the variance below 0) as "-nan".
			v, err := strconv.ParseFloat(x, 64)
			if x == "-nan" || x == "nan" {
				v, err = math.NaN(), nil
			}
			if err != nil {
				return nil, fmt.Errorf("result line %q: %w", lines[i+1], err)
			}
			l.fields = append(l.fields, v)
		}
		return &l, nil
	}
	return nil, fmt.Errorf("no result line")
}

// TestParsePerftest parses result lines of perftest, with the "-nan" it
// prints for a standard deviation it cannot compute, and tells a run it
// could not time.
func TestParsePerftest(t *testing.T) {
	head := " Mtu             : 1024[B]\n #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n"
	for _, c := range []struct {
		line    string
		typical float64
		nan     bool
	}{
		{" 4096    50          314.90         1363.25      447.66   \t       506.75      \t179.90 \t\t1363.25 \t\t1363.25", 447.66, false},
		{" 2       100          203.40         61550.23      293.35   \t       1572.00     \t-nan   \t\t61550.23 \t\t61550.23", 293.35, true},
	} {
		l, err := parsePerftest(head + c.line + "\n")
		if err != nil {
			t.Errorf("%q: %v", c.line, err)
			continue
		}
		if l.mtu != 1024 || len(l.fields) != 7 || l.fields[2] != c.typical || math.IsNaN(l.fields[4]) != c.nan || l.untimed {
			t.Errorf("%q: %+v", c.line, l)
		}
	}
	// A run perftest could not time (its clock measurement failed).
	untimed := "Correlation coefficient r^2: 0.00874678 < 0.9\n Mtu             : 1024[B]\n" +
		" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n" +
		" 65536      10               0.00               0.00   \t\t   0.000000\n"
	if l, err := parsePerftest(untimed); err != nil || !l.untimed || l.size != 65536 || l.iters != 10 || len(l.fields) != 3 {
		t.Errorf("untimed run: %+v, %v", l, err)
	}
}

// parseOurs returns the JSON result lines of `taproce perf --json`.
func parseOurs(out string) ([]perf.Result, error) {
	var rs []perf.Result
	for _, s := range strings.Split(out, "\n") {
		if !strings.HasPrefix(s, "{") {
			continue
		}
		var r perf.Result
		if err := json.Unmarshal([]byte(s), &r); err != nil {
			return nil, fmt.Errorf("%q: %w", s, err)
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// perfRecorder collects the outcomes for $TAPROCE_INTEROP_PERF_RESULTS.
type perfRecorder struct {
	mu  sync.Mutex
	res PerfResults
}

func (pr *perfRecorder) add(r PerfResult) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.res.Results = append(pr.res.Results, r)
}

// perfOutcome checks one run's outputs and fills rec; it reports the
// problems as test errors.
type perfOutcome struct {
	t   *testing.T
	rec PerfResult
}

func (o *perfOutcome) fail(format string, args ...any) {
	o.t.Helper()
	msg := fmt.Sprintf(format, args...)
	o.t.Error(msg)
	o.rec.Problems = append(o.rec.Problems, msg)
}

// check compares what both sides printed.
func (o *perfOutcome) check(c perfCase, mtu, size int, ours []perf.Result, theirs *perftestLine, ourRole string) {
	o.t.Helper()
	t := c.test()
	iters := c.iters(size)
	if theirs.size != size || theirs.iters != iters {
		o.fail("perftest reports %d bytes, %d iterations; want %d, %d", theirs.size, theirs.iters, size, iters)
	}
	if theirs.mtu != mtu {
		o.fail("perftest ran at MTU %d, want %d", theirs.mtu, mtu)
	}
	passive := ourRole == "server" && t.Kind == perf.Lat && (t.Verb == perf.Read || t.Verb == perf.Atomic)
	if passive {
		if len(ours) != 0 {
			o.fail("taproce printed %+v as a passive server", ours)
		}
		if len(theirs.fields) > 2 {
			o.rec.Theirs, o.rec.Unit = theirs.fields[2], "usec"
		}
		return
	}
	if len(ours) != 1 {
		o.fail("taproce printed %d result lines, want 1", len(ours))
		return
	}
	r := ours[0]
	if r.Size != size || r.Iters != uint64(iters) || r.MTU != mtu {
		o.fail("taproce reports %d bytes, %d iterations at MTU %d; want %d, %d at %d", r.Size, r.Iters, r.MTU, size, iters, mtu)
	}
	switch {
	case r.BW != nil && len(theirs.fields) < 3, r.Lat != nil && len(theirs.fields) < 3 && len(theirs.fields) != 0:
		o.fail("perftest's result line has %d numbers", len(theirs.fields))
	case r.Lat != nil && len(theirs.fields) == 0:
		// The peer was a read or atomic latency server: no results.
		o.rec.Ours, o.rec.Unit = r.Lat.Typical, "usec"
		if !(r.Lat.Typical > 0) {
			o.fail("latency: taproce %v usec", r.Lat.Typical)
		}
	case r.BW != nil && theirs.untimed:
		// perftest's figure, and a taproce server's copy of it, mean
		// nothing; the run itself is checked by the counters.
		o.rec.Ours, o.rec.Unit, o.rec.Untimed = r.BW.Avg, "MB/sec", true
		o.t.Logf("perftest could not time the run (%s), so its bandwidth is not checked", untimedMark)
		if !r.Remote && !(r.BW.Avg > 0) {
			o.fail("bandwidth: taproce %v MB/sec", r.BW.Avg)
		}
	case r.BW != nil:
		o.rec.Ours, o.rec.Theirs, o.rec.Unit = r.BW.Avg, theirs.fields[1], "MB/sec"
		if !(r.BW.Avg > 0) || !(theirs.fields[1] >= 0) {
			o.fail("bandwidth: taproce %v, perftest %v MB/sec", r.BW.Avg, theirs.fields[1])
		}
		if r.Remote && math.Abs(r.BW.Avg-theirs.fields[1]) > 0.01 {
			// A write_bw server prints its client's results.
			o.fail("taproce server printed %v MB/sec, the perftest client %v", r.BW.Avg, theirs.fields[1])
		}
	case r.Lat != nil && theirs.untimed:
		o.rec.Ours, o.rec.Unit, o.rec.Untimed = r.Lat.Typical, "usec", true
		o.t.Logf("perftest could not time the run (%s), so its latency is not checked", untimedMark)
		if !(r.Lat.Typical > 0) {
			o.fail("latency: taproce %v usec", r.Lat.Typical)
		}
	case r.Lat != nil:
		o.rec.Ours, o.rec.Theirs, o.rec.Unit = r.Lat.Typical, theirs.fields[2], "usec"
		if !(r.Lat.Typical > 0) || !(theirs.fields[2] > 0) {
			o.fail("latency: taproce %v, perftest %v usec", r.Lat.Typical, theirs.fields[2])
		}
	}
}

// perfVMServer runs the tool as server in the VM for every size, one
// after another in one task (Spawn), and `taproce perf` as its client for each
// (run again while it cannot connect, until the next server listens).
func perfVMServer(t *testing.T, p *Peer, r *perfRig, c perfCase, mtu int, rec *perfRecorder) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	const begin, out, after = "@@@perf-begin@@@", "@@@perf-out@@@", "@@@perf-after@@@"
	var script []string
	for _, size := range c.sizes {
		script = append(script, fmt.Sprintf("echo %s; %s; echo %s; timeout 120 %s %s 2>&1; echo rc=$?; sleep 0.2; echo %s; %s",
			begin, CountersCommand, out, c.tool, c.vmArgs(mtu, size), after, CountersCommand))
	}
	type run struct {
		out    []perf.Result
		s0, s1 rigSnap
		text   string
		err    error
	}
	var runs []run
	var output string
	for attempt := 0; ; attempt++ {
		job := p.Spawn(ctx, "perf-server", strings.Join(script, "; "))
		runs = make([]run, len(c.sizes))
		down := false
		for i, size := range c.sizes {
			s0 := r.snap()
			rctx, rcancel := context.WithTimeout(ctx, 3*time.Minute)
			args := r.args(c, mtu, size, p.IP.String())
			o, err := r.clientOutput(rctx, args...)
			rcancel()
			runs[i] = run{s0: s0, s1: r.end(c), text: string(o), err: err}
			if err == nil {
				runs[i].out, runs[i].err = r.parse(c, size, string(o))
			} else if down = peerDown(p); down {
				break // the sizes after it would wait for a VM that is gone
			}
		}
		code, jobOut, werr := job.Wait(ctx, 3*time.Minute)
		output = jobOut
		if (down || werr != nil || code != 0) && attempt == 0 && recoverPeer(t, p) {
			continue
		}
		if werr != nil || code != 0 {
			t.Errorf("VM job: exit %d, %v", code, werr)
		}
		break
	}
	sections := strings.Split(output, begin+"\n")[1:]
	for i, size := range c.sizes {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			o := &perfOutcome{t: t, rec: c.record("client", mtu, size)}
			defer func() {
				o.rec.Pass = !t.Failed()
				rec.add(o.rec)
			}()
			t.Logf("taproce side: %s:\n%s", strings.Join(r.args(c, mtu, size, p.IP.String()), " "), strings.TrimSpace(runs[i].text))
			if runs[i].err != nil {
				o.fail("taproce perf: %v", runs[i].err)
			}
			if i >= len(sections) {
				o.fail("no output of the VM's run")
				return
			}
			before, rest, _ := strings.Cut(sections[i], out+"\n")
			vmOut, afterCounters, ok := strings.Cut(rest, after+"\n")
			t.Logf("VM %s %s:\n%s", c.tool, c.vmArgs(mtu, size), strings.TrimSpace(vmOut))
			if !ok || !strings.Contains(vmOut, "rc=0\n") {
				o.fail("%s in the VM failed", c.tool)
				return
			}
			theirs, err := parsePerftest(vmOut)
			if err != nil {
				o.fail("%s output: %v", c.tool, err)
				return
			}
			if passive := c.test().Kind == perf.Lat && (c.test().Verb == perf.Read || c.test().Verb == perf.Atomic); passive {
				// A read or atomic latency server prints no results.
				theirs.size, theirs.iters = size, c.iters(size)
			}
			if runs[i].err == nil {
				o.check(c, mtu, size, runs[i].out, theirs, "client")
				c.checkRun(t, o, size, runs[i].s0, runs[i].s1, ParseCounters(before), ParseCounters(afterCounters))
			}
		})
	}
}

// peerDown reports whether the VM has gone down (Peer.Check).
func peerDown(p *Peer) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return errors.Is(p.Check(ctx), ErrPeerDown)
}

// recoverPeer is called after a case failed: when the VM has gone down —
// its kernel crashed or locked up, which under TCG and load the 6.1 rxe
// VMs have done — it logs the VM's console, boots the VM again and
// returns true, so that the caller runs the case once more; when the VM
// is fine, the failure is the case's own and it returns false.
func recoverPeer(t *testing.T, p *Peer) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout+time.Minute)
	defer cancel()
	err := p.Check(ctx)
	if !errors.Is(err, ErrPeerDown) {
		return false
	}
	t.Logf("%v\nthe VM is restarted and the case runs again", err)
	if err := p.Restart(ctx); err != nil {
		t.Fatalf("the VM went down and does not come back: %v", err)
	}
	return true
}

// perfVMClient runs `taproce perf` as server and the tool as its client
// in the VM: the VM runs the clients for every size one after another in
// one Exec, each retrying its connection until the next server listens
// (vmConnectRetry), while the servers run one after another here.
func perfVMClient(t *testing.T, p *Peer, r *perfRig, c perfCase, mtu int, rec *perfRecorder) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	const begin, out, after = "@@@perf-begin@@@", "@@@perf-out@@@", "@@@perf-after@@@"
	var script []string
	for _, size := range c.sizes {
		script = append(script, fmt.Sprintf("echo %s; %s; echo %s; %s; sleep 0.2; echo %s; %s", begin, CountersCommand, out,
			vmConnectRetry(fmt.Sprintf("timeout 120 %s %s %s", c.tool, c.vmArgs(mtu, size), HostIP)), after, CountersCommand))
	}
	type run struct {
		s0, s1 rigSnap
		text   string
		err    error
	}
	var runs []run
	var vmAll string
	for attempt := 0; ; attempt++ {
		runs = make([]run, len(c.sizes))
		sctx, scancel := context.WithCancel(ctx)
		served := make(chan struct{})
		go func() {
			defer close(served)
			for i, size := range c.sizes {
				s0 := r.snap()
				var o bytes.Buffer
				rctx, rcancel := context.WithTimeout(sctx, 3*time.Minute)
				cmd := r.command(rctx, r.args(c, mtu, size)...)
				cmd.Stdout, cmd.Stderr = &o, &o
				err := cmd.Run()
				rcancel()
				runs[i] = run{s0: s0, s1: r.end(c), text: o.String(), err: err}
				if sctx.Err() != nil {
					return
				}
			}
		}()
		out, stderr, err := p.Exec(ctx, strings.Join(script, "; "))
		vmAll = out
		late := false
		select {
		case <-served:
		case <-time.After(30 * time.Second):
			late = true
			scancel()
			<-served
		}
		scancel()
		if err != nil && attempt == 0 && recoverPeer(t, p) {
			continue
		}
		if err != nil {
			t.Errorf("VM clients: %v: %s", err, stderr)
		}
		if late {
			t.Error("taproce perf servers still running 30 s after the VM's clients ended")
		}
		break
	}
	sections := strings.Split(vmAll, begin+"\n")[1:]
	for i, size := range c.sizes {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			o := &perfOutcome{t: t, rec: c.record("server", mtu, size)}
			defer func() {
				o.rec.Pass = !t.Failed()
				rec.add(o.rec)
			}()
			if i >= len(sections) {
				o.fail("no output of the VM's run")
				return
			}
			before, rest, _ := strings.Cut(sections[i], out+"\n")
			vmOut, afterCounters, ok := strings.Cut(rest, after+"\n")
			t.Logf("VM %s %s %s:\n%s", c.tool, c.vmArgs(mtu, size), HostIP, strings.TrimSpace(vmOut))
			t.Logf("taproce side: %s:\n%s", strings.Join(r.args(c, mtu, size), " "), strings.TrimSpace(runs[i].text))
			if !ok || !strings.Contains(vmOut, "rc=0\n") {
				o.fail("%s in the VM failed", c.tool)
			}
			if runs[i].err != nil {
				o.fail("taproce perf server: %v", runs[i].err)
			}
			if o.t.Failed() {
				return
			}
			theirs, err := parsePerftest(vmOut)
			if err != nil {
				o.fail("%s output: %v", c.tool, err)
				return
			}
			ours, err := r.parse(c, size, runs[i].text)
			if err != nil {
				o.fail("taproce output: %v", err)
				return
			}
			o.check(c, mtu, size, ours, theirs, "server")
			c.checkRun(t, o, size, runs[i].s0, runs[i].s1, ParseCounters(before), ParseCounters(afterCounters))
		})
	}
}

// vmConnectRetry runs a perftest client command in a VM again while its
// server does not listen yet (perftest's client does not wait for it), up
// to 100 times 0.2 s apart; it prints the last attempt's output and
// "rc=STATUS".
func vmConnectRetry(cmd string) string {
	return fmt.Sprintf(`i=0; while :; do out=$(%s 2>&1); rc=$?; i=$((i+1)); `+
		`case "$out" in *"Couldn't connect"*|*"Unable to init the socket connection"*) if [ $i -lt 100 ]; then sleep 0.2; continue; fi;; esac; break; done; `+
		`printf '%%s\n' "$out"; echo rc=$rc`, cmd)
}

// checkRun checks the counters of a run: checkCounters, or under loss
// checkLoss, whose account of the recovery goes into the record.
func (c perfCase) checkRun(t *testing.T, o *perfOutcome, size int, s0, s1 rigSnap, before, after Counters) {
	t.Helper()
	if c.loss != 0 {
		o.rec.Recovery = checkLoss(t, s0, s1, before, after)
		return
	}
	checkCounters(t, c.iters(size), s0, s1, before, after)
}

// tapTxDropped returns how many frames the VM's TAP dropped on their way
// to the VM (its queue full: the VM is slower than the bridge).
func tapTxDropped(peer string) (uint64, error) {
	var n uint64
	err := netnsutil.Do(netnsutil.Path(Namespace), func(h *netlink.Handle) error {
		l, err := h.LinkByName("tap-" + peer)
		if err != nil {
			return err
		}
		if st := l.Attrs().Statistics; st != nil {
			n = st.TxDropped
		}
		return nil
	})
	return n, err
}

// checkCounters is exchangeCheck.finish for a run whose taproce
// counters were taken before (snap0) and after (snap1) it: no rxe error
// counter moved, ACK timeouts stayed few on both sides, taproce sent and
// received no NAK or RNR NAK and dropped nothing, and each side accepted
// as many packets as the other sent.
// logOurs logs the port's transport counters between two snaps, and the
// frames the VM's TAP dropped meanwhile.
func logOurs(t *testing.T, snap0, snap1 rigSnap) {
	t.Helper()
	s0, s1 := snap0.stats, snap1.stats
	t.Logf("taproce: sent %d received %d dropped %d retransmits %d timeouts %d NAKs sent %d received %d RNR NAKs sent %d received %d duplicate requests %d responses %d window cuts %d; the VM's TAP dropped %d",
		s1.Sent-s0.Sent, s1.Received-s0.Received, s1.Dropped-s0.Dropped, s1.Retransmits-s0.Retransmits, s1.Timeouts-s0.Timeouts,
		s1.NAKsSent-s0.NAKsSent, s1.NAKsReceived-s0.NAKsReceived, s1.RNRNAKsSent-s0.RNRNAKsSent, s1.RNRNAKsReceived-s0.RNRNAKsReceived,
		s1.DuplicateRequests-s0.DuplicateRequests, s1.DuplicateResponses-s0.DuplicateResponses, s1.WindowCuts-s0.WindowCuts,
		vmDropped(snap0, snap1))
}

func checkCounters(t *testing.T, iters int, snap0, snap1 rigSnap, before, after Counters) {
	t.Helper()
	d := after.Sub(before)
	s0, s1 := snap0.stats, snap1.stats
	t.Logf("rxe counters: %v", d)
	allowed := maxTimeouts(iters)
	// Frames the VM's own TAP had no room for (the emulated VM drains it
	// slowly; taproce's READ responder sends a response whole, as rxe's
	// does) are losses, and rxe's retries and PSN sequence error NAKs are
	// the IBA's recovery from them: allowed, as long as the run is
	// correct.
	var seqNAKs uint64 // rxe's sequence NAKs, when the TAP lost frames
	tapDrops := vmDropped(snap0, snap1)
	if tapDrops > 0 {
		allowed = max(allowed, uint64(2*iters+2))
		seqNAKs = min(snap1.wire.received[seqNAK]-snap0.wire.received[seqNAK], s1.NAKsReceived-s0.NAKsReceived)
		t.Logf("the VM's TAP dropped %d frames during this run: up to %d ACK timeouts and rxe's sequence NAKs (%d) allowed",
			tapDrops, allowed, seqNAKs)
	}
	logOurs(t, snap0, snap1)
	for _, k := range errorCounters {
		if d[k] != 0 && !(k == "out_of_seq_request" && tapDrops > 0) {
			t.Errorf("rxe counter %s rose by %d", k, d[k])
		}
	}
	if n := d["completer_retry_err"]; n > allowed {
		t.Errorf("rxe retransmitted after %d ACK timeouts in %d iterations", n, iters)
	}
	if n := s1.Timeouts - s0.Timeouts; n > allowed {
		t.Errorf("taproce retransmitted after %d ACK timeouts in %d iterations", n, iters)
	}
	dropped := s1.Dropped - s0.Dropped - lateRetries(t, d, s1.Dropped-s0.Dropped)
	if n := s1.NAKsSent - s0.NAKsSent + s1.NAKsReceived - s0.NAKsReceived - seqNAKs + s1.RNRNAKsSent - s0.RNRNAKsSent +
		s1.RNRNAKsReceived - s0.RNRNAKsReceived + dropped; n != 0 {
		t.Errorf("taproce sent or received %d NAKs or RNR NAKs, or dropped packets", n)
	}
	// A request rxe sent again after an ACK timeout is answered again
	// (a READ re-executed, IBA 9.7.4.1.4), and rxe drops the responses it
	// has had already without counting them; the same the other way.
	// Frames the VM's TAP dropped never reach rxe.
	sent, accepted := s1.Sent-s0.Sent, d["rcvd_pkts"]
	if sent != accepted && !((d["completer_retry_err"] > 0 && s1.DuplicateRequests > s0.DuplicateRequests || tapDrops > 0) && sent > accepted) {
		t.Errorf("taproce sent %d packets, rxe accepted %d", sent, accepted)
	}
	theirs, received := d["sent_pkts"], s1.Received-s0.Received
	if theirs != received && !(s1.Timeouts > s0.Timeouts && theirs > received) {
		t.Errorf("rxe sent %d packets, taproce received %d", theirs, received)
	}
}

// perfRec collects the outcome of the perftest tests of a run; each
// writes it all to $TAPROCE_INTEROP_PERF_RESULTS when it ends.
var perfRec = &perfRecorder{res: PerfResults{Peer: "Linux rxe (Debian bookworm 6.1), perftest 4.5-0.17, under TCG"}}

// recordPerf arranges for the results file to be written at the end of t.
func recordPerf(t *testing.T) {
	path := os.Getenv(PerfResultsEnv)
	if path == "" {
		return
	}
	t.Cleanup(func() {
		perfRec.mu.Lock()
		defer perfRec.mu.Unlock()
		perfRec.res.Generated = time.Now().UTC().Truncate(time.Second)
		if err := perfRec.res.WriteFile(path); err != nil {
			t.Error(err)
		}
	})
}

// TestPerftest: `taproce perf` against perftest's programs in the VM,
// both ways, every test at sizes from 2 B to 1 MiB (atomics: 8 B, both
// -A types), at path MTU 1024 (the VM's netdev MTU 1500) and 4096 (9000).
// Both sides' output must show the size, the iterations and the MTU, a
// write_bw server the same bandwidth as its client, and the rxe and
// taproce counters no NAK, RNR NAK, drop or sequence error, with equal
// packet counts both ways. With $TAPROCE_INTEROP_PERF_RESULTS set the
// outcome goes to that file (PerfResults; PerfTable renders it).
func TestPerftest(t *testing.T) {
	p, _ := needPeer(t)
	r := newPerfRig(t, rigConfig{})
	rec := perfRec
	recordPerf(t)
	r.reach(t, p)
	for _, mtu := range []int{1024, 4096} {
		t.Run(fmt.Sprintf("m%d", mtu), func(t *testing.T) {
			if mtu == 4096 {
				withPeerMTU(t, p, jumboMTU)
			}
			for _, c := range perfCases() {
				t.Run(c.name()+"/vm-server", func(t *testing.T) { perfVMServer(t, p, r, c, mtu, rec) })
				t.Run(c.name()+"/vm-client", func(t *testing.T) { perfVMClient(t, p, r, c, mtu, rec) })
			}
		})
	}
}

// TestPerfTable renders a small set of results with PerfTable, LossTable
// and PairTable, and reads back what WriteFile wrote.
func TestPerfTable(t *testing.T) {
	rec := &Recovery{TaproceLost: 3, RxeLost: 2, SeqNAKsSent: 1, SeqNAKsReceived: 2, TaproceTimeouts: 1, RxeRetries: 4}
	r := &PerfResults{Results: []PerfResult{
		{Tool: "ib_write_bw", Taproce: "client", MTU: 1024, Size: 2, Pass: true},
		{Tool: "ib_write_bw", Taproce: "client", MTU: 1024, Size: 1 << 20, Pass: true},
		{Tool: "ib_write_bw", Taproce: "server", MTU: 1024, Size: 4096, Pass: false},
		{Tool: "ib_atomic_bw", Atomic: "CMP_AND_SWAP", Taproce: "server", MTU: 4096, Size: 8, Pass: true},
		{Tool: "ib_write_bw", Taproce: "client", MTU: 1024, Size: 65536, Iters: 10, Pass: true, Ours: 20.04, Unit: "MB/sec"},
		{Tool: "ib_write_bw", Taproce: "server", MTU: 1024, Size: 65536, Iters: 10, Pass: true, Ours: 19, Theirs: 18.96, Unit: "MB/sec"},
		{Tool: "ib_send_lat", Taproce: "client", MTU: 1024, Size: 2, Iters: 20, Pass: false},
		{Tool: "ib_write_bw", Taproce: "client", MTU: 1024, Size: 2, Pass: true, Loss: 0.01, Recovery: rec},
		{Tool: "ib_write_bw", Taproce: "server", MTU: 1024, Size: 2, Pass: false, Loss: 0.01, Recovery: rec},
		{Tool: "ibv_rc_pingpong", Args: "-c", Taproce: "server", MTU: 1024, Size: 4096, Pass: true, Loss: 0.01},
		{Tool: "ib_write_bw", Between: BetweenRxe, MTU: 1024, Size: 65536, Iters: 10, Pass: true, Ours: 11, Theirs: 11.26, Unit: "MB/sec"},
		{Tool: "ib_send_lat", Between: BetweenRxe, MTU: 1024, Size: 2, Iters: 20, Pass: true, Ours: 240, Theirs: 231.4, Unit: "usec"},
	}}
	for _, c := range []struct {
		name   string
		render func(*PerfResults) string
		want   string
	}{
		{"PerfTable", PerfTable,
			"| perftest tool | taproce → rxe server, MTU 1024 | rxe client → taproce, MTU 1024 | taproce → rxe server, MTU 4096 | rxe client → taproce, MTU 4096 |\n" +
				"|---|---|---|---|---|\n" +
				"| `ib_write_bw` | ✅ 2 B, 1 MiB, 64 KiB | ✅ 64 KiB; ❌ 4 KiB | – | – |\n" +
				"| `ib_atomic_bw -A CMP_AND_SWAP` | – | – | – | ✅ 8 B |\n" +
				"| `ib_send_lat` | ❌ 2 B | – | – | – |\n"},
		{"LossTable", LossTable,
			"| tool, MTU 1024, 1 % loss each way | taproce → rxe server | rxe client → taproce | frames lost: taproce's / rxe's | PSN sequence NAKs: taproce's / rxe's | taproce's ACK timeouts | rxe's retries (after a NAK or an ACK timeout) |\n" +
				"|---|---|---|---|---|---|---|\n" +
				"| `ib_write_bw` | ✅ 2 B | ❌ 2 B | 6 / 4 | 2 / 4 | 2 | 8 |\n" +
				"| `ibv_rc_pingpong -c` | – | ✅ 4 KiB | 0 / 0 | 0 / 0 | 0 | 0 |\n"},
		{"PairTable", PairTable,
			"| run (client's figure: average bandwidth, typical latency) | taproce → rxe server | rxe client → taproce | rxe → rxe server |\n" +
				"|---|---|---|---|\n" +
				"| `ib_write_bw` 64 KiB, MTU 1024, 10 iterations | 20.0 MB/s | 19.0 MB/s | 11.3 MB/s |\n" +
				"| `ib_send_lat` 2 B, MTU 1024, 20 iterations | ❌ | – | 231 µs |\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.render(r); got != c.want {
				t.Errorf("got\n%s\nwant\n%s", got, c.want)
			}
			if got := c.render(&PerfResults{}); c.name != "PerfTable" && got != "" {
				t.Errorf("no results: got\n%s", got)
			}
		})
	}
	path := filepath.Join(t.TempDir(), "r.json")
	if err := r.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	back, err := ReadPerfResults(path)
	if err != nil || len(back.Results) != len(r.Results) || back.Results[3].Atomic != "CMP_AND_SWAP" ||
		back.Results[7].Recovery == nil || *back.Results[7].Recovery != *rec || back.Results[10].Between != BetweenRxe {
		t.Fatalf("%+v %v", back, err)
	}
}

// perfOptionCase is a run with options that change the exchange: -a (every
// size from 2 B to 8 MiB; the SEND tests synchronise per size) and -q.
type perfOptionCase struct {
	tool, args string
	results    int // result lines each side prints
}

// TestPerftestOptions: `taproce perf` against perftest with -a (23 sizes,
// 2 B to 8 MiB; the SEND tests synchronise per size) and -q (several QPs
// exchanging keys in turn), both ways, at path MTU 1024, with the same
// counter checks as TestPerftest; recorded in the results file too.
func TestPerftestOptions(t *testing.T) {
	p, _ := needPeer(t)
	r := newPerfRig(t, rigConfig{})
	recordPerf(t)
	for _, c := range []perfOptionCase{
		{"ib_write_bw", "-a -n 5", 23},
		{"ib_send_bw", "-a -n 5", 23},
		{"ib_send_lat", "-a -n 5", 23},
		{"ib_read_lat", "-a -n 5", 23},
		{"ib_write_bw", "-q 3 -n 20 -s 65536", 1},
		{"ib_read_bw", "-q 2 -n 10 -s 65536", 1},
		{"ib_send_bw", "-q 2 -n 20 -s 4096", 1},
	} {
		name := c.tool + strings.ReplaceAll(" "+c.args, " ", "_")
		vmArgs := "-d rxe0 -x 1 -F -m 1024 " + c.args
		ourArgs := append([]string{c.tool, "-m", "1024", "--json"}, strings.Fields(c.args)...)
		test, _ := perf.ParseTest(c.tool)
		// A write_bw server prints its client's last line; a read_lat
		// server nothing.
		serverLines := c.results
		switch {
		case test.Kind == perf.BW && test.Verb != perf.Send:
			serverLines = 1
		case test.Kind == perf.Lat && test.Verb == perf.Read:
			serverLines = 0
		}
		record := func(t *testing.T, role string) {
			rec := PerfResult{Tool: c.tool, Args: c.args, Taproce: role, MTU: 1024, Iters: 5}
			if f := strings.Fields(c.args); len(f) > 0 && f[0] != "-a" {
				rec.Size, _ = strconv.Atoi(f[len(f)-1])
			}
			for i, f := range strings.Fields(c.args) {
				if f == "-n" {
					rec.Iters, _ = strconv.Atoi(strings.Fields(c.args)[i+1])
				}
			}
			t.Cleanup(func() {
				rec.Pass = !t.Failed()
				perfRec.add(rec)
			})
		}
		t.Run(name+"/vm-server", func(t *testing.T) {
			record(t, "client")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			s0 := r.snap()
			job := p.Spawn(ctx, "perf-opt-server", withCounters("timeout 240 "+c.tool+" "+vmArgs))
			out, err := r.clientOutput(ctx, append(ourArgs, p.IP.String())...)
			s1 := r.snap()
			t.Logf("taproce perf %s %s:\n%s", strings.Join(ourArgs, " "), p.IP, strings.TrimSpace(string(out)))
			if err != nil {
				t.Errorf("taproce perf: %v", err)
			}
			code, vmAll, werr := job.Wait(ctx, 4*time.Minute)
			before, vmOut, after, ok := splitCounters(vmAll)
			t.Logf("VM %s %s (exit %d):\n%s", c.tool, vmArgs, code, strings.TrimSpace(vmOut))
			if werr != nil || code != 0 || !ok {
				logOurs(t, s0, r.snap())
				if ok {
					t.Logf("rxe counters: %v", after.Sub(before))
				}
				t.Fatalf("VM server: exit %d, %v", code, werr)
			}
			checkOptionRun(t, c, string(out), c.results, vmOut, serverLines)
			checkCounters(t, optionIters(c.args), s0, s1, before, after)
		})
		t.Run(name+"/vm-client", func(t *testing.T) {
			record(t, "server")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			s0 := r.snap()
			var ours bytes.Buffer
			waited := r.startServer(ctx, t, &ours, ourArgs...)
			vmCmd := "timeout 240 " + c.tool + " " + vmArgs + " " + HostIP
			all, stderr, err := p.Exec(ctx, withCounters(vmCmd))
			before, vmOut, after, ok := splitCounters(all)
			t.Logf("VM %s (exit %d):\n%s%s", vmCmd, max(ExitCode(err), 0), strings.TrimSpace(vmOut), stderr)
			if err != nil {
				cancel()
			}
			werr := <-waited
			s1 := r.snap()
			t.Logf("taproce perf %s:\n%s", strings.Join(ourArgs, " "), strings.TrimSpace(ours.String()))
			if err != nil || werr != nil || !ok {
				logOurs(t, s0, s1)
				if ok {
					t.Logf("rxe counters: %v", after.Sub(before))
				}
				t.Fatalf("VM client: %v; taproce perf server: %v", err, werr)
			}
			checkOptionRun(t, c, ours.String(), serverLines, vmOut, c.results)
			checkCounters(t, optionIters(c.args), s0, s1, before, after)
		})
	}
}

// optionIters is how many iterations a run with these perftest options
// makes in all: -n (default 5 here) for each size, every size of -a
// (2 B to 8 MiB, 23 of them).
func optionIters(args string) int {
	n, sizes := 5, 1
	f := strings.Fields(args)
	for i, x := range f {
		switch {
		case x == "-n" && i+1 < len(f):
			n, _ = strconv.Atoi(f[i+1])
		case x == "-a":
			sizes = 23
		}
	}
	return n * sizes
}

// checkOptionRun checks the number of result lines of both sides and the
// MTU perftest ran at.
func checkOptionRun(t *testing.T, c perfOptionCase, ours string, ourLines int, vmOut string, vmLines int) {
	t.Helper()
	rs, err := parseOurs(ours)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != ourLines {
		t.Errorf("taproce printed %d result lines, want %d", len(rs), ourLines)
	}
	for i, r := range rs {
		if r.MTU != 1024 || ourLines == 23 && r.Size != 2<<i {
			t.Errorf("taproce result %d: %+v", i, r)
		}
	}
	n := 0
	in := false
	for _, l := range strings.Split(vmOut, "\n") {
		switch {
		case strings.HasPrefix(l, " #bytes"):
			in = true
		case in && strings.HasPrefix(l, "---"):
			in = false
		case in && strings.TrimSpace(l) != "":
			n++
		}
	}
	if n != vmLines {
		t.Errorf("%s printed %d result lines, want %d", c.tool, n, vmLines)
	}
	if !strings.Contains(vmOut, " Mtu             : 1024[B]") {
		t.Errorf("%s did not run at MTU 1024", c.tool)
	}
}
