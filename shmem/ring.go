package shmem

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/cpu"
)

// Ring geometry limits and layout constants. See the package documentation
// for the full layout.
const (
	// RingHeaderBytes is the size of the ring header; slot 0 starts at this
	// offset from the first byte of the ring.
	RingHeaderBytes = 256

	// RingAlign is the alignment InitRing and AttachRing require of the
	// first byte of the ring's memory.
	RingAlign = 8

	// MaxRingSlots is the largest slot count a ring may have.
	MaxRingSlots = 1 << 24

	// MaxSlotSize is the largest slot size a ring may have.
	MaxSlotSize = 1 << 24
)

// The ring header's words (see the package documentation), exported for
// the C client library's copy of the layout (verbs/libibverbs/abi.h).
const (
	RingMagic   = 0x474e5254 // "TRNG" read as a little-endian uint32
	RingVersion = 1

	RingOffMagic     = 0
	RingOffVersion   = 4
	RingOffSlots     = 8
	RingOffSlotSize  = 12
	RingOffProd      = 64
	RingOffCons      = 128
	RingOffConsSleep = 192
	RingOffProdSleep = 196
)

// Ring is one side's handle on a single-producer/single-consumer ring of
// fixed-size slots in shared memory (see the package documentation for the
// layout and the sleep protocol).
//
// The producer methods (Free, Reserve, ReserveAt, Commit, CommitN,
// PrepareSpaceWait, CancelSpaceWait) must be called from one goroutine at a
// time, and so must the consumer methods (Len, Peek, PeekAt, Release,
// ReleaseN, PrepareSleep, CancelSleep). Normally each process attaches its own
// Ring and uses one role, but one Ring may also serve a producer goroutine and
// a consumer goroutine at once.
//
// Slot contents live in shared memory: the peer can change them at any time,
// so copy what you read before validating it.
//
// None of the methods allocate. Once a Ring has seen a corrupt index it stays
// broken: Reserve and Peek return nil, Free and Len return 0, and Err returns
// an error wrapping ErrCorrupt.
type Ring struct {
	data      []byte // the slot area, len == nslots*slotSize
	slotSize  int
	nslots    uint64
	mask      uint64
	prodIdx   *atomic.Uint64
	consIdx   *atomic.Uint64
	consSleep *atomic.Uint32
	prodSleep *atomic.Uint32
	err       atomic.Pointer[ringErr]

	_ cpu.CacheLinePad
	// Producer-private state.
	prod     uint64 // next slot to fill; the authoritative producer index
	prodCons uint64 // consumer index last seen by the producer

	_ cpu.CacheLinePad
	// Consumer-private state.
	cons     uint64 // next slot to read; the authoritative consumer index
	consProd uint64 // producer index last seen by the consumer

	_ cpu.CacheLinePad
}

type ringErr struct{ err error }

// checkGeometry reports whether slots and slotSize describe a valid ring.
func checkGeometry(slots, slotSize uint64) error {
	switch {
	case slots == 0 || slots > MaxRingSlots || slots&(slots-1) != 0:
		return fmt.Errorf("slot count %d is not a power of two in [1, %d]: %w", slots, MaxRingSlots, ErrBadRing)
	case slotSize == 0 || slotSize > MaxSlotSize || slotSize%8 != 0:
		return fmt.Errorf("slot size %d is not a multiple of 8 in [8, %d]: %w", slotSize, MaxSlotSize, ErrBadRing)
	}
	return nil
}

// RingBytes returns the number of bytes a ring of slots slots of slotSize
// bytes occupies, header included, or 0 if the geometry is invalid (slots
// not a power of two in [1, MaxRingSlots], slotSize not a multiple of 8 in
// [8, MaxSlotSize], or the total does not fit in an int).
func RingBytes(slots, slotSize int) int {
	if slots < 0 || slotSize < 0 || checkGeometry(uint64(slots), uint64(slotSize)) != nil {
		return 0
	}
	total := uint64(RingHeaderBytes) + uint64(slots)*uint64(slotSize)
	if total > uint64(maxInt) {
		return 0
	}
	return int(total)
}

