package cm_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/appliance/roce"
)

var ones16 = roce.GID{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}

func fill[T ~[]byte](b T) {
	for i := range b {
		b[i] = 0xFF
	}
}

// layout is one field of the IBA tables (vol. 1 tables 106–120, 13.4.8.1):
// its place in the attribute data as byte offset, bit offset from that
// byte's most significant bit, and width in bits.
type layout struct {
	attr            cm.AttrID
	name            string
	set             func(*cm.Message) // sets the field to all ones of its Go type
	byteOff, bitOff int
	width           int
}

// path returns the rows of a REQ path's fields at byte offset o.
func path(name string, o int, p func(*cm.Message) *cm.PathFields) []layout {
	r := cm.AttrREQ
	return []layout{
		{r, name + ".LocalLID", func(m *cm.Message) { p(m).LocalLID = 0xFFFF }, o, 0, 16},
		{r, name + ".RemoteLID", func(m *cm.Message) { p(m).RemoteLID = 0xFFFF }, o + 2, 0, 16},
		{r, name + ".LocalGID", func(m *cm.Message) { p(m).LocalGID = ones16 }, o + 4, 0, 128},
		{r, name + ".RemoteGID", func(m *cm.Message) { p(m).RemoteGID = ones16 }, o + 20, 0, 128},
		{r, name + ".FlowLabel", func(m *cm.Message) { p(m).FlowLabel = ^uint32(0) }, o + 36, 0, 20},
		{r, name + ".PacketRate", func(m *cm.Message) { p(m).PacketRate = 0xFF }, o + 39, 2, 6},
		{r, name + ".TrafficClass", func(m *cm.Message) { p(m).TrafficClass = 0xFF }, o + 40, 0, 8},
		{r, name + ".HopLimit", func(m *cm.Message) { p(m).HopLimit = 0xFF }, o + 41, 0, 8},
		{r, name + ".SL", func(m *cm.Message) { p(m).SL = 0xFF }, o + 42, 0, 4},
		{r, name + ".SubnetLocal", func(m *cm.Message) { p(m).SubnetLocal = true }, o + 42, 4, 1},
		{r, name + ".LocalACKTimeout", func(m *cm.Message) { p(m).LocalACKTimeout = 0xFF }, o + 43, 0, 5},
	}
}

