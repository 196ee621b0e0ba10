package control

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/verbs/abi"
)

// The RDMA CM's ops (abi.OpCMCreateID …) turn a session into an event
// channel of librdmacm: its IDs live in the session as ucma's live in a
// file of /dev/infiniband/rdma_cm, an ID takes a device of the session's
// namespace when its address is bound or resolved, and the device's
// connection manager (Device.CM) does the protocol. The session is the
// manager's owner (cm.Owner): events for its IDs come back to it, in
// order, on one goroutine; when it goes, CloseOwner ends its connections
// as the kernel does when a process holding CM IDs dies.

// cmIDState is where an ID stands before the manager has it, as
// rdma_cm_id's state (enum rdma_cm_state) does.
type cmIDState uint8

const (
	cmIdle cmIDState = iota
	cmBound
	cmAddrQuery
	cmAddrResolved
	cmRouteResolved
	cmListen
	cmConn // the manager has it (connecting, connected, a request)
	cmDestroying
)

// cmID is one ID of a session.
type cmID struct {
	id       uint32
	ctx      uint64
	ps       cm.PortSpace
	qpType   cm.QPType
	state    cmIDState
	dev      *Device // nil until bound to an address of a device, or resolved
	src, dst netip.AddrPort
	// conn is the manager's connection ID; listeners the manager's
	// listener IDs (one per device it listens on).
	conn      cm.ID
	listeners map[*Device]cm.ID
	backlog   int
	psn       roce.PSN // the local QP's starting PSN, chosen here as cma does
	events    uint32   // events sent for it, on every channel it belonged to
	// home is the session the ID belongs to, which rdma_migrate_id
	// changes (cmMigrate); read without its cmMu by what must then lock
	// it.
	home atomic.Pointer[session]
}

// cmKey finds a session's ID by the manager's.
type cmKey struct {
	dev *Device
	id  cm.ID
}

// cmState is a session's RDMA CM state; ss.cmMu guards it.
type cmState struct {
	ids   map[uint32]*cmID
	byCM  map[cmKey]*cmID
	next  uint32
	owner cm.Owner
}

// maxCMEvents bounds the CM events waiting for a client. A connect
// request beyond it is dropped, so that the peer sends its REQ again, as
// ucma's ENOMEM drops it; any other event beyond it ends a client that
// does not read them.
const maxCMEvents = 256

// maxCMIDs bounds a session's IDs, as Limits.QPs its QPs.
const maxCMIDs = 1024

// cmResolveTimeout bounds rdma_resolve_addr when the client gives none.
const cmResolveTimeout = 2 * time.Second

// errCMNoDevice: an address no device of the session's namespace has.
var errCMNoDevice = errors.New("control: no device of the namespace has the address")

// cmInit readies the session's CM state; ss.cmMu is held.
func (ss *session) cmInit() {
	if ss.cm.ids != nil {
		return
	}
	ss.cm = cmState{ids: map[uint32]*cmID{}, byCM: map[cmKey]*cmID{}, owner: cm.Owner(ss.srv.nextOwner.Add(1))}
	ss.cmQ = make(chan cmItem, maxCMEvents)
	ss.srv.owners.Store(ss.cm.owner, ss)
	go ss.cmSender(ss.cmQ)
}

// cmItem is an event on its way to the client: a manager's, translated
// by the sender, or one the session made (ev).
type cmItem struct {
	dev *Device
	mgr cm.Event
	ev  *abi.CMEvent
	x   *cmID // ev's ID
}

// cmSender translates and sends the session's CM events in order until
// the session ends. A manager's event is translated here, not in the
// manager's callback: the callback may run within a call the session
// makes to the manager under ss.cmMu (a REQ to the port's own address,
// answered at once).
func (ss *session) cmSender(q chan cmItem) {
	for {
		select {
		case it := <-q:
			ss.cmMu.Lock()
			ev := it.ev
			var to *session // where an event for an ID moved meanwhile goes
			switch {
			case ev == nil:
				if ev = ss.cmTranslate(it.dev, it.mgr); ev == nil {
					to = ss.cmMovedOwner(it.dev, it.mgr.ID)
				}
			case it.x.home.Load() != ss:
				to, ev = it.x.home.Load(), nil
			case ss.cm.ids[it.x.id] == it.x:
				it.x.events++
				ev.ID = it.x.id
			default:
				ev = nil // destroyed meanwhile: ucma frees its events too
			}
			ss.cmMu.Unlock()
			if to != nil {
				to.cmForward(it)
				continue
			}
			if ev == nil {
				continue
			}
			msg, err := abi.Encode(nil, abi.Header{Op: abi.OpCMEvent, Flags: abi.FlagEvent}, ev)
			if err != nil {
				continue
			}
			if c := ss.evconn.Load(); c != nil {
				err = ss.sendOn(c, msg)
			} else {
				err = ss.send(msg)
			}
			if err != nil {
				return
			}
		case <-ss.ctx.Done():
			return
		}
	}
}

