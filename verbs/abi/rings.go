package abi

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"
)

// Shared region layouts. Every region starts with a state block of
// StateBytes (a cache line) that the appliance writes and the client
// reads, or the reverse where noted; rings follow at 64-byte offsets.

// StateBytes is the size of a region's state block.
const StateBytes = 64

// Slot sizes of the rings.
const (
	SendSlot = 512 // SendWQE; inline data after the SGEs
	RecvSlot = 144 // RecvWQE
	CQESlot  = 48  // CQE
	MaxSGE   = 8
	// MaxInline is the inline data a SendWQE slot holds.
	MaxInline = SendSlot - sendInlineOff
)

// QP region state block (written by the appliance):
//
//	0  uint64  send WQEs retired (completed or flushed)
//	8  uint64  receive WQEs retired
//	16 uint32  the QP's state (enum ibv_qp_state), as the transport has it
//
// CQ region state block:
//
//	0  uint32  armed, written by the client (ibv_req_notify_cq): 1 for the
//	           next completion, 2 for the next solicited one; the
//	           appliance clears it when it signals the channel
//	4  uint32  fired, set by the appliance when it signals the channel,
//	           cleared by the client that takes the event
//	8  uint32  overflowed, set by the appliance
//
// SRQ region state block:
//
//	0  uint64  receive WQEs retired
const (
	QPSendRetired = 0
	QPRecvRetired = 8
	QPStateWord   = 16
	CQArmed       = 0
	CQFired       = 4
	CQOverflow    = 8
	SRQRetired    = 0
)

// Word32 and Word64 return the atomic word at off of a state block.
func Word32(state []byte, off int) *atomic.Uint32 {
	_ = state[off+3]
	return (*atomic.Uint32)(unsafe.Pointer(&state[off]))
}

// Word64 returns the atomic 64-bit word at off (8-byte aligned).
func Word64(state []byte, off int) *atomic.Uint64 {
	_ = state[off+7]
	return (*atomic.Uint64)(unsafe.Pointer(&state[off]))
}

// SGE is a scatter/gather element (struct ibv_sge).
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWQE is a send work request in the send ring (struct ibv_send_wr):
//
//	  0  wr_id u64
//	  8  opcode u8, num_sge u8, reserved u16, send_flags u32
//	 16  imm_data / invalidate_rkey u32, rkey u32
//	 24  remote_addr u64
//	 32  compare_add u64
//	 40  swap u64
//	 48  ah u32, remote_qpn u32
//	 56  remote_qkey u32, inline length u32
//	 64  sg_list[8] (16 bytes each)
//	192  inline data
type SendWQE struct {
	WRID       uint64
	Opcode     uint8
	NumSGE     uint8
	Flags      uint32
	Imm        uint32
	RKey       uint32
	RemoteAddr uint64
	CompareAdd uint64
	Swap       uint64
	AH         uint32
	RemoteQPN  uint32
	RemoteQKey uint32
	SGL        [MaxSGE]SGE
	Inline     []byte // on Put, the data to copy; on Get, a view of the slot
}

const sendInlineOff = 192

var le = binary.LittleEndian

// Put writes w into slot.
func (w *SendWQE) Put(slot []byte) {
	_ = slot[SendSlot-1]
	le.PutUint64(slot[0:], w.WRID)
	slot[8], slot[9] = w.Opcode, w.NumSGE
	le.PutUint16(slot[10:], 0)
	le.PutUint32(slot[12:], w.Flags)
	le.PutUint32(slot[16:], w.Imm)
	le.PutUint32(slot[20:], w.RKey)
	le.PutUint64(slot[24:], w.RemoteAddr)
	le.PutUint64(slot[32:], w.CompareAdd)
	le.PutUint64(slot[40:], w.Swap)
	le.PutUint32(slot[48:], w.AH)
	le.PutUint32(slot[52:], w.RemoteQPN)
	le.PutUint32(slot[56:], w.RemoteQKey)
	n := copy(slot[sendInlineOff:], w.Inline)
	le.PutUint32(slot[60:], uint32(n))
	for i := 0; i < int(w.NumSGE) && i < MaxSGE; i++ {
		putSGE(slot[64+16*i:], w.SGL[i])
	}
}

