package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// TestCloseLinger is the end of a latency run (perftest's write_lat,
// send_lat, ibv_rc_pingpong): B's QP executes A's last request, the
// network loses B's answer, and B's owner destroys the QP at once
// (Close). A, with retry_cnt 7, which never runs out, retransmits; the
// lingering QP answers the duplicate as the live one would, so A's work
// completes successfully. A request B never executed, or a READ whose
// region B has deregistered since, goes unanswered for the quiet spell,
// as at rxe once the QP is gone — A, with a retry_cnt that runs out
// within it, fails with a retry error (a write_lat -D run, whose server
// may stop and destroy its QP first, depends on this: against a NAK its
// client failed before its own end; see perf's TestLatDurationPeerGone)
// — and is NAKed after it, so that A, whose retries never run out, fails
// with a remote operational error instead of retrying forever. Close
// completes nothing on B's CQs and stops B's own timers; after the
// linger, measured with the engine's clock, the QP is gone and its QPN
// free.
func TestCloseLinger(t *testing.T) {
	const linger = 30 * time.Second
	for _, tc := range []struct {
		name  string
		op    abi.WROpcode
		after bool // A posts after the close: B never executed the request
		dereg bool // B deregisters its region after the close
		want  abi.WCStatus
	}{
		{"WRITE", abi.WRRDMAWrite, false, false, abi.WCSuccess},
		{"SEND", abi.WRSend, false, false, abi.WCSuccess},
		{"READ", abi.WRRDMARead, false, false, abi.WCSuccess},
		{"FETCH_ADD", abi.WRAtomicFetchAdd, false, false, abi.WCSuccess},
		{"READ of a deregistered region", abi.WRRDMARead, false, true, abi.WCRetryExcErr},
		{"WRITE after the close", abi.WRRDMAWrite, true, false, abi.WCRetryExcErr},
		{"SEND after the close", abi.WRSend, true, false, abi.WCRetryExcErr},
		{"READ of a deregistered region, retried past the quiet", abi.WRRDMARead, false, true, abi.WCRemOpErr},
		{"WRITE after the close, retried past the quiet", abi.WRRDMAWrite, true, false, abi.WCRemOpErr},
		{"SEND after the close, retried past the quiet", abi.WRSend, true, false, abi.WCRemOpErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, impair.Spec{}, 1500)
			retry := uint8(7)
			if tc.want == abi.WCRetryExcErr {
				retry = 2 // runs out within the quiet spell
			}
			c := s.connect(connOpts{retry: retry, rnr: 7})
			const n = 3000 // three packets at path MTU 1024
			for i := range n {
				c.bufa[i] = byte(i*7 + 1)
				c.bufb[8192+i] = byte(i*5 + 3)
			}
			binary.LittleEndian.PutUint64(c.bufb[4096:], 40)
			_, err := c.qb.PostRecv([]RecvWR{{ID: 1, SGL: sge(c.mrb, 0, n)}, {ID: 2, SGL: sge(c.mrb, 0, n)}})
			must(t, err)
			// B's own SEND waits for a receive A never posts (RNR).
			_, err = c.qb.PostSend([]SendWR{{ID: 9, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: sge(c.mrb, 0, 64)}})
			must(t, err)
			s.run(10000, func() bool { return !c.qb.rnrAt.IsZero() })
			wr := SendWR{ID: 5, Opcode: tc.op, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, n), RemoteAddr: base, RKey: c.mrb.RKey}
			switch tc.op {
			case abi.WRRDMARead:
				wr.SGL, wr.RemoteAddr = sge(c.mra, 16384, n), base+8192
			case abi.WRAtomicFetchAdd:
				wr.SGL, wr.RemoteAddr, wr.CompareAdd = sge(c.mra, 16384, 8), base+4096, 2
			}
			qpn := c.qb.Num()
			var answers []roce.Packet // what B sends once closed
			closeB := func() {
				s.b.watch = func(f []byte) { answers = append(answers, parsed(t, f)) }
				must(t, s.b.eng.Close(c.qb, linger))
				if tc.dereg {
					must(t, s.b.eng.Memory().Deregister(c.mrb))
				}
			}
			if tc.after {
				closeB()
			} else {
				// B executes the request; every answer it sends is lost.
				ePSN := c.qb.ePSN
				s.b.drop = func([]byte) bool { return true }
				_, err = c.qa.PostSend([]SendWR{wr})
				must(t, err)
				s.run(10000, func() bool { return c.qb.ePSN != ePSN && len(s.b.inbox) == 0 })
				// What B completed before the close stays completed.
				got := poll(c.rcqb)
				if tc.op == abi.WRSend && (len(got) != 1 || got[0].ID != 1 || got[0].Status != abi.WCSuccess) {
					t.Fatalf("B's receive completions before the close: %+v", got)
				}
				closeB()
				s.b.drop = nil
			}
			closedAt := s.clock.now
			if tc.after {
				_, err = c.qa.PostSend([]SendWR{wr})
				must(t, err)
			}
			var wcs []WC
			s.run(100000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 1 })
			if wcs[0].ID != 5 || wcs[0].Status != tc.want {
				t.Fatalf("A's completion: %+v (%v), want %v", wcs[0], wcs[0].Status, tc.want)
			}
			naks := 0
			for _, a := range answers {
				if a.Info().Has(roce.HasAETH) && a.AETH.Syndrome.Kind() != roce.SyndromeACK {
					naks++
				}
			}
			if tc.want == abi.WCSuccess {
				if len(answers) == 0 || naks != 0 {
					t.Errorf("closed B answered with %d packets, %d of them NAKs; want the duplicate's answer", len(answers), naks)
				}
				switch tc.op {
				case abi.WRRDMAWrite:
					if !bytes.Equal(c.bufb[:n], c.bufa[:n]) {
						t.Error("the WRITE's data is not in B's memory")
					}
				case abi.WRRDMARead:
					if !bytes.Equal(c.bufa[16384:16384+n], c.bufb[8192:8192+n]) {
						t.Error("the READ's data is not in A's memory")
					}
				case abi.WRAtomicFetchAdd:
					if got, mem := binary.LittleEndian.Uint64(c.bufa[16384:]), binary.LittleEndian.Uint64(c.bufb[4096:]); got != 40 || mem != 42 {
						t.Errorf("FETCH_ADD returned %d and left %d, want 40 and 42 (executed once)", got, mem)
					}
				}
			} else {
				quietTo := closedAt.Add(DefaultLingerQuiet)
				switch {
				case tc.want == abi.WCRetryExcErr && (len(answers) != 0 || !s.clock.now.Before(quietTo)):
					t.Errorf("A failed at %v, with %d answers (%d NAKs); want no answer before the quiet spell's end at %v",
						s.clock.now, len(answers), naks, quietTo)
				case tc.want == abi.WCRemOpErr && (len(answers) != 1 || naks != 1 || s.clock.now.Before(quietTo)):
					t.Errorf("A failed at %v, with %d answers (%d NAKs); want one NAK after the quiet spell's end at %v",
						s.clock.now, len(answers), naks, quietTo)
				}
				if st := c.qa.State(); st != abi.QPSErr {
					t.Errorf("A's QP in %v after its failure, want ERR", st)
				}
				if s.b.eng.Stats().Dropped == 0 {
					t.Error("closed B counted no dropped request")
				}
			}
			if got := append(poll(c.cqb), poll(c.rcqb)...); len(got) != 0 {
				t.Fatalf("B's CQs got %+v after Close", got)
			}
			if _, err := c.qb.PostSend([]SendWR{{ID: 10, Opcode: abi.WRSend, SGL: sge(c.mrb, 0, 8)}}); !errors.Is(err, ErrState) {
				t.Errorf("PostSend on a closed QP: %v", err)
			}
			if _, err := c.qb.PostRecv([]RecvWR{{ID: 10, SGL: sge(c.mrb, 0, 8)}}); !errors.Is(err, ErrState) {
				t.Errorf("PostRecv on a closed QP: %v", err)
			}
			if err := c.qb.Modify(&QPAttr{State: abi.QPSReset}, abi.QPStateMask); !errors.Is(err, ErrState) {
				t.Errorf("Modify of a closed QP: %v", err)
			}
			if tc.want == abi.WCSuccess {
				if s.b.eng.qps[qpn] != c.qb || !s.clock.now.Before(closedAt.Add(linger)) {
					t.Fatalf("A was answered at %v, after the linger ending at %v", s.clock.now, closedAt.Add(linger))
				}
				// B's only timer is the linger's end: its own SEND's
				// retransmission and RNR timers stopped at the close.
				if d, ok := s.b.eng.NextDeadline(); !ok || !d.Equal(closedAt.Add(linger)) {
					t.Errorf("B's next timer at %v (%v), want the linger's end %v", d, ok, closedAt.Add(linger))
				}
			}
			s.run(1_000_000, func() bool { return s.b.eng.qps[qpn] == nil })
			if s.clock.now.Before(closedAt.Add(linger)) {
				t.Fatalf("QP removed at %v, before the linger ended at %v", s.clock.now, closedAt.Add(linger))
			}
			if err := s.b.eng.Close(c.qb, linger); !errors.Is(err, ErrInvalid) {
				t.Errorf("Close after the linger: %v", err)
			}
		})
	}
}

