package tap_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/tap"
)

// The helpers below build and check frames by hand, independently of
// vnet.go, so that the tests compare its output with a second, plain
// reading of the same rules.

// vnetFlow holds the header fields that one flow's frames share.
type vnetFlow struct {
	v6               bool
	dst, src         [6]byte
	tos, ttl         uint8 // IPv6: traffic class, hop limit
	df               bool
	flow             uint32 // IPv6 flow label
	srcIP, dstIP     netip.Addr
	srcPort, dstPort uint16
	udpCsum          uint16 // written as is into every frame
}

func vnetTestFlow(v6 bool) vnetFlow {
	f := vnetFlow{
		v6:  v6,
		dst: [6]byte{0x52, 0x54, 0x00, 0x63, 0x00, 0x03},
		src: [6]byte{0x52, 0x54, 0x00, 0x63, 0x00, 0x02},
		tos: 0x02, ttl: 64, df: true,
		srcIP: netip.MustParseAddr("10.99.0.2"), dstIP: netip.MustParseAddr("10.99.0.3"),
		srcPort: 0xC123, dstPort: 4791,
		udpCsum: 0xBEEF,
	}
	if v6 {
		f.flow = 0xABCDE
		f.srcIP, f.dstIP = netip.MustParseAddr("fd00:55::2"), netip.MustParseAddr("fd00:55::3")
	}
	return f
}

