// Package station is a port's own presence on its link: it answers ARP and
// IPv6 neighbour solicitations and ICMP/ICMPv6 echo for the port's
// addresses (so ping and arping work against a GID), resolves peers' MACs
// with a neighbour cache that expires and re-resolves, and drops and
// counts everything else by reason. RoCEv2 never reaches it: the port
// hands UDP to port 4791 to the RoCE receive path, as the kernel hands it
// to rxe.
//
// A station does no I/O of its own: frames come in through Input and go
// out through the Send function of its Config, so it runs unchanged on a
// real TAP and on a fake in tests.
package station

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taproce/taproce/appliance/roce"
)

// Config describes a station.
type Config struct {
	// MAC is the station's Ethernet address.
	MAC roce.MAC
	// Addrs are its IPv4 and IPv6 addresses with their prefixes. The
	// IPv6 link-local address derived from MAC is always added.
	Addrs []netip.Prefix
	// Send writes a frame to the link. The frame is valid only during the
	// call. Send may be called from Input, Resolve and Announce.
	Send func(frame []byte)
	// NeighborTTL is how long a learned MAC stays valid (default 30 s,
	// Linux's base reachable time).
	NeighborTTL time.Duration
	// ResolveTimeout is how long Resolve waits for an answer before asking
	// again (default 1 s); ResolveAttempts how often it asks (default 3).
	ResolveTimeout  time.Duration
	ResolveAttempts int
	// Now is the clock (default time.Now); tests give a fake one.
	Now func() time.Time
	// Resolver, when set, makes the station silent: the addresses belong
	// to another stack on the same link (redirect mode: the pod's kernel),
	// which answers ARP, neighbour solicitations and echo requests, so the
	// station answers nothing, never announces itself, and Resolve asks
	// the Resolver instead of the link.
	Resolver Resolver
}

// Resolver finds the MAC to send to for a destination address: the
// next hop's, from the routes and neighbours of another stack.
type Resolver interface {
	Resolve(ctx context.Context, a netip.Addr) (roce.MAC, error)
}

// Verdict says what Input did with a frame.
type Verdict int

const (
	// Consumed: the station handled the frame (ARP, ND, echo).
	Consumed Verdict = iota
	// Dropped: not for this station or not valid; counted by reason.
	Dropped
)

// DropReason classifies the frames a port drops: the station's reasons,
// and the two only the port's RoCE receive path has (DropRoCE, DropICRC).
type DropReason int

// Drop reasons.
const (
	DropNotForUs   DropReason = iota // destination MAC is someone else's
	DropEtherType                    // neither ARP, IPv4 nor IPv6
	DropMalformed                    // bad header, length or checksum
	DropNotOurIP                     // IP destination (or ARP target) is not ours
	DropProtocol                     // IP protocol, UDP port or ICMP type not handled
	DropRoCE                         // UDP/4791 for us but not a valid RoCEv2 packet
	DropICRC                         // RoCEv2 packet with a bad ICRC
	NumDropReasons                   // how many reasons there are
)

var dropNames = [NumDropReasons]string{"not_for_us", "ethertype", "malformed", "not_our_ip", "protocol", "roce_invalid", "icrc"}

// String names the reason as metrics label it.
func (r DropReason) String() string {
	if r < 0 || r >= NumDropReasons {
		return fmt.Sprintf("reason_%d", int(r))
	}
	return dropNames[r]
}

// Stats counts what a station did.
type Stats struct {
	Drops                         [NumDropReasons]uint64
	ARPReplies, ARPRequests       uint64 // sent
	NeighborAdverts, NeighborSols uint64 // sent
	EchoReplies, EchoReplies6     uint64 // sent
	Learned                       uint64 // neighbour entries learned or refreshed
}

// maxNeighbors bounds the neighbour cache, as Linux's gc_thresh3 does: a
// host on the link must not be able to grow it without limit.
const maxNeighbors = 1024

// ErrUnresolved is returned by Resolve when no neighbour answered.
var ErrUnresolved = errors.New("station: no answer to address resolution")

type neighbor struct {
	mac      roce.MAC
	valid    bool
	updated  time.Time
	resolved chan struct{} // closed when an answer arrives
}

