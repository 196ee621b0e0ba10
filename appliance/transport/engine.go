package transport

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/verbs/abi"
)

// Output takes the frames the engine sends. The frames lie in the
// engine's buffers, each behind Headroom() free bytes, and are valid only
// during the call.
type Output interface {
	Headroom() int
	Send(frames [][]byte)
}

// AsyncOutput is an Output that writes frames after Send returns, on a
// goroutine of its own, so that building frames and writing them overlap.
// The engine hands it whole batches with SendBatch; the output gives each
// batch back with Batch.Release once it has written (or dropped) the
// frames. An engine never reuses a batch before that; when all are out it
// makes another, so the output must bound what it queues (by blocking in
// SendBatch, as a busy TAP does).
type AsyncOutput interface {
	Output
	SendBatch(b *Batch)
}

// Batch is a set of frames an engine hands to an AsyncOutput.
type Batch struct {
	// Frames are the frames, each behind Headroom() bytes.
	Frames [][]byte
	// Refs, when not nil, runs parallel to Frames: a frame with a
	// reference is a whole message for a local destination (see
	// Config.Local) that carries no payload of its own; Refs[i] is the
	// payload, in the sender's memory, for Engine.ReceiveLocal. Such
	// frames must not leave through a TAP.
	Refs [][]byte
	// Release gives the batch back to its engine. It is a field, bound
	// once, so handing it on allocates nothing.
	Release func()

	bufs [][]byte
	refs [][]byte // Refs' backing array
	pins []*MR    // regions Refs point into, unpinned on Release
	free chan *Batch
}

// Config describes an engine: one port's transport.
type Config struct {
	// MAC is the port's address.
	MAC roce.MAC
	// GIDs is the port's GID table; address vectors name the source GID
	// by index.
	GIDs []roce.GID
	// MTU is the netdev MTU. The largest path MTU it carries
	// (abi.MTUForNetdev) is the port's active MTU: a connected QP may not
	// be given a larger one (see QP.Modify).
	MTU int
	// Out receives the frames.
	Out Output
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Memory holds the registered regions (default: a new one).
	Memory *Memory
	// Local, when set, reports whether a destination is reached through a
	// local switch (memory, not a wire). A connected QP to such a
	// destination sends each SEND or WRITE whose source is one segment
	// as a single frame referring to the sender's memory (Batch.Refs),
	// using the PSNs of all its packets, so the receiver copies it once;
	// its READs are asked for whole and answered the same way.
	Local func(netip.Addr) bool
	// AckDelay is how long the acknowledgement of a message that completed
	// a receive (a SEND, a WRITE with immediate) may wait for another
	// frame of the engine to go out with: the answer the client posts to
	// that message, as in a ping-pong, or the acknowledgement of the next
	// message, which covers this one too (an ACK acknowledges every
	// earlier PSN, IBA 9.7.5.1). They then leave in one write — one UDP
	// GSO super-frame when their sizes allow — and the peer reads them at
	// once. 0 sends every acknowledgement at once; so do the other ACKs,
	// NAKs, RNR NAKs, atomic acknowledgements and READ responses, always.
	// Someone must call FlushAcks while acknowledgements wait; Tick sends
	// them too.
	AckDelay time.Duration
	// LingerQuiet is how long a killed or closed QP only answers the
	// duplicates of what it executed before it NAKs what it never did
	// (lingerAnswer), or the first half of its linger when that is
	// shorter: 0 is DefaultLingerQuiet; less than 0, no quiet spell.
	LingerQuiet time.Duration
	// PortInflight caps the bytes in flight of all the engine's
	// congestion-controlled QPs (RC over a wire, cc.go), each of which may
	// have two packets out however full the port is; 0 is
	// DefaultPortInflight.
	PortInflight int
	// GSI, when set, receives the MADs that arrive for QP1, the general
	// services interface (see GSIHandler; Engine.SetGSI changes it).
	// Without one, packets for QP1 are dropped, as for a QP that is not
	// there.
	GSI GSIHandler
	// CommEstablished, when set, is told the number of each connected QP
	// (RC or UC) that receives the first request it executes since it
	// entered RTR, in sequence: IBA 11.6.3.1's "communication
	// established", which a connection manager takes as the RTU it may
	// have lost (IBA 12.9.6). It is called under the engine's lock, once
	// per connection, and must neither block nor call the engine.
	CommEstablished func(qpn uint32)
	// Seed, when not 0, seeds the engine's random numbers — the QPNs it
	// gives out and, when it makes the Memory, the regions' keys — so that
	// a test or a fuzzer sees the same numbers every run. 0 seeds them
	// from crypto/rand: nobody on the network can predict them.
	Seed uint64
	// ECT marks the packets of connected QPs ECN-capable, ECT(0), so that
	// a congested queue that marks CE instead of dropping tells their
	// responder, which answers with a CNP (cc.go). Without it the traffic
	// class goes out as given, as rxe sends it. CE marks are answered and
	// CNPs obeyed either way.
	ECT bool
}

