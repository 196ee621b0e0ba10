package perf

import (
	"math"
	"strings"
	"testing"
)

// TestResultLinesGolden: result lines as rxe's perftest 4.5 printed them
// in the runs behind the shared vectors (peer/results/vector-runs).
func TestResultLinesGolden(t *testing.T) {
	for _, c := range []struct {
		r    Result
		want string
	}{
		{Result{Size: 64, Iters: 5, BW: &BWResult{Peak: 0.07, Avg: 0.07, MsgRate: 0.001079}},
			" 64         5                0.07               0.07   \t\t   0.001079\n"},
		{Result{Size: 2500, Iters: 5, BW: &BWResult{Peak: 4.91, Avg: 4.34, MsgRate: 0.001819}},
			" 2500       5                4.91               4.34   \t\t   0.001819\n"},
		{Result{Size: 8, Iters: 5, BW: &BWResult{Peak: 0.02, Avg: 0.01, MsgRate: 0.001847}},
			" 8          5                0.02               0.01   \t\t   0.001847\n"},
		{Result{Size: 2, Iters: 5, Lat: &LatResult{Min: 284.05, Max: 3590.50, Typical: 651.71, Avg: 651.71, Stdev: 367, P99: 3590.50, P999: 3590.50}},
			" 2       5          284.05         3590.50      651.71   \t       651.71      \t367.00 \t\t3590.50 \t\t3590.50\n"},
		{Result{Size: 2, Iters: 5, Lat: &LatResult{Min: 506.92, Max: 4845.80, Typical: 1775.08, Avg: 1775.08, Stdev: 1268, P99: 4845.80, P999: 4845.80}},
			" 2       5          506.92         4845.80      1775.08  \t       1775.08     \t1268.00\t\t4845.80 \t\t4845.80\n"},
		{Result{Size: 2500, Iters: 5, Lat: &LatResult{Min: 386.15, Max: 2431.57, Typical: 1314.45, Avg: 1314.45, Stdev: 928, P99: 2431.57, P999: 2431.57}},
			" 2500    5          386.15         2431.57      1314.45  \t       1314.45     \t928.00 \t\t2431.57 \t\t2431.57\n"},
	} {
		if got := formatResult(c.r, false); got != c.want {
			t.Errorf("got  %q\nwant %q", got, c.want)
		}
	}
	// -D latency lines and the Gb/sec lines of small rates.
	if got := formatResult(Result{Size: 2, Iters: 1234, Duration: 5, Lat: &LatResult{Avg: 3.5, TPS: 142857.14}}, false); got != " 2             1234            3.50           142857.14\n" {
		t.Errorf("%q", got)
	}
	if got := formatResult(Result{Size: 8, Iters: 5, BW: &BWResult{Peak: 0.001, Avg: 0.0005, MsgRate: 0.01}}, true); got != " 8          5           0.001000            0.000500            0.010000\n" {
		t.Errorf("%q", got)
	}
	if h := header(Test{Write, BW}, false, false); h != resultLine+" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n" {
		t.Errorf("%q", h)
	}
	if h := header(Test{Send, Lat}, false, false); h != resultLine+" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n" {
		t.Errorf("%q", h)
	}
}

// TestBannerGolden: the test information and address lines as rxe's
// perftest printed them, but for what differs by design (the device, and
// PCIe relaxed ordering, which has no meaning here).
func TestBannerGolden(t *testing.T) {
	p, err := resolve(Config{Test: Test{Read, BW}, Server: "10.99.0.3", Size: 64, Iters: 5, GIDIndex: 1, Margin: -1, Atomic: FetchAndAdd})
	if err != nil {
		t.Fatal(err)
	}
	want := `---------------------------------------------------------------------------------------
                    RDMA_Read BW Test
 Dual-port       : OFF		Device         : rxe0
 Number of qps   : 1		Transport type : IB
 Connection type : RC		Using SRQ      : OFF
 PCIe relax order: ON
 ibv_wr* API     : OFF
 TX depth        : 5
 CQ Moderation   : 5
 Mtu             : 1024[B]
 Link type       : Ethernet
 GID index       : 1
 Outstand reads  : 128
 rdma_cm QPs	 : OFF
 Data ex. method : Ethernet
---------------------------------------------------------------------------------------
`
	want = strings.Replace(want, "PCIe relax order: ON", "PCIe relax order: Unsupported", 1)
	if got := testInfo(p, "rxe0", 1024, 1, 0, 128); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	p, _ = resolve(Config{Test: Test{Send, Lat}, Size: 2, Iters: 5, GIDIndex: 1, Margin: -1, Atomic: FetchAndAdd})
	if got := testInfo(p, "rxe0", 1024, 1, 0, 1); !strings.Contains(got, "                    Send Latency Test\n") ||
		!strings.Contains(got, " RX depth        : 6\n") || strings.Contains(got, "TX depth") || strings.Contains(got, "CQ Moderation") {
		t.Errorf("send_lat server banner:\n%s", got)
	}

	local := Dest{OutReads: 0x80, QPN: 0x18, PSN: 0x2618d6, RKey: 0x9b8, VAddr: 0x561138362000, GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 99, 15: 3}}
	if got := addressLine(local, false, Read); got != " local address: LID 0000 QPN 0x0018 PSN 0x2618d6 OUT 0x80 RKey 0x0009b8 VAddr 0x00561138362000\n GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:99:00:03\n" {
		t.Errorf("%q", got)
	}
	w := Dest{QPN: 0x15, PSN: 0x5847a7, RKey: 0x62d, VAddr: 0x55efb86f8000, GID: local.GID}
	if got := addressLine(w, true, Write); got != " remote address: LID 0000 QPN 0x0015 PSN 0x5847a7 RKey 0x00062d VAddr 0x0055efb86f8000\n GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:99:00:03\n" {
		t.Errorf("%q", got)
	}
	if got := addressLine(Dest{QPN: 0x13, PSN: 0xb0d97c}, false, Send); !strings.HasPrefix(got, " local address: LID 0000 QPN 0x0013 PSN 0xb0d97c\n") {
		t.Errorf("%q", got)
	}
	for v, want := range map[uint64]string{0: "0000", 0x80: "0x80", 0x1234: "0x1234", 0x12345: "0x12345"} {
		if got := cHex(v, 4); got != want {
			t.Errorf("cHex(%#x, 4) = %q, want %q", v, got, want)
		}
	}
}

