package cm_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/appliance/roce"
)

// pair returns a network with an active node A and a passive node B
// listening on TCP port 7174 for any address, both owners behaving as
// serve(false) has them.
func pair(t *testing.T, seed uint64) (*network, *node, *node, cm.ID) {
	t.Helper()
	w := newNetwork(t, seed)
	a := w.add(addrA, guidA, cm.Config{})
	b := w.add(addrB, guidB, cm.Config{})
	a.on, b.on = serve(false), serve(false)
	lid, err := b.m.Listen(ownB, cm.ListenParams{Port: 7174, PortSpace: cm.PortSpaceTCP})
	if err != nil {
		t.Fatal(err)
	}
	return w, a, b, lid
}

// connect connects A to B and returns the two IDs, established.
func connect(t *testing.T, w *network, a, b *node, qpn uint32) (cm.ID, cm.ID) {
	t.Helper()
	id, err := a.m.Connect(ownA, connectParams(addrA, addrB, 7174, qpn))
	if err != nil {
		t.Fatal(err)
	}
	if !w.run(time.Minute, func() bool { return a.state(id) == cm.StateEstablished && len(b.eventsOf(cm.EventEstablished)) > 0 }) {
		t.Fatalf("not established: A %v, B events %v", a.state(id), b.events)
	}
	es := b.eventsOf(cm.EventEstablished)
	return id, es[len(es)-1].ID
}

// TestConnectAndDisconnect: REQ, REP, RTU set up a connection whose two
// IDs agree on QPNs and PSNs; either side disconnects, the other
// answering with Disconnect or Destroy; both ends pass through TimeWait
// and, destroyed, leave nothing behind.
func TestConnectAndDisconnect(t *testing.T) {
	for _, tc := range []struct {
		name      string
		byPassive bool // the passive side disconnects
		answer    string
	}{
		{"active disconnects, passive answers with Disconnect", false, "disconnect"},
		{"active disconnects, passive destroys", false, "destroy"},
		{"passive disconnects, active answers with Disconnect", true, "disconnect"},
		{"passive disconnects, active destroys", true, "destroy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, a, b, lid := pair(t, 1)
			aid, err := a.m.Connect(ownA, connectParams(addrA, addrB, 7174, 0x1f))
			if err != nil {
				t.Fatal(err)
			}
			w.deliver()
			w.check()
			if got, want := w.sentAttrs(), []cm.AttrID{cm.AttrREQ, cm.AttrREP, cm.AttrRTU}; !slices.Equal(got, want) {
				t.Fatalf("sent %v, want %v", got, want)
			}
			if len(b.events) != 2 || b.events[0].Type != cm.EventConnectRequest || b.events[1].Type != cm.EventEstablished {
				t.Fatalf("B's events %+v", b.events)
			}
			req := b.events[0]
			bid := req.ID
			if req.Listener != lid || req.Owner != ownB || req.Param.QPN != 0x1f || req.Param.StartingPSN != 0x164dec ||
				req.Param.RetryCount != 7 || req.Param.RNRRetryCount != 7 || len(req.PrivateData) != 56 {
				t.Errorf("ConnectRequest %+v", req)
			}
			if len(a.events) != 1 || a.events[0].Type != cm.EventConnectResponse || a.events[0].Param.QPN != 0x100+uint32(bid) {
				t.Fatalf("A's events %+v", a.events)
			}
			ai, bi := a.info(aid), b.info(bid)
			if ai.State != cm.StateEstablished || bi.State != cm.StateEstablished {
				t.Fatalf("states %v, %v", ai.State, bi.State)
			}
			// What each side's QP needs: the other's QPN, its own receive
			// PSN, the other's as its send PSN.
			if ai.RemoteQPN != bi.LocalQPN || bi.RemoteQPN != ai.LocalQPN || ai.SQPSN != bi.RQPSN || bi.SQPSN != ai.RQPSN ||
				ai.RQPSN != 0x164dec || bi.RQPSN != 0xeef1a7 {
				t.Errorf("QP attributes do not pair:\nA %+v\nB %+v", ai, bi)
			}
			if ai.AckTimeout != 19 || bi.AckTimeout != 19 || bi.RetryCount != 7 || bi.RNRRetryCount != 7 || ai.RNRRetryCount != 7 ||
				ai.ResponderResources != 1 || ai.InitiatorDepth != 1 || bi.ResponderResources != 1 || bi.InitiatorDepth != 1 {
				t.Errorf("QP attributes:\nA %+v\nB %+v", ai, bi)
			}
			if ai.Local.Addr() != addrA || ai.Remote != netip.AddrPortFrom(addrB, 7174) || bi.Local != ai.Remote || bi.Remote != ai.Local {
				t.Errorf("addresses: A %v→%v, B %v→%v", ai.Local, ai.Remote, bi.Local, bi.Remote)
			}
			if ai.LocalCommID != bi.RemoteCommID || bi.LocalCommID != ai.RemoteCommID || ai.FlowLabel != bi.FlowLabel {
				t.Errorf("comm IDs or flow labels differ:\nA %+v\nB %+v", ai, bi)
			}

			x, y, xid, yid := a, b, aid, bid
			if tc.byPassive {
				x, y, xid, yid = b, a, bid, aid
			}
			yQPN := y.info(yid).LocalQPN
			y.on = func(n *node, e cm.Event) {
				if e.Type != cm.EventDisconnected {
					return
				}
				var err error
				if tc.answer == "destroy" {
					err = n.m.Destroy(e.ID)
				} else {
					err = n.m.Disconnect(e.ID, nil)
				}
				if err != nil {
					t.Error(err)
				}
			}
			start := w.clk.now
			if err := x.m.Disconnect(xid, nil); err != nil {
				t.Fatal(err)
			}
			if x.state(xid) != cm.StateDreqSent {
				t.Fatalf("after Disconnect: %v", x.state(xid))
			}
			w.deliver()
			w.check()
			dreq, drep := w.last(cm.AttrDREQ), w.last(cm.AttrDREP)
			if dreq.DREQ.RemoteQPN != yQPN {
				t.Errorf("DREQ names QPN 0x%x", dreq.DREQ.RemoteQPN)
			}
			if drep.Header.TID != dreq.Header.TID || drep.DREP.RemoteCommID != dreq.DREQ.LocalCommID || drep.DREP.LocalCommID != dreq.DREQ.RemoteCommID {
				t.Errorf("DREP %v does not answer DREQ %v", &drep, &dreq)
			}
			if len(x.eventsOf(cm.EventDisconnected)) != 1 || len(y.eventsOf(cm.EventDisconnected)) != 1 {
				t.Errorf("Disconnected events: %d, %d", len(x.eventsOf(cm.EventDisconnected)), len(y.eventsOf(cm.EventDisconnected)))
			}
			if x.state(xid) != cm.StateTimeWait {
				t.Errorf("disconnecting side in %v", x.state(xid))
			}
			// TimeWait lasts the path's ACK timeout as Linux converts it:
			// 2^(19-8) ms.
			w.run(time.Minute, func() bool { return x.state(xid) == cm.StateIdle })
			if d := w.clk.now.Sub(start); d != 2048*time.Millisecond {
				t.Errorf("TimeWait lasted %v", d)
			}
			if len(x.eventsOf(cm.EventTimeWaitExit)) != 1 {
				t.Errorf("no TimeWaitExit: %+v", x.events)
			}
			w.run(time.Minute, nil)
			if tc.answer == "disconnect" && y.state(yid) != cm.StateIdle {
				t.Errorf("answering side in %v", y.state(yid))
			}
			if n := w.count(cm.AttrDREQ, x.addr) + w.count(cm.AttrDREP, y.addr); n != 2 {
				t.Errorf("%d DREQs and DREPs; sent %v", n, w.sentAttrs())
			}
			for _, id := range []cm.ID{xid, yid, lid} {
				for _, n := range []*node{a, b} {
					_ = n.m.Destroy(id)
				}
			}
			w.run(time.Minute, nil)
			w.empty()
		})
	}
}

