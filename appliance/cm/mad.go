package cm

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	"github.com/taproce/taproce/appliance/roce"
)

// Sizes of a MAD (IBA 13.4.2, 13.4.3).
const (
	MADLen       = 256                   // every CM MAD: the payload of its UD SEND
	MADHeaderLen = 24                    // the common MAD header
	DataLen      = MADLen - MADHeaderLen // the attribute: 232 bytes
)

// Values of the common MAD header fields for the CM class.
const (
	BaseVersion  = 1    // IBA 13.4.3: the MAD format
	MgmtClassCM  = 0x07 // communication management (IBA 13.4.4)
	ClassVersion = 2    // the CM class version (Linux's IB_CM_CLASS_VERSION)
	// GSIQPN is the queue pair of the general services interface, where
	// CM MADs are sent.
	GSIQPN = 1
	// GSIQKey is QP1's Q_Key, carried in the DETH of every CM MAD.
	GSIQKey = roce.GSIQKey
)

// Method is a MAD's method (IBA 13.4.5). Bit 7 is the response
// bit (R): GetResp is Get|MethodResponse.
type Method uint8

// MAD methods. The CM sends its connection messages with MethodSend and
// answers nothing with a response method; ClassPortInfo alone uses
// Get/Set/GetResp.
const (
	MethodGet         Method = 0x01
	MethodSet         Method = 0x02
	MethodSend        Method = 0x03
	MethodTrap        Method = 0x05
	MethodReport      Method = 0x06
	MethodTrapRepress Method = 0x07
	MethodGetResp     Method = 0x81
	MethodReportResp  Method = 0x86
	MethodResponse    Method = 0x80 // the R bit
)

// String names the method as the IBA does ("Send", "GetResp").
func (m Method) String() string {
	switch m {
	case MethodGet:
		return "Get"
	case MethodSet:
		return "Set"
	case MethodSend:
		return "Send"
	case MethodTrap:
		return "Trap"
	case MethodReport:
		return "Report"
	case MethodTrapRepress:
		return "TrapRepress"
	case MethodGetResp:
		return "GetResp"
	case MethodReportResp:
		return "ReportResp"
	}
	return "Method(0x" + strconv.FormatUint(uint64(m), 16) + ")"
}

// AttrID is a MAD attribute ID; for the CM class it names the message
// (IBA vol. 1 ch. 12; Linux include/rdma/ib_cm.h).
type AttrID uint16

// CM attribute IDs.
const (
	AttrClassPortInfo AttrID = 0x0001
	AttrREQ           AttrID = 0x0010
	AttrMRA           AttrID = 0x0011
	AttrREJ           AttrID = 0x0012
	AttrREP           AttrID = 0x0013
	AttrRTU           AttrID = 0x0014
	AttrDREQ          AttrID = 0x0015
	AttrDREP          AttrID = 0x0016
	AttrSIDRReq       AttrID = 0x0017
	AttrSIDRRep       AttrID = 0x0018
	AttrLAP           AttrID = 0x0019 // load alternate path: recognised, kept raw
	AttrAPR           AttrID = 0x001A // alternate path response: recognised, kept raw
)

var attrNames = map[AttrID]string{
	AttrClassPortInfo: "ClassPortInfo",
	AttrREQ:           "REQ",
	AttrMRA:           "MRA",
	AttrREJ:           "REJ",
	AttrREP:           "REP",
	AttrRTU:           "RTU",
	AttrDREQ:          "DREQ",
	AttrDREP:          "DREP",
	AttrSIDRReq:       "SIDR_REQ",
	AttrSIDRRep:       "SIDR_REP",
	AttrLAP:           "LAP",
	AttrAPR:           "APR",
}

// Known reports whether a is an attribute of the CM class.
func (a AttrID) Known() bool { _, ok := attrNames[a]; return ok }

// String names the attribute ("REQ", "SIDR_REP"), or "Attr(0x0042)".
func (a AttrID) String() string {
	if n, ok := attrNames[a]; ok {
		return n
	}
	return fmt.Sprintf("Attr(0x%04x)", uint16(a))
}

// validMethod reports whether attribute a is sent with method m.
func (a AttrID) validMethod(m Method) bool {
	if a == AttrClassPortInfo {
		return m == MethodGet || m == MethodSet || m == MethodGetResp
	}
	return m == MethodSend
}

