package verbs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Connections
//
// A Conn is one reliable-connected QP to a peer, set up by Listen/Accept
// and Dial: the two sides exchange their QP number, first PSN, GID, path
// MTU and receive credits over a TCP connection, take their QPs to RTS,
// and keep the TCP connection open so that each learns when the other
// closes. Every Conn has its own device context, PD, CQ with a completion
// channel, and a registered area holding its receive slots, the bounce
// slots of Send and the results of atomics. One goroutine per Conn polls
// the CQ (briefly spinning while work is in flight, then sleeping on the
// channel) and hands each completion to the call waiting for it, so any
// number of goroutines may have operations in flight at once.
//
// Messages (Send/Recv, SendMR/ReceiveMR) are SENDs with an 8-byte header:
// a kind and the total number of receive WQEs the sender has posted so
// far. That total is the peer's credit: a side sends only while it has
// sent fewer messages than the peer has posted receives, keeping the last
// credit for a message that returns credits, so a receiver is never
// overrun and no RNR NAK is needed.
//
// Through the RDMA CM (Dial with WithRDMACM, Listen with network
// "rdma_cm"; cmconn.go) there is no TCP connection: the CMs of both sides
// exchange what the QPs need in their REQ, REP and RTU (IBA vol. 1 ch. 12)
// as librdmacm's programs do, and the end of a connection is a DREQ. Its
// messages are the application's bytes alone, one SEND each, paced by
// RNR NAKs instead of credits, so that the peer may be any rdma_cm program.

// Errors of connections. A completion with an error status gives a
// *WCError, which wraps the sentinel of its status.
var (
	// ErrRemoteAccess: the responder refused the access (IBV_WC_REM_ACCESS_ERR):
	// a bad rkey, a range outside the region, or an access the region lacks.
	ErrRemoteAccess = errors.New("verbs: remote access error")
	// ErrRemoteInvalidRequest: the responder found the request invalid
	// (IBV_WC_REM_INV_REQ_ERR), such as a message longer than its buffer.
	ErrRemoteInvalidRequest = errors.New("verbs: remote invalid request")
	// ErrRemoteOperation: the responder could not carry the request out
	// (IBV_WC_REM_OP_ERR), as when the peer's process died.
	ErrRemoteOperation = errors.New("verbs: remote operation error")
	// ErrRetryExceeded: the peer did not answer within the QP's timeout
	// and retry count (IBV_WC_RETRY_EXC_ERR).
	ErrRetryExceeded = errors.New("verbs: transport retry counter exceeded")
	// ErrRNRRetryExceeded: the peer had no receive buffer for too long
	// (IBV_WC_RNR_RETRY_EXC_ERR).
	ErrRNRRetryExceeded = errors.New("verbs: RNR retry counter exceeded")
	// ErrFlushed: the work request was flushed because the QP had gone to
	// the error state (IBV_WC_WR_FLUSH_ERR).
	ErrFlushed = errors.New("verbs: work request flushed")
	// ErrLocal: a local length, protection, access or QP operation error.
	ErrLocal = errors.New("verbs: local error")
	// ErrCompletion: any other completion error status.
	ErrCompletion = errors.New("verbs: completion error")

	// ErrBroken is returned, together with the first cause, by the
	// operations of a connection whose QP failed: after an error
	// completion an RC QP is in the error state and does no more work.
	ErrBroken = errors.New("verbs: connection broken")
	// ErrPeerClosed: the peer closed the connection (or its process
	// ended). Messages that arrived before are still received.
	ErrPeerClosed = errors.New("verbs: peer closed the connection")
	// ErrMessageTooLarge: a Send longer than the connection's maximum
	// message size (the smaller of both sides' WithMaxMessage).
	ErrMessageTooLarge = errors.New("verbs: message too large")
	// ErrHandshake: the out-of-band exchange with the peer failed, or
	// the peer's record was not understood.
	ErrHandshake = errors.New("verbs: connection handshake failed")
)

// WCError is a work completion with an error status. errors.Is matches
// it against the sentinel of its status (ErrRemoteAccess etc.).
type WCError struct {
	// Op names the operation ("RDMA WRITE", "SEND", "receive", …).
	Op        string
	Status    WCStatus
	VendorErr uint32
}

// Error says the operation and its status, as ibv_wc_status_str names it.
func (e *WCError) Error() string {
	return fmt.Sprintf("verbs: %s completed with status %d: %v", e.Op, e.Status, e.Status)
}

// Unwrap returns the sentinel error of the status.
func (e *WCError) Unwrap() error {
	switch e.Status {
	case WCRemAccessErr:
		return ErrRemoteAccess
	case WCRemInvReqErr:
		return ErrRemoteInvalidRequest
	case WCRemOpErr:
		return ErrRemoteOperation
	case WCRetryExcErr:
		return ErrRetryExceeded
	case WCRNRRetryExcErr:
		return ErrRNRRetryExceeded
	case WCWRFlushErr:
		return ErrFlushed
	case WCLocLenErr, WCLocQPOpErr, WCLocProtErr, WCLocAccessErr:
		return ErrLocal
	}
	return ErrCompletion
}

// RemoteMR names memory of the peer: what SendMR sends and ReceiveMR
// returns, and what Write, Read and the atomics address (offsets are
// from Addr and must stay within Len).
type RemoteMR struct {
	Addr uint64
	Len  uint64
	RKey uint32
	// Access is what the owner said it grants; the owner's appliance
	// enforces the region's registered access whatever this says.
	Access Access
}

// Slice returns the n bytes at off of the remote region.
func (r RemoteMR) Slice(off, n uint64) (RemoteMR, error) {
	if off > r.Len || n > r.Len-off {
		return RemoteMR{}, fmt.Errorf("verbs: %d bytes at %d of a remote region of %d: %w", n, off, r.Len, syscall.EINVAL)
	}
	return RemoteMR{Addr: r.Addr + off, Len: n, RKey: r.RKey, Access: r.Access}, nil
}

// Connection defaults; see the options.
const (
	// DefaultQueueDepth is the send queue depth (WithQueueDepth).
	DefaultQueueDepth = 64
	// DefaultRecvDepth is the number of receive credits (WithRecvDepth).
	DefaultRecvDepth = 16
	// DefaultMaxMessage is the largest message (WithMaxMessage).
	DefaultMaxMessage = 64 << 10
	// DefaultGIDIndex is the GID used: the IPv4-mapped address.
	DefaultGIDIndex = 1
	// DefaultAckTimeout is the local ACK timeout: 4.096 µs × 2^14 ≈ 67 ms.
	DefaultAckTimeout = 14
	// DefaultRetryCount is the transport retry count.
	DefaultRetryCount = 6
	// DefaultRNRRetry retries RNR NAKs forever: credits keep the peer's
	// receive queue stocked, so an RNR NAK means only that the appliance
	// has not yet taken a receive WQE from the ring.
	DefaultRNRRetry = 7
	// DefaultRNRTimer is the minimum RNR NAK timer (0.64 ms).
	DefaultRNRTimer = 12
)

type connConfig struct {
	device      string
	gidIndex    int
	queueDepth  int
	recvDepth   int
	maxMessage  int
	timeout     uint8
	retryCnt    uint8
	rnrRetry    uint8
	minRNRTimer uint8
	hopLimit    uint8
	retrySet    bool // WithRetry was given
	cm          bool // WithRDMACM: Dial through the RDMA CM
}

