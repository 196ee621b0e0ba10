package redirect_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/station"
)

// fakeResolver answers with a fixed MAC and records what it was asked.
type fakeResolver struct {
	mac   roce.MAC
	err   error
	asked []netip.Addr
}

func (f *fakeResolver) Resolve(_ context.Context, a netip.Addr) (roce.MAC, error) {
	f.asked = append(f.asked, a)
	return f.mac, f.err
}

var (
	podMAC  = roce.MAC{0x0a, 0x58, 0x0a, 0xf4, 0x00, 0x05}
	peerMAC = roce.MAC{0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x07}
	podIP   = netip.MustParseAddr("10.244.0.5")
	peerIP  = netip.MustParseAddr("10.244.1.7")
)

func arpRequestFor(target netip.Addr) []byte {
	f := make([]byte, 42)
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], peerMAC[:])
	binary.BigEndian.PutUint16(f[12:], roce.EtherTypeARP)
	a := f[14:]
	binary.BigEndian.PutUint16(a[0:], 1)
	binary.BigEndian.PutUint16(a[2:], roce.EtherTypeIPv4)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], 1)
	copy(a[8:14], peerMAC[:])
	s, tg := peerIP.As4(), target.As4()
	copy(a[14:18], s[:])
	copy(a[24:28], tg[:])
	return f
}

func echoRequestTo(dst netip.Addr) []byte {
	f := make([]byte, 14+20+8)
	copy(f[0:6], podMAC[:])
	copy(f[6:12], peerMAC[:])
	binary.BigEndian.PutUint16(f[12:], roce.EtherTypeIPv4)
	roce.IPv4(f[14:]).Encode(&roce.IPv4Fields{TotalLength: 28, TTL: 64, Protocol: 1, Src: peerIP, Dst: dst})
	icmp := f[34:]
	icmp[0] = 8
	var sum uint32
	for i := 0; i < len(icmp); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(icmp[i:]))
	}
	binary.BigEndian.PutUint16(icmp[2:], ^uint16(sum+sum>>16))
	return f
}

func roceFrame(t *testing.T) []byte {
	p := roce.Packet{
		DstMAC: podMAC, SrcMAC: peerMAC, Src: peerIP, Dst: podIP, TTL: 64,
		SrcPort: 0xC000, DstPort: roce.UDPPort,
		BTH: roce.BTHFields{Opcode: roce.RCSendOnly, PKey: 0xFFFF, DestQP: 0x42},
	}
	buf := make([]byte, 256)
	n, err := p.Build(buf, []byte("payload"))
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// TestSilentStation: with a Resolver, the station of a redirect-mode
// port leaves ARP and echo to the pod's kernel (the port's receive path
// takes RoCEv2 before the station sees it: TestRedirectPorts), never
// announces itself, and resolves through the Resolver.
func TestSilentStation(t *testing.T) {
	var sent int
	res := &fakeResolver{mac: peerMAC}
	st, err := station.New(station.Config{
		MAC:      podMAC,
		Addrs:    []netip.Prefix{netip.PrefixFrom(podIP, 24)},
		Send:     func([]byte) { sent++ },
		Resolver: res,
	})
	if err != nil {
		t.Fatal(err)
	}
	st.Announce()
	tests := []struct {
		name  string
		frame []byte
		want  station.Verdict
	}{
		{"ARP request for the pod's address", arpRequestFor(podIP), station.Dropped},
		{"echo request to the pod's address", echoRequestTo(podIP), station.Dropped},
		{"UDP to the pod's address", roceFrame(t), station.Dropped},
	}
	for _, tt := range tests {
		if got := st.Input(tt.frame); got != tt.want {
			t.Errorf("%s: verdict %v, want %v", tt.name, got, tt.want)
		}
	}
	if sent != 0 {
		t.Errorf("the silent station sent %d frames", sent)
	}
	mac, err := st.Resolve(context.Background(), netip.AddrFrom16(peerIP.As16()))
	if err != nil || mac != peerMAC || len(res.asked) != 1 || res.asked[0] != peerIP {
		t.Errorf("Resolve = %v, %v; resolver asked %v", mac, err, res.asked)
	}
	res.err = station.ErrUnresolved
	if _, err := st.Resolve(context.Background(), peerIP); !errors.Is(err, station.ErrUnresolved) {
		t.Errorf("Resolve error %v", err)
	}
	if s := st.Stats(); s.Drops[station.DropProtocol] != 3 {
		t.Errorf("stats %+v", s)
	}

	// The control: without a Resolver the same station answers both.
	replies := 0
	loud, err := station.New(station.Config{MAC: podMAC, Addrs: []netip.Prefix{netip.PrefixFrom(podIP, 24)}, Send: func([]byte) { replies++ }})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range [][]byte{arpRequestFor(podIP), echoRequestTo(podIP)} {
		if v := loud.Input(f); v != station.Consumed {
			t.Errorf("station without a resolver: verdict %v", v)
		}
	}
	if replies != 2 {
		t.Errorf("station without a resolver sent %d replies, want 2", replies)
	}
}
