package transport

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/internal/testvectors"
)

// gotMAD is one call of a GSIHandler.
type gotMAD struct {
	src, dst netip.Addr
	srcQPN   uint32
	pkey     uint16
	mad      []byte
}

// gsiRecorder returns a handler that records its calls into *got.
func gsiRecorder(got *[]gotMAD) GSIHandler {
	return func(src, dst netip.Addr, srcQPN uint32, pkey uint16, mad []byte) {
		*got = append(*got, gotMAD{src, dst, srcQPN, pkey, append([]byte(nil), mad...)})
	}
}

// testMAD returns a MAD whose bytes count from seed.
func testMAD(seed byte) []byte {
	m := make([]byte, MADSize)
	for i := range m {
		m[i] = seed + byte(i)
	}
	return m
}

// TestGSIExchange: a MAD one engine sends with SendMAD reaches the other's
// GSI handler with the sender's and receiver's addresses, source QP 1,
// the default P_Key and the MAD's bytes, both ways, over IPv4 and over
// the link-local IPv6 GIDs; QP1's PSN counts from 0, one a MAD.
func TestGSIExchange(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	var gotA, gotB []gotMAD
	s.a.eng.SetGSI(gsiRecorder(&gotA))
	s.b.eng.SetGSI(gsiRecorder(&gotB))
	var psns []roce.PSN
	s.a.watch = func(f []byte) { psns = append(psns, parsed(t, f).BTH.PSN) }
	llA, llB := roce.LinkLocalGID(s.a.mac).Addr(), roce.LinkLocalGID(s.b.mac).Addr()
	for i, c := range []struct {
		name     string
		from, to *simPort
		dst      netip.Addr
		src      netip.Addr // asked for; invalid: the engine picks
		wantSrc  netip.Addr
		got      *[]gotMAD
	}{
		{"A to B, IPv4", s.a, s.b, s.b.ip, netip.Addr{}, s.a.ip, &gotB},
		{"B to A, IPv4", s.b, s.a, s.a.ip, s.b.ip, s.b.ip, &gotA},
		{"A to B, IPv4-mapped", s.a, s.b, netip.AddrFrom16(s.b.ip.As16()), netip.AddrFrom16(s.a.ip.As16()), s.a.ip, &gotB},
		{"A to B, IPv6 link-local", s.a, s.b, llB, netip.Addr{}, llA, &gotB},
		{"B to A, IPv6 link-local", s.b, s.a, llA, llB, llB, &gotA},
	} {
		t.Run(c.name, func(t *testing.T) {
			*c.got = nil
			mad := testMAD(byte(i))
			if err := c.from.eng.SendMAD(c.src, c.dst, c.to.mac, mad); err != nil {
				t.Fatal(err)
			}
			s.run(100, func() bool { return len(*c.got) == 1 })
			g := (*c.got)[0]
			want := gotMAD{c.wantSrc, c.dst.Unmap(), GSIQPN, roce.DefaultPKey, mad}
			if g.src != want.src || g.dst != want.dst || g.srcQPN != want.srcQPN || g.pkey != want.pkey || !bytes.Equal(g.mad, want.mad) {
				t.Errorf("handler got %v→%v QP %d P_Key %#x MAD %x…; want %v→%v QP %d P_Key %#x MAD %x…",
					g.src, g.dst, g.srcQPN, g.pkey, g.mad[:8], want.src, want.dst, want.srcQPN, want.pkey, want.mad[:8])
			}
		})
	}
	for i, p := range psns {
		if p != roce.PSN(i) {
			t.Errorf("A's MADs carried PSNs %v, want 0, 1, …", psns)
			break
		}
	}
	for _, p := range []*simPort{s.a, s.b} {
		st := p.eng.Stats()
		if st.GSISent == 0 || st.GSIReceived == 0 || st.Dropped != 0 || st.GSISent != st.Sent || st.GSIReceived != st.Received {
			t.Errorf("%v: stats %+v", p.ip, st)
		}
	}
}