// Stats counts what an engine did.
type Stats struct {
	// Dropped counts the received packets the engine dropped for any
	// reason, the Rejected ones included.
	Sent, Received, Dropped      uint64
	Retransmits, Timeouts        uint64
	RNRNAKsSent, RNRNAKsReceived uint64
	NAKsSent, NAKsReceived       uint64
	// DuplicateRequests counts request packets the responder had already
	// executed (a PSN behind the expected one, IBA 9.7.4.1.2): answered
	// again, never executed twice. rxe counts these as duplicate_request.
	DuplicateRequests uint64
	// DuplicateResponses counts acknowledgements, READ responses and
	// atomic acknowledgements the completer had already seen: an ACK for
	// PSNs already acknowledged, a response for data already received.
	DuplicateResponses uint64
	// Rejected counts, by reason, the packets for one of the engine's
	// queue pairs that failed the checks rxe's hdr_check makes before a
	// packet reaches its QP (QP.admit).
	Rejected [NumRejectReasons]uint64
	// GSIReceived counts the MADs handed to the GSI handler, GSISent those
	// SendMAD sent (in Received and Sent too); GSIDropped, by reason, the
	// packets for QP1 dropped (in Dropped too, not in Rejected).
	GSIReceived, GSISent uint64
	GSIDropped           [NumGSIDropReasons]uint64
	// CNPsSent counts the congestion notifications the responders sent
	// for CE-marked requests, CNPsReceived those the requesters took;
	// WindowCuts the times a requester's congestion window was cut, for
	// delay, loss or CNPs (cc.go).
	CNPsSent, CNPsReceived, WindowCuts uint64
}

// RejectReason says why the engine refused a packet addressed to one of
// its queue pairs before its responder or completer saw it (QP.admit).
type RejectReason int

// Reject reasons.
const (
	RejectAddress    RejectReason = iota // a connected QP's packet not from its peer's address to its own
	RejectPKey                           // a P_Key that does not match the port's default one
	RejectQKey                           // a UD packet whose Q_Key is not its QP's
	NumRejectReasons                     // how many reasons there are
)

var rejectNames = [NumRejectReasons]string{"address", "pkey", "qkey"}

// String names the reason as metrics label it.
func (r RejectReason) String() string {
	if r < 0 || r >= NumRejectReasons {
		return fmt.Sprintf("reason_%d", int(r))
	}
	return rejectNames[r]
}

