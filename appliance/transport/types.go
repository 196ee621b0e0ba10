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

import "github.com/taproce/taproce/verbs/abi"

// SGE is a scatter/gather element: Length bytes at Addr of the region with
// local key LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

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
	Opcode abi.WROpcode
	Flags  abi.SendFlags
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

// WC is a work completion (struct ibv_wc).
type WC struct {
	ID           uint64
	Status       abi.WCStatus
	Opcode       abi.WCOpcode
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

func wcOpcodeOf(op abi.WROpcode) abi.WCOpcode {
	switch op {
	case abi.WRRDMAWrite, abi.WRRDMAWriteWithImm:
		return abi.WCRDMAWrite
	case abi.WRRDMARead:
		return abi.WCRDMARead
	case abi.WRAtomicCmpAndSwp:
		return abi.WCCompSwap
	case abi.WRAtomicFetchAdd:
		return abi.WCFetchAdd
	}
	return abi.WCSend
}