func layouts() []layout {
	const (
		req, mra, rej, rep, rtu = cm.AttrREQ, cm.AttrMRA, cm.AttrREJ, cm.AttrREP, cm.AttrRTU
		dreq, drep              = cm.AttrDREQ, cm.AttrDREP
		sreq, srep, cpi         = cm.AttrSIDRReq, cm.AttrSIDRRep, cm.AttrClassPortInfo
	)
	l := []layout{
		// Table 106, REQ.
		{req, "LocalCommID", func(m *cm.Message) { m.REQ.LocalCommID = ^uint32(0) }, 0, 0, 32},
		{req, "ServiceID", func(m *cm.Message) { m.REQ.ServiceID = ^cm.ServiceID(0) }, 8, 0, 64},
		{req, "LocalCAGUID", func(m *cm.Message) { m.REQ.LocalCAGUID = ^uint64(0) }, 16, 0, 64},
		{req, "LocalQKey", func(m *cm.Message) { m.REQ.LocalQKey = ^uint32(0) }, 28, 0, 32},
		{req, "LocalQPN", func(m *cm.Message) { m.REQ.LocalQPN = ^uint32(0) }, 32, 0, 24},
		{req, "ResponderResources", func(m *cm.Message) { m.REQ.ResponderResources = 0xFF }, 35, 0, 8},
		{req, "LocalEECN", func(m *cm.Message) { m.REQ.LocalEECN = ^uint32(0) }, 36, 0, 24},
		{req, "InitiatorDepth", func(m *cm.Message) { m.REQ.InitiatorDepth = 0xFF }, 39, 0, 8},
		{req, "RemoteEECN", func(m *cm.Message) { m.REQ.RemoteEECN = ^uint32(0) }, 40, 0, 24},
		{req, "RemoteCMResponseTimeout", func(m *cm.Message) { m.REQ.RemoteCMResponseTimeout = 0xFF }, 43, 0, 5},
		{req, "TransportServiceType", func(m *cm.Message) { m.REQ.TransportServiceType = 0xFF }, 43, 5, 2},
		{req, "EndToEndFlowControl", func(m *cm.Message) { m.REQ.EndToEndFlowControl = true }, 43, 7, 1},
		{req, "StartingPSN", func(m *cm.Message) { m.REQ.StartingPSN = ^roce.PSN(0) }, 44, 0, 24},
		{req, "LocalCMResponseTimeout", func(m *cm.Message) { m.REQ.LocalCMResponseTimeout = 0xFF }, 47, 0, 5},
		{req, "RetryCount", func(m *cm.Message) { m.REQ.RetryCount = 0xFF }, 47, 5, 3},
		{req, "PKey", func(m *cm.Message) { m.REQ.PKey = 0xFFFF }, 48, 0, 16},
		{req, "PathMTU", func(m *cm.Message) { m.REQ.PathMTU = 0xFF }, 50, 0, 4},
		{req, "RDCExists", func(m *cm.Message) { m.REQ.RDCExists = true }, 50, 4, 1},
		{req, "RNRRetryCount", func(m *cm.Message) { m.REQ.RNRRetryCount = 0xFF }, 50, 5, 3},
		{req, "MaxCMRetries", func(m *cm.Message) { m.REQ.MaxCMRetries = 0xFF }, 51, 0, 4},
		{req, "SRQ", func(m *cm.Message) { m.REQ.SRQ = true }, 51, 4, 1},
		{req, "ExtendedTransportType", func(m *cm.Message) { m.REQ.ExtendedTransportType = 0xFF }, 51, 5, 3},
		{req, "SAPSupported", func(m *cm.Message) { m.REQ.SAPSupported = true }, 139, 5, 1},
		{req, "PrivateData", func(m *cm.Message) { fill(m.REQ.PrivateData[:]) }, 140, 0, 92 * 8},
		// Table 107, MRA.
		{mra, "LocalCommID", func(m *cm.Message) { m.MRA.LocalCommID = ^uint32(0) }, 0, 0, 32},
		{mra, "RemoteCommID", func(m *cm.Message) { m.MRA.RemoteCommID = ^uint32(0) }, 4, 0, 32},
		{mra, "MessageMRAed", func(m *cm.Message) { m.MRA.MessageMRAed = 0xFF }, 8, 0, 2},
		{mra, "ServiceTimeout", func(m *cm.Message) { m.MRA.ServiceTimeout = 0xFF }, 9, 0, 5},
		{mra, "PrivateData", func(m *cm.Message) { fill(m.MRA.PrivateData[:]) }, 10, 0, 222 * 8},
		// Table 108, REJ.
		{rej, "LocalCommID", func(m *cm.Message) { m.REJ.LocalCommID = ^uint32(0) }, 0, 0, 32},
		{rej, "RemoteCommID", func(m *cm.Message) { m.REJ.RemoteCommID = ^uint32(0) }, 4, 0, 32},
		{rej, "MessageRejected", func(m *cm.Message) { m.REJ.MessageRejected = 0xFF }, 8, 0, 2},
		{rej, "RejectInfoLength", func(m *cm.Message) { m.REJ.RejectInfoLength = 0xFF }, 9, 0, 7},
		{rej, "Reason", func(m *cm.Message) { m.REJ.Reason = 0xFFFF }, 10, 0, 16},
		{rej, "ARI", func(m *cm.Message) { fill(m.REJ.ARI[:]) }, 12, 0, 72 * 8},
		{rej, "PrivateData", func(m *cm.Message) { fill(m.REJ.PrivateData[:]) }, 84, 0, 148 * 8},
		// Table 110, REP.
		{rep, "LocalCommID", func(m *cm.Message) { m.REP.LocalCommID = ^uint32(0) }, 0, 0, 32},
		{rep, "RemoteCommID", func(m *cm.Message) { m.REP.RemoteCommID = ^uint32(0) }, 4, 0, 32},
		{rep, "LocalQKey", func(m *cm.Message) { m.REP.LocalQKey = ^uint32(0) }, 8, 0, 32},
		{rep, "LocalQPN", func(m *cm.Message) { m.REP.LocalQPN = ^uint32(0) }, 12, 0, 24},
		{rep, "LocalEECN", func(m *cm.Message) { m.REP.LocalEECN = ^uint32(0) }, 16, 0, 24},
		{rep, "StartingPSN", func(m *cm.Message) { m.REP.StartingPSN = ^roce.PSN(0) }, 20, 0, 24},
		{rep, "ResponderResources", func(m *cm.Message) { m.REP.ResponderResources = 0xFF }, 24, 0, 8},
		{rep, "InitiatorDepth", func(m *cm.Message) { m.REP.InitiatorDepth = 0xFF }, 25, 0, 8},
		{rep, "TargetACKDelay", func(m *cm.Message) { m.REP.TargetACKDelay = 0xFF }, 26, 0, 5},
		{rep, "FailoverAccepted", func(m *cm.Message) { m.REP.FailoverAccepted = 0xFF }, 26, 5, 2},
		{rep, "EndToEndFlowControl", func(m *cm.Message) { m.REP.EndToEndFlowControl = true }, 26, 7, 1},
		{rep, "RNRRetryCount", func(m *cm.Message) { m.REP.RNRRetryCount = 0xFF }, 27, 0, 3},
		{rep, "SRQ", func(m *cm.Message) { m.REP.SRQ = true }, 27, 3, 1},
		{rep, "LocalCAGUID", func(m *cm.Message) { m.REP.LocalCAGUID = ^uint64(0) }, 28, 0, 64},
		{rep, "PrivateData", func(m *cm.Message) { fill(m.REP.PrivateData[:]) }, 36, 0, 196 * 8},
		// Tables 111–113, RTU, DREQ, DREP.
		{rtu, "LocalCommID", func(m *cm.Message) { m.RTU.LocalCommID = ^uint32(0) }, 0, 0, 32},
		{rtu, "RemoteCommID", func(m *cm.Message) { m.RTU.RemoteCommID = ^uint32(0) }, 4, 0, 32},
		{rtu, "PrivateData", func(m *cm.Message) { fill(m.RTU.PrivateData[:]) }, 8, 0, 224 * 8},
		{dreq, "LocalCommID", func(m *cm.Message) { m.DREQ.LocalCommID = ^uint32(0) }, 0, 0, 32},
		{dreq, "RemoteCommID", func(m *cm.Message) { m.DREQ.RemoteCommID = ^uint32(0) }, 4, 0, 32},
		{dreq, "RemoteQPN", func(m *cm.Message) { m.DREQ.RemoteQPN = ^uint32(0) }, 8, 0, 24},
		{dreq, "PrivateData", func(m *cm.Message) { fill(m.DREQ.PrivateData[:]) }, 12, 0, 220 * 8},
		{drep, "LocalCommID", func(m *cm.Message) { m.DREP.LocalCommID = ^uint32(0) }, 0, 0, 32},
		{drep, "RemoteCommID", func(m *cm.Message) { m.DREP.RemoteCommID = ^uint32(0) }, 4, 0, 32},
		{drep, "PrivateData", func(m *cm.Message) { fill(m.DREP.PrivateData[:]) }, 8, 0, 224 * 8},
		// Tables 119, 120, SIDR_REQ and SIDR_REP.
		{sreq, "RequestID", func(m *cm.Message) { m.SIDRReq.RequestID = ^uint32(0) }, 0, 0, 32},
		{sreq, "PKey", func(m *cm.Message) { m.SIDRReq.PKey = 0xFFFF }, 4, 0, 16},
		{sreq, "ServiceID", func(m *cm.Message) { m.SIDRReq.ServiceID = ^cm.ServiceID(0) }, 8, 0, 64},
		{sreq, "PrivateData", func(m *cm.Message) { fill(m.SIDRReq.PrivateData[:]) }, 16, 0, 216 * 8},
		{srep, "RequestID", func(m *cm.Message) { m.SIDRRep.RequestID = ^uint32(0) }, 0, 0, 32},
		{srep, "Status", func(m *cm.Message) { m.SIDRRep.Status = 0xFF }, 4, 0, 8},
		{srep, "AdditionalInfoLength", func(m *cm.Message) { m.SIDRRep.AdditionalInfoLength = 0xFF }, 5, 0, 8},
		{srep, "QPN", func(m *cm.Message) { m.SIDRRep.QPN = ^uint32(0) }, 8, 0, 24},
		{srep, "ServiceID", func(m *cm.Message) { m.SIDRRep.ServiceID = ^cm.ServiceID(0) }, 12, 0, 64},
		{srep, "QKey", func(m *cm.Message) { m.SIDRRep.QKey = ^uint32(0) }, 20, 0, 32},
		{srep, "AdditionalInfo", func(m *cm.Message) { fill(m.SIDRRep.AdditionalInfo[:]) }, 24, 0, 72 * 8},
		{srep, "PrivateData", func(m *cm.Message) { fill(m.SIDRRep.PrivateData[:]) }, 96, 0, 136 * 8},
		// 13.4.8.1, ClassPortInfo.
		{cpi, "BaseVersion", func(m *cm.Message) { m.ClassPortInfo.BaseVersion = 0xFF }, 0, 0, 8},
		{cpi, "ClassVersion", func(m *cm.Message) { m.ClassPortInfo.ClassVersion = 0xFF }, 1, 0, 8},
		{cpi, "CapabilityMask", func(m *cm.Message) { m.ClassPortInfo.CapabilityMask = 0xFFFF }, 2, 0, 16},
		{cpi, "CapabilityMask2", func(m *cm.Message) { m.ClassPortInfo.CapabilityMask2 = ^uint32(0) }, 4, 0, 27},
		{cpi, "RespTimeValue", func(m *cm.Message) { m.ClassPortInfo.RespTimeValue = 0xFF }, 7, 3, 5},
		{cpi, "RedirectGID", func(m *cm.Message) { m.ClassPortInfo.RedirectGID = ones16 }, 8, 0, 128},
		{cpi, "RedirectTC", func(m *cm.Message) { m.ClassPortInfo.RedirectTC = 0xFF }, 24, 0, 8},
		{cpi, "RedirectSL", func(m *cm.Message) { m.ClassPortInfo.RedirectSL = 0xFF }, 25, 0, 4},
		{cpi, "RedirectFL", func(m *cm.Message) { m.ClassPortInfo.RedirectFL = ^uint32(0) }, 25, 4, 20},
		{cpi, "RedirectLID", func(m *cm.Message) { m.ClassPortInfo.RedirectLID = 0xFFFF }, 28, 0, 16},
		{cpi, "RedirectPKey", func(m *cm.Message) { m.ClassPortInfo.RedirectPKey = 0xFFFF }, 30, 0, 16},
		{cpi, "RedirectQP", func(m *cm.Message) { m.ClassPortInfo.RedirectQP = ^uint32(0) }, 33, 0, 24},
		{cpi, "RedirectQKey", func(m *cm.Message) { m.ClassPortInfo.RedirectQKey = ^uint32(0) }, 36, 0, 32},
		{cpi, "TrapGID", func(m *cm.Message) { m.ClassPortInfo.TrapGID = ones16 }, 40, 0, 128},
		{cpi, "TrapTC", func(m *cm.Message) { m.ClassPortInfo.TrapTC = 0xFF }, 56, 0, 8},
		{cpi, "TrapSL", func(m *cm.Message) { m.ClassPortInfo.TrapSL = 0xFF }, 57, 0, 4},
		{cpi, "TrapFL", func(m *cm.Message) { m.ClassPortInfo.TrapFL = ^uint32(0) }, 57, 4, 20},
		{cpi, "TrapLID", func(m *cm.Message) { m.ClassPortInfo.TrapLID = 0xFFFF }, 60, 0, 16},
		{cpi, "TrapPKey", func(m *cm.Message) { m.ClassPortInfo.TrapPKey = 0xFFFF }, 62, 0, 16},
		{cpi, "TrapHL", func(m *cm.Message) { m.ClassPortInfo.TrapHL = 0xFF }, 64, 0, 8},
		{cpi, "TrapQP", func(m *cm.Message) { m.ClassPortInfo.TrapQP = ^uint32(0) }, 65, 0, 24},
		{cpi, "TrapQKey", func(m *cm.Message) { m.ClassPortInfo.TrapQKey = ^uint32(0) }, 68, 0, 32},
	}
	l = append(l, path("Primary", 52, func(m *cm.Message) *cm.PathFields { return &m.REQ.Primary })...)
	l = append(l, path("Alternate", 96, func(m *cm.Message) *cm.PathFields { return &m.REQ.Alternate })...)
	return l
}

