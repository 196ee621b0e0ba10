package tap

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/internal/testnet"
)

// TestKernelSegmentation writes runs of RoCE packets into an offloaded TAP
// as UDP GSO super-frames and reads them from a TAP without offloads on
// the same bridge, so that the kernel cuts them: every datagram must come
// out as the frame it was built as (the UDP checksum aside, which the
// kernel fills in), with a good ICRC, over IPv4 and IPv6, with IPv4 IDs
// wrapping.
func TestKernelSegmentation(t *testing.T) {
	_, path := testnet.Namespace(t)
	err := netnsutil.Do(path, func(h *netlink.Handle) error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0", MTU: 1500}}
		if err := h.LinkAdd(br); err != nil {
			return err
		}
		return h.LinkSetUp(br)
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err := Create(Config{Name: "wr0", Netns: path, Offload: true, MAC: net.HardwareAddr{2, 0, 0, 0, 0xA, 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if !w.Offloaded() {
		t.Skip("the kernel refuses USO offloads on TAPs")
	}
	r, err := Create(Config{Name: "rd0", Netns: path, MAC: net.HardwareAddr{2, 0, 0, 0, 0xB, 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, dev := range []string{"wr0", "rd0"} {
		if err := netnsutil.AttachToBridge(path, dev, "br0"); err != nil {
			t.Fatal(err)
		}
	}
	src, dst := roce.MAC{2, 0, 0, 0, 0xA, 2}, roce.MAC{2, 0, 0, 0, 0xB, 2}
	// Teach the bridge that dst lives behind rd0.
	hello := make([]byte, Headroom+60)
	copy(hello[Headroom:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(hello[Headroom+6:], dst[:])
	hello[Headroom+12], hello[Headroom+13] = 0x88, 0xB5
	if _, err := r.Write([][]byte{hello}, Headroom); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 256)
	go func() {
		bufs, sizes := [][]byte{make([]byte, Headroom+2000)}, []int{0}
		for {
			if _, err := r.Read(bufs, sizes, Headroom); err != nil {
				close(got)
				return
			}
			f := bufs[0][Headroom : Headroom+sizes[0]]
			if roce.Ethernet(f).Dst() != dst {
				continue // the kernel's own multicast (IGMP, MLD) on the bridge
			}
			got <- append([]byte(nil), f...)
		}
	}()
	time.Sleep(50 * time.Millisecond)

	for _, ipv6 := range []bool{false, true} {
		p := roce.Packet{
			DstMAC: dst, SrcMAC: src, TTL: 64, DontFragment: true,
			Src: netip.MustParseAddr("10.55.0.1"), Dst: netip.MustParseAddr("10.55.0.2"),
			SrcPort: 0xC123, DstPort: roce.UDPPort,
			BTH: roce.BTHFields{Opcode: roce.RCRDMAWriteMiddle, PKey: 0xFFFF, DestQP: 0x15},
		}
		if ipv6 {
			p.IPv6 = true
			p.Src, p.Dst = netip.MustParseAddr("fd55::1"), netip.MustParseAddr("fd55::2")
		}
		const n = 10
		frames := make([][]byte, n)
		for i := range frames {
			payload := bytes.Repeat([]byte{byte(i + 1)}, 1024)
			if i == n-1 {
				payload = payload[:300] // a shorter last segment
				p.BTH.Opcode = roce.RCRDMAWriteLast
			}
			p.ID = uint16(0xFFFA + i) // wraps
			p.BTH.PSN = roce.PSN(i)
			buf := make([]byte, Headroom+1200)
			m, err := p.Build(buf[Headroom:], payload)
			if err != nil {
				t.Fatal(err)
			}
			frames[i] = buf[:Headroom+m]
		}
		if k := CoalesceRun(stripHeadroom(frames), MaxGSOSegments); k != n {
			t.Fatalf("ipv6=%v: only %d of %d frames coalesce", ipv6, k, n)
		}
		if wn, err := w.Write(frames, Headroom); err != nil || wn != n {
			t.Fatalf("Write = %d, %v", wn, err)
		}
		for i := 0; i < n; i++ {
			var f []byte
			select {
			case f = <-got:
			case <-time.After(2 * time.Second):
				t.Fatalf("ipv6=%v: segment %d did not arrive", ipv6, i)
			}
			want := frames[i][Headroom:]
			l4 := roce.EthernetLen + roce.IPv4Len
			if ipv6 {
				l4 = roce.EthernetLen + roce.IPv6Len
			}
			if len(f) != len(want) || !bytes.Equal(f[:l4+6], want[:l4+6]) || !bytes.Equal(f[l4+8:], want[l4+8:]) {
				t.Fatalf("ipv6=%v segment %d differs\n got %x\nwant %x", ipv6, i, f, want)
			}
			var q roce.Packet
			if err := roce.Parse(f, &q); err != nil {
				t.Fatalf("segment %d: %v", i, err)
			}
			if err := q.VerifyICRC(f); err != nil {
				t.Fatalf("segment %d: %v", i, err)
			}
		}
	}
}

func stripHeadroom(frames [][]byte) [][]byte {
	out := make([][]byte, len(frames))
	for i, f := range frames {
		out[i] = f[Headroom:]
	}
	return out
}