// Engine is the transport of one port. Its methods are safe for
// concurrent use.
type Engine struct {
	cfg Config
	mem *Memory

	mu        sync.Mutex
	qps       map[uint32]*QP
	paths     map[netip.Addr]*ccPath // congestion control's, by destination
	ccBytes   int                    // bytes in flight of the controlled QPs (QP.countInflight)
	lingering int                    // killed or closed QPs in qps (QP.linger)
	rng       *rand.ChaCha8          // QPNs (newRand)
	ipID      uint16
	gsiPSN    roce.PSN // the PSN of QP1's next MAD (SendMAD)
	// curUrgent tells that cur holds a frame that must go out at the end
	// of the call that built it: any but an acknowledgement that may wait
	// (Config.AckDelay).
	curUrgent bool
	// ackDue is when the acknowledgements waiting in cur must go out, in
	// Unix nanoseconds of cfg.Now; 0 when none waits. FlushAcks reads it
	// without the lock.
	ackDue atomic.Int64

	async   AsyncOutput // cfg.Out when it writes asynchronously
	free    chan *Batch // batches not handed out
	cur     *Batch      // the batch being filled, nil when none
	bufSize int         // bytes of a transmit buffer
	made    int         // batches newBatch has made
	curBufs int         // buffers of cur in use

	// tickAt is when the caller of Tick plans to call it next (PlanTick),
	// zero when it plans to wait for a timer to be set; tickAcks says
	// whether its plan counts the acknowledgements that wait for company.
	// A queue pair that sets a timer before tickAt signals tickWake.
	tickAt   time.Time
	tickAcks bool
	tickWake chan struct{}

	gsi atomic.Pointer[GSIHandler] // Config.GSI, SetGSI

	stats struct {
		sent, received, dropped, retransmits, timeouts atomic.Uint64
		rnrSent, rnrReceived, naksSent, naksReceived   atomic.Uint64
		dupRequests, dupResponses                      atomic.Uint64
		rejected                                       [NumRejectReasons]atomic.Uint64
		gsiReceived, gsiSent                           atomic.Uint64
		gsiDropped                                     [NumGSIDropReasons]atomic.Uint64
		cnpSent, cnpReceived, windowCuts               atomic.Uint64
	}
}

// txBatchSize is how many frames the engine gathers before handing them
// to the Output; asyncBatches how many batches an engine with an
// AsyncOutput has (so that many can be queued for writing at once).
// Batches of 85 frames at MTU 1500 (room for the 62 packets of a whole
// UDP GSO super-frame) measured no faster than 32 (docs/performance-log.md,
// window in bytes) and took 1 MiB per port: 64 pods' ports 40 MiB more.
const (
	txBatchSize  = 32
	asyncBatches = 8
)

// NewEngine returns an engine for cfg.
func NewEngine(cfg Config) *Engine {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Memory == nil {
		cfg.Memory = NewMemory(cfg.Seed)
	}
	if cfg.MTU == 0 {
		cfg.MTU = 1500
	}
	e := &Engine{cfg: cfg, mem: cfg.Memory, qps: map[uint32]*QP{}, rng: newRand(cfg.Seed, "qpns"), tickWake: make(chan struct{}, 1)}
	e.SetGSI(cfg.GSI)
	size := cfg.Out.Headroom() + cfg.MTU + roce.EthernetLen
	n := 1
	if a, ok := cfg.Out.(AsyncOutput); ok {
		e.async, n = a, asyncBatches
	}
	// The free list keeps, beyond the batches made now, those made while
	// all were out, up to as many bytes as asyncBatches take at MTU 9000:
	// at MTU 1500 the window of 512 packets (window) holds more than eight
	// batches of 32, and a spinning port's writer gave them back only
	// after the engine had made new ones, for the garbage collector
	// (write_bw 64 KiB 0.77× TCP, the collector busy; docs/performance-log.md,
	// window in bytes).
	keep := n
	if n > 1 {
		keep = max(n, n*9000/cfg.MTU)
	}
	e.free = make(chan *Batch, keep)
	e.bufSize = size
	for range n {
		e.free <- e.newBatch()
	}
	return e
}

// newBatch makes a batch with room for txBatchSize transmit buffers,
// which frame allocates on first use, so that memory follows the frames
// a batch has carried, not its room: a pod's engine that only ever sends
// one frame at a time keeps one buffer per batch, not txBatchSize (64
// pods of 16 QPs: 48 MB of never-used buffers). A released batch goes
// back to the free list, or, when the list is full (it was made while all
// were out), to the garbage collector.
func (e *Engine) newBatch() *Batch {
	e.made++
	b := &Batch{Frames: make([][]byte, 0, txBatchSize), bufs: make([][]byte, txBatchSize), refs: make([][]byte, txBatchSize), free: e.free}
	b.Release = func() {
		b.reset()
		select {
		case b.free <- b:
		default:
		}
	}
	return b
}