// TestLayout sets each field alone to all ones (of its Go type, so wider
// than the field) and checks that exactly the field's bits of the IBA
// table are set in the encoded attribute data, that parsing gives the
// field back cut to its width, and that encoding that gives the same
// bytes.
func TestLayout(t *testing.T) {
	covered := map[cm.AttrID]int{}
	for _, l := range layouts() {
		m := cm.Message{Header: cm.NewHeader(l.attr, 1)}
		if l.attr == cm.AttrClassPortInfo {
			m.Header.Method = cm.MethodGetResp
		}
		l.set(&m)
		buf := make([]byte, cm.MADLen)
		if _, err := m.Encode(buf); err != nil {
			t.Fatalf("%v %s: %v", l.attr, l.name, err)
		}
		data := buf[cm.MADHeaderLen:]
		start := l.byteOff*8 + l.bitOff
		for bit := 0; bit < cm.DataLen*8; bit++ {
			set := data[bit/8]>>(7-bit%8)&1 != 0
			if want := bit >= start && bit < start+l.width; set != want {
				t.Errorf("%v %s: bit %d (byte %d bit %d) is %v, want %v", l.attr, l.name, bit, bit/8, bit%8, set, want)
				break
			}
		}
		var p cm.Message
		if err := cm.Parse(buf, &p); err != nil {
			t.Fatalf("%v %s: Parse: %v", l.attr, l.name, err)
		}
		again := make([]byte, cm.MADLen)
		if _, err := p.Encode(again); err != nil || !bytes.Equal(again, buf) {
			t.Errorf("%v %s: parsed and encoded again differs (%v)", l.attr, l.name, err)
		}
		covered[l.attr] += l.width
	}
	// Every bit of each attribute's fields is accounted for: the widths
	// add up to the attribute's length less its reserved bits.
	reserved := map[cm.AttrID]int{
		cm.AttrREQ:           32 + 32 + 2*(6+3+3) - 1, // after lcid, after the GUID; per path, of which SAP takes one
		cm.AttrMRA:           6 + 3,
		cm.AttrREJ:           6 + 1,
		cm.AttrREP:           3*8 + 4,
		cm.AttrRTU:           0,
		cm.AttrDREQ:          8,
		cm.AttrDREP:          0,
		cm.AttrSIDRReq:       16,
		cm.AttrSIDRRep:       16 + 8,
		cm.AttrClassPortInfo: 8 + (cm.DataLen-cm.ClassPortInfoLen)*8,
	}
	for a, r := range reserved {
		if covered[a]+r != cm.DataLen*8 {
			t.Errorf("%v: fields cover %d bits and %d are reserved, of %d", a, covered[a], r, cm.DataLen*8)
		}
	}
}

