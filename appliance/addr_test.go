package appliance

import (
	"errors"
	"net"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/internal/testnet"
	"github.com/taproce/taproce/tap"
)

// TestNICRoute: in a namespace whose kernel has 10.57.0.101/24 on a veth
// and a default route via 10.57.0.254, a port with 10.57.0.1/24 (bridge
// mode: an address of its own on the link) reaches a neighbour from its
// address directly, an address elsewhere through the gateway, its own
// address and a link-local one without a route; a port with the kernel's
// address (redirect mode) sends from it. NICByAddr finds a port by its
// address in its namespace only.
// TestNICRouteWithoutKernelRoutes: in a namespace whose kernel has no
// route at all (a test's, a bare pod's), a NIC still reaches the
// destinations on its own link from its address there, and nothing else.
func TestNICRouteWithoutKernelRoutes(t *testing.T) {
	_, path := testnet.Namespace(t)
	app, err := New(Options{Socket: filepath.Join(t.TempDir(), "s.sock"), Poll: PollBlock})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	dev, peer := tap.NewFakePair(1500, 16)
	t.Cleanup(func() { peer.Close() })
	n, err := app.AddPortOn(dev, PortConfig{Namespace: "bare", Netns: path, Name: "rb0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.59.0.1/24")}})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := n.Route(netip.MustParseAddr("10.59.0.7")); err != nil || r.Src != netip.MustParseAddr("10.59.0.1") || r.NextHop != netip.MustParseAddr("10.59.0.7") {
		t.Errorf("Route(10.59.0.7) = %+v, %v; want from 10.59.0.1 on the link", r, err)
	}
	if _, err := n.Route(netip.MustParseAddr("192.0.2.9")); !errors.Is(err, netnsutil.ErrNoRoute) {
		t.Errorf("Route(192.0.2.9): %v, want ErrNoRoute", err)
	}
}

func TestNICRoute(t *testing.T) {
	_, path := testnet.Namespace(t)
	err := netnsutil.Do(path, func(h *netlink.Handle) error {
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "up1"}); err != nil {
			return err
		}
		for _, dev := range []string{"up0", "up1"} {
			l, err := h.LinkByName(dev)
			if err != nil {
				return err
			}
			if err := h.LinkSetUp(l); err != nil {
				return err
			}
			if dev == "up0" {
				addr, _ := netlink.ParseAddr("10.57.0.101/24")
				addr.Flags = unix.IFA_F_NODAD
				if err := h.AddrAdd(l, addr); err != nil {
					return err
				}
				if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP("10.57.0.254")}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	app, err := New(Options{Socket: filepath.Join(t.TempDir(), "s.sock"), Poll: PollBlock})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	port := func(name, addr string) *NIC {
		dev, peer := tap.NewFakePair(1500, 16)
		t.Cleanup(func() { peer.Close() })
		n, err := app.AddPortOn(dev, PortConfig{Namespace: "route", Netns: path, Name: name, Addrs: []netip.Prefix{netip.MustParsePrefix(addr)}})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	bridge, redirect := port("rb0", "10.57.0.1/24"), port("rr0", "10.57.0.101/24")
	ip := netip.MustParseAddr
	for _, c := range []struct {
		n        *NIC
		dst      string
		src, hop string
	}{
		{bridge, "10.57.0.2", "10.57.0.1", "10.57.0.2"},
		{bridge, "::ffff:10.57.0.2", "10.57.0.1", "10.57.0.2"},
		{bridge, "192.0.2.9", "10.57.0.1", "10.57.0.254"},
		{bridge, "10.57.0.1", "10.57.0.1", "10.57.0.1"},
		{bridge, "10.57.0.101", "10.57.0.1", "10.57.0.101"}, // the namespace's kernel, on the link
		{redirect, "192.0.2.9", "10.57.0.101", "10.57.0.254"},
		{redirect, "10.57.0.2", "10.57.0.101", "10.57.0.2"},
	} {
		r, err := c.n.Route(ip(c.dst))
		if err != nil || r.NIC != c.n || r.Src != ip(c.src) || r.NextHop != ip(c.hop) {
			t.Errorf("%s: Route(%s) = %v→%v, %v; want %s via %s", c.n.Name(), c.dst, r.Src, r.NextHop, err, c.src, c.hop)
		}
	}
	ll := bridge.GIDs()[0].Addr()
	if r, err := bridge.Route(ip("fe80::77")); err != nil || r.Src != ll || r.NextHop != ip("fe80::77") {
		t.Errorf("Route(fe80::77) = %+v, %v", r, err)
	}
	if _, err := bridge.Route(ip("2001:db8::1")); !errors.Is(err, netnsutil.ErrNoRoute) {
		t.Errorf("Route(2001:db8::1): %v, want ErrNoRoute", err)
	}
	ns := bridge.Netns()
	if ns == 0 || redirect.Netns() != ns {
		t.Fatalf("namespaces %d and %d", ns, redirect.Netns())
	}
	for addr, want := range map[string]*NIC{"10.57.0.1": bridge, "::ffff:10.57.0.101": redirect, "10.57.0.2": nil} {
		if got := app.NICByAddr(ns, ip(addr)); got != want {
			t.Errorf("NICByAddr(%s) = %v, want %v", addr, got, want)
		}
	}
	if got := app.NICByAddr(ns+1, ip("10.57.0.1")); got != nil {
		t.Errorf("NICByAddr in another namespace = %v", got.Name())
	}
	if r, err := app.Route(ns, ip("192.0.2.9")); err != nil || r.NIC != bridge {
		t.Errorf("app.Route = %+v, %v; want the first port", r, err)
	}
	if _, err := app.Route(ns+1, ip("192.0.2.9")); !errors.Is(err, ErrNoSource) {
		t.Errorf("app.Route in a namespace without ports: %v", err)
	}
}
