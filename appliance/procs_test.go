package appliance

import (
	"runtime"
	"testing"

	"github.com/taproce/taproce/appliance/control"
)

// TestProcs: a configured procs is used as given; otherwise the
// GOMAXPROCS environment variable keeps the runtime's choice; otherwise
// the poll mode takes its share of the processors the process has, and
// a mode that takes them all changes nothing.
func TestProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	for _, c := range []struct {
		name       string
		mode       control.PollMode
		configured int
		env        string
		want       int
	}{
		{"spin takes half", control.PollSpin, 0, "", 2},
		{"block takes all", control.PollBlock, 0, "", 0},
		{"adaptive takes all", control.PollAdaptive, 0, "", 0},
		{"configured", control.PollBlock, 3, "", 3},
		{"configured beats spin", control.PollSpin, 4, "", 4},
		{"environment beats spin", control.PollSpin, 0, "4", 0},
		{"configured beats environment", control.PollSpin, 1, "4", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("GOMAXPROCS", c.env)
			if got := Procs(c.mode, c.configured); got != c.want {
				t.Errorf("Procs(%s, %d) with GOMAXPROCS=%q = %d, want %d", c.mode, c.configured, c.env, got, c.want)
			}
		})
	}
}