// Station is one port's link-layer presence. Input must not be called
// concurrently with itself; everything else is safe for concurrent use.
type Station struct {
	cfg       Config
	mac       roce.MAC
	linkLocal netip.Addr
	v4        []netip.Prefix
	v6        []netip.Prefix // link-local first
	groups    []roce.MAC     // solicited-node multicast MACs we accept
	gids      []roce.GID

	rx   []byte // reply buffer of Input
	ipID atomic.Uint32

	sendMu sync.Mutex
	tx     []byte // buffer of Resolve and Announce

	mu    sync.Mutex
	neigh map[netip.Addr]*neighbor

	stats struct {
		drops                               [NumDropReasons]atomic.Uint64
		arpReplies, arpRequests             atomic.Uint64
		adverts, sols, echo, echo6, learned atomic.Uint64
	}
}

// New returns a station for cfg.
func New(cfg Config) (*Station, error) {
	if cfg.Send == nil {
		return nil, errors.New("station: Config.Send is required")
	}
	if cfg.MAC[0]&1 != 0 || cfg.MAC == (roce.MAC{}) {
		return nil, fmt.Errorf("station: MAC %v is not a unicast address", cfg.MAC)
	}
	if cfg.NeighborTTL <= 0 {
		cfg.NeighborTTL = 30 * time.Second
	}
	if cfg.ResolveTimeout <= 0 {
		cfg.ResolveTimeout = time.Second
	}
	if cfg.ResolveAttempts <= 0 {
		cfg.ResolveAttempts = 3
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Station{
		cfg:   cfg,
		mac:   cfg.MAC,
		rx:    make([]byte, roce.EthernetLen+roce.IPv6Len+0xFFFF),
		tx:    make([]byte, 256),
		neigh: map[netip.Addr]*neighbor{},
	}
	ll := roce.LinkLocalGID(cfg.MAC)
	s.linkLocal = ll.Addr()
	s.v6 = append(s.v6, netip.PrefixFrom(s.linkLocal, 64))
	s.gids = append(s.gids, ll)
	var v6 []roce.GID
	for _, p := range cfg.Addrs {
		a := p.Addr().Unmap()
		switch {
		case !p.IsValid():
			return nil, fmt.Errorf("station: invalid address %v", p)
		case a.Is4():
			s.v4 = append(s.v4, netip.PrefixFrom(a, p.Bits()))
			s.gids = append(s.gids, roce.GIDFromAddr(a))
		case a == s.linkLocal:
		default:
			s.v6 = append(s.v6, p)
			v6 = append(v6, roce.GIDFromAddr(a))
		}
	}
	s.gids = append(s.gids, v6...)
	for _, p := range s.v6 {
		s.groups = append(s.groups, multicastMAC(solicitedNode(p.Addr())))
	}
	return s, nil
}

// MAC returns the station's Ethernet address.
func (s *Station) MAC() roce.MAC { return s.mac }

// GIDs returns the port's GID table as rxe builds it: index 0 the fe80::
// link-local GID from the MAC, then the IPv4 addresses as ::ffff:a.b.c.d,
// then the other IPv6 addresses, all of RoCEv2 type.
func (s *Station) GIDs() []roce.GID { return append([]roce.GID(nil), s.gids...) }

// HasGID reports whether a is the address of one of the station's GIDs
// (roce.GID.Addr: an IPv4 GID's as IPv4), without the copy GIDs makes:
// it is asked for every frame a port sends.
func (s *Station) HasGID(a netip.Addr) bool {
	for _, g := range s.gids {
		if g.Addr() == a {
			return true
		}
	}
	return false
}

// Owns reports whether a is one of the station's addresses; an
// IPv4-mapped address (a GID) counts as its IPv4 address.
func (s *Station) Owns(a netip.Addr) bool {
	a = a.Unmap()
	if a.Is4() {
		return s.ownsV4(a)
	}
	return s.ownsV6(a)
}

func (s *Station) ownsV4(a netip.Addr) bool {
	for _, p := range s.v4 {
		if p.Addr() == a {
			return true
		}
	}
	return false
}

// ownsV6 matches IPv6 addresses only: on the wire, ::ffff:a.b.c.d is not
// an address of the interface (RFC 4291, 2.5.5.2).
func (s *Station) ownsV6(a netip.Addr) bool {
	for _, p := range s.v6 {
		if p.Addr() == a {
			return true
		}
	}
	return false
}

// OnLink returns the station's address whose prefix holds a (an
// IPv4-mapped address counts as its IPv4 address; an IPv6 link-local one
// gets the link-local address): the source of a packet to a on the link.
func (s *Station) OnLink(a netip.Addr) (netip.Addr, bool) {
	a = a.Unmap()
	prefixes := s.v6
	if a.Is4() {
		prefixes = s.v4
	}
	for _, p := range prefixes {
		if p.Contains(a) {
			return p.Addr(), true
		}
	}
	return netip.Addr{}, false
}

// Stats returns a snapshot of the counters.
func (s *Station) Stats() Stats {
	var st Stats
	for i := range st.Drops {
		st.Drops[i] = s.stats.drops[i].Load()
	}
	st.ARPReplies = s.stats.arpReplies.Load()
	st.ARPRequests = s.stats.arpRequests.Load()
	st.NeighborAdverts = s.stats.adverts.Load()
	st.NeighborSols = s.stats.sols.Load()
	st.EchoReplies = s.stats.echo.Load()
	st.EchoReplies6 = s.stats.echo6.Load()
	st.Learned = s.stats.learned.Load()
	return st
}

func (s *Station) drop(r DropReason) Verdict {
	s.stats.drops[r].Add(1)
	return Dropped
}

func (s *Station) acceptMAC(m roce.MAC) bool {
	if m == s.mac || m == broadcastMAC || m == multicastMAC(allNodes) {
		return true
	}
	for _, g := range s.groups {
		if m == g {
			return true
		}
	}
	return false
}

// Input handles one frame from the link that is not RoCEv2 (the port's
// RoCE receive path takes UDP to port 4791).
func (s *Station) Input(frame []byte) Verdict {
	if len(frame) < roce.EthernetLen {
		return s.drop(DropMalformed)
	}
	eth := roce.Ethernet(frame)
	if !s.acceptMAC(eth.Dst()) {
		return s.drop(DropNotForUs)
	}
	if s.cfg.Resolver != nil {
		return s.drop(DropProtocol) // another stack answers
	}
	switch eth.EtherType() {
	case roce.EtherTypeARP:
		return s.inputARP(frame)
	case roce.EtherTypeIPv4:
		return s.inputIPv4(frame)
	case roce.EtherTypeIPv6:
		return s.inputIPv6(frame)
	}
	return s.drop(DropEtherType)
}

func (s *Station) inputARP(frame []byte) Verdict {
	a := arp(frame[roce.EthernetLen:])
	if !a.valid() {
		return s.drop(DropMalformed)
	}
	sender, target := a.senderIP(), a.targetIP()
	ours := s.ownsV4(target)
	if ours || s.known(sender) {
		s.learn(sender, a.senderMAC())
	}
	if !ours {
		return s.drop(DropNotOurIP)
	}
	if a.op() == arpRequest && sender != target {
		b := s.rx[:roce.EthernetLen+arpLen]
		writeEthernet(b, a.senderMAC(), s.mac, roce.EtherTypeARP)
		putARP(b[roce.EthernetLen:], arpReply, s.mac, target, a.senderMAC(), sender)
		s.cfg.Send(b)
		s.stats.arpReplies.Add(1)
	}
	return Consumed
}

func (s *Station) inputIPv4(frame []byte) Verdict {
	if len(frame) < roce.EthernetLen+roce.IPv4Len {
		return s.drop(DropMalformed)
	}
	ip := roce.IPv4(frame[roce.EthernetLen:])
	ihl := ip.IHL()
	end := roce.EthernetLen + int(ip.TotalLength())
	if ip.Version() != 4 || ihl < roce.IPv4Len || end > len(frame) || int(ip.TotalLength()) < ihl ||
		ip.ComputeChecksum() != ip.Checksum() {
		return s.drop(DropMalformed)
	}
	if !s.ownsV4(ip.Dst()) {
		return s.drop(DropNotOurIP)
	}
	switch ip.Protocol() {
	case protoICMP:
		if ip.IsFragment() {
			return s.drop(DropProtocol)
		}
		icmp := frame[roce.EthernetLen+ihl : end]
		if len(icmp) < 8 || checksum(icmp, 0) != 0 {
			return s.drop(DropMalformed)
		}
		if icmp[0] != icmpEchoRequest || icmp[1] != 0 {
			return s.drop(DropProtocol)
		}
		n := roce.EthernetLen + roce.IPv4Len + len(icmp)
		b := s.rx[:n]
		writeEthernet(b, roce.Ethernet(frame).Src(), s.mac, roce.EtherTypeIPv4)
		writeIPv4(b[roce.EthernetLen:], ip.Dst(), ip.Src(), protoICMP, len(icmp), uint16(s.ipID.Add(1)))
		r := b[roce.EthernetLen+roce.IPv4Len:]
		copy(r, icmp)
		r[0], r[2], r[3] = icmpEchoReply, 0, 0
		binary.BigEndian.PutUint16(r[2:4], checksum(r, 0))
		s.cfg.Send(b)
		s.stats.echo.Add(1)
		return Consumed
	}
	return s.drop(DropProtocol)
}

func (s *Station) inputIPv6(frame []byte) Verdict {
	if len(frame) < roce.EthernetLen+roce.IPv6Len {
		return s.drop(DropMalformed)
	}
	ip := roce.IPv6(frame[roce.EthernetLen:])
	end := roce.EthernetLen + roce.IPv6Len + int(ip.PayloadLength())
	if ip.Version() != 6 || end > len(frame) {
		return s.drop(DropMalformed)
	}
	dst := ip.Dst()
	unicast := s.ownsV6(dst)
	if !unicast && dst != allNodes && !s.isSolicitedNode(dst) {
		return s.drop(DropNotOurIP)
	}
	switch ip.NextHeader() {
	case protoICMPv6:
		return s.inputICMPv6(frame, ip, frame[roce.EthernetLen+roce.IPv6Len:end], unicast)
	}
	return s.drop(DropProtocol)
}

func (s *Station) isSolicitedNode(a netip.Addr) bool {
	for _, p := range s.v6 {
		if solicitedNode(p.Addr()) == a {
			return true
		}
	}
	return false
}

func (s *Station) inputICMPv6(frame []byte, ip roce.IPv6, msg []byte, unicast bool) Verdict {
	src, dst := ip.Src(), ip.Dst()
	if len(msg) < 8 || checksum(msg, pseudo6(src, dst, len(msg), protoICMPv6)) != 0 {
		return s.drop(DropMalformed)
	}
	switch msg[0] {
	case icmp6EchoRequest:
		if !unicast || msg[1] != 0 {
			return s.drop(DropProtocol)
		}
		n := roce.EthernetLen + roce.IPv6Len + len(msg)
		b := s.rx[:n]
		writeEthernet(b, roce.Ethernet(frame).Src(), s.mac, roce.EtherTypeIPv6)
		writeIPv6(b[roce.EthernetLen:], dst, src, protoICMPv6, len(msg), 64)
		r := b[roce.EthernetLen+roce.IPv6Len:]
		copy(r, msg)
		r[0], r[2], r[3] = icmp6EchoReply, 0, 0
		binary.BigEndian.PutUint16(r[2:4], checksum(r, pseudo6(dst, src, len(r), protoICMPv6)))
		s.cfg.Send(b)
		s.stats.echo6.Add(1)
		return Consumed
	case icmp6NeighborSol, icmp6NeighborAdv:
		// RFC 4861 7.1.1/7.1.2: hop limit 255, code 0, at least 24 bytes.
		if ip.HopLimit() != 255 || msg[1] != 0 || len(msg) < 24 {
			return s.drop(DropMalformed)
		}
		target := netip.AddrFrom16([16]byte(msg[8:24]))
		lladdr, ok := ndLinkAddr(msg[24:], msg[0] == icmp6NeighborSol)
		if msg[0] == icmp6NeighborAdv {
			if ok && (s.known(target) || s.pending(target)) {
				s.learn(target, lladdr)
			}
			return Consumed
		}
		if !s.ownsV6(target) {
			return s.drop(DropNotOurIP)
		}
		solicited := src.IsValid() && !src.IsUnspecified()
		if solicited && ok {
			s.learn(src, lladdr)
		}
		s.sendAdvert(s.rx, target, src, roce.Ethernet(frame).Src(), solicited)
		return Consumed
	}
	return s.drop(DropProtocol)
}

// ndLinkAddr finds the source (sol) or target link-layer address option.
func ndLinkAddr(opts []byte, sol bool) (roce.MAC, bool) {
	want := byte(ndOptTargetLLAddr)
	if sol {
		want = ndOptSourceLLAddr
	}
	for len(opts) >= 8 {
		n := int(opts[1]) * 8
		if n == 0 || n > len(opts) {
			return roce.MAC{}, false
		}
		if opts[0] == want && n >= 8 {
			return roce.MAC(opts[2:8]), true
		}
		opts = opts[n:]
	}
	return roce.MAC{}, false
}

// sendAdvert sends a neighbour advertisement for target (RFC 4861, 4.4):
// solicited to the asker, or unsolicited to all nodes.
func (s *Station) sendAdvert(buf []byte, target, to netip.Addr, toMAC roce.MAC, solicited bool) {
	const msgLen = 32
	n := roce.EthernetLen + roce.IPv6Len + msgLen
	b := buf[:n]
	flags := byte(0x20) // override
	if solicited {
		flags |= 0x40
	} else {
		to, toMAC = allNodes, multicastMAC(allNodes)
	}
	writeEthernet(b, toMAC, s.mac, roce.EtherTypeIPv6)
	writeIPv6(b[roce.EthernetLen:], target, to, protoICMPv6, msgLen, 255)
	m := b[roce.EthernetLen+roce.IPv6Len:]
	clear(m)
	m[0] = icmp6NeighborAdv
	m[4] = flags
	t := target.As16()
	copy(m[8:24], t[:])
	m[24], m[25] = ndOptTargetLLAddr, 1
	copy(m[26:32], s.mac[:])
	binary.BigEndian.PutUint16(m[2:4], checksum(m, pseudo6(target, to, msgLen, protoICMPv6)))
	s.cfg.Send(b)
	s.stats.adverts.Add(1)
}

// Announce tells the link the station is there: a gratuitous ARP for each
// IPv4 address and an unsolicited neighbour advertisement for each IPv6
// address, as a host does when its interface comes up.
func (s *Station) Announce() {
	if s.cfg.Resolver != nil {
		return
	}
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	for _, p := range s.v4 {
		b := s.tx[:roce.EthernetLen+arpLen]
		writeEthernet(b, broadcastMAC, s.mac, roce.EtherTypeARP)
		putARP(b[roce.EthernetLen:], arpRequest, s.mac, p.Addr(), roce.MAC{}, p.Addr())
		s.cfg.Send(b)
		s.stats.arpRequests.Add(1)
	}
	for _, p := range s.v6 {
		s.sendAdvert(s.tx, p.Addr(), netip.Addr{}, roce.MAC{}, false)
	}
}

// Lookup returns the MAC of neighbour a when the cache holds a valid,
// unexpired entry.
func (s *Station) Lookup(a netip.Addr) (roce.MAC, bool) {
	a = a.Unmap()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.neigh[a]
	if n == nil || !n.valid || s.cfg.Now().Sub(n.updated) >= s.cfg.NeighborTTL {
		return roce.MAC{}, false
	}
	return n.mac, true
}

func (s *Station) known(a netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.neigh[a]
	return n != nil && n.valid
}

func (s *Station) pending(a netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.neigh[a] != nil
}

func (s *Station) learn(a netip.Addr, mac roce.MAC) {
	if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || mac[0]&1 != 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.neigh[a]
	if n == nil {
		s.makeRoomLocked()
		n = &neighbor{resolved: make(chan struct{})}
		s.neigh[a] = n
	}
	n.mac, n.valid, n.updated = mac, true, s.cfg.Now()
	select {
	case <-n.resolved:
	default:
		close(n.resolved)
	}
	s.stats.learned.Add(1)
}

// makeRoomLocked keeps the cache below maxNeighbors before an insertion:
// it removes expired entries and, if none, the least recently updated
// one. s.mu is held.
func (s *Station) makeRoomLocked() {
	if len(s.neigh) < maxNeighbors {
		return
	}
	now := s.cfg.Now()
	var oldest netip.Addr
	var oldestAt time.Time
	for a, n := range s.neigh {
		if now.Sub(n.updated) >= s.cfg.NeighborTTL {
			delete(s.neigh, a)
			continue
		}
		if !oldest.IsValid() || n.updated.Before(oldestAt) {
			oldest, oldestAt = a, n.updated
		}
	}
	if len(s.neigh) >= maxNeighbors {
		delete(s.neigh, oldest)
	}
}

// NeighborCount returns the number of entries in the neighbour cache.
func (s *Station) NeighborCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.neigh)
}

