package lab

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/verbs/abi"
)

// labTimeout is the lab QPs' local ACK timeout exponent: 4.096 µs × 2^12
// ≈ 17 ms, many round trips of a veth yet short enough that the tail
// losses of an impaired run (a last READ response or ACK lost, which
// nothing after it reveals) cost seconds, not a minute, over 256 MiB.
const labTimeout = 12

// rcPair is an RC connection between two lab hosts, each with a region.
type rcPair struct {
	qa, qb     *transport.QP
	cqa, rcqb  *transport.CQ
	rcqa, cqb  *transport.CQ
	mra, mrb   *transport.MR
	bufa, bufb []byte
	wake       chan struct{}
	wakeA      chan struct{}
	wakeB      chan struct{}
	pmtu       abi.MTU // the path MTU of both QPs
}

const rdmaBase = 0x7f0000000000

func connectRC(ctx context.Context, ea, eb *transport.Engine, a, b *Host, size int) (*rcPair, error) {
	// The path MTU is the largest both ports carry: an engine refuses one
	// above its port's active MTU.
	pmtu := min(abi.MTUForNetdev(a.Port.Device().MTU()), abi.MTUForNetdev(b.Port.Device().MTU()))
	rp := &rcPair{wake: make(chan struct{}, 1), pmtu: pmtu}
	notify := func() {
		select {
		case rp.wake <- struct{}{}:
		default:
		}
	}
	all := abi.AccessLocalWrite | abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic
	rp.wakeA, rp.wakeB = make(chan struct{}, 1), make(chan struct{}, 1)
	side := func(ch chan struct{}) func() {
		return func() {
			notify()
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	mk := func(e *transport.Engine, buf *[]byte, mr **transport.MR, cq **transport.CQ, rcq **transport.CQ, notify func()) (*transport.QP, error) {
		pd := e.Memory().NewPD()
		*buf = make([]byte, size)
		var err error
		if *mr, err = e.Memory().Register(pd, rdmaBase, *buf, all); err != nil {
			return nil, err
		}
		*cq, *rcq = transport.NewCQ(8192, notify), transport.NewCQ(8192, notify)
		return e.CreateQP(transport.QPConfig{Type: abi.RC, PD: pd, SendCQ: *cq, RecvCQ: *rcq, MaxSendWR: 4096, MaxRecvWR: 1024, MaxInline: 64})
	}
	var err error
	if rp.qa, err = mk(ea, &rp.bufa, &rp.mra, &rp.cqa, &rp.rcqa, side(rp.wakeA)); err != nil {
		return nil, err
	}
	if rp.qb, err = mk(eb, &rp.bufb, &rp.mrb, &rp.cqb, &rp.rcqb, side(rp.wakeB)); err != nil {
		return nil, err
	}
	for _, x := range []struct {
		qp       *transport.QP
		from, to *Host
		dqp      uint32
		sq, rq   roce.PSN
	}{{rp.qa, a, b, rp.qb.Num(), 0x100, 0xFFFF00}, {rp.qb, b, a, rp.qa.Num(), 0xFFFF00, 0x100}} {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		mac, err := x.from.Port.Station().Resolve(cctx, x.to.PortIPv4())
		cancel()
		if err != nil {
			return nil, err
		}
		steps := []struct {
			attr transport.QPAttr
			mask abi.AttrMask
		}{
			{transport.QPAttr{State: abi.QPSInit, Port: 1, Access: all},
				abi.QPStateMask | abi.QPPKeyIndex | abi.QPPort | abi.QPAccessFlags},
			{transport.QPAttr{State: abi.QPSRTR, PathMTU: pmtu, DestQPN: x.dqp, RQPSN: x.rq, MaxDestRdAtomic: 16, MinRNRTimer: 12,
				AV: transport.AddressVector{DstIP: x.to.PortIPv4(), DstMAC: mac, SGIDIndex: 1}},
				abi.QPStateMask | abi.QPAV | abi.QPPathMTU | abi.QPDestQPN | abi.QPRQPSN | abi.QPMaxDestRdAtomic | abi.QPMinRNRTimer},
			{transport.QPAttr{State: abi.QPSRTS, SQPSN: x.sq, Timeout: labTimeout, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
				abi.QPStateMask | abi.QPSQPSN | abi.QPTimeout | abi.QPRetryCnt | abi.QPRNRRetry | abi.QPMaxQPRdAtomic},
		}
		for _, s := range steps {
			if err := x.qp.Modify(&s.attr, s.mask); err != nil {
				return nil, err
			}
		}
	}
	return rp, nil
}

// wait polls cq until n completions arrived, all successful, or the
// context or timeout ends.
func (rp *rcPair) wait(ctx context.Context, cq *transport.CQ, n int, timeout time.Duration) error {
	wcs := make([]transport.WC, 64)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for got := 0; got < n; {
		k := cq.Poll(wcs)
		for _, wc := range wcs[:k] {
			if wc.Status != abi.WCSuccess {
				return fmt.Errorf("work request %d: %v", wc.ID, wc.Status)
			}
		}
		got += k
		if k > 0 {
			continue
		}
		select {
		case <-rp.wake:
		case <-time.After(time.Millisecond):
		case <-deadline.C:
			return fmt.Errorf("%d of %d completions after %v", got, n, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// rdmaSteps runs the RDMA exchange between the first two hosts: SEND,
// both atomics, and rounds of RDMA WRITE of total bytes read back by RDMA
// READ and compared by SHA-256.
func rdmaSteps(ctx context.Context, l *Lab, total int) []Step {
	a, b := l.Hosts[0], l.Hosts[1]
	const region = 32 << 20
	name := fmt.Sprintf("RDMA %s ⇄ %s", a.Namespace, b.Namespace)
	start := time.Now()
	rp, err := connectRC(ctx, a.NIC.Engine(), b.NIC.Engine(), a, b, 2*region)
	if err != nil {
		return []Step{{Name: name + " connect", Detail: err.Error(), Took: time.Since(start)}}
	}
	steps := []Step{{Name: fmt.Sprintf("%s connect (RC, path MTU %d)", name, rp.pmtu.Bytes()), OK: true, Took: time.Since(start),
		Detail: fmt.Sprintf("QP %#x ⇄ QP %#x", rp.qa.Num(), rp.qb.Num())}}
	steps = append(steps, rp.sendAndAtomics(ctx))
	steps = append(steps, rp.writeRead(ctx, total, region))
	sa, sb := a.NIC.Engine().Stats(), b.NIC.Engine().Stats()
	steps = append(steps, Step{Name: "transport counters", OK: true, Detail: fmt.Sprintf(
		"%s sent %d packets: %d go-backs, %d timeouts, %d NAKs and %d RNR NAKs received, %d duplicate responses seen, %d CNPs received, %d window cuts; %s sent %d: %d NAKs, %d CNPs, %d duplicate requests seen",
		a.Namespace, sa.Sent, sa.Retransmits, sa.Timeouts, sa.NAKsReceived, sa.RNRNAKsReceived, sa.DuplicateResponses, sa.CNPsReceived, sa.WindowCuts,
		b.Namespace, sb.Sent, sb.NAKsSent, sb.CNPsSent, sb.DuplicateRequests)})
	return steps
}

// sendAndAtomics: a SEND with immediate, a FETCH_ADD and a CMP_SWAP.
func (rp *rcPair) sendAndAtomics(ctx context.Context) Step {
	s := Step{Name: "SEND, FETCH_ADD, CMP_SWAP"}
	start := time.Now()
	msg := []byte("taproce lab: a SEND crossing the veth")
	copy(rp.bufa, msg)
	binary.LittleEndian.PutUint64(rp.bufb[1024:], 40)
	if _, err := rp.qb.PostRecv([]transport.RecvWR{{ID: 1, SGL: []transport.SGE{{Addr: rdmaBase + 4096, Length: 256, LKey: rp.mrb.LKey}}}}); err != nil {
		s.Detail = err.Error()
		return s
	}
	wrs := []transport.SendWR{
		{ID: 1, Opcode: abi.WRSendWithImm, Imm: 0x1234, Flags: abi.SendSignaled, SGL: []transport.SGE{{Addr: rdmaBase, Length: uint32(len(msg)), LKey: rp.mra.LKey}}},
		{ID: 2, Opcode: abi.WRAtomicFetchAdd, Flags: abi.SendSignaled, CompareAdd: 2, RemoteAddr: rdmaBase + 1024, RKey: rp.mrb.RKey,
			SGL: []transport.SGE{{Addr: rdmaBase + 512, Length: 8, LKey: rp.mra.LKey}}},
		{ID: 3, Opcode: abi.WRAtomicCmpAndSwp, Flags: abi.SendSignaled, CompareAdd: 42, Swap: 7, RemoteAddr: rdmaBase + 1024, RKey: rp.mrb.RKey,
			SGL: []transport.SGE{{Addr: rdmaBase + 520, Length: 8, LKey: rp.mra.LKey}}},
	}
	if _, err := rp.qa.PostSend(wrs); err != nil {
		s.Detail = err.Error()
		return s
	}
	if err := rp.wait(ctx, rp.cqa, 3, 20*time.Second); err != nil {
		s.Detail = err.Error()
		return s
	}
	if err := rp.wait(ctx, rp.rcqb, 1, 5*time.Second); err != nil {
		s.Detail = "receive: " + err.Error()
		return s
	}
	s.Took = time.Since(start)
	gotMsg := bytes.Equal(rp.bufb[4096:4096+len(msg)], msg)
	fa, cs, now := binary.LittleEndian.Uint64(rp.bufa[512:]), binary.LittleEndian.Uint64(rp.bufa[520:]), binary.LittleEndian.Uint64(rp.bufb[1024:])
	s.OK = gotMsg && fa == 40 && cs == 42 && now == 7
	s.Detail = fmt.Sprintf("message intact %v; fetch-add returned %d (want 40), cmp-swap returned %d (want 42), target now %d (want 7)", gotMsg, fa, cs, now)
	return s
}

// writeRead moves total bytes by RDMA WRITE in rounds of one region, reads
// each round back into a second region by RDMA READ and compares the
// SHA-256 of what was sent and what came back.
func (rp *rcPair) writeRead(ctx context.Context, total, region int) Step {
	const msgSize = 1 << 20
	s := Step{Name: fmt.Sprintf("RDMA WRITE %d MiB, READ it back", total>>20)}
	r := rand.New(rand.NewPCG(1, 2))
	src, back := rp.bufa[:region], rp.bufa[region:2*region]
	var writeTime, readTime time.Duration
	start := time.Now()
	for moved := 0; moved < total; moved += region {
		for i := 0; i < len(src); i += 8 {
			binary.LittleEndian.PutUint64(src[i:], r.Uint64())
		}
		want := sha256.Sum256(src)
		clear(back)
		n := region / msgSize
		wrs := make([]transport.SendWR, n)
		for i := range wrs {
			wrs[i] = transport.SendWR{ID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
				SGL:        []transport.SGE{{Addr: rdmaBase + uint64(i*msgSize), Length: msgSize, LKey: rp.mra.LKey}},
				RemoteAddr: rdmaBase + uint64(i*msgSize), RKey: rp.mrb.RKey}
		}
		t0 := time.Now()
		if err := rp.post(ctx, wrs); err != nil {
			s.Detail = "WRITE: " + err.Error()
			return s
		}
		writeTime += time.Since(t0)
		for i := range wrs {
			wrs[i].Opcode = abi.WRRDMARead
			wrs[i].SGL = []transport.SGE{{Addr: rdmaBase + uint64(region+i*msgSize), Length: msgSize, LKey: rp.mra.LKey}}
		}
		t0 = time.Now()
		if err := rp.post(ctx, wrs); err != nil {
			s.Detail = "READ: " + err.Error()
			return s
		}
		readTime += time.Since(t0)
		if got := sha256.Sum256(back); got != want {
			s.Detail = fmt.Sprintf("round at %d MiB: read back %x, wrote %x", moved>>20, got[:8], want[:8])
			return s
		}
	}
	s.OK, s.Took = true, time.Since(start)
	s.Detail = fmt.Sprintf("SHA-256 identical; WRITE %.0f MB/s, READ %.0f MB/s",
		float64(total)/writeTime.Seconds()/1e6, float64(total)/readTime.Seconds()/1e6)
	return s
}

// post posts wrs with at most 64 outstanding and waits for them all.
func (rp *rcPair) post(ctx context.Context, wrs []transport.SendWR) error {
	const depth = 64
	posted, done := 0, 0
	wcs := make([]transport.WC, 64)
	deadline := time.Now().Add(120 * time.Second)
	for done < len(wrs) {
		for posted < len(wrs) && posted-done < depth {
			k, err := rp.qa.PostSend(wrs[posted:min(len(wrs), done+depth)])
			posted += k
			if err != nil {
				return err
			}
		}
		n := rp.cqa.Poll(wcs)
		for _, wc := range wcs[:n] {
			if wc.Status != abi.WCSuccess {
				return fmt.Errorf("work request %d: %v", wc.ID, wc.Status)
			}
		}
		done += n
		if n == 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("%d of %d completions after 120 s", done, len(wrs))
			}
			select {
			case <-rp.wake:
			case <-time.After(time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}
