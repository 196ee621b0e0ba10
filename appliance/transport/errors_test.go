package transport

import (
	"bytes"
	"errors"
	"testing"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

const base = 0x10000

func sge(mr *MR, off, n int) []SGE {
	return []SGE{{Addr: base + uint64(off), Length: uint32(n), LKey: mr.LKey}}
}

// TestRetryExceeded: with every frame from A lost, the WQE fails with
// RETRY_EXC_ERR after retry_cnt retries, later ones are flushed, and the
// QP is in the error state.
func TestRetryExceeded(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	c := s.connect(connOpts{retry: 2, rnr: 7})
	s.a.im = impair.New(impair.Spec{Loss: 1, Seed: 1})
	_, err := c.qa.PostSend([]SendWR{
		{ID: 1, Opcode: abi.WRRDMAWrite, SGL: sge(c.mra, 0, 100), RemoteAddr: base, RKey: c.mrb.RKey}, // unsignaled
		{ID: 2, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 100), RemoteAddr: base, RKey: c.mrb.RKey},
	})
	must(t, err)
	var wcs []WC
	s.run(100000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 2 })
	if wcs[0].ID != 1 || wcs[0].Status != abi.WCRetryExcErr || wcs[1].ID != 2 || wcs[1].Status != abi.WCWRFlushErr {
		t.Fatalf("completions %+v", wcs)
	}
	if c.qa.State() != abi.QPSErr {
		t.Fatalf("state %v", c.qa.State())
	}
	if st := s.a.eng.Stats(); st.Timeouts != 3 {
		t.Fatalf("%d timeouts, want 3 (first try + 2 retries)", st.Timeouts)
	}
	// Work posted in the error state completes at once with a flush error.
	_, err = c.qa.PostSend([]SendWR{{ID: 3, Opcode: abi.WRSend, SGL: sge(c.mra, 0, 1)}})
	must(t, err)
	if wc := poll(c.cqa); len(wc) != 1 || wc[0].Status != abi.WCWRFlushErr {
		t.Fatalf("post in ERR: %+v", wc)
	}
}

// TestRNR: a SEND with no receive posted meets RNR NAKs until a receive
// arrives, then succeeds; with rnr_retry exhausted it fails.
func TestRNR(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	c := s.connect(connOpts{retry: 7, rnr: 7})
	_, err := c.qa.PostSend([]SendWR{{ID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 3000)}})
	must(t, err)
	s.run(1000, func() bool { return s.b.eng.Stats().RNRNAKsSent >= 3 })
	if len(poll(c.cqa)) != 0 {
		t.Fatal("completed without a receive")
	}
	_, err = c.qb.PostRecv([]RecvWR{{ID: 9, SGL: sge(c.mrb, 0, 4096)}})
	must(t, err)
	var wcs []WC
	s.run(10000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 1 })
	if wcs[0].Status != abi.WCSuccess {
		t.Fatalf("after RNR: %+v", wcs[0])
	}
	if r := poll(c.rcqb); len(r) != 1 || r[0].ByteLen != 3000 {
		t.Fatalf("receive %+v", r)
	}

	s2 := newSim(t, impair.Spec{}, 1500)
	c2 := s2.connect(connOpts{retry: 7, rnr: 2})
	_, err = c2.qa.PostSend([]SendWR{{ID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: sge(c2.mra, 0, 10)}})
	must(t, err)
	wcs = nil
	s2.run(10000, func() bool { wcs = append(wcs, poll(c2.cqa)...); return len(wcs) == 1 })
	if wcs[0].Status != abi.WCRNRRetryExcErr || s2.b.eng.Stats().RNRNAKsSent != 3 {
		t.Fatalf("RNR exhausted: %+v, %d RNR NAKs", wcs[0], s2.b.eng.Stats().RNRNAKsSent)
	}
}

