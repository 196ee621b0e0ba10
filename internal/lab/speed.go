package lab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/internal/cpulist"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/tap"
)

// SpeedOptions says what Speed measures.
type SpeedOptions struct {
	// Prefix of the lab's namespaces.
	Prefix string
	// Poll is how the appliance waits: on its TAPs and on its clients'
	// rings.
	Poll appliance.PollMode
	// Procs is how many processors the appliance runs on (config procs;
	// 0: as Poll chooses). The baselines run on all of them.
	Procs int
	// CPUs is the processors the appliance runs on (config cpus; "":
	// all), the client processes running on the others. The baselines
	// run on all of them.
	CPUs string
	// Binary is the taproce executable the perf client processes run.
	Binary string
	// Socket is the appliance's control socket (default DefaultSocket).
	Socket string
	// LibDir is the directory of taproce's libibverbs.so.1 for Debian's
	// ib_write_bw and ib_send_lat ("": found as the lab finds it); with
	// none, or without perftest, those figures are 0.
	LibDir string
	// BWIters and LatIters are the iterations of the perf runs (defaults
	// 20000 and 5000), and LatIters also those of the events ping-pong;
	// TCPBytes what each run of the TCP baseline moves (256 MiB), TCPRuns
	// how many runs its median is taken of (5); RawRounds the round trips
	// of the raw ping-pong (20000).
	//
	// One TCP run is a poor baseline on a small machine: ten runs of
	// 256 MiB in one lab on 2 cores gave 1.2 to 2.6 GB/s, where
	// write_bw's 20000 iterations stayed within ±7 %.
	BWIters, LatIters, TCPBytes, TCPRuns, RawRounds int
	// MTU of the lab's veths, bridges and TAPs (default 9000).
	MTU int
	// Local measures the local switch too, in a second lab of the same
	// configuration whose ports cross in memory (config local_switch):
	// send_lat and the events ping-pong as on the TAP path, and RDMA
	// WRITE and READ of 1 MiB (LocalIters of each, default 2000) next to
	// a copy of 1 MiB in this process.
	Local      bool
	LocalIters int
}

// SpeedResult is what Speed measured, every figure next to its baseline
// from the same run and the same veth.
type SpeedResult struct {
	Poll appliance.PollMode
	// WriteBW is `taproce perf write_bw -s 65536` between the two hosts'
	// client processes, TCP one TCP stream between the hosts' kernels over
	// the same veth (the median of SpeedOptions.TCPRuns runs); both in
	// bytes per second.
	WriteBW, TCP float64
	// SendLat is `taproce perf send_lat -s 2`'s typical (median) half
	// round trip; Raw the median half round trip of a frame bounced
	// between two bare TAPs, one on each host's bridge, read the way the
	// appliance reads (sleeping in block mode, busy-polling otherwise).
	SendLat, Raw time.Duration
	// Events is `taproce pingpong -e -s 2`'s usec/iter halved (one way): an
	// application that sleeps on its completion channel for every
	// completion, as `ibv_rc_pingpong -e` does.
	Events time.Duration
	// LibWriteBW and LibSendLat are Debian's ib_write_bw and
	// ib_send_lat, unmodified, on taproce's libibverbs.so.1, each run
	// right after the taproce perf test it stands beside (0: not run;
	// LibWhy says why).
	LibWriteBW float64
	LibSendLat time.Duration
	LibWhy     string
	// RawSpin tells whether the raw ping-pong busy-polled.
	RawSpin bool
	// Procs is how many processors the appliance ran on (GOMAXPROCS).
	Procs int
	// CPUs is the processors the appliance ran on ("": all).
	CPUs string
	// MTU is the lab's.
	MTU int

	// The local switch's figures (SpeedOptions.Local; 0 when not
	// measured): LocalSendLat and LocalEvents as SendLat and Events;
	// LocalWrite and LocalRead `taproce perf write_bw` and `read_bw` of
	// 1 MiB, Memcpy a copy of 1 MiB between two buffers of this process,
	// in bytes per second.
	LocalSendLat, LocalEvents     time.Duration
	LocalWrite, LocalRead, Memcpy float64
}

