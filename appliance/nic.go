package appliance

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/appliance/poll"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/tap"
)

// NIC is a port with its transport engine: one RDMA device of the
// appliance. Its engine's frames leave through the port's TAP, or, for a
// destination that is another NIC of the same appliance (or this one),
// through the local switch without touching a TAP.
type NIC struct {
	name   string
	port   *Port
	engine atomic.Pointer[transport.Engine]
	sw     *Switch
	tap    func([]byte, *roce.Packet) // the port config's Handler, called first

	lmu     sync.Mutex
	local   []localItem // frames from the switch, for this NIC's engine
	spare   []localItem // the other half of the double buffer
	closed  bool
	queued  atomic.Bool // local has items: an empty poll takes no lock
	asleep  bool        // the port's blocking loop sleeps without polling local (Arm)
	unlocal func()      // takes pollLocal out of the port's loop
	stop    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
	ticks   atomic.Uint64 // the tick loop's Tick calls
	unhold  func()        // takes the engine's held acknowledgements off a blocking loop
	mads    madQueue      // MADs waiting for their destinations' MACs (SendMAD)
	cm      *cm.Manager   // the port's connection manager, on QP1 (cm.go)
	cmEv    atomic.Pointer[func(cm.Event)]
	est     chan uint32 // QPs that executed their first request (commEstablished)
	netns   uint64      // the inode of the port's namespace, when an Appliance made the NIC
}

// localItem is a batch of frames crossing the local switch; refs, when
// not nil, are the payloads of whole-message frames (transport.Batch.Refs).
type localItem struct {
	frames [][]byte
	refs   [][]byte
	done   func()
}

// OpenNIC opens a port for cfg and runs a transport engine on it. sw is
// the local switch to join, nil for none. A Handler in cfg sees every
// RoCE packet of the port before the engine does.
func OpenNIC(name string, cfg PortConfig, sw *Switch) (*NIC, error) {
	n := &NIC{name: name, sw: sw, stop: make(chan struct{}), tap: cfg.Handler}
	cfg.Handler = n.receive
	p, err := OpenPort(cfg)
	if err != nil {
		return nil, err
	}
	if err := n.start(p); err != nil {
		p.Close()
		return nil, err
	}
	return n, nil
}

// NewNIC runs a port and its engine on an existing device (a fake in
// tests); the NIC owns dev from then on.
func NewNIC(name string, dev tap.Device, cfg PortConfig, sw *Switch) (*NIC, error) {
	n := &NIC{name: name, sw: sw, stop: make(chan struct{}), tap: cfg.Handler}
	cfg.Handler = n.receive
	p, err := NewPort(dev, cfg)
	if err != nil {
		return nil, err
	}
	if err := n.start(p); err != nil {
		p.Close()
		return nil, err
	}
	return n, nil
}

func (n *NIC) start(p *Port) error {
	n.port = p
	n.mads.init()
	n.est = make(chan uint32, estQueue)
	m, err := cm.New(cm.Config{Wire: nicWire{n}, Events: n.cmEvent, GUID: p.MAC().EUI64()})
	if err != nil {
		n.mads.close()
		return fmt.Errorf("NIC %s: %w", n.name, err)
	}
	n.cm = m
	cfg := transport.Config{MAC: p.MAC(), GIDs: p.Station().GIDs(), MTU: p.Device().MTU(), Out: nicOutput{n},
		Local: func(a netip.Addr) bool { return n.route(a) != nil }, AckDelay: p.cfg.AckDelay, LingerQuiet: p.cfg.LingerQuiet,
		ECT: p.cfg.ECT, CommEstablished: n.commEstablished}
	e := transport.NewEngine(cfg)
	e.SetGSI(n.receiveMAD)
	n.engine.Store(e)
	if p.cfg.Loop.Blocking() {
		// The blocking loop watches the acknowledgements held for company.
		n.unhold = p.cfg.Loop.AddHold(e.AckDue, e.FlushAcks)
	}
	// The local switch's frames are a source of the port's loop, so that
	// a message between two ports of one loop crosses in its passes, with
	// no hand-off to another goroutine: one cost 50–250 µs whenever the
	// runtime had to wake a thread for it (docs/performance-log.md,
	// local switch).
	var p0 roce.Packet
	local := func() bool { return n.pollLocal(e, &p0) }
	n.unlocal = p.cfg.Loop.AddSleeper(local, poll.Sleeper{Fd: -1, Arm: n.armLocal, Disarm: n.disarmLocal})
	if n.sw != nil {
		n.sw.join(n)
	}
	n.wg.Add(3)
	go n.tickLoop(e)
	go n.cmLoop()
	go n.estLoop()
	return nil
}

