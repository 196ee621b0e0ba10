package transport

import (
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/verbs/abi"
)

// respond handles a request packet on the responder side (IBA 9.7.4;
// rxe's responder): PSN check, execution, acknowledgement. ref, when not
// nil, is the payload of a whole message from the local switch
// (Engine.ReceiveLocal).
func (qp *QP) respond(frame []byte, p *roce.Packet, ref []byte) {
	if qp.state != abi.QPSRTR && qp.state != abi.QPSRTS && qp.state != abi.QPSSQE {
		qp.e.stats.dropped.Add(1)
		return
	}
	if qp.cfg.Type == abi.UD {
		qp.receiveUD(frame, p)
		return
	}
	if p.TOS&roce.ECNMask == roce.ECNCE {
		qp.sendCNP()
	}
	d := p.BTH.PSN.Diff(qp.ePSN)
	switch {
	case d < 0:
		qp.e.stats.dupRequests.Add(1)
		if qp.cfg.Type == abi.RC {
			qp.duplicate(frame, p)
		}
		return
	case d > 0:
		if qp.cfg.Type == abi.UC {
			// UC: a lost packet ends the message; start over at this one.
			qp.inMsg = false
			qp.ePSN = p.BTH.PSN
			break
		}
		// A packet ahead of the expected one is behind a loss or has only
		// overtaken the one expected. It is kept aside, and the gap NAKed
		// (once per gap, IBA 9.7.5.2.3) only when more than a swap's worth
		// of packets wait or it falls outside the reorder window: on the
		// wire this is go-back-N, but a reordered packet costs no
		// retransmission.
		// A whole message from the local switch is never kept aside: its
		// payload is the sender's memory, lent only for this call.
		if qp.stash == nil {
			qp.stash = newReorderStash(qp.e.cfg.MTU + roce.EthernetLen)
		}
		if d >= reorderWindow || ref != nil || !qp.stash.put(frame, p) || qp.stash.n >= reorderTolerance {
			qp.sendSeqNAK()
		} else if !qp.nakSent && qp.nakAt.IsZero() {
			// Few packets follow a loss at the end of a burst: NAK after
			// a short while rather than leave it to the requester's
			// timeout.
			qp.nakAt = qp.e.cfg.Now().Add(reorderHold)
			qp.e.timerSet(qp.nakAt)
		}
		return
	}
	qp.nakSent, qp.nakAt = false, time.Time{}
	if qp.firstReq {
		qp.firstReq = false
		if f := qp.e.cfg.CommEstablished; f != nil {
			f(qp.num)
		}
	}
	qp.executeInOrder(frame, p, ref)
	// Packets that overtook this one now follow it.
	for qp.stash != nil && qp.stash.n > 0 && qp.state != abi.QPSErr {
		f, sp, ok := qp.stash.take(qp.ePSN)
		if !ok {
			break
		}
		qp.executeInOrder(f, sp, nil)
	}
}

// executeInOrder executes the expected packet and forgets any copy kept
// aside for the PSNs it consumed (copies that a retransmission overtook).
func (qp *QP) executeInOrder(frame []byte, p *roce.Packet, ref []byte) {
	start := qp.ePSN
	qp.execute(frame, p, ref)
	if qp.stash != nil && qp.stash.n > 0 {
		qp.stash.drop(start, qp.ePSN)
	}
}

// execute carries out the request packet expected next; ref is
// respond's.
func (qp *QP) execute(frame []byte, p *roce.Packet, ref []byte) {
	info := p.Info()
	switch {
	case info.Has(roce.OpSend), info.Has(roce.OpWrite):
		qp.sendOrWrite(frame, p, ref)
	case info.Has(roce.OpRead):
		qp.read(p, p.BTH.PSN, true)
	case info.Has(roce.OpAtomic):
		qp.atomic(p)
	default:
		qp.nak(roce.NAKInvalidRequest)
	}
}

// maxLingering bounds the killed and closed QPs an engine keeps, whose
// timers Tick and NextDeadline go through with the live ones' and which
// no client's limits count.
const maxLingering = 4096

// DefaultLingerQuiet is Config.LingerQuiet's default: longer than the two
// ends of a perftest -D run lie apart, and than a dead client's DREQ takes
// to reach its peer.
const DefaultLingerQuiet = 2 * time.Second

