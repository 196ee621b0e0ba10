package cm

import (
	"encoding/binary"
	"strconv"

	"github.com/taproce/taproce/appliance/roce"
)

// Lengths of the private data each message carries (Linux
// include/rdma/ib_cm.h, enum ib_cm_data_size), of the path fields in a
// REQ, and of the additional information fields.
const (
	REQPrivateDataLen     = 92
	MRAPrivateDataLen     = 222
	REJPrivateDataLen     = 148
	REPPrivateDataLen     = 196
	RTUPrivateDataLen     = 224
	DREQPrivateDataLen    = 220
	DREPPrivateDataLen    = 224
	SIDRReqPrivateDataLen = 216
	SIDRRepPrivateDataLen = 136
	ARILen                = 72 // REJ additional rejection information
	SIDRInfoLen           = 72 // SIDR_REP additional information
	PathLen               = 44 // one path's fields in a REQ
	ClassPortInfoLen      = 72
)

// Offsets of the private data in the attribute data.
const (
	reqPrivate     = 140
	mraPrivate     = 10
	rejARI         = 12
	rejPrivate     = 84
	repPrivate     = 36
	rtuPrivate     = 8
	dreqPrivate    = 12
	drepPrivate    = 8
	sidrReqPrivate = 16
	sidrRepInfo    = 24
	sidrRepPrivate = 96
)

func get24(b []byte) uint32      { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }
func put24(b []byte, v uint32)   { b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v) }
func flag(b byte, bit uint) bool { return b>>bit&1 != 0 }

func b2u(v bool) uint8 {
	if v {
		return 1
	}
	return 0
}

// TransportType is the transport service type of a REQ (2 bits).
type TransportType uint8

// Transport service types. TransportExtended says that the REQ's extended
// transport type field names it (1 = XRC, IBA Annex A14).
const (
	TransportRC       TransportType = 0
	TransportUC       TransportType = 1
	TransportRD       TransportType = 2
	TransportExtended TransportType = 3
)

// String returns "RC", "UC", "RD" or "EXT".
func (t TransportType) String() string {
	return [...]string{"RC", "UC", "RD", "EXT"}[t&3]
}

// MessageKind is the 2-bit field of an MRA (the message MRAed) and of a
// REJ (the message rejected).
type MessageKind uint8

// Message kinds. For an MRA, MessageOther is a LAP; for a REJ, a REJ of
// something other than a REQ or REP (a stale connection found by a
// message of another kind).
const (
	MessageREQ   MessageKind = 0
	MessageREP   MessageKind = 1
	MessageOther MessageKind = 2
)

// String returns "REQ", "REP", "OTHER", or "3" (reserved).
func (k MessageKind) String() string {
	switch k {
	case MessageREQ:
		return "REQ"
	case MessageREP:
		return "REP"
	case MessageOther:
		return "OTHER"
	}
	return strconv.Itoa(int(k & 3))
}

// MTUBytes returns the bytes of a path MTU code (1 = 256 … 5 = 4096, IBA
// 7.7.7, the REQ's path packet payload MTU), or 0 for a code that names
// none.
func MTUBytes(code uint8) int {
	if code < 1 || code > 5 {
		return 0
	}
	return 128 << code
}

// Path is a view of one path's fields in a REQ, primary or alternate
// (IBA vol. 1 table 106), 44 bytes.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|        Local Port LID         |        Remote Port LID        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                  Local Port GID (128 bits)                    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                  Remote Port GID (128 bits)                   |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|              Flow Label               |  resv6    |  Rate     |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	| Traffic Class |   Hop Limit   |  SL   |S|resv3|ACK T/O  |resv3|
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// S = subnet local. On RoCE the LIDs are 0xFFFF (permissive) and the GIDs
// the ports' IP addresses; Linux derives the primary flow label from the
// RDMA CM's ports, and both sides take their RC packets' UDP source port
// from it (roce.SourcePortFromFlowLabel).
type Path []byte

// PathFields holds one path's fields.
type PathFields struct {
	LocalLID, RemoteLID uint16
	LocalGID, RemoteGID roce.GID
	FlowLabel           uint32 // 20 bits
	PacketRate          uint8  // 6 bits, IBA rate code (0: the port's current rate)
	TrafficClass        uint8
	HopLimit            uint8
	SL                  uint8 // 4 bits
	SubnetLocal         bool
	LocalACKTimeout     uint8 // 5 bits: 4.096 µs × 2^n
}