// ConnOption configures Listen and Dial.
type ConnOption func(*connConfig)

// WithDevice names the device to open; by default the first one this
// process may use.
func WithDevice(name string) ConnOption { return func(c *connConfig) { c.device = name } }

// WithGIDIndex selects the port's GID (default 1, the IPv4-mapped
// address).
func WithGIDIndex(i int) ConnOption { return func(c *connConfig) { c.gidIndex = i } }

// WithQueueDepth sets how many work requests may be in flight on the send
// queue (default 64).
func WithQueueDepth(n int) ConnOption { return func(c *connConfig) { c.queueDepth = n } }

// WithRecvDepth sets the receive credits: how many messages the peer may
// send ahead of Recv (default 16, at least 4). As many Send bounce slots
// are kept.
func WithRecvDepth(n int) ConnOption { return func(c *connConfig) { c.recvDepth = n } }

// WithMaxMessage sets the largest message Send and Recv carry (default
// 64 KiB); the connection uses the smaller of both sides'.
func WithMaxMessage(n int) ConnOption { return func(c *connConfig) { c.maxMessage = n } }

// WithRetry sets the QP's local ACK timeout (4.096 µs × 2^timeout, 0 for
// none), transport retry count and RNR retry count (7 retries forever).
// The defaults, 14, 6 and 7, make an operation towards a vanished peer
// fail within about half a second.
//
// On a connection through the RDMA CM the ACK timeout is the CM's (the
// REQ's local ACK timeout) and timeout is ignored; the counts go into the
// CM's messages, where the QPs of both sides take theirs from (Dial's REQ
// carries both, Accept's REP the RNR retry count). Without WithRetry they
// are 7 and 7, what librdmacm's rdma_connect and rdma_accept ask for
// without parameters.
func WithRetry(timeout, retryCnt, rnrRetry uint8) ConnOption {
	return func(c *connConfig) {
		c.timeout, c.retryCnt, c.rnrRetry, c.retrySet = timeout, retryCnt, rnrRetry, true
	}
}

// WithHopLimit sets the hop limit (IP TTL) of the connection's packets
// (default 64).
func WithHopLimit(n uint8) ConnOption { return func(c *connConfig) { c.hopLimit = n } }

func newConnConfig(opts []ConnOption) (connConfig, error) {
	c := connConfig{gidIndex: DefaultGIDIndex, queueDepth: DefaultQueueDepth, recvDepth: DefaultRecvDepth,
		maxMessage: DefaultMaxMessage, timeout: DefaultAckTimeout, retryCnt: DefaultRetryCount,
		rnrRetry: DefaultRNRRetry, minRNRTimer: DefaultRNRTimer, hopLimit: 64}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case c.gidIndex < 0:
		return c, fmt.Errorf("verbs: GID index %d: %w", c.gidIndex, syscall.EINVAL)
	case c.queueDepth < 1 || c.queueDepth > 1<<14:
		return c, fmt.Errorf("verbs: queue depth %d, want 1…16384: %w", c.queueDepth, syscall.EINVAL)
	case c.recvDepth < 4 || c.recvDepth > 1<<14:
		return c, fmt.Errorf("verbs: receive depth %d, want 4…16384: %w", c.recvDepth, syscall.EINVAL)
	case c.maxMessage < 0 || c.maxMessage > 1<<30:
		return c, fmt.Errorf("verbs: maximum message %d: %w", c.maxMessage, syscall.EINVAL)
	case c.timeout > 31 || c.retryCnt > 7 || c.rnrRetry > 7:
		return c, fmt.Errorf("verbs: retry attributes %d/%d/%d: %w", c.timeout, c.retryCnt, c.rnrRetry, syscall.EINVAL)
	}
	return c, nil
}

// The out-of-band record: "tprc", version, body length, then the body
// (big-endian). A body longer than a version knows is accepted and its
// tail ignored, so later versions may append fields.
const (
	recordMagic   = "tprc"
	recordVersion = 1
	recordHead    = 8
	recordBodyV1  = 36
	recordMaxBody = 1024

	oobReady = 'R' // each side at RTS
	oobBye   = 'B' // Close
)

type connRecord struct {
	QPN, PSN   uint32
	GID        [16]byte
	MTU        MTU
	RecvDepth  uint32
	MaxMessage uint32
}

func (r *connRecord) marshal() []byte {
	b := make([]byte, recordHead+recordBodyV1)
	copy(b, recordMagic)
	binary.BigEndian.PutUint16(b[4:], recordVersion)
	binary.BigEndian.PutUint16(b[6:], recordBodyV1)
	p := b[recordHead:]
	binary.BigEndian.PutUint32(p[0:], r.QPN)
	binary.BigEndian.PutUint32(p[4:], r.PSN)
	copy(p[8:24], r.GID[:])
	p[24] = uint8(r.MTU)
	binary.BigEndian.PutUint32(p[28:], r.RecvDepth)
	binary.BigEndian.PutUint32(p[32:], r.MaxMessage)
	return b
}

