package daemon_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/taproce/taproce/appliance/admin"
	"github.com/taproce/taproce/appliance/daemon"
	"github.com/taproce/taproce/appliance/redirect"
	"github.com/taproce/taproce/appliance/redirect/redirecttest"
	"github.com/taproce/taproce/config"
	"github.com/taproce/taproce/internal/cpulist"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/internal/testnet"
	"github.com/taproce/taproce/tap"
	"github.com/taproce/taproce/verbs"
)

// testConfig returns a configuration whose sockets and state file lie in
// dir, with metrics on a free loopback port.
func testConfig(dir string) *config.Config {
	c := config.Default()
	c.Socket = filepath.Join(dir, "taproce.sock")
	c.AdminSocket = filepath.Join(dir, "admin.sock")
	c.StateFile = filepath.Join(dir, "attachments.json")
	c.MetricsAddress = "127.0.0.1:0"
	c.Poll = config.PollBlock
	return c
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// running is a daemon started by a test.
type running struct {
	d      *daemon.Daemon
	cancel context.CancelFunc
	done   chan error
}

// start starts a daemon for cfg and stops it when the test ends.
func start(t *testing.T, cfg *config.Config) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d, err := daemon.Start(ctx, cfg, quietLogger())
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	r := &running{d: d, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- d.Wait() }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels the daemon's context and returns Wait's result.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for a later stop
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the daemon did not stop")
		return nil
	}
}

// get fetches a URL path of the daemon's metrics server.
func (r *running) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + r.d.MetricsAddr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestHelperOpenDevice is not a test: openIn runs the test binary with it,
// inside a network namespace, as an application of that namespace would
// use its device.
func TestHelperOpenDevice(t *testing.T) {
	name := os.Getenv("TAPROCE_TEST_OPEN")
	if name == "" {
		t.Skip("helper process of openIn")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := verbs.Open(ctx, name)
	if err != nil {
		fmt.Printf("RESULT error %v\n", err)
		return
	}
	defer c.Close()
	var gids []string
	for i := range 8 {
		if g, err := c.GID(i); err == nil {
			gids = append(gids, g.String())
		}
	}
	fmt.Printf("RESULT opened %s %s\n", name, strings.Join(gids, " "))
}

// requireIP skips the test without iproute2's ip, which runs the
// helper processes in namespaces.
func requireIP(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skipf("needs ip (iproute2) to run applications in namespaces: %v", err)
	}
}

// openIn opens device in the named namespace from another process, as
// the pod's application does, and returns the helper's RESULT line.
func openIn(t *testing.T, ns, socket, device string) string {
	t.Helper()
	requireIP(t)
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestHelperOpenDevice$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "TAPROCE_SOCKET="+socket, "TAPROCE_TEST_OPEN="+device)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper in %s: %v\n%s", ns, err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if r, ok := strings.CutPrefix(l, "RESULT "); ok {
			return r
		}
	}
	t.Fatalf("helper in %s said nothing:\n%s", ns, out)
	return ""
}

