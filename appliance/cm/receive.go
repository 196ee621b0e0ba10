package cm

import (
	"encoding/binary"
	"net/netip"
	"time"
)

// Receive takes a MAD that arrived on QP1 from src to dst (the peer's
// address and the local one the packet was sent to). A MAD that does not
// parse, or that matches nothing, is dropped and counted (Stats.Drops);
// the manager never fails on what the wire brings.
func (m *Manager) Receive(src, dst netip.Addr, mad []byte) {
	m.mu.Lock()
	defer m.unlock()
	msg := &m.rx
	if err := Parse(mad, msg); err != nil {
		m.drop(DropMalformed)
		return
	}
	if i, ok := AttrIndex(msg.Header.AttrID); ok {
		m.stats.Received[i]++
	}
	src, dst = src.Unmap(), dst.Unmap()
	switch msg.Header.AttrID {
	case AttrREQ:
		m.onREQ(src, dst, msg)
	case AttrMRA:
		m.onMRA(msg)
	case AttrREJ:
		m.onREJ(msg)
	case AttrREP:
		m.onREP(src, dst, msg)
	case AttrRTU:
		m.onRTU(msg)
	case AttrDREQ:
		m.onDREQ(src, dst, msg)
	case AttrDREP:
		m.onDREP(msg)
	case AttrSIDRReq:
		m.onSIDRReq(src, dst, msg)
	case AttrSIDRRep:
		m.onSIDRRep(msg)
	default: // LAP, APR: "not supported for RoCE link layer"; ClassPortInfo: no agent for Get
		m.drop(DropUnsupported)
	}
}

// issueREJ rejects a received message no ID answers for (Linux's
// cm_issue_rej): its transaction ID, its local communication ID as the
// remote one, its remote one (0 in a REQ) as the local one.
func (m *Manager) issueREJ(src, dst netip.Addr, rcv *Message, kind MessageKind, reason RejectReason) {
	var local, remote uint32
	switch rcv.Header.AttrID {
	case AttrREQ:
		remote = rcv.REQ.LocalCommID
	case AttrREP:
		local, remote = rcv.REP.RemoteCommID, rcv.REP.LocalCommID
	}
	msg := Message{Header: NewHeader(AttrREJ, rcv.Header.TID)}
	msg.REJ = REJFields{LocalCommID: local, RemoteCommID: remote, MessageRejected: kind, Reason: reason}
	m.queue(Route{Src: dst, Dst: src}, &msg)
}

