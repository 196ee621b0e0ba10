package cm

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/taproce/taproce/appliance/roce"
)

// conn is a connection ID: active (Connect, Resolve) or passive (made
// from a REQ or SIDR_REQ), Linux's cm_id_private and the RDMA CM's
// rdma_id_private in one.
type conn struct {
	// asked is when the active side sent its REQ or SIDR_REQ first
	// (askAgain).
	asked time.Time
	id    ID
	owner Owner
	state State
	// passive: made from a REQ or SIDR_REQ.
	passive bool
	qpType  QPType
	sid     ServiceID
	ps      PortSpace

	localID, remoteID uint32 // communication IDs (SIDR: request IDs)
	remoteGUID        uint64
	// tid is the transaction ID the next answer carries: the REQ's (or
	// SIDR_REQ's), then a received DREQ's (Linux's cm_id_priv->tid).
	tid uint64

	route         Route // where the connection's MADs go
	local, remote netip.AddrPort

	localQPN, remoteQPN uint32
	remoteQKey          uint32
	rqPSN, sqPSN        roce.PSN
	respRes, initDepth  uint8
	retryCount          uint8
	rnrRetry            uint8
	pathMTU             uint8
	// avTimeout is the path's local ACK timeout code (Linux's
	// av.timeout): the QP's RTS timeout and, in Linux's conversion, the
	// length of TimeWait and part of an MRA's wait.
	avTimeout uint8

	// The message waiting for an answer (REQ, REP, DREQ, SIDR_REQ):
	// sent again at deadline while retries remain, every msgTimeout.
	msg        [MADLen]byte
	msgLive    bool
	msgTimeout time.Duration
	retries    int
	maxRetries uint8
	// deadline is when the waiting message is due again, or, in
	// TimeWait, when TimeWait ends; zero when no timer runs.
	deadline time.Time

	// rtuPrivate is the RTU's private data, sent again with the RTU
	// that answers a duplicate REP (Linux keeps the RTU's, MRA's and
	// DREP's private data for the same reason).
	rtuPrivate []byte

	// listener is the listener the ID waits on while it is handed up
	// and not answered (it counts against the backlog), else nil.
	listener *listener
	// disconnected: the owner had its Disconnected event (the RDMA CM
	// delivers one per connection, then none but TimeWaitExit).
	disconnected bool
	// inRemote: the ID is in byRemote and byRemoteQPN; inSIDR: in
	// sidrIn.
	inRemote, inSIDR bool
}

// checkPrivate checks that private data p fits the max bytes a message
// of attribute a leaves its sender.
func checkPrivate(a AttrID, p []byte, max int) error {
	if len(p) > max {
		return fmt.Errorf("%w: %d bytes for a %v, at most %d", ErrPrivateData, len(p), a, max)
	}
	return nil
}

// Listen makes a listener: REQs (TCP, IB port spaces) or SIDR_REQs (UDP,
// IB) for the port reach its owner as ConnectRequest events with new
// IDs. Linux's CM listens by service ID alone; its RDMA CM then picks the
// listener by the destination address in the request's CMA header.
func (m *Manager) Listen(owner Owner, p ListenParams) (ID, error) {
	l := &listener{owner: owner, ps: p.PortSpace, qpType: p.QPType, backlog: p.Backlog}
	switch p.PortSpace {
	case PortSpaceTCP:
		if l.qpType == QPTypeUD {
			return 0, fmt.Errorf("%w: UD in the TCP port space", ErrInvalid)
		}
	case PortSpaceUDP:
		if l.qpType != QPTypeUD && l.qpType != QPTypeRC {
			return 0, fmt.Errorf("%w: %v in the UDP port space", ErrInvalid, l.qpType)
		}
		l.qpType = QPTypeUD
	case PortSpaceIB:
	default:
		return 0, fmt.Errorf("%w: port space %v", ErrInvalid, p.PortSpace)
	}
	if l.qpType > QPTypeUD {
		return 0, fmt.Errorf("%w: QP type %v", ErrInvalid, l.qpType)
	}
	if p.Port == 0 {
		return 0, fmt.Errorf("%w: port 0", ErrInvalid)
	}
	if l.backlog <= 0 {
		l.backlog = DefaultBacklog
	}
	switch a := p.Addr.Unmap(); {
	case a == netip.IPv4Unspecified():
		l.any4 = true
	case a.IsValid() && !a.IsUnspecified():
		l.addr = a
	}
	l.sid = RDMAServiceID(p.PortSpace, p.Port)
	m.mu.Lock()
	defer m.unlock()
	if len(m.listeners) >= m.cfg.MaxListeners {
		return 0, fmt.Errorf("%w: %d listeners", ErrLimit, len(m.listeners))
	}
	for _, o := range m.byService[l.sid] {
		if !o.addr.IsValid() || !l.addr.IsValid() || o.addr == l.addr {
			return 0, fmt.Errorf("%w: %v on %v", ErrAddrInUse, l.sid, p.Addr)
		}
	}
	l.id = m.newHandle()
	m.listeners[l.id] = l
	m.byService[l.sid] = append(m.byService[l.sid], l)
	m.hear(l.sid)
	return l.id, nil
}

