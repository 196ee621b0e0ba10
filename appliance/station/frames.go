package station

import (
	"encoding/binary"
	"net/netip"

	"github.com/taproce/taproce/appliance/roce"
)

// ARP over Ethernet for IPv4 (RFC 826).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|       Hardware type (1)       |     Protocol type (0x0800)    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	| HW len (6)    | Proto len (4) |   Operation (1 req, 2 reply)  |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|          Sender hardware address (6) | Sender IP (4)          |
//	|          Target hardware address (6) | Target IP (4)          |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type arp []byte

const (
	arpLen     = 28
	arpRequest = 1
	arpReply   = 2
)

func (a arp) valid() bool {
	return len(a) >= arpLen && binary.BigEndian.Uint16(a[0:2]) == 1 &&
		binary.BigEndian.Uint16(a[2:4]) == roce.EtherTypeIPv4 && a[4] == 6 && a[5] == 4
}
func (a arp) op() uint16              { return binary.BigEndian.Uint16(a[6:8]) }
func (a arp) senderMAC() (m roce.MAC) { copy(m[:], a[8:14]); return }
func (a arp) senderIP() netip.Addr    { return netip.AddrFrom4([4]byte(a[14:18])) }
func (a arp) targetIP() netip.Addr    { return netip.AddrFrom4([4]byte(a[24:28])) }
func putARP(a arp, op uint16, sha roce.MAC, spa netip.Addr, tha roce.MAC, tpa netip.Addr) {
	binary.BigEndian.PutUint16(a[0:2], 1)
	binary.BigEndian.PutUint16(a[2:4], roce.EtherTypeIPv4)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:8], op)
	s, t := spa.As4(), tpa.As4()
	copy(a[8:14], sha[:])
	copy(a[14:18], s[:])
	copy(a[18:24], tha[:])
	copy(a[24:28], t[:])
}

// IP protocol numbers the station handles.
const (
	protoICMP   = 1
	protoICMPv6 = 58
)

// ICMP and ICMPv6 message types the station handles (RFC 792, RFC 4443,
// RFC 4861).
const (
	icmpEchoReply     = 0
	icmpEchoRequest   = 8
	icmp6EchoRequest  = 128
	icmp6EchoReply    = 129
	icmp6NeighborSol  = 135
	icmp6NeighborAdv  = 136
	ndOptSourceLLAddr = 1
	ndOptTargetLLAddr = 2
)

// checksum returns the Internet checksum (RFC 1071) of b, starting from
// the partial sum initial.
func checksum(b []byte, initial uint32) uint16 {
	sum := initial
	for len(b) >= 2 {
		sum += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	for sum > 0xFFFF {
		sum = sum&0xFFFF + sum>>16
	}
	return ^uint16(sum)
}

// pseudo6 returns the partial sum of the IPv6 pseudo-header (RFC 8200,
// 8.1) for an upper-layer packet of length n and protocol proto.
func pseudo6(src, dst netip.Addr, n int, proto uint8) uint32 {
	var sum uint32
	s, d := src.As16(), dst.As16()
	for i := 0; i < 16; i += 2 {
		sum += uint32(s[i])<<8 | uint32(s[i+1])
		sum += uint32(d[i])<<8 | uint32(d[i+1])
	}
	sum += uint32(n>>16) + uint32(n&0xFFFF) + uint32(proto)
	return sum
}

// solicitedNode returns the solicited-node multicast address of a
// (RFC 4291, 2.7.1).
func solicitedNode(a netip.Addr) netip.Addr {
	b := a.As16()
	return netip.AddrFrom16([16]byte{0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, b[13], b[14], b[15]})
}

// multicastMAC returns the Ethernet address of an IPv6 multicast group
// (RFC 2464, 7).
func multicastMAC(a netip.Addr) roce.MAC {
	b := a.As16()
	return roce.MAC{0x33, 0x33, b[12], b[13], b[14], b[15]}
}

var (
	broadcastMAC = roce.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	allNodes     = netip.MustParseAddr("ff02::1")
)

// writeEthernet writes an Ethernet header.
func writeEthernet(b []byte, dst, src roce.MAC, etherType uint16) {
	roce.Ethernet(b).Encode(&roce.EthernetFields{Dst: dst, Src: src, EtherType: etherType})
}

// writeIPv4 writes an option-less IPv4 header with checksum.
func writeIPv4(b []byte, src, dst netip.Addr, proto uint8, payloadLen int, id uint16) {
	roce.IPv4(b).Encode(&roce.IPv4Fields{
		TotalLength:  uint16(roce.IPv4Len + payloadLen),
		ID:           id,
		DontFragment: true,
		TTL:          64,
		Protocol:     proto,
		Src:          src,
		Dst:          dst,
	})
}

// writeIPv6 writes a fixed IPv6 header.
func writeIPv6(b []byte, src, dst netip.Addr, proto uint8, payloadLen int, hopLimit uint8) {
	roce.IPv6(b).Encode(&roce.IPv6Fields{
		PayloadLength: uint16(payloadLen),
		NextHeader:    proto,
		HopLimit:      hopLimit,
		Src:           src,
		Dst:           dst,
	})
}
