package perf

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/taproce/taproce/internal/spin"
	"github.com/taproce/taproce/verbs"
)

// rdmaConfig is what the exchange settled before the resources are made.
type rdmaConfig struct {
	cycle, cacheLine int // page size and cache line size, the larger of both sides'
	mtu              verbs.MTU
	gidIndex         int
	gid              netip.Addr
}

// rdma holds a test's verbs objects, laid out as perftest lays out its
// buffer: one region, for QP i a send area at i*BUFF_SIZE and the area the
// peer targets at (QPs+i)*BUFF_SIZE, where BUFF_SIZE is the larger of the
// message size and the cycle buffer (a page).
type rdma struct {
	ctx context.Context
	p   *params
	rdmaConfig
	vc       *verbs.Context
	pd       *verbs.PD
	mr       *verbs.MR
	scq, rcq *verbs.CQ
	ch       *verbs.CompChannel // both CQs' events, for waits that sleep
	qps      []*verbs.QP
	psn      []uint32
	rem      []Dest
	buffSize int // BUFF_SIZE(size, cycle_buffer)
	slotSize int // INC(BUFF_SIZE, cache line): the receive areas' stride
	inline   int
	outReads int
	devMaxRd int
	wcs      []verbs.WC
	// peerLast is the count the peer's answer to this side's last WRITE
	// of a write_lat -D run leaves in the polled byte (awaitPeerLast);
	// peerLastOK says there is one to wait for.
	peerLast   byte
	peerLastOK bool
	peerLastAt int // the polled byte's offset
}

// buffSizeOf is BUFF_SIZE.
func buffSizeOf(size, cycle int) int { return max(size, cycle) }

// inc is INC(size, cache_line_size): size rounded up to cache lines.
func inc(size, cacheLine int) int {
	if size > cacheLine {
		return roundUp(size, cacheLine)
	}
	return cacheLine
}

// newRDMA makes the PD, the region, the CQs and the QPs (in INIT), as
// perftest's ctx_init does.
func newRDMA(ctx context.Context, vc *verbs.Context, p *params, rc rdmaConfig) (*rdma, error) {
	d := &rdma{ctx: ctx, p: p, rdmaConfig: rc, vc: vc, wcs: make([]verbs.WC, 16)}
	t := p.Test
	dev := vc.QueryDevice()
	d.devMaxRd = int(dev.MaxQPRdAtom)
	d.outReads = 1
	if t.Verb == Read || t.Verb == Atomic {
		d.outReads = max(d.devMaxRd, 1)
	}
	switch {
	case t.Verb == Read || t.Verb == Atomic:
		d.inline = 0
	case p.Inline >= 0:
		d.inline = min(p.Inline, int(dev.MaxInline))
	case t.Verb == Send:
		d.inline = min(defInlineSend, int(dev.MaxInline))
	default:
		d.inline = min(defInlineWrite, int(dev.MaxInline))
	}
	d.buffSize = buffSizeOf(p.size, d.cycle)
	d.slotSize = inc(d.buffSize, d.cacheLine)
	total := d.slotSize * 2 * p.QPs

	fail := func(err error) (*rdma, error) {
		d.close()
		return nil, err
	}
	var err error
	if d.pd, err = vc.AllocPD(ctx); err != nil {
		return fail(err)
	}
	access := verbs.AccessLocalWrite
	switch t.Verb {
	case Write:
		access |= verbs.AccessRemoteWrite
	case Read:
		access |= verbs.AccessRemoteRead
	case Atomic:
		access |= verbs.AccessRemoteAtomic
	}
	if d.mr, err = d.pd.AllocMR(ctx, total, access); err != nil {
		return fail(err)
	}
	if t.Verb != Write || t.Kind != Lat {
		// perftest fills its buffer with random bytes, except for
		// write_lat, which polls it for the peer's writes.
		b := d.mr.Bytes()
		for i := 0; i+8 <= len(b); i += 8 {
			*(*uint64)(unsafe.Pointer(&b[i])) = rand.Uint64()
		}
	}
	if d.ch, err = vc.CreateCompChannel(ctx); err != nil {
		return fail(err)
	}
	if d.scq, err = vc.CreateCQ(ctx, max(p.tx*p.QPs, 16), d.ch); err != nil {
		return fail(err)
	}
	if d.rcq, err = vc.CreateCQ(ctx, max(p.rx*p.QPs, 16), d.ch); err != nil {
		return fail(err)
	}
	qpAccess := verbs.AccessRemoteWrite
	switch t.Verb {
	case Atomic:
		qpAccess = verbs.AccessRemoteAtomic
	case Read:
		qpAccess = verbs.AccessRemoteRead
	case Send:
		qpAccess = verbs.AccessRemoteWrite | verbs.AccessLocalWrite
	}
	for range p.QPs {
		qp, err := d.pd.CreateQP(ctx, verbs.QPInitAttr{Type: verbs.RC, SendCQ: d.scq, RecvCQ: d.rcq,
			Cap: verbs.QPCap{MaxSendWR: uint32(p.tx), MaxRecvWR: uint32(p.rx), MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: uint32(d.inline)}})
		if err != nil {
			return fail(err)
		}
		d.qps = append(d.qps, qp)
		if err := qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSInit, PKeyIndex: 0, Port: 1, Access: qpAccess},
			verbs.QPStateMask|verbs.QPPKeyIndex|verbs.QPPort|verbs.QPAccessFlags); err != nil {
			return fail(fmt.Errorf("modify QP to INIT: %w", err))
		}
		d.psn = append(d.psn, rand.Uint32()&0xffffff)
	}
	return d, nil
}

