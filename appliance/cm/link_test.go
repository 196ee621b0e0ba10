package cm_test

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/cm"
)

// The harness: managers on an in-memory network with a fake clock. A MAD
// a manager sends is queued; deliver hands the queue to the managers it
// is addressed to, in order; run also moves the clock to the next timer
// and ticks. Loss and filters drop MADs on the way.

var (
	addrA = netip.MustParseAddr("10.99.0.2")
	addrB = netip.MustParseAddr("10.99.0.3")
)

const (
	guidA = 0x505400fffe630002
	guidB = 0x505400fffe630003
	ownA  = cm.Owner(1)
	ownB  = cm.Owner(2)
)

type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

// packet is one MAD on the network.
type packet struct {
	src, dst netip.Addr
	mad      [cm.MADLen]byte
}

func (p *packet) msg(t testing.TB) cm.Message {
	t.Helper()
	var m cm.Message
	if err := cm.Parse(p.mad[:], &m); err != nil {
		t.Fatalf("a manager sent a MAD that does not parse: %v", err)
	}
	return m
}

func (p *packet) attr() cm.AttrID { return cm.MAD(p.mad[:]).AttrID() }

type network struct {
	t     testing.TB
	clk   *clock
	rng   *rand.Rand
	loss  float64 // of every MAD, each way
	lost  int
	nodes map[netip.Addr]*node
	// drop, when set, drops the MADs it reports true for.
	drop func(p *packet) bool
	// hold keeps MADs in flight until the test hands them on (take).
	hold     bool
	inflight []packet
	sent     []packet // every MAD sent, dropped or not
}

// node is one manager and its owners' side: the events it got and what
// its owners do on them.
type node struct {
	addr   netip.Addr
	net    *network
	m      *cm.Manager
	events []cm.Event
	// on, when set, is the owners' answer to an event.
	on func(n *node, e cm.Event)
}

func newNetwork(t testing.TB, seed uint64) *network {
	return &network{t: t, clk: &clock{now: time.Unix(1_800_000_000, 0)}, rng: rand.New(rand.NewPCG(seed, 7)),
		nodes: map[netip.Addr]*node{}}
}

