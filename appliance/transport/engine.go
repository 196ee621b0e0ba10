package transport

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taproce/taproce/appliance/roce"
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
// frames. An engine never reuses a batch before that, and waits for one
// when all are out.
type AsyncOutput interface {
	Output
	SendBatch(b *Batch)
}

// Batch is a set of frames an engine hands to an AsyncOutput.
type Batch struct {
	// Frames are the frames, each behind Headroom() bytes.
	Frames [][]byte
	// Release gives the batch back to its engine. It is a field, bound
	// once, so handing it on allocates nothing.
	Release func()

	bufs [][]byte
	free chan *Batch
}

// Config describes an engine: one port's transport.
type Config struct {
	// MAC is the port's address.
	MAC roce.MAC
	// GIDs is the port's GID table; address vectors name the source GID
	// by index.
	GIDs []roce.GID
	// MTU is the netdev MTU; it bounds the path MTU.
	MTU int
	// Out receives the frames.
	Out Output
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Memory holds the registered regions (default: a new one).
	Memory *Memory
}

// Stats counts what an engine did.
type Stats struct {
	Sent, Received, Dropped      uint64
	Retransmits, Timeouts        uint64
	RNRNAKsSent, RNRNAKsReceived uint64
	NAKsSent, NAKsReceived       uint64
	Duplicates                   uint64
}

// Engine is the transport of one port. Its methods are safe for
// concurrent use.
type Engine struct {
	cfg Config
	mem *Memory

	mu      sync.Mutex
	qps     map[uint32]*QP
	nextQPN uint32
	ipID    uint16

	async   AsyncOutput // cfg.Out when it writes asynchronously
	free    chan *Batch // batches not handed out
	cur     *Batch      // the batch being filled, nil when none
	curBufs int         // buffers of cur in use

	stats struct {
		sent, received, dropped, retransmits, timeouts     atomic.Uint64
		rnrSent, rnrReceived, naksSent, naksReceived, dups atomic.Uint64
	}
}

// txBatchSize is how many frames the engine gathers before handing them
// to the Output; asyncBatches how many batches an engine with an
// AsyncOutput has (so that many can be queued for writing at once).
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
		cfg.Memory = &Memory{}
	}
	if cfg.MTU == 0 {
		cfg.MTU = 1500
	}
	e := &Engine{cfg: cfg, mem: cfg.Memory, qps: map[uint32]*QP{}, nextQPN: 0x10}
	size := cfg.Out.Headroom() + cfg.MTU + roce.EthernetLen
	n := 1
	if a, ok := cfg.Out.(AsyncOutput); ok {
		e.async, n = a, asyncBatches
	}
	e.free = make(chan *Batch, n)
	for range n {
		b := &Batch{Frames: make([][]byte, 0, txBatchSize), bufs: make([][]byte, txBatchSize), free: e.free}
		for i := range b.bufs {
			b.bufs[i] = make([]byte, size)
		}
		b.Release = func() {
			b.Frames = b.Frames[:0]
			b.free <- b
		}
		e.free <- b
	}
	return e
}

// Memory returns the engine's memory regions.
func (e *Engine) Memory() *Memory { return e.mem }

// Stats returns a snapshot of the counters.
func (e *Engine) Stats() Stats {
	return Stats{
		Sent: e.stats.sent.Load(), Received: e.stats.received.Load(), Dropped: e.stats.dropped.Load(),
		Retransmits: e.stats.retransmits.Load(), Timeouts: e.stats.timeouts.Load(),
		RNRNAKsSent: e.stats.rnrSent.Load(), RNRNAKsReceived: e.stats.rnrReceived.Load(),
		NAKsSent: e.stats.naksSent.Load(), NAKsReceived: e.stats.naksReceived.Load(),
		Duplicates: e.stats.dups.Load(),
	}
}

// frame returns the next transmit buffer (behind the headroom), flushing
// the batch when it is full and waiting for a free batch when an
// asynchronous output holds them all. e.mu is held.
func (e *Engine) frame() []byte {
	if e.cur != nil && e.curBufs == len(e.cur.bufs) {
		e.flush()
	}
	if e.cur == nil {
		e.cur = <-e.free
		e.curBufs = 0
	}
	b := e.cur.bufs[e.curBufs]
	e.curBufs++
	return b[e.cfg.Out.Headroom():cap(b)]
}

