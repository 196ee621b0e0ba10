package roce

import "encoding/binary"

// BTHLen is the length of the Base Transport Header.
const BTHLen = 12

// BTH is a view of the Base Transport Header (IBA vol. 1, 9.2).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|    OpCode     |S|M|Pad| TVer  |             P_Key             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|F|B|  resv6    |                    DestQP                     |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|A|   resv7     |                      PSN                      |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// S = solicited event, M = MigReq, Pad = pad count, TVer = transport
// version (0), F/B = FECN/BECN (RoCEv2 congestion notification), A = AckReq.
// The ICRC masks the whole byte holding F, B and resv6 (resv8a) to 1s.
type BTH []byte

// BTHFields holds the fields of a BTH. Reserved bits are written as 0.
type BTHFields struct {
	Opcode         Opcode
	SolicitedEvent bool
	MigReq         bool
	PadCount       uint8
	TVer           uint8
	PKey           uint16
	FECN, BECN     bool
	DestQP         uint32
	AckReq         bool
	PSN            PSN
}

// DefaultPKey is the default full-membership partition key.
const DefaultPKey = 0xFFFF

// PKeyMatch reports whether a packet's P_Key a is in the partition of the
// P_Key b (IBA ch. 10, partitioning; rxe's pkey_match): the low 15 bits, the partition
// number, are equal and not 0 (an invalid P_Key), and at least one of the
// two is a full member (bit 15), since two limited members may not talk.
// Against DefaultPKey, 0xFFFF and 0x7FFF match and nothing else does.
func PKeyMatch(a, b uint16) bool {
	return a&0x7FFF != 0 && a&0x7FFF == b&0x7FFF && (a|b)&0x8000 != 0
}

// GSIQKey is the Q_Key of QP1, the general services interface, which
// every GSI datagram carries (IBA ch. 13; rxe's GSI_QKEY): a UD packet
// for QP1 with another Q_Key is dropped.
const GSIQKey = 0x80010000

// QPNMask masks a 24-bit queue pair number.
const QPNMask = 0xFFFFFF

// Opcode returns the opcode.
func (b BTH) Opcode() Opcode { return Opcode(b[0]) }

// SolicitedEvent reports the SE bit.
func (b BTH) SolicitedEvent() bool { return b[1]&0x80 != 0 }

// MigReq reports the M bit.
func (b BTH) MigReq() bool { return b[1]&0x40 != 0 }

// PadCount returns the number of pad bytes after the payload (0…3).
func (b BTH) PadCount() uint8 { return b[1] >> 4 & 0x3 }

// TVer returns the transport header version.
func (b BTH) TVer() uint8 { return b[1] & 0x0F }

// PKey returns the partition key.
func (b BTH) PKey() uint16 { return binary.BigEndian.Uint16(b[2:4]) }

// FECN reports the forward explicit congestion notification bit.
func (b BTH) FECN() bool { return b[4]&0x80 != 0 }

// BECN reports the backward explicit congestion notification bit.
func (b BTH) BECN() bool { return b[4]&0x40 != 0 }

// DestQP returns the destination queue pair number.
func (b BTH) DestQP() uint32 { return binary.BigEndian.Uint32(b[4:8]) & QPNMask }

// AckReq reports the acknowledge request bit.
func (b BTH) AckReq() bool { return b[8]&0x80 != 0 }

// PSN returns the packet sequence number.
func (b BTH) PSN() PSN { return PSN(binary.BigEndian.Uint32(b[8:12]) & PSNMask) }

// SetPSN sets the PSN, keeping the AckReq bit.
func (b BTH) SetPSN(p PSN) {
	binary.BigEndian.PutUint32(b[8:12], uint32(b[8]&0x80)<<24|uint32(p)&PSNMask)
}

// SetAckReq sets or clears the AckReq bit.
func (b BTH) SetAckReq(v bool) {
	if v {
		b[8] |= 0x80
	} else {
		b[8] &^= 0x80
	}
}

// Fields returns all fields.
func (b BTH) Fields() BTHFields {
	return BTHFields{
		Opcode:         b.Opcode(),
		SolicitedEvent: b.SolicitedEvent(),
		MigReq:         b.MigReq(),
		PadCount:       b.PadCount(),
		TVer:           b.TVer(),
		PKey:           b.PKey(),
		FECN:           b.FECN(),
		BECN:           b.BECN(),
		DestQP:         b.DestQP(),
		AckReq:         b.AckReq(),
		PSN:            b.PSN(),
	}
}

// b2u is 1 for true and 0 for false.
func b2u(v bool) uint32 {
	if v {
		return 1
	}
	return 0
}

// Encode writes all fields of f.
func (b BTH) Encode(f *BTHFields) {
	_ = b[11]
	binary.BigEndian.PutUint32(b[0:4], uint32(f.Opcode)<<24|b2u(f.SolicitedEvent)<<23|b2u(f.MigReq)<<22|
		uint32(f.PadCount&3)<<20|uint32(f.TVer&0xF)<<16|uint32(f.PKey))
	binary.BigEndian.PutUint32(b[4:8], b2u(f.FECN)<<31|b2u(f.BECN)<<30|f.DestQP&QPNMask)
	binary.BigEndian.PutUint32(b[8:12], b2u(f.AckReq)<<31|uint32(f.PSN)&PSNMask)
}