// close destroys what newRDMA made (the context's closing would too).
func (d *rdma) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, qp := range d.qps {
		_ = qp.Destroy(ctx)
	}
	for _, cq := range []*verbs.CQ{d.scq, d.rcq} {
		if cq != nil {
			_ = cq.Destroy(ctx)
		}
	}
	if d.ch != nil {
		_ = d.ch.Destroy(ctx)
	}
	if d.mr != nil {
		_ = d.mr.Dereg(ctx)
	}
	if d.pd != nil {
		_ = d.pd.Dealloc(ctx)
	}
}

// dests returns this side's keys for each QP (set_up_connection).
func (d *rdma) dests() []Dest {
	out := make([]Dest, len(d.qps))
	for i, qp := range d.qps {
		out[i] = Dest{LID: 0, OutReads: uint16(d.outReads), QPN: qp.Num(), PSN: d.psn[i], RKey: d.mr.RKey,
			VAddr: d.mr.Addr() + uint64((d.p.QPs+i)*d.buffSize), GID: gidBytes(d.gid)}
	}
	return out
}

// connect is ctx_connect: RTR towards the peer's QP, and RTS for a
// latency test's QPs and a bandwidth client's (a bandwidth server only
// responds).
func (d *rdma) connect(rem []Dest) error {
	d.rem = rem
	rts := d.p.Test.Kind == Lat || !d.p.IsServer()
	for i, qp := range d.qps {
		r := rem[i]
		dgid := netip.AddrFrom16(r.GID).Unmap()
		err := qp.Modify(d.ctx, &verbs.QPAttr{State: verbs.QPSRTR, PathMTU: d.mtu, DestQPN: r.QPN, RQPSN: r.PSN,
			MaxDestRdAtomic: uint8(d.outReads), MinRNRTimer: minRNRTimer,
			AH: verbs.AHAttr{DGID: dgid, SGIDIndex: uint8(d.gidIndex), HopLimit: 0xff, Port: 1}},
			verbs.QPStateMask|verbs.QPAV|verbs.QPPathMTU|verbs.QPDestQPN|verbs.QPRQPSN|verbs.QPMaxDestRdAtomic|verbs.QPMinRNRTimer)
		if err != nil {
			return fmt.Errorf("modify QP %#x to RTR: %w", qp.Num(), err)
		}
		if !rts {
			continue
		}
		// The peer's outstanding reads bound ours; so does our device.
		rd := min(max(int(r.OutReads), 1), max(d.devMaxRd, 1), 255)
		err = qp.Modify(d.ctx, &verbs.QPAttr{State: verbs.QPSRTS, SQPSN: d.psn[i], Timeout: uint8(d.p.QPTimeout), RetryCnt: 7, RNRRetry: 7,
			MaxRdAtomic: uint8(rd)},
			verbs.QPStateMask|verbs.QPSQPSN|verbs.QPTimeout|verbs.QPRetryCnt|verbs.QPRNRRetry|verbs.QPMaxQPRdAtomic)
		if err != nil {
			return fmt.Errorf("modify QP %#x to RTS: %w", qp.Num(), err)
		}
	}
	return nil
}

