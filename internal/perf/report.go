package perf

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// Table lines of perftest (perftest_parameters.h).
const (
	resultLine   = "---------------------------------------------------------------------------------------\n"
	resultFmt    = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
	resultFmtG   = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
	resultFmtLat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
	// resultFmtLatDur heads the latency tests' -D results.
	resultFmtLatDur = " #bytes        #iterations       t_avg[usec]    tps average"

	reportFmt       = " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n"
	reportFmtExt    = " %-7d    %d           %-7.6f            %-7.6f            %-7.6f\n"
	reportFmtLat    = " %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n"
	reportFmtLatDur = " %-7d       %d            %-7.2f        %-7.2f\n"

	// Bytes per unit of the bandwidth columns: MB = 2^20 bytes, or
	// Gb = 125000000 bytes with --report_gbits (format_factor).
	mbFactor = 0x100000
	gbFactor = 125000000
)

// Result is one line of a test's results table.
type Result struct {
	Test string `json:"test"`
	// Side is "client" or "server"; Remote says the numbers are the
	// peer's, as a server of write_bw, read_bw and atomic_bw prints its
	// client's.
	Side   string `json:"side"`
	Remote bool   `json:"remote,omitempty"`
	// Size is the message size in bytes; Iters the messages counted
	// (all QPs').
	Size  int    `json:"bytes"`
	Iters uint64 `json:"iterations"`
	MTU   int    `json:"mtu"`
	QPs   int    `json:"qps"`
	// Duration is the -D run time in seconds, 0 for a run of iterations.
	Duration int        `json:"duration,omitempty"`
	BW       *BWResult  `json:"bw,omitempty"`
	Lat      *LatResult `json:"lat,omitempty"`
}

// BWResult holds a bandwidth line: peak and average in Unit (MB/sec, with
// 1 MB = 2^20 bytes, or Gb/sec) and the message rate in Mpps.
type BWResult struct {
	Unit    string  `json:"unit"`
	Peak    float64 `json:"peak"`
	Avg     float64 `json:"average"`
	MsgRate float64 `json:"msg_rate_mpps"`
}

// LatResult holds a latency line in microseconds: for WRITE and SEND half
// the round trip, for READ and atomics the whole. A -D run has only Avg
// and TPS (transactions per second).
type LatResult struct {
	Min     float64 `json:"t_min_usec,omitempty"`
	Max     float64 `json:"t_max_usec,omitempty"`
	Typical float64 `json:"t_typical_usec,omitempty"`
	Avg     float64 `json:"t_avg_usec"`
	Stdev   float64 `json:"t_stdev_usec,omitempty"`
	P99     float64 `json:"p99_usec,omitempty"`
	P999    float64 `json:"p99_9_usec,omitempty"`
	TPS     float64 `json:"tps,omitempty"`
}

// bwInput is what print_report_bw computes from: nanoseconds since an
// origin before the first post, per message (tposted, tcompleted), or one
// of each with noPeak or in a -D run.
type bwInput struct {
	size      int
	iters     uint64 // per QP (ITERATIONS), or the messages counted (-D)
	qps       int
	posted    []int64
	completed []int64
	noPeak    bool
	duration  bool
	cqMod     int
	gbits     bool
}