// TestCloseAtOnce: Close removes at once what has nothing to linger for:
// a UD QP, an RC QP that never had a peer, any QP with a linger of zero.
// A lingering QP no longer holds its SRQ, which can be destroyed at once.
func TestCloseAtOnce(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	e := s.b.eng
	pd := e.Memory().NewPD()
	cq := NewCQ(16, nil)
	mk := func(typ abi.QPType, srq *SRQ) *QP {
		qp, err := e.CreateQP(QPConfig{Type: typ, PD: pd, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4, SRQ: srq})
		must(t, err)
		return qp
	}
	ud := mk(abi.UD, nil)
	must(t, ud.Modify(&QPAttr{State: abi.QPSInit, Port: 1, QKey: 7}, abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPQKey))
	rcInit := mk(abi.RC, nil)
	must(t, rcInit.Modify(&QPAttr{State: abi.QPSInit, Port: 1}, abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPAccessFlags))
	for _, tc := range []struct {
		name   string
		qp     *QP
		linger time.Duration
	}{
		{"UD", ud, time.Minute},
		{"RC in INIT", rcInit, time.Minute},
		{"RTS with no linger", s.connect(connOpts{}).qb, 0},
	} {
		before := e.QPCount()
		must(t, e.Close(tc.qp, tc.linger))
		if got := e.QPCount(); got != before-1 {
			t.Errorf("%s: %d QPs after Close, want %d", tc.name, got, before-1)
		}
	}
	srq, err := e.CreateSRQ(SRQConfig{PD: pd, MaxWR: 4})
	must(t, err)
	qp := mk(abi.RC, srq)
	must(t, qp.Modify(&QPAttr{State: abi.QPSInit, Port: 1}, abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPAccessFlags))
	must(t, qp.Modify(&QPAttr{State: abi.QPSRTR, AV: AddressVector{DstIP: s.a.ip, DstMAC: s.a.mac, SGIDIndex: 1},
		PathMTU: abi.MTU1024, DestQPN: 5, MaxDestRdAtomic: 1, MinRNRTimer: 1},
		abi.QPStateMask|abi.QPAV|abi.QPPathMTU|abi.QPDestQPN|abi.QPRQPSN|abi.QPMaxDestRdAtomic|abi.QPMinRNRTimer))
	must(t, e.Close(qp, time.Minute))
	if e.qps[qp.Num()] != qp {
		t.Fatal("a connected RC QP did not linger")
	}
	if err := e.DestroySRQ(srq); err != nil {
		t.Fatalf("DestroySRQ after its QP's Close: %v", err)
	}
}