// TestRemoteAccessViolations: each violation NAKs with remote access
// error, completes with REM_ACCESS_ERR, and leaves the target unchanged.
func TestRemoteAccessViolations(t *testing.T) {
	cases := []struct {
		name   string
		access abi.Access // of B's QP
		wr     func(c *conn) SendWR
	}{
		{"bad rkey", 0, func(c *conn) SendWR {
			return SendWR{Opcode: abi.WRRDMAWrite, SGL: sge(c.mra, 0, 64), RemoteAddr: base, RKey: c.mrb.RKey ^ 0x100}
		}},
		{"beyond the region", 0, func(c *conn) SendWR {
			return SendWR{Opcode: abi.WRRDMAWrite, SGL: sge(c.mra, 0, 64), RemoteAddr: base + uint64(len(c.bufb)) - 32, RKey: c.mrb.RKey}
		}},
		{"below the region", 0, func(c *conn) SendWR {
			return SendWR{Opcode: abi.WRRDMARead, SGL: sge(c.mra, 0, 64), RemoteAddr: base - 8, RKey: c.mrb.RKey}
		}},
		{"no remote write on the QP", abi.AccessLocalWrite | abi.AccessRemoteRead, func(c *conn) SendWR {
			return SendWR{Opcode: abi.WRRDMAWrite, SGL: sge(c.mra, 0, 64), RemoteAddr: base, RKey: c.mrb.RKey}
		}},
		{"no remote read on the QP", abi.AccessLocalWrite | abi.AccessRemoteWrite, func(c *conn) SendWR {
			return SendWR{Opcode: abi.WRRDMARead, SGL: sge(c.mra, 0, 64), RemoteAddr: base, RKey: c.mrb.RKey}
		}},
		{"no atomics on the QP", abi.AccessLocalWrite | abi.AccessRemoteWrite, func(c *conn) SendWR {
			return SendWR{Opcode: abi.WRAtomicFetchAdd, SGL: sge(c.mra, 0, 8), RemoteAddr: base, RKey: c.mrb.RKey, CompareAdd: 1}
		}},
		{"region of another PD", 0, func(c *conn) SendWR {
			return SendWR{Opcode: abi.WRRDMAWrite, SGL: sge(c.mra, 0, 64), RemoteAddr: base, RKey: c.otherRKey}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, impair.Spec{}, 1500)
			c := s.connect(connOpts{retry: 7, rnr: 7, access: tc.access})
			for i := range c.bufa {
				c.bufa[i] = 0xAA
			}
			other := make([]byte, 4096)
			mr, err := s.b.eng.Memory().Register(s.b.eng.Memory().NewPD(), base, other, abi.AccessLocalWrite|abi.AccessRemoteWrite|abi.AccessRemoteRead)
			must(t, err)
			c.otherRKey = mr.RKey
			before := append([]byte(nil), c.bufb...)
			wr := tc.wr(c)
			wr.ID, wr.Flags = 7, abi.SendSignaled
			_, err = c.qa.PostSend([]SendWR{wr})
			must(t, err)
			var wcs []WC
			s.run(10000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 1 })
			if wcs[0].Status != abi.WCRemAccessErr {
				t.Fatalf("completion %+v (%v)", wcs[0], wcs[0].Status)
			}
			if !bytes.Equal(before, c.bufb) || bytes.Count(other, []byte{0}) != len(other) {
				t.Fatal("target memory changed")
			}
			if c.qa.State() != abi.QPSErr || c.qb.State() != abi.QPSErr {
				t.Fatalf("states %v / %v", c.qa.State(), c.qb.State())
			}
		})
	}
}

// TestReceiveTooSmall: a SEND longer than the receive buffer completes the
// receive with LOC_LEN_ERR and the send with REM_INV_REQ_ERR.
func TestReceiveTooSmall(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	c := s.connect(connOpts{retry: 7, rnr: 7})
	_, err := c.qb.PostRecv([]RecvWR{{ID: 5, SGL: sge(c.mrb, 0, 100)}, {ID: 6, SGL: sge(c.mrb, 100, 100)}})
	must(t, err)
	_, err = c.qa.PostSend([]SendWR{{ID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 2000)}})
	must(t, err)
	var wcs []WC
	s.run(10000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 1 })
	if wcs[0].Status != abi.WCRemInvReqErr {
		t.Fatalf("send: %+v", wcs[0])
	}
	r := poll(c.rcqb)
	if len(r) != 2 || r[0].ID != 5 || r[0].Status != abi.WCLocLenErr || r[1].Status != abi.WCWRFlushErr {
		t.Fatalf("receives %+v", r)
	}
}

