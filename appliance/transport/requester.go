package transport

import (
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/verbs/abi"
)

// A QP's window bounds the packets it has sent and not yet seen
// acknowledged, and it asks for an acknowledgement at least every ackEvery
// packets within a long message (rxe: RXE_MAX_PKT_PER_ACK). Both are set
// in bytes — inflightBytes and ackBytes of payload, at least maxInflight
// and maxPktsPerAck packets — so that a path MTU of 1024 keeps as much in
// flight as one of 4096 and asks as seldom: in packets, the 1024-byte path
// of an MTU 1500 network stalled on its window a quarter as full, and
// wrote four times the acknowledgements (BenchmarkLabWrite64K/mtu1500:
// write_bw 0.79–0.92× TCP with 128 and 32 packets, 0.93–1.10× in bytes;
// docs/performance-log.md, window in bytes).
const (
	maxInflight   = 128
	maxPktsPerAck = 32
	inflightBytes = maxInflight * 4096
	ackBytes      = maxPktsPerAck * 4096
)

// window returns how many packets qp may have unacknowledged. Towards the
// local switch too: there a whole message is one frame, and 1 MiB WRITEs
// in flight sixteen at a time, not one, moved at half the speed
// (BenchmarkLabSpeed's local-write, 9.1–9.5 against 19–22 GB/s): their
// buffers no longer stay in the cache.
// Below it, the congestion window (cc.go) bounds a QP over a wire.
func (qp *QP) window() int { return qp.cc.limit(qp.maxWindow()) }

// maxWindow is the fixed window, the hard cap on packets in flight.
func (qp *QP) maxWindow() int { return max(maxInflight, inflightBytes/max(qp.pmtu, 1)) }

// ackEvery returns how many packets of a long message qp sends before one
// asks for an acknowledgement.
func (qp *QP) ackEvery() int {
	return qp.portAckEvery(qp.cc.ackEvery(max(maxPktsPerAck, ackBytes/max(qp.pmtu, 1))))
}

// readChunk is the most packets one READ request asks for. A longer READ
// is asked for in pieces with consecutive PSNs, two pieces ahead of what
// has arrived, so that a READ's responses are paced by the
// requester as its WRITEs are by the window, and a lost response costs at
// most a piece again. With two requests out, a lost one shows as a gap
// to the responder, which NAKs it, instead of costing a local ACK
// timeout. The responder sees ordinary READ requests.
//
// Pieces lie on a grid of readChunk packets from the start of the READ,
// and a request asked again never crosses a grid line: so every request
// is either news to the responder (a piece it has not executed, starting
// at its expected PSN) or wholly a duplicate of one it has executed —
// never a duplicate that runs on into PSNs it has not seen.
const readChunk = 64

// localReadPiece is how many bytes one READ request asks for when the
// responder is on the local switch (a multiple of every path MTU): the
// whole READ up to 1 GiB, answered by one frame that refers to the
// responder's memory (respondWhole), so that the data is copied once,
// straight into the requester's buffer.
const localReadPiece = 1 << 30

// readPiece is how many bytes one READ request asks for at most.
func (qp *QP) readPiece() uint32 {
	if qp.local {
		return localReadPiece
	}
	return readChunk * uint32(qp.pmtu)
}

// buildAndSend encodes p into the next transmit buffer, with n payload
// bytes taken from src at offset off (or from inline bytes), and queues it.
func (qp *QP) buildAndSend(p *roce.Packet, src *sgl, inline []byte, off, n uint32) {
	qp.build(p, src, inline, off, n, false)
}

// build is buildAndSend; mayWait marks an acknowledgement that may wait
// for company (Engine.emit).
func (qp *QP) build(p *roce.Packet, src *sgl, inline []byte, off, n uint32, mayWait bool) {
	e := qp.e
	b := e.frame()
	p.SetPayloadLen(int(n))
	h := p.HeaderLen()
	if n > 0 {
		if inline != nil {
			copy(b[h:h+int(n)], inline[off:off+n])
		} else {
			src.copyOut(b[h:h+int(n)], off)
		}
	}
	m, ok := e.encode(p, b)
	if !ok {
		return
	}
	e.emit(m, mayWait)
	if p.Info().Has(roce.Request) {
		end := p.BTH.PSN.Next()
		if p.BTH.Opcode == roce.RCRDMAReadRequest {
			end = p.BTH.PSN.Add(roce.ReadPSNs(p.RETH.DMALen, qp.pmtu))
		}
		if end.Diff(qp.sentTo) > 0 {
			if p.BTH.AckReq && qp.cc.on {
				qp.cc.sent(end.Add(-1), e.cfg.Now())
			}
			qp.sentTo = end
		}
	}
}