// reset empties the batch and unpins the regions its references held.
func (b *Batch) reset() {
	b.Frames, b.Refs = b.Frames[:0], nil
	for i, mr := range b.pins {
		mr.pins.Add(-1)
		b.pins[i] = nil
	}
	b.pins = b.pins[:0]
}

// Memory returns the engine's memory regions.
func (e *Engine) Memory() *Memory { return e.mem }

// Stats returns a snapshot of the counters.
func (e *Engine) Stats() Stats {
	s := Stats{
		Sent: e.stats.sent.Load(), Received: e.stats.received.Load(), Dropped: e.stats.dropped.Load(),
		Retransmits: e.stats.retransmits.Load(), Timeouts: e.stats.timeouts.Load(),
		RNRNAKsSent: e.stats.rnrSent.Load(), RNRNAKsReceived: e.stats.rnrReceived.Load(),
		NAKsSent: e.stats.naksSent.Load(), NAKsReceived: e.stats.naksReceived.Load(),
		DuplicateRequests: e.stats.dupRequests.Load(), DuplicateResponses: e.stats.dupResponses.Load(),
		GSIReceived: e.stats.gsiReceived.Load(), GSISent: e.stats.gsiSent.Load(),
		CNPsSent: e.stats.cnpSent.Load(), CNPsReceived: e.stats.cnpReceived.Load(), WindowCuts: e.stats.windowCuts.Load(),
	}
	for r := range s.Rejected {
		s.Rejected[r] = e.stats.rejected[r].Load()
	}
	for r := range s.GSIDropped {
		s.GSIDropped[r] = e.stats.gsiDropped[r].Load()
	}
	return s
}

// frame returns the next transmit buffer (behind the headroom), flushing
// the batch when it is full and waiting for a free batch when an
// asynchronous output holds them all. e.mu is held.
func (e *Engine) frame() []byte {
	if e.cur != nil && e.curBufs == len(e.cur.bufs) {
		e.flush()
	}
	if e.cur == nil {
		// With every batch out, make another rather than wait: the output
		// may give batches back only after another engine's lock, which
		// might be waiting for this one (two NICs of the local switch).
		// The output bounds what is queued (a TAP's write queue blocks).
		select {
		case e.cur = <-e.free:
		default:
			e.cur = e.newBatch()
		}
		e.curBufs = 0
	}
	b := e.cur.bufs[e.curBufs]
	if b == nil {
		b = make([]byte, e.bufSize)
		e.cur.bufs[e.curBufs] = b
	}
	e.curBufs++
	return b[e.cfg.Out.Headroom():cap(b)]
}

// unframe gives back the buffer frame returned last, unused.
func (e *Engine) unframe() { e.curBufs-- }

// emit queues the frame just built in the current buffer with length n;
// mayWait marks an acknowledgement that may wait for company
// (Config.AckDelay).
func (e *Engine) emit(n int, mayWait bool) {
	if !mayWait {
		e.curUrgent = true
	}
	b := e.cur.bufs[e.curBufs-1]
	e.cur.Frames = append(e.cur.Frames, b[:e.cfg.Out.Headroom()+n])
	if e.cur.Refs != nil {
		e.cur.Refs = append(e.cur.Refs, nil)
	}
	e.stats.sent.Add(1)
}

// emitRef queues the frame just built as a whole message whose payload is
// ref, in region mr, which stays pinned until the batch is released.
func (e *Engine) emitRef(n int, ref []byte, mr *MR) {
	c := e.cur
	if c.Refs == nil {
		c.Refs = c.refs[:len(c.Frames)]
		clear(c.Refs)
	}
	b := c.bufs[e.curBufs-1]
	c.Frames = append(c.Frames, b[:e.cfg.Out.Headroom()+n])
	c.Refs = append(c.Refs, ref)
	mr.pins.Add(1)
	c.pins = append(c.pins, mr)
	e.curUrgent = true
	e.stats.sent.Add(1)
}

