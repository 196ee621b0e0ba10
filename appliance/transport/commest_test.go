package transport

import (
	"slices"
	"testing"

	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// TestCommEstablished: Config.CommEstablished hears of a connected QP once,
// when it executes its first request in sequence (IBA 11.6.3.1) — not for
// the packets of a message whose first packet was lost, which wait aside,
// nor for the ACKs the requester receives — and again after the QP is
// reset and connected anew.
func TestCommEstablished(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	var atA, atB []uint32
	s.a.eng.cfg.CommEstablished = func(q uint32) { atA = append(atA, q) }
	s.b.eng.cfg.CommEstablished = func(q uint32) { atB = append(atB, q) }
	c := s.connect(connOpts{retry: 7})
	drops := 0
	s.a.drop = func([]byte) bool { drops++; return drops == 1 }
	write := func(from *QP, mr *MR, rkey uint32, cq *CQ) {
		t.Helper()
		must(t, firstErr(from.PostSend([]SendWR{{ID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
			SGL: []SGE{{Addr: 0x10000, Length: 3000, LKey: mr.LKey}}, RemoteAddr: 0x20000, RKey: rkey}})))
		var wcs []WC
		s.run(10000, func() bool { wcs = append(wcs, poll(cq)...); return len(wcs) > 0 })
		if wcs[0].Status != abi.WCSuccess {
			t.Fatalf("WRITE: %+v", wcs[0])
		}
	}
	write(c.qa, c.mra, c.mrb.RKey, c.cqa)
	if s.b.eng.Stats().Retransmits+s.a.eng.Stats().Retransmits == 0 {
		t.Fatal("the first packet was not lost")
	}
	write(c.qa, c.mra, c.mrb.RKey, c.cqa)
	if !slices.Equal(atB, []uint32{c.qb.Num()}) || len(atA) != 0 {
		t.Fatalf("after A's WRITEs: A told of %#x, B of %#x; want B of %#x once", atA, atB, c.qb.Num())
	}
	write(c.qb, c.mrb, c.mra.RKey, c.cqb)
	if !slices.Equal(atA, []uint32{c.qa.Num()}) {
		t.Fatalf("after B's WRITE A told of %#x, want %#x", atA, c.qa.Num())
	}

	// Reset and connected again, B's QP is told again of its first request.
	must(t, c.qb.Modify(&QPAttr{State: abi.QPSReset}, abi.QPStateMask))
	must(t, c.qb.Modify(&QPAttr{State: abi.QPSInit, Port: 1, Access: abi.AccessRemoteWrite}, abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPAccessFlags))
	must(t, c.qb.Modify(&QPAttr{State: abi.QPSRTR, AV: AddressVector{DstIP: s.a.ip, DstMAC: s.a.mac, SGIDIndex: 1},
		PathMTU: abi.MTU1024, DestQPN: c.qa.Num(), RQPSN: c.qa.psn, MaxDestRdAtomic: 16, MinRNRTimer: 1},
		abi.QPStateMask|abi.QPAV|abi.QPPathMTU|abi.QPDestQPN|abi.QPRQPSN|abi.QPMaxDestRdAtomic|abi.QPMinRNRTimer))
	write(c.qa, c.mra, c.mrb.RKey, c.cqa)
	if !slices.Equal(atB, []uint32{c.qb.Num(), c.qb.Num()}) {
		t.Fatalf("after B's reset B told of %#x, want %#x twice", atB, c.qb.Num())
	}
}

// firstErr is the error of a post.
func firstErr(_ int, err error) error { return err }