// randomMessage returns a message of attribute a with every field at a
// random value within its width.
func randomMessage(r *rand.Rand, a cm.AttrID) cm.Message {
	u8 := func(bits uint) uint8 { return uint8(r.Uint32() & (1<<bits - 1)) }
	u16 := func() uint16 { return uint16(r.Uint32()) }
	u24 := func() uint32 { return r.Uint32() & 0xFFFFFF }
	b := func() bool { return r.IntN(2) == 1 }
	gid := func() (g roce.GID) {
		for i := range g {
			g[i] = byte(r.Uint32())
		}
		return g
	}
	bytesOf := func(p []byte) {
		for i := range p {
			p[i] = byte(r.Uint32())
		}
	}
	pathOf := func() cm.PathFields {
		return cm.PathFields{LocalLID: u16(), RemoteLID: u16(), LocalGID: gid(), RemoteGID: gid(),
			FlowLabel: r.Uint32() & 0xFFFFF, PacketRate: u8(6), TrafficClass: u8(8), HopLimit: u8(8),
			SL: u8(4), SubnetLocal: b(), LocalACKTimeout: u8(5)}
	}
	m := cm.Message{Header: cm.NewHeader(a, r.Uint64())}
	m.Header.Status, m.Header.ClassSpecific, m.Header.AttrMod = u16(), u16(), r.Uint32()
	switch a {
	case cm.AttrREQ:
		m.REQ = cm.REQFields{LocalCommID: r.Uint32(), ServiceID: cm.ServiceID(r.Uint64()), LocalCAGUID: r.Uint64(),
			LocalQKey: r.Uint32(), LocalQPN: u24(), ResponderResources: u8(8), LocalEECN: u24(), InitiatorDepth: u8(8),
			RemoteEECN: u24(), RemoteCMResponseTimeout: u8(5), TransportServiceType: cm.TransportType(u8(2)),
			EndToEndFlowControl: b(), StartingPSN: roce.PSN(u24()), LocalCMResponseTimeout: u8(5), RetryCount: u8(3),
			PKey: u16(), PathMTU: u8(4), RDCExists: b(), RNRRetryCount: u8(3), MaxCMRetries: u8(4), SRQ: b(),
			ExtendedTransportType: u8(3), Primary: pathOf(), Alternate: pathOf(), SAPSupported: b()}
		bytesOf(m.REQ.PrivateData[:])
	case cm.AttrMRA:
		m.MRA = cm.MRAFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32(), MessageMRAed: cm.MessageKind(u8(2)), ServiceTimeout: u8(5)}
		bytesOf(m.MRA.PrivateData[:])
	case cm.AttrREJ:
		m.REJ = cm.REJFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32(), MessageRejected: cm.MessageKind(u8(2)),
			RejectInfoLength: u8(7), Reason: cm.RejectReason(u16())}
		bytesOf(m.REJ.ARI[:])
		bytesOf(m.REJ.PrivateData[:])
	case cm.AttrREP:
		m.REP = cm.REPFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32(), LocalQKey: r.Uint32(), LocalQPN: u24(),
			LocalEECN: u24(), StartingPSN: roce.PSN(u24()), ResponderResources: u8(8), InitiatorDepth: u8(8),
			TargetACKDelay: u8(5), FailoverAccepted: u8(2), EndToEndFlowControl: b(), RNRRetryCount: u8(3), SRQ: b(),
			LocalCAGUID: r.Uint64()}
		bytesOf(m.REP.PrivateData[:])
	case cm.AttrRTU:
		m.RTU = cm.RTUFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32()}
		bytesOf(m.RTU.PrivateData[:])
	case cm.AttrDREQ:
		m.DREQ = cm.DREQFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32(), RemoteQPN: u24()}
		bytesOf(m.DREQ.PrivateData[:])
	case cm.AttrDREP:
		m.DREP = cm.DREPFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32()}
		bytesOf(m.DREP.PrivateData[:])
	case cm.AttrSIDRReq:
		m.SIDRReq = cm.SIDRReqFields{RequestID: r.Uint32(), PKey: u16(), ServiceID: cm.ServiceID(r.Uint64())}
		bytesOf(m.SIDRReq.PrivateData[:])
	case cm.AttrSIDRRep:
		m.SIDRRep = cm.SIDRRepFields{RequestID: r.Uint32(), Status: cm.SIDRStatus(u8(8)), AdditionalInfoLength: u8(8),
			QPN: u24(), ServiceID: cm.ServiceID(r.Uint64()), QKey: r.Uint32()}
		bytesOf(m.SIDRRep.AdditionalInfo[:])
		bytesOf(m.SIDRRep.PrivateData[:])
	case cm.AttrClassPortInfo:
		m.Header.Method = []cm.Method{cm.MethodGet, cm.MethodSet, cm.MethodGetResp}[r.IntN(3)]
		m.ClassPortInfo = cm.ClassPortInfoFields{BaseVersion: u8(8), ClassVersion: u8(8), CapabilityMask: u16(),
			CapabilityMask2: r.Uint32() & (1<<27 - 1), RespTimeValue: u8(5), RedirectGID: gid(), RedirectTC: u8(8),
			RedirectSL: u8(4), RedirectFL: r.Uint32() & 0xFFFFF, RedirectLID: u16(), RedirectPKey: u16(), RedirectQP: u24(),
			RedirectQKey: r.Uint32(), TrapGID: gid(), TrapTC: u8(8), TrapSL: u8(4), TrapFL: r.Uint32() & 0xFFFFF,
			TrapLID: u16(), TrapPKey: u16(), TrapHL: u8(8), TrapQP: u24(), TrapQKey: r.Uint32()}
	case cm.AttrLAP, cm.AttrAPR:
		bytesOf(m.Raw[:])
	}
	return m
}

