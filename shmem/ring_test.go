package shmem

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// alignedMem returns n zero bytes whose first byte is 64-byte aligned.
func alignedMem(n int) []byte {
	words := make([]uint64, (n+64)/8+1)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
	off := (64 - int(uintptr(unsafe.Pointer(&b[0]))%64)) % 64
	return b[off : off+n : off+n]
}

func newTestRing(t testing.TB, slots, slotSize int) (*Ring, []byte) {
	t.Helper()
	mem := alignedMem(RingBytes(slots, slotSize))
	r, err := InitRing(mem, slots, slotSize)
	if err != nil {
		t.Fatal(err)
	}
	return r, mem
}

func TestRingBytes(t *testing.T) {
	for _, tc := range []struct {
		slots, size, want int
	}{
		{1, 8, RingHeaderBytes + 8},
		{64, 64, RingHeaderBytes + 64*64},
		{MaxRingSlots, 8, RingHeaderBytes + MaxRingSlots*8},
		{0, 8, 0},
		{3, 8, 0},
		{-4, 8, 0},
		{2 * MaxRingSlots, 8, 0},
		{4, 0, 0},
		{4, 12, 0},
		{4, -8, 0},
		{4, MaxSlotSize + 8, 0},
	} {
		if got := RingBytes(tc.slots, tc.size); got != tc.want {
			t.Errorf("RingBytes(%d, %d) = %d, want %d", tc.slots, tc.size, got, tc.want)
		}
	}
}

func TestInitRingErrors(t *testing.T) {
	big := alignedMem(RingBytes(16, 64) + 8)
	for _, tc := range []struct {
		name        string
		mem         []byte
		slots, size int
	}{
		{"zero slots", big, 0, 64},
		{"not power of two", big, 12, 64},
		{"negative slots", big, -16, 64},
		{"slot size not multiple of 8", big, 16, 60},
		{"zero slot size", big, 16, 0},
		{"too large", big, MaxRingSlots, MaxSlotSize},
		{"memory too short", big[:RingBytes(16, 64)-1], 16, 64},
		{"misaligned", big[1 : RingBytes(16, 64)+1], 16, 64},
		{"nil memory", nil, 16, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := InitRing(tc.mem, tc.slots, tc.size); !errors.Is(err, ErrBadRing) {
				t.Fatalf("InitRing: err = %v, want ErrBadRing", err)
			}
		})
	}
}

