package control_test

import (
	"runtime"
	"sort"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/verbs"
)

// spin polls cq until it has n completions; it fails on an error status.
func spin(tb testing.TB, cq *verbs.CQ, wcs []verbs.WC, n int) {
	got := 0
	deadline := time.Now().Add(10 * time.Second)
	for got < n {
		k := cq.Poll(wcs)
		for _, wc := range wcs[:max(k, 0)] {
			if wc.Status != verbs.WCSuccess {
				tb.Fatalf("completion %+v", wc)
			}
		}
		got += k
		if k == 0 {
			if time.Now().After(deadline) {
				tb.Fatalf("%d of %d completions", got, n)
			}
			// Client and appliance share this process's threads here;
			// between processes the kernel would run them side by side.
			runtime.Gosched()
		}
	}
}

// TestClientZeroAllocs: posting work requests and polling completions
// allocate nothing, in the client library or in the appliance, over the
// local switch: a WRITE, a whole-message READ, and a burst of atomics
// whose sixteen answers the responder sends together (one batch each
// once outnumbered the engine's batches, which it then made anew).
func TestClientZeroAllocs(t *testing.T) {
	r := newRig(t, true)
	a, b := newEnd(t, r.ca, verbs.RC, 1<<20), newEnd(t, r.cb, verbs.RC, 1<<20)
	connectRC(t, a, b, r.ga, r.gb)
	one := func(op verbs.Opcode, n int) []verbs.SendWR {
		return []verbs.SendWR{{ID: 1, Opcode: op, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(0, n)},
			RemoteAddr: b.mr.Addr() + 4096, RKey: b.mr.RKey, CompareAdd: 1}}
	}
	var burst []verbs.SendWR
	for range 16 {
		burst = append(burst, one(verbs.WRAtomicFetchAdd, 8)[0])
	}
	wcs := make([]verbs.WC, 16)
	for _, c := range []struct {
		name string
		wrs  []verbs.SendWR
	}{
		{"write 64 B", one(verbs.WRRDMAWrite, 64)},
		{"read 64 KiB", one(verbs.WRRDMARead, 64<<10)},
		{"16 atomics", burst},
	} {
		allocs := testing.AllocsPerRun(500, func() {
			if _, err := a.qp.PostSend(c.wrs); err != nil {
				t.Fatal(err)
			}
			spin(t, a.cq, wcs, len(c.wrs))
		})
		if allocs != 0 {
			t.Errorf("%s: post + poll: %v allocations", c.name, allocs)
		}
	}
}

// BenchmarkPostPoll: one signaled 64-byte RDMA WRITE posted on the shared
// ring and its completion polled, over the local switch: the round trip
// client → appliance → transport → peer → completion → client.
func BenchmarkPostPoll(b *testing.B) {
	for _, local := range []bool{true, false} {
		name := map[bool]string{true: "local-switch", false: "fake-wire"}[local]
		b.Run(name, func(b *testing.B) {
			r := newRig(b, local)
			x, y := newEnd(b, r.ca, verbs.RC, 1<<20), newEnd(b, r.cb, verbs.RC, 1<<20)
			connectRC(b, x, y, r.ga, r.gb)
			wr := []verbs.SendWR{{ID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{x.mr.SGE(0, 64)},
				RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey}}
			wcs := make([]verbs.WC, 4)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := x.qp.PostSend(wr); err != nil {
					b.Fatal(err)
				}
				spin(b, x.cq, wcs, 1)
			}
		})
	}
}

// BenchmarkLocal1M: RDMA WRITE and RDMA READ of 1 MiB over the local
// switch, eight in flight, next to a plain copy of 1 MiB measured in the
// same run: write/copy (target at least 0.8) and read/write (target at
// least 0.8) are the ratios.
func BenchmarkLocal1M(b *testing.B) {
	r := newRigMTU(b, true, 9000)
	const size = 1 << 20
	x, y := newEnd(b, r.ca, verbs.RC, 2*size), newEnd(b, r.cb, verbs.RC, 2*size)
	connectRCMTU(b, x, y, r.ga, r.gb, verbs.MTU4096)
	rate := func(op verbs.Opcode, n int) float64 {
		wr := []verbs.SendWR{{ID: 1, Opcode: op, Flags: verbs.SendSignaled, SGL: []verbs.SGE{x.mr.SGE(0, size)},
			RemoteAddr: y.mr.Addr() + size, RKey: y.mr.RKey}}
		return streamOps(b, x, wr, n, 8, size)
	}
	b.SetBytes(size)
	b.ResetTimer()
	write := rate(verbs.WRRDMAWrite, b.N)
	read := rate(verbs.WRRDMARead, b.N)
	b.StopTimer()
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	n := max(b.N, 200)
	start := time.Now()
	for range n {
		copy(dst, src)
	}
	cp := float64(n*size) / time.Since(start).Seconds()
	b.ReportMetric(write/1e6, "write-MB/s")
	b.ReportMetric(read/1e6, "read-MB/s")
	b.ReportMetric(cp/1e6, "copy-MB/s")
	b.ReportMetric(write/cp, "write/copy")
	b.ReportMetric(read/write, "read/write")
}

