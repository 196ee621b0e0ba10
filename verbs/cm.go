package verbs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/taproce/taproce/verbs/abi"
)

// The RDMA CM client: what librdmacm asks of the kernel's ucma, asked of
// the appliance over its CM ops (verbs/abi/cm.go), as the C library
// verbs/librdmacm does. An event channel (rdma_event_channel) is a control
// connection of its own; the IDs made on it live in its session, and go
// with it (the appliance then ends their connections, as the kernel ends
// those of a process holding CM IDs). The channel's events come on the
// connection in the order they happened; each goes to its ID's queue, a
// connect request to its listener's.

// ErrRejected is wrapped by the error of a connection the peer's CM
// refused with a REJ (RDMA_CM_EVENT_REJECTED); RejectedError says why.
var ErrRejected = errors.New("verbs: connection rejected")

// Reject reasons of a REJ (IBA vol. 1 table 109) that a connection through
// the RDMA CM meets most.
const (
	// RejectTimeout: the peer's CM gave up waiting (an unanswered REQ
	// destroyed, IBA 12.6.7.2 reason 4).
	RejectTimeout = 4
	// RejectInvalidServiceID: nobody listens on the port (reason 8);
	// Linux's CM answers a REQ for a service nobody listens on with it
	// at once, and so does the appliance's.
	RejectInvalidServiceID = 8
	// RejectConsumer: the peer's application refused the request
	// (rdma_reject, reason 28).
	RejectConsumer = 28
)

// RejectedError is the error of a connection request the peer refused.
// It wraps ErrRejected and syscall.ECONNREFUSED (the errno librdmacm's
// synchronous rdma_connect fails with then).
type RejectedError struct {
	// Reason is the REJ's reject reason (IBA vol. 1 12.6.7.2, table 109):
	// RejectInvalidServiceID when nobody listens on the port.
	Reason int
	// PrivateData is what the peer put in its REJ.
	PrivateData []byte
}

func (e *RejectedError) Error() string {
	what := ""
	switch e.Reason {
	case RejectTimeout:
		what = " (timeout)"
	case RejectInvalidServiceID:
		what = " (invalid service ID: nobody listens on the port)"
	case RejectConsumer:
		what = " (by the peer's application)"
	}
	return fmt.Sprintf("verbs: connection rejected with reason %d%s", e.Reason, what)
}

func (e *RejectedError) Unwrap() []error { return []error{ErrRejected, syscall.ECONNREFUSED} }

// ErrUnreachable is wrapped by the error of a connection whose peer did
// not answer its CM (RDMA_CM_EVENT_UNREACHABLE: the REQ's retries ran
// out), or whose address or route did not resolve.
var ErrUnreachable = errors.New("verbs: peer unreachable")

// cmEventNames are rdma_event_str's names, for errors.
var cmEventNames = [...]string{"ADDR_RESOLVED", "ADDR_ERROR", "ROUTE_RESOLVED", "ROUTE_ERROR", "CONNECT_REQUEST",
	"CONNECT_RESPONSE", "CONNECT_ERROR", "UNREACHABLE", "REJECTED", "ESTABLISHED", "DISCONNECTED", "DEVICE_REMOVAL",
	"MULTICAST_JOIN", "MULTICAST_ERROR", "ADDR_CHANGE", "TIMEWAIT_EXIT"}

func cmEventName(t uint32) string {
	if int(t) < len(cmEventNames) {
		return "RDMA_CM_EVENT_" + cmEventNames[t]
	}
	return fmt.Sprintf("RDMA CM event %d", t)
}

// cmEventErr is the error of an event that ends a connection attempt.
func cmEventErr(ev *abi.CMEvent) error {
	switch ev.Event {
	case abi.CMEventRejected:
		n := min(int(ev.Param.PrivateDataLen), len(ev.Param.PrivateData))
		return &RejectedError{Reason: int(ev.Status), PrivateData: append([]byte(nil), ev.Param.PrivateData[:n]...)}
	case abi.CMEventAddrError, abi.CMEventRouteError, abi.CMEventUnreachable:
		if ev.Status < 0 {
			return fmt.Errorf("verbs: %s: %w (%w)", cmEventName(ev.Event), ErrUnreachable, syscall.Errno(-ev.Status))
		}
		return fmt.Errorf("verbs: %s, status %d: %w", cmEventName(ev.Event), ev.Status, ErrUnreachable)
	}
	if ev.Status < 0 {
		return fmt.Errorf("verbs: %s: %w", cmEventName(ev.Event), syscall.Errno(-ev.Status))
	}
	return fmt.Errorf("verbs: unexpected %s, status %d: %w", cmEventName(ev.Event), ev.Status, syscall.EPROTO)
}

