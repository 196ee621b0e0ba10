package abi

// MaxDevices and MaxGIDs bound the fixed-size lists of the messages.
const (
	MaxDevices = 64
	MaxGIDs    = 16
)

// Device describes one device (port) of the appliance.
type Device struct {
	Name     Name
	NodeGUID uint64
	MAC      [6]byte
	// Usable is 1 when the asking client may open it (its own network
	// namespace), else 0; only an appliance that lists all devices lists
	// such.
	Usable  uint8
	PortUp  uint8
	MTU     uint32
	NumGIDs uint32
	GIDs    [MaxGIDs][16]byte
}

// ListDevicesReply answers OpListDevices (no request body).
type ListDevicesReply struct {
	Errno   Errno
	Count   uint32
	Devices [MaxDevices]Device
	// OthersHidden is 1 when the list holds only the devices of the
	// asking client's network namespace, those it may open: an appliance
	// does not show a client the devices, MACs and addresses of other
	// namespaces unless its operator lets it (list_all_devices). Whether
	// there are any, the client cannot tell.
	OthersHidden uint32
}

// OpenRequest opens a device (ibv_open_device).
type OpenRequest struct {
	Name  Name
	Flags uint32 // OpenEventSocket
}

// OpenEventSocket asks the appliance to send the session's events on a
// socket of their own (SOCK_SEQPACKET, one Event message each, header
// included), which comes with the reply as its second descriptor: a
// client without a reader thread gives it to the application as the
// async event fd (ibv_context.async_fd), which polls readable when an
// event waits and at end of file when the appliance is gone.
const OpenEventSocket = 1

// DeviceAttr is struct ibv_device_attr, the fields taproce fills.
type DeviceAttr struct {
	FWVer         Name
	NodeGUID      uint64
	SysImageGUID  uint64
	MaxMRSize     uint64
	PageSizeCap   uint64
	VendorID      uint32
	VendorPartID  uint32
	HWVer         uint32
	MaxQP         uint32
	MaxQPWR       uint32
	DeviceCapFlag uint32
	MaxSGE        uint32
	MaxCQ         uint32
	MaxCQE        uint32
	MaxMR         uint32
	MaxPD         uint32
	MaxQPRdAtom   uint32
	MaxQPInitRd   uint32
	MaxSRQ        uint32
	MaxSRQWR      uint32
	MaxSRQSGE     uint32
	MaxAH         uint32
	MaxInline     uint32
	AtomicCap     uint32
	PhysPortCnt   uint8
	// Polls is taproce's own, not ibv_device_attr's: 1 when the appliance
	// busy-polls its clients' rings on processors it keeps for that
	// (config poll = "spin"), so that a client that busy-polls its
	// completion queue takes no processor time the appliance needs; 0
	// when the appliance sleeps for want of work.
	Polls uint8
	_     [6]byte
}

// PortAttr is struct ibv_port_attr, the fields taproce fills.
type PortAttr struct {
	State        uint8 // enum ibv_port_state: 4 ACTIVE, 1 DOWN
	MaxMTU       uint8 // enum ibv_mtu
	ActiveMTU    uint8
	LinkLayer    uint8 // 2 = Ethernet
	PhysState    uint8 // 5 = LinkUp
	ActiveWidth  uint8
	ActiveSpeed  uint8
	_            uint8
	GIDTblLen    uint32
	PortCapFlags uint32
	MaxMsgSz     uint32
	PKeyTblLen   uint16
	LID          uint16
	NumGIDs      uint32
	GIDs         [MaxGIDs][16]byte
	// GIDTypes: 1 = RoCE v2 for each GID (the link-local one too, as
	// taproce speaks only RoCE v2).
	GIDTypes [MaxGIDs]uint8
}

// OpenReply answers OpOpen. A doorbell comes with it, the write end of a
// pipe (shmem.NewPipeDoorbell): the client rings it after posting when the
// appliance said it sleeps.
type OpenReply struct {
	Errno  Errno
	Device DeviceAttr
	Port   PortAttr
}

// QueryPortReply answers OpQueryPort (no request body).
type QueryPortReply struct {
	Errno Errno
	Port  PortAttr
}

// Handle names an object of the client in the appliance.
type Handle uint32

// HandleRequest is the request of the operations that take one handle
// (dealloc PD, dereg MR, destroy CQ/QP/SRQ/AH/channel, query QP).
type HandleRequest struct {
	Handle Handle
}

// ErrnoReply is the reply of operations that return nothing else.
type ErrnoReply struct {
	Errno Errno
}

// HandleReply is the reply of operations that create one plain object.
type HandleReply struct {
	Errno  Errno
	Handle Handle
}

// RegMRRequest registers memory the client shares (ibv_reg_mr); the
// memfd it lies in comes with the message.
type RegMRRequest struct {
	PD     Handle
	Access uint32 // enum ibv_access_flags
	Addr   uint64 // the client's virtual address: SGEs and RDMA use it
	Length uint64
	Offset uint64 // where Addr lies in the memfd
	Size   uint64 // the memfd's size
}

// MaxMRSegments bounds the pieces of one OpRegMRSegments request.
const MaxMRSegments = 32

// MRSegment is one piece of a region registered with OpRegMRSegments:
// Length bytes at Offset of a memfd of Size bytes, which comes with the
// message in the segment's place. Offset and Length are whole pages.
type MRSegment struct {
	Offset uint64
	Length uint64
	Size   uint64
}