// computeBW is print_report_bw: the average over the whole run, the
// message rate, and unless noPeak the peak, the best time per message
// over any run of messages from a post to a completion.
func computeBW(in bwInput) BWResult {
	factor := float64(mbFactor)
	unit := "MB/sec"
	if in.gbits {
		factor, unit = gbFactor, "Gb/sec"
	}
	n := in.iters
	if !in.duration {
		n *= uint64(in.qps)
	}
	r := BWResult{Unit: unit}
	if n == 0 || len(in.posted) == 0 || len(in.completed) == 0 {
		return r
	}
	loc := 0
	if !in.noPeak {
		loc = int(n) - 1
	}
	if loc >= len(in.completed) {
		loc = len(in.completed) - 1
	}
	sum := float64(in.completed[loc]-in.posted[0]) / 1e9
	if sum <= 0 {
		return r
	}
	r.Avg = float64(in.size) * float64(n) / (sum * factor)
	r.MsgRate = float64(n) / sum / 1e6
	if in.noPeak || int(n) > len(in.posted) || int(n) > len(in.completed) {
		return r
	}
	// opt_delta starts at tcompleted[0] - tposted[0], which in perftest
	// wraps around (is "infinite") when the first message was not
	// signaled.
	opt := int64(math.MaxInt64)
	if in.completed[0] > 0 {
		opt = in.completed[0] - in.posted[0]
	}
	cq := max(in.cqMod, 1)
	N := int(n)
	for i := range N {
		for j := roundUp(i+1, cq) - 1; j < N; j += cq {
			if t := (in.completed[j] - in.posted[i]) / int64(j-i+1); t < opt {
				opt = t
			}
		}
		if N%cq != 0 {
			j := N - 1
			if t := (in.completed[j] - in.posted[i]) / int64(j-i+1); t < opt {
				opt = t
			}
		}
	}
	if opt > 0 && opt != math.MaxInt64 {
		r.Peak = float64(in.size) / (float64(opt) / 1e9) / factor
	}
	return r
}

func roundUp(v, a int) int {
	if v%a == 0 {
		return v
	}
	return v + a - v%a
}

// latMeasureTail is LAT_MEASURE_TAIL: the largest samples left out.
const latMeasureTail = 2

// computeLat is print_report_lat: deltas are the iters-1 round-trip
// times (ns) between consecutive posts; rtt is 2 for WRITE and SEND (a
// ping-pong's round trip holds two one-way trips) and 1 for READ and
// atomics.
func computeLat(deltas []int64, rtt int) LatResult {
	d := slices.Clone(deltas)
	slices.Sort(d)
	m := len(d) - latMeasureTail
	if m < 1 {
		return LatResult{}
	}
	q := 1000 * float64(rtt) // ns per reported microsecond
	us := func(v int64) float64 { return float64(v) / q }
	var median int64
	if (m-1)%2 != 0 {
		median = (d[m/2] + d[m/2-1]) / 2
	} else {
		median = d[m/2]
	}
	var sum float64
	for _, v := range d[:m] {
		sum += us(v)
	}
	avg := sum / float64(m)
	// perftest truncates each deviation and its square to int.
	var sq float64
	for _, v := range d[:m] {
		dev := int64(avg - us(v))
		sq += float64(dev * dev)
	}
	i99 := int(math.Ceil(float64(m) * 0.99))
	i999 := int(math.Ceil(float64(m) * 0.999))
	return LatResult{Min: us(d[0]), Max: us(d[m]), Typical: us(median), Avg: avg,
		Stdev: math.Sqrt(sq / float64(m)), P99: us(d[i99]), P999: us(d[i999])}
}

// computeLatDuration is print_report_lat_duration: the average over a -D
// run's sample time and the transactions per second.
func computeLatDuration(sampleNS int64, iters uint64, rtt int) LatResult {
	if iters == 0 || sampleNS <= 0 {
		return LatResult{}
	}
	us := float64(sampleNS) / 1000
	return LatResult{Avg: us / float64(rtt) / float64(iters), TPS: float64(iters) / (float64(sampleNS) / 1e9)}
}

// printer writes a test's output: perftest's tables, or JSON lines.
type printer struct {
	w    io.Writer
	json bool
}

func (p *printer) text(format string, args ...any) {
	if !p.json {
		fmt.Fprintf(p.w, format, args...)
	}
}

// result prints one result line.
func (p *printer) result(r Result, gbits bool) {
	if p.json {
		b, _ := json.Marshal(r)
		fmt.Fprintf(p.w, "%s\n", b)
		return
	}
	fmt.Fprint(p.w, formatResult(r, gbits))
}

