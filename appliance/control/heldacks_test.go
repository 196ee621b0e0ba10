package control

import (
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/verbs/abi"
)

// queueOut is a transport output that keeps the frames an engine sends.
type queueOut struct{ frames [][]byte }

func (o *queueOut) Headroom() int { return 0 }
func (o *queueOut) Send(frames [][]byte) {
	for _, f := range frames {
		o.frames = append(o.frames, append([]byte(nil), f...))
	}
}

// deliverAll hands every frame of from to e, and reports how many.
func deliverAll(t *testing.T, from *queueOut, e *transport.Engine) int {
	t.Helper()
	n := 0
	for len(from.frames) > 0 {
		f := from.frames[0]
		from.frames = from.frames[1:]
		var p roce.Packet
		if err := roce.Parse(f, &p); err != nil {
			t.Fatal(err)
		}
		e.Receive(f, &p)
		n++
	}
	return n
}

// TestPollOnceBusyFlushesAcks: a session busy with a request of its
// client (its lock held) is not waited for by the polling loop, but the
// acknowledgements its queue pairs hold back for an answer still go out
// once due — the loop's pass is all that sends them.
func TestPollOnceBusyFlushesAcks(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	const delay = 10 * time.Microsecond
	mk := func(last byte, out *queueOut) *transport.Engine {
		mac := roce.MAC{2, 0, 0, 0, 0, last}
		ip := netip.AddrFrom4([4]byte{10, 66, 0, last})
		return transport.NewEngine(transport.Config{MAC: mac, GIDs: []roce.GID{roce.LinkLocalGID(mac), roce.GIDFromAddr(ip)},
			MTU: 1500, Out: out, Now: clock, AckDelay: delay})
	}
	var outA, outB queueOut
	ea, eb := mk(1, &outA), mk(2, &outB)
	qp := func(e *transport.Engine) (*transport.QP, *transport.CQ, *transport.MR) {
		pd := e.Memory().NewPD()
		mr, err := e.Memory().Register(pd, 0x10000, make([]byte, 4096), abi.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		cq := transport.NewCQ(16, nil)
		q, err := e.CreateQP(transport.QPConfig{Type: abi.RC, PD: pd, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4, MaxInline: 64})
		if err != nil {
			t.Fatal(err)
		}
		return q, cq, mr
	}
	qa, cqa, _ := qp(ea)
	qb, cqb, mrb := qp(eb)
	up := func(q *transport.QP, peer byte, dqpn uint32) {
		mac := roce.MAC{2, 0, 0, 0, 0, peer}
		for _, st := range []struct {
			attr transport.QPAttr
			mask abi.AttrMask
		}{
			{transport.QPAttr{State: abi.QPSInit, Port: 1}, abi.QPStateMask | abi.QPPKeyIndex | abi.QPPort | abi.QPAccessFlags},
			{transport.QPAttr{State: abi.QPSRTR, PathMTU: abi.MTU1024, DestQPN: dqpn, RQPSN: 1, MaxDestRdAtomic: 1, MinRNRTimer: 1,
				AV: transport.AddressVector{DstIP: netip.AddrFrom4([4]byte{10, 66, 0, peer}), DstMAC: mac, SGIDIndex: 1}},
				abi.QPStateMask | abi.QPAV | abi.QPPathMTU | abi.QPDestQPN | abi.QPRQPSN | abi.QPMaxDestRdAtomic | abi.QPMinRNRTimer},
			{transport.QPAttr{State: abi.QPSRTS, SQPSN: 1, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
				abi.QPStateMask | abi.QPSQPSN | abi.QPTimeout | abi.QPRetryCnt | abi.QPRNRRetry | abi.QPMaxQPRdAtomic},
		} {
			if err := q.Modify(&st.attr, st.mask); err != nil {
				t.Fatal(err)
			}
		}
	}
	up(qa, 2, qb.Num())
	up(qb, 1, qa.Num())

	// A SEND from A completes a receive at B, whose ACK waits.
	if _, err := qb.PostRecv([]transport.RecvWR{{ID: 1, SGL: []transport.SGE{{Addr: 0x10000, Length: 64, LKey: mrb.LKey}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := qa.PostSend([]transport.SendWR{{ID: 2, Opcode: abi.WRSend, Flags: abi.SendSignaled | abi.SendInline, Inline: []byte("hi")}}); err != nil {
		t.Fatal(err)
	}
	if deliverAll(t, &outA, eb) != 1 {
		t.Fatal("A sent no SEND")
	}
	wcs := make([]transport.WC, 4)
	if cqb.Poll(wcs) != 1 || wcs[0].Status != abi.WCSuccess {
		t.Fatalf("B's receive: %+v", wcs[0])
	}
	if len(outB.frames) != 0 {
		t.Fatalf("B acknowledged at once: %d frames", len(outB.frames))
	}

	// B's session is busy; the loop passes over it.
	ss := &session{srv: New(Config{Socket: filepath.Join(t.TempDir(), "s.sock")}), ctx: t.Context()}
	ss.rings.Store(&[]ringWork{{q: &qpObj{qp: qb}}})
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.pollOnce() {
		t.Error("pollOnce of a busy session reported work")
	}
	if len(outB.frames) != 0 {
		t.Fatalf("the ACK went out before it was due: %d frames", len(outB.frames))
	}
	now = now.Add(delay)
	if ss.pollOnce() {
		t.Error("pollOnce of a busy session reported work")
	}
	if deliverAll(t, &outB, ea) != 1 {
		t.Fatal("the busy session's pass sent no ACK once it was due")
	}
	if cqa.Poll(wcs) != 1 || wcs[0].ID != 2 || wcs[0].Status != abi.WCSuccess {
		t.Fatalf("A's send completion: %+v", wcs[0])
	}
}