// cmEvent delivers an event of a device's manager to the session that owns
// the ID (Device.SetCMEvents). It never waits.
func (s *Server) cmEvent(d *Device, ev cm.Event) {
	v, ok := s.owners.Load(ev.Owner)
	if !ok {
		// The owner is gone; CloseOwner already ended its IDs, and a
		// request to a listener that went with it goes the same way.
		if ev.Type == cm.EventConnectRequest {
			_ = d.CM.Destroy(ev.ID)
		}
		return
	}
	ss := v.(*session)
	select {
	case ss.cmQ <- cmItem{dev: d, mgr: ev}:
	default:
		if ev.Type == cm.EventConnectRequest {
			_ = d.CM.Drop(ev.ID) // the peer sends its REQ again
			return
		}
		ss.log.Warn("client left its CM events unread; disconnected", "events", maxCMEvents)
		ss.conn.Close()
	}
}

// cmTranslate turns a manager's event into the session's CMEvent, nil
// when its ID is gone; ss.cmMu is held.
func (ss *session) cmTranslate(d *Device, ev cm.Event) *abi.CMEvent {
	if ss.cm.ids == nil {
		return nil
	}
	var x *cmID
	out := &abi.CMEvent{Event: cmEventType(ev)}
	if ev.Type == cm.EventConnectRequest {
		l := ss.cm.byCM[cmKey{d, ev.Listener}]
		if l == nil {
			// The listener went (rdma_destroy_id) after its manager
			// handed the request up: ucma destroys the requests of a
			// listener it destroys, and the CM rejects them with reason
			// 28 at once, where a drop would leave the peer to send its
			// REQ again and hear REJ 8 seconds later.
			_ = d.CM.Destroy(ev.ID)
			return nil
		}
		if len(ss.cm.ids) >= maxCMIDs {
			_ = d.CM.Drop(ev.ID) // ucma's ENOMEM: the peer sends its REQ again
			return nil
		}
		x = ss.cmNewID(l.ctx, l.ps, l.qpType)
		x.state, x.dev, x.conn, x.src, x.dst = cmConn, d, ev.ID, ev.Local, ev.Remote
		ss.cm.byCM[cmKey{d, ev.ID}] = x
		out.Listener = l.id
	} else if x = ss.cm.byCM[cmKey{d, ev.ID}]; x == nil {
		return nil // destroyed meanwhile
	}
	out.ID, out.Context = x.id, x.ctx
	switch ev.Type {
	case cm.EventRejected:
		out.Status = int32(ev.Reason)
	case cm.EventUnreachable, cm.EventDisconnected:
		switch {
		case ev.TimedOut:
			out.Status = -int32(syscall.ETIMEDOUT)
		case ev.Type == cm.EventUnreachable:
			out.Status = int32(ev.SIDRStatus) // a SIDR_REP's refusal, as cma reports it
		}
	}
	out.Param = connParamOut(ev.Param, ev.PrivateData)
	out.Src, out.Dst = sockAddr(ev.Local), sockAddr(ev.Remote)
	if !ev.Local.IsValid() {
		out.Src, out.Dst = sockAddr(x.src), sockAddr(x.dst)
	}
	if x.dst.IsValid() {
		out.DGID = x.dst.Addr().As16()
		out.HopLimit = cm.DefaultHopLimit
	}
	x.events++
	return out
}

// cmMovedOwner returns the session that owns the manager's ID id of d now,
// when it is not ss: the ID moved to another session's channel
// (cmMigrate) after its event was queued here. ss.cmMu is held.
func (ss *session) cmMovedOwner(d *Device, id cm.ID) *session {
	if d == nil || d.CM == nil {
		return nil
	}
	info, err := d.CM.Info(id)
	if err != nil || info.Owner == ss.cm.owner {
		return nil
	}
	if v, ok := ss.srv.owners.Load(info.Owner); ok {
		return v.(*session)
	}
	return nil
}

// cmForward queues an item of another session's queue, for an ID that
// moved to ss: as ucma moves an ID's queued events with it.
func (ss *session) cmForward(it cmItem) {
	select {
	case ss.cmQ <- it:
	default:
		ss.log.Warn("client left its CM events unread; disconnected", "events", maxCMEvents)
		ss.conn.Close()
	}
}

// cmQueue queues an event the session made for x; ss.cmMu is held.
func (ss *session) cmQueue(x *cmID, ev *abi.CMEvent) {
	select {
	case ss.cmQ <- cmItem{ev: ev, x: x}:
	default:
		ss.log.Warn("client left its CM events unread; disconnected", "events", maxCMEvents)
		ss.conn.Close()
	}
}

