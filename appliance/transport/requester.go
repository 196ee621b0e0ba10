package transport

import (
	"github.com/taproce/taproce/appliance/roce"
)

// maxInflight bounds the packets a QP has sent and not yet seen
// acknowledged; maxPktsPerAck makes the requester ask for an
// acknowledgement at least this often within a long message (rxe:
// RXE_MAX_PKT_PER_ACK).
const (
	maxInflight   = 128
	maxPktsPerAck = 64
)

// buildAndSend encodes p into the next transmit buffer, with n payload
// bytes taken from src at offset off (or from inline bytes), and queues it.
func (qp *QP) buildAndSend(p *roce.Packet, src *sgl, inline []byte, off, n uint32) {
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
	if !p.IPv6 {
		e.ipID++
		p.ID = e.ipID
	}
	m, err := p.Encode(b)
	if err != nil {
		e.unframe()
		e.stats.dropped.Add(1)
		return
	}
	e.emit(m)
	if p.Info().Has(roce.Request) {
		end := p.BTH.PSN.Next()
		if p.BTH.Opcode == roce.RCRDMAReadRequest {
			end = p.BTH.PSN.Add(roce.ReadPSNs(p.RETH.DMALen, qp.pmtu))
		}
		if end.Diff(qp.sentTo) > 0 {
			qp.sentTo = end
		}
	}
}

// inflight returns the packets sent and not acknowledged.
func (qp *QP) inflight() int { return qp.psn.Diff(qp.acked.Next()) }

// drive sends what the send queue holds, as far as the window, the
// max_rd_atomic limit and an RNR wait allow.
func (qp *QP) drive() {
	if qp.state != StateRTS && qp.state != StateSQE || !qp.rnrAt.IsZero() {
		return
	}
	for qp.sqNext < qp.sqTl {
		if qp.sq[qp.sqNext%uint64(len(qp.sq))].fail != 0 {
			break
		}
		if qp.cfg.Type == RC && qp.inflight() >= maxInflight {
			break
		}
		w := &qp.sq[qp.sqNext%uint64(len(qp.sq))]
		if qp.cfg.Type == UD {
			qp.sendUD(w)
			continue
		}
		if !qp.sendRC(w) {
			break
		}
	}
	if qp.cfg.Type == RC && qp.retryAt.IsZero() {
		qp.armRetry()
	}
}

// resolveLocal resolves the WQE's SGL for reading (sends, writes) or
// writing (reads, atomics) into qp.scratch; a failure completes the WQE
// with a local protection error and moves the QP to the error state.
func (qp *QP) resolveLocal(w *sendWQE, write bool) bool {
	if w.wr.Flags&SendInline != 0 {
		return true
	}
	if !qp.e.mem.resolve(qp.cfg.PD, w.wr.SGL, write, &qp.scratch) {
		qp.failWQE(w, WCLocProtErr)
		return false
	}
	return true
}

// failWQE ends w with a local error. Completions come in order: when
// earlier work is still waiting for acknowledgement, w fails when the
// completer reaches it, and nothing after it is sent.
func (qp *QP) failWQE(w *sendWQE, st Status) {
	if &qp.sq[qp.sqHead%uint64(len(qp.sq))] == w {
		qp.toError(st, true)
		return
	}
	w.fail = st
	qp.sqNext++
	qp.reqOff = 0
	qp.state = StateSQE // the send queue stops; the completer finishes the job
}