func (w *network) add(addr netip.Addr, guid uint64, cfg cm.Config) *node {
	w.t.Helper()
	n := &node{addr: addr, net: w}
	cfg.Wire, cfg.Now, cfg.GUID = n, w.clk.Now, guid
	if cfg.Seed == 0 {
		cfg.Seed = guid
	}
	cfg.Events = func(e cm.Event) {
		n.events = append(n.events, e)
		if n.on != nil {
			n.on(n, e)
		}
	}
	m, err := cm.New(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	n.m = m
	w.nodes[addr] = n
	return n
}

// SendMAD implements cm.Wire.
func (n *node) SendMAD(r cm.Route, mad *[cm.MADLen]byte) {
	w := n.net
	if w.nodes[r.Src] != n {
		w.t.Errorf("%v sends a MAD from %v", n.addr, r.Src)
	}
	p := packet{src: r.Src, dst: r.Dst, mad: *mad}
	w.sent = append(w.sent, p)
	if w.drop != nil && w.drop(&p) {
		return
	}
	if w.loss > 0 && w.rng.Float64() < w.loss {
		w.lost++
		return
	}
	w.inflight = append(w.inflight, p)
}

// deliver hands on every MAD in flight, and those they cause, unless the
// network holds them.
func (w *network) deliver() {
	for !w.hold && len(w.inflight) > 0 {
		p := w.inflight[0]
		w.inflight = w.inflight[1:]
		if n := w.nodes[p.dst]; n != nil {
			n.m.Receive(p.src, p.dst, p.mad[:])
		}
	}
}

// take hands on the first MAD in flight of attribute a from src, and
// reports whether there was one.
func (w *network) take(a cm.AttrID, src netip.Addr) bool {
	for i, p := range w.inflight {
		if p.attr() == a && p.src == src {
			w.inflight = append(w.inflight[:i:i], w.inflight[i+1:]...)
			if n := w.nodes[p.dst]; n != nil {
				n.m.Receive(p.src, p.dst, p.mad[:])
			}
			return true
		}
	}
	return false
}

// run delivers and runs the timers, moving the clock from deadline to
// deadline, until cond holds (true) or the clock would pass d from now
// (false; the clock stops there).
func (w *network) run(d time.Duration, cond func() bool) bool {
	end := w.clk.now.Add(d)
	for {
		w.deliver()
		if cond != nil && cond() {
			return true
		}
		var next time.Time
		for _, n := range w.nodes {
			if t, ok := n.m.NextDeadline(); ok && (next.IsZero() || t.Before(next)) {
				next = t
			}
		}
		if next.IsZero() || next.After(end) {
			w.clk.now = end
			return cond != nil && cond()
		}
		if next.After(w.clk.now) {
			w.clk.now = next
		}
		for _, n := range w.nodes {
			n.m.Tick()
		}
	}
}

// sentAttrs returns the attributes of the MADs sent, in order.
func (w *network) sentAttrs() []cm.AttrID {
	var a []cm.AttrID
	for i := range w.sent {
		a = append(a, w.sent[i].attr())
	}
	return a
}

// count returns how many MADs of attribute a src sent.
func (w *network) count(a cm.AttrID, src netip.Addr) int {
	n := 0
	for i := range w.sent {
		if w.sent[i].attr() == a && w.sent[i].src == src {
			n++
		}
	}
	return n
}

// last returns the last MAD of attribute a sent, parsed.
func (w *network) last(a cm.AttrID) cm.Message {
	w.t.Helper()
	for i := len(w.sent) - 1; i >= 0; i-- {
		if w.sent[i].attr() == a {
			return w.sent[i].msg(w.t)
		}
	}
	w.t.Fatalf("no %v sent; sent %v", a, w.sentAttrs())
	return cm.Message{}
}

// eventsOf returns the node's events of type t.
func (n *node) eventsOf(t cm.EventType) []cm.Event {
	var r []cm.Event
	for _, e := range n.events {
		if e.Type == t {
			r = append(r, e)
		}
	}
	return r
}

// check checks the invariants of every manager.
func (w *network) check() {
	w.t.Helper()
	for _, n := range w.nodes {
		if err := cm.CheckInvariants(n.m); err != nil {
			w.t.Fatalf("%v: %v", n.addr, err)
		}
	}
}

// empty fails the test unless every manager's tables are empty: no state
// leaks once the owners destroyed their IDs.
func (w *network) empty() {
	w.t.Helper()
	w.check()
	for _, n := range w.nodes {
		for k, v := range cm.Sizes(n.m) {
			if v != 0 {
				w.t.Errorf("%v: %s holds %d", n.addr, k, v)
			}
		}
	}
}

// info returns the Info of an ID, failing the test when there is none.
func (n *node) info(id cm.ID) cm.Info {
	n.net.t.Helper()
	i, err := n.m.Info(id)
	if err != nil {
		n.net.t.Fatal(err)
	}
	return i
}

// state returns an ID's state, or NumStates when it is gone.
func (n *node) state(id cm.ID) cm.State {
	i, err := n.m.Info(id)
	if err != nil {
		return cm.NumStates
	}
	return i.State
}

// Connection parameters of the tests: rping's (responder resources and
// initiator depth 1, retries 7, path MTU 1024).
func connectParams(local, remote netip.Addr, port uint16, qpn uint32) cm.ConnectParams {
	return cm.ConnectParams{
		Local: netip.AddrPortFrom(local, 0), Remote: netip.AddrPortFrom(remote, port),
		PortSpace: cm.PortSpaceTCP, QPType: cm.QPTypeRC, QPN: qpn, StartingPSN: 0x164dec,
		ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7, PathMTU: 3,
	}
}

func acceptParams(qpn uint32) cm.AcceptParams {
	return cm.AcceptParams{QPN: qpn, StartingPSN: 0xeef1a7, ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7}
}

// serve makes n's owners behave as a librdmacm server and client do:
// accept every request (QPN 0x100 + the ID), establish on every reply,
// and, when hangUp is set, disconnect and destroy an ID that is
// disconnected.
func serve(hangUp bool) func(n *node, e cm.Event) {
	return func(n *node, e cm.Event) {
		t := n.net.t
		switch e.Type {
		case cm.EventConnectRequest:
			p := acceptParams(0x100 + uint32(e.ID))
			if err := n.m.Accept(e.ID, p); err != nil {
				t.Errorf("accept: %v", err)
			}
		case cm.EventConnectResponse:
			if err := n.m.Establish(e.ID, nil); err != nil {
				t.Errorf("establish: %v", err)
			}
		case cm.EventDisconnected:
			if hangUp {
				if err := n.m.Destroy(e.ID); err != nil {
					t.Errorf("destroy: %v", err)
				}
			}
		}
	}
}