// BenchmarkLocalAtomic: 8-byte FETCH_ADDs over the local switch, sixteen
// in flight (the QPs' max_rd_atomic), next to 8-byte RDMA WRITEs in the
// same run: atomic/write is the ratio of their rates.
func BenchmarkLocalAtomic(b *testing.B) {
	r := newRig(b, true)
	x, y := newEnd(b, r.ca, verbs.RC, 4096), newEnd(b, r.cb, verbs.RC, 4096)
	connectRC(b, x, y, r.ga, r.gb)
	add := []verbs.SendWR{{ID: 1, Opcode: verbs.WRAtomicFetchAdd, Flags: verbs.SendSignaled, SGL: []verbs.SGE{x.mr.SGE(0, 8)},
		RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey, CompareAdd: 1}}
	write := []verbs.SendWR{{ID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{x.mr.SGE(0, 8)},
		RemoteAddr: y.mr.Addr() + 64, RKey: y.mr.RKey}}
	b.ResetTimer()
	atomics := streamOps(b, x, add, b.N, 16, 1)
	writes := streamOps(b, x, write, b.N, 16, 1)
	b.StopTimer()
	b.ReportMetric(atomics, "atomics/s")
	b.ReportMetric(atomics/writes, "atomic/write")
}

// streamOps posts wr n times from e, at most depth in flight, polling
// completions as they come; it returns the rate in units per second, each
// work request counting unit.
func streamOps(b *testing.B, e *end, wr []verbs.SendWR, n, depth, unit int) float64 {
	wcs := make([]verbs.WC, 16)
	start := time.Now()
	posted, done := 0, 0
	for done < n {
		for posted < n && posted-done < depth {
			if _, err := e.qp.PostSend(wr); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		k := e.cq.Poll(wcs)
		for _, wc := range wcs[:max(k, 0)] {
			if wc.Status != verbs.WCSuccess {
				b.Fatalf("completion %+v", wc)
			}
		}
		done += k
		if k == 0 {
			runtime.Gosched()
		}
	}
	return float64(n*unit) / time.Since(start).Seconds()
}

// BenchmarkLocalSendPingPong: 2-byte SENDs bounced between two clients
// over the local switch; the median one-way time (half a round trip) is
// reported (target at most 5 µs).
func BenchmarkLocalSendPingPong(b *testing.B) {
	for _, m := range []struct {
		name string
		mode appliance.PollMode
	}{{"adaptive", appliance.PollAdaptive}, {"block", appliance.PollBlock}, {"spin", appliance.PollSpin}} {
		b.Run(m.name, func(b *testing.B) { localPingPong(b, m.mode) })
	}
}

func localPingPong(b *testing.B, mode appliance.PollMode) {
	r := newRigOpts(b, true, 1500, mode)
	x, y := newEnd(b, r.ca, verbs.RC, 4096), newEnd(b, r.cb, verbs.RC, 4096)
	connectRC(b, x, y, r.ga, r.gb)
	recv := func(e *end) {
		if _, err := e.qp.PostRecv([]verbs.RecvWR{{ID: 9, SGL: []verbs.SGE{e.mr.SGE(64, 64)}}}); err != nil {
			b.Fatal(err)
		}
	}
	send := []verbs.SendWR{{ID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled | verbs.SendInline, Inline: []byte("pp")}}
	recv(x)
	recv(y)
	wcs := make([]verbs.WC, 4)
	// The peer echoes in a goroutine of its own, like another process.
	stop := make(chan struct{})
	echoed := make(chan struct{})
	go func() {
		defer close(echoed)
		ywcs := make([]verbs.WC, 4)
		for {
			k := y.cq.Poll(ywcs)
			for _, wc := range ywcs[:max(k, 0)] {
				if wc.Opcode == verbs.WCRecv {
					recv(y)
					if _, err := y.qp.PostSend(send); err != nil {
						return
					}
				}
			}
			select {
			case <-stop:
				return
			default:
			}
			if k == 0 {
				runtime.Gosched()
			}
		}
	}()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		if _, err := x.qp.PostSend(send); err != nil {
			b.Fatal(err)
		}
		for got := false; !got; {
			k := x.cq.Poll(wcs)
			for _, wc := range wcs[:max(k, 0)] {
				if wc.Status != verbs.WCSuccess {
					b.Fatalf("%+v", wc)
				}
				if wc.Opcode == verbs.WCRecv {
					got = true
				}
			}
			if k == 0 {
				runtime.Gosched()
			}
		}
		lat = append(lat, time.Since(t0))
		recv(x)
	}
	b.StopTimer()
	close(stop)
	<-echoed
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/2/1000, "median-µs/one-way")
	}
}
