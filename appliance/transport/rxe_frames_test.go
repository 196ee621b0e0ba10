package transport

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// rxeFramesFile holds eight frames of Linux Soft-RoCE (rdma_rxe, kernel
// 6.1) RC traffic between two perftest hosts, copied unchanged from the
// captures in shared/vectors by testdata/gen_rxe_frames.go, which names the
// capture and frame number of each.
const rxeFramesFile = "testdata/rxe-frames.pcap"

// rxePathMTU and rxeNetdevMTU are the path MTU and the netdev MTU of the
// captured connections (shared/vectors/README.md); single-packet frames do
// not show them.
const (
	rxePathMTU   = abi.MTU1024
	rxeNetdevMTU = 1500
)

// TestRxeFrames pins the engine's wire format to rxe's. For each exchange
// of the captures (a request and, where kept, rxe's answer to it) two
// engines are set up as the captured hosts were — their MACs and IP
// addresses (GID index 1, IPv4-mapped, or GID 0, the IPv6 link-local one),
// the QPNs, the request's PSN, the path MTU, the remote address, R_Key and
// payload of the request, and the responder's memory holding what rxe's
// answer returns — and the work request is posted. The requester's request
// and the responder's answer (ACKNOWLEDGE, READ RESPONSE ONLY, ATOMIC
// ACKNOWLEDGE) must equal rxe's frames field by field: the Ethernet header;
// the IPv4 version, header length, TOS, total length, flags (DF),
// fragment offset, TTL (64), protocol and addresses, or the IPv6 version,
// traffic class, flow label, payload length, next header, hop limit (64)
// and addresses; the UDP ports (the source port derived from the QPN pair
// as rxe does), length and checksum (0); every BTH field, reserved bits
// included; the RETH, AETH, AtomicETH and AtomicAckETH; payload and pad.
// The ICRC of each frame of ours must verify.
//
// Only the IPv4 identification may differ, and what covers it: the IPv4
// header checksum and the ICRC. The identification comes from a counter,
// the engine's or the Linux IP stack's, so the test takes rxe's into a
// copy of our frame, recomputes the checksum and the ICRC, and then wants
// rxe's frame byte for byte. Over IPv6 the ICRC must be rxe's as it
// stands.
//
// Nothing else is normalised. The engine picks QPNs and memory keys at
// random, so the queue pairs are given rxe's QPNs (createQPNum) and the
// responder's region rxe's R_Key (registerWithRKey). The AETH MSN and credits are compared as they
// come: each exchange is the first message of its connection, which rxe
// acknowledges with MSN 1 and credits 31 (none), as a fresh queue pair of
// the engine does.
func TestRxeFrames(t *testing.T) {
	frames, err := capture.ReadFile(rxeFramesFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(frames) != 8 {
		t.Fatalf("%s holds %d frames, want 8 (see testdata/gen_rxe_frames.go)", rxeFramesFile, len(frames))
	}
	for _, tc := range []struct {
		name string
		// qpn is the requester's QPN: the answer's destination QP; the
		// responder's is the request's. perftest's two hosts, each with a
		// fresh rxe device, gave both ends the same number.
		qpn uint32
		// req and resp are the request and rxe's answer in rxeFramesFile,
		// counted from 0; resp -1: the answer is not compared.
		req, resp int
	}{
		{"SEND ONLY and ACKNOWLEDGE", 0x13, 0, 1},
		{"RDMA WRITE ONLY", 0x17, 2, -1},
		{"RDMA READ REQUEST and READ RESPONSE ONLY", 0x18, 3, 4},
		{"CMP_SWAP and ATOMIC ACKNOWLEDGE", 0x1a, 5, 6},
		{"IPv6 RDMA WRITE ONLY", 0x1c, 7, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := frames[tc.req].Data
			var resp []byte
			if tc.resp >= 0 {
				resp = frames[tc.resp].Data
			}
			ourReq, ourResp := rxeExchange(t, tc.qpn, req, resp)
			t.Run(rxeFrameName(t, tc.req, req), func(t *testing.T) { compareRxeFrame(t, req, ourReq) })
			if resp != nil {
				t.Run(rxeFrameName(t, tc.resp, resp), func(t *testing.T) { compareRxeFrame(t, resp, ourResp) })
			}
		})
	}
}