func readRecord(rd io.Reader) (connRecord, error) {
	var r connRecord
	h := make([]byte, recordHead)
	if _, err := io.ReadFull(rd, h); err != nil {
		return r, err
	}
	if string(h[:4]) != recordMagic {
		return r, fmt.Errorf("%w: the peer is not a taproce connection (%q)", ErrHandshake, h[:4])
	}
	if v := binary.BigEndian.Uint16(h[4:]); v != recordVersion {
		return r, fmt.Errorf("%w: record version %d, this side speaks %d", ErrHandshake, v, recordVersion)
	}
	n := int(binary.BigEndian.Uint16(h[6:]))
	if n < recordBodyV1 || n > recordMaxBody {
		return r, fmt.Errorf("%w: record body of %d bytes", ErrHandshake, n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(rd, p); err != nil {
		return r, err
	}
	r.QPN = binary.BigEndian.Uint32(p[0:])
	r.PSN = binary.BigEndian.Uint32(p[4:])
	copy(r.GID[:], p[8:24])
	r.MTU = MTU(p[24])
	r.RecvDepth = binary.BigEndian.Uint32(p[28:])
	r.MaxMessage = binary.BigEndian.Uint32(p[32:])
	switch {
	case r.QPN == 0 || r.QPN > 0xffffff || r.PSN > 0xffffff:
		return r, fmt.Errorf("%w: QPN %#x, PSN %#x", ErrHandshake, r.QPN, r.PSN)
	case r.MTU.Bytes() == 0:
		return r, fmt.Errorf("%w: path MTU %d", ErrHandshake, r.MTU)
	case r.RecvDepth < 4 || r.RecvDepth > 1<<14:
		return r, fmt.Errorf("%w: %d receive credits", ErrHandshake, r.RecvDepth)
	}
	return r, nil
}

// Message header: kind, 3 reserved bytes, the sender's receive WQEs
// posted so far (little-endian, wrapping).
const (
	msgHeader = 8
	msgData   = 1
	msgMR     = 2
	msgCredit = 3
	mrPayload = 24 // addr, len, rkey, access

	recvBit = 1 << 63 // receive WR IDs: recvBit | slot
)

// connOp is one call's work requests; the dispatcher completes it.
type connOp struct {
	name    string
	left    int // work requests not completed
	bounce  int // send slot to free on completion, or -1
	scratch int // atomic result slot to read and free, or -1
	result  uint64
	err     error
	done    chan struct{}
}

type inMsg struct{ slot, n int }

// mrInfo is what the connection keeps of a region it allocated, so that
// a region deregistered behind its back is refused rather than touched.
type mrInfo struct {
	access Access
	addr   uint64
	size   int
}

// Conn is a reliable connection to a peer with its own device context,
// PD, CQ and QP. Its methods may be called from any number of goroutines.
type Conn struct {
	cfg    connConfig
	vc     *Context
	pd     *PD
	ch     *CompChannel
	cq     *CQ
	qp     *QP
	area   *MR
	tcp    net.Conn     // the out-of-band connection; nil through the CM
	cm     *cmConnState // the connection's CM ID; nil over TCP
	mtu    MTU
	maxMsg int // Send limit: the smaller of both sides'
	// hdr is the message header's length: msgHeader, or 0 on a connection
	// through the CM, whose messages are the application's bytes alone.
	hdr int
	// area layout
	slotSize   int
	recvN      int
	sendOff    int
	scratchOff int
	maxInline  int
	maxWR      uint64 // bytes one work request may carry
	threshold  int

	dctx     context.Context
	dcancel  context.CancelFunc
	dispDone chan struct{}
	watchDn  chan struct{}
	peerGone atomic.Bool
	closedCh chan struct{}

	// opMu is held shared while a call touches the area or posts, and
	// exclusively by Close while it tears the objects down.
	opMu sync.RWMutex

	mu          sync.Mutex
	changed     chan struct{} // closed and replaced when anything below changes
	closed      bool
	failed      error
	peerClosed  bool
	nextID      uint64
	pending     map[uint64]*connOp
	sqFree      int
	freeSend    []int
	freeScratch []int
	recvPosted  uint32 // receive WQEs posted, wrapping
	peerPosted  uint32 // the peer's, as it last said
	sent        uint32 // messages sent, wrapping
	consumed    int    // message slots reposted since the last announcement
	inbox       []inMsg
	receivers   int // calls waiting for a message or a region
	mrInbox     []RemoteMR
	mrs         map[*MR]mrInfo
	wake        context.CancelFunc
}

// Listener accepts connections (see Listen).
type Listener struct {
	ln    net.Listener // nil through the RDMA CM
	cm    *cmListener  // nil over TCP
	cfg   connConfig
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	loop  chan struct{}

	mu  sync.Mutex
	err error
}

// Listen listens for connections on a TCP address (network "tcp", "tcp4"
// or "tcp6"); Accept completes each with the out-of-band exchange. The
// options apply to every accepted connection.
//
// With network "rdma_cm" (NetworkRDMACM) it listens through the RDMA CM
// instead, as rdma_bind_addr and rdma_listen do, on an address of a device
// of this process's network namespace and a port of the RDMA CM's TCP port
// space (RDMA_PS_TCP; port 0 picks one, an address of "" or 0.0.0.0
// listens on every device); Accept answers each request as rdma_accept
// does, so that the peer may be any rdma_cm program (or Dial with
// WithRDMACM), and its connections carry raw messages (see Conn).
func Listen(ctx context.Context, network, addr string, opts ...ConnOption) (*Listener, error) {
	cfg, err := newConnConfig(opts)
	if err != nil {
		return nil, err
	}
	if network == NetworkRDMACM {
		return listenCM(ctx, addr, cfg)
	}
	if cfg.cm {
		return nil, fmt.Errorf("verbs: listen on %q with WithRDMACM: the RDMA CM's network is %q: %w", network, NetworkRDMACM, syscall.EINVAL)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("verbs: listen: %w", err)
	}
	l := &Listener{ln: ln, cfg: cfg, conns: make(chan net.Conn), done: make(chan struct{}), loop: make(chan struct{})}
	go l.acceptLoop()
	return l, nil
}

func (l *Listener) acceptLoop() {
	defer close(l.loop)
	for {
		tc, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.done:
			default:
				l.mu.Lock()
				l.err = fmt.Errorf("verbs: accept: %w", err)
				l.mu.Unlock()
				l.once.Do(func() { close(l.done) })
			}
			return
		}
		select {
		case l.conns <- tc:
		case <-l.done:
			tc.Close()
			return
		}
	}
}

// Addr returns the address the listener listens on.
func (l *Listener) Addr() net.Addr {
	if l.cm != nil {
		return l.cm.addr
	}
	return l.ln.Addr()
}

// Accept waits for a peer to Dial and sets the connection up with it.
// Through the RDMA CM it waits for a connect request and accepts it; a
// request whose setup fails is rejected and its error returned.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	if l.cm != nil {
		return l.acceptCM(ctx)
	}
	select {
	case tc := <-l.conns:
		return newConn(ctx, tc, l.cfg)
	case <-l.done:
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.err != nil {
			return nil, l.err
		}
		return nil, fmt.Errorf("verbs: accept: %w", ErrClosed)
	case <-ctx.Done():
		return nil, fmt.Errorf("verbs: accept: %w", ctx.Err())
	}
}

// Close stops listening; connections already accepted stay open. Through
// the RDMA CM the requests not yet accepted are rejected.
func (l *Listener) Close() error {
	if l.cm != nil {
		return l.closeCM()
	}
	l.once.Do(func() { close(l.done) })
	err := l.ln.Close()
	<-l.loop
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("verbs: listener: %w", err)
	}
	return nil
}

// Dial connects to a Listener at a TCP address and sets the connection up.
//
// With WithRDMACM it connects through the RDMA CM instead, to addr's IP
// address and port of the RDMA CM's TCP port space, as librdmacm's
// rdma_resolve_addr, rdma_resolve_route and rdma_connect do: the peer may
// be any rdma_cm program listening there (or a Listener of network
// "rdma_cm"), and the connection carries raw messages (see Conn). A port
// nobody listens on fails at once with a *RejectedError of reason
// RejectInvalidServiceID (wrapping ErrRejected).
func Dial(ctx context.Context, addr string, opts ...ConnOption) (*Conn, error) {
	cfg, err := newConnConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.cm {
		return dialCM(ctx, addr, cfg)
	}
	var d net.Dialer
	tc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("verbs: dial %s: %w", addr, err)
	}
	return newConn(ctx, tc, cfg)
}

// newConn makes the local objects, exchanges records over tc and takes
// the QP to RTS. It owns tc.
func newConn(ctx context.Context, tc net.Conn, cfg connConfig) (*Conn, error) {
	c := newConnState(cfg)
	c.tcp = tc
	// When ctx ends, a deadline in the past ends the exchange.
	stop := context.AfterFunc(ctx, func() { _ = tc.SetDeadline(time.Unix(1, 0)) })
	err := c.handshake(ctx)
	if !stop() && err == nil {
		err = fmt.Errorf("verbs: connect: %w", context.Cause(ctx))
	}
	if err == nil {
		err = tc.SetDeadline(time.Time{})
	}
	if err != nil {
		tc.Close()
		_ = c.teardown()
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return nil, err
	}
	c.start(c.watch)
	return c, nil
}