// lingerQuiet is Config.LingerQuiet with its default.
func (e *Engine) lingerQuiet() time.Duration {
	switch q := e.cfg.LingerQuiet; {
	case q == 0:
		return DefaultLingerQuiet
	case q < 0:
		return 0
	default:
		return q
	}
}

// linger makes the QP a killed or closed one until linger from now: its
// timers stop, its queues and the packets it kept aside go, and from then
// on lingerAnswer answers what arrives for it. e.mu is held.
func (qp *QP) linger(linger time.Duration) {
	// Past a bound, the QP whose linger ends first goes at once.
	e := qp.e
	if e.lingering >= maxLingering {
		var first *QP
		for _, o := range e.qps {
			if o.killed && (first == nil || o.killAt.Before(first.killAt)) {
				first = o
			}
		}
		e.remove(first)
	}
	e.lingering++
	qp.killed = true
	now := qp.e.cfg.Now()
	qp.killAt = now.Add(linger)
	qp.quietTo = now.Add(min(e.lingerQuiet(), linger/2))
	qp.e.timerSet(qp.killAt)
	qp.retryAt, qp.rnrAt, qp.nakAt, qp.cc.fastAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	// It sends no more requests: its part of the port's cap and its path
	// go now.
	qp.releasePath()
	qp.inMsg = false
	qp.stash = nil
	qp.nakSent, qp.lastPSN = false, qp.ePSN.Add(-1)
	// Nothing posts to it again (PostSend and PostRecv refuse): the
	// queues' memory need not wait for the linger.
	qp.sq, qp.rq = nil, nil
	qp.sqHead, qp.sqNext, qp.sqTl, qp.rqHead, qp.rqTl, qp.reqOff = 0, 0, 0, 0, 0, 0
	// Nor does it take receives from its SRQ, which may go before it, or
	// complete anything: it lets go of its CQs and its owner's callbacks,
	// whose rings its owner may unmap.
	if qp.cfg.SRQ != nil {
		qp.cfg.SRQ.users--
	}
	qp.cfg.SRQ, qp.cfg.SendCQ, qp.cfg.RecvCQ = nil, nil, nil
	qp.cfg.OnState, qp.cfg.OnRetire, qp.cfg.Refill, qp.addRecv = nil, nil, nil, nil
}

// lingerAnswer answers a packet for a killed or closed QP (Engine.Kill,
// Engine.Close). An RC request the QP executed before, whose answer the
// network lost, is answered as the live QP answers a duplicate (IBA
// 9.7.4.1.2): SEND and WRITE acknowledged again, a READ read again while
// its region is still registered, an atomic from its saved result.
//
// Every other RC request, and a duplicate that cannot be answered so, is
// dropped during the QP's quiet spell (lingerQuiet), as rxe drops what
// arrives for a QP that no longer exists, and NAKed after it: with the
// remote operational error code (AETH NAK code 3, IBA 9.7.5.2.1 table 44)
// and the QP's MSN, with the request's PSN, or the expected PSN when the
// request lies beyond it (the requester takes a NAK as acknowledging every
// PSN before its own, and nothing the QP never executed is acknowledged).
// The requester then completes its work with IBV_WC_REM_OP_ERR and moves
// to the error state (IBA 9.9.3.1.3), where silence would leave it
// retrying, forever with the retry_cnt of 7 rxe takes as infinite. The
// silence first lets the peer's own end come before the error: the peer
// of a perftest -D run, which stops on its own timer and may still poll
// for the completion of its last request, and the peer of a dead RDMA CM
// client, whose DREQ (its DISCONNECTED event) must come before the error.
// Anything else, and a request to a QP that never had a peer, is dropped.
//
// The QP NAKs once per episode, as a live one NAKs a gap once
// (sendSeqNAK): the requester fails at the first NAK, so the rest of its
// window, still in flight, is dropped instead of drawing a NAK each —
// hundreds for one PSN. An episode begins when the requester goes back: a
// request at or behind the last one seen is its retransmission after a
// timeout (IBA 9.7.6.1.3), which means it lost the NAK and needs another.
func (qp *QP) lingerAnswer(frame []byte, p *roce.Packet) {
	if qp.cfg.Type != abi.RC || !p.Info().Has(roce.Request) || !qp.tmpl.Dst.IsValid() {
		qp.e.stats.dropped.Add(1)
		return
	}
	psn := p.BTH.PSN
	if psn.Diff(qp.lastPSN) <= 0 {
		qp.nakSent = false
	}
	qp.lastPSN = psn
	switch d := psn.Diff(qp.ePSN); {
	case d < 0:
		qp.e.stats.dupRequests.Add(1)
		if qp.duplicate(frame, p) {
			return
		}
	case d > 0:
		psn = qp.ePSN
	}
	if qp.nakSent || qp.e.cfg.Now().Before(qp.quietTo) {
		qp.e.stats.dropped.Add(1)
		return
	}
	qp.nakSent = true
	qp.e.stats.naksSent.Add(1)
	qp.sendAck(psn, roce.SyndromeNAK|roce.NAKRemoteOperationError)
}