func TestRingFullEmptyEdges(t *testing.T) {
	const slots, size = 8, 16
	r, _ := newTestRing(t, slots, size)
	if r.Slots() != slots || r.SlotSize() != size {
		t.Fatalf("geometry %d×%d", r.Slots(), r.SlotSize())
	}
	if r.Len() != 0 || r.Free() != slots || r.Peek() != nil || r.PeekAt(0) != nil {
		t.Fatal("new ring not empty")
	}
	for lap := range 5 {
		for i := range slots {
			s := r.Reserve()
			if s == nil || len(s) != size || cap(s) != size {
				t.Fatalf("lap %d: Reserve %d = %v", lap, i, s)
			}
			if &r.Reserve()[0] != &s[0] {
				t.Fatal("Reserve without Commit moved")
			}
			binary.LittleEndian.PutUint64(s, uint64(lap*slots+i))
			r.Commit()
			if r.Len() != i+1 || r.Free() != slots-i-1 {
				t.Fatalf("after %d commits: Len %d Free %d", i+1, r.Len(), r.Free())
			}
		}
		if r.Reserve() != nil || r.ReserveAt(0) != nil || r.Free() != 0 {
			t.Fatal("full ring still reserves")
		}
		if r.PeekAt(slots-1) == nil || r.PeekAt(slots) != nil || r.PeekAt(-1) != nil {
			t.Fatal("PeekAt bounds on a full ring")
		}
		for i := range slots {
			s := r.Peek()
			if s == nil {
				t.Fatalf("lap %d: Peek %d = nil", lap, i)
			}
			if got := binary.LittleEndian.Uint64(s); got != uint64(lap*slots+i) {
				t.Fatalf("lap %d: slot %d holds %d", lap, i, got)
			}
			r.Release()
		}
		if r.Peek() != nil || r.Len() != 0 || r.Free() != slots {
			t.Fatal("drained ring not empty")
		}
		if r.ReserveAt(slots-1) == nil || r.ReserveAt(slots) != nil || r.ReserveAt(-1) != nil {
			t.Fatal("ReserveAt bounds on an empty ring")
		}
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestRingMisusePanics(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func(r *Ring)
	}{
		{"commit on full", func(r *Ring) {
			for r.Reserve() != nil {
				r.Commit()
			}
			r.Commit()
		}},
		{"commit negative", func(r *Ring) { r.CommitN(-1) }},
		{"commit too many", func(r *Ring) { r.CommitN(5) }},
		{"release on empty", func(r *Ring) { r.Release() }},
		{"release negative", func(r *Ring) { r.ReleaseN(-1) }},
		{"release unseen", func(r *Ring) {
			r.Reserve()
			r.Commit()
			r.ReleaseN(1) // not yet seen by Len/Peek
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := newTestRing(t, 4, 8)
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			tc.f(r)
		})
	}
}

func TestRingWakeFlags(t *testing.T) {
	r, _ := newTestRing(t, 4, 8)
	push := func() bool { r.Reserve(); return r.Commit() }
	pop := func() bool { r.Peek(); return r.Release() }

	if push() {
		t.Fatal("Commit wakes without PrepareSleep")
	}
	r.PrepareSleep()
	if !push() {
		t.Fatal("Commit after PrepareSleep does not wake")
	}
	if push() {
		t.Fatal("wake request not cleared by Commit")
	}
	r.PrepareSleep()
	r.CancelSleep()
	if push() {
		t.Fatal("Commit wakes after CancelSleep")
	}
	if r.CommitN(0) {
		t.Fatal("CommitN(0) wakes")
	}
	// The ring now holds 4 slots: full.
	r.PrepareSpaceWait()
	if r.Free() != 0 {
		t.Fatal("ring not full")
	}
	if !pop() {
		t.Fatal("Release after PrepareSpaceWait does not wake")
	}
	if pop() {
		t.Fatal("space request not cleared by Release")
	}
	r.PrepareSpaceWait()
	r.CancelSpaceWait()
	if pop() {
		t.Fatal("Release wakes after CancelSpaceWait")
	}
}

func TestAttachRingHeader(t *testing.T) {
	const slots, size = 16, 32
	n := RingBytes(slots, size)
	put32 := func(off int, v uint32) func([]byte) {
		return func(m []byte) { binary.NativeEndian.PutUint32(m[off:], v) }
	}
	put64 := func(off int, v uint64) func([]byte) {
		return func(m []byte) { binary.NativeEndian.PutUint64(m[off:], v) }
	}
	for _, tc := range []struct {
		name  string
		mut   func([]byte)
		trim  int // bytes cut off the end of the memory
		shift bool
		want  error
	}{
		{"valid", func([]byte) {}, 0, false, nil},
		{"bad magic", put32(RingOffMagic, 0xdeadbeef), 0, false, ErrBadRing},
		{"byte-swapped magic", put32(RingOffMagic, 0x54524e47), 0, false, ErrBadRing},
		{"zero header", func(m []byte) { clear(m[:RingHeaderBytes]) }, 0, false, ErrBadRing},
		{"version 2", put32(RingOffVersion, 2), 0, false, ErrBadRing},
		{"zero slots", put32(RingOffSlots, 0), 0, false, ErrBadRing},
		{"slots not power of two", put32(RingOffSlots, 15), 0, false, ErrBadRing},
		{"huge slots", put32(RingOffSlots, 1<<31), 0, false, ErrBadRing},
		{"slots beyond memory", put32(RingOffSlots, 32), 0, false, ErrBadRing},
		{"zero slot size", put32(RingOffSlotSize, 0), 0, false, ErrBadRing},
		{"slot size not multiple of 8", put32(RingOffSlotSize, 33), 0, false, ErrBadRing},
		{"huge slot size", put32(RingOffSlotSize, 0xfffffff8), 0, false, ErrBadRing},
		{"slot size beyond memory", put32(RingOffSlotSize, 40), 0, false, ErrBadRing},
		{"memory one byte short", func([]byte) {}, 1, false, ErrBadRing},
		{"memory shorter than header", func([]byte) {}, n - RingHeaderBytes + 1, false, ErrBadRing},
		{"misaligned", func([]byte) {}, 0, true, ErrBadRing},
		{"full ring", put64(RingOffProd, slots), 0, false, nil},
		{"producer too far ahead", put64(RingOffProd, slots+1), 0, false, ErrCorrupt},
		{"consumer ahead of producer", put64(RingOffCons, 1), 0, false, ErrCorrupt},
		{"indices near wrap", func(m []byte) {
			put64(RingOffProd, 3)(m)
			put64(RingOffCons, ^uint64(0)-2)(m)
		}, 0, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			buf := alignedMem(n + 8)
			mem := buf[:n]
			if _, err := InitRing(mem, slots, size); err != nil {
				t.Fatal(err)
			}
			tc.mut(mem)
			mem = mem[:n-tc.trim]
			if tc.shift {
				copy(buf[1:], buf[:n])
				mem = buf[1 : n+1]
			}
			r, err := AttachRing(mem)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("AttachRing: err = %v, want %v", err, tc.want)
			}
			if err == nil && (r.Slots() != slots || r.SlotSize() != size) {
				t.Fatalf("geometry %d×%d", r.Slots(), r.SlotSize())
			}
		})
	}
}

