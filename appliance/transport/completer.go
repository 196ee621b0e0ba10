package transport

import (
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/verbs/abi"
)

// complete handles a response or acknowledgement for the requester side of
// an RC queue pair (IBA 9.7.5; rxe's completer). ref, when not nil, is the
// data of a whole READ response from the local switch (respondWhole).
func (qp *QP) complete(frame []byte, p *roce.Packet, ref []byte) {
	if qp.cfg.Type != abi.RC || qp.state != abi.QPSRTS && qp.state != abi.QPSSQE {
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
		qp.e.stats.dupResponses.Add(1) // still applied: completing is idempotent
	}
	progress := false
	prev := qp.acked
	switch p.BTH.Opcode {
	case roce.RCAcknowledge:
		syn := p.AETH.Syndrome
		switch syn.Kind() {
		case roce.SyndromeACK:
			progress = qp.ackUpTo(psn)
		case roce.SyndromeRNRNAK:
			qp.e.stats.rnrReceived.Add(1)
			qp.ackUpTo(psn.Add(-1))
			if qp.state == abi.QPSErr || psn.Diff(qp.acked) <= 0 {
				return // an RNR NAK for what is acknowledged: stale
			}
			if qp.rnrLeft == 0 {
				qp.toError(abi.WCRNRRetryExcErr, true)
				return
			}
			if qp.attr.RNRRetry != 7 {
				qp.rnrLeft--
			}
			qp.congested(false)
			qp.rewind(psn)
			qp.rnrAt = qp.e.cfg.Now().Add(RNRDelay(syn.Value()))
			qp.e.timerSet(qp.rnrAt)
			qp.cc.fastAt = time.Time{} // the wait is the responder's; drive arms it again
			qp.retryAt = time.Time{}
			if d := timeoutDuration(qp.attr.Timeout); d != 0 {
				qp.retryAt = qp.rnrAt.Add(d)
			}
			return
		case roce.SyndromeNAK:
			qp.e.stats.naksReceived.Add(1)
			progress = qp.ackUpTo(psn.Add(-1))
			if qp.state == abi.QPSErr || psn.Diff(qp.acked) <= 0 {
				return // a NAK for what is acknowledged: stale (rxe check_psn)
			}
			switch syn.Value() {
			case roce.NAKPSNSequenceError:
				if qp.retryLeft == 0 {
					qp.toError(abi.WCRetryExcErr, true)
					return
				}
				if qp.attr.RetryCnt != 7 {
					qp.retryLeft--
				}
				qp.congested(true)
				qp.rewind(psn)
			case roce.NAKInvalidRequest:
				qp.toError(abi.WCRemInvReqErr, true)
				return
			case roce.NAKRemoteAccessError:
				qp.toError(abi.WCRemAccessErr, true)
				return
			default:
				qp.toError(abi.WCRemOpErr, true)
				return
			}
		default:
			return
		}
	case roce.RCRDMAReadResponseFirst, roce.RCRDMAReadResponseMiddle,
		roce.RCRDMAReadResponseLast, roce.RCRDMAReadResponseOnly:
		progress = qp.readResponse(frame, p, ref)
	case roce.RCAtomicAcknowledge:
		progress = qp.atomicAck(p)
	default:
		return
	}
	if qp.state == abi.QPSErr {
		return
	}
	if qp.cc.on {
		now := qp.e.cfg.Now()
		qp.cc.acked(qp.acked, qp.acked.Diff(prev), qp.maxWindow(), now)
		qp.ackedFast(qp.acked.Diff(prev) > 0, now)
	}
	if progress {
		qp.retryLeft, qp.rnrLeft = qp.attr.RetryCnt, qp.attr.RNRRetry
		qp.retryAt = time.Time{}
		qp.armRetry()
	}
	qp.drive()
}

