package verbs

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"syscall"

	"github.com/taproce/taproce/shmem"
	"github.com/taproce/taproce/verbs/abi"
)

// QP is a queue pair (struct ibv_qp).
type QP struct {
	pd     *PD
	h      abi.Handle
	num    uint32
	typ    QPType
	cap    QPCap
	srq    *SRQ
	sendCQ *CQ
	recvCQ *CQ
	region *shmem.Region
	state  []byte

	// Posting is serialised per queue, as libibverbs serialises it.
	smu   sync.Mutex
	sq    *shmem.Ring
	sent  uint64 // send WQEs posted
	wqe   abi.SendWQE
	rmu   sync.Mutex
	rq    *shmem.Ring
	recvd uint64 // receive WQEs posted
	rwqe  abi.RecvWQE
	gone  bool
}

// CreateQP creates a queue pair in the RESET state.
func (pd *PD) CreateQP(ctx context.Context, a QPInitAttr) (*QP, error) {
	if a.SendCQ == nil || a.RecvCQ == nil {
		return nil, fmt.Errorf("verbs: QP needs CQs: %w", syscall.EINVAL)
	}
	req := &abi.CreateQPRequest{PD: pd.h, SendCQ: a.SendCQ.h, RecvCQ: a.RecvCQ.h, Type: uint8(a.Type),
		Caps: abi.QPCaps{MaxSendWR: a.Cap.MaxSendWR, MaxRecvWR: a.Cap.MaxRecvWR, MaxSendSGE: a.Cap.MaxSendSGE,
			MaxRecvSGE: a.Cap.MaxRecvSGE, MaxInline: a.Cap.MaxInline}}
	if a.SRQ != nil {
		req.SRQ = a.SRQ.h
	}
	if a.SigAll {
		req.SigAll = 1
	}
	var r abi.CreateQPReply
	fds, err := pd.c.cn.call(ctx, abi.OpCreateQP, req, &r)
	if err != nil {
		return nil, err
	}
	if err := errnoOf(abi.OpCreateQP, r.Errno); err != nil {
		closeFds(fds)
		return nil, err
	}
	region, mem, err := mapReply(fds, r.Size)
	if err != nil {
		return nil, err
	}
	if r.SQOff < abi.StateBytes || r.RQOff <= r.SQOff || r.RQOff >= uint64(len(mem)) {
		region.Close()
		return nil, fmt.Errorf("verbs: QP region layout %d/%d in %d", r.SQOff, r.RQOff, len(mem))
	}
	sq, err1 := shmem.AttachRing(mem[r.SQOff:r.RQOff])
	rq, err2 := shmem.AttachRing(mem[r.RQOff:])
	if err1 != nil || err2 != nil {
		region.Close()
		return nil, fmt.Errorf("verbs: QP rings: %v %v", err1, err2)
	}
	c := r.Caps
	qp := &QP{pd: pd, h: r.Handle, num: r.QPN, typ: a.Type, srq: a.SRQ, sendCQ: a.SendCQ, recvCQ: a.RecvCQ, region: region, state: mem[:abi.StateBytes], sq: sq, rq: rq,
		cap: QPCap{MaxSendWR: c.MaxSendWR, MaxRecvWR: c.MaxRecvWR, MaxSendSGE: c.MaxSendSGE, MaxRecvSGE: c.MaxRecvSGE, MaxInline: c.MaxInline}}
	pd.c.track(region)
	pd.c.mu.Lock()
	pd.c.qps[uint32(r.Handle)] = qp
	pd.c.mu.Unlock()
	return qp, nil
}

// Num returns the QP number.
func (qp *QP) Num() uint32 { return qp.num }

// Cap returns the QP's queue sizes.
func (qp *QP) Cap() QPCap { return qp.cap }

// State returns the QP's state as the appliance has it: the one Modify
// moved it to, or SQE or ERR when the transport failed it; ERR once the
// appliance is gone, whose QPs are gone with it.
func (qp *QP) State() QPState {
	if qp.pd.c.gone() != nil {
		return QPSErr
	}
	return qp.published()
}