// cmChannel is an event channel: a control connection whose session holds
// IDs. It is shared by reference (a listener and the connections it
// accepted, whose IDs live in its session): the last release closes it.
type cmChannel struct {
	cn *conn
	// reaps are the destroys of requests nobody will take, in flight.
	reaps sync.WaitGroup

	mu   sync.Mutex
	ids  map[uint32]*cmID
	refs int
}

// cmID is an ID (rdma_cm_id) of a channel, with its queue of events.
type cmID struct {
	ch     *cmChannel
	handle uint32
	ready  chan struct{} // signalled when an event is queued

	// Guarded by ch.mu.
	queue []abi.CMEvent
	// closed: a listener going away; the requests that come for it are
	// destroyed (the peer gets a REJ) instead of queued.
	closed bool
}

// newCMChannel opens an event channel (rdma_create_event_channel).
func newCMChannel(ctx context.Context) (*cmChannel, error) {
	ch := &cmChannel{ids: map[uint32]*cmID{}, refs: 1}
	cn, err := dialWith(ctx, ch.deliver)
	if err != nil {
		return nil, err
	}
	ch.cn = cn
	return ch, nil
}

// acquire takes a reference, false once the channel is closed.
func (ch *cmChannel) acquire() bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.refs == 0 {
		return false
	}
	ch.refs++
	return true
}

// release drops a reference; the last closes the channel: the appliance
// ends the IDs still in it, and the destroys under way end.
func (ch *cmChannel) release() {
	ch.mu.Lock()
	ch.refs--
	last := ch.refs == 0
	ch.mu.Unlock()
	if !last {
		return
	}
	_ = ch.cn.close()
	<-ch.cn.done
	ch.reaps.Wait()
}

// deliver queues an event for its ID; it runs on the connection's reader.
// A connect request makes its new ID here, before the ID's later events
// can come; one for a listener that is gone or going is destroyed.
func (ch *cmChannel) deliver(ev *abi.CMEvent) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ev.Event == abi.CMEventConnectRequest {
		if _, dup := ch.ids[ev.ID]; dup {
			return // an ID the channel has already: not a new request
		}
		l := ch.ids[ev.Listener]
		if l == nil || l.closed {
			ch.reaps.Add(1)
			go ch.reap(ev.ID)
			return
		}
		ch.ids[ev.ID] = &cmID{ch: ch, handle: ev.ID, ready: make(chan struct{}, 1)}
		l.pushLocked(ev)
		return
	}
	if x := ch.ids[ev.ID]; x != nil {
		x.pushLocked(ev)
	}
}

// reap destroys the ID of a request nobody takes: its peer gets a REJ.
func (ch *cmChannel) reap(handle uint32) {
	defer ch.reaps.Done()
	ctx, cancel := context.WithTimeout(context.Background(), cmCleanupTimeout)
	defer cancel()
	var r abi.CMDestroyReply
	_, _ = ch.cn.call(ctx, abi.OpCMDestroyID, &abi.CMIDRequest{ID: handle}, &r)
}

func (x *cmID) pushLocked(ev *abi.CMEvent) {
	x.queue = append(x.queue, *ev)
	select {
	case x.ready <- struct{}{}:
	default:
	}
}

// cmCleanupTimeout bounds what is undone after a failure or cancellation,
// when the caller's context may have ended already.
const cmCleanupTimeout = 5 * time.Second

// cmResolveTimeout is rdma_resolve_addr's and rdma_resolve_route's, as
// rdma_getaddrinfo's users (rdma_create_ep) give them: 2 s.
const cmResolveTimeout = 2000

// createID makes an ID (rdma_create_id) for the TCP port space's RC
// connections (RDMA_PS_TCP), the only kind this library makes.
func (ch *cmChannel) createID(ctx context.Context) (*cmID, error) {
	var r abi.CMIDReply
	if _, err := ch.cn.call(ctx, abi.OpCMCreateID, &abi.CMCreateIDRequest{PortSpace: abi.CMPortSpaceTCP, QPType: uint8(RC)}, &r); err != nil {
		return nil, err
	}
	if err := errnoOf(abi.OpCMCreateID, r.Errno); err != nil {
		return nil, err
	}
	x := &cmID{ch: ch, handle: r.ID, ready: make(chan struct{}, 1)}
	ch.mu.Lock()
	ch.ids[r.ID] = x
	ch.mu.Unlock()
	return x, nil
}

