package roce

// The UDP source port of a RoCEv2 packet carries entropy for ECMP
// (IBA Annex A17.5.1.2): the range 0xC000–0xFFFF, constant for a flow so
// that its packets stay in order. rxe chooses it in one of two ways, and
// taproce does the same so that its traffic hashes as rxe's does.

// SourcePortMin is the lowest RoCEv2 UDP source port
// (IB_ROCE_UDP_ENCAP_VALID_PORT_MIN).
const SourcePortMin = 0xC000

// FlowLabel returns the flow label rxe derives for a connected QP from its
// local and remote QPNs when the address vector has none
// (rdma_calc_flow_label): the 64-bit product folded to 20 bits. It is
// symmetric, so both directions of a connection share it.
func FlowLabel(lqpn, rqpn uint32) uint32 {
	v := uint64(lqpn) * uint64(rqpn)
	v ^= v >> 20
	v ^= v >> 40
	return uint32(v & 0xFFFFF)
}

// SourcePortFromFlowLabel folds a 20-bit flow label into the 14 variable
// bits of a source port (rdma_flow_label_to_udp_sport).
func SourcePortFromFlowLabel(fl uint32) uint16 {
	lo, hi := fl&0x3FFF, fl&0xFC000
	lo ^= hi >> 14
	return uint16(lo | SourcePortMin)
}

// ConnectedSourcePort returns the UDP source port of an RC or UC QP as
// Linux 6.1 rxe picks it when the QP gets its address vector
// (rdma_get_udp_sport): from the AV's flow label, or when that is 0 from
// FlowLabel(lqpn, rqpn).
func ConnectedSourcePort(flowLabel, lqpn, rqpn uint32) uint16 {
	if flowLabel == 0 {
		flowLabel = FlowLabel(lqpn, rqpn)
	}
	return SourcePortFromFlowLabel(flowLabel)
}

// DatagramSourcePort returns the UDP source port of a UD QP (QP1
// included) as rxe picks it at QP creation: 0xC000 plus the 14-bit
// multiplicative hash of the QPN (hash_32(qpn, 14)).
func DatagramSourcePort(qpn uint32) uint16 {
	const goldenRatio32 = 0x61C88647
	h := (qpn * goldenRatio32) >> (32 - 14)
	return SourcePortMin + uint16(h&0x3FFF)
}
