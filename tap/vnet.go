package tap

import (
	"bytes"
	"encoding/binary"
	"errors"
)

// A TAP device opened with IFF_VNET_HDR puts a virtio-net header in front
// of every frame, in both directions (drivers/net/tun.c, tun_vnet.h). With
// the offloads TUN_F_CSUM|TUN_F_USO4|TUN_F_USO6 set, one write can carry a
// UDP GSO super-frame that the kernel cuts into datagrams, and one read can
// return such a super-frame whole. This file holds the frame logic of that:
// the header codec, SplitUSO for reads, Coalesce for writes. It makes no
// system calls and allocates nothing.
//
// The header is struct virtio_net_hdr of include/uapi/linux/virtio_net.h,
// 10 bytes, TAP's default header size:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|     flags     |   gso_type    |            hdr_len            |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|           gso_size            |          csum_start           |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|          csum_offset          |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// The four 16-bit fields are __virtio16: TAP uses the legacy virtio rule,
// the host's byte order, unless TUNSETVNETLE/TUNSETVNETBE says otherwise
// (tun_vnet_is_little_endian). On the hosts taproce runs on (x86-64,
// arm64) that is little-endian, which Encode and Decode use; a big-endian
// host would have to set TUNSETVNETLE.
//
// What the kernel does with these headers, as this file relies on it
// (include/linux/virtio_net.h, net/ipv4/udp_offload.c, net/ipv4/af_inet.c,
// net/ipv6/ip6_offload.c):
//
//   - On write, virtio_net_hdr_to_skb accepts GSO_UDP_L4 only with
//     F_NEEDS_CSUM, csum_offset 6 (the UDP checksum), a non-zero gso_size
//     other than 0xFFFF, no ECN bit, and at most UDP_MAX_SEGMENTS
//     segments' worth of payload (64 on older kernels, 128 on newer ones).
//     A packet whose payload fits in one gso_size is not treated as GSO.
//   - Segmentation (__udp_gso_segment) requires csum_start to be the UDP
//     header, cuts the payload into gso_size pieces (the last may be
//     shorter), copies Ethernet, IP and UDP headers into each, sets the UDP
//     length, and adjusts the UDP checksum field from the super-frame's
//     UDP length to the segment's before completing the checksum;
//     inet_gso_segment gives IPv4 segment i the ID id+i and its own total
//     length and header checksum, ipv6_gso_segment sets each payload
//     length. Everything else (MACs, TOS, DF, TTL, flow label, hop limit,
//     addresses, ports) is copied unchanged.
//   - On read, virtio_net_hdr_from_skb reports a USO skb with GSO_UDP_L4,
//     its gso_size, and hdr_len = skb_headlen(skb), which is only a hint
//     for how much of the skb is linear, not the header length. Such
//     super-frames come from GSO writers (another offloading TAP, a
//     UDP_SEGMENT socket); UDP GRO merges only datagrams with a non-zero
//     UDP checksum (udp_gro_receive_segment), so rxe's datagrams, sent
//     with checksum 0, arrive one by one.

// VirtioNetHdrLen is the length of struct virtio_net_hdr, the header TAP
// puts in front of each frame by default (TUNSETVNETHDRSZ can make it
// longer; taproce keeps the default).
const VirtioNetHdrLen = 10

// Flags of VirtioNetHdr (VIRTIO_NET_HDR_F_*).
const (
	// VirtioNetHdrFNeedsCsum: the checksum at CsumStart+CsumOffset is to
	// be completed over the bytes from CsumStart to the end of the packet;
	// the field holds the pseudo-header sum meanwhile.
	VirtioNetHdrFNeedsCsum = 1
	// VirtioNetHdrFDataValid: the checksum was already verified.
	VirtioNetHdrFDataValid = 2
)

// GSO types of VirtioNetHdr (VIRTIO_NET_HDR_GSO_*).
const (
	// VirtioNetHdrGSONone: a plain frame.
	VirtioNetHdrGSONone = 0
	// VirtioNetHdrGSOTCPv4: TCP segmentation offload over IPv4.
	VirtioNetHdrGSOTCPv4 = 1
	// VirtioNetHdrGSOUDP: UDP fragmentation offload (UFO, IP fragments).
	VirtioNetHdrGSOUDP = 3
	// VirtioNetHdrGSOTCPv6: TCP segmentation offload over IPv6.
	VirtioNetHdrGSOTCPv6 = 4
	// VirtioNetHdrGSOUDPL4: UDP segmentation offload (USO) over IPv4 or
	// IPv6: one UDP datagram per gso_size bytes of payload.
	VirtioNetHdrGSOUDPL4 = 5
	// VirtioNetHdrGSOECN: a flag ORed into the TCP types (ECN CWR set).
	VirtioNetHdrGSOECN = 0x80
)

