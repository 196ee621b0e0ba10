package pingpong

import (
	"testing"
	"time"
)

// TestPollPacer: a polling loop spins — however many empty polls — until
// pollSpinFor has passed, then sleeps at every empty poll.
func TestPollPacer(t *testing.T) {
	var p pollPacer
	for i := range 5000 {
		if p.idle() {
			if elapsed := time.Since(p.since); elapsed <= pollSpinFor {
				t.Fatalf("sleeps after %d empty polls and %v, want only after %v", i+1, elapsed, pollSpinFor)
			}
			break
		}
	}
	// Past the spin, as if the polls had taken that long.
	p = pollPacer{}
	p.idle()
	p.since = time.Now().Add(-2 * pollSpinFor)
	sleeps := 0
	for range 200 {
		if p.idle() {
			sleeps++
		}
	}
	// The clock is read at the 64th empty poll: from then on, every
	// empty poll sleeps.
	if want := 200 - 62; sleeps != want {
		t.Errorf("%d of 200 empty polls past the spin slept, want %d", sleeps, want)
	}
}
