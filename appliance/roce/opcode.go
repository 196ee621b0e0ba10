package roce

// Opcode is the BTH opcode (IBA vol. 1, 9.2.1, table 38). Bits 7:5 select
// the transport service, bits 4:0 the operation.
type Opcode uint8

// Transport services (opcode bits 7:5).
const (
	TransportRC  = 0x00 // reliable connection
	TransportUC  = 0x20 // unreliable connection
	TransportRD  = 0x40 // reliable datagram (not supported)
	TransportUD  = 0x60 // unreliable datagram
	TransportCNP = 0x80 // RoCEv2 congestion notification (Annex A17.9.3)
	TransportXRC = 0xA0 // extended reliable connection (not supported)
)

// RC opcodes.
const (
	RCSendFirst                  Opcode = 0x00
	RCSendMiddle                 Opcode = 0x01
	RCSendLast                   Opcode = 0x02
	RCSendLastWithImmediate      Opcode = 0x03
	RCSendOnly                   Opcode = 0x04
	RCSendOnlyWithImmediate      Opcode = 0x05
	RCRDMAWriteFirst             Opcode = 0x06
	RCRDMAWriteMiddle            Opcode = 0x07
	RCRDMAWriteLast              Opcode = 0x08
	RCRDMAWriteLastWithImmediate Opcode = 0x09
	RCRDMAWriteOnly              Opcode = 0x0A
	RCRDMAWriteOnlyWithImmediate Opcode = 0x0B
	RCRDMAReadRequest            Opcode = 0x0C
	RCRDMAReadResponseFirst      Opcode = 0x0D
	RCRDMAReadResponseMiddle     Opcode = 0x0E
	RCRDMAReadResponseLast       Opcode = 0x0F
	RCRDMAReadResponseOnly       Opcode = 0x10
	RCAcknowledge                Opcode = 0x11
	RCAtomicAcknowledge          Opcode = 0x12
	RCCompareSwap                Opcode = 0x13
	RCFetchAdd                   Opcode = 0x14
	RCSendLastWithInvalidate     Opcode = 0x16
	RCSendOnlyWithInvalidate     Opcode = 0x17
	RCFlush                      Opcode = 0x1C // IBA 1.5
	RCAtomicWrite                Opcode = 0x1D // IBA 1.5
	UCSendFirst                  Opcode = 0x20
	UCSendMiddle                 Opcode = 0x21
	UCSendLast                   Opcode = 0x22
	UCSendLastWithImmediate      Opcode = 0x23
	UCSendOnly                   Opcode = 0x24
	UCSendOnlyWithImmediate      Opcode = 0x25
	UCRDMAWriteFirst             Opcode = 0x26
	UCRDMAWriteMiddle            Opcode = 0x27
	UCRDMAWriteLast              Opcode = 0x28
	UCRDMAWriteLastWithImmediate Opcode = 0x29
	UCRDMAWriteOnly              Opcode = 0x2A
	UCRDMAWriteOnlyWithImmediate Opcode = 0x2B
	UDSendOnly                   Opcode = 0x64
	UDSendOnlyWithImmediate      Opcode = 0x65
	CNP                          Opcode = 0x81
)

// OpFlags describe an opcode: which headers follow the BTH, what kind of
// packet it is and where it sits in a message.
type OpFlags uint32

// Headers that follow the BTH, in the order they appear on the wire.
const (
	HasDETH OpFlags = 1 << iota
	HasFETH
	HasRETH
	HasAtomicETH
	HasImmDt
	HasIETH
	HasAETH
	HasAtomicAckETH
	HasCNPReserved // the 16 reserved bytes of a CNP
	HasPayload

	// Kind of packet.
	Request  // carries a request: SEND, WRITE, READ request, atomic, FLUSH
	Response // READ response or ATOMIC ACKNOWLEDGE
	Ack      // ACKNOWLEDGE (ACK, NAK, RNR NAK)

	// Position in a message.
	First
	Middle
	Last
	Only

	// Operation.
	OpSend
	OpWrite
	OpRead
	OpAtomic
	OpFlush
	OpAtomicWrite
	OpCNP
)

// numHeaders is the number of extension header kinds (HasDETH…HasCNPReserved).
const numHeaders = 9

var headerLens = [numHeaders]uint8{DETHLen, FETHLen, RETHLen, AtomicETHLen, ImmDtLen, IETHLen, AETHLen, AtomicAckETHLen, CNPLen}

