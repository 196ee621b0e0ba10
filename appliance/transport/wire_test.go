package transport

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// parsed returns the packet of a frame the sim saw, failing the test when
// it does not parse.
func parsed(t *testing.T, f []byte) roce.Packet {
	t.Helper()
	var p roce.Packet
	if err := roce.Parse(f, &p); err != nil {
		t.Fatalf("a sent frame does not parse: %v", err)
	}
	return p
}

// TestHopLimit: whatever hop limit a connected QP's address vector asks
// for (0, the pingpong tools' 1, or any other), every packet of both
// sides leaves with TTL or hop limit 64, as rxe's do once ib_core has put
// the route's hop limit in its place; the traffic class and the IPv6 flow
// label are kept as given.
func TestHopLimit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ipv6   bool
		hop    uint8
		tclass uint8
		flow   uint32
	}{
		{"IPv4/hop 0", false, 0, 0, 0},
		{"IPv4/hop 1", false, 1, 0x68, 0},
		{"IPv4/hop 10", false, 10, 0, 0},
		{"IPv4/hop 255", false, 255, 0xb8, 0},
		{"IPv6/hop 1", true, 1, 0x68, 0x12345},
		{"IPv6/hop 10", true, 10, 0, 0},
		{"IPv6/hop 200", true, 200, 0x20, 0xfffff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, impair.Spec{}, 1500)
			av := func(peer *simPort) AddressVector {
				a := AddressVector{DstIP: peer.ip, DstMAC: peer.mac, SGIDIndex: 1, HopLimit: tc.hop, TClass: tc.tclass, FlowLabel: tc.flow}
				if tc.ipv6 {
					a.DstIP, a.SGIDIndex = roce.LinkLocalGID(peer.mac).Addr(), 0
				}
				return a
			}
			frames, bad := map[string]int{}, map[string]bool{}
			watch := func(side string) func([]byte) {
				return func(f []byte) {
					p := parsed(t, f)
					frames[side]++
					if !bad[side] && (p.TTL != 64 || p.TOS != tc.tclass || p.IPv6 != tc.ipv6 || tc.ipv6 && p.FlowLabel != tc.flow) {
						bad[side] = true
						t.Errorf("%s sent %v with TTL %d, traffic class %#x, IPv6 %v, flow label %#x; want TTL 64, %#x, %v, %#x",
							side, p.BTH.Opcode, p.TTL, p.TOS, p.IPv6, p.FlowLabel, tc.tclass, tc.ipv6, tc.flow)
					}
				}
			}
			s.a.watch, s.b.watch = watch("A"), watch("B")
			c := s.connect(connOpts{retry: 7, rnr: 7, av: av})
			if h := c.qa.Attr().AV.HopLimit; h != 64 {
				t.Errorf("Attr reports hop limit %d, want 64 as ibv_query_qp would", h)
			}
			_, err := c.qa.PostSend([]SendWR{
				{ID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 3000), RemoteAddr: base, RKey: c.mrb.RKey},
				{ID: 2, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 3000), RemoteAddr: base + 8192, RKey: c.mrb.RKey},
			})
			must(t, err)
			var wcs []WC
			s.run(10000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 2 })
			for _, wc := range wcs {
				if wc.Status != abi.WCSuccess {
					t.Fatalf("completion %+v (%v)", wc, wc.Status)
				}
			}
			if frames["A"] == 0 || frames["B"] == 0 {
				t.Fatalf("frames seen: %v", frames)
			}
		})
	}
}