const maxInt = int(^uint(0) >> 1)

func checkMem(mem []byte, need uint64) error {
	if uint64(len(mem)) < need {
		return fmt.Errorf("ring needs %d bytes, memory has %d: %w", need, len(mem), ErrBadRing)
	}
	if p := uintptr(unsafe.Pointer(unsafe.SliceData(mem))); p%RingAlign != 0 {
		return fmt.Errorf("ring memory at %#x is not %d-byte aligned: %w", p, RingAlign, ErrBadRing)
	}
	return nil
}

func u32At(mem []byte, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&mem[off]))
}

func u64At(mem []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&mem[off]))
}

// InitRing writes a fresh ring header with slots slots of slotSize bytes at
// the start of mem, marks the ring empty, and returns a handle on it. mem must
// be at least RingBytes(slots, slotSize) long and RingAlign-aligned; bytes
// beyond the ring are left alone, and slot contents are not cleared. Errors
// wrap ErrBadRing.
func InitRing(mem []byte, slots, slotSize int) (*Ring, error) {
	need := RingBytes(slots, slotSize)
	if need == 0 {
		if slots < 0 || slotSize < 0 {
			return nil, fmt.Errorf("shmem: InitRing(%d slots, %d bytes): %w", slots, slotSize, ErrBadRing)
		}
		if err := checkGeometry(uint64(slots), uint64(slotSize)); err != nil {
			return nil, fmt.Errorf("shmem: InitRing: %w", err)
		}
		return nil, fmt.Errorf("shmem: InitRing(%d slots, %d bytes): too large: %w", slots, slotSize, ErrBadRing)
	}
	if err := checkMem(mem, uint64(need)); err != nil {
		return nil, fmt.Errorf("shmem: InitRing: %w", err)
	}
	u32At(mem, RingOffMagic).Store(0)
	clear(mem[RingOffMagic+4 : RingHeaderBytes])
	u32At(mem, RingOffVersion).Store(RingVersion)
	u32At(mem, RingOffSlots).Store(uint32(slots))
	u32At(mem, RingOffSlotSize).Store(uint32(slotSize))
	u64At(mem, RingOffProd).Store(0)
	u64At(mem, RingOffCons).Store(0)
	u32At(mem, RingOffConsSleep).Store(0)
	u32At(mem, RingOffProdSleep).Store(0)
	u32At(mem, RingOffMagic).Store(RingMagic)
	return newRing(mem, uint64(slots), uint64(slotSize), 0, 0), nil
}

// AttachRing returns a handle on the ring whose header starts at mem, as
// written by InitRing, possibly in another process. The header is treated as
// untrusted: the magic, version and geometry are checked and the ring must fit
// in mem (errors wrap ErrBadRing), and the two indices must be consistent
// (errors wrap ErrCorrupt). The geometry is copied, so later changes to the
// header by the peer have no effect. mem must be RingAlign-aligned.
func AttachRing(mem []byte) (*Ring, error) {
	if err := checkMem(mem, RingHeaderBytes); err != nil {
		return nil, fmt.Errorf("shmem: AttachRing: %w", err)
	}
	magic := u32At(mem, RingOffMagic).Load()
	version := u32At(mem, RingOffVersion).Load()
	slots := uint64(u32At(mem, RingOffSlots).Load())
	slotSize := uint64(u32At(mem, RingOffSlotSize).Load())
	if magic != RingMagic {
		return nil, fmt.Errorf("shmem: AttachRing: magic %#08x, want %#08x: %w", magic, RingMagic, ErrBadRing)
	}
	if version != RingVersion {
		return nil, fmt.Errorf("shmem: AttachRing: version %d, want %d: %w", version, RingVersion, ErrBadRing)
	}
	if err := checkGeometry(slots, slotSize); err != nil {
		return nil, fmt.Errorf("shmem: AttachRing: %w", err)
	}
	// slots, slotSize <= 2^24, so this cannot overflow.
	if err := checkMem(mem, RingHeaderBytes+slots*slotSize); err != nil {
		return nil, fmt.Errorf("shmem: AttachRing: %w", err)
	}
	prod := u64At(mem, RingOffProd).Load()
	cons := u64At(mem, RingOffCons).Load()
	if prod-cons > slots {
		return nil, fmt.Errorf("shmem: AttachRing: producer index %d, consumer index %d, %d slots: %w", prod, cons, slots, ErrCorrupt)
	}
	return newRing(mem, slots, slotSize, prod, cons), nil
}