// cmEventType maps a manager's event to the RDMA CM's.
func cmEventType(ev cm.Event) uint32 {
	switch ev.Type {
	case cm.EventConnectRequest:
		return abi.CMEventConnectRequest
	case cm.EventConnectResponse:
		return abi.CMEventConnectResponse
	case cm.EventEstablished:
		return abi.CMEventEstablished
	case cm.EventRejected:
		return abi.CMEventRejected
	case cm.EventUnreachable:
		return abi.CMEventUnreachable
	case cm.EventDisconnected:
		return abi.CMEventDisconnected
	case cm.EventTimeWaitExit:
		return abi.CMEventTimewaitExit
	}
	return abi.CMEventConnectError
}

func connParamOut(p cm.ConnParam, private []byte) abi.CMConnParam {
	out := abi.CMConnParam{QPN: p.QPN, QKey: p.QKey, ResponderResources: p.ResponderResources,
		InitiatorDepth: p.InitiatorDepth, RetryCount: p.RetryCount, RNRRetryCount: p.RNRRetryCount}
	if p.FlowControl {
		out.FlowControl = 1
	}
	if p.SRQ {
		out.SRQ = 1
	}
	out.PrivateDataLen = uint8(copy(out.PrivateData[:], private))
	return out
}

// sockAddr is a as the abi carries it.
func sockAddr(a netip.AddrPort) abi.SockAddr {
	if !a.IsValid() {
		return abi.SockAddr{}
	}
	s := abi.SockAddr{Family: abi.AFInet6, Port: a.Port(), Addr: a.Addr().As16()}
	if a.Addr().Unmap().Is4() {
		s.Family = abi.AFInet
	}
	return s
}

// addrPort is the address of s; ok is false for a family other than
// AF_INET and AF_INET6 (an unset one is the zero AddrPort and true).
func addrPort(s abi.SockAddr) (netip.AddrPort, bool) {
	switch s.Family {
	case 0:
		return netip.AddrPort{}, true
	case abi.AFInet:
		return netip.AddrPortFrom(netip.AddrFrom16(s.Addr).Unmap(), s.Port), true
	case abi.AFInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(s.Addr), s.Port), true
	}
	return netip.AddrPort{}, false
}

// cmNewID adds an ID; ss.cmMu is held.
func (ss *session) cmNewID(ctx uint64, ps cm.PortSpace, qt cm.QPType) *cmID {
	ss.cm.next++
	x := &cmID{id: ss.cm.next, ctx: ctx, ps: ps, qpType: qt, psn: randomPSN()}
	x.home.Store(ss)
	ss.cm.ids[x.id] = x
	return x
}

func randomPSN() roce.PSN {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return roce.PSN(binary.LittleEndian.Uint32(b[:]) & 0xffffff)
}

// cmErr maps the manager's errors to the errnos ucma answers with.
func cmErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, cm.ErrAddrInUse):
		return errno(syscall.EADDRINUSE, "%v", err)
	case errors.Is(err, cm.ErrLimit):
		return errno(syscall.ENOMEM, "%v", err)
	case errors.Is(err, cm.ErrEstablished):
		return errno(syscall.EISCONN, "%v", err)
	}
	return errno(syscall.EINVAL, "%v", err) // ErrNoID, ErrState, ErrInvalid, ErrPrivateData
}

// cmDevices returns the devices of the session's namespace that run a
// connection manager.
func (ss *session) cmDevices() []*Device {
	var out []*Device
	for _, d := range ss.srv.Devices() {
		if d.Netns == ss.netns && d.CM != nil {
			out = append(out, d)
		}
	}
	return out
}

// gidIndex returns the index of address a in d's GID table, and false
// when d does not have it.
func gidIndex(d *Device, a netip.Addr) (int, bool) {
	for i, g := range d.GIDs() {
		if g.Addr() == a.Unmap() {
			return i, true
		}
	}
	return 0, false
}

// cmDeviceOf returns the device of the namespace that has address a.
func (ss *session) cmDeviceOf(a netip.Addr) *Device {
	for _, d := range ss.cmDevices() {
		if _, ok := gidIndex(d, a); ok {
			return d
		}
	}
	return nil
}

