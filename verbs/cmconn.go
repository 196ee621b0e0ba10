package verbs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/taproce/taproce/verbs/abi"
)

// Connections through the RDMA CM
//
// Dial with WithRDMACM and Listen with network "rdma_cm" connect as
// librdmacm's programs do, so that either side may be an rdma_cm program:
// the active side resolves the peer's address and route, makes its QP and
// takes it to INIT with the attributes the CM gives (rdma_init_qp_attr),
// posts its receives and sends the REQ; on the REP it moves the QP to RTR
// and RTS and sends the RTU (librdmacm's ucma_process_conn_resp). The
// passive side takes a connect request, makes its QP, takes it to RTR and
// RTS before it sends the REP (librdmacm's rdma_accept) and waits for
// ESTABLISHED. A DREQ from the peer (its rdma_disconnect, or its process's
// end) is RDMA_CM_EVENT_DISCONNECTED: the DREP goes back at once, and the
// connection is closed by the peer (ErrPeerClosed) once what came before
// has been received. The messages are the application's bytes alone.

// NetworkRDMACM is Listen's network for connections through the RDMA CM.
const NetworkRDMACM = "rdma_cm"

// WithRDMACM makes Dial connect through the RDMA CM (see Dial). WithDevice,
// WithGIDIndex and WithHopLimit do not apply there, nor to a Listener of
// network "rdma_cm": the route to the peer's address picks the device and
// the source GID, as it does for rdma_resolve_addr, and the CM gives the
// path's attributes (rdma_init_qp_attr). WithQueueDepth, WithRecvDepth
// (the receives posted) and WithMaxMessage (their size) apply as over TCP.
func WithRDMACM() ConnOption { return func(c *connConfig) { c.cm = true } }

// errRawMR: the region messages of SendMR and ReceiveMR need the header
// that connections through the CM do not have.
var errRawMR = fmt.Errorf("a connection through the RDMA CM carries the application's messages alone, with no header for regions: %w", errors.ErrUnsupported)

// librdmacm's retry counts when rdma_connect and rdma_accept get no
// parameters (ucma_copy_conn_param_to_kern): 7 and 7, RNR retries for
// ever.
const (
	cmRetryCount    = 7
	cmRNRRetryCount = 7
)

// cmConnState is what a connection through the CM has of it: its ID, on
// a channel of which it holds a reference, and its addresses.
type cmConnState struct {
	ch            *cmChannel
	id            *cmID
	local, remote cmAddr
}

// close is rdma_disconnect and rdma_destroy_id for a connection that
// closes: its QP to the error state, the DREQ (or the DREP the peer's
// DREQ waits for; EINVAL once that exchange is over, which is ignored),
// the ID destroyed, the channel released.
func (s *cmConnState) close(qp *QP, vc *Context) error {
	ctx, cancel := context.WithTimeout(context.Background(), cmCleanupTimeout)
	defer cancel()
	if vc.gone() == nil {
		_ = qp.Modify(ctx, &QPAttr{State: QPSErr}, QPStateMask)
	}
	_ = s.id.arg(ctx, abi.OpCMDisconnect, 0)
	err := s.id.destroy(ctx)
	s.ch.release()
	if err != nil && !errors.Is(err, ErrDeviceGone) {
		return fmt.Errorf("verbs: destroy the connection's CM ID: %w", err)
	}
	return nil
}

// retries returns the retry counts the connection asks for.
func (cfg *connConfig) cmRetries() (retry, rnr uint8) {
	if cfg.retrySet {
		return cfg.retryCnt, cfg.rnrRetry
	}
	return cmRetryCount, cmRNRRetryCount
}