// rxeFrameName names frame i of rxeFramesFile, f, for a subtest: its
// number from 1 and its opcode.
func rxeFrameName(t *testing.T, i int, f []byte) string {
	t.Helper()
	p := parsed(t, f)
	return fmt.Sprintf("frame %d %v", i+1, p.BTH.Opcode)
}

// rxeExchange sets up two engines as the hosts of rxe's request frame req
// were, the requester with QPN qpn, posts the work request that makes the
// requester send req, and returns the one frame the requester sent and the
// one the responder answered with. resp, when not nil, is rxe's answer: the
// responder's memory holds what it returns (READ data, an atomic's
// original value).
func rxeExchange(t *testing.T, qpn uint32, req, resp []byte) (ourReq, ourResp []byte) {
	t.Helper()
	rq := parsed(t, req)
	if err := rq.VerifyICRC(req); err != nil {
		t.Fatalf("rxe's request: %v", err)
	}
	var rs roce.Packet
	if resp != nil {
		rs = parsed(t, resp)
		if err := rs.VerifyICRC(resp); err != nil {
			t.Fatalf("rxe's answer: %v", err)
		}
		if rs.BTH.DestQP != qpn || rs.BTH.PSN != rq.BTH.PSN {
			t.Fatalf("rxe's answer goes to QP %#x with PSN %d; the requester is QP %#x, its request PSN %d",
				rs.BTH.DestQP, rs.BTH.PSN, qpn, rq.BTH.PSN)
		}
	}

	s := &sim{t: t, clock: fakeClock{now: time.Unix(1000, 0)}}
	port := func(mac roce.MAC, ip netip.Addr) *simPort {
		p := &simPort{sim: s, mac: mac, ip: ip, im: impair.New(impair.Spec{})}
		// rxe's GID table: 0 the link-local GID of the MAC, 1 the
		// IPv4-mapped address.
		gids := []roce.GID{roce.LinkLocalGID(mac)}
		if ip.Is4() {
			gids = append(gids, roce.GIDFromAddr(ip))
		} else if ll := roce.LinkLocalGID(mac).Addr(); ip != ll {
			t.Fatalf("rxe's IPv6 address %v is not the link-local GID %v of %v", ip, ll, mac)
		}
		p.eng = NewEngine(Config{MAC: mac, GIDs: gids, MTU: rxeNetdevMTU, Out: p, Now: s.clock.Now})
		return p
	}
	s.a, s.b = port(rq.SrcMAC, rq.Src), port(rq.DstMAC, rq.Dst)
	s.a.peer, s.b.peer = s.b, s.a
	var sentA, sentB [][]byte
	s.a.watch = func(f []byte) { sentA = append(sentA, append([]byte(nil), f...)) }
	s.b.watch = func(f []byte) { sentB = append(sentB, append([]byte(nil), f...)) }

	const local = 0x10000 // the requester's buffer
	ma, mb := s.a.eng.Memory(), s.b.eng.Memory()
	pda, pdb := ma.NewPD(), mb.NewPD()
	bufa := make([]byte, 4096)
	mra, err := ma.Register(pda, local, bufa, abi.AccessLocalWrite)
	must(t, err)
	cqa, cqb := NewCQ(16, nil), NewCQ(16, nil)
	qa := createQPNum(t, s.a.eng, QPConfig{Type: abi.RC, PD: pda, SendCQ: cqa, RecvCQ: cqa, MaxSendWR: 16, MaxRecvWR: 16}, qpn)
	qb := createQPNum(t, s.b.eng, QPConfig{Type: abi.RC, PD: pdb, SendCQ: cqb, RecvCQ: cqb, MaxSendWR: 16, MaxRecvWR: 16}, rq.BTH.DestQP)
	// The requester's first PSN is the request's, and so is the PSN the
	// responder expects; the other direction carries no requests.
	rxeConnect(t, qa, s.b, rq.BTH.DestQP, 0, rq.BTH.PSN)
	rxeConnect(t, qb, s.a, qpn, rq.BTH.PSN, 0)

	wr := SendWR{ID: 1, Flags: abi.SendSignaled}
	if rq.BTH.SolicitedEvent {
		wr.Flags |= abi.SendSolicited
	}
	payload := rq.Payload(req)
	copy(bufa, payload)
	wr.SGL = []SGE{{Addr: local, Length: uint32(len(payload)), LKey: mra.LKey}}
	switch rq.BTH.Opcode {
	case roce.RCSendOnly:
		wr.Opcode = abi.WRSend
		mrb, err := mb.Register(pdb, local, make([]byte, 4096), abi.AccessLocalWrite)
		must(t, err)
		_, err = qb.PostRecv([]RecvWR{{ID: 1, SGL: []SGE{{Addr: local, Length: 4096, LKey: mrb.LKey}}}})
		must(t, err)
	case roce.RCRDMAWriteOnly:
		wr.Opcode, wr.RemoteAddr, wr.RKey = abi.WRRDMAWrite, rq.RETH.VA, rq.RETH.RKey
		registerWithRKey(t, mb, pdb, rq.RETH.VA, make([]byte, rq.RETH.DMALen), abi.AccessLocalWrite|abi.AccessRemoteWrite, rq.RETH.RKey)
	case roce.RCRDMAReadRequest:
		wr.Opcode, wr.RemoteAddr, wr.RKey = abi.WRRDMARead, rq.RETH.VA, rq.RETH.RKey
		wr.SGL[0].Length = rq.RETH.DMALen
		data := make([]byte, rq.RETH.DMALen)
		if resp != nil {
			copy(data, rs.Payload(resp))
		}
		registerWithRKey(t, mb, pdb, rq.RETH.VA, data, abi.AccessRemoteRead, rq.RETH.RKey)
	case roce.RCCompareSwap, roce.RCFetchAdd:
		a := rq.AtomicETH
		wr.Opcode, wr.RemoteAddr, wr.RKey = abi.WRAtomicCmpAndSwp, a.VA, a.RKey
		wr.CompareAdd, wr.Swap = a.Compare, a.SwapAdd
		if rq.BTH.Opcode == roce.RCFetchAdd {
			wr.Opcode, wr.CompareAdd, wr.Swap = abi.WRAtomicFetchAdd, a.SwapAdd, 0
		}
		wr.SGL[0].Length = 8
		target := make([]byte, 8)
		putUint64(target, rs.AtomicAck) // the original value rxe's answer returns
		registerWithRKey(t, mb, pdb, a.VA, target, abi.AccessLocalWrite|abi.AccessRemoteAtomic, a.RKey)
	default:
		t.Fatalf("no work request makes a %v", rq.BTH.Opcode)
	}
	_, err = qa.PostSend([]SendWR{wr})
	must(t, err)
	var wcs []WC
	s.run(1000, func() bool { wcs = append(wcs, poll(cqa)...); return len(wcs) == 1 })
	if wcs[0].Status != abi.WCSuccess {
		t.Fatalf("%v completed with %v", wr.Opcode, wcs[0].Status)
	}
	if len(sentA) != 1 || len(sentB) != 1 {
		t.Fatalf("the requester sent %d frames, the responder %d; want one each", len(sentA), len(sentB))
	}
	return sentA[0], sentB[0]
}

