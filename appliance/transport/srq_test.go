package transport

import (
	"errors"
	"testing"

	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// TestSRQ: two QPs of B take receive WQEs from one SRQ in order; the
// limit event fires once when the SRQ runs low; a QP with an SRQ refuses
// its own receives; the SRQ cannot be destroyed while QPs use it; the
// retire counts reach OnRetire.
func TestSRQ(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	ea, eb := s.a.eng, s.b.eng
	pda, pdb := ea.Memory().NewPD(), eb.Memory().NewPD()
	bufa, bufb := make([]byte, 1<<16), make([]byte, 1<<16)
	mra, err := ea.Memory().Register(pda, base, bufa, abi.AccessLocalWrite)
	must(t, err)
	mrb, err := eb.Memory().Register(pdb, base, bufb, abi.AccessLocalWrite)
	must(t, err)
	limits := 0
	var recvRetired uint64
	srq, err := eb.CreateSRQ(SRQConfig{PD: pdb, MaxWR: 8, OnLimit: func() { limits++ }, OnRetire: func(n uint64) { recvRetired = n }})
	must(t, err)
	cqa, cqb := NewCQ(64, nil), NewCQ(64, nil)
	var sendRetired uint64
	var qa [2]*QP
	var qb [2]*QP
	for i := range 2 {
		qa[i], err = ea.CreateQP(QPConfig{Type: abi.RC, PD: pda, SendCQ: cqa, RecvCQ: cqa, MaxSendWR: 16, MaxRecvWR: 1,
			OnRetire: func(sq, _ uint64) { sendRetired = sq }})
		must(t, err)
		qb[i], err = eb.CreateQP(QPConfig{Type: abi.RC, PD: pdb, SendCQ: cqb, RecvCQ: cqb, MaxSendWR: 16, SRQ: srq})
		must(t, err)
	}
	for i := range 2 {
		up := func(q *QP, peer *simPort, dqpn uint32) {
			must(t, q.Modify(&QPAttr{State: abi.QPSInit, Port: 1}, abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPAccessFlags))
			must(t, q.Modify(&QPAttr{State: abi.QPSRTR, AV: AddressVector{DstIP: peer.ip, DstMAC: peer.mac, SGIDIndex: 1},
				PathMTU: abi.MTU1024, DestQPN: dqpn, MaxDestRdAtomic: 1, MinRNRTimer: 1},
				abi.QPStateMask|abi.QPAV|abi.QPPathMTU|abi.QPDestQPN|abi.QPRQPSN|abi.QPMaxDestRdAtomic|abi.QPMinRNRTimer))
			must(t, q.Modify(&QPAttr{State: abi.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
				abi.QPStateMask|abi.QPSQPSN|abi.QPTimeout|abi.QPRetryCnt|abi.QPRNRRetry|abi.QPMaxQPRdAtomic))
		}
		up(qa[i], s.b, qb[i].Num())
		up(qb[i], s.a, qa[i].Num())
	}
	if _, err := qb[0].PostRecv([]RecvWR{{ID: 1, SGL: sge(mrb, 0, 64)}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("post receive on a QP with an SRQ: %v", err)
	}
	for i := range 4 {
		_, err := srq.PostRecv([]RecvWR{{ID: uint64(100 + i), SGL: sge(mrb, i*1024, 1024)}})
		must(t, err)
	}
	must(t, srq.Arm(3))
	copy(bufa, "first second")
	_, err = qa[1].PostSend([]SendWR{{ID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: sge(mra, 0, 5)}})
	must(t, err)
	_, err = qa[0].PostSend([]SendWR{{ID: 2, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: sge(mra, 6, 6)}})
	must(t, err)
	var got []WC
	s.run(10000, func() bool { got = append(got, poll(cqb)...); return len(got) == 2 })
	if got[0].ID != 100 || got[0].QPNum != qb[1].Num() || got[1].ID != 101 || got[1].QPNum != qb[0].Num() {
		t.Fatalf("receives %+v", got)
	}
	if string(bufb[:5]) != "first" || string(bufb[1024:1030]) != "second" {
		t.Fatalf("data %q %q", bufb[:5], bufb[1024:1030])
	}
	if limits != 1 || srq.Len() != 2 || recvRetired != 2 {
		t.Fatalf("limit events %d, %d left, %d retired", limits, srq.Len(), recvRetired)
	}
	s.run(10000, func() bool { return len(poll(cqa)) > 0 || sendRetired > 0 })
	if sendRetired != 1 {
		t.Fatalf("send retired %d", sendRetired)
	}
	if err := eb.DestroySRQ(srq); !errors.Is(err, ErrBusy) {
		t.Fatalf("destroy an SRQ in use: %v", err)
	}
	// A QP in error leaves the SRQ's WQEs for the others.
	qb[0].Modify(&QPAttr{State: abi.QPSErr}, abi.QPStateMask)
	if srq.Len() != 2 {
		t.Fatalf("error state flushed the SRQ: %d left", srq.Len())
	}
	for _, q := range qb {
		must(t, eb.DestroyQP(q))
	}
	must(t, eb.DestroySRQ(srq))
}
