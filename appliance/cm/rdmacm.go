package cm

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
)

// ServiceID is a CM service ID: what a REQ or SIDR_REQ asks to connect to,
// as a port number does for TCP. The RDMA CM builds it from a port space
// and a port (IBA Annex A11 "RDMA IP CM Service"; Linux cma.c
// cma_get_service_id): (port space << 16) | port, so that TCP port 7174 is
// 0x0000000001061c06.
type ServiceID uint64

// The RDMA CM's service IDs for IP addressing (Linux include/rdma/ib_cm.h
// IB_CMA_SERVICE_ID): a service ID s is the RDMA CM's when
// s&ServiceIDCMAMask == ServiceIDCMA. The IPoIB port space lies outside.
const (
	ServiceIDCMA     ServiceID = 0x0000000001000000
	ServiceIDCMAMask ServiceID = 0xFFFFFFFFFF000000
)

// PortSpace is an RDMA CM port space (Linux enum rdma_ucm_port_space):
// which protocol's ports a service ID's port counts, and so which QP type
// a listener serves.
type PortSpace uint16

// RDMA CM port spaces. TCP and IB carry RC connections (REQ/REP), UDP
// and IPoIB UD ones (SIDR).
const (
	PortSpaceIPoIB PortSpace = 0x0002
	PortSpaceTCP   PortSpace = 0x0106 // RDMA_PS_TCP: 0x01 then IP protocol 6
	PortSpaceUDP   PortSpace = 0x0111 // RDMA_PS_UDP: 0x01 then IP protocol 17
	PortSpaceIB    PortSpace = 0x013F // RDMA_PS_IB
)

// String returns "TCP", "UDP", "IB", "IPOIB" or the number in hex.
func (ps PortSpace) String() string {
	switch ps {
	case PortSpaceIPoIB:
		return "IPOIB"
	case PortSpaceTCP:
		return "TCP"
	case PortSpaceUDP:
		return "UDP"
	case PortSpaceIB:
		return "IB"
	}
	return "PS_0x" + strconv.FormatUint(uint64(ps), 16)
}

// RDMAServiceID returns the service ID of port in port space ps.
func RDMAServiceID(ps PortSpace, port uint16) ServiceID {
	return ServiceID(ps)<<16 | ServiceID(port)
}

// PortSpace returns the RDMA CM port space of s and whether s is an RDMA
// CM service ID at all: bits 63…16 equal to one of the four port spaces.
func (s ServiceID) PortSpace() (PortSpace, bool) {
	if s>>32 != 0 {
		return 0, false
	}
	switch ps := PortSpace(s >> 16); ps {
	case PortSpaceIPoIB, PortSpaceTCP, PortSpaceUDP, PortSpaceIB:
		return ps, true
	}
	return 0, false
}

// Port returns the low 16 bits of s: the port, for an RDMA CM service ID.
func (s ServiceID) Port() uint16 { return uint16(s) }

// String formats s as 16 hex digits, followed for an RDMA CM service ID by
// its port space and port: "0x0000000001061c06(TCP:7174)".
func (s ServiceID) String() string {
	h := fmt.Sprintf("0x%016x", uint64(s))
	if ps, ok := s.PortSpace(); ok {
		return h + "(" + ps.String() + ":" + strconv.Itoa(int(s.Port())) + ")"
	}
	return h
}

// CMAHeaderLen is the length of the RDMA CM's header at the start of a REQ's
// or SIDR_REQ's private data, which leaves the application 56 bytes of a
// REQ's (REQPrivateDataLen - CMAHeaderLen) and 180 of a SIDR_REQ's.
const CMAHeaderLen = 36

// CMAVersion is the only cma_version there is.
const CMAVersion = 0

// CMAHeader is the RDMA CM's IP addressing in a REQ's or SIDR_REQ's
// private data (Linux cma.c struct cma_hdr; IBA Annex A11, the "IP CM
// private data"):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|  cma_version  | IPV   | resv  |          Source Port          |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|             Source IP address (128 bits)                      |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|             Destination IP address (128 bits)                 |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// IPV is 4 or 6; an IPv4 address takes the last 4 bytes of its 16, after
// 12 zero bytes (not the ::ffff: form of GIDs). The port is the active
// side's own; the destination port is the service ID's.
type CMAHeader struct {
	Version uint8          // cma_version, CMAVersion
	Src     netip.AddrPort // the active side's address and port
	Dst     netip.Addr     // the passive side's address; its port is in the service ID
}

// Destination returns the passive side's address and port, the port
// taken from the message's service ID.
func (h CMAHeader) Destination(sid ServiceID) netip.AddrPort {
	return netip.AddrPortFrom(h.Dst, sid.Port())
}

// ParseCMAHeader reads the CMA header at the start of private data.
func ParseCMAHeader(b []byte) (CMAHeader, error) {
	if len(b) < CMAHeaderLen {
		return CMAHeader{}, fmt.Errorf("%w: %d bytes", ErrCMAHeaderLength, len(b))
	}
	h := CMAHeader{Version: b[0]}
	if h.Version != CMAVersion {
		return CMAHeader{}, fmt.Errorf("%w %d", ErrCMAVersion, h.Version)
	}
	port := binary.BigEndian.Uint16(b[2:4])
	var src, dst netip.Addr
	switch v := b[1] >> 4; v {
	case 4:
		src, dst = netip.AddrFrom4([4]byte(b[16:20])), netip.AddrFrom4([4]byte(b[32:36]))
	case 6:
		src, dst = netip.AddrFrom16([16]byte(b[4:20])), netip.AddrFrom16([16]byte(b[20:36]))
	default:
		return CMAHeader{}, fmt.Errorf("%w: %d", ErrCMAIPVersion, v)
	}
	h.Src, h.Dst = netip.AddrPortFrom(src, port), dst
	return h, nil
}

// Encode writes h at the start of private data b: version, IP version,
// source port and both addresses. The addresses must be valid and of one
// IP version (an IPv4-mapped IPv6 address counts as IPv4).
func (h *CMAHeader) Encode(b []byte) error {
	if len(b) < CMAHeaderLen {
		return ErrBufferTooSmall
	}
	src, dst := h.Src.Addr().Unmap(), h.Dst.Unmap()
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return ErrCMAAddress
	}
	clear(b[:CMAHeaderLen])
	b[0] = h.Version
	b[1] = 6 << 4
	if src.Is4() {
		b[1] = 4 << 4
	}
	binary.BigEndian.PutUint16(b[2:4], h.Src.Port())
	put := func(o []byte, a netip.Addr) {
		if a.Is4() {
			a4 := a.As4()
			copy(o[12:16], a4[:])
			return
		}
		a16 := a.As16()
		copy(o, a16[:])
	}
	put(b[4:20], src)
	put(b[20:36], dst)
	return nil
}
