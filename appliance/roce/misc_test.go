package roce_test

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/taproce/taproce/appliance/roce"
)

func TestPSN(t *testing.T) {
	const max = roce.PSN(roce.PSNMask)
	adds := []struct {
		p    roce.PSN
		n    int
		want roce.PSN
	}{
		{0, 1, 1},
		{max, 1, 0},
		{max - 2, 5, 2},
		{0, -1, max},
		{3, -5, max - 1},
		{100, 1 << 24, 100},
	}
	for _, a := range adds {
		if got := a.p.Add(a.n); got != a.want {
			t.Errorf("%#x.Add(%d) = %#x, want %#x", a.p, a.n, got, a.want)
		}
	}
	if max.Next() != 0 {
		t.Errorf("max.Next() = %#x", max.Next())
	}
	diffs := []struct {
		p, q roce.PSN
		want int
	}{
		{5, 3, 2},
		{3, 5, -2},
		{0, max, 1},
		{max, 0, -1},
		{1 << 23, 0, -(1 << 23)}, // exactly half: counted as before (rxe)
		{0, 1 << 23, -(1 << 23)}, // … from either side
		{1<<23 - 1, 0, 1<<23 - 1},
		{1<<23 + 1, 0, -(1<<23 - 1)},
	}
	for _, d := range diffs {
		if got := d.p.Diff(d.q); got != d.want {
			t.Errorf("%#x.Diff(%#x) = %d, want %d", d.p, d.q, got, d.want)
		}
		if d.p.Before(d.q) != (d.want < 0) || d.p.After(d.q) != (d.want > 0) {
			t.Errorf("%#x vs %#x: Before/After disagree with Diff %d", d.p, d.q, d.want)
		}
	}
	betweens := []struct {
		p, lo, hi roce.PSN
		want      bool
	}{
		{5, 5, 6, true},
		{6, 5, 6, false},
		{5, 5, 5, false},
		{0, max, 2, true},
		{max, max - 1, 1, true},
		{2, max, 2, false},
	}
	for _, b := range betweens {
		if got := b.p.Between(b.lo, b.hi); got != b.want {
			t.Errorf("%#x.Between(%#x, %#x) = %v, want %v", b.p, b.lo, b.hi, got, b.want)
		}
	}
	reads := []struct {
		length uint32
		pmtu   int
		want   int
	}{
		{0, 1024, 1}, {1, 1024, 1}, {1024, 1024, 1}, {1025, 1024, 2}, {2500, 1024, 3},
		{1 << 31, 4096, 1 << 19}, {0xFFFFFFFF, 256, 1 << 24},
	}
	for _, r := range reads {
		if got := roce.ReadPSNs(r.length, r.pmtu); got != r.want {
			t.Errorf("ReadPSNs(%d, %d) = %d, want %d", r.length, r.pmtu, got, r.want)
		}
	}
}

// TestSourcePorts pins the ports seen in the rxe captures (see
// TestVectorSourcePorts, which checks every flow of the captures).
func TestSourcePorts(t *testing.T) {
	connected := []struct {
		fl, l, r uint32
		want     uint16
	}{
		{0, 0x15, 0x15, 49593}, // rxe-write-bw
		{0, 0x11, 0x11, 49441}, // rxe-uc-pingpong
		{0, 0x11, 0x12, roce.SourcePortFromFlowLabel(roce.FlowLabel(0x12, 0x11))},
		{0x12345, 1, 2, roce.SourcePortFromFlowLabel(0x12345)},
	}
	for _, c := range connected {
		if got := roce.ConnectedSourcePort(c.fl, c.l, c.r); got != c.want {
			t.Errorf("ConnectedSourcePort(%#x, %#x, %#x) = %d, want %d", c.fl, c.l, c.r, got, c.want)
		}
	}
	datagram := []struct {
		qpn  uint32
		want uint16
	}{{1, 55410}, {0x11, 57236}, {0x20, 52804}}
	for _, d := range datagram {
		if got := roce.DatagramSourcePort(d.qpn); got != d.want {
			t.Errorf("DatagramSourcePort(%#x) = %d, want %d", d.qpn, got, d.want)
		}
	}
	for q := uint32(0); q < 1<<24; q += 4099 {
		if p := roce.ConnectedSourcePort(0, q, q+7); p < roce.SourcePortMin {
			t.Fatalf("port %d below 0xC000", p)
		}
		if p := roce.DatagramSourcePort(q); p < roce.SourcePortMin {
			t.Fatalf("port %d below 0xC000", p)
		}
	}
}