// TestCrossedDREQs: both sides disconnect at once. Linux's CM takes the
// peer's DREQ in DREQ_SENT as a DREQ (its own is no longer sent) and the
// DREP in DREQ_RCVD as a DREP, so either order ends in TimeWait on both
// sides with no DREQ sent again; in rxe-cm-write-bw.pcap the server
// answers the client's DREQ while the client, whose DREP arrived after
// the server's DREQ, never answers the server's. Both orders here, with
// the owners destroying their IDs once disconnected.
func TestCrossedDREQs(t *testing.T) {
	for _, tc := range []struct {
		name string
		// aAnswers: A's owner answers the DREQ it is told of at once; in
		// the capture the DREP to the client's DREQ came first.
		aAnswers bool
		steps    func(w *network)
		dreps    int
	}{
		{"as in the capture", false, func(w *network) {
			// The client's DREQ reaches the server, whose owner answers
			// it; the server's DREQ reaches the client before that DREP.
			w.take(cm.AttrDREQ, addrA)
			w.take(cm.AttrDREQ, addrB)
			w.take(cm.AttrDREP, addrB)
		}, 1},
		{"both DREQs first, both answered", true, func(w *network) {
			w.take(cm.AttrDREQ, addrA)
			w.take(cm.AttrDREQ, addrB)
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, a, b, lid := pair(t, 2)
			aid, bid := connect(t, w, a, b, 0x1e)
			// Owners as librdmacm programs: rdma_disconnect when told
			// of the disconnection (it sends the DREP), destroy once out
			// of TimeWait.
			owner := func(answer bool) func(n *node, e cm.Event) {
				return func(n *node, e cm.Event) {
					switch e.Type {
					case cm.EventDisconnected:
						if !answer {
							return
						}
						if err := n.m.Disconnect(e.ID, nil); err != nil {
							t.Error(err)
						}
					case cm.EventTimeWaitExit:
						if err := n.m.Destroy(e.ID); err != nil {
							t.Error(err)
						}
					}
				}
			}
			a.on, b.on = owner(tc.aAnswers), owner(true)
			w.hold = true
			before := len(w.sent)
			if err := a.m.Disconnect(aid, nil); err != nil {
				t.Fatal(err)
			}
			if err := b.m.Disconnect(bid, nil); err != nil {
				t.Fatal(err)
			}
			tc.steps(w)
			w.hold = false
			w.run(5*time.Minute, nil)
			var got []cm.AttrID
			for i := range w.sent[before:] {
				got = append(got, w.sent[before+i].attr())
			}
			if w.count(cm.AttrDREQ, addrA) != 1 || w.count(cm.AttrDREQ, addrB) != 1 {
				t.Errorf("DREQs sent again: %v", got)
			}
			if n := w.count(cm.AttrDREP, addrA) + w.count(cm.AttrDREP, addrB); n != tc.dreps {
				t.Errorf("%d DREPs, want %d: %v", n, tc.dreps, got)
			}
			for _, n := range []*node{a, b} {
				if len(n.eventsOf(cm.EventDisconnected)) != 1 || len(n.eventsOf(cm.EventTimeWaitExit)) != 1 {
					t.Errorf("%v: events %+v", n.addr, n.events)
				}
				if s := n.m.Stats(); s.Retries != ([cm.NumAttrs]uint64{}) || s.Timeouts != ([cm.NumAttrs]uint64{}) {
					t.Errorf("%v: retries %v, timeouts %v", n.addr, s.Retries, s.Timeouts)
				}
			}
			if err := b.m.Destroy(lid); err != nil {
				t.Fatal(err)
			}
			w.empty()
		})
	}
}

// TestNoListener: a REQ for a service nobody listens on is rejected at
// once with reason 8 (invalid service ID), as rxe does, and leaves no
// state at the passive side; one the RDMA CM's listeners of the service
// do not take (another address, another QP type, a CMA header that does
// not parse) with reason 28, as Linux's RDMA CM failing the request
// makes its CM reject it.
func TestNoListener(t *testing.T) {
	for _, tc := range []struct {
		name   string
		listen *cm.ListenParams
		mod    func(p *cm.ConnectParams)
		reason cm.RejectReason
	}{
		{"no listener", nil, nil, cm.RejInvalidServiceID},
		{"another port", &cm.ListenParams{Port: 7175, PortSpace: cm.PortSpaceTCP}, nil, cm.RejInvalidServiceID},
		{"another port space", &cm.ListenParams{Port: 7174, PortSpace: cm.PortSpaceIB}, nil, cm.RejInvalidServiceID},
		{"another address", &cm.ListenParams{Addr: netip.MustParseAddr("10.99.0.9"), Port: 7174, PortSpace: cm.PortSpaceTCP}, nil, cm.RejConsumerDefined},
		{"IPv4 listener, IPv6 request", &cm.ListenParams{Addr: netip.IPv4Unspecified(), Port: 7174, PortSpace: cm.PortSpaceTCP}, func(p *cm.ConnectParams) {
			p.Local = netip.MustParseAddrPort("[fd00::2]:5000")
			p.Remote = netip.MustParseAddrPort("[fd00::3]:7174")
		}, cm.RejConsumerDefined},
		{"UC listener, RC request", &cm.ListenParams{Port: 7174, PortSpace: cm.PortSpaceTCP, QPType: cm.QPTypeUC}, nil, cm.RejConsumerDefined},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newNetwork(t, 3)
			a := w.add(addrA, guidA, cm.Config{})
			b := w.add(addrB, guidB, cm.Config{})
			w.nodes[netip.MustParseAddr("fd00::2")] = a
			w.nodes[netip.MustParseAddr("fd00::3")] = b
			var lid cm.ID
			if tc.listen != nil {
				var err error
				if lid, err = b.m.Listen(ownB, *tc.listen); err != nil {
					t.Fatal(err)
				}
			}
			p := connectParams(addrA, addrB, 7174, 0x1f)
			if tc.mod != nil {
				tc.mod(&p)
			}
			id, err := a.m.Connect(ownA, p)
			if err != nil {
				t.Fatal(err)
			}
			// REJ 28 comes at once; REJ 8 once the request waited
			// its grace for a listener (Config.ListenGrace), and not
			// before.
			start := w.clk.now
			w.deliver()
			if tc.reason == cm.RejInvalidServiceID {
				if len(a.events) != 0 {
					t.Fatalf("A's events before the grace: %+v", a.events)
				}
				w.run(time.Minute, func() bool { return len(a.events) > 0 })
			}
			if d := w.clk.now.Sub(start); tc.reason == cm.RejInvalidServiceID && d != cm.DefaultListenGrace || tc.reason != cm.RejInvalidServiceID && d != 0 {
				t.Errorf("rejected after %v", d)
			}
			if len(a.events) != 1 || a.events[0].Type != cm.EventRejected || a.events[0].Reason != tc.reason {
				t.Fatalf("A's events %+v", a.events)
			}
			req, rej := w.last(cm.AttrREQ), w.last(cm.AttrREJ)
			if rej.Header.TID != req.Header.TID || rej.REJ.RemoteCommID != req.REQ.LocalCommID || rej.REJ.LocalCommID != 0 ||
				rej.REJ.MessageRejected != cm.MessageREQ || rej.REJ.Reason != tc.reason {
				t.Errorf("REJ %v for REQ %v", &rej, &req)
			}
			if a.state(id) != cm.StateIdle || len(b.events) != 0 {
				t.Errorf("A in %v, B's events %+v", a.state(id), b.events)
			}
			w.run(10*time.Minute, nil)
			if n := w.count(cm.AttrREQ, p.Local.Addr()); n != 1 {
				t.Errorf("%d REQs", n)
			}
			_ = a.m.Destroy(id)
			_ = b.m.Destroy(lid)
			w.empty()
		})
	}
}

