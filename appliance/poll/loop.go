package poll

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/internal/spin"
)

// A Loop polls many sources from one goroutine: an appliance's TAP readers
// and its clients' rings. Each pass calls every poll function once. What a
// pass that finds no work does depends on the kind of loop:
//
//   - A spinning loop (NewLoop) gives way (spin.Spinner.Idle) and polls again.
//     One goroutine for all sources, where each could spin on its own, is
//     what lets a spinning process have more processors than spinners: the
//     loop takes one, and the others are left to the work that sleeps
//     until there is some (a port's writer, the kernel's side of the
//     writes, the clients).
//   - A blocking loop (NewBlockingLoop) sleeps in one ppoll(2) on every
//     source's descriptor (Sleeper), after lingering as long as SetLinger
//     says. A client's doorbell or a TAP's frame then wakes the thread
//     that does the work, marked synchronous, which puts it on the
//     waker's processor; and the frame a port writes to another port of
//     the same host is read by the same pass that wrote it, with no
//     wakeup at all.
//
// In both kinds a second goroutine (the helper) joins the passes while
// they keep finding work (helpAfter, spinHelpAfter passes in a row) and
// the process has more than one processor (GOMAXPROCS), so that a stream
// uses two; it sleeps again once its passes find nothing for a while.
//
// Each source is polled by one goroutine at a time. Add and AddSleeper may
// be called from any goroutine, and remove from any but the loop's own
// (the one of its poll functions), whose poll remove may wait for; Run
// runs the loop.
type Loop struct {
	mu   sync.Mutex // serialises Add and remove
	list atomic.Pointer[[]*loopEntry]
	pass atomic.Uint64 // passes begun by Run
	wake chan struct{} // Add's nudge for a Run that has nothing to poll
	rest atomic.Int64  // ns an idle pass of a spinning loop sleeps; 0: it only gives way

	// A blocking loop's: its eventfd, which Add, remove, AddHold and the
	// end of Run write to wake it; how long it lingers; its holds; what
	// one sleep uses, made once. And for both kinds: how many passes in a
	// row found work, and GOMAXPROCS.
	blocking bool
	emu      sync.RWMutex // held shared to write efd, exclusively to close it
	efd      int
	linger   atomic.Int64
	hmu      sync.Mutex
	holds    []*hold
	nholds   atomic.Int32
	pfds     []unix.PollFd
	held     []*loopEntry
	armed    int
	ts       unix.Timespec
	lastWork time.Time
	streak   int // passes in a row that found work
	procs    int // GOMAXPROCS, as last looked at
	// helping is set while the helper makes passes; helpWake starts it.
	helping  atomic.Bool
	helpWake chan struct{}
}

// A Sleeper says how a blocking loop sleeps on one source: until Fd is
// readable. Arm, when set, is called first and reports whether the loop
// may sleep — it tells the source's producers to wake the loop, and
// reports false when work came meanwhile; Disarm, when set, is called
// once the loop is awake, or when another source's Arm said no, with
// rung true when Fd was found readable (or the loop did not sleep).
//
// A source with no Arm is one whose descriptor is the only sign of work
// (a TAP): after a sleep that found it not readable, the next pass does
// not poll it. A negative Fd is none: such a source's producers wake the
// loop with Wake once Arm has told them to.
//
// Costly marks a source whose poll costs a system call when it finds
// nothing (a TAP's read): while the loop's passes keep finding work
// elsewhere, such a source whose last poll found nothing is polled only
// every costlyEvery passes, in a spinning loop too. An idle pass polls
// it as every other source.
type Sleeper struct {
	Fd     int
	Arm    func() bool
	Disarm func(rung bool)
	Costly bool
}

// entry states: polled or held by one goroutine, or removed for good.
const (
	entryIdle int32 = iota
	entryBusy
	entryRemoved
)

type loopEntry struct {
	poll  func() bool
	sl    *Sleeper
	state atomic.Int32
	quiet bool        // the last sleep found the descriptor not readable (owner: Run's goroutine)
	empty atomic.Bool // the last poll found nothing
}

// skip reports whether a pass that follows passes with work (busy) skips
// e: a costly source whose last poll found nothing, except on every
// costlyEvery-th pass.
func (e *loopEntry) skip(busy bool, pass uint64) bool {
	return busy && e.sl != nil && e.sl.Costly && pass%costlyEvery != 0 && e.empty.Load()
}