// reorderWindow is how far ahead of the expected PSN a request may be
// kept aside; reorderTolerance how many may wait before the gap is NAKed.
const (
	reorderWindow    = 64
	reorderTolerance = 3
	reorderHold      = 2 * time.Millisecond // longer than the impairment's reorder hold
)

// reorderStash keeps request packets that arrived ahead of their turn.
// A slot's frame buffer is made when the slot is first used: a QP that
// sees one packet out of order keeps one buffer, not reorderWindow (at
// MTU 9000, 576 KiB a QP).
type reorderStash struct {
	slot [reorderWindow]struct {
		psn   roce.PSN
		valid bool
		frame []byte
		pkt   roce.Packet
	}
	n         int
	frameSize int
}

func newReorderStash(frameSize int) *reorderStash {
	return &reorderStash{frameSize: frameSize}
}

// put keeps a copy of frame; it reports false when it cannot.
func (s *reorderStash) put(frame []byte, p *roce.Packet) bool {
	e := &s.slot[uint32(p.BTH.PSN)%reorderWindow]
	if e.valid && e.psn == p.BTH.PSN {
		return true // a duplicate of one kept
	}
	if e.valid || len(frame) > s.frameSize {
		return false
	}
	if e.frame == nil {
		e.frame = make([]byte, 0, s.frameSize)
	}
	e.frame = append(e.frame[:0], frame...)
	e.pkt, e.psn, e.valid = *p, p.BTH.PSN, true
	s.n++
	return true
}

// take returns the packet kept for psn.
func (s *reorderStash) take(psn roce.PSN) ([]byte, *roce.Packet, bool) {
	e := &s.slot[uint32(psn)%reorderWindow]
	if !e.valid || e.psn != psn {
		return nil, nil, false
	}
	e.valid = false
	s.n--
	return e.frame, &e.pkt, true
}

// drop forgets the packets kept for PSNs in [from, to).
func (s *reorderStash) drop(from, to roce.PSN) {
	for i := range s.slot {
		e := &s.slot[i]
		if e.valid && e.psn.Between(from, to) {
			e.valid = false
			s.n--
		}
	}
}

func (s *reorderStash) clear() {
	for i := range s.slot {
		s.slot[i].valid = false
	}
	s.n = 0
}

// sendSeqNAK sends the PSN sequence error NAK for the expected PSN.
func (qp *QP) sendSeqNAK() {
	if qp.nakSent || qp.state == abi.QPSErr {
		return
	}
	qp.nakSent, qp.nakAt = true, time.Time{}
	qp.sendAck(qp.ePSN, roce.SyndromeNAK|roce.NAKPSNSequenceError)
	qp.e.stats.naksSent.Add(1)
}

// nak sends a NAK for the expected PSN and, for the errors that end a
// connection (invalid request, remote access or operational error),
// moves the QP to the error state (IBA 9.9.3.1.3).
func (qp *QP) nak(code uint8) {
	if qp.cfg.Type == abi.UC { // UC: drop the message silently (rxe drop_msg)
		qp.inMsg = false
		qp.e.stats.dropped.Add(1)
		return
	}
	qp.e.stats.naksSent.Add(1)
	if qp.cfg.Type == abi.RC {
		qp.sendAck(qp.ePSN, roce.SyndromeNAK|roce.Syndrome(code))
	}
	qp.inMsg = false
	qp.toError(abi.WCWRFlushErr, false)
}