// vnetTestSum adds the big-endian 16-bit words of b to s (one's complement,
// not yet folded).
func vnetTestSum(s uint64, b []byte) uint64 {
	for i := 0; i+1 < len(b); i += 2 {
		s += uint64(b[i])<<8 | uint64(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint64(b[len(b)-1]) << 8
	}
	return s
}

// vnetTestFold folds s to 16 bits with end-around carry.
func vnetTestFold(s uint64) uint16 {
	for s > 0xFFFF {
		s = s&0xFFFF + s>>16
	}
	return uint16(s)
}

// build returns the frame of fl with IPv4 ID id carrying payload.
func (fl vnetFlow) build(id uint16, payload []byte) []byte {
	ipLen := 20
	et := uint16(0x0800)
	if fl.v6 {
		ipLen, et = 40, 0x86DD
	}
	f := make([]byte, 14+ipLen+8+len(payload))
	copy(f[0:6], fl.dst[:])
	copy(f[6:12], fl.src[:])
	binary.BigEndian.PutUint16(f[12:14], et)
	ip := f[14 : 14+ipLen]
	udpLen := 8 + len(payload)
	if fl.v6 {
		binary.BigEndian.PutUint32(ip[0:4], 6<<28|uint32(fl.tos)<<20|fl.flow)
		binary.BigEndian.PutUint16(ip[4:6], uint16(udpLen))
		ip[6], ip[7] = 17, fl.ttl
		s, d := fl.srcIP.As16(), fl.dstIP.As16()
		copy(ip[8:24], s[:])
		copy(ip[24:40], d[:])
	} else {
		ip[0], ip[1] = 0x45, fl.tos
		binary.BigEndian.PutUint16(ip[2:4], uint16(20+udpLen))
		binary.BigEndian.PutUint16(ip[4:6], id)
		if fl.df {
			ip[6] = 0x40
		}
		ip[8], ip[9] = fl.ttl, 17
		s, d := fl.srcIP.As4(), fl.dstIP.As4()
		copy(ip[12:16], s[:])
		copy(ip[16:20], d[:])
		binary.BigEndian.PutUint16(ip[10:12], ^vnetTestFold(vnetTestSum(0, ip)))
	}
	u := f[14+ipLen:]
	binary.BigEndian.PutUint16(u[0:2], fl.srcPort)
	binary.BigEndian.PutUint16(u[2:4], fl.dstPort)
	binary.BigEndian.PutUint16(u[4:6], uint16(udpLen))
	binary.BigEndian.PutUint16(u[6:8], fl.udpCsum)
	copy(u[8:], payload)
	return f
}

// vnetTestPayload returns n pseudo-random bytes.
func vnetTestPayload(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// vnetL4 returns the offset of the UDP header of a frame.
func vnetL4(f []byte) int {
	if binary.BigEndian.Uint16(f[12:14]) == 0x86DD {
		return 54
	}
	return 34
}

// vnetEqualButUDPCsum reports whether a and b are equal except for the UDP
// checksum field.
func vnetEqualButUDPCsum(a, b []byte) bool {
	if len(a) != len(b) || len(a) < 42 {
		return false
	}
	c := vnetL4(a) + 6
	return bytes.Equal(a[:c], b[:c]) && bytes.Equal(a[c+2:], b[c+2:])
}

// vnetRFCChecksum computes the UDP checksum of frame from scratch (RFC 768
// and RFC 8200 8.1): pseudo-header with the frame's own UDP length, UDP
// header with checksum 0, payload.
func vnetRFCChecksum(frame []byte) uint16 {
	l4 := vnetL4(frame)
	udp := frame[l4:]
	var s uint64
	if l4 == 54 {
		s = vnetTestSum(s, frame[22:54])
	} else {
		s = vnetTestSum(s, frame[26:34])
	}
	s += 17 + uint64(len(udp))
	s = vnetTestSum(s, udp[0:6])
	s = vnetTestSum(s, udp[8:])
	return ^vnetTestFold(s)
}

// vnetKernelChecksum is what Linux fills into the UDP checksum of one
// segment of a CHECKSUM_PARTIAL super-frame whose UDP header carried
// superCsum and superLen: __udp_gso_segment's
// csum16_add(csum16_sub(uh->check, uh->len), newlen), then the checksum
// completed from csum_start over the segment with that value in place.
func vnetKernelChecksum(superCsum, superLen uint16, seg []byte) uint16 {
	l4 := vnetL4(seg)
	udp := seg[l4:]
	add := func(a, b uint16) uint16 { return vnetTestFold(uint64(a) + uint64(b)) }
	check := add(add(superCsum, ^superLen), uint16(len(udp)))
	s := vnetTestSum(uint64(check), udp[0:6])
	s = vnetTestSum(s, udp[8:])
	return ^vnetTestFold(s)
}

// vnetBufs returns n buffers of size bytes each.
func vnetBufs(n, size int) ([][]byte, []int) {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	return bufs, make([]int, n)
}

func TestVnetHdrCodec(t *testing.T) {
	tests := []struct {
		name string
		h    tap.VirtioNetHdr
		wire []byte
	}{
		{"zero", tap.VirtioNetHdr{}, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"uso ipv4", tap.VirtioNetHdr{
			Flags: tap.VirtioNetHdrFNeedsCsum, GSOType: tap.VirtioNetHdrGSOUDPL4,
			HdrLen: 42, GSOSize: 4112, CsumStart: 34, CsumOffset: 6,
		}, []byte{0x01, 0x05, 0x2a, 0x00, 0x10, 0x10, 0x22, 0x00, 0x06, 0x00}},
		{"uso ipv6", tap.VirtioNetHdr{
			Flags: tap.VirtioNetHdrFNeedsCsum, GSOType: tap.VirtioNetHdrGSOUDPL4,
			HdrLen: 62, GSOSize: 1040, CsumStart: 54, CsumOffset: 6,
		}, []byte{0x01, 0x05, 0x3e, 0x00, 0x10, 0x04, 0x36, 0x00, 0x06, 0x00}},
		{"data valid", tap.VirtioNetHdr{Flags: tap.VirtioNetHdrFDataValid},
			[]byte{0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"tso ecn, every byte distinct", tap.VirtioNetHdr{
			Flags: 0x03, GSOType: tap.VirtioNetHdrGSOTCPv4 | tap.VirtioNetHdrGSOECN,
			HdrLen: 0x0201, GSOSize: 0x0403, CsumStart: 0x0605, CsumOffset: 0x0807,
		}, []byte{0x03, 0x81, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08}},
		{"all ones", tap.VirtioNetHdr{
			Flags: 0xFF, GSOType: 0xFF, HdrLen: 0xFFFF, GSOSize: 0xFFFF, CsumStart: 0xFFFF, CsumOffset: 0xFFFF,
		}, bytes.Repeat([]byte{0xFF}, 10)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := make([]byte, tap.VirtioNetHdrLen+2)
			b[10], b[11] = 0xAA, 0xAA
			tt.h.Encode(b)
			if !bytes.Equal(b[:10], tt.wire) {
				t.Errorf("Encode = % x, want % x", b[:10], tt.wire)
			}
			if b[10] != 0xAA || b[11] != 0xAA {
				t.Errorf("Encode wrote beyond 10 bytes: % x", b)
			}
			var h tap.VirtioNetHdr
			if err := h.Decode(b); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if h != tt.h {
				t.Errorf("Decode = %+v, want %+v", h, tt.h)
			}
		})
	}
	if tap.VirtioNetHdrLen != 10 {
		t.Errorf("VirtioNetHdrLen = %d, want 10", tap.VirtioNetHdrLen)
	}
	// The constants as include/uapi/linux/virtio_net.h has them.
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"F_NEEDS_CSUM", tap.VirtioNetHdrFNeedsCsum, 1},
		{"F_DATA_VALID", tap.VirtioNetHdrFDataValid, 2},
		{"GSO_NONE", tap.VirtioNetHdrGSONone, 0},
		{"GSO_TCPV4", tap.VirtioNetHdrGSOTCPv4, 1},
		{"GSO_UDP", tap.VirtioNetHdrGSOUDP, 3},
		{"GSO_TCPV6", tap.VirtioNetHdrGSOTCPv6, 4},
		{"GSO_UDP_L4", tap.VirtioNetHdrGSOUDPL4, 5},
		{"GSO_ECN", tap.VirtioNetHdrGSOECN, 0x80},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
}

func TestVnetHdrDecodeShort(t *testing.T) {
	for n := range tap.VirtioNetHdrLen {
		h := tap.VirtioNetHdr{Flags: 7}
		if err := h.Decode(make([]byte, n)); !errors.Is(err, tap.ErrVnetHdrShort) {
			t.Errorf("Decode(%d bytes) = %v, want ErrVnetHdrShort", n, err)
		}
		if h.Flags != 7 {
			t.Errorf("Decode(%d bytes) changed the header", n)
		}
	}
}

// vnetRoCEFrames builds n RoCE packets of one RC RDMA WRITE: n-1
// RC_RDMA_WRITE_MIDDLE packets with mtu bytes of payload and an
// RC_RDMA_WRITE_LAST with last bytes, consecutive PSNs and IPv4 IDs
// starting at id (wrapping), UDP checksum udpCsum.
func vnetRoCEFrames(t testing.TB, v6 bool, n, mtu, last int, id uint16, udpCsum uint16) [][]byte {
	t.Helper()
	r := rand.New(rand.NewPCG(uint64(n), uint64(mtu)))
	frames := make([][]byte, n)
	for i := range frames {
		p := roce.Packet{
			DstMAC: roce.MAC{0x52, 0x54, 0x00, 0x63, 0x00, 0x03},
			SrcMAC: roce.MAC{0x52, 0x54, 0x00, 0x63, 0x00, 0x02},
			IPv6:   v6,
			Src:    netip.MustParseAddr("10.99.0.2"), Dst: netip.MustParseAddr("10.99.0.3"),
			TOS: 0, TTL: 64, ID: id + uint16(i), DontFragment: true,
			SrcPort: 0xC0DE, DstPort: roce.UDPPort, UDPChecksum: udpCsum,
			BTH: roce.BTHFields{
				Opcode: roce.RCRDMAWriteMiddle, PKey: roce.DefaultPKey,
				DestQP: 0x000123, PSN: roce.PSN(0xFFFFFE).Add(i),
			},
		}
		if v6 {
			p.Src, p.Dst = netip.MustParseAddr("fd00:55::2"), netip.MustParseAddr("fd00:55::3")
			p.FlowLabel = 0x1F00D
		}
		size := mtu
		if i == n-1 {
			p.BTH.Opcode = roce.RCRDMAWriteLast
			p.BTH.AckReq = true
			size = last
		}
		b := make([]byte, 9000)
		m, err := p.Build(b, vnetTestPayload(r, size))
		if err != nil {
			t.Fatalf("Build packet %d: %v", i, err)
		}
		frames[i] = b[:m]
	}
	return frames
}

// TestVnetRoCERoundTrip proves what the write path relies on: RoCE packets
// built in full with the IP IDs and lengths of their segments, coalesced
// into one super-frame, come out of the kernel's segmentation (modelled by
// SplitUSO) byte for byte as built, except for the UDP checksum; each
// parses, its ICRC verifies, and the UDP checksum the kernel would fill in
// from Coalesce's pseudo-header sum is the correct one.
func TestVnetRoCERoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		v6      bool
		n, last int
		id      uint16
	}{
		{"ipv4", false, 8, 777, 0xFFFC},
		{"ipv4 last full", false, 3, 1024, 0},
		{"ipv4 last one byte", false, 2, 1, 100},
		{"ipv6", true, 8, 777, 0},
		{"ipv6 many", true, 40, 333, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			frames := vnetRoCEFrames(t, tc.v6, tc.n, 1024, tc.last, tc.id, 0xBEEF)
			if got := tap.CoalesceRun(frames, 64); got != tc.n {
				t.Fatalf("CoalesceRun = %d, want %d", got, tc.n)
			}
			hl := 42
			if tc.v6 {
				hl = 62
			}
			seg := len(frames[0]) - hl
			dst := make([]byte, 70000)
			n, h, err := tap.Coalesce(dst, frames)
			if err != nil {
				t.Fatalf("Coalesce: %v", err)
			}
			super := dst[:n]
			total := 0
			for _, f := range frames {
				total += len(f) - hl
			}
			if n != hl+total {
				t.Errorf("Coalesce n = %d, want %d", n, hl+total)
			}
			want := tap.VirtioNetHdr{
				Flags: tap.VirtioNetHdrFNeedsCsum, GSOType: tap.VirtioNetHdrGSOUDPL4,
				HdrLen: uint16(hl), GSOSize: uint16(seg), CsumStart: uint16(hl - 8), CsumOffset: 6,
			}
			if h != want {
				t.Errorf("Coalesce header = %+v, want %+v", h, want)
			}
			// The headers are frames[0]'s but for lengths and checksums.
			l4 := hl - 8
			if !bytes.Equal(super[:14], frames[0][:14]) || !bytes.Equal(super[l4:l4+4], frames[0][l4:l4+4]) {
				t.Errorf("super-frame headers differ from the first frame's")
			}
			if tc.v6 {
				if got := binary.BigEndian.Uint16(super[18:20]); int(got) != 8+total {
					t.Errorf("IPv6 payload length = %d, want %d", got, 8+total)
				}
			} else {
				ip := super[14:34]
				if got := binary.BigEndian.Uint16(ip[2:4]); int(got) != 28+total {
					t.Errorf("IPv4 total length = %d, want %d", got, 28+total)
				}
				if vnetTestFold(vnetTestSum(0, ip)) != 0xFFFF {
					t.Errorf("IPv4 header checksum of the super-frame is wrong")
				}
				if binary.BigEndian.Uint16(ip[4:6]) != tc.id {
					t.Errorf("IPv4 ID = %#x, want the first frame's %#x", binary.BigEndian.Uint16(ip[4:6]), tc.id)
				}
			}
			superLen := binary.BigEndian.Uint16(super[l4+4:])
			if int(superLen) != 8+total {
				t.Errorf("UDP length = %d, want %d", superLen, 8+total)
			}
			// The pseudo-header sum with the super-frame's UDP length,
			// folded and not complemented.
			var ps uint64
			if tc.v6 {
				ps = vnetTestSum(0, super[22:54])
			} else {
				ps = vnetTestSum(0, super[26:34])
			}
			superCsum := binary.BigEndian.Uint16(super[l4+6:])
			if wantCsum := vnetTestFold(ps + 17 + uint64(superLen)); superCsum != wantCsum {
				t.Errorf("UDP checksum field = %#04x, want pseudo-header sum %#04x", superCsum, wantCsum)
			}
			if !bytes.Equal(super[hl:hl+seg], frames[0][hl:]) || !bytes.Equal(super[n-(len(frames[tc.n-1])-hl):], frames[tc.n-1][hl:]) {
				t.Errorf("payloads not back to back")
			}

			// Through the virtio-net header's wire form, as the kernel
			// would see it.
			var wire [tap.VirtioNetHdrLen]byte
			h.Encode(wire[:])
			var kh tap.VirtioNetHdr
			if err := kh.Decode(wire[:]); err != nil {
				t.Fatal(err)
			}
			const offset = 16
			bufs, sizes := vnetBufs(64, offset+9000)
			got, err := tap.SplitUSO(&kh, super, bufs, sizes, offset)
			if err != nil {
				t.Fatalf("SplitUSO: %v", err)
			}
			if got != tc.n {
				t.Fatalf("SplitUSO = %d segments, want %d", got, tc.n)
			}
			for i, orig := range frames {
				s := bufs[i][offset : offset+sizes[i]]
				if !vnetEqualButUDPCsum(s, orig) {
					t.Errorf("segment %d differs from its frame beyond the UDP checksum:\n got % x\nwant % x", i, s[:hl+16], orig[:hl+16])
					continue
				}
				if c := binary.BigEndian.Uint16(s[l4+6:]); c != 0 {
					t.Errorf("segment %d UDP checksum = %#x, want 0", i, c)
				}
				var p roce.Packet
				if err := roce.Parse(s, &p); err != nil {
					t.Errorf("segment %d: Parse: %v", i, err)
					continue
				}
				if err := p.VerifyICRC(s); err != nil {
					t.Errorf("segment %d: %v", i, err)
				}
				if want := roce.PSN(0xFFFFFE).Add(i); p.BTH.PSN != want {
					t.Errorf("segment %d PSN = %#x, want %#x", i, p.BTH.PSN, want)
				}
				if !tc.v6 && p.ID != tc.id+uint16(i) {
					t.Errorf("segment %d IPv4 ID = %#x, want %#x", i, p.ID, tc.id+uint16(i))
				}
				// What the kernel writes into the checksum field is the
				// datagram's true UDP checksum.
				if k, r := vnetKernelChecksum(superCsum, superLen, s), vnetRFCChecksum(s); k != r {
					t.Errorf("segment %d: kernel would write UDP checksum %#04x, correct is %#04x", i, k, r)
				}
			}
		})
	}
}