// Fields returns all fields.
func (h Path) Fields() PathFields {
	v := binary.BigEndian.Uint32(h[36:40])
	return PathFields{
		LocalLID:        binary.BigEndian.Uint16(h[0:2]),
		RemoteLID:       binary.BigEndian.Uint16(h[2:4]),
		LocalGID:        roce.GID(h[4:20]),
		RemoteGID:       roce.GID(h[20:36]),
		FlowLabel:       v >> 12,
		PacketRate:      uint8(v) & 0x3F,
		TrafficClass:    h[40],
		HopLimit:        h[41],
		SL:              h[42] >> 4,
		SubnetLocal:     flag(h[42], 3),
		LocalACKTimeout: h[43] >> 3,
	}
}

// Encode writes all fields of f, and 0 to the reserved bits.
func (h Path) Encode(f *PathFields) {
	binary.BigEndian.PutUint16(h[0:2], f.LocalLID)
	binary.BigEndian.PutUint16(h[2:4], f.RemoteLID)
	copy(h[4:20], f.LocalGID[:])
	copy(h[20:36], f.RemoteGID[:])
	binary.BigEndian.PutUint32(h[36:40], f.FlowLabel&0xFFFFF<<12|uint32(f.PacketRate&0x3F))
	h[40], h[41] = f.TrafficClass, f.HopLimit
	h[42] = f.SL&0xF<<4 | b2u(f.SubnetLocal)<<3
	h[43] = f.LocalACKTimeout & 0x1F << 3
}

// REQ is a view of a REQ's attribute data, the request for communication
// (IBA vol. 1 ch. 12, table 106 "REQ Message Contents"; Linux
// CM_REQ_* in include/rdma/ibta_vol1_c12.h). Byte offsets in the 232
// bytes:
//
//	  0 Local Communication ID                 4 reserved
//	  8 Service ID (64)                       16 Local CA GUID (64)
//	 24 reserved                              28 Local Q_Key
//	 32 Local QPN (24) | Responder Resources (8)
//	 36 Local EECN (24) | Initiator Depth (8)
//	 40 Remote EECN (24) | Remote CM Response Timeout (5) | Transport
//	    Service Type (2) | End-to-End Flow Control (1)
//	 44 Starting PSN (24) | Local CM Response Timeout (5) | Retry Count (3)
//	 48 P_Key (16) | Path MTU (4) | RDC Exists (1) | RNR Retry Count (3) |
//	    Max CM Retries (4) | SRQ (1) | Extended Transport Type (3)
//	 52 Primary path (44)                     96 Alternate path (44);
//	    the alternate path's last byte holds SAP Supported at bit 5
//	140 Private Data (92)
type REQ []byte

// REQFields holds the fields of a REQ.
type REQFields struct {
	LocalCommID        uint32
	ServiceID          ServiceID
	LocalCAGUID        uint64
	LocalQKey          uint32 // UD/RD only; 0 on RC
	LocalQPN           uint32 // 24 bits
	ResponderResources uint8  // RDMA READs/atomics the sender accepts at once
	LocalEECN          uint32 // 24 bits, RD only
	InitiatorDepth     uint8  // RDMA READs/atomics the sender issues at once
	RemoteEECN         uint32 // 24 bits, RD only
	// RemoteCMResponseTimeout is how long (5-bit code) the sender waits
	// for the answer to this REQ; LocalCMResponseTimeout how long its
	// own CM takes to answer the peer's messages.
	RemoteCMResponseTimeout uint8
	TransportServiceType    TransportType
	EndToEndFlowControl     bool
	// StartingPSN is the PSN the sender's QP expects first: its receive
	// PSN, the one the passive side's QP starts sending with (Linux sets
	// the passive side's sq_psn from it, and rxe's captures show the
	// passive side's first request carrying it).
	StartingPSN            roce.PSN
	LocalCMResponseTimeout uint8
	RetryCount             uint8 // 3 bits: transport retries (7 = for ever, rxe)
	PKey                   uint16
	PathMTU                uint8 // 4 bits: 1 = 256 … 5 = 4096 (MTUBytes)
	RDCExists              bool
	RNRRetryCount          uint8 // 3 bits (7 = for ever)
	MaxCMRetries           uint8 // 4 bits: how often the CMs resend a message
	SRQ                    bool
	ExtendedTransportType  uint8 // 3 bits, when TransportServiceType is TransportExtended
	Primary                PathFields
	Alternate              PathFields
	SAPSupported           bool
	PrivateData            [REQPrivateDataLen]byte
}