var allAttrs = []cm.AttrID{cm.AttrClassPortInfo, cm.AttrREQ, cm.AttrMRA, cm.AttrREJ, cm.AttrREP, cm.AttrRTU,
	cm.AttrDREQ, cm.AttrDREP, cm.AttrSIDRReq, cm.AttrSIDRRep, cm.AttrLAP, cm.AttrAPR}

// TestRoundTrip: a message of every attribute with random in-range values
// encodes and parses back to itself.
func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, a := range allAttrs {
		for i := 0; i < 50; i++ {
			m := randomMessage(r, a)
			buf := make([]byte, cm.MADLen+10)
			n, err := m.Encode(buf)
			if err != nil || n != cm.MADLen {
				t.Fatalf("%v: Encode = %d, %v", a, n, err)
			}
			var p cm.Message
			if err := cm.Parse(buf[:n], &p); err != nil {
				t.Fatalf("%v: Parse: %v", a, err)
			}
			if p != m {
				t.Fatalf("%v: round trip\n got %+v\nwant %+v", a, p, m)
			}
			if s := p.String(); len(s) < len(a.String()) || s[:len(a.String())] != a.String() {
				t.Errorf("%v: String %q", a, s)
			}
		}
	}
}

// TestParseErrors: malformed MADs give the sentinel errors, never a panic,
// and the header whenever the length is right.
func TestParseErrors(t *testing.T) {
	good := make([]byte, cm.MADLen)
	m := cm.Message{Header: cm.NewHeader(cm.AttrREQ, 0x1234)}
	if _, err := m.Encode(good); err != nil {
		t.Fatal(err)
	}
	with := func(off int, v ...byte) []byte {
		b := append([]byte(nil), good...)
		copy(b[off:], v)
		return b
	}
	for _, c := range []struct {
		name string
		mad  []byte
		want error
	}{
		{"empty", nil, cm.ErrLength},
		{"short", good[:cm.MADLen-1], cm.ErrLength},
		{"header only", good[:cm.MADHeaderLen], cm.ErrLength},
		{"long", append(append([]byte(nil), good...), 0), cm.ErrLength},
		{"base version 2", with(0, 2), cm.ErrBaseVersion},
		{"subnet administration class", with(1, 0x03), cm.ErrClass},
		{"class version 1", with(2, 1), cm.ErrClassVersion},
		{"class version 3", with(2, 3), cm.ErrClassVersion},
		{"unknown attribute", with(16, 0x00, 0x42), cm.ErrAttribute},
		{"attribute 0", with(16, 0x00, 0x00), cm.ErrAttribute},
		{"REQ with Get", with(3, byte(cm.MethodGet)), cm.ErrMethod},
		{"REQ as a response", with(3, byte(cm.MethodSend|cm.MethodResponse)), cm.ErrMethod},
		{"ClassPortInfo with Send", with(16, 0x00, 0x01), cm.ErrMethod},
	} {
		var got cm.Message
		err := cm.Parse(c.mad, &got)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
			continue
		}
		if len(c.mad) == cm.MADLen && got.Header != cm.MAD(c.mad).Header() {
			t.Errorf("%s: header %+v not filled", c.name, got.Header)
		}
	}

	var enc cm.Message
	enc.Header.AttrID = 0x42
	if _, err := enc.Encode(make([]byte, cm.MADLen)); !errors.Is(err, cm.ErrAttribute) {
		t.Errorf("Encode of attribute 0x42: %v", err)
	}
	if _, err := m.Encode(make([]byte, cm.MADLen-1)); !errors.Is(err, cm.ErrBufferTooSmall) {
		t.Errorf("Encode into 255 bytes: %v", err)
	}
}