// id returns the channel's ID of that handle, nil if it has none.
func (ch *cmChannel) id(handle uint32) *cmID {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.ids[handle]
}

// op calls an op that answers with an errno.
func (x *cmID) op(ctx context.Context, op abi.Op, req any) error {
	var r abi.ErrnoReply
	if _, err := x.ch.cn.call(ctx, op, req, &r); err != nil {
		return err
	}
	return errnoOf(op, r.Errno)
}

func (x *cmID) arg(ctx context.Context, op abi.Op, arg uint32) error {
	return x.op(ctx, op, &abi.CMIDRequest{ID: x.handle, Arg: arg})
}

// next waits for the ID's next event. It fails when ctx ends, with
// ErrClosed when stop is closed, and with the channel's end when the
// appliance is gone.
func (x *cmID) next(ctx context.Context, stop <-chan struct{}) (abi.CMEvent, error) {
	for {
		x.ch.mu.Lock()
		if len(x.queue) > 0 {
			ev := x.queue[0]
			x.queue = x.queue[1:]
			if len(x.queue) > 0 {
				// Another waiter (concurrent Accepts) takes the next.
				select {
				case x.ready <- struct{}{}:
				default:
				}
			}
			x.ch.mu.Unlock()
			return ev, nil
		}
		x.ch.mu.Unlock()
		select {
		case <-x.ready:
		case <-ctx.Done():
			return abi.CMEvent{}, ctx.Err()
		case <-stop:
			return abi.CMEvent{}, ErrClosed
		case <-x.ch.cn.done:
			select {
			case <-x.ready: // one delivered before the end
				continue
			default:
			}
			return abi.CMEvent{}, x.ch.cn.ended()
		}
	}
}

// await waits for an event of type want; another ends the wait with the
// error it stands for (cmEventErr).
func (x *cmID) await(ctx context.Context, want uint32) (abi.CMEvent, error) {
	ev, err := x.next(ctx, nil)
	if err != nil {
		return ev, err
	}
	if ev.Event != want || ev.Status != 0 {
		return ev, cmEventErr(&ev)
	}
	return ev, nil
}

// bind binds the ID to a local address (rdma_bind_addr).
func (x *cmID) bind(ctx context.Context, src netip.AddrPort) error {
	return x.op(ctx, abi.OpCMBind, &abi.CMAddrRequest{ID: x.handle, Src: sockAddrOf(src)})
}

// resolve resolves dst's address and route (rdma_resolve_addr and
// rdma_resolve_route, each followed by its event, as rdma_create_ep's
// synchronous ID does): the ID then has a device and a source address.
func (x *cmID) resolve(ctx context.Context, dst netip.AddrPort) error {
	if err := x.op(ctx, abi.OpCMResolveAddr, &abi.CMAddrRequest{ID: x.handle, TimeoutMs: cmResolveTimeout, Dst: sockAddrOf(dst)}); err != nil {
		return err
	}
	if _, err := x.await(ctx, abi.CMEventAddrResolved); err != nil {
		return err
	}
	if err := x.arg(ctx, abi.OpCMResolveRoute, cmResolveTimeout); err != nil {
		return err
	}
	_, err := x.await(ctx, abi.CMEventRouteResolved)
	return err
}

// query returns the ID's addresses, device and path (rdma_query_route).
func (x *cmID) query(ctx context.Context) (*abi.CMQueryReply, error) {
	var r abi.CMQueryReply
	if _, err := x.ch.cn.call(ctx, abi.OpCMQuery, &abi.CMIDRequest{ID: x.handle}, &r); err != nil {
		return nil, err
	}
	if err := errnoOf(abi.OpCMQuery, r.Errno); err != nil {
		return nil, err
	}
	return &r, nil
}

// connect sends the REQ (rdma_connect); accept the REP (rdma_accept);
// reject a REJ (rdma_reject, reason 28).
func (x *cmID) connect(ctx context.Context, p *abi.CMConnParam) error {
	return x.op(ctx, abi.OpCMConnect, &abi.CMConnectRequest{ID: x.handle, Param: *p})
}

func (x *cmID) accept(ctx context.Context, p *abi.CMConnParam) error {
	return x.op(ctx, abi.OpCMAccept, &abi.CMConnectRequest{ID: x.handle, Param: *p})
}

func (x *cmID) reject(ctx context.Context) error {
	return x.op(ctx, abi.OpCMReject, &abi.CMConnectRequest{ID: x.handle})
}

