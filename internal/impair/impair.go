// Package impair injects seeded faults into a port's frames: loss,
// duplication, reordering, single-bit corruption and a fixed delay, in the
// spirit of Linux netem, which the kernels taproce runs on often lack; and it
// models a bottleneck link behind them: a rate, a drop-tail queue of bytes
// and ECN marking at a threshold of queued bytes, as netem's rate, a bfifo
// and a RED queue's marking would together.
//
// A port passes every frame of one direction through one Impairer:
//
//	im := impair.New(spec)
//	im.Apply(frame, time.Now(), send) // for each frame
//	if due, ok := im.NextDue(); ok { /* arm a timer, then */ im.Flush(time.Now(), send) }
//
// Decisions come from a PCG generator seeded with Spec.Seed, so the same seed
// and the same frame sequence give the same drops, duplicates, swaps and bit
// flips on every run. The link adds no random decisions: for a given sequence
// of frames and times its pacing, drops and marks are fixed. Apply and Flush
// allocate nothing: frames held back are copied into buffers preallocated by
// New.
package impair

import (
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// Defaults and caps of Limits.
const (
	// DefaultHeldFrames is how many frames an Impairer holds back at most
	// unless Limits says otherwise.
	DefaultHeldFrames = 1024
	// DefaultHeldBytes is how many bytes of held frames an Impairer stores at
	// most unless Limits says otherwise.
	DefaultHeldBytes = 2 << 20
	// MaxHeldFrames caps Limits.Frames.
	MaxHeldFrames = 1 << 20
	// MaxHeldBytes caps Limits.Bytes.
	MaxHeldBytes = 1 << 30
	// MinReorderHold is the shortest time a frame held back for reordering
	// waits for a successor before Flush releases it on its own; the hold
	// limit is max(Spec.Delay, MinReorderHold).
	MinReorderHold = time.Millisecond
)

// seedStream is the second PCG seed word; the first is Spec.Seed.
const seedStream = 0x7461_7072_6f63_6521

// Limits bounds the memory an Impairer uses for frames it holds back
// (delayed, waiting to be reordered or waiting for the link). A frame that
// would be held when the limits are reached goes out at once, unheld, and is
// counted in Counters.Overflowed. Zero fields mean the defaults, which with a
// Spec.Rate grow to hold what the link can hold (see NewWithLimits).
type Limits struct {
	// Frames is the most frames held at once (default DefaultHeldFrames,
	// or enough for the link's bytes in minimal 60-byte frames; at most
	// MaxHeldFrames).
	Frames int
	// Bytes is the most bytes of held frames (default DefaultHeldBytes, or
	// the link's bytes when more; at most MaxHeldBytes). A frame longer
	// than this is never held.
	Bytes int
}

// Counters counts what an Impairer did. Every decision is counted when it is
// taken, so a frame held back is counted before it goes out.
type Counters struct {
	// Frames is the number of frames given to Apply.
	Frames uint64
	// Dropped is the number of frames lost.
	Dropped uint64
	// Duplicated is the number of frames emitted twice.
	Duplicated uint64
	// Reordered is the number of frames held back for reordering.
	Reordered uint64
	// Corrupted is the number of frames with one bit flipped.
	Corrupted uint64
	// Delayed is the number of frames held back for Spec.Delay.
	Delayed uint64
	// Overflowed is the number of frames that should have been held back
	// (delayed, reordered or paced by the link) but went out at once because
	// the Limits were reached.
	Overflowed uint64
	// QueueDropped is the number of frames the link's queue had no room for
	// (Spec.Queue), a duplicate counting as a frame of its own; Dropped
	// counts only the random loss, so that the two causes stay apart.
	QueueDropped uint64
	// Marked is the number of frames whose ECN field the link's queue set
	// from ECT(0) or ECT(1) to CE (Spec.ECN); a frame and its duplicate
	// count once.
	Marked uint64
}

// held is one frame held back, stored in the arena at [off, off+n).
type held struct {
	off, n int
	at     time.Time // when Apply took it
	due    time.Time // when Flush releases it
	flipAt int       // byte to corrupt on the way out, -1 for none
	flip   byte      // bit mask to XOR into byte flipAt
	dup    bool      // emit twice
	live   bool      // not yet emitted
}

// queue is a FIFO of held-slot indices.
type queue struct {
	idx     []int32
	head, n int
}

func (q *queue) push(i int) {
	q.idx[(q.head+q.n)%len(q.idx)] = int32(i)
	q.n++
}

func (q *queue) peek() (int, bool) {
	if q.n == 0 {
		return 0, false
	}
	return int(q.idx[q.head]), true
}

func (q *queue) pop() {
	q.head = (q.head + 1) % len(q.idx)
	q.n--
}

// Impairer impairs the frames of one direction of a port. Apply, Flush and
// NextDue must be called from one goroutine at a time; Counters may be called
// from any goroutine. A nil *Impairer passes every frame through unchanged.
type Impairer struct {
	spec Spec          // clamped into range
	hold time.Duration // reorder hold limit: max(Delay, MinReorderHold)
	rng  *rand.Rand

	// Held frames live in arena, a ring of bytes, described by slots, a ring
	// in the order the frames were stored. Frames leave in another order
	// (a reordered frame leaves after its successor), so a slot is marked
	// free when its frame leaves and the rings' tails advance over free slots.
	arena  []byte
	aHead  int // end of the most recently stored frame
	slots  []held
	sTail  int // oldest stored slot still live
	sCount int // slots from sTail up to the newest one, live or not

	delayed queue     // frames waiting for their due time, in emission order
	pending queue     // frames waiting for a successor to swap with, in arrival order
	lastDue time.Time // due time of the newest frame in delayed

	// The link (Spec.Rate > 0; see link.go) has sent everything it was
	// given by busyUntil + busyFrac/Rate ns, busyFrac < Rate, so that the
	// fractions of a nanosecond add up instead of being lost. linkAt is the
	// latest time the link has seen: it runs on that, so that a clock that
	// steps back neither refills the queue nor lets a frame overtake.
	queueLimit uint64 // Spec.QueueLimit
	busyUntil  time.Time
	busyFrac   uint64
	linkAt     time.Time

	frames, dropped, duplicated, reordered, corrupted, delayedN, overflowed atomic.Uint64
	queueDropped, marked                                                    atomic.Uint64
}

// New returns an Impairer for spec with the default Limits. Out-of-range
// fields of spec are clamped: probabilities into [0,1] (NaN counts as 0), a
// negative Delay to 0, Queue to MaxQueue, and Queue and ECN to 0 without a
// Rate. Seed 0 means seed 1.
func New(spec Spec) *Impairer {
	return NewWithLimits(spec, Limits{})
}

// NewWithLimits is New with explicit bounds on the frames held back. Buffers
// are allocated here, and only when spec holds frames (Spec.Holds). With a
// Rate, zero Limits grow to what the link holds at most, so that the model
// and not the storage decides what is dropped: the queue's limit, plus what
// the link sends during Delay, plus linkSlack, in frames of linkFrameBytes
// on average; both within MaxHeldBytes and MaxHeldFrames.
func NewWithLimits(spec Spec, lim Limits) *Impairer {
	spec.Loss = clampProbability(spec.Loss)
	spec.Duplicate = clampProbability(spec.Duplicate)
	spec.Reorder = clampProbability(spec.Reorder)
	spec.Corrupt = clampProbability(spec.Corrupt)
	spec.Delay = max(spec.Delay, 0)
	if spec.Rate == 0 {
		spec.Queue, spec.ECN = 0, 0
	}
	spec.Queue = min(spec.Queue, MaxQueue)
	seed := spec.Seed
	if seed == 0 {
		seed = 1
	}
	im := &Impairer{
		spec:       spec,
		hold:       max(spec.Delay, MinReorderHold),
		rng:        rand.New(rand.NewPCG(seed, seedStream)),
		queueLimit: spec.QueueLimit(),
	}
	if spec.Holds() {
		frames, bytes := lim.Frames, lim.Bytes
		link := linkBytes(spec)
		if frames <= 0 {
			frames = max(DefaultHeldFrames, link/linkFrameBytes)
		}
		if bytes <= 0 {
			bytes = max(DefaultHeldBytes, link)
		}
		frames = min(frames, MaxHeldFrames)
		bytes = min(bytes, MaxHeldBytes)
		im.arena = make([]byte, bytes)
		im.slots = make([]held, frames)
		im.delayed.idx = make([]int32, frames)
		im.pending.idx = make([]int32, frames)
	}
	return im
}

// Spec returns the Spec im applies, after clamping.
func (im *Impairer) Spec() Spec {
	if im == nil {
		return Spec{}
	}
	return im.spec
}

// Counters returns a snapshot of im's counters. It is safe to call from any
// goroutine, concurrently with Apply and Flush.
func (im *Impairer) Counters() Counters {
	if im == nil {
		return Counters{}
	}
	return Counters{
		Frames:     im.frames.Load(),
		Dropped:    im.dropped.Load(),
		Duplicated: im.duplicated.Load(),
		Reordered:  im.reordered.Load(),
		Corrupted:  im.corrupted.Load(),
		Delayed:    im.delayedN.Load(),
		Overflowed: im.overflowed.Load(),

		QueueDropped: im.queueDropped.Load(),
		Marked:       im.marked.Load(),
	}
}

// Apply takes one frame at time now and calls emit zero or more times with
// the frames to send now, in order: first the held frames that are due by
// now (as Flush would), then what becomes of frame.
//
// Each frame, independently, is dropped with probability Loss (and nothing
// else happens to it); otherwise one random bit of one random byte is flipped
// with probability Corrupt, it is emitted twice with probability Duplicate
// (the second copy uncorrupted, as netem does), and it is held back with
// probability Reorder until the next frame that goes out, so that the two
// swap, or until Flush finds it held longer than max(Delay, MinReorderHold).
// Frames held back in a row all follow that next frame, in their order.
// With Delay > 0 every frame is held until now+Delay, and a reordered frame
// takes the place right behind its successor in that delayed queue. A frame
// that finds the Limits reached is emitted at once instead of being held.
//
// With a Rate, what survives the faults above goes through the link (see
// link.go): it enters the queue, or is dropped when the queue has no room
// for it (Counters.QueueDropped), is marked CE when it finds ECN bytes or
// more queued ahead of it, and is held until the link has sent it, plus
// Delay. Frames leave in the order they entered. A duplicate enters right
// behind its original and takes the link's time too; both leave once the
// duplicate is sent, so the link never sends faster than Rate. Reordering
// happens before the link: a reordered frame waits for its successor and
// enters the queue right behind it, or on its own at the hold limit. A frame
// that finds the Limits reached goes out at once, neither marked nor taking
// the link's time.
//
// frame belongs to the caller: a frame held back is copied, and corruption
// flips the bit in place only for the duration of the emit call and flips it
// back afterwards, so frame is unchanged when Apply returns. emit's argument
// is valid only during the call, and emit must not call back into im.
// Apply allocates nothing.
func (im *Impairer) Apply(frame []byte, now time.Time, emit func([]byte)) {
	if im == nil {
		emit(frame)
		return
	}
	im.frames.Add(1)
	im.Flush(now, emit)
	s := &im.spec
	if s.Loss > 0 && im.rng.Float64() < s.Loss {
		im.dropped.Add(1)
		return
	}
	flipAt, flip := -1, byte(0)
	if s.Corrupt > 0 && im.rng.Float64() < s.Corrupt && len(frame) > 0 {
		flipAt = im.rng.IntN(len(frame))
		flip = 1 << im.rng.IntN(8)
		im.corrupted.Add(1)
	}
	dup := s.Duplicate > 0 && im.rng.Float64() < s.Duplicate
	if dup {
		im.duplicated.Add(1)
	}
	reorder := s.Reorder > 0 && im.rng.Float64() < s.Reorder
	if s.Rate > 0 {
		im.applyLink(frame, now, flipAt, flip, dup, reorder, emit)
		return
	}

	if reorder || s.Delay > 0 {
		i, ok := im.store(frame)
		if ok {
			h := &im.slots[i]
			h.at, h.flipAt, h.flip, h.dup = now, flipAt, flip, dup
			if s.Delay > 0 {
				im.delayedN.Add(1)
			}
			if reorder {
				im.reordered.Add(1)
				h.due = now.Add(im.hold)
				im.pending.push(i)
				return
			}
			im.enqueueDelayed(i, now.Add(s.Delay))
			im.releasePending(emit)
			return
		}
		im.overflowed.Add(1)
	}
	emitFrame(frame, flipAt, flip, dup, emit)
	im.releasePending(emit)
}

// Flush emits the held frames that are due by now, in order: delayed frames
// whose time has come and reordered frames held longer than
// max(Delay, MinReorderHold) without a successor. With a Rate such a
// reordered frame enters the link's queue at its hold limit instead, and
// goes out when the link has sent it. It allocates nothing.
func (im *Impairer) Flush(now time.Time, emit func([]byte)) {
	if im == nil {
		return
	}
	for {
		d, dok := im.delayed.peek()
		p, pok := im.pending.peek()
		dok = dok && !im.slots[d].due.After(now)
		pok = pok && !im.slots[p].due.After(now)
		switch {
		case dok && (!pok || !im.slots[p].due.Before(im.slots[d].due)):
			im.delayed.pop()
			im.emitHeld(d, emit)
		case pok:
			im.pending.pop()
			if im.spec.Rate > 0 {
				im.enterLink(p, im.linkTime(im.slots[p].due))
				continue
			}
			im.emitHeld(p, emit)
		default:
			return
		}
	}
}

// NextDue returns the earliest time at which Flush has work, and false when
// no frame is held.
func (im *Impairer) NextDue() (time.Time, bool) {
	if im == nil {
		return time.Time{}, false
	}
	d, dok := im.delayed.peek()
	p, pok := im.pending.peek()
	switch {
	case dok && pok:
		if im.slots[p].due.Before(im.slots[d].due) {
			return im.slots[p].due, true
		}
		return im.slots[d].due, true
	case dok:
		return im.slots[d].due, true
	case pok:
		return im.slots[p].due, true
	}
	return time.Time{}, false
}

// enqueueDelayed puts slot i at the end of the delayed queue, due at due or
// at the due time of the frame ahead of it, whichever is later, so that the
// queue stays in time order even if now goes backwards.
func (im *Impairer) enqueueDelayed(i int, due time.Time) {
	if due.Before(im.lastDue) {
		due = im.lastDue
	}
	im.slots[i].due = due
	im.lastDue = due
	im.delayed.push(i)
}

// releasePending lets the frames held for reordering follow the frame that
// just went out (or was queued): at once without Delay, right behind it in
// the delayed queue with Delay.
func (im *Impairer) releasePending(emit func([]byte)) {
	for {
		p, ok := im.pending.peek()
		if !ok {
			return
		}
		im.pending.pop()
		if im.spec.Delay > 0 {
			im.enqueueDelayed(p, im.slots[p].at.Add(im.spec.Delay))
			continue
		}
		im.emitHeld(p, emit)
	}
}

// emitHeld emits held frame i and frees its slot.
func (im *Impairer) emitHeld(i int, emit func([]byte)) {
	h := &im.slots[i]
	emitFrame(im.arena[h.off:h.off+h.n], h.flipAt, h.flip, h.dup, emit)
	im.free(i)
}

// emitFrame emits b, with bit flip of byte flipAt flipped when flipAt >= 0,
// then again uncorrupted when dup. b is left as it was.
func emitFrame(b []byte, flipAt int, flip byte, dup bool, emit func([]byte)) {
	if flipAt >= 0 && flipAt < len(b) {
		b[flipAt] ^= flip
		emit(b)
		b[flipAt] ^= flip
	} else {
		emit(b)
	}
	if dup {
		emit(b)
	}
}

// store copies frame into a free slot and returns the slot's index, or false
// when the Limits leave no room.
func (im *Impairer) store(frame []byte) (int, bool) {
	n := len(frame)
	if im.sCount == len(im.slots) || n > len(im.arena) {
		return 0, false
	}
	off, ok := im.alloc(n)
	if !ok {
		return 0, false
	}
	i := (im.sTail + im.sCount) % len(im.slots)
	im.sCount++
	copy(im.arena[off:off+n], frame)
	im.slots[i] = held{off: off, n: n, live: true}
	im.aHead = off + n
	return i, true
}

// alloc finds n contiguous free bytes in the arena ring. The live bytes run
// from the oldest live slot's offset t up to aHead, wrapping around the end
// when aHead < t. A wrapped ring never fills up to t exactly, so that
// aHead == t always means "not wrapped".
func (im *Impairer) alloc(n int) (int, bool) {
	if im.sCount == 0 {
		return 0, true // n <= len(arena) checked by store
	}
	t := im.slots[im.sTail].off
	if im.aHead >= t {
		if n <= len(im.arena)-im.aHead {
			return im.aHead, true
		}
		if n < t {
			return 0, true
		}
		return 0, false
	}
	if n < t-im.aHead {
		return im.aHead, true
	}
	return 0, false
}

// free marks slot i free and advances the tails over free slots.
func (im *Impairer) free(i int) {
	im.slots[i].live = false
	for im.sCount > 0 && !im.slots[im.sTail].live {
		im.sTail = (im.sTail + 1) % len(im.slots)
		im.sCount--
	}
	if im.sCount == 0 {
		im.sTail, im.aHead = 0, 0
	}
}