// cmHandle serves the CM's ops; ss.cmMu is not held.
func (ss *session) cmHandle(op abi.Op, decode func(any) error) (any, error) {
	ss.cmMu.Lock()
	defer ss.cmMu.Unlock()
	ss.cmInit()
	if op == abi.OpCMCreateID {
		var r abi.CMCreateIDRequest
		if err := decode(&r); err != nil {
			return nil, err
		}
		ps, qt := cm.PortSpace(r.PortSpace), cm.QPType(0)
		switch abi.QPType(r.QPType) {
		case abi.RC:
			qt = cm.QPTypeRC
		case abi.UC:
			qt = cm.QPTypeUC
		case abi.UD:
			qt = cm.QPTypeUD
		default:
			return &abi.CMIDReply{Errno: abi.Errno(syscall.EINVAL)}, nil
		}
		switch {
		case ps == cm.PortSpaceTCP && qt != cm.QPTypeUD, ps == cm.PortSpaceUDP && qt == cm.QPTypeUD, ps == cm.PortSpaceIB:
		default:
			return &abi.CMIDReply{Errno: abi.Errno(syscall.EINVAL)}, nil
		}
		if len(ss.cm.ids) >= maxCMIDs {
			return &abi.CMIDReply{Errno: abi.Errno(syscall.ENOMEM)}, nil
		}
		return &abi.CMIDReply{ID: ss.cmNewID(r.Context, ps, qt).id}, nil
	}
	switch op {
	case abi.OpCMDestroyID, abi.OpCMQuery, abi.OpCMDisconnect, abi.OpCMEstablish, abi.OpCMListen,
		abi.OpCMResolveRoute, abi.OpCMInitQPAttr, abi.OpCMNotify:
		var r abi.CMIDRequest
		if err := decode(&r); err != nil {
			return nil, err
		}
		x := ss.cm.ids[r.ID]
		if x == nil {
			return cmFail(op, syscall.EINVAL), nil
		}
		return ss.cmIDOp(op, x, r.Arg), nil
	case abi.OpCMBind, abi.OpCMResolveAddr:
		var r abi.CMAddrRequest
		if err := decode(&r); err != nil {
			return nil, err
		}
		x := ss.cm.ids[r.ID]
		src, ok1 := addrPort(r.Src)
		dst, ok2 := addrPort(r.Dst)
		if x == nil || !ok1 || !ok2 {
			return &abi.ErrnoReply{Errno: abi.Errno(syscall.EINVAL)}, nil
		}
		if op == abi.OpCMBind {
			return &abi.ErrnoReply{Errno: abi.ErrnoOf(ss.cmBind(x, src))}, nil
		}
		return &abi.ErrnoReply{Errno: abi.ErrnoOf(ss.cmResolveAddr(x, src, dst, time.Duration(r.TimeoutMs)*time.Millisecond))}, nil
	case abi.OpCMConnect, abi.OpCMAccept, abi.OpCMReject:
		var r abi.CMConnectRequest
		if err := decode(&r); err != nil {
			return nil, err
		}
		x := ss.cm.ids[r.ID]
		if x == nil || int(r.Param.PrivateDataLen) > len(r.Param.PrivateData) {
			return &abi.ErrnoReply{Errno: abi.Errno(syscall.EINVAL)}, nil
		}
		return &abi.ErrnoReply{Errno: abi.ErrnoOf(ss.cmConnOp(op, x, &r.Param))}, nil
	}
	return nil, fmt.Errorf("%w: %v from a client", abi.ErrOp, op)
}

// cmFail is op's reply with errno e.
func cmFail(op abi.Op, e syscall.Errno) any {
	switch op {
	case abi.OpCMDestroyID:
		return &abi.CMDestroyReply{Errno: abi.Errno(e)}
	case abi.OpCMQuery:
		return &abi.CMQueryReply{Errno: abi.Errno(e)}
	case abi.OpCMInitQPAttr:
		return &abi.CMInitQPAttrReply{Errno: abi.Errno(e)}
	}
	return &abi.ErrnoReply{Errno: abi.Errno(e)}
}

// cmBind binds x to src (rdma_bind_addr): an unspecified or loopback
// address binds no device yet (the kernel's cma_any_addr counts both as
// any address: libfabric's verbs provider binds to localhost to learn
// that); a port of 0 gets an ephemeral one now, as the kernel's
// cma_get_port gives it, so that rdma_get_src_port tells it before the
// ID listens (qperf's server sends it to its client that way).
func (ss *session) cmBind(x *cmID, src netip.AddrPort) error {
	if x.state != cmIdle || !src.IsValid() {
		return errno(syscall.EINVAL, "bind in state %d", x.state)
	}
	if !anyAddr(src.Addr()) {
		d := ss.cmDeviceOf(src.Addr())
		if d == nil {
			return errno(syscall.EADDRNOTAVAIL, "%v: %v", src.Addr(), errCMNoDevice)
		}
		x.dev = d
	}
	if src.Port() == 0 {
		src = netip.AddrPortFrom(src.Addr(), ss.srv.ephemeralPort())
	}
	x.src, x.state = src, cmBound
	return nil
}

