package transport

import (
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// sentFrame is a frame a sim port sent: its opcode, its syndrome for an
// acknowledgement, whether it asks for one, and the Send call (flush) it
// went out in.
type sentFrame struct {
	op     roce.Opcode
	syn    roce.Syndrome
	ackReq bool
	flush  int
}

// record makes p's watch note every frame it sends into *out.
func record(t *testing.T, p *simPort, out *[]sentFrame) {
	p.watch = func(f []byte) {
		var pkt roce.Packet
		if err := roce.Parse(f, &pkt); err != nil {
			t.Fatalf("sent an unparsable frame: %v", err)
		}
		*out = append(*out, sentFrame{pkt.BTH.Opcode, pkt.AETH.Syndrome, pkt.BTH.AckReq, p.sends})
	}
}

// deliver hands every frame queued for p to its engine.
func deliver(p *simPort) {
	for len(p.inbox) > 0 {
		f := p.inbox[0]
		p.inbox = p.inbox[1:]
		var pkt roce.Packet
		if roce.Parse(f, &pkt) == nil && pkt.VerifyICRC(f) == nil {
			p.eng.Receive(f, &pkt)
		}
	}
}

// TestAckDelay: with Config.AckDelay, the acknowledgement of a message
// that completed a receive waits — for the answer its client posts, which
// takes it along in the same flush, or until FlushAcks or Tick finds its
// time up — while the acknowledgement of a plain WRITE, and NAKs, go at
// once.
func TestAckDelay(t *testing.T) {
	const delay = 10 * time.Microsecond
	s := newSim(t, impair.Spec{}, 4096)
	for _, p := range []*simPort{s.a, s.b} {
		p.eng.cfg.AckDelay = delay
	}
	c := s.connect(connOpts{})
	var fromB []sentFrame
	record(t, s.b, &fromB)
	recv := func(qp *QP, mr *MR, id uint64) {
		_, err := qp.PostRecv([]RecvWR{{ID: id, SGL: []SGE{{Addr: 0x10000 + 0x40000, Length: 64, LKey: mr.LKey}}}})
		must(t, err)
	}
	send := func(qp *QP, mr *MR, id uint64) {
		_, err := qp.PostSend([]SendWR{{ID: id, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []SGE{{Addr: 0x10000, Length: 2, LKey: mr.LKey}}}})
		must(t, err)
	}

	// A ping-pong: B's acknowledgement of A's SEND leaves with B's answer.
	recv(c.qb, c.mrb, 1)
	recv(c.qa, c.mra, 2)
	send(c.qa, c.mra, 3)
	deliver(s.b)
	if len(fromB) != 0 {
		t.Fatalf("B sent %+v at once; want its ACK held back", fromB)
	}
	if got := poll(c.rcqb); len(got) != 1 || got[0].ID != 1 {
		t.Fatalf("B's receive completions %+v", got)
	}
	if next, ok := s.b.eng.NextDeadline(); !ok || !next.Equal(s.clock.now.Add(delay)) {
		t.Errorf("B's next deadline %v, %v; want the ACK's, %v", next, ok, s.clock.now.Add(delay))
	}
	if next, ok := s.b.eng.PlanTick(false); ok {
		t.Errorf("B's tick plan without acknowledgements %v: want none, the held ACK left to FlushAcks", next)
	}
	if next, ok := s.b.eng.PlanTick(true); !ok || !next.Equal(s.clock.now.Add(delay)) {
		t.Errorf("B's tick plan with acknowledgements %v, %v; want the ACK's, %v", next, ok, s.clock.now.Add(delay))
	}
	s.b.eng.FlushAcks() // not due yet
	if len(fromB) != 0 {
		t.Fatalf("FlushAcks before the ACK was due sent %+v", fromB)
	}
	send(c.qb, c.mrb, 4)
	if len(fromB) != 2 || fromB[0].op != roce.RCAcknowledge || fromB[0].syn.Kind() != roce.SyndromeACK ||
		fromB[1].op != roce.RCSendOnly || fromB[0].flush != fromB[1].flush {
		t.Fatalf("B sent %+v; want its ACK, then its SEND, in one flush", fromB)
	}
	deliver(s.a)
	if got := poll(c.cqa); len(got) != 1 || got[0].ID != 3 || got[0].Status != abi.WCSuccess {
		t.Fatalf("A's send completions %+v", got)
	}
	if got := poll(c.rcqa); len(got) != 1 || got[0].ID != 2 {
		t.Fatalf("A's receive completions %+v", got)
	}

	// No answer: FlushAcks sends the ACK once its time is up.
	fromB = nil
	recv(c.qb, c.mrb, 5)
	send(c.qa, c.mra, 6)
	deliver(s.b)
	s.clock.now = s.clock.now.Add(delay - time.Nanosecond)
	s.b.eng.FlushAcks()
	if len(fromB) != 0 {
		t.Fatalf("B sent %+v before the delay ended", fromB)
	}
	s.clock.now = s.clock.now.Add(time.Nanosecond)
	s.b.eng.FlushAcks()
	if len(fromB) != 1 || fromB[0].op != roce.RCAcknowledge {
		t.Fatalf("after the delay B sent %+v; want its ACK", fromB)
	}
	if _, ok := s.b.eng.NextDeadline(); ok {
		t.Error("a deadline is left after the ACK went")
	}

	// Or Tick does.
	fromB = nil
	recv(c.qb, c.mrb, 7)
	send(c.qa, c.mra, 8)
	deliver(s.b)
	s.clock.now = s.clock.now.Add(delay)
	s.b.eng.Tick()
	if len(fromB) != 1 || fromB[0].op != roce.RCAcknowledge {
		t.Fatalf("Tick after the delay: B sent %+v; want its ACK", fromB)
	}

	// A plain WRITE completes no receive: its ACK goes at once.
	fromB = nil
	_, err := c.qa.PostSend([]SendWR{{ID: 9, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: []SGE{{Addr: 0x10000, Length: 2, LKey: c.mra.LKey}},
		RemoteAddr: 0x10000 + 0x70000, RKey: c.mrb.RKey}})
	must(t, err)
	deliver(s.b)
	if len(fromB) != 1 || fromB[0].op != roce.RCAcknowledge {
		t.Fatalf("for a WRITE B sent %+v; want its ACK at once", fromB)
	}

	// A SEND with no receive posted gets its RNR NAK at once.
	fromB = nil
	send(c.qa, c.mra, 10)
	deliver(s.b)
	if len(fromB) != 1 || fromB[0].op != roce.RCAcknowledge || fromB[0].syn.Kind() != roce.SyndromeRNRNAK {
		t.Fatalf("for a SEND without a receive B sent %+v; want an RNR NAK at once", fromB)
	}

	if n := testing.AllocsPerRun(100, s.b.eng.FlushAcks); n != 0 {
		t.Errorf("FlushAcks with nothing due: %v allocations", n)
	}
	// Everything still completes.
	recv(c.qb, c.mrb, 11)
	s.run(100000, func() bool {
		for _, wc := range poll(c.cqa) {
			if wc.ID == 10 {
				return true
			}
		}
		return false
	})
}

// TestAckDelayOff: without AckDelay every acknowledgement goes at once.
func TestAckDelayOff(t *testing.T) {
	s := newSim(t, impair.Spec{}, 4096)
	c := s.connect(connOpts{})
	var fromB []sentFrame
	record(t, s.b, &fromB)
	_, err := c.qb.PostRecv([]RecvWR{{ID: 1, SGL: []SGE{{Addr: 0x10000, Length: 64, LKey: c.mrb.LKey}}}})
	must(t, err)
	_, err = c.qa.PostSend([]SendWR{{ID: 2, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []SGE{{Addr: 0x10000, Length: 2, LKey: c.mra.LKey}}}})
	must(t, err)
	deliver(s.b)
	if len(fromB) != 1 || fromB[0].op != roce.RCAcknowledge {
		t.Fatalf("B sent %+v; want its ACK at once", fromB)
	}
}
