package roce

import (
	"encoding/binary"
	"strconv"
)

// Lengths of the extended transport headers (IBA vol. 1, 9.3).
const (
	RETHLen         = 16
	AETHLen         = 4
	AtomicETHLen    = 28
	AtomicAckETHLen = 8
	ImmDtLen        = 4
	IETHLen         = 4
	DETHLen         = 8
	FETHLen         = 4
	CNPLen          = 16
	ICRCLen         = 4
)

// RETH is a view of the RDMA Extended Transport Header (IBA 9.3.3).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                     Virtual Address (64 bits)                 |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                             R_Key                             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                          DMA Length                           |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type RETH []byte

// RETHFields holds the fields of a RETH.
type RETHFields struct {
	VA     uint64
	RKey   uint32
	DMALen uint32
}

// Fields returns all fields.
func (h RETH) Fields() RETHFields {
	return RETHFields{
		VA:     binary.BigEndian.Uint64(h[0:8]),
		RKey:   binary.BigEndian.Uint32(h[8:12]),
		DMALen: binary.BigEndian.Uint32(h[12:16]),
	}
}

// Encode writes all fields of f.
func (h RETH) Encode(f *RETHFields) {
	binary.BigEndian.PutUint64(h[0:8], f.VA)
	binary.BigEndian.PutUint32(h[8:12], f.RKey)
	binary.BigEndian.PutUint32(h[12:16], f.DMALen)
}

// AETH is a view of the ACK Extended Transport Header (IBA 9.3.5).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|   Syndrome    |                      MSN                      |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// Syndrome bits 7:5 select ACK (000), RNR NAK (001) or NAK (011); bits 4:0
// are the credit count, the RNR timer code or the NAK code (IBA table 44).
type AETH []byte

// AETHFields holds the fields of an AETH.
type AETHFields struct {
	Syndrome Syndrome
	MSN      uint32
}

// Fields returns all fields.
func (h AETH) Fields() AETHFields {
	v := binary.BigEndian.Uint32(h[0:4])
	return AETHFields{Syndrome: Syndrome(v >> 24), MSN: v & 0xFFFFFF}
}

// Encode writes all fields of f.
func (h AETH) Encode(f *AETHFields) {
	binary.BigEndian.PutUint32(h[0:4], uint32(f.Syndrome)<<24|f.MSN&0xFFFFFF)
}

// Syndrome is the AETH syndrome byte (IBA 9.7.5.2.1, table 44).
type Syndrome uint8

// Syndrome kinds (bits 7:5).
const (
	SyndromeACK    Syndrome = 0x00
	SyndromeRNRNAK Syndrome = 0x20
	SyndromeNAK    Syndrome = 0x60
)

// NAK codes (syndrome bits 4:0 when the kind is SyndromeNAK).
const (
	NAKPSNSequenceError     = 0
	NAKInvalidRequest       = 1
	NAKRemoteAccessError    = 2
	NAKRemoteOperationError = 3
	NAKInvalidRDRequest     = 4
)

// CreditInvalid is the ACK credit count meaning "no end-to-end credits";
// rxe sends it on every ACK.
const CreditInvalid = 0x1F

// Kind returns bits 7:5 of the syndrome: SyndromeACK, SyndromeRNRNAK,
// SyndromeNAK, or a reserved value.
func (s Syndrome) Kind() Syndrome { return s & 0xE0 }

// Value returns bits 4:0: the credit count, RNR timer code or NAK code.
func (s Syndrome) Value() uint8 { return uint8(s) & 0x1F }

// String names the syndrome, e.g. "ACK(credits=31)", "RNR_NAK(timer=14)",
// "NAK(PSN_SEQ_ERR)".
func (s Syndrome) String() string {
	switch s.Kind() {
	case SyndromeACK:
		return "ACK(credits=" + strconv.Itoa(int(s.Value())) + ")"
	case SyndromeRNRNAK:
		return "RNR_NAK(timer=" + strconv.Itoa(int(s.Value())) + ")"
	case SyndromeNAK:
		switch s.Value() {
		case NAKPSNSequenceError:
			return "NAK(PSN_SEQ_ERR)"
		case NAKInvalidRequest:
			return "NAK(INV_REQ)"
		case NAKRemoteAccessError:
			return "NAK(REM_ACCESS_ERR)"
		case NAKRemoteOperationError:
			return "NAK(REM_OP_ERR)"
		case NAKInvalidRDRequest:
			return "NAK(INV_RD_REQ)"
		}
		return "NAK(" + strconv.Itoa(int(s.Value())) + ")"
	}
	return "RESERVED(0x" + strconv.FormatUint(uint64(s), 16) + ")"
}