// anyAddr reports whether a names no address of a device, as the kernel's
// cma_any_addr: the unspecified address and the loopback ones.
func anyAddr(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsUnspecified() || a.IsLoopback()
}

// listenAddr is the address a listener bound to a takes requests for: any
// address of a's family for a loopback one, as the kernel's
// cma_match_private_data matches a listener bound to one of cma_any_addr's.
func listenAddr(a netip.Addr) netip.Addr {
	switch a = a.Unmap(); {
	case !a.IsLoopback():
		return a
	case a.Is4():
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}

// cmResolveAddr resolves dst (rdma_resolve_addr): the device and source
// address that reach it in the session's namespace, then the next hop's
// MAC within timeout; ADDR_RESOLVED or ADDR_ERROR follows.
func (ss *session) cmResolveAddr(x *cmID, src, dst netip.AddrPort, timeout time.Duration) error {
	if x.state != cmIdle && x.state != cmBound || !dst.IsValid() || dst.Addr().IsUnspecified() {
		return errno(syscall.EINVAL, "resolve in state %d", x.state)
	}
	if x.state == cmBound {
		src = x.src
	}
	dev := x.dev
	if src.IsValid() && !anyAddr(src.Addr()) && dev == nil {
		if dev = ss.cmDeviceOf(src.Addr()); dev == nil {
			return errno(syscall.EADDRNOTAVAIL, "%v: %v", src.Addr(), errCMNoDevice)
		}
	}
	var from netip.Addr
	if dev != nil {
		from = src.Addr()
	} else {
		for _, d := range ss.cmDevices() {
			if d.Route == nil {
				continue
			}
			if a, err := d.Route(dst.Addr().Unmap()); err == nil {
				dev, from = d, a
				break
			}
		}
	}
	if dev == nil {
		// ucma answers at once; librdmacm's rdma_resolve_addr fails.
		return errno(syscall.EADDRNOTAVAIL, "no device of the namespace reaches %v", dst.Addr())
	}
	x.dev, x.src, x.dst, x.state = dev, netip.AddrPortFrom(from.Unmap(), src.Port()), netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()), cmAddrQuery
	if timeout <= 0 {
		timeout = cmResolveTimeout
	}
	ctx, cancel := context.WithTimeout(ss.ctx, timeout)
	go func() {
		defer cancel()
		_, err := dev.Resolve(ctx, x.dst.Addr())
		ss := x.lockHome()
		defer ss.cmMu.Unlock()
		if ss.cm.ids[x.id] != x || x.state != cmAddrQuery {
			return
		}
		ev := abi.CMEvent{ID: x.id, Context: x.ctx, Event: abi.CMEventAddrResolved, Src: sockAddr(x.src), Dst: sockAddr(x.dst)}
		if err != nil {
			ev.Event, ev.Status = abi.CMEventAddrError, -int32(syscall.EHOSTUNREACH)
			x.state = cmBound
			if !x.src.IsValid() {
				x.state = cmIdle
			}
		} else {
			x.state = cmAddrResolved
		}
		ss.cmQueue(x, &ev)
	}()
	return nil
}

// lockHome locks the cmMu of the session x belongs to, which a migration
// may change until it is held, and returns that session.
func (x *cmID) lockHome() *session {
	for {
		ss := x.home.Load()
		ss.cmMu.Lock()
		if x.home.Load() == ss {
			return ss
		}
		ss.cmMu.Unlock()
	}
}

// cmIDOp serves the ops that name an ID and one argument.
func (ss *session) cmIDOp(op abi.Op, x *cmID, arg uint32) any {
	switch op {
	case abi.OpCMDestroyID:
		reported := x.events
		ss.cmDestroy(x)
		return &abi.CMDestroyReply{EventsReported: reported}
	case abi.OpCMQuery:
		return ss.cmQuery(x)
	case abi.OpCMResolveRoute:
		if x.state != cmAddrResolved {
			return &abi.ErrnoReply{Errno: abi.Errno(syscall.EINVAL)}
		}
		// RoCE has no path query: the route is the address's.
		x.state = cmRouteResolved
		ss.cmQueue(x, &abi.CMEvent{ID: x.id, Context: x.ctx, Event: abi.CMEventRouteResolved, Src: sockAddr(x.src), Dst: sockAddr(x.dst)})
		return &abi.ErrnoReply{}
	case abi.OpCMListen:
		return &abi.ErrnoReply{Errno: abi.ErrnoOf(ss.cmListen(x, int(arg)))}
	case abi.OpCMDisconnect:
		if x.state != cmConn {
			return &abi.ErrnoReply{Errno: abi.Errno(syscall.EINVAL)}
		}
		return &abi.ErrnoReply{Errno: abi.ErrnoOf(cmErr(x.dev.CM.Disconnect(x.conn, nil)))}
	case abi.OpCMEstablish:
		if x.state != cmConn {
			return &abi.ErrnoReply{Errno: abi.Errno(syscall.EINVAL)}
		}
		return &abi.ErrnoReply{Errno: abi.ErrnoOf(cmErr(x.dev.CM.Establish(x.conn, nil)))}
	case abi.OpCMInitQPAttr:
		return ss.cmInitQPAttr(x, uint8(arg))
	case abi.OpCMNotify:
		return &abi.ErrnoReply{Errno: abi.ErrnoOf(ss.cmNotify(x, arg))}
	}
	return &abi.ErrnoReply{Errno: abi.Errno(syscall.EINVAL)}
}

