package spin

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// TestIdleGivesWay: with one P, a loop that calls Idle between polls lets
// a runnable goroutine run at once (not only when the runtime preempts
// the loop, after 10 ms), and Idle allocates nothing.
func TestIdleGivesWay(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var done atomic.Bool
	go done.Store(true)
	var s Spinner
	deadline := time.Now().Add(5 * time.Second)
	polls := 0
	for !done.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the other goroutine never ran")
		}
		s.Idle()
		polls++
	}
	if polls > 2 {
		t.Errorf("the other goroutine ran after %d polls, want at the first", polls)
	}
	if n := testing.AllocsPerRun(100, s.Idle); n != 0 {
		t.Errorf("Idle: %v allocations", n)
	}
}