// LocalCommID returns the local communication ID.
func (h REQ) LocalCommID() uint32 { return binary.BigEndian.Uint32(h[0:4]) }

// ServiceID returns the service ID.
func (h REQ) ServiceID() ServiceID { return ServiceID(binary.BigEndian.Uint64(h[8:16])) }

// Fields returns all fields.
func (h REQ) Fields() REQFields {
	f := REQFields{
		LocalCommID:             binary.BigEndian.Uint32(h[0:4]),
		ServiceID:               ServiceID(binary.BigEndian.Uint64(h[8:16])),
		LocalCAGUID:             binary.BigEndian.Uint64(h[16:24]),
		LocalQKey:               binary.BigEndian.Uint32(h[28:32]),
		LocalQPN:                get24(h[32:]),
		ResponderResources:      h[35],
		LocalEECN:               get24(h[36:]),
		InitiatorDepth:          h[39],
		RemoteEECN:              get24(h[40:]),
		RemoteCMResponseTimeout: h[43] >> 3,
		TransportServiceType:    TransportType(h[43] >> 1 & 3),
		EndToEndFlowControl:     flag(h[43], 0),
		StartingPSN:             roce.PSN(get24(h[44:])),
		LocalCMResponseTimeout:  h[47] >> 3,
		RetryCount:              h[47] & 7,
		PKey:                    binary.BigEndian.Uint16(h[48:50]),
		PathMTU:                 h[50] >> 4,
		RDCExists:               flag(h[50], 3),
		RNRRetryCount:           h[50] & 7,
		MaxCMRetries:            h[51] >> 4,
		SRQ:                     flag(h[51], 3),
		ExtendedTransportType:   h[51] & 7,
		Primary:                 Path(h[52:96]).Fields(),
		Alternate:               Path(h[96:140]).Fields(),
		SAPSupported:            flag(h[139], 2),
	}
	copy(f.PrivateData[:], h[reqPrivate:])
	return f
}

// Encode writes all fields of f, and 0 to the reserved bits.
func (h REQ) Encode(f *REQFields) {
	clear(h[:DataLen])
	binary.BigEndian.PutUint32(h[0:4], f.LocalCommID)
	binary.BigEndian.PutUint64(h[8:16], uint64(f.ServiceID))
	binary.BigEndian.PutUint64(h[16:24], f.LocalCAGUID)
	binary.BigEndian.PutUint32(h[28:32], f.LocalQKey)
	put24(h[32:], f.LocalQPN)
	h[35] = f.ResponderResources
	put24(h[36:], f.LocalEECN)
	h[39] = f.InitiatorDepth
	put24(h[40:], f.RemoteEECN)
	h[43] = f.RemoteCMResponseTimeout&0x1F<<3 | uint8(f.TransportServiceType&3)<<1 | b2u(f.EndToEndFlowControl)
	put24(h[44:], uint32(f.StartingPSN))
	h[47] = f.LocalCMResponseTimeout&0x1F<<3 | f.RetryCount&7
	binary.BigEndian.PutUint16(h[48:50], f.PKey)
	h[50] = f.PathMTU&0xF<<4 | b2u(f.RDCExists)<<3 | f.RNRRetryCount&7
	h[51] = f.MaxCMRetries&0xF<<4 | b2u(f.SRQ)<<3 | f.ExtendedTransportType&7
	Path(h[52:96]).Encode(&f.Primary)
	Path(h[96:140]).Encode(&f.Alternate)
	h[139] |= b2u(f.SAPSupported) << 2
	copy(h[reqPrivate:], f.PrivateData[:])
}

