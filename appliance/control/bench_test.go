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

// TestClientZeroAllocs: posting work requests and polling completions in
// the client library allocate nothing.
func TestClientZeroAllocs(t *testing.T) {
	r := newRig(t, true)
	a, b := newEnd(t, r.ca, verbs.RC, 1<<20), newEnd(t, r.cb, verbs.RC, 1<<20)
	connectRC(t, a, b, r.ga, r.gb)
	wr := []verbs.SendWR{{ID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(0, 64)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey}}
	wcs := make([]verbs.WC, 4)
	allocs := testing.AllocsPerRun(500, func() {
		if _, err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		spin(t, a.cq, wcs, 1)
	})
	if allocs != 0 {
		t.Fatalf("post + poll: %v allocations", allocs)
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

// BenchmarkLocalWrite1M: RDMA WRITE of 1 MiB over the local switch next
// to a plain copy of 1 MiB measured in the same run; write/copy is the
// ratio (target at least 0.5).
func BenchmarkLocalWrite1M(b *testing.B) {
	r := newRigMTU(b, true, 9000)
	const size = 1 << 20
	x, y := newEnd(b, r.ca, verbs.RC, 2*size), newEnd(b, r.cb, verbs.RC, 2*size)
	connectRCMTU(b, x, y, r.ga, r.gb, verbs.MTU4096)
	wr := []verbs.SendWR{{ID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{x.mr.SGE(0, size)},
		RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey}}
	wcs := make([]verbs.WC, 4)
	const depth = 8
	b.SetBytes(size)
	b.ResetTimer()
	start := time.Now()
	posted, done := 0, 0
	for done < b.N {
		for posted < b.N && posted-done < depth {
			if _, err := x.qp.PostSend(wr); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		k := x.cq.Poll(wcs)
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
	rdma := float64(b.N*size) / time.Since(start).Seconds()
	b.StopTimer()
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	n := max(b.N, 200)
	start = time.Now()
	for range n {
		copy(dst, src)
	}
	cp := float64(n*size) / time.Since(start).Seconds()
	b.ReportMetric(rdma/1e6, "write-MB/s")
	b.ReportMetric(cp/1e6, "copy-MB/s")
	b.ReportMetric(rdma/cp, "write/copy")
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