// TestLocalProtection: an SGE with a bad lkey fails locally, in order,
// after the work before it completes.
func TestLocalProtection(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	c := s.connect(connOpts{retry: 7, rnr: 7})
	bad := []SGE{{Addr: base, Length: 10, LKey: 0xdead00}}
	_, err := c.qa.PostSend([]SendWR{
		{ID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 10), RemoteAddr: base, RKey: c.mrb.RKey},
		{ID: 2, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: bad, RemoteAddr: base, RKey: c.mrb.RKey},
		{ID: 3, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 10), RemoteAddr: base, RKey: c.mrb.RKey},
	})
	must(t, err)
	var wcs []WC
	s.run(10000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 3 })
	if wcs[0].Status != abi.WCSuccess || wcs[1].Status != abi.WCLocProtErr || wcs[2].Status != abi.WCWRFlushErr {
		t.Fatalf("completions %v %v %v", wcs[0].Status, wcs[1].Status, wcs[2].Status)
	}
}

// TestUD: UD sends land behind the 40-byte GRH area with the sender's QPN;
// a wrong Q_Key is dropped.
func TestUD(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	mk := func(p *simPort) (*QP, *CQ, *CQ, *MR, []byte) {
		pd := p.eng.Memory().NewPD()
		buf := make([]byte, 8192)
		mr, err := p.eng.Memory().Register(pd, base, buf, abi.AccessLocalWrite)
		must(t, err)
		scq, rcq := NewCQ(64, nil), NewCQ(64, nil)
		qp, err := p.eng.CreateQP(QPConfig{Type: abi.UD, PD: pd, SendCQ: scq, RecvCQ: rcq, MaxSendWR: 16, MaxRecvWR: 16})
		must(t, err)
		must(t, qp.Modify(&QPAttr{State: abi.QPSInit, Port: 1, QKey: 0x11111111}, abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPQKey))
		must(t, qp.Modify(&QPAttr{State: abi.QPSRTR}, abi.QPStateMask))
		must(t, qp.Modify(&QPAttr{State: abi.QPSRTS, SQPSN: 7}, abi.QPStateMask|abi.QPSQPSN))
		return qp, scq, rcq, mr, buf
	}
	qa, scqa, _, mra, bufa := mk(s.a)
	qb, _, rcqb, mrb, bufb := mk(s.b)
	copy(bufa, "hello over UD")
	_, err := qb.PostRecv([]RecvWR{{ID: 1, SGL: []SGE{{Addr: base, Length: 1000, LKey: mrb.LKey}}}})
	must(t, err)
	ah := &AH{DstIP: s.b.ip.As16(), DstMAC: s.b.mac, SGIDIndex: 1}
	_, err = qa.PostSend([]SendWR{
		{ID: 1, Opcode: abi.WRSendWithImm, Imm: 42, Flags: abi.SendSignaled, SGL: []SGE{{Addr: base, Length: 13, LKey: mra.LKey}}, AH: ah, RemoteQPN: qb.Num(), RemoteQKey: 0x11111111},
		{ID: 2, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []SGE{{Addr: base, Length: 13, LKey: mra.LKey}}, AH: ah, RemoteQPN: qb.Num(), RemoteQKey: 0x22222222},
	})
	must(t, err)
	var r []WC
	s.run(1000, func() bool { r = append(r, poll(rcqb)...); return len(r) == 1 && len(s.a.inbox)+len(s.b.inbox) == 0 })
	if r[0].ByteLen != 40+13 || r[0].SrcQP != qa.Num() || r[0].Flags&abi.WCGRH == 0 || r[0].Imm != 42 {
		t.Fatalf("UD receive %+v", r[0])
	}
	if string(bufb[40:53]) != "hello over UD" {
		t.Fatalf("payload %q", bufb[40:53])
	}
	ip := roce.IPv4(bufb[20:40])
	if ip.Version() != 4 || ip.Src() != s.a.ip || ip.Dst() != s.b.ip {
		t.Fatalf("GRH area %x", bufb[:40])
	}
	if s := poll(scqa); len(s) != 2 || s[0].Status != abi.WCSuccess || s[1].Status != abi.WCSuccess {
		t.Fatalf("send completions %+v", s)
	}
	if len(poll(rcqb)) != 0 {
		t.Fatal("the wrong Q_Key was delivered")
	}
}