// TestVnetRoCEFirstAlone: an RC_RDMA_WRITE_FIRST carries a RETH and so a
// longer UDP payload than the MIDDLE packets after it; the run it starts
// ends with the first MIDDLE (shorter, so it must be the last segment).
func TestVnetRoCEFirstAlone(t *testing.T) {
	frames := vnetRoCEFrames(t, false, 4, 1024, 1024, 7, 0)
	first := append([]byte(nil), frames[0]...)
	var p roce.Packet
	if err := roce.Parse(first, &p); err != nil {
		t.Fatal(err)
	}
	p.BTH.Opcode = roce.RCRDMAWriteFirst
	p.BTH.PSN = p.BTH.PSN.Add(-1)
	p.ID--
	b := make([]byte, 9000)
	n, err := p.Build(b, first[p.HeaderLen():p.HeaderLen()+p.PayloadLen])
	if err != nil {
		t.Fatal(err)
	}
	all := append([][]byte{b[:n]}, frames...)
	if got := tap.CoalesceRun(all, 64); got != 2 {
		t.Errorf("CoalesceRun(FIRST, MIDDLE…) = %d, want 2", got)
	}
	if got := tap.CoalesceRun(all[1:], 64); got != 4 {
		t.Errorf("CoalesceRun(MIDDLE…) = %d, want 4", got)
	}
}

func TestSplitUSONone(t *testing.T) {
	arp := make([]byte, 60)
	binary.BigEndian.PutUint16(arp[12:14], 0x0806)
	fl := vnetTestFlow(false)
	udp := fl.build(1, []byte("hello"))
	for _, tc := range []struct {
		name  string
		h     *tap.VirtioNetHdr
		frame []byte
	}{
		{"nil header", nil, udp},
		{"zero header", &tap.VirtioNetHdr{}, udp},
		{"arp", &tap.VirtioNetHdr{}, arp},
		{"needs csum", &tap.VirtioNetHdr{Flags: tap.VirtioNetHdrFNeedsCsum, CsumStart: 34, CsumOffset: 6}, udp},
		{"empty", &tap.VirtioNetHdr{}, nil},
		{"garbage", &tap.VirtioNetHdr{GSOSize: 3, HdrLen: 9999}, []byte{1, 2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bufs, sizes := vnetBufs(2, 10+len(tc.frame))
			n, err := tap.SplitUSO(tc.h, tc.frame, bufs, sizes, 10)
			if err != nil || n != 1 {
				t.Fatalf("SplitUSO = %d, %v; want 1, nil", n, err)
			}
			if sizes[0] != len(tc.frame) || !bytes.Equal(bufs[0][10:10+sizes[0]], tc.frame) {
				t.Errorf("frame not copied as is")
			}
		})
	}
}

