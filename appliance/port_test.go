package appliance

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/impair"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/internal/spin"
	"github.com/taproce/taproce/tap"
)

var (
	peerMAC = roce.MAC{0x02, 0, 0, 0, 0, 0xbb}
	portV4  = netip.MustParseAddr("10.55.0.1")
	peerV4  = netip.MustParseAddr("10.55.0.2")
)

// wire is the test's end of a fake TAP pair: one reader goroutine hands
// the frames the port sends, announcements left out, to a channel.
type wire struct {
	t      *testing.T
	dev    *tap.Fake
	frames chan []byte
	err    chan error
}

func newWire(t *testing.T, dev *tap.Fake) wire {
	w := wire{t: t, dev: dev, frames: make(chan []byte, 1024), err: make(chan error, 1)}
	go func() {
		bufs, sizes := [][]byte{make([]byte, 9000)}, []int{0}
		for {
			if _, err := dev.Read(bufs, sizes, 0); err != nil {
				w.err <- err
				return
			}
			if f := append([]byte(nil), bufs[0][:sizes[0]]...); !isAnnouncement(f) {
				w.frames <- f
			}
		}
	}()
	return w
}

// next returns the next frame the port sent, or nil after timeout; a
// failed read fails the test.
func (w wire) next(timeout time.Duration) []byte {
	w.t.Helper()
	select {
	case f := <-w.frames:
		return f
	case err := <-w.err:
		w.t.Fatalf("reading the wire: %v", err)
	case <-time.After(timeout):
	}
	return nil
}

// isAnnouncement reports gratuitous ARPs and unsolicited neighbour adverts.
func isAnnouncement(f []byte) bool {
	eth := roce.Ethernet(f)
	if eth.EtherType() == roce.EtherTypeARP {
		return bytes.Equal(f[14+14:14+18], f[14+24:14+28])
	}
	return eth.EtherType() == roce.EtherTypeIPv6 && len(f) > 54 && f[54] == 136 && roce.IPv6(f[14:]).Dst() == netip.MustParseAddr("ff02::1")
}

func (w wire) send(f []byte) {
	w.t.Helper()
	if _, err := w.dev.Write([][]byte{f}, 0); err != nil {
		w.t.Fatal(err)
	}
}

func newTestPort(t *testing.T, cfg PortConfig) (*Port, wire) {
	t.Helper()
	a, b := tap.NewFakePair(1500, 256)
	cfg.Namespace, cfg.Name = "test", "roce0"
	cfg.Addrs = []netip.Prefix{netip.MustParsePrefix("10.55.0.1/24"), netip.MustParsePrefix("fd55::1/64")}
	p, err := NewPort(a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(); b.Close() })
	return p, newWire(t, b)
}

func arpRequest(target netip.Addr) []byte {
	f := make([]byte, 42)
	for i := 0; i < 6; i++ {
		f[i] = 0xff
	}
	copy(f[6:12], peerMAC[:])
	binary.BigEndian.PutUint16(f[12:], roce.EtherTypeARP)
	a := f[14:]
	binary.BigEndian.PutUint16(a[0:], 1)
	binary.BigEndian.PutUint16(a[2:], 0x0800)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], 1)
	copy(a[8:14], peerMAC[:])
	s, tg := peerV4.As4(), target.As4()
	copy(a[14:18], s[:])
	copy(a[24:28], tg[:])
	return f
}

