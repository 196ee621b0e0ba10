package control

import (
	"testing"
	"time"
)

// TestPollModes: each mode's name reads back to it, and the modes wait
// as documented (block sleeps at once, spin never, adaptive no longer
// than its spin time).
func TestPollModes(t *testing.T) {
	for _, c := range []struct {
		mode PollMode
		name string
		spin func(time.Duration) bool
	}{
		{PollBlock, "block", func(d time.Duration) bool { return d == 0 }},
		{PollSpin, "spin", func(d time.Duration) bool { return d < 0 }},
		{PollAdaptive, "adaptive", func(d time.Duration) bool { return d == spinFor && d >= 0 && d <= time.Millisecond }},
	} {
		if c.mode.String() != c.name {
			t.Errorf("%d.String() = %q, want %q", c.mode, c.mode.String(), c.name)
		}
		m, err := ParsePollMode(c.name)
		if err != nil || m != c.mode {
			t.Errorf("ParsePollMode(%q) = %v, %v", c.name, m, err)
		}
		if !c.spin(c.mode.Spin()) {
			t.Errorf("%s.Spin() = %v", c.name, c.mode.Spin())
		}
	}
	if _, err := ParsePollMode("fast"); err == nil {
		t.Error("ParsePollMode accepted fast")
	}
}

// TestPollModeProcs: a spinning appliance takes half the processors, but
// two where there are two or three (its loop's and its helper's); a
// sleeping one takes them all.
func TestPollModeProcs(t *testing.T) {
	for _, c := range []struct {
		mode            PollMode
		available, want int
	}{
		{PollSpin, 1, 1}, {PollSpin, 2, 2}, {PollSpin, 3, 2}, {PollSpin, 4, 2}, {PollSpin, 5, 2}, {PollSpin, 64, 32},
		{PollBlock, 1, 1}, {PollBlock, 2, 2}, {PollBlock, 64, 64},
		{PollAdaptive, 2, 2}, {PollAdaptive, 8, 8},
	} {
		if got := c.mode.Procs(c.available); got != c.want {
			t.Errorf("%s.Procs(%d) = %d, want %d", c.mode, c.available, got, c.want)
		}
	}
}

// TestPollModeAckDelay: acknowledgements wait for company 10 µs in a
// spinning appliance, whose ring pollers watch the time, and 5 µs in a
// sleeping one, whose blocking loop polls while they wait.
func TestPollModeAckDelay(t *testing.T) {
	for _, c := range []struct {
		mode PollMode
		want time.Duration
	}{{PollSpin, 10 * time.Microsecond}, {PollBlock, 5 * time.Microsecond}, {PollAdaptive, 5 * time.Microsecond}} {
		if got := c.mode.AckDelay(); got != c.want {
			t.Errorf("%s.AckDelay() = %v, want %v", c.mode, got, c.want)
		}
	}
}