// inflight returns the packets sent and not acknowledged.
func (qp *QP) inflight() int { return qp.psn.Diff(qp.acked.Next()) }

// drive sends what the send queue holds, as far as the window, the
// port's cap, the max_rd_atomic limit and an RNR wait allow.
func (qp *QP) drive() {
	qp.driveQueue()
	if qp.cc.on {
		qp.countInflight()
	}
}

func (qp *QP) driveQueue() {
	if qp.state != abi.QPSRTS && qp.state != abi.QPSSQE || !qp.rnrAt.IsZero() {
		return
	}
	for qp.sqNext < qp.sqTl {
		if qp.sq[qp.sqNext%uint64(len(qp.sq))].fail != 0 {
			break
		}
		if qp.cfg.Type == abi.RC && (qp.inflight() >= qp.window() || qp.portFull()) {
			break
		}
		w := &qp.sq[qp.sqNext%uint64(len(qp.sq))]
		if qp.cfg.Type == abi.UD {
			qp.sendUD(w)
			continue
		}
		if !qp.sendRC(w) {
			break
		}
	}
	if qp.cfg.Type == abi.RC && qp.retryAt.IsZero() {
		qp.armRetry()
	}
	if qp.cc.lossOn && qp.cc.fastAt.IsZero() {
		qp.armFast(qp.e.cfg.Now())
	}
}

// resolveLocal resolves the WQE's SGL for reading (sends, writes) or
// writing (reads, atomics) into qp.scratch; a failure completes the WQE
// with a local protection error and moves the QP to the error state.
func (qp *QP) resolveLocal(w *sendWQE, write bool) bool {
	if w.wr.Flags&abi.SendInline != 0 {
		return true
	}
	if !qp.e.mem.resolve(qp.cfg.PD, w.wr.SGL, write, &qp.scratch) {
		qp.failWQE(w, abi.WCLocProtErr)
		return false
	}
	return true
}

// failWQE ends w with a local error. Completions come in order: when
// earlier work is still waiting for acknowledgement, w fails when the
// completer reaches it, and nothing after it is sent.
func (qp *QP) failWQE(w *sendWQE, st abi.WCStatus) {
	if &qp.sq[qp.sqHead%uint64(len(qp.sq))] == w {
		qp.toError(st, true)
		return
	}
	w.fail = st
	qp.sqNext++
	qp.reqOff = 0
	qp.state = abi.QPSSQE // the send queue stops; the completer finishes the job
	qp.stateChanged()
}

