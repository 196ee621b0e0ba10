package lab

import (
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/internal/cpulist"
	"github.com/taproce/taproce/internal/testnet"
)

// BenchmarkLabSpeed measures the lab's TAP path between two namespaces'
// client processes against baselines from the same run (see Speed), at
// MTU 9000 and at MTU 1500 (mtu9000/…, mtu1500/…), with the appliance
// blocking, adaptive and spinning — on the processors its poll mode takes
// (appliance.Procs), spinning once more on all of them (spin-all-procs),
// and blocking and spinning on processors of its own (block-own-cpus,
// spin-own-cpus: the upper half, ApplianceCPUs, with the client processes
// on the rest). Metrics: procs, the processors it ran on; bw/tcp, the
// `taproce perf write_bw` 64 KiB bandwidth over TCP's on the same veth
// (the median of five runs; target ≥ 1.0), and lat/raw, `taproce perf
// send_lat` 2 B's median half round trip over a raw frame ping-pong's
// between two TAPs (target ≤ 3.0); events/raw, `taproce pingpong -e` 2 B's
// one-way time over the same raw ping-pong's; ib_write_bw/write_bw and
// ib_send_lat/send_lat, Debian's perftest on taproce's libibverbs.so.1
// over taproce perf on the Go library, each run right after the other
// (targets ≥ 0.95 and ≤ 1.1). At MTU 9000 it measures the local switch
// too, in a lab of the same configuration whose ports cross in memory:
// local-lat/lat, its send_lat over the TAP path's (target ≤ 0.5);
// local-events/events, its events ping-pong over the TAP path's (target
// ≤ 1.0); write/memcpy, `perf write_bw` 1 MiB over a copy of 1 MiB
// (target ≥ 0.8); read/write, `perf read_bw` 1 MiB over write_bw's
// (target ≥ 0.8). Each run measures once, whatever b.N: run it with
// -benchtime 1x.
func BenchmarkLabSpeed(b *testing.B) {
	testnet.RequireRoot(b)
	bin := taproceBinary(b)
	own, err := ApplianceCPUs()
	if err != nil {
		b.Fatal(err)
	}
	for _, mtu := range []int{9000, 1500} {
		for _, c := range []struct {
			name  string
			mode  appliance.PollMode
			procs int
			cpus  string
		}{
			{"block", appliance.PollBlock, 0, ""}, {"adaptive", appliance.PollAdaptive, 0, ""}, {"spin", appliance.PollSpin, 0, ""},
			{"spin-all-procs", appliance.PollSpin, runtime.GOMAXPROCS(0), ""},
			{"block-own-cpus", appliance.PollBlock, 0, own}, {"spin-own-cpus", appliance.PollSpin, 0, own},
		} {
			b.Run(fmt.Sprintf("mtu%d/%s", mtu, c.name), func(b *testing.B) {
				if strings.HasSuffix(c.name, "-own-cpus") && own == "" {
					b.Skip("one processor: none to give the appliance alone")
				}
				for range b.N {
					r, err := Speed(b.Context(), SpeedOptions{Prefix: testnet.Name() + "-", Poll: c.mode, Procs: c.procs, CPUs: c.cpus, Binary: bin,
						Socket: filepath.Join(b.TempDir(), "lab.sock"), MTU: mtu, Local: mtu == 9000})
					if err != nil {
						b.Fatal(err)
					}
					reportSpeed(b, r)
				}
			})
		}
	}
}

// reportSpeed reports a Speed result as BenchmarkLabSpeed's metrics.
func reportSpeed(b *testing.B, r *SpeedResult) {
	b.ReportMetric(float64(r.Procs), "procs")
	b.ReportMetric(r.WriteBW/1e6, "write_bw-MB/s")
	b.ReportMetric(r.TCP/1e6, "tcp-MB/s")
	b.ReportMetric(r.BWRatio(), "bw/tcp")
	b.ReportMetric(float64(r.SendLat.Nanoseconds())/1e3, "send_lat-µs")
	b.ReportMetric(float64(r.Raw.Nanoseconds())/1e3, "raw-µs")
	b.ReportMetric(r.LatRatio(), "lat/raw")
	b.ReportMetric(float64(r.Events.Nanoseconds())/1e3, "events-µs")
	b.ReportMetric(r.EventsRatio(), "events/raw")
	if r.LocalWrite > 0 {
		b.ReportMetric(float64(r.LocalSendLat.Nanoseconds())/1e3, "local-lat-µs")
		b.ReportMetric(r.LocalLatRatio(), "local-lat/lat")
		b.ReportMetric(float64(r.LocalEvents.Nanoseconds())/1e3, "local-events-µs")
		b.ReportMetric(r.LocalEventsRatio(), "local-events/events")
		b.ReportMetric(r.LocalWrite/1e6, "local-write-MB/s")
		b.ReportMetric(r.LocalRead/1e6, "local-read-MB/s")
		b.ReportMetric(r.Memcpy/1e6, "memcpy-MB/s")
		b.ReportMetric(r.LocalWriteRatio(), "write/memcpy")
		b.ReportMetric(r.LocalReadRatio(), "read/write")
	}
	if r.LibWriteBW == 0 {
		b.Logf("Debian's perftest on taproce's libibverbs not run: %s", r.LibWhy)
		return
	}
	b.ReportMetric(r.LibWriteBW/1e6, "ib_write_bw-MB/s")
	b.ReportMetric(r.LibBWRatio(), "ib_write_bw/write_bw")
	b.ReportMetric(float64(r.LibSendLat.Nanoseconds())/1e3, "ib_send_lat-µs")
	b.ReportMetric(r.LibLatRatio(), "ib_send_lat/send_lat")
}