// waiter returns the channel closed when a fresh answer for a arrives.
func (s *Station) waiter(a netip.Addr) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.neigh[a]
	if n == nil {
		s.makeRoomLocked()
		n = &neighbor{resolved: make(chan struct{}), updated: s.cfg.Now()}
		s.neigh[a] = n
	}
	select {
	case <-n.resolved:
		// Stale answer: wait for the next one.
		n.resolved = make(chan struct{})
	default:
	}
	return n.resolved
}

// Resolve returns the MAC of on-link neighbour a, asking the link (ARP
// request or neighbour solicitation) when the cache has no valid entry;
// a silent station asks its Config.Resolver instead.
func (s *Station) Resolve(ctx context.Context, a netip.Addr) (roce.MAC, error) {
	a = a.Unmap()
	if s.cfg.Resolver != nil {
		return s.cfg.Resolver.Resolve(ctx, a)
	}
	for attempt := 0; attempt < s.cfg.ResolveAttempts; attempt++ {
		if mac, ok := s.Lookup(a); ok {
			return mac, nil
		}
		ch := s.waiter(a)
		if err := s.solicit(a); err != nil {
			return roce.MAC{}, err
		}
		t := time.NewTimer(s.cfg.ResolveTimeout)
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return roce.MAC{}, fmt.Errorf("station: resolving %v: %w", a, ctx.Err())
		}
		t.Stop()
	}
	if mac, ok := s.Lookup(a); ok {
		return mac, nil
	}
	return roce.MAC{}, fmt.Errorf("%w: %v after %d attempts", ErrUnresolved, a, s.cfg.ResolveAttempts)
}

