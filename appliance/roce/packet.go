package roce

import (
	"encoding/binary"
	"hash/crc32"
	"net/netip"
)

// Packet is the parsed form of one RoCEv2 frame: every header field the
// transport and the tools need, plus where the payload lies in the frame.
// It is a plain value (no pointers into the frame), filled by Parse and
// written out by Encode and Build. Fields of extension headers the opcode
// does not carry are zero.
type Packet struct {
	// Ethernet.
	DstMAC, SrcMAC MAC

	// IP. IPv6 selects the IP version; Src and Dst are IPv4 addresses
	// for IPv4 packets. TOS is the IPv4 type of service or the IPv6
	// traffic class, TTL the TTL or hop limit; ID and DontFragment are
	// IPv4 only, FlowLabel IPv6 only.
	IPv6         bool
	Src, Dst     netip.Addr
	TOS          uint8
	TTL          uint8
	ID           uint16
	DontFragment bool
	FlowLabel    uint32

	// UDP. DstPort is UDPPort on every packet Parse accepts.
	SrcPort, DstPort uint16
	UDPChecksum      uint16

	// InfiniBand transport headers.
	BTH       BTHFields
	DETH      DETHFields
	FETH      FETHFields
	RETH      RETHFields
	AtomicETH AtomicETHFields
	Imm       uint32 // ImmDt
	IETH      uint32 // R_Key to invalidate
	AETH      AETHFields
	AtomicAck uint64 // AtomicAckETH original remote data

	// PayloadLen is the number of payload bytes (pad excluded).
	PayloadLen int
	// ICRC is the invariant CRC stored in the frame (set by Parse).
	ICRC uint32
}

// Info returns the opcode table entry of the packet.
func (p *Packet) Info() *OpInfo { return &opTable[p.BTH.Opcode] }

func (p *Packet) l4Offset() int {
	if p.IPv6 {
		return EthernetLen + IPv6Len
	}
	return EthernetLen + IPv4Len
}

func (p *Packet) bthOffset() int { return p.l4Offset() + UDPLen }

// HeaderLen returns the length of all headers from Ethernet through the
// last extension header: the offset of the payload in the frame.
func (p *Packet) HeaderLen() int { return p.bthOffset() + BTHLen + opTable[p.BTH.Opcode].ExtLen }

func (p *Packet) icrcOffset() int { return p.HeaderLen() + p.PayloadLen + int(p.BTH.PadCount) }

// FrameLen returns the length of the whole frame: headers, payload, pad
// and ICRC.
func (p *Packet) FrameLen() int { return p.icrcOffset() + ICRCLen }

// Payload returns the payload bytes of frame, which p describes.
func (p *Packet) Payload(frame []byte) []byte {
	off := p.HeaderLen()
	return frame[off : off+p.PayloadLen]
}

// PadCount returns the number of pad bytes that bring a payload of n bytes
// to a multiple of 4 (IBA 9.2.3).
func PadCount(n int) uint8 { return uint8(-n & 3) }

// SetPayloadLen sets PayloadLen and the BTH pad count for n payload bytes.
func (p *Packet) SetPayloadLen(n int) {
	p.PayloadLen = n
	p.BTH.PadCount = PadCount(n)
}

// IsRoCE reports whether frame is a UDP datagram to RoCEv2's port 4791,
// over IPv4 or IPv6: what a port hands to the RoCE receive path (Parse,
// the ICRC, the transport), as the kernel's UDP tunnel socket hands it to
// rxe (rxe_udp_encap_recv), where everything else goes to the station. It
// only looks at the port; Parse validates the rest.
func IsRoCE(frame []byte) bool {
	if len(frame) < EthernetLen {
		return false
	}
	var l4 int
	switch Ethernet(frame).EtherType() {
	case EtherTypeIPv4:
		if len(frame) < EthernetLen+IPv4Len {
			return false
		}
		ip := IPv4(frame[EthernetLen:])
		if ip.Protocol() != IPProtoUDP {
			return false
		}
		l4 = EthernetLen + ip.IHL()
	case EtherTypeIPv6:
		if len(frame) < EthernetLen+IPv6Len || IPv6(frame[EthernetLen:]).NextHeader() != IPProtoUDP {
			return false
		}
		l4 = EthernetLen + IPv6Len
	default:
		return false
	}
	return len(frame) >= l4+UDPLen && UDP(frame[l4:]).DstPort() == UDPPort
}