// TestModifyRules: missing and forbidden attributes are EINVAL-like
// errors, as libibverbs reports them.
func TestModifyRules(t *testing.T) {
	e := NewEngine(Config{MAC: roce.MAC{2, 0, 0, 0, 0, 1}, GIDs: []roce.GID{{}}, Out: &simPort{}})
	pd := e.Memory().NewPD()
	cq := NewCQ(4, nil)
	qp, err := e.CreateQP(QPConfig{Type: abi.RC, PD: pd, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
	must(t, err)
	tests := []struct {
		attr QPAttr
		mask abi.AttrMask
		ok   bool
	}{
		{QPAttr{State: abi.QPSRTR}, abi.QPStateMask, false},                                                                  // RESET→RTR
		{QPAttr{State: abi.QPSInit}, abi.QPStateMask | abi.QPPKeyIndex | abi.QPPort, false},                                  // missing access
		{QPAttr{State: abi.QPSInit}, abi.QPStateMask | abi.QPPKeyIndex | abi.QPPort | abi.QPAccessFlags | abi.QPQKey, false}, // QKey not for RC
		{QPAttr{State: abi.QPSInit, Port: 1}, abi.QPStateMask | abi.QPPKeyIndex | abi.QPPort | abi.QPAccessFlags, true},
		{QPAttr{State: abi.QPSRTR}, abi.QPStateMask | abi.QPAV | abi.QPPathMTU, false}, // missing DEST_QPN etc.
		{QPAttr{State: abi.QPSErr}, abi.QPStateMask | abi.QPTimeout, false},            // ERR takes the state alone
		{QPAttr{State: abi.QPSReset}, abi.QPStateMask, true},
	}
	for i, tt := range tests {
		err := qp.Modify(&tt.attr, tt.mask)
		if (err == nil) != tt.ok || err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("case %d (%v, %#x): %v", i, tt.attr.State, tt.mask, err)
		}
	}
	if _, err := qp.PostSend([]SendWR{{Opcode: abi.WRSend}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("post send in RESET: %v", err)
	}
}

// TestSendWithInvalidate: SEND with invalidate delivers the rkey in the
// completion and the region stops answering remote access with it.
func TestSendWithInvalidate(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	c := s.connect(connOpts{retry: 7, rnr: 7})
	_, err := c.qb.PostRecv([]RecvWR{{ID: 1, SGL: sge(c.mrb, 0, 64)}})
	must(t, err)
	_, err = c.qa.PostSend([]SendWR{{ID: 1, Opcode: abi.WRSendWithInv, Imm: c.mrb.RKey, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 10)}})
	must(t, err)
	var r []WC
	s.run(10000, func() bool { r = append(r, poll(c.rcqb)...); return len(r) == 1 })
	if r[0].Flags&abi.WCWithInv == 0 || r[0].Imm != c.mrb.RKey || r[0].ByteLen != 10 {
		t.Fatalf("receive %+v", r[0])
	}
	var sent []WC
	s.run(10000, func() bool { sent = append(sent, poll(c.cqa)...); return len(sent) == 1 })
	if sent[0].ID != 1 || sent[0].Status != abi.WCSuccess {
		t.Fatalf("SEND with invalidate: %+v", sent[0])
	}
	_, err = c.qa.PostSend([]SendWR{{ID: 2, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 10), RemoteAddr: base, RKey: c.mrb.RKey}})
	must(t, err)
	var wcs []WC
	s.run(10000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 1 })
	if wcs[0].ID != 2 || wcs[0].Status != abi.WCRemAccessErr {
		t.Fatalf("WRITE with an invalidated rkey: %+v (%v)", wcs[0], wcs[0].Status)
	}
}