// newConnState is a Conn before its objects are made.
func newConnState(cfg connConfig) *Conn {
	return &Conn{cfg: cfg, hdr: msgHeader, changed: make(chan struct{}), closedCh: make(chan struct{}),
		pending: map[uint64]*connOp{}, mrs: map[*MR]mrInfo{}, dispDone: make(chan struct{}), watchDn: make(chan struct{})}
}

// start starts the connection's goroutines: the dispatcher, and watch,
// which learns of the peer's end.
func (c *Conn) start(watch func()) {
	c.dctx, c.dcancel = context.WithCancel(context.Background())
	go c.dispatch()
	go watch()
}

// setup opens device dev and makes the connection's objects: PD, CQ with
// its channel, RC QP (in RESET), and the area of receive slots, send
// slots and atomic results.
func (c *Conn) setup(ctx context.Context, dev string) error {
	cfg := &c.cfg
	var err error
	if c.vc, err = Open(ctx, dev); err != nil {
		return err
	}
	port, err := c.vc.QueryPort(ctx)
	if err != nil {
		return err
	}
	c.mtu = MTU(port.ActiveMTU)
	if c.mtu.Bytes() == 0 {
		c.mtu = MTU1024
	}
	c.maxWR = uint64(port.MaxMsgSz)
	if c.maxWR == 0 {
		c.maxWR = 1 << 31
	}
	if c.pd, err = c.vc.AllocPD(ctx); err != nil {
		return err
	}
	if c.ch, err = c.vc.CreateCompChannel(ctx); err != nil {
		return err
	}
	if c.cq, err = c.vc.CreateCQ(ctx, cfg.queueDepth+cfg.recvDepth+1, c.ch); err != nil {
		return err
	}
	if c.qp, err = c.pd.CreateQP(ctx, QPInitAttr{Type: RC, SendCQ: c.cq, RecvCQ: c.cq,
		Cap: QPCap{MaxSendWR: uint32(cfg.queueDepth), MaxRecvWR: uint32(cfg.recvDepth), MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 64}}); err != nil {
		return err
	}
	c.maxInline = int(c.qp.Cap().MaxInline)
	// The area: receive slots, send slots, 8-byte atomic result slots.
	c.slotSize = (c.hdr + cfg.maxMessage + 63) &^ 63
	c.recvN = cfg.recvDepth
	c.sendOff = c.recvN * c.slotSize
	c.scratchOff = c.sendOff + c.recvN*c.slotSize
	if c.area, err = c.pd.AllocMR(ctx, c.scratchOff+8*cfg.queueDepth, AccessLocalWrite); err != nil {
		return err
	}
	c.sqFree = cfg.queueDepth
	for i := range c.recvN {
		c.freeSend = append(c.freeSend, i)
	}
	for i := range cfg.queueDepth {
		c.freeScratch = append(c.freeScratch, i)
	}
	c.threshold = max(2, c.recvN/4)
	return nil
}

// postReceives posts every receive slot, on the QP out of RESET.
func (c *Conn) postReceives() error {
	wrs := make([]RecvWR, c.recvN)
	for i := range wrs {
		wrs[i] = RecvWR{ID: recvBit | uint64(i), SGL: []SGE{c.area.SGE(i*c.slotSize, c.slotSize)}}
	}
	if _, err := c.qp.PostRecv(wrs); err != nil {
		return err
	}
	c.recvPosted = uint32(c.recvN)
	return nil
}

func (c *Conn) handshake(ctx context.Context) error {
	cfg := &c.cfg
	if err := c.setup(ctx, cfg.device); err != nil {
		return err
	}
	gid, err := c.vc.GID(cfg.gidIndex)
	if err != nil {
		return err
	}
	if !gid.IsValid() || gid.IsUnspecified() {
		return fmt.Errorf("verbs: GID index %d of %s is unset: %w", cfg.gidIndex, c.vc.Name(), syscall.EINVAL)
	}
	remote := AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
	if err := c.qp.Modify(ctx, &QPAttr{State: QPSInit, Port: 1, Access: remote},
		QPStateMask|QPPKeyIndex|QPPort|QPAccessFlags); err != nil {
		return err
	}
	if err := c.postReceives(); err != nil {
		return err
	}

	mine := connRecord{QPN: c.qp.Num(), PSN: rand.Uint32() & 0xffffff, MTU: c.mtu,
		RecvDepth: uint32(c.recvN), MaxMessage: uint32(cfg.maxMessage)}
	mine.GID = gid.As16()
	peer, err := exchange(c, mine.marshal(), readRecord)
	if err != nil {
		return err
	}
	c.mtu = min(c.mtu, peer.MTU)
	c.maxMsg = min(cfg.maxMessage, int(peer.MaxMessage))
	c.peerPosted = peer.RecvDepth
	rd := uint8(min(c.vc.QueryDevice().MaxQPRdAtom, 16))
	dgid := netip.AddrFrom16(peer.GID).Unmap()
	if err := c.qp.Modify(ctx, &QPAttr{State: QPSRTR, PathMTU: c.mtu, DestQPN: peer.QPN, RQPSN: peer.PSN,
		MaxDestRdAtomic: rd, MinRNRTimer: cfg.minRNRTimer,
		AH: AHAttr{DGID: dgid, SGIDIndex: uint8(cfg.gidIndex), HopLimit: cfg.hopLimit, Port: 1}},
		QPStateMask|QPAV|QPPathMTU|QPDestQPN|QPRQPSN|QPMaxDestRdAtomic|QPMinRNRTimer); err != nil {
		return fmt.Errorf("verbs: connect to QP %#x at %v: %w", peer.QPN, dgid, err)
	}
	if err := c.qp.Modify(ctx, &QPAttr{State: QPSRTS, SQPSN: mine.PSN, Timeout: cfg.timeout, RetryCnt: cfg.retryCnt,
		RNRRetry: cfg.rnrRetry, MaxRdAtomic: rd},
		QPStateMask|QPSQPSN|QPTimeout|QPRetryCnt|QPRNRRetry|QPMaxQPRdAtomic); err != nil {
		return err
	}
	// Neither side sends before the other is ready to receive.
	_, err = exchange(c, []byte{oobReady}, func(r io.Reader) (struct{}, error) {
		var b [1]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return struct{}{}, err
		}
		if b[0] != oobReady {
			return struct{}{}, fmt.Errorf("%w: the peer sent %#x, not ready", ErrHandshake, b[0])
		}
		return struct{}{}, nil
	})
	return err
}

