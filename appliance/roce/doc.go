// Package roce is taproce's RoCEv2 wire format: header views over []byte,
// the IBA opcode table, the invariant CRC, 24-bit PSN arithmetic and the
// packet descriptor that the transport works with.
//
// A RoCEv2 packet (IBA vol. 1 Annex A17, "RoCEv2") is an Ethernet frame
// carrying IPv4 or IPv6, then UDP to destination port 4791, then the
// InfiniBand transport headers:
//
//	+----------+---------+-----+-----+------------------+---------+-----+------+
//	| Ethernet | IPv4/v6 | UDP | BTH | extension hdrs   | payload | pad | ICRC |
//	|   14 B   | 20/40 B | 8 B | 12B | DETH RETH AETH … |  0…MTU  | 0-3 | 4 B  |
//	+----------+---------+-----+-----+------------------+---------+-----+------+
//
// Header views (Ethernet, IPv4, BTH, RETH, …) are []byte types with getters
// and Set* methods, in the style of gVisor's tcpip/header: they do no bounds
// checking of their own; Parse validates a frame once and the views are then
// safe to use on the slices it describes. Each view has an Encode method that
// writes a whole header from a Fields struct.
//
// Nothing on the hot path allocates: Parse fills a caller's Packet, Encode
// and Build write into a caller's buffer, and the ICRC is computed in place.
//
// The package depends on nothing else in taproce.
package roce
