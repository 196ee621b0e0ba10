package transport

import (
	"testing"
	"time"

	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// woken reports whether e's TickWake was signalled, and clears it.
func woken(e *Engine) bool {
	select {
	case <-e.TickWake():
		return true
	default:
		return false
	}
}

// TestPlanTick: an engine with nothing timed plans no tick; a queue pair
// that sets a timer before the plan signals TickWake, one that sets a
// later timer does not, and the plan follows the earliest timer: the
// retry timer of a SEND in flight, an RNR NAK's shorter wait, and none
// again once everything is acknowledged.
func TestPlanTick(t *testing.T) {
	s := newSim(t, impair.Spec{}, 4096)
	c := s.connect(connOpts{timeout: 14, retry: 7, rnr: 7}) // 67 ms
	later := s.connect(connOpts{timeout: 14, retry: 7, rnr: 7})
	e := s.a.eng
	woken(e)
	if next, ok := e.PlanTick(true); ok {
		t.Fatalf("PlanTick with nothing in flight: %v", next)
	}
	// A SEND to a receiver without receive WQEs: its retry timer is set
	// while the plan is to wait for one.
	send := func(qp *QP, id uint64) {
		_, err := qp.PostSend([]SendWR{{ID: id, Opcode: abi.WRSend, Flags: abi.SendSignaled | abi.SendInline, Inline: []byte("hi")}})
		must(t, err)
	}
	send(c.qa, 1)
	if !woken(e) {
		t.Fatal("setting the retry timer of a SEND did not signal TickWake")
	}
	next, ok := e.PlanTick(true)
	if want := s.clock.now.Add(timeoutDuration(14)); !ok || !next.Equal(want) {
		t.Fatalf("PlanTick with a SEND in flight: %v %v, want %v", next, ok, want)
	}
	// A later timer — another queue pair's retry timer, a millisecond
	// on — does not signal.
	s.clock.now = s.clock.now.Add(time.Millisecond)
	send(later.qa, 2)
	if later.qa.retryAt.IsZero() {
		t.Fatal("the second queue pair's SEND set no retry timer")
	}
	if woken(e) {
		t.Error("a timer later than the plan signalled TickWake")
	}
	// The receiver answers with RNR NAKs (no receive WQE): the RNR wait
	// (MinRNRTimer 1: 0.01 ms) is earlier than the plan.
	deliver(s.b)
	deliver(s.a)
	if !woken(e) {
		t.Fatal("an RNR NAK's wait, earlier than the plan, did not signal TickWake")
	}
	next, ok = e.PlanTick(true)
	if !ok || !next.Before(s.clock.now.Add(time.Millisecond)) {
		t.Fatalf("PlanTick after an RNR NAK: %v %v, want within a millisecond of %v", next, ok, s.clock.now)
	}
	// Receive WQEs, then time runs: the SENDs go through and are
	// acknowledged, and nothing is timed any more.
	for _, x := range []*conn{c, later} {
		_, err := x.qb.PostRecv([]RecvWR{{ID: 1, SGL: []SGE{{Addr: 0x10000, Length: 64, LKey: x.mrb.LKey}}}})
		must(t, err)
	}
	for s.step() {
	}
	for _, cq := range []*CQ{c.cqa, later.cqa} {
		if got := poll(cq); len(got) != 1 || got[0].Status != abi.WCSuccess {
			t.Fatalf("send completions %+v", got)
		}
	}
	if next, ok := e.PlanTick(true); ok {
		t.Errorf("PlanTick with everything acknowledged: %v", next)
	}
}
