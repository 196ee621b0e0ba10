package cm_test

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/testvectors"
)

// frame is one RoCE frame of a capture, parsed, with its CM message when it
// carries one.
type frame struct {
	n   int // 1-based frame number
	p   roce.Packet
	mad []byte // the MAD, when cm.IsGSI
	m   cm.Message
}

// capture returns the RoCE frames of the rxe capture name, every GSI one
// parsed as a CM MAD.
func capture(t *testing.T, name string) []frame {
	t.Helper()
	for _, f := range testvectors.Files(t) {
		if f.Name != name {
			continue
		}
		var out []frame
		for i, fr := range f.Frames {
			x := frame{n: i + 1}
			if err := roce.Parse(fr.Data, &x.p); err != nil {
				continue
			}
			if cm.IsGSI(&x.p) {
				x.mad = x.p.Payload(fr.Data)
				if err := cm.Parse(x.mad, &x.m); err != nil {
					t.Fatalf("%s frame %d: %v", name, x.n, err)
				}
			}
			out = append(out, x)
		}
		return out
	}
	t.Fatalf("no capture %s", name)
	return nil
}

var cmCaptures = []struct {
	name  string
	attrs []cm.AttrID // the CM MADs in order, as INDEX.txt counts them
}{
	{"rxe-cm-rping.pcap", []cm.AttrID{cm.AttrREQ, cm.AttrREP, cm.AttrRTU, cm.AttrDREQ, cm.AttrDREP}},
	{"rxe-cm-udaddy.pcap", []cm.AttrID{cm.AttrSIDRReq, cm.AttrSIDRRep}},
	{"rxe-cm-write-bw.pcap", []cm.AttrID{cm.AttrREQ, cm.AttrREP, cm.AttrRTU, cm.AttrREQ, cm.AttrREP, cm.AttrRTU,
		cm.AttrDREQ, cm.AttrDREQ, cm.AttrDREP, cm.AttrDREQ, cm.AttrDREP}},
}

// TestVectors: every CM MAD of the rxe captures parses, as the attribute
// INDEX.txt names, and encoding the parsed message gives its bytes back.
func TestVectors(t *testing.T) {
	for _, c := range cmCaptures {
		t.Run(c.name, func(t *testing.T) {
			var attrs []cm.AttrID
			for _, f := range capture(t, c.name) {
				if f.mad == nil {
					if f.p.BTH.DestQP == cm.GSIQPN {
						t.Errorf("frame %d: to QP1 but not a GSI MAD: %+v", f.n, f.p.BTH)
					}
					continue
				}
				attrs = append(attrs, f.m.Header.AttrID)
				buf := bytes.Repeat([]byte{0xA5}, cm.MADLen) // Encode must clear what it does not set
				n, err := f.m.Encode(buf)
				if err != nil || n != cm.MADLen {
					t.Fatalf("frame %d: Encode = %d, %v", f.n, n, err)
				}
				if !bytes.Equal(buf, f.mad) {
					t.Errorf("frame %d (%v): re-encoded MAD differs\n got %x\nwant %x", f.n, f.m.Header.AttrID, buf, f.mad)
				}
				h := f.m.Header
				if h.BaseVersion != 1 || h.MgmtClass != 7 || h.ClassVersion != 2 || h.Method != cm.MethodSend || h.Status != 0 || h.AttrMod != 0 {
					t.Errorf("frame %d: header %+v", f.n, h)
				}
			}
			if len(attrs) != len(c.attrs) {
				t.Fatalf("CM MADs %v, want %v", attrs, c.attrs)
			}
			for i := range attrs {
				if attrs[i] != c.attrs[i] {
					t.Errorf("CM MAD %d is %v, want %v", i, attrs[i], c.attrs[i])
				}
			}
		})
	}
}