// onREQ is cm_req_handler and the RDMA CM's cma_ib_req_handler: a
// duplicate of a request already handed up is answered with an MRA (or
// ignored once answered); a REQ from a QP that already has a connection
// here is stale (REJ 10, and the old connection is disconnected); one
// for a service nobody listens on gets REJ 8 at once; one no listener of
// the service takes — no CMA header, another address, another QP type —
// gets REJ 28; one beyond the listener's backlog, or the manager's
// limit, is dropped for the peer to send again; the rest become new IDs
// in StateMRAReqSent, handed to the listener's owner.
func (m *Manager) onREQ(src, dst netip.Addr, msg *Message) {
	r := &msg.REQ
	if c := m.byRemote[remoteKey{r.LocalCommID, r.LocalCAGUID}]; c != nil {
		m.dup(AttrREQ)
		if c.state == StateMRAReqSent {
			m.sendMRA(c, MessageREQ)
		}
		return
	}
	if old := m.byRemoteQPN[remoteKey{r.LocalQPN, r.LocalCAGUID}]; old != nil {
		m.issueREJ(src, dst, msg, MessageREQ, RejStaleConn)
		if old.state == StateEstablished {
			m.sendDREQ(old, nil)
		}
		return
	}
	ls := m.byService[r.ServiceID]
	if len(ls) == 0 {
		if !m.hold(src, dst, msg) {
			m.issueREJ(src, dst, msg, MessageREQ, RejInvalidServiceID)
		}
		return
	}
	if len(m.conns) >= m.cfg.MaxConns {
		m.drop(DropLimit)
		return
	}
	qp := QPTypeRC
	switch r.TransportServiceType {
	case TransportRC:
	case TransportUC:
		qp = QPTypeUC
	default:
		qp = QPTypeUD // no listener of a connected QP type takes it
	}
	h, l := m.pick(ls, r.ServiceID, r.PrivateData[:], qp)
	if l == nil {
		// Linux's RDMA CM fails the request and its CM, destroying the
		// ID in REQ_RCVD, rejects it as the consumer's: reason 28,
		// local communication ID 0.
		m.issueREJ(src, dst, msg, MessageREQ, RejConsumerDefined)
		return
	}
	if l.pending >= l.backlog {
		m.drop(DropBacklog)
		return
	}
	c := m.newConn(l.owner, StateMRAReqSent)
	c.passive, c.qpType, c.sid, c.ps = true, qp, r.ServiceID, l.ps
	c.remoteID, c.remoteGUID, c.tid = r.LocalCommID, r.LocalCAGUID, msg.Header.TID
	c.local, c.remote = netip.AddrPortFrom(h.Dst.Unmap(), r.ServiceID.Port()), netip.AddrPortFrom(h.Src.Addr().Unmap(), h.Src.Port())
	c.route = Route{Src: dst, Dst: src, FlowLabel: r.Primary.FlowLabel, TrafficClass: r.Primary.TrafficClass, HopLimit: r.Primary.HopLimit}
	c.remoteQPN, c.sqPSN = r.LocalQPN, r.StartingPSN
	// Turned round to the local side, as cm_req_handler stores them.
	c.respRes, c.initDepth = r.InitiatorDepth, r.ResponderResources
	c.retryCount, c.rnrRetry, c.pathMTU = r.RetryCount, r.RNRRetryCount, r.PathMTU
	// The path's packet lifetime is the REQ's local ACK timeout less one
	// (cm_format_paths_from_req); av.timeout is one more.
	c.avTimeout = max(r.Primary.LocalACKTimeout, 1)
	c.msgTimeout, c.maxRetries = cmTime(r.LocalCMResponseTimeout), r.MaxCMRetries
	c.listener = l
	l.pending++
	m.enterRemote(c)
	m.event(Event{Type: EventConnectRequest, ID: c.id, Owner: c.owner, Listener: l.id, Local: c.local, Remote: c.remote,
		Param: ConnParam{QPType: qp, QPN: r.LocalQPN, StartingPSN: r.StartingPSN,
			ResponderResources: r.InitiatorDepth, InitiatorDepth: r.ResponderResources, FlowControl: r.EndToEndFlowControl,
			RetryCount: r.RetryCount, RNRRetryCount: r.RNRRetryCount, SRQ: r.SRQ},
		PrivateData: append([]byte(nil), r.PrivateData[CMAHeaderLen:]...)})
}

// pick finds the listener among ls (those of service sid) that a request
// with private data p for a QP of type qp reaches (the RDMA CM's
// cma_ib_id_from_event): the CMA header's destination address picks it,
// then its QP type must be the request's.
func (m *Manager) pick(ls []*listener, sid ServiceID, p []byte, qp QPType) (CMAHeader, *listener) {
	if _, ok := sid.PortSpace(); !ok {
		return CMAHeader{}, nil
	}
	h, err := ParseCMAHeader(p)
	if err != nil {
		return h, nil
	}
	dst := h.Dst.Unmap()
	for _, l := range ls {
		if l.matches(dst) {
			if l.qpType != qp {
				return h, nil
			}
			return h, l
		}
	}
	return h, nil
}

// onMRA is cm_mra_handler: the peer needs more time for our REQ or REP;
// the wait for the answer becomes the MRA's service timeout plus the
// path's ACK timeout, from now and for the retries left.
func (m *Manager) onMRA(msg *Message) {
	a := &msg.MRA
	c := m.byLocal[a.RemoteCommID]
	switch a.MessageMRAed {
	case MessageREQ:
		if c != nil && c.remoteID != 0 {
			c = nil
		}
	case MessageREP, MessageOther:
		if c != nil && c.remoteID != a.LocalCommID {
			c = nil
		}
	default:
		c = nil
	}
	if c == nil {
		m.drop(DropUnknownID)
		return
	}
	switch {
	case c.state == StateReqSent && a.MessageMRAed == MessageREQ:
		c.state = StateMRAReqRcvd
	case c.state == StateRepSent && a.MessageMRAed == MessageREP:
		c.state = StateMRARepRcvd
	case c.state == StateMRAReqRcvd || c.state == StateMRARepRcvd:
		m.dup(AttrMRA)
		return
	default:
		m.drop(DropState)
		return
	}
	c.msgTimeout = cmTime(a.ServiceTimeout) + cmTime(c.avTimeout)
	m.setDeadline(c, m.cfg.Now().Add(c.msgTimeout))
}