// cmNotify is rdma_notify on x, as Linux's rdma_notify and ib_cm_notify
// answer it: an ID without a connection is EINVAL; IBV_EVENT_COMM_EST
// establishes a connection still waiting for its RTU (EISCONN when it is
// established already), IBV_EVENT_LID_CHANGE is taken and ignored, any
// other event is EINVAL. The appliance's transport tells the CM of a QP's
// first request itself (appliance.NIC), so a program that never calls
// rdma_notify loses nothing.
func (ss *session) cmNotify(x *cmID, event uint32) error {
	if x.state != cmConn {
		return errno(syscall.EINVAL, "notify in state %d", x.state)
	}
	switch event {
	case abi.EventCommEst:
		return cmErr(x.dev.CM.Notify(x.conn))
	case abi.EventLIDChange:
		return nil
	}
	return errno(syscall.EINVAL, "notify of event %d", event)
}

// cmListen makes x listen (rdma_listen) on its device, or on every device
// of the namespace when it is bound to no address.
func (ss *session) cmListen(x *cmID, backlog int) error {
	if x.state == cmIdle {
		x.src, x.state = netip.AddrPortFrom(netip.IPv6Unspecified(), 0), cmBound
	}
	if x.state != cmBound {
		return errno(syscall.EINVAL, "listen in state %d", x.state)
	}
	if x.src.Port() == 0 {
		x.src = netip.AddrPortFrom(x.src.Addr(), ss.srv.ephemeralPort())
	}
	devs := []*Device{x.dev}
	if x.dev == nil {
		devs = ss.cmDevices()
	}
	x.listeners = map[*Device]cm.ID{}
	for _, d := range devs {
		lid, err := d.CM.Listen(ss.cm.owner, cm.ListenParams{Addr: listenAddr(x.src.Addr()), Port: x.src.Port(), PortSpace: x.ps, QPType: x.qpType, Backlog: backlog})
		if err != nil {
			ss.cmUnlisten(x)
			return cmErr(err)
		}
		x.listeners[d] = lid
		ss.cm.byCM[cmKey{d, lid}] = x
	}
	x.state, x.backlog = cmListen, backlog
	return nil
}

func (ss *session) cmUnlisten(x *cmID) {
	for d, lid := range x.listeners {
		_ = d.CM.Destroy(lid)
		delete(ss.cm.byCM, cmKey{d, lid})
	}
	x.listeners = nil
}

// cmConnOp serves connect, accept and reject.
func (ss *session) cmConnOp(op abi.Op, x *cmID, p *abi.CMConnParam) error {
	private := p.PrivateData[:p.PrivateDataLen]
	d := x.dev
	switch op {
	case abi.OpCMConnect:
		if x.state != cmRouteResolved {
			return errno(syscall.EINVAL, "connect in state %d", x.state)
		}
		local := x.src
		var (
			id  cm.ID
			err error
		)
		if x.qpType == cm.QPTypeUD {
			id, err = d.CM.Resolve(ss.cm.owner, cm.ResolveParams{Local: local, Remote: x.dst, PortSpace: x.ps, PrivateData: private})
		} else {
			id, err = d.CM.Connect(ss.cm.owner, cm.ConnectParams{Local: local, Remote: x.dst, PortSpace: x.ps, QPType: x.qpType,
				QPN: p.QPN, StartingPSN: x.psn, ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
				RetryCount: p.RetryCount, RNRRetryCount: p.RNRRetryCount, PathMTU: uint8(pathMTU(d)), SRQ: p.SRQ != 0,
				FlowControl: p.FlowControl != 0, PrivateData: private})
		}
		if err != nil {
			return cmErr(err)
		}
		x.conn, x.state = id, cmConn
		ss.cm.byCM[cmKey{d, id}] = x
		if info, err := d.CM.Info(id); err == nil {
			x.src = info.Local
		}
		return nil
	case abi.OpCMAccept:
		if x.state != cmConn {
			return errno(syscall.EINVAL, "accept in state %d", x.state)
		}
		return cmErr(d.CM.Accept(x.conn, cm.AcceptParams{QPN: p.QPN, StartingPSN: x.psn, ResponderResources: p.ResponderResources,
			InitiatorDepth: p.InitiatorDepth, RNRRetryCount: p.RNRRetryCount, SRQ: p.SRQ != 0, FlowControl: p.FlowControl != 0,
			QKey: p.QKey, PrivateData: private}))
	case abi.OpCMReject:
		if x.state != cmConn {
			return errno(syscall.EINVAL, "reject in state %d", x.state)
		}
		return cmErr(d.CM.Reject(x.conn, private))
	}
	return errno(syscall.EINVAL, "%v", op)
}

