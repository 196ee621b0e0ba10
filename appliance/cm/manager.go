package cm

import (
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"
)

// Config describes a manager: the CM of one port.
type Config struct {
	// Wire sends the manager's MADs.
	Wire Wire
	// Events receives what happens to IDs, each event once, in the order
	// the manager made them. It is called without the manager's lock
	// held and may call the manager (Accept from a ConnectRequest).
	Events func(Event)
	// Now is the clock (default time.Now).
	Now func() time.Time
	// GUID is the port's CA GUID, the REQ's and REP's Local CA GUID
	// (Linux's node GUID; rxe derives it from the MAC, EUI-64 style). It
	// must not be 0 and should be unique: peers find their connections
	// by it and the communication ID or QPN (duplicate and stale
	// connection detection), as Linux's CM does.
	GUID uint64
	// Seed, when not 0, seeds the communication IDs and transaction IDs,
	// so that a test sees the same ones every run; 0 seeds them from
	// crypto/rand.
	Seed uint64
	// MaxConns bounds the connection IDs (0: DefaultMaxConns);
	// MaxListeners the listeners (0: DefaultMaxListeners).
	MaxConns     int
	MaxListeners int
	// AckDelay is the port's CA ACK delay code, the REP's target ACK
	// delay (0: DefaultAckDelay).
	AckDelay uint8
	// PacketLifeTime is the paths' packet lifetime code (0:
	// DefaultPacketLifeTime).
	PacketLifeTime uint8
	// ListenGrace is how long a request for a service nobody listens on
	// (a REQ, a SIDR_REQ) waits for a listener before it is rejected
	// (REJ 8; SIDR_REP "service ID not supported"); 0: DefaultListenGrace,
	// negative: none, at once, as Linux's CM answers.
	ListenGrace time.Duration
}

// Manager is the connection manager of one port (IBA vol. 1 ch. 12, with
// the RDMA CM's conventions of Linux's cma.c on top): a state machine
// with no I/O of its own. MADs come in through Receive and go out
// through Config.Wire; time comes from Config.Now and moves on in Tick;
// what happens to an ID goes to its owner through Config.Events.
//
// Its methods are safe for concurrent use. They hold the manager's lock
// while they change state and release it before they send MADs or
// deliver events, which they do in the order they were made; a call made
// from within Events or Wire.SendMAD (a re-entrant call) queues its own
// behind them.
type Manager struct {
	cfg  Config
	wake chan struct{} // TimerWake

	mu         sync.Mutex
	rng        *rand.ChaCha8
	idOperand  uint32 // XORed into local communication IDs (Linux's random_id_operand)
	idCounter  uint32 // the next local communication ID before the XOR (Linux's local_id_next)
	hiTID      uint32 // the high half of the manager's transaction IDs (Linux's MAD agent hi_tid)
	nextHandle ID

	conns     map[ID]*conn
	listeners map[ID]*listener
	byService map[ServiceID][]*listener
	// byLocal finds a connection by its local communication ID
	// (Linux's local_id_table); byRemote by the peer's communication ID
	// and CA GUID (remote_id_table: duplicate REQs and REPs);
	// byRemoteQPN by the peer's QPN and CA GUID (remote_qp_table: stale
	// connections); byQPN a passive connection waiting for its RTU by
	// its local QPN (CommEstablished); sidrIn a SIDR_REQ handed up by
	// its source and request ID (remote_sidr_table).
	byLocal     map[uint32]*conn
	byRemote    map[remoteKey]*conn
	byRemoteQPN map[remoteKey]*conn
	byQPN       map[uint32]*conn
	sidrIn      map[sidrKey]*conn

	rx Message // the MAD being received

	// unheard are the requests that wait for a listener of their service
	// (Config.ListenGrace), oldest first.
	unheard []unheard

	// out and events wait to be sent and delivered once the lock is
	// released; flushing says that a call is doing so.
	out      []outMAD
	events   []Event
	flushing bool

	stats Stats
}

// unheard is a request for a service nobody listened on when it came.
type unheard struct {
	src, dst netip.Addr
	msg      Message
	deadline time.Time
}

type remoteKey struct {
	id   uint32 // a communication ID or a QPN
	guid uint64
}

