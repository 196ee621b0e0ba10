package transport

import (
	"math"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/verbs/abi"
)

// Congestion control of an RC queue pair's requester over a wire (not the
// local switch, whose frames are memory). A window of packets, cwnd,
// bounds what the QP has in flight below the fixed window (QP.window).
// It answers three signals:
//
//   - delay, as Swift does: the round trip of requests that ask for an
//     acknowledgement, against the least seen on the path (base). The
//     least of the last ccEpochs epochs' least round trips (an epoch is a
//     smoothed round trip long) above base + max(ccSlack, base), plus
//     up to ccFlowRange for a small window (flowScaling), cuts the
//     window in proportion to the excess, at most once a round trip; so
//     a queue that builds behind a slower link is held short of its drop
//     point (a tbf, a switch), where go-back-N would resend the window.
//     The rule wakes on a path where a drop has shown such a queue, for
//     ccDropMemory (ccPath.dropped). A single late sample — a receiver that stalls, a scheduler's delay
//     — is not a queue: it must last three epochs. base is the least of
//     the current and the previous ccBasePeriod, so that a host that
//     becomes busy for good (every round trip longer, whatever the
//     windows) raises it within a second instead of reading as a queue
//     for ever: with a base from an idle host the windows of a loaded
//     one collapsed to 2 packets.
//   - loss (a sequence NAK, a local ACK timeout, an RNR NAK): the window
//     halves, once per loss episode (until what was in flight when it
//     began is acknowledged), as TCP's fast recovery does.
//   - ECN: CNPs (RoCEv2 Annex A17.9.3) from the responder, which saw
//     CE-marked requests: the window is cut by alpha/2, once a window,
//     alpha DCQCN's reaction point's estimate — raised by g = 1/256 for
//     each 55 µs with a CNP, lowered by it for each without — and the
//     delay rule rests while CNPs flow: the marks say where the queue
//     is. Two QPs behind a link marking from 32 KiB (TestLabECN) kept
//     27 % of it with DCTCP's alpha of the round trips that brought a
//     CNP (CNPs came in every round trip: alpha near 1, the windows
//     halved), 68 % with g = 1/16 per slot, 80–85 % with DCQCN's 1/256.
//
// A QP starts with ccInitWindow packets in slow start, doubling the
// window each round trip up to the fixed window: a few round trips on an
// open path, and the base is measured before its own burst fills a queue.
// Started with the whole fixed window, as a RoCE NIC starts at line rate,
// eight QPs reading from rxe in the emulated VM had 4 MiB of responses
// asked for at once, which the VM sends in 200 ms: every request behind
// the first 67 ms timed out and was asked again (2.4× the packets needed,
// TestReadBurst). Slow start ends at the first signal, or when an
// epoch's round trip, with the rule awake, is above its target (as
// HyStart leaves it on delay, before a loss). Between cuts the window
// grows by one packet a round trip, and doubles each round trip again
// once the path has shown no signal for ccForget.
//
// The delay rule is also awake while round trips are longer than an
// eighth of the QP's local ACK timeout (ccLongRTT): a queue that long
// is a timeout on its way, a loss whether or not a queue has dropped.
const (
	ccMinWindow  = 1.0
	ccInitWindow = 16
	ccLongRTT    = 8
	ccSlack      = 100 * time.Microsecond
	ccFlowRange  = 600 * time.Microsecond
	ccBeta       = 0.8
	ccMaxCut     = 0.5
	ccEpochs     = 3
	ccBasePeriod = 500 * time.Millisecond
	ccForget     = 500 * time.Millisecond
	ccDropMemory = 10 * time.Second
	ccStamps     = 8
	ccAlphaGain  = 1.0 / 256
	ccAlphaSlot  = 55 * time.Microsecond
	// ccCNPRest is how long after a CNP the delay rule rests.
	ccCNPRest = 10 * time.Millisecond
	// ccFastMin is the least wait of a fast go-back, ccFastMax how many
	// an episode has before the local ACK timeout takes over.
	ccFastMin   = time.Millisecond
	ccFastFirst = 4 * time.Millisecond
	ccFastMax   = 2
	// cnpGap is the least time between two CNPs a QP sends: one per
	// 50 µs per flow, as DCQCN's notification point generates them.
	cnpGap = 50 * time.Microsecond
	// DefaultPortInflight is Config.PortInflight's default: sixteen QPs'
	// fixed windows.
	DefaultPortInflight = 16 * inflightBytes
	// ccMinShare is how many packets a QP may have in flight however full
	// the port is: none waits for the others for ever.
	ccMinShare = 2
)