// ackUpTo records an acknowledgement of every PSN up to psn and completes
// what that finishes. It reports whether it was news.
func (qp *QP) ackUpTo(psn roce.PSN) bool {
	progress := false
	if psn.Diff(qp.acked) > 0 && psn.Diff(qp.sentTo) < 0 {
		qp.acked = psn
		progress = true
	}
	return qp.completeInOrder() || progress
}

// completeInOrder completes the WQEs at the head of the send queue that
// are finished: SEND and WRITE once acknowledged, READ and atomics once
// their response has arrived whole. A READ or atomic that an
// acknowledgement has passed without its response was lost on the way
// back: only it is asked for again (IBA 9.7.5.1.1, implicit NAK).
func (qp *QP) completeInOrder() bool {
	done := false
	for qp.sqHead < qp.sqTl {
		w := &qp.sq[qp.sqHead%uint64(len(qp.sq))]
		if w.fail != 0 {
			qp.toError(w.fail, true)
			return done
		}
		if qp.sqHead >= qp.sqNext || !w.assigned {
			break
		}
		if w.wr.Opcode == abi.WRRDMARead || w.wr.Opcode.IsAtomic() {
			if !w.filled {
				if qp.acked.Diff(w.lastPSN) >= 0 {
					qp.askAgain(w)
				}
				break
			}
		} else if w.lastPSN.Diff(qp.acked) > 0 {
			break
		}
		// Completed in order: every PSN up to this WQE's last is done.
		if w.lastPSN.Diff(qp.acked) > 0 {
			qp.acked = w.lastPSN
		}
		qp.completeSend(w, abi.WCSuccess)
		done = true
	}
	return done
}

// findResponder returns the outstanding READ or atomic WQE whose PSNs
// hold psn.
func (qp *QP) findResponder(psn roce.PSN, atomic bool) *sendWQE {
	end := qp.sqNext
	if end < qp.sqTl && qp.sq[end%uint64(len(qp.sq))].asked {
		end++ // a READ the send queue is held at, asked for in part
	}
	for i := qp.sqHead; i < end; i++ {
		w := &qp.sq[i%uint64(len(qp.sq))]
		if !w.assigned || w.filled || w.wr.Opcode.IsAtomic() != atomic || !atomic && w.wr.Opcode != abi.WRRDMARead {
			continue
		}
		if psn.Diff(w.firstPSN) >= 0 && psn.Diff(w.lastPSN) <= 0 {
			return w
		}
	}
	return nil
}

// askAgain sends the request of a READ again for what has not arrived, or
// an atomic again (the responder answers it from its cache), without
// rewinding the rest of the send queue. It does so once for each point
// the READ has reached, so that the responses still on their way behind a
// gap do not each start another request.
func (qp *QP) askAgain(w *sendWQE) {
	if w.askedAt == w.resp+1 {
		return
	}
	w.askedAt = w.resp + 1
	qp.e.stats.retransmits.Add(1)
	if !qp.resolveLocal(w, true) {
		return
	}
	qp.sendReadOrAtomic(w)
}