// sendRC sends the next packets of w; it returns false when it must stop.
func (qp *QP) sendRC(w *sendWQE) bool {
	op := w.wr.Opcode
	pmtu := uint32(qp.pmtu)
	if !w.assigned {
		// A fenced request waits until every READ and atomic before it
		// has completed (the fence indicator; rxe's wait_fence): then it cannot
		// change what an earlier READ returns, even through the local
		// switch, whose READ data is read when the requester places it
		// (respondWhole).
		if w.wr.Flags&abi.SendFence != 0 && qp.rdAtomicOut > 0 {
			return false
		}
		if (op == abi.WRRDMARead || op.IsAtomic()) && !qp.rdAtomicRoom(w) {
			return false
		}
		w.firstPSN = qp.psn
		n := 1
		switch {
		case op == abi.WRRDMARead:
			n = roce.ReadPSNs(w.length, qp.pmtu)
		case !op.IsAtomic() && w.length > 0:
			n = int((w.length + pmtu - 1) / pmtu)
		}
		w.lastPSN = w.firstPSN.Add(n - 1)
		w.assigned = true
	}
	if (op == abi.WRRDMARead || op.IsAtomic()) && w.cost == 0 {
		if !qp.rdAtomicRoom(w) {
			return false
		}
		w.cost = uint8(qp.rdAtomicCost(w))
		qp.rdAtomicOut += int(w.cost)
	}
	if !qp.resolveLocal(w, op == abi.WRRDMARead || op.IsAtomic()) {
		return false
	}
	if op == abi.WRRDMARead {
		chunk := qp.readPiece()
		if !w.filled && (w.reqEnd < w.length || !w.asked) && w.reqEnd <= w.resp+chunk*uint32(qp.piecesAhead()-1) {
			qp.sendReadRange(w, w.reqEnd)
		}
		if !w.filled && w.reqEnd < w.length {
			// The rest is asked for as responses arrive; nothing after
			// this READ goes before its last request.
			qp.psn = w.firstPSN.Add(int(w.reqEnd / pmtu))
			qp.reqOff = w.reqEnd
			return false
		}
		qp.psn = w.lastPSN.Next()
		qp.finishSent()
		return true
	}
	if op.IsAtomic() {
		if !w.filled {
			qp.sendReadOrAtomic(w)
		}
		qp.psn = w.lastPSN.Next()
		qp.finishSent()
		return true
	}
	p := &qp.tmpl
	p.RETH, p.AtomicETH, p.Imm, p.IETH = roce.RETHFields{}, roce.AtomicETHFields{}, 0, 0
	p.BTH.SolicitedEvent = false
	// SEND and RDMA WRITE: one packet per path MTU.
	var inline []byte
	if w.wr.Flags&abi.SendInline != 0 {
		inline = w.inline
	}
	if qp.local && inline == nil && qp.reqOff == 0 && w.length > pmtu && len(qp.scratch.segs) == 1 {
		return qp.sendWhole(w, p)
	}
	for {
		if qp.cfg.Type == abi.RC && (qp.inflight() >= qp.window() || qp.portFull()) {
			return false
		}
		off := qp.reqOff
		n := min(pmtu, w.length-off)
		first, last := off == 0, off+n >= w.length
		p.BTH.PSN = w.firstPSN.Add(int(off / pmtu))
		p.BTH.Opcode = rcOpcode(op, first, last)
		if qp.cfg.Type == abi.UC {
			p.BTH.Opcode |= roce.TransportUC
		}
		info := p.BTH.Opcode.Info()
		if info.Has(roce.HasRETH) {
			p.RETH = roce.RETHFields{VA: w.wr.RemoteAddr, RKey: w.wr.RKey, DMALen: w.length}
		}
		if info.Has(roce.HasImmDt) {
			p.Imm = w.wr.Imm
		}
		if info.Has(roce.HasIETH) {
			p.IETH = w.wr.Imm
		}
		p.BTH.SolicitedEvent = last && w.wr.Flags&abi.SendSolicited != 0
		qp.noAckPkts++
		p.BTH.AckReq = qp.cfg.Type == abi.RC && (last && qp.lastAsksAck() || qp.noAckPkts >= qp.ackEvery())
		if p.BTH.AckReq {
			qp.noAckPkts = 0
		}
		qp.buildAndSend(p, &qp.scratch, inline, off, n)
		qp.psn = p.BTH.PSN.Next()
		if last {
			qp.finishSent()
			if qp.cfg.Type == abi.UC {
				qp.completeSend(w, abi.WCSuccess)
			}
			return true
		}
		qp.reqOff = off + n
	}
}

// sendWhole sends a SEND or WRITE to a destination on the local switch
// as one frame: the ONLY opcode, the PSNs of all the message's packets,
// and the payload left where it is, in the source region (Batch.Refs).
// The responder executes it as the packets would be and acknowledges its
// last PSN.
func (qp *QP) sendWhole(w *sendWQE, p *roce.Packet) bool {
	if qp.inflight() >= qp.window() {
		return false
	}
	op := w.wr.Opcode
	p.BTH.PSN = w.firstPSN
	p.BTH.Opcode = rcOpcode(op, true, true)
	info := p.BTH.Opcode.Info()
	if info.Has(roce.HasRETH) {
		p.RETH = roce.RETHFields{VA: w.wr.RemoteAddr, RKey: w.wr.RKey, DMALen: w.length}
	}
	if info.Has(roce.HasImmDt) {
		p.Imm = w.wr.Imm
	}
	if info.Has(roce.HasIETH) {
		p.IETH = w.wr.Imm
	}
	p.BTH.SolicitedEvent = w.wr.Flags&abi.SendSolicited != 0
	p.BTH.AckReq = true
	qp.noAckPkts = 0
	if !qp.e.sendWhole(p, qp.scratch.segs[0], qp.scratch.mrs[0]) {
		return false
	}
	if end := w.lastPSN.Next(); end.Diff(qp.sentTo) > 0 {
		qp.sentTo = end
	}
	qp.psn = w.lastPSN.Next()
	qp.finishSent()
	return true
}

