package lab

import (
	"bytes"
	"context"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/redirect"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/netnsutil"
)

// TestLabRedirect builds a lab in redirect mode and checks what it is
// made of: each host's uplink carries the kernel's addresses, with no
// bridge; the port shares them and the uplink's MAC, its GIDs among them;
// the redirect's tc filters are in place. Then the lab's checks, the
// exchange of RoCE frames both ways and the RDMA exchange pass over it,
// and Close leaves nothing behind.
func TestLabRedirect(t *testing.T) {
	p := prefix(t)
	before := rootLinks(t)
	l, err := Build(Topology{Prefix: p, Hosts: 2, Offload: true, Redirect: true})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			l.Close()
		}
	}()
	for _, h := range l.Hosts {
		if h.Bridge != "" || !slices.Equal(h.PortAddrs, h.KernelAddrs) {
			t.Errorf("%s: bridge %q, port %v, kernel %v: want no bridge and the same addresses", h.Namespace, h.Bridge, h.PortAddrs, h.KernelAddrs)
		}
		err := netnsutil.Do(netnsutil.Path(h.Namespace), func(nh *netlink.Handle) error {
			links, err := nh.LinkList()
			if err != nil {
				return err
			}
			for _, link := range links {
				if link.Type() == "bridge" {
					t.Errorf("%s: bridge %s in redirect mode", h.Namespace, link.Attrs().Name)
				}
			}
			up, err := nh.LinkByName(h.Uplink)
			if err != nil {
				return err
			}
			if mac := h.Port.MAC(); !bytes.Equal(up.Attrs().HardwareAddr, mac[:]) {
				t.Errorf("%s: port MAC %v, uplink %v", h.Namespace, mac, up.Attrs().HardwareAddr)
			}
			addrs, err := nh.AddrList(up, netlink.FAMILY_ALL)
			if err != nil {
				return err
			}
			for _, want := range h.KernelAddrs {
				if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool {
					got, _ := netip.AddrFromSlice(a.IP)
					return got.Unmap() == want.Addr()
				}) {
					t.Errorf("%s: %s lacks the kernel's %v (has %v)", h.Namespace, h.Uplink, want, addrs)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		gids := h.Port.Station().GIDs()
		for _, a := range h.KernelAddrs {
			if !slices.ContainsFunc(gids, func(g roce.GID) bool { return g.Addr() == a.Addr() }) {
				t.Errorf("%s: %v not among the port's GIDs", h.Namespace, a.Addr())
			}
		}
		cfg := redirect.Config{Netns: netnsutil.Path(h.Namespace), Pod: h.Uplink, TAP: appliance.DefaultPortName}
		if err := redirect.Verify(cfg); err != nil {
			t.Errorf("%s: %v", h.Namespace, err)
		}
	}
	ctx := context.Background()
	for _, s := range l.Checks(ctx) {
		if !s.OK {
			t.Errorf("%s: %s", s.Name, s.Detail)
		}
	}
	a, b := l.Hosts[0], l.Hosts[1]
	ex := newExchange()
	l.Handler = ex.receive
	for _, pair := range [][2]*Host{{a, b}, {b, a}} {
		if s := ex.run(ctx, pair[0], pair[1], 2000, 1); !s.OK {
			t.Errorf("%s: %s", s.Name, s.Detail)
		}
	}
	for _, s := range rdmaSteps(ctx, l, 8<<20) {
		if !s.OK {
			t.Errorf("%s: %s", s.Name, s.Detail)
		}
	}
	closed = true
	if err := l.Close(); err != nil {
		t.Error(err)
	}
	if left, _ := netnsutil.List(p); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
	for name := range rootLinks(t) {
		if !before[name] {
			t.Errorf("link %s left in the root namespace", name)
		}
	}
}

// TestLabRedirectRun runs the lab as `taproce lab --redirect` does on
// three hosts (the switch topology), under impairment, asking for kernel
// loss too: no nftables rule of a host namespace sees the RoCE the tc
// filters redirect, so that step is skipped, saying why, and the lab
// passes without it.
func TestLabRedirectRun(t *testing.T) {
	p := prefix(t)
	var out strings.Builder
	steps, err := Run(context.Background(), Options{
		Prefix: p, Hosts: 3, MTU: 1500, Offload: true, Frames: 2000, RDMA: 16 << 20, KernelLoss: 1, Redirect: true,
		Impair: "loss=1%,duplicate=1%,reorder=5%,corrupt=0.1%,seed=7", Out: &out, Binary: "-",
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"redirect mode", "SHA-256 identical", "RoCE frames " + p + "3 → " + p + "1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in the table", want)
		}
	}
	skipped := 0
	for _, s := range steps {
		if strings.HasPrefix(s.Name, "kernel loss") {
			if !s.Skipped || !s.OK || !strings.Contains(s.Detail, "redirect mode") {
				t.Errorf("%s: %+v", s.Name, s)
			}
			skipped++
		}
	}
	if skipped != 1 || len(steps) < 10 {
		t.Errorf("%d kernel loss steps, %d steps", skipped, len(steps))
	}
	t.Logf("\n%s", out.String())
}

// TestLabRedirectClients runs the lab in redirect mode with its client
// processes — the verbs steps, taproce perf, and Debian's
// ibv_rc_pingpong, ib_write_bw and ib_send_lat on taproce's library built
// from the checkout — each reaching the server host at its kernel's
// address, which is also its port's, and judged by its own output.
func TestLabRedirectClients(t *testing.T) {
	p := prefix(t)
	var out strings.Builder
	steps, err := Run(context.Background(), Options{Prefix: p, Hosts: 2, Offload: true, Frames: 200, RDMA: -1, Redirect: true, Out: &out,
		Binary: taproceBinary(t), Socket: filepath.Join(t.TempDir(), "lab.sock")})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	pingpong := regexp.MustCompile(`^1000 iters, [0-9.]+ µs/iter, [0-9.]+ Mbit/s$`)
	ran := 0
	for _, s := range steps {
		if !strings.HasPrefix(s.Name, "ibv_rc_pingpong (Debian's") {
			continue
		}
		ran++
		switch {
		case s.Skipped:
			t.Skipf("Debian's ibv_rc_pingpong did not run: %s", s.Detail)
		case !s.OK || !pingpong.MatchString(s.Detail):
			t.Errorf("%s: %s", s.Name, s.Detail)
		}
	}
	if ran != 1 {
		t.Errorf("%d ibv_rc_pingpong steps:\n%s", ran, out.String())
	}
	t.Logf("\n%s", out.String())
}