// ccStamp is a request that asked for an acknowledgement: the PSN whose
// acknowledgement ends its round trip, and when it was sent.
type ccStamp struct {
	psn roce.PSN
	at  time.Time
}

// congestion is a QP's congestion control state (see above).
type congestion struct {
	on   bool    // the QP is controlled: RC over a wire
	cwnd float64 // packets
	max  float64 // the fixed window
	slow bool    // slow start: doubling each round trip
	// long is the round trip that wakes the delay rule: the local ACK
	// timeout / ccLongRTT; 0 with no timeout.
	long time.Duration

	srtt time.Duration
	path *ccPath // the least round trip, shared with the QPs to the same address

	epochEnd time.Time
	epochMin time.Duration // 0: no sample yet this epoch
	mins     [ccEpochs]time.Duration
	nmins    int

	cutAt    time.Time // the last cut (delay or CNP)
	signalAt time.Time // the last congestion signal of any kind
	cnpAt    time.Time // the last CNP received
	alpha    float64
	alphaAt  time.Time // alpha decayed up to here
	cnpWait  bool      // a CNP cut waits for cnpTo's acknowledgement
	cnpTo    roce.PSN  // the last PSN sent before that cut

	lossOn bool
	lossTo roce.PSN // the episode ends when the acknowledgements pass it
	fastAt time.Time
	fastN  int // fast go-backs in this episode

	stamps [ccStamps]ccStamp
	ns     int

	cnpSentAt time.Time // the responder's last CNP

	cuts *atomic.Uint64 // the engine's count of cuts
}

// ccPath is what the QPs to one address share: the least round trip
// of this and the last ccBasePeriod. Each QP measured its own, each
// with what the others had queued already, and a QP that came to a
// queue another had filled held a larger target and took more: four QPs
// behind one drop-tail queue had Jain's index 0.85 (TestCongestionLink).
type ccPath struct {
	dst            netip.Addr
	refs           int
	base, basePrev time.Duration
	baseFrom       time.Time
	dropAt         time.Time // the last drop one of its QPs saw
}

// dropped reports whether one of the path's QPs saw a drop within
// ccDropMemory: only then does the delay rule cut. A longer round trip
// is a queue that will overflow only where one has: on an open path the
// queue is the receiver's, whose own speed sets the rate whatever the
// window, and cutting it there cost 15–19 % of write_bw at MTU 1500
// (scripts/bench, interleaved); on a host that is merely busy, every
// round trip is longer and no queue is full.
func (p *ccPath) dropped(now time.Time) bool {
	return !p.dropAt.IsZero() && now.Sub(p.dropAt) < ccDropMemory
}

// sample takes a round trip of one of the path's QPs.
func (p *ccPath) sample(rtt time.Duration, now time.Time) {
	switch {
	case p.baseFrom.IsZero():
		p.base, p.baseFrom = rtt, now
	case now.Sub(p.baseFrom) >= ccBasePeriod:
		p.basePrev, p.base, p.baseFrom = p.base, rtt, now
	case rtt < p.base:
		p.base = rtt
	}
}

// least returns the least round trip of this and the last period.
func (p *ccPath) least() time.Duration {
	if p.basePrev != 0 {
		return min(p.base, p.basePrev)
	}
	return p.base
}

// path returns the shared state of the QPs to dst, counting qp's use of
// it. e.mu is held.
func (e *Engine) path(dst netip.Addr) *ccPath {
	p := e.paths[dst]
	if p == nil {
		if e.paths == nil {
			e.paths = map[netip.Addr]*ccPath{}
		}
		p = &ccPath{dst: dst}
		e.paths[dst] = p
	}
	p.refs++
	return p
}

// portInflight is Config.PortInflight with its default.
func (e *Engine) portInflight() int {
	if e.cfg.PortInflight > 0 {
		return e.cfg.PortInflight
	}
	return DefaultPortInflight
}