func TestSplitUSOSegments(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name    string
		v6      bool
		id      uint16
		gso     int
		payload int
		want    []int // payload sizes of the segments
	}{
		{"ipv4 uneven", false, 0x1234, 100, 250, []int{100, 100, 50}},
		{"ipv4 even", false, 0xFFFF, 100, 300, []int{100, 100, 100}},
		{"ipv4 id wraps", false, 0xFFFE, 1, 4, []int{1, 1, 1, 1}},
		{"ipv4 one segment", false, 5, 1000, 999, []int{999}},
		{"ipv4 exactly gso", false, 5, 1000, 1000, []int{1000}},
		{"ipv4 no payload", false, 5, 1000, 0, []int{0}},
		{"ipv4 odd gso", false, 9, 333, 1000, []int{333, 333, 333, 1}},
		{"ipv6", true, 0, 1040, 1040*5 + 17, []int{1040, 1040, 1040, 1040, 1040, 17}},
		{"ipv6 big", true, 0, 4112, 4112 * 15, []int{4112, 4112, 4112, 4112, 4112, 4112, 4112, 4112, 4112, 4112, 4112, 4112, 4112, 4112, 4112}},
		{"ipv4 64 segments", false, 0, 10, 640, func() []int {
			s := make([]int, 64)
			for i := range s {
				s[i] = 10
			}
			return s
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fl := vnetTestFlow(tc.v6)
			payload := vnetTestPayload(r, tc.payload)
			// A super-frame is a frame whose lengths cover all payloads.
			super := fl.build(tc.id, payload)
			h := tap.VirtioNetHdr{
				Flags: tap.VirtioNetHdrFNeedsCsum, GSOType: tap.VirtioNetHdrGSOUDPL4,
				HdrLen:  1, // a hint only: must not matter
				GSOSize: uint16(tc.gso), CsumStart: 34, CsumOffset: 6,
			}
			const offset = 3
			bufs, sizes := vnetBufs(len(tc.want), offset+tc.gso+62)
			n, err := tap.SplitUSO(&h, super, bufs, sizes, offset)
			if err != nil || n != len(tc.want) {
				t.Fatalf("SplitUSO = %d, %v; want %d, nil", n, err, len(tc.want))
			}
			fl.udpCsum = 0
			off := 0
			for i, size := range tc.want {
				want := fl.build(tc.id+uint16(i), payload[off:off+size])
				off += size
				if got := bufs[i][offset : offset+sizes[i]]; !bytes.Equal(got, want) {
					t.Errorf("segment %d:\n got % x\nwant % x", i, got, want)
				}
			}
		})
	}
}