// MAD is a view of a 256-byte CM MAD: the common MAD header (IBA 13.4.3,
// figure 145) and the attribute data.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|  BaseVersion  |   MgmtClass   | ClassVersion  |R|   Method    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|            Status             |         ClassSpecific         |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                   TransactionID (64 bits)                     |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|          AttributeID          |           Reserved            |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                      AttributeModifier                        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                  attribute data (232 bytes)                   |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// Like package roce's views it does no bounds checking: use it on what
// Parse accepted or on MADLen bytes.
type MAD []byte

// HeaderFields holds the common MAD header.
type HeaderFields struct {
	BaseVersion   uint8
	MgmtClass     uint8
	ClassVersion  uint8
	Method        Method
	Status        uint16 // IBA 13.4.7; 0 on every CM Send
	ClassSpecific uint16
	// TID is the transaction ID. Linux's CM makes its own as the MAD
	// agent's number in the high 32 bits and the local communication ID
	// (its bytes read little-endian) in the low ones; a REP, RTU or DREP
	// carries the TID of the message it answers.
	TID     uint64
	AttrID  AttrID
	AttrMod uint32 // 0 for every CM attribute
}

// NewHeader returns the header of a CM Send of attribute a with
// transaction ID tid.
func NewHeader(a AttrID, tid uint64) HeaderFields {
	return HeaderFields{BaseVersion: BaseVersion, MgmtClass: MgmtClassCM, ClassVersion: ClassVersion,
		Method: MethodSend, TID: tid, AttrID: a}
}

// BaseVersion returns the base version.
func (m MAD) BaseVersion() uint8 { return m[0] }

// MgmtClass returns the management class.
func (m MAD) MgmtClass() uint8 { return m[1] }

// ClassVersion returns the class version.
func (m MAD) ClassVersion() uint8 { return m[2] }

// Method returns the method, response bit included.
func (m MAD) Method() Method { return Method(m[3]) }

// TID returns the transaction ID.
func (m MAD) TID() uint64 { return binary.BigEndian.Uint64(m[8:16]) }

// AttrID returns the attribute ID.
func (m MAD) AttrID() AttrID { return AttrID(binary.BigEndian.Uint16(m[16:18])) }

// Data returns the attribute data, 232 bytes.
func (m MAD) Data() []byte { return m[MADHeaderLen:MADLen] }

// Header returns all header fields.
func (m MAD) Header() HeaderFields {
	return HeaderFields{
		BaseVersion:   m[0],
		MgmtClass:     m[1],
		ClassVersion:  m[2],
		Method:        Method(m[3]),
		Status:        binary.BigEndian.Uint16(m[4:6]),
		ClassSpecific: binary.BigEndian.Uint16(m[6:8]),
		TID:           binary.BigEndian.Uint64(m[8:16]),
		AttrID:        AttrID(binary.BigEndian.Uint16(m[16:18])),
		AttrMod:       binary.BigEndian.Uint32(m[20:24]),
	}
}

// EncodeHeader writes all header fields of f.
func (m MAD) EncodeHeader(f *HeaderFields) {
	m[0], m[1], m[2], m[3] = f.BaseVersion, f.MgmtClass, f.ClassVersion, uint8(f.Method)
	binary.BigEndian.PutUint16(m[4:6], f.Status)
	binary.BigEndian.PutUint16(m[6:8], f.ClassSpecific)
	binary.BigEndian.PutUint64(m[8:16], f.TID)
	binary.BigEndian.PutUint16(m[16:18], uint16(f.AttrID))
	binary.BigEndian.PutUint16(m[18:20], 0)
	binary.BigEndian.PutUint32(m[20:24], f.AttrMod)
}

// Message is one parsed CM MAD: its header and the fields of its
// attribute. Only the attribute Header.AttrID names is meaningful; the
// others are zero after Parse. It is a plain comparable value, filled by
// Parse and written by Encode.
type Message struct {
	Header HeaderFields

	ClassPortInfo ClassPortInfoFields
	REQ           REQFields
	MRA           MRAFields
	REJ           REJFields
	REP           REPFields
	RTU           RTUFields
	DREQ          DREQFields
	DREP          DREPFields
	SIDRReq       SIDRReqFields
	SIDRRep       SIDRRepFields
	// Raw holds the attribute data of LAP and APR, which taproce
	// recognises but does not take apart (no alternate paths on RoCE).
	Raw [DataLen]byte
}