// waiter paces the polling loops. It busy-polls while nothing happens,
// giving way to other threads between polls, then — after its spinFor — it
// sleeps: on the completion channel when the loop waits for completions
// (the CQs armed first, as an application using events would, so the
// next completion wakes it), otherwise a little between polls (a loop
// watching memory, as write_lat does). It fails when nothing has happened
// for the idle timeout or the context ends, with the context's cause: Run
// ends it when the device dies.
type waiter struct {
	ctx      context.Context
	idle     time.Duration
	spinFor  time.Duration // busy-polling before the first sleep
	empty    int
	since    time.Time
	sleeping bool
	// cqs and ch, when set, are the CQs the loop polls and their channel.
	cqs   []*verbs.CQ
	ch    *verbs.CompChannel
	armed bool
	spin  spin.Spinner
}

// bwSpinFor is how long a waiter of a bandwidth test busy-polls before it
// sleeps: long with cores to spare; short on a small machine, where the
// appliance (or a VM, or the peer) needs the core a polling client would
// take to move the test's traffic, and a wakeup costs less than the time
// slices a crowd of pollers shares out (docs/performance-log.md, perf's
// polling).
var bwSpinFor = func() time.Duration {
	if runtime.NumCPU() >= 4 {
		return time.Millisecond
	}
	return 20 * time.Microsecond
}()

// latSpinFor is how long a waiter of a latency test busy-polls before it
// sleeps, on any machine. A latency test has one operation in flight and
// nothing for the appliance to do while its answer travels, and what it
// measures is how soon the answer is seen: perftest's latency tests poll
// without ever sleeping. Each sleep of a waiter costs a wakeup that the
// answer waits for (docs/performance-log.md, perf's polling).
const latSpinFor = time.Millisecond

// spinFor is how long the waiters of a test of kind k busy-poll; polls
// says the appliance busy-polls the rings on processors of its own
// (verbs.Context.AppliancePolls). A bandwidth test then polls as long as
// a latency test: a sleeping client costs the spinning appliance a
// doorbell write for each wakeup and answers the completion late, and
// takes nothing from it by polling (docs/performance-log.md, perf's
// polling).
func spinFor(k Kind, polls bool) time.Duration {
	if k == Lat || polls {
		return latSpinFor
	}
	return bwSpinFor
}

// maxSleep bounds one sleep of a waiter on the completion channel.
const maxSleep = time.Millisecond

func newWaiter(ctx context.Context, idle, spinFor time.Duration) *waiter {
	return &waiter{ctx: ctx, idle: idle, spinFor: spinFor}
}

// cqWaiter is a waiter for loops that poll the test's CQs: it sleeps on
// their completion channel after busy-polling as long as the test's kind
// wants.
func (d *rdma) cqWaiter() *waiter {
	w := newWaiter(d.ctx, d.p.IdleTimeout, spinFor(d.p.Test.Kind, d.vc.AppliancePolls()))
	w.cqs, w.ch = []*verbs.CQ{d.scq, d.rcq}, d.ch
	return w
}

// progress records that something happened.
func (w *waiter) progress() { w.empty = 0 }

// wait is called when nothing happened; what is an error ends the loop.
func (w *waiter) wait(what string) error {
	w.empty++
	if w.empty == 1 {
		w.since, w.sleeping = time.Now(), false
	}
	if w.sleeping || w.empty%64 == 0 {
		if w.ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, context.Cause(w.ctx))
		}
		waited := time.Since(w.since)
		if waited > w.idle {
			return fmt.Errorf("%s: nothing for %v", what, w.idle)
		}
		w.sleeping = waited > w.spinFor
	}
	switch {
	case !w.sleeping:
		w.spin.Idle()
	case w.ch != nil && !w.armed:
		// Arm, then let the loop poll once more: a completion that came
		// before the arming is seen by that poll.
		for _, cq := range w.cqs {
			if err := cq.ReqNotify(false); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
		}
		w.armed = true
	case w.ch != nil:
		// Not longer than maxSleep at a time: a loop also watches the
		// clock (-D), which no completion announces.
		until := time.Now().Add(maxSleep)
		if end := w.since.Add(w.idle); end.Before(until) {
			until = end
		}
		ctx, cancel := context.WithDeadline(w.ctx, until)
		_, err := w.ch.Wait(ctx)
		cancel()
		w.armed = false
		switch {
		case errors.Is(err, verbs.ErrDeviceGone):
			return fmt.Errorf("%s: %w", what, err)
		case err != nil && w.ctx.Err() != nil:
			return fmt.Errorf("%s: %w", what, context.Cause(w.ctx))
		}
		// Woken (or at the idle deadline, which the next wait reports).
	default:
		time.Sleep(20 * time.Microsecond)
	}
	return nil
}

// Duration states (perftest's START, SAMPLE, STOP_SAMPLE, END).
const (
	stStart = iota
	stSample
	stStopSample
	stEnd
)

