package roce_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/taproce/taproce/appliance/roce"
)

var (
	macA = roce.MAC{0x52, 0x54, 0x00, 0x63, 0x00, 0x02}
	macB = roce.MAC{0x52, 0x54, 0x00, 0x63, 0x00, 0x03}
	ip4A = netip.MustParseAddr("10.99.0.2")
	ip4B = netip.MustParseAddr("10.99.0.3")
	ip6A = netip.MustParseAddr("fe80::5054:ff:fe63:2")
	ip6B = netip.MustParseAddr("fd00:55::2")
)

// randomPacket returns a packet with opcode op and random values in every
// field op carries (and zero in the others, as Parse leaves them).
func randomPacket(r *rand.Rand, op roce.Opcode, ipv6 bool) roce.Packet {
	p := roce.Packet{
		DstMAC: macB, SrcMAC: macA,
		IPv6: ipv6, Src: ip4A, Dst: ip4B,
		TOS: uint8(r.Uint32()), TTL: uint8(r.Uint32()),
		SrcPort: 0xC000 | uint16(r.Uint32()), DstPort: roce.UDPPort,
		UDPChecksum: uint16(r.Uint32()),
		BTH: roce.BTHFields{
			Opcode:         op,
			SolicitedEvent: r.IntN(2) == 1,
			MigReq:         r.IntN(2) == 1,
			PKey:           uint16(r.Uint32()),
			FECN:           r.IntN(2) == 1,
			BECN:           r.IntN(2) == 1,
			DestQP:         r.Uint32() & roce.QPNMask,
			AckReq:         r.IntN(2) == 1,
			PSN:            roce.PSN(r.Uint32() & roce.PSNMask),
		},
	}
	if ipv6 {
		p.Src, p.Dst = ip6A, ip6B
		p.FlowLabel = r.Uint32() & 0xFFFFF
	} else {
		p.ID = uint16(r.Uint32())
		p.DontFragment = r.IntN(2) == 1
	}
	info := op.Info()
	if info.Has(roce.HasDETH) {
		p.DETH = roce.DETHFields{QKey: r.Uint32(), SrcQP: r.Uint32() & roce.QPNMask}
	}
	if info.Has(roce.HasFETH) {
		p.FETH = roce.FETHFields{Selectivity: uint8(r.IntN(4)), Placement: uint8(r.IntN(16))}
	}
	if info.Has(roce.HasRETH) {
		p.RETH = roce.RETHFields{VA: r.Uint64(), RKey: r.Uint32(), DMALen: r.Uint32()}
	}
	if info.Has(roce.HasAtomicETH) {
		p.AtomicETH = roce.AtomicETHFields{VA: r.Uint64(), RKey: r.Uint32(), SwapAdd: r.Uint64(), Compare: r.Uint64()}
	}
	if info.Has(roce.HasImmDt) {
		p.Imm = r.Uint32()
	}
	if info.Has(roce.HasIETH) {
		p.IETH = r.Uint32()
	}
	if info.Has(roce.HasAETH) {
		p.AETH = roce.AETHFields{Syndrome: roce.Syndrome(r.Uint32()), MSN: r.Uint32() & 0xFFFFFF}
	}
	if info.Has(roce.HasAtomicAckETH) {
		p.AtomicAck = r.Uint64()
	}
	return p
}