// Parse validates b as a CM MAD and fills m. It checks, in order: the
// length (exactly MADLen: the payload of a UD SEND to QP1), the base
// version, the management class, the class version, that the attribute
// is a CM one and that it goes with the method. Errors wrap the sentinels
// of this package with the offending value. Whenever the length is right,
// m.Header is filled, even on error, so that a CM can answer (a REQ of
// another class version gets a REJ).
func Parse(b []byte, m *Message) error {
	if len(b) != MADLen {
		return fmt.Errorf("%w: %d bytes", ErrLength, len(b))
	}
	*m = Message{}
	mad := MAD(b)
	m.Header = mad.Header()
	h := &m.Header
	switch {
	case h.BaseVersion != BaseVersion:
		return fmt.Errorf("%w %d", ErrBaseVersion, h.BaseVersion)
	case h.MgmtClass != MgmtClassCM:
		return fmt.Errorf("%w: class 0x%02x", ErrClass, h.MgmtClass)
	case h.ClassVersion != ClassVersion:
		return fmt.Errorf("%w %d", ErrClassVersion, h.ClassVersion)
	case !h.AttrID.Known():
		return fmt.Errorf("%w 0x%04x", ErrAttribute, uint16(h.AttrID))
	case !h.AttrID.validMethod(h.Method):
		return fmt.Errorf("%w: %v %v", ErrMethod, h.AttrID, h.Method)
	}
	d := mad.Data()
	switch h.AttrID {
	case AttrClassPortInfo:
		m.ClassPortInfo = ClassPortInfo(d).Fields()
	case AttrREQ:
		m.REQ = REQ(d).Fields()
	case AttrMRA:
		m.MRA = MRA(d).Fields()
	case AttrREJ:
		m.REJ = REJ(d).Fields()
	case AttrREP:
		m.REP = REP(d).Fields()
	case AttrRTU:
		m.RTU = RTU(d).Fields()
	case AttrDREQ:
		m.DREQ = DREQ(d).Fields()
	case AttrDREP:
		m.DREP = DREP(d).Fields()
	case AttrSIDRReq:
		m.SIDRReq = SIDRReq(d).Fields()
	case AttrSIDRRep:
		m.SIDRRep = SIDRRep(d).Fields()
	default: // LAP, APR
		copy(m.Raw[:], d)
	}
	return nil
}

// Encode writes m as a MAD into b: the header, then the attribute that
// m.Header.AttrID names, every reserved bit 0. It returns MADLen, or
// ErrBufferTooSmall, or ErrAttribute for an attribute it does not know.
// It checks no other field: a caller may write a MAD that Parse refuses.
func (m *Message) Encode(b []byte) (int, error) {
	if len(b) < MADLen {
		return 0, ErrBufferTooSmall
	}
	if !m.Header.AttrID.Known() {
		return 0, fmt.Errorf("%w 0x%04x", ErrAttribute, uint16(m.Header.AttrID))
	}
	mad := MAD(b[:MADLen])
	mad.EncodeHeader(&m.Header)
	d := mad.Data()
	switch m.Header.AttrID {
	case AttrClassPortInfo:
		ClassPortInfo(d).Encode(&m.ClassPortInfo)
	case AttrREQ:
		REQ(d).Encode(&m.REQ)
	case AttrMRA:
		MRA(d).Encode(&m.MRA)
	case AttrREJ:
		REJ(d).Encode(&m.REJ)
	case AttrREP:
		REP(d).Encode(&m.REP)
	case AttrRTU:
		RTU(d).Encode(&m.RTU)
	case AttrDREQ:
		DREQ(d).Encode(&m.DREQ)
	case AttrDREP:
		DREP(d).Encode(&m.DREP)
	case AttrSIDRReq:
		SIDRReq(d).Encode(&m.SIDRReq)
	case AttrSIDRRep:
		SIDRRep(d).Encode(&m.SIDRRep)
	default:
		copy(d, m.Raw[:])
	}
	return MADLen, nil
}

// IsGSI reports whether p carries a MAD for the general services
// interface: a UD SEND (without immediate) to QP1 with QP1's Q_Key and a
// MADLen payload. Whether it is a CM MAD is Parse's to say.
func IsGSI(p *roce.Packet) bool {
	return p.BTH.Opcode == roce.UDSendOnly && p.BTH.DestQP == GSIQPN &&
		p.DETH.QKey == GSIQKey && p.PayloadLen == MADLen
}

// Timeout returns the time a 5-bit IBA timeout code stands for:
// 4.096 µs × 2^code, as the CM response timeouts, the local ACK timeout,
// the target ACK delay and the MRA service timeout count (IBA ch. 12).
// Codes beyond 31 are cut to 5 bits. rxe's CM asks for 20 (≈4.3 s).
func Timeout(code uint8) time.Duration {
	return 4096 * time.Nanosecond << (code & 0x1F)
}