// durClock is the -D state machine: the margin, the measured time, the
// margin again, then the end (catch_alarm), started by begin.
type durClock struct {
	on            bool
	margin, total time.Duration
	origin        time.Time
	start         time.Time
	begun         bool
}

func (d *rdma) newClock(origin time.Time) *durClock {
	return &durClock{on: d.p.duration, margin: time.Duration(d.p.margin) * time.Second,
		total: time.Duration(d.p.Duration) * time.Second, origin: origin}
}

func (c *durClock) begin(now time.Time) {
	if c.on && !c.begun {
		c.begun, c.start = true, now
	}
}

// state returns the state at now.
func (c *durClock) state(now time.Time) int {
	if !c.on || !c.begun {
		return stStart
	}
	switch e := now.Sub(c.start); {
	case e < c.margin:
		return stStart
	case e < c.total-c.margin:
		return stSample
	case e < c.total:
		return stStopSample
	}
	return stEnd
}

// sample returns the measured interval in ns since the origin.
func (c *durClock) sample() (int64, int64) {
	s := c.start.Add(c.margin).Sub(c.origin)
	return int64(s), int64(s + c.total - 2*c.margin)
}

// wcError formats a failed completion as perftest's NOTIFY_COMP_ERROR.
func wcError(what string, wc verbs.WC, a, b uint64) error {
	return fmt.Errorf("completion with error at %s: status %d (%v), vendor error %#x, counts %d/%d",
		what, wc.Status, wc.Status, wc.VendorErr, a, b)
}

// prepare is ctx_set_recv_wqes: RxDepth receives per QP, for a bandwidth
// test at addresses cycling through the page, for latency all at one.
func (d *rdma) prepare(size int) error {
	if d.p.Test.Verb != Send {
		return nil
	}
	for i, qp := range d.qps {
		base := d.mr.Addr() + uint64((d.p.QPs+i)*d.slotSize)
		addr := base
		for j := range d.p.rx {
			wr := []verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{{Addr: addr, Length: uint32(size), LKey: d.mr.LKey}}}}
			if _, err := qp.PostRecv(wr); err != nil {
				return fmt.Errorf("couldn't post receive QP %d: counter=%d: %w", i, j, err)
			}
			if d.p.Test.Kind == BW && size <= d.cycle/2 {
				addr = d.advance(addr, base, size, uint64(j))
			}
		}
	}
	return nil
}

// advance is increase_loc_addr / increase_rem_addr: the next address a
// cache-line-rounded size further, back to the base at each cycle
// buffer's end.
func (d *rdma) advance(addr, base uint64, size int, cnt uint64) uint64 {
	step := inc(size, d.cacheLine)
	addr += uint64(step)
	if (cnt+1)%uint64(d.cycle/step) == 0 {
		addr = base
	}
	return addr
}

// run runs one message size.
func (d *rdma) run(size int) (*Result, error) {
	t := d.p.Test
	switch {
	case t.Kind == BW && t.Verb == Send && d.p.IsServer():
		return d.runBWServer(size)
	case t.Kind == BW:
		return d.runBW(size)
	case t.Verb == Write:
		return d.runLatWrite(size)
	case t.Verb == Send:
		return d.runLatSend(size)
	}
	return d.runLat(size)
}

func (d *rdma) side() string {
	if d.p.IsServer() {
		return "server"
	}
	return "client"
}

func (d *rdma) result(size int, iters uint64) *Result {
	return &Result{Test: d.p.Test.String(), Side: d.side(), Size: size, Iters: iters, MTU: d.mtu.Bytes(),
		QPs: d.p.QPs, Duration: d.p.Duration}
}

// sendWR returns QP i's work request of a size (ctx_set_send_reg_wqes).
func (d *rdma) sendWR(i, size int) verbs.SendWR {
	t := d.p.Test
	wr := verbs.SendWR{ID: uint64(i), SGL: []verbs.SGE{d.mr.SGE(i*d.buffSize, size)}}
	switch t.Verb {
	case Send:
		wr.Opcode = verbs.WRSend
	case Write:
		wr.Opcode = verbs.WRRDMAWrite
	case Read:
		wr.Opcode = verbs.WRRDMARead
	case Atomic:
		wr.Opcode = verbs.WRAtomicFetchAdd
		if d.p.Atomic == CmpAndSwap {
			wr.Opcode = verbs.WRAtomicCmpAndSwp
			wr.Swap = 0 // ATOMIC_SWAP_VALUE, compare 0
		} else {
			wr.CompareAdd = 1 // ATOMIC_ADD_VALUE
		}
	}
	if t.Verb != Send {
		wr.RemoteAddr, wr.RKey = d.rem[i].VAddr, d.rem[i].RKey
	}
	return wr
}

