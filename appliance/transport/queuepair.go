package transport

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/verbs/abi"
)

// maxSGE is the most scatter/gather elements of one work request.
const maxSGE = 8

type sendWQE struct {
	wr       SendWR
	sge      [maxSGE]SGE
	inline   []byte
	length   uint32
	firstPSN roce.PSN
	lastPSN  roce.PSN
	assigned bool         // PSNs assigned
	cost     uint8        // READ or atomic: requests counted against max_rd_atomic
	resp     uint32       // READ: response bytes received
	fail     abi.WCStatus // a local error found while sending, reported in order
	filled   bool         // READ or atomic: its response has arrived whole
	askedAt  uint32       // READ: w.resp when its remainder was last asked for again
	reqEnd   uint32       // READ: the end of the bytes requested so far
	asked    bool         // READ: a request went out since the WQE was (re)started
	ahead    uint64       // READ: responses received past w.resp, bit i = packet i after it
}

type recvWQE struct {
	id  uint64
	sge [maxSGE]SGE
	n   int
}

func (w *recvWQE) sges() []SGE { return w.sge[:w.n] }

// respEntry remembers an executed RDMA READ or atomic for duplicates.
type respEntry struct {
	first, last roce.PSN
	atomic      bool
	orig        uint64
	valid       bool
	// READ: the region the request named, which a duplicate asked of a
	// killed or closed QP must lie within.
	rkey    uint32
	va, end uint64
}

// QP is a queue pair. Its methods take the engine's lock.
type QP struct {
	e     *Engine
	num   uint32
	cfg   QPConfig
	state abi.QPState
	attr  QPAttr

	src   netip.Addr
	sport uint16
	pmtu  int
	tmpl  roce.Packet

	// Send queue: absolute counters; slot = counter % len(sq).
	sq                   []sendWQE
	sqHead, sqNext, sqTl uint64
	reqOff               uint32   // bytes of sq[sqNext] already sent
	psn                  roce.PSN // next PSN to send
	sentTo               roce.PSN // one past the highest PSN ever sent
	acked                roce.PSN // highest PSN acknowledged
	rdAtomicOut          int
	noAckPkts            int
	retryLeft, rnrLeft   uint8
	retryAt, rnrAt       time.Time

	// Receive queue.
	rq           []recvWQE
	rqHead, rqTl uint64

	// Responder.
	ePSN    roce.PSN
	msn     uint32
	nakSent bool
	nakAt   time.Time // when to NAK a gap that too few packets follow
	// firstReq: the QP has executed no request since it entered RTR
	// (Config.CommEstablished).
	firstReq bool
	inMsg    bool // in the middle of a multi-packet SEND or WRITE
	msgSend  bool // the message in progress is a SEND (else a WRITE)
	msgOff   uint32
	msgLen   uint32
	msgRKey  uint32 // WRITE target
	msgVA    uint64
	cache    []respEntry
	cacheN   int
	stash    *reorderStash

	// Kill and Close: the QP only answers requests (lingerAnswer) until
	// killAt, then it is removed; it NAKs nothing before quietTo.
	// lastPSN is the PSN of the last request it saw.
	killed  bool
	killAt  time.Time
	quietTo time.Time
	lastPSN roce.PSN

	cc congestion
	// ccCounted is what qp counts in the engine's ccBytes (countInflight).
	ccCounted int

	scratch sgl
	local   bool              // the destination is on a local switch: whole-message frames
	addRecv func(RecvWR) bool // addRecvLocked, bound once for Refill
}

// Num returns the queue pair number.
func (qp *QP) Num() uint32 { return qp.num }

// State returns the current state.
func (qp *QP) State() abi.QPState {
	qp.e.mu.Lock()
	defer qp.e.mu.Unlock()
	return qp.state
}

// Attr returns the current attributes.
func (qp *QP) Attr() QPAttr {
	qp.e.mu.Lock()
	defer qp.e.mu.Unlock()
	a := qp.attr
	a.State = qp.state
	return a
}