// MRA is a view of an MRA's attribute data, the message receipt
// acknowledgement: "I have your REQ, REP or LAP; my answer takes up to
// the service timeout" (IBA vol. 1 table 107). Linux's RDMA CM sends one
// only when a duplicate REQ arrives before the application has accepted
// (IB_CM_MRA_FLAG_DELAY), with service timeout 24 (≈69 s): rxe's captures
// hold none.
//
//	0 Local Communication ID    4 Remote Communication ID
//	8 Message MRAed (2) | reserved (6)
//	9 Service Timeout (5) | reserved (3)
//	10 Private Data (222)
type MRA []byte

// MRAFields holds the fields of an MRA.
type MRAFields struct {
	LocalCommID    uint32
	RemoteCommID   uint32
	MessageMRAed   MessageKind
	ServiceTimeout uint8 // 5 bits: 4.096 µs × 2^n, added to the sender's wait
	PrivateData    [MRAPrivateDataLen]byte
}

// Fields returns all fields.
func (h MRA) Fields() MRAFields {
	f := MRAFields{
		LocalCommID:    binary.BigEndian.Uint32(h[0:4]),
		RemoteCommID:   binary.BigEndian.Uint32(h[4:8]),
		MessageMRAed:   MessageKind(h[8] >> 6),
		ServiceTimeout: h[9] >> 3,
	}
	copy(f.PrivateData[:], h[mraPrivate:])
	return f
}

// Encode writes all fields of f, and 0 to the reserved bits.
func (h MRA) Encode(f *MRAFields) {
	clear(h[:DataLen])
	binary.BigEndian.PutUint32(h[0:4], f.LocalCommID)
	binary.BigEndian.PutUint32(h[4:8], f.RemoteCommID)
	h[8] = uint8(f.MessageMRAed&3) << 6
	h[9] = f.ServiceTimeout & 0x1F << 3
	copy(h[mraPrivate:], f.PrivateData[:])
}

// REJ is a view of a REJ's attribute data, the reject (IBA vol. 1
// table 108).
//
//	 0 Local Communication ID    4 Remote Communication ID
//	 8 Message Rejected (2) | reserved (6)
//	 9 Reject Info Length (7) | reserved (1)
//	10 Reason (16)
//	12 Additional Rejection Information (72)
//	84 Private Data (148)
//
// Linux rejects a REQ with the REQ's TID, the REQ's comm ID as
// RemoteCommID and 0 as LocalCommID, both when no one listens (reason 8,
// cm.c's cm_issue_rej) and when the consumer rejects before sending an
// MRA (cm_format_rej in REQ_RCVD).
type REJ []byte

// REJFields holds the fields of a REJ.
type REJFields struct {
	LocalCommID     uint32
	RemoteCommID    uint32
	MessageRejected MessageKind
	// RejectInfoLength is how many bytes of ARI are meaningful (7
	// bits; at most ARILen make sense).
	RejectInfoLength uint8
	Reason           RejectReason
	ARI              [ARILen]byte
	PrivateData      [REJPrivateDataLen]byte
}

// AdditionalInfo returns the meaningful part of the ARI.
func (f *REJFields) AdditionalInfo() []byte {
	return f.ARI[:min(int(f.RejectInfoLength), ARILen)]
}

// Fields returns all fields.
func (h REJ) Fields() REJFields {
	f := REJFields{
		LocalCommID:      binary.BigEndian.Uint32(h[0:4]),
		RemoteCommID:     binary.BigEndian.Uint32(h[4:8]),
		MessageRejected:  MessageKind(h[8] >> 6),
		RejectInfoLength: h[9] >> 1,
		Reason:           RejectReason(binary.BigEndian.Uint16(h[10:12])),
	}
	copy(f.ARI[:], h[rejARI:rejPrivate])
	copy(f.PrivateData[:], h[rejPrivate:])
	return f
}

// Encode writes all fields of f, and 0 to the reserved bits.
func (h REJ) Encode(f *REJFields) {
	clear(h[:DataLen])
	binary.BigEndian.PutUint32(h[0:4], f.LocalCommID)
	binary.BigEndian.PutUint32(h[4:8], f.RemoteCommID)
	h[8] = uint8(f.MessageRejected&3) << 6
	h[9] = f.RejectInfoLength & 0x7F << 1
	binary.BigEndian.PutUint16(h[10:12], uint16(f.Reason))
	copy(h[rejARI:rejPrivate], f.ARI[:])
	copy(h[rejPrivate:], f.PrivateData[:])
}

