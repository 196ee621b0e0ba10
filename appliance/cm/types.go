package cm

import (
	"errors"
	"net/netip"
	"strconv"
	"time"

	"github.com/taproce/taproce/appliance/roce"
)

// Sentinel errors of the Manager's methods; they come wrapped with the ID
// or the value at fault (errors.Is finds them).
var (
	// ErrNoID: no ID by that handle (never made, or destroyed).
	ErrNoID = errors.New("cm: no such ID")
	// ErrState: the ID's state does not allow the call (Accept on an ID
	// that is not waiting for an answer, Disconnect before the
	// connection is established, …), as Linux's ib_send_cm_* answer
	// EINVAL.
	ErrState = errors.New("cm: not allowed in the ID's state")
	// ErrInvalid: parameters that cannot make a message (addresses of two
	// IP families, a path MTU code out of range, a port space that does
	// not carry the QP type).
	ErrInvalid = errors.New("cm: invalid parameters")
	// ErrPrivateData: more private data than the message carries.
	ErrPrivateData = errors.New("cm: private data too long")
	// ErrLimit: Config.MaxConns IDs or Config.MaxListeners listeners
	// exist already.
	ErrLimit = errors.New("cm: too many IDs")
	// ErrAddrInUse: a listener for that port and address, or one that
	// overlaps it (any address), exists already (Linux's EADDRINUSE and
	// EADDRNOTAVAIL of rdma_listen).
	ErrAddrInUse = errors.New("cm: address and port in use")
	// ErrEstablished: Notify of a connection that is established already
	// (Linux's cm_establish answers EISCONN).
	ErrEstablished = errors.New("cm: connection already established")
)

// Defaults, as Linux's RDMA CM (drivers/infiniband/core/cma.c) and rxe's
// device give them on RoCE; the captured rxe MADs of shared/vectors hold
// every one of them.
const (
	// DefaultCMResponseTimeout is the REQ's remote and local CM response
	// timeout (CMA_CM_RESPONSE_TIMEOUT): 4.096 µs × 2^20 ≈ 4.3 s.
	DefaultCMResponseTimeout = 20
	// DefaultMaxCMRetries is how often a REQ, REP, DREQ or SIDR_REQ is
	// sent again before giving up (CMA_MAX_CM_RETRIES).
	DefaultMaxCMRetries = 15
	// DefaultPacketLifeTime is the path's packet lifetime on RoCE
	// (CMA_IBOE_PACKET_LIFETIME in the Linux 6.1 of rxe's captures; later
	// kernels use 16). The REQ's local ACK timeout is one more: 19.
	DefaultPacketLifeTime = 18
	// DefaultAckDelay is the CA ACK delay a REP states as its target ACK
	// delay: rxe's, 15.
	DefaultAckDelay = 15
	// DefaultHopLimit is the REQ's path hop limit (the route's).
	DefaultHopLimit = 64
	// MRAServiceTimeout is the service timeout of the MRA the RDMA CM
	// owes for a request or reply its consumer has not answered yet
	// (CMA_CM_MRA_SETTING less its delay flag): 2^24 × 4.096 µs ≈ 69 s.
	MRAServiceTimeout = 24
	// DefaultUDPQKey is the Q_Key a SIDR_REP gives when the consumer
	// names none (RDMA_UDP_QKEY).
	DefaultUDPQKey = 0x01234567
	// DefaultBacklog is a listener's backlog when Listen is given 0
	// (ucma's max_backlog).
	DefaultBacklog = 1024
	// DefaultMaxConns and DefaultMaxListeners bound a manager's state
	// when the Config leaves them 0.
	DefaultMaxConns = 16384
	// DefaultListenGrace is how long a request waits for a listener
	// (Config.ListenGrace). A server's rdma_listen reaches taproce's CM
	// through the appliance's control socket, from a process that may
	// share its processors with busy-polling programs: where a server
	// tells its client to connect just before it listens (perftest's -R
	// does, after its own exchange), the kernel's CM has the listener in
	// microseconds and taproce's, on a busy machine, in milliseconds,
	// which a client's REQ can beat. A request nobody listens for is
	// still rejected well within what a program sees as at once.
	DefaultListenGrace = 100 * time.Millisecond
	// maxUnheard bounds the requests waiting for a listener; more are
	// rejected at once.
	maxUnheard          = 256
	DefaultMaxListeners = 1024
	// sidrTimeout is how long a SIDR_REQ waits for its SIDR_REP, as
	// cma_resolve_ib_udp asks: 1 << (CMA_CM_RESPONSE_TIMEOUT - 8) ms.
	sidrTimeout = time.Millisecond << (DefaultCMResponseTimeout - 8)
)