// onREJ is cm_rej_handler: the peer refused, or withdrew, what the ID
// waits on. A REJ names the ID by the communication IDs as Linux's
// cm_acquire_rejected_id finds it: a timeout by the peer's ID and the CA
// GUID in its ARI, a rejected REQ by ours alone.
func (m *Manager) onREJ(msg *Message) {
	j := &msg.REJ
	var c *conn
	switch {
	case j.Reason == RejTimeout:
		c = m.byRemote[remoteKey{j.LocalCommID, binary.BigEndian.Uint64(j.ARI[:8])}]
	case j.MessageRejected == MessageREQ:
		if c = m.byLocal[j.RemoteCommID]; c != nil && c.remoteID != 0 {
			c = nil
		}
	default:
		if c = m.byLocal[j.RemoteCommID]; c != nil && c.remoteID != j.LocalCommID {
			c = nil
		}
	}
	if c == nil {
		m.drop(DropUnknownID)
		return
	}
	if j.Reason == RejInvalidServiceID && c.state == StateReqSent && m.askAgain(c) {
		return
	}
	switch c.state {
	case StateReqSent, StateMRAReqRcvd, StateRepSent, StateMRARepRcvd, StateMRAReqSent:
		if j.Reason == RejStaleConn {
			m.enterTimeWait(c)
		} else {
			m.toIdle(c)
		}
	case StateDreqSent, StateMRARepSent, StateEstablished:
		m.enterTimeWait(c)
	default:
		m.drop(DropState)
		return
	}
	if c.disconnected {
		return // the RDMA CM hands nothing up after DISCONNECTED
	}
	m.event(Event{Type: EventRejected, ID: c.id, Owner: c.owner, Local: c.local, Remote: c.remote,
		Reason: j.Reason, ARI: append([]byte(nil), j.AdditionalInfo()...),
		PrivateData: append([]byte(nil), j.PrivateData[:]...)})
}

// onREP is cm_rep_handler: the answer to our REQ. A second copy of a REP
// already taken is answered by what answered the first — the RTU once
// sent, an MRA while the owner has not handled the reply — as
// cm_dup_rep_handler does; a REP from a QP that already has a
// connection here is stale (REJ 10). The ID moves to StateMRARepSent and
// its owner gets ConnectResponse.
func (m *Manager) onREP(src, dst netip.Addr, msg *Message) {
	r := &msg.REP
	c := m.byLocal[r.RemoteCommID]
	if c == nil {
		m.drop(DropUnknownID)
		return
	}
	if c.remoteID != 0 {
		if c.remoteID != r.LocalCommID {
			m.drop(DropUnknownID)
			return
		}
		m.dup(AttrREP)
		switch c.state {
		case StateEstablished:
			m.sendRTU(c)
		case StateMRARepSent:
			m.sendMRA(c, MessageREP)
		}
		return
	}
	if c.state != StateReqSent && c.state != StateMRAReqRcvd {
		m.drop(DropState)
		return
	}
	if m.byRemote[remoteKey{r.LocalCommID, r.LocalCAGUID}] != nil {
		m.drop(DropState) // another ID has that peer already
		return
	}
	if old := m.byRemoteQPN[remoteKey{r.LocalQPN, r.LocalCAGUID}]; old != nil {
		m.issueREJ(src, dst, msg, MessageREP, RejStaleConn)
		if old.state == StateEstablished {
			m.sendDREQ(old, nil)
		}
		return
	}
	c.remoteID, c.remoteGUID, c.remoteQPN = r.LocalCommID, r.LocalCAGUID, r.LocalQPN
	c.initDepth, c.respRes = r.ResponderResources, r.InitiatorDepth
	c.sqPSN, c.rnrRetry = r.StartingPSN, r.RNRRetryCount
	c.avTimeout = ackTimeout(r.TargetACKDelay, c.avTimeout-1)
	m.enterRemote(c)
	m.leaveTimer(c)
	c.state = StateMRARepSent
	m.event(Event{Type: EventConnectResponse, ID: c.id, Owner: c.owner, Local: c.local, Remote: c.remote,
		Param: ConnParam{QPType: c.qpType, QPN: r.LocalQPN, StartingPSN: r.StartingPSN,
			ResponderResources: r.InitiatorDepth, InitiatorDepth: r.ResponderResources,
			FlowControl: r.EndToEndFlowControl, RNRRetryCount: r.RNRRetryCount, SRQ: r.SRQ},
		PrivateData: append([]byte(nil), r.PrivateData[:]...)})
}

