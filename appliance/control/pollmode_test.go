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
