package transport

import (
	"time"

	"github.com/taproce/taproce/appliance/roce"
)

// complete handles a response or acknowledgement for the requester side of
// an RC queue pair (IBA 9.7.5; rxe's completer).
func (qp *QP) complete(frame []byte, p *roce.Packet) {
	if qp.cfg.Type != RC || qp.state != StateRTS && qp.state != StateSQE {
		qp.e.stats.dropped.Add(1)
		return
	}
	psn := p.BTH.PSN
	// A response to a PSN never sent is garbage.
	if psn.Diff(qp.sentTo) >= 0 {
		qp.e.stats.dropped.Add(1)
		return
	}
	if psn.Diff(qp.acked) <= 0 && p.BTH.Opcode == roce.RCAcknowledge {
		qp.e.stats.dups.Add(1) // still applied: completing is idempotent
	}
	progress := false
	switch p.BTH.Opcode {
	case roce.RCAcknowledge:
		syn := p.AETH.Syndrome
		switch syn.Kind() {
		case roce.SyndromeACK:
			progress = qp.ackUpTo(psn)
		case roce.SyndromeRNRNAK:
			qp.e.stats.rnrReceived.Add(1)
			qp.ackUpTo(psn.Add(-1))
			if qp.state == StateErr {
				return
			}
			if qp.rnrLeft == 0 {
				qp.toError(WCRNRRetryExcErr, true)
				return
			}
			if qp.attr.RNRRetry != 7 {
				qp.rnrLeft--
			}
			qp.rewind(psn)
			qp.rnrAt = qp.e.cfg.Now().Add(RNRDelay(syn.Value()))
			qp.retryAt = qp.rnrAt.Add(timeoutDuration(qp.attr.Timeout))
			return
		case roce.SyndromeNAK:
			qp.e.stats.naksReceived.Add(1)
			progress = qp.ackUpTo(psn.Add(-1))
			if qp.state == StateErr {
				return
			}
			switch syn.Value() {
			case roce.NAKPSNSequenceError:
				if qp.retryLeft == 0 {
					qp.toError(WCRetryExcErr, true)
					return
				}
				if qp.attr.RetryCnt != 7 {
					qp.retryLeft--
				}
				qp.rewind(psn)
			case roce.NAKInvalidRequest:
				qp.toError(WCRemInvReqErr, true)
				return
			case roce.NAKRemoteAccessError:
				qp.toError(WCRemAccessErr, true)
				return
			default:
				qp.toError(WCRemOpErr, true)
				return
			}
		default:
			return
		}
	case roce.RCRDMAReadResponseFirst, roce.RCRDMAReadResponseMiddle,
		roce.RCRDMAReadResponseLast, roce.RCRDMAReadResponseOnly:
		progress = qp.readResponse(frame, p)
	case roce.RCAtomicAcknowledge:
		progress = qp.atomicAck(p)
	default:
		return
	}
	if qp.state == StateErr {
		return
	}
	if progress {
		qp.retryLeft = qp.attr.RetryCnt
		qp.retryAt = time.Time{}
		qp.armRetry()
	}
	qp.drive()
}

// ackUpTo completes, in order, the WQEs whose packets are all at or before
// psn. A READ or atomic that an acknowledgement passes without its
// response having arrived was lost: the requester asks again (IBA
// 9.7.5.1.1, implicit NAK). It reports whether anything was acknowledged.
func (qp *QP) ackUpTo(psn roce.PSN) bool {
	progress := false
	if psn.Diff(qp.acked) > 0 && psn.Diff(qp.sentTo) < 0 {
		qp.acked = psn
		progress = true
	}
	// Complete up to the highest acknowledgement seen, whichever packet
	// brought it.
	psn = qp.acked
	for qp.sqHead < qp.sqNext {
		w := &qp.sq[qp.sqHead%uint64(len(qp.sq))]
		if w.fail != 0 {
			qp.toError(w.fail, true)
			return progress
		}
		if !w.assigned || w.lastPSN.Diff(psn) > 0 {
			break
		}
		if w.wr.Opcode == OpRead || w.wr.Opcode.isAtomic() {
			// The response, not an ACK, completes these.
			qp.rewind(w.firstPSN.Add(int(w.resp / uint32(qp.pmtu))))
			break
		}
		qp.completeSend(w, WCSuccess)
		progress = true
	}
	return progress
}