// peerConn finds the ID a message from the peer names by both
// communication IDs (cm_acquire_id with the remote ID).
func (m *Manager) peerConn(local, remote uint32) *conn {
	if c := m.byLocal[local]; c != nil && c.remoteID == remote {
		return c
	}
	return nil
}

// onRTU is cm_rtu_handler: the passive side is established.
func (m *Manager) onRTU(msg *Message) {
	c := m.peerConn(msg.RTU.RemoteCommID, msg.RTU.LocalCommID)
	if c == nil {
		m.drop(DropUnknownID)
		return
	}
	if c.state != StateRepSent && c.state != StateMRARepRcvd {
		m.dup(AttrRTU)
		return
	}
	m.established(c)
}

// onDREQ is cm_dreq_handler: the peer disconnects. A DREQ for no ID here
// is answered with a DREP all the same (cm_issue_drep), one in TimeWait
// with its DREP again; the ID moves to StateDreqRcvd — a DREQ of its own
// crossing this one is no longer sent — and its owner gets Disconnected;
// the DREP goes when the owner calls Disconnect or Destroy. A DREQ for an
// ID out of TimeWait is answered as for one destroyed.
func (m *Manager) onDREQ(src, dst netip.Addr, msg *Message) {
	d := &msg.DREQ
	c := m.peerConn(d.RemoteCommID, d.LocalCommID)
	if c == nil {
		m.dup(AttrDREQ)
		drep := Message{Header: NewHeader(AttrDREP, msg.Header.TID)}
		drep.DREP = DREPFields{LocalCommID: d.RemoteCommID, RemoteCommID: d.LocalCommID}
		m.queue(Route{Src: dst, Dst: src}, &drep)
		return
	}
	if c.localQPN != d.RemoteQPN {
		m.drop(DropQPN)
		return
	}
	switch c.state {
	case StateRepSent, StateMRARepRcvd, StateDreqSent, StateEstablished:
		m.leaveTimer(c)
	case StateTimeWait, StateIdle:
		// Again the DREP; after TimeWait too, as for an ID destroyed
		// (Linux drops a DREQ for an ID left in IDLE, which its
		// programs destroy on leaving TimeWait anyway).
		m.dup(AttrDREQ)
		drep := Message{Header: NewHeader(AttrDREP, msg.Header.TID)}
		drep.DREP = DREPFields{LocalCommID: c.localID, RemoteCommID: c.remoteID}
		m.queue(c.route, &drep)
		return
	case StateDreqRcvd:
		m.dup(AttrDREQ)
		return
	default:
		m.drop(DropState)
		return
	}
	if m.byQPN[c.localQPN] == c {
		delete(m.byQPN, c.localQPN)
	}
	c.state, c.tid = StateDreqRcvd, msg.Header.TID
	m.disconnected(c, false, append([]byte(nil), d.PrivateData[:]...))
}

// onDREP is cm_drep_handler: our DREQ is answered (or, in StateDreqRcvd,
// the peer's crossed it); the ID enters TimeWait.
func (m *Manager) onDREP(msg *Message) {
	c := m.peerConn(msg.DREP.RemoteCommID, msg.DREP.LocalCommID)
	if c == nil {
		m.drop(DropUnknownID)
		return
	}
	if c.state != StateDreqSent && c.state != StateDreqRcvd {
		m.drop(DropState)
		return
	}
	m.enterTimeWait(c)
	m.disconnected(c, false, append([]byte(nil), msg.DREP.PrivateData[:]...))
}