// MaxGSOSegments is the most datagrams Coalesce puts into one super-frame:
// the kernel's UDP_MAX_SEGMENTS on older kernels (newer ones allow 128),
// above which a write of GSO_UDP_L4 fails with EINVAL.
const MaxGSOSegments = 64

// Errors of the virtio-net header and super-frame logic. Buffers too small
// for a frame are reported with ErrShortBuffer.
var (
	// ErrVnetHdrShort: fewer than VirtioNetHdrLen bytes to decode.
	ErrVnetHdrShort = errors.New("tap: virtio-net header shorter than 10 bytes")
	// ErrGSOType: a GSO type other than NONE and UDP_L4 (TSO, UFO, the ECN
	// flag), which taproce neither asks for nor handles.
	ErrGSOType = errors.New("tap: unsupported virtio-net GSO type")
	// ErrGSOSizeZero: a UDP_L4 super-frame with gso_size 0.
	ErrGSOSizeZero = errors.New("tap: UDP GSO super-frame with gso_size 0")
	// ErrFrameHeaders: the frame ends inside its Ethernet, IP or UDP
	// header.
	ErrFrameHeaders = errors.New("tap: frame too short for its Ethernet, IP and UDP headers")
	// ErrFrameNotUDP: not an untagged Ethernet frame carrying IPv4
	// without options or IPv6 without extension headers, then UDP.
	ErrFrameNotUDP = errors.New("tap: not an Ethernet/IPv4 or IPv6/UDP frame without options or VLAN tag")
	// ErrFrameFragment: an IPv4 fragment (MF set or non-zero offset).
	ErrFrameFragment = errors.New("tap: frame is an IPv4 fragment")
	// ErrFrameLength: the IP and UDP length fields disagree with each
	// other or with the frame (super-frames beyond 64 KiB, whose length
	// fields are 0, included).
	ErrFrameLength = errors.New("tap: IP and UDP lengths disagree with the frame")
	// ErrBatchTooSmall: a super-frame holds more datagrams than there are
	// buffers (or sizes) to put them in.
	ErrBatchTooSmall = errors.New("tap: super-frame has more segments than buffers")
	// ErrNotCoalescable: the frames given to Coalesce cannot form one UDP
	// GSO super-frame (see Coalescable and CoalesceRun).
	ErrNotCoalescable = errors.New("tap: frames cannot form one UDP GSO super-frame")
	// ErrSuperFrameTooLarge: the frames would make a super-frame beyond
	// 65535 bytes of IP datagram or of more than MaxGSOSegments datagrams.
	ErrSuperFrameTooLarge = errors.New("tap: super-frame too large")
)

// VirtioNetHdr is struct virtio_net_hdr, decoded (see the diagram above).
type VirtioNetHdr struct {
	// Flags holds VirtioNetHdrF* bits.
	Flags uint8
	// GSOType is one of VirtioNetHdrGSO*.
	GSOType uint8
	// HdrLen is the length of the Ethernet, IP and UDP/TCP headers on
	// write; on read only a hint for how much of the packet is linear.
	HdrLen uint16
	// GSOSize is the payload per segment of a super-frame.
	GSOSize uint16
	// CsumStart is the offset, from the start of the Ethernet header, at
	// which checksumming starts (the UDP header).
	CsumStart uint16
	// CsumOffset is the offset of the checksum field from CsumStart (6
	// for UDP).
	CsumOffset uint16
}

// Decode fills h from the first VirtioNetHdrLen bytes of b. It returns
// ErrVnetHdrShort when b is shorter.
func (h *VirtioNetHdr) Decode(b []byte) error {
	if len(b) < VirtioNetHdrLen {
		return ErrVnetHdrShort
	}
	h.Flags = b[0]
	h.GSOType = b[1]
	h.HdrLen = binary.LittleEndian.Uint16(b[2:4])
	h.GSOSize = binary.LittleEndian.Uint16(b[4:6])
	h.CsumStart = binary.LittleEndian.Uint16(b[6:8])
	h.CsumOffset = binary.LittleEndian.Uint16(b[8:10])
	return nil
}