// sendAck sends an ACKNOWLEDGE with the given PSN and syndrome at once.
func (qp *QP) sendAck(psn roce.PSN, syn roce.Syndrome) { qp.queueAck(psn, syn, false) }

// queueAck queues an ACKNOWLEDGE; mayWait lets it wait for company
// (Config.AckDelay).
func (qp *QP) queueAck(psn roce.PSN, syn roce.Syndrome, mayWait bool) {
	p := &qp.tmpl
	p.BTH.Opcode, p.BTH.PSN, p.BTH.AckReq, p.BTH.SolicitedEvent = roce.RCAcknowledge, psn, false, false
	p.AETH = roce.AETHFields{Syndrome: syn, MSN: qp.msn & 0xFFFFFF}
	qp.build(p, nil, nil, 0, 0, mayWait)
}

// recvHead returns the oldest receive WQE, of the QP's receive queue or
// its SRQ, or nil when there is none.
func (qp *QP) recvHead() *recvWQE {
	if s := qp.cfg.SRQ; s != nil {
		return s.next()
	}
	if qp.rqHead == qp.rqTl && qp.cfg.Refill != nil {
		qp.cfg.Refill(qp.addRecv)
	}
	if qp.rqHead == qp.rqTl {
		return nil
	}
	return &qp.rq[qp.rqHead%uint64(len(qp.rq))]
}

// addRecvLocked queues one receive WQE with the engine's lock held (for
// Refill); it reports whether there was room.
func (qp *QP) addRecvLocked(wr RecvWR) bool {
	if qp.rqTl-qp.rqHead == uint64(len(qp.rq)) || len(wr.SGL) > maxSGE || qp.state == abi.QPSReset || qp.state == abi.QPSErr {
		return false
	}
	w := &qp.rq[qp.rqTl%uint64(len(qp.rq))]
	w.id = wr.ID
	w.n = copy(w.sge[:], wr.SGL)
	qp.rqTl++
	return true
}

// consumeRecv retires the receive WQE recvHead returned.
func (qp *QP) consumeRecv() {
	if s := qp.cfg.SRQ; s != nil {
		s.consume()
		return
	}
	qp.rqHead++
	qp.retired()
}

// rnr answers a request that needs a receive WQE when there is none: an
// RNR NAK with the QP's min_rnr_timer; the PSN is not consumed.
func (qp *QP) rnr() {
	if qp.cfg.Type == abi.UC {
		qp.inMsg = false
		qp.e.stats.dropped.Add(1)
		return
	}
	qp.e.stats.rnrSent.Add(1)
	qp.sendAck(qp.ePSN, roce.SyndromeRNRNAK|roce.Syndrome(qp.attr.MinRNRTimer&31))
}