// published returns the state the appliance last published.
func (qp *QP) published() QPState {
	return QPState(abi.Word32(qp.state, abi.QPStateWord).Load())
}

// Modify changes the QP's attributes (ibv_modify_qp). A transition with
// missing or forbidden attributes fails with EINVAL; an address vector
// whose destination cannot be resolved with EHOSTUNREACH.
func (qp *QP) Modify(ctx context.Context, a *QPAttr, mask AttrMask) error {
	req := &abi.ModifyQPRequest{Handle: qp.h, Mask: uint32(mask), Attr: abi.QPAttr{
		State: uint8(a.State), CurState: uint8(a.CurState), PathMTU: uint8(a.PathMTU), Timeout: a.Timeout,
		RetryCnt: a.RetryCnt, RNRRetry: a.RNRRetry, MinRNRTimer: a.MinRNRTimer, MaxRdAtomic: a.MaxRdAtomic,
		MaxDestRdAtomic: a.MaxDestRdAtomic, Port: a.Port, SGIDIndex: a.AH.SGIDIndex, HopLimit: a.AH.HopLimit,
		TClass: a.AH.TClass, PKeyIndex: a.PKeyIndex, Access: uint32(a.Access), QKey: a.QKey, DestQPN: a.DestQPN,
		RQPSN: a.RQPSN, SQPSN: a.SQPSN, FlowLabel: a.AH.FlowLabel, DGID: gid(a.AH.DGID)}}
	var r abi.ErrnoReply
	if _, err := qp.pd.c.cn.call(ctx, abi.OpModifyQP, req, &r); err != nil {
		return err
	}
	if err := errnoOf(abi.OpModifyQP, r.Errno); err != nil {
		return err
	}
	return nil
}

// Query returns the QP's attributes and queue sizes (ibv_query_qp); the
// state is the appliance's, so a QP that failed shows ERR.
func (qp *QP) Query(ctx context.Context) (QPAttr, QPCap, error) {
	var r abi.QueryQPReply
	if _, err := qp.pd.c.cn.call(ctx, abi.OpQueryQP, &abi.HandleRequest{Handle: qp.h}, &r); err != nil {
		return QPAttr{}, QPCap{}, err
	}
	if err := errnoOf(abi.OpQueryQP, r.Errno); err != nil {
		return QPAttr{}, QPCap{}, err
	}
	a := r.Attr
	out := QPAttr{State: QPState(a.State), CurState: QPState(a.CurState), PathMTU: MTU(a.PathMTU), Access: Access(a.Access),
		PKeyIndex: a.PKeyIndex, Port: a.Port, QKey: a.QKey, DestQPN: a.DestQPN, RQPSN: a.RQPSN, SQPSN: a.SQPSN,
		Timeout: a.Timeout, RetryCnt: a.RetryCnt, RNRRetry: a.RNRRetry, MinRNRTimer: a.MinRNRTimer,
		MaxRdAtomic: a.MaxRdAtomic, MaxDestRdAtomic: a.MaxDestRdAtomic,
		AH: AHAttr{DGID: netip.AddrFrom16(a.DGID).Unmap(), SGIDIndex: a.SGIDIndex, FlowLabel: a.FlowLabel, HopLimit: a.HopLimit, TClass: a.TClass, Port: a.Port}}
	c := r.Caps
	return out, QPCap{MaxSendWR: c.MaxSendWR, MaxRecvWR: c.MaxRecvWR, MaxSendSGE: c.MaxSendSGE, MaxRecvSGE: c.MaxRecvSGE, MaxInline: c.MaxInline}, nil
}