// Encode writes h into the first VirtioNetHdrLen bytes of b, which must be
// that long (Encode panics otherwise, as binary.PutUint16 does).
func (h *VirtioNetHdr) Encode(b []byte) {
	_ = b[VirtioNetHdrLen-1]
	b[0] = h.Flags
	b[1] = h.GSOType
	binary.LittleEndian.PutUint16(b[2:4], h.HdrLen)
	binary.LittleEndian.PutUint16(b[4:6], h.GSOSize)
	binary.LittleEndian.PutUint16(b[6:8], h.CsumStart)
	binary.LittleEndian.PutUint16(b[8:10], h.CsumOffset)
}

// Frame layout constants (the same values as appliance/roce's, which this
// package does not import).
const (
	vnetEthLen    = 14
	vnetIPv4Len   = 20
	vnetIPv6Len   = 40
	vnetUDPLen    = 8
	vnetEtherIPv4 = 0x0800
	vnetEtherIPv6 = 0x86DD
	vnetProtoUDP  = 17
	vnetMaxIPLen  = 0xFFFF
	// vnetUDPCsumOffset is the offset of the checksum in the UDP header.
	vnetUDPCsumOffset = 6
)

// vnetParseUDP checks that f is an untagged Ethernet frame carrying IPv4
// without options and not fragmented, or IPv6 without extension headers,
// then UDP, with the IP and UDP lengths both matching len(f) exactly. It
// returns the length of the Ethernet, IP and UDP headers (42 or 62) and
// whether the frame is IPv6. f[:hdrLen] is in bounds when err is nil.
func vnetParseUDP(f []byte) (hdrLen int, v6 bool, err error) {
	if len(f) < vnetEthLen {
		return 0, false, ErrFrameHeaders
	}
	switch binary.BigEndian.Uint16(f[12:14]) {
	case vnetEtherIPv4:
		const l4 = vnetEthLen + vnetIPv4Len
		if len(f) < l4 {
			return 0, false, ErrFrameHeaders
		}
		ip := f[vnetEthLen:l4]
		if ip[0] != 0x45 || ip[9] != vnetProtoUDP {
			return 0, false, ErrFrameNotUDP
		}
		if binary.BigEndian.Uint16(ip[6:8])&0x3FFF != 0 {
			return 0, false, ErrFrameFragment
		}
		if len(f) < l4+vnetUDPLen {
			return 0, false, ErrFrameHeaders
		}
		if int(binary.BigEndian.Uint16(ip[2:4])) != len(f)-vnetEthLen ||
			int(binary.BigEndian.Uint16(f[l4+4:l4+6])) != len(f)-l4 {
			return 0, false, ErrFrameLength
		}
		return l4 + vnetUDPLen, false, nil
	case vnetEtherIPv6:
		const l4 = vnetEthLen + vnetIPv6Len
		if len(f) < l4 {
			return 0, false, ErrFrameHeaders
		}
		if f[vnetEthLen]>>4 != 6 || f[vnetEthLen+6] != vnetProtoUDP {
			return 0, false, ErrFrameNotUDP
		}
		if len(f) < l4+vnetUDPLen {
			return 0, false, ErrFrameHeaders
		}
		if int(binary.BigEndian.Uint16(f[vnetEthLen+4:vnetEthLen+6])) != len(f)-l4 ||
			int(binary.BigEndian.Uint16(f[l4+4:l4+6])) != len(f)-l4 {
			return 0, false, ErrFrameLength
		}
		return l4 + vnetUDPLen, true, nil
	}
	return 0, false, ErrFrameNotUDP
}