// QPType is the transport service of a connection: what a REQ's transport
// service type names, or UD for SIDR.
type QPType uint8

// QP types.
const (
	QPTypeRC QPType = iota
	QPTypeUC
	QPTypeUD
)

// String returns "RC", "UC" or "UD".
func (t QPType) String() string {
	switch t {
	case QPTypeRC:
		return "RC"
	case QPTypeUC:
		return "UC"
	case QPTypeUD:
		return "UD"
	}
	return "QPType(" + strconv.Itoa(int(t)) + ")"
}

// State is an ID's state in the connection state machine (IBA vol. 1
// 12.9.6, figures 147–151), named as Linux's enum ib_cm_state names it.
// Two of Linux's states are never held here: REQ_RCVD and REP_RCVD last
// only while Linux hands the event up, because its RDMA CM at once puts
// every request and reply of a connected QP into MRA_REQ_SENT or
// MRA_REP_SENT with a delayed MRA (cma.c, ib_send_cm_mra with
// CMA_CM_MRA_SETTING): no MRA goes out until the peer repeats itself.
type State uint8

// States.
const (
	StateIdle        State = iota // made, answered, rejected, timed out, or out of TimeWait
	StateListen                   // a listener
	StateReqSent                  // active: REQ out, waiting for REP
	StateMRAReqRcvd               // active: the peer MRAed the REQ
	StateMRAReqSent               // passive: REQ handed up, not yet accepted or rejected
	StateRepSent                  // passive: REP out, waiting for RTU
	StateMRARepRcvd               // passive: the peer MRAed the REP
	StateMRARepSent               // active: REP handed up, RTU not yet sent (Establish)
	StateEstablished              // connected
	StateDreqSent                 // DREQ out, waiting for DREP
	StateDreqRcvd                 // DREQ handed up, DREP not yet sent (Disconnect, Destroy)
	StateTimeWait                 // disconnected; waiting out stray packets
	StateSIDRReqSent              // active UD: SIDR_REQ out, waiting for SIDR_REP
	StateSIDRReqRcvd              // passive UD: SIDR_REQ handed up, not yet answered
	NumStates                     // how many states there are
)

var stateNames = [NumStates]string{"IDLE", "LISTEN", "REQ_SENT", "MRA_REQ_RCVD", "MRA_REQ_SENT", "REP_SENT",
	"MRA_REP_RCVD", "MRA_REP_SENT", "ESTABLISHED", "DREQ_SENT", "DREQ_RCVD", "TIMEWAIT", "SIDR_REQ_SENT", "SIDR_REQ_RCVD"}

// String names the state as Linux does, without its prefix ("REQ_SENT").
func (s State) String() string {
	if s < NumStates {
		return stateNames[s]
	}
	return "STATE_" + strconv.Itoa(int(s))
}

// ID is a handle for a listener or a connection. Handles are never
// reused; they are not communication IDs (those are on the wire, in
// Info).
type ID uint64

// Owner names who an ID belongs to — a session of the control server, a
// process — so that its events reach it and CloseOwner can tear down what
// it leaves.
type Owner uint64

// EventType is what happened to an ID, named for the RDMA CM event
// (enum rdma_cm_event_type) the library hands its application.
type EventType uint8