// TestSendWithBadInvalidate: a SEND with invalidate naming an rkey the
// responder cannot invalidate (none, or another PD's) fails the receive
// with REM_INV_REQ_ERR, NAKs with invalid request so the SEND completes
// with REM_INV_REQ_ERR, and both QPs end in the error state; the other
// PD's region stays valid.
func TestSendWithBadInvalidate(t *testing.T) {
	for _, c := range []struct {
		name string
		rkey func(s *sim, c *conn) uint32
	}{
		{"no such rkey", func(*sim, *conn) uint32 { return 0xdead00 }},
		{"other PD", func(s *sim, c *conn) uint32 {
			mr, err := s.b.eng.Memory().Register(s.b.eng.Memory().NewPD(), 0x900000, make([]byte, 64), abi.AccessRemoteWrite|abi.AccessLocalWrite)
			must(s.t, err)
			return mr.RKey
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSim(t, impair.Spec{}, 1500)
			cn := s.connect(connOpts{retry: 7, rnr: 7})
			rkey := c.rkey(s, cn)
			_, err := cn.qb.PostRecv([]RecvWR{{ID: 1, SGL: sge(cn.mrb, 0, 64)}, {ID: 2, SGL: sge(cn.mrb, 64, 64)}})
			must(t, err)
			_, err = cn.qa.PostSend([]SendWR{{ID: 7, Opcode: abi.WRSendWithInv, Imm: rkey, Flags: abi.SendSignaled, SGL: sge(cn.mra, 0, 10)}})
			must(t, err)
			var recv, sent []WC
			s.run(100000, func() bool {
				recv, sent = append(recv, poll(cn.rcqb)...), append(sent, poll(cn.cqa)...)
				return len(recv) == 2 && len(sent) == 1
			})
			if len(recv) != 2 || recv[0].ID != 1 || recv[0].Status != abi.WCRemInvReqErr || recv[1].Status != abi.WCWRFlushErr {
				t.Fatalf("receives %+v", recv)
			}
			if len(sent) != 1 || sent[0].ID != 7 || sent[0].Status != abi.WCRemInvReqErr {
				t.Fatalf("SEND with invalidate: %+v", sent)
			}
			if cn.qa.State() != abi.QPSErr || cn.qb.State() != abi.QPSErr {
				t.Fatalf("states %v %v", cn.qa.State(), cn.qb.State())
			}
			if mr := s.b.eng.Memory().lookup(rkey); mr != nil && mr.invalid {
				t.Fatal("another PD's region was invalidated")
			}
		})
	}
}

// TestPostSendChecks: what ibv_post_send refuses with EINVAL.
func TestPostSendChecks(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	c := s.connect(connOpts{retry: 7, rnr: 7})
	for _, wr := range []SendWR{
		{Opcode: abi.WRSend, SGL: make([]SGE, maxSGE+1)},
		{Opcode: abi.WRSend, Flags: abi.SendInline, Inline: make([]byte, 65)},
		{Opcode: abi.WRRDMARead, Flags: abi.SendInline, SGL: sge(c.mra, 0, 8)},
		{Opcode: abi.WRAtomicFetchAdd, SGL: sge(c.mra, 0, 4)},
		{Opcode: abi.WRRDMAWrite, SGL: []SGE{{Addr: base, Length: 1 << 31, LKey: c.mra.LKey}, {Addr: base, Length: 1, LKey: c.mra.LKey}}},
		{Opcode: abi.WROpcode(42)},
	} {
		if _, err := c.qa.PostSend([]SendWR{wr}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%v: %v", wr.Opcode, err)
		}
	}
}