// unframe gives back the buffer frame returned last, unused.
func (e *Engine) unframe() { e.curBufs-- }

// emit queues the frame just built in the current buffer with length n.
func (e *Engine) emit(n int) {
	b := e.cur.bufs[e.curBufs-1]
	e.cur.Frames = append(e.cur.Frames, b[:e.cfg.Out.Headroom()+n])
	e.stats.sent.Add(1)
}

// flush hands the queued frames to the Output. e.mu is held.
func (e *Engine) flush() {
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
	b.Frames = b.Frames[:0]
	e.curBufs = 0
}

// QPConfig describes a queue pair to create (struct ibv_qp_init_attr).
type QPConfig struct {
	Type           QPType
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
}

// CreateQP creates a queue pair in the RESET state.
func (e *Engine) CreateQP(c QPConfig) (*QP, error) {
	if c.PD == nil || c.SendCQ == nil || c.RecvCQ == nil || c.MaxSendWR <= 0 || c.MaxRecvWR < 0 {
		return nil, fmt.Errorf("%w: queue pair needs a PD, CQs and a send queue", ErrInvalid)
	}
	if c.Type != RC && c.Type != UD && c.Type != UC {
		return nil, fmt.Errorf("%w: QP type %v", ErrInvalid, c.Type)
	}
	if c.SRQ != nil && (c.SRQ.e != e || c.SRQ.pd != c.PD) {
		return nil, fmt.Errorf("%w: the SRQ belongs to another device or PD", ErrInvalid)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.qps[e.nextQPN] != nil || e.nextQPN < 2 {
		e.nextQPN = (e.nextQPN + 1) & roce.QPNMask
	}
	qp := &QP{e: e, num: e.nextQPN, cfg: c, state: StateReset}
	qp.sq = make([]sendWQE, c.MaxSendWR)
	qp.rq = make([]recvWQE, max(c.MaxRecvWR, 1))
	qp.cache = make([]respEntry, 16)
	if c.SRQ != nil {
		c.SRQ.users++
	}
	e.qps[qp.num] = qp
	e.nextQPN = (e.nextQPN + 1) & roce.QPNMask
	return qp, nil
}

// DestroyQP removes a queue pair; packets for it are dropped from then on.
func (e *Engine) DestroyQP(qp *QP) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.qps[qp.num] != qp {
		return fmt.Errorf("%w: queue pair %#x is not there", ErrInvalid, qp.num)
	}
	delete(e.qps, qp.num)
	qp.state = StateReset
	if qp.cfg.SRQ != nil {
		qp.cfg.SRQ.users--
	}
	return nil
}

// Receive handles a RoCEv2 packet addressed to the port (the station
// checked the ICRC): requests go to the responder of their QP, responses
// and acknowledgements to its completer.
func (e *Engine) Receive(frame []byte, p *roce.Packet) {
	e.stats.received.Add(1)
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.flush()
	qp := e.qps[p.BTH.DestQP]
	if qp == nil || !qp.acceptsTransport(p.BTH.Opcode) {
		e.stats.dropped.Add(1)
		return
	}
	info := p.Info()
	switch {
	case info.Has(roce.Request):
		qp.respond(frame, p)
	case info.Flags&(roce.Response|roce.Ack) != 0:
		qp.complete(frame, p)
	default:
		e.stats.dropped.Add(1)
	}
}

// Tick runs the timers that are due: retransmission after a local ACK
// timeout, resumption after an RNR delay.
func (e *Engine) Tick() {
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.flush()
	now := e.cfg.Now()
	for _, qp := range e.qps {
		qp.tick(now)
	}
}

// NextDeadline returns the earliest timer of any queue pair.
func (e *Engine) NextDeadline() (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var next time.Time
	for _, qp := range e.qps {
		for _, t := range []time.Time{qp.retryAt, qp.rnrAt, qp.nakAt} {
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