// vnetSum adds the big-endian 16-bit words of b (an odd last byte padded
// with zero) to the one's-complement accumulator s.
func vnetSum(s uint32, b []byte) uint32 {
	for len(b) >= 2 {
		s += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	return s
}

// vnetFold folds the accumulator s to 16 bits with end-around carry, not
// complemented.
func vnetFold(s uint32) uint16 {
	for s > 0xFFFF {
		s = s&0xFFFF + s>>16
	}
	return uint16(s)
}

// SplitUSO cuts what one read() from an offloading TAP returned after the
// virtio-net header h into Ethernet frames: frame i goes to bufs[i][offset:]
// with its length in sizes[i], and n is the number of frames.
//
// When h.GSOType is VirtioNetHdrGSONone (or h is nil), frame is copied as
// it is into bufs[0] and n is 1; it need not be IP at all. When it is
// VirtioNetHdrGSOUDPL4, frame is a super-frame: Ethernet (14 bytes, no VLAN
// tag), IPv4 without options or IPv6 without extension headers, and UDP,
// once, then the payloads of the datagrams, h.GSOSize bytes each, the last
// possibly shorter. SplitUSO writes each datagram as the kernel's UDP GSO
// segmentation would have produced it: the super-frame's headers with
// IPv4 ID first+i (modulo 2^16), total length and header checksum
// recomputed, or the IPv6 payload length set, and the UDP length set.
// h.HdrLen is not used: on read it is only a hint (skb_headlen); the
// headers are found in the frame itself. h.CsumStart and h.CsumOffset are
// not used either.
//
// The UDP checksum of every datagram is set to 0. In a NEEDS_CSUM
// super-frame the field holds only the pseudo-header sum of the whole
// datagram, so some value has to be written, and computing real checksums
// would mean a second pass over every payload byte. RoCEv2 does not need
// them: the ICRC covers everything the UDP checksum covers and masks the
// checksum field, and rxe itself sends 0, on IPv4 and IPv6 alike. The
// frames SplitUSO returns go to taproce's own receive path, never back to
// the kernel (where a zero checksum over IPv6 would be dropped).
//
// SplitUSO checks everything before it writes anything; on error n is 0
// and the buffers are untouched. Errors: ErrGSOType for other GSO types,
// ErrGSOSizeZero, ErrFrameHeaders, ErrFrameNotUDP, ErrFrameFragment,
// ErrFrameLength for a super-frame that is not as described,
// ErrBatchTooSmall when there are more datagrams than min(len(bufs),
// len(sizes)), ErrShortBuffer when a buffer cannot hold its frame at
// offset (or offset is negative). It does not panic on any input and does
// not allocate.
func SplitUSO(h *VirtioNetHdr, frame []byte, bufs [][]byte, sizes []int, offset int) (n int, err error) {
	var gsoType uint8
	var gsoSize int
	if h != nil {
		gsoType, gsoSize = h.GSOType, int(h.GSOSize)
	}
	if offset < 0 {
		return 0, ErrShortBuffer
	}
	room := min(len(bufs), len(sizes))
	switch gsoType {
	case VirtioNetHdrGSONone:
		if room < 1 {
			return 0, ErrBatchTooSmall
		}
		if len(bufs[0])-offset < len(frame) {
			return 0, ErrShortBuffer
		}
		sizes[0] = copy(bufs[0][offset:], frame)
		return 1, nil
	case VirtioNetHdrGSOUDPL4:
	default:
		return 0, ErrGSOType
	}
	if gsoSize == 0 {
		return 0, ErrGSOSizeZero
	}
	hl, v6, err := vnetParseUDP(frame)
	if err != nil {
		return 0, err
	}
	payload := frame[hl:]
	segs := 1
	if len(payload) > gsoSize {
		segs = (len(payload) + gsoSize - 1) / gsoSize
	}
	if segs > room {
		return 0, ErrBatchTooSmall
	}
	for i := range segs {
		if len(bufs[i])-offset < hl+min(gsoSize, len(payload)-i*gsoSize) {
			return 0, ErrShortBuffer
		}
	}

	l4 := hl - vnetUDPLen
	hdr := frame[:hl]
	// IPv4: the header's one's-complement sum without total length, ID
	// and checksum, to which each segment adds its own two.
	var base uint32
	var id uint16
	if !v6 {
		ip := hdr[vnetEthLen:l4]
		base = vnetSum(vnetSum(vnetSum(0, ip[0:2]), ip[6:10]), ip[12:20])
		id = binary.BigEndian.Uint16(ip[4:6])
	}
	for i := range segs {
		chunk := payload[i*gsoSize:]
		chunk = chunk[:min(gsoSize, len(chunk))]
		seg := bufs[i][offset : offset+hl+len(chunk)]
		copy(seg[hl:], chunk)
		segmentHeaders(seg, hdr, l4, v6, base, id+uint16(i))
		sizes[i] = len(seg)
	}
	return segs, nil
}

// Coalescable reports whether frame b can follow frame a in one UDP GSO
// super-frame whose segment size is a's UDP payload length: both are
// untagged Ethernet frames with IPv4 (no options, not fragmented) or IPv6
// (next header UDP) and UDP, with IP and UDP lengths matching the frame;
// they have identical Ethernet headers, IP versions and addresses, IPv4
// TOS, TTL and flags (DF) or IPv6 traffic class, flow label and hop limit,
// and UDP ports; b's IPv4 ID is a's plus 1 (modulo 2^16); and both carry
// UDP payload, b no more than a. The UDP checksums are not compared: the
// kernel recomputes them.
//
// A run of frames f0, f1, … needs in addition that every frame but the
// last carries exactly f0's payload length; CoalesceRun checks that.
func Coalescable(a, b []byte) bool {
	hl, v6, err := vnetParseUDP(a)
	if err != nil {
		return false
	}
	hb, _, err := vnetParseUDP(b)
	if err != nil || hb != hl {
		return false
	}
	return vnetFollows(a, b, hl, v6)
}

// vnetFollows is Coalescable for two frames that vnetParseUDP accepted
// with header length hl.
func vnetFollows(a, b []byte, hl int, v6 bool) bool {
	pa, pb := len(a)-hl, len(b)-hl
	if pa < 1 || pb < 1 || pb > pa {
		return false
	}
	if !bytes.Equal(a[:vnetEthLen], b[:vnetEthLen]) {
		return false
	}
	l4 := hl - vnetUDPLen
	// UDP source and destination ports.
	if !bytes.Equal(a[l4:l4+4], b[l4:l4+4]) {
		return false
	}
	ip, iq := a[vnetEthLen:l4], b[vnetEthLen:l4]
	if v6 {
		// Version, traffic class, flow label; then (after the payload
		// length) next header, hop limit and both addresses.
		return bytes.Equal(ip[0:4], iq[0:4]) && bytes.Equal(ip[6:40], iq[6:40])
	}
	// Version/IHL and TOS; flags/fragment offset, TTL and protocol;
	// both addresses; consecutive IDs.
	return bytes.Equal(ip[0:2], iq[0:2]) && bytes.Equal(ip[6:10], iq[6:10]) &&
		bytes.Equal(ip[12:20], iq[12:20]) &&
		binary.BigEndian.Uint16(iq[4:6]) == binary.BigEndian.Uint16(ip[4:6])+1
}

// vnetRun measures the longest leading run of frames, at most limit of them,
// that forms one super-frame: it returns the run's length k (1 when
// frames[0] cannot start a super-frame, 0 when frames is empty or limit < 1),
// the header length hl and IP version of the run, its segment size seg
// and total UDP payload, and whether the run stopped because one more
// frame would have made the IP datagram longer than 65535 bytes.
func vnetRun(frames [][]byte, limit int) (k, hl int, v6 bool, seg, total int, tooLarge bool) {
	if len(frames) == 0 || limit < 1 {
		return 0, 0, false, 0, 0, false
	}
	hl, v6, err := vnetParseUDP(frames[0])
	if err != nil {
		return 1, 0, false, 0, 0, false
	}
	seg = len(frames[0]) - hl
	if seg < 1 {
		return 1, 0, false, 0, 0, false
	}
	ipHdr := hl - vnetEthLen - vnetUDPLen
	total = seg
	k = 1
	for k < len(frames) && k < limit {
		prev, f := frames[k-1], frames[k]
		if len(prev)-hl != seg {
			break // prev was a shorter last segment
		}
		if h, _, err := vnetParseUDP(f); err != nil || h != hl || !vnetFollows(prev, f, hl, v6) {
			break
		}
		p := len(f) - hl
		if ipHdr+vnetUDPLen+total+p > vnetMaxIPLen {
			tooLarge = true
			break
		}
		total += p
		k++
	}
	return k, hl, v6, seg, total, tooLarge
}

// CoalesceRun returns how many leading frames can go into one UDP GSO
// super-frame: at most max and MaxGSOSegments of them, each Coalescable
// after the one before, all with the first frame's UDP payload length but
// the last, which may be shorter, and no more than 65535 bytes of IP
// datagram in all. It returns 1 when frames[0] cannot start a super-frame
// (it then goes alone, with an empty virtio-net header), and 0 when frames
// is empty or max < 1. It does not allocate.
func CoalesceRun(frames [][]byte, max int) int {
	k, _, _, _, _, _ := vnetRun(frames, min(max, MaxGSOSegments))
	return k
}

// Coalesce writes frames into dst as one UDP GSO super-frame and returns
// its length n and the virtio-net header h to write in front of it.
//
// With one frame, the frame is copied unchanged (it need not be IP at all)
// and h is the zero header: GSO NONE, no flags. With more, the frames must
// form one run as CoalesceRun describes; the super-frame is then frames[0]'s
// Ethernet, IP and UDP headers with the IPv4 total length (and header
// checksum) or IPv6 payload length and the UDP length covering all the
// payloads, followed by every frame's UDP payload back to back. h has
// GSOType UDP_L4, GSOSize the first frame's payload length, HdrLen the
// header length (42 or 62), Flags NEEDS_CSUM, CsumStart the offset of the
// UDP header and CsumOffset 6.
//
// For CHECKSUM_PARTIAL the kernel expects the UDP checksum field to hold
// the folded, not complemented, one's-complement sum of the pseudo-header
// (source and destination address, protocol 17, UDP length), as
// udp4_hwcsum and udp6_hwcsum write it (~csum_tcpudp_magic(...)). The
// length in it is the super-frame's UDP length, the one in its UDP header:
// __udp_gso_segment (net/ipv4/udp_offload.c) adjusts the field of each
// segment by subtracting the super-frame's uh->len and adding the
// segment's ("compute checksum adjustment based on old length versus
// new"), then completes the checksum over the segment.
//
// Segmentation then gives segment i the IPv4 ID of frames[0] plus i, its
// own lengths and IPv4 header checksum, and copies everything else from
// the super-frame's headers, so each datagram the kernel produces equals
// frames[i] byte for byte except the UDP checksum, which the kernel fills
// in. dst must not overlap the frames. Errors: ErrNotCoalescable (also for
// no frames at all), ErrSuperFrameTooLarge, ErrShortBuffer when dst is too
// small. Coalesce does not allocate.
func Coalesce(dst []byte, frames [][]byte) (n int, h VirtioNetHdr, err error) {
	switch len(frames) {
	case 0:
		return 0, VirtioNetHdr{}, ErrNotCoalescable
	case 1:
		if len(dst) < len(frames[0]) {
			return 0, VirtioNetHdr{}, ErrShortBuffer
		}
		return copy(dst, frames[0]), VirtioNetHdr{}, nil
	}
	hl, v6, seg, total, err := wholeRun(frames)
	if err != nil {
		return 0, VirtioNetHdr{}, err
	}
	n = hl + total
	if len(dst) < n {
		return 0, VirtioNetHdr{}, ErrShortBuffer
	}
	dst = dst[:n]
	off := hl
	for _, f := range frames {
		off += copy(dst[off:], f[hl:])
	}
	h = coalesceHeader(dst[:hl], frames[0], v6, seg, total)
	return n, h, nil
}

// CoalesceHeader is Coalesce without the payloads: it writes into dst only
// the headers of the super-frame (their length is returned) for a writer
// that gathers the payloads from the frames themselves (writev), and
// returns the virtio-net header that describes it.
func CoalesceHeader(dst []byte, frames [][]byte) (hl int, h VirtioNetHdr, err error) {
	if len(frames) < 2 {
		return 0, VirtioNetHdr{}, ErrNotCoalescable
	}
	hl, v6, seg, total, err := wholeRun(frames)
	if err != nil {
		return 0, VirtioNetHdr{}, err
	}
	if len(dst) < hl {
		return 0, VirtioNetHdr{}, ErrShortBuffer
	}
	return hl, coalesceHeader(dst[:hl], frames[0], v6, seg, total), nil
}

// wholeRun checks that all of frames make one super-frame and returns its
// header length, IP version, segment size and total payload.
func wholeRun(frames [][]byte) (hl int, v6 bool, seg, total int, err error) {
	k, hl, v6, seg, total, tooLarge := vnetRun(frames, len(frames))
	switch {
	case k < len(frames) && tooLarge:
		return 0, false, 0, 0, ErrSuperFrameTooLarge
	case k < len(frames):
		return 0, false, 0, 0, ErrNotCoalescable
	case k > MaxGSOSegments:
		return 0, false, 0, 0, ErrSuperFrameTooLarge
	}
	return hl, v6, seg, total, nil
}

// coalesceHeader writes into dst (hl bytes) the first frame's headers with
// the lengths and checksums of a super-frame of total payload bytes in
// segments of seg.
func coalesceHeader(dst, first []byte, v6 bool, seg, total int) VirtioNetHdr {
	hl := len(dst)
	copy(dst, first[:hl])

	l4 := hl - vnetUDPLen
	udpLen := uint16(vnetUDPLen + total)
	pseudo := uint32(vnetProtoUDP) + uint32(udpLen)
	if v6 {
		binary.BigEndian.PutUint16(dst[vnetEthLen+4:], udpLen)
		pseudo = vnetSum(pseudo, dst[vnetEthLen+8:l4])
	} else {
		ip := dst[vnetEthLen:l4]
		binary.BigEndian.PutUint16(ip[2:4], vnetIPv4Len+udpLen)
		binary.BigEndian.PutUint16(ip[10:12], 0)
		binary.BigEndian.PutUint16(ip[10:12], ^vnetFold(vnetSum(0, ip)))
		pseudo = vnetSum(pseudo, ip[12:20])
	}
	binary.BigEndian.PutUint16(dst[l4+4:], udpLen)
	binary.BigEndian.PutUint16(dst[l4+vnetUDPCsumOffset:], vnetFold(pseudo))
	return VirtioNetHdr{
		Flags:      VirtioNetHdrFNeedsCsum,
		GSOType:    VirtioNetHdrGSOUDPL4,
		HdrLen:     uint16(hl),
		GSOSize:    uint16(seg),
		CsumStart:  uint16(l4),
		CsumOffset: vnetUDPCsumOffset,
	}
}

// SplitUSOEach cuts a read like SplitUSO but without copying: it hands fn
// each datagram as a frame inside frame itself, writing each datagram's
// headers over the last bytes of the one before, which fn has had by
// then. fn must not keep the slice. It returns how many datagrams it
// delivered.
func SplitUSOEach(h *VirtioNetHdr, frame []byte, fn func(seg []byte)) (int, error) {
	if h == nil || h.GSOType == VirtioNetHdrGSONone {
		fn(frame)
		return 1, nil
	}
	if h.GSOType != VirtioNetHdrGSOUDPL4 {
		return 0, ErrGSOType
	}
	gsoSize := int(h.GSOSize)
	if gsoSize == 0 {
		return 0, ErrGSOSizeZero
	}
	hl, v6, err := vnetParseUDP(frame)
	if err != nil {
		return 0, err
	}
	var saved [vnetEthLen + vnetIPv6Len + vnetUDPLen]byte
	hdr := saved[:copy(saved[:], frame[:hl])]
	l4 := hl - vnetUDPLen
	var base uint32
	var id uint16
	if !v6 {
		ip := hdr[vnetEthLen:l4]
		base = vnetSum(vnetSum(vnetSum(0, ip[0:2]), ip[6:10]), ip[12:20])
		id = binary.BigEndian.Uint16(ip[4:6])
	}
	n := 0
	for start := hl; start < len(frame) || n == 0; start += gsoSize {
		end := min(start+gsoSize, len(frame))
		seg := frame[start-hl : end]
		segmentHeaders(seg, hdr, l4, v6, base, id+uint16(n))
		fn(seg)
		n++
	}
	return n, nil
}

// segmentHeaders writes into seg, whose payload is in place behind them,
// the headers hdr of a super-frame made right for this one datagram, as
// the kernel's UDP segmentation makes them: the UDP length; on IPv6 the
// payload length; on IPv4 the total length, the datagram's ID and the
// header checksum (base is the sum of the fields all segments share); the
// UDP checksum 0, as rxe sends it and as the ICRC masks it.
func segmentHeaders(seg, hdr []byte, l4 int, v6 bool, base uint32, id uint16) {
	copy(seg, hdr)
	udpLen := uint16(len(seg) - l4)
	if v6 {
		binary.BigEndian.PutUint16(seg[vnetEthLen+4:], udpLen)
	} else {
		ip := seg[vnetEthLen:l4]
		tot := vnetIPv4Len + udpLen
		binary.BigEndian.PutUint16(ip[2:4], tot)
		binary.BigEndian.PutUint16(ip[4:6], id)
		binary.BigEndian.PutUint16(ip[10:12], ^vnetFold(base+uint32(tot)+uint32(id)))
	}
	binary.BigEndian.PutUint16(seg[l4+4:], udpLen)
	binary.BigEndian.PutUint16(seg[l4+vnetUDPCsumOffset:], 0)
}
