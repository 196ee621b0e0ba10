package appliance

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/cm"
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