// TestSpeed runs Speed briefly in each poll mode: every figure measured,
// and the ratios computed from them; blocking, the local switch's figures
// too, and spinning at MTU 1500.
func TestSpeed(t *testing.T) {
	testnet.RequireRoot(t)
	if testing.Short() {
		t.Skip("builds a lab and runs client processes")
	}
	bin := taproceBinary(t)
	own, err := ApplianceCPUs()
	if err != nil {
		t.Fatal(err)
	}
	type run struct {
		mode  appliance.PollMode
		cpus  string
		mtu   int
		local bool
	}
	cases := []run{{appliance.PollBlock, "", 9000, true}, {appliance.PollSpin, "", 1500, false}}
	if own != "" {
		cases = append(cases, run{appliance.PollBlock, own, 9000, false})
	}
	for _, c := range cases {
		mode := c.mode
		name := fmt.Sprintf("%v-mtu%d", mode, c.mtu)
		if c.cpus != "" {
			name += "-on-cpus-" + c.cpus
		}
		if c.local {
			name += "-local"
		}
		t.Run(name, func(t *testing.T) {
			r, err := Speed(t.Context(), SpeedOptions{Prefix: testnet.Name() + "-", Poll: mode, CPUs: c.cpus, Binary: bin,
				Socket: filepath.Join(t.TempDir(), "lab.sock"), BWIters: 200, LatIters: 200, TCPBytes: 16 << 20, TCPRuns: 3, RawRounds: 200,
				MTU: c.mtu, Local: c.local, LocalIters: 100})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v bw/tcp %.2f lat/raw %.2f", r, r.BWRatio(), r.LatRatio())
			procs, ncpus := runtime.GOMAXPROCS(0), 0
			if c.cpus != "" {
				set, err := cpulist.Parse(c.cpus)
				if err != nil {
					t.Fatal(err)
				}
				ncpus = set.Count()
			}
			if n := appliance.Procs(mode, 0, ncpus); n > 0 {
				procs = n
			}
			if r.WriteBW <= 0 || r.TCP <= 0 || r.SendLat <= 0 || r.Raw <= 0 || r.Events <= 0 || r.Poll != mode || r.RawSpin != (mode == appliance.PollSpin) ||
				r.Procs != procs || r.CPUs != c.cpus || r.MTU != c.mtu {
				t.Errorf("result %+v", r)
			}
			if r.BWRatio() != r.WriteBW/r.TCP || r.LatRatio() != float64(r.SendLat)/float64(r.Raw) || r.EventsRatio() != float64(r.Events)/float64(r.Raw) {
				t.Errorf("ratios %v %v %v", r.BWRatio(), r.LatRatio(), r.EventsRatio())
			}
			measured := r.LocalSendLat > 0 && r.LocalEvents > 0 && r.LocalWrite > 0 && r.LocalRead > 0 && r.Memcpy > 0
			if measured != c.local {
				t.Errorf("local switch measured %v, want %v: %+v", measured, c.local, r)
			}
			if c.local {
				t.Logf("local switch: send_lat %v (%.2f of the TAP path's), events %v (%.2f), write %.0f MB/s (%.2f of memcpy), read %.0f MB/s (%.2f of write)",
					r.LocalSendLat, r.LocalLatRatio(), r.LocalEvents, r.LocalEventsRatio(), r.LocalWrite/1e6, r.LocalWriteRatio(), r.LocalRead/1e6, r.LocalReadRatio())
				if r.LocalLatRatio() != float64(r.LocalSendLat)/float64(r.SendLat) || r.LocalWriteRatio() != r.LocalWrite/r.Memcpy ||
					r.LocalReadRatio() != r.LocalRead/r.LocalWrite || r.LocalEventsRatio() != float64(r.LocalEvents)/float64(r.Events) {
					t.Errorf("local ratios %v %v %v %v", r.LocalLatRatio(), r.LocalEventsRatio(), r.LocalWriteRatio(), r.LocalReadRatio())
				}
			}
			// Debian's perftest on the library, measured too where the
			// lab can build it (a checkout with the C toolchain).
			if r.LibWhy == "" && (r.LibWriteBW <= 0 || r.LibSendLat <= 0 || r.LibBWRatio() != r.LibWriteBW/r.WriteBW) {
				t.Errorf("Debian's perftest on the library: %+v", r)
			}
			if r.LibWhy != "" {
				t.Logf("Debian's perftest on the library not run: %s", r.LibWhy)
			}
		})
	}
}