// PostSend posts send work requests (ibv_post_send). It writes them into
// the shared send ring and wakes the appliance only if it sleeps. It
// returns how many were posted; the error (EINVAL for a bad request or a
// QP in RESET, INIT or RTR; ENOMEM for a full queue; a *DeviceGoneError
// once the appliance is gone) says why the next was not.
func (qp *QP) PostSend(wrs []SendWR) (int, error) {
	qp.smu.Lock()
	defer qp.smu.Unlock()
	if qp.gone {
		return 0, ErrClosed
	}
	// Checked under smu: Context.lose flushes what was posted before.
	if err := qp.pd.c.gone(); err != nil {
		return 0, err
	}
	st := qp.published()
	if st < QPSRTS {
		return 0, fmt.Errorf("verbs: post send on a QP in %v: %w", st, syscall.EINVAL)
	}
	retired := abi.Word64(qp.state, abi.QPSendRetired).Load()
	n := 0
	for i := range wrs {
		wr := &wrs[i]
		if err := qp.checkSend(wr); err != nil {
			qp.commitSend(n)
			return i, err
		}
		if qp.sent+uint64(n)-retired >= uint64(qp.cap.MaxSendWR) {
			qp.commitSend(n)
			return i, fmt.Errorf("verbs: send queue full (%d): %w", qp.cap.MaxSendWR, syscall.ENOMEM)
		}
		slot := qp.sq.ReserveAt(n)
		if slot == nil {
			qp.commitSend(n)
			return i, fmt.Errorf("verbs: send ring full: %w", syscall.ENOMEM)
		}
		w := &qp.wqe
		*w = abi.SendWQE{WRID: wr.ID, Opcode: uint8(wr.Opcode), NumSGE: uint8(len(wr.SGL)), Flags: uint32(wr.Flags),
			Imm: wr.Imm, RKey: wr.RKey, RemoteAddr: wr.RemoteAddr, CompareAdd: wr.CompareAdd, Swap: wr.Swap,
			RemoteQPN: wr.RemoteQPN, RemoteQKey: wr.RemoteQKey}
		for j, s := range wr.SGL {
			w.SGL[j] = abi.SGE{Addr: s.Addr, Length: s.Length, LKey: s.LKey}
		}
		if wr.Flags&SendInline != 0 {
			w.Inline = wr.Inline
		}
		if wr.AH != nil {
			w.AH = uint32(wr.AH.h)
		}
		w.Put(slot)
		n++
	}
	qp.commitSend(n)
	return len(wrs), nil
}

func (qp *QP) commitSend(n int) {
	if n == 0 {
		return
	}
	qp.sent += uint64(n)
	if qp.sq.CommitN(n) {
		qp.pd.c.ring()
	}
}

func (qp *QP) checkSend(wr *SendWR) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("verbs: post send: "+format+": %w", append(args, syscall.EINVAL)...)
	}
	if len(wr.SGL) > int(qp.cap.MaxSendSGE) {
		return bad("%d SGEs, at most %d", len(wr.SGL), qp.cap.MaxSendSGE)
	}
	if wr.Flags&SendInline != 0 && len(wr.Inline) > int(qp.cap.MaxInline) {
		return bad("%d inline bytes, at most %d", len(wr.Inline), qp.cap.MaxInline)
	}
	switch qp.typ {
	case UD:
		if wr.Opcode != WRSend && wr.Opcode != WRSendWithImm || wr.AH == nil {
			return bad("UD takes SEND with an address handle")
		}
	case UC:
		if wr.Opcode > WRSendWithImm {
			return bad("UC takes SEND and RDMA WRITE")
		}
	case RC:
		if wr.Opcode > WRAtomicFetchAdd && wr.Opcode != WRSendWithInv {
			return bad("opcode %d", wr.Opcode)
		}
		if (wr.Opcode == WRAtomicCmpAndSwp || wr.Opcode == WRAtomicFetchAdd) && (len(wr.SGL) != 1 || wr.SGL[0].Length != 8) {
			return bad("an atomic takes one 8-byte SGE")
		}
	}
	return nil
}