// readResponse places a READ response packet in the requester's buffer.
// Each packet's place follows from its PSN, so responses that overtook
// one another are placed as they come, within a window of 64 packets past
// the first missing one; w.resp counts the bytes received without a hole.
// The rest of a READ is asked for again only when a hole outlives its
// last response, or a response lands beyond the window. A READ further
// down the queue fills while an earlier one waits. ref is complete's: the
// data of every packet from this PSN on, in the responder's memory.
func (qp *QP) readResponse(frame []byte, p *roce.Packet, ref []byte) bool {
	psn := p.BTH.PSN
	w := qp.findResponder(psn, false)
	if w == nil {
		// Of a READ filled already, or of one a rewind went back past,
		// which is asked for again: only the first is a duplicate.
		qp.countStale(psn)
		return false
	}
	pmtu := uint32(qp.pmtu)
	want := w.firstPSN.Add(int(w.resp / pmtu))
	d := psn.Diff(want)
	if d < 0 || d >= 64 {
		if d > 0 {
			qp.askAgain(w)
		} else {
			qp.e.stats.dupResponses.Add(1) // data already placed
		}
		return false
	}
	if ref != nil && d != 0 {
		// A whole response is placed only in order (the local switch
		// keeps it): this one overtook nothing that can still come.
		qp.askAgain(w)
		return false
	}
	if d > 0 && w.ahead&(1<<(d-1)) != 0 {
		qp.e.stats.dupResponses.Add(1) // placed ahead already
		return false
	}
	off := uint32(psn.Diff(w.firstPSN)) * pmtu
	data := p.Payload(frame)
	if ref != nil {
		data = ref
	}
	n := uint32(len(data))
	last := p.Info().Has(roce.Last) || p.Info().Has(roce.Only)
	// Every packet but the one that ends the READ is full; a LAST or ONLY
	// that is not the end closes one of the pieces it was asked for in. A
	// whole response is the packets of a piece together, in order.
	if off+n > w.length || off+n < w.length && n%pmtu != 0 || off+n == w.length && !last ||
		ref == nil && off+n < w.length && n != pmtu {
		qp.toError(abi.WCBadRespErr, true)
		return false
	}
	if !qp.e.mem.resolve(qp.cfg.PD, w.wr.SGL, true, &qp.scratch) {
		qp.toError(abi.WCLocProtErr, true)
		return false
	}
	qp.scratch.copyIn(data, off)
	if d > 0 {
		w.ahead |= 1 << (d - 1)
		if last {
			qp.askAgain(w) // the last is here and a hole is not: ask for it
		}
		return true
	}
	// In order: advance over this packet and those already here behind it.
	w.resp = min(w.length, off+n)
	for w.ahead&1 != 0 {
		w.ahead >>= 1
		w.resp = min(w.length, w.resp+pmtu)
	}
	w.ahead >>= 1
	w.filled = w.resp == w.length
	// Keep two pieces asked for ahead of what has come. While the send
	// queue is held at this READ, drive does that.
	held := qp.sqNext < qp.sqTl && &qp.sq[qp.sqNext%uint64(len(qp.sq))] == w
	if !w.filled && !held && w.reqEnd < w.length && w.reqEnd <= w.resp+qp.readPiece()*uint32(qp.piecesAhead()-1) {
		qp.sendReadRange(w, w.reqEnd)
	}
	// The responder executes in order: everything before this READ is
	// done, and a response acknowledges the READ's PSNs up to its own
	// (IBA 9.7.5.1.2), which opens the window for the READ's next piece.
	upTo := w.firstPSN.Add(int(w.resp/pmtu) - 1)
	if w.filled {
		upTo = w.lastPSN
	}
	if upTo.Diff(qp.acked) > 0 {
		qp.acked = upTo
	}
	qp.completeInOrder()
	return true
}

// atomicAck stores an atomic's original value.
func (qp *QP) atomicAck(p *roce.Packet) bool {
	w := qp.findResponder(p.BTH.PSN, true)
	if w == nil || w.firstPSN != p.BTH.PSN {
		qp.countStale(p.BTH.PSN)
		return false
	}
	if !qp.e.mem.resolve(qp.cfg.PD, w.wr.SGL, true, &qp.scratch) || qp.scratch.total != 8 {
		qp.toError(abi.WCLocProtErr, true)
		return false
	}
	var b [8]byte
	putUint64(b[:], p.AtomicAck)
	qp.scratch.copyIn(b[:], 0)
	w.filled = true
	if p.BTH.PSN.Diff(qp.acked) > 0 {
		qp.acked = p.BTH.PSN
	}
	qp.completeInOrder()
	return true
}

// countStale counts a READ response or atomic acknowledgement that
// matches no outstanding request as a duplicate when its PSN is
// acknowledged already: a READ or atomic that has its answer acknowledges
// its PSNs. One for a request a rewind went back past is not counted.
func (qp *QP) countStale(psn roce.PSN) {
	if psn.Diff(qp.acked) <= 0 {
		qp.e.stats.dupResponses.Add(1)
	}
}