// exchange writes out and reads the peer's answer with read.
func exchange[T any](c *Conn, out []byte, read func(io.Reader) (T, error)) (T, error) {
	var zero T
	if _, err := c.tcp.Write(out); err != nil {
		return zero, fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	v, err := read(c.tcp)
	if err != nil && !errors.Is(err, ErrHandshake) {
		err = fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	return v, err
}

// teardown destroys what the connection made; Close and a failed setup
// call it with no call touching the area.
func (c *Conn) teardown() error {
	if c.vc == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	c.mu.Lock()
	mrs := c.mrs
	c.mrs = map[*MR]mrInfo{}
	c.mu.Unlock()
	if c.vc.gone() != nil {
		// The objects went with the appliance; closing the context
		// releases what this side holds.
		return c.vc.Close()
	}
	for mr := range mrs {
		keep(mr.Dereg(ctx))
	}
	if c.area != nil {
		keep(c.area.Dereg(ctx))
	}
	if c.qp != nil {
		keep(c.qp.Destroy(ctx))
	}
	if c.cq != nil {
		keep(c.cq.Destroy(ctx))
	}
	if c.ch != nil {
		keep(c.ch.Destroy(ctx))
	}
	if c.pd != nil {
		keep(c.pd.Dealloc(ctx))
	}
	keep(c.vc.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("verbs: connection teardown: %w", err)
	}
	return nil
}

// Close tears the connection down: the calls in progress return
// ErrClosed, the peer learns at once over the out-of-band connection and
// its later operations fail with ErrPeerClosed. An operation of the peer
// already on its way fails with ErrPeerClosed too when the notice comes
// first, else with ErrRetryExceeded once its retries run out: the
// destroyed QP, while it lingers (the appliance's linger), answers only
// retransmissions of what it executed, as rxe answers nothing once a QP is
// gone. The memory regions AllocMR made are deregistered and unmapped:
// their Bytes must not be used afterwards.
//
// Through the RDMA CM, Close is rdma_disconnect and rdma_destroy_id: the
// QP goes to the error state and the peer's CM gets a DREQ (or the DREP
// its own DREQ waits for), which its application sees as
// RDMA_CM_EVENT_DISCONNECTED and a Conn as ErrPeerClosed.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.closedCh)
	c.broadcastLocked()
	c.mu.Unlock()
	if c.tcp != nil {
		_ = c.tcp.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.tcp.Write([]byte{oobBye})
		c.tcp.Close()
	}
	c.dcancel()
	<-c.dispDone
	<-c.watchDn
	c.opMu.Lock()
	defer c.opMu.Unlock()
	var cmErr error
	if c.cm != nil {
		cmErr = c.cm.close(c.qp, c.vc)
	}
	return errors.Join(cmErr, c.teardown())
}

// PathMTU returns the connection's path MTU, the smaller of both ports'.
func (c *Conn) PathMTU() MTU { return c.mtu }

// MaxMessage returns the largest message Send may send. Through the RDMA
// CM it is this side's WithMaxMessage: the CM does not say how large the
// peer's receive buffers are, which a longer message overruns (see Send).
func (c *Conn) MaxMessage() int { return c.maxMsg }

// LocalAddr returns the local address of the out-of-band connection, or,
// through the RDMA CM, the connection's own address and port (network
// "rdma_cm").
func (c *Conn) LocalAddr() net.Addr {
	if c.cm != nil {
		return c.cm.local
	}
	return c.tcp.LocalAddr()
}

// RemoteAddr returns the peer's address on the out-of-band connection, or,
// through the RDMA CM, the peer's address and port (network "rdma_cm").
func (c *Conn) RemoteAddr() net.Addr {
	if c.cm != nil {
		return c.cm.remote
	}
	return c.tcp.RemoteAddr()
}

// AllocMR allocates and registers a memory region in the connection's PD
// (see PD.AllocMR); Write, Read and SendMR take only such regions. Close
// deregisters it, or FreeMR earlier.
func (c *Conn) AllocMR(ctx context.Context, size int, access Access) (*MR, error) {
	c.opMu.RLock()
	defer c.opMu.RUnlock()
	if err := c.usable(); err != nil {
		return nil, err
	}
	mr, err := c.pd.AllocMR(ctx, size, access)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.mrs[mr] = mrInfo{access: access, addr: mr.Addr(), size: size}
	c.mu.Unlock()
	return mr, nil
}

// FreeMR deregisters a region AllocMR made. Work still in flight on it
// fails.
func (c *Conn) FreeMR(ctx context.Context, mr *MR) error {
	c.opMu.RLock()
	defer c.opMu.RUnlock()
	c.mu.Lock()
	_, ok := c.mrs[mr]
	delete(c.mrs, mr)
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if !ok {
		return fmt.Errorf("verbs: the memory region is not this connection's: %w", syscall.EINVAL)
	}
	return mr.Dereg(ctx)
}

// usable says why the connection takes no more work, if it does not.
func (c *Conn) usable() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stateErrLocked()
}

func (c *Conn) stateErrLocked() error {
	switch {
	case c.closed:
		return ErrClosed
	case c.failed != nil:
		return fmt.Errorf("%w: %w", ErrBroken, c.failed)
	case c.peerClosed:
		return ErrPeerClosed
	}
	return nil
}

func (c *Conn) broadcastLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *Conn) failLocked(err error) {
	if c.failed == nil && !c.closed {
		c.failed = err
	}
}

// loseLocked ends the connection whose device is gone: the calls waiting
// for completions that will never come, and the later ones, fail with
// the *DeviceGoneError.
func (c *Conn) loseLocked(err error) {
	c.failLocked(err)
	for id, o := range c.pending {
		delete(c.pending, id)
		c.sqFree++
		if o.err == nil {
			o.err = err
		}
		o.left--
		if o.left == 0 {
			c.releaseLocked(o)
			close(o.done)
		}
	}
	c.broadcastLocked()
}

// wcErr is the error of a completion in error; once the device is gone,
// its flushed work requests say so first.
func (c *Conn) wcErr(op string, wc *WC) error {
	err := error(&WCError{Op: op, Status: wc.Status, VendorErr: wc.VendorErr})
	if lost := c.vc.gone(); lost != nil {
		err = fmt.Errorf("%w (%w)", lost, err)
	}
	return err
}

// need is what a call takes before posting.
type need struct {
	wrs     int  // send queue entries
	message bool // a message credit and, unless inline, a send slot
	inline  bool
	scratch bool
}

// acquire waits until what n asks for is free and takes it, registering
// an op with n.wrs work request IDs.
func (c *Conn) acquire(ctx context.Context, name string, n need) (*connOp, []uint64, uint32, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, 0, fmt.Errorf("verbs: %s: %w", name, err)
	}
	for {
		c.mu.Lock()
		if err := c.stateErrLocked(); err != nil {
			c.mu.Unlock()
			return nil, nil, 0, err
		}
		ok := c.sqFree >= n.wrs
		if n.message {
			// The last credit is kept for a message that returns credits.
			// Through the CM there are no credits: the peer's receive
			// queue paces the sender by RNR NAKs, which the QP retries.
			ok = ok && (c.cm != nil || int32(c.peerPosted-c.sent) >= 2) && (n.inline || len(c.freeSend) > 0)
		}
		if n.scratch {
			ok = ok && len(c.freeScratch) > 0
		}
		if ok {
			o := &connOp{name: name, left: n.wrs, bounce: -1, scratch: -1, done: make(chan struct{})}
			ids := make([]uint64, n.wrs)
			for i := range ids {
				c.nextID++
				ids[i] = c.nextID
				c.pending[ids[i]] = o
			}
			c.sqFree -= n.wrs
			var posted uint32
			if n.message {
				if !n.inline {
					o.bounce = c.freeSend[len(c.freeSend)-1]
					c.freeSend = c.freeSend[:len(c.freeSend)-1]
				}
				c.sent++
				c.consumed = 0
				posted = c.recvPosted
			}
			if n.scratch {
				o.scratch = c.freeScratch[len(c.freeScratch)-1]
				c.freeScratch = c.freeScratch[:len(c.freeScratch)-1]
			}
			c.mu.Unlock()
			return o, ids, posted, nil
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, nil, 0, fmt.Errorf("verbs: %s: %w", name, ctx.Err())
		}
	}
}

