package cm

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// String formats m on one line, the key fields of its attribute as
// key=value in the style of `taproce decode`: the attribute (and the
// method when it is not Send), the transaction ID, the communication IDs
// (lcid, rcid) or SIDR request ID, the service ID with its RDMA CM port
// space and port, QPNs in hex, PSNs in decimal as the data packets' are
// printed, the CMA header's addresses (cma=src>dst), a REJ's reason by
// name. For example:
//
//	REQ tid=0x00000002106c28e6 lcid=0xe6286c10 sid=0x0000000001061c06(TCP:7174) qpn=0x00001f start_psn=1461740 …
func (m *Message) String() string {
	var b strings.Builder
	h := &m.Header
	b.WriteString(h.AttrID.String())
	if h.Method != MethodSend {
		b.WriteString(" " + h.Method.String())
	}
	fmt.Fprintf(&b, " tid=0x%016x", h.TID)
	if h.Status != 0 {
		fmt.Fprintf(&b, " status=0x%04x", h.Status)
	}
	ids := func(l, r uint32) { fmt.Fprintf(&b, " lcid=0x%08x rcid=0x%08x", l, r) }
	switch h.AttrID {
	case AttrREQ:
		f := &m.REQ
		fmt.Fprintf(&b, " lcid=0x%08x sid=%v qpn=0x%06x start_psn=%d %v", f.LocalCommID, f.ServiceID, f.LocalQPN, f.StartingPSN, f.TransportServiceType)
		if f.TransportServiceType == TransportExtended {
			fmt.Fprintf(&b, "(%d)", f.ExtendedTransportType)
		}
		if f.LocalQKey != 0 {
			fmt.Fprintf(&b, " qkey=0x%08x", f.LocalQKey)
		}
		fmt.Fprintf(&b, " mtu=%d resp_res=%d init_depth=%d cm_timeout=%d/%d retry=%d rnr_retry=%d max_cm_retries=%d",
			MTUBytes(f.PathMTU), f.ResponderResources, f.InitiatorDepth, f.RemoteCMResponseTimeout, f.LocalCMResponseTimeout,
			f.RetryCount, f.RNRRetryCount, f.MaxCMRetries)
		if f.SRQ {
			b.WriteString(" srq")
		}
		if f.PKey != 0xFFFF {
			fmt.Fprintf(&b, " pkey=0x%04x", f.PKey)
		}
		p := &f.Primary
		fmt.Fprintf(&b, " gid=%v>%v flow_label=0x%05x hop_limit=%d tclass=%d ack_timeout=%d guid=0x%016x",
			p.LocalGID.Addr(), p.RemoteGID.Addr(), p.FlowLabel, p.HopLimit, p.TrafficClass, p.LocalACKTimeout, f.LocalCAGUID)
		writeCMA(&b, f.ServiceID, f.PrivateData[:])
	case AttrREP:
		f := &m.REP
		ids(f.LocalCommID, f.RemoteCommID)
		fmt.Fprintf(&b, " qpn=0x%06x start_psn=%d", f.LocalQPN, f.StartingPSN)
		if f.LocalQKey != 0 {
			fmt.Fprintf(&b, " qkey=0x%08x", f.LocalQKey)
		}
		fmt.Fprintf(&b, " resp_res=%d init_depth=%d ack_delay=%d rnr_retry=%d", f.ResponderResources, f.InitiatorDepth, f.TargetACKDelay, f.RNRRetryCount)
		if f.SRQ {
			b.WriteString(" srq")
		}
		fmt.Fprintf(&b, " guid=0x%016x", f.LocalCAGUID)
	case AttrRTU:
		ids(m.RTU.LocalCommID, m.RTU.RemoteCommID)
	case AttrDREQ:
		ids(m.DREQ.LocalCommID, m.DREQ.RemoteCommID)
		fmt.Fprintf(&b, " qpn=0x%06x", m.DREQ.RemoteQPN)
	case AttrDREP:
		ids(m.DREP.LocalCommID, m.DREP.RemoteCommID)
	case AttrMRA:
		f := &m.MRA
		ids(f.LocalCommID, f.RemoteCommID)
		fmt.Fprintf(&b, " mraed=%v service_timeout=%d", f.MessageMRAed, f.ServiceTimeout)
	case AttrREJ:
		f := &m.REJ
		ids(f.LocalCommID, f.RemoteCommID)
		fmt.Fprintf(&b, " rejected=%v reason=%v(%d)", f.MessageRejected, f.Reason, uint16(f.Reason))
		if f.RejectInfoLength != 0 {
			fmt.Fprintf(&b, " ari=%x", f.AdditionalInfo())
		}
	case AttrSIDRReq:
		f := &m.SIDRReq
		fmt.Fprintf(&b, " req_id=0x%08x sid=%v", f.RequestID, f.ServiceID)
		if f.PKey != 0xFFFF {
			fmt.Fprintf(&b, " pkey=0x%04x", f.PKey)
		}
		writeCMA(&b, f.ServiceID, f.PrivateData[:])
	case AttrSIDRRep:
		f := &m.SIDRRep
		fmt.Fprintf(&b, " req_id=0x%08x status=%v qpn=0x%06x qkey=0x%08x sid=%v", f.RequestID, f.Status, f.QPN, f.QKey, f.ServiceID)
	case AttrClassPortInfo:
		f := &m.ClassPortInfo
		fmt.Fprintf(&b, " base_version=%d class_version=%d cap=0x%04x resp_time=%d", f.BaseVersion, f.ClassVersion, f.CapabilityMask, f.RespTimeValue)
		if f.RedirectQP != 0 {
			fmt.Fprintf(&b, " redirect=%v/0x%06x", f.RedirectGID.Addr(), f.RedirectQP)
		}
	case AttrLAP, AttrAPR: // the comm IDs lead both
		ids(binary.BigEndian.Uint32(m.Raw[0:4]), binary.BigEndian.Uint32(m.Raw[4:8]))
	}
	return b.String()
}

// writeCMA appends the CMA header of private data p when sid is an RDMA
// CM service ID: " cma=10.99.0.2:37174>10.99.0.3:7174", or " cma=invalid"
// when it does not parse.
func writeCMA(b *strings.Builder, sid ServiceID, p []byte) {
	if _, ok := sid.PortSpace(); !ok {
		return
	}
	h, err := ParseCMAHeader(p)
	if err != nil {
		b.WriteString(" cma=invalid")
		return
	}
	fmt.Fprintf(b, " cma=%v>%v", h.Src, h.Destination(sid))
}
