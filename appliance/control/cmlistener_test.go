package control

import (
	"net/netip"
	"sync"
	"testing"

	"github.com/taproce/taproce/appliance/cm"
)

// cmWire hands a manager's MADs to its peer's at once, as the local
// switch does.
type cmWire struct{ peer *cm.Manager }

func (w *cmWire) SendMAD(r cm.Route, mad *[cm.MADLen]byte) { w.peer.Receive(r.Src, r.Dst, mad[:]) }

// cmEventLog keeps a manager's events.
type cmEventLog struct {
	mu  sync.Mutex
	evs []cm.Event
}

func (l *cmEventLog) add(ev cm.Event) {
	l.mu.Lock()
	l.evs = append(l.evs, ev)
	l.mu.Unlock()
}

func (l *cmEventLog) all() []cm.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]cm.Event(nil), l.evs...)
}

// TestCMRequestForListenerGone: a connect request that the manager handed
// up for a listener its session destroyed before translating it is
// rejected at once with reason 28, as Linux's ucma destroys the requests
// of a listener it destroys; the peer used to hear nothing, send its REQ
// again 6 s later and then get REJ 8.
func TestCMRequestForListenerGone(t *testing.T) {
	srcA, srcB := netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2")
	var logA, logB cmEventLog
	var wa, wb cmWire
	ma, err := cm.New(cm.Config{Wire: &wa, Events: logA.add, GUID: 1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	mb, err := cm.New(cm.Config{Wire: &wb, Events: logB.add, GUID: 2, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	wa.peer, wb.peer = mb, ma
	d := &Device{Name: "b", CM: mb}
	ss := &session{}
	ss.cm = cmState{ids: map[uint32]*cmID{}, byCM: map[cmKey]*cmID{}, owner: 2}
	lid, err := mb.Listen(2, cm.ListenParams{Addr: srcB, Port: 7471, PortSpace: cm.PortSpaceTCP, QPType: cm.QPTypeRC})
	if err != nil {
		t.Fatal(err)
	}
	l := ss.cmNewID(0, cm.PortSpaceTCP, cm.QPTypeRC)
	l.state, l.dev, l.listeners = cmListen, d, map[*Device]cm.ID{d: lid}
	ss.cm.byCM[cmKey{d, lid}] = l

	if _, err := ma.Connect(1, cm.ConnectParams{Local: netip.AddrPortFrom(srcA, 0), Remote: netip.AddrPortFrom(srcB, 7471),
		PortSpace: cm.PortSpaceTCP, QPType: cm.QPTypeRC, QPN: 0x11, StartingPSN: 1, ResponderResources: 1, InitiatorDepth: 1,
		RetryCount: 7, RNRRetryCount: 7, PathMTU: 3}); err != nil {
		t.Fatal(err)
	}
	evB := logB.all()
	if len(evB) != 1 || evB[0].Type != cm.EventConnectRequest || mb.Stats().States[cm.StateMRAReqSent] != 1 {
		t.Fatalf("B's events %+v, %d requests handed up", evB, mb.Stats().States[cm.StateMRAReqSent])
	}
	// The session's listener goes before the request is translated.
	ss.cmDestroy(l)
	if ev := ss.cmTranslate(d, evB[0]); ev != nil {
		t.Fatalf("a request for a destroyed listener translated: %+v", ev)
	}
	evA := logA.all()
	if len(evA) != 1 || evA[0].Type != cm.EventRejected || evA[0].Reason != cm.RejConsumerDefined {
		t.Fatalf("A's events %+v, want one REJECTED with reason 28", evA)
	}
	if n := mb.Stats().States[cm.StateMRAReqSent]; n != 0 {
		t.Errorf("B still holds %d requests", n)
	}
}
