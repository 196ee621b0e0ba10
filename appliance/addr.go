package appliance

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/taproce/taproce/internal/netnsutil"
)

// The connection manager works with IP addresses, as the kernel's RDMA CM
// does: rdma_bind_addr and rdma_resolve_addr name a local address, or
// none, and a destination, and the kernel finds the device whose GID
// table holds the source (cma_acquire_dev_by_src_ip), taking the source
// the namespace's routing picks when none is given (rdma_resolve_ip).
// These are the appliance's answers: which NIC owns an address in a
// namespace, and which of its addresses reaches a destination by the
// namespace's routing.

// ErrNoSource is Route's error when no address of the port reaches the
// destination.
var ErrNoSource = errors.New("appliance: no address of the port reaches the destination")

// Route is how a NIC reaches a destination: from which of its addresses,
// through which next hop, by its namespace's routing (Kernel).
type Route struct {
	NIC *NIC
	// Src is the port's address to send from: a GID of the port.
	Src netip.Addr
	// NextHop is the route's gateway, or the destination itself on the
	// link (and for the port's own addresses).
	NextHop netip.Addr
	// Kernel is what the namespace's routing said (netnsutil.RouteTo);
	// zero for the port's own addresses and link-local ones, which need
	// no route.
	Kernel netnsutil.Route
}

// Netns returns the inode of the port's network namespace, as the
// control server identifies clients' namespaces; 0 for a NIC no
// Appliance made.
func (n *NIC) Netns() uint64 { return n.netns }

// Route finds how the NIC reaches dst. Its own addresses it reaches
// from themselves (the loopback of the local switch) and IPv6 link-local
// ones from its link-local address, without asking anyone; anything else
// by its namespace's routing (netnsutil.RouteTo, which enters the
// namespace: a call for a connection's setup, not for a packet). The
// source is the routing's own when it is one of the port's addresses (a
// redirected pod's port has the pod's), else the port's address on the
// next hop's link, else on the destination's. Errors wrap
// netnsutil.ErrNoRoute or ErrNoSource.
func (n *NIC) Route(dst netip.Addr) (Route, error) {
	dst = dst.Unmap()
	st := n.port.Station()
	if st.Owns(dst) {
		return Route{NIC: n, Src: dst, NextHop: dst}, nil
	}
	if dst.IsLinkLocalUnicast() {
		src, _ := st.OnLink(dst)
		return Route{NIC: n, Src: src, NextHop: dst}, nil
	}
	k, err := netnsutil.RouteTo(n.port.cfg.Netns, dst)
	if err != nil {
		// A namespace whose kernel has no route to the port's own
		// subnet (the port's addresses are taproce's, not the kernel's)
		// still reaches a destination on the port's link.
		if src, ok := st.OnLink(dst); ok && errors.Is(err, netnsutil.ErrNoRoute) {
			return Route{NIC: n, Src: src, NextHop: dst}, nil
		}
		return Route{}, fmt.Errorf("appliance: %s: %w", n.name, err)
	}
	r := Route{NIC: n, NextHop: k.NextHop, Kernel: k}
	switch src, ok := st.OnLink(k.NextHop); {
	case st.Owns(k.Src):
		r.Src = k.Src
	case ok:
		r.Src = src
	default:
		if r.Src, ok = st.OnLink(dst); !ok {
			return Route{}, fmt.Errorf("%w: %s to %v (next hop %v via %s)", ErrNoSource, n.name, dst, k.NextHop, k.Link)
		}
	}
	return r, nil
}

// NICByAddr returns the NIC of the namespace netns (an inode, as
// NIC.Netns) that owns address a (its station's; an IPv4-mapped address
// counts as its IPv4 address), nil when none does.
func (a *Appliance) NICByAddr(netns uint64, addr netip.Addr) *NIC {
	for _, n := range a.NICs() {
		if n.netns == netns && n.port.Station().Owns(addr) {
			return n
		}
	}
	return nil
}

// Route finds how a NIC of the namespace netns reaches dst (NIC.Route):
// the first NIC, by name, that does. It fails with ErrNoSource when the
// namespace has no NIC, and with the first NIC's error when none reaches
// dst.
func (a *Appliance) Route(netns uint64, dst netip.Addr) (Route, error) {
	var first error
	for _, n := range a.NICs() {
		if n.netns != netns {
			continue
		}
		r, err := n.Route(dst)
		if err == nil {
			return r, nil
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		return Route{}, fmt.Errorf("%w: no port in namespace %d", ErrNoSource, netns)
	}
	return Route{}, first
}