// RegMRSegmentsRequest registers memory the client shares whose pages lie
// on several memfds (ibv_reg_mr of a client that moves only the pages it
// registers onto memfds, so that a region may meet pages an earlier one
// moved): the segments, one descriptor each in order, laid end to end
// make pages that hold the region from Lead bytes into the first. (Lead
// is more than Addr's offset in its page where the first segment starts
// at a huge page below it.)
type RegMRSegmentsRequest struct {
	PD          Handle
	Access      uint32 // enum ibv_access_flags
	Addr        uint64 // the client's virtual address: SGEs and RDMA use it
	Length      uint64
	Lead        uint64
	NumSegments uint32
	_           uint32
	Segments    [MaxMRSegments]MRSegment
}

// RegMRReply answers OpRegMR and OpRegMRSegments.
type RegMRReply struct {
	Errno  Errno
	Handle Handle
	LKey   uint32
	RKey   uint32
}

// CreateChannelReply answers OpCreateChannel; the channel's eventfd comes
// with it.
type CreateChannelReply = HandleReply

// CreateCQRequest creates a completion queue (ibv_create_cq).
type CreateCQRequest struct {
	Depth   uint32
	Channel Handle // 0: none
}

// CreateCQReply answers OpCreateCQ; the CQ's shared region comes with it
// (a CQState and then the CQE ring).
type CreateCQReply struct {
	Errno  Errno
	Handle Handle
	Depth  uint32 // entries, at least the requested
	Size   uint64 // region bytes
}

// QPCaps are the queue sizes of a QP (struct ibv_qp_cap).
type QPCaps struct {
	MaxSendWR  uint32
	MaxRecvWR  uint32
	MaxSendSGE uint32
	MaxRecvSGE uint32
	MaxInline  uint32
}

// CreateQPRequest creates a queue pair (ibv_create_qp).
type CreateQPRequest struct {
	PD     Handle
	SendCQ Handle
	RecvCQ Handle
	SRQ    Handle // 0: none
	Type   uint8  // 2 RC, 3 UC, 4 UD
	SigAll uint8
	_      [2]byte
	Caps   QPCaps
}

// CreateQPReply answers OpCreateQP; the QP's shared region comes with it
// (a QPState, the send ring, the receive ring).
type CreateQPReply struct {
	Errno  Errno
	Handle Handle
	QPN    uint32
	Caps   QPCaps
	Size   uint64
	SQOff  uint64 // offset of the send ring in the region
	RQOff  uint64 // offset of the receive ring
}

// QPAttr is struct ibv_qp_attr, with the address vector's GID.
type QPAttr struct {
	State           uint8
	CurState        uint8
	PathMTU         uint8
	Timeout         uint8
	RetryCnt        uint8
	RNRRetry        uint8
	MinRNRTimer     uint8
	MaxRdAtomic     uint8
	MaxDestRdAtomic uint8
	Port            uint8
	SGIDIndex       uint8
	HopLimit        uint8
	TClass          uint8
	_               [1]byte
	PKeyIndex       uint16
	Access          uint32
	QKey            uint32
	DestQPN         uint32
	RQPSN           uint32
	SQPSN           uint32
	FlowLabel       uint32
	DGID            [16]byte
	DMAC            [6]byte // filled by the appliance in QueryQP
	_               [2]byte
}

// ModifyQPRequest modifies a QP (ibv_modify_qp).
type ModifyQPRequest struct {
	Handle Handle
	Mask   uint32 // enum ibv_qp_attr_mask
	Attr   QPAttr
}

// QueryQPReply answers OpQueryQP.
type QueryQPReply struct {
	Errno Errno
	Attr  QPAttr
	Caps  QPCaps
}

// CreateSRQRequest creates a shared receive queue (ibv_create_srq).
type CreateSRQRequest struct {
	PD     Handle
	MaxWR  uint32
	MaxSGE uint32
	Limit  uint32
}

// CreateSRQReply answers OpCreateSRQ; the SRQ's shared region comes with it.
type CreateSRQReply struct {
	Errno  Errno
	Handle Handle
	MaxWR  uint32
	Size   uint64
	RQOff  uint64
}

// ModifySRQRequest arms an SRQ's limit (ibv_modify_srq, IBV_SRQ_LIMIT).
type ModifySRQRequest struct {
	Handle Handle
	Limit  uint32
}

// CreateAHRequest creates an address handle (ibv_create_ah); the
// appliance resolves the destination's MAC.
type CreateAHRequest struct {
	PD        Handle
	SGIDIndex uint8
	HopLimit  uint8
	TClass    uint8
	Port      uint8
	FlowLabel uint32
	DGID      [16]byte
}

// Event types (enum ibv_event_type).
const (
	EventCQErr            = 0
	EventQPFatal          = 1
	EventQPReqErr         = 2
	EventQPAccessErr      = 3
	EventCommEst          = 4
	EventSQDrained        = 5
	EventPathMig          = 6
	EventPathMigErr       = 7
	EventDeviceFatal      = 8
	EventPortActive       = 9
	EventPortErr          = 10
	EventLIDChange        = 11
	EventPKeyChange       = 12
	EventSMChange         = 13
	EventSRQErr           = 14
	EventSRQLimitReached  = 15
	EventQPLastWQEReached = 16
)

// Event is the body of an OpEvent message (struct ibv_async_event).
type Event struct {
	Type   uint32
	Handle Handle // the QP, CQ or SRQ; 0 for port and device events
	Port   uint32
}