// formatResult is the table line of a result (print_full_bw_report,
// print_report_lat, print_report_lat_duration).
func formatResult(r Result, gbits bool) string {
	switch {
	case r.BW != nil:
		if r.BW.Avg < 0.1 && gbits {
			return fmt.Sprintf(reportFmtExt, r.Size, r.Iters, r.BW.Peak, r.BW.Avg, r.BW.MsgRate)
		}
		return fmt.Sprintf(reportFmt, r.Size, r.Iters, r.BW.Peak, r.BW.Avg, r.BW.MsgRate)
	case r.Lat != nil && r.Duration > 0:
		return fmt.Sprintf(reportFmtLatDur, r.Size, r.Iters, r.Lat.Avg, r.Lat.TPS)
	case r.Lat != nil:
		l := r.Lat
		return fmt.Sprintf(reportFmtLat, r.Size, r.Iters, l.Min, l.Max, l.Typical, l.Avg, l.Stdev, l.P99, l.P999)
	}
	return ""
}

// header is the line above the results.
func header(t Test, duration, gbits bool) string {
	switch {
	case t.Kind == BW && gbits:
		return resultLine + resultFmtG + "\n"
	case t.Kind == BW:
		return resultLine + resultFmt + "\n"
	case duration:
		return resultLine + resultFmtLatDur + "\n"
	}
	return resultLine + resultFmtLat + "\n"
}

// cHex formats v as C's printf "%#0Nx" does: "0x" and zero padding to N
// characters in all, or only zeros for 0 (which gets no prefix).
func cHex(v uint64, width int) string {
	if v == 0 {
		return strings.Repeat("0", width)
	}
	s := fmt.Sprintf("%x", v)
	if len(s) < width-2 {
		s = strings.Repeat("0", width-2-len(s)) + s
	}
	return "0x" + s
}

// testInfo is ctx_print_test_info's banner.
func testInfo(p *params, device string, mtu int, gidIndex, inline, outReads int) string {
	var b strings.Builder
	t := p.Test
	b.WriteString(resultLine)
	fmt.Fprintf(&b, "                    %s\n", t.title(p.Atomic))
	fmt.Fprintf(&b, " Dual-port       : OFF\t\tDevice         : %s\n", device)
	fmt.Fprintf(&b, " Number of qps   : %d\t\tTransport type : IB\n", p.QPs)
	b.WriteString(" Connection type : RC\t\tUsing SRQ      : OFF\n")
	b.WriteString(" PCIe relax order: Unsupported\n")
	b.WriteString(" ibv_wr* API     : OFF\n")
	if !p.IsServer() {
		fmt.Fprintf(&b, " TX depth        : %d\n", p.tx)
	}
	if t.Verb == Send && p.IsServer() {
		fmt.Fprintf(&b, " RX depth        : %d\n", p.rx)
	}
	if t.Kind == BW {
		fmt.Fprintf(&b, " CQ Moderation   : %d\n", p.cqMod)
	}
	fmt.Fprintf(&b, " Mtu             : %d[B]\n", mtu)
	b.WriteString(" Link type       : Ethernet\n")
	fmt.Fprintf(&b, " GID index       : %d\n", gidIndex)
	if t.Verb != Read && t.Verb != Atomic {
		fmt.Fprintf(&b, " Max inline data : %d[B]\n", inline)
	} else {
		fmt.Fprintf(&b, " Outstand reads  : %d\n", outReads)
	}
	b.WriteString(" rdma_cm QPs\t : OFF\n")
	b.WriteString(" Data ex. method : Ethernet\n")
	b.WriteString(resultLine)
	return b.String()
}

// addressLine is ctx_print_pingpong_data: a QP's keys and its GID (whose
// bytes perftest prints in decimal).
func addressLine(d Dest, remote bool, v Verb) string {
	side := "local"
	if remote {
		side = "remote"
	}
	s := fmt.Sprintf(" %s address: LID %s QPN %s PSN %s", side, cHex(uint64(d.LID), 4), cHex(uint64(d.QPN), 6), cHex(uint64(d.PSN), 6))
	if v == Read {
		s += " OUT " + cHex(uint64(d.OutReads), 4)
	}
	if v == Read || v == Write {
		s += fmt.Sprintf(" RKey %s VAddr %s", cHex(uint64(d.RKey), 8), cHex(d.VAddr, 16))
	}
	g := make([]string, 16)
	for i, x := range d.GID {
		g[i] = fmt.Sprintf("%02d", x)
	}
	return s + "\n GID: " + strings.Join(g, ":") + "\n"
}