// onSIDRReq is cm_sidr_req_handler and the RDMA CM's UD requests: a
// repeat of a SIDR_REQ handed up is ignored; one for a service nobody
// listens on is answered with status UNSUPPORTED, one no listener takes
// (or beyond its backlog) with REJECT; the rest become new IDs in
// StateSIDRReqRcvd, handed to the listener's owner.
func (m *Manager) onSIDRReq(src, dst netip.Addr, msg *Message) {
	r := &msg.SIDRReq
	key := sidrKey{src, r.RequestID}
	if m.sidrIn[key] != nil {
		m.dup(AttrSIDRReq)
		return
	}
	answer := func(status SIDRStatus) {
		rep := Message{Header: NewHeader(AttrSIDRRep, msg.Header.TID)}
		rep.SIDRRep = SIDRRepFields{RequestID: r.RequestID, Status: status, ServiceID: r.ServiceID}
		m.queue(Route{Src: dst, Dst: src}, &rep)
	}
	ls := m.byService[r.ServiceID]
	if len(ls) == 0 {
		if !m.hold(src, dst, msg) {
			answer(SIDRUnsupported)
		}
		return
	}
	if len(m.conns) >= m.cfg.MaxConns {
		m.drop(DropLimit)
		return
	}
	h, l := m.pick(ls, r.ServiceID, r.PrivateData[:], QPTypeUD)
	if l == nil || l.pending >= l.backlog {
		answer(SIDRReject)
		return
	}
	c := m.newConn(l.owner, StateSIDRReqRcvd)
	c.passive, c.qpType, c.sid, c.ps = true, QPTypeUD, r.ServiceID, l.ps
	c.remoteID, c.tid = r.RequestID, msg.Header.TID
	c.local, c.remote = netip.AddrPortFrom(h.Dst.Unmap(), r.ServiceID.Port()), netip.AddrPortFrom(h.Src.Addr().Unmap(), h.Src.Port())
	c.route = Route{Src: dst, Dst: src}
	c.listener = l
	l.pending++
	m.sidrIn[key], c.inSIDR = c, true
	m.event(Event{Type: EventConnectRequest, ID: c.id, Owner: c.owner, Listener: l.id, Local: c.local, Remote: c.remote,
		Param:       ConnParam{QPType: QPTypeUD},
		PrivateData: append([]byte(nil), r.PrivateData[CMAHeaderLen:]...)})
}

// onSIDRRep is cm_sidr_rep_handler and the RDMA CM's
// cma_sidr_rep_handler: the answer to our SIDR_REQ. Success gives the
// owner Established with the service's QPN and Q_Key, any other status
// Unreachable.
func (m *Manager) onSIDRRep(msg *Message) {
	r := &msg.SIDRRep
	c := m.byLocal[r.RequestID]
	if c == nil || c.remoteID != 0 {
		m.drop(DropUnknownID)
		return
	}
	if c.state != StateSIDRReqSent {
		m.drop(DropState)
		return
	}
	if r.Status == SIDRUnsupported && m.askAgain(c) {
		return
	}
	m.toIdle(c)
	e := Event{Type: EventEstablished, ID: c.id, Owner: c.owner, Local: c.local, Remote: c.remote,
		PrivateData: append([]byte(nil), r.PrivateData[:]...)}
	if r.Status != SIDRSuccess {
		e.Type, e.SIDRStatus = EventUnreachable, r.Status
	} else {
		c.remoteQPN, c.remoteQKey = r.QPN, r.QKey
		e.Param = ConnParam{QPType: QPTypeUD, QPN: r.QPN, QKey: r.QKey}
	}
	m.event(e)
}

