package transport

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/decode"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// ccAt drives one congestion state on a fake clock: each round trip, the
// window's packets are sent as one stamped request and acknowledged rtt
// later.
type ccAt struct {
	c    congestion
	now  time.Time
	psn  roce.PSN
	cuts atomic.Uint64
}

func newCCAt(window int) *ccAt {
	a := &ccAt{now: time.Unix(1000, 0)}
	// A drop on the path a while ago: the delay rule is awake.
	a.c.reset(true, window, 0, a.now, &a.cuts, &ccPath{dropAt: a.now.Add(-time.Second)})
	return a
}

// round sends a window, waits rtt and takes its acknowledgement.
func (a *ccAt) round(rtt time.Duration, max int) {
	n := a.c.limit(max)
	a.psn = a.psn.Add(n)
	a.c.sent(a.psn.Add(-1), a.now)
	a.now = a.now.Add(rtt)
	a.c.acked(a.psn.Add(-1), n, max, a.now)
}

func TestCongestionSignals(t *testing.T) {
	const max = 128
	base := 50 * time.Microsecond
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, a *ccAt)
		// want checks the state after the run.
		want func(a *ccAt) string
	}{
		{"open path: the whole window, no cut", func(t *testing.T, a *ccAt) {
			for range 100 {
				a.round(base, max)
			}
		}, func(a *ccAt) string {
			if a.c.limit(max) != max || a.cuts.Load() != 0 {
				return "cut on an open path"
			}
			return ""
		}},
		{"a queue for three epochs cuts, in proportion", func(t *testing.T, a *ccAt) {
			for range 10 {
				a.round(base, max)
			}
			for range 4 {
				a.round(4*base, max) // 200 µs: 100 µs over the target
			}
		}, func(a *ccAt) string {
			if a.cuts.Load() == 0 || a.c.cwnd >= max || a.c.cwnd < max*(1-ccMaxCut)*(1-ccMaxCut) {
				return "want a cut of at most half a round trip"
			}
			return ""
		}},
		{"without a drop on the path, delay does not cut", func(t *testing.T, a *ccAt) {
			a.c.path.dropAt = time.Time{}
			for range 10 {
				a.round(base, max)
			}
			for range 10 {
				a.round(4*base, max)
			}
		}, func(a *ccAt) string {
			if a.cuts.Load() != 0 {
				return "delay cut where no queue had overflowed"
			}
			return ""
		}},
		{"one late epoch is not a queue", func(t *testing.T, a *ccAt) {
			for range 10 {
				a.round(base, max)
			}
			a.round(20*base, max)
			for range 10 {
				a.round(base, max)
			}
		}, func(a *ccAt) string {
			if a.cuts.Load() != 0 {
				return "a single late round trip cut the window"
			}
			return ""
		}},
		{"a slower host raises the base within two periods", func(t *testing.T, a *ccAt) {
			for range 10 {
				a.round(base, max)
			}
			// Every round trip 10× longer for good: cuts at first, then
			// the base follows and the window grows back.
			for a.now.Before(time.Unix(1000, 0).Add(2*ccBasePeriod + 10*time.Millisecond)) {
				a.round(10*base, max)
			}
			a.c.cwnd = 8
			for range 200 {
				a.round(10*base, max)
			}
		}, func(a *ccAt) string {
			if a.c.cwnd < 8+100 && a.c.cwnd < max {
				return "the window did not grow once the base followed the host"
			}
			return ""
		}},
		{"loss halves once per episode", func(t *testing.T, a *ccAt) {
			a.c.cwnd = 64
			a.c.loss(a.psn.Add(64), a.now)
			a.c.loss(a.psn.Add(64), a.now) // the same episode
		}, func(a *ccAt) string {
			if a.c.cwnd != 32 || a.cuts.Load() != 1 {
				return "want one halving"
			}
			return ""
		}},
		{"a new episode after the old one is acknowledged", func(t *testing.T, a *ccAt) {
			a.c.cwnd = 64
			a.c.loss(a.psn.Add(10), a.now)
			a.c.acked(a.psn.Add(10), 10, max, a.now) // the episode ends
			a.c.loss(a.psn.Add(20), a.now)
		}, func(a *ccAt) string {
			if a.cuts.Load() != 2 || a.c.cwnd > 17 {
				return "want two halvings"
			}
			return ""
		}},
		{"CNPs cut by alpha/2 once a round trip and rest the delay rule", func(t *testing.T, a *ccAt) {
			for range 10 {
				a.round(base, max)
			}
			// alpha, 1 at the start, decays by g each 55 µs without a
			// CNP, and rises by g of what it lacks with one.
			a.c.decayAlpha(a.now)
			slots := int(a.now.Sub(time.Unix(1000, 0)) / ccAlphaSlot)
			if want := math.Pow(1-ccAlphaGain, float64(slots)); math.Abs(a.c.alpha-want) > 1e-9 {
				t.Fatalf("alpha %v after %d slots, want %v", a.c.alpha, slots, want)
			}
			alpha := a.c.alpha + ccAlphaGain*(1-a.c.alpha)
			defer func() { t.Logf("alpha at the CNP %v", alpha) }()
			a.c.cwnd = max
			a.c.cnp(a.now, a.psn.Add(-1), a.psn.Add(8))
			a.c.cnp(a.now.Add(time.Millisecond), a.psn.Add(-1), a.psn.Add(8)) // before the cut's window is acknowledged
		}, func(a *ccAt) string {
			if a.cuts.Load() != 1 || a.c.cwnd >= max || a.c.cwnd < max*0.5 {
				return "want one cut by alpha/2"
			}
			for range 5 {
				a.round(4*base, max) // a queue for five epochs: cut but for the CNPs
			}
			if a.cuts.Load() != 1 {
				return "the delay rule cut while CNPs flow"
			}
			return ""
		}},
		{"a QP starts in slow start: ccInitWindow, doubling each round trip", func(t *testing.T, a *ccAt) {
			if a.c.limit(max) != ccInitWindow || !a.c.slow {
				t.Fatalf("started with %d packets, slow start %v; want %d, slow start", a.c.limit(max), a.c.slow, ccInitWindow)
			}
			for want := 2 * ccInitWindow; want <= max; want *= 2 {
				a.round(base, max)
				if got := a.c.limit(max); got != want {
					t.Fatalf("window %d after a round trip, want %d", got, want)
				}
			}
		}, func(a *ccAt) string {
			if a.cuts.Load() != 0 {
				return "slow start cut an open path"
			}
			return ""
		}},
		{"slow start ends without a cut when a queue begins", func(t *testing.T, a *ccAt) {
			for range 2 {
				a.round(base, max)
			}
			a.round(4*base, max) // one epoch above the target
		}, func(a *ccAt) string {
			if a.c.slow || a.cuts.Load() != 0 || a.c.cwnd < 4*ccInitWindow {
				return "want slow start over, and no cut"
			}
			return ""
		}},
		{"round trips near the ACK timeout wake the delay rule with no drop", func(t *testing.T, a *ccAt) {
			a.c.path.dropAt = time.Time{}
			a.c.setTimeout(64 * time.Millisecond) // wakes above 8 ms
			for range 10 {
				a.round(time.Millisecond, max)
			}
			for range 4 {
				a.round(10*time.Millisecond, max)
			}
		}, func(a *ccAt) string {
			if a.cuts.Load() == 0 {
				return "round trips of 10 ms against a 64 ms timeout did not cut"
			}
			return ""
		}},
		{"round trips far from the ACK timeout leave the rule asleep", func(t *testing.T, a *ccAt) {
			a.c.path.dropAt = time.Time{}
			a.c.setTimeout(64 * time.Millisecond)
			for range 10 {
				a.round(time.Millisecond, max)
			}
			for range 10 {
				a.round(6*time.Millisecond, max)
			}
		}, func(a *ccAt) string {
			if a.cuts.Load() != 0 {
				return "round trips of 6 ms against a 64 ms timeout cut"
			}
			return ""
		}},
		{"after ccForget without a signal the window doubles each round trip", func(t *testing.T, a *ccAt) {
			a.c.cwnd = 4
			a.c.slow, a.c.signalAt = false, a.now
			a.now = a.now.Add(ccForget + time.Millisecond)
			for range 5 {
				a.round(base, max)
			}
		}, func(a *ccAt) string {
			if a.c.cwnd < 100 {
				return "slow start did not return"
			}
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newCCAt(max)
			tc.run(t, a)
			if msg := tc.want(a); msg != "" {
				t.Errorf("%s: cwnd %.1f, cuts %d, base %v/%v, srtt %v", msg, a.c.cwnd, a.cuts.Load(), a.c.path.base, a.c.path.basePrev, a.c.srtt)
			}
		})
	}
}