// sendWhole sends p, with no payload of its own, as a whole message for
// the local switch whose payload is ref, in mr: alone in its batch, so
// that the output can route the batch whole. It reports false when p
// could not be encoded (counted as dropped). e.mu is held.
func (e *Engine) sendWhole(p *roce.Packet, ref []byte, mr *MR) bool {
	e.flush()
	b := e.frame()
	p.SetPayloadLen(0)
	m, ok := e.encode(p, b)
	if !ok {
		return false
	}
	e.emitRef(m, ref, mr)
	e.flush()
	return true
}

// stampID gives an IPv4 packet the engine's next IP identification.
// e.mu is held.
func (e *Engine) stampID(p *roce.Packet) {
	if !p.IPv6 {
		e.ipID++
		p.ID = e.ipID
	}
}

// encode stamps p's IP identification and encodes it into b, the buffer
// e.frame gave, whose payload is in place; when p cannot be encoded it
// gives the buffer back, counts a drop and reports false. e.mu is held.
func (e *Engine) encode(p *roce.Packet, b []byte) (int, bool) {
	e.stampID(p)
	m, err := p.Encode(b)
	if err != nil {
		e.unframe()
		e.stats.dropped.Add(1)
		return 0, false
	}
	return m, true
}

// flush hands the queued frames to the Output. e.mu is held.
func (e *Engine) flush() {
	e.curUrgent = false
	e.ackDue.Store(0)
	b := e.cur
	if b == nil {
		return
	}
	if len(b.Frames) == 0 {
		e.curBufs = 0
		return
	}
	if e.async != nil {
		e.cur = nil
		e.async.SendBatch(b)
		return
	}
	e.cfg.Out.Send(b.Frames)
	b.reset()
	e.curBufs = 0
}

// QPConfig describes a queue pair to create (struct ibv_qp_init_attr).
type QPConfig struct {
	Type           abi.QPType
	PD             *PD
	SendCQ, RecvCQ *CQ
	MaxSendWR      int
	MaxRecvWR      int
	MaxInline      int
	SigAll         bool
	// SRQ, when set, is where the QP takes its receive WQEs from
	// (ibv_qp_init_attr.srq); the QP's own receive queue is then unused.
	SRQ *SRQ
	// OnRetire, when set, is told the running counts of send and receive
	// WQEs the QP has retired (completed, signaled or not, or flushed),
	// under the engine's lock: for a client that tracks how full its
	// queues are.
	OnRetire func(send, recv uint64)
	// Refill, when set, is called (under the engine's lock) when a packet
	// needs a receive WQE and the queue is empty, to add any the client
	// has posted where the engine has not seen them yet, through add —
	// as a kernel driver reads a receive queue the application shares.
	Refill func(add func(RecvWR) bool)
	// OnState, when set, is told each new state of the QP (a Modify, or
	// the transport moving it to SQE or ERR), under the engine's lock.
	OnState func(abi.QPState)
}

// CreateQP creates a queue pair in the RESET state. Its number is random
// in the 24-bit space, unique among the engine's QPs (the killed and
// closed ones that linger included), and neither 0, 1 (QP0 and QP1, the
// SMI and GSI) nor 0xFFFFFF (the multicast QPN): a host on the network
// that cannot guess a QPN cannot aim packets at it, where sequential
// numbers gave every QP's away.
func (e *Engine) CreateQP(c QPConfig) (*QP, error) {
	if c.PD == nil || c.SendCQ == nil || c.RecvCQ == nil || c.MaxSendWR < 0 || c.MaxRecvWR < 0 {
		return nil, fmt.Errorf("%w: queue pair needs a PD and CQs", ErrInvalid)
	}
	if c.Type != abi.RC && c.Type != abi.UD && c.Type != abi.UC {
		return nil, fmt.Errorf("%w: QP type %v", ErrInvalid, c.Type)
	}
	if c.SRQ != nil && (c.SRQ.e != e || c.SRQ.pd != c.PD) {
		return nil, fmt.Errorf("%w: the SRQ belongs to another device or PD", ErrInvalid)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	num := uint32(0)
	for num < 2 || num == roce.QPNMask || e.qps[num] != nil {
		num = uint32(e.rng.Uint64()) & roce.QPNMask
	}
	qp := &QP{e: e, num: num, cfg: c, state: abi.QPSReset}
	// An empty queue is allowed, as rxe allows it (qperf's one-way tests
	// make QPs that only send or only receive): it takes no work.
	qp.sq = make([]sendWQE, max(c.MaxSendWR, 1))
	qp.rq = make([]recvWQE, max(c.MaxRecvWR, 1))
	qp.cache = make([]respEntry, 16)
	qp.addRecv = qp.addRecvLocked
	if c.SRQ != nil {
		c.SRQ.users++
	}
	e.qps[qp.num] = qp
	return qp, nil
}

// DestroyQP removes a queue pair; packets for it are dropped from then on.
func (e *Engine) DestroyQP(qp *QP) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.holds(qp); err != nil {
		return err
	}
	e.remove(qp)
	return nil
}

