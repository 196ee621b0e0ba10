package transport

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/verbs/abi"
)

// maxFuzzFrames bounds the frames FuzzReceive's engines may exchange
// after its packet: the work posted takes a few dozen.
const maxFuzzFrames = 10000

// fuzzMem is the size of each side's registered memory in FuzzReceive.
const fuzzMem = 1 << 14

// FuzzReceive feeds arbitrary packets to an established RC QP (B) whose
// peer (A) has work outstanding: nothing panics, nothing outside B's
// registered memory changes, and B either carries on or is in the error
// state. A packet for QP1 goes to B's GSI handler instead, which must see
// only MADs of MADSize bytes.
//
// The pair of engines is built once and reset between inputs
// (fuzzPair.reset), which TestFuzzPairReset holds to being as good as a
// new pair: building one per input took most of the fuzzer's time.
func FuzzReceive(f *testing.F) {
	for _, frame := range fuzzSeeds(f) {
		f.Add(frame)
	}
	f.Add(fuzzMADSeed(f))
	fp := newFuzzPair(f)
	f.Fuzz(func(t *testing.T, frame []byte) {
		fp.reset(t)
		fp.receive(t, frame)
	})
}

// fuzzSeeds returns the request frames of a SEND, a WRITE, a WRITE with
// immediate, a READ and both atomics of A to B, PSN 0 to 5. Their
// payloads are small: the fuzzer minimizes each input that finds
// something new, and the time that takes grows with the square of its
// length — for a frame of a few kilobytes, the whole minute Go allows it
// (-fuzzminimizetime), in which the fuzzer reports no progress.
func fuzzSeeds(tb testing.TB) [][]byte {
	rp := newRingPairSized(tb, fuzzMem, 16, 16)
	_, err := rp.qa.PostSend([]SendWR{
		{ID: 1, Opcode: abi.WRSend, SGL: sge(rp.mra, 0, 24)},
		{ID: 2, Opcode: abi.WRRDMAWrite, SGL: sge(rp.mra, 0, 40), RemoteAddr: base + 64, RKey: rp.mrb.RKey},
		{ID: 3, Opcode: abi.WRRDMAWriteWithImm, Imm: 0x1234, SGL: sge(rp.mra, 0, 16), RemoteAddr: base + 128, RKey: rp.mrb.RKey},
		{ID: 4, Opcode: abi.WRRDMARead, SGL: sge(rp.mra, 0, 3000), RemoteAddr: base, RKey: rp.mrb.RKey},
		{ID: 5, Opcode: abi.WRAtomicFetchAdd, SGL: sge(rp.mra, 0, 8), RemoteAddr: base + 8, RKey: rp.mrb.RKey, CompareAdd: 1},
		{ID: 6, Opcode: abi.WRAtomicCmpAndSwp, SGL: sge(rp.mra, 0, 8), RemoteAddr: base + 16, RKey: rp.mrb.RKey, Swap: 7},
	})
	must(tb, err)
	var frames [][]byte
	for rp.b.in.n > 0 {
		i := rp.b.in.head
		frames = append(frames, append([]byte(nil), rp.b.in.slots[i][:rp.b.in.lens[i]]...))
		rp.b.in.head = (i + 1) % len(rp.b.in.slots)
		rp.b.in.n--
	}
	return frames
}

// fuzzMADSeed returns a MAD of A for QP1 of B.
func fuzzMADSeed(tb testing.TB) []byte {
	rp := newRingPairSized(tb, fuzzMem, 16, 16)
	must(tb, rp.a.eng.SendMAD(netip.Addr{}, rp.b.ip, rp.b.mac, make([]byte, MADSize)))
	return append([]byte(nil), rp.b.in.slots[rp.b.in.head][:rp.b.in.lens[rp.b.in.head]]...)
}

// fuzzPair is FuzzReceive's pair: a ring pair of small engines, built
// once, whose state reset puts back as newFuzzPair left it.
type fuzzPair struct{ *ringPair }

func newFuzzPair(tb testing.TB) *fuzzPair {
	fp := &fuzzPair{newRingPairSized(tb, fuzzMem, 16, 16)}
	fp.b.eng.SetGSI(func(_, _ netip.Addr, _ uint32, _ uint16, mad []byte) {
		if len(mad) != MADSize {
			panic(fmt.Sprintf("the GSI handler got %d bytes", len(mad)))
		}
	})
	return fp
}

