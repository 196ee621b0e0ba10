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
// Add may be called from any goroutine, and remove from any but the
// loop's own, whose pass remove may wait for; Run runs the loop.
type Loop struct {
	mu   sync.Mutex // serialises Add and remove
	list atomic.Pointer[[]*loopEntry]
	// pass is odd while a pass holds the list, even between passes: a
	// remove that finds it even has nothing to wait for, one that finds
	// it odd waits until it changes.
	pass atomic.Uint64
	wake chan struct{} // Add's nudge for a Run that has nothing to poll
	rest atomic.Int64  // ns an idle pass sleeps; 0: it only gives way
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
	l.mu.Unlock()
	// A pass under way may hold the old list; one begun from now on does
	// not.
	started := l.pass.Load()
	if started%2 == 0 {
		return
	}
	for l.pass.Load() == started {
		time.Sleep(10 * time.Microsecond)
	}
}

// Run polls until ctx ends. Only one Run may run at a time.
func (l *Loop) Run(ctx context.Context) {
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
	l.pass.Add(1) // odd: this pass holds the list
	list := *l.list.Load()
	busy := false
	for _, e := range list {
		if e.poll() {
			busy = true
		}
	}
	l.pass.Add(1) // even again
	if len(list) == 0 {
		return false
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