// holds reports an error when qp is not the engine's. e.mu is held.
func (e *Engine) holds(qp *QP) error {
	if e.qps[qp.num] != qp {
		return fmt.Errorf("%w: queue pair %#x is not there", ErrInvalid, qp.num)
	}
	return nil
}

// Kill ends a queue pair whose owner is gone, such as a client process
// that died, so that its peer fails instead of waiting for it. The QP
// goes to the error state at once, its work flushed as a modify to ERR
// flushes it (IBA 10.3.1), and then lingers for linger, measured with the
// engine's clock and checked by Tick, answering what arrives for it as a
// closed QP does (lingerAnswer): duplicates of what it executed again,
// and after a quiet spell NAKs for the rest, so that the peer fails
// instead of retrying forever. Then the QP is removed as DestroyQP removes
// it; a linger of zero or less removes it at once. A killed QP refuses
// Modify and posts.
func (e *Engine) Kill(qp *QP, linger time.Duration) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.flush()
	if err := e.holds(qp); err != nil {
		return err
	}
	if qp.state != abi.QPSErr {
		qp.toError(abi.WCWRFlushErr, false)
	}
	e.retire(qp, linger)
	return nil
}

// Close destroys a queue pair at its owner's request (ibv_destroy_qp,
// IBA 11.2.4.4): its outstanding work is dropped without completions and
// nothing it does reaches its CQs again. An RC QP that has had a peer
// (RTR or later) lingers before it goes (lingerAnswer): the last request
// it executed may still wait for an acknowledgement the network lost, and
// the requester, which retries into silence (forever with rxe's retry_cnt
// of 7) when nothing answers, gets it again; a request it never executed
// goes unanswered for a quiet spell, as at rxe once the QP is gone, and is
// NAKed after it. Any other QP, or a linger of zero or less, is removed at
// once, as DestroyQP removes it.
func (e *Engine) Close(qp *QP, linger time.Duration) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.flush()
	if err := e.holds(qp); err != nil {
		return err
	}
	if qp.cfg.Type != abi.RC || qp.state < abi.QPSRTR || !qp.tmpl.Dst.IsValid() {
		linger = 0
	}
	qp.state = abi.QPSErr
	e.retire(qp, linger)
	return nil
}

// retire removes a killed or closed QP, after linger when it is
// positive. e.mu is held.
func (e *Engine) retire(qp *QP, linger time.Duration) {
	if linger <= 0 {
		e.remove(qp)
		qp.killed = true // refuses Modify and posts all the same
		return
	}
	qp.linger(linger)
}

// remove takes a queue pair out of the engine. e.mu is held.
func (e *Engine) remove(qp *QP) {
	delete(e.qps, qp.num)
	qp.releasePath()
	if qp.killed {
		e.lingering--
	}
	qp.state = abi.QPSReset
	qp.killAt = time.Time{}
	if qp.cfg.SRQ != nil {
		qp.cfg.SRQ.users--
	}
}