// Event types.
const (
	// EventConnectRequest: a REQ or SIDR_REQ reached a listener; Event.ID
	// is a new ID in StateMRAReqSent or StateSIDRReqRcvd, owned by the
	// listener's owner, to Accept, Reject or Destroy.
	// RDMA_CM_EVENT_CONNECT_REQUEST.
	EventConnectRequest EventType = iota
	// EventConnectResponse: the REP to a Connect arrived. The library
	// moves its QP to RTR and RTS (Info gives the attributes) and calls
	// Establish, which sends the RTU. RDMA_CM_EVENT_CONNECT_RESPONSE.
	EventConnectResponse
	// EventEstablished: passive side, the RTU arrived or the transport
	// saw the first packet on the QP (CommEstablished); active UD, the
	// SIDR_REP gave the service's QPN and Q_Key (Event.Param).
	// RDMA_CM_EVENT_ESTABLISHED.
	EventEstablished
	// EventRejected: a REJ arrived; Event.Reason, Event.ARI and
	// Event.PrivateData say why. RDMA_CM_EVENT_REJECTED.
	EventRejected
	// EventUnreachable: the REQ, REP or SIDR_REQ went unanswered through
	// all its retries (Event.TimedOut), or a SIDR_REP refused
	// (Event.SIDRStatus). RDMA_CM_EVENT_UNREACHABLE.
	EventUnreachable
	// EventDisconnected: the peer's DREQ arrived, the DREP to ours did,
	// or ours went unanswered (Event.TimedOut) — whichever comes first,
	// once per connection. RDMA_CM_EVENT_DISCONNECTED.
	EventDisconnected
	// EventTimeWaitExit: a disconnected ID left TimeWait for Idle.
	// RDMA_CM_EVENT_TIMEWAIT_EXIT.
	EventTimeWaitExit
)

var eventNames = [...]string{"CONNECT_REQUEST", "CONNECT_RESPONSE", "ESTABLISHED", "REJECTED", "UNREACHABLE",
	"DISCONNECTED", "TIMEWAIT_EXIT"}

// String names the event as the RDMA CM does, without its prefix.
func (t EventType) String() string {
	if int(t) < len(eventNames) {
		return eventNames[t]
	}
	return "EVENT_" + strconv.Itoa(int(t))
}

// ConnParam is what the peer said of a connection, from the local side's
// point of view, as Linux's RDMA CM turns a REQ's or REP's fields round
// for its event (cm_format_req_event, cm_format_rep_event): the peer's
// initiator depth is the local responder resources and the other way
// round.
type ConnParam struct {
	QPType QPType
	// QPN is the peer's QPN: the destination of the local QP, or, after
	// a SIDR_REP, the service's UD QPN.
	QPN uint32
	// QKey is the service's Q_Key after a SIDR_REP.
	QKey uint32
	// StartingPSN is the peer's starting PSN: the local QP's send PSN.
	StartingPSN        roce.PSN
	ResponderResources uint8
	InitiatorDepth     uint8
	FlowControl        bool
	RetryCount         uint8 // a REQ's; 0 in a REP
	RNRRetryCount      uint8
	SRQ                bool
}

// Event tells an ID's owner what happened (Config.Events).
type Event struct {
	Type  EventType
	ID    ID
	Owner Owner
	// Listener is the listener a ConnectRequest came through.
	Listener ID
	// Local and Remote are the connection's addresses and ports: the
	// CMA header's, on the passive side.
	Local, Remote netip.AddrPort
	// Param is the peer's side of the connection (ConnectRequest,
	// ConnectResponse, a UD Established).
	Param ConnParam
	// PrivateData is the peer's private data, whole as the message
	// carries it (librdmacm hands the full length up): a REQ's 56 bytes
	// after the CMA header, a SIDR_REQ's 180, a REP's 196, a REJ's 148,
	// a DREQ's 220, a DREP's 224, a SIDR_REP's 136. It belongs to the
	// receiver.
	PrivateData []byte
	// Reason and ARI are a Rejected event's reject reason and additional
	// rejection information.
	Reason RejectReason
	ARI    []byte
	// SIDRStatus is the SIDR_REP's status of an Unreachable event that
	// a SIDR_REP caused.
	SIDRStatus SIDRStatus
	// TimedOut says that an Unreachable or Disconnected event came from
	// retries running out (the RDMA CM's status -ETIMEDOUT).
	TimedOut bool
}

// Route says where a MAD goes: the port's transport wraps it in a UD
// SEND from QP1 to QP1 (Q_Key 0x80010000) from Src to Dst.
type Route struct {
	Src, Dst netip.Addr
	// FlowLabel, TrafficClass and HopLimit are the connection's primary
	// path's; all 0 for an answer to a MAD no ID owns.
	FlowLabel    uint32
	TrafficClass uint8
	HopLimit     uint8
}

// Wire sends the manager's MADs.
type Wire interface {
	// SendMAD sends mad along r. mad is valid only during the call. It
	// is called without the manager's lock held, and may call the
	// manager (a local switch handing the MAD to another port's manager,
	// which answers at once).
	SendMAD(r Route, mad *[MADLen]byte)
}