func newRing(mem []byte, slots, slotSize, prod, cons uint64) *Ring {
	end := RingHeaderBytes + int(slots*slotSize)
	return &Ring{
		data:      mem[RingHeaderBytes:end:end],
		slotSize:  int(slotSize),
		nslots:    slots,
		mask:      slots - 1,
		prodIdx:   u64At(mem, RingOffProd),
		consIdx:   u64At(mem, RingOffCons),
		consSleep: u32At(mem, RingOffConsSleep),
		prodSleep: u32At(mem, RingOffProdSleep),
		prod:      prod,
		prodCons:  cons,
		cons:      cons,
		consProd:  prod,
	}
}

// Slots returns the number of slots in the ring.
func (r *Ring) Slots() int { return int(r.nslots) }

// SlotSize returns the size of one slot in bytes.
func (r *Ring) SlotSize() int { return r.slotSize }

// Err returns nil while the ring is consistent, and an error wrapping
// ErrCorrupt once a corrupt index published by the peer has been seen.
func (r *Ring) Err() error {
	if e := r.err.Load(); e != nil {
		return e.err
	}
	return nil
}

func (r *Ring) corrupt(err error) {
	r.err.CompareAndSwap(nil, &ringErr{err})
}

// slot returns slot i (a free-running index). Masking keeps it in bounds
// whatever i is.
func (r *Ring) slot(i uint64) []byte {
	off := int(i&r.mask) * r.slotSize
	return r.data[off : off+r.slotSize : off+r.slotSize]
}

// SlotAt returns the slot of free-running index i, whatever it holds: a
// slot published, consumed or not yet filled. It lets a producer read back
// what it wrote when its consumer is gone (the verbs library flushes the
// work requests a dead appliance left).
func (r *Ring) SlotAt(i uint64) []byte { return r.slot(i) }

// Producer side.

// Free loads the consumer index and returns how many slots the producer may
// fill before the ring is full. It returns 0 if the ring is corrupt.
func (r *Ring) Free() int {
	if r.err.Load() != nil {
		return 0
	}
	c := r.consIdx.Load()
	// Valid consumer indices lie in [prodCons, prod]: the consumer neither
	// goes backwards nor passes the producer. Unsigned wrap-around turns
	// both violations into one comparison.
	if c-r.prodCons > r.prod-r.prodCons {
		r.corrupt(fmt.Errorf("shmem: consumer index %d outside [%d, %d]: %w", c, r.prodCons, r.prod, ErrCorrupt))
		return 0
	}
	r.prodCons = c
	return int(r.nslots - (r.prod - c))
}

// Reserve returns the next free slot, or nil if the ring is full or corrupt.
// The slot is published by Commit; until then Reserve returns the same slot.
func (r *Ring) Reserve() []byte {
	return r.ReserveAt(0)
}

// ReserveAt returns the i-th free slot after the next one (ReserveAt(0) is
// Reserve), or nil if fewer than i+1 slots are free or the ring is corrupt.
// Fill slots 0..k-1 and publish them together with CommitN(k).
func (r *Ring) ReserveAt(i int) []byte {
	if r.err.Load() != nil || i < 0 || uint64(i) >= r.nslots {
		return nil
	}
	if r.prod-r.prodCons+uint64(i) >= r.nslots && r.Free() <= i {
		return nil
	}
	return r.slot(r.prod + uint64(i))
}

// Commit publishes the reserved slot to the consumer. It reports whether the
// consumer had asked to be woken (see PrepareSleep), clearing that request;
// if so, the producer must ring the consumer's doorbell.
// Commit panics if no slot was reserved.
func (r *Ring) Commit() (wake bool) {
	return r.CommitN(1)
}