// Receive handles a RoCEv2 packet addressed to the port (the station
// checked the ICRC): requests go to the responder of their QP, responses
// and acknowledgements to its completer, and what is for QP1 to the GSI
// handler (Config.GSI) — the one compare an ordinary packet pays for it.
func (e *Engine) Receive(frame []byte, p *roce.Packet) {
	if p.BTH.DestQP == GSIQPN {
		e.receiveGSI(frame, p)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.flushUrgent()
	e.receiveLocked(frame, p, nil)
}

// flushUrgent is flush, except that when everything queued is
// acknowledgements that may wait (Config.AckDelay), and their time is not
// up, they stay queued. e.mu is held.
func (e *Engine) flushUrgent() {
	if e.cfg.AckDelay > 0 && e.cur != nil && len(e.cur.Frames) > 0 && !e.curUrgent {
		now := e.cfg.Now().UnixNano()
		due := e.ackDue.Load()
		if due == 0 {
			e.ackDue.Store(now + int64(e.cfg.AckDelay))
			if e.tickAcks {
				e.timerSet(time.Unix(0, now+int64(e.cfg.AckDelay)))
			}
			return
		}
		if now < due {
			return
		}
	}
	e.flush()
}

// AckDue is when the held acknowledgements are due, in Unix ns; 0: none.
func (e *Engine) AckDue() int64 { return e.ackDue.Load() }

// AckDelay returns the engine's Config.AckDelay.
func (e *Engine) AckDelay() time.Duration { return e.cfg.AckDelay }

// FlushAcks is Engine.FlushAcks for the queue pair's engine.
func (qp *QP) FlushAcks() { qp.e.FlushAcks() }

// FlushAcks sends the acknowledgements that waited for company
// (Config.AckDelay) once their time is up. It costs a clock reading and
// an atomic load when none is due, for pollers to call whenever they
// find nothing to do.
func (e *Engine) FlushAcks() {
	due := e.ackDue.Load()
	if due == 0 || e.cfg.Now().UnixNano() < due {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ackDue.Load() != 0 {
		e.flush()
	}
}

// receiveLocked is Receive with e.mu held; ref is ReceiveLocal's.
func (e *Engine) receiveLocked(frame []byte, p *roce.Packet, ref []byte) {
	e.stats.received.Add(1)
	qp := e.qps[p.BTH.DestQP]
	if qp != nil && p.BTH.Opcode == roce.CNP && qp.cfg.Type != abi.UD && !qp.killed {
		if _, ok := qp.admit(p); ok {
			e.stats.cnpReceived.Add(1)
			qp.cc.cnp(e.cfg.Now(), qp.acked, qp.sentTo)
			return
		}
	}
	if qp == nil || !qp.acceptsTransport(p.BTH.Opcode) {
		e.stats.dropped.Add(1)
		return
	}
	if r, ok := qp.admit(p); !ok {
		e.stats.rejected[r].Add(1)
		e.stats.dropped.Add(1)
		return
	}
	info := p.Info()
	switch {
	case qp.killed:
		qp.lingerAnswer(frame, p)
	case info.Has(roce.Request):
		qp.respond(frame, p, ref)
	case info.Flags&(roce.Response|roce.Ack) != 0:
		qp.complete(frame, p, ref)
	default:
		e.stats.dropped.Add(1)
	}
}

// Barrier waits until whatever the engine is doing under its lock is
// done. After Memory.Deregister and a Barrier, nothing but the pinned
// frames of a local switch (MR.Pinned) refers to the region's memory.
func (e *Engine) Barrier() {
	e.mu.Lock()
	//lint:ignore SA2001 an empty critical section is the point
	e.mu.Unlock()
}

// QPCount returns how many queue pairs the engine holds (killed and
// closed ones included until their linger ends).
func (e *Engine) QPCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.qps)
}

// ReceiveLocalBatch handles frames of a local switch as ReceiveLocal does
// each, in order, under one hold of the engine's lock and with one flush
// at the end, so that the answers to many requests leave together: an
// answer in a batch of its own holds a batch of buffers until the
// receiving NIC polls, and with every batch out the engine makes another
// (BenchmarkLocalAtomic). next parses the next frame into p and returns
// it with its reference; ok false ends the batch. next must not call the
// engine.
func (e *Engine) ReceiveLocalBatch(p *roce.Packet, next func(p *roce.Packet) (frame, ref []byte, ok bool)) {
	e.mu.Lock()
	whole := false
	for {
		frame, ref, ok := next(p)
		if !ok {
			break
		}
		if p.BTH.DestQP == GSIQPN {
			// The GSI handler runs without the lock: it may send.
			e.mu.Unlock()
			e.receiveGSI(frame, p)
			e.mu.Lock()
			continue
		}
		whole = whole || ref != nil
		e.receiveLocked(frame, p, ref)
	}
	if whole {
		e.flush()
	} else {
		e.flushUrgent()
	}
	e.mu.Unlock()
}