// TestLingerReadBounds: a closed or killed QP reads again, for a
// duplicate READ, only what the READ it executed named: the same request,
// or the rest of it from a later PSN; a duplicate PSN naming another
// region of the same PD, or bytes beyond the original, is not read — it
// goes unanswered during the quiet spell and is NAKed after it.
func TestLingerReadBounds(t *testing.T) {
	for _, tc := range []struct {
		name        string
		kill, quiet bool
	}{
		{"closed", false, false},
		{"closed, in the quiet spell", false, true},
		{"killed", true, false},
		{"killed, in the quiet spell", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) { lingerReadBounds(t, tc.kill, tc.quiet) })
	}
}

func lingerReadBounds(t *testing.T, kill, quiet bool) {
	s := newSim(t, impair.Spec{}, 1500)
	c := s.connect(connOpts{psnA: 500})
	other, err := s.b.eng.Memory().Register(c.pdb, 0x900000, make([]byte, 8192), abi.AccessRemoteRead)
	must(t, err)
	_, err = c.qa.PostSend([]SendWR{{ID: 1, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 4096), RemoteAddr: base + 4096, RKey: c.mrb.RKey}})
	must(t, err)
	s.run(10000, func() bool { return len(poll(c.cqa)) == 1 })
	// The READ took PSNs 500…503.
	if kill {
		must(t, s.b.eng.Kill(c.qb, time.Minute))
	} else {
		must(t, s.b.eng.Close(c.qb, time.Minute))
	}
	if !quiet {
		s.clock.now = s.clock.now.Add(DefaultLingerQuiet)
	}
	var sent []roce.Packet
	s.b.watch = func(f []byte) { sent = append(sent, parsed(t, f)) }
	for _, tc := range []struct {
		name  string
		psn   roce.PSN
		rkey  uint32
		va    uint64
		n     uint32
		reads bool
	}{
		{"the same READ", 500, c.mrb.RKey, base + 4096, 4096, true},
		{"its rest", 502, c.mrb.RKey, base + 6144, 2048, true},
		{"beyond its end", 502, c.mrb.RKey, base + 6144, 4096, false},
		{"before its start", 500, c.mrb.RKey, base, 4096, false},
		{"another region", 500, other.RKey, 0x900000, 4096, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent = sent[:0]
			p := c.qa.template(s.b.ip, s.b.mac, c.qb.Num(), 0, 0)
			p.BTH.Opcode, p.BTH.PSN = roce.RCRDMAReadRequest, tc.psn
			p.RETH = roce.RETHFields{VA: tc.va, RKey: tc.rkey, DMALen: tc.n}
			p.SetPayloadLen(0)
			buf := make([]byte, 2048)
			m, err := p.Build(buf, nil)
			must(t, err)
			var q roce.Packet
			must(t, roce.Parse(buf[:m], &q))
			s.b.eng.Receive(buf[:m], &q)
			if !tc.reads && quiet {
				if len(sent) != 0 {
					t.Fatalf("answered with %v (syndrome %#x), want no answer", sent[0].BTH.Opcode, uint8(sent[0].AETH.Syndrome))
				}
				return
			}
			if len(sent) == 0 {
				t.Fatal("no answer")
			}
			a := sent[0]
			if got := a.BTH.Opcode != roce.RCAcknowledge; got != tc.reads {
				t.Fatalf("answered with %v (syndrome %#x), want read responses %v", a.BTH.Opcode, uint8(a.AETH.Syndrome), tc.reads)
			}
			if !tc.reads && a.AETH.Syndrome != roce.SyndromeNAK|roce.NAKRemoteOperationError {
				t.Fatalf("answered with syndrome %#x, want a remote operational error NAK", uint8(a.AETH.Syndrome))
			}
		})
	}
}