// hold keeps a request for a service nobody listens on until a listener
// comes (Listen hears it then) or Config.ListenGrace is over (Tick
// rejects it), and reports whether it did: not when there is no grace or
// too many wait. A request that already waits (the peer's REQ again) is
// a duplicate. m.mu is held.
func (m *Manager) hold(src, dst netip.Addr, msg *Message) bool {
	if m.cfg.ListenGrace < 0 {
		return false
	}
	for i := range m.unheard {
		if u := &m.unheard[i]; u.src == src && sameRequest(&u.msg, msg) {
			m.dup(msg.Header.AttrID)
			return true
		}
	}
	if len(m.unheard) >= maxUnheard {
		return false
	}
	deadline := m.cfg.Now().Add(m.cfg.ListenGrace)
	m.unheard = append(m.unheard, unheard{src: src, dst: dst, msg: *msg, deadline: deadline})
	select {
	case m.wake <- struct{}{}:
	default:
	}
	return true
}

// sameRequest reports whether a and b are the same request: the same
// peer's REQ (its communication ID and CA GUID) or SIDR_REQ (its
// request ID).
func sameRequest(a, b *Message) bool {
	if a.Header.AttrID != b.Header.AttrID {
		return false
	}
	if a.Header.AttrID == AttrSIDRReq {
		return a.SIDRReq.RequestID == b.SIDRReq.RequestID
	}
	return a.REQ.LocalCommID == b.REQ.LocalCommID && a.REQ.LocalCAGUID == b.REQ.LocalCAGUID
}

// hear hands the requests that wait for service sid, which now has a
// listener, to the manager as if they came now. m.mu is held.
func (m *Manager) hear(sid ServiceID) {
	var now []unheard
	kept := m.unheard[:0]
	for _, u := range m.unheard {
		if requestService(&u.msg) == sid {
			now = append(now, u)
		} else {
			kept = append(kept, u)
		}
	}
	clear(m.unheard[len(kept):])
	m.unheard = kept
	for i := range now {
		u := &now[i]
		if u.msg.Header.AttrID == AttrSIDRReq {
			m.onSIDRReq(u.src, u.dst, &u.msg)
		} else {
			m.onREQ(u.src, u.dst, &u.msg)
		}
	}
}

// requestService is the service ID a REQ or SIDR_REQ asks for.
func requestService(msg *Message) ServiceID {
	if msg.Header.AttrID == AttrSIDRReq {
		return msg.SIDRReq.ServiceID
	}
	return msg.REQ.ServiceID
}

// rejectUnheard rejects the requests whose grace is over as nobody
// listened: REJ 8, SIDR_REP "service ID not supported". m.mu is held.
func (m *Manager) rejectUnheard(now time.Time) {
	n := 0
	for n < len(m.unheard) && !now.Before(m.unheard[n].deadline) {
		u := &m.unheard[n]
		if u.msg.Header.AttrID == AttrSIDRReq {
			rep := Message{Header: NewHeader(AttrSIDRRep, u.msg.Header.TID)}
			rep.SIDRRep = SIDRRepFields{RequestID: u.msg.SIDRReq.RequestID, Status: SIDRUnsupported, ServiceID: u.msg.SIDRReq.ServiceID}
			m.queue(Route{Src: u.dst, Dst: u.src}, &rep)
		} else {
			m.issueREJ(u.src, u.dst, &u.msg, MessageREQ, RejInvalidServiceID)
		}
		n++
	}
	if n > 0 {
		rest := copy(m.unheard, m.unheard[n:])
		clear(m.unheard[rest:])
		m.unheard = m.unheard[:rest]
	}
}

// askAgainGap is how long the active side waits before it asks again a
// service nobody listened on (askAgain).
const askAgainGap = 10 * time.Millisecond

// askAgain is the active side's grace for a listener (Config.ListenGrace):
// a REQ rejected, or a SIDR_REQ answered, as nobody listens (Linux's CM
// answers so at once) is sent again askAgainGap later, as a retry, while
// the grace since the first is not over, and it reports whether it will
// be. A server whose kernel listens a moment after its client was told to
// connect — perftest's -R, with taproce's CM quicker on the client's side
// than the server's kernel is to listen (a VM's, emulated) — is then
// reached. m.mu is held.
func (m *Manager) askAgain(c *conn) bool {
	now := m.cfg.Now()
	if m.cfg.ListenGrace < 0 || !c.msgLive || c.retries == 0 || now.Add(askAgainGap).Sub(c.asked) > m.cfg.ListenGrace {
		return false
	}
	m.setDeadline(c, now.Add(askAgainGap))
	return true
}
