package interop

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/roce"
)

// Flow identifies one direction of RoCE traffic to one QP.
type Flow struct {
	Src, Dst netip.Addr
	DestQP   uint32
}

// CaptureReport summarises the RoCE frames of a capture.
type CaptureReport struct {
	Frames int // all frames
	RoCE   int // frames to UDP port 4791
	// Opcodes counts the RoCE packets by opcode.
	Opcodes map[roce.Opcode]int
	// SourcePorts and TTLs hold the UDP source ports and the IPv4 TTLs
	// (IPv6 hop limits) seen per flow.
	SourcePorts map[Flow][]uint16
	TTLs        map[Flow][]uint8
	// Problems lists the frames that break a RoCEv2 rule (index from 1):
	// unparsable, bad ICRC, and on IPv4 a UDP checksum other than 0, DF
	// clear, a source port below 0xC000.
	Problems []string
}

// String summarises the report.
func (r *CaptureReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d frames, %d RoCE:", r.Frames, r.RoCE)
	for _, op := range slices.Sorted(maps.Keys(r.Opcodes)) {
		fmt.Fprintf(&b, " %v×%d", op, r.Opcodes[op])
	}
	if len(r.Problems) > 0 {
		fmt.Fprintf(&b, "; %d problems", len(r.Problems))
	}
	return b.String()
}

// CheckCapture reads a pcap or pcapng capture and checks every RoCEv2
// frame in it: it must parse (roce.Parse), its ICRC must verify, and it
// must follow the wire facts rxe follows (UDP checksum 0 and DF on IPv4,
// source port in 0xC000–0xFFFF). Frames that are not RoCEv2 (ARP, ICMP,
// TCP) are counted and skipped.
func CheckCapture(path string) (*CaptureReport, error) {
	frames, err := capture.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("interop: %w", err)
	}
	r := &CaptureReport{Opcodes: map[roce.Opcode]int{}, SourcePorts: map[Flow][]uint16{}, TTLs: map[Flow][]uint8{}}
	for i, f := range frames {
		r.Frames++
		n := i + 1
		if f.Truncated() {
			r.Problems = append(r.Problems, fmt.Sprintf("frame %d: truncated to %d of %d bytes", n, len(f.Data), f.OrigLen))
			continue
		}
		var p roce.Packet
		if err := roce.Parse(f.Data, &p); err != nil {
			if errors.Is(err, roce.ErrNotRoCE) {
				continue
			}
			r.RoCE++
			r.Problems = append(r.Problems, fmt.Sprintf("frame %d: %v", n, err))
			continue
		}
		r.RoCE++
		r.Opcodes[p.BTH.Opcode]++
		if err := p.VerifyICRC(f.Data); err != nil {
			r.Problems = append(r.Problems, fmt.Sprintf("frame %d (%v %v→%v PSN %#x): %v: stored %#08x, computed %#08x",
				n, p.BTH.Opcode, p.Src, p.Dst, uint32(p.BTH.PSN), err, p.ICRC, p.ComputeICRC(f.Data)))
		}
		if !p.IPv6 {
			if p.UDPChecksum != 0 {
				r.Problems = append(r.Problems, fmt.Sprintf("frame %d (%v→%v): UDP checksum %#04x, rxe sends 0", n, p.Src, p.Dst, p.UDPChecksum))
			}
			if !p.DontFragment {
				r.Problems = append(r.Problems, fmt.Sprintf("frame %d (%v→%v): DF clear", n, p.Src, p.Dst))
			}
		}
		if p.SrcPort < roce.SourcePortMin {
			r.Problems = append(r.Problems, fmt.Sprintf("frame %d (%v→%v): UDP source port %d below %d", n, p.Src, p.Dst, p.SrcPort, roce.SourcePortMin))
		}
		fl := Flow{Src: p.Src, Dst: p.Dst, DestQP: p.BTH.DestQP}
		if !slices.Contains(r.SourcePorts[fl], p.SrcPort) {
			r.SourcePorts[fl] = append(r.SourcePorts[fl], p.SrcPort)
		}
		if !slices.Contains(r.TTLs[fl], p.TTL) {
			r.TTLs[fl] = append(r.TTLs[fl], p.TTL)
		}
	}
	return r, nil
}