// releasePath ends qp's use of its path, which goes with its last QP.
// e.mu is held.
func (qp *QP) releasePath() {
	p := qp.cc.path
	if p == nil {
		return
	}
	qp.cc.path = nil
	qp.e.ccBytes -= qp.ccCounted
	qp.ccCounted = 0
	if p.refs--; p.refs == 0 {
		delete(qp.e.paths, p.dst)
	}
}

// reset starts control afresh for a new connection, in slow start;
// timeout is the QP's local ACK timeout.
func (c *congestion) reset(on bool, window int, timeout time.Duration, now time.Time, cuts *atomic.Uint64, path *ccPath) {
	*c = congestion{on: on, cwnd: float64(min(ccInitWindow, window)), max: float64(window), slow: true,
		alpha: 1, alphaAt: now, signalAt: now, cuts: cuts, path: path}
	c.setTimeout(timeout)
}

// setTimeout takes the QP's local ACK timeout (0: none).
func (c *congestion) setTimeout(timeout time.Duration) { c.long = timeout / ccLongRTT }

// limit returns the packets the window allows in flight, at most max.
func (c *congestion) limit(max int) int {
	if !c.on {
		return max
	}
	return min(max, int(c.cwnd))
}

// sent records a new request that asks for an acknowledgement, ending at
// last (a READ's last response PSN).
func (c *congestion) sent(last roce.PSN, now time.Time) {
	if c.on && c.ns < ccStamps {
		c.stamps[c.ns] = ccStamp{psn: last, at: now}
		c.ns++
	}
}

// forget drops the stamps: what is sent again cannot be timed (Karn).
func (c *congestion) forget() { c.ns = 0 }

// acked takes an acknowledgement up to acked that was news for n
// packets: it times the stamps it covers and grows the window.
func (c *congestion) acked(acked roce.PSN, n int, max int, now time.Time) {
	if !c.on {
		return
	}
	k := 0
	for i := 0; i < c.ns; i++ {
		if s := c.stamps[i]; s.psn.Diff(acked) <= 0 {
			c.sample(now.Sub(s.at), now)
		} else {
			c.stamps[k] = s
			k++
		}
	}
	c.ns = k
	if c.lossOn && c.lossTo.Diff(acked) <= 0 {
		c.lossOn = false
	}
	if n <= 0 || c.lossOn {
		return
	}
	if !c.slow && now.Sub(c.signalAt) > ccForget {
		c.slow = true
	}
	if c.slow {
		c.cwnd += float64(n)
	} else {
		c.cwnd += float64(n) / c.cwnd
	}
	c.cwnd = min(c.cwnd, float64(max))
}

// sample takes a round trip.
func (c *congestion) sample(rtt time.Duration, now time.Time) {
	if rtt <= 0 {
		rtt = 1
	}
	if c.srtt == 0 {
		c.srtt = rtt
	} else {
		c.srtt += (rtt - c.srtt) / 8
	}
	c.path.sample(rtt, now)
	if c.epochMin == 0 || rtt < c.epochMin {
		c.epochMin = rtt
	}
	if now.Before(c.epochEnd) {
		return
	}
	// The epoch is over: judge it.
	em := c.epochMin
	copy(c.mins[1:], c.mins[:ccEpochs-1])
	c.mins[0] = em
	c.nmins = min(c.nmins+1, ccEpochs)
	c.epochMin, c.epochEnd = 0, now.Add(c.srtt)
	awake := c.path.dropped(now) || c.long != 0 && em > c.long
	if !awake || now.Sub(c.cnpAt) < ccCNPRest {
		return
	}
	base := c.path.least()
	target := base + max(ccSlack, base) + c.flowScaling()
	if c.slow && em > target {
		// A queue has begun: stop doubling, without a cut.
		c.slow, c.signalAt = false, now
	}
	if c.nmins < ccEpochs || now.Sub(c.cutAt) < c.srtt {
		return
	}
	m := c.mins[0]
	for _, v := range c.mins[1:] {
		m = min(m, v)
	}
	if m <= target {
		return
	}
	f := max(1-ccBeta*float64(m-target)/float64(m), 1-ccMaxCut)
	c.cut(f, now)
}

