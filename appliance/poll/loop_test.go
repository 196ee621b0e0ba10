package poll

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/internal/spin"
)

// runLoop runs l until the test ends.
func runLoop(t *testing.T, l *Loop) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
}

// promptly runs f and fails the test with what if f takes more than a
// few seconds.
func promptly(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal(what)
	}
}

// eventually waits until cond holds, failing the test after a while.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLoopPolls: every poll function added is called, again and again,
// never by two goroutines at once (the helper may run another meanwhile);
// one removed is no longer called once remove returns.
func TestLoopPolls(t *testing.T) {
	l := NewLoop()
	runLoop(t, l)
	var a, b atomic.Int64
	var overlap atomic.Bool
	poll := func(n *atomic.Int64, busy bool) func() bool {
		var inside atomic.Int32 // goroutines running this poll function
		return func() bool {
			if inside.Add(1) > 1 {
				overlap.Store(true)
			}
			n.Add(1)
			inside.Add(-1)
			return busy
		}
	}
	removeA := l.Add(poll(&a, true))
	removeB := l.Add(poll(&b, false))
	eventually(t, "both polled 100 times", func() bool { return a.Load() >= 100 && b.Load() >= 100 })
	if overlap.Load() {
		t.Error("a poll function ran in two goroutines at once")
	}
	removeA()
	n := a.Load()
	time.Sleep(10 * time.Millisecond)
	if got := a.Load(); got != n {
		t.Errorf("a removed poll function was called %d more times", got-n)
	}
	m := b.Load()
	eventually(t, "the other one still polled", func() bool { return b.Load() > m+10 })
	removeA() // a second call does nothing
	removeB()
}

// TestLoopSleepsWhenEmpty: with nothing to poll the loop makes no passes
// until something is added.
func TestLoopSleepsWhenEmpty(t *testing.T) {
	l := NewLoop()
	runLoop(t, l)
	time.Sleep(5 * time.Millisecond)
	before := l.pass.Load()
	time.Sleep(20 * time.Millisecond)
	if d := l.pass.Load() - before; d > 0 {
		t.Errorf("%d passes with nothing to poll", d)
	}
	var n atomic.Int64
	remove := l.Add(func() bool { n.Add(1); return false })
	eventually(t, "polled after Add", func() bool { return n.Load() > 0 })
	remove()
}

// TestLoopRest: while SetRest is on, a pass that finds nothing sleeps, so
// the loop makes few passes; after SetRest(0) it spins again.
func TestLoopRest(t *testing.T) {
	l := NewLoop()
	runLoop(t, l)
	var n atomic.Int64
	defer l.Add(func() bool { n.Add(1); return false })()
	eventually(t, "polled", func() bool { return n.Load() > 0 })
	l.SetRest(10 * time.Millisecond)
	time.Sleep(15 * time.Millisecond) // a pass begun before may end first
	before := n.Load()
	time.Sleep(50 * time.Millisecond)
	if d := n.Load() - before; d > 8 {
		t.Errorf("%d passes in 50 ms resting 10 ms each", d)
	}
	l.SetRest(0)
	before = n.Load()
	eventually(t, "spinning again", func() bool { return n.Load() > before+100 })
}

// TestLoopRemoveStopped: remove returns at once when the loop is not
// running, and Add before Run is polled once it runs.
func TestLoopRemoveStopped(t *testing.T) {
	l := NewLoop()
	var n atomic.Int64
	remove := l.Add(func() bool { n.Add(1); return false })
	promptly(t, "remove waited for a loop that does not run", remove)
	l.Add(func() bool { n.Add(1); return false })
	runLoop(t, l)
	eventually(t, "polled once running", func() bool { return n.Load() > 0 })
}

// TestLoopPassAllocs: a pass allocates nothing.
func TestLoopPassAllocs(t *testing.T) {
	l := NewLoop()
	busy := true
	l.Add(func() bool { return busy })
	l.Add(func() bool { return false })
	var sp spin.Spinner
	if n := testing.AllocsPerRun(100, func() { l.passOnce(&sp) }); n != 0 {
		t.Errorf("a busy pass: %v allocations", n)
	}
	busy = false
	if n := testing.AllocsPerRun(100, func() { l.passOnce(&sp) }); n != 0 {
		t.Errorf("an idle pass: %v allocations", n)
	}
}