// sendReadOrAtomic sends the request of an atomic, or of a READ for the
// first piece of its data not yet received.
func (qp *QP) sendReadOrAtomic(w *sendWQE) {
	if w.wr.Opcode == abi.WRRDMARead {
		qp.sendReadRange(w, w.resp)
		return
	}
	p := &qp.tmpl
	p.BTH.SolicitedEvent, p.BTH.AckReq = false, true
	p.BTH.Opcode = roce.RCFetchAdd
	p.AtomicETH = roce.AtomicETHFields{VA: w.wr.RemoteAddr, RKey: w.wr.RKey, SwapAdd: w.wr.CompareAdd}
	if w.wr.Opcode == abi.WRAtomicCmpAndSwp {
		p.BTH.Opcode = roce.RCCompareSwap
		p.AtomicETH.Compare, p.AtomicETH.SwapAdd = w.wr.CompareAdd, w.wr.Swap
	}
	p.BTH.PSN = w.firstPSN
	qp.buildAndSend(p, nil, nil, 0, 0)
}

// piecesAhead is how many pieces of a long READ may be asked for beyond
// what has arrived: two, unless max_rd_atomic allows only one request.
func (qp *QP) piecesAhead() int {
	if qp.attr.MaxRdAtomic >= 2 {
		return 2
	}
	return 1
}

// rdAtomicCost is how many of the max_rd_atomic outstanding READ and
// atomic requests w takes (IBA 9.5: a requester never has more out than
// the responder has resources, and the responder keeps only that many of
// the latest requests to answer duplicates from). A READ or atomic of one
// request takes one. A READ of several pieces takes them all: it starts
// when nothing else is out and nothing starts behind it until it is
// done, so its pieces asked for again are always among the latest
// requests the responder remembers.
func (qp *QP) rdAtomicCost(w *sendWQE) int {
	if w.wr.Opcode == abi.WRRDMARead && w.length > qp.readPiece() {
		return max(int(qp.attr.MaxRdAtomic), 1)
	}
	return 1
}

// rdAtomicRoom reports whether w's requests fit within max_rd_atomic
// beside those outstanding.
func (qp *QP) rdAtomicRoom(w *sendWQE) bool {
	return qp.rdAtomicOut == 0 || qp.rdAtomicOut+qp.rdAtomicCost(w) <= max(int(qp.attr.MaxRdAtomic), 1)
}

// sendReadRange sends a READ request for w's data from byte off (a
// multiple of the path MTU) to the next grid line of pieces (readPiece),
// and records how far w has been asked for.
func (qp *QP) sendReadRange(w *sendWQE, off uint32) {
	pmtu := uint32(qp.pmtu)
	chunk := qp.readPiece()
	end := min(w.length, (off/chunk+1)*chunk)
	n := end - off
	p := &qp.tmpl
	p.BTH.SolicitedEvent, p.BTH.AckReq = false, true
	p.BTH.Opcode = roce.RCRDMAReadRequest
	p.BTH.PSN = w.firstPSN.Add(int(off / pmtu))
	p.RETH = roce.RETHFields{VA: w.wr.RemoteAddr + uint64(off), RKey: w.wr.RKey, DMALen: n}
	w.reqEnd, w.asked = max(w.reqEnd, end), true
	qp.buildAndSend(p, nil, nil, 0, 0)
}

// lastAsksAck reports whether the last packet of the SEND or WRITE being
// sent (the WQE at sqNext) asks for an acknowledgement. It does unless
// another SEND or WRITE is already posted behind it: that message's
// acknowledgement covers this one too (an ACK acknowledges every earlier
// PSN, IBA 9.7.5.1), so a stream of messages is acknowledged every
// ackEvery packets and at its end rather than once per message, and
// the responder writes, and the requester reads, that many fewer frames.
// A READ or atomic behind it may wait for credits (max_rd_atomic)
// before it goes, and a WQE already failed completes only once this one
// is acknowledged: both make the last packet ask, so that this message's
// completion waits for neither.
func (qp *QP) lastAsksAck() bool {
	next := qp.sqNext + 1
	if next >= qp.sqTl {
		return true
	}
	w := &qp.sq[next%uint64(len(qp.sq))]
	return w.fail != 0 || w.wr.Opcode == abi.WRRDMARead || w.wr.Opcode.IsAtomic()
}

// finishSent moves on from the WQE whose packets are all sent to the next
// WQE.
func (qp *QP) finishSent() {
	qp.sqNext++
	qp.reqOff = 0
}

