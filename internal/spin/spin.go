// Package spin holds what busy-polling loops share: how they give way to
// other work between polls.
package spin

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// A Spinner paces one busy-polling loop; its zero value is ready. It is
// not safe for concurrent use: each loop has its own.
type Spinner struct{ polls uint32 }

// osYieldEvery is how many empty polls a Spinner makes between two
// sched_yield calls.
const osYieldEvery = 8

// Idle gives way after a poll that found nothing: to the process's other
// goroutines every time (runtime.Gosched), and every few polls to the
// machine's other threads (sched_yield). A poller that only yields to its
// goroutines is, for the kernel, a thread that never sleeps: on a machine
// with fewer cores than busy threads it keeps the thread with real work —
// the appliance's reader, a client about to post — off the core for a
// whole time slice. Yielding to the kernel at every poll would cost a
// system call each time.
func (s *Spinner) Idle() {
	s.polls++
	runtime.Gosched()
	if s.polls%osYieldEvery == 0 {
		unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) //nolint:errcheck // sched_yield cannot fail
	}
}

// OSYield gives way to the machine's other threads (sched_yield), and not
// to the process's other goroutines: for a loop on a thread of its own
// (runtime.LockOSThread), where runtime.Gosched hands the processor to
// another thread — waking it — and waits to be handed it back.
func OSYield() {
	unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) //nolint:errcheck // sched_yield cannot fail
}