// cmAddrOf resolves addr ("host:port"); passive allows an empty host,
// which is 0.0.0.0, and port 0.
func cmAddrOf(ctx context.Context, addr string, passive bool) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("verbs: address %q: %w", addr, err)
	}
	p, err := net.DefaultResolver.LookupPort(ctx, "tcp", port)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("verbs: address %q: %w", addr, err)
	}
	if p == 0 && !passive {
		return netip.AddrPort{}, fmt.Errorf("verbs: address %q: no port: %w", addr, syscall.EINVAL)
	}
	var ip netip.Addr
	switch {
	case host == "" && passive:
		ip = netip.IPv4Unspecified()
	case host == "":
		return netip.AddrPort{}, fmt.Errorf("verbs: address %q: no host: %w", addr, syscall.EINVAL)
	default:
		if ip, err = netip.ParseAddr(host); err != nil {
			ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
			if err != nil {
				return netip.AddrPort{}, fmt.Errorf("verbs: address %q: %w", addr, err)
			}
			if len(ips) == 0 {
				return netip.AddrPort{}, fmt.Errorf("verbs: address %q: no IP address: %w", addr, syscall.EADDRNOTAVAIL)
			}
			ip = ips[0]
			for _, a := range ips {
				if a.Unmap().Is4() {
					ip = a
					break
				}
			}
		}
	}
	return netip.AddrPortFrom(ip.Unmap().WithZone(""), uint16(p)), nil
}

// newCMConn is a Conn through the CM on ID x of ch, before its objects
// are made.
func newCMConn(cfg connConfig, ch *cmChannel, x *cmID) *Conn {
	c := newConnState(cfg)
	c.hdr = 0
	c.maxMsg = cfg.maxMessage
	c.cm = &cmConnState{ch: ch, id: x}
	return c
}

// undo ends a connection whose setup failed: the ID is rejected (when it
// is a request, or a REP came) and destroyed, the objects torn down. The
// channel reference stays the caller's.
func (c *Conn) undo(rejectIt bool) {
	ctx, cancel := context.WithTimeout(context.Background(), cmCleanupTimeout)
	defer cancel()
	if rejectIt {
		_ = c.cm.id.reject(ctx)
	}
	_ = c.cm.id.destroy(ctx)
	_ = c.teardown()
}

// cmObjects makes the connection's objects on the ID's device, the QP in
// INIT with the CM's attributes and every receive posted (before the
// REQ or REP, as rdma_cm programs post theirs).
func (c *Conn) cmObjects(ctx context.Context) error {
	q, err := c.cm.id.query(ctx)
	if err != nil {
		return err
	}
	if q.Device.String() == "" {
		return fmt.Errorf("verbs: the CM ID has no device: %w", syscall.ENODEV)
	}
	if err := c.setup(ctx, q.Device.String()); err != nil {
		return err
	}
	if err := c.cm.id.modifyQP(ctx, c.qp, QPSInit, -1); err != nil {
		return err
	}
	return c.postReceives()
}

// cmReady takes the QP to RTR and RTS as librdmacm does once the peer's
// resources are known: INIT again first, for the access they allow
// (ucma_modify_qp_rtr), then RTR, then RTS with depth (negative: the CM's)
// as its max_rd_atomic.
func (c *Conn) cmReady(ctx context.Context, depth int) error {
	x := c.cm.id
	if err := x.modifyQP(ctx, c.qp, QPSInit, -1); err != nil {
		return err
	}
	if err := x.modifyQP(ctx, c.qp, QPSRTR, -1); err != nil {
		return err
	}
	return x.modifyQP(ctx, c.qp, QPSRTS, depth)
}

// cmEstablished records the connection's path MTU and addresses and
// starts its goroutines.
func (c *Conn) cmEstablished(ctx context.Context) error {
	q, err := c.cm.id.query(ctx)
	if err != nil {
		return err
	}
	if m := MTU(q.PathMTU); m.Bytes() != 0 {
		c.mtu = min(c.mtu, m)
	}
	c.cm.local, c.cm.remote = cmAddr(addrPortOf(q.Src)), cmAddr(addrPortOf(q.Dst))
	c.start(c.cmWatch)
	return nil
}