// TestRingCorruptIndices overwrites the peer's index the way a hostile peer
// would and checks that the reading side reports corruption instead of
// handing out slots.
func TestRingCorruptIndices(t *testing.T) {
	const slots = 8
	for _, tc := range []struct {
		name     string
		filled   int    // slots committed and seen before the corruption
		released int    // of those, released
		off      int    // which index the peer overwrites
		delta    uint64 // new value = current producer index + delta
		producer bool   // whether the producer (true) or consumer (false) side notices
		ok       bool   // a legal value: no corruption
	}{
		{"producer jumps past consumer+slots", 2, 0, RingOffProd, slots + 1, false, false},
		{"producer moves backwards", 4, 0, RingOffProd, ^uint64(0), false, false},
		{"producer behind consumer", 4, 4, RingOffProd, ^uint64(1), false, false},
		{"producer huge", 0, 0, RingOffProd, 1 << 63, false, false},
		{"producer exactly full", 0, 0, RingOffProd, slots, false, true},
		{"consumer ahead of producer", 3, 0, RingOffCons, 1, true, false},
		{"consumer backwards", 3, 3, RingOffCons, ^uint64(3), true, false},
		{"consumer huge", 3, 0, RingOffCons, 1 << 40, true, false},
		{"consumer catches up", 3, 0, RingOffCons, 0, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, mem := newTestRing(t, slots, 8)
			for range tc.filled {
				r.Reserve()
				r.Commit()
			}
			r.Len()
			r.ReleaseN(tc.released)
			r.Free()
			u64At(mem, tc.off).Store(u64At(mem, RingOffProd).Load() + tc.delta)
			if tc.producer {
				free := r.Free()
				if tc.ok {
					if free != slots || r.Reserve() == nil || r.Err() != nil {
						t.Fatalf("legal consumer index: Free %d, Err %v", free, r.Err())
					}
					return
				}
				if free != 0 || r.Reserve() != nil || r.ReserveAt(0) != nil {
					t.Fatalf("corrupt consumer index still gives space: Free %d", free)
				}
			} else {
				n := r.Len()
				if tc.ok {
					if n != slots || r.Peek() == nil || r.Err() != nil {
						t.Fatalf("legal producer index: Len %d, Err %v", n, r.Err())
					}
					return
				}
				if n != 0 || r.Peek() != nil || r.PeekAt(0) != nil {
					t.Fatalf("corrupt producer index still gives slots: Len %d", n)
				}
			}
			if err := r.Err(); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Err = %v, want ErrCorrupt", err)
			}
			// Corruption is sticky on both sides.
			if r.Free() != 0 || r.Len() != 0 || r.Reserve() != nil || r.Peek() != nil {
				t.Fatal("corrupt ring still works")
			}
		})
	}
}