// Modify changes attributes and state by the IBA rules (see checkModify).
func (qp *QP) Modify(attr *QPAttr, mask abi.AttrMask) error {
	e := qp.e
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.flush()
	if qp.killed {
		return fmt.Errorf("%w: queue pair %#x is killed or closed", ErrState, qp.num)
	}
	to, err := checkModify(qp.cfg.Type, qp.state, attr, mask)
	if err != nil {
		return err
	}
	if mask&abi.QPPathMTU != 0 {
		if !attr.PathMTU.Valid() {
			return fmt.Errorf("%w: path MTU %d", ErrInvalid, attr.PathMTU)
		}
		// A path MTU the port cannot carry is refused, not shrunk: the
		// peer, told the same path MTU, expects FIRST and MIDDLE packets
		// of exactly that size (IBA 9.7.7, C9-33) and NAKs shorter ones.
		if active := abi.MTUForNetdev(e.cfg.MTU); attr.PathMTU > active {
			return fmt.Errorf("%w: path MTU %d above the port's active MTU %d (netdev MTU %d)",
				ErrInvalid, attr.PathMTU.Bytes(), active.Bytes(), e.cfg.MTU)
		}
	}
	if mask&abi.QPAV != 0 {
		src, err := e.sourceAddr(attr.AV.SGIDIndex)
		if err != nil {
			return err
		}
		if !attr.AV.DstIP.IsValid() || src.Is4() != attr.AV.DstIP.Unmap().Is4() {
			return fmt.Errorf("%w: address vector %v from GID %v", ErrInvalid, attr.AV.DstIP, src)
		}
	}
	a := &qp.attr
	if mask&abi.QPAccessFlags != 0 {
		a.Access = attr.Access
	}
	if mask&abi.QPPKeyIndex != 0 {
		a.PKeyIndex = attr.PKeyIndex
	}
	if mask&abi.QPPort != 0 {
		a.Port = attr.Port
	}
	if mask&abi.QPQKey != 0 {
		a.QKey = attr.QKey
	}
	if mask&abi.QPAV != 0 {
		a.AV = attr.AV
		a.AV.HopLimit = HopLimit
	}
	if mask&abi.QPPathMTU != 0 {
		a.PathMTU = attr.PathMTU
	}
	if mask&abi.QPDestQPN != 0 {
		a.DestQPN = attr.DestQPN & roce.QPNMask
	}
	if mask&abi.QPRQPSN != 0 {
		a.RQPSN = attr.RQPSN & roce.PSNMask
		qp.ePSN = a.RQPSN
	}
	if mask&abi.QPMaxDestRdAtomic != 0 {
		a.MaxDestRdAtomic = attr.MaxDestRdAtomic
		// The responder remembers that many READs and atomics for
		// duplicates (IBA 9.7.4.1.4.1), and no fewer than 16.
		if n := max(16, int(attr.MaxDestRdAtomic)); n > len(qp.cache) {
			qp.cache = make([]respEntry, n)
			qp.cacheN = 0
		}
	}
	if mask&abi.QPMinRNRTimer != 0 {
		a.MinRNRTimer = attr.MinRNRTimer & 31
	}
	if mask&abi.QPSQPSN != 0 {
		a.SQPSN = attr.SQPSN & roce.PSNMask
		qp.psn, qp.sentTo = a.SQPSN, a.SQPSN
		qp.acked = a.SQPSN.Add(-1)
	}
	if mask&abi.QPTimeout != 0 {
		a.Timeout = attr.Timeout
		qp.cc.setTimeout(timeoutDuration(a.Timeout))
	}
	if mask&abi.QPRetryCnt != 0 {
		a.RetryCnt = attr.RetryCnt & 7
		qp.retryLeft = a.RetryCnt
	}
	if mask&abi.QPRNRRetry != 0 {
		a.RNRRetry = attr.RNRRetry & 7
		qp.rnrLeft = a.RNRRetry
	}
	if mask&abi.QPMaxQPRdAtomic != 0 {
		a.MaxRdAtomic = attr.MaxRdAtomic
	}
	switch to {
	case abi.QPSReset:
		qp.reset()
	case abi.QPSRTR:
		qp.prepare()
	case abi.QPSErr:
		if qp.state != abi.QPSErr {
			qp.toError(abi.WCWRFlushErr, false)
		}
	}
	qp.state = to
	qp.stateChanged()
	if to == abi.QPSRTS {
		qp.drive()
	}
	return nil
}