// reset makes the pair as new: the links and completion queues emptied,
// the regions zeroed and valid again (a SEND with invalidate may have
// invalidated one), the engines' IP identification counters back at 0,
// and both queue pairs through RESET (QP.reset) to RTS again.
func (fp *fuzzPair) reset(tb testing.TB) {
	rp := fp.ringPair
	for _, p := range []*ringPort{rp.a, rp.b} {
		p.in.head, p.in.n = 0, 0
		p.eng.mu.Lock()
		p.eng.ipID, p.eng.gsiPSN = 0, 0
		p.eng.mu.Unlock()
	}
	for _, cq := range []*CQ{rp.cqa, rp.rcqa, rp.cqb, rp.rcqb} {
		cq.mu.Lock()
		cq.head, cq.n, cq.overflow = 0, 0, false
		cq.mu.Unlock()
	}
	for _, mr := range []*MR{rp.mra, rp.mrb} {
		mr.invalid = false
	}
	clear(rp.bufa)
	clear(rp.backingB)
	for _, qp := range []*QP{rp.qa, rp.qb} {
		must(tb, qp.Modify(&QPAttr{State: abi.QPSReset}, abi.QPStateMask))
	}
	rp.connect(tb)
}

// receive posts A's READ and a receive at B, hands B's QP frame, lets the
// engines exchange what follows, and checks the outcome.
func (fp *fuzzPair) receive(t testing.TB, frame []byte) {
	rp := fp.ringPair
	_, _ = rp.qa.PostSend([]SendWR{{ID: 1, Opcode: abi.WRRDMARead, SGL: sge(rp.mra, 0, 3000), RemoteAddr: base, RKey: rp.mrb.RKey}})
	_, _ = rp.qb.PostRecv([]RecvWR{{ID: 2, SGL: sge(rp.mrb, 0, 2000)}})
	var p roce.Packet
	if roce.Parse(frame, &p) != nil {
		return
	}
	// Aim the packet at B's QP, whatever it said, unless it is for QP1.
	if p.BTH.DestQP != GSIQPN {
		p.BTH.DestQP = rp.qb.Num()
	}
	rp.b.eng.Receive(frame, &p)
	// With the clock standing still, the exchange that one packet sets
	// off must come to an end: no two engines answer each other forever.
	if n := pumpAtMost(maxFuzzFrames, rp.a, rp.b); n >= maxFuzzFrames {
		t.Fatalf("the engines still exchange frames after %d", n)
	}
	size := len(rp.bufb)
	for i, b := range rp.backingB {
		if b != 0 && (i < size || i >= 2*size) {
			t.Fatalf("byte %d outside B's registered memory written", i-size)
		}
	}
	if st := rp.qb.State(); st != abi.QPSRTS && st != abi.QPSErr {
		t.Fatalf("B in state %v", st)
	}
}

// fuzzOutcome is what one input of FuzzReceive did: the frames each side
// sent, the completions, the memory, the states and the counters.
type fuzzOutcome struct {
	sentA, sentB [][]byte
	wcs          []WC
	memA, memB   []byte
	stA, stB     abi.QPState
	statsA       Stats
	statsB       Stats
}

// String sums the outcome up, for failures.
func (o fuzzOutcome) String() string {
	return fmt.Sprintf("frames sent %d and %d (SHA-256 %x), completions %+v, memory SHA-256 %x and %x, states %v and %v\ncounters %+v\n%+v",
		len(o.sentA), len(o.sentB), sha256.Sum256(bytes.Join(append(o.sentA, o.sentB...), []byte{0})), o.wcs,
		sha256.Sum256(o.memA), sha256.Sum256(o.memB), o.stA, o.stB, o.statsA, o.statsB)
}

// run runs frame on the pair as FuzzReceive does and returns what it did.
func (fp *fuzzPair) run(t *testing.T, frame []byte) fuzzOutcome {
	rp := fp.ringPair
	var o fuzzOutcome
	rp.a.watch = func(f []byte) { o.sentA = append(o.sentA, append([]byte(nil), f...)) }
	rp.b.watch = func(f []byte) { o.sentB = append(o.sentB, append([]byte(nil), f...)) }
	defer func() { rp.a.watch, rp.b.watch = nil, nil }()
	sa, sb := rp.a.eng.Stats(), rp.b.eng.Stats()
	fp.receive(t, frame)
	for _, cq := range []*CQ{rp.cqa, rp.rcqa, rp.cqb, rp.rcqb} {
		o.wcs = append(o.wcs, poll(cq)...)
	}
	o.memA, o.memB = append([]byte(nil), rp.bufa...), append([]byte(nil), rp.backingB...)
	o.stA, o.stB = rp.qa.State(), rp.qb.State()
	o.statsA, o.statsB = statsDelta(sa, rp.a.eng.Stats()), statsDelta(sb, rp.b.eng.Stats())
	return o
}

