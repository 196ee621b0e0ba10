package roce

import (
	"encoding/binary"
	"net/netip"
)

// GID is a 128-bit global identifier. On RoCEv2 it is the port's IP
// address: IPv6 as is, IPv4 as the IPv4-mapped address ::ffff:a.b.c.d
// (IBA Annex A17.8).
type GID [16]byte

// GIDFromAddr returns the RoCEv2 GID of an IP address.
func GIDFromAddr(a netip.Addr) GID { return GID(a.As16()) }

// Addr returns the IP address of g: an IPv4 address when g is
// IPv4-mapped, otherwise the IPv6 address.
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

// IsIPv4 reports whether g is an IPv4-mapped GID.
func (g GID) IsIPv4() bool { return netip.AddrFrom16(g).Is4In6() }

// String formats g as libibverbs tools print GIDs:
// "0000:0000:0000:0000:0000:ffff:0a63:0002".
func (g GID) String() string {
	const digits = "0123456789abcdef"
	b := make([]byte, 0, 39)
	for i := 0; i < 16; i += 2 {
		if i > 0 {
			b = append(b, ':')
		}
		b = append(b, digits[g[i]>>4], digits[g[i]&0xF], digits[g[i+1]>>4], digits[g[i+1]&0xF])
	}
	return string(b)
}

// EUI64 returns the modified EUI-64 of m (RFC 4291 appendix A) as a
// number: the interface identifier of LinkLocalGID, and the node GUID rxe
// gives a port (its ibv_devinfo node_guid, the CM's Local CA GUID).
func (m MAC) EUI64() uint64 {
	g := LinkLocalGID(m)
	return binary.BigEndian.Uint64(g[8:])
}

// LinkLocalGID returns the fe80:: GID a port derives from its MAC, the way
// the kernel builds an IPv6 link-local address (RFC 4291 appendix A,
// modified EUI-64: ff:fe in the middle, universal/local bit flipped).
func LinkLocalGID(mac MAC) GID {
	return GID{0xfe, 0x80, 0, 0, 0, 0, 0, 0,
		mac[0] ^ 0x02, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]}
}