// matches reports whether a request whose CMA header names dst is for l
// (Linux's cma_match_private_data).
func (l *listener) matches(dst netip.Addr) bool {
	switch {
	case l.any4:
		return dst.Is4()
	case !l.addr.IsValid():
		return true
	}
	return l.addr == dst
}

// newConn makes a connection ID with a local communication ID.
func (m *Manager) newConn(owner Owner, state State) *conn {
	c := &conn{id: m.newHandle(), owner: owner, state: state, localID: m.newCommID()}
	m.conns[c.id] = c
	m.byLocal[c.localID] = c
	return c
}

// ephemeralPort returns a port of ps no ID of the manager uses, from
// Linux's default local port range (32768–60999), at random as
// cma_alloc_any_port picks them.
func (m *Manager) ephemeralPort(ps PortSpace) uint16 {
	used := map[uint16]bool{}
	for _, c := range m.conns {
		if c.ps == ps {
			used[c.local.Port()] = true
		}
	}
	for _, l := range m.listeners {
		if l.ps == ps {
			used[l.sid.Port()] = true
		}
	}
	const low, n = 32768, 60999 - 32768 + 1
	start := int(m.rng.Uint64() % n)
	for i := range n {
		if p := uint16(low + (start+i)%n); !used[p] {
			return p
		}
	}
	return uint16(low + start)
}

// addrs checks an active ID's addresses and gives the local port.
func (m *Manager) addrs(local, remote netip.AddrPort, ps PortSpace) (netip.AddrPort, netip.AddrPort, error) {
	la, ra := local.Addr().Unmap(), remote.Addr().Unmap()
	if !la.IsValid() || !ra.IsValid() || la.Is4() != ra.Is4() || la.IsUnspecified() || ra.IsUnspecified() {
		return local, remote, fmt.Errorf("%w: addresses %v and %v", ErrInvalid, local, remote)
	}
	if remote.Port() == 0 {
		return local, remote, fmt.Errorf("%w: remote port 0", ErrInvalid)
	}
	port := local.Port()
	if port == 0 {
		port = m.ephemeralPort(ps)
	}
	return netip.AddrPortFrom(la, port), netip.AddrPortFrom(ra, remote.Port()), nil
}