// Receive hands a RoCE packet from the port to the engine.
func (n *NIC) Receive(frame []byte, p *roce.Packet) { n.receive(frame, p) }

func (n *NIC) receive(frame []byte, p *roce.Packet) {
	if n.tap != nil {
		n.tap(frame, p)
	}
	if e := n.engine.Load(); e != nil {
		e.Receive(frame, p)
	}
}

// Name returns the device name; Port and Engine its parts.
func (n *NIC) Name() string              { return n.name }
func (n *NIC) Port() *Port               { return n.port }
func (n *NIC) Engine() *transport.Engine { return n.engine.Load() }
func (n *NIC) GIDs() []roce.GID          { return n.port.Station().GIDs() }
func (n *NIC) MTU() int                  { return n.port.Device().MTU() }
func (n *NIC) Resolve(ctx context.Context, a netip.Addr) (roce.MAC, error) {
	if peer := n.route(a); peer != nil {
		return peer.port.MAC(), nil
	}
	return n.port.Station().Resolve(ctx, a)
}

// route returns the NIC that a destination reaches in memory: a NIC of
// the local switch, or this one for its own GIDs (loopback, as rxe loops
// a QP's packets to its own port back internally); nil for the wire.
func (n *NIC) route(a netip.Addr) *NIC {
	if !a.IsValid() {
		return nil
	}
	if n.sw != nil {
		return n.sw.lookup(a)
	}
	if n.port.Station().HasGID(a) {
		return n
	}
	return nil
}

// Close stops the engine and closes the port.
func (n *NIC) Close() error {
	var err error
	n.once.Do(func() {
		if n.sw != nil {
			n.sw.leave(n)
		}
		close(n.stop)
		n.unlocal()
		n.lmu.Lock()
		n.closed = true
		items := n.local
		n.local = nil
		n.lmu.Unlock()
		for _, it := range items {
			it.done()
		}
		n.mads.close()
		err = n.port.Close()
		n.wg.Wait()
		if n.unhold != nil {
			n.unhold()
		}
	})
	return err
}

// tickLoop runs the engine's timers: it sleeps until the earliest is due
// (transport.Engine.PlanTick), or, while none is set, until one is
// (TickWake) — an idle port's engine wakes no one.
func (n *NIC) tickLoop(e *transport.Engine) {
	defer n.wg.Done()
	// With a loop, it sends held acknowledgements on time (a spinning
	// loop's ring pollers call FlushAcks, a blocking one holds: AddHold):
	// waking every few microseconds for them would take a thread of its
	// own, often on a client's core.
	acks := n.port.cfg.Loop == nil
	n.timerLoop(func() (time.Time, bool) { return e.PlanTick(acks) }, e.TickWake(), func() {
		n.ticks.Add(1)
		e.Tick()
	})
}

// timerLoop runs timers until the NIC closes: it sleeps until plan's
// deadline (no less than minTickSleep) and then calls tick, or, while plan
// has none, until wake says one was set; after either it plans again.
func (n *NIC) timerLoop(plan func() (time.Time, bool), wake <-chan struct{}, tick func()) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		if next, ok := plan(); ok {
			t.Reset(max(time.Until(next), minTickSleep))
		} else {
			t.Stop()
		}
		select {
		case <-n.stop:
			return
		case <-t.C:
			tick()
		case <-wake:
		}
	}
}

// minTickSleep is the shortest the tick loop sleeps: timers due sooner
// wait that long, so that a burst of them costs one wakeup.
const minTickSleep = 50 * time.Microsecond

// pollLocal feeds the frames of the local switch to the engine, on the
// port's loop; it reports whether there were any. The queue is unbounded:
// a sender must never wait for a receiver that might be waiting for it;
// the senders' windows bound it.
func (n *NIC) pollLocal(e *transport.Engine, p *roce.Packet) bool {
	if !n.queued.Load() {
		return false
	}
	n.lmu.Lock()
	n.queued.Store(false)
	items := n.local
	if len(items) == 0 {
		n.lmu.Unlock()
		return false
	}
	n.local, n.spare = n.spare[:0], nil
	n.lmu.Unlock()
	i, j := 0, 0
	e.ReceiveLocalBatch(p, func(p *roce.Packet) ([]byte, []byte, bool) {
		for i < len(items) {
			it := &items[i]
			if j == len(it.frames) {
				i, j = i+1, 0
				continue
			}
			f := it.frames[j]
			var ref []byte
			if it.refs != nil {
				ref = it.refs[j]
			}
			j++
			if roce.Parse(f, p) == nil {
				return f, ref, true
			}
		}
		return nil, nil, false
	})
	for i, it := range items {
		it.done()
		items[i] = localItem{}
	}
	n.lmu.Lock()
	if n.spare == nil {
		n.spare = items[:0]
	}
	n.lmu.Unlock()
	return true
}