// TestCongestionAckEvery: a window smaller than maxPktsPerAck still asks
// for two acknowledgements a window, or it would wait for the timeout.
func TestCongestionAckEvery(t *testing.T) {
	a := newCCAt(128)
	for _, tc := range []struct {
		cwnd float64
		want int
	}{{128, 32}, {16, 8}, {3, 1}, {1, 1}} {
		a.c.cwnd = tc.cwnd
		if got := a.c.ackEvery(32); got != tc.want {
			t.Errorf("cwnd %v: ackEvery %d, want %d", tc.cwnd, got, tc.want)
		}
	}
}

// TestCongestionFlowScaling: a small window tolerates more delay, up to
// ccFlowRange at the least window and nothing at the fixed one.
func TestCongestionFlowScaling(t *testing.T) {
	a := newCCAt(128)
	prev := time.Duration(-1)
	for _, w := range []float64{128, 64, 16, 4, 1} {
		a.c.cwnd = w
		fs := a.c.flowScaling()
		if fs < prev || fs < 0 || fs > ccFlowRange {
			t.Errorf("cwnd %v: flow scaling %v after %v, want growing as the window shrinks, within 0..%v", w, fs, prev, ccFlowRange)
		}
		prev = fs
	}
	if a.c.cwnd = 128; a.c.flowScaling() != 0 {
		t.Errorf("the fixed window: %v, want 0", a.c.flowScaling())
	}
	if a.c.cwnd = 1; a.c.flowScaling() < ccFlowRange-time.Microsecond {
		t.Errorf("the least window: %v, want %v", a.c.flowScaling(), ccFlowRange)
	}
}

