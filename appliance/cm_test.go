package appliance

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/verbs/abi"
)

// cmEvents installs a CM event handler on n that passes the events on a
// channel.
func cmEvents(n *NIC) chan cm.Event {
	ch := make(chan cm.Event, 64)
	n.SetCMEvents(func(ev cm.Event) { ch <- ev })
	return ch
}

// waitEvent returns the next event of ch, which must be of type want.
func waitEvent(t *testing.T, ch chan cm.Event, want cm.EventType, who string) cm.Event {
	t.Helper()
	select {
	case ev := <-ch:
		if ev.Type != want {
			t.Fatalf("%s: event %v, want %v", who, ev.Type, want)
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no %v event", who, want)
		return cm.Event{}
	}
}

// TestNICConnectionManager: each NIC's connection manager speaks over its
// QP1 — on a fake wire and on the local switch — through a whole RDMA CM
// connection: B listens, A's REQ reaches B's manager as a connect
// request, B accepts, A's REP arrives, A's RTU establishes B's side, and
// A's DREQ and B's DREP disconnect both. The REQ carries the port's node GUID, and a
// REQ that no one answers goes out again on the NIC's timer.
func TestNICConnectionManager(t *testing.T) {
	for _, local := range []bool{false, true} {
		name := "fake wire"
		if local {
			name = "local switch"
		}
		t.Run(name, func(t *testing.T) {
			var sw *Switch
			if local {
				sw = NewSwitch()
			}
			a, b, _, _ := madNICs(t, sw)
			ipA, ipB := a.GIDs()[1].Addr().Unmap(), b.GIDs()[1].Addr().Unmap()
			evA, evB := cmEvents(a), cmEvents(b)
			// B's QP1 records what it hands its manager.
			var mu sync.Mutex
			var atB [][]byte
			b.SetGSI(func(src, dst netip.Addr, _ uint32, _ uint16, mad []byte) {
				mu.Lock()
				atB = append(atB, append([]byte(nil), mad...))
				mu.Unlock()
				b.CM().Receive(src, dst, mad)
			})
			const ownA, ownB = 1, 2
			lid, err := b.CM().Listen(ownB, cm.ListenParams{Port: 7174, PortSpace: cm.PortSpaceTCP})
			if err != nil {
				t.Fatal(err)
			}
			id, err := a.CM().Connect(ownA, cm.ConnectParams{
				Local: netip.AddrPortFrom(ipA, 0), Remote: netip.AddrPortFrom(ipB, 7174),
				PortSpace: cm.PortSpaceTCP, QPType: cm.QPTypeRC, QPN: 0x11, StartingPSN: 0x1234,
				ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7, PathMTU: 3,
			})
			if err != nil {
				t.Fatal(err)
			}
			req := waitEvent(t, evB, cm.EventConnectRequest, "B")
			if req.Listener != lid || req.Remote.Addr() != ipA || req.Local != netip.AddrPortFrom(ipB, 7174) ||
				req.Param.QPN != 0x11 || req.Param.StartingPSN != 0x1234 {
				t.Fatalf("B's connect request %+v", req)
			}
			if err := b.CM().Accept(req.ID, cm.AcceptParams{QPN: 0x22, StartingPSN: 0x5678, ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7}); err != nil {
				t.Fatal(err)
			}
			rep := waitEvent(t, evA, cm.EventConnectResponse, "A")
			if rep.ID != id || rep.Param.QPN != 0x22 || rep.Param.StartingPSN != 0x5678 {
				t.Fatalf("A's connect response %+v", rep)
			}
			if err := a.CM().Establish(id, nil); err != nil {
				t.Fatal(err)
			}
			if ev := waitEvent(t, evB, cm.EventEstablished, "B"); ev.ID != req.ID {
				t.Fatalf("B established %v, want %v", ev.ID, req.ID)
			}
			if err := a.CM().Disconnect(id, nil); err != nil {
				t.Fatal(err)
			}
			waitEvent(t, evB, cm.EventDisconnected, "B")
			// B answers with its own rdma_disconnect, as librdmacm's
			// programs do: the DREP.
			if err := b.CM().Disconnect(req.ID, nil); err != nil {
				t.Fatal(err)
			}
			waitEvent(t, evA, cm.EventDisconnected, "A")
			mu.Lock()
			var first cm.Message
			err = cm.Parse(atB[0], &first)
			mu.Unlock()
			if err != nil || first.REQ.LocalCAGUID != a.Port().MAC().EUI64() || first.REQ.LocalQPN != 0x11 {
				t.Errorf("the REQ B received: %v, CA GUID %#x QPN %#x; want A's node GUID %#x", err,
					first.REQ.LocalCAGUID, first.REQ.LocalQPN, a.Port().MAC().EUI64())
			}
			sa, sb := a.Engine().Stats(), b.Engine().Stats()
			if sa.GSISent < 3 || sb.GSIReceived < 3 || sb.GSISent < 2 { // REQ, RTU, DREQ; REP, DREP
				t.Errorf("MADs: A sent %d, B received %d and sent %d", sa.GSISent, sb.GSIReceived, sb.GSISent)
			}

			// B's QP1 falls silent: A's next REQ is sent again on A's timer.
			b.SetGSI(func(netip.Addr, netip.Addr, uint32, uint16, []byte) {})
			before := b.Engine().Stats().GSIReceived
			if _, err := a.CM().Connect(ownA, cm.ConnectParams{
				Local: netip.AddrPortFrom(ipA, 0), Remote: netip.AddrPortFrom(ipB, 7174),
				PortSpace: cm.PortSpaceTCP, QPType: cm.QPTypeRC, QPN: 0x33, StartingPSN: 1,
				RetryCount: 7, RNRRetryCount: 7, PathMTU: 3,
			}); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for b.Engine().Stats().GSIReceived < before+2 {
				if time.Now().After(deadline) {
					t.Fatalf("B's QP1 got %d MADs in 30 s, want the REQ and its retry", b.Engine().Stats().GSIReceived-before)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// TestNICLostRTU: B's RTU is lost, and A's first SEND on the connected QP
// establishes B's side of the connection at once (IBA 12.9.6: the
// engine's first request is "communication established"), long before
// B's REP would go again (4.3 s, the REQ's CM response timeout); the
// SEND arrives. Without the engine telling the manager, B would wait for
// that retry and the RTU it draws.
func TestNICLostRTU(t *testing.T) {
	a, b, _, _ := madNICs(t, nil)
	ipA, ipB := a.GIDs()[1].Addr().Unmap(), b.GIDs()[1].Addr().Unmap()
	evA, evB := cmEvents(a), cmEvents(b)
	var mu sync.Mutex
	var rtus, reps int
	b.SetGSI(func(src, dst netip.Addr, _ uint32, _ uint16, mad []byte) {
		mu.Lock()
		lost := cm.MAD(mad).AttrID() == cm.AttrRTU
		if lost {
			rtus++
		}
		mu.Unlock()
		if !lost {
			b.CM().Receive(src, dst, mad)
		}
	})
	a.SetGSI(func(src, dst netip.Addr, _ uint32, _ uint16, mad []byte) {
		mu.Lock()
		if cm.MAD(mad).AttrID() == cm.AttrREP {
			reps++
		}
		mu.Unlock()
		a.CM().Receive(src, dst, mad)
	})
	qa, qb := newRCEnd(t, a), newRCEnd(t, b)
	if _, err := b.CM().Listen(2, cm.ListenParams{Port: 7175, PortSpace: cm.PortSpaceTCP}); err != nil {
		t.Fatal(err)
	}
	id, err := a.CM().Connect(1, cm.ConnectParams{Local: netip.AddrPortFrom(ipA, 0), Remote: netip.AddrPortFrom(ipB, 7175),
		PortSpace: cm.PortSpaceTCP, QPType: cm.QPTypeRC, QPN: qa.qp.Num(), StartingPSN: 100,
		ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7, PathMTU: 3})
	if err != nil {
		t.Fatal(err)
	}
	req := waitEvent(t, evB, cm.EventConnectRequest, "B")
	qb.connect(t, ipA, a, qa.qp.Num(), 100, 200)
	if err := b.CM().Accept(req.ID, cm.AcceptParams{QPN: qb.qp.Num(), StartingPSN: 200, ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, evA, cm.EventConnectResponse, "A")
	qa.connect(t, ipB, b, qb.qp.Num(), 200, 100)
	if err := a.CM().Establish(id, nil); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := qb.qp.PostRecv([]transport.RecvWR{{ID: 7, SGL: []transport.SGE{{Addr: 0x10000, Length: 64, LKey: qb.mr.LKey}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := qa.qp.PostSend([]transport.SendWR{{ID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled | abi.SendInline, Inline: []byte("hi")}}); err != nil {
		t.Fatal(err)
	}
	if ev := waitEvent(t, evB, cm.EventEstablished, "B"); ev.ID != req.ID {
		t.Fatalf("B established %v, want %v", ev.ID, req.ID)
	}
	mu.Lock()
	defer mu.Unlock()
	if d := time.Since(start); rtus != 1 || reps != 1 || d > 2*time.Second {
		t.Fatalf("B established after %v, %d RTUs lost, %d REPs; want at once on the SEND, with the first REP", d, rtus, reps)
	}
	wcs := make([]transport.WC, 1)
	for deadline := time.Now().Add(5 * time.Second); qb.cq.Poll(wcs) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the SEND did not arrive")
		}
	}
	if wcs[0].Status != abi.WCSuccess || wcs[0].ID != 7 || string(qb.buf[:2]) != "hi" {
		t.Fatalf("B's completion %+v, buffer %q", wcs[0], qb.buf[:2])
	}
}

// rcEnd is an RC QP on a NIC's engine, with a CQ and 4 KiB of memory at
// 0x10000.
type rcEnd struct {
	qp  *transport.QP
	cq  *transport.CQ
	mr  *transport.MR
	buf []byte
}

func newRCEnd(t *testing.T, n *NIC) *rcEnd {
	t.Helper()
	e := n.Engine()
	pd := e.Memory().NewPD()
	r := &rcEnd{buf: make([]byte, 4096), cq: transport.NewCQ(64, nil)}
	var err error
	if r.mr, err = e.Memory().Register(pd, 0x10000, r.buf, abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if r.qp, err = e.CreateQP(transport.QPConfig{Type: abi.RC, PD: pd, SendCQ: r.cq, RecvCQ: r.cq, MaxSendWR: 16, MaxRecvWR: 16, MaxInline: 64}); err != nil {
		t.Fatal(err)
	}
	return r
}

// connect takes the QP through INIT and RTR to RTS towards QP dqpn of
// peer at ip, as librdmacm does with the CM's attributes.
func (r *rcEnd) connect(t *testing.T, ip netip.Addr, peer *NIC, dqpn uint32, rq, sq roce.PSN) {
	t.Helper()
	for _, st := range []struct {
		attr transport.QPAttr
		mask abi.AttrMask
	}{
		{transport.QPAttr{State: abi.QPSInit, Port: 1}, abi.QPStateMask | abi.QPPKeyIndex | abi.QPPort | abi.QPAccessFlags},
		{transport.QPAttr{State: abi.QPSRTR, PathMTU: abi.MTU1024, DestQPN: dqpn, RQPSN: rq, MaxDestRdAtomic: 1,
			AV: transport.AddressVector{DstIP: ip, DstMAC: peer.Port().MAC(), SGIDIndex: 1}},
			abi.QPStateMask | abi.QPAV | abi.QPPathMTU | abi.QPDestQPN | abi.QPRQPSN | abi.QPMaxDestRdAtomic | abi.QPMinRNRTimer},
		{transport.QPAttr{State: abi.QPSRTS, SQPSN: sq, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
			abi.QPStateMask | abi.QPSQPSN | abi.QPTimeout | abi.QPRetryCnt | abi.QPRNRRetry | abi.QPMaxQPRdAtomic},
	} {
		if err := r.qp.Modify(&st.attr, st.mask); err != nil {
			t.Fatal(err)
		}
	}
}