// dialCM connects to dst through the CM on a channel of the connection's
// own.
func dialCM(ctx context.Context, addr string, cfg connConfig) (*Conn, error) {
	dst, err := cmAddrOf(ctx, addr, false)
	if err != nil {
		return nil, err
	}
	ch, err := newCMChannel(ctx)
	if err != nil {
		return nil, fmt.Errorf("verbs: dial %s through the RDMA CM: %w", addr, err)
	}
	c, err := connectCM(ctx, ch, dst, cfg)
	if err != nil {
		ch.release()
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return nil, fmt.Errorf("verbs: dial %s through the RDMA CM: %w", addr, err)
	}
	return c, nil
}

func connectCM(ctx context.Context, ch *cmChannel, dst netip.AddrPort, cfg connConfig) (*Conn, error) {
	x, err := ch.createID(ctx)
	if err != nil {
		return nil, err
	}
	c := newCMConn(cfg, ch, x)
	if err := x.resolve(ctx, dst); err != nil {
		c.undo(false)
		return nil, err
	}
	if err := c.cmObjects(ctx); err != nil {
		c.undo(false)
		return nil, err
	}
	// rdma_connect(id, NULL): as many resources as the device has.
	da := c.vc.QueryDevice()
	retry, rnr := cfg.cmRetries()
	p := abi.CMConnParam{QPN: c.qp.Num(), ResponderResources: uint8(min(da.MaxQPRdAtom, 255)),
		InitiatorDepth: uint8(min(da.MaxQPInitRd, 255)), RetryCount: retry, RNRRetryCount: rnr}
	if err := x.connect(ctx, &p); err != nil {
		c.undo(false)
		return nil, err
	}
	if _, err := x.await(ctx, abi.CMEventConnectResponse); err != nil {
		c.undo(false) // a REJ ended it, or destroying the ID sends one
		return nil, err
	}
	if err := c.cmReady(ctx, -1); err != nil {
		c.undo(true)
		return nil, err
	}
	if err := x.arg(ctx, abi.OpCMEstablish, 0); err != nil {
		c.undo(true)
		return nil, err
	}
	if err := c.cmEstablished(ctx); err != nil {
		c.undo(false)
		return nil, err
	}
	return c, nil
}

// cmListener is a Listener's side of the CM: a listening ID on a channel
// that the connections it accepts share.
type cmListener struct {
	ch   *cmChannel
	id   *cmID
	addr cmAddr
}

func listenCM(ctx context.Context, addr string, cfg connConfig) (*Listener, error) {
	src, err := cmAddrOf(ctx, addr, true)
	if err != nil {
		return nil, err
	}
	ch, err := newCMChannel(ctx)
	if err != nil {
		return nil, fmt.Errorf("verbs: listen on %s through the RDMA CM: %w", addr, err)
	}
	lc, err := listenOn(ctx, ch, src)
	if err != nil {
		ch.release()
		return nil, fmt.Errorf("verbs: listen on %s through the RDMA CM: %w", addr, err)
	}
	return &Listener{cm: lc, cfg: cfg, done: make(chan struct{})}, nil
}

// listenOn binds an ID of ch to src and listens (rdma_bind_addr,
// rdma_listen with the default backlog).
func listenOn(ctx context.Context, ch *cmChannel, src netip.AddrPort) (*cmListener, error) {
	x, err := ch.createID(ctx)
	if err != nil {
		return nil, err
	}
	if err := x.bind(ctx, src); err != nil {
		return nil, err
	}
	if err := x.arg(ctx, abi.OpCMListen, 0); err != nil {
		return nil, err
	}
	q, err := x.query(ctx)
	if err != nil {
		return nil, err
	}
	return &cmListener{ch: ch, id: x, addr: cmAddr(addrPortOf(q.Src))}, nil
}

