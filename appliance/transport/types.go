// Package transport is the InfiniBand transport of a taproce port, as IBA
// vol. 1 chapters 9–11 define it and Linux rxe organises it: a requester
// that turns work requests into packets, a responder that executes
// requests and answers them, a completer that turns acknowledgements into
// completions and decides on retries, and one routing point between the
// wire and them (Engine.Receive).
//
// The package does no I/O of its own. Frames leave through an Output,
// time comes from the caller (Engine.Tick with the current time), and
// memory is the byte slices of registered memory regions, so the whole
// transport runs deterministically in tests over an in-memory lossy link
// with a fake clock.
package transport

import "fmt"

// QPType is the transport service of a queue pair (enum ibv_qp_type).
type QPType uint8

// QP types.
const (
	RC QPType = 2 // IBV_QPT_RC
	UC QPType = 3 // IBV_QPT_UC
	UD QPType = 4 // IBV_QPT_UD
)

func (t QPType) String() string {
	switch t {
	case RC:
		return "RC"
	case UC:
		return "UC"
	case UD:
		return "UD"
	}
	return fmt.Sprintf("QPType(%d)", t)
}

// QPState is a queue pair state (enum ibv_qp_state, IBA 10.3.1).
type QPState uint8

// QP states.
const (
	StateReset QPState = iota
	StateInit
	StateRTR
	StateRTS
	StateSQD
	StateSQE
	StateErr
)

var stateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

func (s QPState) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("QPState(%d)", s)
}

// Access flags of memory regions and queue pairs (enum ibv_access_flags).
type Access uint32

// Access flags.
const (
	AccessLocalWrite   Access = 1
	AccessRemoteWrite  Access = 2
	AccessRemoteRead   Access = 4
	AccessRemoteAtomic Access = 8
)

// Opcode is a work request opcode (enum ibv_wr_opcode).
type Opcode uint8

// Work request opcodes.
const (
	OpWrite    Opcode = 0
	OpWriteImm Opcode = 1
	OpSend     Opcode = 2
	OpSendImm  Opcode = 3
	OpRead     Opcode = 4
	OpCmpSwap  Opcode = 5
	OpFetchAdd Opcode = 6
	OpSendInv  Opcode = 9
)

var opNames = map[Opcode]string{
	OpWrite: "RDMA_WRITE", OpWriteImm: "RDMA_WRITE_WITH_IMM", OpSend: "SEND", OpSendImm: "SEND_WITH_IMM",
	OpRead: "RDMA_READ", OpCmpSwap: "ATOMIC_CMP_AND_SWP", OpFetchAdd: "ATOMIC_FETCH_AND_ADD", OpSendInv: "SEND_WITH_INV",
}

func (o Opcode) String() string {
	if n, ok := opNames[o]; ok {
		return n
	}
	return fmt.Sprintf("Opcode(%d)", o)
}

func (o Opcode) isAtomic() bool { return o == OpCmpSwap || o == OpFetchAdd }
func (o Opcode) isSend() bool   { return o == OpSend || o == OpSendImm || o == OpSendInv }
func (o Opcode) isWrite() bool  { return o == OpWrite || o == OpWriteImm }

// SGE is a scatter/gather element: Length bytes at Addr of the region with
// local key LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendFlags are the flags of a send work request (enum ibv_send_flags).
type SendFlags uint32

// Send flags.
const (
	SendFence     SendFlags = 1
	SendSignaled  SendFlags = 2
	SendSolicited SendFlags = 4
	SendInline    SendFlags = 8
)

// AH is an address handle: where a UD send goes (struct ibv_ah_attr with
// its GRH, which RoCE always has).
type AH struct {
	DstIP     [16]byte // GID of the destination (IPv4-mapped for IPv4)
	DstMAC    [6]byte
	SGIDIndex uint8  // source GID
	SrcPort   uint16 // UDP source port; 0 lets the engine choose
	// HopLimit is the GRH hop limit asked for. As ib_core does for an
	// address handle of a RoCEv2 GID (rdma_create_user_ah), the engine
	// replaces it with the route's: packets carry HopLimit (64) whatever
	// it is.
	HopLimit uint8
	// TClass is the GRH traffic class: the IPv4 TOS or IPv6 traffic
	// class of the packets.
	TClass uint8
	// FlowLabel is the GRH flow label, the IPv6 flow label of the packets
	// (20 bits).
	FlowLabel uint32
}

// SendWR is a send work request (struct ibv_send_wr).
type SendWR struct {
	ID     uint64
	Opcode Opcode
	Flags  SendFlags
	SGL    []SGE
	Inline []byte // data for SendInline, copied at post time
	Imm    uint32 // immediate data (network order as the wire has it), or the rkey to invalidate
	// RDMA and atomics.
	RemoteAddr uint64
	RKey       uint32
	CompareAdd uint64 // compare (CMP_SWAP) or add (FETCH_ADD) operand
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

// Status is a work completion status (enum ibv_wc_status).
type Status uint8

// Completion statuses.
const (
	WCSuccess        Status = 0
	WCLocLenErr      Status = 1
	WCLocQPOpErr     Status = 2
	WCLocEECOpErr    Status = 3
	WCLocProtErr     Status = 4
	WCWRFlushErr     Status = 5
	WCMWBindErr      Status = 6
	WCBadRespErr     Status = 7
	WCLocAccessErr   Status = 8
	WCRemInvReqErr   Status = 9
	WCRemAccessErr   Status = 10
	WCRemOpErr       Status = 11
	WCRetryExcErr    Status = 12
	WCRNRRetryExcErr Status = 13
	WCLocRDDViolErr  Status = 14
	WCRemInvRDReqErr Status = 15
	WCRemAbortErr    Status = 16
	WCInvEECNErr     Status = 17
	WCInvEECStateErr Status = 18
	WCFatalErr       Status = 19
	WCRespTimeoutErr Status = 20
	WCGeneralErr     Status = 21
)

var statusNames = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "Work Request Flushed Error", "memory management operation error",
	"bad response error", "local access error", "remote invalid request error", "remote access error",
	"remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
	"local RDD violation error", "remote invalid RD request", "operation aborted", "invalid EE context number",
	"invalid EE context state", "fatal error", "response timeout error", "general error",
}

// String gives the text of ibv_wc_status_str.
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", s)
}

// WCOpcode is the opcode of a work completion (enum ibv_wc_opcode).
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

// WC flags (enum ibv_wc_flags).
const (
	WCWithImm uint32 = 2
	WCWithInv uint32 = 8
	WCGRH     uint32 = 1
)

// WC is a work completion (struct ibv_wc).
type WC struct {
	ID           uint64
	Status       Status
	Opcode       WCOpcode
	VendorErr    uint32
	ByteLen      uint32
	Imm          uint32 // immediate data, or the invalidated rkey
	QPNum        uint32
	SrcQP        uint32
	Flags        uint32
	PKeyIndex    uint16
	SLID         uint16
	SL           uint8
	DLIDPathBits uint8
}

func wcOpcodeOf(op Opcode) WCOpcode {
	switch op {
	case OpWrite, OpWriteImm:
		return WCRDMAWrite
	case OpRead:
		return WCRDMARead
	case OpCmpSwap:
		return WCCompSwap
	case OpFetchAdd:
		return WCFetchAdd
	}
	return WCSend
}