// TestConsumerReject: the passive owner's Reject sends REJ 28 with its
// private data; the REJ names the REQ and, since Linux's RDMA CM holds
// every request in MRA_REQ_SENT, the passive side's communication ID.
func TestConsumerReject(t *testing.T) {
	w, a, b, lid := pair(t, 4)
	priv := []byte("not today, thank you")
	b.on = func(n *node, e cm.Event) {
		if e.Type == cm.EventConnectRequest {
			if err := n.m.Reject(e.ID, priv); err != nil {
				t.Error(err)
			}
		}
	}
	id, err := a.m.Connect(ownA, connectParams(addrA, addrB, 7174, 0x1f))
	if err != nil {
		t.Fatal(err)
	}
	w.deliver()
	if len(a.events) != 1 || a.events[0].Type != cm.EventRejected || a.events[0].Reason != cm.RejConsumerDefined {
		t.Fatalf("A's events %+v", a.events)
	}
	if got := a.events[0].PrivateData; len(got) != cm.REJPrivateDataLen || !bytes.HasPrefix(got, priv) {
		t.Errorf("private data %q", got)
	}
	bid := b.events[0].ID
	rej := w.last(cm.AttrREJ)
	if rej.REJ.LocalCommID != b.info(bid).LocalCommID || rej.REJ.MessageRejected != cm.MessageREQ {
		t.Errorf("REJ %v", &rej)
	}
	if b.state(bid) != cm.StateIdle || a.state(id) != cm.StateIdle {
		t.Errorf("states %v, %v", a.state(id), b.state(bid))
	}
	if err := b.m.Reject(bid, nil); !errors.Is(err, cm.ErrState) {
		t.Errorf("second Reject: %v", err)
	}
	if err := b.m.Reject(bid, make([]byte, cm.REJPrivateDataLen+1)); err == nil {
		t.Error("Reject with too much private data")
	}
	for _, x := range []struct {
		n  *node
		id cm.ID
	}{{a, id}, {b, bid}, {b, lid}} {
		if err := x.n.m.Destroy(x.id); err != nil {
			t.Fatal(err)
		}
	}
	w.empty()
}