// BenchmarkLoopPass is the cost of a pass over eight sources that find
// nothing, without the pause that follows (what the loop spends per pass
// besides its sources' reads).
func BenchmarkLoopPass(b *testing.B) {
	l := NewLoop()
	var n int
	for range 8 {
		l.Add(func() bool { n++; return n%2 == 0 })
	}
	var sp spin.Spinner
	for b.Loop() {
		l.passOnce(&sp)
	}
}

// TestLoopAddRemoveRace: adding and removing the only poll function over
// and over, while the loop runs, never leaves remove waiting for a pass
// that does not come (the loop asleep for want of anything to poll).
func TestLoopAddRemoveRace(t *testing.T) {
	l := NewLoop()
	runLoop(t, l)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 20000 {
			l.Add(func() bool { return false })()
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("remove hung")
	}
}

// newBlocking returns a blocking loop, closed when the test ends (after
// runLoop's cleanup, registered later, has stopped it).
func newBlocking(t *testing.T) *Loop {
	t.Helper()
	l, err := NewBlockingLoop()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	return l
}

// pipeSource is a source a blocking loop sleeps on: a pipe whose every
// byte is one piece of work.
type pipeSource struct {
	r, w   int
	polls  atomic.Int64
	works  atomic.Int64
	arms   atomic.Int64
	rung   atomic.Int64 // Disarm told the descriptor was readable
	inside atomic.Int32
	racing atomic.Bool // polled by two goroutines at once
}

func newPipeSource(t *testing.T) *pipeSource {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return &pipeSource{r: p[0], w: p[1]}
}

func (s *pipeSource) poll() bool {
	if s.inside.Add(1) > 1 {
		s.racing.Store(true)
	}
	defer s.inside.Add(-1)
	s.polls.Add(1)
	var b [1]byte
	if n, _ := unix.Read(s.r, b[:]); n == 1 {
		s.works.Add(1)
		return true
	}
	return false
}

func (s *pipeSource) put(t *testing.T) {
	t.Helper()
	if _, err := unix.Write(s.w, []byte{1}); err != nil {
		t.Fatal(err)
	}
}

// settled waits until n stops moving for 10 ms: the loop sleeps.
func settled(t *testing.T, what string, n *atomic.Uint64) {
	t.Helper()
	eventually(t, what, func() bool {
		before := n.Load()
		time.Sleep(10 * time.Millisecond)
		return n.Load() == before
	})
}

// TestBlockingLoopSleeps: a blocking loop with nothing to do makes no
// passes; a byte in a source's pipe wakes it, the source is polled and
// finds it, and Disarm learns that the descriptor was readable. A pass
// after a sleep skips the sources without Arm whose descriptors were not
// readable.
func TestBlockingLoopSleeps(t *testing.T) {
	l := newBlocking(t)
	a, b := newPipeSource(t), newPipeSource(t)
	defer l.AddSleeper(a.poll, Sleeper{Fd: a.r, Arm: func() bool { a.arms.Add(1); return true },
		Disarm: func(rung bool) {
			if rung {
				a.rung.Add(1)
			}
		}})()
	defer l.AddSleeper(b.poll, Sleeper{Fd: b.r})()
	runLoop(t, l)
	settled(t, "the loop sleeps", &l.pass)
	for i := range 3 {
		pa, pb, arms := a.polls.Load(), b.polls.Load(), a.arms.Load()
		rung := a.rung.Load()
		a.put(t)
		eventually(t, "the work is found", func() bool { return a.works.Load() == int64(i+1) })
		settled(t, "the loop sleeps again", &l.pass)
		// One pass finds the work, the next finds nothing and sleeps.
		if d := a.polls.Load() - pa; d != 2 {
			t.Errorf("round %d: the source with work polled %d times, want 2", i, d)
		}
		// b, not readable when the loop woke, waits for the second pass.
		if d := b.polls.Load() - pb; d != 1 {
			t.Errorf("round %d: the quiet source polled %d times, want 1", i, d)
		}
		if d := a.arms.Load() - arms; d != 1 {
			t.Errorf("round %d: armed %d times, want 1", i, d)
		}
		if a.rung.Load() != rung+1 {
			t.Errorf("round %d: Disarm not told the descriptor was readable", i)
		}
	}
}