// TestAddressHandleHopLimit: a UD send leaves with TTL or hop limit 64
// whatever its address handle asks for, with the handle's traffic class
// and IPv6 flow label.
func TestAddressHandleHopLimit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ipv6   bool
		hop    uint8
		tclass uint8
		flow   uint32
	}{
		{"IPv4/hop 0", false, 0, 0, 0},
		{"IPv4/hop 1", false, 1, 0x68, 0},
		{"IPv4/hop 10", false, 10, 0xb8, 0},
		{"IPv6/hop 1", true, 1, 0x68, 0xabcde},
		{"IPv6/hop 255", true, 255, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, impair.Spec{}, 1500)
			mk := func(p *simPort) (*QP, *CQ, *CQ, *MR) {
				pd := p.eng.Memory().NewPD()
				mr, err := p.eng.Memory().Register(pd, base, make([]byte, 8192), abi.AccessLocalWrite)
				must(t, err)
				scq, rcq := NewCQ(64, nil), NewCQ(64, nil)
				qp, err := p.eng.CreateQP(QPConfig{Type: abi.UD, PD: pd, SendCQ: scq, RecvCQ: rcq, MaxSendWR: 16, MaxRecvWR: 16})
				must(t, err)
				must(t, qp.Modify(&QPAttr{State: abi.QPSInit, Port: 1, QKey: 0x11111111}, abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPQKey))
				must(t, qp.Modify(&QPAttr{State: abi.QPSRTR}, abi.QPStateMask))
				must(t, qp.Modify(&QPAttr{State: abi.QPSRTS, SQPSN: 7}, abi.QPStateMask|abi.QPSQPSN))
				return qp, scq, rcq, mr
			}
			qa, scqa, _, mra := mk(s.a)
			qb, _, rcqb, mrb := mk(s.b)
			_, err := qb.PostRecv([]RecvWR{{ID: 1, SGL: []SGE{{Addr: base, Length: 1000, LKey: mrb.LKey}}}})
			must(t, err)
			ah := &AH{DstIP: s.b.ip.As16(), DstMAC: s.b.mac, SGIDIndex: 1, HopLimit: tc.hop, TClass: tc.tclass, FlowLabel: tc.flow}
			if tc.ipv6 {
				ah.DstIP, ah.SGIDIndex = roce.LinkLocalGID(s.b.mac), 0
			}
			var sent []roce.Packet
			s.a.watch = func(f []byte) { sent = append(sent, parsed(t, f)) }
			_, err = qa.PostSend([]SendWR{{ID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []SGE{{Addr: base, Length: 100, LKey: mra.LKey}},
				AH: ah, RemoteQPN: qb.Num(), RemoteQKey: 0x11111111}})
			must(t, err)
			var r []WC
			s.run(1000, func() bool { r = append(r, poll(rcqb)...); return len(r) == 1 })
			if r[0].Status != abi.WCSuccess || r[0].ByteLen != 140 {
				t.Fatalf("UD receive %+v", r[0])
			}
			if wc := poll(scqa); len(wc) != 1 || wc[0].Status != abi.WCSuccess {
				t.Fatalf("send completions %+v", wc)
			}
			if len(sent) != 1 {
				t.Fatalf("%d frames sent, want 1", len(sent))
			}
			if p := sent[0]; p.TTL != 64 || p.TOS != tc.tclass || p.IPv6 != tc.ipv6 || tc.ipv6 && p.FlowLabel != tc.flow {
				t.Fatalf("UD SEND with TTL %d, traffic class %#x, IPv6 %v, flow label %#x; want TTL 64, %#x, %v, %#x",
					p.TTL, p.TOS, p.IPv6, p.FlowLabel, tc.tclass, tc.ipv6, tc.flow)
			}
		})
	}
}

// TestPathMTULimit: a path MTU above the port's active MTU (the largest
// path MTU whose packets fit the netdev MTU less rxe's 80 header bytes)
// fails the move to RTR with ErrInvalid and leaves the QP in INIT; one
// within it is used exactly: every FIRST and MIDDLE packet of a WRITE and
// of a READ's responses carries the full path MTU, as the peer, told the
// same path MTU, requires.
func TestPathMTULimit(t *testing.T) {
	for _, tc := range []struct {
		netdev int
		pmtu   abi.MTU
		ok     bool
	}{
		{1500, abi.MTU256, true},
		{1500, abi.MTU1024, true},
		{1500, abi.MTU2048, false},
		{1500, abi.MTU4096, false},
		{2127, abi.MTU2048, false},
		{2128, abi.MTU2048, true},
		{4175, abi.MTU2048, true},
		{4175, abi.MTU4096, false},
		{4176, abi.MTU4096, true},
		{9000, abi.MTU4096, true},
	} {
		t.Run(fmt.Sprintf("netdev %d/path %d", tc.netdev, tc.pmtu.Bytes()), func(t *testing.T) {
			s := newSim(t, impair.Spec{}, tc.netdev)
			if !tc.ok {
				e := s.a.eng
				cq := NewCQ(4, nil)
				qp, err := e.CreateQP(QPConfig{Type: abi.RC, PD: e.Memory().NewPD(), SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
				must(t, err)
				must(t, qp.Modify(&QPAttr{State: abi.QPSInit, Port: 1}, abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPAccessFlags))
				rtr := QPAttr{State: abi.QPSRTR, AV: AddressVector{DstIP: s.b.ip, DstMAC: s.b.mac, SGIDIndex: 1},
					PathMTU: tc.pmtu, DestQPN: 0x42, MaxDestRdAtomic: 1, MinRNRTimer: 12}
				mask := abi.QPStateMask | abi.QPAV | abi.QPPathMTU | abi.QPDestQPN | abi.QPRQPSN | abi.QPMaxDestRdAtomic | abi.QPMinRNRTimer
				if err := qp.Modify(&rtr, mask); !errors.Is(err, ErrInvalid) {
					t.Fatalf("RTR with path MTU %d on netdev MTU %d: %v, want ErrInvalid", tc.pmtu.Bytes(), tc.netdev, err)
				}
				if st := qp.State(); st != abi.QPSInit {
					t.Fatalf("state %v after the refused RTR, want INIT", st)
				}
				rtr.PathMTU = abi.MTUForNetdev(tc.netdev)
				must(t, qp.Modify(&rtr, mask))
				return
			}
			pmtu := tc.pmtu.Bytes()
			sizes := map[roce.Opcode][]int{}
			watch := func(f []byte) {
				p := parsed(t, f)
				sizes[p.BTH.Opcode] = append(sizes[p.BTH.Opcode], p.PayloadLen)
			}
			s.a.watch, s.b.watch = watch, watch
			c := s.connect(connOpts{retry: 7, rnr: 7, pmtu: tc.pmtu})
			for i := range c.bufa[:4*pmtu] {
				c.bufa[i] = byte(i * 7)
				c.bufb[4*pmtu+i] = byte(i * 13)
			}
			n := 2*pmtu + 100
			_, err := c.qa.PostSend([]SendWR{
				{ID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, n), RemoteAddr: base, RKey: c.mrb.RKey},
				{ID: 2, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, SGL: sge(c.mra, 8*pmtu, n), RemoteAddr: base + uint64(4*pmtu), RKey: c.mrb.RKey},
			})
			must(t, err)
			var wcs []WC
			s.run(10000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 2 })
			for _, wc := range wcs {
				if wc.Status != abi.WCSuccess {
					t.Fatalf("completion %+v (%v)", wc, wc.Status)
				}
			}
			if !bytes.Equal(c.bufb[:n], c.bufa[:n]) || !bytes.Equal(c.bufa[8*pmtu:8*pmtu+n], c.bufb[4*pmtu:4*pmtu+n]) {
				t.Fatal("data differs")
			}
			for _, w := range []struct {
				op   roce.Opcode
				want []int
			}{
				{roce.RCRDMAWriteFirst, []int{pmtu}},
				{roce.RCRDMAWriteMiddle, []int{pmtu}},
				{roce.RCRDMAWriteLast, []int{100}},
				{roce.RCRDMAReadResponseFirst, []int{pmtu}},
				{roce.RCRDMAReadResponseMiddle, []int{pmtu}},
				{roce.RCRDMAReadResponseLast, []int{100}},
			} {
				if got := sizes[w.op]; fmt.Sprint(got) != fmt.Sprint(w.want) {
					t.Errorf("%v payloads %v, want %v", w.op, got, w.want)
				}
			}
		})
	}
}