// pathMTU is the largest path MTU d's link carries (its active MTU).
func pathMTU(d *Device) abi.MTU {
	return abi.MTUForNetdev(d.MTU)
}

// cmQuery answers rdma_query_route's questions about x.
func (ss *session) cmQuery(x *cmID) *abi.CMQueryReply {
	r := &abi.CMQueryReply{Port: 1, PKey: 0xffff, HopLimit: cm.DefaultHopLimit, Src: sockAddr(x.src), Dst: sockAddr(x.dst)}
	if x.dev == nil {
		return r
	}
	r.Device = abi.MakeName(x.dev.Name)
	r.PathMTU = uint8(pathMTU(x.dev))
	if x.src.IsValid() {
		r.SGID = x.src.Addr().As16()
		i, _ := gidIndex(x.dev, x.src.Addr())
		r.SGIDIndex = uint32(i)
	}
	if x.dst.IsValid() {
		r.DGID = x.dst.Addr().As16()
	}
	if x.state == cmConn {
		if info, err := x.dev.CM.Info(x.conn); err == nil {
			r.FlowLabel, r.HopLimit, r.TClass = info.FlowLabel, info.HopLimit, info.TrafficClass
			r.PathMTU = info.PathMTU
		}
	}
	return r
}

// cmInitQPAttr answers rdma_init_qp_attr: the attributes that take the
// ID's QP to state, as the kernel's cma_init_qp_attr gives them.
func (ss *session) cmInitQPAttr(x *cmID, state uint8) *abi.CMInitQPAttrReply {
	if x.dev == nil {
		return &abi.CMInitQPAttrReply{Errno: abi.Errno(syscall.EINVAL)}
	}
	r := &abi.CMInitQPAttrReply{}
	a := &r.Attr
	a.State, a.Port = state, 1
	switch abi.QPState(state) {
	case abi.QPSInit:
		r.Mask = uint32(abi.QPStateMask | abi.QPPKeyIndex | abi.QPPort)
		if x.qpType == cm.QPTypeUD {
			a.QKey = cm.DefaultUDPQKey
			r.Mask |= uint32(abi.QPQKey)
			return r
		}
		a.Access = uint32(abi.AccessRemoteWrite)
		r.Mask |= uint32(abi.QPAccessFlags)
		if x.state == cmConn {
			if info, err := x.dev.CM.Info(x.conn); err == nil && info.ResponderResources > 0 {
				a.Access |= uint32(abi.AccessRemoteRead | abi.AccessRemoteAtomic)
			}
		}
		return r
	case abi.QPSRTR, abi.QPSRTS:
		if x.qpType == cm.QPTypeUD {
			r.Mask = uint32(abi.QPStateMask)
			if abi.QPState(state) == abi.QPSRTS {
				r.Mask |= uint32(abi.QPSQPSN)
			}
			return r
		}
		if x.state != cmConn {
			return &abi.CMInitQPAttrReply{Errno: abi.Errno(syscall.EINVAL)}
		}
		info, err := x.dev.CM.Info(x.conn)
		if err != nil {
			return &abi.CMInitQPAttrReply{Errno: abi.ErrnoOf(cmErr(err))}
		}
		if abi.QPState(state) == abi.QPSRTR {
			r.Mask = uint32(abi.QPStateMask | abi.QPAV | abi.QPPathMTU | abi.QPDestQPN | abi.QPRQPSN)
			// The receive PSN is the ID's own starting PSN, chosen when
			// it was made, as cma's rdma_init_qp_attr gives seq_num: the
			// passive side asks for it before it accepts.
			a.PathMTU, a.DestQPN, a.RQPSN = info.PathMTU, info.RemoteQPN, uint32(x.psn)
			a.DGID = info.Remote.Addr().As16()
			a.HopLimit, a.TClass, a.FlowLabel = info.HopLimit, info.TrafficClass, info.FlowLabel
			i, _ := gidIndex(x.dev, info.Local.Addr())
			a.SGIDIndex = uint8(i)
			if x.qpType == cm.QPTypeRC {
				r.Mask |= uint32(abi.QPMaxDestRdAtomic | abi.QPMinRNRTimer)
				a.MaxDestRdAtomic, a.MinRNRTimer = info.ResponderResources, cmMinRNRTimer
			}
			return r
		}
		r.Mask = uint32(abi.QPStateMask | abi.QPSQPSN)
		a.SQPSN = uint32(info.SQPSN)
		if x.qpType == cm.QPTypeRC {
			r.Mask |= uint32(abi.QPTimeout | abi.QPRetryCnt | abi.QPRNRRetry | abi.QPMaxQPRdAtomic)
			a.Timeout, a.RetryCnt, a.RNRRetry, a.MaxRdAtomic = info.AckTimeout, info.RetryCount, info.RNRRetryCount, info.InitiatorDepth
		}
		return r
	}
	return &abi.CMInitQPAttrReply{Errno: abi.Errno(syscall.EINVAL)}
}