// Connect starts an active connection: it sends a REQ for the RDMA CM
// service of the remote port, with the CMA header and the private data,
// and returns the new ID in StateReqSent. The REQ carries rxe's values
// (CM response timeouts 20, 15 retries, local ACK timeout of the packet
// lifetime and ACK delay, hop limit 64, LIDs 0xFFFF, the flow label from
// the ports) and is sent again every 2 × lifetime + response timeout
// (6.144 s), as Linux's ib_send_cm_req times it.
func (m *Manager) Connect(owner Owner, p ConnectParams) (ID, error) {
	switch {
	case p.PortSpace != PortSpaceTCP && p.PortSpace != PortSpaceIB:
		return 0, fmt.Errorf("%w: port space %v for a connected QP", ErrInvalid, p.PortSpace)
	case p.QPType != QPTypeRC && p.QPType != QPTypeUC:
		return 0, fmt.Errorf("%w: QP type %v for a REQ", ErrInvalid, p.QPType)
	case MTUBytes(p.PathMTU) == 0:
		return 0, fmt.Errorf("%w: path MTU code %d", ErrInvalid, p.PathMTU)
	}
	if err := checkPrivate(AttrREQ, p.PrivateData, REQPrivateDataLen-CMAHeaderLen); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.unlock()
	local, remote, err := m.addrs(p.Local, p.Remote, p.PortSpace)
	if err != nil {
		return 0, err
	}
	if len(m.conns) >= m.cfg.MaxConns {
		return 0, fmt.Errorf("%w: %d connection IDs", ErrLimit, len(m.conns))
	}
	c := m.newConn(owner, StateReqSent)
	c.asked = m.cfg.Now()
	c.qpType, c.ps, c.local, c.remote = p.QPType, p.PortSpace, local, remote
	c.sid = RDMAServiceID(p.PortSpace, remote.Port())
	plt := p.PacketLifeTime
	if plt == 0 {
		plt = m.cfg.PacketLifeTime
	}
	hop := p.HopLimit
	if hop == 0 {
		hop = DefaultHopLimit
	}
	fl := p.FlowLabel & 0xFFFFF
	if fl == 0 {
		// cma_get_roce_udp_flow_label: the source port × 31 plus the
		// destination port.
		fl = (uint32(local.Port())*31 + uint32(remote.Port())) & 0xFFFFF
	}
	c.route = Route{Src: local.Addr(), Dst: remote.Addr(), FlowLabel: fl, TrafficClass: p.TrafficClass, HopLimit: hop}
	c.localQPN, c.rqPSN = p.QPN&0xFFFFFF, p.StartingPSN&roce.PSNMask
	c.respRes, c.initDepth = p.ResponderResources, p.InitiatorDepth
	c.retryCount, c.rnrRetry = min(7, p.RetryCount), min(7, p.RNRRetryCount)
	c.pathMTU = p.PathMTU
	c.avTimeout = plt + 1
	c.msgTimeout = 2*cmTime(plt) + cmTime(DefaultCMResponseTimeout)
	c.maxRetries = DefaultMaxCMRetries
	c.tid = m.tid(c)

	msg := Message{Header: NewHeader(AttrREQ, c.tid)}
	r := &msg.REQ
	*r = REQFields{
		LocalCommID:             c.localID,
		ServiceID:               c.sid,
		LocalCAGUID:             m.cfg.GUID,
		LocalQPN:                c.localQPN,
		ResponderResources:      c.respRes,
		InitiatorDepth:          c.initDepth,
		RemoteCMResponseTimeout: DefaultCMResponseTimeout,
		TransportServiceType:    TransportRC,
		EndToEndFlowControl:     p.FlowControl,
		StartingPSN:             c.rqPSN,
		LocalCMResponseTimeout:  DefaultCMResponseTimeout,
		RetryCount:              c.retryCount,
		PKey:                    0xFFFF,
		PathMTU:                 c.pathMTU,
		RNRRetryCount:           c.rnrRetry,
		MaxCMRetries:            c.maxRetries,
		SRQ:                     p.SRQ,
		Primary: PathFields{
			LocalGID:        roce.GIDFromAddr(local.Addr()),
			RemoteGID:       roce.GIDFromAddr(remote.Addr()),
			FlowLabel:       fl,
			TrafficClass:    p.TrafficClass,
			HopLimit:        hop,
			SubnetLocal:     hop <= 1,
			LocalACKTimeout: ackTimeout(m.cfg.AckDelay, plt),
		},
	}
	if p.QPType == QPTypeUC {
		r.TransportServiceType = TransportUC
	}
	if hop > 1 {
		// Linux's "work-around until there's a way to obtain remote
		// LID info": permissive LIDs on a routed path.
		r.Primary.LocalLID, r.Primary.RemoteLID = 0xFFFF, 0xFFFF
	}
	h := CMAHeader{Src: local, Dst: remote.Addr()}
	if err := h.Encode(r.PrivateData[:]); err != nil {
		m.destroyConn(c)
		return 0, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	copy(r.PrivateData[CMAHeaderLen:], p.PrivateData)
	m.sendWaiting(c, &msg)
	return c.id, nil
}

// Resolve starts a UD resolution: a SIDR_REQ for the RDMA CM service of
// the remote port, sent every 4.096 s up to 15 more times (Linux's
// cma_resolve_ib_udp). The ID waits in StateSIDRReqSent for an
// Established (with the service's QPN and Q_Key) or Unreachable event.
func (m *Manager) Resolve(owner Owner, p ResolveParams) (ID, error) {
	if p.PortSpace != PortSpaceUDP && p.PortSpace != PortSpaceIB {
		return 0, fmt.Errorf("%w: port space %v for UD", ErrInvalid, p.PortSpace)
	}
	if err := checkPrivate(AttrSIDRReq, p.PrivateData, SIDRReqPrivateDataLen-CMAHeaderLen); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.unlock()
	local, remote, err := m.addrs(p.Local, p.Remote, p.PortSpace)
	if err != nil {
		return 0, err
	}
	if len(m.conns) >= m.cfg.MaxConns {
		return 0, fmt.Errorf("%w: %d connection IDs", ErrLimit, len(m.conns))
	}
	c := m.newConn(owner, StateSIDRReqSent)
	c.asked = m.cfg.Now()
	c.qpType, c.ps, c.local, c.remote = QPTypeUD, p.PortSpace, local, remote
	c.sid = RDMAServiceID(p.PortSpace, remote.Port())
	c.route = Route{Src: local.Addr(), Dst: remote.Addr(), HopLimit: DefaultHopLimit}
	c.msgTimeout, c.maxRetries = sidrTimeout, DefaultMaxCMRetries
	c.tid = m.tid(c)
	msg := Message{Header: NewHeader(AttrSIDRReq, c.tid)}
	msg.SIDRReq = SIDRReqFields{RequestID: c.localID, PKey: 0xFFFF, ServiceID: c.sid}
	h := CMAHeader{Src: local, Dst: remote.Addr()}
	if err := h.Encode(msg.SIDRReq.PrivateData[:]); err != nil {
		m.destroyConn(c)
		return 0, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	copy(msg.SIDRReq.PrivateData[CMAHeaderLen:], p.PrivateData)
	m.sendWaiting(c, &msg)
	return c.id, nil
}

// conn returns the connection ID id, or an error wrapping ErrNoID.
func (m *Manager) conn(id ID) (*conn, error) {
	c := m.conns[id]
	if c == nil {
		return nil, fmt.Errorf("%w: %d", ErrNoID, id)
	}
	return c, nil
}

func stateErr(c *conn, what string) error {
	return fmt.Errorf("%w: %s in %v", ErrState, what, c.state)
}

// Accept answers a ConnectRequest: for RC and UC a REP (the ID moves to
// StateRepSent and waits for the RTU, sending the REP again every CM
// response timeout the REQ asked for, as many times as it allowed); for
// UD a SIDR_REP with the QPN and Q_Key (the ID moves to StateIdle).
func (m *Manager) Accept(id ID, p AcceptParams) error {
	m.mu.Lock()
	defer m.unlock()
	c, err := m.conn(id)
	if err != nil {
		return err
	}
	switch c.state {
	case StateSIDRReqRcvd:
		if err := checkPrivate(AttrSIDRRep, p.PrivateData, SIDRRepPrivateDataLen); err != nil {
			return err
		}
		qkey := p.QKey
		if qkey == 0 {
			qkey = DefaultUDPQKey
		}
		c.localQPN = p.QPN & 0xFFFFFF
		m.sendSIDRRep(c, SIDRSuccess, c.localQPN, qkey, p.PrivateData)
		m.toIdle(c)
		return nil
	case StateMRAReqSent:
	default:
		return stateErr(c, "accept")
	}
	if err := checkPrivate(AttrREP, p.PrivateData, REPPrivateDataLen); err != nil {
		return err
	}
	c.localQPN, c.rqPSN = p.QPN&0xFFFFFF, p.StartingPSN&roce.PSNMask
	c.respRes, c.initDepth = p.ResponderResources, p.InitiatorDepth
	m.unpend(c)
	msg := Message{Header: NewHeader(AttrREP, c.tid)}
	msg.REP = REPFields{
		LocalCommID:         c.localID,
		RemoteCommID:        c.remoteID,
		LocalQPN:            c.localQPN,
		StartingPSN:         c.rqPSN,
		ResponderResources:  c.respRes,
		InitiatorDepth:      c.initDepth,
		TargetACKDelay:      m.cfg.AckDelay,
		EndToEndFlowControl: p.FlowControl,
		RNRRetryCount:       min(7, p.RNRRetryCount),
		SRQ:                 p.SRQ,
		LocalCAGUID:         m.cfg.GUID,
	}
	copy(msg.REP.PrivateData[:], p.PrivateData)
	c.state = StateRepSent
	m.byQPN[c.localQPN] = c
	m.sendWaiting(c, &msg)
	return nil
}

// Reject refuses a ConnectRequest — a REJ with reason 28 (consumer
// defined) and the private data, or for UD a SIDR_REP with status
// REJECT — or, on the active side, a ConnectResponse (the REJ Linux's
// RDMA CM sends when it cannot move its QP). The ID moves to StateIdle,
// or to TimeWait when its REP was out.
func (m *Manager) Reject(id ID, private []byte) error {
	m.mu.Lock()
	defer m.unlock()
	c, err := m.conn(id)
	if err != nil {
		return err
	}
	switch c.state {
	case StateSIDRReqRcvd:
		if err := checkPrivate(AttrSIDRRep, private, SIDRRepPrivateDataLen); err != nil {
			return err
		}
		m.sendSIDRRep(c, SIDRReject, 0, 0, private)
		m.toIdle(c)
		return nil
	case StateMRAReqSent, StateMRARepSent, StateReqSent, StateMRAReqRcvd, StateRepSent, StateMRARepRcvd:
	default:
		return stateErr(c, "reject")
	}
	if err := checkPrivate(AttrREJ, private, REJPrivateDataLen); err != nil {
		return err
	}
	m.sendREJ(c, RejConsumerDefined, nil, private)
	return nil
}

// Establish sends the RTU of an active connection whose ConnectResponse
// its owner has handled (its QP is in RTS): the ID moves to
// StateEstablished. The RDMA CM's library reports ESTABLISHED itself;
// no event follows.
func (m *Manager) Establish(id ID, private []byte) error {
	if err := checkPrivate(AttrRTU, private, RTUPrivateDataLen); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.unlock()
	c, err := m.conn(id)
	if err != nil {
		return err
	}
	if c.state != StateMRARepSent {
		return stateErr(c, "establish")
	}
	c.rtuPrivate = append([]byte(nil), private...)
	m.sendRTU(c)
	c.state = StateEstablished
	return nil
}

// Disconnect starts or answers a disconnection, as the RDMA CM's
// rdma_disconnect does: an established connection sends a DREQ (and
// waits in StateDreqSent for the DREP, sending the DREQ again as the REQ
// was); one whose peer sent a DREQ answers it with a DREP and enters
// TimeWait.
func (m *Manager) Disconnect(id ID, private []byte) error {
	m.mu.Lock()
	defer m.unlock()
	c, err := m.conn(id)
	if err != nil {
		return err
	}
	switch c.state {
	case StateEstablished:
		if err := checkPrivate(AttrDREQ, private, DREQPrivateDataLen); err != nil {
			return err
		}
		m.sendDREQ(c, private)
	case StateDreqRcvd:
		if err := checkPrivate(AttrDREP, private, DREPPrivateDataLen); err != nil {
			return err
		}
		m.sendDREP(c, private)
		m.enterTimeWait(c)
	default:
		return stateErr(c, "disconnect")
	}
	return nil
}

// Destroy ends an ID in any state as Linux's cm_destroy_id does, telling
// the peer what it must know, and forgets it at once: a listener stops
// listening; an unanswered request is rejected (REJ 28, or SIDR_REP
// REJECT); an unanswered REQ is withdrawn with REJ 4 (timeout) carrying
// the local CA GUID; a REP not yet answered, or a reply not yet
// acknowledged, is rejected (REJ 28); an established connection sends
// one DREQ (not repeated); a received DREQ is answered with a DREP. No
// event follows.
func (m *Manager) Destroy(id ID) error {
	m.mu.Lock()
	defer m.unlock()
	if l := m.listeners[id]; l != nil {
		m.destroyListener(l)
		return nil
	}
	c, err := m.conn(id)
	if err != nil {
		return err
	}
	m.destroy(c)
	return nil
}

// Drop forgets a request handed up and not yet answered without
// answering it, as Linux's CM does when the RDMA CM's handler fails for
// want of memory — ucma's, when its backlog of unread events is full —
// "to allow future retries": the peer sends its REQ again and it comes
// up as a new request. A SIDR_REQ is refused all the same (SIDR_REP
// status REJECT), as Linux's CM refuses it. Other states: ErrState.
func (m *Manager) Drop(id ID) error {
	m.mu.Lock()
	defer m.unlock()
	c, err := m.conn(id)
	if err != nil {
		return err
	}
	switch c.state {
	case StateMRAReqSent:
		m.destroyConn(c)
	case StateSIDRReqRcvd:
		m.destroy(c)
	default:
		return stateErr(c, "drop")
	}
	return nil
}

// CloseOwner destroys every ID of owner — its listeners first, so that
// no request reaches them meanwhile — as when the process holding them
// died: the peers see REJs and DREQs. It returns how many IDs it
// destroyed.
func (m *Manager) CloseOwner(owner Owner) int {
	m.mu.Lock()
	defer m.unlock()
	n := 0
	for _, l := range m.listeners {
		if l.owner == owner {
			m.destroyListener(l)
			n++
		}
	}
	for _, c := range m.conns {
		if c.owner == owner {
			m.destroy(c)
			n++
		}
	}
	return n
}

// SetOwner gives the ID id — a connection or a listener — to owner: its
// events from now on are owner's, and so are the connection requests a
// listener hands up from now on (rdma_migrate_id). It fails with ErrNoID
// for an ID the manager does not have.
func (m *Manager) SetOwner(id ID, owner Owner) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if l := m.listeners[id]; l != nil {
		l.owner = owner
		return nil
	}
	c, err := m.conn(id)
	if err != nil {
		return err
	}
	c.owner = owner
	return nil
}

// CommEstablished tells the manager that the QP numbered qpn received its
// first packet (IBA 12.9.6's communication established event): a passive
// connection still waiting for its RTU takes it as one, as Linux's
// ib_cm_notify(IB_EVENT_COMM_EST) does — the RTU may be lost, and the
// peer's data shows that it has the REP. It reports whether a connection
// was waiting.
func (m *Manager) CommEstablished(qpn uint32) bool {
	m.mu.Lock()
	defer m.unlock()
	c := m.byQPN[qpn&0xFFFFFF]
	return c != nil && m.commEst(c) == nil
}

// Notify is rdma_notify(IBV_EVENT_COMM_EST) on the ID id, the consumer
// telling what its QP's async event said: as CommEstablished, and
// ErrEstablished for a connection that is established already, ErrState
// for one in any other state, as Linux's cm_establish answers.
func (m *Manager) Notify(id ID) error {
	m.mu.Lock()
	defer m.unlock()
	c, err := m.conn(id)
	if err != nil {
		return err
	}
	return m.commEst(c)
}

// commEst establishes c, waiting for its RTU, without it. m.mu is held.
func (m *Manager) commEst(c *conn) error {
	switch c.state {
	case StateRepSent, StateMRARepRcvd:
		m.established(c)
		return nil
	case StateEstablished:
		return fmt.Errorf("%w: ID %d", ErrEstablished, c.id)
	}
	return stateErr(c, "communication established")
}

// Info describes the ID id.
func (m *Manager) Info(id ID) (Info, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if l := m.listeners[id]; l != nil {
		i := Info{State: StateListen, Owner: l.owner, QPType: l.qpType, Listener: true, ServiceID: l.sid}
		i.Local = netip.AddrPortFrom(l.addr, l.sid.Port())
		if l.any4 {
			i.Local = netip.AddrPortFrom(netip.IPv4Unspecified(), l.sid.Port())
		}
		return i, nil
	}
	c, err := m.conn(id)
	if err != nil {
		return Info{}, err
	}
	return Info{
		State: c.state, Owner: c.owner, QPType: c.qpType, Local: c.local, Remote: c.remote, ServiceID: c.sid,
		LocalCommID: c.localID, RemoteCommID: c.remoteID,
		FlowLabel: c.route.FlowLabel, HopLimit: c.route.HopLimit, TrafficClass: c.route.TrafficClass, PathMTU: c.pathMTU,
		LocalQPN: c.localQPN, RemoteQPN: c.remoteQPN, RemoteQKey: c.remoteQKey, RQPSN: c.rqPSN, SQPSN: c.sqPSN,
		ResponderResources: c.respRes, InitiatorDepth: c.initDepth, RetryCount: c.retryCount, RNRRetryCount: c.rnrRetry,
		AckTimeout: c.avTimeout,
	}, nil
}

// destroyListener forgets a listener. The IDs it handed up stay with
// their owner; they no longer count against anything.
func (m *Manager) destroyListener(l *listener) {
	delete(m.listeners, l.id)
	ls := m.byService[l.sid]
	for i, o := range ls {
		if o == l {
			ls = append(ls[:i:i], ls[i+1:]...)
			break
		}
	}
	if len(ls) == 0 {
		delete(m.byService, l.sid)
	} else {
		m.byService[l.sid] = ls
	}
	for _, c := range m.conns {
		if c.listener == l {
			c.listener = nil
		}
	}
}

// destroy is cm_destroy_id: what c's state owes the peer, then c gone.
func (m *Manager) destroy(c *conn) {
	switch c.state {
	case StateSIDRReqRcvd:
		m.sendSIDRRep(c, SIDRReject, 0, 0, nil)
	case StateReqSent, StateMRAReqRcvd:
		var ari [8]byte
		binary.BigEndian.PutUint64(ari[:], m.cfg.GUID)
		m.sendREJ(c, RejTimeout, ari[:], nil)
	case StateMRAReqSent, StateRepSent, StateMRARepRcvd, StateMRARepSent:
		m.sendREJ(c, RejConsumerDefined, nil, nil)
	case StateEstablished:
		// One DREQ, not repeated: the ID is gone (Linux sends it, then
		// cancels it on entering TimeWait).
		m.sendDREQ(c, nil)
	case StateDreqRcvd:
		m.sendDREP(c, nil)
	}
	m.destroyConn(c)
}

// destroyConn forgets c.
func (m *Manager) destroyConn(c *conn) {
	m.leaveTables(c)
	delete(m.conns, c.id)
	if m.byLocal[c.localID] == c {
		delete(m.byLocal, c.localID)
	}
}

// leaveTables takes c out of the tables that find it by the peer's IDs,
// out of its listener's backlog, and stops its timer: what Linux's
// cm_reset_to_idle and cm_enter_timewait (cm_remove_remote) do.
func (m *Manager) leaveTables(c *conn) {
	if c.inRemote {
		if k := (remoteKey{c.remoteID, c.remoteGUID}); m.byRemote[k] == c {
			delete(m.byRemote, k)
		}
		if k := (remoteKey{c.remoteQPN, c.remoteGUID}); m.byRemoteQPN[k] == c {
			delete(m.byRemoteQPN, k)
		}
		c.inRemote = false
	}
	if m.byQPN[c.localQPN] == c {
		delete(m.byQPN, c.localQPN)
	}
	if c.inSIDR {
		if k := (sidrKey{c.route.Dst, c.remoteID}); m.sidrIn[k] == c {
			delete(m.sidrIn, k)
		}
		c.inSIDR = false
	}
	m.unpend(c)
	c.msgLive, c.deadline = false, time.Time{}
}

// unpend takes c out of its listener's backlog.
func (m *Manager) unpend(c *conn) {
	if c.listener != nil {
		c.listener.pending--
		c.listener = nil
	}
}

// enterRemote puts c in the tables that find it by the peer's
// communication ID and QPN (Linux's cm_insert_remote_id and
// cm_insert_remote_qpn, which the REQ's and REP's handlers call).
func (m *Manager) enterRemote(c *conn) {
	m.byRemote[remoteKey{c.remoteID, c.remoteGUID}] = c
	m.byRemoteQPN[remoteKey{c.remoteQPN, c.remoteGUID}] = c
	c.inRemote = true
}

// toIdle is cm_reset_to_idle.
func (m *Manager) toIdle(c *conn) {
	m.leaveTables(c)
	c.state = StateIdle
}

// enterTimeWait is cm_enter_timewait: TimeWait for the path's local ACK
// timeout in Linux's conversion (2.048 s on RoCE).
func (m *Manager) enterTimeWait(c *conn) {
	m.leaveTables(c)
	c.state = StateTimeWait
	m.setDeadline(c, m.cfg.Now().Add(cmTime(c.avTimeout)))
}

// established moves a passive connection to StateEstablished: its RTU
// arrived, or its QP's first packet did.
func (m *Manager) established(c *conn) {
	m.leaveTimer(c)
	if m.byQPN[c.localQPN] == c {
		delete(m.byQPN, c.localQPN)
	}
	c.state = StateEstablished
	m.event(Event{Type: EventEstablished, ID: c.id, Owner: c.owner, Local: c.local, Remote: c.remote})
}

// leaveTimer stops waiting for an answer (Linux's ib_cancel_mad).
func (m *Manager) leaveTimer(c *conn) { c.msgLive, c.deadline = false, time.Time{} }

// disconnected delivers c's Disconnected event, once.
func (m *Manager) disconnected(c *conn, timedOut bool, private []byte) {
	if c.disconnected {
		return
	}
	c.disconnected = true
	m.event(Event{Type: EventDisconnected, ID: c.id, Owner: c.owner, Local: c.local, Remote: c.remote,
		TimedOut: timedOut, PrivateData: private})
}

// expire runs c's timer, due at now (cm_process_send_error for a
// message whose retries ran out, cm_timewait_handler for TimeWait).
func (m *Manager) expire(c *conn, now time.Time) {
	if c.state == StateTimeWait {
		c.deadline = time.Time{}
		c.state = StateIdle
		if c.disconnected {
			m.event(Event{Type: EventTimeWaitExit, ID: c.id, Owner: c.owner, Local: c.local, Remote: c.remote})
		}
		return
	}
	if !c.msgLive {
		c.deadline = time.Time{}
		return
	}
	if c.retries > 0 {
		c.retries--
		m.setDeadline(c, now.Add(c.msgTimeout))
		m.queueRaw(c.route, &c.msg)
		return
	}
	if i, ok := AttrIndex(MAD(c.msg[:]).AttrID()); ok {
		m.stats.Timeouts[i]++
	}
	m.leaveTimer(c)
	switch c.state {
	case StateReqSent, StateMRAReqRcvd, StateRepSent, StateMRARepRcvd, StateSIDRReqSent:
		m.toIdle(c)
		m.event(Event{Type: EventUnreachable, ID: c.id, Owner: c.owner, Local: c.local, Remote: c.remote, TimedOut: true})
	case StateDreqSent:
		m.enterTimeWait(c)
		m.disconnected(c, true, nil)
	}
}

// sendWaiting sends a message that waits for an answer — REQ, REP, DREQ,
// SIDR_REQ — and keeps it to send again.
func (m *Manager) sendWaiting(c *conn, msg *Message) {
	if _, err := msg.Encode(c.msg[:]); err != nil {
		panic("cm: encoding a message of the manager's own: " + err.Error())
	}
	m.queue(c.route, msg)
	c.msgLive, c.retries = true, int(c.maxRetries)
	m.setDeadline(c, m.cfg.Now().Add(c.msgTimeout))
}

// sendRTU sends c's RTU (cm_format_rtu): the REQ's transaction ID.
func (m *Manager) sendRTU(c *conn) {
	msg := Message{Header: NewHeader(AttrRTU, c.tid)}
	msg.RTU = RTUFields{LocalCommID: c.localID, RemoteCommID: c.remoteID}
	copy(msg.RTU.PrivateData[:], c.rtuPrivate)
	m.queue(c.route, &msg)
}

// sendMRA sends c's MRA of the message kind k with the RDMA CM's service
// timeout (cm_format_mra): what Linux answers a duplicate REQ or REP its
// consumer has not answered yet.
func (m *Manager) sendMRA(c *conn, k MessageKind) {
	msg := Message{Header: NewHeader(AttrMRA, c.tid)}
	msg.MRA = MRAFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageMRAed: k, ServiceTimeout: MRAServiceTimeout}
	m.queue(c.route, &msg)
}