// PostRecv posts receive work requests (ibv_post_recv); ENOMEM when the
// receive queue is full, EINVAL on a QP in RESET or one with an SRQ, a
// *DeviceGoneError once the appliance is gone.
func (qp *QP) PostRecv(wrs []RecvWR) (int, error) {
	qp.rmu.Lock()
	defer qp.rmu.Unlock()
	if qp.gone {
		return 0, ErrClosed
	}
	if err := qp.pd.c.gone(); err != nil {
		return 0, err
	}
	if qp.srq != nil {
		return 0, fmt.Errorf("verbs: post receive on a QP with an SRQ: %w", syscall.EINVAL)
	}
	if st := qp.published(); st == QPSReset {
		return 0, fmt.Errorf("verbs: post receive on a QP in RESET: %w", syscall.EINVAL)
	}
	retired := abi.Word64(qp.state, abi.QPRecvRetired).Load()
	n, err := postRecv(qp.rq, &qp.rwqe, wrs, qp.recvd, retired, qp.cap.MaxRecvWR, qp.cap.MaxRecvSGE)
	qp.recvd += uint64(n)
	if n > 0 && qp.rq.CommitN(n) {
		qp.pd.c.ring()
	}
	return n, err
}

func postRecv(ring *shmem.Ring, w *abi.RecvWQE, wrs []RecvWR, posted, retired uint64, depth, maxSGE uint32) (int, error) {
	for i := range wrs {
		wr := &wrs[i]
		if len(wr.SGL) > int(maxSGE) {
			return i, fmt.Errorf("verbs: post receive: %d SGEs, at most %d: %w", len(wr.SGL), maxSGE, syscall.EINVAL)
		}
		if posted+uint64(i)-retired >= uint64(depth) {
			return i, fmt.Errorf("verbs: receive queue full (%d): %w", depth, syscall.ENOMEM)
		}
		slot := ring.ReserveAt(i)
		if slot == nil {
			return i, fmt.Errorf("verbs: receive ring full: %w", syscall.ENOMEM)
		}
		*w = abi.RecvWQE{WRID: wr.ID, NumSGE: uint32(len(wr.SGL))}
		for j, s := range wr.SGL {
			w.SGL[j] = abi.SGE{Addr: s.Addr, Length: s.Length, LKey: s.LKey}
		}
		w.Put(slot)
	}
	return len(wrs), nil
}

// flush completes the QP's outstanding work requests with WCWRFlushErr in
// its CQs, as a device flushes a QP in error, once the appliance is gone
// (Context.lose). They are the WQEs posted and not retired, still in
// their ring slots: a queue never holds more than its depth, and its ring
// has at least as many slots. Receives of an SRQ are not flushed, as a
// QP in error leaves them to the SRQ.
func (qp *QP) flush() {
	qp.smu.Lock()
	defer qp.smu.Unlock()
	qp.rmu.Lock()
	defer qp.rmu.Unlock()
	if qp.gone {
		return
	}
	var wcs []WC
	var w abi.SendWQE
	for i := outstanding(qp.sq, abi.Word64(qp.state, abi.QPSendRetired).Load(), qp.sent); i < qp.sent; i++ {
		w.Get(qp.sq.SlotAt(i))
		wcs = append(wcs, WC{ID: w.WRID, Status: WCWRFlushErr, QPNum: qp.num})
	}
	qp.sendCQ.addFlushed(wcs)
	if qp.srq != nil {
		return
	}
	wcs = nil
	var r abi.RecvWQE
	for i := outstanding(qp.rq, abi.Word64(qp.state, abi.QPRecvRetired).Load(), qp.recvd); i < qp.recvd; i++ {
		r.Get(qp.rq.SlotAt(i))
		wcs = append(wcs, WC{ID: r.WRID, Status: WCWRFlushErr, QPNum: qp.num})
	}
	qp.recvCQ.addFlushed(wcs)
}

// outstanding returns the first of the posted WQEs that a queue's retire
// count leaves outstanding, within the ring's slots whatever the count
// in shared memory says.
func outstanding(ring *shmem.Ring, retired, posted uint64) uint64 {
	switch slots := uint64(ring.Slots()); {
	case retired > posted:
		return posted
	case posted-retired > slots:
		return posted - slots
	}
	return retired
}

