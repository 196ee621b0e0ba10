package spin

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
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
// from one goroutine; one removed is no longer called once remove returns.
func TestLoopPolls(t *testing.T) {
	l := NewLoop()
	runLoop(t, l)
	var a, b atomic.Int64
	var inside atomic.Int32 // poll functions running at once
	var overlap atomic.Bool
	poll := func(n *atomic.Int64, busy bool) func() bool {
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
		t.Error("two poll functions ran at once")
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
	done := make(chan struct{})
	go func() { remove(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("remove waited for a loop that does not run")
	}
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
	var sp Spinner
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
	var sp Spinner
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