// reset empties the queues and forgets the connection, down to the
// counters a new one sets again, so that nothing of the old one shows in
// the new one.
func (qp *QP) reset() {
	qp.sqHead, qp.sqNext, qp.sqTl, qp.rqHead, qp.rqTl = 0, 0, 0, 0, 0
	qp.attr = QPAttr{}
	qp.inMsg, qp.nakSent, qp.firstReq, qp.msn, qp.reqOff, qp.rdAtomicOut = false, false, false, 0, 0, 0
	qp.psn, qp.sentTo, qp.acked, qp.ePSN, qp.noAckPkts, qp.retryLeft, qp.rnrLeft = 0, 0, 0, 0, 0, 0, 0
	qp.msgSend, qp.msgOff, qp.msgLen, qp.msgRKey, qp.msgVA = false, 0, 0, 0, 0
	qp.cacheN = 0
	qp.retryAt, qp.rnrAt, qp.nakAt = time.Time{}, time.Time{}, time.Time{}
	qp.tmpl = roce.Packet{}
	qp.releasePath()
	qp.cc = congestion{}
	if qp.stash != nil {
		qp.stash.clear()
	}
	for i := range qp.cache {
		qp.cache[i] = respEntry{}
	}
}

// prepare builds the packet template of a connected QP at INIT→RTR. The
// path MTU is used as given (Modify refused one the port cannot carry):
// every FIRST and MIDDLE packet carries exactly that many bytes, as the
// responder, told the same path MTU, checks (IBA 9.7.7, C9-33).
func (qp *QP) prepare() {
	e := qp.e
	a := &qp.attr
	if qp.cfg.Type == abi.UD {
		qp.pmtu = abi.MTUForNetdev(e.cfg.MTU).Bytes()
		qp.sport = roce.DatagramSourcePort(qp.num)
		src, _ := e.sourceAddr(0)
		qp.src = src
		return
	}
	qp.pmtu = a.PathMTU.Bytes()
	qp.firstReq = true
	qp.local = qp.cfg.Type == abi.RC && e.cfg.Local != nil && e.cfg.Local(a.AV.DstIP)
	qp.src, _ = e.sourceAddr(a.AV.SGIDIndex)
	qp.sport = roce.ConnectedSourcePort(a.AV.FlowLabel, qp.num, a.DestQPN)
	qp.tmpl = qp.template(a.AV.DstIP, a.AV.DstMAC, a.DestQPN, a.AV.TClass, a.AV.FlowLabel)
	if e.cfg.ECT {
		qp.tmpl.TOS = qp.tmpl.TOS&^roce.ECNMask | roce.ECT0
	}
	qp.releasePath()
	on := qp.cfg.Type == abi.RC && !qp.local
	var path *ccPath
	if on {
		path = e.path(a.AV.DstIP)
	}
	qp.cc.reset(on, qp.maxWindow(), timeoutDuration(qp.attr.Timeout), e.cfg.Now(), &e.stats.windowCuts, path)
}

// HopLimit is the IPv4 TTL or IPv6 hop limit of every packet an engine
// sends, which carries the GRH hop limit of RoCEv2 (IBA Annex A17). For a
// RoCEv2 GID, ib_core does not keep the hop limit a client gives a
// connected QP's address vector or an address handle: ib_resolve_eth_dmac
// puts in its place the hop limit of the IP route to the destination
// (rdma_addr_find_l2_eth_by_grh; ip4_dst_hoplimit, ip6_dst_hoplimit),
// which is the system default of 64 unless a route says otherwise, and
// rxe sends that. So does the engine, whatever the hop limit asked for: 0,
// 1 (what the pingpong tools ask for) or any other.
const HopLimit = 64

// template returns a packet with the addressing of a destination, the
// traffic class in the IPv4 TOS or IPv6 traffic class and, for IPv6, the
// flow label.
func (qp *QP) template(dst netip.Addr, mac roce.MAC, dqpn uint32, tclass uint8, flow uint32) roce.Packet {
	p := roce.Packet{
		DstMAC: mac, SrcMAC: qp.e.cfg.MAC,
		Src: qp.src.Unmap(), Dst: dst.Unmap(),
		TOS: tclass, TTL: HopLimit, DontFragment: true,
		SrcPort: qp.sport, DstPort: roce.UDPPort,
		BTH: roce.BTHFields{PKey: roce.DefaultPKey, DestQP: dqpn},
	}
	if !p.Src.Is4() {
		p.IPv6 = true
		p.DontFragment = false
		p.FlowLabel = flow & 0xFFFFF
	}
	return p
}

