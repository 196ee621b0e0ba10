package appliance

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/poll"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/station"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/internal/testvectors"
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
	a, b := tap.NewFakePair(1500, 4096) // the test's reader must not lose frames
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

func roceTo(t testing.TB, dst roce.MAC, qp uint32) []byte {
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

// TestPortStation runs a port on a fake TAP, read the way every port is
// read (TryReadEach in the passes of a loop): ARP answered with the port's
// MAC, RoCE delivered to the handler, a RoCE frame for another MAC
// dropped — on a loop of the port's own (none given), a spinning loop and
// a blocking one.
func TestPortStation(t *testing.T) {
	for _, c := range []struct {
		name string
		loop func() (*poll.Loop, error)
	}{
		{"own", func() (*poll.Loop, error) { return nil, nil }},
		{"spinning", func() (*poll.Loop, error) { return poll.NewLoop(), nil }},
		{"blocking", poll.NewBlockingLoop},
	} {
		t.Run(c.name, func(t *testing.T) {
			loop, err := c.loop()
			if err != nil {
				t.Fatal(err)
			}
			if loop != nil {
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { loop.Run(ctx); close(done) }()
				t.Cleanup(func() { cancel(); <-done; loop.Close() })
			}
			testPortStation(t, loop)
		})
	}
}

func testPortStation(t *testing.T, loop *poll.Loop) {
	var handled atomic.Uint32
	p, w := newTestPort(t, PortConfig{Loop: loop, Handler: func(frame []byte, pkt *roce.Packet) {
		if pkt.BTH.DestQP == 0x77 && string(pkt.Payload(frame)) == "over the fake wire" {
			handled.Add(1)
		}
	}})
	if (p.ownLoop != nil) != (loop == nil) {
		t.Fatalf("own loop %v with a loop given %v", p.ownLoop != nil, loop != nil)
	}
	w.send(arpRequest(portV4))
	rep := w.next(2 * time.Second)
	if rep == nil || roce.Ethernet(rep).Src() != p.MAC() || binary.BigEndian.Uint16(rep[20:22]) != 2 {
		t.Fatalf("ARP reply %x", rep)
	}
	w.send(roceTo(t, p.MAC(), 0x77))
	w.send(roceTo(t, roce.MAC{0x02, 9, 9, 9, 9, 9}, 0x77))
	deadline := time.Now().Add(2 * time.Second)
	for p.Stats().RxFrames < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	st := p.Stats()
	if handled.Load() != 1 || st.Delivered != 1 || st.Drops[station.DropNotForUs] != 1 || st.RxFrames != 3 || st.TxFrames < 1 {
		t.Fatalf("handler saw %d packets, want 1; stats %+v", handled.Load(), st)
	}
}

// TestPortReceivePath: every received frame takes one path, as in the
// kernel with rxe: UDP to port 4791 to the RoCE checks (headers with the
// IPv4 checksum, MAC, address, ICRC) and the handler, everything else to
// the station; each drop is counted once, by its reason.
func TestPortReceivePath(t *testing.T) {
	var handled []uint32
	p, _ := newTestPort(t, PortConfig{Handler: func(_ []byte, pkt *roce.Packet) { handled = append(handled, pkt.BTH.DestQP) }})
	good := roceTo(t, p.MAC(), 1)
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	v6 := func() []byte {
		pk := roce.Packet{DstMAC: p.MAC(), SrcMAC: peerMAC, IPv6: true, Src: netip.MustParseAddr("fd55::2"),
			Dst: netip.MustParseAddr("fd55::1"), TTL: 64, SrcPort: 0xC123, DstPort: roce.UDPPort,
			BTH: roce.BTHFields{Opcode: roce.RCSendOnly, PKey: 0xFFFF, DestQP: 6}}
		buf := make([]byte, 256)
		n, err := pk.Build(buf, []byte("v6"))
		if err != nil {
			t.Fatal(err)
		}
		return buf[:n]
	}()
	for _, c := range []struct {
		name    string
		frame   []byte
		handled uint32 // the QP the handler sees, 0 for none
		drop    station.DropReason
	}{
		{"RoCE over IPv4", good, 1, -1},
		{"RoCE over IPv6", v6, 6, -1},
		{"another MAC", roceTo(t, roce.MAC{0x02, 9, 9, 9, 9, 9}, 2), 0, station.DropNotForUs},
		{"bad IPv4 checksum", mut(func(b []byte) []byte { b[24] ^= 1; return b }), 0, station.DropMalformed},
		{"reserved opcode", mut(func(b []byte) []byte { b[roce.EthernetLen+roce.IPv4Len+roce.UDPLen] = 0x15; return b }), 0, station.DropRoCE},
		{"bad ICRC", mut(func(b []byte) []byte { b[len(b)-6] ^= 1; return b }), 0, station.DropICRC},
		{"another address", func() []byte {
			pk := roce.Packet{DstMAC: p.MAC(), SrcMAC: peerMAC, Src: peerV4, Dst: netip.MustParseAddr("10.55.0.9"), TTL: 64,
				SrcPort: 0xC123, DstPort: roce.UDPPort, BTH: roce.BTHFields{Opcode: roce.RCSendOnly, PKey: 0xFFFF, DestQP: 3}}
			buf := make([]byte, 256)
			n, _ := pk.Build(buf, nil)
			return buf[:n]
		}(), 0, station.DropNotOurIP},
		{"UDP to another port", mut(func(b []byte) []byte { b[roce.EthernetLen+roce.IPv4Len+3]++; return b }), 0, station.DropProtocol},
	} {
		t.Run(c.name, func(t *testing.T) {
			handled = handled[:0]
			before := p.Stats()
			p.ingressMu.Lock()
			p.deliverLocked(c.frame)
			p.ingressMu.Unlock()
			after := p.Stats()
			if c.handled != 0 {
				if len(handled) != 1 || handled[0] != c.handled || after.Delivered != before.Delivered+1 {
					t.Fatalf("handled %v, delivered %d → %d", handled, before.Delivered, after.Delivered)
				}
				if after.Drops != before.Drops {
					t.Fatalf("drops %v → %v", before.Drops, after.Drops)
				}
				return
			}
			if len(handled) != 0 || after.Delivered != before.Delivered {
				t.Fatalf("handled %v", handled)
			}
			for r := range after.Drops {
				want := before.Drops[r]
				if station.DropReason(r) == c.drop {
					want++
				}
				if after.Drops[r] != want {
					t.Errorf("%v drops %d → %d", station.DropReason(r), before.Drops[r], after.Drops[r])
				}
			}
		})
	}
}

// FuzzPortReceive: any frame takes the port's receive path without
// panicking, and what reaches the handler is a RoCEv2 packet to the
// port's MAC and one of its addresses with a good ICRC.
func FuzzPortReceive(f *testing.F) {
	for _, fr := range testvectors.Frames() {
		f.Add(fr)
	}
	f.Add(arpRequest(portV4))
	f.Add(roceTo(f, roce.MAC{0x02, 0, 0, 0, 0, 1}, 1))
	dev := newSink()
	var bad atomic.Value
	var p *Port
	p, err := NewPort(dev, PortConfig{Namespace: "fuzz", MAC: roce.MAC{0x02, 0, 0, 0, 0, 1},
		Addrs: []netip.Prefix{netip.MustParsePrefix("10.55.0.1/24"), netip.MustParsePrefix("10.99.0.3/24")},
		Handler: func(frame []byte, pk *roce.Packet) {
			if pk.DstMAC != p.MAC() || !p.Station().Owns(pk.Dst) || pk.VerifyICRC(frame) != nil {
				bad.Store(fmt.Sprintf("delivered %+v", *pk))
			}
		}})
	if err != nil {
		f.Fatal(err)
	}
	defer p.Close()
	f.Fuzz(func(t *testing.T, frame []byte) {
		p.ingressMu.Lock()
		p.deliverLocked(frame)
		p.ingressMu.Unlock()
		if b := bad.Load(); b != nil {
			t.Fatal(b)
		}
	})
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

// sink is a device that takes every frame and counts it, and delivers
// none: for measuring the port's own paths.
type sink struct {
	*tap.Fake
	frames atomic.Uint64
}

func newSink() *sink {
	a, _ := tap.NewFakePair(1500, 16)
	return &sink{Fake: a}
}

func (s *sink) Write(bufs [][]byte, _ int) (int, error) {
	s.frames.Add(uint64(len(bufs)))
	return len(bufs), nil
}

// TestPortZeroAllocs: the receive path of a RoCE frame to the handler,
// answering ARP, and sending allocate nothing.
func TestPortZeroAllocs(t *testing.T) {
	dev := newSink()
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
	loop := poll.NewLoop()
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
	dev := newSink()
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
