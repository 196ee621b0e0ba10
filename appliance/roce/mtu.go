package roce

// MTU is a path MTU as libibverbs enumerates it (enum ibv_mtu, IBA 7.7.7):
// 1 = 256 bytes … 5 = 4096 bytes of payload per packet.
type MTU uint8

// Path MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the payload bytes per packet, or 0 for an invalid MTU.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// Valid reports whether m is one of MTU256…MTU4096.
func (m MTU) Valid() bool { return m >= MTU256 && m <= MTU4096 }

// MTUFromBytes returns the MTU enum for 256, 512, 1024, 2048 or 4096, and
// false for any other value.
func MTUFromBytes(n int) (MTU, bool) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, true
		}
	}
	return 0, false
}

// MaxHeaderLen is the most header bytes a RoCEv2 packet adds to its payload
// as rxe counts it (RXE_MAX_HDR_LENGTH): the active MTU of a port is the
// largest path MTU that fits the netdev MTU less this.
const MaxHeaderLen = 80

// MTUForNetdev returns the active path MTU of a port whose network device
// has MTU netdevMTU, as rxe derives it (eth_mtu_int_to_enum): 1500 gives
// MTU1024, 9000 gives MTU4096. Below 256+80 it returns MTU256.
func MTUForNetdev(netdevMTU int) MTU {
	avail := netdevMTU - MaxHeaderLen
	m := MTU256
	for c := MTU512; c <= MTU4096; c++ {
		if c.Bytes() <= avail {
			m = c
		}
	}
	return m
}