// armLocal tells deliver that the port's blocking loop is about to sleep,
// so that frames arriving meanwhile wake it; it reports false when some
// are already queued.
func (n *NIC) armLocal() bool {
	n.lmu.Lock()
	defer n.lmu.Unlock()
	if len(n.local) > 0 {
		return false
	}
	n.asleep = true
	return true
}

func (n *NIC) disarmLocal(bool) {
	n.lmu.Lock()
	n.asleep = false
	n.lmu.Unlock()
}

// nicOutput routes an engine's frames: to a NIC on the local switch, or
// out of the port.
type nicOutput struct{ n *NIC }

func (o nicOutput) Headroom() int { return tap.Headroom }

// Send implements transport.Output (used only by synchronous callers).
func (o nicOutput) Send(frames [][]byte) {
	done := make(chan struct{})
	o.SendBatch(&transport.Batch{Frames: frames, Release: func() { close(done) }})
	<-done
}

// SendBatch implements transport.AsyncOutput: a batch whose frames all
// go to one NIC in memory is handed over whole, one for the wire goes to
// the port's writer, and a mixed one is split.
func (o nicOutput) SendBatch(b *transport.Batch) {
	n := o.n
	var first *NIC
	for i, f := range b.Frames {
		r := n.route(frameDst(f[tap.Headroom:]))
		if i == 0 {
			first = r
		} else if r != first {
			n.sendMixed(b)
			return
		}
	}
	if first == nil {
		n.port.SendAsync(b.Frames, tap.Headroom, b.Release)
		return
	}
	if n.sw != nil {
		n.sw.frames.Add(uint64(len(b.Frames)))
	}
	first.deliver(trim(b.Frames), b.Refs, b.Release)
}

// trim drops the headroom of each frame, in place.
func trim(frames [][]byte) [][]byte {
	for i, f := range frames {
		frames[i] = f[tap.Headroom:]
	}
	return frames
}

// sendMixed splits a batch whose frames go to several places: local
// frames are copied to their NICs, the rest written to the port.
func (n *NIC) sendMixed(b *transport.Batch) {
	var remote [][]byte
	for _, f := range b.Frames {
		if peer := n.route(frameDst(f[tap.Headroom:])); peer != nil {
			peer.deliver([][]byte{append([]byte(nil), f[tap.Headroom:]...)}, nil, func() {})
			continue
		}
		remote = append(remote, f)
	}
	_ = n.port.Send(remote, tap.Headroom)
	b.Release()
}

func (n *NIC) deliver(frames, refs [][]byte, done func()) {
	n.lmu.Lock()
	if n.closed {
		n.lmu.Unlock()
		done()
		return
	}
	n.local = append(n.local, localItem{frames: frames, refs: refs, done: done})
	n.queued.Store(true)
	wake := n.asleep
	n.asleep = false
	n.lmu.Unlock()
	if wake {
		n.port.cfg.Loop.Wake()
	}
}

// frameDst returns the destination IP of an Ethernet frame (invalid when
// it is not IPv4 or IPv6).
func frameDst(f []byte) netip.Addr {
	if len(f) < roce.EthernetLen+roce.IPv6Len {
		if len(f) >= roce.EthernetLen+roce.IPv4Len && binary.BigEndian.Uint16(f[12:]) == roce.EtherTypeIPv4 {
			return netip.AddrFrom4([4]byte(f[30:34]))
		}
		return netip.Addr{}
	}
	switch binary.BigEndian.Uint16(f[12:]) {
	case roce.EtherTypeIPv4:
		return netip.AddrFrom4([4]byte(f[30:34]))
	case roce.EtherTypeIPv6:
		return netip.AddrFrom16([16]byte(f[38:54]))
	}
	return netip.Addr{}
}

// Switch joins the NICs of one appliance: frames between them cross in
// memory, with the same packets, PSNs and acknowledgements as on a wire.
type Switch struct {
	mu     sync.RWMutex
	byAddr map[netip.Addr]*NIC
	frames atomic.Uint64
}

// NewSwitch returns an empty local switch.
func NewSwitch() *Switch { return &Switch{byAddr: map[netip.Addr]*NIC{}} }

// Frames counts the frames that crossed the switch.
func (s *Switch) Frames() uint64 { return s.frames.Load() }

func (s *Switch) join(n *NIC) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range n.port.Station().GIDs() {
		s.byAddr[g.Addr()] = n
	}
}

func (s *Switch) leave(n *NIC) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for a, x := range s.byAddr {
		if x == n {
			delete(s.byAddr, a)
		}
	}
}

func (s *Switch) lookup(a netip.Addr) *NIC {
	if !a.IsValid() {
		return nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byAddr[a]
}
