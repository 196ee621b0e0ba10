package transport

import (
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/verbs/abi"
)

// ring is a lossless in-memory link that copies frames into preallocated
// slots, so that it allocates nothing itself: for allocation counts and
// benchmarks.
type ring struct {
	slots [][]byte
	lens  []int
	head  int
	n     int
}

type ringPort struct {
	eng   *Engine
	mac   roce.MAC
	ip    netip.Addr
	in    ring
	peer  *ringPort
	pkt   roce.Packet
	watch func(frame []byte) // when set, sees every frame the port sends
}

func (p *ringPort) Headroom() int { return 10 }

func (p *ringPort) Send(frames [][]byte) {
	r := &p.peer.in
	for _, f := range frames {
		f = f[10:]
		if p.watch != nil {
			p.watch(f)
		}
		if r.n == len(r.slots) {
			panic("ring full")
		}
		i := (r.head + r.n) % len(r.slots)
		r.lens[i] = copy(r.slots[i], f)
		r.n++
	}
}

// pump delivers everything queued on both sides; it reports whether it
// delivered anything.
func pump(ps ...*ringPort) bool { return pumpAtMost(math.MaxInt, ps...) > 0 }

// pumpAtMost is pump that stops after limit frames; it returns how many
// it delivered.
func pumpAtMost(limit int, ps ...*ringPort) int {
	n := 0
	for again := true; again && n < limit; {
		again = false
		for _, p := range ps {
			for p.in.n > 0 && n < limit {
				i := p.in.head
				f := p.in.slots[i][:p.in.lens[i]]
				p.in.head = (p.in.head + 1) % len(p.in.slots)
				p.in.n--
				if roce.Parse(f, &p.pkt) == nil {
					p.eng.Receive(f, &p.pkt)
				}
				again = true
				n++
			}
		}
	}
	return n
}

type ringPair struct {
	a, b       *ringPort
	qa, qb     *QP
	cqa, cqb   *CQ
	rcqa, rcqb *CQ
	mra, mrb   *MR
	bufa, bufb []byte
	backingB   []byte // bufb with a guard zone on each side (its size, at most 1 MiB)
}

func newRingPair(tb testing.TB, size int) *ringPair { return newRingPairSized(tb, size, 1024, 4096) }

// newRingPairSized is newRingPair with slots frames in flight each way
// and queue pairs of depth work requests (completion queues of 16×depth).
func newRingPairSized(tb testing.TB, size, slots, depth int) *ringPair {
	now := func() time.Time { return time.Unix(1000, 0) }
	mk := func(last byte) *ringPort {
		p := &ringPort{mac: roce.MAC{2, 0, 0, 0, 0, last}, ip: netip.AddrFrom4([4]byte{10, 55, 0, last})}
		p.in.slots = make([][]byte, slots)
		p.in.lens = make([]int, slots)
		for i := range p.in.slots {
			p.in.slots[i] = make([]byte, 9100)
		}
		p.eng = NewEngine(Config{MAC: p.mac, GIDs: []roce.GID{roce.LinkLocalGID(p.mac), roce.GIDFromAddr(p.ip)}, MTU: 9000, Out: p, Now: now, Seed: uint64(last)})
		return p
	}
	rp := &ringPair{a: mk(1), b: mk(2)}
	rp.a.peer, rp.b.peer = rp.b, rp.a
	qp := func(p *ringPort, buf *[]byte, mr **MR, cq, rcq **CQ) *QP {
		pd := p.eng.Memory().NewPD()
		guard := min(size, 1<<20)
		rp.backingB = make([]byte, size+2*guard)
		*buf = rp.backingB[guard : guard+size : guard+size]
		var err error
		*mr, err = p.eng.Memory().Register(pd, base, *buf, abi.AccessLocalWrite|abi.AccessRemoteWrite|abi.AccessRemoteRead|abi.AccessRemoteAtomic)
		must(tb, err)
		*cq, *rcq = NewCQ(16*depth, nil), NewCQ(16*depth, nil)
		q, err := p.eng.CreateQP(QPConfig{Type: abi.RC, PD: pd, SendCQ: *cq, RecvCQ: *rcq, MaxSendWR: depth, MaxRecvWR: depth, MaxInline: 64})
		must(tb, err)
		return q
	}
	rp.qa = qp(rp.a, &rp.bufa, &rp.mra, &rp.cqa, &rp.rcqa)
	rp.qb = qp(rp.b, &rp.bufb, &rp.mrb, &rp.cqb, &rp.rcqb)
	rp.connect(tb)
	return rp
}

