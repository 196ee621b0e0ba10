package abi

// The RDMA CM's operations: what librdmacm asks of the kernel's ucma
// (drivers/infiniband/core/ucma.c, struct rdma_ucm_*), asked of the
// appliance. A connection that makes CM IDs is an event channel
// (rdma_create_event_channel): it opens no device; an ID belongs to a
// device once its address is bound or resolved, and only to a device of
// the client's network namespace. Its events come on the same connection
// as FlagEvent messages of OpCMEvent, each CMEvent, in the order they
// happened.
//
// OpCMChannel (no body; an ErrnoReply) gives the session's events a socket
// of their own (SOCK_SEQPACKET, one OpCMEvent message each), which comes
// with the reply: the library hands it to the application as the event
// channel's fd (rdma_event_channel.fd), which polls readable when an
// event waits, while requests and replies keep to the connection.
//
// Requests that name an ID take CMIDRequest (Arg as each op says) or a
// structure that starts with the ID; an ID of another connection is
// EINVAL, as in ucma. Replies are ErrnoReply unless an op says otherwise.

// Port spaces (enum rdma_port_space).
const (
	CMPortSpaceIPoIB uint16 = 0x0002
	CMPortSpaceIB    uint16 = 0x013F
	CMPortSpaceTCP   uint16 = 0x0106
	CMPortSpaceUDP   uint16 = 0x0111
)

// RDMA CM event types (enum rdma_cm_event_type).
const (
	CMEventAddrResolved    = 0
	CMEventAddrError       = 1
	CMEventRouteResolved   = 2
	CMEventRouteError      = 3
	CMEventConnectRequest  = 4
	CMEventConnectResponse = 5
	CMEventConnectError    = 6
	CMEventUnreachable     = 7
	CMEventRejected        = 8
	CMEventEstablished     = 9
	CMEventDisconnected    = 10
	CMEventDeviceRemoval   = 11
	CMEventMulticastJoin   = 12
	CMEventMulticastError  = 13
	CMEventAddrChange      = 14
	CMEventTimewaitExit    = 15
)

// Address families of SockAddr (Linux's).
const (
	AFInet  = 2
	AFInet6 = 10
)

// CMMaxPrivateData is the most private data a CM message carries whole:
// the REP's 196 bytes (IBA 12.6.6); a REQ takes 56 after the RDMA CM's
// header, a REJ 148, a DREQ 220 (CMEvent's carry what came).
const CMMaxPrivateData = 224

// SockAddr is an IP address and port: struct sockaddr_in or sockaddr_in6
// as the library hands them over, in one shape.
type SockAddr struct {
	Family  uint16 // AFInet or AFInet6; 0: none
	Port    uint16 // host byte order
	ScopeID uint32 // sin6_scope_id: the interface of a link-local address
	Addr    [16]byte
}

// CMCreateIDRequest makes a CM ID (rdma_create_id, RDMA_USER_CM_CMD_CREATE_ID).
type CMCreateIDRequest struct {
	// Context is the application's, handed back in the ID's events.
	Context   uint64
	PortSpace uint16
	QPType    uint8 // enum ibv_qp_type: RC, UC or UD
	_         [5]byte
}

// CMIDReply answers OpCMCreateID.
type CMIDReply struct {
	Errno Errno
	ID    uint32
}

// CMIDRequest names an ID, with one argument: OpCMDestroyID, OpCMQuery,
// OpCMDisconnect, OpCMEstablish (none); OpCMListen (the backlog, 0 for
// the default); OpCMResolveRoute (the timeout in ms); OpCMInitQPAttr (the
// QP state whose attributes are asked for); OpCMNotify (the enum
// ibv_event_type of rdma_notify).
type CMIDRequest struct {
	ID  uint32
	Arg uint32
}

// CMDestroyReply answers OpCMDestroyID: EventsReported is how many events
// the appliance sent for the ID, which rdma_destroy_id waits to see acked.
type CMDestroyReply struct {
	Errno          Errno
	EventsReported uint32
}

// OpCMMigrateID moves an ID to the event channel of the connection the
// request comes on (rdma_migrate_id, RDMA_USER_CM_CMD_MIGRATE_ID) from
// the channel it belongs to, which the request names by that channel's
// event socket (the descriptor the library has as the channel's fd, sent
// with the request, as ucma's command names the current channel by its
// fd). Its CMIDRequest names the ID by its handle on that channel; the
// reply is CMMigrateReply.

// CMMigrateReply answers OpCMMigrateID: the ID's handle on its new
// channel, and how many events its old channel reported for it, which the
// library waits to see acknowledged, as librdmacm does.
type CMMigrateReply struct {
	Errno          Errno
	ID             uint32
	EventsReported uint32
	_              uint32
}

// CMAddrRequest binds an ID to an address (OpCMBind: Src) or resolves the
// destination's address (OpCMResolveAddr: Dst, Src when bound or given,
// TimeoutMs).
type CMAddrRequest struct {
	ID        uint32
	TimeoutMs uint32
	Src, Dst  SockAddr
}

// CMQueryReply answers OpCMQuery: the ID's addresses, device, port and
// path (rdma_cm_id's route.addr and route.path_rec that librdmacm fills
// from RDMA_USER_CM_CMD_QUERY_ROUTE).
type CMQueryReply struct {
	Errno      Errno
	Device     Name // empty while the ID has none
	Port       uint8
	PathMTU    uint8 // enum ibv_mtu
	HopLimit   uint8
	TClass     uint8
	PKey       uint16
	_          [2]byte
	FlowLabel  uint32
	SGIDIndex  uint32
	Src, Dst   SockAddr
	SGID, DGID [16]byte
}

// CMConnParam is struct rdma_conn_param as the library passes it, and the
// peer's side of a connection as an event hands it up.
type CMConnParam struct {
	QPN                uint32 // the local QP (connect, accept), or the peer's (an event)
	QKey               uint32 // UD: the service's Q_Key
	ResponderResources uint8
	InitiatorDepth     uint8
	FlowControl        uint8
	RetryCount         uint8
	RNRRetryCount      uint8
	SRQ                uint8
	PrivateDataLen     uint8
	_                  uint8
	PrivateData        [CMMaxPrivateData]byte
}

// CMConnectRequest is OpCMConnect's, OpCMAccept's and OpCMReject's (only
// the private data counts) request.
type CMConnectRequest struct {
	ID    uint32
	_     uint32
	Param CMConnParam
}

// CMInitQPAttrReply answers OpCMInitQPAttr: the attributes and their mask
// (enum ibv_qp_attr_mask) that take the ID's QP to the state asked for
// (rdma_init_qp_attr).
type CMInitQPAttrReply struct {
	Errno Errno
	Mask  uint32
	Attr  QPAttr
}

// CMEvent is an RDMA CM event (struct rdma_ucm_event_resp).
type CMEvent struct {
	// ID is the ID the event is for; for a connect request a new ID,
	// which Listener's owner now owns.
	ID       uint32
	Listener uint32
	// Context is the ID's (a new ID's: its listener's).
	Context uint64
	Event   uint32 // CMEvent*
	// Status is 0, a negative errno (ETIMEDOUT, ECONNREFUSED, …), or a
	// REJECTED event's reject reason (IBA 12.6.7.2).
	Status int32
	// Param is the peer's side: its QP, resources, private data.
	Param CMConnParam
	// Src and Dst are the connection's addresses (a connect request's
	// as the peer's REQ says).
	Src, Dst SockAddr
	// The path to the peer, for a UD ID's address handle.
	DGID      [16]byte
	FlowLabel uint32
	HopLimit  uint8
	TClass    uint8
	_         [2]byte
}