// TestOpcodeRoundTrip builds a packet of every opcode in the table, over
// IPv4 and IPv6 and with payloads of several sizes, parses it back and
// expects the same fields and a valid ICRC.
func TestOpcodeRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	valid := 0
	for o := 0; o < 256; o++ {
		op := roce.Opcode(o)
		if !op.Valid() {
			continue
		}
		valid++
		sizes := []int{0}
		if op.Info().Has(roce.HasPayload) {
			sizes = []int{0, 1, 2, 3, 4, 5, 255, 256, 1024, 4096}
		}
		for _, ipv6 := range []bool{false, true} {
			for _, n := range sizes {
				want := randomPacket(r, op, ipv6)
				payload := make([]byte, n)
				for i := range payload {
					payload[i] = byte(r.Uint32())
				}
				buf := make([]byte, 8192)
				m, err := want.Build(buf, payload)
				if err != nil {
					t.Fatalf("%v ipv6=%v len=%d: Build: %v", op, ipv6, n, err)
				}
				if m != want.FrameLen() {
					t.Fatalf("%v: Build wrote %d bytes, FrameLen %d", op, m, want.FrameLen())
				}
				var got roce.Packet
				if err := roce.Parse(buf[:m], &got); err != nil {
					t.Fatalf("%v ipv6=%v len=%d: Parse: %v", op, ipv6, n, err)
				}
				if got != want {
					t.Fatalf("%v ipv6=%v len=%d: round trip\n got %+v\nwant %+v", op, ipv6, n, got, want)
				}
				if !bytes.Equal(got.Payload(buf[:m]), payload) {
					t.Fatalf("%v: payload differs", op)
				}
				if err := got.VerifyICRC(buf[:m]); err != nil {
					t.Fatalf("%v: %v", op, err)
				}
				if m%4 != 2 { // 14-byte Ethernet header + 4-byte aligned rest
					t.Fatalf("%v len=%d: frame of %d bytes is not padded to 4 bytes after Ethernet", op, n, m)
				}
			}
		}
	}
	if valid != 40 {
		t.Errorf("%d valid opcodes, want 40 (25 RC, 12 UC, 2 UD, CNP)", valid)
	}
}