// CommitN publishes the next n reserved slots (n >= 0) in one step and, like
// Commit, reports whether the consumer must be woken. It panics if n exceeds
// the number of free slots the producer has seen (through Free, Reserve or
// ReserveAt), which would overwrite unread slots.
func (r *Ring) CommitN(n int) (wake bool) {
	if n < 0 || uint64(n) > r.nslots-(r.prod-r.prodCons) {
		panic("shmem: Ring.CommitN: more slots than are free")
	}
	if n == 0 {
		return false
	}
	r.prod += uint64(n)
	r.prodIdx.Store(r.prod)
	// The store above happens before this load (sequential consistency),
	// so a consumer that set the flag before our store is seen here, and one
	// that sets it after will see our store when it re-checks Len.
	return r.consSleep.Load() != 0 && r.consSleep.Swap(0) != 0
}

// PrepareSpaceWait tells the consumer that the producer is about to wait for
// free slots. After calling it the producer must re-check Free and call
// CancelSpaceWait instead of waiting if space has appeared.
func (r *Ring) PrepareSpaceWait() { r.prodSleep.Store(1) }

// CancelSpaceWait withdraws a PrepareSpaceWait.
func (r *Ring) CancelSpaceWait() { r.prodSleep.Store(0) }

// Consumer side.

// Len loads the producer index and returns the number of filled slots that
// have not been released. It returns 0 if the ring is corrupt.
func (r *Ring) Len() int {
	if r.err.Load() != nil {
		return 0
	}
	p := r.prodIdx.Load()
	// Valid producer indices lie in [consProd, cons+nslots].
	if p-r.consProd > r.cons+r.nslots-r.consProd {
		r.corrupt(fmt.Errorf("shmem: producer index %d outside [%d, %d]: %w", p, r.consProd, r.cons+r.nslots, ErrCorrupt))
		return 0
	}
	r.consProd = p
	return int(p - r.cons)
}

// Peek returns the next filled slot, or nil if the ring is empty or corrupt.
// The slot stays in the ring until Release; until then Peek returns it again.
func (r *Ring) Peek() []byte {
	return r.PeekAt(0)
}

// PeekAt returns the i-th filled slot after the next one (PeekAt(0) is Peek),
// or nil if fewer than i+1 slots are filled or the ring is corrupt. Release
// slots 0..k-1 together with ReleaseN(k).
func (r *Ring) PeekAt(i int) []byte {
	if r.err.Load() != nil || i < 0 || uint64(i) >= r.nslots {
		return nil
	}
	if r.consProd-r.cons <= uint64(i) && r.Len() <= i {
		return nil
	}
	return r.slot(r.cons + uint64(i))
}

// Release returns the slot Peek returned to the producer. It reports whether
// the producer had asked to be woken when space appears (see
// PrepareSpaceWait), clearing that request; if so, the consumer must ring the
// producer's doorbell. Release panics if no slot was filled.
func (r *Ring) Release() (wake bool) {
	return r.ReleaseN(1)
}

// ReleaseN releases the next n filled slots (n >= 0) in one step and, like
// Release, reports whether the producer must be woken. It panics if n exceeds
// the number of filled slots the consumer has seen (through Len, Peek or
// PeekAt).
func (r *Ring) ReleaseN(n int) (wake bool) {
	if n < 0 || uint64(n) > r.consProd-r.cons {
		panic("shmem: Ring.ReleaseN: more slots than are filled")
	}
	if n == 0 {
		return false
	}
	r.cons += uint64(n)
	r.consIdx.Store(r.cons)
	return r.prodSleep.Load() != 0 && r.prodSleep.Swap(0) != 0
}

// PrepareSleep tells the producer that the consumer is about to sleep. After
// calling it the consumer must re-check Len and call CancelSleep instead of
// sleeping if slots have appeared; otherwise the next Commit returns true
// and the producer rings the doorbell.
func (r *Ring) PrepareSleep() { r.consSleep.Store(1) }

// CancelSleep withdraws a PrepareSleep. A doorbell rung in between remains
// pending and causes one spurious wake-up later.
func (r *Ring) CancelSleep() { r.consSleep.Store(0) }