// ListenParams describe a listener: the RDMA CM's rdma_bind_addr and
// rdma_listen on one port.
type ListenParams struct {
	// Addr is the address listened on. The zero Addr and :: take
	// requests for any address; 0.0.0.0 for any IPv4 address (Linux's
	// AF_INET listeners are IPv4 only).
	Addr netip.Addr
	Port uint16
	// PortSpace is TCP or IB (connected QPs, REQ) or UDP (UD, SIDR_REQ).
	PortSpace PortSpace
	// QPType is the QP type requests must be for: RC or UC in the TCP
	// and IB port spaces, UD in the UDP one. The zero value is RC, which
	// in the UDP port space means UD.
	QPType QPType
	// Backlog bounds the requests handed up and not yet accepted,
	// rejected or destroyed; 0 means DefaultBacklog. A request beyond it
	// is dropped, so that the peer sends it again (Linux's ucma does the
	// same: its event handler fails with ENOMEM and the CM "does not
	// reject to allow future retries"); a SIDR_REQ beyond it is refused
	// with SIDR_REP status REJECT.
	Backlog int
}

// ConnectParams describe an active connection: the RDMA CM's
// rdma_connect on a resolved route, for RC or UC.
type ConnectParams struct {
	// Local and Remote are the connection's addresses (of one IP family)
	// and ports. The remote port and the port space make the service ID;
	// a local port of 0 gets an ephemeral one.
	Local, Remote netip.AddrPort
	// PortSpace is TCP or IB.
	PortSpace PortSpace
	// QPType is RC or UC.
	QPType QPType
	// QPN and StartingPSN are the local QP's number and the PSN it
	// expects first (its receive PSN; the peer's QP sends from it).
	QPN         uint32
	StartingPSN roce.PSN
	// ResponderResources and InitiatorDepth are the RDMA READs and
	// atomics the local QP takes and issues at once.
	ResponderResources uint8
	InitiatorDepth     uint8
	// RetryCount and RNRRetryCount are the transport's retries (0–7; 7
	// is for ever), cut to 7 as cma_connect_ib does.
	RetryCount    uint8
	RNRRetryCount uint8
	// PathMTU is the path's MTU code (1 = 256 … 5 = 4096).
	PathMTU     uint8
	SRQ         bool
	FlowControl bool
	// PrivateData follows the CMA header: at most REQPrivateDataLen -
	// CMAHeaderLen (56) bytes.
	PrivateData []byte
	// HopLimit (0: DefaultHopLimit) and TrafficClass are the path's.
	HopLimit     uint8
	TrafficClass uint8
	// FlowLabel, when not 0, is the path's flow label; 0 derives it from
	// the ports as cma_get_roce_udp_flow_label does.
	FlowLabel uint32
	// PacketLifeTime, when not 0, is the path's packet lifetime code
	// instead of the manager's.
	PacketLifeTime uint8
}

// ResolveParams describe a UD resolution: the RDMA CM's rdma_connect on a
// UD ID, a SIDR_REQ.
type ResolveParams struct {
	// Local and Remote are the addresses and ports; a local port of 0
	// gets an ephemeral one.
	Local, Remote netip.AddrPort
	// PortSpace is UDP or IB.
	PortSpace PortSpace
	// PrivateData follows the CMA header: at most SIDRReqPrivateDataLen
	// - CMAHeaderLen (180) bytes.
	PrivateData []byte
}

// AcceptParams answer a ConnectRequest: a REP for RC and UC, a SIDR_REP
// for UD (the RDMA CM's rdma_accept).
type AcceptParams struct {
	// QPN is the local QP's number.
	QPN uint32
	// StartingPSN is the PSN the local QP expects first (RC, UC).
	StartingPSN        roce.PSN
	ResponderResources uint8
	InitiatorDepth     uint8
	RNRRetryCount      uint8 // cut to 7
	SRQ                bool
	FlowControl        bool
	// QKey is the UD QP's Q_Key; 0 gives DefaultUDPQKey.
	QKey uint32
	// PrivateData goes into the REP (at most 196 bytes) or the SIDR_REP
	// (136).
	PrivateData []byte
}