// sendOrWrite executes a SEND or RDMA WRITE packet; a ref that is not nil
// is the payload of a whole message from the local switch, which stands
// for all the packets of its payload.
func (qp *QP) sendOrWrite(frame []byte, p *roce.Packet, ref []byte) {
	info := p.Info()
	first := info.Has(roce.First) || info.Has(roce.Only)
	last := info.Has(roce.Last) || info.Has(roce.Only)
	isSend := info.Has(roce.OpSend)
	if err := roce.CheckPayloadLen(p.BTH.Opcode, p.PayloadLen, qp.pmtu); err != nil {
		qp.nak(roce.NAKInvalidRequest)
		return
	}
	if first == qp.inMsg || !first && qp.msgSend != isSend {
		qp.nak(roce.NAKInvalidRequest) // out of sequence (IBA 9.7.4.1.5)
		return
	}
	needRecv := isSend || info.Has(roce.HasImmDt)
	if needRecv && qp.recvHead() == nil && (isSend && first || !isSend && last) {
		qp.rnr()
		return
	}
	payload := p.Payload(frame)
	npkts := 1
	if ref != nil && first && last {
		payload = ref
		npkts = max(1, (len(payload)+qp.pmtu-1)/qp.pmtu)
	}
	if first {
		qp.msgSend, qp.msgOff = isSend, 0
		if !isSend {
			if qp.attr.Access&abi.AccessRemoteWrite == 0 {
				qp.nak(roce.NAKRemoteAccessError)
				return
			}
			if _, ok := qp.e.mem.remote(qp.cfg.PD, p.RETH.RKey, p.RETH.VA, p.RETH.DMALen, abi.AccessRemoteWrite); !ok {
				qp.nak(roce.NAKRemoteAccessError)
				return
			}
			qp.msgRKey, qp.msgVA, qp.msgLen = p.RETH.RKey, p.RETH.VA, p.RETH.DMALen
		}
	}
	if isSend {
		w := qp.recvHead()
		if !qp.e.mem.resolve(qp.cfg.PD, w.sges(), true, &qp.scratch) {
			qp.recvError(w, abi.WCLocProtErr)
			qp.nak(roce.NAKRemoteOperationError)
			return
		}
		if qp.msgOff+uint32(len(payload)) > qp.scratch.total {
			qp.recvError(w, abi.WCLocLenErr)
			qp.nak(roce.NAKInvalidRequest)
			return
		}
		qp.scratch.copyIn(payload, qp.msgOff)
	} else {
		if qp.msgOff+uint32(len(payload)) > qp.msgLen || last && qp.msgOff+uint32(len(payload)) != qp.msgLen {
			qp.nak(roce.NAKInvalidRequest)
			return
		}
		// The target is looked up again for each packet: no slice of a
		// region outlives the engine's lock, so a region deregistered in
		// the middle of a message is refused, never written after.
		dst, ok := qp.e.mem.remote(qp.cfg.PD, qp.msgRKey, qp.msgVA+uint64(qp.msgOff), uint32(len(payload)), abi.AccessRemoteWrite)
		if !ok {
			qp.nak(roce.NAKRemoteAccessError)
			return
		}
		copy(dst, payload)
	}
	if last && info.Has(roce.HasIETH) && !qp.e.mem.invalidate(qp.cfg.PD, p.IETH) {
		// IBA 10.6.7.2 and the class J responder error: an R_Key the
		// responder cannot invalidate fails the receive WQE with a remote
		// invalid request error, NAKs the request and ends the QP.
		qp.recvError(qp.recvHead(), abi.WCRemInvReqErr)
		qp.nak(roce.NAKInvalidRequest)
		return
	}
	qp.msgOff += uint32(len(payload))
	qp.inMsg = !last
	qp.ePSN = qp.ePSN.Add(npkts)
	if last {
		qp.msn++
		if needRecv {
			w := qp.recvHead()
			wc := WC{ID: w.id, Status: abi.WCSuccess, Opcode: abi.WCRecv, ByteLen: qp.msgOff, QPNum: qp.num}
			if !isSend {
				wc.Opcode = abi.WCRecvRDMAImm
			}
			if info.Has(roce.HasImmDt) {
				wc.Imm, wc.Flags = p.Imm, abi.WCWithImm
			}
			if info.Has(roce.HasIETH) {
				wc.Imm, wc.Flags = p.IETH, abi.WCWithInv
			}
			qp.consumeRecv()
			qp.cfg.RecvCQ.push(&wc)
			qp.notify(qp.cfg.RecvCQ)
		}
	}
	if qp.cfg.Type == abi.RC {
		// The acknowledgement of a message that completed a receive may
		// wait for the answer its client may post (Config.AckDelay) —
		// not towards the local switch, where it costs no write, and
		// waiting keeps a blocking loop polling on a core the clients
		// need.
		mayWait := last && needRecv && !qp.local
		if npkts > 1 {
			qp.queueAck(p.BTH.PSN.Add(npkts-1), roce.SyndromeACK|roce.CreditInvalid, mayWait)
		} else if p.BTH.AckReq {
			qp.queueAck(p.BTH.PSN, roce.SyndromeACK|roce.CreditInvalid, mayWait)
		}
	}
}

// recvError completes the receive WQE w with an error status.
func (qp *QP) recvError(w *recvWQE, st abi.WCStatus) {
	wc := WC{ID: w.id, Status: st, Opcode: abi.WCRecv, QPNum: qp.num}
	qp.consumeRecv()
	qp.cfg.RecvCQ.push(&wc)
}