// destroy destroys the ID (rdma_destroy_id): the appliance sends the peer
// what the connection's state owes it (a REJ, a DREQ, the DREP a DREQ
// waits for). The ID's queued events go with it.
func (x *cmID) destroy(ctx context.Context) error {
	var r abi.CMDestroyReply
	_, err := x.ch.cn.call(ctx, abi.OpCMDestroyID, &abi.CMIDRequest{ID: x.handle}, &r)
	if err == nil {
		err = errnoOf(abi.OpCMDestroyID, r.Errno)
	}
	x.ch.mu.Lock()
	if x.ch.ids[x.handle] == x {
		delete(x.ch.ids, x.handle)
	}
	x.queue = nil
	x.ch.mu.Unlock()
	return err
}

// modifyQP moves qp to state with the attributes the appliance's
// rdma_init_qp_attr gives the ID; depth, when not negative, caps an RTS's
// max_rd_atomic (the initiator depth the connection agreed on), as
// librdmacm's ucma_modify_qp_rts does.
func (x *cmID) modifyQP(ctx context.Context, qp *QP, state QPState, depth int) error {
	var r abi.CMInitQPAttrReply
	if _, err := x.ch.cn.call(ctx, abi.OpCMInitQPAttr, &abi.CMIDRequest{ID: x.handle, Arg: uint32(state)}, &r); err != nil {
		return err
	}
	if err := errnoOf(abi.OpCMInitQPAttr, r.Errno); err != nil {
		return fmt.Errorf("verbs: QP attributes for %v: %w", state, err)
	}
	a := &r.Attr
	if QPState(a.State) != state {
		return fmt.Errorf("verbs: QP attributes for %v came for %v: %w", state, QPState(a.State), syscall.EPROTO)
	}
	mask := AttrMask(r.Mask)
	attr := QPAttr{State: state, PathMTU: MTU(a.PathMTU), Access: Access(a.Access), PKeyIndex: a.PKeyIndex, Port: a.Port,
		QKey: a.QKey, DestQPN: a.DestQPN, RQPSN: a.RQPSN, SQPSN: a.SQPSN, Timeout: a.Timeout, RetryCnt: a.RetryCnt,
		RNRRetry: a.RNRRetry, MinRNRTimer: a.MinRNRTimer, MaxRdAtomic: a.MaxRdAtomic, MaxDestRdAtomic: a.MaxDestRdAtomic,
		AH: AHAttr{DGID: netip.AddrFrom16(a.DGID).Unmap(), SGIDIndex: a.SGIDIndex, FlowLabel: a.FlowLabel,
			HopLimit: a.HopLimit, TClass: a.TClass, Port: a.Port}}
	if depth >= 0 && mask&QPMaxQPRdAtomic != 0 && int(attr.MaxRdAtomic) > depth {
		attr.MaxRdAtomic = uint8(depth)
	}
	if err := qp.Modify(ctx, &attr, mask); err != nil {
		return fmt.Errorf("verbs: QP to %v: %w", state, err)
	}
	return nil
}

// sockAddrOf is a's SockAddr: AF_INET for an IPv4 address (as
// struct sockaddr_in), AF_INET6 else.
func sockAddrOf(a netip.AddrPort) abi.SockAddr {
	if !a.IsValid() {
		return abi.SockAddr{}
	}
	s := abi.SockAddr{Family: abi.AFInet6, Port: a.Port(), Addr: a.Addr().As16()}
	if a.Addr().Unmap().Is4() {
		s.Family = abi.AFInet
		s.Addr = a.Addr().Unmap().As16()
	}
	return s
}

// addrPortOf is s's address; the zero AddrPort for a family it does not
// know.
func addrPortOf(s abi.SockAddr) netip.AddrPort {
	switch s.Family {
	case abi.AFInet:
		return netip.AddrPortFrom(netip.AddrFrom16(s.Addr).Unmap(), s.Port)
	case abi.AFInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(s.Addr), s.Port)
	}
	return netip.AddrPort{}
}

// cmAddr is the address of a connection or listener through the RDMA CM:
// an IP address and a port of the RDMA CM's TCP port space (RDMA_PS_TCP),
// which is not the kernel's TCP.
type cmAddr netip.AddrPort

// Network is "rdma_cm", Listen's network for the RDMA CM.
func (a cmAddr) Network() string { return NetworkRDMACM }

func (a cmAddr) String() string { return netip.AddrPort(a).String() }
