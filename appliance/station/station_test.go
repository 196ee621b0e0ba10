package station

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/roce"
)

var (
	ourMAC   = roce.MAC{0x02, 0, 0, 0, 0, 0x0a}
	peerMAC  = roce.MAC{0x02, 0, 0, 0, 0, 0x0b}
	otherMAC = roce.MAC{0x02, 0, 0, 0, 0, 0x0c}
	ourV4    = netip.MustParseAddr("10.55.0.1")
	peerV4   = netip.MustParseAddr("10.55.0.2")
	ourV6    = netip.MustParseAddr("fd55::1")
	peerV6   = netip.MustParseAddr("fd55::2")
)

// rig is a station whose sent frames are collected, with a fake clock.
type rig struct {
	*Station
	mu   sync.Mutex
	sent [][]byte
	now  time.Time
	sig  chan struct{}
}

func newRig(t testing.TB) *rig {
	t.Helper()
	r := &rig{now: time.Unix(1000, 0), sig: make(chan struct{}, 64)}
	s, err := New(Config{
		MAC:   ourMAC,
		Addrs: []netip.Prefix{netip.MustParsePrefix("10.55.0.1/24"), netip.MustParsePrefix("fd55::1/64")},
		Send: func(f []byte) {
			r.mu.Lock()
			r.sent = append(r.sent, append([]byte(nil), f...))
			r.mu.Unlock()
			r.sig <- struct{}{}
		},
		NeighborTTL:     30 * time.Second,
		ResolveTimeout:  50 * time.Millisecond,
		ResolveAttempts: 3,
		Now:             func() time.Time { r.mu.Lock(); defer r.mu.Unlock(); return r.now },
	})
	if err != nil {
		t.Fatal(err)
	}
	r.Station = s
	return r
}

func (r *rig) take() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sent
	r.sent = nil
	return s
}

func (r *rig) advance(d time.Duration) {
	r.mu.Lock()
	r.now = r.now.Add(d)
	r.mu.Unlock()
}

func arpFrame(op uint16, dstMAC, sha roce.MAC, spa netip.Addr, tha roce.MAC, tpa netip.Addr) []byte {
	b := make([]byte, roce.EthernetLen+arpLen)
	writeEthernet(b, dstMAC, sha, roce.EtherTypeARP)
	putARP(b[roce.EthernetLen:], op, sha, spa, tha, tpa)
	return b
}

func icmpEcho(src, dst netip.Addr, dstMAC roce.MAC, payload string) []byte {
	msg := make([]byte, 8+len(payload))
	msg[0] = icmpEchoRequest
	binary.BigEndian.PutUint16(msg[4:], 0x1234)
	binary.BigEndian.PutUint16(msg[6:], 7)
	copy(msg[8:], payload)
	binary.BigEndian.PutUint16(msg[2:], checksum(msg, 0))
	b := make([]byte, roce.EthernetLen+roce.IPv4Len+len(msg))
	writeEthernet(b, dstMAC, peerMAC, roce.EtherTypeIPv4)
	writeIPv4(b[roce.EthernetLen:], src, dst, protoICMP, len(msg), 1)
	copy(b[roce.EthernetLen+roce.IPv4Len:], msg)
	return b
}

func icmp6Frame(src, dst netip.Addr, dstMAC roce.MAC, hop uint8, msg []byte) []byte {
	binary.BigEndian.PutUint16(msg[2:], 0)
	binary.BigEndian.PutUint16(msg[2:], checksum(msg, pseudo6(src, dst, len(msg), protoICMPv6)))
	b := make([]byte, roce.EthernetLen+roce.IPv6Len+len(msg))
	writeEthernet(b, dstMAC, peerMAC, roce.EtherTypeIPv6)
	writeIPv6(b[roce.EthernetLen:], src, dst, protoICMPv6, len(msg), hop)
	copy(b[roce.EthernetLen+roce.IPv6Len:], msg)
	return b
}

func nsMsg(target netip.Addr, sll roce.MAC) []byte {
	m := make([]byte, 32)
	m[0] = icmp6NeighborSol
	t := target.As16()
	copy(m[8:24], t[:])
	m[24], m[25] = ndOptSourceLLAddr, 1
	copy(m[26:], sll[:])
	return m
}

func naMsg(target netip.Addr, tll roce.MAC) []byte {
	m := make([]byte, 32)
	m[0] = icmp6NeighborAdv
	m[4] = 0x60
	t := target.As16()
	copy(m[8:24], t[:])
	m[24], m[25] = ndOptTargetLLAddr, 1
	copy(m[26:], tll[:])
	return m
}