// unpost gives back the work requests of o from ids[k:] that were not
// posted, after a post failed with err.
func (c *Conn) unpost(o *connOp, ids []uint64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if c.pending[id] == o {
			delete(c.pending, id)
			c.sqFree++
			o.left--
		}
	}
	if o.err == nil {
		o.err = err
	}
	if o.left == 0 {
		c.releaseLocked(o)
		close(o.done)
	}
	c.broadcastLocked()
}

func (c *Conn) releaseLocked(o *connOp) {
	if o.bounce >= 0 {
		c.freeSend = append(c.freeSend, o.bounce)
		o.bounce = -1
	}
	if o.scratch >= 0 {
		c.freeScratch = append(c.freeScratch, o.scratch)
		o.scratch = -1
	}
}

// postSend posts wrs. The appliance publishes that a send WQE retired
// just after it pushes its completion, so for a moment a queue the CQ
// says has room may look full to QP.PostSend: ENOMEM is retried briefly.
func (c *Conn) postSend(wrs []SendWR) (int, error) {
	done := 0
	var deadline time.Time
	for {
		n, err := c.qp.PostSend(wrs[done:])
		done += n
		if err == nil || !errors.Is(err, syscall.ENOMEM) {
			return done, err
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(100 * time.Millisecond)
		} else if time.Now().After(deadline) {
			return done, err
		}
		runtime.Gosched()
	}
}

