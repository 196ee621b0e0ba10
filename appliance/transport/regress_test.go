package transport

import (
	"testing"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// TestLocalErrorAfterLoss: a lost packet ahead of a WQE that fails locally
// is still resent, and the failure is reported in order after it.
func TestLocalErrorAfterLoss(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	c := s.connect(connOpts{retry: 7, rnr: 7})
	s.a.im = impair.New(impair.Spec{Loss: 1, Seed: 1}) // lose what PostSend emits
	bad := []SGE{{Addr: base, Length: 10, LKey: 0xdead00}}
	_, err := c.qa.PostSend([]SendWR{
		{ID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 10), RemoteAddr: base, RKey: c.mrb.RKey},
		{ID: 2, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: bad, RemoteAddr: base, RKey: c.mrb.RKey},
	})
	must(t, err)
	s.a.im = impair.New(impair.Spec{})
	var wcs []WC
	s.run(10000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 2 })
	if wcs[0].Status != abi.WCSuccess || wcs[1].Status != abi.WCLocProtErr {
		t.Fatalf("completions %v, %v", wcs[0].Status, wcs[1].Status)
	}
}

// TestRNRWithInfiniteTimeout: with local ACK timeout 0 (infinite), an RNR
// NAK costs no retry_cnt.
func TestRNRWithInfiniteTimeout(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	c := s.connect(connOpts{retry: 0, rnr: 7})
	c.qa.attr.Timeout = 0
	_, err := c.qa.PostSend([]SendWR{{ID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 10)}})
	must(t, err)
	s.run(1000, func() bool { return s.b.eng.Stats().RNRNAKsSent >= 1 && len(s.a.inbox) == 0 })
	for i := 0; i < 3; i++ {
		s.step()
	}
	_, err = c.qb.PostRecv([]RecvWR{{ID: 9, SGL: sge(c.mrb, 0, 4096)}})
	must(t, err)
	var wcs []WC
	s.run(10000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 1 })
	if wcs[0].Status != abi.WCSuccess {
		t.Fatalf("got %v, timeouts %d", wcs[0].Status, s.a.eng.Stats().Timeouts)
	}
}

// TestRNRRetryResetOnProgress: rnr_retry counts RNR NAKs in a row, and
// progress restores it, as rxe's reset_retry_counters does.
func TestRNRRetryResetOnProgress(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	c := s.connect(connOpts{retry: 7, rnr: 1})
	for id := uint64(1); id <= 3; id++ {
		_, err := c.qa.PostSend([]SendWR{{ID: id, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 10)}})
		must(t, err)
		n := s.b.eng.Stats().RNRNAKsSent
		s.run(1000, func() bool { return s.b.eng.Stats().RNRNAKsSent == n+1 && len(s.a.inbox) == 0 })
		_, err = c.qb.PostRecv([]RecvWR{{ID: id, SGL: sge(c.mrb, 0, 4096)}})
		must(t, err)
		var wcs []WC
		s.run(10000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 1 })
		if wcs[0].Status != abi.WCSuccess {
			t.Fatalf("message %d (one RNR NAK each, rnr_retry=1): %v", id, wcs[0].Status)
		}
	}
}

// TestUC: a UC QP sends UC opcodes without AckReq and completes its sends
// once their last packet is out.
func TestUC(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	mk := func(p *simPort) (*QP, *CQ, *CQ, *MR) {
		pd := p.eng.Memory().NewPD()
		mr, err := p.eng.Memory().Register(pd, base, make([]byte, 1<<16), abi.AccessLocalWrite|abi.AccessRemoteWrite)
		must(t, err)
		scq, rcq := NewCQ(64, nil), NewCQ(64, nil)
		qp, err := p.eng.CreateQP(QPConfig{Type: abi.UC, PD: pd, SendCQ: scq, RecvCQ: rcq, MaxSendWR: 16, MaxRecvWR: 16})
		must(t, err)
		return qp, scq, rcq, mr
	}
	qa, scqa, _, mra := mk(s.a)
	qb, _, rcqb, mrb := mk(s.b)
	up := func(q *QP, peer *simPort, d uint32) {
		must(t, q.Modify(&QPAttr{State: abi.QPSInit, Port: 1, Access: abi.AccessRemoteWrite}, abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPAccessFlags))
		must(t, q.Modify(&QPAttr{State: abi.QPSRTR, AV: AddressVector{DstIP: peer.ip, DstMAC: peer.mac, SGIDIndex: 1}, PathMTU: abi.MTU1024, DestQPN: d},
			abi.QPStateMask|abi.QPAV|abi.QPPathMTU|abi.QPDestQPN|abi.QPRQPSN))
		must(t, q.Modify(&QPAttr{State: abi.QPSRTS}, abi.QPStateMask|abi.QPSQPSN))
	}
	up(qa, s.b, qb.Num())
	up(qb, s.a, qa.Num())
	_, err := qb.PostRecv([]RecvWR{{ID: 7, SGL: []SGE{{Addr: base, Length: 100, LKey: mrb.LKey}}}})
	must(t, err)
	_, err = qa.PostSend([]SendWR{{ID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []SGE{{Addr: base, Length: 10, LKey: mra.LKey}}}})
	must(t, err)
	var p roce.Packet
	must(t, roce.Parse(s.b.inbox[0], &p))
	t.Logf("UC QP sent %v ackreq=%v", p.BTH.Opcode, p.BTH.AckReq)
	for s.step() {
	}
	t.Logf("send completions %v, recv completions %v, B dropped %d", poll(scqa), poll(rcqb), s.b.eng.Stats().Dropped)
	if p.BTH.Opcode.Transport() != roce.TransportUC {
		t.Fatal("UC requester emits RC opcodes")
	}
}

