package perf

import (
	"context"
	"testing"
	"time"
)

// TestWaiterSpinFor pins when a waiter stops busy-polling and sleeps: a
// latency test's waiter still polls after 200 µs with nothing to see (its
// answer is due any moment), a waiter that may sleep after 20 µs sleeps.
func TestWaiterSpinFor(t *testing.T) {
	for _, tc := range []struct {
		name      string
		spinFor   time.Duration
		idleFor   time.Duration
		wantSleep bool
	}{
		{"latency test, 200 µs idle", latSpinFor, 200 * time.Microsecond, false},
		{"latency test, past its spin", latSpinFor, 2 * latSpinFor, true},
		{"20 µs spin, 200 µs idle", 20 * time.Microsecond, 200 * time.Microsecond, true},
		{"bandwidth test, within its spin", bwSpinFor, bwSpinFor / 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWaiter(context.Background(), time.Minute, tc.spinFor)
			// The waiter looks at the clock every 64th empty poll.
			for range 63 {
				if err := w.wait("test"); err != nil {
					t.Fatal(err)
				}
			}
			if w.sleeping {
				t.Fatal("sleeping after 63 polls without looking at the clock")
			}
			w.since = time.Now().Add(-tc.idleFor)
			if err := w.wait("test"); err != nil {
				t.Fatal(err)
			}
			if w.sleeping != tc.wantSleep {
				t.Errorf("idle for %v with spinFor %v: sleeping = %v, want %v", tc.idleFor, tc.spinFor, w.sleeping, tc.wantSleep)
			}
		})
	}
	for _, name := range []string{"send_lat", "write_lat", "read_lat", "atomic_lat"} {
		test, err := ParseTest(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, polls := range []bool{false, true} {
			if got := spinFor(test.Kind, polls); got != latSpinFor {
				t.Errorf("%s polls for %v before it sleeps (appliance polls: %v), want %v", name, got, polls, latSpinFor)
			}
		}
	}
	for _, name := range []string{"write_bw", "send_bw"} {
		test, err := ParseTest(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := spinFor(test.Kind, false); got != bwSpinFor {
			t.Errorf("%s polls for %v before it sleeps, want %v", name, got, bwSpinFor)
		}
		if got := spinFor(test.Kind, true); got != latSpinFor {
			t.Errorf("%s polls for %v before it sleeps with a polling appliance, want %v", name, got, latSpinFor)
		}
	}
}