// OpInfo describes one opcode. Offsets count from the end of the BTH.
type OpInfo struct {
	Name   string
	Flags  OpFlags
	ExtLen int // bytes of extension headers between the BTH and the payload

	off [numHeaders]uint8
}

// Valid reports whether the opcode is one taproce implements.
func (i *OpInfo) Valid() bool { return i.Name != "" }

// Has reports whether all of f are set.
func (i *OpInfo) Has(f OpFlags) bool { return i.Flags&f == f }

// Offset returns the offset after the BTH of the extension header h (one
// of HasDETH…HasCNPReserved) and whether the opcode carries it.
func (i *OpInfo) Offset(h OpFlags) (int, bool) {
	for k := 0; k < numHeaders; k++ {
		if h == 1<<k {
			return int(i.off[k]), i.Flags&h != 0
		}
	}
	return 0, false
}

func op(name string, f OpFlags) OpInfo {
	info := OpInfo{Name: name, Flags: f}
	n := 0
	for k := 0; k < numHeaders; k++ {
		if f&(1<<k) != 0 {
			info.off[k] = uint8(n)
			n += int(headerLens[k])
		}
	}
	info.ExtLen = n
	return info
}

// opTable is the [256] opcode table, indexed by opcode; entries with an
// empty Name are opcodes taproce rejects (RD, XRC, reserved).
var opTable = [256]OpInfo{
	RCSendFirst:                  op("RC_SEND_FIRST", OpSend|Request|First|HasPayload),
	RCSendMiddle:                 op("RC_SEND_MIDDLE", OpSend|Request|Middle|HasPayload),
	RCSendLast:                   op("RC_SEND_LAST", OpSend|Request|Last|HasPayload),
	RCSendLastWithImmediate:      op("RC_SEND_LAST_WITH_IMMEDIATE", OpSend|Request|Last|HasImmDt|HasPayload),
	RCSendOnly:                   op("RC_SEND_ONLY", OpSend|Request|Only|HasPayload),
	RCSendOnlyWithImmediate:      op("RC_SEND_ONLY_WITH_IMMEDIATE", OpSend|Request|Only|HasImmDt|HasPayload),
	RCRDMAWriteFirst:             op("RC_RDMA_WRITE_FIRST", OpWrite|Request|First|HasRETH|HasPayload),
	RCRDMAWriteMiddle:            op("RC_RDMA_WRITE_MIDDLE", OpWrite|Request|Middle|HasPayload),
	RCRDMAWriteLast:              op("RC_RDMA_WRITE_LAST", OpWrite|Request|Last|HasPayload),
	RCRDMAWriteLastWithImmediate: op("RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", OpWrite|Request|Last|HasImmDt|HasPayload),
	RCRDMAWriteOnly:              op("RC_RDMA_WRITE_ONLY", OpWrite|Request|Only|HasRETH|HasPayload),
	RCRDMAWriteOnlyWithImmediate: op("RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", OpWrite|Request|Only|HasRETH|HasImmDt|HasPayload),
	RCRDMAReadRequest:            op("RC_RDMA_READ_REQUEST", OpRead|Request|Only|HasRETH),
	RCRDMAReadResponseFirst:      op("RC_RDMA_READ_RESPONSE_FIRST", OpRead|Response|First|HasAETH|HasPayload),
	RCRDMAReadResponseMiddle:     op("RC_RDMA_READ_RESPONSE_MIDDLE", OpRead|Response|Middle|HasPayload),
	RCRDMAReadResponseLast:       op("RC_RDMA_READ_RESPONSE_LAST", OpRead|Response|Last|HasAETH|HasPayload),
	RCRDMAReadResponseOnly:       op("RC_RDMA_READ_RESPONSE_ONLY", OpRead|Response|Only|HasAETH|HasPayload),
	RCAcknowledge:                op("RC_ACKNOWLEDGE", Ack|Only|HasAETH),
	RCAtomicAcknowledge:          op("RC_ATOMIC_ACKNOWLEDGE", OpAtomic|Response|Only|HasAETH|HasAtomicAckETH),
	RCCompareSwap:                op("RC_COMPARE_SWAP", OpAtomic|Request|Only|HasAtomicETH),
	RCFetchAdd:                   op("RC_FETCH_ADD", OpAtomic|Request|Only|HasAtomicETH),
	RCSendLastWithInvalidate:     op("RC_SEND_LAST_WITH_INVALIDATE", OpSend|Request|Last|HasIETH|HasPayload),
	RCSendOnlyWithInvalidate:     op("RC_SEND_ONLY_WITH_INVALIDATE", OpSend|Request|Only|HasIETH|HasPayload),
	RCFlush:                      op("RC_FLUSH", OpFlush|Request|Only|HasFETH|HasRETH),
	RCAtomicWrite:                op("RC_ATOMIC_WRITE", OpAtomicWrite|Request|Only|HasRETH|HasPayload),

	UCSendFirst:                  op("UC_SEND_FIRST", OpSend|Request|First|HasPayload),
	UCSendMiddle:                 op("UC_SEND_MIDDLE", OpSend|Request|Middle|HasPayload),
	UCSendLast:                   op("UC_SEND_LAST", OpSend|Request|Last|HasPayload),
	UCSendLastWithImmediate:      op("UC_SEND_LAST_WITH_IMMEDIATE", OpSend|Request|Last|HasImmDt|HasPayload),
	UCSendOnly:                   op("UC_SEND_ONLY", OpSend|Request|Only|HasPayload),
	UCSendOnlyWithImmediate:      op("UC_SEND_ONLY_WITH_IMMEDIATE", OpSend|Request|Only|HasImmDt|HasPayload),
	UCRDMAWriteFirst:             op("UC_RDMA_WRITE_FIRST", OpWrite|Request|First|HasRETH|HasPayload),
	UCRDMAWriteMiddle:            op("UC_RDMA_WRITE_MIDDLE", OpWrite|Request|Middle|HasPayload),
	UCRDMAWriteLast:              op("UC_RDMA_WRITE_LAST", OpWrite|Request|Last|HasPayload),
	UCRDMAWriteLastWithImmediate: op("UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", OpWrite|Request|Last|HasImmDt|HasPayload),
	UCRDMAWriteOnly:              op("UC_RDMA_WRITE_ONLY", OpWrite|Request|Only|HasRETH|HasPayload),
	UCRDMAWriteOnlyWithImmediate: op("UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", OpWrite|Request|Only|HasRETH|HasImmDt|HasPayload),

	UDSendOnly:              op("UD_SEND_ONLY", OpSend|Request|Only|HasDETH|HasPayload),
	UDSendOnlyWithImmediate: op("UD_SEND_ONLY_WITH_IMMEDIATE", OpSend|Request|Only|HasDETH|HasImmDt|HasPayload),

	CNP: op("CNP", OpCNP|HasCNPReserved),
}

