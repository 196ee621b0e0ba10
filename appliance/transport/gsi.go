package transport

import (
	"fmt"
	"net/netip"

	"github.com/taproce/taproce/appliance/roce"
)

// QP1, the general services interface (GSI, IBA 13.5), belongs to the
// engine: it is no QP a client creates, and the engine hands what arrives
// for it to a GSIHandler — the port's connection manager — and sends
// what that manager gives it (Engine.SendMAD) through the same Output as
// every QP's frames, so that a MAD to another port of the appliance
// crosses the local switch and one to a kernel rxe host leaves through the
// TAP.
//
// Linux rxe is the model. A packet to QP 1 reaches the MAD layer (ib_mad)
// when rxe_recv.c's hdr_check passes it: check_type_state wants a UD
// opcode of the GSI QP (SEND ONLY, with or without immediate data: the
// only UD opcodes, IBA 9.2), check_addr checks nothing of a datagram QP,
// and check_keys wants the P_Key in the default partition (pkey_match
// against IB_DEFAULT_PKEY_FULL, as for every QP) and, for QP 1, the Q_Key
// GSI_QKEY, 0x80010000 (IBA 10.2.5, 13.5); a failure counts in the port's
// bad P_Key or Q_Key violation counters. The MAD layer posts receive
// buffers of a GRH and one MAD (IBA 13.4.2: a MAD is exactly 256 bytes),
// so rxe completes a longer payload with a length error, which
// ib_mad_recv_done drops; a shorter one it would pass on with the rest of
// the buffer stale, which no MAD is, so the engine drops both. What a MAD says (its
// version, class and method: validate_mad) is for the manager to judge.
//
// rxe sends a MAD as the GSI QP's UD SEND ONLY (rxe_req.c
// init_req_packet): DestQP and the DETH's source QP 1, the DETH Q_Key
// GSI_QKEY, the default P_Key, the PSN from the GSI QP's send PSN, which
// the MAD layer sets to 0 (IB_MAD_SEND_Q_PSN) when it brings the QP up
// and rxe advances by one a packet, and AckReq set: rxe asks for an
// acknowledgement on the last packet of a message of every QP whose type
// is neither IB_QPT_UD nor IB_QPT_UC, and the GSI QP's is IB_QPT_GSI (a
// UD QP's SEND has it clear, as rxe-ud-pingpong.pcap shows). The UDP source port is the QP's own, chosen when rxe creates it
// (rxe_qp_init_req: 0xC000 plus hash_32 of the QPN, 1 for the GSI QP,
// to 14 bits: 0xD872) and never replaced, since only a connected QP's
// modify with an address vector derives it from a flow label
// (rdma_get_udp_sport). Every CM MAD of shared/vectors/rxe-cm-*.pcap
// leaves from port 55410 (0xD872), whatever its connection. The IPv4
// header has TOS 0 (the path's traffic class), DF and TTL 64 (the
// route's hop limit); an IPv6 header's flow label is 0, as rxe_net.c's
// prepare_ipv6_hdr writes every one.

// MADSize is the size of a management datagram (IBA 13.4.2): the payload
// of every packet to or from QP1.
const MADSize = 256

// GSIQPN is the number of QP1, the general services interface (IBA
// 13.5).
const GSIQPN = 1

// gsiSourcePort is the UDP source port of every MAD, as rxe's GSI QP has
// it (roce.DatagramSourcePort of QP 1).
var gsiSourcePort = roce.DatagramSourcePort(GSIQPN)

// GSIHandler receives the MADs that arrive for QP1: the packet's source
// and destination addresses (IPv4 ones as IPv4), the DETH's source QP, the
// BTH's P_Key and the MAD, MADSize bytes, valid only during the call. It
// runs on the goroutine that hands the engine its packets — a port's
// polling loop, a local switch's — outside the engine's lock, so it may
// call SendMAD; it may run on several such goroutines at once, and must
// not wait long.
type GSIHandler func(src, dst netip.Addr, srcQPN uint32, pkey uint16, mad []byte)

// GSIDropReason says why the engine dropped a packet for QP1.
type GSIDropReason int

// GSI drop reasons, in the order rxe's hdr_check and the MAD layer's
// receive buffer apply them.
const (
	GSIDropNoHandler  GSIDropReason = iota // no GSIHandler: the port has no QP1
	GSIDropOpcode                          // not a UD SEND (check_type_state)
	GSIDropPKey                            // P_Key outside the default partition (check_keys)
	GSIDropQKey                            // Q_Key not GSI_QKEY (check_keys)
	GSIDropLength                          // payload not MADSize bytes
	NumGSIDropReasons                      // how many reasons there are
)

var gsiDropNames = [NumGSIDropReasons]string{"no_handler", "opcode", "pkey", "qkey", "length"}

// String names the reason as metrics label it.
func (r GSIDropReason) String() string {
	if r < 0 || r >= NumGSIDropReasons {
		return fmt.Sprintf("reason_%d", int(r))
	}
	return gsiDropNames[r]
}