func roceFrame(t testing.TB, dst netip.Addr, dstMAC roce.MAC, port uint16) []byte {
	t.Helper()
	p := roce.Packet{
		DstMAC: dstMAC, SrcMAC: peerMAC, Src: peerV4, Dst: dst, TTL: 64,
		SrcPort: 0xC000, DstPort: port,
		BTH: roce.BTHFields{Opcode: roce.RCSendOnly, PKey: 0xFFFF, DestQP: 0x11, PSN: 5},
	}
	if dst.Is6() {
		p.IPv6, p.Src = true, peerV6
	}
	buf := make([]byte, 512)
	n, err := p.Build(buf, []byte("payload!"))
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

func TestARP(t *testing.T) {
	r := newRig(t)
	// A request for our address: answered, and the asker learned.
	if v := r.Input(arpFrame(arpRequest, broadcastMAC, peerMAC, peerV4, roce.MAC{}, ourV4)); v != Consumed {
		t.Fatalf("verdict %v", v)
	}
	sent := r.take()
	if len(sent) != 1 {
		t.Fatalf("%d frames sent, want 1 reply", len(sent))
	}
	rep := sent[0]
	a := arp(rep[roce.EthernetLen:])
	if roce.Ethernet(rep).Dst() != peerMAC || roce.Ethernet(rep).Src() != ourMAC || a.op() != arpReply ||
		a.senderMAC() != ourMAC || a.senderIP() != ourV4 || a.targetIP() != peerV4 {
		t.Fatalf("bad ARP reply %x", rep)
	}
	if mac, ok := r.Lookup(peerV4); !ok || mac != peerMAC {
		t.Fatalf("asker not learned: %v %v", mac, ok)
	}
	// A request for someone else's address: silence.
	if v := r.Input(arpFrame(arpRequest, broadcastMAC, peerMAC, peerV4, roce.MAC{}, netip.MustParseAddr("10.55.0.9"))); v != Dropped {
		t.Fatalf("verdict %v for a stranger's address", v)
	}
	if len(r.take()) != 0 || r.Stats().Drops[DropNotOurIP] != 1 {
		t.Fatalf("answered a stranger's address; stats %+v", r.Stats())
	}
	// Malformed ARP.
	bad := arpFrame(arpRequest, broadcastMAC, peerMAC, peerV4, roce.MAC{}, ourV4)
	bad[roce.EthernetLen+4] = 8
	if v := r.Input(bad); v != Dropped || r.Stats().Drops[DropMalformed] != 1 {
		t.Fatalf("malformed ARP: %v %+v", v, r.Stats())
	}
}

func TestDrops(t *testing.T) {
	r := newRig(t)
	tests := []struct {
		name   string
		frame  []byte
		reason DropReason
	}{
		{"runt", []byte{1, 2, 3}, DropMalformed},
		{"other MAC", icmpEcho(peerV4, ourV4, otherMAC, "x"), DropNotForUs},
		{"other multicast", icmpEcho(peerV4, ourV4, roce.MAC{0x33, 0x33, 0, 0, 0, 2}, "x"), DropNotForUs},
		{"ethertype", func() []byte { b := icmpEcho(peerV4, ourV4, ourMAC, "x"); b[12], b[13] = 0x88, 0xCC; return b }(), DropEtherType},
		{"other IP", icmpEcho(peerV4, netip.MustParseAddr("10.55.0.9"), ourMAC, "x"), DropNotOurIP},
		{"bad IP checksum", func() []byte { b := icmpEcho(peerV4, ourV4, ourMAC, "x"); b[24] ^= 1; return b }(), DropMalformed},
		{"bad ICMP checksum", func() []byte { b := icmpEcho(peerV4, ourV4, ourMAC, "xy"); b[len(b)-1] ^= 1; return b }(), DropMalformed},
		{"UDP other port", roceFrame(t, ourV4, ourMAC, 4790), DropProtocol},
		{"RoCE, which the port keeps from the station", roceFrame(t, ourV4, ourMAC, roce.UDPPort), DropProtocol},
		{"ND hop limit", icmp6Frame(peerV6, solicitedNode(ourV6), multicastMAC(solicitedNode(ourV6)), 64, nsMsg(ourV6, peerMAC)), DropMalformed},
		{"IPv6 other address", icmp6Frame(peerV6, netip.MustParseAddr("fd55::9"), ourMAC, 64, []byte{icmp6EchoRequest, 0, 0, 0, 0, 0, 0, 0}), DropNotOurIP},
	}
	for _, tt := range tests {
		before := r.Stats().Drops[tt.reason]
		if v := r.Input(tt.frame); v != Dropped {
			t.Errorf("%s: verdict %v, want Dropped", tt.name, v)
			continue
		}
		if got := r.Stats().Drops[tt.reason]; got != before+1 {
			t.Errorf("%s: %v drops %d → %d", tt.name, tt.reason, before, got)
		}
	}
	if len(r.take()) != 0 {
		t.Error("a dropped frame was answered")
	}
}

func TestEcho(t *testing.T) {
	r := newRig(t)
	if v := r.Input(icmpEcho(peerV4, ourV4, ourMAC, "hello station")); v != Consumed {
		t.Fatalf("verdict %v", v)
	}
	rep := r.take()[0]
	ip := roce.IPv4(rep[roce.EthernetLen:])
	icmp := rep[roce.EthernetLen+roce.IPv4Len:]
	if ip.Src() != ourV4 || ip.Dst() != peerV4 || ip.ComputeChecksum() != ip.Checksum() ||
		icmp[0] != icmpEchoReply || checksum(icmp, 0) != 0 || !bytes.HasSuffix(icmp, []byte("hello station")) ||
		roce.Ethernet(rep).Dst() != peerMAC {
		t.Fatalf("bad echo reply %x", rep)
	}
	msg := append([]byte{icmp6EchoRequest, 0, 0, 0, 0x12, 0x34, 0, 1}, "ping6"...)
	if v := r.Input(icmp6Frame(peerV6, ourV6, ourMAC, 64, msg)); v != Consumed {
		t.Fatalf("ICMPv6 echo verdict %v", v)
	}
	rep = r.take()[0]
	ip6 := roce.IPv6(rep[roce.EthernetLen:])
	m := rep[roce.EthernetLen+roce.IPv6Len:]
	if ip6.Src() != ourV6 || ip6.Dst() != peerV6 || m[0] != icmp6EchoReply ||
		checksum(m, pseudo6(ourV6, peerV6, len(m), protoICMPv6)) != 0 || !bytes.HasSuffix(m, []byte("ping6")) {
		t.Fatalf("bad ICMPv6 echo reply %x", rep)
	}
}

func TestNeighborDiscovery(t *testing.T) {
	r := newRig(t)
	for _, target := range []netip.Addr{ourV6, roce.LinkLocalGID(ourMAC).Addr()} {
		group := solicitedNode(target)
		if v := r.Input(icmp6Frame(peerV6, group, multicastMAC(group), 255, nsMsg(target, peerMAC))); v != Consumed {
			t.Fatalf("NS for %v: verdict %v", target, v)
		}
		na := r.take()[0]
		ip6 := roce.IPv6(na[roce.EthernetLen:])
		m := na[roce.EthernetLen+roce.IPv6Len:]
		if ip6.HopLimit() != 255 || ip6.Src() != target || ip6.Dst() != peerV6 || m[0] != icmp6NeighborAdv ||
			m[4]&0x60 != 0x60 || netip.AddrFrom16([16]byte(m[8:24])) != target ||
			m[24] != ndOptTargetLLAddr || roce.MAC(m[26:32]) != ourMAC ||
			checksum(m, pseudo6(target, peerV6, len(m), protoICMPv6)) != 0 {
			t.Fatalf("bad NA for %v: %x", target, na)
		}
	}
	if mac, ok := r.Lookup(peerV6); !ok || mac != peerMAC {
		t.Fatal("soliciting node not learned")
	}
	// DAD probe (unspecified source): unsolicited NA to all nodes.
	group := solicitedNode(ourV6)
	r.Input(icmp6Frame(netip.IPv6Unspecified(), group, multicastMAC(group), 255, nsMsg(ourV6, peerMAC)))
	na := r.take()[0]
	if roce.IPv6(na[roce.EthernetLen:]).Dst() != allNodes || na[roce.EthernetLen+roce.IPv6Len+4]&0x40 != 0 {
		t.Fatalf("DAD answer %x", na)
	}
	// NS for an address we don't own.
	other := netip.MustParseAddr("fd55::77")
	if v := r.Input(icmp6Frame(peerV6, solicitedNode(other), multicastMAC(solicitedNode(other)), 255, nsMsg(other, peerMAC))); v != Dropped {
		t.Fatalf("NS for a stranger: %v", v)
	}
}

func TestResolveAndExpiry(t *testing.T) {
	r := newRig(t)
	answer := func(req []byte) {
		if roce.Ethernet(req).EtherType() == roce.EtherTypeARP {
			a := arp(req[roce.EthernetLen:])
			if a.op() != arpRequest || a.targetIP() != peerV4 || a.senderIP() != ourV4 || roce.Ethernet(req).Dst() != broadcastMAC {
				t.Errorf("bad ARP request %x", req)
			}
			r.Input(arpFrame(arpReply, ourMAC, peerMAC, peerV4, ourMAC, ourV4))
			return
		}
		m := req[roce.EthernetLen+roce.IPv6Len:]
		dst := roce.IPv6(req[roce.EthernetLen:]).Dst()
		if m[0] != icmp6NeighborSol || dst != solicitedNode(peerV6) || roce.Ethernet(req).Dst() != multicastMAC(dst) {
			t.Errorf("bad NS %x", req)
		}
		r.Input(icmp6Frame(peerV6, ourV6, ourMAC, 255, naMsg(peerV6, peerMAC)))
	}
	// A responder on the "wire".
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-r.sig:
				for _, f := range r.take() {
					answer(f)
				}
			}
		}
	}()
	for _, ip := range []netip.Addr{peerV4, peerV6} {
		mac, err := r.Resolve(context.Background(), ip)
		if err != nil || mac != peerMAC {
			t.Fatalf("Resolve(%v) = %v, %v", ip, mac, err)
		}
	}
	before := r.Stats()
	// Cached: no new request.
	if _, err := r.Resolve(context.Background(), peerV4); err != nil {
		t.Fatal(err)
	}
	if r.Stats().ARPRequests != before.ARPRequests {
		t.Fatal("resolved again while the entry was fresh")
	}
	// Expired: Lookup fails and Resolve asks again.
	r.advance(31 * time.Second)
	if _, ok := r.Lookup(peerV4); ok {
		t.Fatal("entry did not expire")
	}
	if _, err := r.Resolve(context.Background(), peerV4); err != nil {
		t.Fatal(err)
	}
	if r.Stats().ARPRequests != before.ARPRequests+1 {
		t.Fatalf("ARP requests %d → %d, want one more", before.ARPRequests, r.Stats().ARPRequests)
	}
}

