package control

import (
	"sync"

	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/verbs/abi"
)

// ringWork is one thing the poller drains: a QP's send and receive rings,
// or an SRQ's ring.
type ringWork struct {
	q   *qpObj
	srq *srqObj
}

// rebuildRings refreshes the poller's list after a QP or SRQ came or went
// and wakes it; ss.mu is held.
func (ss *session) rebuildRings() {
	list := make([]ringWork, 0, len(ss.qps)+len(ss.srqs))
	for _, q := range ss.qps {
		list = append(list, ringWork{q: q})
	}
	for _, s := range ss.srqs {
		list = append(list, ringWork{srq: s})
	}
	ss.rings.Store(&list)
	if ss.kick != nil {
		_ = ss.kick.Ring()
	}
}

// postBatch is how many work requests the poller hands the transport at
// once.
const postBatch = 32

// batch holds a drain's conversions (13 KiB).
type batch struct {
	wqe   abi.SendWQE
	rwqe  abi.RecvWQE
	send  [postBatch]transport.SendWR
	recv  [postBatch]transport.RecvWR
	ssges [postBatch][abi.MaxSGE]transport.SGE
	rsges [postBatch][abi.MaxSGE]transport.SGE
}

// batches lends drains their batch: there are as many as drains under way
// at once (the loop and its helper), not one per session, which with a
// connection per session (1024 of them) held 16 MiB.
var batches = sync.Pool{New: func() any { return new(batch) }}

// scratch is a drain's batch, borrowed when a ring first holds something,
// so that polling idle sessions costs no trip to the pool.
type scratch struct{ b *batch }

func (s *scratch) get() *batch {
	if s.b == nil {
		s.b = batches.Get().(*batch)
	}
	return s.b
}

func (s *scratch) put() {
	if s.b != nil {
		batches.Put(s.b)
		s.b = nil
	}
}

// pollOnce is the session's part of a pass of the appliance's polling
// loop (Config.Loop): it posts what the rings hold and reports whether
// they held anything; when they held nothing, it sends the held
// acknowledgements whose time is up. A session busy with a request of its
// client is not waited for — the loop has other work — and only its
// acknowledgements are seen to.
func (ss *session) pollOnce() bool {
	if ss.ctx.Err() != nil {
		return false
	}
	if !ss.mu.TryLock() {
		ss.flushAcks()
		return false
	}
	var b scratch
	busy := ss.drainLocked(&b)
	b.put()
	ss.mu.Unlock()
	if !busy {
		ss.flushAcks()
	}
	return busy
}

// tryPrepareSleep tells the producers of the rings whose posts need the
// poller to ring the doorbell, then looks once more: it reports whether
// all rings are still empty. Receive posts need no poller while the QP
// works — the transport takes receive WQEs from the ring itself when a
// message finds its queue empty (Refill) — so clients ring for them only
// when the QP is in ERROR, where a posted receive completes with a flush
// status at once. Sparing those rings saves a wakeup per message. A
// session busy with a request of its client is not waited for: the loop
// has other work, and does not sleep.
func (ss *session) tryPrepareSleep() bool {
	if !ss.mu.TryLock() {
		return false
	}
	defer ss.mu.Unlock()
	return ss.prepareSleepLocked()
}

func (ss *session) prepareSleepLocked() bool {
	for _, w := range *ss.rings.Load() {
		if w.q != nil {
			w.q.sq.PrepareSleep()
			if w.q.inError() {
				w.q.rmu.Lock() // the receive ring's consumer is shared with Refill
				w.q.rq.PrepareSleep()
				w.q.rmu.Unlock()
			}
		}
	}
	for _, w := range *ss.rings.Load() {
		if w.q != nil {
			w.q.rmu.Lock()
			busy := w.q.sq.Len() > 0 || w.q.rq.Len() > 0
			w.q.rmu.Unlock()
			if busy {
				return false
			}
		} else {
			w.srq.rmu.Lock()
			busy := w.srq.rq.Len() > 0
			w.srq.rmu.Unlock()
			if busy {
				return false
			}
		}
	}
	return true
}

func (ss *session) cancelSleep() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, w := range *ss.rings.Load() {
		if w.q != nil {
			w.q.sq.CancelSleep()
			w.q.rmu.Lock()
			w.q.rq.CancelSleep()
			w.q.rmu.Unlock()
		} else {
			w.srq.rmu.Lock()
			w.srq.rq.CancelSleep()
			w.srq.rmu.Unlock()
		}
	}
}

// flushAcks sends the acknowledgements that the engines of the session's
// queue pairs held back for company (transport.Config.AckDelay) once
// their time is up: a spinning poller is where that time is watched.
func (ss *session) flushAcks() {
	for _, w := range *ss.rings.Load() {
		if w.q != nil {
			w.q.qp.FlushAcks()
		}
	}
}