// Info describes an ID: its state, addresses, the communication IDs, and
// the QP attributes that Linux's ib_cm_init_qp_attr gives the RDMA CM's
// rdma_init_qp_attr for the moves to RTR and RTS.
type Info struct {
	State         State
	Owner         Owner
	QPType        QPType
	Listener      bool
	Local, Remote netip.AddrPort
	ServiceID     ServiceID
	// LocalCommID and RemoteCommID are the communication IDs on the
	// wire (for a SIDR, the request ID).
	LocalCommID, RemoteCommID uint32
	// The primary path.
	FlowLabel    uint32
	HopLimit     uint8
	TrafficClass uint8
	PathMTU      uint8
	// LocalQPN and RemoteQPN are the QPs' numbers (the remote one once
	// the REQ or REP told it); RemoteQKey a SIDR_REP's Q_Key.
	LocalQPN, RemoteQPN uint32
	RemoteQKey          uint32
	// RQPSN is the local QP's receive PSN (its own starting PSN), SQPSN
	// its send PSN (the peer's).
	RQPSN, SQPSN roce.PSN
	// ResponderResources is the RTR's max_dest_rd_atomic,
	// InitiatorDepth the RTS's max_rd_atomic.
	ResponderResources uint8
	InitiatorDepth     uint8
	RetryCount         uint8
	RNRRetryCount      uint8
	// AckTimeout is the RTS's local ACK timeout code (Linux's
	// av.timeout): the path's packet lifetime and the peer's ACK delay
	// combined as cm_ack_timeout does.
	AckTimeout uint8
}

// DropReason says why the manager dropped a received MAD without acting
// on it.
type DropReason uint8

// Drop reasons.
const (
	// DropMalformed: Parse refused it (length, base or class version,
	// class, attribute, method), or its private data held no CMA header
	// where one was due and no listener could be asked.
	DropMalformed DropReason = iota
	// DropUnsupported: LAP, APR and ClassPortInfo, which Linux's CM on
	// RoCE ignores.
	DropUnsupported
	// DropUnknownID: its communication IDs match no ID.
	DropUnknownID
	// DropState: its ID is in a state that does not take it.
	DropState
	// DropQPN: a DREQ naming a QPN that is not the connection's.
	DropQPN
	// DropBacklog: a REQ to a listener whose backlog is full.
	DropBacklog
	// DropLimit: a REQ or SIDR_REQ that would make more than MaxConns
	// IDs.
	DropLimit
	// NumDropReasons is how many reasons there are.
	NumDropReasons
)

var dropNames = [NumDropReasons]string{"malformed", "unsupported", "unknown_id", "state", "qpn", "backlog", "limit"}

// String names the reason as metrics label it.
func (r DropReason) String() string {
	if r < NumDropReasons {
		return dropNames[r]
	}
	return "reason_" + strconv.Itoa(int(r))
}

// NumAttrs is how many attributes Stats counts: the CM's, REQ (0x10) to
// APR (0x1A), at AttrIndex.
const NumAttrs = int(AttrAPR-AttrREQ) + 1

// AttrIndex returns a CM attribute's index in Stats' arrays, and false
// for one outside them (ClassPortInfo).
func AttrIndex(a AttrID) (int, bool) {
	if a < AttrREQ || a > AttrAPR {
		return 0, false
	}
	return int(a - AttrREQ), true
}

// Stats counts what a manager did, as Linux's CM counts per port
// (cm_tx_msgs, cm_tx_retries, cm_rx_msgs, cm_rx_duplicates), and more.
// The arrays by attribute are indexed by AttrIndex.
type Stats struct {
	// Received counts the MADs Parse accepted, by attribute.
	Received [NumAttrs]uint64
	// Sent counts first transmissions and answers, Retries the
	// retransmissions of REQ, REP, DREQ and SIDR_REQ.
	Sent, Retries [NumAttrs]uint64
	// Duplicates counts received messages already acted on: answered
	// again (a REQ with an MRA, a REP with an RTU, a DREQ with a DREP)
	// or ignored.
	Duplicates [NumAttrs]uint64
	// Timeouts counts the messages whose retries ran out.
	Timeouts [NumAttrs]uint64
	// Drops counts the MADs dropped, by reason.
	Drops [NumDropReasons]uint64
	// States counts the IDs by state now; Listeners are among them
	// (StateListen).
	States [NumStates]uint64
}