// sendDREQ sends c's DREQ, with a transaction ID of its own, and waits
// for the DREP in StateDreqSent.
func (m *Manager) sendDREQ(c *conn, private []byte) {
	msg := Message{Header: NewHeader(AttrDREQ, m.tid(c))}
	msg.DREQ = DREQFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, RemoteQPN: c.remoteQPN}
	copy(msg.DREQ.PrivateData[:], private)
	c.state = StateDreqSent
	m.sendWaiting(c, &msg)
}

// sendDREP answers the DREQ c received (cm_format_drep: the DREQ's
// transaction ID).
func (m *Manager) sendDREP(c *conn, private []byte) {
	msg := Message{Header: NewHeader(AttrDREP, c.tid)}
	msg.DREP = DREPFields{LocalCommID: c.localID, RemoteCommID: c.remoteID}
	copy(msg.DREP.PrivateData[:], private)
	m.queue(c.route, &msg)
}

// sendREJ is cm_send_rej_locked: it rejects what c is waiting on and
// moves it on — to Idle, or to TimeWait when a REP of its own was out.
// The REJ names the message rejected as cm_format_rej does from c's
// state: the REQ while the request waits for its consumer, the REP while
// the reply waits for its, anything else otherwise.
func (m *Manager) sendREJ(c *conn, reason RejectReason, ari, private []byte) {
	msg := Message{Header: NewHeader(AttrREJ, c.tid)}
	j := &msg.REJ
	j.LocalCommID, j.RemoteCommID, j.Reason = c.localID, c.remoteID, reason
	switch c.state {
	case StateMRAReqSent:
		j.MessageRejected = MessageREQ
	case StateMRARepSent:
		j.MessageRejected = MessageREP
	default:
		j.MessageRejected = MessageOther
	}
	j.RejectInfoLength = uint8(copy(j.ARI[:], ari))
	copy(j.PrivateData[:], private)
	m.queue(c.route, &msg)
	switch c.state {
	case StateRepSent, StateMRARepRcvd:
		m.enterTimeWait(c)
	default:
		m.toIdle(c)
	}
}

// sendSIDRRep answers the SIDR_REQ c received (cm_format_sidr_rep).
func (m *Manager) sendSIDRRep(c *conn, status SIDRStatus, qpn, qkey uint32, private []byte) {
	msg := Message{Header: NewHeader(AttrSIDRRep, c.tid)}
	msg.SIDRRep = SIDRRepFields{RequestID: c.remoteID, Status: status, QPN: qpn, ServiceID: c.sid, QKey: qkey}
	copy(msg.SIDRRep.PrivateData[:], private)
	m.queue(c.route, &msg)
}
