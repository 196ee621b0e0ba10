package lab

import (
	"path/filepath"
	"runtime"
	"testing"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/control"
	"github.com/taproce/taproce/internal/testnet"
)

// BenchmarkLabSpeed measures the lab's TAP path between two namespaces'
// client processes against baselines from the same run (see Speed), with
// the appliance blocking, adaptive and spinning — on the processors its
// poll mode takes (appliance.Procs), and spinning once more on all of
// them (spin-all-procs). Metrics: procs, the processors it ran on; bw/tcp, the
// `taproce perf write_bw` 64 KiB bandwidth over TCP's on the same veth
// (target ≥ 1.0), and lat/raw, `taproce perf send_lat` 2 B's median half
// round trip over a raw frame ping-pong's between two TAPs (target ≤ 3.0);
// events/raw, `taproce pingpong -e` 2 B's one-way time over the same raw
// ping-pong's.
// Each run measures once, whatever b.N: run it with -benchtime 1x.
func BenchmarkLabSpeed(b *testing.B) {
	testnet.RequireRoot(b)
	bin := taproceBinary(b)
	for _, c := range []struct {
		name  string
		mode  control.PollMode
		procs int
	}{
		{"block", control.PollBlock, 0}, {"adaptive", control.PollAdaptive, 0}, {"spin", control.PollSpin, 0},
		{"spin-all-procs", control.PollSpin, runtime.GOMAXPROCS(0)},
	} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				r, err := Speed(b.Context(), SpeedOptions{Prefix: testnet.Name() + "-", Poll: c.mode, Procs: c.procs, Binary: bin,
					Socket: filepath.Join(b.TempDir(), "lab.sock")})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(r.Procs), "procs")
				b.ReportMetric(r.WriteBW/1e6, "write_bw-MB/s")
				b.ReportMetric(r.TCP/1e6, "tcp-MB/s")
				b.ReportMetric(r.BWRatio(), "bw/tcp")
				b.ReportMetric(float64(r.SendLat.Nanoseconds())/1e3, "send_lat-µs")
				b.ReportMetric(float64(r.Raw.Nanoseconds())/1e3, "raw-µs")
				b.ReportMetric(r.LatRatio(), "lat/raw")
				b.ReportMetric(float64(r.Events.Nanoseconds())/1e3, "events-µs")
				b.ReportMetric(r.EventsRatio(), "events/raw")
			}
		})
	}
}

// TestSpeed runs Speed briefly in each poll mode: every figure measured,
// and the ratios computed from them.
func TestSpeed(t *testing.T) {
	testnet.RequireRoot(t)
	if testing.Short() {
		t.Skip("builds a lab and runs client processes")
	}
	bin := taproceBinary(t)
	for _, mode := range []control.PollMode{control.PollBlock, control.PollSpin} {
		t.Run(mode.String(), func(t *testing.T) {
			r, err := Speed(t.Context(), SpeedOptions{Prefix: testnet.Name() + "-", Poll: mode, Binary: bin,
				Socket: filepath.Join(t.TempDir(), "lab.sock"), BWIters: 200, LatIters: 200, TCPBytes: 16 << 20, RawRounds: 200})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v bw/tcp %.2f lat/raw %.2f", r, r.BWRatio(), r.LatRatio())
			procs := runtime.GOMAXPROCS(0)
			if n := appliance.Procs(mode, 0); n > 0 {
				procs = n
			}
			if r.WriteBW <= 0 || r.TCP <= 0 || r.SendLat <= 0 || r.Raw <= 0 || r.Events <= 0 || r.Poll != mode || r.RawSpin != (mode == control.PollSpin) ||
				r.Procs != procs {
				t.Errorf("result %+v", r)
			}
			if r.BWRatio() != r.WriteBW/r.TCP || r.LatRatio() != float64(r.SendLat)/float64(r.Raw) || r.EventsRatio() != float64(r.Events)/float64(r.Raw) {
				t.Errorf("ratios %v %v %v", r.BWRatio(), r.LatRatio(), r.EventsRatio())
			}
		})
	}
}

// TestAppProcs: the lab runs its clients' phases on the processors its
// appliance's poll mode takes, and gives the rest back afterwards.
func TestAppProcs(t *testing.T) {
	t.Setenv("GOMAXPROCS", "")
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	for _, c := range []struct {
		poll control.PollMode
		want int
	}{{control.PollSpin, 2}, {control.PollBlock, 4}, {control.PollAdaptive, 4}} {
		l := &Lab{Topology: Topology{Poll: c.poll}}
		restore := l.appProcs()
		if got := runtime.GOMAXPROCS(0); got != c.want {
			t.Errorf("%s: GOMAXPROCS %d while clients run, want %d", c.poll, got, c.want)
		}
		restore()
		if got := runtime.GOMAXPROCS(0); got != 4 {
			t.Errorf("%s: GOMAXPROCS %d afterwards, want 4", c.poll, got)
		}
	}
}