// REP is a view of a REP's attribute data, the reply to a REQ (IBA vol. 1
// table 110).
//
//	 0 Local Communication ID    4 Remote Communication ID
//	 8 Local Q_Key
//	12 Local QPN (24) | reserved (8)
//	16 Local EE Context Number (24) | reserved (8)
//	20 Starting PSN (24) | reserved (8)
//	24 Responder Resources      25 Initiator Depth
//	26 Target ACK Delay (5) | Failover Accepted (2) | End-to-End Flow Control (1)
//	27 RNR Retry Count (3) | SRQ (1) | reserved (4)
//	28 Local CA GUID (64)
//	36 Private Data (196)
type REP []byte

// REPFields holds the fields of a REP.
type REPFields struct {
	LocalCommID  uint32
	RemoteCommID uint32
	LocalQKey    uint32
	LocalQPN     uint32 // 24 bits
	LocalEECN    uint32 // 24 bits
	// StartingPSN is the PSN the passive side's QP expects first: the
	// active side sends from it (Linux sets the active side's sq_psn
	// from it; so do rxe's captures).
	StartingPSN         roce.PSN
	ResponderResources  uint8
	InitiatorDepth      uint8
	TargetACKDelay      uint8 // 5 bits: the passive side's CA ACK delay
	FailoverAccepted    uint8 // 2 bits: 0 accepted, 1 not supported, 2 rejected
	EndToEndFlowControl bool
	RNRRetryCount       uint8 // 3 bits
	SRQ                 bool
	LocalCAGUID         uint64
	PrivateData         [REPPrivateDataLen]byte
}

// Fields returns all fields.
func (h REP) Fields() REPFields {
	f := REPFields{
		LocalCommID:         binary.BigEndian.Uint32(h[0:4]),
		RemoteCommID:        binary.BigEndian.Uint32(h[4:8]),
		LocalQKey:           binary.BigEndian.Uint32(h[8:12]),
		LocalQPN:            get24(h[12:]),
		LocalEECN:           get24(h[16:]),
		StartingPSN:         roce.PSN(get24(h[20:])),
		ResponderResources:  h[24],
		InitiatorDepth:      h[25],
		TargetACKDelay:      h[26] >> 3,
		FailoverAccepted:    h[26] >> 1 & 3,
		EndToEndFlowControl: flag(h[26], 0),
		RNRRetryCount:       h[27] >> 5,
		SRQ:                 flag(h[27], 4),
		LocalCAGUID:         binary.BigEndian.Uint64(h[28:36]),
	}
	copy(f.PrivateData[:], h[repPrivate:])
	return f
}

// Encode writes all fields of f, and 0 to the reserved bits.
func (h REP) Encode(f *REPFields) {
	clear(h[:DataLen])
	binary.BigEndian.PutUint32(h[0:4], f.LocalCommID)
	binary.BigEndian.PutUint32(h[4:8], f.RemoteCommID)
	binary.BigEndian.PutUint32(h[8:12], f.LocalQKey)
	put24(h[12:], f.LocalQPN)
	put24(h[16:], f.LocalEECN)
	put24(h[20:], uint32(f.StartingPSN))
	h[24], h[25] = f.ResponderResources, f.InitiatorDepth
	h[26] = f.TargetACKDelay&0x1F<<3 | f.FailoverAccepted&3<<1 | b2u(f.EndToEndFlowControl)
	h[27] = f.RNRRetryCount&7<<5 | b2u(f.SRQ)<<4
	binary.BigEndian.PutUint64(h[28:36], f.LocalCAGUID)
	copy(h[repPrivate:], f.PrivateData[:])
}

// RTU is a view of an RTU's attribute data, ready to use (IBA vol. 1
// table 111): 0 Local Communication ID, 4 Remote Communication ID,
// 8 Private Data (224).
type RTU []byte

// RTUFields holds the fields of an RTU.
type RTUFields struct {
	LocalCommID  uint32
	RemoteCommID uint32
	PrivateData  [RTUPrivateDataLen]byte
}

