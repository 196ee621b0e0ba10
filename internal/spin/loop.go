package spin

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// A Loop busy-polls many sources from one goroutine: a spinning
// appliance's TAP readers and its clients' rings. Each pass calls every
// poll function once; a pass that finds no work gives way (Spinner.Idle).
//
// One goroutine for all of them, where each source could spin on its own,
// is what lets a spinning process have more processors than spinners: the
// loop takes one, and the others are left to the work that sleeps until
// there is some (a port's writer, the kernel's side of the writes, the
// clients). Goroutines that each spin take every processor GOMAXPROCS
// gives them.
//
// Add and its remove function may be called from any goroutine but the
// loop's own (remove waits for the loop's pass to end); Run runs the loop.
type Loop struct {
	mu      sync.Mutex // serialises Add, remove and the end of Run
	list    atomic.Pointer[[]*loopEntry]
	pass    atomic.Uint64 // incremented as each pass begins
	running bool          // Run is in its loop; under mu
	wake    chan struct{} // Add's nudge for a Run that has nothing to poll
	rest    atomic.Int64  // ns an idle pass sleeps; 0: it only gives way
}

// SetRest makes every pass that finds no work sleep for d, so that the
// loop leaves the processors to others while latency does not matter
// (a benchmark's baseline); 0, the default, only gives way (Spinner.Idle).
func (l *Loop) SetRest(d time.Duration) { l.rest.Store(int64(d)) }

type loopEntry struct {
	poll func() bool
}

// NewLoop returns a loop with nothing to poll; Run runs it.
func NewLoop() *Loop {
	l := &Loop{wake: make(chan struct{}, 1)}
	l.list.Store(&[]*loopEntry{})
	return l
}

// Add makes poll part of every pass until remove is called. poll reports
// whether it found work; it must not block. Once remove returns, poll is
// not running and is not called again.
func (l *Loop) Add(poll func() bool) (remove func()) {
	e := &loopEntry{poll: poll}
	l.mu.Lock()
	old := *l.list.Load()
	next := make([]*loopEntry, len(old), len(old)+1)
	copy(next, old)
	next = append(next, e)
	l.list.Store(&next)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	var once sync.Once
	return func() { once.Do(func() { l.remove(e) }) }
}

// remove takes e out of the list and waits until no pass that may still
// call it is under way.
func (l *Loop) remove(e *loopEntry) {
	l.mu.Lock()
	old := *l.list.Load()
	next := make([]*loopEntry, 0, len(old))
	for _, x := range old {
		if x != e {
			next = append(next, x)
		}
	}
	l.list.Store(&next)
	running := l.running
	started := l.pass.Load()
	l.mu.Unlock()
	if !running {
		return
	}
	// The pass under way may hold the old list; the next one does not.
	for l.pass.Load() == started {
		l.mu.Lock()
		running = l.running
		l.mu.Unlock()
		if !running {
			return
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// Run polls until ctx ends. Only one Run may run at a time.
func (l *Loop) Run(ctx context.Context) {
	l.mu.Lock()
	l.running = true
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.running = false
		l.mu.Unlock()
	}()
	var sp Spinner
	for ctx.Err() == nil {
		if !l.passOnce(&sp) {
			// Nothing to poll: sleep until something is added.
			select {
			case <-l.wake:
			case <-ctx.Done():
			}
		}
	}
}

// passOnce is one pass: every poll function once, then, when none found
// work, a rest or Spinner.Idle. It reports false when there was nothing to
// poll.
func (l *Loop) passOnce(sp *Spinner) bool {
	l.pass.Add(1)
	list := *l.list.Load()
	if len(list) == 0 {
		return false
	}
	busy := false
	for _, e := range list {
		if e.poll() {
			busy = true
		}
	}
	if !busy {
		if d := l.rest.Load(); d > 0 {
			time.Sleep(time.Duration(d))
		} else {
			sp.Idle()
		}
	}
	return true
}
