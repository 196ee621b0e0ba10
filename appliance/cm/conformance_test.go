package cm_test

import (
	"math/bits"
	"net/netip"
	"testing"

	"github.com/taproce/taproce/appliance/cm"
)

// cmFrames returns the CM MADs of a capture, in order.
func cmFrames(t *testing.T, name string) []frame {
	t.Helper()
	var r []frame
	for _, f := range capture(t, name) {
		if f.mad != nil {
			r = append(r, f)
		}
	}
	return r
}

// encode returns msg as a MAD.
func encode(t *testing.T, msg *cm.Message) []byte {
	t.Helper()
	b := make([]byte, cm.MADLen)
	if _, err := msg.Encode(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// checkTID checks that a message a manager started carries a transaction
// ID made as Linux makes one: its communication ID's bytes read
// little-endian in the low half.
func checkTID(t *testing.T, msg *cm.Message, commID uint32) {
	t.Helper()
	if uint32(msg.Header.TID) != bits.ReverseBytes32(commID) {
		t.Errorf("%v: TID 0x%016x for communication ID 0x%08x", msg.Header.AttrID, msg.Header.TID, commID)
	}
}

// TestConformanceActive: for every REQ rxe sent in the captures, a
// manager given the same connection's parameters (addresses, ports, QPN,
// PSN, resources) sends the same REQ — every field but the random
// communication ID, and a transaction ID made the same way; the captured
// REP, addressed to it, is answered with an RTU like the captured one;
// its DREQ is like rxe's.
func TestConformanceActive(t *testing.T) {
	for _, name := range []string{"rxe-cm-rping.pcap", "rxe-cm-write-bw.pcap"} {
		frames := cmFrames(t, name)
		for i, f := range frames {
			if f.m.Header.AttrID != cm.AttrREQ {
				continue
			}
			t.Run(name+"/REQ", func(t *testing.T) {
				capREQ := f.m.REQ
				var capREP, capRTU *cm.Message
				for j := range frames[i+1:] {
					g := &frames[i+1+j].m
					switch {
					case g.Header.AttrID == cm.AttrREP && g.REP.RemoteCommID == capREQ.LocalCommID && capREP == nil:
						capREP = g
					case g.Header.AttrID == cm.AttrRTU && g.RTU.LocalCommID == capREQ.LocalCommID && capRTU == nil:
						capRTU = g
					}
				}
				if capREP == nil || capRTU == nil {
					t.Fatal("no REP or RTU in the capture")
				}
				h, err := cm.ParseCMAHeader(capREQ.PrivateData[:])
				if err != nil {
					t.Fatal(err)
				}
				w := newNetwork(t, 20)
				a := w.add(f.p.Src, capREQ.LocalCAGUID, cm.Config{})
				a.on = serve(false)
				id, err := a.m.Connect(ownA, cm.ConnectParams{
					Local: h.Src, Remote: h.Destination(capREQ.ServiceID), PortSpace: cm.PortSpaceTCP, QPType: cm.QPTypeRC,
					QPN: capREQ.LocalQPN, StartingPSN: capREQ.StartingPSN,
					ResponderResources: capREQ.ResponderResources, InitiatorDepth: capREQ.InitiatorDepth,
					RetryCount: 7, RNRRetryCount: 7, PathMTU: 3,
				})
				if err != nil {
					t.Fatal(err)
				}
				sent := w.sent[len(w.sent)-1]
				if sent.src != f.p.Src || sent.dst != f.p.Dst {
					t.Errorf("REQ from %v to %v, captured from %v to %v", sent.src, sent.dst, f.p.Src, f.p.Dst)
				}
				req := sent.msg(t)
				lcid := req.REQ.LocalCommID
				checkTID(t, &req, lcid)
				checkTID(t, &f.m, capREQ.LocalCommID)
				got, want := req, f.m
				got.REQ.LocalCommID, got.Header.TID = want.REQ.LocalCommID, want.Header.TID
				if got != want {
					t.Errorf("REQ\n got %v\nwant %v\n got %+v\nwant %+v", &got, &want, got.REQ, want.REQ)
				}

				// The captured REP, to this REQ.
				rep := *capREP
				rep.Header.TID, rep.REP.RemoteCommID = req.Header.TID, lcid
				a.m.Receive(f.p.Dst, f.p.Src, encode(t, &rep))
				w.deliver()
				if a.state(id) != cm.StateEstablished {
					t.Fatalf("after the REP: %v, events %+v", a.state(id), a.events)
				}
				e := a.eventsOf(cm.EventConnectResponse)[0]
				if e.Param.QPN != capREP.REP.LocalQPN || e.Param.StartingPSN != capREP.REP.StartingPSN {
					t.Errorf("ConnectResponse %+v", e)
				}
				if i := a.info(id); i.SQPSN != capREP.REP.StartingPSN || i.RemoteQPN != capREP.REP.LocalQPN || i.AckTimeout != 19 {
					t.Errorf("info %+v", i)
				}
				rtu := w.last(cm.AttrRTU)
				wantRTU := *capRTU
				wantRTU.Header.TID, wantRTU.RTU.LocalCommID = req.Header.TID, lcid
				if rtu != wantRTU {
					t.Errorf("RTU\n got %v\nwant %v", &rtu, &wantRTU)
				}

				// The DREQ, as rxe's active side sends it.
				if err := a.m.Disconnect(id, nil); err != nil {
					t.Fatal(err)
				}
				dreq := w.last(cm.AttrDREQ)
				if dreq.Header.TID != req.Header.TID || dreq.DREQ.LocalCommID != lcid ||
					dreq.DREQ.RemoteCommID != capREP.REP.LocalCommID || dreq.DREQ.RemoteQPN != capREP.REP.LocalQPN {
					t.Errorf("DREQ %v", &dreq)
				}
				_ = a.m.Destroy(id)
				w.empty()
			})
		}
	}
}

// TestConformancePassive: a manager listening as rping's and
// ib_write_bw's servers do answers each REQ rxe captured with a REP like
// the captured one (all fields but the random communication ID; the
// REQ's transaction ID), takes the captured RTU, and answers the
// captured DREQ with a DREP like rxe's.
func TestConformancePassive(t *testing.T) {
	for _, name := range []string{"rxe-cm-rping.pcap", "rxe-cm-write-bw.pcap"} {
		frames := cmFrames(t, name)
		for i, f := range frames {
			if f.m.Header.AttrID != cm.AttrREQ {
				continue
			}
			t.Run(name+"/REQ", func(t *testing.T) {
				capREQ := f.m.REQ
				var capREP, capRTU, capDREQ, capDREP *cm.Message
				for j := range frames[i+1:] {
					g := &frames[i+1+j].m
					switch a := g.Header.AttrID; {
					case a == cm.AttrREP && g.REP.RemoteCommID == capREQ.LocalCommID:
						capREP = g
					case capREP == nil:
					case a == cm.AttrRTU && g.RTU.LocalCommID == capREQ.LocalCommID:
						capRTU = g
					case a == cm.AttrDREQ && g.DREQ.LocalCommID == capREQ.LocalCommID:
						capDREQ = g
					case a == cm.AttrDREP && capDREQ != nil && g.DREP.RemoteCommID == capREQ.LocalCommID && g.Header.TID == capDREQ.Header.TID:
						capDREP = g
					}
				}
				if capREP == nil || capRTU == nil {
					t.Fatal("no REP or RTU in the capture")
				}
				h, err := cm.ParseCMAHeader(capREQ.PrivateData[:])
				if err != nil {
					t.Fatal(err)
				}
				w := newNetwork(t, 21)
				b := w.add(f.p.Dst, capREP.REP.LocalCAGUID, cm.Config{})
				if _, err := b.m.Listen(ownB, cm.ListenParams{Port: capREQ.ServiceID.Port(), PortSpace: cm.PortSpaceTCP}); err != nil {
					t.Fatal(err)
				}
				b.on = func(n *node, e cm.Event) {
					if e.Type != cm.EventConnectRequest {
						return
					}
					if e.Remote != h.Src || e.Local != h.Destination(capREQ.ServiceID) || e.Param.QPN != capREQ.LocalQPN ||
						e.Param.StartingPSN != capREQ.StartingPSN || e.Param.ResponderResources != capREQ.InitiatorDepth {
						t.Errorf("ConnectRequest %+v", e)
					}
					r := capREP.REP
					if err := n.m.Accept(e.ID, cm.AcceptParams{QPN: r.LocalQPN, StartingPSN: r.StartingPSN,
						ResponderResources: r.ResponderResources, InitiatorDepth: r.InitiatorDepth, RNRRetryCount: r.RNRRetryCount}); err != nil {
						t.Error(err)
					}
				}
				b.m.Receive(f.p.Src, f.p.Dst, f.mad)
				sent := w.sent[len(w.sent)-1]
				if sent.src != f.p.Dst || sent.dst != f.p.Src {
					t.Errorf("REP from %v to %v", sent.src, sent.dst)
				}
				rep := sent.msg(t)
				lcid := rep.REP.LocalCommID
				got := rep
				got.REP.LocalCommID = capREP.REP.LocalCommID
				if got != *capREP {
					t.Errorf("REP\n got %v\nwant %v\n got %+v\nwant %+v", &got, capREP, got.REP, capREP.REP)
				}
				id := b.events[0].ID
				if i := b.info(id); i.SQPSN != capREQ.StartingPSN || i.RemoteQPN != capREQ.LocalQPN || i.AckTimeout != 19 {
					t.Errorf("info %+v", i)
				}

				rtu := *capRTU
				rtu.RTU.RemoteCommID = lcid
				b.m.Receive(f.p.Src, f.p.Dst, encode(t, &rtu))
				if b.state(id) != cm.StateEstablished || len(b.eventsOf(cm.EventEstablished)) != 1 {
					t.Fatalf("after the RTU: %v", b.state(id))
				}
				if capDREQ != nil && capDREP != nil {
					b.on = func(n *node, e cm.Event) {
						if e.Type == cm.EventDisconnected {
							if err := n.m.Disconnect(e.ID, nil); err != nil {
								t.Error(err)
							}
						}
					}
					dreq := *capDREQ
					dreq.DREQ.RemoteCommID = lcid
					b.m.Receive(f.p.Src, f.p.Dst, encode(t, &dreq))
					drep := w.last(cm.AttrDREP)
					want := *capDREP
					want.DREP.LocalCommID = lcid
					if drep != want {
						t.Errorf("DREP\n got %v\nwant %v", &drep, &want)
					}
					if b.state(id) != cm.StateTimeWait {
						t.Errorf("after the DREP: %v", b.state(id))
					}
				}
				b.m.CloseOwner(ownB)
				w.empty()
			})
		}
	}
}

// TestConformanceSIDR: udaddy's resolution. A manager resolving as the
// udaddy client sends the captured SIDR_REQ but for its request ID; one
// listening as the udaddy server answers the captured SIDR_REQ with the
// captured SIDR_REP, byte for byte.
func TestConformanceSIDR(t *testing.T) {
	frames := cmFrames(t, "rxe-cm-udaddy.pcap")
	capReq, capRep := frames[0], frames[1]
	h, err := cm.ParseCMAHeader(capReq.m.SIDRReq.PrivateData[:])
	if err != nil {
		t.Fatal(err)
	}
	w := newNetwork(t, 22)
	a := w.add(capReq.p.Src, guidA, cm.Config{})
	id, err := a.m.Resolve(ownA, cm.ResolveParams{Local: h.Src, Remote: h.Destination(capReq.m.SIDRReq.ServiceID), PortSpace: cm.PortSpaceUDP})
	if err != nil {
		t.Fatal(err)
	}
	req := w.last(cm.AttrSIDRReq)
	checkTID(t, &req, req.SIDRReq.RequestID)
	got := req
	got.SIDRReq.RequestID, got.Header.TID = capReq.m.SIDRReq.RequestID, capReq.m.Header.TID
	if got != capReq.m {
		t.Errorf("SIDR_REQ\n got %v\nwant %v", &got, &capReq.m)
	}
	rep := capRep.m
	rep.SIDRRep.RequestID, rep.Header.TID = req.SIDRReq.RequestID, req.Header.TID
	a.m.Receive(capReq.p.Dst, capReq.p.Src, encode(t, &rep))
	if es := a.eventsOf(cm.EventEstablished); len(es) != 1 || es[0].Param.QPN != 0x20 || es[0].Param.QKey != 0x01234567 {
		t.Errorf("A's events %+v", a.events)
	}
	_ = a.m.Destroy(id)

	b := w.add(capReq.p.Dst, guidB, cm.Config{})
	if _, err := b.m.Listen(ownB, cm.ListenParams{Port: 7174, PortSpace: cm.PortSpaceUDP}); err != nil {
		t.Fatal(err)
	}
	b.on = func(n *node, e cm.Event) {
		if e.Type == cm.EventConnectRequest {
			if e.Remote != h.Src || e.Local != netip.AddrPortFrom(capReq.p.Dst, 7174) {
				t.Errorf("ConnectRequest %+v", e)
			}
			if err := n.m.Accept(e.ID, cm.AcceptParams{QPN: capRep.m.SIDRRep.QPN}); err != nil {
				t.Error(err)
			}
		}
	}
	b.m.Receive(capReq.p.Src, capReq.p.Dst, capReq.mad)
	sent := w.sent[len(w.sent)-1]
	if string(sent.mad[:]) != string(capRep.mad) {
		got := sent.msg(t)
		t.Errorf("SIDR_REP\n got %v\nwant %v", &got, &capRep.m)
	}
	a.m.CloseOwner(ownA)
	b.m.CloseOwner(ownB)
	w.empty()
}