// TestBlockingLoopArmRefuses: while a source's Arm reports work, the loop
// does not sleep, and every Arm is matched by a Disarm.
func TestBlockingLoopArmRefuses(t *testing.T) {
	l := newBlocking(t)
	s := newPipeSource(t)
	var refuse atomic.Bool
	refuse.Store(true)
	var arms, disarms atomic.Int64
	defer l.AddSleeper(s.poll, Sleeper{Fd: s.r,
		Arm:    func() bool { arms.Add(1); return !refuse.Load() },
		Disarm: func(bool) { disarms.Add(1) }})()
	runLoop(t, l)
	before := l.pass.Load()
	time.Sleep(20 * time.Millisecond)
	if d := l.pass.Load() - before; d < 100 {
		t.Errorf("%d passes in 20 ms while Arm refused", d)
	}
	refuse.Store(false)
	settled(t, "the loop sleeps once Arm agrees", &l.pass)
	if arms.Load() != disarms.Load()+1 { // the last one sleeps armed
		t.Errorf("%d arms, %d disarms", arms.Load(), disarms.Load())
	}
}

// TestBlockingLoopHold: while a hold is pending the loop polls instead of
// sleeping; once it is due the loop flushes it, on its goroutine, and
// sleeps.
func TestBlockingLoopHold(t *testing.T) {
	l := newBlocking(t)
	s := newPipeSource(t)
	defer l.AddSleeper(s.poll, Sleeper{Fd: s.r})()
	var due atomic.Int64
	var flushes atomic.Int64
	remove := l.AddHold(due.Load, func() {
		if time.Now().UnixNano() < due.Load() {
			t.Error("flushed before due")
		}
		due.Store(0)
		flushes.Add(1)
	})
	defer remove()
	runLoop(t, l)
	settled(t, "the loop sleeps", &l.pass)
	// Due long after the test would fail: until then the loop must go on
	// polling the quiet source, which a sleeping loop would not.
	due.Store(time.Now().Add(time.Hour).UnixNano())
	s.put(t) // wakes the loop, which now sees the hold
	eventually(t, "polled", func() bool { return s.works.Load() == 1 })
	p := s.polls.Load()
	eventually(t, "ten polls while the hold is pending", func() bool { return s.polls.Load()-p >= 10 })
	if flushes.Load() != 0 {
		t.Fatal("flushed an hour early")
	}
	due.Store(time.Now().UnixNano())
	eventually(t, "flushed", func() bool { return flushes.Load() == 1 })
	settled(t, "the loop sleeps after the flush", &l.pass)
	remove()
	remove() // a second call does nothing
}

// TestBlockingLoopHoldBegunBeforeSleep: a hold begun after the pass
// looked, with no kick — as the helper begins one when the message it
// polled from a source waits for company — keeps the loop from sleeping:
// nothing else would wake it until the peer retransmits.
func TestBlockingLoopHoldBegunBeforeSleep(t *testing.T) {
	l := newBlocking(t)
	s := newPipeSource(t)
	defer l.AddSleeper(s.poll, Sleeper{Fd: s.r})()
	var due atomic.Int64
	defer l.AddHold(due.Load, func() { due.Store(0) })()
	list := *l.list.Load()
	// The first sleep takes the kicks of AddSleeper and AddHold.
	promptly(t, "the loop slept through its kicks", func() { l.sleep(list) })
	due.Store(time.Now().Add(time.Hour).UnixNano())
	promptly(t, "the loop slept with a hold pending", func() { l.sleep(list) })
	for _, e := range list {
		if e.state.Load() != entryIdle {
			t.Error("a source is still held after sleep")
		}
	}
}