// TestGSIDrops: packets for QP1 that rxe's hdr_check would refuse, or
// whose payload is no MAD, never reach the handler and are counted by
// reason (and in Dropped); what rxe accepts — a SEND ONLY with immediate
// data, the limited-member default P_Key 0x7FFF, any source QP — does.
func TestGSIDrops(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	var good []byte
	s.a.watch = func(f []byte) { good = append([]byte(nil), f...) }
	must(t, s.a.eng.SendMAD(netip.Addr{}, s.b.ip, s.b.mac, testMAD(7)))
	tmpl := parsed(t, good)
	for _, c := range []struct {
		name    string
		edit    func(p *roce.Packet) // changes the good MAD's packet
		payload int                  // payload bytes, MADSize when 0
		nilGSI  bool                 // B has no handler
		reason  GSIDropReason        // NumGSIDropReasons: delivered
	}{
		{name: "good", reason: NumGSIDropReasons},
		{name: "SEND ONLY with immediate", edit: func(p *roce.Packet) { p.BTH.Opcode, p.Imm = roce.UDSendOnlyWithImmediate, 0x1234 }, reason: NumGSIDropReasons},
		{name: "limited-member default P_Key", edit: func(p *roce.Packet) { p.BTH.PKey = 0x7FFF }, reason: NumGSIDropReasons},
		{name: "from another QP", edit: func(p *roce.Packet) { p.DETH.SrcQP = 0x1234 }, reason: NumGSIDropReasons},
		{name: "no handler", nilGSI: true, reason: GSIDropNoHandler},
		{name: "no handler, bad Q_Key", nilGSI: true, edit: func(p *roce.Packet) { p.DETH.QKey = 1 }, reason: GSIDropNoHandler},
		{name: "RC SEND ONLY", edit: func(p *roce.Packet) { p.BTH.Opcode = roce.RCSendOnly }, reason: GSIDropOpcode},
		{name: "UC SEND ONLY", edit: func(p *roce.Packet) { p.BTH.Opcode = roce.UCSendOnly }, reason: GSIDropOpcode},
		{name: "RC ACKNOWLEDGE", edit: func(p *roce.Packet) { p.BTH.Opcode = roce.RCAcknowledge }, payload: -1, reason: GSIDropOpcode},
		{name: "P_Key 0x1234", edit: func(p *roce.Packet) { p.BTH.PKey = 0x1234 }, reason: GSIDropPKey},
		{name: "invalid P_Key 0x8000", edit: func(p *roce.Packet) { p.BTH.PKey = 0x8000 }, reason: GSIDropPKey},
		{name: "P_Key and Q_Key wrong", edit: func(p *roce.Packet) { p.BTH.PKey, p.DETH.QKey = 0x1234, 1 }, reason: GSIDropPKey},
		{name: "Q_Key 0x11111111", edit: func(p *roce.Packet) { p.DETH.QKey = 0x11111111 }, reason: GSIDropQKey},
		{name: "Q_Key 0", edit: func(p *roce.Packet) { p.DETH.QKey = 0 }, reason: GSIDropQKey},
		{name: "Q_Key with the high bit", edit: func(p *roce.Packet) { p.DETH.QKey = 0x80000000 }, reason: GSIDropQKey},
		{name: "255 bytes", payload: 255, reason: GSIDropLength},
		{name: "257 bytes", payload: 257, reason: GSIDropLength},
		{name: "empty", payload: -1, reason: GSIDropLength},
		{name: "1024 bytes", payload: 1024, reason: GSIDropLength},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := tmpl
			if c.edit != nil {
				c.edit(&p)
			}
			n := c.payload
			switch n {
			case 0:
				n = MADSize
			case -1:
				n = 0
			}
			payload := testMAD(7)
			if n > MADSize {
				payload = bytes.Repeat([]byte{7}, n)
			}
			buf := make([]byte, 2048)
			m, err := p.Build(buf, payload[:n])
			must(t, err)
			f := buf[:m]
			var got []gotMAD
			h := gsiRecorder(&got)
			if c.nilGSI {
				h = nil
			}
			s.b.eng.SetGSI(h)
			before := s.b.eng.Stats()
			var q roce.Packet
			must(t, roce.Parse(f, &q))
			must(t, q.VerifyICRC(f))
			s.b.eng.Receive(f, &q)
			d := s.b.eng.Stats()
			if c.reason == NumGSIDropReasons {
				if len(got) != 1 || d.GSIReceived != before.GSIReceived+1 || d.Dropped != before.Dropped {
					t.Fatalf("not delivered: %d calls, stats %+v", len(got), d)
				}
				if got[0].pkey != p.BTH.PKey || got[0].srcQPN != p.DETH.SrcQP || !bytes.Equal(got[0].mad, testMAD(7)) {
					t.Errorf("delivered %+v", got[0])
				}
				return
			}
			if len(got) != 0 {
				t.Errorf("the handler got it")
			}
			for r := range NumGSIDropReasons {
				want := before.GSIDropped[r]
				if r == c.reason {
					want++
				}
				if d.GSIDropped[r] != want {
					t.Errorf("drops %v: %d, want %d", r, d.GSIDropped[r], want)
				}
			}
			if d.Dropped != before.Dropped+1 || d.Received != before.Received+1 || d.Rejected != before.Rejected || d.GSIReceived != before.GSIReceived {
				t.Errorf("stats %+v, before %+v", d, before)
			}
		})
	}
}

