package transport

import (
	"slices"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/verbs/abi"
)

// numbers returns the QPNs of n queue pairs and the keys of n regions an
// engine made with seed gives out, the queue pairs killed with a linger
// (so that they stay in the engine) every third one.
func numbers(t *testing.T, seed uint64, n int) (qpns, keys []uint32) {
	t.Helper()
	e := NewEngine(Config{MAC: roce.MAC{2, 0, 0, 0, 0, 1}, GIDs: []roce.GID{{}}, Out: &simPort{}, Seed: seed,
		Now: func() time.Time { return time.Unix(1000, 0) }})
	pd := e.Memory().NewPD()
	cq := NewCQ(1, nil)
	buf := make([]byte, 64)
	for i := range n {
		qp, err := e.CreateQP(QPConfig{Type: abi.UD, PD: pd, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1})
		must(t, err)
		if i%3 == 0 {
			must(t, e.Kill(qp, time.Hour))
		}
		qpns = append(qpns, qp.Num())
		mr, err := e.Memory().Register(pd, 0x1000, buf, abi.AccessLocalWrite)
		must(t, err)
		if mr.LKey != mr.RKey {
			t.Fatalf("L_Key %#x, R_Key %#x", mr.LKey, mr.RKey)
		}
		keys = append(keys, mr.RKey)
	}
	if e.QPCount() != n {
		t.Fatalf("%d queue pairs, want %d", e.QPCount(), n)
	}
	return qpns, keys
}

// TestRandomNumbers: QPNs and memory keys carry unpredictable bits, as
// rxe's keys do: they differ from engine to engine unless a seed is given,
// a QPN is never 0, 1 or 0xFFFFFF nor the number of another queue pair
// (lingering ones included), a key never 0 nor another live region's; the
// same seed gives the same numbers.
func TestRandomNumbers(t *testing.T) {
	const n = 8192 // QPNs collide a few times in 2^24: some are drawn again
	qpns, keys := numbers(t, 0, n)
	seenQPN, seenKey := map[uint32]bool{}, map[uint32]bool{}
	for i := range n {
		q, k := qpns[i], keys[i]
		if q < 2 || q >= roce.QPNMask || seenQPN[q] {
			t.Fatalf("QPN %#x (number %d): reserved, out of range or taken", q, i)
		}
		if k == 0 || seenKey[k] {
			t.Fatalf("key %#x (number %d): 0 or taken", k, i)
		}
		seenQPN[q], seenKey[k] = true, true
	}
	// Sequential numbers, as before, would pass the checks above.
	step := 0
	for i := 1; i < n; i++ {
		if qpns[i]-qpns[i-1] == 1 || keys[i]-keys[i-1] == 0x100 {
			step++
		}
	}
	if step > 4 {
		t.Errorf("%d of %d numbers follow their predecessor", step, n)
	}
	other, otherKeys := numbers(t, 0, 8)
	if slices.Equal(other, qpns[:8]) || slices.Equal(otherKeys, keys[:8]) {
		t.Errorf("two engines gave the same numbers: QPNs %#x, keys %#x", other, otherKeys)
	}
	a, ak := numbers(t, 42, 8)
	b, bk := numbers(t, 42, 8)
	if !slices.Equal(a, b) || !slices.Equal(ak, bk) {
		t.Errorf("seed 42 gave QPNs %#x and %#x, keys %#x and %#x", a, b, ak, bk)
	}
}
