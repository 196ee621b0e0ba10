// Package redirecttest builds what redirect-mode tests need: pairs of
// network namespaces joined by a veth, with addresses on both ends, and
// the kernel-side traffic (ping, UDP, TCP) that shows what reaches which
// stack. Everything it creates is removed when the test ends, pass or
// fail.
package redirecttest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/internal/testnet"
)

// End is one side of a Pair: a namespace and its end of the veth.
type End struct {
	NS, Path string // namespace name and path
	Link     string // the veth end inside it
	MAC      net.HardwareAddr
	V4, V6   netip.Prefix // its addresses
}

// Pair creates two namespaces joined by a veth: a's end is named aLink,
// b's bLink; a gets 10.net.0.1/24 and fd00:net::1/64, b the .2 and ::2
// addresses (net picks the subnets; any value works, the namespaces
// are private). Both ends and both loopbacks are up, IPv6 duplicate
// address detection is off.
func Pair(t testing.TB, net byte, aLink, bLink string) (a, b End) {
	t.Helper()
	testnet.RequireRoot(t)
	a.NS, a.Path = testnet.Namespace(t)
	b.NS, b.Path = testnet.Namespace(t)
	a.Link, b.Link = aLink, bLink
	a.V4 = netip.MustParsePrefix(fmt.Sprintf("10.%d.0.1/24", net))
	b.V4 = netip.MustParsePrefix(fmt.Sprintf("10.%d.0.2/24", net))
	a.V6 = netip.MustParsePrefix(fmt.Sprintf("fd00:%x::1/64", net))
	b.V6 = netip.MustParsePrefix(fmt.Sprintf("fd00:%x::2/64", net))
	// a's end gets ifindex 100, b's the next free one (2): with equal
	// indexes (both 2 in fresh namespaces) the kernel's linkwatch would
	// take the veth for one whose peer is itself, treat its carrier change
	// as not urgent and apply it up to a second late, and IPv6 would not
	// answer neighbour solicitations until then.
	if err := veth(a.Path, aLink, b.Path, bLink, 100); err != nil {
		t.Fatal(err)
	}
	for _, e := range []*End{&a, &b} {
		err := netnsutil.Do(e.Path, func(h *netlink.Handle) error {
			_ = netnsutil.WriteSysctl("net/ipv6/conf/"+e.Link+"/accept_dad", "0")
			link, err := h.LinkByName(e.Link)
			if err != nil {
				return err
			}
			for _, p := range []netip.Prefix{e.V4, e.V6} {
				addr := &netlink.Addr{IPNet: IPNet(p), Flags: unix.IFA_F_NODAD}
				if err := h.AddrAdd(link, addr); err != nil {
					return fmt.Errorf("address %v: %w", p, err)
				}
			}
			lo, err := h.LinkByName("lo")
			if err != nil {
				return err
			}
			if err := h.LinkSetUp(lo); err != nil {
				return err
			}
			if err := h.LinkSetUp(link); err != nil {
				return err
			}
			e.MAC = link.Attrs().HardwareAddr
			return nil
		})
		if err != nil {
			t.Fatalf("setting up %s in %s: %v", e.Link, e.NS, err)
		}
	}
	return a, b
}

// Veth creates a veth pair with end nameA in the namespace at pathA and
// nameB in the one at pathB, both up.
func Veth(pathA, nameA, pathB, nameB string) error {
	return veth(pathA, nameA, pathB, nameB, 0)
}

func veth(pathA, nameA, pathB, nameB string, indexA int) error {
	fdA, err := unix.Open(pathA, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	defer unix.Close(fdA)
	fdB, err := unix.Open(pathB, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	defer unix.Close(fdB)
	v := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: nameA, Index: indexA, Namespace: netlink.NsFd(fdA)},
		PeerName:      nameB,
		PeerNamespace: netlink.NsFd(fdB),
	}
	if err := netlink.LinkAdd(v); err != nil {
		return fmt.Errorf("veth %s – %s: %w", nameA, nameB, err)
	}
	return nil
}

// IPNet converts a prefix to the netlink form, address bits kept.
func IPNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), bits)}
}

// In runs fn inside the namespace at path, failing the test on error.
func In(t testing.TB, path string, fn func() error) {
	t.Helper()
	if err := netnsutil.Do(path, func(*netlink.Handle) error { return fn() }); err != nil {
		t.Fatal(err)
	}
}

// ListenUDP opens a UDP socket on port inside the namespace at path.
func ListenUDP(t testing.TB, path string, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	In(t, path, func() error {
		var err error
		c, err = net.ListenUDP("udp", &net.UDPAddr{Port: port})
		return err
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// SendUDP sends payload from the kernel of the namespace at path to
// dst:port.
func SendUDP(t testing.TB, path string, dst netip.Addr, port int, payload []byte) {
	t.Helper()
	In(t, path, func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, uint16(port))))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(payload)
		return err
	})
}

// ReadUDP returns the next datagram on c, or an error after timeout.
func ReadUDP(c *net.UDPConn, timeout time.Duration) ([]byte, netip.AddrPort, error) {
	buf := make([]byte, 2048)
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, netip.AddrPort{}, err
	}
	n, from, err := c.ReadFromUDPAddrPort(buf)
	return buf[:n], from, err
}

