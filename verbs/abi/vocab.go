package abi

import "fmt"

// The ibverbs vocabulary, defined once for both sides: the appliance's
// transport speaks it and the verbs library hands it to applications, with
// libibverbs' values (verbs.h), so that a field crosses the control socket
// and the rings as the number a C program would use.

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
	QPSReset QPState = iota
	QPSInit
	QPSRTR
	QPSRTS
	QPSSQD
	QPSSQE
	QPSErr
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

// AttrMask selects queue pair attributes (enum ibv_qp_attr_mask).
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
	QPAltPath         AttrMask = 1 << 14
	QPMinRNRTimer     AttrMask = 1 << 15
	QPSQPSN           AttrMask = 1 << 16
	QPMaxDestRdAtomic AttrMask = 1 << 17
	QPPathMigState    AttrMask = 1 << 18
	QPCap             AttrMask = 1 << 19
	QPDestQPN         AttrMask = 1 << 20
)

// MTU is a path MTU (enum ibv_mtu, IBA 7.7.7): 1 = 256 bytes … 5 = 4096
// bytes of payload per packet.
type MTU uint8

// Path MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the payload bytes per packet, or 0 for an invalid MTU.
func (m MTU) Bytes() int {
	if !m.Valid() {
		return 0
	}
	return 128 << m
}

// Valid reports whether m is one of MTU256…MTU4096.
func (m MTU) Valid() bool { return m >= MTU256 && m <= MTU4096 }

// MTUFromBytes returns the MTU of 256, 512, 1024, 2048 or 4096 bytes, and
// false for any other value.
func MTUFromBytes(n int) (MTU, bool) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, true
		}
	}
	return 0, false
}

// RoCEHeaderRoom is the most header bytes a RoCEv2 packet adds to its
// payload as rxe counts them (RXE_MAX_HDR_LENGTH): a port's active MTU is
// the largest path MTU that fits its netdev MTU less this.
const RoCEHeaderRoom = 80

// MTUForNetdev returns the active path MTU of a port whose network device
// has MTU netdevMTU, as rxe derives it (eth_mtu_int_to_enum): 1500 gives
// MTU1024, 9000 gives MTU4096. Below 256+80 it returns MTU256.
func MTUForNetdev(netdevMTU int) MTU {
	avail := netdevMTU - RoCEHeaderRoom
	m := MTU256
	for c := MTU512; c <= MTU4096; c++ {
		if c.Bytes() <= avail {
			m = c
		}
	}
	return m
}

// WROpcode is a send work request's operation (enum ibv_wr_opcode).
type WROpcode uint8

// Send work request opcodes.
const (
	WRRDMAWrite        WROpcode = 0
	WRRDMAWriteWithImm WROpcode = 1
	WRSend             WROpcode = 2
	WRSendWithImm      WROpcode = 3
	WRRDMARead         WROpcode = 4
	WRAtomicCmpAndSwp  WROpcode = 5
	WRAtomicFetchAdd   WROpcode = 6
	WRSendWithInv      WROpcode = 9
)

var wrOpcodeNames = map[WROpcode]string{
	WRRDMAWrite: "RDMA_WRITE", WRRDMAWriteWithImm: "RDMA_WRITE_WITH_IMM", WRSend: "SEND", WRSendWithImm: "SEND_WITH_IMM",
	WRRDMARead: "RDMA_READ", WRAtomicCmpAndSwp: "ATOMIC_CMP_AND_SWP", WRAtomicFetchAdd: "ATOMIC_FETCH_AND_ADD", WRSendWithInv: "SEND_WITH_INV",
}

func (o WROpcode) String() string {
	if n, ok := wrOpcodeNames[o]; ok {
		return n
	}
	return fmt.Sprintf("WROpcode(%d)", o)
}

// Valid reports whether o is one of the opcodes above.
func (o WROpcode) Valid() bool {
	_, ok := wrOpcodeNames[o]
	return ok
}

// IsAtomic reports a compare-and-swap or fetch-and-add.
func (o WROpcode) IsAtomic() bool { return o == WRAtomicCmpAndSwp || o == WRAtomicFetchAdd }

// IsSend reports a SEND of any kind.
func (o WROpcode) IsSend() bool { return o == WRSend || o == WRSendWithImm || o == WRSendWithInv }

// IsWrite reports an RDMA WRITE, with immediate or not.
func (o WROpcode) IsWrite() bool { return o == WRRDMAWrite || o == WRRDMAWriteWithImm }

// SendFlags are the flags of a send work request (enum ibv_send_flags).
type SendFlags uint32

// Send flags.
const (
	SendFence     SendFlags = 1
	SendSignaled  SendFlags = 2
	SendSolicited SendFlags = 4
	SendInline    SendFlags = 8
)

// WCStatus is a work completion status (enum ibv_wc_status).
type WCStatus uint8

// Completion statuses.
const (
	WCSuccess        WCStatus = 0
	WCLocLenErr      WCStatus = 1
	WCLocQPOpErr     WCStatus = 2
	WCLocEECOpErr    WCStatus = 3
	WCLocProtErr     WCStatus = 4
	WCWRFlushErr     WCStatus = 5
	WCMWBindErr      WCStatus = 6
	WCBadRespErr     WCStatus = 7
	WCLocAccessErr   WCStatus = 8
	WCRemInvReqErr   WCStatus = 9
	WCRemAccessErr   WCStatus = 10
	WCRemOpErr       WCStatus = 11
	WCRetryExcErr    WCStatus = 12
	WCRNRRetryExcErr WCStatus = 13
	WCLocRDDViolErr  WCStatus = 14
	WCRemInvRDReqErr WCStatus = 15
	WCRemAbortErr    WCStatus = 16
	WCInvEECNErr     WCStatus = 17
	WCInvEECStateErr WCStatus = 18
	WCFatalErr       WCStatus = 19
	WCRespTimeoutErr WCStatus = 20
	WCGeneralErr     WCStatus = 21
)

var statusNames = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "Work Request Flushed Error", "memory management operation error",
	"bad response error", "local access error", "remote invalid request error", "remote access error",
	"remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
	"local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
	"invalid EE context state", "fatal error", "response timeout error", "general error", "TM error",
	"TM software rendezvous",
}

// String gives the text of ibv_wc_status_str.
func (s WCStatus) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("WCStatus(%d)", s)
}

// WCOpcode is the operation of a work completion (enum ibv_wc_opcode).
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