func TestResolveUnanswered(t *testing.T) {
	r := newRig(t)
	start := time.Now()
	_, err := r.Resolve(context.Background(), netip.MustParseAddr("10.55.0.99"))
	if !errors.Is(err, ErrUnresolved) {
		t.Fatalf("err %v, want ErrUnresolved", err)
	}
	if r.Stats().ARPRequests != 3 || time.Since(start) < 140*time.Millisecond {
		t.Fatalf("%d requests in %v, want 3 over 150 ms", r.Stats().ARPRequests, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.Resolve(ctx, netip.MustParseAddr("10.55.0.98")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Resolve: %v", err)
	}
}

func TestGIDsAndAnnounce(t *testing.T) {
	r := newRig(t)
	g := r.GIDs()
	want := []netip.Addr{netip.MustParseAddr("fe80::ff:fe00:a"), ourV4, ourV6}
	if len(g) != len(want) {
		t.Fatalf("GIDs %v", g)
	}
	for i, w := range want {
		if g[i].Addr() != w {
			t.Errorf("GID %d = %v, want %v", i, g[i].Addr(), w)
		}
		if !r.HasGID(w) {
			t.Errorf("HasGID(%v) false", w)
		}
	}
	for _, a := range []netip.Addr{netip.MustParseAddr("10.55.0.99"), netip.AddrFrom16(ourV4.As16()), {}} {
		if r.HasGID(a) {
			t.Errorf("HasGID(%v) true", a)
		}
	}
	r.Announce()
	sent := r.take()
	if len(sent) != 3 { // gratuitous ARP + NA for link-local and fd55::1
		t.Fatalf("%d announcements", len(sent))
	}
	a := arp(sent[0][roce.EthernetLen:])
	if a.op() != arpRequest || a.senderIP() != ourV4 || a.targetIP() != ourV4 || roce.Ethernet(sent[0]).Dst() != broadcastMAC {
		t.Fatalf("gratuitous ARP %x", sent[0])
	}
}

// TestOnLink: the source for an address on one of the station's links is
// the station's address of that prefix; an address off every link has
// none.
func TestOnLink(t *testing.T) {
	r := newRig(t)
	ll := roce.LinkLocalGID(ourMAC).Addr()
	for a, want := range map[netip.Addr]netip.Addr{
		peerV4: ourV4, netip.AddrFrom16(peerV4.As16()): ourV4, ourV4: ourV4, peerV6: ourV6,
		netip.MustParseAddr("fe80::1"):   ll,
		netip.MustParseAddr("10.56.0.2"): {}, netip.MustParseAddr("fd56::2"): {}, {}: {},
	} {
		got, ok := r.OnLink(a)
		if got != want || ok != want.IsValid() {
			t.Errorf("OnLink(%v) = %v, %v; want %v", a, got, ok, want)
		}
	}
}

func TestNewErrors(t *testing.T) {
	send := func([]byte) {}
	if _, err := New(Config{MAC: ourMAC}); err == nil {
		t.Error("no Send accepted")
	}
	if _, err := New(Config{MAC: roce.MAC{1, 0, 0, 0, 0, 1}, Send: send}); err == nil {
		t.Error("multicast MAC accepted")
	}
	if _, err := New(Config{MAC: ourMAC, Send: send, Addrs: []netip.Prefix{{}}}); err == nil {
		t.Error("invalid prefix accepted")
	}
}

// FuzzInput: any frame is handled without panicking, and what the
// station sends in answer is a frame from its own MAC.
func FuzzInput(f *testing.F) {
	f.Add(arpFrame(arpRequest, broadcastMAC, peerMAC, peerV4, roce.MAC{}, ourV4))
	f.Add(icmpEcho(peerV4, ourV4, ourMAC, "x"))
	f.Add(icmp6Frame(peerV6, solicitedNode(ourV6), multicastMAC(solicitedNode(ourV6)), 255, nsMsg(ourV6, peerMAC)))
	f.Add(roceFrame(f, ourV4, ourMAC, roce.UDPPort))
	f.Add(roceFrame(f, ourV6, ourMAC, roce.UDPPort))
	r := newRig(f)
	go func() {
		for range r.sig {
		}
	}()
	f.Fuzz(func(t *testing.T, frame []byte) {
		r.Input(frame)
		for _, sent := range r.take() {
			if len(sent) < roce.EthernetLen || roce.Ethernet(sent).Src() != ourMAC {
				t.Fatalf("sent %x", sent)
			}
		}
	})
}

// TestNeighborCacheBounded: a flood of ARP requests from spoofed senders
// cannot grow the cache past its limit.
func TestNeighborCacheBounded(t *testing.T) {
	r := newRig(t)
	go func() {
		for range r.sig {
		}
	}()
	for i := 0; i < 5000; i++ {
		spoof := netip.AddrFrom4([4]byte{10, 55, byte(i >> 8), byte(i)})
		r.Input(arpFrame(arpRequest, broadcastMAC, roce.MAC{0x02, 1, 0, 0, byte(i >> 8), byte(i)}, spoof, roce.MAC{}, ourV4))
		r.take()
	}
	if n := r.NeighborCount(); n > maxNeighbors {
		t.Fatalf("%d neighbour entries, limit %d", n, maxNeighbors)
	}
}

// TestMappedAddressNotOurs: ::ffff:10.55.0.1 is not an IPv6 address of
// the station (RFC 4291, 2.5.5.2): no NA, no echo.
func TestMappedAddressNotOurs(t *testing.T) {
	r := newRig(t)
	mapped := netip.AddrFrom16(ourV4.As16())
	group := solicitedNode(mapped)
	if v := r.Input(icmp6Frame(peerV6, group, multicastMAC(group), 255, nsMsg(mapped, peerMAC))); v != Dropped {
		t.Fatalf("NS for %v: verdict %v", mapped, v)
	}
	echo := []byte{icmp6EchoRequest, 0, 0, 0, 0, 1, 0, 1}
	if v := r.Input(icmp6Frame(peerV6, mapped, ourMAC, 64, echo)); v != Dropped {
		t.Fatalf("echo to %v: verdict %v", mapped, v)
	}
	if len(r.take()) != 0 {
		t.Fatal("answered for an IPv4-mapped address")
	}
	if !r.Owns(mapped) {
		t.Fatal("Owns must still accept the IPv4 GID form")
	}
}

// TestHugeEcho: an echo request as large as IPv6 allows gets its reply
// without overrunning the reply buffer.
func TestHugeEcho(t *testing.T) {
	r := newRig(t)
	msg := make([]byte, 0xFFFF)
	msg[0] = icmp6EchoRequest
	if v := r.Input(icmp6Frame(peerV6, ourV6, ourMAC, 64, msg)); v != Consumed {
		t.Fatalf("verdict %v", v)
	}
	if sent := r.take(); len(sent) != 1 || len(sent[0]) != roce.EthernetLen+roce.IPv6Len+0xFFFF {
		t.Fatalf("reply of %d frames", len(sent))
	}
}