func roceTo(t *testing.T, dst roce.MAC, qp uint32) []byte {
	p := roce.Packet{
		DstMAC: dst, SrcMAC: peerMAC, Src: peerV4, Dst: portV4, TTL: 64,
		SrcPort: 0xC123, DstPort: roce.UDPPort,
		BTH: roce.BTHFields{Opcode: roce.RCSendOnly, PKey: 0xFFFF, DestQP: qp},
	}
	buf := make([]byte, 256)
	n, err := p.Build(buf, []byte("over the fake wire"))
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

func TestDeriveMAC(t *testing.T) {
	a, b := DeriveMAC("ns-a", "roce0"), DeriveMAC("ns-b", "roce0")
	if a == b || a != DeriveMAC("ns-a", "roce0") {
		t.Fatal("derived MACs not stable and distinct")
	}
	for _, m := range []roce.MAC{a, b} {
		if m[0]&1 != 0 || m[0]&2 == 0 {
			t.Fatalf("%v is not a locally administered unicast MAC", m)
		}
	}
}

// TestPortStation runs the station through the port on a fake TAP: ARP
// answered with the port's MAC, RoCE delivered to the handler, a frame for
// another MAC dropped — the device read by a reader of the port's own and
// by a polling loop (PortConfig.Loop).
func TestPortStation(t *testing.T) {
	for _, polled := range []bool{false, true} {
		t.Run(map[bool]string{false: "reader", true: "loop"}[polled], func(t *testing.T) {
			testPortStation(t, polled)
		})
	}
}

func testPortStation(t *testing.T, polled bool) {
	var loop *spin.Loop
	if polled {
		loop = spin.NewLoop()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { loop.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	var handled atomic.Uint32
	p, w := newTestPort(t, PortConfig{Loop: loop, Handler: func(frame []byte, pkt *roce.Packet) {
		if pkt.BTH.DestQP == 0x77 && string(pkt.Payload(frame)) == "over the fake wire" {
			handled.Add(1)
		}
	}})
	if (p.tr != nil) != polled {
		t.Fatalf("polled by the loop: %v, want %v", p.tr != nil, polled)
	}
	w.send(arpRequest(portV4))
	rep := w.next(2 * time.Second)
	if rep == nil || roce.Ethernet(rep).Src() != p.MAC() || binary.BigEndian.Uint16(rep[20:22]) != 2 {
		t.Fatalf("ARP reply %x", rep)
	}
	w.send(roceTo(t, p.MAC(), 0x77))
	w.send(roceTo(t, roce.MAC{0x02, 9, 9, 9, 9, 9}, 0x77))
	deadline := time.Now().Add(2 * time.Second)
	for handled.Load() < 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	if handled.Load() != 1 {
		t.Fatalf("handler saw %d packets, want 1", handled.Load())
	}
	st := p.Stats()
	if st.Station.Delivered != 1 || st.Station.Drops[0] != 1 || st.RxFrames != 3 || st.TxFrames < 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestPortSendCaptureImpair: Send reaches the wire and the capture; an
// egress that drops everything reaches neither the wire nor a peer, and
// counts it.
func TestPortSendCaptureImpair(t *testing.T) {
	path := filepath.Join(t.TempDir(), "port.pcap")
	cw, err := capture.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	p, w := newTestPort(t, PortConfig{Capture: cw})
	frame := append(make([]byte, tap.Headroom), roceTo(t, peerMAC, 1)...)
	if err := p.Send([][]byte{frame}, tap.Headroom); err != nil {
		t.Fatal(err)
	}
	if got := w.next(2 * time.Second); !bytes.Equal(got, frame[tap.Headroom:]) {
		t.Fatalf("wire got %x", got)
	}
	p.Close()
	cw.Close()
	frames, err := capture.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range frames {
		found = found || bytes.Equal(f.Data, frame[tap.Headroom:])
	}
	if !found {
		t.Fatalf("sent frame not in the capture of %d frames", len(frames))
	}

	spec, err := impair.ParseSpec("loss=100%")
	if err != nil {
		t.Fatal(err)
	}
	q, w2 := newTestPort(t, PortConfig{Egress: spec})
	for i := 0; i < 10; i++ {
		if err := q.Send([][]byte{frame}, tap.Headroom); err != nil {
			t.Fatal(err)
		}
	}
	if got := w2.next(200 * time.Millisecond); got != nil {
		t.Fatalf("a frame crossed a 100%% loss egress: %x", got)
	}
	if c := q.Stats().Egress; c.Dropped < 10 {
		t.Fatalf("egress counters %+v", c)
	}
}

// sink is a device that takes every frame and counts it, and never
// delivers any: for measuring the port's own paths.
type sink struct {
	frames atomic.Uint64
	done   chan struct{}
}

func (s *sink) Read([][]byte, []int, int) (int, error) { <-s.done; return 0, tap.ErrClosed }
func (s *sink) Write(bufs [][]byte, _ int) (int, error) {
	s.frames.Add(uint64(len(bufs)))
	return len(bufs), nil
}
func (s *sink) BatchSize() int { return 1 }
func (s *sink) Name() string   { return "sink" }
func (s *sink) MTU() int       { return 1500 }
func (s *sink) Close() error   { close(s.done); return nil }

// TestPortZeroAllocs: delivering frames to the station and handler,
// answering ARP, and sending allocate nothing.
func TestPortZeroAllocs(t *testing.T) {
	dev := &sink{done: make(chan struct{})}
	var handled atomic.Uint64
	p, err := NewPort(dev, PortConfig{
		Namespace: "test", Addrs: []netip.Prefix{netip.MustParsePrefix("10.55.0.1/24")},
		Handler: func([]byte, *roce.Packet) { handled.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	roceFrame := roceTo(t, p.MAC(), 5)
	arp := arpRequest(portV4)
	out := [][]byte{append(make([]byte, tap.Headroom), roceTo(t, peerMAC, 1)...)}
	for _, c := range []struct {
		name string
		fn   func()
	}{
		{"deliver RoCE", func() { p.ingressMu.Lock(); p.deliverLocked(roceFrame); p.ingressMu.Unlock() }},
		{"answer ARP", func() { p.ingressMu.Lock(); p.deliverLocked(arp); p.ingressMu.Unlock() }},
		{"send", func() { _ = p.Send(out, tap.Headroom) }},
	} {
		if a := testing.AllocsPerRun(200, c.fn); a != 0 {
			t.Errorf("%s: %v allocations", c.name, a)
		}
	}
	if handled.Load() == 0 || dev.frames.Load() == 0 {
		t.Fatalf("nothing happened: handled %d, written %d", handled.Load(), dev.frames.Load())
	}
}

// failingDev is a fake TAP whose reads fail while fail is set.
type failingDev struct {
	*tap.Fake
	fail  atomic.Bool
	tries atomic.Int64
}

func (d *failingDev) TryReadEach(fn func([]byte)) (int, error) {
	d.tries.Add(1)
	if d.fail.Load() {
		return 0, errors.New("device gone wrong")
	}
	return d.Fake.TryReadEach(fn)
}

// levelCounter is a slog handler that counts the records of each level.
type levelCounter struct {
	mu sync.Mutex
	n  map[slog.Level]int
}

func (c *levelCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *levelCounter) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[slog.Level]int{}
	}
	c.n[r.Level]++
	return nil
}
func (c *levelCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *levelCounter) WithGroup(string) slog.Handler      { return c }

func (c *levelCounter) count(l slog.Level) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[l]
}

// TestPortLoopReadFails: on a polling loop, a port whose reads fail is
// down (OnLink false) and reads again only every millisecond, leaving the
// loop to its other work; it warns once, not at every failed read, and
// counts them (RxErrors); once reads work it is up again (OnLink true).
func TestPortLoopReadFails(t *testing.T) {
	loop := spin.NewLoop()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { loop.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	a, b := tap.NewFakePair(1500, 16)
	defer b.Close()
	dev := &failingDev{Fake: a}
	dev.fail.Store(true)
	links := make(chan bool, 16)
	logs := &levelCounter{}
	p, err := NewPort(dev, PortConfig{Namespace: "test", Loop: loop, Addrs: []netip.Prefix{netip.MustParsePrefix("10.55.0.1/24")},
		OnLink: func(up bool) { links <- up }, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	select {
	case up := <-links:
		if up {
			t.Fatal("OnLink(true) first")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no OnLink(false) for failing reads")
	}
	if p.Up() {
		t.Error("Up with failing reads")
	}
	before := dev.tries.Load()
	time.Sleep(30 * time.Millisecond)
	if n := dev.tries.Load() - before; n > 40 {
		t.Errorf("%d reads of a failing device in 30 ms, want about one a millisecond", n)
	}
	if n := p.Stats().RxErrors; n < 5 || n > uint64(dev.tries.Load()) {
		t.Errorf("RxErrors %d after %d failed reads", n, dev.tries.Load())
	}
	if n := logs.count(slog.LevelWarn); n != 1 {
		t.Errorf("%d warnings for a device that kept failing, want 1", n)
	}
	dev.fail.Store(false)
	select {
	case up := <-links:
		if !up {
			t.Fatal("OnLink(false) again")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no OnLink(true) once reads work")
	}
	if !p.Up() {
		t.Error("not Up once reads work")
	}
}

// TestNICOutputAllocs: handing an engine's batch to the wire — routed
// frame by frame, then written — allocates nothing.
func TestNICOutputAllocs(t *testing.T) {
	dev := &sink{done: make(chan struct{})}
	n, err := NewNIC("taproce0", dev, PortConfig{Namespace: "test", Addrs: []netip.Prefix{netip.MustParsePrefix("10.55.0.1/24")}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	frame := append(make([]byte, tap.Headroom), roceTo(t, peerMAC, 1)...)
	back := make(chan struct{}, 1)
	b := &transport.Batch{Frames: make([][]byte, 0, 4), Release: func() { back <- struct{}{} }}
	a := testing.AllocsPerRun(200, func() {
		b.Frames = append(b.Frames[:0], frame, frame)
		nicOutput{n}.SendBatch(b)
		<-back
	})
	if a != 0 {
		t.Errorf("%v allocations", a)
	}
	if dev.frames.Load() == 0 {
		t.Fatal("nothing written")
	}
}