// createQPNum creates a queue pair with QPN want: the engine picks QPNs
// at random, so the queue pair it made is given rxe's number, as
// registerWithRKey gives a region rxe's key.
func createQPNum(t *testing.T, e *Engine, cfg QPConfig, want uint32) *QP {
	t.Helper()
	qp, err := e.CreateQP(cfg)
	must(t, err)
	e.mu.Lock()
	defer e.mu.Unlock()
	if other := e.qps[want]; other != nil && other != qp {
		t.Fatalf("QPN %#x is taken", want)
	}
	delete(e.qps, qp.num)
	qp.num = want
	e.qps[want] = qp
	return qp
}

// rxeConnect takes an RC queue pair to RTS towards peer's QP dqpn, with the
// captures' path MTU and the GID of the peer's address family (1 for IPv4,
// 0 for IPv6), and the given receive and send PSNs.
func rxeConnect(t *testing.T, qp *QP, peer *simPort, dqpn uint32, rq, sq roce.PSN) {
	t.Helper()
	av := AddressVector{DstIP: peer.ip, DstMAC: peer.mac, SGIDIndex: 1}
	if peer.ip.Is6() {
		av.SGIDIndex = 0
	}
	must(t, qp.Modify(&QPAttr{State: abi.QPSInit, Port: 1, Access: abi.AccessLocalWrite | abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic},
		abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPAccessFlags))
	must(t, qp.Modify(&QPAttr{State: abi.QPSRTR, AV: av, PathMTU: rxePathMTU, DestQPN: dqpn, RQPSN: rq, MaxDestRdAtomic: 16, MinRNRTimer: 12},
		abi.QPStateMask|abi.QPAV|abi.QPPathMTU|abi.QPDestQPN|abi.QPRQPSN|abi.QPMaxDestRdAtomic|abi.QPMinRNRTimer))
	must(t, qp.Modify(&QPAttr{State: abi.QPSRTS, SQPSN: sq, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
		abi.QPStateMask|abi.QPSQPSN|abi.QPTimeout|abi.QPRetryCnt|abi.QPRNRRetry|abi.QPMaxQPRdAtomic))
}

// registerWithRKey registers buf at va as a region of pd whose L_Key and
// R_Key are key. Memory.Register picks keys itself; the region takes the
// R_Key of rxe's request here, so that our request carries the same and the
// responder finds the region by it.
func registerWithRKey(t *testing.T, m *Memory, pd *PD, va uint64, buf []byte, access abi.Access, key uint32) *MR {
	t.Helper()
	mr, err := m.Register(pd, va, buf, access)
	must(t, err)
	m.mu.Lock()
	defer m.mu.Unlock()
	if other := m.keys[key]; other != nil && other != mr {
		t.Fatalf("key %#x is taken", key)
	}
	delete(m.keys, mr.LKey)
	mr.LKey, mr.RKey = key, key
	m.keys[key] = mr
	return mr
}

// wireField is one header field of a frame, formatted.
type wireField struct{ name, value string }

// rxeMayDiffer names the fields whose values may differ from rxe's over
// IPv4: the identification, from the engine's own counter, and the header
// checksum and ICRC, which cover it.
var rxeMayDiffer = map[string]bool{"IPv4 identification": true, "IPv4 header checksum": true, "ICRC": true}

// wireFields lists every field of a RoCEv2 frame, from the Ethernet header
// to the ICRC, reserved bits included.
func wireFields(t *testing.T, f []byte) []wireField {
	t.Helper()
	p := parsed(t, f)
	var out []wireField
	add := func(name string, v any) {
		var s string
		switch v := v.(type) {
		case uint8, uint16, uint32, uint64, roce.PSN, roce.Syndrome, roce.Opcode:
			s = fmt.Sprintf("%#x", v)
		case []byte:
			s = hex.EncodeToString(v)
		default:
			s = fmt.Sprint(v)
		}
		out = append(out, wireField{name, s})
	}
	eth := roce.Ethernet(f)
	add("Ethernet destination", eth.Dst())
	add("Ethernet source", eth.Src())
	add("EtherType", eth.EtherType())
	l4 := roce.EthernetLen + roce.IPv4Len
	if p.IPv6 {
		l4 = roce.EthernetLen + roce.IPv6Len
		ip := roce.IPv6(f[roce.EthernetLen:])
		add("IP version", ip.Version())
		add("IPv6 traffic class", ip.TrafficClass())
		add("IPv6 flow label", ip.FlowLabel())
		add("IPv6 payload length", ip.PayloadLength())
		add("IPv6 next header", ip.NextHeader())
		add("IPv6 hop limit", ip.HopLimit())
		add("IP source", ip.Src())
		add("IP destination", ip.Dst())
	} else {
		ip := roce.IPv4(f[roce.EthernetLen:])
		flags := binary.BigEndian.Uint16(ip[6:8])
		add("IP version", ip.Version())
		add("IPv4 header length", uint8(ip.IHL()))
		add("IPv4 TOS", ip.TOS())
		add("IPv4 total length", ip.TotalLength())
		add("IPv4 identification", ip.ID())
		add("IPv4 flags (0x2 DF)", uint8(flags>>13))
		add("IPv4 fragment offset", flags&0x1FFF)
		add("IPv4 TTL", ip.TTL())
		add("IPv4 protocol", ip.Protocol())
		add("IPv4 header checksum", ip.Checksum())
		add("IP source", ip.Src())
		add("IP destination", ip.Dst())
	}
	udp := roce.UDP(f[l4:])
	add("UDP source port", udp.SrcPort())
	add("UDP destination port", udp.DstPort())
	add("UDP length", udp.Length())
	add("UDP checksum", udp.Checksum())
	bth := roce.BTH(f[l4+roce.UDPLen:])
	add("BTH opcode", bth.Opcode())
	add("BTH SE", bth.SolicitedEvent())
	add("BTH M", bth.MigReq())
	add("BTH pad count", bth.PadCount())
	add("BTH TVer", bth.TVer())
	add("BTH P_Key", bth.PKey())
	add("BTH FECN", bth.FECN())
	add("BTH BECN", bth.BECN())
	add("BTH resv6", bth[4]&0x3F)
	add("BTH dest QP", bth.DestQP())
	add("BTH AckReq", bth.AckReq())
	add("BTH resv7", bth[8]&0x7F)
	add("BTH PSN", bth.PSN())
	info := p.Info()
	if info.Has(roce.HasRETH) {
		add("RETH VA", p.RETH.VA)
		add("RETH R_Key", p.RETH.RKey)
		add("RETH DMA length", p.RETH.DMALen)
	}
	if info.Has(roce.HasAtomicETH) {
		add("AtomicETH VA", p.AtomicETH.VA)
		add("AtomicETH R_Key", p.AtomicETH.RKey)
		add("AtomicETH swap/add", p.AtomicETH.SwapAdd)
		add("AtomicETH compare", p.AtomicETH.Compare)
	}
	if info.Has(roce.HasImmDt) {
		add("ImmDt", p.Imm)
	}
	if info.Has(roce.HasIETH) {
		add("IETH", p.IETH)
	}
	if info.Has(roce.HasAETH) {
		add("AETH syndrome", p.AETH.Syndrome)
		add("AETH MSN", p.AETH.MSN)
	}
	if info.Has(roce.HasAtomicAckETH) {
		add("AtomicAckETH original data", p.AtomicAck)
	}
	add("payload", p.Payload(f))
	pad := p.HeaderLen() + p.PayloadLen
	add("pad", f[pad:pad+int(p.BTH.PadCount)])
	add("ICRC", p.ICRC)
	add("frame length", uint32(len(f)))
	return out
}

// compareRxeFrame compares our frame with rxe's, field by field and then
// byte by byte with rxe's IPv4 identification taken into ours.
func compareRxeFrame(t *testing.T, rxe, ours []byte) {
	t.Helper()
	p := parsed(t, ours)
	if err := p.VerifyICRC(ours); err != nil {
		t.Errorf("the ICRC of our %v does not verify: %v", p.BTH.Opcode, err)
	}
	want, got := wireFields(t, rxe), wireFields(t, ours)
	have := map[string]string{}
	for _, f := range got {
		have[f.name] = f.value
	}
	fields := map[string]bool{}
	for _, f := range want {
		fields[f.name] = true
		v, ok := have[f.name]
		switch {
		case !ok:
			t.Errorf("%s: rxe %s, ours has no such field", f.name, f.value)
		case v != f.value && rxeMayDiffer[f.name] && !p.IPv6:
			t.Logf("%s: rxe %s, ours %s (may differ)", f.name, f.value, v)
		case v != f.value:
			t.Errorf("%s: rxe %s, ours %s", f.name, f.value, v)
		}
	}
	for _, f := range got {
		if !fields[f.name] {
			t.Errorf("%s: ours %s, rxe has no such field", f.name, f.value)
		}
	}
	if t.Failed() {
		return
	}
	// The frame as it would be with rxe's identification.
	norm := append([]byte(nil), ours...)
	if !p.IPv6 {
		ip := roce.IPv4(norm[roce.EthernetLen:])
		ip.SetID(roce.IPv4(rxe[roce.EthernetLen:]).ID())
		ip.SetChecksum(ip.ComputeChecksum())
		binary.LittleEndian.PutUint32(norm[p.FrameLen()-roce.ICRCLen:], p.ComputeICRC(norm))
	}
	if !bytes.Equal(norm, rxe) {
		t.Errorf("with rxe's IPv4 identification, our frame still differs from rxe's:\nrxe:  %x\nours: %x", rxe, norm)
	}
}