// TestGSIRxeCaptures: every CM MAD of rxe's captures (shared/vectors
// rxe-cm-*.pcap), fed to an engine with the receiving host's MAC and
// GIDs, reaches its handler with the capture's addresses, source QP,
// P_Key and MAD bytes.
func TestGSIRxeCaptures(t *testing.T) {
	n := 0
	for _, file := range testvectors.Files(t) {
		if !strings.HasPrefix(file.Name, "rxe-cm-") {
			continue
		}
		for _, fr := range file.Frames {
			var p roce.Packet
			if roce.Parse(fr.Data, &p) != nil || p.BTH.DestQP != GSIQPN {
				continue
			}
			n++
			must(t, p.VerifyICRC(fr.Data))
			e := NewEngine(Config{MAC: p.DstMAC, GIDs: []roce.GID{roce.LinkLocalGID(p.DstMAC), roce.GIDFromAddr(p.Dst)}, Out: &simPort{}, MTU: 1500})
			var got []gotMAD
			e.SetGSI(gsiRecorder(&got))
			e.Receive(fr.Data, &p)
			if len(got) != 1 {
				t.Fatalf("%s: the MAD did not arrive: %+v", file.Name, e.Stats())
			}
			g := got[0]
			if g.src != p.Src || g.dst != p.Dst || g.srcQPN != 1 || g.pkey != 0xFFFF || !bytes.Equal(g.mad, p.Payload(fr.Data)) || len(g.mad) != MADSize {
				t.Errorf("%s: handler got %v→%v QP %d P_Key %#x, %d bytes", file.Name, g.src, g.dst, g.srcQPN, g.pkey, len(g.mad))
			}
		}
	}
	if n < 18 {
		t.Fatalf("only %d CM MADs in the captures", n)
	}
}

// TestGSIRxeFrames: a MAD SendMAD builds is rxe's frame, field by field
// and then byte by byte but for the IPv4 identification (compareRxeFrame):
// for every CM MAD of the captures, an engine with the sender's MAC and
// GIDs and QP1's PSN where rxe's was sends the captured MAD to the
// captured destination. So the UDP source port (0xD872), the BTH (AckReq
// set, P_Key 0xFFFF, DestQP 1), the DETH (Q_Key 0x80010000, source QP 1),
// TTL, DF and TOS are rxe's.
func TestGSIRxeFrames(t *testing.T) {
	n := 0
	for _, file := range testvectors.Files(t) {
		if !strings.HasPrefix(file.Name, "rxe-cm-") {
			continue
		}
		for _, fr := range file.Frames {
			var p roce.Packet
			if roce.Parse(fr.Data, &p) != nil || p.BTH.DestQP != GSIQPN {
				continue
			}
			n++
			port := &simPort{sim: &sim{t: t}, im: impair.New(impair.Spec{})}
			var ours [][]byte
			port.watch = func(f []byte) { ours = append(ours, append([]byte(nil), f...)) }
			port.peer = &simPort{}
			e := NewEngine(Config{MAC: p.SrcMAC, GIDs: []roce.GID{roce.LinkLocalGID(p.SrcMAC), roce.GIDFromAddr(p.Src)}, Out: port, MTU: rxeNetdevMTU})
			e.gsiPSN = p.BTH.PSN
			must(t, e.SendMAD(netip.Addr{}, p.Dst, p.DstMAC, p.Payload(fr.Data)))
			if len(ours) != 1 {
				t.Fatalf("%s: SendMAD sent %d frames", file.Name, len(ours))
			}
			compareRxeFrame(t, fr.Data, ours[0])
		}
	}
	if n < 18 {
		t.Fatalf("only %d CM MADs in the captures", n)
	}
}

// TestGSIIPv6Frame: over IPv6 a MAD leaves as rxe's would: flow label 0
// (rxe's prepare_ipv6_hdr writes no other), traffic class 0, hop limit
// 64, UDP source port 0xD872, and a good ICRC.
func TestGSIIPv6Frame(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	var f []byte
	s.a.watch = func(g []byte) { f = append([]byte(nil), g...) }
	dst := roce.LinkLocalGID(s.b.mac).Addr()
	must(t, s.a.eng.SendMAD(netip.Addr{}, dst, s.b.mac, testMAD(1)))
	p := parsed(t, f)
	must(t, p.VerifyICRC(f))
	if !p.IPv6 || p.FlowLabel != 0 || p.TOS != 0 || p.TTL != HopLimit || p.SrcPort != 0xD872 || p.Dst != dst ||
		p.BTH.Opcode != roce.UDSendOnly || p.BTH.DestQP != 1 || !p.BTH.AckReq || p.DETH != (roce.DETHFields{QKey: roce.GSIQKey, SrcQP: 1}) {
		t.Errorf("IPv6 MAD %+v", p)
	}
}