// admit makes the checks rxe's hdr_check makes of a packet for a QP
// before its responder or completer sees it (rxe_recv.c), and says which
// failed. check_addr: a connected QP (RC, UC) takes packets only from its
// peer's address to its own — the address vector's destination and its
// source GID's address — so that no other host on the network can
// execute a request on it or make it acknowledge or NAK its peer; a QP
// that has no peer yet (RESET, INIT) is left to its state, which refuses
// everything. check_keys: the P_Key must match the port's one, the
// default (0xFFFF, full member); a UD packet's Q_Key must be its QP's,
// and one of the privileged Q_Keys (high bit set) is for QP1 alone (IBA
// 10.2.5), which is no QP of a client's (Engine.Receive gives its
// packets to the GSI handler, receiveGSI). Each costs a comparison or two.
func (qp *QP) admit(p *roce.Packet) (RejectReason, bool) {
	switch qp.cfg.Type {
	case abi.RC, abi.UC:
		if qp.tmpl.Dst.IsValid() && (p.Src != qp.tmpl.Dst || p.Dst != qp.tmpl.Src) {
			return RejectAddress, false
		}
	}
	if !roce.PKeyMatch(p.BTH.PKey, roce.DefaultPKey) {
		return RejectPKey, false
	}
	if qp.cfg.Type == abi.UD {
		if qkey := qp.attr.QKey; p.DETH.QKey != qkey || qkey&0x80000000 != 0 {
			return RejectQKey, false
		}
	}
	return 0, true
}

func (qp *QP) acceptsTransport(op roce.Opcode) bool {
	switch qp.cfg.Type {
	case abi.RC:
		return op.Transport() == roce.TransportRC
	case abi.UC:
		return op.Transport() == roce.TransportUC
	case abi.UD:
		return op.Transport() == roce.TransportUD
	}
	return false
}

// PostSend queues send work requests and starts sending (ibv_post_send).
// It returns how many were queued; the error says why the next was not.
func (qp *QP) PostSend(wrs []SendWR) (int, error) {
	e := qp.e
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.flush()
	if qp.killed {
		return 0, fmt.Errorf("%w: queue pair %#x is killed or closed", ErrState, qp.num)
	}
	if qp.state < abi.QPSRTS && qp.state != abi.QPSErr || qp.state == abi.QPSSQE {
		return 0, fmt.Errorf("%w: post send in %v", ErrState, qp.state)
	}
	for i := range wrs {
		wr := &wrs[i]
		if qp.sqTl-qp.sqHead == uint64(len(qp.sq)) || qp.cfg.MaxSendWR == 0 {
			return i, ErrQueueFull
		}
		if err := qp.checkSendWR(wr); err != nil {
			return i, err
		}
		w := &qp.sq[qp.sqTl%uint64(len(qp.sq))]
		*w = sendWQE{wr: *wr, inline: w.inline[:0]}
		n := copy(w.sge[:], wr.SGL)
		w.wr.SGL = w.sge[:n]
		if wr.Flags&abi.SendInline != 0 {
			w.inline = append(w.inline, wr.Inline...)
			w.length = uint32(len(w.inline))
		} else {
			for _, s := range wr.SGL {
				w.length += s.Length
			}
		}
		if qp.cfg.SigAll {
			w.wr.Flags |= abi.SendSignaled
		}
		qp.sqTl++
	}
	if qp.state == abi.QPSErr {
		qp.flushSQ()
	} else {
		qp.drive()
	}
	return len(wrs), nil
}

