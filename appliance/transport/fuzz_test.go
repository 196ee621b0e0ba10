package transport

import (
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
// state.
//
// Each input gets a pair of its own, as small as the work posted allows:
// with deep queues, setting one up took most of the fuzzer's time.
func FuzzReceive(f *testing.F) {
	seed := newRingPairSized(f, fuzzMem, 16, 16)
	_, _ = seed.qa.PostSend([]SendWR{{ID: 1, Opcode: abi.WRRDMAWrite, SGL: sge(seed.mra, 0, 5000), RemoteAddr: base, RKey: seed.mrb.RKey}})
	for seed.b.in.n > 0 {
		i := seed.b.in.head
		f.Add(append([]byte(nil), seed.b.in.slots[i][:seed.b.in.lens[i]]...))
		seed.b.in.head = (i + 1) % len(seed.b.in.slots)
		seed.b.in.n--
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		rp := newRingPairSized(t, fuzzMem, 16, 16)
		_, _ = rp.qa.PostSend([]SendWR{{ID: 1, Opcode: abi.WRRDMARead, SGL: sge(rp.mra, 0, 3000), RemoteAddr: base, RKey: rp.mrb.RKey}})
		_, _ = rp.qb.PostRecv([]RecvWR{{ID: 2, SGL: sge(rp.mrb, 0, 2000)}})
		var p roce.Packet
		if roce.Parse(frame, &p) != nil {
			return
		}
		// Aim the packet at B's QP, whatever it said.
		p.BTH.DestQP = rp.qb.Num()
		rp.b.eng.Receive(frame, &p)
		// With the clock standing still, the exchange that one packet sets
		// off must come to an end: no two engines answer each other
		// forever.
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
	})
}
