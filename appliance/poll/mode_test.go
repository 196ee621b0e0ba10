package poll

import (
	"errors"
	"testing"
	"time"
)

// TestModes: each mode's name reads back to it, and the modes wait
// as documented (block sleeps at once, spin never, adaptive no longer
// than its spin time).
func TestModes(t *testing.T) {
	for _, c := range []struct {
		mode Mode
		name string
		spin func(time.Duration) bool
	}{
		{Block, "block", func(d time.Duration) bool { return d == 0 }},
		{Spin, "spin", func(d time.Duration) bool { return d < 0 }},
		{Adaptive, "adaptive", func(d time.Duration) bool { return d == adaptiveLinger && d >= 0 && d <= time.Millisecond }},
	} {
		if c.mode.String() != c.name {
			t.Errorf("%d.String() = %q, want %q", c.mode, c.mode.String(), c.name)
		}
		m, err := ParseMode(c.name)
		if err != nil || m != c.mode {
			t.Errorf("ParseMode(%q) = %v, %v", c.name, m, err)
		}
		if !c.spin(c.mode.Linger()) {
			t.Errorf("%s.Linger() = %v", c.name, c.mode.Linger())
		}
	}
	if _, err := ParseMode("fast"); err == nil {
		t.Error("ParseMode accepted fast")
	}
}

// TestModeProcs: a spinning appliance takes half the processors, but
// two where there are two or three (its loop's and its helper's); a
// sleeping one takes them all.
func TestModeProcs(t *testing.T) {
	for _, c := range []struct {
		mode            Mode
		available, want int
	}{
		{Spin, 1, 1}, {Spin, 2, 2}, {Spin, 3, 2}, {Spin, 4, 2}, {Spin, 5, 2}, {Spin, 64, 32},
		{Block, 1, 1}, {Block, 2, 2}, {Block, 64, 64},
		{Adaptive, 2, 2}, {Adaptive, 8, 8},
	} {
		if got := c.mode.Procs(c.available); got != c.want {
			t.Errorf("%s.Procs(%d) = %d, want %d", c.mode, c.available, got, c.want)
		}
	}
}

// TestModeAckDelay: acknowledgements wait for company 10 µs in a
// spinning appliance, whose ring pollers watch the time, and 5 µs in a
// sleeping one, whose blocking loop polls while they wait.
func TestModeAckDelay(t *testing.T) {
	for _, c := range []struct {
		mode Mode
		want time.Duration
	}{{Spin, 10 * time.Microsecond}, {Block, 5 * time.Microsecond}, {Adaptive, 5 * time.Microsecond}} {
		if got := c.mode.AckDelay(); got != c.want {
			t.Errorf("%s.AckDelay() = %v, want %v", c.mode, got, c.want)
		}
	}
}

// TestNames: Names lists exactly the modes ParseMode reads, the default
// first, so that the config can check a poll name without importing the
// appliance.
func TestNames(t *testing.T) {
	seen := map[Mode]bool{}
	for i, n := range Names {
		m, err := ParseMode(n)
		if err != nil || m.String() != n {
			t.Errorf("ParseMode(%q) = %v, %v", n, m, err)
		}
		if i == 0 && m != Adaptive {
			t.Errorf("Names[0] = %q, want the default", n)
		}
		seen[m] = true
	}
	if len(seen) != 3 {
		t.Errorf("Names %v covers %d modes, want 3", Names, len(seen))
	}
	if _, err := ParseMode("fast"); !errors.Is(err, ErrMode) {
		t.Errorf("ParseMode(fast) = %v, want ErrMode", err)
	}
}