// costlyEvery is how often a busy loop polls a costly source that found
// nothing (Sleeper.Costly). With the local switch's traffic between two
// clients, the appliance's loop and helper read both ports' empty TAPs at
// every pass: 1 MiB WRITEs moved at 15.8 GB/s blocking and 20.2 spinning
// (the median of six runs in a kept lab), against 19.3 and 24.3 polling
// them every eighth pass, and spinning send_lat took 13.4 µs against 9.5
// (docs/performance-log.md, costly sources).
const costlyEvery = 8

// A hold is work held back for company until a deadline (AddHold).
type hold struct {
	due   func() int64
	flush func()
}

// NewLoop returns a spinning loop with nothing to poll; Run runs it.
func NewLoop() *Loop {
	l := &Loop{wake: make(chan struct{}, 1), efd: -1, helpWake: make(chan struct{}, 1)}
	l.list.Store(&[]*loopEntry{})
	return l
}

// NewBlockingLoop returns a blocking loop with nothing to poll; Run runs
// it, Close releases its descriptor once it no longer runs.
func NewBlockingLoop() (*Loop, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("poll: blocking loop: eventfd: %w", err)
	}
	l := NewLoop()
	l.blocking, l.efd = true, fd
	return l, nil
}

// Blocking reports whether l is a blocking loop; a nil Loop is not.
func (l *Loop) Blocking() bool { return l != nil && l.blocking }

// Close releases a blocking loop's descriptor. Call it once Run has
// returned and every source is removed.
func (l *Loop) Close() error {
	l.emu.Lock()
	defer l.emu.Unlock()
	if l.efd < 0 {
		return nil
	}
	err := unix.Close(l.efd)
	l.efd = -1
	return err
}

// SetRest makes every pass of a spinning loop that finds no work sleep for
// d, so that the loop leaves the processors to others while latency does
// not matter (a benchmark's baseline); 0, the default, only gives way
// (spin.Spinner.Idle).
func (l *Loop) SetRest(d time.Duration) { l.rest.Store(int64(d)) }

// SetLinger makes a blocking loop keep polling, giving way between passes,
// for d after the last pass that found work before it sleeps; 0, the
// default, sleeps at once.
func (l *Loop) SetLinger(d time.Duration) { l.linger.Store(int64(d)) }

// kick wakes a sleeping blocking loop.
func (l *Loop) kick() {
	if !l.blocking {
		return
	}
	l.emu.RLock()
	defer l.emu.RUnlock()
	if l.efd >= 0 {
		one := [8]byte{1}
		_, _ = unix.Write(l.efd, one[:])
	}
}

// Wake wakes a sleeping blocking loop for work that reached it otherwise
// than through its sources' descriptors: a hold (AddHold) begun on
// another goroutine, which the loop, once awake, watches until it is
// flushed, or the work of a source with no descriptor (Sleeper.Fd < 0).
func (l *Loop) Wake() { l.kick() }

// Add makes poll part of every pass until remove is called. poll reports
// whether it found work; it must not block. Once remove returns, poll is
// not running and is not called again. A blocking loop cannot sleep on
// such a source: while it has one, it sleeps a millisecond at most.
func (l *Loop) Add(poll func() bool) (remove func()) {
	return l.add(&loopEntry{poll: poll})
}

// AddSleeper is Add for a source a blocking loop sleeps on (see Sleeper);
// a spinning loop heeds only sl.Costly.
func (l *Loop) AddSleeper(poll func() bool, sl Sleeper) (remove func()) {
	return l.add(&loopEntry{poll: poll, sl: &sl})
}

func (l *Loop) add(e *loopEntry) (remove func()) {
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
	l.kick()
	var once sync.Once
	return func() { once.Do(func() { l.remove(e) }) }
}

// remove takes e out of the list and waits until no goroutine polls or
// holds it.
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
	// A sleeping blocking loop holds its sources until it wakes.
	l.kick()
	for !e.state.CompareAndSwap(entryIdle, entryRemoved) {
		time.Sleep(10 * time.Microsecond)
	}
}

