package verbs

import (
	"net/netip"

	"github.com/taproce/taproce/verbs/abi"
)

// The ibverbs vocabulary is verbs/abi's, defined once for the library
// and the appliance; it is named here for applications.

// Access flags of a memory region or QP (enum ibv_access_flags).
type Access = abi.Access

// Access flags.
const (
	AccessLocalWrite   = abi.AccessLocalWrite
	AccessRemoteWrite  = abi.AccessRemoteWrite
	AccessRemoteRead   = abi.AccessRemoteRead
	AccessRemoteAtomic = abi.AccessRemoteAtomic
)

// QPType is the transport service of a QP (enum ibv_qp_type).
type QPType = abi.QPType

// QP types.
const (
	RC = abi.RC
	UC = abi.UC
	UD = abi.UD
)

// QPState is a QP state (enum ibv_qp_state).
type QPState = abi.QPState

// QP states.
const (
	QPSReset = abi.QPSReset
	QPSInit  = abi.QPSInit
	QPSRTR   = abi.QPSRTR
	QPSRTS   = abi.QPSRTS
	QPSSQD   = abi.QPSSQD
	QPSSQE   = abi.QPSSQE
	QPSErr   = abi.QPSErr
)

// MTU is a path MTU (enum ibv_mtu).
type MTU = abi.MTU

// Path MTUs.
const (
	MTU256  = abi.MTU256
	MTU512  = abi.MTU512
	MTU1024 = abi.MTU1024
	MTU2048 = abi.MTU2048
	MTU4096 = abi.MTU4096
)

// MTUFromBytes returns the MTU of 256…4096 bytes.
func MTUFromBytes(n int) (MTU, bool) { return abi.MTUFromBytes(n) }

// Opcode is a send work request's operation (enum ibv_wr_opcode).
type Opcode = abi.WROpcode

// Send opcodes.
const (
	WRRDMAWrite        = abi.WRRDMAWrite
	WRRDMAWriteWithImm = abi.WRRDMAWriteWithImm
	WRSend             = abi.WRSend
	WRSendWithImm      = abi.WRSendWithImm
	WRRDMARead         = abi.WRRDMARead
	WRAtomicCmpAndSwp  = abi.WRAtomicCmpAndSwp
	WRAtomicFetchAdd   = abi.WRAtomicFetchAdd
	WRSendWithInv      = abi.WRSendWithInv
)

// SendFlags of a send work request (enum ibv_send_flags).
type SendFlags = abi.SendFlags

// Send flags.
const (
	SendFence     = abi.SendFence
	SendSignaled  = abi.SendSignaled
	SendSolicited = abi.SendSolicited
	SendInline    = abi.SendInline
)

// WCStatus is a completion status (enum ibv_wc_status); its String is
// ibv_wc_status_str.
type WCStatus = abi.WCStatus

// Completion statuses.
const (
	WCSuccess        = abi.WCSuccess
	WCLocLenErr      = abi.WCLocLenErr
	WCLocQPOpErr     = abi.WCLocQPOpErr
	WCLocProtErr     = abi.WCLocProtErr
	WCWRFlushErr     = abi.WCWRFlushErr
	WCBadRespErr     = abi.WCBadRespErr
	WCLocAccessErr   = abi.WCLocAccessErr
	WCRemInvReqErr   = abi.WCRemInvReqErr
	WCRemAccessErr   = abi.WCRemAccessErr
	WCRemOpErr       = abi.WCRemOpErr
	WCRetryExcErr    = abi.WCRetryExcErr
	WCRNRRetryExcErr = abi.WCRNRRetryExcErr
	WCFatalErr       = abi.WCFatalErr
	WCGeneralErr     = abi.WCGeneralErr
)

// WCOpcode is a completion's operation (enum ibv_wc_opcode).
type WCOpcode = abi.WCOpcode

// Completion opcodes.
const (
	WCSend        = abi.WCSend
	WCRDMAWrite   = abi.WCRDMAWrite
	WCRDMARead    = abi.WCRDMARead
	WCCompSwap    = abi.WCCompSwap
	WCFetchAdd    = abi.WCFetchAdd
	WCRecv        = abi.WCRecv
	WCRecvRDMAImm = abi.WCRecvRDMAImm
)

// Completion flags (enum ibv_wc_flags).
const (
	WCGRH     = abi.WCGRH
	WCWithImm = abi.WCWithImm
	WCWithInv = abi.WCWithInv
)