// TestCongestionCNP: with ECT on, A's requests leave ECT(0); the link
// marks some CE; B answers them with CNPs, which A takes: its window is
// cut, and every WRITE still completes with its data. B's frames,
// captured as pcap and read back, decode as taproce decode shows them:
// CNPs to A's QP, BECN set, PSN 0.
func TestCongestionCNP(t *testing.T) {
	s := newSim(t, impair.Spec{}, 9000)
	s.a.eng.cfg.ECT = true
	c := s.connect(connOpts{pmtu: abi.MTU4096, size: 4 << 20})
	var pcap bytes.Buffer
	w, err := capture.NewWriter(&pcap)
	must(t, err)
	s.b.watch = func(f []byte) { must(t, w.WriteFrame(s.clock.now, f)) }
	var requests, notECT, marked int
	s.a.drop = func(f []byte) bool {
		var p roce.Packet
		if roce.Parse(f, &p) != nil || !p.Info().Has(roce.Request) {
			return false
		}
		requests++
		if p.TOS&roce.ECNMask != roce.ECT0 {
			notECT++
		}
		if requests%8 == 0 {
			// CE, and the IPv4 header checksum again; the ICRC does not
			// cover the ECN bits.
			f[15] |= roce.ECNCE
			f[24], f[25] = 0, 0
			var sum uint32
			for i := 14; i < 34; i += 2 {
				sum += uint32(f[i])<<8 | uint32(f[i+1])
			}
			for sum > 0xffff {
				sum = sum&0xffff + sum>>16
			}
			f[24], f[25] = byte(^sum>>8), byte(^sum)
			marked++
		}
		return false
	}
	for i := range c.bufa[:1<<20] {
		c.bufa[i] = byte(i * 7)
	}
	var wrs []SendWR
	for i := range 16 {
		wrs = append(wrs, SendWR{ID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
			SGL:        []SGE{{Addr: 0x10000 + uint64(i)<<16, Length: 1 << 16, LKey: c.mra.LKey}},
			RemoteAddr: 0x10000 + 2<<20 + uint64(i)<<16, RKey: c.mrb.RKey})
	}
	_, err = c.qa.PostSend(wrs)
	must(t, err)
	var got []WC
	s.run(1000000, func() bool { got = append(got, poll(c.cqa)...); return len(got) == len(wrs) })
	must(t, w.Flush())
	frames, err := capture.NewReader(&pcap)
	must(t, err)
	cnps := 0
	for n := 1; ; n++ {
		f, err := frames.Next()
		if err == io.EOF {
			break
		}
		must(t, err)
		r := decode.Decode(n, f.Time, f.Data)
		if r.Error != "" {
			t.Fatalf("frame %d: %s", n, r.Error)
		}
		if r.Opcode == "CNP" {
			cnps++
			if !r.BECN || r.PSN != 0 || r.DestQP != c.qa.Num() || r.AckReq {
				t.Errorf("CNP decoded as %+v: want BECN, PSN 0, A's QP %#x, no AckReq", r, c.qa.Num())
			}
		}
	}
	for i, wc := range got {
		if wc.Status != abi.WCSuccess || wc.ID != uint64(i) {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	if !bytes.Equal(c.bufb[2<<20:3<<20], c.bufa[:1<<20]) {
		t.Error("WRITE data differs")
	}
	sa, sb := s.a.eng.Stats(), s.b.eng.Stats()
	t.Logf("%d requests, %d marked CE; B sent %d CNPs, A received %d, cut its window %d times to %.1f packets",
		requests, marked, sb.CNPsSent, sa.CNPsReceived, sa.WindowCuts, c.qa.cc.cwnd)
	if notECT != 0 {
		t.Errorf("%d of %d requests were not ECT(0)", notECT, requests)
	}
	if sb.CNPsSent == 0 || sa.CNPsReceived != sb.CNPsSent || sa.WindowCuts == 0 || c.qa.cc.cwnd >= float64(c.qa.maxWindow()) {
		t.Error("want CNPs sent for the marks, every one received, and the window cut")
	}
	if cnps != int(sb.CNPsSent) {
		t.Errorf("the capture decodes %d CNPs, B sent %d", cnps, sb.CNPsSent)
	}
	if sa.CNPsSent != 0 || sb.CNPsReceived != 0 {
		t.Errorf("CNPs the other way: A sent %d, B received %d", sa.CNPsSent, sb.CNPsReceived)
	}
}

// TestCongestionLink runs the control loop against the impairment's
// modelled link — a rate and a drop-tail queue, on the fake clock — with
// QPs that keep 16 WRITEs of 64 KiB posted until each has written its
// share: the flows take the link's rate (less the headers) and share it,
// and what they send again stays small. Each QP starts in slow start, so
// the least round trip is measured on the empty link; drop-tail queues
// smaller than the flows' bursts still cost packets sent again — 0.23 %
// with one QP and 128 KiB, 1.6 % with four and 256 KiB (0.7 % and 3.3 %
// when a QP started with its whole fixed window) — where ECN and a queue
// that holds the bursts cost next to none. The bounds hold what this
// control reaches, so that a change that loses it fails.
func TestCongestionLink(t *testing.T) {
	const rate = 1e9 // bits/s
	for _, tc := range []struct {
		name     string
		spec     impair.Spec
		qps      int
		ect      bool
		minRate  float64 // of the link's, in payload
		maxAgain float64 // packets sent again, of those needed
		drops    bool    // the queue may drop
	}{
		{"one QP, a 128 KiB queue", impair.Spec{Rate: rate, Queue: 128 << 10}, 1, false, 0.9, 0.005, true},
		{"one QP, a 1 MiB queue", impair.Spec{Rate: rate, Queue: 1 << 20}, 1, false, 0.95, 0, false},
		{"four QPs, a 256 KiB queue", impair.Spec{Rate: rate, Queue: 256 << 10}, 4, false, 0.9, 0.03, true},
		{"four QPs, a 1 MiB queue", impair.Spec{Rate: rate, Queue: 1 << 20}, 4, false, 0.95, 0.01, true},
		{"one QP, ECN from 32 KiB", impair.Spec{Rate: rate, Queue: 1 << 20, ECN: 32 << 10}, 1, true, 0.95, 0, false},
		{"four QPs, ECN from 32 KiB", impair.Spec{Rate: rate, Queue: 1 << 20, ECN: 32 << 10}, 4, true, 0.95, 0.01, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, tc.spec, 9000)
			s.a.eng.cfg.ECT = tc.ect
			const msg, depth = 64 << 10, 16
			share := (256 << 20) / tc.qps
			type flow struct {
				c            *conn
				posted, done int
				end          time.Time
			}
			flows := make([]*flow, tc.qps)
			for i := range flows {
				flows[i] = &flow{c: s.connect(connOpts{pmtu: abi.MTU4096, size: depth * msg, retry: 7, rnr: 7})}
			}
			post := func(f *flow) {
				var wrs []SendWR
				for ; f.posted-f.done < depth && f.posted*msg < share; f.posted++ {
					off := uint64(f.posted%depth) * msg
					wrs = append(wrs, SendWR{ID: uint64(f.posted), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
						SGL: []SGE{{Addr: 0x10000 + off, Length: msg, LKey: f.c.mra.LKey}}, RemoteAddr: 0x10000 + off, RKey: f.c.mrb.RKey})
				}
				if len(wrs) > 0 {
					_, err := f.c.qa.PostSend(wrs)
					must(t, err)
				}
			}
			start := s.clock.now
			for _, f := range flows {
				post(f)
			}
			s.run(50_000_000, func() bool {
				all := true
				for _, f := range flows {
					for _, wc := range poll(f.c.cqa) {
						if wc.Status != abi.WCSuccess {
							t.Fatalf("completion %+v", wc)
						}
						f.done++
					}
					if f.done*msg >= share {
						if f.end.IsZero() {
							f.end = s.clock.now
						}
					} else {
						all = false
						post(f)
					}
				}
				return all
			})
			var rates []float64
			end := start
			for _, f := range flows {
				rates = append(rates, float64(share)*8/f.end.Sub(start).Seconds())
				if f.end.After(end) {
					end = f.end
				}
			}
			got := float64(share*tc.qps) * 8 / end.Sub(start).Seconds() / rate
			needed := share * tc.qps / 4096
			sent := int(s.a.eng.Stats().Sent)
			again := float64(sent-needed) / float64(needed)
			st, link := s.a.eng.Stats(), s.a.im.Counters()
			t.Logf("%.1f %% of the link in payload, rates %s Mb/s, Jain %.3f; %d packets for %d, %.2f %% again; queue drops %d, CE marks %d, CNPs %d, window cuts %d",
				100*got, mbs(rates), jain(rates), sent, needed, 100*again, link.QueueDropped, link.Marked, st.CNPsReceived, st.WindowCuts)
			if got < tc.minRate || again > tc.maxAgain || !tc.drops && link.QueueDropped != 0 {
				t.Errorf("want ≥ %.0f %% of the link, ≤ %.1f %% sent again, drops allowed %v", 100*tc.minRate, 100*tc.maxAgain, tc.drops)
			}
			if tc.qps > 1 && jain(rates) < 0.98 {
				t.Errorf("Jain's index %.3f, want ≥ 0.98", jain(rates))
			}
			if tc.ect && (link.Marked == 0 || st.CNPsReceived == 0) {
				t.Error("want CE marks and CNPs")
			}
		})
	}
}