func (l *Listener) acceptCM(ctx context.Context) (*Conn, error) {
	lc := l.cm
	for {
		ev, err := lc.id.next(ctx, l.done)
		if err != nil {
			return nil, fmt.Errorf("verbs: accept: %w", err)
		}
		if ev.Event != abi.CMEventConnectRequest {
			continue // a listener hears of nothing else but its device's removal
		}
		x := lc.ch.id(ev.ID)
		if x == nil {
			continue
		}
		if !lc.ch.acquire() {
			return nil, fmt.Errorf("verbs: accept: %w", ErrClosed)
		}
		c, err := acceptRequest(ctx, lc.ch, x, &ev, l.cfg)
		if err != nil {
			lc.ch.release()
			if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
				err = fmt.Errorf("%w (%w)", err, ctx.Err())
			}
			return nil, fmt.Errorf("verbs: accept: %w", err)
		}
		return c, nil
	}
}

// acceptRequest answers the connect request ev of ID x as rdma_accept
// does, with the resources the request asked for (within the device's),
// and waits for ESTABLISHED. A failure rejects the request.
func acceptRequest(ctx context.Context, ch *cmChannel, x *cmID, ev *abi.CMEvent, cfg connConfig) (*Conn, error) {
	c := newCMConn(cfg, ch, x)
	if err := c.cmObjects(ctx); err != nil {
		c.undo(true)
		return nil, err
	}
	da := c.vc.QueryDevice()
	retry, rnr := cfg.cmRetries()
	p := abi.CMConnParam{QPN: c.qp.Num(), ResponderResources: uint8(min(uint32(ev.Param.ResponderResources), da.MaxQPRdAtom)),
		InitiatorDepth: uint8(min(uint32(ev.Param.InitiatorDepth), da.MaxQPInitRd)), RetryCount: retry, RNRRetryCount: rnr}
	// rdma_accept: RTR and RTS before the REP, so that the peer may send
	// the moment it has the REP.
	if err := c.cmReady(ctx, int(p.InitiatorDepth)); err != nil {
		c.undo(true)
		return nil, err
	}
	if err := x.accept(ctx, &p); err != nil {
		c.undo(true)
		return nil, err
	}
	if _, err := x.await(ctx, abi.CMEventEstablished); err != nil {
		c.undo(false)
		return nil, err
	}
	if err := c.cmEstablished(ctx); err != nil {
		c.undo(false)
		return nil, err
	}
	return c, nil
}

// closeCM stops listening: the listening ID is destroyed, the requests
// not accepted are destroyed too (their peers get a REJ), and so are those
// that come meanwhile (cmChannel.deliver). The channel stays open while
// accepted connections use it.
func (l *Listener) closeCM() error {
	first := false
	l.once.Do(func() { close(l.done); first = true })
	if !first {
		return nil
	}
	lc := l.cm
	lc.ch.mu.Lock()
	lc.id.closed = true
	pending := lc.id.queue
	lc.id.queue = nil
	lc.ch.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), cmCleanupTimeout)
	defer cancel()
	err := lc.id.destroy(ctx)
	for _, ev := range pending {
		if x := lc.ch.id(ev.ID); ev.Event == abi.CMEventConnectRequest && x != nil {
			_ = x.destroy(ctx)
		}
	}
	lc.ch.release()
	if err != nil && !errors.Is(err, ErrDeviceGone) {
		return fmt.Errorf("verbs: listener: %w", err)
	}
	return nil
}

// cmWatch waits for the peer's end: on DISCONNECTED (a DREQ; or the
// device's removal) it sends the DREP the peer waits for, as rdma_cm
// programs answer that event with rdma_disconnect, and tells the
// dispatcher. The QP stays as it is, so that what the peer sent before
// is still received. It ends with the connection's Close too.
func (c *Conn) cmWatch() {
	defer close(c.watchDn)
	for {
		ev, err := c.cm.id.next(c.dctx, nil)
		if err != nil {
			// Close, or the appliance is gone: the context learns that
			// too, and the dispatcher ends the calls.
			return
		}
		if ev.Event == abi.CMEventDisconnected || ev.Event == abi.CMEventDeviceRemoval {
			_ = c.cm.id.arg(c.dctx, abi.OpCMDisconnect, 0)
			c.peerLeft()
			return
		}
	}
}