func TestSplitUSOErrors(t *testing.T) {
	fl4, fl6 := vnetTestFlow(false), vnetTestFlow(true)
	payload := bytes.Repeat([]byte{0x5A}, 300)
	good4, good6 := fl4.build(1, payload), fl6.build(1, payload)
	uso := func(gso uint16) *tap.VirtioNetHdr {
		return &tap.VirtioNetHdr{Flags: tap.VirtioNetHdrFNeedsCsum, GSOType: tap.VirtioNetHdrGSOUDPL4, GSOSize: gso, CsumStart: 34, CsumOffset: 6}
	}
	mod := func(f []byte, fn func(f []byte)) []byte {
		f = append([]byte(nil), f...)
		fn(f)
		return f
	}
	put16 := func(off int, v uint16) func([]byte) {
		return func(f []byte) { binary.BigEndian.PutUint16(f[off:], v) }
	}
	tests := []struct {
		name   string
		h      *tap.VirtioNetHdr
		frame  []byte
		nbufs  int
		nsizes int
		size   int
		offset int
		want   error
	}{
		{"tcpv4", &tap.VirtioNetHdr{GSOType: tap.VirtioNetHdrGSOTCPv4, GSOSize: 100}, good4, 8, 8, 500, 0, tap.ErrGSOType},
		{"ufo", &tap.VirtioNetHdr{GSOType: tap.VirtioNetHdrGSOUDP, GSOSize: 100}, good4, 8, 8, 500, 0, tap.ErrGSOType},
		{"tcpv6", &tap.VirtioNetHdr{GSOType: tap.VirtioNetHdrGSOTCPv6, GSOSize: 100}, good6, 8, 8, 500, 0, tap.ErrGSOType},
		{"uso with ecn", &tap.VirtioNetHdr{GSOType: tap.VirtioNetHdrGSOUDPL4 | tap.VirtioNetHdrGSOECN, GSOSize: 100}, good4, 8, 8, 500, 0, tap.ErrGSOType},
		{"unknown type", &tap.VirtioNetHdr{GSOType: 0x42, GSOSize: 100}, good4, 8, 8, 500, 0, tap.ErrGSOType},
		{"gso size 0", uso(0), good4, 8, 8, 500, 0, tap.ErrGSOSizeZero},
		{"empty frame", uso(100), nil, 8, 8, 500, 0, tap.ErrFrameHeaders},
		{"short ethernet", uso(100), good4[:13], 8, 8, 500, 0, tap.ErrFrameHeaders},
		{"short ipv4", uso(100), good4[:33], 8, 8, 500, 0, tap.ErrFrameHeaders},
		{"short udp v4", uso(100), good4[:41], 8, 8, 500, 0, tap.ErrFrameHeaders},
		{"short ipv6", uso(100), good6[:53], 8, 8, 500, 0, tap.ErrFrameHeaders},
		{"short udp v6", uso(100), good6[:61], 8, 8, 500, 0, tap.ErrFrameHeaders},
		{"arp", uso(100), mod(good4, put16(12, 0x0806)), 8, 8, 500, 0, tap.ErrFrameNotUDP},
		{"vlan", uso(100), mod(good4, put16(12, 0x8100)), 8, 8, 500, 0, tap.ErrFrameNotUDP},
		{"tcp", uso(100), mod(good4, func(f []byte) { f[23] = 6 }), 8, 8, 500, 0, tap.ErrFrameNotUDP},
		{"ipv4 options", uso(100), mod(good4, func(f []byte) { f[14] = 0x46 }), 8, 8, 500, 0, tap.ErrFrameNotUDP},
		{"ipv6 in ipv4 ethertype", uso(100), mod(good4, func(f []byte) { f[14] = 0x65 }), 8, 8, 500, 0, tap.ErrFrameNotUDP},
		{"ipv4 in ipv6 ethertype", uso(100), mod(good6, func(f []byte) { f[14] = 0x45 }), 8, 8, 500, 0, tap.ErrFrameNotUDP},
		{"ipv6 hop-by-hop", uso(100), mod(good6, func(f []byte) { f[20] = 0 }), 8, 8, 500, 0, tap.ErrFrameNotUDP},
		{"ipv6 fragment header", uso(100), mod(good6, func(f []byte) { f[20] = 44 }), 8, 8, 500, 0, tap.ErrFrameNotUDP},
		{"ipv4 more fragments", uso(100), mod(good4, func(f []byte) { f[20] |= 0x20 }), 8, 8, 500, 0, tap.ErrFrameFragment},
		{"ipv4 fragment offset", uso(100), mod(good4, func(f []byte) { f[21] = 1 }), 8, 8, 500, 0, tap.ErrFrameFragment},
		{"ipv4 total length", uso(100), mod(good4, put16(16, uint16(len(good4)-14-1))), 8, 8, 500, 0, tap.ErrFrameLength},
		{"ipv4 udp length", uso(100), mod(good4, put16(38, uint16(len(good4)-34+1))), 8, 8, 500, 0, tap.ErrFrameLength},
		{"ipv4 trailing byte", uso(100), append(append([]byte(nil), good4...), 0), 8, 8, 500, 0, tap.ErrFrameLength},
		{"ipv4 truncated", uso(100), good4[:len(good4)-1], 8, 8, 500, 0, tap.ErrFrameLength},
		{"ipv6 payload length", uso(100), mod(good6, put16(18, 0)), 8, 8, 500, 0, tap.ErrFrameLength},
		{"ipv6 udp length", uso(100), mod(good6, put16(58, 0)), 8, 8, 500, 0, tap.ErrFrameLength},
		{"more segments than bufs", uso(100), good4, 2, 8, 500, 0, tap.ErrBatchTooSmall},
		{"more segments than sizes", uso(100), good4, 8, 2, 500, 0, tap.ErrBatchTooSmall},
		{"one byte per segment", uso(1), good4, 299, 299, 500, 0, tap.ErrBatchTooSmall},
		{"none without bufs", &tap.VirtioNetHdr{}, good4, 0, 0, 500, 0, tap.ErrBatchTooSmall},
		{"none without sizes", &tap.VirtioNetHdr{}, good4, 1, 0, 500, 0, tap.ErrBatchTooSmall},
		{"buf too small", uso(100), good4, 8, 8, 42 + 99, 0, tap.ErrShortBuffer},
		{"buf too small with offset", uso(100), good4, 8, 8, 42 + 100, 1, tap.ErrShortBuffer},
		{"offset beyond buf", uso(100), good4, 8, 8, 500, 501, tap.ErrShortBuffer},
		{"negative offset", uso(100), good4, 8, 8, 500, -1, tap.ErrShortBuffer},
		{"none buf too small", &tap.VirtioNetHdr{}, good4, 1, 1, len(good4) - 1, 0, tap.ErrShortBuffer},
		{"none negative offset", &tap.VirtioNetHdr{}, good4, 1, 1, 500, -1, tap.ErrShortBuffer},
		{"none offset beyond buf", &tap.VirtioNetHdr{}, good4, 1, 1, 500, 501, tap.ErrShortBuffer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bufs := make([][]byte, tt.nbufs)
			for i := range bufs {
				bufs[i] = bytes.Repeat([]byte{0xAA}, tt.size)
			}
			sizes := make([]int, tt.nsizes)
			n, err := tap.SplitUSO(tt.h, tt.frame, bufs, sizes, tt.offset)
			if !errors.Is(err, tt.want) || n != 0 {
				t.Fatalf("SplitUSO = %d, %v; want 0, %v", n, err, tt.want)
			}
			for i, b := range bufs {
				if bytes.Count(b, []byte{0xAA}) != len(b) {
					t.Errorf("buffer %d written on error", i)
				}
			}
			for i, s := range sizes {
				if s != 0 {
					t.Errorf("sizes[%d] = %d written on error", i, s)
				}
			}
		})
	}
	// The last segment (60 bytes of payload) needs less room than the
	// others (120).
	bufs, sizes := vnetBufs(3, 42+120)
	bufs[2] = bufs[2][:42+60]
	if n, err := tap.SplitUSO(uso(120), good4, bufs, sizes, 0); err != nil || n != 3 {
		t.Errorf("SplitUSO with a last buffer of exactly its size = %d, %v", n, err)
	}
	bufs[2] = bufs[2][:42+59]
	if n, err := tap.SplitUSO(uso(120), good4, bufs, sizes, 0); err != tap.ErrShortBuffer || n != 0 {
		t.Errorf("SplitUSO with a last buffer too small = %d, %v", n, err)
	}
}

func TestCoalescable(t *testing.T) {
	payload := bytes.Repeat([]byte{1}, 100)
	for _, v6 := range []bool{false, true} {
		base := vnetTestFlow(v6)
		a := base.build(41, payload)
		type change struct {
			name string
			b    []byte
			want bool
		}
		flow := func(fn func(*vnetFlow)) vnetFlow {
			f := base
			fn(&f)
			return f
		}
		bytesMod := func(f []byte, fn func([]byte)) []byte {
			f = append([]byte(nil), f...)
			fn(f)
			return f
		}
		same := flow(func(*vnetFlow) {})
		cases := []change{
			{"next", same.build(42, payload), true},
			{"shorter", same.build(42, payload[:1]), true},
			{"other udp checksum", flow(func(f *vnetFlow) { f.udpCsum = 0 }).build(42, payload), true},
			{"longer", same.build(42, append(payload, 0)), false},
			{"empty", same.build(42, nil), false},
			{"dst mac", flow(func(f *vnetFlow) { f.dst[5]++ }).build(42, payload), false},
			{"src mac", flow(func(f *vnetFlow) { f.src[0]++ }).build(42, payload), false},
			{"tos", flow(func(f *vnetFlow) { f.tos++ }).build(42, payload), false},
			{"ttl", flow(func(f *vnetFlow) { f.ttl-- }).build(42, payload), false},
			{"src ip", flow(func(f *vnetFlow) { f.srcIP = f.srcIP.Next() }).build(42, payload), false},
			{"dst ip", flow(func(f *vnetFlow) { f.dstIP = f.dstIP.Next() }).build(42, payload), false},
			{"src port", flow(func(f *vnetFlow) { f.srcPort++ }).build(42, payload), false},
			{"dst port", flow(func(f *vnetFlow) { f.dstPort++ }).build(42, payload), false},
			{"other version", vnetTestFlow(!v6).build(42, payload), false},
			{"not udp", bytesMod(same.build(42, payload), func(f []byte) { binary.BigEndian.PutUint16(f[12:], 0x0806) }), false},
		}
		if v6 {
			cases = append(cases,
				change{"same id", same.build(41, payload), true},
				change{"flow label", flow(func(f *vnetFlow) { f.flow++ }).build(42, payload), false},
				change{"bad payload length", bytesMod(same.build(42, payload), func(f []byte) { f[19]++ }), false},
			)
		} else {
			cases = append(cases,
				change{"same id", same.build(41, payload), false},
				change{"id + 2", same.build(43, payload), false},
				change{"id - 1", same.build(40, payload), false},
				change{"df", flow(func(f *vnetFlow) { f.df = false }).build(42, payload), false},
				change{"fragment", bytesMod(same.build(42, payload), func(f []byte) { f[20] |= 0x20 }), false},
				change{"bad total length", bytesMod(same.build(42, payload), func(f []byte) { f[17]++ }), false},
				change{"bad udp length", bytesMod(same.build(42, payload), func(f []byte) { f[39]++ }), false},
			)
		}
		for _, c := range cases {
			name := "ipv4/"
			if v6 {
				name = "ipv6/"
			}
			t.Run(name+c.name, func(t *testing.T) {
				if got := tap.Coalescable(a, c.b); got != c.want {
					t.Errorf("Coalescable = %v, want %v", got, c.want)
				}
			})
		}
		// IPv4 IDs wrap.
		if !v6 && !tap.Coalescable(base.build(0xFFFF, payload), base.build(0, payload)) {
			t.Errorf("Coalescable(ID 0xFFFF, ID 0) = false")
		}
		// An empty a cannot set a segment size.
		if tap.Coalescable(base.build(1, nil), base.build(2, nil)) {
			t.Errorf("Coalescable of two empty datagrams = true")
		}
		if tap.Coalescable(nil, a) || tap.Coalescable(a, nil) || tap.Coalescable(a[:20], a) {
			t.Errorf("Coalescable accepts a truncated frame")
		}
	}
}

