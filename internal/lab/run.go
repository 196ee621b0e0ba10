package lab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/tap"
	"github.com/taproce/taproce/verbs/abi"
)

// Options are the `taproce lab` flags.
type Options struct {
	Hosts   int
	MTU     int
	Impair  string // impair.ParseSpec syntax, applied to every port in both directions
	Pcap    string // file to record every frame the ports send and receive
	Keep    bool   // leave the lab up until interrupted
	Offload bool   // UDP GSO super-frames on the TAPs
	Frames  int    // RoCE frames per direction in the exchange
	RDMA    int    // bytes moved by RDMA WRITE and read back by READ (0: 64 MiB; <0: none)
	// KernelLoss makes the kernels drop this percentage of the RoCE
	// packets arriving on each host's veth (an nftables rule).
	KernelLoss int
	Prefix     string // namespace name prefix (default DefaultPrefix)
	Out        io.Writer
	Logger     *slog.Logger
	// LocalSwitch lets the ports' traffic cross in memory instead of the
	// veth (off by default: the lab is about the wire).
	LocalSwitch bool
	// Socket is the appliance's control socket (default DefaultSocket).
	Socket string
	// Poll is how the appliance waits for its clients' posts.
	Poll appliance.PollMode
	// Procs is how many processors the appliance runs on while clients
	// use it (config procs; 0: as Poll chooses, appliance.Procs).
	Procs int
	// CPUs is the processors the appliance runs on while clients use it,
	// the clients running on the others (config cpus; "": all).
	CPUs string
	// Binary is the taproce executable the client processes run (default:
	// this process's own); "-" skips the client steps.
	Binary string
	// LibDir is the directory of taproce's libibverbs.so.1, on which the
	// client steps run Debian's RDMA programs ("": found as `taproce exec`
	// finds it, see findLibrary).
	LibDir string
	// Redirect attaches the ports in redirect mode (Topology.Redirect):
	// each shares its namespace kernel's addresses on the uplink.
	Redirect bool
}

// Step is one line of the result table.
type Step struct {
	Name string
	OK   bool
	// Skipped: the step did not run for want of something this machine
	// lacks (a program, a library), which Detail names. It is no failure
	// (OK is true): the lab works without it.
	Skipped bool
	Detail  string
	Took    time.Duration
}

// PIDFile records the process of a lab kept up with --keep.
var PIDFile = "/run/taproce/lab.pid"

// ErrFailed is returned by Run when a step failed.
var ErrFailed = errors.New("lab: a step failed")