// BWRatio is WriteBW over TCP.
func (r *SpeedResult) BWRatio() float64 { return r.WriteBW / r.TCP }

// LatRatio is SendLat over Raw.
func (r *SpeedResult) LatRatio() float64 { return float64(r.SendLat) / float64(r.Raw) }

// LibBWRatio is LibWriteBW over WriteBW: Debian's ib_write_bw on the
// library against taproce perf on the Go library (target ≥ 0.95).
func (r *SpeedResult) LibBWRatio() float64 { return r.LibWriteBW / r.WriteBW }

// LibLatRatio is LibSendLat over SendLat (target ≤ 1.1).
func (r *SpeedResult) LibLatRatio() float64 { return float64(r.LibSendLat) / float64(r.SendLat) }

// EventsRatio is Events over Raw.
func (r *SpeedResult) EventsRatio() float64 { return float64(r.Events) / float64(r.Raw) }

// LocalLatRatio is LocalSendLat over SendLat: a message between two
// clients of one appliance against one through the TAPs (target ≤ 0.5).
func (r *SpeedResult) LocalLatRatio() float64 { return float64(r.LocalSendLat) / float64(r.SendLat) }

// LocalEventsRatio is LocalEvents over Events (target ≤ 1.0: no worse
// than the TAP path).
func (r *SpeedResult) LocalEventsRatio() float64 { return float64(r.LocalEvents) / float64(r.Events) }

// LocalWriteRatio is LocalWrite over Memcpy (target ≥ 0.8).
func (r *SpeedResult) LocalWriteRatio() float64 { return r.LocalWrite / r.Memcpy }

// LocalReadRatio is LocalRead over LocalWrite (target ≥ 0.8).
func (r *SpeedResult) LocalReadRatio() float64 { return r.LocalRead / r.LocalWrite }