// setInline makes wr inline when its size allows (SEND and WRITE).
func (d *rdma) setInline(wr *verbs.SendWR, size int) {
	v := d.p.Test.Verb
	if (v == Send || v == Write) && size <= d.inline {
		wr.Flags |= verbs.SendInline
		off := int(wr.SGL[0].Addr - d.mr.Addr())
		wr.Inline = d.mr.Bytes()[off : off+size]
	} else {
		wr.Flags &^= verbs.SendInline
		wr.Inline = nil
	}
}

// post posts one work request.
func post(qp *verbs.QP, wr []verbs.SendWR) error {
	if _, err := qp.PostSend(wr); err != nil {
		return fmt.Errorf("couldn't post send: %w", err)
	}
	return nil
}

// runBW is run_iter_bw: each QP keeps up to TxDepth requests in flight,
// asking for a completion every CQMod of them, until every QP has had
// Iters completed (or the -D time is over).
func (d *rdma) runBW(size int) (*Result, error) {
	p := d.p
	q := len(d.qps)
	iters := uint64(p.iters)
	tot := iters * uint64(q)
	cqMod := uint64(p.cqMod)
	n := tot
	if p.noPeak || p.duration {
		n = 1
	}
	posted, completed := make([]int64, n), make([]int64, n)
	scnt, ccnt := make([]uint64, q), make([]uint64, q)
	wrs := make([][]verbs.SendWR, q)
	locBase, remBase := make([]uint64, q), make([]uint64, q)
	for i := range q {
		wrs[i] = []verbs.SendWR{d.sendWR(i, size)}
		locBase[i], remBase[i] = wrs[i][0].SGL[0].Addr, wrs[i][0].RemoteAddr
	}
	cycles := size <= d.cycle/2
	origin := time.Now()
	now := func() int64 { return int64(time.Since(origin)) }
	clk := d.newClock(origin)
	clk.begin(origin)
	w := d.cqWaiter()
	var totscnt, totccnt, counted uint64
	if p.noPeak && !p.duration {
		posted[0] = now()
	}
	for totscnt < tot || totccnt < tot || p.duration && clk.state(time.Now()) != stEnd {
		for i := range q {
			wr := &wrs[i][0]
			for (scnt[i] < iters || p.duration) && scnt[i]-ccnt[i]+1 <= uint64(p.tx) {
				if p.duration && clk.state(time.Now()) == stEnd {
					break
				}
				s := scnt[i]
				wr.Flags = 0
				if (s+1)%cqMod == 0 || !p.duration && s == iters-1 {
					wr.Flags = verbs.SendSignaled
				}
				d.setInline(wr, size)
				if !p.noPeak {
					posted[totscnt] = now()
				}
				if err := post(d.qps[i], wrs[i]); err != nil {
					return nil, fmt.Errorf("%w (qp %d scnt=%d)", err, i, s)
				}
				if cycles {
					wr.SGL[0].Addr = d.advance(wr.SGL[0].Addr, locBase[i], size, s)
					if p.Test.Verb != Send {
						wr.RemoteAddr = d.advance(wr.RemoteAddr, remBase[i], size, s)
					}
				}
				scnt[i]++
				totscnt++
				w.progress()
			}
		}
		if totccnt < tot || p.duration && totccnt < totscnt {
			ne := d.scq.Poll(d.wcs)
			if ne < 0 {
				return nil, fmt.Errorf("poll CQ failed %d", ne)
			}
			if ne == 0 {
				if err := w.wait("waiting for send completions"); err != nil {
					return nil, err
				}
				continue
			}
			w.progress()
			t := time.Now()
			for _, wc := range d.wcs[:ne] {
				if wc.Status != verbs.WCSuccess {
					return nil, wcError("send", wc, totscnt, totccnt)
				}
				ccnt[wc.ID] += cqMod
				totccnt += cqMod
				if !p.noPeak {
					idx := totccnt - 1
					if totccnt > tot {
						idx = tot - 1
					}
					completed[idx] = int64(t.Sub(origin))
				}
				if p.duration && clk.state(t) == stSample {
					counted += cqMod
				}
			}
		} else if p.duration {
			if err := w.wait("sending"); err != nil {
				return nil, err
			}
		}
	}
	in := bwInput{size: size, iters: iters, qps: q, posted: posted, completed: completed, noPeak: p.noPeak,
		cqMod: p.cqMod, gbits: p.ReportGbits}
	if p.noPeak && !p.duration {
		completed[0] = now()
	}
	if p.duration {
		posted[0], completed[0] = clk.sample()
		in.iters, in.duration = counted, true
	}
	r := d.result(size, in.iters*uint64(q))
	if p.duration {
		r.Iters = counted
	}
	bw := computeBW(in)
	r.BW = &bw
	return r, nil
}