// TestOpcodeTable pins the table entries against the IBA header layouts.
func TestOpcodeTable(t *testing.T) {
	tests := []struct {
		op     roce.Opcode
		name   string
		extLen int
		flags  roce.OpFlags
	}{
		{roce.RCSendFirst, "RC_SEND_FIRST", 0, roce.Request | roce.First | roce.OpSend | roce.HasPayload},
		{roce.RCSendLastWithImmediate, "RC_SEND_LAST_WITH_IMMEDIATE", 4, roce.Request | roce.Last | roce.HasImmDt},
		{roce.RCRDMAWriteFirst, "RC_RDMA_WRITE_FIRST", 16, roce.Request | roce.First | roce.HasRETH | roce.OpWrite},
		{roce.RCRDMAWriteOnlyWithImmediate, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 20, roce.Only | roce.HasRETH | roce.HasImmDt},
		{roce.RCRDMAReadRequest, "RC_RDMA_READ_REQUEST", 16, roce.Request | roce.OpRead | roce.HasRETH},
		{roce.RCRDMAReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE", 0, roce.Response | roce.Middle | roce.HasPayload},
		{roce.RCRDMAReadResponseOnly, "RC_RDMA_READ_RESPONSE_ONLY", 4, roce.Response | roce.Only | roce.HasAETH},
		{roce.RCAcknowledge, "RC_ACKNOWLEDGE", 4, roce.Ack | roce.HasAETH},
		{roce.RCAtomicAcknowledge, "RC_ATOMIC_ACKNOWLEDGE", 12, roce.Response | roce.HasAETH | roce.HasAtomicAckETH},
		{roce.RCCompareSwap, "RC_COMPARE_SWAP", 28, roce.Request | roce.OpAtomic | roce.HasAtomicETH},
		{roce.RCFetchAdd, "RC_FETCH_ADD", 28, roce.Request | roce.OpAtomic | roce.HasAtomicETH},
		{roce.RCSendOnlyWithInvalidate, "RC_SEND_ONLY_WITH_INVALIDATE", 4, roce.Request | roce.Only | roce.HasIETH},
		{roce.RCFlush, "RC_FLUSH", 20, roce.Request | roce.HasFETH | roce.HasRETH},
		{roce.RCAtomicWrite, "RC_ATOMIC_WRITE", 16, roce.Request | roce.HasRETH | roce.HasPayload},
		{roce.UCRDMAWriteMiddle, "UC_RDMA_WRITE_MIDDLE", 0, roce.Request | roce.Middle},
		{roce.UDSendOnly, "UD_SEND_ONLY", 8, roce.Request | roce.Only | roce.HasDETH | roce.HasPayload},
		{roce.UDSendOnlyWithImmediate, "UD_SEND_ONLY_WITH_IMMEDIATE", 12, roce.HasDETH | roce.HasImmDt},
		{roce.CNP, "CNP", 16, roce.OpCNP | roce.HasCNPReserved},
	}
	for _, tt := range tests {
		info := tt.op.Info()
		if info.Name != tt.name || tt.op.String() != tt.name {
			t.Errorf("%#x: name %q, want %q", uint8(tt.op), info.Name, tt.name)
		}
		if info.ExtLen != tt.extLen {
			t.Errorf("%v: ExtLen %d, want %d", tt.op, info.ExtLen, tt.extLen)
		}
		if !info.Has(tt.flags) {
			t.Errorf("%v: flags %#x lack %#x", tt.op, info.Flags, tt.flags)
		}
	}
	// Header order: DETH before ImmDt, RETH before ImmDt, AETH before
	// AtomicAckETH, FETH before RETH.
	offsets := []struct {
		op   roce.Opcode
		hdr  roce.OpFlags
		want int
	}{
		{roce.UDSendOnlyWithImmediate, roce.HasImmDt, 8},
		{roce.RCRDMAWriteOnlyWithImmediate, roce.HasImmDt, 16},
		{roce.RCAtomicAcknowledge, roce.HasAtomicAckETH, 4},
		{roce.RCFlush, roce.HasRETH, 4},
		{roce.RCFlush, roce.HasFETH, 0},
	}
	for _, o := range offsets {
		got, ok := o.op.Info().Offset(o.hdr)
		if !ok || got != o.want {
			t.Errorf("%v: header %#x at %d (%v), want %d", o.op, o.hdr, got, ok, o.want)
		}
	}
	for _, bad := range []roce.Opcode{0x15, 0x18, 0x1E, 0x2C, 0x40, 0x60, 0x63, 0x66, 0x80, 0xA0, 0xFF} {
		if bad.Valid() {
			t.Errorf("%#x: valid, want rejected", uint8(bad))
		}
		if got := bad.String(); len(got) != len("OPCODE_0x00") {
			t.Errorf("%#x: String %q", uint8(bad), got)
		}
	}
}

// validFrame returns a freshly built frame of op with n payload bytes.
func validFrame(t *testing.T, op roce.Opcode, n int, ipv6 bool) []byte {
	t.Helper()
	p := randomPacket(rand.New(rand.NewPCG(7, uint64(op))), op, ipv6)
	buf := make([]byte, 8192)
	m, err := p.Build(buf, make([]byte, n))
	if err != nil {
		t.Fatal(err)
	}
	return buf[:m]
}

// fixIPv4Checksum recomputes the IPv4 header checksum after a mutation.
func fixIPv4Checksum(f []byte) {
	ip := roce.IPv4(f[roce.EthernetLen:])
	if ip.IHL() >= 20 && len(f) >= roce.EthernetLen+ip.IHL() {
		ip.SetChecksum(ip.ComputeChecksum())
	}
}

// TestParseErrors feeds malformed frames to Parse and expects the sentinel
// error of the check that must catch each.
func TestParseErrors(t *testing.T) {
	const v4 = roce.EthernetLen
	const udp4 = v4 + roce.IPv4Len
	const bth4 = udp4 + roce.UDPLen
	const v6 = roce.EthernetLen
	const udp6 = v6 + roce.IPv6Len
	tests := []struct {
		name   string
		op     roce.Opcode
		n      int
		ipv6   bool
		mutate func(f []byte) []byte
		want   error
	}{
		{"empty", roce.RCSendOnly, 8, false, func(f []byte) []byte { return f[:0] }, roce.ErrTruncated},
		{"ethernet only", roce.RCSendOnly, 8, false, func(f []byte) []byte { return f[:14] }, roce.ErrTruncated},
		{"short IPv4 header", roce.RCSendOnly, 8, false, func(f []byte) []byte { return f[:30] }, roce.ErrTruncated},
		{"no UDP header", roce.RCSendOnly, 8, false, func(f []byte) []byte { return f[:udp4+4] }, roce.ErrTruncated},
		{"cut inside payload", roce.RCSendOnly, 64, false, func(f []byte) []byte { return f[:len(f)-10] }, roce.ErrTruncated},
		{"cut IPv6", roce.RCSendOnly, 64, true, func(f []byte) []byte { return f[:len(f)-1] }, roce.ErrTruncated},
		{"short IPv6 header", roce.RCSendOnly, 8, true, func(f []byte) []byte { return f[:40] }, roce.ErrTruncated},
		{"ARP", roce.RCSendOnly, 8, false, func(f []byte) []byte { f[12], f[13] = 0x08, 0x06; return f }, roce.ErrNotRoCE},
		{"TCP", roce.RCSendOnly, 8, false, func(f []byte) []byte { f[v4+9] = 6; fixIPv4Checksum(f); return f }, roce.ErrNotRoCE},
		{"other UDP port", roce.RCSendOnly, 8, false, func(f []byte) []byte { f[udp4+3]++; return f }, roce.ErrNotRoCE},
		{"IPv6 other next header", roce.RCSendOnly, 8, true, func(f []byte) []byte { f[v6+6] = 0; return f }, roce.ErrNotRoCE},
		{"IPv6 other UDP port", roce.RCSendOnly, 8, true, func(f []byte) []byte { f[udp6+2] = 0; return f }, roce.ErrNotRoCE},
		{"IP version 6 in IPv4 frame", roce.RCSendOnly, 8, false, func(f []byte) []byte { f[v4] = 0x65; return f }, roce.ErrIPVersion},
		{"IP version 4 in IPv6 frame", roce.RCSendOnly, 8, true, func(f []byte) []byte { f[v6] = 0x40; return f }, roce.ErrIPVersion},
		{"IPv4 options", roce.RCSendOnly, 8, false, func(f []byte) []byte {
			g := append(append(append([]byte(nil), f[:udp4]...), 1, 1, 1, 0), f[udp4:]...) // four NOP/EOL bytes
			g[v4] = 0x46
			binary.BigEndian.PutUint16(g[v4+2:], uint16(len(g)-v4))
			fixIPv4Checksum(g)
			return g
		}, roce.ErrIPv4Options},
		{"IHL below 5", roce.RCSendOnly, 8, false, func(f []byte) []byte { f[v4] = 0x44; return f }, roce.ErrLength},
		{"more fragments", roce.RCSendOnly, 8, false, func(f []byte) []byte { f[v4+6] |= 0x20; fixIPv4Checksum(f); return f }, roce.ErrFragment},
		{"fragment offset", roce.RCSendOnly, 8, false, func(f []byte) []byte { f[v4+7] = 0x10; fixIPv4Checksum(f); return f }, roce.ErrFragment},
		{"IP total length beyond frame", roce.RCSendOnly, 8, false, func(f []byte) []byte {
			binary.BigEndian.PutUint16(f[v4+2:], uint16(len(f)-v4+4))
			fixIPv4Checksum(f)
			return f
		}, roce.ErrTruncated},
		{"IP total length below headers", roce.RCSendOnly, 8, false, func(f []byte) []byte {
			binary.BigEndian.PutUint16(f[v4+2:], 24)
			fixIPv4Checksum(f)
			return f
		}, roce.ErrLength},
		{"UDP length disagrees", roce.RCSendOnly, 8, false, func(f []byte) []byte { f[udp4+5] -= 4; return f }, roce.ErrLength},
		{"IPv6 UDP length disagrees", roce.RCSendOnly, 8, true, func(f []byte) []byte { f[udp6+5] += 4; return f }, roce.ErrLength},
		{"IPv6 payload length below UDP", roce.RCSendOnly, 8, true, func(f []byte) []byte { f[v6+4], f[v6+5] = 0, 4; return f }, roce.ErrLength},
		{"IPv4 checksum", roce.RCSendOnly, 8, false, func(f []byte) []byte { f[v4+10] ^= 1; return f }, roce.ErrIPChecksum},
		{"no room for BTH", roce.RCSendOnly, 8, false, func(f []byte) []byte {
			f = f[:bth4+8]
			binary.BigEndian.PutUint16(f[v4+2:], uint16(len(f)-v4))
			binary.BigEndian.PutUint16(f[udp4+4:], uint16(len(f)-udp4))
			fixIPv4Checksum(f)
			return f
		}, roce.ErrTruncated},
		{"transport version 1", roce.RCSendOnly, 8, false, func(f []byte) []byte { f[bth4+1] |= 1; return f }, roce.ErrTVer},
		{"reserved opcode 0x15", roce.RCSendOnly, 8, false, func(f []byte) []byte { f[bth4] = 0x15; return f }, roce.ErrOpcode},
		{"RD opcode", roce.RCSendOnly, 8, false, func(f []byte) []byte { f[bth4] = 0x44; return f }, roce.ErrOpcode},
		{"XRC opcode", roce.RCSendOnly, 8, false, func(f []byte) []byte { f[bth4] = 0xA4; return f }, roce.ErrOpcode},
		{"READ request without RETH room", roce.RCAcknowledge, 0, false, func(f []byte) []byte { f[bth4] = byte(roce.RCRDMAReadRequest); return f }, roce.ErrHeaderLength},
		{"pad count beyond payload", roce.RCSendOnly, 2, false, func(f []byte) []byte { f[bth4+1] |= 0x30; return dropPayload(f, 4) }, roce.ErrPadCount},
		{"pad count on ACK", roce.RCAcknowledge, 0, false, func(f []byte) []byte { f[bth4+1] |= 0x10; return f }, roce.ErrPadCount},
		{"payload on ACK", roce.RCSendOnly, 8, false, func(f []byte) []byte { f[bth4] = byte(roce.RCAcknowledge); return f }, roce.ErrUnexpectedPayload},
		{"payload on atomic", roce.RCSendOnly, 32, false, func(f []byte) []byte { f[bth4] = byte(roce.RCFetchAdd); return f }, roce.ErrUnexpectedPayload},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.mutate(validFrame(t, tt.op, tt.n, tt.ipv6))
			var p roce.Packet
			if err := roce.Parse(f, &p); !errors.Is(err, tt.want) {
				t.Fatalf("Parse = %v, want %v", err, tt.want)
			}
		})
	}
}