// TestVectorFields checks the fields of the captured MADs against what
// Wireshark (tshark 4.0.17) shows of them, field by field for rping's REQ
// and REP. Wireshark shows the REQ's primary flow label as 0x001b1 and
// the packet rate as 0x1b; the flow label is the top 20 bits of the word
// (0x1b190), as TestVectorsAgainstData confirms from the UDP source port
// both sides then use.
func TestVectorFields(t *testing.T) {
	rping := capture(t, "rxe-cm-rping.pcap")
	req := rping[0].m.REQ
	var cmaPriv [cm.REQPrivateDataLen]byte
	cma := cm.CMAHeader{Src: netip.MustParseAddrPort("10.99.0.2:37174"), Dst: netip.MustParseAddr("10.99.0.3")}
	if err := cma.Encode(cmaPriv[:]); err != nil {
		t.Fatal(err)
	}
	wantREQ := cm.REQFields{
		LocalCommID: 0xe6286c10, ServiceID: 0x0000000001061c06, LocalCAGUID: 0x505400fffe630002,
		LocalQPN: 0x1f, ResponderResources: 1, InitiatorDepth: 1,
		RemoteCMResponseTimeout: 20, TransportServiceType: cm.TransportRC,
		StartingPSN: 0x164dec, LocalCMResponseTimeout: 20, RetryCount: 7,
		PKey: 0xffff, PathMTU: 3, RNRRetryCount: 7, MaxCMRetries: 15,
		Primary: cm.PathFields{
			LocalLID: 0xffff, RemoteLID: 0xffff,
			LocalGID:  roce.GIDFromAddr(netip.MustParseAddr("::ffff:10.99.0.2")),
			RemoteGID: roce.GIDFromAddr(netip.MustParseAddr("::ffff:10.99.0.3")),
			FlowLabel: 0x1b190, HopLimit: 64, LocalACKTimeout: 19,
		},
		PrivateData: cmaPriv,
	}
	if req != wantREQ {
		t.Errorf("rping REQ\n got %+v\nwant %+v", req, wantREQ)
	}
	wantREP := cm.REPFields{
		LocalCommID: 0xc2ebc219, RemoteCommID: 0xe6286c10, LocalQPN: 0x1f, StartingPSN: 0xeef1a7,
		ResponderResources: 1, InitiatorDepth: 1, TargetACKDelay: 15, RNRRetryCount: 7,
		LocalCAGUID: 0x505400fffe630003,
	}
	if rep := rping[1].m.REP; rep != wantREP {
		t.Errorf("rping REP\n got %+v\nwant %+v", rep, wantREP)
	}

	// The key fields of every MAD: (local, remote) comm IDs, or the SIDR
	// request ID as local; the service ID; a QPN (REQ/REP: local, DREQ:
	// remote, SIDR_REP: the service's); a starting PSN.
	type key struct {
		tid        uint64
		lcid, rcid uint32
		sid        cm.ServiceID
		qpn        uint32
		psn        roce.PSN
	}
	keyOf := func(m *cm.Message) key {
		k := key{tid: m.Header.TID}
		switch m.Header.AttrID {
		case cm.AttrREQ:
			k.lcid, k.sid, k.qpn, k.psn = m.REQ.LocalCommID, m.REQ.ServiceID, m.REQ.LocalQPN, m.REQ.StartingPSN
		case cm.AttrREP:
			k.lcid, k.rcid, k.qpn, k.psn = m.REP.LocalCommID, m.REP.RemoteCommID, m.REP.LocalQPN, m.REP.StartingPSN
		case cm.AttrRTU:
			k.lcid, k.rcid = m.RTU.LocalCommID, m.RTU.RemoteCommID
		case cm.AttrDREQ:
			k.lcid, k.rcid, k.qpn = m.DREQ.LocalCommID, m.DREQ.RemoteCommID, m.DREQ.RemoteQPN
		case cm.AttrDREP:
			k.lcid, k.rcid = m.DREP.LocalCommID, m.DREP.RemoteCommID
		case cm.AttrSIDRReq:
			k.lcid, k.sid = m.SIDRReq.RequestID, m.SIDRReq.ServiceID
		case cm.AttrSIDRRep:
			k.lcid, k.sid, k.qpn = m.SIDRRep.RequestID, m.SIDRRep.ServiceID, m.SIDRRep.QPN
		}
		return k
	}
	for _, c := range []struct {
		file  string
		frame int
		want  key
	}{
		{"rxe-cm-rping.pcap", 1, key{0x2106c28e6, 0xe6286c10, 0, 0x0000000001061c06, 0x1f, 0x164dec}},
		{"rxe-cm-rping.pcap", 2, key{0x2106c28e6, 0xc2ebc219, 0xe6286c10, 0, 0x1f, 0xeef1a7}},
		{"rxe-cm-rping.pcap", 3, key{0x2106c28e6, 0xe6286c10, 0xc2ebc219, 0, 0, 0}},
		{"rxe-cm-rping.pcap", 40, key{0x2106c28e6, 0xe6286c10, 0xc2ebc219, 0, 0x1f, 0}},
		{"rxe-cm-rping.pcap", 41, key{0x2106c28e6, 0xc2ebc219, 0xe6286c10, 0, 0, 0}},
		{"rxe-cm-write-bw.pcap", 1, key{0x2106c28e4, 0xe4286c10, 0, 0x0000000001064853, 0x1d, 0xad6aad}},
		{"rxe-cm-write-bw.pcap", 2, key{0x2106c28e4, 0xc6ebc219, 0xe4286c10, 0, 0x1d, 0xbd6879}},
		{"rxe-cm-write-bw.pcap", 3, key{0x2106c28e4, 0xe4286c10, 0xc6ebc219, 0, 0, 0}},
		{"rxe-cm-write-bw.pcap", 24, key{0x2106c28e5, 0xe5286c10, 0, 0x0000000001064853, 0x1e, 0x8c3641}},
		{"rxe-cm-write-bw.pcap", 25, key{0x2106c28e5, 0xc4ebc219, 0xe5286c10, 0, 0x1e, 0x1a8b10}},
		{"rxe-cm-write-bw.pcap", 26, key{0x2106c28e5, 0xe5286c10, 0xc4ebc219, 0, 0, 0}},
		// The two sides' DREQs of the second connection cross (81, 82);
		// the server answers the client's (83), the client never the
		// server's.
		{"rxe-cm-write-bw.pcap", 81, key{0x2106c28e5, 0xe5286c10, 0xc4ebc219, 0, 0x1e, 0}},
		{"rxe-cm-write-bw.pcap", 82, key{0x219c2ebc4, 0xc4ebc219, 0xe5286c10, 0, 0x1e, 0}},
		{"rxe-cm-write-bw.pcap", 83, key{0x2106c28e5, 0xc4ebc219, 0xe5286c10, 0, 0, 0}},
		{"rxe-cm-write-bw.pcap", 84, key{0x219c2ebc6, 0xc6ebc219, 0xe4286c10, 0, 0x1d, 0}},
		{"rxe-cm-write-bw.pcap", 85, key{0x219c2ebc6, 0xe4286c10, 0xc6ebc219, 0, 0, 0}},
		{"rxe-cm-udaddy.pcap", 1, key{0x2106c28e7, 0xe7286c10, 0, 0x0000000001111c06, 0, 0}},
		{"rxe-cm-udaddy.pcap", 2, key{0x2106c28e7, 0xe7286c10, 0, 0x0000000001111c06, 0x20, 0}},
	} {
		var got *frame
		for _, f := range capture(t, c.file) {
			if f.n == c.frame {
				got = &f
			}
		}
		if got == nil || got.mad == nil {
			t.Errorf("%s frame %d: no CM MAD", c.file, c.frame)
			continue
		}
		if k := keyOf(&got.m); k != c.want {
			t.Errorf("%s frame %d (%v):\n got %#v\nwant %#v", c.file, c.frame, got.m.Header.AttrID, k, c.want)
		}
	}

	// Every REQ of rxe's: the same CM parameters (the RDMA CM's defaults
	// on RoCE: CM response timeouts 20, 15 CM retries, path MTU 1024 on
	// this 1500-byte link, hop limit 64, local ACK timeout 19).
	for _, name := range []string{"rxe-cm-rping.pcap", "rxe-cm-write-bw.pcap"} {
		for _, f := range capture(t, name) {
			if f.mad == nil || f.m.Header.AttrID != cm.AttrREQ {
				continue
			}
			r := &f.m.REQ
			if r.RemoteCMResponseTimeout != 20 || r.LocalCMResponseTimeout != 20 || r.MaxCMRetries != 15 ||
				r.RetryCount != 7 || r.RNRRetryCount != 7 || cm.MTUBytes(r.PathMTU) != 1024 ||
				r.Primary.HopLimit != 64 || r.Primary.LocalACKTimeout != 19 || r.TransportServiceType != cm.TransportRC {
				t.Errorf("%s frame %d: REQ %+v", name, f.n, r)
			}
		}
	}
	sidr := capture(t, "rxe-cm-udaddy.pcap")
	if rep := sidr[1].m.SIDRRep; rep.Status != cm.SIDRSuccess || rep.QKey != 0x01234567 {
		t.Errorf("udaddy SIDR_REP %+v", rep)
	}
}