// Parse validates frame as a RoCEv2 packet and fills p. It checks, in
// order: EtherType, IP version, protocol UDP, IPv4 fragment and options,
// destination port 4791, IP and UDP lengths against each other and the
// frame, the IPv4 header checksum, the BTH transport version, the opcode,
// the room for the opcode's headers, and the pad count. It returns
// ErrNotRoCE for frames that are not RoCEv2 and another sentinel error
// for malformed ones. Bytes after the IP datagram (Ethernet padding of
// short frames) are ignored. Parse does not verify the ICRC (VerifyICRC
// does), nor the UDP checksum, which the ICRC's coverage makes redundant.
//
// On success every slice view of frame up to p.FrameLen() is in bounds.
func Parse(frame []byte, p *Packet) error {
	*p = Packet{}
	if len(frame) < EthernetLen {
		return ErrTruncated
	}
	eth := Ethernet(frame)
	var l4, ipEnd int
	switch eth.EtherType() {
	case EtherTypeIPv4:
		if len(frame) < EthernetLen+IPv4Len {
			return ErrTruncated
		}
		ip := IPv4(frame[EthernetLen:])
		if ip.Version() != 4 {
			return ErrIPVersion
		}
		if ip.Protocol() != IPProtoUDP {
			return ErrNotRoCE
		}
		if ip.IsFragment() {
			return ErrFragment
		}
		ihl := ip.IHL()
		if ihl < IPv4Len {
			return ErrLength
		}
		if len(frame) < EthernetLen+ihl+UDPLen {
			return ErrTruncated
		}
		if UDP(frame[EthernetLen+ihl:]).DstPort() != UDPPort {
			return ErrNotRoCE
		}
		if ihl != IPv4Len {
			return ErrIPv4Options
		}
		tl := int(ip.TotalLength())
		if tl < IPv4Len+UDPLen {
			return ErrLength
		}
		if EthernetLen+tl > len(frame) {
			return ErrTruncated
		}
		if ip.ComputeChecksum() != ip.Checksum() {
			return ErrIPChecksum
		}
		l4, ipEnd = EthernetLen+IPv4Len, EthernetLen+tl
		p.Src, p.Dst = ip.Src(), ip.Dst()
		p.TOS, p.TTL, p.ID, p.DontFragment = ip.TOS(), ip.TTL(), ip.ID(), ip.DontFragment()
	case EtherTypeIPv6:
		if len(frame) < EthernetLen+IPv6Len {
			return ErrTruncated
		}
		ip := IPv6(frame[EthernetLen:])
		if ip.Version() != 6 {
			return ErrIPVersion
		}
		if ip.NextHeader() != IPProtoUDP {
			return ErrNotRoCE
		}
		if len(frame) < EthernetLen+IPv6Len+UDPLen {
			return ErrTruncated
		}
		if UDP(frame[EthernetLen+IPv6Len:]).DstPort() != UDPPort {
			return ErrNotRoCE
		}
		pl := int(ip.PayloadLength())
		if pl < UDPLen {
			return ErrLength
		}
		if EthernetLen+IPv6Len+pl > len(frame) {
			return ErrTruncated
		}
		l4, ipEnd = EthernetLen+IPv6Len, EthernetLen+IPv6Len+pl
		p.IPv6 = true
		p.Src, p.Dst = ip.Src(), ip.Dst()
		p.TOS, p.TTL, p.FlowLabel = ip.TrafficClass(), ip.HopLimit(), ip.FlowLabel()
	default:
		return ErrNotRoCE
	}
	p.DstMAC, p.SrcMAC = eth.Dst(), eth.Src()

	udp := UDP(frame[l4:])
	if l4+int(udp.Length()) != ipEnd {
		return ErrLength
	}
	p.SrcPort, p.DstPort, p.UDPChecksum = udp.SrcPort(), udp.DstPort(), udp.Checksum()

	bthOff := l4 + UDPLen
	icrcOff := ipEnd - ICRCLen
	if icrcOff < bthOff+BTHLen {
		return ErrTruncated
	}
	bth := BTH(frame[bthOff:])
	if bth.TVer() != 0 {
		return ErrTVer
	}
	info := &opTable[bth.Opcode()]
	if !info.Valid() {
		return ErrOpcode
	}
	extOff := bthOff + BTHLen
	payOff := extOff + info.ExtLen
	if payOff > icrcOff {
		return ErrHeaderLength
	}
	avail := icrcOff - payOff
	pad := int(bth.PadCount())
	if pad > avail {
		return ErrPadCount
	}
	if info.Flags&HasPayload == 0 && avail != 0 {
		return ErrUnexpectedPayload
	}
	p.BTH = bth.Fields()
	p.PayloadLen = avail - pad
	p.ICRC = binary.LittleEndian.Uint32(frame[icrcOff:])

	f := info.Flags
	ext := frame[extOff:payOff]
	if f&HasDETH != 0 {
		p.DETH = DETH(ext[info.off[0]:]).Fields()
	}
	if f&HasFETH != 0 {
		p.FETH = FETH(ext[info.off[1]:]).Fields()
	}
	if f&HasRETH != 0 {
		p.RETH = RETH(ext[info.off[2]:]).Fields()
	}
	if f&HasAtomicETH != 0 {
		p.AtomicETH = AtomicETH(ext[info.off[3]:]).Fields()
	}
	if f&HasImmDt != 0 {
		p.Imm = ImmDt(ext[info.off[4]:]).Imm()
	}
	if f&HasIETH != 0 {
		p.IETH = IETH(ext[info.off[5]:]).RKey()
	}
	if f&HasAETH != 0 {
		p.AETH = AETH(ext[info.off[6]:]).Fields()
	}
	if f&HasAtomicAckETH != 0 {
		p.AtomicAck = AtomicAckETH(ext[info.off[7]:]).Orig()
	}
	return nil
}