func TestCoalesceRun(t *testing.T) {
	fl := vnetTestFlow(false)
	run := func(id uint16, sizes ...int) [][]byte {
		fs := make([][]byte, len(sizes))
		for i, s := range sizes {
			fs[i] = fl.build(id+uint16(i), make([]byte, s))
		}
		return fs
	}
	repeat := func(n, size int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = size
		}
		return s
	}
	arp := make([]byte, 60)
	binary.BigEndian.PutUint16(arp[12:14], 0x0806)
	broken := run(1, 100, 100, 100, 100)
	broken[2] = fl.build(77, make([]byte, 100))
	tests := []struct {
		name   string
		frames [][]byte
		max    int
		want   int
	}{
		{"none", nil, 64, 0},
		{"max 0", run(1, 100, 100), 0, 0},
		{"max negative", run(1, 100, 100), -1, 0},
		{"single", run(1, 100), 64, 1},
		{"arp first", [][]byte{arp, fl.build(1, make([]byte, 100))}, 64, 1},
		{"arp second", [][]byte{fl.build(1, make([]byte, 100)), arp}, 64, 1},
		{"empty payload first", run(1, 0, 0), 64, 1},
		{"all", run(1, 100, 100, 100, 100, 37), 64, 5},
		{"max", run(1, 100, 100, 100, 100, 37), 3, 3},
		{"short ends the run", run(1, 100, 100, 37, 100, 100), 64, 3},
		{"longer second", run(1, 100, 101), 64, 1},
		{"broken id", broken, 64, 2},
		{"MaxGSOSegments", run(1, repeat(100, 10)...), 1000, tap.MaxGSOSegments},
		{"65535 bytes", run(1, repeat(20, 4112)...), 64, 15},
		{"65535 exactly", run(1, append(repeat(7, 8192), 65535-28-7*8192)...), 64, 8},
		{"65535 plus one", run(1, append(repeat(7, 8192), 65535-28-7*8192+1)...), 64, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tap.CoalesceRun(tt.frames, tt.max); got != tt.want {
				t.Errorf("CoalesceRun = %d, want %d", got, tt.want)
			}
		})
	}
	// IPv6: 40 bytes of IP header count against 65535 too.
	fl6 := vnetTestFlow(true)
	var fs [][]byte
	for range 8 {
		fs = append(fs, fl6.build(0, make([]byte, 8192)))
	}
	fs[7] = fl6.build(0, make([]byte, 65535-48-7*8192))
	if got := tap.CoalesceRun(fs, 64); got != 8 {
		t.Errorf("IPv6 CoalesceRun up to 65535 = %d, want 8", got)
	}
	fs[7] = fl6.build(0, make([]byte, 65535-48-7*8192+1))
	if got := tap.CoalesceRun(fs, 64); got != 7 {
		t.Errorf("IPv6 CoalesceRun beyond 65535 = %d, want 7", got)
	}
}

func TestCoalesceSingle(t *testing.T) {
	arp := make([]byte, 60)
	binary.BigEndian.PutUint16(arp[12:14], 0x0806)
	arp[59] = 9
	fl := vnetTestFlow(true)
	for _, f := range [][]byte{arp, fl.build(0, []byte("x")), {}} {
		dst := make([]byte, len(f))
		n, h, err := tap.Coalesce(dst, [][]byte{f})
		if err != nil || n != len(f) || !bytes.Equal(dst, f) || h != (tap.VirtioNetHdr{}) {
			t.Errorf("Coalesce(one frame) = %d, %+v, %v", n, h, err)
		}
	}
}

func TestCoalesceErrors(t *testing.T) {
	fl := vnetTestFlow(false)
	run := func(n, size int) [][]byte {
		fs := make([][]byte, n)
		for i := range fs {
			fs[i] = fl.build(uint16(i), make([]byte, size))
		}
		return fs
	}
	broken := run(3, 100)
	broken[1] = fl.build(9, make([]byte, 100))
	short := run(3, 100)
	short[1] = fl.build(1, make([]byte, 50))
	arp := make([]byte, 60)
	binary.BigEndian.PutUint16(arp[12:14], 0x0806)
	tests := []struct {
		name   string
		dst    int
		frames [][]byte
		want   error
	}{
		{"no frames", 70000, nil, tap.ErrNotCoalescable},
		{"ids", 70000, broken, tap.ErrNotCoalescable},
		{"short in the middle", 70000, short, tap.ErrNotCoalescable},
		{"arp", 70000, [][]byte{arp, arp}, tap.ErrNotCoalescable},
		{"too many", 70000, run(tap.MaxGSOSegments+1, 10), tap.ErrSuperFrameTooLarge},
		{"too long", 70000, run(16, 4112), tap.ErrSuperFrameTooLarge},
		{"dst too small", 42 + 3*100 - 1, run(3, 100), tap.ErrShortBuffer},
		{"dst too small for one", 42 + 100 - 1, run(1, 100), tap.ErrShortBuffer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := bytes.Repeat([]byte{0xAA}, tt.dst)
			n, h, err := tap.Coalesce(dst, tt.frames)
			if !errors.Is(err, tt.want) || n != 0 || h != (tap.VirtioNetHdr{}) {
				t.Fatalf("Coalesce = %d, %+v, %v; want 0, {}, %v", n, h, err, tt.want)
			}
			if bytes.Count(dst, []byte{0xAA}) != len(dst) {
				t.Errorf("dst written on error")
			}
		})
	}
	if n, _, err := tap.Coalesce(make([]byte, 70000), run(tap.MaxGSOSegments, 10)); err != nil || n != 42+640 {
		t.Errorf("Coalesce of MaxGSOSegments frames = %d, %v", n, err)
	}
}