// sendRC sends the next packets of w; it returns false when it must stop.
func (qp *QP) sendRC(w *sendWQE) bool {
	op := w.wr.Opcode
	pmtu := uint32(qp.pmtu)
	if !w.assigned {
		if (op == OpRead || op.isAtomic()) && qp.rdAtomicOut >= max(int(qp.attr.MaxRdAtomic), 1) {
			return false
		}
		w.firstPSN = qp.psn
		n := 1
		switch {
		case op == OpRead:
			n = roce.ReadPSNs(w.length, qp.pmtu)
		case !op.isAtomic() && w.length > 0:
			n = int((w.length + pmtu - 1) / pmtu)
		}
		w.lastPSN = w.firstPSN.Add(n - 1)
		w.assigned = true
	}
	if (op == OpRead || op.isAtomic()) && !w.counted {
		if qp.rdAtomicOut >= max(int(qp.attr.MaxRdAtomic), 1) {
			return false
		}
		w.counted = true
		qp.rdAtomicOut++
	}
	if !qp.resolveLocal(w, op == OpRead || op.isAtomic()) {
		return false
	}
	if op == OpRead || op.isAtomic() {
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
	if w.wr.Flags&SendInline != 0 {
		inline = w.inline
	}
	for {
		if qp.cfg.Type == RC && qp.inflight() >= maxInflight {
			return false
		}
		off := qp.reqOff
		n := min(pmtu, w.length-off)
		first, last := off == 0, off+n >= w.length
		p.BTH.PSN = w.firstPSN.Add(int(off / pmtu))
		p.BTH.Opcode = rcOpcode(op, first, last)
		if qp.cfg.Type == UC {
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
		p.BTH.SolicitedEvent = last && w.wr.Flags&SendSolicited != 0
		qp.noAckPkts++
		p.BTH.AckReq = qp.cfg.Type == RC && (last || qp.noAckPkts >= maxPktsPerAck)
		if p.BTH.AckReq {
			qp.noAckPkts = 0
		}
		qp.buildAndSend(p, &qp.scratch, inline, off, n)
		qp.psn = p.BTH.PSN.Next()
		if last {
			qp.finishSent()
			if qp.cfg.Type == UC {
				qp.completeSend(w, WCSuccess)
			}
			return true
		}
		qp.reqOff = off + n
	}
}

// sendReadOrAtomic sends the request of a READ, for the part of its data
// not yet received, or of an atomic.
func (qp *QP) sendReadOrAtomic(w *sendWQE) {
	p := &qp.tmpl
	p.BTH.SolicitedEvent, p.BTH.AckReq = false, true
	if w.wr.Opcode == OpRead {
		off := w.resp
		p.BTH.Opcode = roce.RCRDMAReadRequest
		p.BTH.PSN = w.firstPSN.Add(int(off / uint32(qp.pmtu)))
		p.RETH = roce.RETHFields{VA: w.wr.RemoteAddr + uint64(off), RKey: w.wr.RKey, DMALen: w.length - off}
	} else {
		p.BTH.Opcode = roce.RCFetchAdd
		p.AtomicETH = roce.AtomicETHFields{VA: w.wr.RemoteAddr, RKey: w.wr.RKey, SwapAdd: w.wr.CompareAdd}
		if w.wr.Opcode == OpCmpSwap {
			p.BTH.Opcode = roce.RCCompareSwap
			p.AtomicETH.Compare, p.AtomicETH.SwapAdd = w.wr.CompareAdd, w.wr.Swap
		}
		p.BTH.PSN = w.firstPSN
	}
	qp.buildAndSend(p, nil, nil, 0, 0)
}

// finishSent moves on from the WQE whose packets are all sent to the next
// WQE.
func (qp *QP) finishSent() {
	qp.sqNext++
	qp.reqOff = 0
}

// rcOpcode picks the packet opcode of a SEND or WRITE packet.
func rcOpcode(op Opcode, first, last bool) roce.Opcode {
	switch op {
	case OpWrite, OpWriteImm:
		switch {
		case first && last && op == OpWriteImm:
			return roce.RCRDMAWriteOnlyWithImmediate
		case first && last:
			return roce.RCRDMAWriteOnly
		case first:
			return roce.RCRDMAWriteFirst
		case last && op == OpWriteImm:
			return roce.RCRDMAWriteLastWithImmediate
		case last:
			return roce.RCRDMAWriteLast
		}
		return roce.RCRDMAWriteMiddle
	}
	switch {
	case first && last && op == OpSendImm:
		return roce.RCSendOnlyWithImmediate
	case first && last && op == OpSendInv:
		return roce.RCSendOnlyWithInvalidate
	case first && last:
		return roce.RCSendOnly
	case first:
		return roce.RCSendFirst
	case last && op == OpSendImm:
		return roce.RCSendLastWithImmediate
	case last && op == OpSendInv:
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
			switch {
			case w.wr.Opcode == OpRead:
				// Ask again for what has not arrived (IBA 9.7.6.2.2).
			case w.wr.Opcode.isAtomic():
			default:
				qp.reqOff = uint32(psn.Diff(w.firstPSN)) * uint32(qp.pmtu)
			}
			qp.psn = psn
			qp.noAckPkts = 0
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
		qp.completeSendUD(w, WCLocLenErr)
		return
	}
	ah := w.wr.AH
	src, err := qp.e.sourceAddr(ah.SGIDIndex)
	if err != nil {
		qp.completeSendUD(w, WCLocQPOpErr)
		return
	}
	qp.src = src
	p := qp.template(netipFrom16(ah.DstIP), ah.DstMAC, w.wr.RemoteQPN)
	if ah.SrcPort != 0 {
		p.SrcPort = ah.SrcPort
	}
	p.BTH.Opcode = roce.UDSendOnly
	if w.wr.Opcode == OpSendImm {
		p.BTH.Opcode = roce.UDSendOnlyWithImmediate
		p.Imm = w.wr.Imm
	}
	p.BTH.PSN = qp.psn
	p.BTH.SolicitedEvent = w.wr.Flags&SendSolicited != 0
	qkey := w.wr.RemoteQKey
	if qkey&0x80000000 != 0 { // IBA 10.2.5: take the QP's Q_Key
		qkey = qp.attr.QKey
	}
	p.DETH = roce.DETHFields{QKey: qkey, SrcQP: qp.num}
	var inline []byte
	if w.wr.Flags&SendInline != 0 {
		inline = w.inline
	}
	if p.Src.Is4() != p.Dst.Is4() {
		qp.completeSendUD(w, WCLocQPOpErr)
		return
	}
	qp.buildAndSend(&p, &qp.scratch, inline, 0, w.length)
	qp.psn = qp.psn.Next()
	qp.completeSendUD(w, WCSuccess)
}

func (qp *QP) completeSendUD(w *sendWQE, st Status) {
	qp.sqNext++
	qp.completeSend(w, st)
}