// read executes an RDMA READ request: the response packets carry the
// request's PSNs from psn on. fresh is false for a duplicate re-executed.
// It reports whether it answered with the data.
func (qp *QP) read(p *roce.Packet, psn roce.PSN, fresh bool) bool {
	if fresh && qp.attr.Access&abi.AccessRemoteRead == 0 {
		qp.nak(roce.NAKRemoteAccessError)
		return false
	}
	length := p.RETH.DMALen
	buf, mr, ok := qp.e.mem.remoteMR(qp.cfg.PD, p.RETH.RKey, p.RETH.VA, length, abi.AccessRemoteRead)
	if !ok {
		if fresh {
			qp.nak(roce.NAKRemoteAccessError)
		}
		return false
	}
	n := roce.ReadPSNs(length, qp.pmtu)
	if fresh {
		qp.remember(respEntry{first: psn, last: psn.Add(n - 1), valid: true,
			rkey: p.RETH.RKey, va: p.RETH.VA, end: p.RETH.VA + uint64(length)})
		qp.ePSN = psn.Add(n)
		qp.msn++
	}
	r := &qp.tmpl
	r.BTH.AckReq, r.BTH.SolicitedEvent = false, false
	r.AETH = roce.AETHFields{Syndrome: roce.SyndromeACK | roce.CreditInvalid, MSN: qp.msn & 0xFFFFFF}
	if qp.local && n > 1 {
		qp.respondWhole(r, psn, buf, mr)
		return true
	}
	var src sgl
	src.segs = append(qp.scratch.segs[:0], buf)
	src.total = length
	for i := 0; i < n; i++ {
		off := uint32(i) * uint32(qp.pmtu)
		k := min(uint32(qp.pmtu), length-off)
		switch {
		case n == 1:
			r.BTH.Opcode = roce.RCRDMAReadResponseOnly
		case i == 0:
			r.BTH.Opcode = roce.RCRDMAReadResponseFirst
		case i == n-1:
			r.BTH.Opcode = roce.RCRDMAReadResponseLast
		default:
			r.BTH.Opcode = roce.RCRDMAReadResponseMiddle
		}
		r.BTH.PSN = psn.Add(i)
		qp.buildAndSend(r, &src, nil, off, k)
	}
	qp.scratch.segs = src.segs[:0]
	return true
}

// respondWhole answers a READ from a requester on the local switch with
// one frame: READ RESPONSE ONLY with the request's first PSN, standing for
// the packets of all its PSNs, and the data left where it is, in mr
// (Batch.Refs), which stays pinned until the frame is delivered. The
// requester copies it once, into its buffer — so the data is read then,
// not when the READ executes: a WRITE or SEND behind the READ that the
// responder executes before the requester polls can show in it, where
// rxe's copy would not. IBA's ordering rules let a later WRITE or SEND
// pass a READ's data this way (IBA 9.5, RDMA READ's relaxed ordering);
// an application that needs them apart sets the fence indicator
// (IBV_SEND_FENCE), and the requester then holds the later request until
// the READ completes (sendRC; TestLocalReadFence).
func (qp *QP) respondWhole(r *roce.Packet, psn roce.PSN, data []byte, mr *MR) {
	r.BTH.Opcode, r.BTH.PSN = roce.RCRDMAReadResponseOnly, psn
	qp.e.sendWhole(r, data, mr)
}

// atomic executes CMP_SWAP or FETCH_ADD (IBA 9.4.5) and answers with the
// original value.
func (qp *QP) atomic(p *roce.Packet) {
	a := &p.AtomicETH
	if a.VA%8 != 0 {
		qp.nak(roce.NAKInvalidRequest) // rxe: misaligned atomic, class C
		return
	}
	if qp.attr.Access&abi.AccessRemoteAtomic == 0 {
		qp.nak(roce.NAKRemoteAccessError)
		return
	}
	buf, ok := qp.e.mem.remote(qp.cfg.PD, a.RKey, a.VA, 8, abi.AccessRemoteAtomic)
	if !ok {
		qp.nak(roce.NAKRemoteAccessError)
		return
	}
	orig := getUint64(buf)
	switch p.BTH.Opcode {
	case roce.RCCompareSwap:
		if orig == a.Compare {
			putUint64(buf, a.SwapAdd)
		}
	case roce.RCFetchAdd:
		putUint64(buf, orig+a.SwapAdd)
	}
	qp.remember(respEntry{first: p.BTH.PSN, last: p.BTH.PSN, atomic: true, orig: orig, valid: true})
	qp.ePSN = qp.ePSN.Next()
	qp.msn++
	qp.sendAtomicAck(p.BTH.PSN, orig)
}