// TestLoss: 5 % of the MADs lost each way; 200 connections all
// establish, through REQ, REP and RTU retries (a duplicate REP is
// answered with the RTU again, a duplicate REQ with an MRA), then all
// disconnect, and nothing is left.
func TestLoss(t *testing.T) {
	w, a, b, lid := pair(t, 5)
	w.loss = 0.05
	a.on, b.on = serve(true), serve(true)
	const conns = 200
	var ids []cm.ID
	for i := range conns {
		id, err := a.m.Connect(ownA, connectParams(addrA, addrB, 7174, 0x200+uint32(i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	established := func() bool {
		for _, id := range ids {
			if a.state(id) != cm.StateEstablished {
				return false
			}
		}
		return len(b.eventsOf(cm.EventEstablished)) == conns
	}
	if !w.run(10*time.Minute, established) {
		n := 0
		for _, id := range ids {
			if a.state(id) == cm.StateEstablished {
				n++
			}
		}
		t.Fatalf("%d of %d established at A, %d at B", n, conns, len(b.eventsOf(cm.EventEstablished)))
	}
	w.check()
	sa, sb := a.m.Stats(), b.m.Stats()
	req, _ := cm.AttrIndex(cm.AttrREQ)
	rep, _ := cm.AttrIndex(cm.AttrREP)
	t.Logf("lost %d; A retries %v, B retries %v, B duplicates %v", w.lost, sa.Retries, sb.Retries, sb.Duplicates)
	if w.lost == 0 || sa.Retries[req]+sb.Retries[rep] == 0 {
		t.Errorf("lost %d, REQ retries %d, REP retries %d", w.lost, sa.Retries[req], sb.Retries[rep])
	}
	if sa.Timeouts != ([cm.NumAttrs]uint64{}) || sb.Timeouts != ([cm.NumAttrs]uint64{}) {
		t.Errorf("timeouts: %v, %v", sa.Timeouts, sb.Timeouts)
	}
	for _, id := range ids {
		if err := a.m.Disconnect(id, nil); err != nil {
			t.Fatal(err)
		}
	}
	if !w.run(10*time.Minute, func() bool {
		return len(a.eventsOf(cm.EventDisconnected)) == conns && len(b.eventsOf(cm.EventDisconnected)) == conns
	}) {
		t.Fatalf("%d disconnected at A, %d at B", len(a.eventsOf(cm.EventDisconnected)), len(b.eventsOf(cm.EventDisconnected)))
	}
	w.loss = 0
	w.run(10*time.Minute, nil)
	if err := b.m.Destroy(lid); err != nil {
		t.Fatal(err)
	}
	w.empty()
}

// TestLostRTU: the RTU is lost. The passive side takes the QP's first
// packet as it (CommEstablished), or the consumer's rdma_notify (Notify),
// and sends the REP no more; or, with neither, sends the REP again and the active side answers the
// duplicate with the RTU again.
func TestLostRTU(t *testing.T) {
	for _, mode := range []string{"CommEstablished", "Notify", "REP again"} {
		commEst := mode != "REP again"
		t.Run(mode, func(t *testing.T) {
			w, a, b, lid := pair(t, 6)
			rtus := 0
			w.drop = func(p *packet) bool {
				if p.attr() == cm.AttrRTU {
					rtus++
					return rtus == 1
				}
				return false
			}
			aid, err := a.m.Connect(ownA, connectParams(addrA, addrB, 7174, 0x1f))
			if err != nil {
				t.Fatal(err)
			}
			w.deliver()
			bid := b.events[0].ID
			if a.state(aid) != cm.StateEstablished || b.state(bid) != cm.StateRepSent {
				t.Fatalf("states %v, %v", a.state(aid), b.state(bid))
			}
			qpn := b.info(bid).LocalQPN
			switch mode {
			case "Notify":
				if err := b.m.Notify(lid); !errors.Is(err, cm.ErrNoID) {
					t.Errorf("Notify of the listener: %v", err)
				}
				if err := b.m.Notify(bid); err != nil {
					t.Fatalf("Notify: %v", err)
				}
				if err := b.m.Notify(bid); !errors.Is(err, cm.ErrEstablished) {
					t.Errorf("a second Notify: %v, want ErrEstablished", err)
				}
			case "CommEstablished":
				if b.m.CommEstablished(qpn + 1) {
					t.Error("CommEstablished of another QPN took")
				}
				if !b.m.CommEstablished(qpn) {
					t.Fatal("CommEstablished did not take")
				}
				if b.m.CommEstablished(qpn) {
					t.Error("a second CommEstablished took")
				}
			}
			w.run(time.Minute, func() bool { return b.state(bid) == cm.StateEstablished })
			if len(b.eventsOf(cm.EventEstablished)) != 1 {
				t.Fatalf("B's events %+v", b.events)
			}
			w.run(10*time.Minute, nil)
			reps := w.count(cm.AttrREP, addrB)
			if commEst && reps != 1 || !commEst && (reps != 2 || rtus != 2) {
				t.Errorf("%d REPs, %d RTUs", reps, rtus)
			}
			if !commEst {
				dup, _ := cm.AttrIndex(cm.AttrREP)
				if a.m.Stats().Duplicates[dup] != 1 {
					t.Errorf("A's duplicates %v", a.m.Stats().Duplicates)
				}
			}
			_ = a.m.Destroy(aid)
			_ = b.m.Destroy(bid)
			_ = b.m.Destroy(lid)
			w.run(time.Minute, nil)
			w.empty()
		})
	}
}

// rawREQ returns a REQ as a librdmacm peer at src would send it to
// 10.99.0.3:port, with communication ID id and QPN qpn.
func rawREQ(t testing.TB, src netip.Addr, port uint16, id, qpn uint32, guid uint64) []byte {
	t.Helper()
	msg := cm.Message{Header: cm.NewHeader(cm.AttrREQ, uint64(bits.ReverseBytes32(id)))}
	msg.REQ = cm.REQFields{LocalCommID: id, ServiceID: cm.RDMAServiceID(cm.PortSpaceTCP, port), LocalCAGUID: guid,
		LocalQPN: qpn, ResponderResources: 1, InitiatorDepth: 1, RemoteCMResponseTimeout: 20, StartingPSN: 1,
		LocalCMResponseTimeout: 20, RetryCount: 7, PKey: 0xFFFF, PathMTU: 3, RNRRetryCount: 7, MaxCMRetries: 15,
		Primary: cm.PathFields{LocalLID: 0xFFFF, RemoteLID: 0xFFFF, LocalGID: roce.GIDFromAddr(src),
			RemoteGID: roce.GIDFromAddr(addrB), HopLimit: 64, LocalACKTimeout: 19}}
	h := cm.CMAHeader{Src: netip.AddrPortFrom(src, 40000), Dst: addrB}
	if err := h.Encode(msg.REQ.PrivateData[:]); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, cm.MADLen)
	if _, err := msg.Encode(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDrop: a request the owner drops (its queue full, as ucma's
// backlog) gets no answer; the peer's REQ comes again after 6.144 s and
// up as a new request, which the owner accepts.
func TestDrop(t *testing.T) {
	w, a, b, lid := pair(t, 18)
	dropped := false
	b.on = func(n *node, e cm.Event) {
		if e.Type == cm.EventConnectRequest && !dropped {
			dropped = true
			if err := n.m.Drop(e.ID); err != nil {
				t.Error(err)
			}
			return
		}
		serve(false)(n, e)
	}
	start := w.clk.now
	aid, bid := connect(t, w, a, b, 1)
	if d := w.clk.now.Sub(start); d != 6144*time.Millisecond {
		t.Errorf("established after %v", d)
	}
	if n := len(b.eventsOf(cm.EventConnectRequest)); n != 2 || w.count(cm.AttrREJ, addrB) != 0 || w.count(cm.AttrMRA, addrB) != 0 {
		t.Errorf("%d requests; sent %v", n, w.sentAttrs())
	}
	if err := b.m.Drop(bid); !errors.Is(err, cm.ErrState) {
		t.Errorf("Drop of an established ID: %v", err)
	}
	_ = a.m.Destroy(aid)
	w.deliver()
	_ = b.m.Destroy(bid)
	_ = b.m.Destroy(lid)
	w.run(time.Minute, nil)
	w.empty()
}

// TestRepeatedREQ: a REQ repeated once the REP is out is ignored and
// counted (Linux's cm_dup_req_handler answers only while the request
// waits for its consumer): the REP's own timer answers it.
func TestRepeatedREQ(t *testing.T) {
	w, a, b, lid := pair(t, 20)
	a.on = nil
	id, err := a.m.Connect(ownA, connectParams(addrA, addrB, 7174, 1))
	if err != nil {
		t.Fatal(err)
	}
	w.deliver()
	req := w.sent[0]
	b.m.Receive(req.src, req.dst, req.mad[:])
	w.deliver()
	dup, _ := cm.AttrIndex(cm.AttrREQ)
	if n := b.m.Stats().Duplicates[dup]; n != 1 || len(w.sent) != 2 || len(b.events) != 1 {
		t.Errorf("%d duplicates; sent %v; events %+v", n, w.sentAttrs(), b.events)
	}
	_ = a.m.Destroy(id)
	w.deliver()
	b.m.CloseOwner(ownB)
	_ = lid
	w.empty()
}

// TestStaleConnection: a REQ from a QP that already has a connection
// here (its peer lost it without a DREQ reaching us) is stale: REJ 10,
// and the old connection is disconnected with a DREQ, as Linux's
// cm_match_req does.
func TestStaleConnection(t *testing.T) {
	w, a, b, lid := pair(t, 21)
	aid, bid := connect(t, w, a, b, 0x11)
	b.m.Receive(addrA, addrB, rawREQ(t, addrA, 7174, 0x5555, 0x11, guidA))
	w.hold = true
	w.deliver()
	if rej := w.last(cm.AttrREJ); rej.REJ.Reason != cm.RejStaleConn || rej.REJ.RemoteCommID != 0x5555 || rej.REJ.MessageRejected != cm.MessageREQ {
		t.Errorf("REJ %v", &rej)
	}
	if b.state(bid) != cm.StateDreqSent || len(b.eventsOf(cm.EventConnectRequest)) != 1 {
		t.Errorf("old connection in %v; events %+v", b.state(bid), b.events)
	}
	w.hold = false
	w.inflight = w.inflight[1:] // the REJ goes to a peer that never sent the REQ
	a.on = serve(true)
	w.run(time.Minute, nil)
	if b.state(bid) != cm.StateIdle || len(a.eventsOf(cm.EventDisconnected)) != 1 {
		t.Errorf("old connection in %v; A's events %+v", b.state(bid), a.events)
	}
	_ = aid
	_ = b.m.Destroy(bid)
	_ = b.m.Destroy(lid)
	w.empty()
}

// TestREQFlood: a peer floods REQs. A listener's backlog holds as many
// as it allows and drops the rest silently, for the peer to send again,
// as Linux's ucma does; repeats of those held get MRAs; the manager's
// limit holds across listeners; REQs for no listener cost no state; the
// owner's teardown rejects what it held, and nothing is left.
func TestREQFlood(t *testing.T) {
	w := newNetwork(t, 7)
	b := w.add(addrB, guidB, cm.Config{MaxConns: 24, ListenGrace: -1}) // REJ 8 at once (TestListenGrace waits)
	peer := netip.MustParseAddr("10.99.0.66")
	l1, err := b.m.Listen(ownB, cm.ListenParams{Port: 7174, PortSpace: cm.PortSpaceTCP, Backlog: 8})
	if err != nil {
		t.Fatal(err)
	}
	l2, err := b.m.Listen(ownB, cm.ListenParams{Port: 7175, PortSpace: cm.PortSpaceTCP, Backlog: 100})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		b.m.Receive(peer, addrB, rawREQ(t, peer, 7174, uint32(0x1000+i), uint32(0x10+i), 0xAA))
	}
	w.check()
	s := b.m.Stats()
	if s.States[cm.StateMRAReqSent] != 8 || s.Drops[cm.DropBacklog] != 992 || len(w.sent) != 0 {
		t.Fatalf("held %d, dropped %d for the backlog, sent %v", s.States[cm.StateMRAReqSent], s.Drops[cm.DropBacklog], w.sentAttrs())
	}
	for i := range 1000 { // the flood again: MRAs for those held
		b.m.Receive(peer, addrB, rawREQ(t, peer, 7174, uint32(0x1000+i), uint32(0x10+i), 0xAA))
	}
	if n := w.count(cm.AttrMRA, addrB); n != 8 {
		t.Errorf("%d MRAs", n)
	}
	mra := w.last(cm.AttrMRA)
	if mra.MRA.ServiceTimeout != cm.MRAServiceTimeout || mra.MRA.MessageMRAed != cm.MessageREQ {
		t.Errorf("MRA %v", &mra)
	}
	for i := range 1000 {
		b.m.Receive(peer, addrB, rawREQ(t, peer, 7175, uint32(0x9000+i), uint32(0x5000+i), 0xAB))
	}
	s = b.m.Stats()
	if s.States[cm.StateMRAReqSent] != 24 || s.Drops[cm.DropLimit] != 1000-16 {
		t.Errorf("held %d, dropped %d for the limit", s.States[cm.StateMRAReqSent], s.Drops[cm.DropLimit])
	}
	for i := range 1000 {
		b.m.Receive(peer, addrB, rawREQ(t, peer, 7999, uint32(0x20000+i), uint32(0x20000+i), 0xAC))
	}
	if n := w.count(cm.AttrREJ, addrB); n != 1000 {
		t.Errorf("%d REJs for no listener", n)
	}
	if n := cm.Sizes(b.m)["conns"]; n != 24 {
		t.Errorf("%d IDs", n)
	}
	w.check()
	if n := b.m.CloseOwner(ownB); n != 26 {
		t.Errorf("CloseOwner destroyed %d", n)
	}
	if n := w.count(cm.AttrREJ, addrB); n != 1024 {
		t.Errorf("%d REJs after teardown", n)
	}
	if _, err := b.m.Info(l1); !errors.Is(err, cm.ErrNoID) {
		t.Errorf("listener after teardown: %v", err)
	}
	_ = l2
	w.empty()
}

// TestMalformed: MADs that do not parse, that the CM does not take on
// RoCE, or that name no ID are dropped and counted; a live connection
// goes on untouched.
func TestMalformed(t *testing.T) {
	w, a, b, lid := pair(t, 8)
	aid, bid := connect(t, w, a, b, 0x1f)
	ai, bi := a.info(aid), b.info(bid)
	good := func(attr cm.AttrID, f func(m *cm.Message)) []byte {
		msg := cm.Message{Header: cm.NewHeader(attr, 1)}
		f(&msg)
		buf := make([]byte, cm.MADLen)
		if _, err := msg.Encode(buf); err != nil {
			t.Fatal(err)
		}
		return buf
	}
	set := func(b []byte, i int, v byte) []byte { b = slices.Clone(b); b[i] = v; return b }
	rtu := good(cm.AttrRTU, func(m *cm.Message) {
		m.RTU = cm.RTUFields{LocalCommID: ai.LocalCommID, RemoteCommID: bi.LocalCommID}
	})
	for _, tc := range []struct {
		name string
		mad  []byte
		drop cm.DropReason
	}{
		{"short", rtu[:100], cm.DropMalformed},
		{"long", append(slices.Clone(rtu), 0), cm.DropMalformed},
		{"base version", set(rtu, 0, 2), cm.DropMalformed},
		{"class", set(rtu, 1, 4), cm.DropMalformed},
		{"class version", set(rtu, 2, 1), cm.DropMalformed},
		{"method", set(rtu, 3, byte(cm.MethodGet)), cm.DropMalformed},
		{"attribute", set(rtu, 17, 0x42), cm.DropMalformed},
		{"LAP", good(cm.AttrLAP, func(*cm.Message) {}), cm.DropUnsupported},
		{"ClassPortInfo", set(good(cm.AttrClassPortInfo, func(*cm.Message) {}), 3, byte(cm.MethodGet)), cm.DropUnsupported},
		{"REP for no ID", good(cm.AttrREP, func(m *cm.Message) { m.REP.RemoteCommID = 0xdeadbeef }), cm.DropUnknownID},
		{"RTU of another peer ID", good(cm.AttrRTU, func(m *cm.Message) {
			m.RTU = cm.RTUFields{LocalCommID: 7, RemoteCommID: bi.LocalCommID}
		}), cm.DropUnknownID},
		{"DREP not awaited", good(cm.AttrDREP, func(m *cm.Message) {
			m.DREP = cm.DREPFields{LocalCommID: ai.LocalCommID, RemoteCommID: bi.LocalCommID}
		}), cm.DropState},
		{"DREQ of another QPN", good(cm.AttrDREQ, func(m *cm.Message) {
			m.DREQ = cm.DREQFields{LocalCommID: ai.LocalCommID, RemoteCommID: bi.LocalCommID, RemoteQPN: bi.LocalQPN + 1}
		}), cm.DropQPN},
		{"MRA of nothing", good(cm.AttrMRA, func(m *cm.Message) {
			m.MRA = cm.MRAFields{LocalCommID: ai.LocalCommID, RemoteCommID: bi.LocalCommID, MessageMRAed: cm.MessageREP}
		}), cm.DropState},
		{"REJ for no ID", good(cm.AttrREJ, func(m *cm.Message) { m.REJ.RemoteCommID = 0x12345678; m.REJ.Reason = 28 }), cm.DropUnknownID},
		{"SIDR_REP for no ID", good(cm.AttrSIDRRep, func(m *cm.Message) { m.SIDRRep.RequestID = 0x12345678 }), cm.DropUnknownID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := b.m.Stats().Drops[tc.drop]
			b.m.Receive(addrA, addrB, tc.mad)
			w.deliver()
			if got := b.m.Stats().Drops[tc.drop]; got != before+1 {
				t.Errorf("drops for %v: %d, want %d", tc.drop, got, before+1)
			}
			w.check()
		})
	}
	// A REQ whose CMA header does not parse reaches no listener: REJ 28.
	req := rawREQ(t, addrA, 7174, 0x77, 0x77, guidA)
	req[cm.MADHeaderLen+140] = 9 // cma_version
	b.m.Receive(addrA, addrB, req)
	w.deliver()
	if rej := w.last(cm.AttrREJ); rej.REJ.Reason != cm.RejConsumerDefined || rej.REJ.RemoteCommID != 0x77 {
		t.Errorf("REJ %v", &rej)
	}
	if a.state(aid) != cm.StateEstablished || b.state(bid) != cm.StateEstablished || len(a.events) != 1 || len(b.events) != 2 {
		t.Errorf("the connection: %v, %v; events %+v, %+v", a.state(aid), b.state(bid), a.events, b.events)
	}
	_ = a.m.Destroy(aid)
	w.deliver()
	_ = b.m.Destroy(bid)
	_ = b.m.Destroy(lid)
	w.run(time.Minute, nil)
	w.empty()
}

// TestSIDR: a UD resolution through a listener in the UDP port space, and
// its failures: no listener (status UNSUPPORTED), a refusal (REJECT), a
// lost SIDR_REQ (sent again after 4.096 s), silence (Unreachable after
// 16 tries).
func TestSIDR(t *testing.T) {
	for _, tc := range []struct {
		name    string
		listen  bool
		reject  bool
		lose    int // SIDR_REQs lost
		status  cm.SIDRStatus
		event   cm.EventType
		elapsed time.Duration
	}{
		{"resolved", true, false, 0, cm.SIDRSuccess, cm.EventEstablished, 0},
		{"no listener", false, false, 0, cm.SIDRUnsupported, cm.EventUnreachable, cm.DefaultListenGrace},
		{"rejected", true, true, 0, cm.SIDRReject, cm.EventUnreachable, 0},
		{"two lost", true, false, 2, cm.SIDRSuccess, cm.EventEstablished, 2 * 4096 * time.Millisecond},
		{"all lost", true, false, 16, 0, cm.EventUnreachable, 16 * 4096 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newNetwork(t, 9)
			a := w.add(addrA, guidA, cm.Config{})
			b := w.add(addrB, guidB, cm.Config{})
			var lid cm.ID
			if tc.listen {
				var err error
				if lid, err = b.m.Listen(ownB, cm.ListenParams{Port: 7174, PortSpace: cm.PortSpaceUDP}); err != nil {
					t.Fatal(err)
				}
			}
			b.on = func(n *node, e cm.Event) {
				if e.Type != cm.EventConnectRequest {
					return
				}
				if e.Param.QPType != cm.QPTypeUD || !bytes.HasPrefix(e.PrivateData, []byte("udaddy")) || len(e.PrivateData) != 180 {
					t.Errorf("ConnectRequest %+v", e)
				}
				var err error
				if tc.reject {
					err = n.m.Reject(e.ID, nil)
				} else {
					err = n.m.Accept(e.ID, cm.AcceptParams{QPN: 0x20})
				}
				if err != nil {
					t.Error(err)
				}
			}
			lost := 0
			w.drop = func(p *packet) bool {
				if p.attr() == cm.AttrSIDRReq && lost < tc.lose {
					lost++
					return true
				}
				return false
			}
			start := w.clk.now
			id, err := a.m.Resolve(ownA, cm.ResolveParams{Local: netip.AddrPortFrom(addrA, 39759),
				Remote: netip.AddrPortFrom(addrB, 7174), PortSpace: cm.PortSpaceUDP, PrivateData: []byte("udaddy")})
			if err != nil {
				t.Fatal(err)
			}
			if !w.run(10*time.Minute, func() bool { return len(a.events) > 0 }) {
				t.Fatal("no event")
			}
			e := a.events[0]
			if e.Type != tc.event || e.SIDRStatus != tc.status || e.TimedOut != (tc.lose > 15) {
				t.Errorf("event %+v", e)
			}
			if d := w.clk.now.Sub(start); d != tc.elapsed {
				t.Errorf("after %v, want %v", d, tc.elapsed)
			}
			if tc.event == cm.EventEstablished {
				if e.Param.QPN != 0x20 || e.Param.QKey != cm.DefaultUDPQKey {
					t.Errorf("resolved to %+v", e.Param)
				}
				rep, req := w.last(cm.AttrSIDRRep), w.last(cm.AttrSIDRReq)
				if rep.Header.TID != req.Header.TID || rep.SIDRRep.RequestID != req.SIDRReq.RequestID || rep.SIDRRep.ServiceID != req.SIDRReq.ServiceID {
					t.Errorf("SIDR_REP %v for %v", &rep, &req)
				}
				if i := a.info(id); i.RemoteQPN != 0x20 || i.RemoteQKey != cm.DefaultUDPQKey || i.State != cm.StateIdle {
					t.Errorf("info %+v", i)
				}
			}
			if n := w.count(cm.AttrSIDRReq, addrA); n != min(tc.lose, 15)+1 {
				t.Errorf("%d SIDR_REQs", n)
			}
			_ = a.m.Destroy(id)
			for _, ev := range b.eventsOf(cm.EventConnectRequest) {
				_ = b.m.Destroy(ev.ID)
			}
			_ = b.m.Destroy(lid)
			w.empty()
		})
	}
}

// TestTimers: the retransmission pace and limits, as Linux's CM keeps
// them on RoCE: a REQ to a silent peer every 6.144 s, 16 in all, then
// Unreachable; an MRA stretches the wait to its service timeout plus the
// ACK timeout (65.536 + 2.048 s); an unanswered REP every 4.096 s (the
// REQ's response timeout), then Unreachable at the passive side; an
// unanswered DREQ, then Disconnected (timed out) and TimeWait.
func TestTimers(t *testing.T) {
	t.Run("REQ to nobody", func(t *testing.T) {
		w := newNetwork(t, 10)
		a := w.add(addrA, guidA, cm.Config{})
		start := w.clk.now
		id, err := a.m.Connect(ownA, connectParams(addrA, netip.MustParseAddr("10.99.0.99"), 7174, 1))
		if err != nil {
			t.Fatal(err)
		}
		w.run(time.Hour, func() bool { return len(a.events) > 0 })
		if d := w.clk.now.Sub(start); d != 16*6144*time.Millisecond {
			t.Errorf("Unreachable after %v", d)
		}
		if e := a.events[0]; e.Type != cm.EventUnreachable || !e.TimedOut || a.state(id) != cm.StateIdle {
			t.Errorf("event %+v in %v", e, a.state(id))
		}
		req, _ := cm.AttrIndex(cm.AttrREQ)
		if s := a.m.Stats(); s.Sent[req] != 1 || s.Retries[req] != 15 || s.Timeouts[req] != 1 {
			t.Errorf("sent %d, retries %d, timeouts %d", s.Sent[req], s.Retries[req], s.Timeouts[req])
		}
		_ = a.m.Destroy(id)
		w.empty()
	})
	t.Run("MRA", func(t *testing.T) {
		w, a, b, lid := pair(t, 11)
		b.on = nil // the owner never answers
		start := w.clk.now
		id, err := a.m.Connect(ownA, connectParams(addrA, addrB, 7174, 1))
		if err != nil {
			t.Fatal(err)
		}
		// The REQ again after 6.144 s meets the held request: MRA.
		w.run(7*time.Second, func() bool { return a.state(id) == cm.StateMRAReqRcvd })
		if d := w.clk.now.Sub(start); d != 6144*time.Millisecond {
			t.Fatalf("MRA after %v (state %v)", d, a.state(id))
		}
		mraAt := w.clk.now
		w.run(time.Hour, func() bool { return w.count(cm.AttrREQ, addrA) == 3 })
		if d := w.clk.now.Sub(mraAt); d != (65536+2048)*time.Millisecond {
			t.Errorf("REQ again %v after the MRA", d)
		}
		_ = a.m.Destroy(id) // REJ 4 with A's GUID reaches the held request
		w.deliver()
		if es := b.eventsOf(cm.EventRejected); len(es) != 1 || es[0].Reason != cm.RejTimeout ||
			!bytes.Equal(es[0].ARI, binary.BigEndian.AppendUint64(nil, guidA)) {
			t.Errorf("B's events %+v", b.events)
		}
		for _, e := range b.eventsOf(cm.EventConnectRequest) {
			_ = b.m.Destroy(e.ID)
		}
		_ = b.m.Destroy(lid)
		w.empty()
	})
	t.Run("REP unanswered", func(t *testing.T) {
		w, a, b, lid := pair(t, 12)
		a.on = nil // never establishes: the library hung
		w.drop = func(p *packet) bool { return p.attr() == cm.AttrMRA }
		id, err := a.m.Connect(ownA, connectParams(addrA, addrB, 7174, 1))
		if err != nil {
			t.Fatal(err)
		}
		w.deliver()
		start := w.clk.now
		w.run(time.Hour, func() bool { return len(b.eventsOf(cm.EventUnreachable)) > 0 })
		if d := w.clk.now.Sub(start); d != 16*4096*time.Millisecond {
			t.Errorf("Unreachable after %v", d)
		}
		if n := w.count(cm.AttrREP, addrB); n != 16 {
			t.Errorf("%d REPs", n)
		}
		_ = a.m.Destroy(id)
		for _, e := range b.eventsOf(cm.EventConnectRequest) {
			_ = b.m.Destroy(e.ID)
		}
		_ = b.m.Destroy(lid)
		w.run(time.Minute, nil)
		w.empty()
	})
	t.Run("REP MRAed", func(t *testing.T) {
		// The library has not handled the reply when the REP comes
		// again: the MRA Linux's RDMA CM owes it stretches the REP's
		// wait.
		w, a, b, lid := pair(t, 19)
		a.on = nil
		id, err := a.m.Connect(ownA, connectParams(addrA, addrB, 7174, 1))
		if err != nil {
			t.Fatal(err)
		}
		w.deliver()
		bid := b.events[0].ID
		start := w.clk.now
		w.run(time.Hour, func() bool { return b.state(bid) == cm.StateMRARepRcvd })
		if d := w.clk.now.Sub(start); d != 4096*time.Millisecond {
			t.Errorf("MRA after %v", d)
		}
		if mra := w.last(cm.AttrMRA); mra.MRA.MessageMRAed != cm.MessageREP || mra.MRA.ServiceTimeout != cm.MRAServiceTimeout {
			t.Errorf("MRA %v", &mra)
		}
		mraAt := w.clk.now
		w.run(time.Hour, func() bool { return w.count(cm.AttrREP, addrB) == 3 })
		if d := w.clk.now.Sub(mraAt); d != (65536+2048)*time.Millisecond {
			t.Errorf("REP again %v after the MRA", d)
		}
		if err := a.m.Establish(id, nil); err != nil {
			t.Fatal(err)
		}
		w.deliver()
		if b.state(bid) != cm.StateEstablished {
			t.Errorf("B in %v", b.state(bid))
		}
		_ = a.m.Destroy(id)
		w.deliver()
		_ = b.m.Destroy(bid)
		_ = b.m.Destroy(lid)
		w.run(time.Minute, nil)
		w.empty()
	})
	t.Run("DREQ unanswered", func(t *testing.T) {
		w, a, b, lid := pair(t, 13)
		aid, bid := connect(t, w, a, b, 1)
		w.drop = func(p *packet) bool { return p.dst == addrB }
		start := w.clk.now
		if err := a.m.Disconnect(aid, nil); err != nil {
			t.Fatal(err)
		}
		w.run(time.Hour, func() bool { return len(a.eventsOf(cm.EventDisconnected)) > 0 })
		if d := w.clk.now.Sub(start); d != 16*6144*time.Millisecond {
			t.Errorf("Disconnected after %v", d)
		}
		if e := a.eventsOf(cm.EventDisconnected)[0]; !e.TimedOut || a.state(aid) != cm.StateTimeWait {
			t.Errorf("event %+v in %v", e, a.state(aid))
		}
		_ = a.m.Destroy(aid)
		_ = b.m.Destroy(bid)
		_ = b.m.Destroy(lid)
		w.empty()
	})
}

// TestOwnerTeardown: a process dies. Its established connections send a
// DREQ (the peers see Disconnected), its unanswered REQ is withdrawn
// with REJ 4 (the peer's held request is Rejected), its unanswered
// request is rejected (the peer sees Rejected 28), its listener goes;
// the peers destroy what they hold and nothing is left.
func TestOwnerTeardown(t *testing.T) {
	w, a, b, lid := pair(t, 14)
	const ownA2 = cm.Owner(3)
	aid, bid := connect(t, w, a, b, 0x11)
	b.on = nil // B's owner answers nothing more
	pend, err := a.m.Connect(ownA, connectParams(addrA, addrB, 7174, 0x12))
	if err != nil {
		t.Fatal(err)
	}
	w.deliver()
	bPend := b.events[len(b.events)-1].ID
	// A listens too; B's request to it stays unanswered.
	alid, err := a.m.Listen(ownA, cm.ListenParams{Port: 9000, PortSpace: cm.PortSpaceTCP})
	if err != nil {
		t.Fatal(err)
	}
	a.on = nil
	other, err := a.m.Listen(ownA2, cm.ListenParams{Port: 9001, PortSpace: cm.PortSpaceTCP})
	if err != nil {
		t.Fatal(err)
	}
	breq, err := b.m.Connect(ownB, connectParams(addrB, addrA, 9000, 0x13))
	if err != nil {
		t.Fatal(err)
	}
	w.deliver()
	b.events = nil
	if n := a.m.CloseOwner(ownA); n != 4 {
		t.Errorf("CloseOwner destroyed %d IDs", n)
	}
	w.deliver()
	for _, want := range []struct {
		id cm.ID
		ev cm.EventType
		r  cm.RejectReason
	}{{bid, cm.EventDisconnected, 0}, {bPend, cm.EventRejected, cm.RejTimeout}, {breq, cm.EventRejected, cm.RejConsumerDefined}} {
		found := false
		for _, e := range b.events {
			if e.ID == want.id && e.Type == want.ev && e.Reason == want.r {
				found = true
			}
		}
		if !found {
			t.Errorf("B has no %v (%v) for ID %d: %+v", want.ev, want.r, want.id, b.events)
		}
	}
	if _, err := a.m.Info(aid); !errors.Is(err, cm.ErrNoID) {
		t.Errorf("A's ID after teardown: %v", err)
	}
	if _, err := a.m.Info(other); err != nil {
		t.Errorf("another owner's listener went: %v", err)
	}
	_ = a.m.Destroy(other)
	_ = alid
	_ = pend
	b.m.CloseOwner(ownB)
	_ = lid
	w.run(time.Minute, nil)
	w.empty()
}

// TestAPIErrors: calls in the wrong state or with bad parameters fail
// with the package's sentinel errors and change nothing.
func TestAPIErrors(t *testing.T) {
	w, a, b, lid := pair(t, 15)
	aid, bid := connect(t, w, a, b, 1)
	p := connectParams(addrA, addrB, 7174, 2)
	bad := func(f func(*cm.ConnectParams)) cm.ConnectParams { q := p; f(&q); return q }
	for _, tc := range []struct {
		name string
		err  error
		call func() error
	}{
		{"accept an established ID", cm.ErrState, func() error { return b.m.Accept(bid, acceptParams(1)) }},
		{"establish twice", cm.ErrState, func() error { return a.m.Establish(aid, nil) }},
		{"reject an established ID", cm.ErrState, func() error { return a.m.Reject(aid, nil) }},
		{"destroy nothing", cm.ErrNoID, func() error { return a.m.Destroy(999) }},
		{"disconnect nothing", cm.ErrNoID, func() error { return a.m.Disconnect(999, nil) }},
		{"listen twice", cm.ErrAddrInUse, func() error {
			_, err := b.m.Listen(ownB, cm.ListenParams{Addr: addrB, Port: 7174, PortSpace: cm.PortSpaceTCP})
			return err
		}},
		{"listen on port 0", cm.ErrInvalid, func() error {
			_, err := b.m.Listen(ownB, cm.ListenParams{PortSpace: cm.PortSpaceTCP})
			return err
		}},
		{"UD in TCP", cm.ErrInvalid, func() error {
			_, err := b.m.Listen(ownB, cm.ListenParams{Port: 1, PortSpace: cm.PortSpaceTCP, QPType: cm.QPTypeUD})
			return err
		}},
		{"mixed families", cm.ErrInvalid, func() error {
			_, err := a.m.Connect(ownA, bad(func(q *cm.ConnectParams) { q.Remote = netip.MustParseAddrPort("[fd00::3]:7174") }))
			return err
		}},
		{"no MTU", cm.ErrInvalid, func() error {
			_, err := a.m.Connect(ownA, bad(func(q *cm.ConnectParams) { q.PathMTU = 0 }))
			return err
		}},
		{"UD REQ", cm.ErrInvalid, func() error {
			_, err := a.m.Connect(ownA, bad(func(q *cm.ConnectParams) { q.QPType = cm.QPTypeUD }))
			return err
		}},
		{"REQ private data", cm.ErrPrivateData, func() error {
			_, err := a.m.Connect(ownA, bad(func(q *cm.ConnectParams) { q.PrivateData = make([]byte, 57) }))
			return err
		}},
		{"SIDR in TCP", cm.ErrInvalid, func() error {
			_, err := a.m.Resolve(ownA, cm.ResolveParams{Local: p.Local, Remote: p.Remote, PortSpace: cm.PortSpaceTCP})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, tc.err) {
				t.Errorf("got %v, want %v", err, tc.err)
			}
			w.deliver()
			w.check()
		})
	}
	// The bound: MaxConns.
	w2 := newNetwork(t, 16)
	c := w2.add(addrA, guidA, cm.Config{MaxConns: 2})
	for i := range 3 {
		_, err := c.m.Connect(ownA, connectParams(addrA, addrB, 7174, uint32(i)))
		if (i < 2) != (err == nil) || i == 2 && !errors.Is(err, cm.ErrLimit) {
			t.Errorf("connect %d: %v", i, err)
		}
	}
	c.m.CloseOwner(ownA)
	w2.empty()
	_ = a.m.Destroy(aid)
	_ = b.m.Destroy(bid)
	_ = b.m.Destroy(lid)
	w.run(time.Minute, nil)
	w.empty()
}

// TestCommIDs: local communication IDs and transaction IDs as Linux makes
// them — successive IDs differ in their first byte on the wire, a REQ's
// TID holds the ID's bytes read little-endian, the passive side answers
// with the REQ's TID and starts its DREQ with its own — and the same seed
// gives the same IDs.
func TestCommIDs(t *testing.T) {
	w := newNetwork(t, 17)
	a := w.add(addrA, guidA, cm.Config{Seed: 42})
	var ids []uint32
	for i := range 4 {
		id, err := a.m.Connect(ownA, connectParams(addrA, addrB, 7174, uint32(i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, a.info(id).LocalCommID)
	}
	for i := 1; i < len(ids); i++ {
		if ids[i]&0x00FFFFFF != ids[0]&0x00FFFFFF || ids[i]>>24 == ids[i-1]>>24 {
			t.Errorf("IDs %08x", ids)
		}
	}
	for i := range w.sent {
		m := w.sent[i].msg(t)
		if uint32(m.Header.TID) != bits.ReverseBytes32(m.REQ.LocalCommID) {
			t.Errorf("REQ TID 0x%016x for ID 0x%08x", m.Header.TID, m.REQ.LocalCommID)
		}
	}
	w2 := newNetwork(t, 17)
	a2 := w2.add(addrA, guidA, cm.Config{Seed: 42})
	id, err := a2.m.Connect(ownA, connectParams(addrA, addrB, 7174, 0))
	if err != nil {
		t.Fatal(err)
	}
	if got := a2.info(id).LocalCommID; got != ids[0] {
		t.Errorf("seed 42 gave 0x%08x, then 0x%08x", ids[0], got)
	}
}

// TestTimerWake: a REQ sent arms its retry timer and signals TimerWake, so
// that a tick loop sleeping while no timer ran plans again; a manager
// with nothing armed signals nothing.
func TestTimerWake(t *testing.T) {
	_, a, _, _ := pair(t, 1)
	select {
	case <-a.m.TimerWake():
		t.Fatal("TimerWake signalled before any timer was set")
	default:
	}
	if _, err := a.m.Connect(ownA, connectParams(addrA, addrB, 7174, 0x11)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.m.TimerWake():
	default:
		t.Fatal("no TimerWake after a REQ armed its timer")
	}
	if _, ok := a.m.NextDeadline(); !ok {
		t.Fatal("no deadline after the REQ")
	}
}

// TestSetOwner: a listener given to another owner hands its next requests
// to that owner, and a connection given to another owner has its events
// and CloseOwner there (rdma_migrate_id); an ID the manager does not have
// is ErrNoID.
func TestSetOwner(t *testing.T) {
	w, a, b, lid := pair(t, 21)
	const ownB2, ownA2 = cm.Owner(3), cm.Owner(4)
	if err := b.m.SetOwner(lid, ownB2); err != nil {
		t.Fatal(err)
	}
	aid, bid := connect(t, w, a, b, 0x21)
	for _, e := range b.events {
		if e.Type == cm.EventConnectRequest && e.Owner != ownB2 {
			t.Errorf("connect request for owner %d, want %d", e.Owner, ownB2)
		}
	}
	if i, err := b.m.Info(bid); err != nil || i.Owner != ownB2 {
		t.Errorf("B's connection: owner %d (%v), want %d", i.Owner, err, ownB2)
	}
	if err := a.m.SetOwner(aid, ownA2); err != nil {
		t.Fatal(err)
	}
	if err := b.m.Disconnect(bid, nil); err != nil {
		t.Fatal(err)
	}
	w.deliver()
	ds := a.eventsOf(cm.EventDisconnected)
	if len(ds) != 1 || ds[0].ID != aid || ds[0].Owner != ownA2 {
		t.Errorf("A's DISCONNECTED events %+v, want one for ID %d of owner %d", ds, aid, ownA2)
	}
	if n := a.m.CloseOwner(ownA); n != 0 {
		t.Errorf("the old owner still had %d IDs", n)
	}
	if n := a.m.CloseOwner(ownA2); n != 1 {
		t.Errorf("the new owner had %d IDs, want 1", n)
	}
	if err := a.m.SetOwner(aid, ownA); !errors.Is(err, cm.ErrNoID) {
		t.Errorf("SetOwner of a destroyed ID: %v, want ErrNoID", err)
	}
	b.m.CloseOwner(ownB2)
	w.run(time.Minute, nil)
	w.empty()
}

// TestListenGrace: a request for a service nobody listens on waits its
// grace (Config.ListenGrace) for a listener: one that comes in time hears
// it — a REQ is handed up and connects, a SIDR_REQ is answered — the
// peer's repeat of a waiting REQ is a duplicate, and only so many wait;
// the rest, and every request once its grace is over, are rejected as
// nobody listened (REJ 8, SIDR "unsupported").
func TestListenGrace(t *testing.T) {
	t.Run("REQ heard", func(t *testing.T) {
		w := newNetwork(t, 11)
		a := w.add(addrA, guidA, cm.Config{})
		b := w.add(addrB, guidB, cm.Config{})
		a.on, b.on = serve(false), serve(false)
		aid, err := a.m.Connect(ownA, connectParams(addrA, addrB, 7174, 0x1f))
		if err != nil {
			t.Fatal(err)
		}
		w.run(cm.DefaultListenGrace-time.Millisecond, nil)
		if len(a.events) != 0 || len(b.events) != 0 || w.count(cm.AttrREJ, addrB) != 0 {
			t.Fatalf("before the listener: A %+v, B %+v, sent %v", a.events, b.events, w.sentAttrs())
		}
		lid, err := b.m.Listen(ownB, cm.ListenParams{Port: 7174, PortSpace: cm.PortSpaceTCP})
		if err != nil {
			t.Fatal(err)
		}
		w.run(time.Second, func() bool { return a.state(aid) == cm.StateEstablished })
		if a.state(aid) != cm.StateEstablished || len(b.eventsOf(cm.EventConnectRequest)) != 1 || w.count(cm.AttrREJ, addrB) != 0 {
			t.Fatalf("A in %v; B's events %+v; sent %v", a.state(aid), b.events, w.sentAttrs())
		}
		_ = a.m.Destroy(aid)
		w.deliver()
		for _, e := range b.eventsOf(cm.EventConnectRequest) {
			_ = b.m.Destroy(e.ID)
		}
		_ = b.m.Destroy(lid)
		w.run(time.Minute, nil)
		w.empty()
	})
	t.Run("SIDR heard", func(t *testing.T) {
		w := newNetwork(t, 12)
		a := w.add(addrA, guidA, cm.Config{})
		b := w.add(addrB, guidB, cm.Config{})
		b.on = func(n *node, e cm.Event) {
			if e.Type == cm.EventConnectRequest {
				if err := n.m.Accept(e.ID, cm.AcceptParams{QPN: 0x20}); err != nil {
					t.Errorf("accept: %v", err)
				}
			}
		}
		id, err := a.m.Resolve(ownA, cm.ResolveParams{Local: netip.AddrPortFrom(addrA, 39759),
			Remote: netip.AddrPortFrom(addrB, 7174), PortSpace: cm.PortSpaceUDP})
		if err != nil {
			t.Fatal(err)
		}
		w.run(cm.DefaultListenGrace/2, nil)
		if _, err := b.m.Listen(ownB, cm.ListenParams{Port: 7174, PortSpace: cm.PortSpaceUDP}); err != nil {
			t.Fatal(err)
		}
		if !w.run(time.Second, func() bool { return len(a.events) > 0 }) || a.events[0].Type != cm.EventEstablished || a.events[0].Param.QPN != 0x20 {
			t.Fatalf("A's events %+v", a.events)
		}
		_ = a.m.Destroy(id)
	})
	t.Run("repeated, too many", func(t *testing.T) {
		w := newNetwork(t, 13)
		b := w.add(addrB, guidB, cm.Config{})
		peer := netip.MustParseAddr("10.99.0.66")
		req := rawREQ(t, peer, 7174, 0x1000, 0x10, 0xAA)
		b.m.Receive(peer, addrB, req)
		b.m.Receive(peer, addrB, req) // the peer's REQ again
		if s := b.m.Stats(); s.Duplicates[0] != 1 || len(w.sent) != 0 {
			t.Fatalf("duplicates %v, sent %v", s.Duplicates, w.sentAttrs())
		}
		const waiting = 256 // the manager's bound
		for i := 1; i < waiting+10; i++ {
			b.m.Receive(peer, addrB, rawREQ(t, peer, 7174, uint32(0x1000+i), uint32(0x10+i), 0xAA))
		}
		if n := w.count(cm.AttrREJ, addrB); n != 10 {
			t.Errorf("%d REJs at once, want the 10 beyond the %d that wait", n, waiting)
		}
		w.run(cm.DefaultListenGrace, nil)
		if n := w.count(cm.AttrREJ, addrB); n != waiting+10 {
			t.Errorf("%d REJs after the grace, want %d", n, waiting+10)
		}
		rej := w.last(cm.AttrREJ)
		if rej.REJ.Reason != cm.RejInvalidServiceID || rej.REJ.MessageRejected != cm.MessageREQ {
			t.Errorf("REJ %v", &rej)
		}
		if _, ok := b.m.NextDeadline(); ok {
			t.Error("a timer is left")
		}
	})
}

// TestAskAgain: against a CM that rejects at once when nobody listens
// (Linux's), the active side sends its REQ again every 10 ms while its
// grace lasts: a server that listens meanwhile is reached; one that does
// not leaves the owner REJECTED (reason 8) once the grace is over.
func TestAskAgain(t *testing.T) {
	for _, listenAfter := range []time.Duration{35 * time.Millisecond, 0} {
		t.Run(fmt.Sprintf("listen after %v", listenAfter), func(t *testing.T) {
			w := newNetwork(t, 14)
			a := w.add(addrA, guidA, cm.Config{})
			b := w.add(addrB, guidB, cm.Config{ListenGrace: -1}) // as Linux: REJ 8 at once
			a.on, b.on = serve(false), serve(false)
			start := w.clk.now
			aid, err := a.m.Connect(ownA, connectParams(addrA, addrB, 7174, 0x1f))
			if err != nil {
				t.Fatal(err)
			}
			if listenAfter == 0 {
				w.run(time.Minute, func() bool { return len(a.events) > 0 })
				if len(a.events) != 1 || a.events[0].Type != cm.EventRejected || a.events[0].Reason != cm.RejInvalidServiceID {
					t.Fatalf("A's events %+v", a.events)
				}
				if d := w.clk.now.Sub(start); d > cm.DefaultListenGrace || d < cm.DefaultListenGrace-20*time.Millisecond {
					t.Errorf("rejected after %v, want the grace, %v", d, cm.DefaultListenGrace)
				}
				if n := w.count(cm.AttrREQ, addrA); n < 5 {
					t.Errorf("%d REQs", n)
				}
				return
			}
			w.run(listenAfter, nil)
			if len(a.events) != 0 || w.count(cm.AttrREJ, addrB) < 2 {
				t.Fatalf("before the listener: A's events %+v, sent %v", a.events, w.sentAttrs())
			}
			if _, err := b.m.Listen(ownB, cm.ListenParams{Port: 7174, PortSpace: cm.PortSpaceTCP}); err != nil {
				t.Fatal(err)
			}
			w.run(time.Second, func() bool { return a.state(aid) == cm.StateEstablished })
			if a.state(aid) != cm.StateEstablished {
				t.Fatalf("A in %v, events %+v; sent %v", a.state(aid), a.events, w.sentAttrs())
			}
		})
	}
}