// TestLingerBound: an engine keeps at most maxLingering closed QPs; past
// that, the one whose linger ends first goes at once.
func TestLingerBound(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	e := s.b.eng
	pd := e.Memory().NewPD()
	cq := NewCQ(4, nil)
	var first *QP
	for i := range maxLingering + 1 {
		qp, err := e.CreateQP(QPConfig{Type: abi.RC, PD: pd, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1})
		must(t, err)
		must(t, qp.Modify(&QPAttr{State: abi.QPSInit, Port: 1}, abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPAccessFlags))
		must(t, qp.Modify(&QPAttr{State: abi.QPSRTR, AV: AddressVector{DstIP: s.a.ip, DstMAC: s.a.mac, SGIDIndex: 1},
			PathMTU: abi.MTU1024, DestQPN: 5, MaxDestRdAtomic: 1, MinRNRTimer: 1},
			abi.QPStateMask|abi.QPAV|abi.QPPathMTU|abi.QPDestQPN|abi.QPRQPSN|abi.QPMaxDestRdAtomic|abi.QPMinRNRTimer))
		must(t, e.Close(qp, time.Minute))
		if i == 0 {
			first = qp
		}
		s.clock.now = s.clock.now.Add(time.Millisecond)
	}
	if n := e.QPCount(); n != maxLingering {
		t.Fatalf("%d QPs lingering, want %d", n, maxLingering)
	}
	if e.qps[first.Num()] == first {
		t.Fatal("the QP closed first is still there")
	}
}