func TestVnetAllocs(t *testing.T) {
	frames := vnetRoCEFrames(t, false, 15, 4096, 1000, 1, 0)
	dst := make([]byte, 70000)
	n, h, err := tap.Coalesce(dst, frames)
	if err != nil {
		t.Fatal(err)
	}
	super := dst[:n]
	bufs, sizes := vnetBufs(64, 16+4200)
	cases := []struct {
		name string
		fn   func()
	}{
		{"SplitUSO", func() { _, _ = tap.SplitUSO(&h, super, bufs, sizes, 16) }},
		{"SplitUSO none", func() { _, _ = tap.SplitUSO(&tap.VirtioNetHdr{}, frames[0], bufs, sizes, 16) }},
		{"SplitUSO error", func() { _, _ = tap.SplitUSO(&h, super, bufs[:2], sizes, 16) }},
		{"Coalescable", func() { _ = tap.Coalescable(frames[0], frames[1]) }},
		{"CoalesceRun", func() { _ = tap.CoalesceRun(frames, 64) }},
		{"Coalesce", func() { _, _, _ = tap.Coalesce(dst, frames) }},
		{"Coalesce error", func() { _, _, _ = tap.Coalesce(dst[:10], frames) }},
		{"Encode/Decode", func() {
			var b [tap.VirtioNetHdrLen]byte
			h.Encode(b[:])
			_ = h.Decode(b[:])
		}},
	}
	for _, c := range cases {
		if a := testing.AllocsPerRun(100, c.fn); a != 0 {
			t.Errorf("%s: %v allocations per run, want 0", c.name, a)
		}
	}
}

// vnetBenchFrames returns 15 RoCE packets of 4112-byte UDP payload (BTH,
// 4096 bytes, ICRC) and their total length.
func vnetBenchFrames(b *testing.B) ([][]byte, int) {
	frames := vnetRoCEFrames(b, false, 15, 4096, 4096, 1, 0)
	total := 0
	for _, f := range frames {
		if len(f)-42 != 4112 {
			b.Fatalf("UDP payload %d, want 4112", len(f)-42)
		}
		total += len(f)
	}
	return frames, total
}

func BenchmarkSplitUSO(b *testing.B) {
	frames, total := vnetBenchFrames(b)
	dst := make([]byte, 70000)
	n, h, err := tap.Coalesce(dst, frames)
	if err != nil {
		b.Fatal(err)
	}
	bufs, sizes := vnetBufs(64, 16+4200)
	b.SetBytes(int64(total))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tap.SplitUSO(&h, dst[:n], bufs, sizes, 16); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCoalesce(b *testing.B) {
	frames, total := vnetBenchFrames(b)
	dst := make([]byte, 70000)
	b.SetBytes(int64(total))
	b.ReportAllocs()
	for b.Loop() {
		if k := tap.CoalesceRun(frames, 64); k != len(frames) {
			b.Fatalf("CoalesceRun = %d", k)
		}
		if _, _, err := tap.Coalesce(dst, frames); err != nil {
			b.Fatal(err)
		}
	}
}

// vnetCheckSegments checks SplitUSO's output for super-frame super with
// header h: every segment a well-formed frame whose lengths agree, with
// the super-frame's headers but for lengths, ID and checksums, payloads
// that add up to the super-frame's.
func vnetCheckSegments(t *testing.T, h *tap.VirtioNetHdr, super []byte, bufs [][]byte, sizes []int, offset, n int) {
	t.Helper()
	if h.GSOType == tap.VirtioNetHdrGSONone {
		if n != 1 || !bytes.Equal(bufs[0][offset:offset+sizes[0]], super) {
			t.Fatalf("GSO NONE: frame not copied as is")
		}
		return
	}
	hl := 42
	if binary.BigEndian.Uint16(super[12:14]) == 0x86DD {
		hl = 62
	}
	l4 := hl - 8
	gso := int(h.GSOSize)
	payload := super[hl:]
	off := 0
	for i := range n {
		s := bufs[i][offset : offset+sizes[i]]
		if len(s) < hl {
			t.Fatalf("segment %d: %d bytes, shorter than the headers", i, len(s))
		}
		p := len(s) - hl
		if p > gso || i < n-1 && p != gso {
			t.Fatalf("segment %d: payload %d with gso_size %d", i, p, gso)
		}
		if !bytes.Equal(s[hl:], payload[off:off+p]) {
			t.Fatalf("segment %d: payload differs", i)
		}
		off += p
		if !bytes.Equal(s[:14], super[:14]) || !bytes.Equal(s[l4:l4+4], super[l4:l4+4]) {
			t.Fatalf("segment %d: Ethernet header or ports differ", i)
		}
		if int(binary.BigEndian.Uint16(s[l4+4:])) != len(s)-l4 || binary.BigEndian.Uint16(s[l4+6:]) != 0 {
			t.Fatalf("segment %d: UDP length or checksum wrong", i)
		}
		if hl == 62 {
			if int(binary.BigEndian.Uint16(s[18:20])) != len(s)-54 ||
				!bytes.Equal(s[14:18], super[14:18]) || !bytes.Equal(s[20:54], super[20:54]) {
				t.Fatalf("segment %d: IPv6 header wrong", i)
			}
		} else {
			ip, sp := s[14:34], super[14:34]
			if int(binary.BigEndian.Uint16(ip[2:4])) != len(s)-14 ||
				binary.BigEndian.Uint16(ip[4:6]) != binary.BigEndian.Uint16(sp[4:6])+uint16(i) ||
				vnetTestFold(vnetTestSum(0, ip)) != 0xFFFF ||
				!bytes.Equal(ip[0:2], sp[0:2]) || !bytes.Equal(ip[6:10], sp[6:10]) || !bytes.Equal(ip[12:20], sp[12:20]) {
				t.Fatalf("segment %d: IPv4 header wrong: % x", i, ip)
			}
		}
	}
	if off != len(payload) {
		t.Fatalf("segments carry %d of %d payload bytes", off, len(payload))
	}
}

func FuzzSplitUSO(f *testing.F) {
	frames := vnetRoCEFrames(f, false, 5, 256, 100, 0xFFFE, 0)
	super := make([]byte, 70000)
	n, h, err := tap.Coalesce(super, frames)
	if err != nil {
		f.Fatal(err)
	}
	var hb [tap.VirtioNetHdrLen]byte
	h.Encode(hb[:])
	f.Add(hb[:], super[:n], uint8(8), uint16(400), uint8(10))
	f.Add(hb[:], super[:n], uint8(3), uint16(400), uint8(0))
	frames6 := vnetRoCEFrames(f, true, 3, 512, 512, 0, 0)
	n6, h6, _ := tap.Coalesce(super, frames6)
	h6.Encode(hb[:])
	f.Add(append([]byte(nil), hb[:]...), super[:n6], uint8(3), uint16(700), uint8(1))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, frames[0], uint8(1), uint16(2000), uint8(4))
	f.Add([]byte{1, 5, 0, 0, 1, 0, 0, 0, 0, 0}, vnetTestFlow(false).build(3, make([]byte, 10)), uint8(16), uint16(60), uint8(2))
	f.Add([]byte{1, 5}, []byte{}, uint8(0), uint16(0), uint8(0))
	f.Fuzz(func(t *testing.T, hdr, frame []byte, nbufs uint8, size uint16, offset uint8) {
		var h tap.VirtioNetHdr
		if h.Decode(hdr) != nil {
			return
		}
		const guard = 64
		count := int(nbufs) % 80
		bsize := int(size) % 5000
		off := int(offset) % 32
		arena := bytes.Repeat([]byte{0xAA}, count*(bsize+guard))
		bufs := make([][]byte, count)
		for i := range bufs {
			start := i * (bsize + guard)
			bufs[i] = arena[start : start+bsize : start+bsize+guard]
		}
		sizes := make([]int, count)
		in := append([]byte(nil), frame...)
		n, err := tap.SplitUSO(&h, frame, bufs, sizes, off)
		if !bytes.Equal(in, frame) {
			t.Fatalf("SplitUSO modified its input")
		}
		if err != nil {
			if n != 0 || bytes.Count(arena, []byte{0xAA}) != len(arena) {
				t.Fatalf("SplitUSO wrote on error %v", err)
			}
			return
		}
		if n < 1 || n > count {
			t.Fatalf("SplitUSO = %d with %d buffers", n, count)
		}
		for i := range count {
			b := bufs[i][:cap(bufs[i])]
			written := 0
			if i < n {
				written = sizes[i]
				if written < 0 || off+written > len(bufs[i]) {
					t.Fatalf("segment %d: size %d at offset %d beyond a %d-byte buffer", i, written, off, len(bufs[i]))
				}
			}
			for j, c := range b {
				if (j < off || j >= off+written) && c != 0xAA {
					t.Fatalf("buffer %d: byte %d written outside the segment", i, j)
				}
			}
		}
		vnetCheckSegments(t, &h, frame, bufs, sizes, off, n)
	})
}