func (qp *QP) sendAtomicAck(psn roce.PSN, orig uint64) {
	r := &qp.tmpl
	r.BTH.Opcode, r.BTH.PSN, r.BTH.AckReq, r.BTH.SolicitedEvent = roce.RCAtomicAcknowledge, psn, false, false
	r.AETH = roce.AETHFields{Syndrome: roce.SyndromeACK | roce.CreditInvalid, MSN: qp.msn & 0xFFFFFF}
	r.AtomicAck = orig
	qp.buildAndSend(r, nil, nil, 0, 0)
}

// covers reports whether a READ request asks for part of the region the
// READ r was executed for.
func (r *respEntry) covers(h *roce.RETHFields) bool {
	return h.RKey == r.rkey && h.VA >= r.va && h.VA <= r.end && uint64(h.DMALen) <= r.end-h.VA
}

// remember keeps a READ or atomic for duplicates, in a ring.
func (qp *QP) remember(r respEntry) {
	qp.cache[qp.cacheN%len(qp.cache)] = r
	qp.cacheN++
}

// duplicate answers a request the responder has seen before (IBA
// 9.7.4.1.2): SEND and WRITE are acknowledged again, not executed; a READ
// is executed again from memory; an atomic is answered from the saved
// result, never executed twice. It reports whether it answered: a READ or
// atomic it no longer remembers, or a READ whose region is gone, is not.
func (qp *QP) duplicate(frame []byte, p *roce.Packet) bool {
	info := p.Info()
	switch {
	case info.Has(roce.OpRead):
		for _, r := range qp.cache {
			if r.valid && !r.atomic && p.BTH.PSN.Diff(r.first) >= 0 && p.BTH.PSN.Diff(r.last) <= 0 {
				if qp.killed && !r.covers(&p.RETH) {
					// Its owner is gone: read again only what it
					// granted before, not whatever a request names.
					return false
				}
				return qp.read(p, p.BTH.PSN, false)
			}
		}
		return false
	case info.Has(roce.OpAtomic):
		for _, r := range qp.cache {
			if r.valid && r.atomic && r.first == p.BTH.PSN {
				qp.sendAtomicAck(r.first, r.orig)
				return true
			}
		}
		return false
	default:
		qp.sendAck(qp.ePSN.Add(-1), roce.SyndromeACK|roce.CreditInvalid)
		return true
	}
}

// receiveUD delivers a UD SEND into the next receive WQE, behind the
// 40-byte GRH area libibverbs defines (for RoCEv2 over IPv4 the IPv4
// header sits in its last 20 bytes).
func (qp *QP) receiveUD(frame []byte, p *roce.Packet) {
	// The Q_Key was checked on arrival (QP.admit).
	w := qp.recvHead()
	if w == nil {
		qp.e.stats.dropped.Add(1)
		return
	}
	const grh = 40
	if !qp.e.mem.resolve(qp.cfg.PD, w.sges(), true, &qp.scratch) {
		qp.recvError(w, abi.WCLocProtErr)
		qp.notify(qp.cfg.RecvCQ)
		return
	}
	payload := p.Payload(frame)
	if qp.scratch.total < grh+uint32(len(payload)) {
		qp.recvError(w, abi.WCLocLenErr)
		qp.notify(qp.cfg.RecvCQ)
		return
	}
	var area [grh]byte
	if p.IPv6 {
		copy(area[:], frame[roce.EthernetLen:roce.EthernetLen+roce.IPv6Len])
	} else {
		copy(area[20:], frame[roce.EthernetLen:roce.EthernetLen+roce.IPv4Len])
	}
	qp.scratch.copyIn(area[:], 0)
	qp.scratch.copyIn(payload, grh)
	wc := WC{ID: w.id, Status: abi.WCSuccess, Opcode: abi.WCRecv, ByteLen: grh + uint32(len(payload)),
		QPNum: qp.num, SrcQP: p.DETH.SrcQP, Flags: abi.WCGRH}
	if p.Info().Has(roce.HasImmDt) {
		wc.Imm, wc.Flags = p.Imm, wc.Flags|abi.WCWithImm
	}
	qp.consumeRecv()
	qp.cfg.RecvCQ.push(&wc)
	qp.notify(qp.cfg.RecvCQ)
}