// runBWServer is run_iter_bw_server: the SEND server counts receives and
// posts each used receive again while more are to come. Its clock starts
// at the first receive.
func (d *rdma) runBWServer(size int) (*Result, error) {
	p := d.p
	q := len(d.qps)
	iters := uint64(p.iters)
	tot := iters * uint64(q)
	posted := make([]uint64, q)
	rcntQP := make([]uint64, q)
	addr, base := make([]uint64, q), make([]uint64, q)
	for i := range q {
		posted[i] = uint64(p.rx)
		base[i] = d.mr.Addr() + uint64((p.QPs+i)*d.slotSize)
		addr[i] = base[i]
		if size <= d.cycle/2 {
			// ctx_set_recv_wqes left the next address after RxDepth posts.
			for j := range p.rx {
				addr[i] = d.advance(addr[i], base[i], size, uint64(j))
			}
		}
	}
	origin := time.Now()
	clk := d.newClock(origin)
	w := d.cqWaiter()
	var rcnt, counted uint64
	var first, last int64
	firstRx := true
	for rcnt < tot || p.duration && clk.state(time.Now()) != stEnd {
		if p.duration && clk.state(time.Now()) == stEnd {
			break
		}
		ne := d.rcq.Poll(d.wcs)
		if ne < 0 {
			return nil, fmt.Errorf("poll receive CQ failed %d", ne)
		}
		if ne == 0 {
			if err := w.wait("waiting for receives"); err != nil {
				return nil, err
			}
			continue
		}
		w.progress()
		t := time.Now()
		if firstRx {
			firstRx = false
			first = int64(t.Sub(origin))
			clk.begin(t)
		}
		for _, wc := range d.wcs[:ne] {
			id := wc.ID
			if wc.Status != verbs.WCSuccess || id >= uint64(q) {
				return nil, wcError("receive", wc, rcntQP[min(id, uint64(q-1))], rcnt)
			}
			rcntQP[id]++
			rcnt++
			if p.duration && clk.state(t) == stSample {
				counted++
			}
			if p.duration || posted[id]+1 <= iters {
				wr := []verbs.RecvWR{{ID: id, SGL: []verbs.SGE{{Addr: addr[id], Length: uint32(size), LKey: d.mr.LKey}}}}
				if _, err := d.qps[id].PostRecv(wr); err != nil {
					return nil, fmt.Errorf("couldn't post receive QP %d rcnt=%d: %w", id, rcntQP[id], err)
				}
				posted[id]++
				if size <= d.cycle/2 {
					addr[id] = d.advance(addr[id], base[id], size, posted[id])
				}
			}
		}
	}
	last = int64(time.Since(origin))
	in := bwInput{size: size, iters: iters, qps: q, posted: []int64{first}, completed: []int64{last}, noPeak: true,
		gbits: p.ReportGbits}
	r := d.result(size, tot)
	if p.duration {
		s, e := clk.sample()
		in.posted[0], in.completed[0], in.iters, in.duration = s, e, counted, true
		r.Iters = counted
	}
	bw := computeBW(in)
	r.BW = &bw
	return r, nil
}

// loadByte reads a byte of the region that the appliance writes.
func loadByte(b []byte, off int) byte {
	word := (*uint32)(unsafe.Pointer(&b[off&^3]))
	return byte(atomic.LoadUint32(word) >> (8 * (off & 3)))
}

// latDone turns a latency run's post times into its result.
func (d *rdma) latDone(size int, posted []int64, iters uint64, clk *durClock) *Result {
	rtt := 2
	if v := d.p.Test.Verb; v == Read || v == Atomic {
		rtt = 1
	}
	r := d.result(size, iters)
	if d.p.duration {
		s, e := clk.sample()
		l := computeLatDuration(e-s, iters, rtt)
		r.Lat = &l
		return r
	}
	deltas := make([]int64, len(posted)-1)
	for i := range deltas {
		deltas[i] = posted[i+1] - posted[i]
	}
	l := computeLat(deltas, rtt)
	r.Lat = &l
	return r
}