// TestBlockingLoopRemoveWhileSleeping: remove returns at once while the
// loop sleeps holding the source, and the loop goes on with the others.
func TestBlockingLoopRemoveWhileSleeping(t *testing.T) {
	l := newBlocking(t)
	a, b := newPipeSource(t), newPipeSource(t)
	removeA := l.AddSleeper(a.poll, Sleeper{Fd: a.r})
	defer l.AddSleeper(b.poll, Sleeper{Fd: b.r})()
	runLoop(t, l)
	settled(t, "the loop sleeps", &l.pass)
	promptly(t, "remove waited for a sleeping loop", removeA)
	pa := a.polls.Load()
	b.put(t)
	eventually(t, "the other source still works", func() bool { return b.works.Load() == 1 })
	if a.polls.Load() != pa {
		t.Error("a removed source was polled")
	}
}

// TestLoopHelper: in both kinds of loop, work in two sources at once
// brings the helper: both sources are polled at the same time, each never
// by two goroutines at once; once the work is done the helper stops.
func TestLoopHelper(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("the helper needs a second processor (GOMAXPROCS)")
	}
	t.Run("spinning", func(t *testing.T) { testHelper(t, NewLoop()) })
	t.Run("blocking", func(t *testing.T) { testHelper(t, newBlocking(t)) })
}

func testHelper(t *testing.T, l *Loop) {
	var inside, most atomic.Int32
	type src struct {
		left   atomic.Int64
		inside atomic.Int32
		racing atomic.Bool
	}
	var srcs [2]src
	for i := range srcs {
		s := &srcs[i]
		s.left.Store(2000)
		defer l.Add(func() bool {
			if s.inside.Add(1) > 1 {
				s.racing.Store(true)
			}
			n := inside.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			busy := s.left.Add(-1) >= 0
			if busy {
				time.Sleep(20 * time.Microsecond) // work that takes a while
			}
			inside.Add(-1)
			s.inside.Add(-1)
			return busy
		})()
	}
	runLoop(t, l)
	eventually(t, "the work is done", func() bool { return srcs[0].left.Load() < 0 && srcs[1].left.Load() < 0 })
	if most.Load() < 2 {
		t.Error("the two sources were never polled at once: no helper")
	}
	for i := range srcs {
		if srcs[i].racing.Load() {
			t.Errorf("source %d polled by two goroutines at once", i)
		}
	}
	eventually(t, "the helper stops", func() bool { return !l.helping.Load() })
}

// TestBlockingLoopLinger: a lingering loop polls for a while after its
// last work before it sleeps.
func TestBlockingLoopLinger(t *testing.T) {
	l := newBlocking(t)
	// Long enough that even a loaded machine lets it poll ten times
	// meanwhile, short enough for the test to see it end.
	l.SetLinger(2 * time.Second)
	s := newPipeSource(t)
	defer l.AddSleeper(s.poll, Sleeper{Fd: s.r})()
	runLoop(t, l)
	settled(t, "the loop sleeps", &l.pass)
	s.put(t)
	eventually(t, "polled", func() bool { return s.works.Load() == 1 })
	p := s.polls.Load()
	eventually(t, "ten polls while lingering", func() bool { return s.polls.Load()-p >= 10 })
	settled(t, "the loop sleeps after lingering", &l.pass)
}

// TestBlockingLoopNoDescriptor: a source added without a Sleeper is
// polled about every millisecond while the loop sleeps.
func TestBlockingLoopNoDescriptor(t *testing.T) {
	l := newBlocking(t)
	var n atomic.Int64
	defer l.Add(func() bool { n.Add(1); return false })()
	runLoop(t, l)
	eventually(t, "polled", func() bool { return n.Load() > 0 })
	before, start := n.Load(), time.Now()
	// Polled again and again while it sleeps...
	eventually(t, "five more polls", func() bool { return n.Load()-before >= 5 })
	// ...but about once a millisecond, not spinning: a few each
	// millisecond at most, however the machine is loaded.
	time.Sleep(20 * time.Millisecond)
	d, ms := n.Load()-before, time.Since(start).Milliseconds()
	if d > 10*(ms+1) {
		t.Errorf("%d polls in %d ms, want about one a millisecond", d, ms)
	}
}