// TestAppPlace: the lab runs its clients' phases on the processors its
// appliance takes — as many at once as its poll mode chooses, on those
// CPUs lists — and gives the rest back afterwards.
func TestAppPlace(t *testing.T) {
	t.Setenv("GOMAXPROCS", "")
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	allowed, err := cpulist.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	own, err := ApplianceCPUs()
	if err != nil {
		t.Fatal(err)
	}
	type placement struct {
		poll appliance.PollMode
		cpus string
		want int
	}
	cases := []placement{{appliance.PollSpin, "", 2}, {appliance.PollBlock, "", 4}, {appliance.PollAdaptive, "", 4}}
	if own != "" {
		set, err := cpulist.Parse(own)
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, placement{appliance.PollBlock, own, set.Count()}, placement{appliance.PollSpin, own, max(1, set.Count()/2)})
	}
	for _, c := range cases {
		l := &Lab{Topology: Topology{Poll: c.poll, CPUs: c.cpus, Logger: slog.Default()}}
		restore, err := l.appPlace()
		if err != nil {
			t.Fatal(err)
		}
		if got := runtime.GOMAXPROCS(0); got != c.want {
			t.Errorf("%s on %q: GOMAXPROCS %d while clients run, want %d", c.poll, c.cpus, got, c.want)
		}
		want := allowed
		if c.cpus != "" {
			want, _ = cpulist.Parse(c.cpus)
		}
		if got, err := cpulist.Allowed(); err != nil || got != want {
			t.Errorf("%s on %q: runs on %q while clients run (%v)", c.poll, c.cpus, cpulist.Format(got), err)
		}
		restore()
		if got := runtime.GOMAXPROCS(0); got != 4 {
			t.Errorf("%s: GOMAXPROCS %d afterwards, want 4", c.poll, got)
		}
		if got, err := cpulist.Allowed(); err != nil || got != allowed {
			t.Errorf("%s on %q: runs on %q afterwards (%v)", c.poll, c.cpus, cpulist.Format(got), err)
		}
	}
}

// TestApplianceCPUs: the appliance gets the upper half of the processors
// and the clients keep at least one.
func TestApplianceCPUs(t *testing.T) {
	allowed, err := cpulist.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	own, err := ApplianceCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if allowed.Count() < 2 {
		if own != "" {
			t.Errorf("one processor, yet the appliance gets %q", own)
		}
		return
	}
	set, err := cpulist.Parse(own)
	if err != nil {
		t.Fatal(err)
	}
	rest := cpulist.Without(allowed, set)
	if !cpulist.Subset(set, allowed) || set.Count() != allowed.Count()-allowed.Count()/2 || rest.Count() != allowed.Count()/2 {
		t.Errorf("of %q the appliance gets %q", cpulist.Format(allowed), own)
	}
}

// TestClientCPUs: the clients run on the processors the appliance's
// leave, anywhere when it takes them all or none is given, and a list
// the lab cannot use is an error.
func TestClientCPUs(t *testing.T) {
	allowed, err := cpulist.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := clientCPUs(""); got != nil || err != nil {
		t.Errorf(`clientCPUs(""): %v, %v`, got, err)
	}
	if got, err := clientCPUs(cpulist.Format(allowed)); got != nil || err != nil {
		t.Errorf("clientCPUs(all): %v, %v", got, err)
	}
	if own, err := ApplianceCPUs(); err != nil {
		t.Fatal(err)
	} else if own != "" {
		set, _ := cpulist.Parse(own)
		got, err := clientCPUs(own)
		if err != nil || got == nil || *got != cpulist.Without(allowed, set) {
			t.Errorf("clientCPUs(%q): %v, %v", own, got, err)
		}
	}
	if _, err := clientCPUs("x"); !errors.Is(err, cpulist.ErrSyntax) {
		t.Errorf(`clientCPUs("x"): %v`, err)
	}
	if !allowed.IsSet(cpulist.Max - 1) {
		if _, err := clientCPUs(fmt.Sprint(cpulist.Max - 1)); !errors.Is(err, cpulist.ErrNotAllowed) {
			t.Errorf("clientCPUs(%d): %v", cpulist.Max-1, err)
		}
	}
}

// TestStartOn: a client process runs on the processors it is started on,
// and the lab's thread goes back to its own.
func TestStartOn(t *testing.T) {
	allowed, err := cpulist.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	one := cpulist.Of(cpulist.List(allowed)[0])
	for _, cpus := range []*cpulist.Set{nil, &one} {
		cmd := exec.Command("sleep", "10")
		if err := startOn(cmd, cpus); err != nil {
			t.Fatal(err)
		}
		var got cpulist.Set
		err := unix.SchedGetaffinity(cmd.Process.Pid, &got)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if err != nil {
			t.Fatal(err)
		}
		want := allowed
		if cpus != nil {
			want = *cpus
		}
		if got != want {
			t.Errorf("started on %v: runs on %q, want %q", cpus != nil, cpulist.Format(got), cpulist.Format(want))
		}
		if mine, err := cpulist.Allowed(); err != nil || mine != allowed {
			t.Errorf("after startOn the test runs on %q (%v)", cpulist.Format(mine), err)
		}
	}
}