func (qp *QP) checkSendWR(wr *SendWR) error {
	if len(wr.SGL) > maxSGE {
		return fmt.Errorf("%w: %d SGEs, at most %d", ErrInvalid, len(wr.SGL), maxSGE)
	}
	if wr.Flags&abi.SendInline != 0 && len(wr.Inline) > max(qp.cfg.MaxInline, 0) {
		return fmt.Errorf("%w: %d inline bytes, at most %d", ErrInvalid, len(wr.Inline), qp.cfg.MaxInline)
	}
	if wr.Flags&abi.SendInline != 0 && (wr.Opcode == abi.WRRDMARead || wr.Opcode.IsAtomic()) {
		return fmt.Errorf("%w: inline data on %v", ErrInvalid, wr.Opcode)
	}
	var total uint64
	for _, s := range wr.SGL {
		total += uint64(s.Length)
	}
	if total > MaxMessage {
		return fmt.Errorf("%w: message of %d bytes, at most %d", ErrInvalid, total, uint64(MaxMessage))
	}
	switch qp.cfg.Type {
	case abi.UD:
		if !wr.Opcode.IsSend() || wr.Opcode == abi.WRSendWithInv || wr.AH == nil {
			return fmt.Errorf("%w: UD takes SEND with an address handle", ErrInvalid)
		}
	case abi.UC:
		if !wr.Opcode.IsSend() && !wr.Opcode.IsWrite() {
			return fmt.Errorf("%w: UC takes SEND and RDMA WRITE", ErrInvalid)
		}
	case abi.RC:
		if !wr.Opcode.Valid() {
			return fmt.Errorf("%w: opcode %v", ErrInvalid, wr.Opcode)
		}
		if wr.Opcode.IsAtomic() {
			var n uint32
			for _, s := range wr.SGL {
				n += s.Length
			}
			if len(wr.SGL) != 1 || n != 8 {
				return fmt.Errorf("%w: an atomic takes one 8-byte SGE", ErrInvalid)
			}
		}
	}
	return nil
}

// PostRecv queues receive work requests (ibv_post_recv).
func (qp *QP) PostRecv(wrs []RecvWR) (int, error) {
	e := qp.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if qp.killed {
		return 0, fmt.Errorf("%w: queue pair %#x is killed or closed", ErrState, qp.num)
	}
	if qp.state == abi.QPSReset {
		return 0, fmt.Errorf("%w: post receive in RESET", ErrState)
	}
	if qp.cfg.SRQ != nil {
		return 0, fmt.Errorf("%w: the QP receives from an SRQ", ErrInvalid)
	}
	for i := range wrs {
		if qp.rqTl-qp.rqHead == uint64(len(qp.rq)) || qp.cfg.MaxRecvWR == 0 {
			return i, ErrQueueFull
		}
		if len(wrs[i].SGL) > maxSGE {
			return i, fmt.Errorf("%w: %d SGEs, at most %d", ErrInvalid, len(wrs[i].SGL), maxSGE)
		}
		w := &qp.rq[qp.rqTl%uint64(len(qp.rq))]
		w.id = wrs[i].ID
		w.n = copy(w.sge[:], wrs[i].SGL)
		qp.rqTl++
	}
	if qp.state == abi.QPSErr {
		qp.flushRQ()
	}
	return len(wrs), nil
}

// completeSend posts the completion of a send WQE when it is signaled or
// failed, and frees it. Only the oldest WQE completes.
func (qp *QP) completeSend(w *sendWQE, status abi.WCStatus) {
	qp.rdAtomicOut -= int(w.cost)
	w.cost = 0
	signaled := status != abi.WCSuccess || w.wr.Flags&abi.SendSignaled != 0
	var wc WC
	if signaled {
		wc = WC{ID: w.wr.ID, Status: status, Opcode: wcOpcodeOf(w.wr.Opcode), QPNum: qp.num}
		if status == abi.WCSuccess && (w.wr.Opcode == abi.WRRDMARead || w.wr.Opcode.IsAtomic()) {
			wc.ByteLen = w.length
		}
	}
	// The slot is free before its completion is seen, so a client that
	// polled the completion may post into it at once.
	qp.sqHead++
	qp.retired()
	if signaled {
		qp.cfg.SendCQ.push(&wc)
		qp.notify(qp.cfg.SendCQ)
	}
	if qp.sqNext < qp.sqHead {
		qp.sqNext = qp.sqHead
		qp.reqOff = 0
	}
}

func (qp *QP) notify(cq *CQ) {
	if cq.notify != nil {
		cq.notify()
	}
}

// toError moves the QP to the error state: the oldest outstanding send
// WQE completes with status (when withHead), everything else is flushed.
func (qp *QP) toError(status abi.WCStatus, withHead bool) {
	if withHead && qp.sqHead < qp.sqTl {
		qp.completeSend(&qp.sq[qp.sqHead%uint64(len(qp.sq))], status)
	}
	qp.state = abi.QPSErr
	qp.stateChanged()
	qp.countInflight()
	qp.retryAt, qp.rnrAt, qp.cc.fastAt = time.Time{}, time.Time{}, time.Time{}
	qp.flushSQ()
	qp.flushRQ()
}