func FuzzCoalesceSplit(f *testing.F) {
	f.Add(false, uint8(15), uint16(1040), uint16(300), uint16(0xFFF0), uint64(1), uint8(0), uint8(0))
	f.Add(true, uint8(15), uint16(4112), uint16(4112), uint16(0), uint64(2), uint8(0), uint8(0))
	f.Add(false, uint8(70), uint16(7), uint16(1), uint16(3), uint64(3), uint8(0), uint8(0))
	f.Add(false, uint8(9), uint16(100), uint16(50), uint16(3), uint64(4), uint8(3), uint8(4))
	f.Add(true, uint8(1), uint16(1), uint16(1), uint16(3), uint64(5), uint8(0), uint8(0))
	f.Add(true, uint8(20), uint16(8000), uint16(8000), uint16(3), uint64(6), uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, v6 bool, k uint8, seg, last, id uint16, seed uint64, breakAt, breakHow uint8) {
		count := 1 + int(k)%80
		s := 1 + int(seg)%9000
		l := 1 + int(last)%s
		r := rand.New(rand.NewPCG(seed, uint64(count)))
		fl := vnetTestFlow(v6)
		fl.tos, fl.ttl, fl.flow = uint8(r.Uint32()), uint8(r.Uint32()), r.Uint32()&0xFFFFF
		fl.srcPort, fl.udpCsum = uint16(r.Uint32()), uint16(r.Uint32())
		frames := make([][]byte, count)
		for i := range frames {
			size := s
			if i == count-1 {
				size = l
			}
			frames[i] = fl.build(id+uint16(i), vnetTestPayload(r, size))
		}
		// Optionally break one frame so that the run ends before it.
		broken := count
		if b := int(breakAt); b > 0 && b < count {
			broken = b
			g := fl
			switch breakHow % 6 {
			case 0:
				g.ttl++
			case 1:
				g.srcPort++
			case 2:
				g.dst[0] ^= 2
			case 3:
				g.tos++
			case 4:
				g.dstIP = g.dstIP.Next()
			case 5:
				g = vnetTestFlow(!v6)
			}
			frames[b] = g.build(id+uint16(b), frames[b][vnetL4(frames[b])+8:])
		}
		// The run, worked out independently: up to the broken frame,
		// MaxGSOSegments frames and 65535 bytes of IP datagram.
		want, ipLen := 0, 28
		if v6 {
			ipLen = 48
		}
		for want < min(broken, tap.MaxGSOSegments) {
			p := len(frames[want]) - vnetL4(frames[want]) - 8
			if ipLen+p > 65535 {
				break
			}
			ipLen += p
			want++
		}
		run := tap.CoalesceRun(frames, 1000)
		if run != want {
			t.Fatalf("CoalesceRun = %d, want %d", run, want)
		}
		dst := make([]byte, 14+65535)
		if run < count {
			if _, _, err := tap.Coalesce(dst, frames); err == nil {
				t.Fatalf("Coalesce of %d frames succeeded where the run is %d", count, run)
			}
		}
		n, h, err := tap.Coalesce(dst, frames[:run])
		if err != nil {
			t.Fatalf("Coalesce of the run: %v", err)
		}
		const offset = 10
		bufs, sizes := vnetBufs(run, offset+s+62)
		got, err := tap.SplitUSO(&h, dst[:n], bufs, sizes, offset)
		if err != nil || got != run {
			t.Fatalf("SplitUSO = %d, %v; want %d", got, err, run)
		}
		superCsum, superLen := uint16(0), uint16(0)
		if run > 1 {
			l4 := vnetL4(dst)
			superCsum, superLen = binary.BigEndian.Uint16(dst[l4+6:]), binary.BigEndian.Uint16(dst[l4+4:])
		}
		for i := range run {
			sgm := bufs[i][offset : offset+sizes[i]]
			if run == 1 {
				if !bytes.Equal(sgm, frames[0]) {
					t.Fatalf("single frame changed")
				}
				continue
			}
			if !vnetEqualButUDPCsum(sgm, frames[i]) {
				t.Fatalf("segment %d differs from frame %d beyond the UDP checksum", i, i)
			}
			if kc, rc := vnetKernelChecksum(superCsum, superLen, sgm), vnetRFCChecksum(sgm); kc != rc {
				t.Fatalf("segment %d: kernel checksum %#04x, correct %#04x", i, kc, rc)
			}
		}
	})
}