// connect takes both queue pairs from RESET to RTS, towards each other.
func (rp *ringPair) connect(tb testing.TB) {
	all := abi.AccessLocalWrite | abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic
	for _, x := range []struct {
		q    *QP
		peer *ringPort
		dqp  uint32
	}{{rp.qa, rp.b, rp.qb.Num()}, {rp.qb, rp.a, rp.qa.Num()}} {
		must(tb, x.q.Modify(&QPAttr{State: abi.QPSInit, Port: 1, Access: all}, abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPAccessFlags))
		must(tb, x.q.Modify(&QPAttr{State: abi.QPSRTR, AV: AddressVector{DstIP: x.peer.ip, DstMAC: x.peer.mac, SGIDIndex: 1},
			PathMTU: abi.MTU4096, DestQPN: x.dqp, MaxDestRdAtomic: 16, MinRNRTimer: 1},
			abi.QPStateMask|abi.QPAV|abi.QPPathMTU|abi.QPDestQPN|abi.QPRQPSN|abi.QPMaxDestRdAtomic|abi.QPMinRNRTimer))
		must(tb, x.q.Modify(&QPAttr{State: abi.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
			abi.QPStateMask|abi.QPSQPSN|abi.QPTimeout|abi.QPRetryCnt|abi.QPRNRRetry|abi.QPMaxQPRdAtomic))
	}
}

// TestZeroAllocsPerPacket: posting, sending, receiving, acknowledging and
// completing allocate nothing once the engines are set up.
func TestZeroAllocsPerPacket(t *testing.T) {
	rp := newRingPair(t, 1<<20)
	wcs := make([]WC, 16)
	write := []SendWR{{ID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sge(rp.mra, 0, 64<<10), RemoteAddr: base, RKey: rp.mrb.RKey}}
	read := []SendWR{{ID: 2, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, SGL: sge(rp.mra, 0, 16<<10), RemoteAddr: base, RKey: rp.mrb.RKey}}
	send := []SendWR{{ID: 3, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: sge(rp.mra, 0, 2)}}
	recv := []RecvWR{{ID: 4, SGL: sge(rp.mrb, 0, 64)}}
	atomic := []SendWR{{ID: 5, Opcode: abi.WRAtomicFetchAdd, Flags: abi.SendSignaled, SGL: sge(rp.mra, 0, 8), RemoteAddr: base, RKey: rp.mrb.RKey, CompareAdd: 1}}
	for _, c := range []struct {
		name string
		fn   func()
	}{
		{"write 64 KiB", func() { _, _ = rp.qa.PostSend(write); pump(rp.a, rp.b); rp.cqa.Poll(wcs) }},
		{"read 16 KiB", func() { _, _ = rp.qa.PostSend(read); pump(rp.a, rp.b); rp.cqa.Poll(wcs) }},
		{"send 2 B", func() {
			_, _ = rp.qb.PostRecv(recv)
			_, _ = rp.qa.PostSend(send)
			pump(rp.a, rp.b)
			rp.cqa.Poll(wcs)
			rp.rcqb.Poll(wcs)
		}},
		{"fetch-add", func() { _, _ = rp.qa.PostSend(atomic); pump(rp.a, rp.b); rp.cqa.Poll(wcs) }},
	} {
		if a := testing.AllocsPerRun(50, c.fn); a != 0 {
			t.Errorf("%s: %v allocations", c.name, a)
		}
	}
	if n := rp.a.eng.Stats().Sent; n < 50*17 {
		t.Fatalf("only %d packets sent", n)
	}
}

// BenchmarkWrite64K: RDMA WRITE of 64 KiB messages between two engines
// over the in-memory link, 4096-byte path MTU.
func BenchmarkWrite64K(b *testing.B) {
	rp := newRingPair(b, 1<<20)
	const size = 64 << 10
	wrs := make([]SendWR, 8)
	for i := range wrs {
		wrs[i] = SendWR{ID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sge(rp.mra, i*size, size), RemoteAddr: base + uint64(i*size), RKey: rp.mrb.RKey}
	}
	wcs := make([]WC, 16)
	b.SetBytes(size)
	b.ReportAllocs()
	b.ResetTimer()
	done := 0
	for i := 0; i < b.N; i += len(wrs) {
		k := min(len(wrs), b.N-i)
		if _, err := rp.qa.PostSend(wrs[:k]); err != nil {
			b.Fatal(err)
		}
		pump(rp.a, rp.b)
		for got := 0; got < k; {
			n := rp.cqa.Poll(wcs)
			if n == 0 {
				b.Fatalf("completions missing: %d of %d", got, k)
			}
			got += n
		}
		done += k
	}
}

// BenchmarkSendPingPong: a 2-byte SEND from A to B answered by a 2-byte
// SEND back, completions polled on both sides; ns/op is one round trip.
func BenchmarkSendPingPong(b *testing.B) {
	rp := newRingPair(b, 1<<16)
	ping := []SendWR{{ID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled | abi.SendInline, Inline: []byte{1, 2}}}
	pong := []SendWR{{ID: 2, Opcode: abi.WRSend, Flags: abi.SendSignaled | abi.SendInline, Inline: []byte{3, 4}}}
	recvA := []RecvWR{{ID: 3, SGL: sge(rp.mra, 0, 64)}}
	recvB := []RecvWR{{ID: 4, SGL: sge(rp.mrb, 0, 64)}}
	rcqA := rp.qa.cfg.RecvCQ
	wcs := make([]WC, 4)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		_, _ = rp.qb.PostRecv(recvB)
		_, _ = rp.qa.PostRecv(recvA)
		_, _ = rp.qa.PostSend(ping)
		pump(rp.a, rp.b)
		for rp.rcqb.Poll(wcs) == 0 {
			b.Fatal("ping not received")
		}
		_, _ = rp.qb.PostSend(pong)
		pump(rp.a, rp.b)
		if rcqA.Poll(wcs) == 0 {
			b.Fatal("pong not received")
		}
		rp.cqa.Poll(wcs)
		rp.cqb.Poll(wcs)
	}
}