// TestComputeLat follows print_report_lat by hand.
func TestComputeLat(t *testing.T) {
	// Post times 0, 10, 30, 33, 43 µs: round trips 10, 20, 3, 10.
	deltas := []int64{10000, 20000, 3000, 10000}
	l := computeLat(deltas, 2)
	// Sorted 3, 10, 10, 20; the two largest left out: 3 and 10, halved.
	want := LatResult{Min: 1.5, Max: 5, Typical: 3.25, Avg: 3.25, Stdev: 1, P99: 5, P999: 5}
	if l != want {
		t.Errorf("got %+v, want %+v", l, want)
	}
	// READ: whole round trips; an odd count takes the middle one.
	l = computeLat([]int64{4000, 1000, 2000, 3000, 100000, 90000}, 1)
	if l.Typical != 2.5 || l.Min != 1 || l.Max != 90 || l.Avg != 2.5 {
		t.Errorf("%+v", l)
	}
	l = computeLat([]int64{1000, 2000, 3000, 100000, 90000}, 1)
	if l.Typical != 2 || l.Max != 90 {
		t.Errorf("%+v", l)
	}
	if l := computeLat([]int64{1, 2}, 2); l != (LatResult{}) {
		t.Errorf("too few samples: %+v", l)
	}
	d := computeLatDuration(2e9, 1000, 2)
	if d.Avg != 1000 || d.TPS != 500 {
		t.Errorf("%+v", d)
	}
}

// TestComputeBW follows print_report_bw by hand.
func TestComputeBW(t *testing.T) {
	const s = int64(1e9)
	in := bwInput{size: 1 << 20, iters: 4, qps: 1, cqMod: 1,
		posted:    []int64{1 * s, 2 * s, 3 * s, 4 * s},
		completed: []int64{2 * s, 3 * s, 4 * s, 9 * s / 2}}
	r := computeBW(in)
	// 4 MiB in 3.5 s; the fastest run is the last message, 0.5 s.
	if math.Abs(r.Avg-4/3.5) > 1e-9 || math.Abs(r.MsgRate-4/3.5/1e6) > 1e-15 || r.Peak != 2 || r.Unit != "MB/sec" {
		t.Errorf("%+v", r)
	}
	// A completion every second message: only completed[1] and [3] are
	// known, and opt_delta does not start from completed[0].
	in.cqMod = 2
	in.completed = []int64{0, 3 * s, 0, 6 * s}
	r = computeBW(in)
	// Runs ending at 1 and 3: (3-1)/2, (3-2)/1, (6-1)/4, (6-2)/3, (6-3)/2, (6-4)/1: best 1 s.
	if r.Peak != 1 || math.Abs(r.Avg-4.0/5) > 1e-9 {
		t.Errorf("%+v", r)
	}
	// No peak: one time each; Gb/sec.
	r = computeBW(bwInput{size: 125000000, iters: 8, qps: 2, noPeak: true, gbits: true, posted: []int64{0}, completed: []int64{2 * s}})
	if r.Peak != 0 || r.Avg != 8 || r.Unit != "Gb/sec" || r.MsgRate != 8e-6 {
		t.Errorf("%+v", r)
	}
	// A -D run counts messages across QPs itself.
	r = computeBW(bwInput{size: 1 << 20, iters: 10, qps: 4, noPeak: true, duration: true, posted: []int64{s}, completed: []int64{6 * s}})
	if r.Avg != 2 {
		t.Errorf("%+v", r)
	}
}
