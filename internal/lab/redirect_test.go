package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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

var (
	qperfTool      = debianTool{"qperf", "qperf"}
	fiPingpongTool = debianTool{"fi_pingpong", "libfabric-bin"}
	fiInfoTool     = debianTool{"fi_info", "libfabric-bin"}
)

// qperfResult matches qperf's result line of a bandwidth or latency test:
// "    bw  =  483 MB/sec", "    latency  =  62.6 us".
var qperfResult = regexp.MustCompile(`(?m)^\s+(bw|latency)\s+=\s+([0-9.]+ \S+)$`)

// TestLabRedirectQperf runs qperf 0.4.11 between the namespaces of a
// redirect lab on taproce's libraries, its server in the second, its
// client in the first: with -cm1 the RC tests connect through the RDMA
// CM to the one address the server host has — its kernel's, the port's
// too — which qperf's TCP control connection uses as well; each must
// exit 0 with its result line. ud_lat, with or without -cm1 (qperf's UD
// tests never use the CM: "-cm1 set but not used"), builds its address
// handle from a LID alone, which RoCE refuses, and fails as on rxe.
func TestLabRedirectQperf(t *testing.T) {
	l, lib := programsLab(t, true, qperfTool)
	a, b := l.Hosts[0], l.Hosts[1]
	ctx := context.Background()
	env := lib.env(l.Socket)
	const port = 19765
	srv, err := l.startClientEnv(ctx, env, "qperf", b, "-lp", strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.wait(time.Millisecond) // it serves until killed
	if err := srv.waitListen(b.Namespace, port, serverStart); err != nil {
		t.Fatalf("qperf server: %v\n%s", err, srv.output())
	}
	run := func(args ...string) (string, error) {
		args = append([]string{"-lp", strconv.Itoa(port), "-t", "1"}, args...)
		c, err := l.startClientEnv(ctx, env, "qperf", a, args...)
		if err != nil {
			return "", err
		}
		err = c.wait(time.Minute)
		return c.output(), err
	}
	for _, test := range []string{"rc_bw", "rc_lat", "rc_rdma_write_bw", "rc_rdma_read_lat"} {
		t.Run(test, func(t *testing.T) {
			out, err := run("-cm1", b.KernelAddrs[0].Addr().String(), test)
			m := qperfResult.FindStringSubmatch(out)
			if err != nil || !strings.HasPrefix(out, test+":\n") || m == nil {
				t.Fatalf("qperf -cm1 %s: %v\n%s\nserver:\n%s", test, err, out, srv.output())
			}
			t.Logf("%s: %s = %s", test, m[1], m[2])
		})
	}
	const refused = "failed to create address handle: Invalid argument"
	for _, cm := range [][]string{nil, {"-cm1"}} {
		t.Run("ud_lat"+strings.Join(cm, ""), func(t *testing.T) {
			before := len(srv.output())
			out, err := run(append(cm, b.KernelAddrs[0].Addr().String(), "ud_lat")...)
			var ee *exec.ExitError
			// Both sides build the handle; whichever fails first prints
			// the refusal and tells the other through TCP urgent data,
			// which qperf's client may then print as a bare "server: "
			// (its own race), so the server's fresh output counts too.
			failed := strings.Contains(out, refused)
			if !failed && strings.Contains(out, "server: ") {
				deadline := time.Now().Add(2 * time.Second)
				for !failed && time.Now().Before(deadline) {
					failed = strings.Contains(srv.output()[before:], refused)
					if !failed {
						time.Sleep(10 * time.Millisecond)
					}
				}
			}
			if !errors.As(err, &ee) || ee.ExitCode() != 1 || !failed || qperfResult.MatchString(out) {
				t.Fatalf("qperf %v ud_lat: %v\n%s\nserver:\n%s\nwant exit status 1 and the address handle refused, as on rxe", cm, err, out, srv.output()[before:])
			}
			if len(cm) > 0 && !strings.Contains(out, "-cm1 set but not used in test ud_lat") {
				t.Errorf("qperf -cm1 ud_lat did not say that it does not use the CM:\n%s", out)
			}
			t.Logf("qperf %v ud_lat: %s (refused by: client %t)", cm, strings.Join(strings.Fields(out), " "), strings.Contains(out, refused))
		})
	}
}

// fiRow matches a row of fi_pingpong's result table: bytes, #sent, #ack
// ("=N" when every message was acknowledged), total, time, MB/sec,
// usec/xfer, Mxfers/sec.
var fiRow = regexp.MustCompile(`(?m)^(\S+)\s+(\d+)\s+=(\d+)\s+\S+\s+\S+\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$`)

// judgeFiPingpong reads fi_pingpong's verdict: both sides exited 0 and
// printed its table, every row's messages all acknowledged; it returns
// the client's rows.
func judgeFiPingpong(srvOut, cliOut string, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	var rows []string
	for _, side := range []struct{ name, out string }{{"server", srvOut}, {"client", cliOut}} {
		if !strings.Contains(side.out, "MB/sec    usec/xfer   Mxfers/sec") {
			return nil, fmt.Errorf("%s printed no result table", side.name)
		}
		ms := fiRow.FindAllStringSubmatch(side.out, -1)
		if len(ms) == 0 {
			return nil, fmt.Errorf("%s printed no result row", side.name)
		}
		for _, m := range ms {
			if m[2] != m[3] {
				return nil, fmt.Errorf("%s: %s sent, %s acknowledged", side.name, m[2], m[3])
			}
		}
		if side.name == "client" {
			for _, m := range ms {
				rows = append(rows, fmt.Sprintf("%s: %s MB/s, %s µs/xfer", m[1], m[4], m[5]))
			}
		}
	}
	return rows, nil
}

// TestLabRedirectFabric runs libfabric's verbs provider (Debian's
// libfabric 1.17) between the namespaces of a redirect lab on taproce's
// libraries: fi_info lists each namespace's device, which the provider
// finds by binding the RDMA CM to the addresses getifaddrs gives (the
// kernel's, which the redirected port shares); fi_pingpong runs msg
// endpoints (RC through the RDMA CM, moving its IDs between event
// channels with rdma_migrate_id), rdm endpoints (ofi_rxm over msg) and
// dgram ones (UD), its server in the second namespace, its client in the
// first, each judged by both sides' exit status and result table. The
// rdm runs set FI_UNIVERSE_SIZE=16: ofi_rxm sizes its completion queue
// from the universe size, 262144 entries by default, beyond the device's
// max_cqe (65536; rxe's is 32767, and rxm fails there the same way,
// "Unable to create verbs CQ").
func TestLabRedirectFabric(t *testing.T) {
	l, lib := programsLab(t, true, fiPingpongTool, fiInfoTool)
	a, b := l.Hosts[0], l.Hosts[1]
	ctx := context.Background()
	env := lib.env(l.Socket)
	for _, h := range l.Hosts {
		c, err := l.startClientEnv(ctx, env, "fi_info", h, "-p", "verbs", "-t", "FI_EP_MSG")
		if err != nil {
			t.Fatal(err)
		}
		err = c.wait(time.Minute)
		out := c.output()
		if err != nil || !strings.Contains(out, "domain: "+h.Device+"\n") || !strings.Contains(out, "type: FI_EP_MSG") {
			t.Errorf("fi_info -p verbs in %s: %v\n%s\nwant %s listed", h.Namespace, err, out, h.Device)
		}
	}
	for i, ep := range []string{"msg", "rdm", "dgram"} {
		t.Run(ep, func(t *testing.T) {
			env := env
			if ep == "rdm" {
				env = append(slices.Clone(env), "FI_UNIVERSE_SIZE=16")
			}
			port := 47592 + i
			args := []string{"-p", "verbs", "-e", ep}
			srvOut, cliOut, err := l.pairEnv(ctx, env, "fi_pingpong", a, b, append(args, "-B", strconv.Itoa(port)),
				append(args, "-P", strconv.Itoa(port)), port, time.Minute)
			rows, err := judgeFiPingpong(srvOut, cliOut, err)
			if err != nil {
				t.Fatalf("fi_pingpong -e %s: %v\nclient:\n%s\nserver:\n%s", ep, err, cliOut, srvOut)
			}
			t.Logf("fi_pingpong -e %s: %s", ep, strings.Join(rows, "; "))
		})
	}
}