// Errors of SendMAD.
var (
	ErrMADSize    = fmt.Errorf("%w: a MAD is %d bytes", ErrInvalid, MADSize)
	ErrMADAddress = fmt.Errorf("%w: no GID of the port to send the MAD from", ErrInvalid)
)

// SetGSI sets the handler of QP1's MADs (Config.GSI), nil for none.
func (e *Engine) SetGSI(h GSIHandler) {
	if h == nil {
		e.gsi.Store(nil)
		return
	}
	e.gsi.Store(&h)
}

// receiveGSI takes a packet for QP1 through rxe's checks to the handler;
// what fails is dropped and counted by reason. It holds no lock: the
// handler may send.
func (e *Engine) receiveGSI(frame []byte, p *roce.Packet) {
	e.stats.received.Add(1)
	h := e.gsi.Load()
	r := GSIDropNoHandler
	switch {
	case h == nil:
	case p.BTH.Opcode.Transport() != roce.TransportUD:
		r = GSIDropOpcode
	case !roce.PKeyMatch(p.BTH.PKey, roce.DefaultPKey):
		r = GSIDropPKey
	case p.DETH.QKey != roce.GSIQKey:
		r = GSIDropQKey
	case p.PayloadLen != MADSize:
		r = GSIDropLength
	default:
		e.stats.gsiReceived.Add(1)
		(*h)(p.Src, p.Dst, p.DETH.SrcQP, p.BTH.PKey, p.Payload(frame))
		return
	}
	e.stats.gsiDropped[r].Add(1)
	e.stats.dropped.Add(1)
}

// SendMAD sends mad, MADSize bytes, from QP1 to QP1 of dst, whose MAC is
// dmac, as rxe's GSI QP sends it (see the package's GSI notes): a UD SEND
// ONLY with the GSI Q_Key and the default P_Key, from UDP port 0xD872,
// through the engine's Output with the frames of its QPs. src is the GID
// address to send from, one of the port's; the zero Addr picks the
// port's first of dst's family (for an IPv6 destination off the link, a
// GID that is not link-local when there is one). IPv4-mapped addresses
// count as IPv4 ones. It fails with ErrMADSize or ErrMADAddress.
func (e *Engine) SendMAD(src, dst netip.Addr, dmac roce.MAC, mad []byte) error {
	if len(mad) != MADSize {
		return fmt.Errorf("%w, not %d", ErrMADSize, len(mad))
	}
	dst = dst.Unmap()
	src, err := e.gsiSource(src.Unmap(), dst)
	if err != nil {
		return err
	}
	v6 := dst.Is6()
	p := roce.Packet{
		DstMAC: dmac, SrcMAC: e.cfg.MAC,
		IPv6: v6, Src: src, Dst: dst, TTL: HopLimit, DontFragment: !v6,
		SrcPort: gsiSourcePort, DstPort: roce.UDPPort,
		BTH:  roce.BTHFields{Opcode: roce.UDSendOnly, PKey: roce.DefaultPKey, DestQP: GSIQPN, AckReq: true},
		DETH: roce.DETHFields{QKey: roce.GSIQKey, SrcQP: GSIQPN},
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.flush()
	p.BTH.PSN = e.gsiPSN
	e.stampID(&p)
	n, err := p.Build(e.frame(), mad)
	if err != nil {
		e.unframe()
		return fmt.Errorf("transport: MAD to %v: %w", dst, err)
	}
	e.emit(n, false)
	e.gsiPSN = e.gsiPSN.Next()
	e.stats.gsiSent.Add(1)
	return nil
}

// gsiSource checks or picks the address a MAD to dst leaves from.
func (e *Engine) gsiSource(src, dst netip.Addr) (netip.Addr, error) {
	if !dst.IsValid() || dst.IsUnspecified() || dst.IsMulticast() {
		return netip.Addr{}, fmt.Errorf("%w: destination %v", ErrMADAddress, dst)
	}
	var pick netip.Addr
	for _, g := range e.cfg.GIDs {
		a := g.Addr()
		switch {
		case src.IsValid():
			if a == src {
				if a.Is4() != dst.Is4() {
					return netip.Addr{}, fmt.Errorf("%w: %v to %v", ErrMADAddress, src, dst)
				}
				return a, nil
			}
		case a.Is4() != dst.Is4():
		case !pick.IsValid():
			pick = a
		case pick.IsLinkLocalUnicast() && !a.IsLinkLocalUnicast() && !dst.IsLinkLocalUnicast():
			pick = a
		}
	}
	if !pick.IsValid() {
		if src.IsValid() {
			return netip.Addr{}, fmt.Errorf("%w: %v is none of its GIDs", ErrMADAddress, src)
		}
		return netip.Addr{}, fmt.Errorf("%w: none of %v's family", ErrMADAddress, dst)
	}
	return pick, nil
}