// Fields returns all fields.
func (h RTU) Fields() RTUFields {
	f := RTUFields{LocalCommID: binary.BigEndian.Uint32(h[0:4]), RemoteCommID: binary.BigEndian.Uint32(h[4:8])}
	copy(f.PrivateData[:], h[rtuPrivate:])
	return f
}

// Encode writes all fields of f.
func (h RTU) Encode(f *RTUFields) {
	clear(h[:DataLen])
	binary.BigEndian.PutUint32(h[0:4], f.LocalCommID)
	binary.BigEndian.PutUint32(h[4:8], f.RemoteCommID)
	copy(h[rtuPrivate:], f.PrivateData[:])
}

// DREQ is a view of a DREQ's attribute data, the disconnection request
// (IBA vol. 1 table 112): 0 Local Communication ID, 4 Remote
// Communication ID, 8 Remote QPN/EECN (24) | reserved (8), 12 Private
// Data (220).
type DREQ []byte

// DREQFields holds the fields of a DREQ.
type DREQFields struct {
	LocalCommID  uint32
	RemoteCommID uint32
	// RemoteQPN is the receiver's QPN (or EECN, on RD), 24 bits: the
	// receiver checks it against the connection's.
	RemoteQPN   uint32
	PrivateData [DREQPrivateDataLen]byte
}

// Fields returns all fields.
func (h DREQ) Fields() DREQFields {
	f := DREQFields{
		LocalCommID:  binary.BigEndian.Uint32(h[0:4]),
		RemoteCommID: binary.BigEndian.Uint32(h[4:8]),
		RemoteQPN:    get24(h[8:]),
	}
	copy(f.PrivateData[:], h[dreqPrivate:])
	return f
}

// Encode writes all fields of f, and 0 to the reserved bits.
func (h DREQ) Encode(f *DREQFields) {
	clear(h[:DataLen])
	binary.BigEndian.PutUint32(h[0:4], f.LocalCommID)
	binary.BigEndian.PutUint32(h[4:8], f.RemoteCommID)
	put24(h[8:], f.RemoteQPN)
	copy(h[dreqPrivate:], f.PrivateData[:])
}

// DREP is a view of a DREP's attribute data, the disconnection reply
// (IBA vol. 1 table 113): 0 Local Communication ID, 4 Remote
// Communication ID, 8 Private Data (224).
type DREP []byte

// DREPFields holds the fields of a DREP.
type DREPFields struct {
	LocalCommID  uint32
	RemoteCommID uint32
	PrivateData  [DREPPrivateDataLen]byte
}

// Fields returns all fields.
func (h DREP) Fields() DREPFields {
	f := DREPFields{LocalCommID: binary.BigEndian.Uint32(h[0:4]), RemoteCommID: binary.BigEndian.Uint32(h[4:8])}
	copy(f.PrivateData[:], h[drepPrivate:])
	return f
}

// Encode writes all fields of f.
func (h DREP) Encode(f *DREPFields) {
	clear(h[:DataLen])
	binary.BigEndian.PutUint32(h[0:4], f.LocalCommID)
	binary.BigEndian.PutUint32(h[4:8], f.RemoteCommID)
	copy(h[drepPrivate:], f.PrivateData[:])
}

// SIDRReq is a view of a SIDR_REQ's attribute data, the service ID
// resolution request that UD users (the RDMA CM's UDP port space) send to
// learn a service's QPN and Q_Key (IBA vol. 1 table 119).
//
//	0 Request ID     4 P_Key (16) | reserved (16)
//	8 Service ID (64)
//	16 Private Data (216)
type SIDRReq []byte

// SIDRReqFields holds the fields of a SIDR_REQ.
type SIDRReqFields struct {
	RequestID   uint32
	PKey        uint16
	ServiceID   ServiceID
	PrivateData [SIDRReqPrivateDataLen]byte
}

// Fields returns all fields.
func (h SIDRReq) Fields() SIDRReqFields {
	f := SIDRReqFields{
		RequestID: binary.BigEndian.Uint32(h[0:4]),
		PKey:      binary.BigEndian.Uint16(h[4:6]),
		ServiceID: ServiceID(binary.BigEndian.Uint64(h[8:16])),
	}
	copy(f.PrivateData[:], h[sidrReqPrivate:])
	return f
}