// Destroy destroys the QP.
func (qp *QP) Destroy(ctx context.Context) error {
	qp.smu.Lock()
	defer qp.smu.Unlock()
	qp.rmu.Lock()
	defer qp.rmu.Unlock()
	if qp.gone {
		return fmt.Errorf("verbs: QP destroyed already: %w", syscall.EINVAL)
	}
	if err := qp.pd.c.destroy(ctx, abi.OpDestroyQP, qp.h); err != nil {
		return err
	}
	qp.gone = true
	qp.pd.c.mu.Lock()
	delete(qp.pd.c.qps, uint32(qp.h))
	qp.pd.c.mu.Unlock()
	return qp.pd.c.untrack(qp.region)
}

// SRQ is a shared receive queue (struct ibv_srq).
type SRQ struct {
	pd     *PD
	h      abi.Handle
	region *shmem.Region
	state  []byte
	maxWR  uint32

	mu    sync.Mutex
	rq    *shmem.Ring
	recvd uint64
	rwqe  abi.RecvWQE
	gone  bool
}

// CreateSRQ creates a shared receive queue of maxWR entries; a limit > 0
// arms the limit event (IBV_EVENT_SRQ_LIMIT_REACHED).
func (pd *PD) CreateSRQ(ctx context.Context, maxWR, limit int) (*SRQ, error) {
	var r abi.CreateSRQReply
	req := &abi.CreateSRQRequest{PD: pd.h, MaxWR: uint32(maxWR), MaxSGE: abi.MaxSGE, Limit: uint32(limit)}
	fds, err := pd.c.cn.call(ctx, abi.OpCreateSRQ, req, &r)
	if err != nil {
		return nil, err
	}
	if err := errnoOf(abi.OpCreateSRQ, r.Errno); err != nil {
		closeFds(fds)
		return nil, err
	}
	region, mem, err := mapReply(fds, r.Size)
	if err != nil {
		return nil, err
	}
	if r.RQOff < abi.StateBytes || r.RQOff >= uint64(len(mem)) {
		region.Close()
		return nil, fmt.Errorf("verbs: SRQ region layout")
	}
	rq, err := shmem.AttachRing(mem[r.RQOff:])
	if err != nil {
		region.Close()
		return nil, err
	}
	pd.c.track(region)
	s := &SRQ{pd: pd, h: r.Handle, region: region, state: mem[:abi.StateBytes], rq: rq, maxWR: r.MaxWR}
	pd.c.mu.Lock()
	pd.c.srqs[uint32(r.Handle)] = s
	pd.c.mu.Unlock()
	return s, nil
}

// PostRecv posts receive work requests to the SRQ (ibv_post_srq_recv);
// a *DeviceGoneError once the appliance is gone.
func (s *SRQ) PostRecv(wrs []RecvWR) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return 0, ErrClosed
	}
	if err := s.pd.c.gone(); err != nil {
		return 0, err
	}
	retired := abi.Word64(s.state, abi.SRQRetired).Load()
	n, err := postRecv(s.rq, &s.rwqe, wrs, s.recvd, retired, s.maxWR, abi.MaxSGE)
	s.recvd += uint64(n)
	if n > 0 && s.rq.CommitN(n) {
		s.pd.c.ring()
	}
	return n, err
}

// Arm sets the SRQ limit (ibv_modify_srq with IBV_SRQ_LIMIT).
func (s *SRQ) Arm(ctx context.Context, limit int) error {
	var r abi.ErrnoReply
	if _, err := s.pd.c.cn.call(ctx, abi.OpModifySRQ, &abi.ModifySRQRequest{Handle: s.h, Limit: uint32(limit)}, &r); err != nil {
		return err
	}
	return errnoOf(abi.OpModifySRQ, r.Errno)
}

// Destroy destroys the SRQ; EBUSY while QPs use it.
func (s *SRQ) Destroy(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.pd.c.destroy(ctx, abi.OpDestroySRQ, s.h); err != nil {
		return err
	}
	s.gone = true
	s.pd.c.mu.Lock()
	delete(s.pd.c.srqs, uint32(s.h))
	s.pd.c.mu.Unlock()
	return s.pd.c.untrack(s.region)
}