// pollOne waits for one send completion (ibv_poll_cq of 1 until it
// returns one).
func (d *rdma) pollOne(w *waiter, clk *durClock, what string) (verbs.WC, bool, error) {
	for {
		ne := d.scq.Poll(d.wcs[:1])
		if ne < 0 {
			return verbs.WC{}, false, fmt.Errorf("poll CQ failed %d", ne)
		}
		if ne == 1 {
			w.progress()
			return d.wcs[0], true, nil
		}
		if d.p.duration && clk.state(time.Now()) == stEnd {
			return verbs.WC{}, false, nil
		}
		if err := w.wait(what); err != nil {
			return verbs.WC{}, false, err
		}
	}
}

// runLatWrite is run_iter_lat_write: a ping-pong of RDMA WRITEs in which
// each side waits for the last byte of the peer's message to change to
// the iteration's count before it writes its own; the server writes
// first.
func (d *rdma) runLatWrite(size int) (*Result, error) {
	p := d.p
	iters := uint64(p.iters)
	buf := d.mr.Bytes()
	postOff := size - 1
	pollOff := p.QPs*d.buffSize + size - 1
	wr := []verbs.SendWR{d.sendWR(0, size)}
	wr[0].Flags = verbs.SendSignaled
	d.setInline(&wr[0], size)
	wr[0].Flags |= verbs.SendSignaled
	server := p.IsServer()
	posted := make([]int64, max(iters, 1))
	origin := time.Now()
	clk := d.newClock(origin)
	clk.begin(origin)
	w := newWaiter(d.ctx, p.IdleTimeout, spinFor(p.Test.Kind, d.vc.AppliancePolls()))
	var scnt, ccnt, rcnt, counted uint64
	active := func(c uint64) bool { return c < iters || p.duration }
	for scnt < iters || ccnt < iters || rcnt < iters || p.duration && clk.state(time.Now()) != stEnd {
		if active(rcnt) && !(scnt < 1 && server) {
			rcnt++
			for loadByte(buf, pollOff) != byte(rcnt) {
				if p.duration && clk.state(time.Now()) == stEnd {
					break
				}
				if err := w.wait("waiting for the peer's write"); err != nil {
					return nil, fmt.Errorf("%w (iteration %d)", err, rcnt)
				}
			}
			w.progress()
		}
		if active(scnt) {
			if !p.duration {
				posted[scnt] = int64(time.Since(origin))
			}
			scnt++
			buf[postOff] = byte(scnt)
			if err := post(d.qps[0], wr); err != nil {
				return nil, fmt.Errorf("%w (scnt=%d)", err, scnt)
			}
		}
		if p.duration && clk.state(time.Now()) == stEnd {
			break
		}
		if active(ccnt) {
			wc, ok, err := d.pollOne(w, clk, "waiting for the write's completion")
			if err != nil {
				return nil, err
			}
			if !ok {
				break
			}
			if wc.Status != verbs.WCSuccess {
				return nil, wcError("RDMA WRITE", wc, scnt, ccnt)
			}
			ccnt++
			if p.duration && clk.state(time.Now()) == stSample {
				counted++
			}
		}
	}
	if p.duration {
		// The server writes first: the client's k-th WRITE answers the
		// server's k-th, the server's k+1-th the client's k-th.
		d.peerLast, d.peerLastOK, d.peerLastAt = byte(scnt), true, pollOff
		if !server {
			d.peerLast++
		}
		return d.latDone(size, nil, counted, clk), nil
	}
	return d.latDone(size, posted, iters, clk), nil
}

// awaitPeerLast keeps this side's QP until the peer's answer to its last
// WRITE of a write_lat -D run has arrived, the peer has gone (gone), or
// limit has passed. Each side of a -D run stops on its own clock with no
// message at the end, and perftest before 4.5-0.18 polls for its last
// WRITE's completion without looking at its clock: a peer that answers
// this side's last WRITE after this side destroyed its QP would wait for
// that completion for ever (rxe retries without end at retry_cnt 7). The
// QP acknowledges the answer on arrival, before its byte shows here.
func (d *rdma) awaitPeerLast(gone <-chan struct{}, limit time.Duration) {
	if !d.peerLastOK {
		return
	}
	buf := d.mr.Bytes()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(50 * time.Microsecond)
	defer tick.Stop()
	for loadByte(buf, d.peerLastAt) != d.peerLast && time.Now().Before(deadline) {
		select {
		case <-gone:
			return
		case <-tick.C:
		}
	}
}