// AddHold tells a blocking loop of work held back for company (a
// transport's acknowledgements waiting for an answer to travel with):
// due reports when it must go (Unix ns; 0: nothing held). While anything
// is held the loop does not sleep — it polls, giving way between passes,
// so that the company is seen at once — and once due is past it calls
// flush, on its goroutine. A spinning loop ignores holds.
func (l *Loop) AddHold(due func() int64, flush func()) (remove func()) {
	h := &hold{due: due, flush: flush}
	l.hmu.Lock()
	l.holds = append(l.holds, h)
	l.nholds.Store(int32(len(l.holds)))
	l.hmu.Unlock()
	l.kick()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.hmu.Lock()
			for i, x := range l.holds {
				if x == h {
					l.holds = append(l.holds[:i], l.holds[i+1:]...)
					break
				}
			}
			l.nholds.Store(int32(len(l.holds)))
			l.hmu.Unlock()
		})
	}
}

// Run polls until ctx ends. Only one Run may run at a time. It returns
// once its helper has stopped too. A blocking loop's Run keeps its
// goroutine on one thread — the one its sources' wakeups reach.
func (l *Loop) Run(ctx context.Context) {
	var sp spin.Spinner
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.help(ctx)
	}()
	if l.blocking {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		// A goroutine that wakes the loop when ctx ends, gone when Run
		// returns.
		ended := make(chan struct{})
		defer close(ended)
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-ctx.Done():
				l.kick()
			case <-ended:
			}
		}()
		l.lastWork = time.Now()
	}
	for ctx.Err() == nil {
		if l.pass.Load()%1024 == 0 {
			// The helper helps only where it has a processor of its own.
			l.procs = runtime.GOMAXPROCS(0)
		}
		if !l.passOnce(&sp) {
			// Nothing to poll: sleep until something is added.
			select {
			case <-l.wake:
			case <-ctx.Done():
			}
		}
	}
}

// pollEntry polls e unless another goroutine has it; it reports whether e
// found work.
func pollEntry(e *loopEntry) bool {
	if !e.state.CompareAndSwap(entryIdle, entryBusy) {
		return false
	}
	busy := e.poll()
	e.empty.Store(!busy)
	e.state.Store(entryIdle)
	return busy
}

// passOnce is one pass of Run: every poll function once, then, when none
// found work, what the kind of loop does then. It reports false when there
// was nothing to poll.
func (l *Loop) passOnce(sp *spin.Spinner) bool {
	l.pass.Add(1)
	list := *l.list.Load()
	if len(list) == 0 {
		return false
	}
	busy := 0
	pass := l.pass.Load()
	for _, e := range list {
		if e.quiet {
			e.quiet = false
			continue
		}
		if e.skip(l.streak > 0, pass) {
			continue
		}
		if pollEntry(e) {
			busy++
		}
	}
	if busy > 0 {
		l.streak++
	} else {
		l.streak = 0
	}
	after := helpAfter
	if !l.blocking {
		after = spinHelpAfter
	}
	if l.streak >= after && l.procs > 1 && l.helping.CompareAndSwap(false, true) {
		// Work pass after pass: let the helper share it.
		l.helpWake <- struct{}{}
	}
	if !l.blocking {
		if busy == 0 {
			if d := l.rest.Load(); d > 0 {
				time.Sleep(time.Duration(d))
			} else {
				sp.Idle()
			}
		}
		return true
	}
	holding := l.holding()
	switch {
	case busy > 0:
		if l.linger.Load() > 0 {
			l.lastWork = time.Now()
		}
	case holding, l.lingering():
		// No runtime.Gosched on the loop's locked thread: it would wake
		// another thread to take the processor.
		spin.OSYield()
	default:
		l.sleep(list)
	}
	return true
}

// holding reports whether a hold is pending, and flushes those that are
// due. It reads the clock only when something is held.
func (l *Loop) holding() bool {
	if l.nholds.Load() == 0 {
		return false
	}
	l.hmu.Lock()
	defer l.hmu.Unlock()
	pending := false
	var now int64
	for _, h := range l.holds {
		t := h.due()
		if t == 0 {
			continue
		}
		if now == 0 {
			now = time.Now().UnixNano()
		}
		if t <= now {
			h.flush()
		} else {
			pending = true
		}
	}
	return pending
}