// jain is Jain's fairness index of xs: 1 when all are equal.
func jain(xs []float64) float64 {
	var s, q float64
	for _, x := range xs {
		s += x
		q += x * x
	}
	return s * s / (float64(len(xs)) * q)
}

// mbs writes bit rates in Mb/s.
func mbs(xs []float64) string {
	var b strings.Builder
	for i, x := range xs {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.0f", x/1e6)
	}
	return b.String()
}

// TestCongestionPaths: the QPs to one address share one path (its least
// round trip), which goes with the last of them.
func TestCongestionPaths(t *testing.T) {
	s := newSim(t, impair.Spec{}, 9000)
	c1 := s.connect(connOpts{pmtu: abi.MTU4096})
	c2 := s.connect(connOpts{pmtu: abi.MTU4096})
	e := s.a.eng
	if len(e.paths) != 1 || c1.qa.cc.path == nil || c1.qa.cc.path != c2.qa.cc.path || c1.qa.cc.path.refs != 2 {
		t.Fatalf("two QPs to one address: %d paths, %p and %p", len(e.paths), c1.qa.cc.path, c2.qa.cc.path)
	}
	must(t, c1.qa.Modify(&QPAttr{State: abi.QPSReset}, abi.QPStateMask))
	if p := c2.qa.cc.path; len(e.paths) != 1 || p.refs != 1 {
		t.Fatalf("after one QP's reset: %d paths, %d uses", len(e.paths), p.refs)
	}
	must(t, e.DestroyQP(c2.qa))
	must(t, e.DestroyQP(c1.qa))
	if len(e.paths) != 0 {
		t.Fatalf("%d paths left with no QP", len(e.paths))
	}
}