// TestVectorsAgainstData checks what the CM MADs say against what the
// data packets that follow them do, which no dissector of ours decides:
// each side's first request goes to the QPN the peer's REQ or REP named,
// with the starting PSN the peer's message named (the REQ's PSN is the
// passive side's first, the REP's the active side's); both directions'
// UDP source port comes from the REQ's primary flow label; the GIDs and
// the CMA header name the frame's addresses; a SIDR_REP's QPN and Q_Key
// are those the UD SENDs that follow go to.
func TestVectorsAgainstData(t *testing.T) {
	for _, name := range []string{"rxe-cm-rping.pcap", "rxe-cm-write-bw.pcap"} {
		frames := capture(t, name)
		conns := 0
		for i, f := range frames {
			if f.mad == nil || f.m.Header.AttrID != cm.AttrREQ {
				continue
			}
			req := &f.m.REQ
			active, passive := f.p.Src, f.p.Dst
			if g := req.Primary.LocalGID.Addr(); g != active {
				t.Errorf("%s frame %d: primary local GID %v, frame from %v", name, f.n, g, active)
			}
			if g := req.Primary.RemoteGID.Addr(); g != passive {
				t.Errorf("%s frame %d: primary remote GID %v, frame to %v", name, f.n, g, passive)
			}
			h, err := cm.ParseCMAHeader(req.PrivateData[:])
			if err != nil {
				t.Fatalf("%s frame %d: CMA header: %v", name, f.n, err)
			}
			if h.Src.Addr() != active || h.Dst != passive {
				t.Errorf("%s frame %d: CMA header %+v, frame %v > %v", name, f.n, h, active, passive)
			}
			// Linux (cma_get_roce_udp_flow_label) hashes the RDMA CM's
			// ports into the flow label of an IPv4 connection.
			if fl := (uint32(h.Src.Port())*31 + uint32(req.ServiceID.Port())) & 0xFFFFF; fl != req.Primary.FlowLabel {
				t.Errorf("%s frame %d: flow label 0x%05x, ports hash to 0x%05x", name, f.n, req.Primary.FlowLabel, fl)
			}
			var rep *cm.REPFields
			for _, g := range frames[i+1:] {
				if g.mad != nil && g.m.Header.AttrID == cm.AttrREP && g.m.REP.RemoteCommID == req.LocalCommID {
					rep = &g.m.REP
					break
				}
			}
			if rep == nil {
				t.Fatalf("%s frame %d: no REP", name, f.n)
			}
			// The first request each way on the connection.
			sport := roce.SourcePortFromFlowLabel(req.Primary.FlowLabel)
			for _, dir := range []struct {
				from    netip.Addr
				qpn     uint32
				psn     roce.PSN
				comment string
				must    bool // ib_write_bw's test QP sends one way only
			}{
				{active, rep.LocalQPN, rep.StartingPSN, "active side's first request (REP's QPN and PSN)", true},
				{passive, req.LocalQPN, req.StartingPSN, "passive side's first request (REQ's QPN and PSN)", conns == 0},
			} {
				found := false
				for _, g := range frames[i+1:] {
					if g.mad != nil || g.p.Src != dir.from || g.p.BTH.DestQP != dir.qpn || !g.p.Info().Has(roce.Request) {
						continue
					}
					if g.p.BTH.PSN != dir.psn {
						t.Errorf("%s frame %d, %s: PSN %d, want %d", name, g.n, dir.comment, g.p.BTH.PSN, dir.psn)
					}
					if g.p.SrcPort != sport {
						t.Errorf("%s frame %d, %s: UDP source port %d, flow label 0x%05x gives %d", name, g.n, dir.comment, g.p.SrcPort, req.Primary.FlowLabel, sport)
					}
					found = true
					break
				}
				if !found && dir.must {
					t.Errorf("%s: no %s", name, dir.comment)
				}
			}
			conns++
		}
		if conns == 0 {
			t.Errorf("%s: no connection", name)
		}
	}

	frames := capture(t, "rxe-cm-udaddy.pcap")
	req, rep := &frames[0].m.SIDRReq, &frames[1].m.SIDRRep
	if rep.RequestID != req.RequestID || rep.ServiceID != req.ServiceID {
		t.Errorf("SIDR_REP %+v does not answer SIDR_REQ %+v", rep, req)
	}
	h, err := cm.ParseCMAHeader(req.PrivateData[:])
	if err != nil || h.Src.Addr() != frames[0].p.Src || h.Dst != frames[0].p.Dst {
		t.Errorf("SIDR_REQ CMA header %+v, %v; frame %v > %v", h, err, frames[0].p.Src, frames[0].p.Dst)
	}
	sends := 0
	for _, f := range frames[2:] {
		if f.p.BTH.Opcode == roce.UDSendOnlyWithImmediate {
			sends++
			if f.p.BTH.DestQP != rep.QPN || f.p.DETH.QKey != rep.QKey {
				t.Errorf("frame %d: UD SEND to QP 0x%x Q_Key 0x%x; SIDR_REP said 0x%x, 0x%x", f.n, f.p.BTH.DestQP, f.p.DETH.QKey, rep.QPN, rep.QKey)
			}
		}
	}
	if sends != 5 {
		t.Errorf("%d UD SENDs after the SIDR exchange, want 5", sends)
	}
}