func TestGID(t *testing.T) {
	g := roce.GIDFromAddr(netip.MustParseAddr("10.99.0.2"))
	if got := g.String(); got != "0000:0000:0000:0000:0000:ffff:0a63:0002" {
		t.Errorf("IPv4 GID %s", got)
	}
	if !g.IsIPv4() || g.Addr() != netip.MustParseAddr("10.99.0.2") {
		t.Errorf("GID %s: IsIPv4 %v Addr %v", g, g.IsIPv4(), g.Addr())
	}
	// The link-local GIDs of the rxe peers (vectors/README.md).
	ll := roce.LinkLocalGID(roce.MAC{0x52, 0x54, 0x00, 0x63, 0x00, 0x03})
	if ll.Addr() != netip.MustParseAddr("fe80::5054:ff:fe63:3") || ll.IsIPv4() {
		t.Errorf("link-local GID %v", ll.Addr())
	}
	if got := (roce.MAC{0x52, 0x54, 0, 0x63, 0, 3}).String(); got != "52:54:00:63:00:03" {
		t.Errorf("MAC %s", got)
	}
}

// TestIPv4Checksum checks the header checksum against a straightforward
// 16-bit one's-complement sum over random headers, options included.
func TestIPv4Checksum(t *testing.T) {
	ref := func(h []byte) uint16 {
		var sum uint32
		for i := 0; i < len(h); i += 2 {
			if i != 10 {
				sum += uint32(h[i])<<8 | uint32(h[i+1])
			}
		}
		for sum > 0xFFFF {
			sum = sum&0xFFFF + sum>>16
		}
		return ^uint16(sum)
	}
	r := rand.New(rand.NewPCG(1, 1))
	for i := 0; i < 20000; i++ {
		ihl := 5 + r.IntN(11)
		h := make([]byte, ihl*4)
		for j := range h {
			h[j] = byte(r.Uint32())
			if i%3 == 0 {
				h[j] = 0xFF
			}
		}
		h[0] = 0x40 | byte(ihl)
		if got, want := roce.IPv4(h).ComputeChecksum(), ref(h); got != want {
			t.Fatalf("header %x: checksum %#04x, want %#04x", h, got, want)
		}
	}
	// A known header (RFC 1071 style example from a real capture).
	h := []byte{0x45, 0, 0, 0x73, 0, 0, 0x40, 0, 0x40, 0x11, 0, 0, 0xc0, 0xa8, 0, 1, 0xc0, 0xa8, 0, 0xc7}
	if got := roce.IPv4(h).ComputeChecksum(); got != 0xb861 {
		t.Fatalf("checksum %#04x, want 0xb861", got)
	}
}

// TestPKeyMatch: rxe's pkey_match — equal partition numbers, not 0, and
// at least one full member.
func TestPKeyMatch(t *testing.T) {
	for _, tc := range []struct {
		a, b uint16
		want bool
	}{
		{0xFFFF, roce.DefaultPKey, true},
		{0x7FFF, roce.DefaultPKey, true}, // limited member of the default partition
		{0x7FFF, 0x7FFF, false},          // two limited members
		{0x8000, 0x8000, false},          // partition 0 is invalid
		{0x0000, roce.DefaultPKey, false},
		{0xFFFE, roce.DefaultPKey, false},
		{0x1234, roce.DefaultPKey, false},
		{0x8001, 0x0001, true},
		{0x8001, 0x8002, false},
	} {
		if got := roce.PKeyMatch(tc.a, tc.b); got != tc.want {
			t.Errorf("PKeyMatch(%#04x, %#04x) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestEUI64 checks the node GUID against rxe's for the peer VM's MAC
// (shared/peer/results/rxe-device-info.txt: node_guid 5054:00ff:fe63:0002
// for 52:54:00:63:00:02) and against the link-local GID's identifier.
func TestEUI64(t *testing.T) {
	for _, c := range []struct {
		mac  roce.MAC
		want uint64
	}{
		{roce.MAC{0x52, 0x54, 0x00, 0x63, 0x00, 0x02}, 0x505400fffe630002},
		{roce.MAC{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}, 0x000000fffe000001},
		{roce.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0xfdfffffffeffffff},
	} {
		if got := c.mac.EUI64(); got != c.want {
			t.Errorf("%v: EUI64 %#016x, want %#016x", c.mac, got, c.want)
		}
	}
}