// statsDelta returns what the counters counted from before to after.
func statsDelta(before, after Stats) Stats {
	d := Stats{
		Sent: after.Sent - before.Sent, Received: after.Received - before.Received, Dropped: after.Dropped - before.Dropped,
		Retransmits: after.Retransmits - before.Retransmits, Timeouts: after.Timeouts - before.Timeouts,
		RNRNAKsSent: after.RNRNAKsSent - before.RNRNAKsSent, RNRNAKsReceived: after.RNRNAKsReceived - before.RNRNAKsReceived,
		NAKsSent: after.NAKsSent - before.NAKsSent, NAKsReceived: after.NAKsReceived - before.NAKsReceived,
		DuplicateRequests: after.DuplicateRequests - before.DuplicateRequests, DuplicateResponses: after.DuplicateResponses - before.DuplicateResponses,
		GSIReceived: after.GSIReceived - before.GSIReceived, GSISent: after.GSISent - before.GSISent,
	}
	for i := range d.Rejected {
		d.Rejected[i] = after.Rejected[i] - before.Rejected[i]
	}
	for i := range d.GSIDropped {
		d.GSIDropped[i] = after.GSIDropped[i] - before.GSIDropped[i]
	}
	return d
}

// BenchmarkFuzzInput: one input of FuzzReceive (a WRITE for B), on a new
// pair as each input once had, and on the pair reset as now.
func BenchmarkFuzzInput(b *testing.B) {
	frame := fuzzSeeds(b)[1]
	b.Run("new pair", func(b *testing.B) {
		for b.Loop() {
			newFuzzPair(b).receive(b, frame)
		}
	})
	b.Run("reset pair", func(b *testing.B) {
		fp := newFuzzPair(b)
		for b.Loop() {
			fp.reset(b)
			fp.receive(b, frame)
		}
	})
}

// TestFuzzPairReset: FuzzReceive's inputs are independent — an input run
// on the pair after hundreds of others does exactly what it does on a new
// pair: the same frames sent, byte for byte, the same completions, memory,
// states and counts. The inputs are FuzzReceive's seeds with their
// opcodes, PSNs and other bytes changed at random (the same every run),
// after a few made to leave traces.
func TestFuzzPairReset(t *testing.T) {
	seeds := fuzzSeeds(t)
	if len(seeds) != 6 {
		t.Fatalf("%d seeds, want 6", len(seeds))
	}
	reused := newFuzzPair(t)
	// Inputs that leave traces a reset must remove: a SEND that
	// invalidates B's region, a packet kept aside for later, an atomic.
	build := func(op roce.Opcode, psn roce.PSN, set func(*roce.Packet)) []byte {
		rp := reused.ringPair
		p := rp.qa.template(rp.b.ip, rp.b.mac, rp.qb.Num(), 0, 0)
		p.BTH.Opcode, p.BTH.PSN, p.BTH.AckReq = op, psn, true
		if set != nil {
			set(&p)
		}
		var payload []byte
		if p.Info().Has(roce.HasPayload) {
			payload = make([]byte, 64)
		}
		buf := make([]byte, 9000)
		n, err := p.Build(buf, payload)
		must(t, err)
		return buf[:n]
	}
	crafted := [][]byte{
		build(roce.RCSendOnlyWithInvalidate, 0, func(p *roce.Packet) { p.IETH = reused.mrb.RKey }),
		build(roce.RCSendOnly, 5, nil),
		build(roce.RCFetchAdd, 0, func(p *roce.Packet) {
			p.AtomicETH = roce.AtomicETHFields{VA: base, RKey: reused.mrb.RKey, SwapAdd: 3}
		}),
	}
	r := rand.New(rand.NewPCG(7, 8))
	sent := 0
	for k := range 400 {
		const bth = roce.EthernetLen + roce.IPv4Len + roce.UDPLen
		var f []byte
		if k < len(crafted) {
			f = crafted[k]
		} else {
			f = append([]byte(nil), seeds[k%len(seeds)]...)
			if k%3 != 0 {
				f[bth] = byte(r.IntN(256)) // opcode
			}
			f[bth+11] = byte(r.IntN(8)) // the PSN's low byte, near the expected one
			for range r.IntN(3) {
				f[bth+r.IntN(len(f)-bth)] = byte(r.IntN(256))
			}
		}
		fresh := newFuzzPair(t)
		want := fresh.run(t, f)
		reused.reset(t)
		got := reused.run(t, f)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("input %d (BTH %x): on the reused pair\n%s\non a new pair\n%s", k, f[bth:bth+12], got, want)
		}
		sent += len(want.sentA) + len(want.sentB)
	}
	if sent == 0 {
		t.Fatal("no input made the engines send anything")
	}
}