// Run builds the lab, runs every check and the exchange, prints the result
// table and tears the lab down (after an interrupt, with Keep). It returns
// ErrFailed when a step failed.
func Run(ctx context.Context, o Options) ([]Step, error) {
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.Frames == 0 {
		o.Frames = 20000
	}
	if o.RDMA == 0 {
		o.RDMA = 64 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	spec, err := impair.ParseSpec(o.Impair)
	if err != nil {
		return nil, fmt.Errorf("lab: --impair: %w", err)
	}
	if err := cleanStale(o.Prefix); err != nil {
		return nil, err
	}
	var pcap *capture.Writer
	if o.Pcap != "" {
		if pcap, err = capture.Create(o.Pcap); err != nil {
			return nil, fmt.Errorf("lab: --pcap: %w", err)
		}
		defer pcap.Close()
	}

	ex := newExchange()
	start := time.Now()
	l, err := Build(Topology{
		Prefix: o.Prefix, Hosts: o.Hosts, MTU: o.MTU, Offload: o.Offload,
		Ingress: spec, Egress: spec, Capture: pcap, Handler: ex.receive, Logger: o.Logger,
		Socket: o.Socket, LocalSwitch: o.LocalSwitch, Poll: o.Poll, Procs: o.Procs, CPUs: o.CPUs, Redirect: o.Redirect,
	})
	steps := []Step{{Name: "build", OK: err == nil, Took: time.Since(start)}}
	if err != nil {
		steps[0].Detail = err.Error()
		printSteps(o.Out, steps)
		return steps, ErrFailed
	}
	defer l.Close()
	if l.Redirect && o.KernelLoss > 0 {
		steps = append(steps, Step{Name: fmt.Sprintf("kernel loss %d%% (nftables on the veths)", o.KernelLoss), OK: true, Skipped: true,
			Detail: "not run: " + errRedirectLoss.Error()})
		o.KernelLoss = 0
	}
	l.faults = newFaults(spec, o.KernelLoss)
	wiring := "veth+bridge, TAP per host"
	if l.Redirect {
		wiring = "veth with the kernel's addresses, TAP per host in redirect mode (tc u32/mirred for UDP 4791)"
	}
	steps[0].Detail = fmt.Sprintf("%d namespaces, %s, MTU %d, super-frames %v", o.Hosts, wiring, l.MTU, l.Hosts[0].Port.Device().(*tap.Tap).Offloaded())

	if o.KernelLoss > 0 {
		if err := l.kernelLoss(o.KernelLoss); err != nil {
			steps = append(steps, Step{Name: "kernel loss (nftables)", Detail: err.Error()})
			printSteps(o.Out, steps)
			return steps, ErrFailed
		}
	}
	steps = append(steps, l.Checks(ctx)...)
	n := len(l.Hosts)
	for i, src := range l.Hosts {
		dst := l.Hosts[(i+1)%n]
		if n == 2 && i == 1 {
			dst = l.Hosts[0]
		}
		steps = append(steps, ex.run(ctx, src, dst, o.Frames, l.faults.delivery))
	}
	if o.RDMA > 0 {
		steps = append(steps, rdmaSteps(ctx, l, o.RDMA)...)
	}
	if o.Binary != "-" || o.Keep {
		more, stop := l.serveClients(ctx, o.Binary, o.LibDir)
		steps = append(steps, more...)
		if o.Keep {
			defer stop()
		} else {
			stop()
		}
	}
	if spec.Enabled() {
		steps = append(steps, impairStep(l, spec))
	}
	if o.KernelLoss > 0 {
		n, err := l.kernelDropped()
		s := Step{Name: fmt.Sprintf("kernel loss %d%% (nftables on the veths)", o.KernelLoss), OK: err == nil && n > 0,
			Detail: fmt.Sprintf("%d RoCE packets dropped by the kernels", n)}
		if err != nil {
			s.Detail = err.Error()
		}
		steps = append(steps, s)
	}
	printSteps(o.Out, steps)
	if len(l.perf) > 0 {
		printPerf(o.Out, l.perf, l.tcpBaseline(), l.perfConf)
	}
	failed := false
	for _, s := range steps {
		failed = failed || !s.OK
	}
	if o.Keep {
		if restore, err := l.appPlace(); err != nil {
			fmt.Fprintf(o.Out, "\nthe appliance stays on every processor: %v\n", err)
		} else {
			defer restore()
		}
		bin, err := executable(o.Binary)
		if err != nil {
			fmt.Fprintf(o.Out, "\n%v\n", err)
			bin = "taproce"
		}
		keep(ctx, o.Out, l, bin)
	}
	if failed {
		return steps, ErrFailed
	}
	return steps, nil
}

// Checks proves that the stations are hosts on the wire: the kernel of
// each namespace pings the port of the next over IPv4 and IPv6, its
// neighbour table then holds the port's MAC, the stations resolve each
// other, and an address no station owns gets no answer.
func (l *Lab) Checks(ctx context.Context) []Step {
	var steps []Step
	n := len(l.Hosts)
	for i, target := range l.Hosts {
		from := l.Hosts[(i+1)%n]
		for _, ip := range []netip.Addr{target.PortIPv4(), target.PortIPv6()} {
			start := time.Now()
			rtt, err := ping(from.Namespace, ip, 3*time.Second)
			s := Step{Name: fmt.Sprintf("ping %v from %s kernel", ip, from.Namespace), OK: err == nil, Took: time.Since(start)}
			switch {
			case err != nil:
				s.Detail = err.Error()
			case l.Redirect:
				s.Detail = fmt.Sprintf("rtt %v, the kernel's answer (the port shares its address, silently)", rtt.Round(time.Microsecond))
			default:
				s.Detail = fmt.Sprintf("rtt %v", rtt.Round(time.Microsecond))
			}
			steps = append(steps, s)
			mac, ok, err := Neighbor(from.Namespace, ip)
			want := target.Port.MAC()
			s = Step{Name: fmt.Sprintf("ip neigh %v in %s", ip, from.Namespace), OK: err == nil && ok && string(mac) == string(want[:])}
			s.Detail = fmt.Sprintf("%v (port MAC %v)", mac, want)
			if err != nil {
				s.Detail = err.Error()
			}
			steps = append(steps, s)
		}
	}
	a, b := l.Hosts[0], l.Hosts[1]
	for _, ip := range []netip.Addr{b.PortIPv4(), b.PortIPv6()} {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		mac, err := a.Port.Station().Resolve(cctx, ip)
		cancel()
		s := Step{Name: fmt.Sprintf("station %s resolves %v", a.Namespace, ip), OK: err == nil && mac == b.Port.MAC(), Took: time.Since(start)}
		s.Detail = mac.String()
		if err != nil {
			s.Detail = err.Error()
		}
		steps = append(steps, s)
	}
	stranger := netip.MustParseAddr("10.55.0.250")
	start := time.Now()
	_, err := ping(b.Namespace, stranger, time.Second)
	s := Step{Name: fmt.Sprintf("no answer for unowned %v", stranger), OK: errors.Is(err, errNoReply), Took: time.Since(start), Detail: "silence, as it should be"}
	if !s.OK {
		s.Detail = fmt.Sprintf("got %v", err)
	}
	steps = append(steps, s)
	return steps
}

// exchange sends RoCEv2 frames between ports and checks what arrives.
type exchange struct {
	received, intact atomic.Uint64
	tag              atomic.Uint32
	credit           chan struct{} // one per creditEvery packets received
}

// creditEvery is how many received packets hand the sender one credit.
const creditEvery = 16

func newExchange() *exchange { return &exchange{credit: make(chan struct{}, 64)} }

const exchangeQP = 0x4242

// receive is the ports' handler: it counts the exchange's packets whose
// payload carries the current tag and the pattern of its sequence number.
func (e *exchange) receive(_ int, frame []byte, p *roce.Packet) {
	if p.BTH.Opcode != roce.UDSendOnly || p.BTH.DestQP != exchangeQP || p.DETH.QKey != e.tag.Load() {
		return
	}
	if e.received.Add(1)%creditEvery == 0 {
		select {
		case e.credit <- struct{}{}:
		default:
		}
	}
	pay := p.Payload(frame)
	if len(pay) < 8 {
		return
	}
	seq := binary.BigEndian.Uint32(pay[4:8])
	for i := 8; i < len(pay); i++ {
		if pay[i] != byte(seq)+byte(i) {
			return
		}
	}
	e.intact.Add(1)
}

// run sends count UD SEND packets of a path-MTU payload from src to dst
// in batches of 32 (one super-frame each where the TAP allows) and waits
// for them to arrive. UD has no flow control of its own, so the sender
// keeps at most a window of packets in flight, as a receiver's posted
// buffers would bound it; a credit that does not come within 20 ms (a
// lost packet, under impairment) lets the next batch go.
func (e *exchange) run(ctx context.Context, src, dst *Host, count int, pass float64) Step {
	name := fmt.Sprintf("RoCE frames %s → %s", src.Namespace, dst.Namespace)
	tag := e.tag.Add(1)
	e.received.Store(0)
	e.intact.Store(0)
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	mac, err := src.Port.Station().Resolve(rctx, dst.PortIPv4())
	cancel()
	if err != nil {
		return Step{Name: name, Detail: err.Error()}
	}
	mtu := abi.MTUForNetdev(src.Port.Device().MTU()).Bytes()
	pkt := roce.Packet{
		DstMAC: mac, SrcMAC: src.Port.MAC(),
		Src: src.PortIPv4(), Dst: dst.PortIPv4(), TTL: 64, DontFragment: true,
		SrcPort: roce.DatagramSourcePort(exchangeQP), DstPort: roce.UDPPort,
		BTH:  roce.BTHFields{Opcode: roce.UDSendOnly, PKey: roce.DefaultPKey, DestQP: exchangeQP},
		DETH: roce.DETHFields{QKey: tag, SrcQP: exchangeQP},
	}
	const batch = 32
	bufs := make([][]byte, batch)
	for i := range bufs {
		bufs[i] = make([]byte, tap.Headroom+mtu+128)
	}
	payload := make([]byte, mtu)
	const window = 16 * batch
	// A rate-limited link's queues drop what they cannot hold: those
	// frames are not expected.
	queueDrops := func() uint64 {
		return src.Port.Stats().Egress.QueueDropped + dst.Port.Stats().Ingress.QueueDropped
	}
	drops0 := queueDrops()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	start := time.Now()
	var bytes int
	for sent := 0; sent < count; {
		for sent-int(e.received.Load()) >= window {
			timer.Reset(20 * time.Millisecond)
			select {
			case <-e.credit:
				continue
			case <-timer.C:
			case <-ctx.Done():
				return Step{Name: name, Detail: ctx.Err().Error()}
			}
			break
		}
		k := min(batch, count-sent)
		for i := 0; i < k; i++ {
			seq := uint32(sent + i)
			binary.BigEndian.PutUint32(payload[0:4], tag)
			binary.BigEndian.PutUint32(payload[4:8], seq)
			for j := 8; j < len(payload); j++ {
				payload[j] = byte(seq) + byte(j)
			}
			pkt.ID = uint16(seq)
			pkt.BTH.PSN = roce.PSN(seq)
			n, err := pkt.Build(bufs[i][tap.Headroom:], payload)
			if err != nil {
				return Step{Name: name, Detail: err.Error()}
			}
			bufs[i] = bufs[i][:tap.Headroom+n]
			bytes += n
		}
		if err := src.Port.Send(bufs[:k], tap.Headroom); err != nil {
			return Step{Name: name, Detail: err.Error()}
		}
		for i := 0; i < k; i++ {
			bufs[i] = bufs[i][:cap(bufs[i])]
		}
		sent += k
	}
	last, lastAt := e.received.Load(), time.Now()
	for last < uint64(count) && time.Since(lastAt) < 200*time.Millisecond {
		time.Sleep(time.Millisecond)
		if n := e.received.Load(); n != last {
			last, lastAt = n, time.Now()
		}
	}
	took := lastAt.Sub(start)
	got, ok := e.received.Load(), e.intact.Load()
	dropped := queueDrops() - drops0
	s := Step{Name: name, Took: took}
	s.Detail = fmt.Sprintf("%d sent, %d received, %d intact, %.0f MB/s, %.0f kpps", count, got, ok,
		float64(bytes)/took.Seconds()/1e6, float64(got)/took.Seconds()/1e3)
	if dropped > 0 {
		s.Detail += fmt.Sprintf(", %d dropped by the link's queues", dropped)
	}
	want := uint64(count) - min(dropped, uint64(count))
	if pass < 1 {
		// Loss and corruption are expected: what arrives must be intact,
		// and at least 90 % of what the loss rates let through.
		s.OK = ok == got && float64(got) >= 0.9*float64(want)*pass
	} else {
		s.OK = ok == want && got == want
	}
	return s
}

// impairStep reports what the ports' fault injection did, summed over
// every port and direction.
func impairStep(l *Lab, spec impair.Spec) Step {
	var sum impair.Counters
	for _, h := range l.Hosts {
		st := h.Port.Stats()
		for _, c := range []impair.Counters{st.Ingress, st.Egress} {
			sum.Frames += c.Frames
			sum.Dropped += c.Dropped
			sum.Duplicated += c.Duplicated
			sum.Reordered += c.Reordered
			sum.Corrupted += c.Corrupted
			sum.Delayed += c.Delayed
			sum.QueueDropped += c.QueueDropped
			sum.Marked += c.Marked
		}
	}
	return Step{
		Name: "impairment (" + spec.String() + ")",
		OK:   sum.Frames > 0,
		Detail: fmt.Sprintf("%d frames: %d dropped, %d duplicated, %d reordered, %d corrupted, %d delayed, %d queue-dropped, %d marked",
			sum.Frames, sum.Dropped, sum.Duplicated, sum.Reordered, sum.Corrupted, sum.Delayed, sum.QueueDropped, sum.Marked),
	}
}

func printSteps(w io.Writer, steps []Step) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tRESULT\tTIME\tDETAIL")
	for _, s := range steps {
		r := "ok"
		switch {
		case !s.OK:
			r = "FAIL"
		case s.Skipped:
			r = "skip"
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\n", s.Name, r, s.Took.Round(time.Millisecond), s.Detail)
	}
	tw.Flush()
}

// keep leaves the lab up until the context ends or a signal arrives.
func keep(ctx context.Context, w io.Writer, l *Lab, binary string) {
	_ = os.MkdirAll(filepath.Dir(PIDFile), 0o755)
	_ = os.WriteFile(PIDFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
	defer os.Remove(PIDFile)
	keepMessage(w, l, binary)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	select {
	case <-ctx.Done():
	case <-sig:
	}
}

// keepMessage tells the user of a kept lab how to use it and take it
// down, in commands that work as printed: they name the taproce binary
// the lab runs (nothing installs one as "taproce" on the PATH) and run
// in the host's namespace with the lab's socket.
func keepMessage(w io.Writer, l *Lab, binary string) {
	srv, cli := l.Hosts[0], l.Hosts[1]
	env := func(h *Host) string {
		return fmt.Sprintf("ip netns exec %s env TAPROCE_SOCKET=%s", h.Namespace, l.Socket)
	}
	fmt.Fprintf(w, "\nThe lab stays up until this process ends: Ctrl-C here, or in a second terminal\n  %s lab down\n", binary)
	fmt.Fprintf(w, "Try it from a second terminal (as root): a perf server in %s,\n  %s %s perf write_bw\n", srv.Namespace, env(srv), binary)
	fmt.Fprintf(w, "then, from a third, its client in %s:\n  %s %s perf write_bw %v\n", cli.Namespace, env(cli), binary, srv.KernelAddrs[0].Addr())
	if l.lib.ok() && l.lib.found.Dir != "" {
		lenv := func(h *Host) string { return env(h) + " LD_LIBRARY_PATH=" + l.lib.found.Dir }
		fmt.Fprintf(w, "Debian's RDMA programs run on it through taproce's libibverbs.so.1: ib_write_bw's server and client,\n  %s ib_write_bw -d %s -x 1\n  %s ib_write_bw -d %s -x 1 %v\n",
			lenv(srv), srv.Device, lenv(cli), cli.Device, srv.KernelAddrs[0].Addr())
	}
	if l.Redirect && l.lib.ok() && l.lib.found.Dir != "" && fileExists(filepath.Join(l.lib.found.Dir, "librdmacm.so.1")) {
		lenv := func(h *Host) string { return env(h) + " LD_LIBRARY_PATH=" + l.lib.found.Dir }
		fmt.Fprintf(w, "Programs that connect with the RDMA CM at the kernel's address run on its librdmacm.so.1 too: qperf's server and an RC test,\n  %s qperf\n  %s qperf -cm1 %v rc_bw\n",
			lenv(srv), lenv(cli), srv.PortIPv4())
	}
	fmt.Fprintln(w, "A shell in a host, whose verbs clients (the same binary) use that host's port:")
	for _, h := range l.Hosts {
		if l.Redirect {
			fmt.Fprintf(w, "  %s bash    # port and kernel %v %v, MAC %v\n", env(h), h.PortIPv4(), h.PortIPv6(), h.Port.MAC())
			continue
		}
		fmt.Fprintf(w, "  %s bash    # port %v %v MAC %v, kernel %v\n", env(h), h.PortIPv4(), h.PortIPv6(), h.Port.MAC(), h.KernelAddrs[0].Addr())
	}
	if strings.Contains(binary, "/go-build") {
		fmt.Fprintln(w, "(That is the binary `go run` built, which may not outlive this lab; `go build -o taproce .` in the repository makes one that stays.)")
	}
	if l.Redirect {
		fmt.Fprintf(w, "The client's out-of-band exchange and RDMA go to the same address of the server host (%v): each port shares its kernel's addresses (redirect mode).\n",
			srv.PortIPv4())
		return
	}
	fmt.Fprintf(w, "The client's out-of-band exchange goes to the server host's kernel address (%v); RDMA goes to its port's (%v).\n",
		srv.KernelAddrs[0].Addr(), srv.PortIPv4())
}

// fileExists reports whether path names a file.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// cleanStale removes what a killed lab left behind: its namespaces and PID
// file. A lab that is still running (--keep) is left alone, with an error.
func cleanStale(prefix string) error {
	if pid, ok := runningLab(); ok {
		return fmt.Errorf("lab: a lab is running (pid %d); stop it with `taproce lab down`", pid)
	}
	_ = os.Remove(PIDFile)
	names, err := netnsutil.List(prefix)
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	var errs []error
	for _, n := range names {
		errs = append(errs, netnsutil.Delete(n))
	}
	return errors.Join(errs...)
}

// runningLab returns the PID of a kept lab that is still alive.
func runningLab() (int, bool) {
	data, err := os.ReadFile(PIDFile)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return 0, false
	}
	if syscall.Kill(pid, 0) != nil {
		return 0, false
	}
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return pid, strings.Contains(string(cmd), "lab")
}

// Removed is what Down took away.
type Removed struct {
	// Prefix is the lab's namespace prefix.
	Prefix string
	// PID is the process of the kept lab Down stopped; 0 when none ran.
	PID int
	// Namespaces are the lab's namespaces that were there and are gone,
	// whether the stopped lab removed them or Down did.
	Namespaces []string
}

// String says what was removed or, when nothing was, that there was no
// lab: "lab removed" after a command that found nothing would mislead.
func (r Removed) String() string {
	ns := "namespaces " + strings.Join(r.Namespaces, ", ")
	switch {
	case r.PID != 0 && len(r.Namespaces) > 0:
		return fmt.Sprintf("stopped the kept lab (pid %d) and removed its %s", r.PID, ns)
	case r.PID != 0:
		return fmt.Sprintf("stopped the kept lab (pid %d)", r.PID)
	case len(r.Namespaces) > 0:
		return "removed " + ns + ", left behind by a lab that did not end"
	}
	return fmt.Sprintf("no lab to remove: no kept lab is running and no namespace starts with %s", r.Prefix)
}

// Down stops a kept lab and removes every namespace of the lab prefix,
// and says what it removed.
func Down(prefix string) (Removed, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	r := Removed{Prefix: prefix}
	before, err := netnsutil.List(prefix)
	if err != nil {
		return r, fmt.Errorf("lab: %w", err)
	}
	if pid, ok := runningLab(); ok {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		waitFor(10*time.Second, func() bool { return syscall.Kill(pid, 0) != nil })
		r.PID = pid
	}
	err = cleanStale(prefix)
	after, lerr := netnsutil.List(prefix)
	if lerr != nil {
		return r, errors.Join(err, fmt.Errorf("lab: %w", lerr))
	}
	for _, n := range before {
		if !slices.Contains(after, n) {
			r.Namespaces = append(r.Namespaces, n)
		}
	}
	return r, err
}

// expectedDelivery is the share of the exchange's packets that the lab's
// faults let through: each crosses two impaired directions (the sender's
// egress, the receiver's ingress) and, with kernel loss, one veth with a
// drop rule.
func expectedDelivery(spec impair.Spec, kernelLoss int) float64 {
	port := (1 - spec.Loss) * (1 - spec.Corrupt)
	return port * port * (1 - float64(kernelLoss)/100)
}