// ReceiveLocal handles a frame of a local switch: like Receive, and when
// ref is not nil the frame is a whole message whose payload is ref (see
// Config.Local), in the sender's memory and valid only during the call.
func (e *Engine) ReceiveLocal(frame []byte, p *roce.Packet, ref []byte) {
	if ref == nil || p.BTH.DestQP == GSIQPN {
		e.Receive(frame, p)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.flush()
	e.receiveLocked(frame, p, ref)
}

// Tick runs the timers that are due: retransmission after a local ACK
// timeout, resumption after an RNR delay, the removal of a killed queue
// pair whose linger is over (Kill, Close).
func (e *Engine) Tick() {
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.flush()
	now := e.cfg.Now()
	for _, qp := range e.qps {
		if qp.killed {
			if !now.Before(qp.killAt) {
				e.remove(qp)
			}
			continue
		}
		qp.tick(now)
	}
}

// PlanTick returns when Tick should run next — NextDeadline, counting
// the acknowledgements that wait for company only when acks is set (a
// caller whose pollers call FlushAcks leaves them out, so that Tick need
// not run every few microseconds) — and records the plan: until Tick or
// PlanTick runs again, a queue pair that sets an earlier timer signals
// TickWake. With no deadline (false) the caller may sleep until
// TickWake. Ticking this way, an idle engine wakes no one, where ticking
// every millisecond woke an idle appliance a thousand times a second.
func (e *Engine) PlanTick(acks bool) (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	next, ok := e.nextDeadlineLocked(acks)
	e.tickAt, e.tickAcks = next, acks
	return next, ok
}

// TickWake is signalled when a queue pair sets a timer earlier than the
// plan PlanTick recorded: the caller of Tick should plan again.
func (e *Engine) TickWake() <-chan struct{} { return e.tickWake }

// timerSet is told, with e.mu held, that a timer was set for t.
func (e *Engine) timerSet(t time.Time) {
	if e.tickAt.IsZero() || t.Before(e.tickAt) {
		e.tickAt = t
		select {
		case e.tickWake <- struct{}{}:
		default:
		}
	}
}

// NextDeadline returns the earliest timer of any queue pair, or when the
// acknowledgements that wait for company are due.
func (e *Engine) NextDeadline() (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.nextDeadlineLocked(true)
}

// nextDeadlineLocked is NextDeadline, with or without the held
// acknowledgements, with e.mu held.
func (e *Engine) nextDeadlineLocked(acks bool) (time.Time, bool) {
	var next time.Time
	if due := e.ackDue.Load(); acks && due != 0 {
		next = time.Unix(0, due)
	}
	for _, qp := range e.qps {
		for _, t := range []time.Time{qp.retryAt, qp.rnrAt, qp.nakAt, qp.killAt, qp.cc.fastAt} {
			if !t.IsZero() && (next.IsZero() || t.Before(next)) {
				next = t
			}
		}
	}
	return next, !next.IsZero()
}

// Errors of posting.
var (
	ErrQueueFull = fmt.Errorf("%w: work queue full", ErrInvalid)
	ErrState     = fmt.Errorf("%w: queue pair state does not allow it", ErrInvalid)
)

// sourceAddr returns the address of GID index i.
func (e *Engine) sourceAddr(i uint8) (netip.Addr, error) {
	if int(i) >= len(e.cfg.GIDs) {
		return netip.Addr{}, fmt.Errorf("%w: GID index %d of %d", ErrInvalid, i, len(e.cfg.GIDs))
	}
	return e.cfg.GIDs[i].Addr(), nil
}