// TestDuplicateCounters: duplicate requests count at the responder's
// engine, duplicate acknowledgements and responses at the requester's,
// each where it belongs: with every frame of one direction doubled, the
// receiving engine counts each second copy once, the other none.
func TestDuplicateCounters(t *testing.T) {
	for _, tc := range []struct {
		name     string
		requests bool // A's requests are doubled (else B's responses)
	}{
		{"requests doubled", true},
		{"responses doubled", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, impair.Spec{}, 1500)
			c := s.connect(connOpts{retry: 7, rnr: 7})
			doubled := s.b
			if tc.requests {
				doubled = s.a
			}
			doubled.im = impair.New(impair.Spec{Duplicate: 1, Seed: 1})
			var wrs []SendWR
			for i := range 12 {
				wr := SendWR{ID: uint64(i), Flags: abi.SendSignaled, RKey: c.mrb.RKey}
				switch i % 3 {
				case 0:
					wr.Opcode, wr.SGL, wr.RemoteAddr = abi.WRRDMAWrite, sge(c.mra, i*8192, 3000), base+uint64(i*8192)
				case 1:
					wr.Opcode, wr.SGL, wr.RemoteAddr = abi.WRRDMARead, sge(c.mra, i*8192, 2500), base+uint64(i*8192)
				case 2:
					wr.Opcode, wr.SGL, wr.RemoteAddr, wr.CompareAdd = abi.WRAtomicFetchAdd, sge(c.mra, i*8192, 8), base+0x80000, 1
				}
				wrs = append(wrs, wr)
			}
			_, err := c.qa.PostSend(wrs)
			must(t, err)
			var wcs []WC
			s.run(100000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == len(wrs) })
			for _, wc := range wcs {
				if wc.Status != abi.WCSuccess {
					t.Fatalf("completion %+v (%v)", wc, wc.Status)
				}
			}
			s.run(100000, func() bool { return len(s.a.inbox)+len(s.b.inbox) == 0 })
			if got := getUint64(c.bufb[0x80000:]); got != 4 {
				t.Fatalf("counter %d, want 4: an atomic ran twice", got)
			}
			sa, sb := s.a.eng.Stats(), s.b.eng.Stats()
			if sa.DuplicateRequests != 0 || sb.DuplicateResponses != 0 {
				t.Errorf("A counted %d duplicate requests, B %d duplicate responses; want none", sa.DuplicateRequests, sb.DuplicateResponses)
			}
			if tc.requests {
				if sb.DuplicateRequests != sa.Sent || sa.DuplicateResponses > sb.Sent {
					t.Errorf("A sent %d requests, B counted %d duplicate requests; A counted %d duplicate responses of B's %d",
						sa.Sent, sb.DuplicateRequests, sa.DuplicateResponses, sb.Sent)
				}
			} else if sa.DuplicateResponses != sb.Sent || sb.DuplicateRequests != 0 {
				t.Errorf("B sent %d responses, A counted %d duplicate responses; B counted %d duplicate requests",
					sb.Sent, sa.DuplicateResponses, sb.DuplicateRequests)
			}
		})
	}
}
