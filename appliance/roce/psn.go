package roce

// PSN is a 24-bit packet sequence number (IBA vol. 1, 9.7.1). Arithmetic
// wraps modulo 2^24 and comparisons use a window of 2^23: a PSN is "before"
// another when it lies less than 2^23 behind it.
type PSN uint32

// PSNMask masks a PSN to its 24 bits.
const PSNMask = 1<<24 - 1

// Add returns p advanced by n packets, wrapping at 2^24. n may be negative.
func (p PSN) Add(n int) PSN { return PSN((int64(p) + int64(n)) & PSNMask) }

// Next returns p + 1.
func (p PSN) Next() PSN { return (p + 1) & PSNMask }

// Diff returns the signed distance p − q, in [−2^23, 2^23): positive when p
// is after q. Exactly half the space apart counts as before, as rxe's
// psn_compare has it.
func (p PSN) Diff(q PSN) int {
	d := int32((uint32(p)-uint32(q))<<8) >> 8 // sign-extend 24 bits
	return int(d)
}

// Before reports whether p comes strictly before q.
func (p PSN) Before(q PSN) bool { return p.Diff(q) < 0 }

// After reports whether p comes strictly after q.
func (p PSN) After(q PSN) bool { return p.Diff(q) > 0 }

// Between reports whether lo ≤ p < hi in PSN order (an empty range when
// lo == hi).
func (p PSN) Between(lo, hi PSN) bool {
	return uint32(p-lo)&PSNMask < uint32(hi-lo)&PSNMask
}

// ReadPSNs returns the number of PSNs an RDMA READ request of length bytes
// consumes at path MTU pmtu: one per response packet, at least one
// (IBA 9.4.3, 9.7.1).
func ReadPSNs(length uint32, pmtu int) int {
	if length == 0 {
		return 1
	}
	return int((uint64(length) + uint64(pmtu) - 1) / uint64(pmtu))
}