// solicit sends one ARP request or neighbour solicitation for a.
func (s *Station) solicit(a netip.Addr) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if a.Is4() {
		src, ok := pickSource(s.v4, a)
		if !ok {
			return fmt.Errorf("station: no IPv4 address to resolve %v from", a)
		}
		b := s.tx[:roce.EthernetLen+arpLen]
		writeEthernet(b, broadcastMAC, s.mac, roce.EtherTypeARP)
		putARP(b[roce.EthernetLen:], arpRequest, s.mac, src, roce.MAC{}, a)
		s.cfg.Send(b)
		s.stats.arpRequests.Add(1)
		return nil
	}
	src := s.linkLocal
	if !a.IsLinkLocalUnicast() {
		if p, ok := pickSource(s.v6[1:], a); ok {
			src = p
		}
	}
	const msgLen = 32
	group := solicitedNode(a)
	b := s.tx[:roce.EthernetLen+roce.IPv6Len+msgLen]
	writeEthernet(b, multicastMAC(group), s.mac, roce.EtherTypeIPv6)
	writeIPv6(b[roce.EthernetLen:], src, group, protoICMPv6, msgLen, 255)
	m := b[roce.EthernetLen+roce.IPv6Len:]
	clear(m)
	m[0] = icmp6NeighborSol
	t := a.As16()
	copy(m[8:24], t[:])
	m[24], m[25] = ndOptSourceLLAddr, 1
	copy(m[26:32], s.mac[:])
	binary.BigEndian.PutUint16(m[2:4], checksum(m, pseudo6(src, group, msgLen, protoICMPv6)))
	s.cfg.Send(b)
	s.stats.sols.Add(1)
	return nil
}

// pickSource returns the address of the prefix that contains a, else the
// first address.
func pickSource(prefixes []netip.Prefix, a netip.Addr) (netip.Addr, bool) {
	for _, p := range prefixes {
		if p.Contains(a) {
			return p.Addr(), true
		}
	}
	if len(prefixes) > 0 {
		return prefixes[0].Addr(), true
	}
	return netip.Addr{}, false
}