type sidrKey struct {
	src netip.Addr
	id  uint32
}

type outMAD struct {
	r   Route
	mad [MADLen]byte
}

// listener is an ID in StateListen.
type listener struct {
	id      ID
	owner   Owner
	sid     ServiceID
	ps      PortSpace
	addr    netip.Addr // valid when listening on one address
	any4    bool       // 0.0.0.0: any IPv4 address
	qpType  QPType
	backlog int
	pending int // connection IDs handed up and not yet answered
}

// New returns a manager for cfg.
func New(cfg Config) (*Manager, error) {
	if cfg.Wire == nil {
		return nil, fmt.Errorf("%w: no Wire", ErrInvalid)
	}
	if cfg.GUID == 0 {
		return nil, fmt.Errorf("%w: no CA GUID", ErrInvalid)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Events == nil {
		cfg.Events = func(Event) {}
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.ListenGrace == 0 {
		cfg.ListenGrace = DefaultListenGrace
	}
	if cfg.MaxListeners <= 0 {
		cfg.MaxListeners = DefaultMaxListeners
	}
	if cfg.AckDelay == 0 {
		cfg.AckDelay = DefaultAckDelay
	}
	if cfg.PacketLifeTime == 0 {
		cfg.PacketLifeTime = DefaultPacketLifeTime
	}
	var seed [32]byte
	if cfg.Seed == 0 {
		if _, err := crand.Read(seed[:]); err != nil {
			return nil, fmt.Errorf("cm: random seed: %w", err)
		}
	} else {
		binary.LittleEndian.PutUint64(seed[:], cfg.Seed)
		copy(seed[8:], "taproce connection manager")
	}
	m := &Manager{
		cfg:         cfg,
		rng:         rand.NewChaCha8(seed),
		conns:       map[ID]*conn{},
		listeners:   map[ID]*listener{},
		byService:   map[ServiceID][]*listener{},
		byLocal:     map[uint32]*conn{},
		byRemote:    map[remoteKey]*conn{},
		byRemoteQPN: map[remoteKey]*conn{},
		byQPN:       map[uint32]*conn{},
		sidrIn:      map[sidrKey]*conn{},
		wake:        make(chan struct{}, 1),
	}
	m.idOperand = uint32(m.rng.Uint64())
	m.idCounter = uint32(m.rng.Uint64())
	m.hiTID = uint32(m.rng.Uint64()) | 1
	return m, nil
}

// unlock releases the lock taken by a method and then sends the MADs and
// delivers the events it (and any call meanwhile) queued, unless another
// call is doing so already: that one takes them on.
func (m *Manager) unlock() {
	if m.flushing {
		m.mu.Unlock()
		return
	}
	m.flushing = true
	done := false
	defer func() {
		if !done { // a panic in Wire or Events, with the lock released
			m.mu.Lock()
			m.flushing = false
			m.mu.Unlock()
		}
	}()
	for len(m.out) > 0 || len(m.events) > 0 {
		out, events := m.out, m.events
		m.out, m.events = nil, nil
		m.mu.Unlock()
		for i := range out {
			m.cfg.Wire.SendMAD(out[i].r, &out[i].mad)
		}
		for _, e := range events {
			m.cfg.Events(e)
		}
		m.mu.Lock()
	}
	m.flushing, done = false, true
	m.mu.Unlock()
}

// newHandle returns an unused ID.
func (m *Manager) newHandle() ID {
	m.nextHandle++
	return m.nextHandle
}

// newCommID returns an unused local communication ID: a counter XORed
// with a random operand, as Linux's cm_alloc_id_priv makes them (its
// counter sits in the first byte on the wire, so successive IDs of a
// capture differ there: 0xe4286c10, 0xe5286c10, …). 0 is never given: a
// REJ or MRA of a REQ names the unknown remote ID as 0.
func (m *Manager) newCommID() uint32 {
	for {
		id := bits.ReverseBytes32(m.idCounter) ^ m.idOperand
		m.idCounter++
		if id != 0 && m.byLocal[id] == nil {
			return id
		}
	}
}

// tid returns a new transaction ID for a message c starts (REQ, DREQ,
// SIDR_REQ): the manager's high half and c's communication ID, its bytes
// read little-endian, as Linux's cm_form_tid has it.
func (m *Manager) tid(c *conn) uint64 {
	return uint64(m.hiTID)<<32 | uint64(bits.ReverseBytes32(c.localID))
}

// queue encodes msg and queues it for r, counting it as sent (or as a
// retry).
func (m *Manager) queue(r Route, msg *Message) {
	m.out = append(m.out, outMAD{r: r})
	o := &m.out[len(m.out)-1]
	if _, err := msg.Encode(o.mad[:]); err != nil {
		panic("cm: encoding a message of the manager's own: " + err.Error())
	}
	if i, ok := AttrIndex(msg.Header.AttrID); ok {
		m.stats.Sent[i]++
	}
}

// queueRaw queues an encoded MAD again (a retransmission).
func (m *Manager) queueRaw(r Route, mad *[MADLen]byte) {
	m.out = append(m.out, outMAD{r: r, mad: *mad})
	if i, ok := AttrIndex(MAD(mad[:]).AttrID()); ok {
		m.stats.Retries[i]++
	}
}

func (m *Manager) event(e Event) { m.events = append(m.events, e) }

func (m *Manager) drop(r DropReason) { m.stats.Drops[r]++ }

func (m *Manager) dup(a AttrID) {
	if i, ok := AttrIndex(a); ok {
		m.stats.Duplicates[i]++
	}
}

// cmTime converts a 5-bit IBA time code (4.096 µs × 2^code) the way
// Linux's CM does for its timers (cm_convert_to_ms): 2^(code-8) ms, at
// least 1 ms. The CM's retransmissions, MRA waits and TimeWait run on it,
// so that they keep Linux's pace (a REQ every 6.144 s on RoCE).
func cmTime(code uint8) time.Duration {
	return time.Millisecond << max(int(code&0x1F)-8, 0)
}

// ackTimeout combines a CA ACK delay and a packet lifetime into a local
// ACK timeout code, as Linux's cm_ack_timeout does: 4.096 µs ×
// 2^ack_timeout ≈ ack delay + 2 × lifetime, taking the larger of the
// delay and lifetime+1 and adding 1 only when the other is within half of
// it (rxe's 15 and 18 give 19).
func ackTimeout(caAckDelay, packetLifeTime uint8) uint8 {
	t, d := int(packetLifeTime)+1, int(caAckDelay)
	if t >= d {
		if d >= t-1 {
			t++
		}
	} else {
		if t >= d-1 {
			d++
		}
		t = d
	}
	return uint8(min(31, t))
}

// Tick runs the timers that are due: retransmissions, the end of retries
// (Unreachable, or a Disconnected that timed out), the end of TimeWait.
func (m *Manager) Tick() {
	m.mu.Lock()
	now := m.cfg.Now()
	for _, c := range m.conns {
		if !c.deadline.IsZero() && !now.Before(c.deadline) {
			m.expire(c, now)
		}
	}
	m.rejectUnheard(now)
	m.unlock()
}

// TimerWake is signalled whenever the manager sets a timer: whoever runs
// Tick at NextDeadline plans again, so that it may sleep while no timer
// runs.
func (m *Manager) TimerWake() <-chan struct{} { return m.wake }

// setDeadline sets c's timer to t and signals TimerWake. m.mu is held.
func (m *Manager) setDeadline(c *conn, t time.Time) {
	c.deadline = t
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// NextDeadline returns when Tick should run next, and false when no timer
// runs.
func (m *Manager) NextDeadline() (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var next time.Time
	for _, c := range m.conns {
		if !c.deadline.IsZero() && (next.IsZero() || c.deadline.Before(next)) {
			next = c.deadline
		}
	}
	if len(m.unheard) > 0 && (next.IsZero() || m.unheard[0].deadline.Before(next)) {
		next = m.unheard[0].deadline
	}
	return next, !next.IsZero()
}

// Stats returns the counters, and the IDs by state as they are now.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats
	for _, c := range m.conns {
		s.States[c.state]++
	}
	s.States[StateListen] = uint64(len(m.listeners))
	return s
}
