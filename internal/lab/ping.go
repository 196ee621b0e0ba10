package lab

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/internal/netnsutil"
)

// ping sends ICMP (or ICMPv6) echo requests from the kernel of namespace ns
// to dst until one is answered or timeout passes: the kernel resolves the
// destination's MAC itself (ARP or neighbour discovery), exactly as the
// ping tool would. It returns the round-trip time of the answered request.
func ping(ns string, dst netip.Addr, timeout time.Duration) (time.Duration, error) {
	var rtt time.Duration
	err := netnsutil.Do(netnsutil.Path(ns), func(*netlink.Handle) error {
		var err error
		rtt, err = pingHere(dst, timeout)
		return err
	})
	return rtt, err
}

// errNoReply: no echo reply before the timeout.
var errNoReply = errors.New("no echo reply")

func pingHere(dst netip.Addr, timeout time.Duration) (time.Duration, error) {
	family, proto, reqType, repType := unix.AF_INET6, unix.IPPROTO_ICMPV6, byte(128), byte(129)
	var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: dst.As16()}
	if dst.Is4() {
		family, proto, reqType, repType = unix.AF_INET, unix.IPPROTO_ICMP, 8, 0
		sa = &unix.SockaddrInet4{Addr: dst.As4()}
	}
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return 0, fmt.Errorf("raw ICMP socket: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return 0, err
	}
	id := uint16(unix.Getpid())
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 1500)
	for seq := uint16(1); time.Now().Before(deadline); seq++ {
		msg := make([]byte, 8+32)
		msg[0] = reqType
		binary.BigEndian.PutUint16(msg[4:6], id)
		binary.BigEndian.PutUint16(msg[6:8], seq)
		copy(msg[8:], "taproce lab echo request payload")
		if family == unix.AF_INET {
			binary.BigEndian.PutUint16(msg[2:4], icmpChecksum(msg))
		} // the kernel fills in the ICMPv6 checksum of raw sockets
		sent := time.Now()
		if err := unix.Sendto(fd, msg, 0, sa); err != nil {
			return 0, fmt.Errorf("sending echo request to %v: %w", dst, err)
		}
		for time.Since(sent) < 500*time.Millisecond && time.Now().Before(deadline) {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
					continue
				}
				return 0, err
			}
			m := buf[:n]
			if family == unix.AF_INET {
				if n < 20 {
					continue
				}
				m = m[int(m[0]&0xF)*4:] // raw IPv4 sockets include the IP header
			}
			if !fromAddr(from, dst) || len(m) < 8 || m[0] != repType ||
				binary.BigEndian.Uint16(m[4:6]) != id || binary.BigEndian.Uint16(m[6:8]) != seq {
				continue
			}
			return time.Since(sent), nil
		}
	}
	return 0, fmt.Errorf("ping %v: %w within %v", dst, errNoReply, timeout)
}

func fromAddr(sa unix.Sockaddr, want netip.Addr) bool {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrFrom4(a.Addr) == want
	case *unix.SockaddrInet6:
		return netip.AddrFrom16(a.Addr) == want
	}
	return false
}

func icmpChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xFFFF {
		sum = sum&0xFFFF + sum>>16
	}
	return ^uint16(sum)
}