// flowScaling is what Swift adds to the target delay of a small window:
// ccFlowRange at ccMinWindow, nothing at the fixed window, in 1/√cwnd
// between. Flows with small windows then grow while large ones are cut,
// so that flows sharing a queue converge to equal windows (Swift's
// fairness) instead of holding the shares they came with: four QPs behind
// a tbf had Jain's index 0.85–0.87 without it, 0.97–0.99 with 600 µs
// (TestLabBottleneck), and a QP joining a busy link its share in 20–70 ms
// instead of 150.
func (c *congestion) flowScaling() time.Duration {
	a := float64(ccFlowRange) / (1/math.Sqrt(ccMinWindow) - 1/math.Sqrt(c.max))
	fs := a/math.Sqrt(max(c.cwnd, ccMinWindow)) - a/math.Sqrt(c.max)
	return time.Duration(min(max(fs, 0), float64(ccFlowRange)))
}

// cut multiplies the window by f, ends slow start and notes the signal.
func (c *congestion) cut(f float64, now time.Time) {
	c.cwnd = max(ccMinWindow, c.cwnd*f)
	c.cuts.Add(1)
	c.slow = false
	c.cutAt, c.signalAt = now, now
}

// loss takes a sequence NAK, a local ACK timeout or an RNR NAK; sentTo is
// one past the highest PSN sent.
func (c *congestion) loss(sentTo roce.PSN, now time.Time) {
	if !c.on {
		return
	}
	c.forget()
	if c.lossOn {
		return
	}
	c.lossOn, c.lossTo = true, sentTo.Add(-1)
	c.cut(0.5, now)
}

// cnp takes a congestion notification.
//
// Like TCP's congestion window reduced state, one cut answers the marks
// of a window: CNPs that come before what was sent after the cut is
// acknowledged are for packets that met the queue it cut, and cut no
// more (without it two QPs behind a marking link kept 27 % of it).
func (c *congestion) cnp(now time.Time, acked, sentTo roce.PSN) {
	if !c.on {
		return
	}
	c.decayAlpha(now)
	c.alpha += ccAlphaGain * (1 - c.alpha)
	c.cnpAt = now
	c.signalAt = now
	if c.cnpWait && c.cnpTo.Diff(acked) > 0 || now.Sub(c.cutAt) < cnpGap {
		return
	}
	c.cnpWait, c.cnpTo = true, sentTo.Add(-1)
	c.cut(1-c.alpha/2, now)
}

// decayAlpha lowers alpha by ccAlphaGain for each ccAlphaSlot since it
// was last brought up to date.
func (c *congestion) decayAlpha(now time.Time) {
	n := now.Sub(c.alphaAt) / ccAlphaSlot
	if n <= 0 {
		return
	}
	c.alpha *= math.Pow(1-ccAlphaGain, float64(min(n, 1000)))
	c.alphaAt = c.alphaAt.Add(n * ccAlphaSlot)
}

// ackEvery bounds how many packets go between two that ask for an
// acknowledgement: at least two a window, or a window smaller than
// maxPktsPerAck would fill with nothing asking and wait for the local
// ACK timeout.
func (c *congestion) ackEvery(every int) int {
	if !c.on {
		return every
	}
	return max(1, min(every, int(c.cwnd)/2))
}

// sendCNP answers a CE-marked request with a congestion notification
// packet to its sender (RoCEv2 Annex A17.9.3: opcode CNP, the sender's
// QP, PSN 0, BECN set, 16 reserved bytes), at most one per cnpGap. The
// CNP itself is not ECN-capable, so that it is never marked.
func (qp *QP) sendCNP() {
	now := qp.e.cfg.Now()
	if !qp.cc.cnpSentAt.IsZero() && now.Sub(qp.cc.cnpSentAt) < cnpGap {
		return
	}
	qp.cc.cnpSentAt = now
	p := qp.tmpl
	p.TOS &^= roce.ECNMask
	p.BTH.Opcode = roce.CNP
	p.BTH.PSN, p.BTH.AckReq, p.BTH.SolicitedEvent, p.BTH.BECN = 0, false, false, true
	p.RETH, p.AtomicETH, p.Imm, p.IETH = roce.RETHFields{}, roce.AtomicETHFields{}, 0, 0
	qp.e.stats.cnpSent.Add(1)
	qp.build(&p, nil, nil, 0, 0, false)
}

// congested takes a loss signal (a sequence NAK, a local ACK timeout, an
// RNR NAK) for the congestion window.
//
// overflow says the signal is a drop (a sequence NAK or a timeout, not
// an RNR NAK): the path's queue overflowed, and the delay rule wakes.
func (qp *QP) congested(overflow bool) {
	now := qp.e.cfg.Now()
	if overflow && qp.cc.on {
		qp.cc.path.dropAt = now
	}
	qp.cc.loss(qp.sentTo, now)
}