func (c *Conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// post posts wrs under opMu, or returns ErrClosed.
func (c *Conn) post(o *connOp, ids []uint64, wrs []SendWR) error {
	c.opMu.RLock()
	var err error
	n := 0
	if c.isClosed() {
		err = ErrClosed
	} else {
		n, err = c.postSend(wrs)
	}
	c.opMu.RUnlock()
	if err != nil {
		c.unpost(o, ids[n:], err)
		return fmt.Errorf("verbs: %s: %w", o.name, err)
	}
	return nil
}

// await waits for o. A call whose ctx ends first returns at once; its
// work requests complete later and the dispatcher frees what they held.
func (c *Conn) await(ctx context.Context, o *connOp) error {
	select {
	case <-o.done:
		return o.err
	case <-ctx.Done():
	case <-c.closedCh:
	}
	select {
	case <-o.done:
		return o.err
	default:
	}
	if ctx.Err() != nil {
		return fmt.Errorf("verbs: %s: %w", o.name, ctx.Err())
	}
	return fmt.Errorf("verbs: %s: %w", o.name, ErrClosed)
}

// localMR returns what the connection knows of a region it allocated.
func (c *Conn) localMR(mr *MR) (mrInfo, error) {
	c.mu.Lock()
	info, ok := c.mrs[mr]
	c.mu.Unlock()
	if mr == nil || !ok {
		return info, fmt.Errorf("verbs: the memory region is not this connection's: %w", syscall.EINVAL)
	}
	return info, nil
}

func (c *Conn) checkLocal(mr *MR, off, n int) (mrInfo, error) {
	if err := c.usable(); err != nil {
		return mrInfo{}, err
	}
	info, err := c.localMR(mr)
	if err != nil {
		return info, err
	}
	if l := info.size; off < 0 || n < 0 || off > l || n > l-off {
		return info, fmt.Errorf("verbs: %d bytes at %d of a region of %d: %w", n, off, l, syscall.EINVAL)
	}
	return info, nil
}

func checkRemote(r RemoteMR, off uint64, n uint64) error {
	if off > r.Len || n > r.Len-off {
		return fmt.Errorf("verbs: %d bytes at %d of a remote region of %d: %w", n, off, r.Len, syscall.EINVAL)
	}
	return nil
}

// Write copies n bytes at off of local to roff of the peer's region
// (RDMA WRITE). When ctx ends first the write may still happen.
func (c *Conn) Write(ctx context.Context, local *MR, off, n int, remote RemoteMR, roff uint64) error {
	return c.rdma(ctx, "RDMA WRITE", WRRDMAWrite, local, off, n, remote, roff)
}

// Read copies n bytes at roff of the peer's region to off of local (RDMA
// READ). When ctx ends first the data may still land in local later.
func (c *Conn) Read(ctx context.Context, local *MR, off, n int, remote RemoteMR, roff uint64) error {
	return c.rdma(ctx, "RDMA READ", WRRDMARead, local, off, n, remote, roff)
}

func (c *Conn) rdma(ctx context.Context, name string, opc Opcode, local *MR, off, n int, remote RemoteMR, roff uint64) error {
	info, err := c.checkLocal(local, off, n)
	if err != nil {
		return fmt.Errorf("verbs: %s: %w", name, err)
	}
	if err := checkRemote(remote, roff, uint64(n)); err != nil {
		return fmt.Errorf("verbs: %s: %w", name, err)
	}
	if n == 0 {
		return c.usable()
	}
	// Larger than a work request carries: several, at most a queue's worth
	// in flight.
	for n > 0 {
		k := min(int((uint64(n)+c.maxWR-1)/c.maxWR), c.cfg.queueDepth)
		o, ids, _, err := c.acquire(ctx, name, need{wrs: k})
		if err != nil {
			return err
		}
		wrs := make([]SendWR, k)
		for i := range wrs {
			l := int(min(uint64(n), c.maxWR))
			wrs[i] = SendWR{ID: ids[i], Opcode: opc, Flags: SendSignaled, SGL: []SGE{{Addr: info.addr + uint64(off), Length: uint32(l), LKey: local.LKey}},
				RemoteAddr: remote.Addr + roff, RKey: remote.RKey}
			off, n, roff = off+l, n-l, roff+uint64(l)
		}
		if err := c.post(o, ids, wrs); err != nil {
			return err
		}
		if err := c.await(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

// CompareAndSwap sets the 8 bytes at roff of the peer's region (8-byte
// aligned) to swap if they equal compare, atomically, and returns what
// they were.
func (c *Conn) CompareAndSwap(ctx context.Context, remote RemoteMR, roff uint64, compare, swap uint64) (uint64, error) {
	return c.atomic(ctx, "COMPARE AND SWAP", WRAtomicCmpAndSwp, remote, roff, compare, swap)
}

// FetchAdd adds add to the 8 bytes at roff of the peer's region (8-byte
// aligned), atomically, and returns what they were.
func (c *Conn) FetchAdd(ctx context.Context, remote RemoteMR, roff uint64, add uint64) (uint64, error) {
	return c.atomic(ctx, "FETCH AND ADD", WRAtomicFetchAdd, remote, roff, add, 0)
}

func (c *Conn) atomic(ctx context.Context, name string, opc Opcode, remote RemoteMR, roff, compareAdd, swap uint64) (uint64, error) {
	if err := checkRemote(remote, roff, 8); err != nil {
		return 0, fmt.Errorf("verbs: %s: %w", name, err)
	}
	if (remote.Addr+roff)%8 != 0 {
		return 0, fmt.Errorf("verbs: %s at %#x: not 8-byte aligned: %w", name, remote.Addr+roff, syscall.EINVAL)
	}
	o, ids, _, err := c.acquire(ctx, name, need{wrs: 1, scratch: true})
	if err != nil {
		return 0, err
	}
	wr := SendWR{ID: ids[0], Opcode: opc, Flags: SendSignaled, SGL: []SGE{c.area.SGE(c.scratchOff+8*o.scratch, 8)},
		RemoteAddr: remote.Addr + roff, RKey: remote.RKey, CompareAdd: compareAdd, Swap: swap}
	if err := c.post(o, ids, []SendWR{wr}); err != nil {
		return 0, err
	}
	if err := c.await(ctx, o); err != nil {
		return 0, err
	}
	return o.result, nil
}

// Send sends p as one message, received whole by one Recv of the peer.
// It waits for a credit while the peer's receive slots are full, and
// returns once the peer's QP acknowledged the message. When ctx ends
// after the message was posted it may still be delivered.
//
// Through the RDMA CM (WithRDMACM, Listen's "rdma_cm") the message is
// exactly one RC SEND of p, with nothing added, as an rdma_cm program's
// ibv_post_send sends it; there are no credits: while the peer has no
// receive posted its QP answers with RNR NAKs and this side's QP tries
// again (RNR retry 7, for ever), so Send returns once the peer took the
// message. A message longer than the receive buffer the peer posted
// breaks the connection (the peer's receive completes with a local
// length error, this side's Send with ErrRemoteInvalidRequest).
func (c *Conn) Send(ctx context.Context, p []byte) error {
	if len(p) > c.maxMsg {
		return fmt.Errorf("verbs: send %d bytes, at most %d: %w", len(p), c.maxMsg, ErrMessageTooLarge)
	}
	return c.sendMessage(ctx, "SEND", msgData, p)
}

func (c *Conn) sendMessage(ctx context.Context, name string, kind byte, p []byte) error {
	inline := c.hdr+len(p) <= c.maxInline
	o, ids, posted, err := c.acquire(ctx, name, need{wrs: 1, message: true, inline: inline})
	if err != nil {
		return err
	}
	var h [msgHeader]byte
	h[0] = kind
	binary.LittleEndian.PutUint32(h[4:], posted)
	hdr := h[:c.hdr]
	wr := SendWR{ID: ids[0], Opcode: WRSend, Flags: SendSignaled}
	if inline {
		wr.Flags |= SendInline
		wr.Inline = append(hdr, p...)
	} else {
		off := c.sendOff + o.bounce*c.slotSize
		wr.SGL = []SGE{c.area.SGE(off, c.hdr+len(p))}
		// Under opMu, so that Close does not unmap the area meanwhile.
		c.opMu.RLock()
		if !c.isClosed() {
			buf := c.area.Bytes()[off:]
			copy(buf, hdr)
			copy(buf[c.hdr:], p)
		}
		c.opMu.RUnlock()
	}
	if err := c.post(o, ids, []SendWR{wr}); err != nil {
		return err
	}
	return c.await(ctx, o)
}

// Recv waits for the next message and returns a copy of it. Messages
// that arrived before the peer closed or the connection broke are still
// returned; then Recv fails with ErrPeerClosed or ErrBroken.
func (c *Conn) Recv(ctx context.Context) ([]byte, error) {
	m, err := c.nextMessage(ctx, -1)
	if err != nil {
		return nil, err
	}
	out := make([]byte, m.n)
	if err := c.consume(m, out); err != nil {
		return nil, err
	}
	return out, nil
}

// RecvInto waits for the next message and copies it into buf, returning
// its length. A message longer than buf is left for the next call and
// RecvInto fails with an error wrapping io.ErrShortBuffer.
func (c *Conn) RecvInto(ctx context.Context, buf []byte) (int, error) {
	m, err := c.nextMessage(ctx, len(buf))
	if err != nil {
		return 0, err
	}
	if err := c.consume(m, buf); err != nil {
		return 0, err
	}
	return m.n, nil
}

func (c *Conn) nextMessage(ctx context.Context, limit int) (inMsg, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return inMsg{}, ErrClosed
		}
		if len(c.inbox) > 0 {
			m := c.inbox[0]
			if limit >= 0 && m.n > limit {
				c.mu.Unlock()
				return inMsg{}, fmt.Errorf("verbs: receive a message of %d bytes into %d: %w", m.n, limit, io.ErrShortBuffer)
			}
			c.inbox = c.inbox[1:]
			c.mu.Unlock()
			return m, nil
		}
		if err := c.stateErrLocked(); err != nil {
			c.mu.Unlock()
			return inMsg{}, err
		}
		if err := c.waitReceive(ctx); err != nil {
			return inMsg{}, fmt.Errorf("verbs: receive: %w", err)
		}
	}
}

// waitReceive waits, with c.mu held and released, for a change; the
// dispatcher polls a little longer before sleeping while receivers wait.
func (c *Conn) waitReceive(ctx context.Context) error {
	ch := c.changed
	c.receivers++
	c.mu.Unlock()
	var err error
	select {
	case <-ch:
	case <-ctx.Done():
		err = ctx.Err()
	}
	c.mu.Lock()
	c.receivers--
	c.mu.Unlock()
	return err
}

// consume copies a received message out and posts its slot again.
func (c *Conn) consume(m inMsg, dst []byte) error {
	c.opMu.RLock()
	defer c.opMu.RUnlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	off := m.slot*c.slotSize + c.hdr
	copy(dst, c.area.Bytes()[off:off+m.n])
	c.repostLocked(m.slot, true)
	c.announceLocked()
	return nil
}

// SendMR tells the peer about a region of this connection, granting it
// access (a subset of the region's own), for the peer's ReceiveMR.
//
// It takes the message header of a connection over TCP: through the RDMA
// CM it fails with an error wrapping errors.ErrUnsupported, and the
// application tells its peer about its regions in messages of its own
// (RemoteMR of the peer's address, length and rkey).
func (c *Conn) SendMR(ctx context.Context, mr *MR, access Access) error {
	if c.cm != nil {
		return fmt.Errorf("verbs: send MR: %w", errRawMR)
	}
	if err := c.usable(); err != nil {
		return err
	}
	info, err := c.localMR(mr)
	if err != nil {
		return fmt.Errorf("verbs: send MR: %w", err)
	}
	if access&^info.access != 0 {
		return fmt.Errorf("verbs: send MR: access %#x beyond the region's %#x: %w", access, info.access, syscall.EINVAL)
	}
	var p [mrPayload]byte
	binary.LittleEndian.PutUint64(p[0:], info.addr)
	binary.LittleEndian.PutUint64(p[8:], uint64(info.size))
	binary.LittleEndian.PutUint32(p[16:], mr.RKey)
	binary.LittleEndian.PutUint32(p[20:], uint32(access))
	return c.sendMessage(ctx, "SEND MR", msgMR, p[:])
}

// ReceiveMR waits for the next region the peer sent with SendMR. Through
// the RDMA CM it fails as SendMR does.
func (c *Conn) ReceiveMR(ctx context.Context) (RemoteMR, error) {
	if c.cm != nil {
		return RemoteMR{}, fmt.Errorf("verbs: receive MR: %w", errRawMR)
	}
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return RemoteMR{}, ErrClosed
		}
		if len(c.mrInbox) > 0 {
			r := c.mrInbox[0]
			c.mrInbox = c.mrInbox[1:]
			c.mu.Unlock()
			return r, nil
		}
		if err := c.stateErrLocked(); err != nil {
			c.mu.Unlock()
			return RemoteMR{}, err
		}
		if err := c.waitReceive(ctx); err != nil {
			return RemoteMR{}, fmt.Errorf("verbs: receive MR: %w", err)
		}
	}
}