// AtomicETH is a view of the Atomic Extended Transport Header (IBA 9.3.4).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                   Virtual Address (64 bits)                   |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                             R_Key                             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                Swap (or Add) Data (64 bits)                   |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                    Compare Data (64 bits)                     |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type AtomicETH []byte

// AtomicETHFields holds the fields of an AtomicETH.
type AtomicETHFields struct {
	VA      uint64
	RKey    uint32
	SwapAdd uint64
	Compare uint64
}

// Fields returns all fields.
func (h AtomicETH) Fields() AtomicETHFields {
	return AtomicETHFields{
		VA:      binary.BigEndian.Uint64(h[0:8]),
		RKey:    binary.BigEndian.Uint32(h[8:12]),
		SwapAdd: binary.BigEndian.Uint64(h[12:20]),
		Compare: binary.BigEndian.Uint64(h[20:28]),
	}
}

// Encode writes all fields of f.
func (h AtomicETH) Encode(f *AtomicETHFields) {
	binary.BigEndian.PutUint64(h[0:8], f.VA)
	binary.BigEndian.PutUint32(h[8:12], f.RKey)
	binary.BigEndian.PutUint64(h[12:20], f.SwapAdd)
	binary.BigEndian.PutUint64(h[20:28], f.Compare)
}

// AtomicAckETH is a view of the Atomic Acknowledge Extended Transport
// Header (IBA 9.3.6): the value the target held before the operation.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|               Original Remote Data (64 bits)                  |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type AtomicAckETH []byte

// Orig returns the original remote data.
func (h AtomicAckETH) Orig() uint64 { return binary.BigEndian.Uint64(h[0:8]) }

// Encode writes the original remote data.
func (h AtomicAckETH) Encode(orig uint64) { binary.BigEndian.PutUint64(h[0:8], orig) }

// ImmDt is a view of the Immediate Data Extended Transport Header
// (IBA 9.3.7): 32 bits delivered to the receiver's completion.
//
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                        Immediate Data                         |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type ImmDt []byte

// Imm returns the immediate data as sent (network byte order read as a
// big-endian integer; libibverbs hands it to applications unconverted).
func (h ImmDt) Imm() uint32 { return binary.BigEndian.Uint32(h[0:4]) }

// Encode writes the immediate data.
func (h ImmDt) Encode(imm uint32) { binary.BigEndian.PutUint32(h[0:4], imm) }

// IETH is a view of the Invalidate Extended Transport Header (IBA 9.3.8):
// the R_Key that SEND with invalidate asks the responder to invalidate.
//
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                             R_Key                             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type IETH []byte

// RKey returns the R_Key to invalidate.
func (h IETH) RKey() uint32 { return binary.BigEndian.Uint32(h[0:4]) }

// Encode writes the R_Key.
func (h IETH) Encode(rkey uint32) { binary.BigEndian.PutUint32(h[0:4], rkey) }

// DETH is a view of the Datagram Extended Transport Header (IBA 9.3.2).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                             Q_Key                             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|    Reserved   |                    SrcQP                      |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type DETH []byte

// DETHFields holds the fields of a DETH.
type DETHFields struct {
	QKey  uint32
	SrcQP uint32
}

// Fields returns all fields.
func (h DETH) Fields() DETHFields {
	return DETHFields{
		QKey:  binary.BigEndian.Uint32(h[0:4]),
		SrcQP: binary.BigEndian.Uint32(h[4:8]) & QPNMask,
	}
}

// Encode writes all fields of f.
func (h DETH) Encode(f *DETHFields) {
	binary.BigEndian.PutUint32(h[0:4], f.QKey)
	binary.BigEndian.PutUint32(h[4:8], f.SrcQP&QPNMask)
}

// FETH is a view of the Flush Extended Transport Header (IBA 1.5, 9.3.9),
// which precedes the RETH of an RDMA FLUSH.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                     Reserved                      |SEL|  PLT  |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type FETH []byte

// FETHFields holds the fields of a FETH.
type FETHFields struct {
	Selectivity uint8 // SEL, 2 bits
	Placement   uint8 // PLT, 4 bits
}

// Fields returns all fields.
func (h FETH) Fields() FETHFields {
	v := binary.BigEndian.Uint32(h[0:4])
	return FETHFields{Selectivity: uint8(v>>4) & 0x3, Placement: uint8(v) & 0xF}
}

// Encode writes all fields of f.
func (h FETH) Encode(f *FETHFields) {
	binary.BigEndian.PutUint32(h[0:4], uint32(f.Selectivity&3)<<4|uint32(f.Placement&0xF))
}