// Get reads a send WQE from slot; the numbers are clamped to the slot, so
// a client's garbage gives a bad request, not a bad access.
func (w *SendWQE) Get(slot []byte) {
	_ = slot[SendSlot-1]
	w.WRID = le.Uint64(slot[0:])
	w.Opcode, w.NumSGE = slot[8], min(slot[9], MaxSGE)
	w.Flags = le.Uint32(slot[12:])
	w.Imm = le.Uint32(slot[16:])
	w.RKey = le.Uint32(slot[20:])
	w.RemoteAddr = le.Uint64(slot[24:])
	w.CompareAdd = le.Uint64(slot[32:])
	w.Swap = le.Uint64(slot[40:])
	w.AH = le.Uint32(slot[48:])
	w.RemoteQPN = le.Uint32(slot[52:])
	w.RemoteQKey = le.Uint32(slot[56:])
	n := min(le.Uint32(slot[60:]), MaxInline)
	w.Inline = slot[sendInlineOff : sendInlineOff+n]
	for i := 0; i < int(w.NumSGE); i++ {
		w.SGL[i] = getSGE(slot[64+16*i:])
	}
}

// RecvWQE is a receive work request (struct ibv_recv_wr):
//
//	0   wr_id u64
//	8   num_sge u32, reserved u32
//	16  sg_list[8]
type RecvWQE struct {
	WRID   uint64
	NumSGE uint32
	SGL    [MaxSGE]SGE
}

// Put writes w into slot.
func (w *RecvWQE) Put(slot []byte) {
	_ = slot[RecvSlot-1]
	le.PutUint64(slot[0:], w.WRID)
	le.PutUint32(slot[8:], w.NumSGE)
	le.PutUint32(slot[12:], 0)
	for i := 0; i < int(w.NumSGE) && i < MaxSGE; i++ {
		putSGE(slot[16+16*i:], w.SGL[i])
	}
}

// Get reads a receive WQE from slot, clamped like SendWQE.Get.
func (w *RecvWQE) Get(slot []byte) {
	_ = slot[RecvSlot-1]
	w.WRID = le.Uint64(slot[0:])
	w.NumSGE = min(le.Uint32(slot[8:]), MaxSGE)
	for i := 0; i < int(w.NumSGE); i++ {
		w.SGL[i] = getSGE(slot[16+16*i:])
	}
}

func putSGE(b []byte, s SGE) {
	le.PutUint64(b[0:], s.Addr)
	le.PutUint32(b[8:], s.Length)
	le.PutUint32(b[12:], s.LKey)
}

func getSGE(b []byte) SGE {
	return SGE{Addr: le.Uint64(b[0:]), Length: le.Uint32(b[8:]), LKey: le.Uint32(b[12:])}
}

// CQE is a work completion (struct ibv_wc):
//
//	 0  wr_id u64
//	 8  status u8, opcode u8, sl u8, dlid_path_bits u8
//	12  vendor_err u32
//	16  byte_len u32
//	20  imm_data / invalidated rkey u32
//	24  qp_num u32
//	28  src_qp u32
//	32  wc_flags u32
//	36  pkey_index u16, slid u16
//	40  reserved
type CQE struct {
	WRID         uint64
	Status       uint8
	Opcode       uint8
	SL           uint8
	DLIDPathBits uint8
	VendorErr    uint32
	ByteLen      uint32
	Imm          uint32
	QPNum        uint32
	SrcQP        uint32
	Flags        uint32
	PKeyIndex    uint16
	SLID         uint16
}

// Put writes c into slot.
func (c *CQE) Put(slot []byte) {
	_ = slot[CQESlot-1]
	le.PutUint64(slot[0:], c.WRID)
	slot[8], slot[9], slot[10], slot[11] = c.Status, c.Opcode, c.SL, c.DLIDPathBits
	le.PutUint32(slot[12:], c.VendorErr)
	le.PutUint32(slot[16:], c.ByteLen)
	le.PutUint32(slot[20:], c.Imm)
	le.PutUint32(slot[24:], c.QPNum)
	le.PutUint32(slot[28:], c.SrcQP)
	le.PutUint32(slot[32:], c.Flags)
	le.PutUint16(slot[36:], c.PKeyIndex)
	le.PutUint16(slot[38:], c.SLID)
}

// Get reads a completion from slot.
func (c *CQE) Get(slot []byte) {
	_ = slot[CQESlot-1]
	c.WRID = le.Uint64(slot[0:])
	c.Status, c.Opcode, c.SL, c.DLIDPathBits = slot[8], slot[9], slot[10], slot[11]
	c.VendorErr = le.Uint32(slot[12:])
	c.ByteLen = le.Uint32(slot[16:])
	c.Imm = le.Uint32(slot[20:])
	c.QPNum = le.Uint32(slot[24:])
	c.SrcQP = le.Uint32(slot[28:])
	c.Flags = le.Uint32(slot[32:])
	c.PKeyIndex = le.Uint16(slot[36:])
	c.SLID = le.Uint16(slot[38:])
}

// RingOffset rounds n up to the 64-byte boundary a ring starts on.
func RingOffset(n int) int { return (n + 63) &^ 63 }
