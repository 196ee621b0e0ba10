package transport

import "net/netip"

func netipFrom16(b [16]byte) netip.Addr { return netip.AddrFrom16(b).Unmap() }