func TestRingAllocs(t *testing.T) {
	r, _ := newTestRing(t, 64, 64)
	allocs := testing.AllocsPerRun(1000, func() {
		s := r.Reserve()
		s[0] = 1
		r.Commit()
		if p := r.Peek(); p[0] != 1 {
			panic("bad slot")
		}
		r.Release()
		r.ReserveAt(3)
		r.PeekAt(0)
		r.Free()
		r.Len()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per push/pop", allocs)
	}
}

// pumpRing moves n messages from prod to cons (two handles on the same
// ring, possibly through different mappings) in random batches, one
// goroutine each side, and checks FIFO order and contents.
func pumpRing(t *testing.T, prod, cons *Ring, n int) {
	t.Helper()
	slots := prod.Slots()
	var wg sync.WaitGroup
	var failed atomic.Bool
	deadline := time.Now().Add(20 * time.Second)
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		spins := 0
		for seq := 0; seq < n && !failed.Load(); {
			k := min(1+rng.IntN(slots), n-seq)
			got := 0
			for ; got < k; got++ {
				s := prod.ReserveAt(got)
				if s == nil {
					break
				}
				binary.LittleEndian.PutUint64(s[len(s)-8:], ^uint64(seq+got))
				binary.LittleEndian.PutUint64(s, uint64(seq+got)) // overlaps the above in 8-byte slots
			}
			if got == 0 {
				if spins++; spins%64 == 0 {
					runtime.Gosched()
					if time.Now().After(deadline) {
						t.Error("producer stuck")
						failed.Store(true)
					}
				}
				continue
			}
			prod.CommitN(got)
			seq += got
		}
	})
	rng := rand.New(rand.NewPCG(3, 4))
	spins := 0
	for seq := 0; seq < n && !failed.Load(); {
		k := 1 + rng.IntN(slots)
		got := 0
		for ; got < k; got++ {
			s := cons.PeekAt(got)
			if s == nil {
				break
			}
			a, b := binary.LittleEndian.Uint64(s), binary.LittleEndian.Uint64(s[len(s)-8:])
			if a != uint64(seq+got) || (len(s) > 8 && b != ^a) {
				t.Errorf("message %d: got %d/%#x", seq+got, a, b)
				failed.Store(true)
				break
			}
		}
		if got == 0 {
			if spins++; spins%64 == 0 {
				runtime.Gosched()
				if time.Now().After(deadline) {
					t.Error("consumer stuck")
					failed.Store(true)
				}
			}
			continue
		}
		cons.ReleaseN(got)
		seq += got
	}
	wg.Wait()
	if err := errors.Join(prod.Err(), cons.Err()); err != nil {
		t.Fatal(err)
	}
	if cons.Len() != 0 || prod.Free() != slots {
		t.Fatalf("ring not empty at the end: Len %d Free %d", cons.Len(), prod.Free())
	}
}

func TestRingTwoGoroutinesHeap(t *testing.T) {
	r, mem := newTestRing(t, 16, 24)
	cons, err := AttachRing(mem)
	if err != nil {
		t.Fatal(err)
	}
	pumpRing(t, r, cons, 10000)
}

