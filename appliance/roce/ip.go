package roce

import (
	"encoding/binary"
	"net/netip"
)

// IPv4Len is the length of an IPv4 header without options, the only kind
// RoCEv2 uses.
const IPv4Len = 20

// IPv6Len is the length of the fixed IPv6 header.
const IPv6Len = 40

// IPProtoUDP is the IP protocol number of UDP.
const IPProtoUDP = 17

// IPv4 is a view of an IPv4 header (RFC 791, section 3.1).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|Version|  IHL  |Type of Service|          Total Length         |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|         Identification        |Flags|      Fragment Offset    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|  Time to Live |    Protocol   |         Header Checksum       |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                       Source Address                          |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                    Destination Address                        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// The ICRC (IBA Annex A17.3.3) masks TOS, TTL and Header Checksum to 1s.
type IPv4 []byte

// IPv4Fields holds the fields of an option-less IPv4 header. Total length
// and checksum are computed by Encode.
type IPv4Fields struct {
	TOS          uint8
	TotalLength  uint16
	ID           uint16
	DontFragment bool
	TTL          uint8
	Protocol     uint8
	Src, Dst     netip.Addr // IPv4 (or IPv4-mapped) addresses
}

// IPv4 flag bits in the flags/fragment-offset word.
const (
	ipv4FlagDF      = 0x4000
	ipv4FlagMF      = 0x2000
	ipv4FragOffMask = 0x1FFF
)

// Version returns the IP version nibble.
func (h IPv4) Version() uint8 { return h[0] >> 4 }

// IHL returns the header length in bytes.
func (h IPv4) IHL() int { return int(h[0]&0x0F) * 4 }

// TOS returns the type of service (DSCP and ECN) byte.
func (h IPv4) TOS() uint8 { return h[1] }

// TotalLength returns the length of the datagram, header included.
func (h IPv4) TotalLength() uint16 { return binary.BigEndian.Uint16(h[2:4]) }

// ID returns the identification field.
func (h IPv4) ID() uint16 { return binary.BigEndian.Uint16(h[4:6]) }

// DontFragment reports whether DF is set.
func (h IPv4) DontFragment() bool { return binary.BigEndian.Uint16(h[6:8])&ipv4FlagDF != 0 }

// IsFragment reports whether MF is set or the fragment offset is non-zero.
func (h IPv4) IsFragment() bool {
	return binary.BigEndian.Uint16(h[6:8])&(ipv4FlagMF|ipv4FragOffMask) != 0
}

// TTL returns the time to live.
func (h IPv4) TTL() uint8 { return h[8] }

// Protocol returns the payload protocol number.
func (h IPv4) Protocol() uint8 { return h[9] }

// Checksum returns the header checksum field.
func (h IPv4) Checksum() uint16 { return binary.BigEndian.Uint16(h[10:12]) }

// Src returns the source address.
func (h IPv4) Src() netip.Addr { return netip.AddrFrom4([4]byte(h[12:16])) }

// Dst returns the destination address.
func (h IPv4) Dst() netip.Addr { return netip.AddrFrom4([4]byte(h[16:20])) }

// SetTOS sets the type of service byte.
func (h IPv4) SetTOS(v uint8) { h[1] = v }

// SetTotalLength sets the total length.
func (h IPv4) SetTotalLength(v uint16) { binary.BigEndian.PutUint16(h[2:4], v) }

// SetID sets the identification field.
func (h IPv4) SetID(v uint16) { binary.BigEndian.PutUint16(h[4:6], v) }

// SetTTL sets the time to live.
func (h IPv4) SetTTL(v uint8) { h[8] = v }

// SetChecksum sets the header checksum field.
func (h IPv4) SetChecksum(v uint16) { binary.BigEndian.PutUint16(h[10:12], v) }

// ComputeChecksum returns the RFC 791 header checksum of the IHL bytes of h,
// taking the checksum field as zero.
func (h IPv4) ComputeChecksum() uint16 {
	n := h.IHL()
	// One's-complement sum in 32-bit words: the carries land in the upper
	// half and fold back below.
	sum := uint64(binary.BigEndian.Uint32(h[0:4])) +
		uint64(binary.BigEndian.Uint32(h[4:8])) +
		uint64(binary.BigEndian.Uint16(h[8:10]))<<16
	for i := 12; i+4 <= n; i += 4 {
		sum += uint64(binary.BigEndian.Uint32(h[i : i+4]))
	}
	sum = sum&0xFFFFFFFF + sum>>32
	sum = sum&0xFFFF + sum>>16
	sum = sum&0xFFFF + sum>>16
	sum = sum&0xFFFF + sum>>16
	return ^uint16(sum)
}

