package verbs

import (
	"fmt"
	"net/netip"
)

// Access flags of a memory region or QP (enum ibv_access_flags).
type Access uint32

// Access flags.
const (
	AccessLocalWrite   Access = 1
	AccessRemoteWrite  Access = 2
	AccessRemoteRead   Access = 4
	AccessRemoteAtomic Access = 8
)

// QPType is the transport service of a QP (enum ibv_qp_type).
type QPType uint8

// QP types.
const (
	RC QPType = 2
	UC QPType = 3
	UD QPType = 4
)

// QPState is a QP state (enum ibv_qp_state).
type QPState uint8

// QP states.
const (
	QPSReset QPState = iota
	QPSInit
	QPSRTR
	QPSRTS
	QPSSQD
	QPSSQE
	QPSErr
)

func (s QPState) String() string {
	n := [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}
	if int(s) < len(n) {
		return n[s]
	}
	return fmt.Sprintf("QPState(%d)", s)
}

// MTU is a path MTU (enum ibv_mtu).
type MTU uint8

// Path MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes (0 when invalid).
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// MTUFromBytes returns the MTU of 256…4096 bytes.
func MTUFromBytes(n int) (MTU, bool) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, true
		}
	}
	return 0, false
}

// Opcode is a send work request's operation (enum ibv_wr_opcode).
type Opcode uint8

// Send opcodes.
const (
	WRRDMAWrite        Opcode = 0
	WRRDMAWriteWithImm Opcode = 1
	WRSend             Opcode = 2
	WRSendWithImm      Opcode = 3
	WRRDMARead         Opcode = 4
	WRAtomicCmpAndSwp  Opcode = 5
	WRAtomicFetchAdd   Opcode = 6
	WRSendWithInv      Opcode = 9
)

// SendFlags of a send work request (enum ibv_send_flags).
type SendFlags uint32

// Send flags.
const (
	SendFence     SendFlags = 1
	SendSignaled  SendFlags = 2
	SendSolicited SendFlags = 4
	SendInline    SendFlags = 8
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

// WCStatus is a completion status (enum ibv_wc_status).
type WCStatus uint8

// Completion statuses.
const (
	WCSuccess        WCStatus = 0
	WCLocLenErr      WCStatus = 1
	WCLocQPOpErr     WCStatus = 2
	WCLocProtErr     WCStatus = 4
	WCWRFlushErr     WCStatus = 5
	WCBadRespErr     WCStatus = 7
	WCLocAccessErr   WCStatus = 8
	WCRemInvReqErr   WCStatus = 9
	WCRemAccessErr   WCStatus = 10
	WCRemOpErr       WCStatus = 11
	WCRetryExcErr    WCStatus = 12
	WCRNRRetryExcErr WCStatus = 13
	WCGeneralErr     WCStatus = 21
)

var statusNames = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "Work Request Flushed Error", "memory management operation error",
	"bad response error", "local access error", "remote invalid request error", "remote access error",
	"remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
	"local RDD violation error", "remote invalid RD request", "operation aborted", "invalid EE context number",
	"invalid EE context state", "fatal error", "response timeout error", "general error",
}

// String is ibv_wc_status_str.
func (s WCStatus) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("WCStatus(%d)", s)
}

// WCOpcode is a completion's operation (enum ibv_wc_opcode).
type WCOpcode uint8

// Completion opcodes.
const (
	WCSend        WCOpcode = 0
	WCRDMAWrite   WCOpcode = 1
	WCRDMARead    WCOpcode = 2
	WCCompSwap    WCOpcode = 3
	WCFetchAdd    WCOpcode = 4
	WCRecv        WCOpcode = 128
	WCRecvRDMAImm WCOpcode = 129
)

// Completion flags (enum ibv_wc_flags).
const (
	WCGRH     uint32 = 1
	WCWithImm uint32 = 2
	WCWithInv uint32 = 8
)

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

// AttrMask selects QP attributes (enum ibv_qp_attr_mask).
type AttrMask uint32

// QP attribute mask bits.
const (
	QPStateMask       AttrMask = 1 << 0 // IBV_QP_STATE
	QPCurState        AttrMask = 1 << 1
	QPAccessFlags     AttrMask = 1 << 3
	QPPKeyIndex       AttrMask = 1 << 4
	QPPort            AttrMask = 1 << 5
	QPQKey            AttrMask = 1 << 6
	QPAV              AttrMask = 1 << 7
	QPPathMTU         AttrMask = 1 << 8
	QPTimeout         AttrMask = 1 << 9
	QPRetryCnt        AttrMask = 1 << 10
	QPRNRRetry        AttrMask = 1 << 11
	QPRQPSN           AttrMask = 1 << 12
	QPMaxQPRdAtomic   AttrMask = 1 << 13
	QPMinRNRTimer     AttrMask = 1 << 15
	QPSQPSN           AttrMask = 1 << 16
	QPMaxDestRdAtomic AttrMask = 1 << 17
	QPDestQPN         AttrMask = 1 << 20
)

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

// Async event types (enum ibv_event_type).
const (
	EventCQErr           = 0
	EventQPFatal         = 1
	EventDeviceFatal     = 8
	EventPortActive      = 9
	EventPortErr         = 10
	EventSRQLimitReached = 15
)

// AsyncEvent is an asynchronous event (struct ibv_async_event): Type and
// the object it concerns (nil for port and device events).
type AsyncEvent struct {
	Type uint32
	QP   *QP
	CQ   *CQ
	SRQ  *SRQ
	Port uint32
}
