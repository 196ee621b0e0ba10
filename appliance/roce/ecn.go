package roce

// The ECN field, the low two bits of the IPv4 TOS and of the IPv6 traffic
// class (RFC 3168): a sender marks its packets ECN-capable (ECT), and a
// congested queue marks such a packet CE instead of dropping it; RoCEv2's
// receiver answers CE with a CNP (Annex A17.9).
const (
	ECNMask  = 0x3 // the ECN bits of a TOS or traffic class
	ECNNotCT = 0x0 // not ECN-capable
	ECT1     = 0x1
	ECT0     = 0x2
	ECNCE    = 0x3 // congestion experienced
)