// AttrMask selects QP attributes (enum ibv_qp_attr_mask).
type AttrMask = abi.AttrMask

// QP attribute mask bits.
const (
	QPStateMask       = abi.QPStateMask
	QPCurState        = abi.QPCurState
	QPAccessFlags     = abi.QPAccessFlags
	QPPKeyIndex       = abi.QPPKeyIndex
	QPPort            = abi.QPPort
	QPQKey            = abi.QPQKey
	QPAV              = abi.QPAV
	QPPathMTU         = abi.QPPathMTU
	QPTimeout         = abi.QPTimeout
	QPRetryCnt        = abi.QPRetryCnt
	QPRNRRetry        = abi.QPRNRRetry
	QPRQPSN           = abi.QPRQPSN
	QPMaxQPRdAtomic   = abi.QPMaxQPRdAtomic
	QPMinRNRTimer     = abi.QPMinRNRTimer
	QPSQPSN           = abi.QPSQPSN
	QPMaxDestRdAtomic = abi.QPMaxDestRdAtomic
	QPDestQPN         = abi.QPDestQPN
)

// Async event types (enum ibv_event_type).
const (
	EventCQErr           = abi.EventCQErr
	EventQPFatal         = abi.EventQPFatal
	EventDeviceFatal     = abi.EventDeviceFatal
	EventPortActive      = abi.EventPortActive
	EventPortErr         = abi.EventPortErr
	EventSRQLimitReached = abi.EventSRQLimitReached
)

// SGE is a scatter/gather element (struct ibv_sge): Addr is an address in
// a memory region (MR.Addr plus an offset).
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send work request (struct ibv_send_wr).
type SendWR struct {
	ID     uint64
	Opcode Opcode
	Flags  SendFlags
	SGL    []SGE
	// Inline is the data of a SendInline request (copied at post).
	Inline []byte
	// Imm is the immediate data (as ibv's __be32 imm_data), or the rkey of
	// a SEND with invalidate.
	Imm uint32
	// RDMA and atomics.
	RemoteAddr uint64
	RKey       uint32
	CompareAdd uint64
	Swap       uint64
	// UD.
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32
}

// RecvWR is a receive work request (struct ibv_recv_wr).
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// WC is a work completion (struct ibv_wc).
type WC struct {
	ID        uint64
	Status    WCStatus
	Opcode    WCOpcode
	VendorErr uint32
	ByteLen   uint32
	Imm       uint32
	QPNum     uint32
	SrcQP     uint32
	Flags     uint32
	PKeyIndex uint16
	SLID      uint16
	SL        uint8
}

// AHAttr is an address vector (struct ibv_ah_attr with its GRH; RoCE
// always has one). DGID is the destination GID as an address (IPv4 GIDs
// as plain IPv4).
type AHAttr struct {
	DGID      netip.Addr
	SGIDIndex uint8
	FlowLabel uint32
	HopLimit  uint8
	TClass    uint8
	Port      uint8
}

// QPAttr holds QP attributes (struct ibv_qp_attr).
type QPAttr struct {
	State           QPState
	CurState        QPState
	PathMTU         MTU
	Access          Access
	PKeyIndex       uint16
	Port            uint8
	QKey            uint32
	AH              AHAttr
	DestQPN         uint32
	RQPSN           uint32
	SQPSN           uint32
	Timeout         uint8
	RetryCnt        uint8
	RNRRetry        uint8
	MinRNRTimer     uint8
	MaxRdAtomic     uint8
	MaxDestRdAtomic uint8
}

// QPCap holds a QP's queue sizes (struct ibv_qp_cap).
type QPCap struct {
	MaxSendWR, MaxRecvWR   uint32
	MaxSendSGE, MaxRecvSGE uint32
	MaxInline              uint32
}

// QPInitAttr describes a QP to create (struct ibv_qp_init_attr).
type QPInitAttr struct {
	Type           QPType
	SendCQ, RecvCQ *CQ
	SRQ            *SRQ
	Cap            QPCap
	SigAll         bool
}

// AsyncEvent is an asynchronous event (struct ibv_async_event): Type and
// the object it concerns (nil for port and device events).
type AsyncEvent struct {
	Type uint32
	QP   *QP
	CQ   *CQ
	SRQ  *SRQ
	Port uint32
}
