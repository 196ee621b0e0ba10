package roce_test

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/testvectors"
)

// isRoCEPort reports whether frame is UDP to port 4791, judged without
// roce.Parse, so that the vector tests notice frames Parse wrongly calls
// "not RoCE".
func isRoCEPort(frame []byte) bool {
	if len(frame) < 14 {
		return false
	}
	switch {
	case frame[12] == 0x08 && frame[13] == 0x00 && len(frame) >= 14+20+4:
		ihl := int(frame[14]&0xF) * 4
		return frame[14+9] == 17 && len(frame) >= 14+ihl+4 && frame[14+ihl+2] == 0x12 && frame[14+ihl+3] == 0xB7
	case frame[12] == 0x86 && frame[13] == 0xDD && len(frame) >= 14+40+4:
		return frame[14+6] == 17 && frame[14+40+2] == 0x12 && frame[14+40+3] == 0xB7
	}
	return false
}

// TestVectors checks every RoCE frame of the rxe captures: it parses, its
// ICRC verifies, and building it again from the parsed fields gives the same
// bytes.
func TestVectors(t *testing.T) {
	total := 0
	for _, f := range testvectors.Files(t) {
		t.Run(f.Name, func(t *testing.T) {
			n := 0
			for i, fr := range f.Frames {
				frame := fr.Data
				var p roce.Packet
				err := roce.Parse(frame, &p)
				if !isRoCEPort(frame) {
					if !errors.Is(err, roce.ErrNotRoCE) {
						t.Errorf("frame %d: non-RoCE frame: Parse = %v, want ErrNotRoCE", i+1, err)
					}
					continue
				}
				n++
				if err != nil {
					t.Errorf("frame %d: Parse: %v", i+1, err)
					continue
				}
				if got := p.ComputeICRC(frame); got != p.ICRC {
					t.Errorf("frame %d (%v): ICRC computed %#08x, stored %#08x", i+1, p.BTH.Opcode, got, p.ICRC)
				}
				if err := roce.CheckPayloadLen(p.BTH.Opcode, p.PayloadLen, 1024); err != nil {
					t.Errorf("frame %d (%v, %d bytes): %v at path MTU 1024", i+1, p.BTH.Opcode, p.PayloadLen, err)
				}
				// Rebuild from the parsed fields alone.
				q := p
				q.ICRC = 0
				buf := make([]byte, 9000)
				m, err := q.Build(buf, p.Payload(frame))
				if err != nil {
					t.Errorf("frame %d: Build: %v", i+1, err)
					continue
				}
				if !bytes.Equal(buf[:m], frame[:p.FrameLen()]) {
					t.Errorf("frame %d (%v): rebuilt frame differs\n got %x\nwant %x", i+1, p.BTH.Opcode, buf[:m], frame[:p.FrameLen()])
				}
				if q.ICRC != p.ICRC {
					t.Errorf("frame %d: rebuilt ICRC %#08x, want %#08x", i+1, q.ICRC, p.ICRC)
				}
				// Anything after the IP datagram is Ethernet padding.
				if tail := frame[p.FrameLen():]; len(tail) > 0 && (len(frame) > 60 || bytes.Count(tail, []byte{0}) != len(tail)) {
					t.Errorf("frame %d: %d unexpected bytes after the datagram", i+1, len(tail))
				}
			}
			total += n
			t.Logf("%d RoCE frames", n)
		})
	}
	if total == 0 {
		t.Fatal("the captures hold no RoCE frames")
	}
}