// Encode writes all fields of f, and 0 to the reserved bits.
func (h SIDRReq) Encode(f *SIDRReqFields) {
	clear(h[:DataLen])
	binary.BigEndian.PutUint32(h[0:4], f.RequestID)
	binary.BigEndian.PutUint16(h[4:6], f.PKey)
	binary.BigEndian.PutUint64(h[8:16], uint64(f.ServiceID))
	copy(h[sidrReqPrivate:], f.PrivateData[:])
}

// SIDRRep is a view of a SIDR_REP's attribute data (IBA vol. 1
// table 120).
//
//	 0 Request ID
//	 4 Status (8) | Additional Information Length (8) | reserved (16)
//	 8 QPN (24) | reserved (8)
//	12 Service ID (64)
//	20 Q_Key
//	24 Additional Information (72): a ClassPortInfo when Status is SIDRRedirect
//	96 Private Data (136)
type SIDRRep []byte

// SIDRRepFields holds the fields of a SIDR_REP.
type SIDRRepFields struct {
	RequestID            uint32
	Status               SIDRStatus
	AdditionalInfoLength uint8
	QPN                  uint32 // 24 bits
	ServiceID            ServiceID
	QKey                 uint32
	AdditionalInfo       [SIDRInfoLen]byte
	PrivateData          [SIDRRepPrivateDataLen]byte
}

// Fields returns all fields.
func (h SIDRRep) Fields() SIDRRepFields {
	f := SIDRRepFields{
		RequestID:            binary.BigEndian.Uint32(h[0:4]),
		Status:               SIDRStatus(h[4]),
		AdditionalInfoLength: h[5],
		QPN:                  get24(h[8:]),
		ServiceID:            ServiceID(binary.BigEndian.Uint64(h[12:20])),
		QKey:                 binary.BigEndian.Uint32(h[20:24]),
	}
	copy(f.AdditionalInfo[:], h[sidrRepInfo:sidrRepPrivate])
	copy(f.PrivateData[:], h[sidrRepPrivate:])
	return f
}

// Encode writes all fields of f, and 0 to the reserved bits.
func (h SIDRRep) Encode(f *SIDRRepFields) {
	clear(h[:DataLen])
	binary.BigEndian.PutUint32(h[0:4], f.RequestID)
	h[4], h[5] = uint8(f.Status), f.AdditionalInfoLength
	put24(h[8:], f.QPN)
	binary.BigEndian.PutUint64(h[12:20], uint64(f.ServiceID))
	binary.BigEndian.PutUint32(h[20:24], f.QKey)
	copy(h[sidrRepInfo:sidrRepPrivate], f.AdditionalInfo[:])
	copy(h[sidrRepPrivate:], f.PrivateData[:])
}

// SIDRStatus is a SIDR_REP's status (Linux enum ib_cm_sidr_status).
type SIDRStatus uint8

// SIDR_REP statuses.
const (
	SIDRSuccess            SIDRStatus = 0 // QPN and Q_Key valid
	SIDRUnsupported        SIDRStatus = 1 // service ID not supported (no listener)
	SIDRReject             SIDRStatus = 2 // rejected by the service provider
	SIDRNoQP               SIDRStatus = 3 // no QP available
	SIDRRedirect           SIDRStatus = 4 // additional information is a ClassPortInfo
	SIDRUnsupportedVersion SIDRStatus = 5 // the CM class version is not supported
)

// String names the status ("SUCCESS", "UNSUPPORTED", …) or gives its number.
func (s SIDRStatus) String() string {
	names := [...]string{"SUCCESS", "UNSUPPORTED", "REJECT", "NO_QP", "REDIRECT", "UNSUPPORTED_VERSION"}
	if int(s) < len(names) {
		return names[s]
	}
	return "STATUS_" + strconv.Itoa(int(s))
}

// ClassPortInfo is a view of the ClassPortInfo attribute (IBA 13.4.8.1),
// 72 bytes at the start of the attribute data: what a class agent tells
// of itself, and where to redirect to.
//
//	 0 BaseVersion | ClassVersion | CapabilityMask (16)
//	 4 CapabilityMask2 (27) | RespTimeValue (5)
//	 8 RedirectGID (128)
//	24 RedirectTC (8) | RedirectSL (4) | RedirectFL (20)
//	28 RedirectLID (16) | RedirectP_Key (16)
//	32 reserved (8) | RedirectQP (24)
//	36 RedirectQ_Key
//	40 TrapGID (128)
//	56 TrapTC (8) | TrapSL (4) | TrapFL (20)
//	60 TrapLID (16) | TrapP_Key (16)
//	64 TrapHL (8) | TrapQP (24)
//	68 TrapQ_Key
type ClassPortInfo []byte