// dropPayload removes the last n bytes before the ICRC from an IPv4 frame
// and fixes the lengths and IP checksum.
func dropPayload(f []byte, n int) []byte {
	end := len(f) - roce.ICRCLen
	g := append(append([]byte(nil), f[:end-n]...), f[end:]...)
	binary.BigEndian.PutUint16(g[roce.EthernetLen+2:], uint16(len(g)-roce.EthernetLen))
	binary.BigEndian.PutUint16(g[roce.EthernetLen+roce.IPv4Len+4:], uint16(len(g)-roce.EthernetLen-roce.IPv4Len))
	fixIPv4Checksum(g)
	return g
}

// TestParseEthernetPadding accepts the zero bytes a NIC appends to frames
// shorter than 60 bytes.
func TestParseEthernetPadding(t *testing.T) {
	f := validFrame(t, roce.RCSendOnly, 0, false)
	if len(f) >= 60 {
		t.Fatalf("test frame is %d bytes, want < 60", len(f))
	}
	padded := append(f, make([]byte, 60-len(f))...)
	var p roce.Packet
	if err := roce.Parse(padded, &p); err != nil {
		t.Fatal(err)
	}
	if p.FrameLen() != len(f) || p.PayloadLen != 0 {
		t.Fatalf("FrameLen %d PayloadLen %d, want %d and 0", p.FrameLen(), p.PayloadLen, len(f))
	}
	if err := p.VerifyICRC(padded); err != nil {
		t.Fatal(err)
	}
}

