package redirect

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/station"
)

// ErrNoRoute: the namespace routes the destination elsewhere than through
// the pod interface, or not at all.
var ErrNoRoute = errors.New("no route through the pod interface")

// nudValid are the neighbour states whose link-layer address the kernel
// itself would send to.
const nudValid = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE | netlink.NUD_PERMANENT

// DefaultResolveTimeout bounds one resolution when the context has no
// deadline: longer than the kernel's own (3 probes, 1 s apart).
const DefaultResolveTimeout = 5 * time.Second

// Resolver finds next hops the way the pod's kernel does, for a port in
// redirect mode (it implements station.Resolver): the route to the
// destination in the pod's namespace gives the next hop (its gateway, or
// the destination itself when on-link), and the namespace's neighbour
// table gives the next hop's MAC.
//
// When the table has no usable entry, the Resolver asks the kernel to
// resolve it: an RTM_NEWNEIGH request with the NTF_USE flag (what `ip
// neigh replace ADDR dev eth0 use` sends) creates the entry if needed and
// calls neigh_event_send on it, exactly what the kernel does when a
// socket's first packet to that neighbour is queued. The kernel sends its
// ARP request or neighbour solicitation from the pod's own address,
// retransmits as configured, and fills in the entry; the Resolver polls
// the entry until it is usable or FAILED. Nothing is sent to the peer but
// the kernel's own probes, no socket is opened in the pod, and the entry
// ends up as if the pod had talked to the peer. The kernel's table is the
// only cache: a Resolve is a netlink round trip, made when a connection
// is set up, not per packet.
type Resolver struct {
	link    string
	index   int
	timeout time.Duration

	mu sync.Mutex // serialises use of h
	h  *netlink.Handle
}

// NewResolver returns a resolver for the namespace at netnsPath whose
// traffic leaves through interface link. It keeps a netlink socket in
// that namespace until Close.
func NewResolver(netnsPath, link string) (*Resolver, error) {
	r := &Resolver{link: link, timeout: DefaultResolveTimeout}
	err := do(netnsPath, func(*netlink.Handle) error {
		ns, err := netns.Get()
		if err != nil {
			return err
		}
		defer ns.Close()
		h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		l, err := h.LinkByName(link)
		if err != nil {
			h.Close()
			return linkErr("pod interface", link, err)
		}
		r.h, r.index = h, l.Attrs().Index
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redirect resolver %s:%s: %w", netnsPath, link, err)
	}
	return r, nil
}

// Close releases the netlink socket.
func (r *Resolver) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h != nil {
		r.h.Close()
		r.h = nil
	}
	return nil
}

// Resolve returns the MAC to send frames for dst to: its next hop's.
// Errors wrap station.ErrUnresolved when the neighbour does not answer,
// ErrNoRoute when dst is not reached through the pod interface.
func (r *Resolver) Resolve(ctx context.Context, dst netip.Addr) (roce.MAC, error) {
	dst = dst.Unmap()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.timeout)
		defer cancel()
	}
	nh, err := r.nextHop(dst)
	if err != nil {
		return roce.MAC{}, fmt.Errorf("resolving %v: %w", dst, err)
	}
	triggered := false
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		n, err := r.neighbor(nh)
		if err != nil {
			return roce.MAC{}, fmt.Errorf("resolving %v: %w", dst, err)
		}
		switch {
		case n != nil && n.State&nudValid != 0 && len(n.HardwareAddr) == 6:
			return roce.MAC(n.HardwareAddr), nil
		case n != nil && n.State&netlink.NUD_FAILED != 0 && triggered:
			return roce.MAC{}, fmt.Errorf("%w: %v (next hop %v) on %s: the kernel's probes went unanswered", station.ErrUnresolved, dst, nh, r.link)
		case !triggered || n == nil || n.State&netlink.NUD_INCOMPLETE == 0 && n.State&netlink.NUD_FAILED == 0:
			if err := r.trigger(nh); err != nil {
				return roce.MAC{}, fmt.Errorf("resolving %v: asking the kernel to resolve %v: %w", dst, nh, err)
			}
			triggered = true
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return roce.MAC{}, fmt.Errorf("%w: %v (next hop %v) on %s: %w", station.ErrUnresolved, dst, nh, r.link, ctx.Err())
		case <-t.C:
		}
	}
}

// nextHop returns the gateway of the route to dst, or dst when it is on
// link, insisting that the route leaves through the pod interface.
func (r *Resolver) nextHop(dst netip.Addr) (netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h == nil {
		return netip.Addr{}, errors.New("resolver closed")
	}
	var opts netlink.RouteGetOptions
	if dst.IsLinkLocalUnicast() {
		opts.OifIndex = r.index
	}
	routes, err := r.h.RouteGetWithOptions(net.IP(dst.AsSlice()), &opts)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: route lookup: %w", ErrNoRoute, err)
	}
	if len(routes) == 0 {
		return netip.Addr{}, ErrNoRoute
	}
	rt := routes[0]
	if rt.Type == unix.RTN_LOCAL {
		return netip.Addr{}, fmt.Errorf("%w: %v is the namespace's own address", ErrNoRoute, dst)
	}
	if rt.LinkIndex != r.index {
		name := fmt.Sprint("ifindex ", rt.LinkIndex)
		if l, err := r.h.LinkByIndex(rt.LinkIndex); err == nil {
			name = l.Attrs().Name
		}
		return netip.Addr{}, fmt.Errorf("%w: the route to %v leaves through %s, not %s", ErrNoRoute, dst, name, r.link)
	}
	if gw, ok := netip.AddrFromSlice(rt.Gw); ok && !gw.IsUnspecified() {
		return gw.Unmap(), nil
	}
	return dst, nil
}

// neighbor returns the namespace's neighbour entry for a on the pod
// interface, nil when there is none.
func (r *Resolver) neighbor(a netip.Addr) (*netlink.Neigh, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h == nil {
		return nil, errors.New("resolver closed")
	}
	ns, err := r.h.NeighList(r.index, family(a))
	if err != nil {
		return nil, fmt.Errorf("listing neighbours: %w", err)
	}
	for i := range ns {
		if x, ok := netip.AddrFromSlice(ns[i].IP); ok && x.Unmap() == a {
			return &ns[i], nil
		}
	}
	return nil, nil
}

// trigger asks the kernel to resolve a (RTM_NEWNEIGH with NTF_USE).
func (r *Resolver) trigger(a netip.Addr) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h == nil {
		return errors.New("resolver closed")
	}
	return r.h.NeighSet(&netlink.Neigh{
		LinkIndex: r.index,
		Family:    family(a),
		IP:        net.IP(a.AsSlice()),
		Flags:     netlink.NTF_USE,
	})
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}