// ClassPortInfoFields holds the fields of a ClassPortInfo.
type ClassPortInfoFields struct {
	BaseVersion     uint8
	ClassVersion    uint8
	CapabilityMask  uint16
	CapabilityMask2 uint32 // 27 bits
	RespTimeValue   uint8  // 5 bits
	RedirectGID     roce.GID
	RedirectTC      uint8
	RedirectSL      uint8  // 4 bits
	RedirectFL      uint32 // 20 bits
	RedirectLID     uint16
	RedirectPKey    uint16
	RedirectQP      uint32 // 24 bits
	RedirectQKey    uint32
	TrapGID         roce.GID
	TrapTC          uint8
	TrapSL          uint8  // 4 bits
	TrapFL          uint32 // 20 bits
	TrapLID         uint16
	TrapPKey        uint16
	TrapHL          uint8
	TrapQP          uint32 // 24 bits
	TrapQKey        uint32
}

// Fields returns all fields.
func (h ClassPortInfo) Fields() ClassPortInfoFields {
	u32 := func(o int) uint32 { return binary.BigEndian.Uint32(h[o : o+4]) }
	u16 := func(o int) uint16 { return binary.BigEndian.Uint16(h[o : o+2]) }
	return ClassPortInfoFields{
		BaseVersion:     h[0],
		ClassVersion:    h[1],
		CapabilityMask:  u16(2),
		CapabilityMask2: u32(4) >> 5,
		RespTimeValue:   h[7] & 0x1F,
		RedirectGID:     roce.GID(h[8:24]),
		RedirectTC:      h[24],
		RedirectSL:      h[25] >> 4,
		RedirectFL:      u32(24) & 0xFFFFF,
		RedirectLID:     u16(28),
		RedirectPKey:    u16(30),
		RedirectQP:      get24(h[33:]),
		RedirectQKey:    u32(36),
		TrapGID:         roce.GID(h[40:56]),
		TrapTC:          h[56],
		TrapSL:          h[57] >> 4,
		TrapFL:          u32(56) & 0xFFFFF,
		TrapLID:         u16(60),
		TrapPKey:        u16(62),
		TrapHL:          h[64],
		TrapQP:          get24(h[65:]),
		TrapQKey:        u32(68),
	}
}

// Encode writes all fields of f into the first ClassPortInfoLen bytes and
// clears the rest of the attribute data.
func (h ClassPortInfo) Encode(f *ClassPortInfoFields) {
	clear(h[:DataLen])
	h[0], h[1] = f.BaseVersion, f.ClassVersion
	binary.BigEndian.PutUint16(h[2:4], f.CapabilityMask)
	binary.BigEndian.PutUint32(h[4:8], f.CapabilityMask2<<5|uint32(f.RespTimeValue&0x1F))
	copy(h[8:24], f.RedirectGID[:])
	binary.BigEndian.PutUint32(h[24:28], uint32(f.RedirectTC)<<24|uint32(f.RedirectSL&0xF)<<20|f.RedirectFL&0xFFFFF)
	binary.BigEndian.PutUint16(h[28:30], f.RedirectLID)
	binary.BigEndian.PutUint16(h[30:32], f.RedirectPKey)
	put24(h[33:], f.RedirectQP)
	binary.BigEndian.PutUint32(h[36:40], f.RedirectQKey)
	copy(h[40:56], f.TrapGID[:])
	binary.BigEndian.PutUint32(h[56:60], uint32(f.TrapTC)<<24|uint32(f.TrapSL&0xF)<<20|f.TrapFL&0xFFFFF)
	binary.BigEndian.PutUint16(h[60:62], f.TrapLID)
	binary.BigEndian.PutUint16(h[62:64], f.TrapPKey)
	h[64] = f.TrapHL
	put24(h[65:], f.TrapQP)
	binary.BigEndian.PutUint32(h[68:72], f.TrapQKey)
}