// TestCongestionPortShare: the QPs a port controls have at most
// Config.PortInflight in flight together — four QPs writing 1 MiB each at
// once behind a 64 KiB cap never have more than 64 KiB out (and the two
// packets each may always have), use the most of it, and wait for no local ACK timeout (each asks for
// acknowledgements within what it may still send) — and only what is in
// flight counts: beside seventy connected idle QPs, one QP has its whole
// fixed window out.
func TestCongestionPortShare(t *testing.T) {
	const capBytes = 64 << 10
	for _, tc := range []struct {
		name         string
		cap          int
		active, idle int
		most         int // packets in flight together, at most
		least        int // at least, at some point
	}{
		// Each may have ccMinShare packets out however full the port is.
		{"four QPs behind 64 KiB", capBytes, 4, 0, capBytes/1024 + 4*ccMinShare, capBytes / 1024 / 2},
		{"one QP beside seventy idle ones, the default cap", 0, 1, 70, inflightBytes / 1024, inflightBytes / 1024},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, impair.Spec{Rate: 1e9, Queue: 16 << 20}, 1500)
			s.a.eng.cfg.PortInflight = tc.cap
			var active []*conn
			for i := range tc.active + tc.idle {
				c := s.connect(connOpts{open: true, retry: 7, rnr: 7})
				if i < tc.active {
					active = append(active, c)
				}
			}
			for _, c := range active {
				_, err := c.qa.PostSend([]SendWR{{ID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
					SGL: sge(c.mra, 0, 1<<20), RemoteAddr: base, RKey: c.mrb.RKey}})
				must(t, err)
			}
			most, done := 0, 0
			s.run(10_000_000, func() bool {
				n := 0
				for _, c := range active {
					n += c.qa.inflight()
					done += len(poll(c.cqa))
				}
				most = max(most, n)
				return done == len(active)
			})
			st := s.a.eng.Stats()
			t.Logf("at most %d packets in flight together; %d timeouts, %d sent for %d", most, st.Timeouts, st.Sent, len(active)*1024)
			if most > tc.most || most < tc.least {
				t.Errorf("at most %d packets of 1024 bytes in flight together, want %d..%d", most, tc.least, tc.most)
			}
			if st.Timeouts != 0 {
				t.Errorf("%d local ACK timeouts: a QP stopped at the cap with no acknowledgement asked for", st.Timeouts)
			}
			if s.a.eng.ccBytes != 0 {
				t.Errorf("the port counts %d bytes in flight once all is acknowledged", s.a.eng.ccBytes)
			}
		})
	}
}

// TestCongestionPortShareKilled: a QP killed or destroyed with packets in
// flight gives its part of the port's cap back at once, not when its
// linger ends.
func TestCongestionPortShareKilled(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(e *Engine, qp *QP) error
	}{
		{"killed", func(e *Engine, qp *QP) error { return e.Kill(qp, time.Minute) }},
		{"closed", func(e *Engine, qp *QP) error { return e.Close(qp, time.Minute) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, impair.Spec{}, 1500)
			s.a.eng.cfg.PortInflight = 64 << 10
			c := s.connect(connOpts{open: true})
			_, err := c.qa.PostSend([]SendWR{{ID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
				SGL: sge(c.mra, 0, 1<<20), RemoteAddr: base, RKey: c.mrb.RKey}})
			must(t, err)
			if s.a.eng.ccBytes != 64<<10 {
				t.Fatalf("%d bytes counted in flight, want the cap", s.a.eng.ccBytes)
			}
			must(t, tc.end(s.a.eng, c.qa))
			if s.a.eng.ccBytes != 0 {
				t.Errorf("%d bytes still counted", s.a.eng.ccBytes)
			}
		})
	}
}