// filtersAndTAP returns the tc filters on the ingress of the namespace's
// interfaces and whether it has a device named tap.
func filtersAndTAP(t *testing.T, path, tap string) (filters int, hasTAP bool) {
	t.Helper()
	err := netnsutil.Do(path, func(h *netlink.Handle) error {
		ls, err := h.LinkList()
		if err != nil {
			return err
		}
		for _, l := range ls {
			hasTAP = hasTAP || l.Attrs().Name == tap
			if fs, err := h.FilterList(l, netlink.HANDLE_MIN_INGRESS); err == nil {
				filters += len(fs)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return filters, hasTAP
}

func gone(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists (%v)", p, err)
		}
	}
}

// TestAttachMakesDevice: a pod attached through the daemon's admin API
// gets a verbs device its applications open; detach withdraws it;
// shutdown takes the port and filters down and keeps the record, and the
// next run adopts the pod again.
func TestAttachMakesDevice(t *testing.T) {
	requireIP(t)
	pod, _ := redirecttest.Pair(t, 91, "eth0", "veth0")
	cfg := testConfig(t.TempDir())
	t.Setenv("TAPROCE_SOCKET", cfg.Socket)
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	client := admin.NewClient(cfg.AdminSocket)
	req := admin.AttachRequest{ContainerID: "pod1", IfName: "eth0", Netns: pod.Path, IPs: []netip.Prefix{pod.V4, pod.V6}, Network: "test"}
	att, err := client.Attach(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if att.Device != "taproce0" {
		t.Fatalf("attachment %+v: want device taproce0", att)
	}
	nics := r.d.Appliance().NICs()
	if len(nics) != 1 || nics[0].Name() != "taproce0" || nics[0].Port().Namespace() != "pod1/eth0" {
		t.Fatalf("appliance devices %v", nics)
	}

	// Shown only in the pod's namespace: the host sees neither the device
	// nor the pod's addresses.
	list, err := verbs.ListDevices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Devices) != 0 || !list.OthersHidden {
		t.Fatalf("devices seen from the host: %+v", list)
	}
	if _, err := verbs.Open(ctx, "taproce0"); err == nil {
		t.Fatal("opened the pod's device from outside its namespace")
	}
	res := openIn(t, pod.NS, cfg.Socket, "taproce0")
	if !strings.HasPrefix(res, "opened taproce0 ") || !strings.Contains(res, " "+pod.V4.Addr().String()) || !strings.Contains(res, " "+pod.V6.Addr().String()) {
		t.Fatalf("the pod's application: %s", res)
	}

	code, text := r.get(t, "/metrics")
	if code != 200 || !strings.Contains(text, `taproce_port_rx_frames_total{device="taproce0",port="pod1/eth0/roce0"}`) ||
		!strings.Contains(text, "taproce_attachments 1") || !strings.Contains(text, "taproce_ports 1") {
		t.Fatalf("/metrics %d:\n%s", code, text)
	}

	// Detach withdraws the device.
	if err := client.Detach(ctx, admin.DetachRequest{ContainerID: "pod1", IfName: "eth0", Netns: pod.Path}); err != nil {
		t.Fatal(err)
	}
	if n := len(r.d.Appliance().NICs()); n != 0 {
		t.Fatalf("%d devices after detach", n)
	}
	if devs, err := verbs.Devices(ctx); err != nil || len(devs) != 0 {
		t.Fatalf("devices after detach: %+v, %v", devs, err)
	}

	// Shutdown with an attachment: no TAP, filter or socket is left, the
	// record is.
	if _, err := client.Attach(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if filters, tap := filtersAndTAP(t, pod.Path, "roce0"); filters != 0 || tap {
		t.Fatalf("after shutdown the pod has %d filters, TAP %v", filters, tap)
	}
	gone(t, cfg.Socket, cfg.AdminSocket)
	state, err := os.ReadFile(cfg.StateFile)
	if err != nil || !strings.Contains(string(state), `"containerID": "pod1"`) {
		t.Fatalf("state file after shutdown: %s, %v", state, err)
	}

	// The next run gives the pod its port back.
	r2 := start(t, cfg)
	if rec := r2.d.Recovery(); !slices.Equal(rec.Adopted, []string{"pod1/eth0"}) || len(rec.Cleaned) != 0 {
		t.Fatalf("recovery %+v", rec)
	}
	if atts, err := client.List(ctx); err != nil || len(atts) != 1 || atts[0].Device != "taproce0" {
		t.Fatalf("attachments after restart: %+v, %v", atts, err)
	}
	if _, err := client.Check(ctx, admin.CheckRequest{ContainerID: "pod1", IfName: "eth0"}); err != nil {
		t.Fatalf("check after restart: %v", err)
	}
	if res := openIn(t, pod.NS, cfg.Socket, "taproce0"); !strings.HasPrefix(res, "opened taproce0 ") {
		t.Fatalf("the pod's application after restart: %s", res)
	}
	if err := r2.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestRecoverCrash: a run that died (its TAP gone, its filters left)
// leaves a pod that still exists and one that does not; the next run
// adopts the first and cleans the second.
func TestRecoverCrash(t *testing.T) {
	pod, _ := redirecttest.Pair(t, 92, "eth0", "veth0")
	dead, _ := redirecttest.Pair(t, 93, "eth0", "veth0")
	cfg := testConfig(t.TempDir())
	ctx := context.Background()

	// A crashed run, as the kernel leaves it: filters without their TAP.
	old := start(t, cfg)
	for _, p := range []redirecttest.End{pod, dead} {
		if _, err := admin.NewClient(cfg.AdminSocket).Attach(ctx, admin.AttachRequest{ContainerID: "c-" + p.NS, IfName: "eth0",
			Netns: p.Path, IPs: []netip.Prefix{p.V4}}); err != nil {
			t.Fatal(err)
		}
	}
	state, err := os.ReadFile(cfg.StateFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.stop(t); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.StateFile, state, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []redirecttest.End{pod, dead} {
		dev, err := tap.Create(tap.Config{Name: "roce0", Netns: p.Path})
		if err != nil {
			t.Fatal(err)
		}
		if err := redirect.Install(redirect.Config{Netns: p.Path, Pod: "eth0", TAP: "roce0"}); err != nil {
			t.Fatal(err)
		}
		dev.Close()
	}
	if filters, tap := filtersAndTAP(t, pod.Path, "roce0"); filters != 2 || tap {
		t.Fatalf("crashed state: %d filters, TAP %v", filters, tap)
	}
	if err := netnsutil.Delete(dead.NS); err != nil {
		t.Fatal(err)
	}

	r := start(t, cfg)
	podID, deadID := "c-"+pod.NS+"/eth0", "c-"+dead.NS+"/eth0"
	if rec := r.d.Recovery(); !slices.Equal(rec.Adopted, []string{podID}) || !slices.Equal(rec.Cleaned, []string{deadID}) {
		t.Fatalf("recovery %+v", rec)
	}
	// The adopted pod's filters point at its new TAP.
	if _, err := admin.NewClient(cfg.AdminSocket).Check(ctx, admin.CheckRequest{ContainerID: "c-" + pod.NS, IfName: "eth0"}); err != nil {
		t.Fatalf("check of the adopted pod: %v", err)
	}
	if filters, tap := filtersAndTAP(t, pod.Path, "roce0"); filters != 3 || !tap {
		t.Fatalf("adopted pod: %d filters, TAP %v", filters, tap)
	}
	if n := len(r.d.Appliance().NICs()); n != 1 {
		t.Fatalf("%d devices", n)
	}
}

// TestHealthz: /healthz answers 200 while both sockets accept, 503 naming
// the one that does not.
func TestHealthz(t *testing.T) {
	testnet.RequireRoot(t)
	cfg := testConfig(t.TempDir())
	r := start(t, cfg)
	if code, body := r.get(t, "/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, body := r.get(t, "/nothing"); code != 404 {
		t.Errorf("/nothing: %d %q", code, body)
	}
	// Someone removes the admin socket: the plugin could no longer reach
	// the appliance.
	if err := os.Remove(cfg.AdminSocket); err != nil {
		t.Fatal(err)
	}
	code, body := r.get(t, "/healthz")
	if code != 503 || !strings.Contains(body, "admin socket") || strings.Contains(body, "control socket") {
		t.Fatalf("/healthz without the admin socket: %d %q", code, body)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("shutdown after losing the admin socket: %v", err)
	}
	gone(t, cfg.Socket)
}

// TestStartFailures: what keeps a daemon from starting is reported, and
// it leaves nothing behind — nor takes anything from a daemon already
// serving the sockets.
func TestStartFailures(t *testing.T) {
	testnet.RequireRoot(t)
	ctx := context.Background()

	t.Run("invalid config", func(t *testing.T) {
		cfg := testConfig(t.TempDir())
		cfg.Poll = "busy"
		cfg.Limits.QPs = 0
		_, err := daemon.Start(ctx, cfg, quietLogger())
		if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "poll") || !strings.Contains(err.Error(), "limits.qps") {
			t.Fatalf("error %v", err)
		}
		// Run refuses it the same way, before it moves the process.
		err = daemon.Run(ctx, cfg, quietLogger())
		if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "poll") || !strings.Contains(err.Error(), "limits.qps") {
			t.Fatalf("Run: error %v", err)
		}
	})

	t.Run("sockets in use", func(t *testing.T) {
		cfg := testConfig(t.TempDir())
		r := start(t, cfg)
		_, err := daemon.Start(ctx, cfg, quietLogger())
		if err == nil || !strings.Contains(err.Error(), "another appliance") {
			t.Fatalf("second daemon: %v", err)
		}
		other := *cfg
		other.Socket = filepath.Join(filepath.Dir(cfg.Socket), "other.sock")
		if _, err := daemon.Start(ctx, &other, quietLogger()); err == nil || !strings.Contains(err.Error(), "admin socket") {
			t.Fatalf("second daemon on the admin socket: %v", err)
		}
		gone(t, other.Socket)
		if code, body := r.get(t, "/healthz"); code != 200 {
			t.Fatalf("the first daemon after the attempts: %d %s", code, body)
		}
	})

	t.Run("metrics address in use", func(t *testing.T) {
		first := start(t, testConfig(t.TempDir()))
		cfg := testConfig(t.TempDir())
		cfg.MetricsAddress = first.d.MetricsAddr().String()
		if _, err := daemon.Start(ctx, cfg, quietLogger()); err == nil || !strings.Contains(err.Error(), "metrics") {
			t.Fatalf("error %v", err)
		}
		gone(t, cfg.Socket, cfg.AdminSocket)
	})

	t.Run("static port in a missing namespace", func(t *testing.T) {
		_, path := testnet.Namespace(t)
		cfg := testConfig(t.TempDir())
		cfg.Ports = []config.Port{config.DefaultPort(), config.DefaultPort()}
		cfg.Ports[0].Namespace, cfg.Ports[0].Addresses = path, []netip.Prefix{netip.MustParsePrefix("10.94.0.1/24")}
		cfg.Ports[1].Namespace, cfg.Ports[1].Addresses = "tpt-missing", []netip.Prefix{netip.MustParsePrefix("10.94.0.2/24")}
		_, err := daemon.Start(ctx, cfg, quietLogger())
		if err == nil || !strings.Contains(err.Error(), "port[1] tpt-missing/roce0") {
			t.Fatalf("error %v", err)
		}
		gone(t, cfg.Socket, cfg.AdminSocket)
		if _, tap := filtersAndTAP(t, path, "roce0"); tap {
			t.Fatal("the first port's TAP outlived the failed start")
		}
	})
}

// TestSocketAccess: the control socket's file gets the configured mode
// and group, by name or by ID; a group the host does not know keeps the
// daemon from starting, leaving nothing behind.
func TestSocketAccess(t *testing.T) {
	testnet.RequireRoot(t)
	nogroup, err := user.LookupGroupId("65534")
	if err != nil {
		t.Skipf("no group 65534 to give the socket: %v", err)
	}
	for _, c := range []struct {
		name  string
		mode  os.FileMode
		group string
		gid   uint32
	}{
		{"default", config.DefaultSocketMode, "", 0},
		{"owner only", 0o600, "", 0},
		{"group by name", 0o660, nogroup.Name, 65534},
		{"group by ID", 0o660, "65534", 65534},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.SocketMode, cfg.SocketGroup = c.mode, c.group
			r := start(t, cfg)
			fi, err := os.Stat(cfg.Socket)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != c.mode || fi.Sys().(*syscall.Stat_t).Gid != c.gid {
				t.Errorf("socket %v group %d, want %v group %d", fi.Mode(), fi.Sys().(*syscall.Stat_t).Gid, c.mode, c.gid)
			}
			if code, body := r.get(t, "/healthz"); code != 200 {
				t.Errorf("healthz: %d %s", code, body)
			}
		})
	}
	cfg := testConfig(t.TempDir())
	cfg.SocketGroup = "tpt-no-such-group"
	_, err = daemon.Start(context.Background(), cfg, quietLogger())
	if !errors.Is(err, daemon.ErrNoGroup) || !strings.Contains(err.Error(), `socket_group "tpt-no-such-group"`) {
		t.Fatalf("unknown group: %v", err)
	}
	gone(t, cfg.Socket, cfg.AdminSocket)
}

// TestListAllDevices: list_all_devices shows the host a static port of
// another namespace, unusable; by default the host is shown nothing.
func TestListAllDevices(t *testing.T) {
	testnet.RequireRoot(t)
	_, path := testnet.Namespace(t)
	for _, listAll := range []bool{false, true} {
		cfg := testConfig(t.TempDir())
		cfg.ListAllDevices = listAll
		p := config.DefaultPort()
		p.Namespace, p.Addresses = path, []netip.Prefix{netip.MustParsePrefix("10.95.0.1/24")}
		cfg.Ports = []config.Port{p}
		r := start(t, cfg)
		t.Setenv("TAPROCE_SOCKET", cfg.Socket)
		list, err := verbs.ListDevices(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		shown := len(list.Devices) == 1 && !list.Devices[0].Usable && slices.Contains(list.Devices[0].GIDs, netip.MustParseAddr("10.95.0.1"))
		if shown != listAll || list.OthersHidden == listAll {
			t.Errorf("list_all_devices = %v: the host is shown %+v", listAll, list)
		}
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
	}
}

// transferSize is what TestTransferMetrics writes from pod to pod.
const transferSize = 1 << 20

// TestHelperTransfer is not a test: TestTransferMetrics runs the test
// binary with it in each pod, one listening and one dialing, as two
// applications doing RDMA would.
func TestHelperTransfer(t *testing.T) {
	role, addr := os.Getenv("TAPROCE_TEST_ROLE"), os.Getenv("TAPROCE_TEST_ADDR")
	if role == "" {
		t.Skip("helper process of TestTransferMetrics")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := transfer(ctx, role, addr); err != nil {
		fmt.Printf("RESULT error %v\n", err)
		return
	}
	fmt.Println("RESULT ok")
}

func transfer(ctx context.Context, role, addr string) error {
	if role == "listen" {
		ln, err := verbs.Listen(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		defer ln.Close()
		fmt.Println("LISTENING")
		conn, err := ln.Accept(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		mr, err := conn.AllocMR(ctx, transferSize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		if err != nil {
			return err
		}
		if err := conn.SendMR(ctx, mr, verbs.AccessRemoteWrite); err != nil {
			return err
		}
		if msg, err := conn.Recv(ctx); err != nil || string(msg) != "written" {
			return fmt.Errorf("message %q, %v", msg, err)
		}
		for i, b := range mr.Bytes() {
			if b != byte(i*7) {
				return fmt.Errorf("byte %d is %d, want %d", i, b, byte(i*7))
			}
		}
		return conn.Send(ctx, []byte("checked"))
	}
	conn, err := verbs.Dial(ctx, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	remote, err := conn.ReceiveMR(ctx)
	if err != nil {
		return err
	}
	local, err := conn.AllocMR(ctx, transferSize, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	for i := range local.Bytes() {
		local.Bytes()[i] = byte(i * 7)
	}
	if err := conn.Write(ctx, local, 0, transferSize, remote, 0); err != nil {
		return err
	}
	if err := conn.Send(ctx, []byte("written")); err != nil {
		return err
	}
	if msg, err := conn.Recv(ctx); err != nil || string(msg) != "checked" {
		return fmt.Errorf("answer %q, %v", msg, err)
	}
	return nil
}

// helper starts the transfer helper in namespace ns.
func helper(t *testing.T, ns, socket, role, addr string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	requireIP(t)
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestHelperTransfer$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "TAPROCE_SOCKET="+socket, "TAPROCE_TEST_ROLE="+role, "TAPROCE_TEST_ADDR="+addr)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, bufio.NewScanner(out)
}

// await reads the helper's output until a line starting with prefix.
func await(t *testing.T, sc *bufio.Scanner, prefix string) string {
	t.Helper()
	var seen []string
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			return sc.Text()
		}
		seen = append(seen, sc.Text())
	}
	t.Fatalf("helper ended without %q:\n%s", prefix, strings.Join(seen, "\n"))
	return ""
}

// metricValue returns the value of the series named by prefix (name and
// labels) in a scrape, -1 when it is missing.
func metricValue(text, prefix string) float64 {
	for _, l := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(l, prefix+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err == nil {
				return v
			}
		}
	}
	return -1
}

// TestTransferMetrics: two pods attached to one daemon, an application in
// each; one writes 1 MiB into the other's memory. The data arrives, and
// the counters of /metrics moved: the transport's packets on both
// devices, the local switch they crossed; the clients' objects are gone
// with them.
func TestTransferMetrics(t *testing.T) {
	requireIP(t)
	a, b := redirecttest.Pair(t, 96, "eth0", "veth0")
	cfg := testConfig(t.TempDir())
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := admin.NewClient(cfg.AdminSocket)
	devs := map[string]string{}
	for _, p := range []redirecttest.End{a, b} {
		att, err := client.Attach(ctx, admin.AttachRequest{ContainerID: "c-" + p.NS, IfName: p.Link, Netns: p.Path, IPs: []netip.Prefix{p.V4}})
		if err != nil {
			t.Fatal(err)
		}
		devs[p.NS] = att.Device
	}
	_, before := r.get(t, "/metrics")

	addr := netip.AddrPortFrom(a.V4.Addr(), 18515).String()
	lcmd, lout := helper(t, a.NS, cfg.Socket, "listen", addr)
	await(t, lout, "LISTENING")
	dcmd, dout := helper(t, b.NS, cfg.Socket, "dial", addr)
	if res := await(t, dout, "RESULT"); res != "RESULT ok" {
		t.Fatalf("dialer: %s", res)
	}
	if res := await(t, lout, "RESULT"); res != "RESULT ok" {
		t.Fatalf("listener: %s", res)
	}
	dcmd.Wait()
	lcmd.Wait()
	_, after := r.get(t, "/metrics")

	for ns, dev := range devs {
		for _, name := range []string{"taproce_transport_packets_sent_total", "taproce_transport_packets_received_total"} {
			series := fmt.Sprintf(`%s{device=%q,port="c-%s/eth0/roce0"}`, name, dev, ns)
			if ns == b.NS {
				series = fmt.Sprintf(`%s{device=%q,port="c-%s/veth0/roce0"}`, name, dev, ns)
			}
			v0, v1 := metricValue(before, series), metricValue(after, series)
			if v0 < 0 || v1 <= v0 {
				t.Errorf("%s went from %v to %v", series, v0, v1)
			}
		}
	}
	// The traffic between the two pods crossed the switch in memory.
	if v0, v1 := metricValue(before, "taproce_local_switch_frames_total"), metricValue(after, "taproce_local_switch_frames_total"); v0 < 0 || v1 <= v0 {
		t.Errorf("taproce_local_switch_frames_total went from %v to %v", v0, v1)
	}
	// The appliance notices the applications' exits on its own time.
	deadline := time.Now().Add(5 * time.Second)
	for _, g := range []string{"taproce_qps", "taproce_clients", "taproce_mr_bytes"} {
		for v := metricValue(after, g); v != 0; v = metricValue(after, g) {
			if time.Now().After(deadline) {
				t.Errorf("%s %v after both applications left", g, v)
				break
			}
			time.Sleep(20 * time.Millisecond)
			_, after = r.get(t, "/metrics")
		}
	}
}

// TestRunProcs: while Run serves, the process runs on the processors the
// configuration chooses — as many at once as procs and poll say, on those
// cpus lists — and afterwards as before.
func TestRunProcs(t *testing.T) {
	testnet.RequireRoot(t)
	t.Setenv("GOMAXPROCS", "")
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	allowed, err := cpulist.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	all := cpulist.List(allowed)
	last := cpulist.Of(all[len(all)-1])
	for _, c := range []struct {
		name  string
		poll  string
		procs int
		cpus  string
		want  int
	}{
		{"spin takes half", config.PollSpin, 0, "", 2},
		{"block takes all", config.PollBlock, 0, "", 4},
		{"configured", config.PollBlock, 1, "", 1},
		{"block on its cpus", config.PollBlock, 0, cpulist.Format(last), 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.Poll, cfg.Procs, cfg.CPUs = c.poll, c.procs, c.cpus
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- daemon.Run(ctx, cfg, quietLogger()) }()
			deadline := time.Now().Add(20 * time.Second)
			for {
				if _, err := os.Stat(cfg.Socket); err == nil {
					break
				}
				select {
				case err := <-done:
					t.Fatalf("Run ended before serving: %v", err)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatal("no control socket after 20 s")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if got := runtime.GOMAXPROCS(0); got != c.want {
				t.Errorf("serving with poll %s and procs %d: GOMAXPROCS %d, want %d", c.poll, c.procs, got, c.want)
			}
			wantSet := allowed
			if c.cpus != "" {
				wantSet = last
			}
			if got, err := cpulist.Allowed(); err != nil || got != wantSet {
				t.Errorf("serving with cpus %q: runs on %q (%v)", c.cpus, cpulist.Format(got), err)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
			if got := runtime.GOMAXPROCS(0); got != 4 {
				t.Errorf("after Run: GOMAXPROCS %d, want 4 as before", got)
			}
			if got, err := cpulist.Allowed(); err != nil || got != allowed {
				t.Errorf("after Run: runs on %q (%v), want %q", cpulist.Format(got), err, cpulist.Format(allowed))
			}
		})
	}
}

// TestRunRefusesCPUs: a processor the process may not use is an error
// before anything starts.
func TestRunRefusesCPUs(t *testing.T) {
	allowed, err := cpulist.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	if allowed.IsSet(cpulist.Max - 1) {
		t.Skip("this process may use every processor number")
	}
	cfg := testConfig(t.TempDir())
	cfg.CPUs = fmt.Sprint(cpulist.Max - 1)
	err = daemon.Run(t.Context(), cfg, quietLogger())
	if !errors.Is(err, cpulist.ErrNotAllowed) {
		t.Fatalf("Run with cpus %s: %v, want ErrNotAllowed", cfg.CPUs, err)
	}
	if _, serr := os.Stat(cfg.Socket); serr == nil {
		t.Error("the control socket exists: Run started")
	}
}