// TestEncodeErrors checks what Encode and Build refuse.
func TestEncodeErrors(t *testing.T) {
	base := randomPacket(rand.New(rand.NewPCG(3, 4)), roce.RCSendOnly, false)
	tests := []struct {
		name    string
		mutate  func(p *roce.Packet)
		bufLen  int
		payload int
		want    error
	}{
		{"unknown opcode", func(p *roce.Packet) { p.BTH.Opcode = 0x15 }, 256, 0, roce.ErrOpcode},
		{"payload on ACK", func(p *roce.Packet) { p.BTH.Opcode = roce.RCAcknowledge }, 256, 4, roce.ErrUnexpectedPayload},
		{"buffer too small", func(p *roce.Packet) {}, 60, 64, roce.ErrBufferTooSmall},
		{"payload beyond buffer", func(p *roce.Packet) {}, 100, 200, roce.ErrBufferTooSmall},
		{"IPv6 addresses on IPv4", func(p *roce.Packet) { p.Src = ip6A }, 256, 0, roce.ErrAddress},
		{"IPv4 addresses on IPv6", func(p *roce.Packet) { p.IPv6 = true }, 256, 0, roce.ErrAddress},
		{"no address", func(p *roce.Packet) { p.Dst = netip.Addr{} }, 256, 0, roce.ErrAddress},
		{"datagram too large", func(p *roce.Packet) {}, 70000, 65520, roce.ErrLength},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := base
			tt.mutate(&p)
			if _, err := p.Build(make([]byte, tt.bufLen), make([]byte, tt.payload)); !errors.Is(err, tt.want) {
				t.Fatalf("Build = %v, want %v", err, tt.want)
			}
		})
	}
	p := base
	p.PayloadLen = 4
	p.BTH.PadCount = 4
	if _, err := p.Encode(make([]byte, 256)); !errors.Is(err, roce.ErrPadCount) {
		t.Fatalf("Encode with pad count 4 = %v, want ErrPadCount", err)
	}
}

