package appliance

import (
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/taproce/taproce/internal/cpulist"
	"github.com/taproce/taproce/tap"
)

// TestProcs: a configured procs is used as given; otherwise the
// GOMAXPROCS environment variable keeps the runtime's choice; otherwise
// the poll mode takes its share of the processors the appliance is pinned
// to, or of those the process has, where a mode that takes them all
// changes nothing.
func TestProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	for _, c := range []struct {
		name             string
		mode             PollMode
		configured, cpus int
		env              string
		want             int
	}{
		{"spin takes half", PollSpin, 0, 0, "", 2},
		{"block takes all", PollBlock, 0, 0, "", 0},
		{"adaptive takes all", PollAdaptive, 0, 0, "", 0},
		{"configured", PollBlock, 3, 0, "", 3},
		{"configured beats spin", PollSpin, 4, 0, "", 4},
		{"environment beats spin", PollSpin, 0, 0, "4", 0},
		{"configured beats environment", PollSpin, 1, 0, "4", 1},
		{"spin takes half of its cpus", PollSpin, 0, 6, "", 3},
		{"block takes all its cpus", PollBlock, 0, 1, "", 1},
		{"configured beats cpus", PollBlock, 2, 1, "", 2},
		{"environment beats cpus", PollBlock, 0, 1, "4", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("GOMAXPROCS", c.env)
			if got := Procs(c.mode, c.configured, c.cpus); got != c.want {
				t.Errorf("Procs(%s, %d, %d) with GOMAXPROCS=%q = %d, want %d", c.mode, c.configured, c.cpus, c.env, got, c.want)
			}
		})
	}
}

// TestPlace: Place pins the process to the listed processors and sets
// GOMAXPROCS from them; restore puts both back. A list it cannot apply
// changes nothing.
func TestPlace(t *testing.T) {
	t.Setenv("GOMAXPROCS", "")
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	allowed, err := cpulist.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	one := cpulist.Format(cpulist.Of(cpulist.List(allowed)[0]))
	for _, c := range []struct {
		name  string
		mode  PollMode
		procs int
		cpus  string
		want  int
	}{
		{"block on one processor", PollBlock, 0, one, 1},
		{"spin on one processor", PollSpin, 0, one, 1},
		{"procs on one processor", PollBlock, 3, one, 3},
		{"no list", PollSpin, 0, "", 2},
		{"no list, block", PollBlock, 0, "", 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			restore, err := Place(c.mode, c.procs, c.cpus)
			if err != nil {
				t.Fatal(err)
			}
			if got := runtime.GOMAXPROCS(0); got != c.want {
				t.Errorf("GOMAXPROCS %d, want %d", got, c.want)
			}
			want := allowed
			if c.cpus != "" {
				want, _ = cpulist.Parse(c.cpus)
			}
			if got, err := cpulist.Allowed(); err != nil || got != want {
				t.Errorf("runs on %q (%v), want %q", cpulist.Format(got), err, cpulist.Format(want))
			}
			if err := restore(); err != nil {
				t.Fatal(err)
			}
			if got := runtime.GOMAXPROCS(0); got != 4 {
				t.Errorf("after restore: GOMAXPROCS %d, want 4", got)
			}
			if got, err := cpulist.Allowed(); err != nil || got != allowed {
				t.Errorf("after restore: runs on %q (%v), want %q", cpulist.Format(got), err, cpulist.Format(allowed))
			}
		})
	}
	for _, bad := range []string{"x", "1023"} {
		if bad == "1023" && allowed.IsSet(1023) {
			continue
		}
		if _, err := Place(PollBlock, 0, bad); err == nil {
			t.Errorf("Place with cpus %q: no error", bad)
		} else if bad == "1023" && !errors.Is(err, cpulist.ErrNotAllowed) {
			t.Errorf("Place with cpus %q: %v, want ErrNotAllowed", bad, err)
		}
		if got := runtime.GOMAXPROCS(0); got != 4 {
			t.Errorf("a refused Place changed GOMAXPROCS to %d", got)
		}
	}
}

// TestPortAckDelay: a port's transport lets acknowledgements wait as the
// appliance's poll mode says (PollMode.AckDelay).
func TestPortAckDelay(t *testing.T) {
	for _, mode := range []PollMode{PollSpin, PollBlock, PollAdaptive} {
		app, err := New(Options{Socket: filepath.Join(t.TempDir(), "s"), Poll: mode, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		dev, _ := tap.NewFakePair(1500, 8)
		n, err := app.AddPortOn(dev, PortConfig{Namespace: "ns", Name: dev.Name(),
			Addrs: []netip.Prefix{netip.MustParsePrefix("10.66.0.1/24")}})
		if err != nil {
			t.Fatal(err)
		}
		if got := n.Engine().AckDelay(); got != mode.AckDelay() {
			t.Errorf("%s: the port's transport has AckDelay %v, want %v", mode, got, mode.AckDelay())
		}
		app.Close()
	}
}
