package redirect_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/redirect"
	"github.com/taproce/taproce/appliance/redirect/redirecttest"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/station"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/tap"
)

// received is a RoCE packet a port handed to its handler.
type received struct {
	pkt     roce.Packet
	payload string
}

// redirectPort opens a redirect-mode port in e's namespace, as the
// appliance attaches a pod: the pod interface's MAC and addresses, a
// resolver on the namespace's routes and neighbours, the tc redirect.
func redirectPort(t *testing.T, e redirecttest.End) (*appliance.Port, chan received) {
	t.Helper()
	res, err := redirect.NewResolver(e.Path, e.Link)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Close() })
	got := make(chan received, 16)
	port, err := appliance.OpenPort(appliance.PortConfig{
		Namespace: e.NS,
		Netns:     e.Path,
		Name:      "roce0",
		MAC:       roce.MAC(e.MAC),
		Addrs:     []netip.Prefix{e.V4, e.V6},
		Resolver:  res,
		Handler: func(frame []byte, p *roce.Packet) {
			got <- received{*p, string(p.Payload(frame))}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { port.Close() })
	if err := redirect.Install(redirect.Config{Netns: e.Path, Pod: e.Link, TAP: "roce0"}); err != nil {
		t.Fatal(err)
	}
	return port, got
}

// sendRoCE builds an RC SEND ONLY from src's port to dst's address,
// resolving the next hop through the port's station, and sends it.
func sendRoCE(t *testing.T, port *appliance.Port, src, dst netip.Addr, qp uint32, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	mac, err := port.Station().Resolve(ctx, dst)
	if err != nil {
		t.Fatal(err)
	}
	p := roce.Packet{
		DstMAC: mac, SrcMAC: port.MAC(), IPv6: dst.Is6(), Src: src, Dst: dst, TTL: 64, DontFragment: !dst.Is6(),
		SrcPort: 0xC0DE, DstPort: roce.UDPPort,
		BTH: roce.BTHFields{Opcode: roce.RCSendOnly, PKey: 0xFFFF, DestQP: qp, PSN: 7},
	}
	buf := make([]byte, tap.Headroom+1500)
	n, err := p.Build(buf[tap.Headroom:], []byte(msg))
	if err != nil {
		t.Fatal(err)
	}
	if err := port.Send([][]byte{buf[:tap.Headroom+n]}, tap.Headroom); err != nil {
		t.Fatal(err)
	}
}

func expect(t *testing.T, ch chan received, qp uint32, msg string) {
	t.Helper()
	select {
	case r := <-ch:
		if r.pkt.BTH.DestQP != qp || r.payload != msg {
			t.Fatalf("got QP %#x %q, want QP %#x %q", r.pkt.BTH.DestQP, r.payload, qp, msg)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("no RoCE packet %q", msg)
	}
}

// TestRedirectPorts: two redirect-mode ports in namespaces joined by a
// veth exchange RoCEv2 packets over IPv4 and IPv6, using the pods' own
// MACs and addresses. The next hops come from the kernels' neighbour
// tables, and the ports' stations never speak ARP or ND themselves.
func TestRedirectPorts(t *testing.T) {
	a, b := redirecttest.Pair(t, 65, "eth0", "eth0")
	pa, ga := redirectPort(t, a)
	pb, gb := redirectPort(t, b)

	sendRoCE(t, pa, a.V4.Addr(), b.V4.Addr(), 0x11, "a to b over IPv4")
	expect(t, gb, 0x11, "a to b over IPv4")
	sendRoCE(t, pb, b.V4.Addr(), a.V4.Addr(), 0x12, "b to a over IPv4")
	expect(t, ga, 0x12, "b to a over IPv4")
	sendRoCE(t, pb, b.V6.Addr(), a.V6.Addr(), 0x13, "b to a over IPv6")
	expect(t, ga, 0x13, "b to a over IPv6")
	sendRoCE(t, pa, a.V6.Addr(), b.V6.Addr(), 0x14, "a to b over IPv6")
	expect(t, gb, 0x14, "a to b over IPv6")

	for _, p := range []*appliance.Port{pa, pb} {
		st := p.Stats().Station
		if st.ARPReplies+st.ARPRequests+st.NeighborAdverts+st.NeighborSols+st.EchoReplies+st.EchoReplies6 != 0 {
			t.Errorf("a silent station spoke on the wire: %+v", st)
		}
		if d := p.Stats().Delivered; d != 2 {
			t.Errorf("delivered %d, want 2", d)
		}
	}
	// The kernels resolved each other and still answer for their
	// addresses: ARP and echo are theirs.
	if err := redirecttest.Ping(a.Path, b.V4.Addr(), 3*time.Second); err != nil {
		t.Error(err)
	}
	if err := redirecttest.Ping(b.Path, a.V6.Addr(), 3*time.Second); err != nil {
		t.Error(err)
	}
}

// TestResolver covers the resolver's answers: an on-link neighbour, an
// off-link destination through a gateway, the namespace's own address, no
// route, a route through another interface, and a neighbour that never
// answers.
func TestResolver(t *testing.T) {
	a, b := redirecttest.Pair(t, 66, "eth0", "eth0")
	if err := redirecttest.Veth(a.Path, "side0", a.Path, "side1"); err != nil {
		t.Fatal(err)
	}
	err := netnsutil.Do(a.Path, func(h *netlink.Handle) error {
		eth0, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		// 198.51.100.0/24 via b; 203.0.113.0/24 out of another interface.
		if err := h.RouteAdd(&netlink.Route{Dst: redirecttest.IPNet(netip.MustParsePrefix("198.51.100.0/24")),
			Gw: b.V4.Addr().AsSlice(), LinkIndex: eth0.Attrs().Index}); err != nil {
			return err
		}
		side, err := h.LinkByName("side0")
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(side); err != nil {
			return err
		}
		return h.RouteAdd(&netlink.Route{Dst: redirecttest.IPNet(netip.MustParsePrefix("203.0.113.0/24")), LinkIndex: side.Attrs().Index})
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := redirect.NewResolver(a.Path, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	tests := []struct {
		name    string
		dst     string
		timeout time.Duration
		wantMAC roce.MAC
		wantErr error
	}{
		{name: "on-link IPv4", dst: b.V4.Addr().String(), wantMAC: roce.MAC(b.MAC)},
		{name: "on-link IPv6", dst: b.V6.Addr().String(), wantMAC: roce.MAC(b.MAC)},
		{name: "IPv4-mapped GID", dst: "::ffff:" + b.V4.Addr().String(), wantMAC: roce.MAC(b.MAC)},
		{name: "through a gateway", dst: "198.51.100.7", wantMAC: roce.MAC(b.MAC)},
		{name: "own address", dst: a.V4.Addr().String(), wantErr: redirect.ErrNoRoute},
		{name: "no route", dst: "192.0.2.1", wantErr: redirect.ErrNoRoute},
		{name: "other interface", dst: "203.0.113.1", wantErr: redirect.ErrNoRoute},
		{name: "nobody answers", dst: "10.66.0.99", timeout: 300 * time.Millisecond, wantErr: station.ErrUnresolved},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			timeout := tt.timeout
			if timeout == 0 {
				timeout = 5 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			mac, err := res.Resolve(ctx, netip.MustParseAddr(tt.dst))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("error %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil || mac != tt.wantMAC {
				t.Fatalf("MAC %v, %v; want %v", mac, err, tt.wantMAC)
			}
		})
	}
}
