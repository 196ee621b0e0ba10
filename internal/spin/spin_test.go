package spin

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// TestIdleGivesWay: with one P, a loop that calls Idle between polls lets
// another goroutine run (what it polls for gets done), and Idle allocates
// nothing.
func TestIdleGivesWay(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var done atomic.Bool
	go done.Store(true)
	var s Spinner
	deadline := time.Now().Add(5 * time.Second)
	for !done.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the other goroutine never ran")
		}
		s.Idle()
	}
	if n := testing.AllocsPerRun(100, s.Idle); n != 0 {
		t.Errorf("Idle: %v allocations", n)
	}
}