// repostLocked posts a receive slot again; counted says it held a
// message (not a credit return).
func (c *Conn) repostLocked(slot int, counted bool) {
	if c.closed || c.failed != nil {
		return
	}
	_, err := c.qp.PostRecv([]RecvWR{{ID: recvBit | uint64(slot), SGL: []SGE{c.area.SGE(slot*c.slotSize, c.slotSize)}}})
	if err != nil {
		c.failLocked(fmt.Errorf("verbs: post receive: %w", err))
		c.broadcastLocked()
		return
	}
	c.recvPosted++
	if counted {
		c.consumed++
	}
}

// announceLocked returns credits in a message of their own once enough
// slots were posted again and no message carried the news.
func (c *Conn) announceLocked() {
	if c.cm != nil || c.consumed < c.threshold || c.closed || c.failed != nil || c.peerClosed {
		return
	}
	if int32(c.peerPosted-c.sent) < 1 || c.sqFree < 1 {
		return // again when a message or a completion comes
	}
	o := &connOp{name: "credit return", left: 1, bounce: -1, scratch: -1, done: make(chan struct{})}
	c.nextID++
	id := c.nextID
	c.pending[id] = o
	var hdr [msgHeader]byte
	hdr[0] = msgCredit
	binary.LittleEndian.PutUint32(hdr[4:], c.recvPosted)
	c.sqFree--
	c.sent++
	c.consumed = 0
	if _, err := c.postSend([]SendWR{{ID: id, Opcode: WRSend, Flags: SendSignaled | SendInline, Inline: hdr[:]}}); err != nil {
		delete(c.pending, id)
		c.sqFree++
		c.sent--
		c.failLocked(fmt.Errorf("verbs: return credits: %w", err))
		c.broadcastLocked()
	}
}

// watch waits for the peer to say goodbye or vanish.
func (c *Conn) watch() {
	defer close(c.watchDn)
	b := make([]byte, 64)
	for {
		n, err := c.tcp.Read(b)
		if err != nil || bytes.IndexByte(b[:n], oobBye) >= 0 {
			break
		}
	}
	c.peerLeft()
}

// peerLeft tells the dispatcher that the peer has gone: once it has
// polled what came before, the connection is closed by the peer.
func (c *Conn) peerLeft() {
	c.peerGone.Store(true)
	c.mu.Lock()
	if c.wake != nil {
		c.wake()
	}
	c.mu.Unlock()
}

// Dispatcher tuning: how long it polls before sleeping while work is in
// flight.
const dispatchSpin = 20 * time.Microsecond

// dispatch polls the CQ and completes the calls. When the device is
// gone it polls the flushed work requests, then ends the calls left.
func (c *Conn) dispatch() {
	defer close(c.dispDone)
	defer func() {
		if err := c.vc.gone(); err != nil {
			c.mu.Lock()
			c.loseLocked(err)
			c.mu.Unlock()
		}
	}()
	wcs := make([]WC, 32)
	for {
		gone := c.peerGone.Load()
		n := c.pollOnce(wcs)
		if n < 0 || c.dctx.Err() != nil {
			return
		}
		if n > 0 {
			continue
		}
		if gone {
			c.mu.Lock()
			if !c.peerClosed {
				// Every message the peer sent before it closed has been
				// polled: it waited for their acknowledgements.
				c.peerClosed = true
				c.broadcastLocked()
			}
			c.mu.Unlock()
		}
		if c.spin(wcs) {
			continue
		}
		if err := c.cq.ReqNotify(false); err != nil {
			return
		}
		if n := c.pollOnce(wcs); n != 0 {
			if n < 0 {
				return
			}
			continue
		}
		wctx, cancel := context.WithCancel(c.dctx)
		c.mu.Lock()
		c.wake = cancel
		c.mu.Unlock()
		if c.peerGone.Load() == gone {
			_, _ = c.ch.Wait(wctx)
		}
		c.mu.Lock()
		c.wake = nil
		c.mu.Unlock()
		cancel()
	}
}

// spin polls for a little while if calls are waiting for completions or
// messages.
func (c *Conn) spin(wcs []WC) bool {
	c.mu.Lock()
	busy := len(c.pending) > 0 || c.receivers > 0
	c.mu.Unlock()
	if !busy {
		return false
	}
	end := time.Now().Add(dispatchSpin)
	for time.Now().Before(end) {
		if n := c.pollOnce(wcs); n != 0 {
			return true
		}
		runtime.Gosched()
	}
	return false
}

// pollOnce polls and handles one batch of completions.
func (c *Conn) pollOnce(wcs []WC) int {
	n := c.cq.Poll(wcs)
	if n <= 0 {
		return n
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range wcs[:n] {
		wc := &wcs[i]
		if wc.ID&recvBit != 0 {
			c.onRecvLocked(wc)
			continue
		}
		o := c.pending[wc.ID]
		if o == nil {
			continue
		}
		delete(c.pending, wc.ID)
		c.sqFree++
		if wc.Status != WCSuccess {
			err := c.wcErr(o.name, wc)
			if o.err == nil {
				o.err = err
			}
			c.failLocked(err)
		} else if o.scratch >= 0 {
			off := c.scratchOff + 8*o.scratch
			o.result = binary.LittleEndian.Uint64(c.area.Bytes()[off:])
		}
		o.left--
		if o.left == 0 {
			c.releaseLocked(o)
			close(o.done)
		}
	}
	c.announceLocked()
	c.broadcastLocked()
	return n
}

func (c *Conn) onRecvLocked(wc *WC) {
	slot := int(wc.ID &^ recvBit)
	if wc.Status != WCSuccess {
		c.failLocked(c.wcErr("receive", wc))
		return
	}
	if slot >= c.recvN || int(wc.ByteLen) < c.hdr || int(wc.ByteLen) > c.slotSize {
		c.failLocked(fmt.Errorf("verbs: a message of %d bytes in slot %d: %w", wc.ByteLen, slot, ErrHandshake))
		return
	}
	if c.cm != nil {
		c.inbox = append(c.inbox, inMsg{slot: slot, n: int(wc.ByteLen)})
		return
	}
	buf := c.area.Bytes()[slot*c.slotSize:]
	if posted := binary.LittleEndian.Uint32(buf[4:]); int32(posted-c.peerPosted) > 0 {
		c.peerPosted = posted
	}
	n := int(wc.ByteLen) - msgHeader
	switch buf[0] {
	case msgData:
		c.inbox = append(c.inbox, inMsg{slot: slot, n: n})
	case msgMR:
		if n >= mrPayload {
			p := buf[msgHeader:]
			c.mrInbox = append(c.mrInbox, RemoteMR{Addr: binary.LittleEndian.Uint64(p[0:]), Len: binary.LittleEndian.Uint64(p[8:]),
				RKey: binary.LittleEndian.Uint32(p[16:]), Access: Access(binary.LittleEndian.Uint32(p[20:]))})
		}
		c.repostLocked(slot, true)
	default: // a credit return, or a kind of a later version: ignored
		c.repostLocked(slot, false)
	}
}