// A fast go-back (IRN's RTO_low): in a loss episode — after a sequence
// NAK or a local ACK timeout — packets outstanding with no
// acknowledgement of progress for max(2 × srtt, 4 × base, ccFastMin)
// (ccFastFirst before the first round trip), doubled each time, go back
// again, at most ccFastMax times an episode, halving the window each
// time and without counting against retry_cnt. The responder NAKs a gap
// once, and nothing NAKs the tail of a go-back lost to a queue still
// full: the requester waited for the local ACK timeout, 67 ms at
// perftest's 14, again and again (TestCongestionLink). Outside an
// episode nothing goes back before the timeout: a receiver that only
// stalls — rxe in an emulated VM, a few milliseconds now and then — got
// duplicates from a probe that fired on a lossless path.

// armFast starts or restarts the fast go-back timer from now.
func (qp *QP) armFast(now time.Time) {
	c := &qp.cc
	if !c.on || !c.lossOn || c.fastN >= ccFastMax || !qp.rnrAt.IsZero() || qp.sqHead == qp.sqNext && qp.reqOff == 0 {
		c.fastAt = time.Time{}
		return
	}
	wait := ccFastFirst
	if c.srtt != 0 {
		wait = max(2*c.srtt, 4*c.path.least(), ccFastMin)
	}
	c.fastAt = now.Add(wait << c.fastN)
	qp.e.timerSet(c.fastAt)
}

// fastTick runs the fast go-back when its time has come.
func (qp *QP) fastTick(now time.Time) {
	c := &qp.cc
	if c.fastAt.IsZero() || now.Before(c.fastAt) {
		return
	}
	c.fastAt = time.Time{}
	if qp.state != abi.QPSRTS && qp.state != abi.QPSSQE || qp.sqHead == qp.sqNext && qp.reqOff == 0 {
		return
	}
	c.path.dropAt = now
	if c.lossOn {
		c.forget()
		c.cut(0.5, now)
	} else {
		c.loss(qp.sentTo, now)
	}
	c.fastN++
	qp.goBack()
	qp.armFast(now)
}

// ackedFast follows an acknowledgement: the episode's end resets the
// count of fast go-backs, progress restarts the timer.
func (qp *QP) ackedFast(progress bool, now time.Time) {
	if !qp.cc.lossOn {
		qp.cc.fastN = 0
	}
	if progress {
		qp.armFast(now)
	}
}

// The port's cap. The QPs a port controls have at most
// Config.PortInflight bytes in flight together — sent (since the last
// go-back) and not yet acknowledged, a READ's responses counted from its
// request — each at least ccMinShare packets, and a READ request may ask
// for up to readChunk packets past the cap. Only what is in flight
// counts: idle and lingering QPs take nothing from the others.

// countInflight brings the port's count of bytes in flight up to date
// with qp's: after each pass of drive, which follows every
// acknowledgement, and when the QP stops.
func (qp *QP) countInflight() {
	n := 0
	if qp.cc.on && (qp.state == abi.QPSRTS || qp.state == abi.QPSSQE) {
		n = qp.inflight() * qp.pmtu
	}
	qp.e.ccBytes += n - qp.ccCounted
	qp.ccCounted = n
}

// portFull reports whether the port's controlled QPs have its cap in
// flight, qp's sends of this pass counted.
func (qp *QP) portFull() bool {
	if !qp.cc.on {
		return false
	}
	own := qp.inflight()
	return own >= ccMinShare && qp.e.ccBytes-qp.ccCounted+own*qp.pmtu >= qp.e.portInflight()
}

// portAckEvery bounds the packets between two that ask for an
// acknowledgement near the cap: two in what the others leave qp, or it
// would stop at the cap with none asked for and wait for the local ACK
// timeout.
func (qp *QP) portAckEvery(every int) int {
	if !qp.cc.on {
		return every
	}
	room := qp.e.portInflight() - (qp.e.ccBytes - qp.ccCounted)
	if room >= 2*every*qp.pmtu {
		return every
	}
	return max(1, min(every, room/max(qp.pmtu, 1)/2))
}
