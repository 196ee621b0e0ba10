package lab

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/taproce/taproce/internal/netnsutil"
)

// listenIn opens a TCP listener inside namespace ns; the socket belongs to
// that namespace whichever thread uses it afterwards.
func listenIn(ns string, addr netip.AddrPort) (net.Listener, error) {
	var l net.Listener
	err := netnsutil.Do(netnsutil.Path(ns), func(*netlink.Handle) error {
		var err error
		l, err = net.Listen("tcp", addr.String())
		return err
	})
	return l, err
}

// dialIn connects to addr from inside namespace ns.
func dialIn(ns string, addr netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := netnsutil.Do(netnsutil.Path(ns), func(*netlink.Handle) error {
		var err error
		c, err = net.DialTimeout("tcp", addr.String(), 5*time.Second)
		return err
	})
	return c, err
}

// TCPThroughput sends total bytes over TCP from the kernel of host a to
// the kernel of host b — over the same veth the ports use — and returns
// the rate in bytes per second: the baseline the RDMA path is measured
// against.
func TCPThroughput(a, b *Host, total int) (float64, error) {
	addr := netip.AddrPortFrom(b.KernelAddrs[0].Addr(), 5201)
	ln, err := listenIn(b.Namespace, addr)
	if err != nil {
		return 0, fmt.Errorf("listening in %s: %w", b.Namespace, err)
	}
	defer ln.Close()
	got := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		n, err := io.Copy(io.Discard, c)
		if err == nil && n != int64(total) {
			err = fmt.Errorf("received %d of %d bytes", n, total)
		}
		got <- err
	}()
	c, err := dialIn(a.Namespace, addr)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 1<<20)
	start := time.Now()
	for sent := 0; sent < total; {
		n, err := c.Write(buf[:min(len(buf), total-sent)])
		if err != nil {
			c.Close()
			return 0, err
		}
		sent += n
	}
	c.Close()
	if err := <-got; err != nil {
		return 0, err
	}
	return float64(total) / time.Since(start).Seconds(), nil
}

// tcpBaseline returns the median of tcpRuns runs of TCPThroughput of
// 256 MiB between the first two hosts, as Speed takes it; 0 when a run
// failed (the table then shows no baseline).
func (l *Lab) tcpBaseline() float64 {
	runs := make([]float64, tcpRuns)
	for i := range runs {
		r, err := TCPThroughput(l.Hosts[0], l.Hosts[1], 256<<20)
		if err != nil {
			l.Logger.Warn("lab: TCP baseline", "err", err)
			return 0
		}
		runs[i] = r
	}
	slices.Sort(runs)
	return runs[len(runs)/2]
}