// runLat is run_iter_lat (read_lat and atomic_lat clients): one request
// at a time, each waited for.
func (d *rdma) runLat(size int) (*Result, error) {
	p := d.p
	iters := uint64(p.iters)
	wr := []verbs.SendWR{d.sendWR(0, size)}
	wr[0].Flags = verbs.SendSignaled
	posted := make([]int64, max(iters, 1))
	origin := time.Now()
	clk := d.newClock(origin)
	clk.begin(origin)
	w := d.cqWaiter()
	var scnt, counted uint64
	for scnt < iters || p.duration && clk.state(time.Now()) != stEnd {
		if !p.duration {
			posted[scnt] = int64(time.Since(origin))
		}
		scnt++
		if err := post(d.qps[0], wr); err != nil {
			return nil, fmt.Errorf("%w (scnt=%d)", err, scnt)
		}
		wc, ok, err := d.pollOne(w, clk, "waiting for the completion")
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		if wc.Status != verbs.WCSuccess {
			return nil, wcError(verbNames[p.Test.Verb], wc, scnt, scnt)
		}
		if p.duration && clk.state(time.Now()) == stSample {
			counted++
		}
	}
	if p.duration {
		return d.latDone(size, nil, counted, clk), nil
	}
	return d.latDone(size, posted, iters, clk), nil
}

// runLatSend is run_iter_lat_send: a ping-pong of SENDs; the client sends
// first, each side sends when it has received. A used receive is posted
// again while more messages are to come. With -D the clock starts at the
// first receive.
func (d *rdma) runLatSend(size int) (*Result, error) {
	p := d.p
	iters := uint64(p.iters)
	wr := []verbs.SendWR{d.sendWR(0, size)}
	wr[0].Flags = 0
	d.setInline(&wr[0], size)
	client := !p.IsServer()
	rxBase := d.mr.Addr() + uint64(p.QPs*d.slotSize)
	posted := make([]int64, max(iters, 1))
	origin := time.Now()
	clk := d.newClock(origin)
	w := d.cqWaiter()
	sizePerQP := uint64(p.rx)
	var scnt, rcnt, counted uint64
	firstRx := true
	for scnt < iters || rcnt < iters || p.duration && clk.state(time.Now()) != stEnd {
		if (rcnt < iters || p.duration) && !(scnt < 1 && client) {
			for {
				if p.duration && clk.state(time.Now()) == stEnd {
					break
				}
				ne := d.rcq.Poll(d.wcs[:1])
				if ne < 0 {
					return nil, fmt.Errorf("poll CQ failed %d", ne)
				}
				if ne == 0 {
					if err := w.wait("waiting for the peer's send"); err != nil {
						return nil, fmt.Errorf("%w (received %d)", err, rcnt)
					}
					continue
				}
				w.progress()
				wc := d.wcs[0]
				if firstRx {
					firstRx = false
					clk.begin(time.Now())
				}
				if wc.Status != verbs.WCSuccess {
					return nil, wcError("receive", wc, rcnt, rcnt)
				}
				rcnt++
				if p.duration && clk.state(time.Now()) == stSample {
					counted++
				}
				if p.duration || rcnt+sizePerQP <= iters {
					rwr := []verbs.RecvWR{{ID: wc.ID, SGL: []verbs.SGE{{Addr: rxBase, Length: uint32(size), LKey: d.mr.LKey}}}}
					if _, err := d.qps[0].PostRecv(rwr); err != nil {
						return nil, fmt.Errorf("couldn't post receive: rcnt=%d: %w", rcnt, err)
					}
				}
				break
			}
		}
		if scnt < iters || p.duration && clk.state(time.Now()) != stEnd {
			if !p.duration {
				posted[scnt] = int64(time.Since(origin))
			}
			scnt++
			// CQ moderation is 1 here (TxDepth 1): every SEND is
			// signaled and waited for.
			poll := scnt%uint64(p.cqMod) == 0 || !p.duration && scnt == iters
			if poll {
				wr[0].Flags |= verbs.SendSignaled
			}
			if p.duration && clk.state(time.Now()) == stEnd {
				break
			}
			if err := post(d.qps[0], wr); err != nil {
				return nil, fmt.Errorf("%w (scnt=%d)", err, scnt)
			}
			if poll {
				wc, ok, err := d.pollOne(w, clk, "waiting for the send's completion")
				if err != nil {
					return nil, err
				}
				if ok && wc.Status != verbs.WCSuccess {
					return nil, wcError("SEND", wc, scnt, scnt)
				}
				wr[0].Flags &^= verbs.SendSignaled
			}
		}
	}
	if p.duration {
		return d.latDone(size, nil, counted, clk), nil
	}
	return d.latDone(size, posted, iters, clk), nil
}