// drainLocked posts what the rings hold; it reports whether it found
// any. ss.mu is held.
func (ss *session) drainLocked(b *scratch) bool {
	any := false
	for _, w := range *ss.rings.Load() {
		if w.q != nil {
			any = ss.drainSend(w.q, b) || any
			any = ss.drainRecv(w.q, b) || any
		} else {
			any = ss.drainSRQ(w.srq, b) || any
		}
	}
	return any
}

func (ss *session) drainSend(q *qpObj, s *scratch) bool {
	n := min(q.sq.Len(), postBatch)
	if n == 0 {
		if q.sq.Err() != nil {
			ss.corrupt(q)
		}
		return false
	}
	b := s.get()
	k := 0
	for i := range n {
		b.wqe.Get(q.sq.PeekAt(i))
		w := &b.wqe
		wr := &b.send[k]
		*wr = transport.SendWR{ID: w.WRID, Opcode: abi.WROpcode(w.Opcode), Flags: abi.SendFlags(w.Flags),
			Imm: w.Imm, RemoteAddr: w.RemoteAddr, RKey: w.RKey, CompareAdd: w.CompareAdd, Swap: w.Swap,
			RemoteQPN: w.RemoteQPN, RemoteQKey: w.RemoteQKey}
		sg := b.ssges[k][:w.NumSGE]
		for j := range sg {
			s := w.SGL[j]
			sg[j] = transport.SGE{Addr: s.Addr, Length: s.Length, LKey: s.LKey}
		}
		wr.SGL = sg
		if wr.Flags&abi.SendInline != 0 {
			wr.Inline = w.Inline
		}
		if q.typ == abi.UD {
			ah := ss.ahs[abi.Handle(w.AH)]
			if ah == nil {
				ss.postSend(q, b.send[:k])
				k = 0
				ss.reject(q, wr)
				continue
			}
			wr.AH = &ah.ah
		}
		k++
	}
	ss.postSend(q, b.send[:k])
	q.sq.ReleaseN(n)
	return true
}

// postSend hands wrs to the transport; a request it refuses completes
// with a local QP operation error, as a driver would report it.
func (ss *session) postSend(q *qpObj, wrs []transport.SendWR) {
	for len(wrs) > 0 {
		n, err := q.qp.PostSend(wrs)
		if err == nil {
			return
		}
		ss.reject(q, &wrs[n])
		wrs = wrs[n+1:]
	}
}

func (ss *session) reject(q *qpObj, wr *transport.SendWR) {
	q.rejected.Add(1)
	abi.Word64(q.state, abi.QPSendRetired).Add(1)
	q.scq.push(&transport.WC{ID: wr.ID, Status: abi.WCLocQPOpErr, QPNum: q.qp.Num()})
}

func (ss *session) drainRecv(q *qpObj, s *scratch) bool {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	n := min(q.rq.Len(), postBatch)
	if n == 0 {
		return false
	}
	b := s.get()
	for i := range n {
		b.rwqe.Get(q.rq.PeekAt(i))
		b.recv[i] = recvWR(&b.rwqe, b.rsges[i][:])
	}
	// The slots go back before the WQEs go to the transport: once there,
	// a receive may retire one at once, and a client that sees it retired
	// must find its ring slot free to post again (posted − retired < depth
	// must imply room in the ring).
	q.rq.ReleaseN(n)
	wrs := b.recv[:n]
	for len(wrs) > 0 {
		k, err := q.qp.PostRecv(wrs)
		if err == nil {
			break
		}
		q.rcq.push(&transport.WC{ID: wrs[k].ID, Status: abi.WCLocQPOpErr, Opcode: abi.WCRecv, QPNum: q.qp.Num()})
		wrs = wrs[k+1:]
	}
	return true
}

func (ss *session) drainSRQ(s *srqObj, sc *scratch) bool {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	n := min(s.rq.Len(), postBatch)
	if n == 0 {
		return false
	}
	b := sc.get()
	for i := range n {
		b.rwqe.Get(s.rq.PeekAt(i))
		b.recv[i] = recvWR(&b.rwqe, b.rsges[i][:])
	}
	s.rq.ReleaseN(n)                  // before the SRQ may retire them, as drainRecv
	_, _ = s.srq.PostRecv(b.recv[:n]) // the client keeps within the depth; excess is lost as on a full SRQ
	return true
}

func recvWR(w *abi.RecvWQE, sges []transport.SGE) transport.RecvWR {
	sg := sges[:w.NumSGE]
	for j := range sg {
		s := w.SGL[j]
		sg[j] = transport.SGE{Addr: s.Addr, Length: s.Length, LKey: s.LKey}
	}
	return transport.RecvWR{ID: w.WRID, SGL: sg}
}

// corrupt handles a client that wrote nonsense into a ring's indices: its
// QP goes to the error state and the client hears IBV_EVENT_QP_FATAL.
func (ss *session) corrupt(q *qpObj) {
	if q.qp.State() == abi.QPSErr {
		return
	}
	_ = q.qp.Modify(&transport.QPAttr{State: abi.QPSErr}, abi.QPStateMask)
	for h, x := range ss.qps {
		if x == q {
			ss.event(abi.EventQPFatal, h)
		}
	}
}
