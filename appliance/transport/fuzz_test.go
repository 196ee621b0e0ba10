package transport

import (
	"testing"

	"github.com/taproce/taproce/appliance/roce"
)

// FuzzReceive feeds arbitrary packets to an established RC QP (B) whose
// peer (A) has work outstanding: nothing panics, nothing outside B's
// registered memory changes, and B either carries on or is in the error
// state.
func FuzzReceive(f *testing.F) {
	seed := newRingPairSlots(f, 1<<16, 64)
	_, _ = seed.qa.PostSend([]SendWR{{ID: 1, Opcode: OpWrite, SGL: sge(seed.mra, 0, 5000), RemoteAddr: base, RKey: seed.mrb.RKey}})
	for seed.b.in.n > 0 {
		i := seed.b.in.head
		f.Add(append([]byte(nil), seed.b.in.slots[i][:seed.b.in.lens[i]]...))
		seed.b.in.head = (i + 1) % len(seed.b.in.slots)
		seed.b.in.n--
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		rp := newRingPairSlots(t, 1<<16, 64)
		_, _ = rp.qa.PostSend([]SendWR{{ID: 1, Opcode: OpRead, SGL: sge(rp.mra, 0, 3000), RemoteAddr: base, RKey: rp.mrb.RKey}})
		_, _ = rp.qb.PostRecv([]RecvWR{{ID: 2, SGL: sge(rp.mrb, 0, 2000)}})
		var p roce.Packet
		if roce.Parse(frame, &p) != nil {
			return
		}
		// Aim the packet at B's QP, whatever it said.
		p.BTH.DestQP = rp.qb.Num()
		rp.b.eng.Receive(frame, &p)
		pump(rp.a, rp.b)
		size := len(rp.bufb)
		for i, b := range rp.backingB {
			if b != 0 && (i < size || i >= 2*size) {
				t.Fatalf("byte %d outside B's registered memory written", i-size)
			}
		}
		if st := rp.qb.State(); st != StateRTS && st != StateErr {
			t.Fatalf("B in state %v", st)
		}
	})
}
