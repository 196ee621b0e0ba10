package tap

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/taproce/taproce/appliance/roce"
)

// runTemplate returns an RDMA WRITE MIDDLE packet of one flow, IPv4 or
// IPv6, for building runs.
func runTemplate(v6 bool) roce.Packet {
	p := roce.Packet{
		DstMAC: roce.MAC{2, 0, 0, 0, 0, 2}, SrcMAC: roce.MAC{2, 0, 0, 0, 0, 1}, TTL: 64, DontFragment: true,
		Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"),
		SrcPort: 0xC001, DstPort: roce.UDPPort,
		BTH: roce.BTHFields{Opcode: roce.RCRDMAWriteMiddle, PKey: 0xFFFF, DestQP: 9},
	}
	if v6 {
		p.IPv6, p.DontFragment = true, false
		p.Src, p.Dst = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	}
	return p
}

// TestCoalesceHeader: the header CoalesceHeader writes, followed by the
// frames' payloads, is exactly what Coalesce builds.
func TestCoalesceHeader(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		p := runTemplate(v6)
		var frames [][]byte
		for i := 0; i < 5; i++ {
			p.ID, p.BTH.PSN = uint16(100+i), roce.PSN(i)
			b := make([]byte, 2048)
			n, err := p.Build(b, bytes.Repeat([]byte{byte(i)}, 1024))
			if err != nil {
				t.Fatal(err)
			}
			frames = append(frames, b[:n])
		}
		whole := make([]byte, 1<<16)
		n, hw, err := Coalesce(whole, frames)
		if err != nil {
			t.Fatal(err)
		}
		hdr := make([]byte, 128)
		hl, hh, err := CoalesceHeader(hdr, frames)
		if err != nil {
			t.Fatal(err)
		}
		gathered := append([]byte(nil), hdr[:hl]...)
		for _, f := range frames {
			gathered = append(gathered, f[hl:]...)
		}
		if hw != hh || !bytes.Equal(gathered, whole[:n]) {
			t.Fatalf("v6=%v: header+payloads differ from Coalesce", v6)
		}
	}
	if _, _, err := CoalesceHeader(make([]byte, 64), nil); err == nil {
		t.Fatal("no frames accepted")
	}
}

// TestSplitUSOEach: datagrams cut in place equal those SplitUSO copies out.
func TestSplitUSOEach(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		p := runTemplate(v6)
		var frames [][]byte
		for i := 0; i < 7; i++ {
			p.ID, p.BTH.PSN = uint16(0xFFFD+i), roce.PSN(i)
			payload := bytes.Repeat([]byte{byte(i)}, 1024)
			if i == 6 {
				payload, p.BTH.Opcode = payload[:100], roce.RCRDMAWriteLast
			}
			b := make([]byte, 2048)
			n, err := p.Build(b, payload)
			if err != nil {
				t.Fatal(err)
			}
			frames = append(frames, b[:n])
		}
		super := make([]byte, 1<<16)
		n, h, err := Coalesce(super, frames)
		if err != nil {
			t.Fatal(err)
		}
		bufs, sizes := make([][]byte, 8), make([]int, 8)
		for i := range bufs {
			bufs[i] = make([]byte, 2048)
		}
		k, err := SplitUSO(&h, super[:n], bufs, sizes, 0)
		if err != nil {
			t.Fatal(err)
		}
		var got [][]byte
		m, err := SplitUSOEach(&h, super[:n], func(seg []byte) { got = append(got, append([]byte(nil), seg...)) })
		if err != nil || m != k {
			t.Fatalf("SplitUSOEach = %d, %v; SplitUSO %d", m, err, k)
		}
		for i := range got {
			if !bytes.Equal(got[i], bufs[i][:sizes[i]]) {
				t.Fatalf("v6=%v segment %d differs", v6, i)
			}
			var q roce.Packet
			if err := roce.Parse(got[i], &q); err != nil || q.VerifyICRC(got[i]) != nil {
				t.Fatalf("segment %d: %v", i, err)
			}
		}
	}
}

// FuzzSplitUSOEach: arbitrary reads never panic, and every datagram handed
// out lies within the read.
func FuzzSplitUSOEach(f *testing.F) {
	f.Add([]byte{0, 5, 0, 0, 0, 4, 0, 0, 0, 0}, make([]byte, 200))
	f.Fuzz(func(t *testing.T, hdr, frame []byte) {
		var h VirtioNetHdr
		if h.Decode(hdr) != nil {
			return
		}
		_, _ = SplitUSOEach(&h, frame, func(seg []byte) {
			if len(seg) > len(frame) {
				t.Fatalf("segment of %d bytes from a read of %d", len(seg), len(frame))
			}
		})
	})
}