// TestSendMADErrors: SendMAD refuses a MAD that is not 256 bytes, a
// source that is none of the port's GIDs or not of the destination's
// family, and a destination it cannot send to; it sends nothing then.
func TestSendMADErrors(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	sent := 0
	s.a.watch = func([]byte) { sent++ }
	ll := roce.LinkLocalGID(s.a.mac).Addr()
	for _, c := range []struct {
		name     string
		src, dst netip.Addr
		mad      []byte
		want     error
	}{
		{"255 bytes", netip.Addr{}, s.b.ip, make([]byte, 255), ErrMADSize},
		{"257 bytes", netip.Addr{}, s.b.ip, make([]byte, 257), ErrMADSize},
		{"nil", netip.Addr{}, s.b.ip, nil, ErrMADSize},
		{"source not a GID", netip.MustParseAddr("10.55.0.9"), s.b.ip, testMAD(0), ErrMADAddress},
		{"IPv6 source, IPv4 destination", ll, s.b.ip, testMAD(0), ErrMADAddress},
		{"IPv4 source, IPv6 destination", s.a.ip, roce.LinkLocalGID(s.b.mac).Addr(), testMAD(0), ErrMADAddress},
		{"no destination", netip.Addr{}, netip.Addr{}, testMAD(0), ErrMADAddress},
		{"unspecified destination", netip.Addr{}, netip.IPv4Unspecified(), testMAD(0), ErrMADAddress},
		{"multicast destination", netip.Addr{}, netip.MustParseAddr("224.0.0.1"), testMAD(0), ErrMADAddress},
		{"no IPv6 GID but the link-local one", netip.Addr{}, netip.MustParseAddr("fd00::1"), testMAD(0), nil},
	} {
		err := s.a.eng.SendMAD(c.src, c.dst, s.b.mac, c.mad)
		if !errors.Is(err, c.want) || c.want != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if st := s.a.eng.Stats(); sent != 1 || st.GSISent != 1 {
		t.Errorf("%d frames sent, stats %+v; want the one MAD that was fine", sent, st)
	}
}

// TestGSISourcePick: without a source, a MAD to an IPv6 address off the
// link leaves from a GID that is not link-local, one to a link-local
// address from the link-local GID, one to IPv4 from the first IPv4 GID.
func TestGSISourcePick(t *testing.T) {
	mac := roce.MAC{2, 0, 0, 0, 0, 1}
	ll := roce.LinkLocalGID(mac)
	e := NewEngine(Config{MAC: mac, Out: &simPort{}, GIDs: []roce.GID{ll,
		roce.GIDFromAddr(netip.MustParseAddr("10.0.0.1")), roce.GIDFromAddr(netip.MustParseAddr("10.0.1.1")),
		roce.GIDFromAddr(netip.MustParseAddr("fd00::1"))}})
	for dst, want := range map[string]string{
		"10.9.9.9": "10.0.0.1", "fe80::99": ll.Addr().String(), "fd00::99": "fd00::1", "2001:db8::1": "fd00::1",
	} {
		got, err := e.gsiSource(netip.Addr{}, netip.MustParseAddr(dst))
		if err != nil || got.String() != want {
			t.Errorf("source for %s: %v, %v; want %s", dst, got, err, want)
		}
	}
}

// TestGSIZeroAllocs: sending a MAD and receiving it allocate nothing.
func TestGSIZeroAllocs(t *testing.T) {
	rp := newRingPair(t, 1<<12)
	calls := 0
	rp.b.eng.SetGSI(func(_, _ netip.Addr, _ uint32, _ uint16, mad []byte) { calls++ })
	mad := testMAD(3)
	if a := testing.AllocsPerRun(50, func() {
		_ = rp.a.eng.SendMAD(netip.Addr{}, rp.b.ip, rp.b.mac, mad)
		pump(rp.a, rp.b)
	}); a != 0 {
		t.Errorf("%v allocations a MAD", a)
	}
	if calls < 50 {
		t.Errorf("%d MADs received", calls)
	}
}

// TestGSIHandlerMaySend: the handler runs outside the engine's lock, so a
// manager may answer a MAD from within it, as the CM answers a REQ.
func TestGSIHandlerMaySend(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	var gotA []gotMAD
	s.a.eng.SetGSI(gsiRecorder(&gotA))
	s.b.eng.SetGSI(func(src, dst netip.Addr, _ uint32, _ uint16, mad []byte) {
		reply := append([]byte(nil), mad...)
		reply[0]++
		if err := s.b.eng.SendMAD(dst, src, s.a.mac, reply); err != nil {
			t.Error(err)
		}
	})
	must(t, s.a.eng.SendMAD(netip.Addr{}, s.b.ip, s.b.mac, testMAD(0)))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 100 && len(gotA) == 0 && s.step(); i++ {
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("deadlock: the handler's SendMAD never returned")
	}
	if len(gotA) != 1 || !bytes.Equal(gotA[0].mad, append([]byte{1}, testMAD(0)[1:]...)) {
		t.Errorf("replies %d", len(gotA))
	}
}
