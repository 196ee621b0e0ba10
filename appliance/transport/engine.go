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

	tx      [][]byte // frame buffers with headroom
	txN     int
	txBatch [][]byte

	stats struct {
		sent, received, dropped, retransmits, timeouts     atomic.Uint64
		rnrSent, rnrReceived, naksSent, naksReceived, dups atomic.Uint64
	}
}

// txBatchSize is how many frames the engine gathers before handing them
// to the Output.
const txBatchSize = 32

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
	e.tx = make([][]byte, txBatchSize)
	for i := range e.tx {
		e.tx[i] = make([]byte, size)
	}
	e.txBatch = make([][]byte, 0, txBatchSize)
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
// the batch when it is full. e.mu is held.
func (e *Engine) frame() []byte {
	if e.txN == len(e.tx) {
		e.flush()
	}
	b := e.tx[e.txN]
	e.txN++
	return b[e.cfg.Out.Headroom():cap(b)]
}

// emit queues the frame just built in the current buffer with length n.
func (e *Engine) emit(n int) {
	b := e.tx[e.txN-1]
	e.txBatch = append(e.txBatch, b[:e.cfg.Out.Headroom()+n])
	e.stats.sent.Add(1)
}

// flush hands the queued frames to the Output. e.mu is held.
func (e *Engine) flush() {
	if len(e.txBatch) > 0 {
		e.cfg.Out.Send(e.txBatch)
	}
	e.txBatch = e.txBatch[:0]
	e.txN = 0
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
}

// CreateQP creates a queue pair in the RESET state.
func (e *Engine) CreateQP(c QPConfig) (*QP, error) {
	if c.PD == nil || c.SendCQ == nil || c.RecvCQ == nil || c.MaxSendWR <= 0 || c.MaxRecvWR < 0 {
		return nil, fmt.Errorf("%w: queue pair needs a PD, CQs and a send queue", ErrInvalid)
	}
	if c.Type != RC && c.Type != UD && c.Type != UC {
		return nil, fmt.Errorf("%w: QP type %v", ErrInvalid, c.Type)
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
