package lab

import (
	"bytes"
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/verbs/abi"
)

// TestLabSpoofed: on the wire between two namespaces, with an RC pair
// exchanging checked data, a host that is not the pair's peer sends B's
// QP a WRITE, a READ and a FETCH_ADD at the PSN it expects and a SEND far
// ahead of it, and the peer a WRITE with a P_Key outside the partition —
// real frames, with valid checksums and ICRCs, written to the veth by a
// packet socket. The port delivers them (they are for its address) and
// the transport drops every one, counted by reason: B's memory is as it
// was, B answers nothing, and the pair's next exchange succeeds.
func TestLabSpoofed(t *testing.T) {
	p := prefix(t) // skips without root
	l, err := Build(Topology{Prefix: p, Hosts: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	}()
	a, b := l.Hosts[0], l.Hosts[1]
	ea, eb := a.NIC.Engine(), b.NIC.Engine()
	ctx := context.Background()
	const region = 1 << 20
	rp, err := connectRC(ctx, ea, eb, a, b, 2*region)
	if err != nil {
		t.Fatal(err)
	}
	pmtu := rp.pmtu.Bytes()

	// The PSN B's QP expects next: past every request A sent it.
	var mu sync.Mutex
	var expect roce.PSN
	seen := false
	b.SetHandler(func(_ []byte, p *roce.Packet) {
		if p.Src != a.PortIPv4() || p.BTH.DestQP != rp.qb.Num() || !p.Info().Has(roce.Request) {
			return
		}
		n := 1
		if p.BTH.Opcode == roce.RCRDMAReadRequest {
			n = roce.ReadPSNs(p.RETH.DMALen, pmtu)
		}
		mu.Lock()
		if end := p.BTH.PSN.Add(n); !seen || end.Diff(expect) > 0 {
			expect, seen = end, true
		}
		mu.Unlock()
	})
	defer b.SetHandler(nil)

	exchange := func(round string) {
		t.Helper()
		for _, s := range []Step{rp.sendAndAtomics(ctx), rp.writeRead(ctx, 4*region, region)} {
			if !s.OK {
				t.Fatalf("%s: %s: %s", round, s.Name, s.Detail)
			}
		}
	}
	exchange("before")
	mu.Lock()
	psn := expect
	mu.Unlock()

	stranger := netip.MustParseAddr("10.55.0.250")
	strangerMAC := roce.MAC{2, 0, 0, 0, 0, 0xfa}
	const target = region + 0x1000 // in B's region, where no exchange writes
	frame := func(src netip.Addr, mac roce.MAC, op roce.Opcode, psn roce.PSN, payload []byte, set func(*roce.Packet)) []byte {
		p := roce.Packet{
			DstMAC: b.Port.MAC(), SrcMAC: mac, Src: src, Dst: b.PortIPv4(), TTL: 64, DontFragment: true,
			SrcPort: 0xC123, DstPort: roce.UDPPort,
			BTH: roce.BTHFields{Opcode: op, PKey: roce.DefaultPKey, DestQP: rp.qb.Num(), PSN: psn, AckReq: true},
		}
		if set != nil {
			set(&p)
		}
		buf := make([]byte, 2048)
		n, err := p.Build(buf, payload)
		if err != nil {
			t.Fatal(err)
		}
		var q roce.Packet
		if err := roce.Parse(buf[:n], &q); err != nil {
			t.Fatal(err)
		}
		if err := q.VerifyICRC(buf[:n]); err != nil {
			t.Fatal(err)
		}
		return buf[:n]
	}
	spoof := bytes.Repeat([]byte{0xEE}, 256)
	frames := [][]byte{
		frame(stranger, strangerMAC, roce.RCRDMAWriteOnly, psn, spoof, func(p *roce.Packet) {
			p.RETH = roce.RETHFields{VA: rdmaBase + target, RKey: rp.mrb.RKey, DMALen: uint32(len(spoof))}
		}),
		frame(stranger, strangerMAC, roce.RCRDMAReadRequest, psn, nil, func(p *roce.Packet) {
			p.RETH = roce.RETHFields{VA: rdmaBase, RKey: rp.mrb.RKey, DMALen: 4096}
		}),
		frame(stranger, strangerMAC, roce.RCFetchAdd, psn, nil, func(p *roce.Packet) {
			p.AtomicETH = roce.AtomicETHFields{VA: rdmaBase + 1024, RKey: rp.mrb.RKey, SwapAdd: 1000}
		}),
		frame(stranger, strangerMAC, roce.RCSendOnly, psn.Add(1000), spoof, nil),
		frame(a.PortIPv4(), a.Port.MAC(), roce.RCRDMAWriteOnly, psn, spoof, func(p *roce.Packet) {
			p.BTH.PKey = 0x8123
			p.RETH = roce.RETHFields{VA: rdmaBase + target, RKey: rp.mrb.RKey, DMALen: uint32(len(spoof))}
		}),
	}

	before := eb.Stats()
	delivered := b.Port.Stats().Delivered
	mem := append([]byte(nil), rp.bufb...)
	writeFrames(t, a.Namespace, a.Uplink, frames)
	if !waitFor(10*time.Second, func() bool { return eb.Stats().Received-before.Received >= uint64(len(frames)) }) {
		t.Fatalf("B's transport received %d of the %d frames (its port delivered %d)",
			eb.Stats().Received-before.Received, len(frames), b.Port.Stats().Delivered-delivered)
	}
	eb.Barrier() // the last one is handled
	after := eb.Stats()
	if got := after.Rejected[transport.RejectAddress] - before.Rejected[transport.RejectAddress]; got != 4 {
		t.Errorf("%d rejected for their address, want 4", got)
	}
	if got := after.Rejected[transport.RejectPKey] - before.Rejected[transport.RejectPKey]; got != 1 {
		t.Errorf("%d rejected for their P_Key, want 1", got)
	}
	if after.Sent != before.Sent || after.NAKsSent != before.NAKsSent {
		t.Errorf("B answered: %d packets sent, %d NAKs", after.Sent-before.Sent, after.NAKsSent-before.NAKsSent)
	}
	if !bytes.Equal(rp.bufb, mem) {
		t.Error("B's memory changed")
	}
	if st := rp.qb.State(); st != abi.QPSRTS {
		t.Errorf("B's QP in %v", st)
	}
	exchange("after")
}

// writeFrames writes frames to the link ifname of namespace ns through a
// packet socket, as a host on that link would send them.
func writeFrames(t *testing.T, ns, ifname string, frames [][]byte) {
	t.Helper()
	var fd, index int
	err := netnsutil.Do(netnsutil.Path(ns), func(h *netlink.Handle) error {
		link, err := h.LinkByName(ifname)
		if err != nil {
			return err
		}
		index = link.Attrs().Index
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	for _, f := range frames {
		to := &unix.SockaddrLinklayer{Ifindex: index, Halen: 6}
		copy(to.Addr[:], f[:6])
		if err := unix.Sendto(fd, f, 0, to); err != nil {
			t.Fatalf("writing a frame to %s/%s: %v", ns, ifname, err)
		}
	}
}