// cmMinRNRTimer is the RTR's min_rnr_timer Linux's CM gives an RC QP
// (cm_init_qp_rtr_attr): code 0, 655.36 ms.
const cmMinRNRTimer = 0

// cmDestroy ends x: its listeners, its connection (a DREQ or REJ goes to
// the peer as the manager decides), its queued events stay queued.
func (ss *session) cmDestroy(x *cmID) {
	ss.cmUnlisten(x)
	if x.state == cmConn && x.dev != nil {
		_ = x.dev.CM.Destroy(x.conn)
		delete(ss.cm.byCM, cmKey{x.dev, x.conn})
	}
	x.state = cmDestroying
	delete(ss.cm.ids, x.id)
}

// cmTeardown ends every ID of a session that goes; ss.cmMu is not held.
func (ss *session) cmTeardown() {
	ss.cmMu.Lock()
	defer ss.cmMu.Unlock()
	if ss.cm.ids == nil {
		return
	}
	ss.srv.owners.Delete(ss.cm.owner)
	for _, d := range ss.srv.Devices() {
		if d.CM != nil {
			d.CM.CloseOwner(ss.cm.owner)
		}
	}
	clear(ss.cm.ids)
	clear(ss.cm.byCM)
}

// cmMigrate moves the ID id of the event channel whose event socket the
// client sent (fd, the client's end) to ss (rdma_migrate_id, ucma's
// MIGRATE_ID): its handle changes to one of ss, its connection and
// listeners, their events and its queued events go with it, and the
// reply says how many events the old channel reported for it. The old
// channel must be one of this client's: a session of the same user and
// network namespace.
func (ss *session) cmMigrate(fd int, id uint32) *abi.CMMigrateReply {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return &abi.CMMigrateReply{Errno: abi.Errno(syscall.EBADF)}
	}
	from := ss.srv.sessionByEventSocket(st.Ino)
	if from == nil || from.uid != ss.uid || from.netns != ss.netns {
		return &abi.CMMigrateReply{Errno: abi.Errno(syscall.EINVAL)}
	}
	if from == ss {
		ss.cmMu.Lock()
		defer ss.cmMu.Unlock()
		x := ss.cm.ids[id]
		if x == nil {
			return &abi.CMMigrateReply{Errno: abi.Errno(syscall.EINVAL)}
		}
		return &abi.CMMigrateReply{ID: x.id, EventsReported: x.events}
	}
	ss.srv.migrateMu.Lock()
	defer ss.srv.migrateMu.Unlock()
	from.cmMu.Lock()
	defer from.cmMu.Unlock()
	ss.cmMu.Lock()
	defer ss.cmMu.Unlock()
	x := from.cm.ids[id]
	if x == nil {
		return &abi.CMMigrateReply{Errno: abi.Errno(syscall.EINVAL)}
	}
	ss.cmInit()
	if len(ss.cm.ids) >= maxCMIDs {
		return &abi.CMMigrateReply{Errno: abi.Errno(syscall.ENOMEM)}
	}
	move := func(d *Device, cid cm.ID) {
		k := cmKey{d, cid}
		delete(from.cm.byCM, k)
		ss.cm.byCM[k] = x
		_ = d.CM.SetOwner(cid, ss.cm.owner)
	}
	if x.state == cmConn && x.dev != nil {
		move(x.dev, x.conn)
	}
	for d, lid := range x.listeners {
		move(d, lid)
	}
	delete(from.cm.ids, x.id)
	ss.cm.next++
	x.id = ss.cm.next
	ss.cm.ids[x.id] = x
	x.home.Store(ss)
	return &abi.CMMigrateReply{ID: x.id, EventsReported: x.events}
}