// FuzzAttachRing feeds AttachRing arbitrary header and index bytes and then
// runs a program of ring operations interleaved with a peer scribbling over
// the indices and header. Nothing may panic, and every slot handed out must
// lie inside the ring's memory.
func FuzzAttachRing(f *testing.F) {
	for _, g := range [][2]int{{1, 8}, {4, 16}, {16, 8}, {8, 64}} {
		mem := alignedMem(RingBytes(g[0], g[1]))
		r, _ := InitRing(mem, g[0], g[1])
		f.Add(append([]byte(nil), mem...), []byte{0, 0, 2, 1, 3, 6, 4, 1, 2, 3, 4, 5, 6, 7, 8, 2, 2})
		for r.Reserve() != nil {
			r.Commit()
		}
		f.Add(append([]byte(nil), mem...), []byte{2, 3, 0, 5, 255, 255, 255, 255, 255, 255, 255, 255, 0, 2})
	}
	f.Add(make([]byte, 300), []byte{0})
	f.Fuzz(func(t *testing.T, hdr, ops []byte) {
		if len(hdr) > 1<<16 {
			return
		}
		mem := alignedMem(len(hdr))
		copy(mem, hdr)
		r, err := AttachRing(mem)
		if err != nil {
			if !errors.Is(err, ErrBadRing) && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("AttachRing: unexpected error %v", err)
			}
			return
		}
		base := uintptr(unsafe.Pointer(&mem[0]))
		slots, size := r.Slots(), r.SlotSize()
		check := func(s []byte) {
			if s == nil {
				return
			}
			p := uintptr(unsafe.Pointer(&s[0]))
			if len(s) != size || cap(s) != size || p < base+RingHeaderBytes ||
				p+uintptr(size) > base+uintptr(len(mem)) || (p-base-RingHeaderBytes)%uintptr(size) != 0 {
				t.Fatalf("slot at offset %d, len %d, cap %d outside ring of %d×%d in %d bytes",
					p-base, len(s), cap(s), slots, size, len(mem))
			}
			s[0]++ // must be writable memory of the ring
		}
		word := func(i *int) uint64 {
			var b [8]byte
			*i += copy(b[:], ops[min(*i, len(ops)):])
			return binary.NativeEndian.Uint64(b[:])
		}
		for i := 0; i < len(ops); {
			op := ops[i]
			i++
			arg := int(op >> 3)
			switch op & 7 {
			case 0:
				if s := r.Reserve(); s != nil {
					check(s)
					r.Commit()
				}
			case 1:
				if s := r.ReserveAt(arg); s != nil {
					check(s)
					r.CommitN(arg + 1)
				}
			case 2:
				if s := r.Peek(); s != nil {
					check(s)
					r.Release()
				}
			case 3:
				if s := r.PeekAt(arg); s != nil {
					check(s)
					r.ReleaseN(arg + 1)
				}
			case 4:
				u64At(mem, RingOffProd).Store(word(&i))
			case 5:
				u64At(mem, RingOffCons).Store(word(&i))
			case 6:
				binary.NativeEndian.PutUint64(mem[arg%RingHeaderBytes&^7:], word(&i))
			case 7:
				if arg&1 != 0 {
					r.PrepareSleep()
				} else {
					r.CancelSleep()
				}
				if arg&2 != 0 {
					r.PrepareSpaceWait()
				} else {
					r.CancelSpaceWait()
				}
			}
			if n, fr := r.Len(), r.Free(); n < 0 || n > slots || fr < 0 || fr > slots {
				t.Fatalf("Len %d, Free %d with %d slots", n, fr, slots)
			}
			if err := r.Err(); err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Err = %v", err)
				}
				if r.Peek() != nil || r.Reserve() != nil {
					t.Fatal("corrupt ring hands out slots")
				}
			}
		}
	})
}

func BenchmarkRingPushPop(b *testing.B) {
	r, _ := newTestRing(b, 256, 64)
	b.ReportAllocs()
	for b.Loop() {
		s := r.Reserve()
		s[0] = 1
		r.Commit()
		r.Peek()
		r.Release()
	}
}

// BenchmarkRingPingPong measures a round trip between two goroutines
// spinning on two rings: one op is one message there and one back.
func BenchmarkRingPingPong(b *testing.B) {
	ping, pingMem := newTestRing(b, 64, 64)
	pong, pongMem := newTestRing(b, 64, 64)
	pingC, _ := AttachRing(pingMem)
	pongP, _ := AttachRing(pongMem)
	spin := func(n *int) {
		if *n++; *n%256 == 0 {
			runtime.Gosched()
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		n := 0
		for {
			s := pingC.Peek()
			if s == nil {
				spin(&n)
				continue
			}
			v := s[0]
			pingC.Release()
			var out []byte
			for out = pongP.Reserve(); out == nil; out = pongP.Reserve() {
				spin(&n)
			}
			out[0] = v
			pongP.Commit()
			if v == 0 {
				return
			}
		}
	})
	n := 0
	send := func(v byte) {
		var s []byte
		for s = ping.Reserve(); s == nil; s = ping.Reserve() {
			spin(&n)
		}
		s[0] = v
		ping.Commit()
		var in []byte
		for in = pong.Peek(); in == nil; in = pong.Peek() {
			spin(&n)
		}
		if in[0] != v {
			panic("reply mismatch")
		}
		pong.Release()
	}
	b.ReportAllocs()
	for b.Loop() {
		send(1)
	}
	b.StopTimer()
	send(0)
	wg.Wait()
}