// TestVectorSourcePorts checks the UDP source ports rxe chose against
// ConnectedSourcePort (RC and UC: both directions of a connection share the
// port derived from the two QPNs) and DatagramSourcePort (UD, QP1 included).
// Connections made by the RDMA CM take their flow label from the CM
// exchange instead, so the cm-* captures are checked for UD only.
func TestVectorSourcePorts(t *testing.T) {
	type flow struct {
		src, dst netip.Addr
		sport    uint16
	}
	checked := 0
	for _, f := range testvectors.Files(t) {
		dqps := map[flow]uint32{}
		for i, fr := range f.Frames {
			var p roce.Packet
			if roce.Parse(fr.Data, &p) != nil {
				continue
			}
			switch p.BTH.Opcode.Transport() {
			case roce.TransportUD:
				if want := roce.DatagramSourcePort(p.DETH.SrcQP); p.SrcPort != want {
					t.Errorf("%s frame %d: UD QP %#x sent from port %d, want %d", f.Name, i+1, p.DETH.SrcQP, p.SrcPort, want)
				}
				checked++
			case roce.TransportRC, roce.TransportUC:
				dqps[flow{p.Src, p.Dst, p.SrcPort}] = p.BTH.DestQP
			}
		}
		if strings.Contains(f.Name, "-cm-") {
			continue
		}
		for fl, dqp := range dqps {
			rev, ok := dqps[flow{fl.dst, fl.src, fl.sport}]
			if !ok {
				t.Errorf("%s: flow %v→%v port %d has no reverse flow on the same port", f.Name, fl.src, fl.dst, fl.sport)
				continue
			}
			// dqp is the receiver's QPN, rev the sender's.
			if want := roce.ConnectedSourcePort(0, rev, dqp); fl.sport != want {
				t.Errorf("%s: QPs %#x→%#x use port %d, want %d", f.Name, rev, dqp, fl.sport, want)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no flows checked")
	}
}

// TestVectorICRCCoverage flips every bit the ICRC covers, one at a time, and
// expects verification to fail; then changes only the masked fields and
// expects it to pass.
func TestVectorICRCCoverage(t *testing.T) {
	frames := 0
	for _, f := range testvectors.Files(t) {
		for i, fr := range f.Frames {
			var p roce.Packet
			if roce.Parse(fr.Data, &p) != nil {
				continue
			}
			frames++
			frame := append([]byte(nil), fr.Data[:p.FrameLen()]...)
			orig := append([]byte(nil), frame...)
			masked := maskedBytes(&p)
			for off := roce.EthernetLen; off < len(frame); off++ {
				for b := 0; b < 8; b++ {
					frame[off] ^= 1 << b
					err := p.VerifyICRC(frame)
					if m, isMasked := masked[off]; isMasked && m&(1<<b) != 0 {
						if err != nil {
							t.Fatalf("%s frame %d: flipping masked byte %d bit %d broke the ICRC", f.Name, i+1, off, b)
						}
					} else if err == nil {
						t.Fatalf("%s frame %d: flipping byte %d bit %d went unnoticed", f.Name, i+1, off, b)
					}
					frame[off] ^= 1 << b
				}
			}
			// Every masked field changed at once, and the MACs.
			for off, m := range masked {
				frame[off] ^= m
			}
			frame[0] ^= 0xFF
			frame[11] ^= 0x5A
			if err := p.VerifyICRC(frame); err != nil {
				t.Fatalf("%s frame %d: changing only masked fields: %v", f.Name, i+1, err)
			}
			for off, m := range masked {
				frame[off] ^= m
			}
			frame[0] ^= 0xFF
			frame[11] ^= 0x5A
			if !bytes.Equal(frame, orig) {
				t.Fatalf("%s frame %d: VerifyICRC changed the frame", f.Name, i+1)
			}
		}
	}
	if frames == 0 {
		t.Fatal("no RoCE frames")
	}
}

// maskedBytes returns, by frame offset, the bits the ICRC masks: IPv4 TOS,
// TTL and header checksum, or IPv6 traffic class, flow label and hop limit;
// the UDP checksum; the BTH resv8a byte.
func maskedBytes(p *roce.Packet) map[int]byte {
	m := map[int]byte{}
	l3 := roce.EthernetLen
	udp := l3 + roce.IPv4Len
	if p.IPv6 {
		udp = l3 + roce.IPv6Len
		m[l3] = 0x0F
		m[l3+1], m[l3+2], m[l3+3] = 0xFF, 0xFF, 0xFF
		m[l3+7] = 0xFF
	} else {
		m[l3+1] = 0xFF
		m[l3+8] = 0xFF
		m[l3+10], m[l3+11] = 0xFF, 0xFF
	}
	m[udp+6], m[udp+7] = 0xFF, 0xFF
	m[udp+roce.UDPLen+4] = 0xFF
	return m
}
