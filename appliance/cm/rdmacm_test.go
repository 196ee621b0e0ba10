package cm_test

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"

	"github.com/taproce/taproce/appliance/cm"
)

func TestServiceID(t *testing.T) {
	for _, c := range []struct {
		sid    cm.ServiceID
		ps     cm.PortSpace
		ok     bool
		port   uint16
		cma    bool // under the RDMA CM's IB_CMA_SERVICE_ID prefix
		string string
	}{
		{cm.RDMAServiceID(cm.PortSpaceTCP, 7174), cm.PortSpaceTCP, true, 7174, true, "0x0000000001061c06(TCP:7174)"}, // rping
		{cm.RDMAServiceID(cm.PortSpaceTCP, 18515), cm.PortSpaceTCP, true, 18515, true, "0x0000000001064853(TCP:18515)"},
		{cm.RDMAServiceID(cm.PortSpaceUDP, 7174), cm.PortSpaceUDP, true, 7174, true, "0x0000000001111c06(UDP:7174)"}, // udaddy
		{cm.RDMAServiceID(cm.PortSpaceIB, 1), cm.PortSpaceIB, true, 1, true, "0x00000000013f0001(IB:1)"},
		{cm.RDMAServiceID(cm.PortSpaceIPoIB, 65535), cm.PortSpaceIPoIB, true, 65535, false, "0x000000000002ffff(IPOIB:65535)"},
		{0x0000000001071c06, 0, false, 0x1c06, true, "0x0000000001071c06"},
		{0x0000000101061c06, 0, false, 0x1c06, false, "0x0000000101061c06"},
		{0x0200000000000001, 0, false, 1, false, "0x0200000000000001"}, // IB_CM_ASSIGN_SERVICE_ID
	} {
		ps, ok := c.sid.PortSpace()
		if ps != c.ps || ok != c.ok || c.sid.Port() != c.port || (c.sid&cm.ServiceIDCMAMask == cm.ServiceIDCMA) != c.cma || c.sid.String() != c.string {
			t.Errorf("%#x: port space %v %v, port %d, %q", uint64(c.sid), ps, ok, c.sid.Port(), c.sid.String())
		}
	}
	if cm.PortSpace(0x42).String() != "PS_0x42" {
		t.Errorf("unknown port space: %q", cm.PortSpace(0x42).String())
	}
}

func TestCMAHeader(t *testing.T) {
	// rping's REQ: 10.99.0.2:37174 > 10.99.0.3, as rxe sent it.
	wire := []byte{0x00, 0x40, 0x91, 0x36,
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 99, 0, 2,
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 99, 0, 3}
	h, err := cm.ParseCMAHeader(wire)
	if err != nil {
		t.Fatal(err)
	}
	want := cm.CMAHeader{Src: netip.MustParseAddrPort("10.99.0.2:37174"), Dst: netip.MustParseAddr("10.99.0.3")}
	if h != want {
		t.Errorf("parsed %+v, want %+v", h, want)
	}
	if d := h.Destination(cm.RDMAServiceID(cm.PortSpaceTCP, 7174)); d != netip.MustParseAddrPort("10.99.0.3:7174") {
		t.Errorf("destination %v", d)
	}
	buf := bytes.Repeat([]byte{0xEE}, cm.CMAHeaderLen)
	if err := want.Encode(buf); err != nil || !bytes.Equal(buf, wire) {
		t.Errorf("encoded %x, %v\n want %x", buf, err, wire)
	}

	for _, h := range []cm.CMAHeader{
		{Src: netip.MustParseAddrPort("[fd00::1]:1"), Dst: netip.MustParseAddr("fe80::5054:ff:fe63:3")},
		{Src: netip.MustParseAddrPort("[::ffff:10.0.0.1]:65535"), Dst: netip.MustParseAddr("10.0.0.2")},
		{Src: netip.MustParseAddrPort("0.0.0.0:0"), Dst: netip.MustParseAddr("255.255.255.255")},
	} {
		b := make([]byte, cm.REQPrivateDataLen)
		if err := h.Encode(b); err != nil {
			t.Fatalf("%+v: %v", h, err)
		}
		got, err := cm.ParseCMAHeader(b)
		want := h
		want.Src = netip.AddrPortFrom(h.Src.Addr().Unmap(), h.Src.Port())
		if err != nil || got != want {
			t.Errorf("%+v: parsed back %+v, %v", h, got, err)
		}
	}

	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"short", wire[:cm.CMAHeaderLen-1], cm.ErrCMAHeaderLength},
		{"version 1", append([]byte{1}, wire[1:]...), cm.ErrCMAVersion},
		{"IP version 5", append([]byte{0, 0x50}, wire[2:]...), cm.ErrCMAIPVersion},
		{"IP version 0 (AF_IB, no header)", make([]byte, cm.CMAHeaderLen), cm.ErrCMAIPVersion},
	} {
		if _, err := cm.ParseCMAHeader(c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	for _, h := range []cm.CMAHeader{
		{Src: netip.MustParseAddrPort("10.0.0.1:1"), Dst: netip.MustParseAddr("fd00::2")},
		{Src: netip.MustParseAddrPort("10.0.0.1:1")},
		{Dst: netip.MustParseAddr("10.0.0.1")},
	} {
		if err := h.Encode(make([]byte, cm.CMAHeaderLen)); !errors.Is(err, cm.ErrCMAAddress) {
			t.Errorf("%+v: %v, want ErrCMAAddress", h, err)
		}
	}
	if err := want.Encode(make([]byte, cm.CMAHeaderLen-1)); !errors.Is(err, cm.ErrBufferTooSmall) {
		t.Errorf("short buffer: %v", err)
	}
}