// TestEncodeInPlace builds a frame whose payload was written first, as the
// transport does, and checks that it equals Build's output.
func TestEncodeInPlace(t *testing.T) {
	p := randomPacket(rand.New(rand.NewPCG(5, 6)), roce.RCRDMAWriteFirst, false)
	payload := bytes.Repeat([]byte{0xAB, 0xCD, 0xEF}, 100)
	a := make([]byte, 1024)
	n, err := p.Build(a, payload)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1024)
	for i := range b {
		b[i] = 0xEE // stale bytes must not leak into headers or pad
	}
	q := p
	q.SetPayloadLen(len(payload))
	copy(b[q.HeaderLen():], payload)
	m, err := q.Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a[:n], b[:m]) {
		t.Fatalf("Encode in place differs from Build\n got %x\nwant %x", b[:m], a[:n])
	}
}

func TestCheckPayloadLen(t *testing.T) {
	tests := []struct {
		op   roce.Opcode
		n    int
		want error
	}{
		{roce.RCSendFirst, 1024, nil},
		{roce.RCSendFirst, 1000, roce.ErrPayloadLength},
		{roce.RCSendMiddle, 1025, roce.ErrPayloadLength},
		{roce.RCRDMAReadResponseMiddle, 1024, nil},
		{roce.RCSendLast, 1, nil},
		{roce.RCSendLast, 0, roce.ErrPayloadLength},
		{roce.RCRDMAWriteLast, 1024, nil},
		{roce.RCRDMAWriteLast, 1025, roce.ErrPayloadLength},
		{roce.RCSendOnly, 0, nil},
		{roce.RCRDMAWriteOnly, 1024, nil},
		{roce.UDSendOnly, 1025, roce.ErrPayloadLength},
		{roce.RCAtomicWrite, 8, nil},
		{roce.RCAtomicWrite, 4, roce.ErrPayloadLength},
		{roce.RCAcknowledge, 0, nil},
		{roce.RCAcknowledge, 4, roce.ErrUnexpectedPayload},
		{0x15, 0, roce.ErrOpcode},
	}
	for _, tt := range tests {
		if err := roce.CheckPayloadLen(tt.op, tt.n, 1024); !errors.Is(err, tt.want) {
			t.Errorf("%v %d bytes: %v, want %v", tt.op, tt.n, err, tt.want)
		}
	}
}

func TestSyndrome(t *testing.T) {
	tests := []struct {
		s    roce.Syndrome
		kind roce.Syndrome
		str  string
	}{
		{0x1F, roce.SyndromeACK, "ACK(credits=31)"},
		{0x20 | 14, roce.SyndromeRNRNAK, "RNR_NAK(timer=14)"},
		{0x60, roce.SyndromeNAK, "NAK(PSN_SEQ_ERR)"},
		{0x61, roce.SyndromeNAK, "NAK(INV_REQ)"},
		{0x62, roce.SyndromeNAK, "NAK(REM_ACCESS_ERR)"},
		{0x63, roce.SyndromeNAK, "NAK(REM_OP_ERR)"},
		{0x64, roce.SyndromeNAK, "NAK(INV_RD_REQ)"},
		{0x65, roce.SyndromeNAK, "NAK(5)"},
		{0x40, 0x40, "RESERVED(0x40)"},
	}
	for _, tt := range tests {
		if tt.s.Kind() != tt.kind || tt.s.String() != tt.str {
			t.Errorf("%#x: kind %#x %q, want %#x %q", uint8(tt.s), uint8(tt.s.Kind()), tt.s.String(), uint8(tt.kind), tt.str)
		}
	}
}