func TestNames(t *testing.T) {
	for _, c := range []struct {
		got  fmt.Stringer
		want string
	}{
		{cm.RejInvalidServiceID, "INVALID_SERVICE_ID"},
		{cm.RejConsumerDefined, "CONSUMER_DEFINED"},
		{cm.RejNoQP, "NO_QP"},
		{cm.RejInvalidAltFlowLabel, "INVALID_ALT_FLOW_LABEL"},
		{cm.RejVendorOptionNotSupported, "VENDOR_OPTION_NOT_SUPPORTED"},
		{cm.RejectReason(34), "REASON_34"},
		{cm.RejectReason(0), "REASON_0"},
		{cm.RejectReason(60000), "REASON_60000"},
		{cm.AttrSIDRReq, "SIDR_REQ"},
		{cm.AttrClassPortInfo, "ClassPortInfo"},
		{cm.AttrID(0x42), "Attr(0x0042)"},
		{cm.MethodGetResp, "GetResp"},
		{cm.Method(0x7f), "Method(0x7f)"},
		{cm.SIDRSuccess, "SUCCESS"},
		{cm.SIDRStatus(9), "STATUS_9"},
		{cm.TransportUC, "UC"},
		{cm.MessageREP, "REP"},
		{cm.MessageKind(3), "3"},
	} {
		if s := c.got.String(); s != c.want {
			t.Errorf("%#v: %q, want %q", c.got, s, c.want)
		}
	}
	for r := cm.RejectReason(1); r <= 33; r++ {
		if !r.Known() {
			t.Errorf("reason %d unknown", r)
		}
	}
}

func TestTimeoutAndMTU(t *testing.T) {
	for _, c := range []struct {
		code uint8
		want time.Duration
	}{
		{0, 4096 * time.Nanosecond},
		{19, 2147483648 * time.Nanosecond},
		{20, 4294967296 * time.Nanosecond}, // rxe's CM response timeout, ≈4.3 s
		{24, 68719476736 * time.Nanosecond},
		{31, 8796093022208 * time.Nanosecond},
		{32, 4096 * time.Nanosecond},
	} {
		if got := cm.Timeout(c.code); got != c.want {
			t.Errorf("Timeout(%d) = %v, want %v", c.code, got, c.want)
		}
	}
	for code, want := range []int{0, 256, 512, 1024, 2048, 4096, 0} {
		if got := cm.MTUBytes(uint8(code)); got != want {
			t.Errorf("MTUBytes(%d) = %d, want %d", code, got, want)
		}
	}
}