// TestUCResponderLoss: on UC a lost FIRST drops the message silently (rxe
// drop_msg); the QP stays usable.
func TestUCResponderLoss(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	pd := s.b.eng.Memory().NewPD()
	mr, _ := s.b.eng.Memory().Register(pd, base, make([]byte, 1<<16), abi.AccessLocalWrite|abi.AccessRemoteWrite)
	cq := NewCQ(64, nil)
	qb, _ := s.b.eng.CreateQP(QPConfig{Type: abi.UC, PD: pd, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16})
	must(t, qb.Modify(&QPAttr{State: abi.QPSInit, Port: 1, Access: abi.AccessRemoteWrite}, abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPAccessFlags))
	must(t, qb.Modify(&QPAttr{State: abi.QPSRTR, AV: AddressVector{DstIP: s.a.ip, DstMAC: s.a.mac, SGIDIndex: 1}, PathMTU: abi.MTU1024, DestQPN: 0x99, RQPSN: 100},
		abi.QPStateMask|abi.QPAV|abi.QPPathMTU|abi.QPDestQPN|abi.QPRQPSN))
	_, _ = qb.PostRecv([]RecvWR{{ID: 1, SGL: []SGE{{Addr: base, Length: 4096, LKey: mr.LKey}}}})
	// Build a UC_SEND_MIDDLE at PSN 101 (FIRST at 100 was lost).
	p := qb.template(s.a.ip, s.a.mac, qb.Num(), 0, 0)
	p.Src, p.Dst = s.a.ip, s.b.ip
	p.BTH.Opcode, p.BTH.PSN = roce.UCSendMiddle, 101
	p.SetPayloadLen(1024)
	buf := make([]byte, 2000)
	n, err := p.Build(buf, make([]byte, 1024))
	must(t, err)
	var q roce.Packet
	must(t, roce.Parse(buf[:n], &q))
	s.b.eng.Receive(buf[:n], &q)
	if qb.State() == abi.QPSErr {
		t.Fatal("UC QP went to ERR on a lost packet")
	}
}

// TestManyOutstandingReads: with more READs outstanding than the default
// cache holds, a retried first READ is still answered.
func TestManyOutstandingReads(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	c := s.connect(connOpts{retry: 3, rnr: 7, rd: 32})
	var wrs []SendWR
	for i := 0; i < 20; i++ {
		wrs = append(wrs, SendWR{ID: uint64(i), Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, SGL: sge(c.mra, i*64, 64), RemoteAddr: base + uint64(i*64), RKey: c.mrb.RKey})
	}
	_, err := c.qa.PostSend(wrs)
	must(t, err)
	s.b.im = impair.New(impair.Spec{Loss: 1, Seed: 1})
	s.step() // B executes READ 0; its response is lost
	s.b.im = impair.New(impair.Spec{})
	var wcs []WC
	s.run(100000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 20 || c.qa.State() == abi.QPSErr })
	if wcs[0].Status != abi.WCSuccess {
		t.Fatalf("READ 0: %v", wcs[0].Status)
	}
}

// TestMisalignedAtomic: a misaligned atomic is an invalid request, as rxe
// has it (REM_INV_REQ_ERR).
func TestMisalignedAtomic(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	c := s.connect(connOpts{retry: 7, rnr: 7})
	_, err := c.qa.PostSend([]SendWR{{ID: 1, Opcode: abi.WRAtomicCmpAndSwp, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 8), RemoteAddr: base + 4, RKey: c.mrb.RKey}})
	must(t, err)
	var wcs []WC
	s.run(1000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 1 })
	if wcs[0].Status != abi.WCRemInvReqErr {
		t.Fatalf("misaligned atomic: %v", wcs[0].Status)
	}
}

// TestStaleNAK: a NAK for a PSN already acknowledged is ignored: no
// rewind, no retry counted.
func TestStaleNAK(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	c := s.connect(connOpts{retry: 7, rnr: 7})
	w := func(id uint64) SendWR {
		return SendWR{ID: id, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 10), RemoteAddr: base, RKey: c.mrb.RKey}
	}
	_, err := c.qa.PostSend([]SendWR{w(1)})
	must(t, err)
	s.run(1000, func() bool { return len(poll(c.cqa)) == 1 })
	_, err = c.qa.PostSend([]SendWR{w(2), w(3), w(4)})
	must(t, err)
	before := s.a.eng.Stats().Retransmits
	e := s.b.eng
	e.mu.Lock()
	c.qb.sendAck(0, roce.SyndromeNAK|roce.NAKPSNSequenceError) // PSN 0 was acked long ago
	e.flush()
	e.mu.Unlock()
	s.b.inbox = s.b.inbox[:0] // keep only the NAK in flight: deliver to A
	s.step()
	if got := s.a.eng.Stats().Retransmits - before; got != 0 || c.qa.retryLeft != 7 {
		t.Fatalf("stale NAK caused %d rewinds, retryLeft %d, A sent %d frames", got, c.qa.retryLeft, len(s.b.inbox))
	}
}