// rcOpcode picks the packet opcode of a SEND or WRITE packet.
func rcOpcode(op abi.WROpcode, first, last bool) roce.Opcode {
	switch op {
	case abi.WRRDMAWrite, abi.WRRDMAWriteWithImm:
		switch {
		case first && last && op == abi.WRRDMAWriteWithImm:
			return roce.RCRDMAWriteOnlyWithImmediate
		case first && last:
			return roce.RCRDMAWriteOnly
		case first:
			return roce.RCRDMAWriteFirst
		case last && op == abi.WRRDMAWriteWithImm:
			return roce.RCRDMAWriteLastWithImmediate
		case last:
			return roce.RCRDMAWriteLast
		}
		return roce.RCRDMAWriteMiddle
	}
	switch {
	case first && last && op == abi.WRSendWithImm:
		return roce.RCSendOnlyWithImmediate
	case first && last && op == abi.WRSendWithInv:
		return roce.RCSendOnlyWithInvalidate
	case first && last:
		return roce.RCSendOnly
	case first:
		return roce.RCSendFirst
	case last && op == abi.WRSendWithImm:
		return roce.RCSendLastWithImmediate
	case last && op == abi.WRSendWithInv:
		return roce.RCSendLastWithInvalidate
	case last:
		return roce.RCSendLast
	}
	return roce.RCSendMiddle
}

// rewind goes back to resend from psn (go-back-N, IBA 9.7.6.2): the send
// queue is rewound to the WQE holding psn, nothing of it is kept but the
// work request itself.
func (qp *QP) rewind(psn roce.PSN) {
	if qp.sqHead < qp.sqTl {
		// Nothing before the oldest outstanding WQE needs sending again.
		if h := &qp.sq[qp.sqHead%uint64(len(qp.sq))]; h.assigned && psn.Diff(h.firstPSN) < 0 {
			psn = h.firstPSN
		}
	}
	for i := qp.sqHead; i < qp.sqTl; i++ {
		w := &qp.sq[i%uint64(len(qp.sq))]
		if !w.assigned {
			break
		}
		if psn.Diff(w.firstPSN) >= 0 && psn.Diff(w.lastPSN) <= 0 {
			qp.sqNext = i
			qp.reqOff = 0
			// Every READ from here on is asked for again, from what has
			// not arrived (IBA 9.7.6.2.2): the responder expects psn next.
			for j := i; j < qp.sqTl; j++ {
				if r := &qp.sq[j%uint64(len(qp.sq))]; r.wr.Opcode == abi.WRRDMARead && !r.filled {
					r.reqEnd, r.asked = r.resp, false
				}
			}
			switch {
			case w.wr.Opcode == abi.WRRDMARead:
			case w.wr.Opcode.IsAtomic():
			default:
				qp.reqOff = uint32(psn.Diff(w.firstPSN)) * uint32(qp.pmtu)
			}
			qp.psn = psn
			qp.noAckPkts = 0
			qp.cc.forget() // what is sent again cannot be timed
			qp.e.stats.retransmits.Add(1)
			return
		}
	}
}

// sendUD sends a UD work request as one SEND ONLY packet and completes it.
func (qp *QP) sendUD(w *sendWQE) {
	if !qp.resolveLocal(w, false) {
		return
	}
	if w.length > uint32(qp.pmtu) {
		qp.completeSendUD(w, abi.WCLocLenErr)
		return
	}
	ah := w.wr.AH
	src, err := qp.e.sourceAddr(ah.SGIDIndex)
	if err != nil {
		qp.completeSendUD(w, abi.WCLocQPOpErr)
		return
	}
	qp.src = src
	p := qp.template(netipFrom16(ah.DstIP), ah.DstMAC, w.wr.RemoteQPN, ah.TClass, ah.FlowLabel)
	if ah.SrcPort != 0 {
		p.SrcPort = ah.SrcPort
	}
	p.BTH.Opcode = roce.UDSendOnly
	if w.wr.Opcode == abi.WRSendWithImm {
		p.BTH.Opcode = roce.UDSendOnlyWithImmediate
		p.Imm = w.wr.Imm
	}
	p.BTH.PSN = qp.psn
	p.BTH.SolicitedEvent = w.wr.Flags&abi.SendSolicited != 0
	qkey := w.wr.RemoteQKey
	if qkey&0x80000000 != 0 { // IBA 10.2.5: take the QP's Q_Key
		qkey = qp.attr.QKey
	}
	p.DETH = roce.DETHFields{QKey: qkey, SrcQP: qp.num}
	var inline []byte
	if w.wr.Flags&abi.SendInline != 0 {
		inline = w.inline
	}
	if p.Src.Is4() != p.Dst.Is4() {
		qp.completeSendUD(w, abi.WCLocQPOpErr)
		return
	}
	qp.buildAndSend(&p, &qp.scratch, inline, 0, w.length)
	qp.psn = qp.psn.Next()
	qp.completeSendUD(w, abi.WCSuccess)
}

func (qp *QP) completeSendUD(w *sendWQE, st abi.WCStatus) {
	qp.sqNext++
	qp.completeSend(w, st)
}