// Speed builds a two-host lab (MTU o.MTU, super-frames) whose appliance
// waits as o.Poll says, and measures its TAP path against baselines taken
// in the same run: RDMA WRITE bandwidth against TCP over the same veth,
// and SEND latency — polled, and waited for on completion events —
// against a raw frame ping-pong between two TAPs. With o.Local it then
// measures the local switch in a second lab (see SpeedOptions.Local).
func Speed(ctx context.Context, o SpeedOptions) (*SpeedResult, error) {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.BWIters == 0 {
		o.BWIters = 20000
	}
	if o.LatIters == 0 {
		o.LatIters = 5000
	}
	if o.TCPBytes == 0 {
		o.TCPBytes = 256 << 20
	}
	if o.TCPRuns == 0 {
		o.TCPRuns = 5
	}
	if o.RawRounds == 0 {
		o.RawRounds = 20000
	}
	if o.MTU == 0 {
		o.MTU = 9000
	}
	if o.LocalIters == 0 {
		o.LocalIters = 2000
	}
	res := &SpeedResult{Poll: o.Poll, RawSpin: o.Poll.Linger() != 0, CPUs: o.CPUs, MTU: o.MTU}
	if err := speedTAP(ctx, o, res); err != nil {
		return nil, err
	}
	if o.Local {
		if err := speedLocal(ctx, o, res); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// speedLab builds Speed's lab, with the local switch or without.
func speedLab(o SpeedOptions, local bool) (*Lab, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	return Build(Topology{Prefix: o.Prefix, Hosts: 2, MTU: o.MTU, Offload: true, Poll: o.Poll, Procs: o.Procs, CPUs: o.CPUs,
		Socket: o.Socket, LocalSwitch: local, Logger: quiet})
}

// serveClients places the appliance of l as its poll mode says and
// serves its control socket until the returned stop is called.
func serveClients(ctx context.Context, l *Lab) (stop func(), err error) {
	restore, err := l.appPlace()
	if err != nil {
		return nil, err
	}
	if err := l.App.Control().Listen(); err != nil {
		restore()
		return nil, fmt.Errorf("lab: control socket: %w", err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.App.Serve(sctx) }()
	return func() { cancel(); <-done; restore() }, nil
}

// perfOne runs one `taproce perf` test between l's first two hosts.
func (l *Lab) perfOne(ctx context.Context, binary, test string, size, iters int) (perfRow, error) {
	row := l.perfPair(ctx, binary, perfRun{test, size, iters})
	if !row.ok {
		return row, fmt.Errorf("lab: perf %s: %s", test, row.detail)
	}
	return row, nil
}

// speedTAP is Speed's measurement of the TAP path.
func speedTAP(ctx context.Context, o SpeedOptions, res *SpeedResult) error {
	l, err := speedLab(o, false)
	if err != nil {
		return err
	}
	defer l.Close()
	a, b := l.Hosts[0], l.Hosts[1]

	// While the baselines run, the appliance's polling loop naps, so that
	// it takes no core from them.
	rest := func(on bool) {
		nap := time.Duration(0)
		if on {
			nap = time.Millisecond
		}
		l.App.Loop().SetRest(nap)
	}
	rest(true)
	tcp := make([]float64, o.TCPRuns)
	for i := range tcp {
		if tcp[i], err = TCPThroughput(a, b, o.TCPBytes); err != nil {
			return fmt.Errorf("lab: TCP baseline: %w", err)
		}
	}
	slices.Sort(tcp)
	res.TCP = tcp[len(tcp)/2]
	spin := time.Duration(0)
	if res.RawSpin {
		spin = -1
	}
	if res.Raw, err = RawPingPong(a, b, o.RawRounds, spin); err != nil {
		return err
	}
	rest(false)

	// The baselines above had all the processors.
	stop, err := serveClients(ctx, l)
	if err != nil {
		return err
	}
	defer stop()
	res.Procs = runtime.GOMAXPROCS(0)
	lib, _ := findLibrary(ctx, o.LibDir, o.Binary)
	debian := func(tool debianTool, size, iters int) (perfRow, error) {
		r := perfRun{tool.name, size, iters}
		path, s, ok := lib.notRun(tool.name, tool)
		if !ok {
			res.LibWhy = s.Detail
			return perfRow{}, nil
		}
		args := []string{"-x", "1", "-F", "-s", fmt.Sprint(size), "-n", fmt.Sprint(iters)}
		_, out, err := l.pairEnv(ctx, lib.env(l.Socket), path, a, b, append([]string{"-d", b.Device}, args...),
			append([]string{"-d", a.Device}, args...), exchangePort, 300*time.Second)
		if err != nil {
			return perfRow{}, fmt.Errorf("lab: %s: %w", tool.name, err)
		}
		row := perfRow{run: r}
		row.ok, row.bw, row.rate, row.lat, row.detail = parsePerftest(out, r)
		if !row.ok {
			return row, fmt.Errorf("lab: %s: %s", tool.name, row.detail)
		}
		return row, nil
	}
	bw, err := l.perfOne(ctx, o.Binary, "write_bw", 65536, o.BWIters)
	if err != nil {
		return err
	}
	res.WriteBW = bw.bw * (1 << 20)
	if bw, err = debian(writeBWTool, 65536, o.BWIters); err != nil {
		return err
	}
	res.LibWriteBW = bw.bw * (1 << 20)
	lat, err := l.perfOne(ctx, o.Binary, "send_lat", 2, o.LatIters)
	if err != nil {
		return err
	}
	res.SendLat = time.Duration(lat.lat * float64(time.Microsecond))
	if lat, err = debian(sendLatTool, 2, o.LatIters); err != nil {
		return err
	}
	res.LibSendLat = time.Duration(lat.lat * float64(time.Microsecond))
	if res.Events, err = l.eventsPingPong(ctx, o.Binary, o.LatIters); err != nil {
		return err
	}
	return nil
}

// speedLocal is Speed's measurement of the local switch.
func speedLocal(ctx context.Context, o SpeedOptions, res *SpeedResult) error {
	l, err := speedLab(o, true)
	if err != nil {
		return err
	}
	defer l.Close()
	stop, err := serveClients(ctx, l)
	if err != nil {
		return err
	}
	defer stop()
	lat, err := l.perfOne(ctx, o.Binary, "send_lat", 2, o.LatIters)
	if err != nil {
		return err
	}
	res.LocalSendLat = time.Duration(lat.lat * float64(time.Microsecond))
	if res.LocalEvents, err = l.eventsPingPong(ctx, o.Binary, o.LatIters); err != nil {
		return err
	}
	const mib = 1 << 20
	w, err := l.perfOne(ctx, o.Binary, "write_bw", mib, o.LocalIters)
	if err != nil {
		return err
	}
	res.LocalWrite = w.bw * mib
	r, err := l.perfOne(ctx, o.Binary, "read_bw", mib, o.LocalIters)
	if err != nil {
		return err
	}
	res.LocalRead = r.bw * mib
	res.Memcpy = memcpyRate(mib, o.LocalIters)
	return nil
}

// memcpyRate copies size bytes between two buffers n times and returns
// the bytes per second: the local switch's baseline, where a WRITE or a
// READ is one such copy from one client's memory to another's.
func memcpyRate(size, n int) float64 {
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // both in the cache, as the RDMA runs' buffers are
	start := time.Now()
	for range n {
		copy(dst, src)
	}
	return float64(n*size) / time.Since(start).Seconds()
}

// eventsPingPong runs `taproce pingpong -e` with 2-byte messages between
// the first two hosts' client processes and returns its usec/iter halved.
func (l *Lab) eventsPingPong(ctx context.Context, binary string, iters int) (time.Duration, error) {
	a, b := l.Hosts[0], l.Hosts[1]
	args := []string{"-g", "1", "-n", fmt.Sprint(iters), "-s", "2", "-e"}
	_, out, err := l.pair(ctx, binary, a, b, append([]string{"pingpong", "-d", b.Device}, args...),
		append([]string{"pingpong", "-d", a.Device}, args...), exchangePort, 120*time.Second)
	if err != nil {
		return 0, fmt.Errorf("lab: pingpong -e: %w", err)
	}
	m := itersRe.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("lab: pingpong -e: no result line: %s", lastLine(out))
	}
	usec, err := strconv.ParseFloat(m[3], 64)
	if err != nil {
		return 0, fmt.Errorf("lab: pingpong -e: %w", err)
	}
	return time.Duration(usec / 2 * float64(time.Microsecond)), nil
}

// ApplianceCPUs returns the upper half of the processors this process
// may use — at least one, and leaving at least one to the clients — as a
// processor list for SpeedOptions.CPUs and Topology.CPUs; "" when the
// process has a single processor.
func ApplianceCPUs() (string, error) {
	allowed, err := cpulist.Allowed()
	if err != nil {
		return "", fmt.Errorf("lab: %w", err)
	}
	all := cpulist.List(allowed)
	if len(all) < 2 {
		return "", nil
	}
	return cpulist.Format(cpulist.Of(all[len(all)/2:]...)), nil
}

// rawMAC is the address of the raw ping-pong's TAP in host i.
func rawMAC(i int) net.HardwareAddr { return net.HardwareAddr{0x02, 0x72, 0x61, 0x77, 0x00, byte(i)} }

// rawFrameMax is the largest frame the raw ping-pong's TAPs deliver.
const rawFrameMax = 14 + 9000

// rawEtherType marks the raw ping-pong's frames (IEEE local experimental).
const rawEtherType = 0x88B5

// RawPingPong bounces a minimum-size frame between two bare TAPs, one on
// each host's bridge (TAP → bridge → veth → bridge → TAP, the path of the
// ports' frames), rounds times, and returns the median half round trip.
// spin is how the TAPs' reads wait (tap.Tap.SetSpin): 0 sleeps, negative
// busy-polls.
func RawPingPong(a, b *Host, rounds int, spin time.Duration) (time.Duration, error) {
	ta, err := rawTAP(a, spin)
	if err != nil {
		return 0, err
	}
	defer ta.Close()
	tb, err := rawTAP(b, spin)
	if err != nil {
		return 0, err
	}
	defer tb.Close()

	// The echo side: every frame for its MAC goes back to its source.
	echoed := make(chan error, 1)
	go func() {
		buf := make([]byte, tap.Headroom+rawFrameMax)
		bufs, sizes := [][]byte{buf}, []int{0}
		for {
			n, err := tb.Read(bufs, sizes, tap.Headroom)
			if err != nil {
				if errors.Is(err, tap.ErrClosed) {
					err = nil
				}
				echoed <- err
				return
			}
			f := buf[tap.Headroom : tap.Headroom+sizes[0]]
			if n != 1 || len(f) < 14 || !slices.Equal(f[:6], rawMAC(b.Index)) {
				continue
			}
			copy(f[:6], f[6:12])
			copy(f[6:12], rawMAC(b.Index))
			if _, err := tb.Write([][]byte{buf[:tap.Headroom+len(f)]}, tap.Headroom); err != nil {
				echoed <- err
				return
			}
		}
	}()
	frame := make([]byte, tap.Headroom+60)
	f := frame[tap.Headroom:]
	copy(f[:6], rawMAC(b.Index))
	copy(f[6:12], rawMAC(a.Index))
	binary.BigEndian.PutUint16(f[12:14], rawEtherType)
	buf := make([]byte, tap.Headroom+rawFrameMax)
	bufs, sizes := [][]byte{buf}, []int{0}
	// The first round trips teach the bridges where the MACs are.
	const warm = 100
	rtts := make([]time.Duration, 0, rounds)
	// A frame lost for good ends the run instead of hanging it.
	watchdog := time.AfterFunc(30*time.Second+time.Duration(rounds)*time.Millisecond, func() { ta.Close() })
	defer watchdog.Stop()
	for i := 0; i < warm+rounds; i++ {
		binary.BigEndian.PutUint32(f[14:18], uint32(i))
		start := time.Now()
		if _, err := ta.Write([][]byte{frame}, tap.Headroom); err != nil {
			return 0, fmt.Errorf("lab: raw ping-pong: %w", err)
		}
		for {
			n, err := ta.Read(bufs, sizes, tap.Headroom)
			if err != nil {
				return 0, fmt.Errorf("lab: raw ping-pong, round %d: %w", i, err)
			}
			g := buf[tap.Headroom : tap.Headroom+sizes[0]]
			if n == 1 && len(g) >= 18 && slices.Equal(g[:6], rawMAC(a.Index)) && binary.BigEndian.Uint32(g[14:18]) == uint32(i) {
				break
			}
		}
		if i >= warm {
			rtts = append(rtts, time.Since(start))
		}
	}
	ta.Close()
	tb.Close()
	if err := <-echoed; err != nil {
		return 0, fmt.Errorf("lab: raw ping-pong echo: %w", err)
	}
	slices.Sort(rtts)
	return rtts[len(rtts)/2] / 2, nil
}

// rawTAP opens the raw ping-pong's TAP in host h and puts it on h's
// bridge.
func rawTAP(h *Host, spin time.Duration) (*tap.Tap, error) {
	const name = "rawpp0"
	// The device has an address of its own: a bridge keeps frames for
	// one of its ports' addresses for itself.
	devMAC := rawMAC(h.Index)
	devMAC[4] = 0xD
	t, err := tap.Create(tap.Config{Name: name, Netns: netnsutil.Path(h.Namespace), MAC: devMAC, MTU: 9000})
	if err != nil {
		return nil, fmt.Errorf("lab: raw ping-pong: %w", err)
	}
	if err := netnsutil.AttachToBridge(netnsutil.Path(h.Namespace), name, h.Bridge); err != nil {
		t.Close()
		return nil, fmt.Errorf("lab: raw ping-pong: %w", err)
	}
	t.SetSpin(spin)
	return t, nil
}