// lingering reports whether a blocking loop should go on polling before
// it sleeps (SetLinger).
func (l *Loop) lingering() bool {
	d := l.linger.Load()
	return d > 0 && time.Since(l.lastWork) < time.Duration(d)
}

// helpAfter is how many passes in a row must find work before the helper
// joins a blocking loop: a ping-pong's message takes a pass or two to go
// through, a stream keeps finding work (docs/performance-log.md,
// helpAfter).
const helpAfter = 16

// spinHelpAfter is helpAfter for a spinning loop, whose passes come
// faster; fewer let the helper join ping-pongs, where it only gets in the
// way (docs/performance-log.md, spinHelpAfter).
const spinHelpAfter = 32

// helperIdlePasses is how many passes in a row the helper makes without
// finding work before it stops: with a TAP read or two in each, some
// tens of microseconds.
const helperIdlePasses = 32

// help is the helper's goroutine: woken by a pass that found work in more
// than one source, it makes passes of its own, polling the sources the
// loop's goroutine is not polling, until it finds nothing for a while.
func (l *Loop) help(ctx context.Context) {
	var sp spin.Spinner
	var pass uint64
	for {
		select {
		case <-l.helpWake:
		case <-ctx.Done():
			return
		}
		for idle := 0; idle < helperIdlePasses && ctx.Err() == nil; {
			// From the end of the list, where the loop's goroutine starts
			// at its head: each takes the sources the other is not at.
			// It helps while the loop is busy: costly sources that found
			// nothing wait for every costlyEvery-th pass.
			busy := false
			pass++
			list := *l.list.Load()
			for i := len(list) - 1; i >= 0; i-- {
				if list[i].skip(true, pass) {
					continue
				}
				if pollEntry(list[i]) {
					busy = true
				}
			}
			if busy {
				idle = 0
			} else {
				idle++
				sp.Idle()
			}
		}
		l.helping.Store(false)
	}
}

// sleep holds and arms every source and sleeps in ppoll until one is
// readable, the loop is kicked, or (with sources it cannot sleep on) a
// millisecond has passed. It does not sleep when a source is being polled
// by the helper or an Arm says no.
func (l *Loop) sleep(list []*loopEntry) {
	l.pfds = append(l.pfds[:0], unix.PollFd{Fd: int32(l.efd), Events: unix.POLLIN})
	l.held, l.armed = l.held[:0], 0
	timeout := (*unix.Timespec)(nil)
	ok := true
	for _, e := range list {
		if !e.state.CompareAndSwap(entryIdle, entryBusy) {
			if e.state.Load() == entryRemoved {
				continue
			}
			ok = false // the helper polls it
			break
		}
		l.held = append(l.held, e)
		if e.sl == nil {
			l.ts = unix.Timespec{Nsec: int64(time.Millisecond)}
			timeout = &l.ts
			continue
		}
		if e.sl.Arm != nil {
			l.armed = len(l.held)
			if !e.sl.Arm() {
				ok = false
				break
			}
		}
		l.pfds = append(l.pfds, unix.PollFd{Fd: int32(e.sl.Fd), Events: unix.POLLIN})
	}
	// A hold begun since the pass looked — by the helper, whose poll of
	// a source it had just released received a message whose ACK waits
	// for company — is watched, not slept through: nothing would wake the
	// loop for it, and the ACK would wait for the peer's next packet or
	// retransmission. Every source is held now, so no later one begins
	// unseen.
	if ok && l.holding() {
		ok = false
	}
	slept := false
	if ok {
		_, err := unix.Ppoll(l.pfds, timeout, nil)
		slept = err == nil
		if l.pfds[0].Revents != 0 {
			var b [8]byte
			_, _ = unix.Read(l.efd, b[:])
		}
	}
	fd := 1
	for i, e := range l.held {
		rung := true
		if e.sl != nil && ok {
			rung = !slept || l.pfds[fd].Revents != 0
			fd++
			if e.sl.Arm == nil && !rung {
				e.quiet = true
			}
		}
		if e.sl != nil && e.sl.Disarm != nil && (e.sl.Arm == nil || i < l.armed) {
			e.sl.Disarm(rung)
		}
		e.state.Store(entryIdle)
	}
	if slept {
		l.lastWork = time.Now()
	}
}