// TCPEcho listens on TCP port in the namespace at path and echoes one
// line per connection; dialing it from another namespace shows TCP
// reaches that namespace's kernel.
func TCPEcho(t testing.TB, path string, port int) {
	t.Helper()
	var l net.Listener
	In(t, path, func() error {
		var err error
		l, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	})
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 256)
				c.SetDeadline(time.Now().Add(5 * time.Second))
				n, _ := c.Read(buf)
				c.Write(buf[:n])
			}()
		}
	}()
}

// TCPRoundTrip connects from the namespace at path to dst:port, sends msg
// and returns what comes back.
func TCPRoundTrip(path string, dst netip.Addr, port int, msg string) (string, error) {
	var got string
	err := netnsutil.Do(path, func(*netlink.Handle) error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(dst, uint16(port)).String(), 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		buf := make([]byte, 256)
		n, err := c.Read(buf)
		got = string(buf[:n])
		return err
	})
	return got, err
}

// Ping sends ICMP or ICMPv6 echo requests from the kernel of the
// namespace at path to dst until one is answered or timeout passes.
func Ping(path string, dst netip.Addr, timeout time.Duration) error {
	return netnsutil.Do(path, func(*netlink.Handle) error { return ping(dst, timeout) })
}

func ping(dst netip.Addr, timeout time.Duration) error {
	family, proto, reqType, repType := unix.AF_INET6, unix.IPPROTO_ICMPV6, byte(128), byte(129)
	var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: dst.As16()}
	if dst.Is4() {
		family, proto, reqType, repType = unix.AF_INET, unix.IPPROTO_ICMP, 8, 0
		sa = &unix.SockaddrInet4{Addr: dst.As4()}
	}
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return fmt.Errorf("raw ICMP socket: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return err
	}
	id := uint16(unix.Getpid())
	buf := make([]byte, 1500)
	for deadline, seq := time.Now().Add(timeout), uint16(1); time.Now().Before(deadline); seq++ {
		msg := make([]byte, 16)
		msg[0] = reqType
		binary.BigEndian.PutUint16(msg[4:6], id)
		binary.BigEndian.PutUint16(msg[6:8], seq)
		if family == unix.AF_INET {
			binary.BigEndian.PutUint16(msg[2:4], Checksum(msg, 0))
		}
		if err := unix.Sendto(fd, msg, 0, sa); err != nil {
			return fmt.Errorf("echo request to %v: %w", dst, err)
		}
		for sent := time.Now(); time.Since(sent) < 300*time.Millisecond; {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return err
			}
			m := buf[:n]
			if family == unix.AF_INET && n >= 20 {
				m = m[int(m[0]&0xF)*4:]
			}
			if len(m) >= 8 && m[0] == repType && binary.BigEndian.Uint16(m[4:6]) == id && binary.BigEndian.Uint16(m[6:8]) == seq {
				return nil
			}
		}
	}
	return fmt.Errorf("no echo reply from %v within %v", dst, timeout)
}

// Checksum returns the Internet checksum of b, starting from the partial
// sum initial.
func Checksum(b []byte, initial uint32) uint16 {
	sum := initial
	for ; len(b) >= 2; b = b[2:] {
		sum += uint32(b[0])<<8 | uint32(b[1])
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	for sum > 0xFFFF {
		sum = sum&0xFFFF + sum>>16
	}
	return ^uint16(sum)
}

// UDPFrame builds an Ethernet frame carrying a UDP datagram from src to
// dst (both IPv4 or both IPv6), with valid IP and UDP checksums.
func UDPFrame(dstMAC, srcMAC net.HardwareAddr, src, dst netip.AddrPort, payload []byte) []byte {
	udpLen := 8 + len(payload)
	udp := make([]byte, udpLen)
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen))
	copy(udp[8:], payload)
	var ip []byte
	var etherType uint16
	var pseudo uint32
	s, d := src.Addr().AsSlice(), dst.Addr().AsSlice()
	for i := 0; i < len(s); i += 2 {
		pseudo += uint32(s[i])<<8 | uint32(s[i+1])
		pseudo += uint32(d[i])<<8 | uint32(d[i+1])
	}
	pseudo += unix.IPPROTO_UDP + uint32(udpLen)
	if src.Addr().Is4() {
		etherType = unix.ETH_P_IP
		ip = make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
		binary.BigEndian.PutUint16(ip[2:], uint16(20+udpLen))
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
		copy(ip[12:16], s)
		copy(ip[16:20], d)
		binary.BigEndian.PutUint16(ip[10:], Checksum(ip, 0))
	} else {
		etherType = unix.ETH_P_IPV6
		ip = make([]byte, 40)
		ip[0], ip[6], ip[7] = 0x60, unix.IPPROTO_UDP, 64
		binary.BigEndian.PutUint16(ip[4:], uint16(udpLen))
		copy(ip[8:24], s)
		copy(ip[24:40], d)
	}
	sum := Checksum(udp, pseudo)
	if sum == 0 {
		sum = 0xFFFF // RFC 768: a computed 0 is sent as all ones
	}
	binary.BigEndian.PutUint16(udp[6:], sum)
	f := make([]byte, 0, 14+len(ip)+udpLen)
	f = append(f, dstMAC...)
	f = append(f, srcMAC...)
	f = binary.BigEndian.AppendUint16(f, etherType)
	f = append(f, ip...)
	return append(f, udp...)
}