// oldestReadOrAtomic returns the oldest WQE not yet completed when it is a
// READ or an atomic that has been sent.
func (qp *QP) oldestReadOrAtomic() *sendWQE {
	if qp.sqHead == qp.sqNext {
		return nil
	}
	w := &qp.sq[qp.sqHead%uint64(len(qp.sq))]
	if w.wr.Opcode == OpRead || w.wr.Opcode.isAtomic() {
		return w
	}
	return nil
}

// readResponse places a READ response packet in the requester's buffer.
func (qp *QP) readResponse(frame []byte, p *roce.Packet) bool {
	psn := p.BTH.PSN
	// Everything before this READ is implicitly acknowledged.
	for qp.sqHead < qp.sqNext {
		w := &qp.sq[qp.sqHead%uint64(len(qp.sq))]
		if w.wr.Opcode == OpRead && psn.Diff(w.firstPSN) >= 0 && psn.Diff(w.lastPSN) <= 0 {
			break
		}
		if w.wr.Opcode == OpRead || w.wr.Opcode.isAtomic() || w.lastPSN.Diff(psn) >= 0 {
			return false // a response for something else: stale
		}
		qp.completeSend(w, WCSuccess)
	}
	w := qp.oldestReadOrAtomic()
	if w == nil || w.wr.Opcode != OpRead {
		return false
	}
	pmtu := uint32(qp.pmtu)
	want := w.firstPSN.Add(int(w.resp / pmtu))
	if d := psn.Diff(want); d != 0 {
		if d > 0 {
			qp.rewind(want) // a response went missing: ask again from it
		}
		return false
	}
	n := uint32(p.PayloadLen)
	last := p.Info().Has(roce.Last) || p.Info().Has(roce.Only)
	if w.resp+n > w.length || !last && n != pmtu || last && w.resp+n != w.length {
		qp.toError(WCBadRespErr, true)
		return false
	}
	if !qp.e.mem.resolve(qp.cfg.PD, w.wr.SGL, true, &qp.scratch) {
		qp.toError(WCLocProtErr, true)
		return false
	}
	qp.scratch.copyIn(p.Payload(frame), w.resp)
	w.resp += n
	if psn.Diff(qp.acked) > 0 {
		qp.acked = psn
	}
	if last {
		qp.completeSend(w, WCSuccess)
		qp.ackUpTo(psn) // later WQEs acknowledged by coalescing
	}
	return true
}

// atomicAck stores an atomic's original value and completes it.
func (qp *QP) atomicAck(p *roce.Packet) bool {
	for qp.sqHead < qp.sqNext {
		w := &qp.sq[qp.sqHead%uint64(len(qp.sq))]
		if w.wr.Opcode.isAtomic() && w.firstPSN == p.BTH.PSN {
			break
		}
		if w.wr.Opcode == OpRead || w.wr.Opcode.isAtomic() || w.lastPSN.Diff(p.BTH.PSN) >= 0 {
			return false
		}
		qp.completeSend(w, WCSuccess)
	}
	w := qp.oldestReadOrAtomic()
	if w == nil || !w.wr.Opcode.isAtomic() || w.firstPSN != p.BTH.PSN {
		return false
	}
	if !qp.e.mem.resolve(qp.cfg.PD, w.wr.SGL, true, &qp.scratch) || qp.scratch.total != 8 {
		qp.toError(WCLocProtErr, true)
		return false
	}
	var b [8]byte
	putUint64(b[:], p.AtomicAck)
	qp.scratch.copyIn(b[:], 0)
	if p.BTH.PSN.Diff(qp.acked) > 0 {
		qp.acked = p.BTH.PSN
	}
	qp.completeSend(w, WCSuccess)
	return true
}