// Info returns the table entry of o. It never returns nil; check Valid.
func (o Opcode) Info() *OpInfo { return &opTable[o] }

// Valid reports whether o is an opcode taproce implements.
func (o Opcode) Valid() bool { return opTable[o].Name != "" }

// Transport returns the transport service bits (TransportRC, …).
func (o Opcode) Transport() uint8 { return uint8(o) & 0xE0 }

// String returns the opcode's name, or "OPCODE_0xNN" for unknown ones.
func (o Opcode) String() string {
	if n := opTable[o].Name; n != "" {
		return n
	}
	const digits = "0123456789abcdef"
	return "OPCODE_0x" + string([]byte{digits[o>>4], digits[o&0xF]})
}

// CheckPayloadLen applies the IBA packet length rules for an opcode's
// position in its message (IBA 9.7.7; rxe's check_length): FIRST and
// MIDDLE packets carry exactly pmtu bytes, LAST packets 1…pmtu, ONLY
// packets 0…pmtu, and RDMA ATOMIC WRITE exactly 8. Opcodes without
// payload must have none.
func CheckPayloadLen(o Opcode, n, pmtu int) error {
	info := &opTable[o]
	switch {
	case !info.Valid():
		return ErrOpcode
	case info.Flags&HasPayload == 0:
		if n != 0 {
			return ErrUnexpectedPayload
		}
	case info.Flags&OpAtomicWrite != 0:
		if n != 8 {
			return ErrPayloadLength
		}
	case info.Flags&(First|Middle) != 0:
		if n != pmtu {
			return ErrPayloadLength
		}
	case info.Flags&Last != 0:
		if n < 1 || n > pmtu {
			return ErrPayloadLength
		}
	default:
		if n > pmtu {
			return ErrPayloadLength
		}
	}
	return nil
}