// Encode writes an option-less header from f, checksum included.
func (h IPv4) Encode(f *IPv4Fields) {
	h[0] = 0x45
	h[1] = f.TOS
	binary.BigEndian.PutUint16(h[2:4], f.TotalLength)
	binary.BigEndian.PutUint16(h[4:6], f.ID)
	var flags uint16
	if f.DontFragment {
		flags = ipv4FlagDF
	}
	binary.BigEndian.PutUint16(h[6:8], flags)
	h[8] = f.TTL
	h[9] = f.Protocol
	src, dst := f.Src.As4(), f.Dst.As4()
	copy(h[12:16], src[:])
	copy(h[16:20], dst[:])
	h.SetChecksum(h.ComputeChecksum())
}

// IPv6 is a view of the fixed IPv6 header (RFC 8200, section 3).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|Version| Traffic Class |           Flow Label                  |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|         Payload Length        |  Next Header  |   Hop Limit   |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                  Source Address (16 bytes)                    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                Destination Address (16 bytes)                |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// The ICRC masks Traffic Class, Flow Label and Hop Limit to 1s.
type IPv6 []byte

// IPv6Fields holds the fields of a fixed IPv6 header.
type IPv6Fields struct {
	TrafficClass  uint8
	FlowLabel     uint32
	PayloadLength uint16
	NextHeader    uint8
	HopLimit      uint8
	Src, Dst      netip.Addr
}

// Version returns the IP version nibble.
func (h IPv6) Version() uint8 { return h[0] >> 4 }

// TrafficClass returns the traffic class byte.
func (h IPv6) TrafficClass() uint8 { return h[0]<<4 | h[1]>>4 }

// FlowLabel returns the 20-bit flow label.
func (h IPv6) FlowLabel() uint32 { return binary.BigEndian.Uint32(h[0:4]) & 0xFFFFF }

// PayloadLength returns the length of what follows the fixed header.
func (h IPv6) PayloadLength() uint16 { return binary.BigEndian.Uint16(h[4:6]) }

// NextHeader returns the next header (protocol) number.
func (h IPv6) NextHeader() uint8 { return h[6] }

// HopLimit returns the hop limit.
func (h IPv6) HopLimit() uint8 { return h[7] }

// Src returns the source address.
func (h IPv6) Src() netip.Addr { return netip.AddrFrom16([16]byte(h[8:24])) }

// Dst returns the destination address.
func (h IPv6) Dst() netip.Addr { return netip.AddrFrom16([16]byte(h[24:40])) }

// SetPayloadLength sets the payload length.
func (h IPv6) SetPayloadLength(v uint16) { binary.BigEndian.PutUint16(h[4:6], v) }

// SetHopLimit sets the hop limit.
func (h IPv6) SetHopLimit(v uint8) { h[7] = v }

// Encode writes the fixed header from f.
func (h IPv6) Encode(f *IPv6Fields) {
	binary.BigEndian.PutUint32(h[0:4], 6<<28|uint32(f.TrafficClass)<<20|f.FlowLabel&0xFFFFF)
	binary.BigEndian.PutUint16(h[4:6], f.PayloadLength)
	h[6] = f.NextHeader
	h[7] = f.HopLimit
	src, dst := f.Src.As16(), f.Dst.As16()
	copy(h[8:24], src[:])
	copy(h[24:40], dst[:])
}

// UDPLen is the length of a UDP header.
const UDPLen = 8

// UDPPort is the IANA-assigned RoCEv2 destination port (IBA Annex A17.2.1).
const UDPPort = 4791

// UDP is a view of a UDP header (RFC 768).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|          Source Port          |       Destination Port        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|            Length             |           Checksum            |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// The ICRC masks the checksum to 1s. rxe sends checksum 0 (none), on IPv4
// and IPv6 alike.
type UDP []byte

// UDPFields holds the fields of a UDP header.
type UDPFields struct {
	SrcPort, DstPort uint16
	Length           uint16
	Checksum         uint16
}

// SrcPort returns the source port.
func (h UDP) SrcPort() uint16 { return binary.BigEndian.Uint16(h[0:2]) }

// DstPort returns the destination port.
func (h UDP) DstPort() uint16 { return binary.BigEndian.Uint16(h[2:4]) }

// Length returns the UDP length, header included.
func (h UDP) Length() uint16 { return binary.BigEndian.Uint16(h[4:6]) }

// Checksum returns the checksum field.
func (h UDP) Checksum() uint16 { return binary.BigEndian.Uint16(h[6:8]) }

// SetLength sets the UDP length.
func (h UDP) SetLength(v uint16) { binary.BigEndian.PutUint16(h[4:6], v) }

// SetChecksum sets the checksum field.
func (h UDP) SetChecksum(v uint16) { binary.BigEndian.PutUint16(h[6:8], v) }

// Encode writes all fields of f.
func (h UDP) Encode(f *UDPFields) {
	binary.BigEndian.PutUint16(h[0:2], f.SrcPort)
	binary.BigEndian.PutUint16(h[2:4], f.DstPort)
	binary.BigEndian.PutUint16(h[4:6], f.Length)
	binary.BigEndian.PutUint16(h[6:8], f.Checksum)
}