func (qp *QP) flushSQ() {
	for qp.sqHead < qp.sqTl {
		w := &qp.sq[qp.sqHead%uint64(len(qp.sq))]
		w.wr.Flags |= abi.SendSignaled // flushed work always completes
		qp.completeSend(w, abi.WCWRFlushErr)
	}
	qp.sqNext, qp.reqOff = qp.sqHead, 0
}

// flushRQ flushes the QP's own receive queue; an SRQ keeps its WQEs for
// the other QPs (IBA 10.2.9.5).
func (qp *QP) flushRQ() {
	for qp.rqHead < qp.rqTl {
		w := &qp.rq[qp.rqHead%uint64(len(qp.rq))]
		wc := WC{ID: w.id, Status: abi.WCWRFlushErr, Opcode: abi.WCRecv, QPNum: qp.num}
		qp.cfg.RecvCQ.push(&wc)
		qp.rqHead++
	}
	qp.retired()
	qp.notify(qp.cfg.RecvCQ)
}

// stateChanged tells the QP's OnState its new state.
func (qp *QP) stateChanged() {
	if qp.cfg.OnState != nil {
		qp.cfg.OnState(qp.state)
	}
}

// retired reports the counts of retired WQEs to the QP's OnRetire.
func (qp *QP) retired() {
	if qp.cfg.OnRetire != nil {
		qp.cfg.OnRetire(qp.sqHead, qp.rqHead)
	}
}

// tick runs the QP's timers.
func (qp *QP) tick(now time.Time) {
	if !qp.nakAt.IsZero() && !now.Before(qp.nakAt) {
		qp.nakAt = time.Time{}
		if qp.stash != nil && qp.stash.n > 0 {
			qp.sendSeqNAK()
		}
	}

	if !qp.rnrAt.IsZero() && !now.Before(qp.rnrAt) {
		qp.rnrAt = time.Time{}
		qp.drive()
	}
	if !qp.retryAt.IsZero() && !now.Before(qp.retryAt) {
		qp.retryAt = time.Time{}
		qp.e.stats.timeouts.Add(1)
		if qp.sqHead == qp.sqNext && qp.reqOff == 0 {
			return // nothing outstanding
		}
		if qp.retryLeft == 0 {
			qp.toError(abi.WCRetryExcErr, true)
			return
		}
		if qp.attr.RetryCnt != 7 {
			qp.retryLeft--
		}
		qp.congested(true)
		qp.goBack()
	}
	qp.fastTick(now)
}

// goBack sends again everything after the last acknowledged PSN, as the
// local ACK timeout and a fast go-back do (IBA 9.7.6.2): READs and
// atomics whose answer is still missing may be asked for again, once
// more each.
func (qp *QP) goBack() {
	for i := qp.sqHead; i < qp.sqNext; i++ {
		if w := &qp.sq[i%uint64(len(qp.sq))]; !w.filled {
			w.askedAt = 0
		}
	}
	qp.rewind(qp.acked.Next())
	qp.completeInOrder()
	qp.drive()
}

// armRetry starts the local ACK timer when packets are outstanding.
func (qp *QP) armRetry() {
	d := timeoutDuration(qp.attr.Timeout)
	if d == 0 || qp.cfg.Type != abi.RC {
		return
	}
	if qp.sqHead == qp.sqNext && qp.reqOff == 0 {
		qp.retryAt = time.Time{}
		return
	}
	qp.retryAt = qp.e.cfg.Now().Add(d)
	qp.e.timerSet(qp.retryAt)
}

// putUint64 stores v in host (little-endian) order, as an atomic's
// original value lands in memory.
func putUint64(b []byte, v uint64) { binary.LittleEndian.PutUint64(b, v) }
func getUint64(b []byte) uint64    { return binary.LittleEndian.Uint64(b) }

// MaxMessage is the largest message, as rxe has it (RXE_MAX_MSG_SIZE):
// 2 GiB, which keeps a READ's PSNs within half the PSN space.
const MaxMessage = 1 << 31