// TestBlockingLoopSleeperWithoutDescriptor: a source with no descriptor
// (Fd -1, as the local switch's queue of a NIC) lets the loop sleep once
// Arm agrees — it is not polled every millisecond as a source without a
// Sleeper is — and its producer's Wake after Arm wakes the loop, which
// finds the work in its next pass.
func TestBlockingLoopSleeperWithoutDescriptor(t *testing.T) {
	l := newBlocking(t)
	var mu sync.Mutex
	var queued, armed bool
	var polls, works atomic.Int64
	defer l.AddSleeper(func() bool {
		polls.Add(1)
		mu.Lock()
		defer mu.Unlock()
		if !queued {
			return false
		}
		queued = false
		works.Add(1)
		return true
	}, Sleeper{Fd: -1,
		Arm: func() bool {
			mu.Lock()
			defer mu.Unlock()
			armed = !queued
			return armed
		},
		Disarm: func(bool) { mu.Lock(); armed = false; mu.Unlock() }})()
	runLoop(t, l)
	settled(t, "the loop sleeps", &l.pass)
	before := polls.Load()
	time.Sleep(20 * time.Millisecond)
	if d := polls.Load() - before; d != 0 {
		t.Errorf("polled %d times in 20 ms of sleep", d)
	}
	for i := range 3 {
		mu.Lock()
		queued = true
		wake := armed
		mu.Unlock()
		if !wake {
			t.Fatalf("round %d: the loop sleeps unarmed", i)
		}
		l.Wake()
		eventually(t, "the work is found", func() bool { return works.Load() == int64(i+1) })
		settled(t, "the loop sleeps again", &l.pass)
	}
}

// TestLoopCostly: while the passes find work, a costly source whose last
// poll found nothing is polled every costlyEvery-th pass only; once they
// find none, at every pass again; and one that found work is polled at
// every pass.
func TestLoopCostly(t *testing.T) {
	for _, blocking := range []bool{false, true} {
		l := NewLoop()
		if blocking {
			l = newBlocking(t)
		}
		var work, frames atomic.Bool
		var polls atomic.Int64
		work.Store(true)
		l.Add(func() bool { return work.Load() })
		l.AddSleeper(func() bool { polls.Add(1); return frames.Load() }, Sleeper{Fd: -1, Costly: true})
		var sp spin.Spinner
		passes := func(n int) int64 {
			before := polls.Load()
			for range n {
				l.passOnce(&sp)
			}
			return polls.Load() - before
		}
		passes(1) // the first pass polls it: now it has found nothing
		if got := passes(8 * costlyEvery); got != 8 {
			t.Errorf("blocking %v: busy passes polled the empty costly source %d times in %d, want 8", blocking, got, 8*costlyEvery)
		}
		frames.Store(true)
		passes(costlyEvery) // it finds work at its next poll
		if got := passes(16); got != 16 {
			t.Errorf("blocking %v: a costly source with work polled %d times in 16 passes", blocking, got)
		}
		frames.Store(false)
		work.Store(false)
		passes(2)
		if got := passes(16); got != 16 && !blocking {
			t.Errorf("idle passes polled the costly source %d times in 16", got)
		}
	}
}

// TestBlockingLoopSleepAllocs: a pass that sleeps (here, on a descriptor
// that is readable at once) allocates nothing.
func TestBlockingLoopSleepAllocs(t *testing.T) {
	l := newBlocking(t)
	s := newPipeSource(t)
	s.put(t) // never read: the descriptor stays readable
	l.AddSleeper(func() bool { return false }, Sleeper{Fd: s.r, Arm: func() bool { return true }, Disarm: func(bool) {}})
	var sp spin.Spinner
	if n := testing.AllocsPerRun(100, func() { l.passOnce(&sp) }); n != 0 {
		t.Errorf("a sleeping pass: %v allocations", n)
	}
}