// Encode writes the frame p describes into b[:p.FrameLen()] and returns
// its length. The payload must already be in place at
// b[p.HeaderLen():][:p.PayloadLen] — the transport copies it there
// straight from registered memory — and the pad count in p.BTH is used as
// given (SetPayloadLen sets both). Encode writes every header, zero pad
// bytes, the IP and UDP lengths, the IPv4 header checksum and the ICRC.
// The UDP checksum is written as p.UDPChecksum (0: none, as rxe sends).
func (p *Packet) Encode(b []byte) (int, error) {
	info := &opTable[p.BTH.Opcode]
	if !info.Valid() {
		return 0, ErrOpcode
	}
	if p.PayloadLen < 0 || p.PayloadLen > 0 && info.Flags&HasPayload == 0 {
		return 0, ErrUnexpectedPayload
	}
	if p.BTH.PadCount > 3 {
		return 0, ErrPadCount
	}
	if p.IPv6 && !(p.Src.Is6() && p.Dst.Is6()) ||
		!p.IPv6 && !((p.Src.Is4() || p.Src.Is4In6()) && (p.Dst.Is4() || p.Dst.Is4In6())) {
		return 0, ErrAddress
	}
	n := p.FrameLen()
	if n > len(b) {
		return 0, ErrBufferTooSmall
	}
	l4 := p.l4Offset()
	udpLen := n - l4
	if p.IPv6 && udpLen > 0xFFFF || !p.IPv6 && IPv4Len+udpLen > 0xFFFF {
		return 0, ErrLength
	}
	b = b[:n]
	bthOff := l4 + UDPLen
	icrcOff := n - ICRCLen

	// IP, UDP and BTH go first and with the ICRC's masked fields set to
	// 1s, so that the CRC can run over the frame as it stands; the real
	// values follow once it has.
	var src4, dst4 [4]byte
	var flags uint32
	if p.IPv6 {
		h := b[EthernetLen:l4]
		src, dst := p.Src.As16(), p.Dst.As16()
		binary.BigEndian.PutUint32(h[0:4], 0x6FFFFFFF)
		binary.BigEndian.PutUint32(h[4:8], uint32(udpLen)<<16|IPProtoUDP<<8|0xFF)
		*(*[16]byte)(h[8:24]) = src
		*(*[16]byte)(h[24:40]) = dst
	} else {
		h := b[EthernetLen:l4]
		src4, dst4 = p.Src.As4(), p.Dst.As4()
		binary.BigEndian.PutUint32(h[0:4], 0x45FF<<16|uint32(IPv4Len+udpLen))
		if p.DontFragment {
			flags = ipv4FlagDF
		}
		binary.BigEndian.PutUint32(h[4:8], uint32(p.ID)<<16|flags)
		binary.BigEndian.PutUint32(h[8:12], 0xFF<<24|IPProtoUDP<<16|0xFFFF)
		*(*[4]byte)(h[12:16]) = src4
		*(*[4]byte)(h[16:20]) = dst4
	}
	binary.BigEndian.PutUint32(b[l4:], uint32(p.SrcPort)<<16|uint32(p.DstPort))
	binary.BigEndian.PutUint32(b[l4+4:], uint32(udpLen)<<16|0xFFFF)
	bth := BTH(b[bthOff : bthOff+BTHLen])
	bth.Encode(&p.BTH)
	resv8a := bth[4]
	bth[4] = 0xFF

	ext := b[bthOff+BTHLen : bthOff+BTHLen+info.ExtLen]
	f := info.Flags
	if f&HasDETH != 0 {
		DETH(ext[info.off[0]:]).Encode(&p.DETH)
	}
	if f&HasFETH != 0 {
		FETH(ext[info.off[1]:]).Encode(&p.FETH)
	}
	if f&HasRETH != 0 {
		RETH(ext[info.off[2]:]).Encode(&p.RETH)
	}
	if f&HasAtomicETH != 0 {
		AtomicETH(ext[info.off[3]:]).Encode(&p.AtomicETH)
	}
	if f&HasImmDt != 0 {
		ImmDt(ext[info.off[4]:]).Encode(p.Imm)
	}
	if f&HasIETH != 0 {
		IETH(ext[info.off[5]:]).Encode(p.IETH)
	}
	if f&HasAETH != 0 {
		AETH(ext[info.off[6]:]).Encode(&p.AETH)
	}
	if f&HasAtomicAckETH != 0 {
		AtomicAckETH(ext[info.off[7]:]).Encode(p.AtomicAck)
	}
	if f&HasCNPReserved != 0 {
		clear(ext[info.off[8] : info.off[8]+CNPLen])
	}
	for i := icrcOff - int(p.BTH.PadCount); i < icrcOff; i++ {
		b[i] = 0
	}
	eth := Ethernet(b)
	*(*[6]byte)(b[0:6]) = p.DstMAC
	*(*[6]byte)(b[6:12]) = p.SrcMAC

	// The headers just written go through the table CRC, which loads them
	// in pieces the processor can forward from its stores; the payload,
	// in memory for a while, through the carry-less-multiply CRC.
	hdrEnd := bthOff + BTHLen + info.ExtLen
	crc := crcHeaders(crcMaskedLRH, b[EthernetLen:hdrEnd])
	p.ICRC = crc32.Update(crc, crc32.IEEETable, b[hdrEnd:icrcOff])
	putICRC(b[icrcOff:], p.ICRC)

	// The real values of the masked fields.
	bth[4] = resv8a
	binary.BigEndian.PutUint16(b[l4+6:], p.UDPChecksum)
	if p.IPv6 {
		eth.SetEtherType(EtherTypeIPv6)
		binary.BigEndian.PutUint32(b[EthernetLen:], 6<<28|uint32(p.TOS)<<20|p.FlowLabel&0xFFFFF)
		b[EthernetLen+7] = p.TTL
	} else {
		eth.SetEtherType(EtherTypeIPv4)
		h := IPv4(b[EthernetLen:l4])
		h[1], h[8] = p.TOS, p.TTL
		// From the field values, not by reading back the header just
		// written: such loads would wait for the stores to drain.
		sum := (0x45<<8 | uint32(p.TOS)) + uint32(IPv4Len+udpLen) + uint32(p.ID) + flags +
			(uint32(p.TTL)<<8 | IPProtoUDP) +
			(uint32(src4[0])<<8 | uint32(src4[1])) + (uint32(src4[2])<<8 | uint32(src4[3])) +
			(uint32(dst4[0])<<8 | uint32(dst4[1])) + (uint32(dst4[2])<<8 | uint32(dst4[3]))
		sum = sum&0xFFFF + sum>>16
		sum = sum&0xFFFF + sum>>16
		h.SetChecksum(^uint16(sum))
	}
	return n, nil
}

// Build copies payload into b after the headers, sets PayloadLen and the
// pad count from it, and encodes the frame as Encode does.
func (p *Packet) Build(b []byte, payload []byte) (int, error) {
	p.SetPayloadLen(len(payload))
	off := p.HeaderLen()
	if off+len(payload) > len(b) {
		return 0, ErrBufferTooSmall
	}
	copy(b[off:], payload)
	return p.Encode(b)
}
