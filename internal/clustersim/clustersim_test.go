package clustersim_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/taproce/taproce/appliance/admin"
	"github.com/taproce/taproce/appliance/daemon"
	"github.com/taproce/taproce/appliance/redirect/redirecttest"
	"github.com/taproce/taproce/config"
	"github.com/taproce/taproce/images"
	"github.com/taproce/taproce/internal/ibvlib"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/internal/testnet"
	"github.com/taproce/taproce/verbs"
)

// The simulated cluster's addresses: each node's pod subnet (its bridge
// takes .1), and the link between the nodes. Nodes 1 and 2 are
// TestCluster's, 4 and 5 TestCRI's.
var (
	podSubnet = [6]netip.Prefix{1: netip.MustParsePrefix("10.89.1.0/24"), 2: netip.MustParsePrefix("10.89.2.0/24"),
		4: netip.MustParsePrefix("10.71.4.0/24"), 5: netip.MustParsePrefix("10.71.5.0/24")}
	nodeLink = [6]netip.Prefix{1: netip.MustParsePrefix("192.168.89.1/30"), 2: netip.MustParsePrefix("192.168.89.2/30"),
		4: netip.MustParsePrefix("10.71.0.1/30"), 5: netip.MustParsePrefix("10.71.0.2/30")}
)

// demoSize is what each application writes into and reads from its peer.
const demoSize = 4 << 20

// The capabilities of the DaemonSet's container, as setpriv names them,
// and as /proc/PID/status shows them (bits 12, 21 and 19).
const (
	daemonSetCaps = "+net_admin,+sys_admin,+sys_ptrace"
	daemonSetMask = 1<<12 | 1<<21 | 1<<19
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds taproce, taproce-cni, the image's entrypoint, the
// reference bridge, host-local and loopback plugins and the pod sandbox's
// pause (TestCRI's) into a temporary directory, once per test binary. Everyone may run them (the unprivileged
// application does).
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "taproce-clustersim-bin-"); buildErr != nil {
			return
		}
		if buildErr = os.Chmod(binDir, 0o755); buildErr != nil {
			return
		}
		gocmd, err := exec.LookPath("go") // go test puts its own first
		if err != nil {
			buildErr = err
			return
		}
		cmd := exec.Command(gocmd, "build", "-o", binDir,
			"github.com/taproce/taproce",
			"github.com/taproce/taproce/cni/taproce-cni",
			"github.com/taproce/taproce/images/entrypoint",
			"github.com/containernetworking/plugins/plugins/main/bridge",
			"github.com/containernetworking/plugins/plugins/main/loopback",
			"github.com/containernetworking/plugins/plugins/ipam/host-local",
			"github.com/taproce/taproce/internal/clustersim/pause")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

func TestMain(m *testing.M) {
	if os.Getenv(clientEnv) != "" {
		os.Exit(runClient())
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// requireTools skips the test without the programs it runs.
func requireTools(t *testing.T) {
	t.Helper()
	testnet.RequireRoot(t)
	for _, p := range []string{"ip", "setpriv"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("needs %s: %v", p, err)
		}
	}
}

// workDir returns a directory everyone may traverse (the unprivileged
// application connects to a socket in it), removed when the test ends.
func workDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "taproce-clustersim-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// node is a simulated node: a network namespace with its pod bridge,
// the link to the other node, an appliance and a CNI configuration.
type node struct {
	n        int
	ns, path string
	dir      string
	cfg      *config.Config // the appliance's, sockets in dir
	cni      *libcni.CNIConfig
	list     *libcni.NetworkConfigList
	admin    *admin.Client
	metrics  func(t *testing.T) string // a scrape of /metrics
}

// newNode creates node n's namespace with loopback up and forwarding on,
// and the appliance configuration of the DaemonSet's ConfigMap with its
// directories moved into the node's own.
func newNode(t *testing.T, n int, base string) *node {
	t.Helper()
	nd := &node{n: n, dir: filepath.Join(base, fmt.Sprintf("node%d", n))}
	nd.ns, nd.path = testnet.Namespace(t)
	err := netnsutil.Do(nd.path, func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(lo); err != nil {
			return err
		}
		return netnsutil.WriteSysctl("net/ipv4/ip_forward", "1")
	})
	if err != nil {
		t.Fatal(err)
	}
	text, err := images.ConfigTOML()
	if err != nil {
		t.Fatal(err)
	}
	run, adm := filepath.Join(nd.dir, "run")+"/", filepath.Join(nd.dir, "admin")+"/"
	for _, d := range []string{run, adm} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	text = images.ReplaceDirs(text, map[string]string{"/run/taproce/": run, "/run/taproce-admin/": adm})
	if err := os.WriteFile(filepath.Join(nd.dir, "taproce.toml"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if nd.cfg, err = config.Parse([]byte(text), "node config"); err != nil {
		t.Fatal(err)
	}
	nd.admin = admin.NewClient(nd.cfg.AdminSocket)
	return nd
}

// link joins two nodes by a veth (eth0 in each) and routes each node's
// pod subnet through the other.
func link(t *testing.T, a, b *node) {
	t.Helper()
	if err := redirecttest.Veth(a.path, "eth0", b.path, "eth0"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct{ self, peer *node }{{a, b}, {b, a}} {
		err := netnsutil.Do(p.self.path, func(h *netlink.Handle) error {
			l, err := h.LinkByName("eth0")
			if err != nil {
				return err
			}
			if err := h.AddrAdd(l, &netlink.Addr{IPNet: redirecttest.IPNet(nodeLink[p.self.n])}); err != nil {
				return err
			}
			if err := h.LinkSetUp(l); err != nil {
				return err
			}
			return h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: redirecttest.IPNet(podSubnet[p.peer.n].Masked()),
				Gw: nodeLink[p.peer.n].Addr().AsSlice()})
		})
		if err != nil {
			t.Fatalf("node %d: %v", p.self.n, err)
		}
	}
}

// syncBuffer collects a daemon's log.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startInProcess runs node 1's appliance in the test process, its
// metrics on a free port of the test's loopback, and uses the plain
// chained conflist of images/ (bridge + host-local, taproce-cni) for its
// pods, with the node's subnet and admin socket.
func startInProcess(t *testing.T, nd *node, bins string) (stop func() error) {
	t.Helper()
	nd.cfg.MetricsAddress = "127.0.0.1:0"
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	d, err := daemon.Start(ctx, nd.cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Wait() }()
	var once sync.Once
	var result error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case result = <-done:
			case <-time.After(20 * time.Second):
				result = errors.New("node 1's appliance did not stop")
			}
		})
		return result
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("node 1 appliance log:\n%s", logs)
		}
	})
	nd.metrics = func(t *testing.T) string {
		t.Helper()
		resp, err := http.Get("http://" + d.MetricsAddr().String() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	useBridgeConflist(t, nd, bins)
	return stop
}

// useBridgeConflist gives the node the plain chained conflist of images/
// (bridge + host-local, taproce-cni) with the node's pod subnet and admin
// socket, and a libcni that runs the plugins in bins.
func useBridgeConflist(t *testing.T, nd *node, bins string) {
	t.Helper()
	var err error
	if nd.list, err = libcni.ConfListFromBytes(bridgeConflist(t, nd)); err != nil {
		t.Fatal(err)
	}
	nd.cni = libcni.NewCNIConfigWithCacheDir([]string{bins}, filepath.Join(nd.dir, "cni-cache"), nil)
}

// bridgeConflist returns the plain chained conflist of images/ (bridge +
// host-local, taproce-cni) with the node's pod subnet, host-local's
// data in the node's directory and the node's admin socket; portmap is
// left out (no port mappings here, nor iptables).
func bridgeConflist(t *testing.T, nd *node) []byte {
	t.Helper()
	data, err := images.Files.ReadFile("10-taproce-bridge.conflist")
	if err != nil {
		t.Fatal(err)
	}
	var list map[string]any
	if err := json.Unmarshal(data, &list); err != nil {
		t.Fatal(err)
	}
	var plugins []any
	for _, p := range list["plugins"].([]any) {
		m := p.(map[string]any)
		switch m["type"] {
		case "bridge":
			m["ipMasq"] = false // no iptables in the simulation, nor a need for it
			ipam := m["ipam"].(map[string]any)
			ipam["ranges"] = [][]map[string]string{{{"subnet": podSubnet[nd.n].String()}}}
			ipam["dataDir"] = filepath.Join(nd.dir, "ipam")
		case "portmap":
			continue // no port mappings here
		case "taproce-cni":
			m["adminSocket"] = nd.cfg.AdminSocket
		}
		plugins = append(plugins, m)
	}
	list["plugins"] = plugins
	data, _ = json.MarshalIndent(list, "", "  ")
	return data
}

// entrypoint is node 2's appliance, run as the DaemonSet runs it.
type entrypoint struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	done   chan struct{}
	status int
}

// startEntrypoint runs the image's entrypoint for node 2 as the
// DaemonSet does — in the node's network namespace, as root with only
// the DaemonSet's capabilities, with its arguments — over a directory
// laid out like the node (host/opt/cni/bin holding the cluster's
// plugins, host/etc/cni/net.d the cluster's primary conflist), and waits
// until it has chained taproce-cni into that conflist. The node's CNI
// configuration is then what a runtime finds there.
func startEntrypoint(t *testing.T, nd *node, bins string) *entrypoint {
	t.Helper()
	binDir, confDir := filepath.Join(nd.dir, "host/opt/cni/bin"), filepath.Join(nd.dir, "host/etc/cni/net.d")
	for _, d := range []string{binDir, confDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"bridge", "host-local"} {
		data, err := os.ReadFile(filepath.Join(bins, p))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(binDir, p), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The image's libraries, libibverbs.so.1 and librdmacm.so.1, which
	// the entrypoint puts on the node for pods: any bytes do, the copies
	// are what is checked.
	libSrc, libDir := filepath.Join(nd.dir, "image/usr/lib/taproce"), filepath.Join(nd.dir, "host/opt/taproce/lib")
	libData := func(name string) string { return fmt.Sprintf("\x7fELF taproce's %s for node %d", name, nd.n) }
	if err := os.MkdirAll(libSrc, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range ibvlib.Names {
		if err := os.WriteFile(filepath.Join(libSrc, name), []byte(libData(name)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	primary := filepath.Join(confDir, "10-bridge.conflist")
	original := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "k8s-pod-network",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true,
     "ipam": {"type": "host-local", "dataDir": %q,
              "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}}
  ]
}
`, filepath.Join(nd.dir, "ipam"), podSubnet[nd.n])
	if err := os.WriteFile(primary, []byte(original), 0o644); err != nil {
		t.Fatal(err)
	}

	// The DaemonSet's arguments, with the image's paths moved here.
	_, c := daemonSetContainer(t)
	var args []string
	for _, a := range images.Strings(c["args"]) {
		if strings.HasPrefix(a, "-config=") || strings.HasPrefix(a, "-resync=") {
			continue
		}
		args = append(args, a)
	}
	i := slices.Index(args, "--")
	args = slices.Insert(args, max(i, 0), "-config="+filepath.Join(nd.dir, "taproce.toml"), "-resync=500ms",
		"-taproce="+filepath.Join(bins, "taproce"), "-plugin="+filepath.Join(bins, "taproce-cni"),
		"-cni-bin-dir="+binDir, "-cni-conf-dir="+confDir, "-lib="+libSrc, "-lib-dir="+libDir)
	ep := &entrypoint{out: &syncBuffer{}, done: make(chan struct{})}
	ep.cmd = exec.Command("setpriv", append([]string{"--bounding-set=-all," + daemonSetCaps, "--inh-caps=-all", "--",
		filepath.Join(bins, "entrypoint")}, args...)...)
	ep.cmd.Stdout, ep.cmd.Stderr = ep.out, ep.out
	// Started from a thread in the node's namespace, the entrypoint is in
	// it too; it shares the test's mount namespace, so pods' namespaces
	// created later are visible to it, as HostToContainer propagation
	// makes them visible to the DaemonSet's container.
	if err := netnsutil.Do(nd.path, func(*netlink.Handle) error { return ep.cmd.Start() }); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := ep.cmd.Wait()
		ep.status = 0
		if ee, ok := errors.AsType[*exec.ExitError](err); ok {
			ep.status = ee.ExitCode()
		} else if err != nil {
			ep.status = -1
		}
		close(ep.done)
	}()
	t.Cleanup(func() {
		ep.stop(t)
		if t.Failed() {
			t.Logf("node 2 entrypoint and appliance log:\n%s", ep.out)
		}
	})

	deadline := time.Now().Add(20 * time.Second)
	for {
		data, _ := os.ReadFile(primary)
		if strings.Contains(string(data), "taproce-cni") {
			break
		}
		select {
		case <-ep.done:
			t.Fatalf("the entrypoint exited with %d:\n%s", ep.status, ep.out)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("taproce-cni not chained within 20 s:\n%s", ep.out)
		}
	}
	for _, name := range ibvlib.Names {
		if data, err := os.ReadFile(filepath.Join(libDir, name)); err != nil || string(data) != libData(name) {
			t.Fatalf("%s on the node: %q, %v; want the image's", name, data, err)
		}
	}
	// What a runtime does: take the first configuration of the directory.
	files, err := libcni.ConfFiles(confDir, []string{".conf", ".conflist", ".json"})
	if err != nil || len(files) == 0 {
		t.Fatalf("configuration files %v, %v", files, err)
	}
	slices.Sort(files)
	if nd.list, err = libcni.ConfListFromFile(files[0]); err != nil {
		t.Fatal(err)
	}
	if n := len(nd.list.Plugins); n != 2 || nd.list.Plugins[1].Network.Type != "taproce-cni" {
		t.Fatalf("the runtime's configuration %s has %d plugins:\n%s", files[0], n, nd.list.Bytes)
	}
	nd.cni = libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(nd.dir, "cni-cache"), nil)
	nd.metrics = func(t *testing.T) string {
		t.Helper()
		code, body := httpGetIn(t, nd.path, nd.cfg.MetricsAddress, "/metrics")
		if code != http.StatusOK {
			t.Fatalf("node 2 /metrics: %d %s", code, body)
		}
		return body
	}
	return ep
}

// daemonSetContainer returns the DaemonSet's pod spec and appliance
// container from images/.
func daemonSetContainer(t *testing.T) (spec, c map[string]any) {
	t.Helper()
	m, err := images.Find("DaemonSet", "taproce")
	if err != nil {
		t.Fatal(err)
	}
	spec, _ = images.Get(m.Object, "spec", "template", "spec").(map[string]any)
	if c = images.Named(spec["containers"], "appliance"); c == nil {
		t.Fatal("no appliance container")
	}
	return spec, c
}

// stop sends SIGTERM, as the kubelet does, and waits for the exit.
func (ep *entrypoint) stop(t *testing.T) int {
	t.Helper()
	select {
	case <-ep.done:
		return ep.status
	default:
	}
	_ = ep.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-ep.done:
	case <-time.After(20 * time.Second):
		ep.cmd.Process.Kill()
		<-ep.done
		t.Errorf("the entrypoint ignored SIGTERM")
	}
	return ep.status
}

// appliancePID returns the PID of the entrypoint's child, `taproce run`.
func (ep *entrypoint) appliancePID(t *testing.T) int {
	t.Helper()
	// Any of the entrypoint's threads may have forked it.
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", ep.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	var f []string
	for _, task := range tasks {
		data, _ := os.ReadFile(task)
		f = append(f, strings.Fields(string(data))...)
	}
	if len(f) != 1 {
		t.Fatalf("the entrypoint has children %q", f)
	}
	n, _ := strconv.Atoi(f[0])
	return n
}

// procStatus returns a field of /proc/PID/status.
func procStatus(t *testing.T, pid int, field string) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return ""
}

// httpGetIn fetches http://addr/path from inside the namespace at path,
// as the kubelet's probe does from the node (the appliance's metrics are
// on the node's loopback).
func httpGetIn(t *testing.T, nsPath, addr, path string) (int, string) {
	t.Helper()
	var conn net.Conn
	err := netnsutil.Do(nsPath, func(*netlink.Handle) error {
		var err error
		conn, err = net.DialTimeout("tcp", addr, 3*time.Second)
		return err
	})
	if err != nil {
		t.Fatalf("GET %s%s: %v", addr, path, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, addr)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("GET %s%s: %v", addr, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// pod is a pod attached to a node through libcni.
type pod struct {
	name     string
	node     *node
	ns, path string
	rt       *libcni.RuntimeConf
	ip       netip.Addr
	device   string
}

// inNode runs fn in the node's namespace: libcni execs the plugins from
// the calling thread, so they run there, as a runtime runs them on its
// node.
func inNode(nd *node, fn func() error) error {
	return netnsutil.Do(nd.path, func(*netlink.Handle) error { return fn() })
}

// addPod creates a pod's namespace and runs the node's CNI ADD for it.
func addPod(t *testing.T, ctx context.Context, nd *node, name string) *pod {
	t.Helper()
	p := &pod{name: name, node: nd}
	p.ns, p.path = testnet.Namespace(t)
	p.rt = &libcni.RuntimeConf{ContainerID: "ctr-" + name, NetNS: p.path, IfName: "eth0"}
	var res types.Result
	if err := inNode(nd, func() (err error) { res, err = nd.cni.AddNetworkList(ctx, nd.list, p.rt); return }); err != nil {
		t.Fatalf("ADD %s: %v", name, err)
	}
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	if len(cur.IPs) != 1 {
		t.Fatalf("%s: IPs %v", name, cur.IPs)
	}
	p.ip, _ = netip.AddrFromSlice(cur.IPs[0].Address.IP.To4())
	if !podSubnet[nd.n].Contains(p.ip) {
		t.Fatalf("%s got %v, outside node %d's %v", name, p.ip, nd.n, podSubnet[nd.n])
	}
	if !slices.ContainsFunc(cur.Interfaces, func(i *current.Interface) bool { return i.Name == "roce0" && i.Sandbox == p.path }) {
		t.Fatalf("%s: the result has no roce0: %v", name, cur.Interfaces)
	}
	att, err := nd.admin.Check(ctx, admin.CheckRequest{ContainerID: p.rt.ContainerID, IfName: "eth0"})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if !slices.Contains(att.GIDs, netip.AddrFrom16(p.ip.As16())) || att.Device == "" || att.Mode != admin.ModeRedirect {
		t.Fatalf("%s: attachment %+v: want the pod's IP %v as a GID in redirect mode", name, att, p.ip)
	}
	p.device = att.Device
	return p
}

// state returns the pod namespace's interfaces, the tc filters on their
// ingress and their clsact qdiscs.
func (p *pod) state(t *testing.T) (names []string, filters, clsact int) {
	t.Helper()
	err := netnsutil.Do(p.path, func(h *netlink.Handle) error {
		ls, err := h.LinkList()
		if err != nil {
			return err
		}
		for _, l := range ls {
			names = append(names, l.Attrs().Name)
			if fs, err := h.FilterList(l, netlink.HANDLE_MIN_INGRESS); err == nil {
				filters += len(fs)
			}
			if qs, err := h.QdiscList(l); err == nil {
				for _, q := range qs {
					if q.Type() == "clsact" {
						clsact++
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names, filters, clsact
}

// app is an application process in a pod.
type app struct {
	cmd   *exec.Cmd
	lines chan string
	log   *syncBuffer
}

// startApp runs `taproce rdma-demo ARGS` in the pod, with its node's
// socket; asNobody drops it to an unprivileged user without capabilities.
func startApp(t *testing.T, p *pod, asNobody bool, args ...string) *app {
	t.Helper()
	bin := filepath.Join(binaries(t), "taproce")
	argv := []string{"netns", "exec", p.ns}
	if asNobody {
		argv = append(argv, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--")
	}
	argv = append(append(argv, bin, "rdma-demo", "-size", strconv.Itoa(demoSize), "-timeout", "30s"), args...)
	a := &app{cmd: exec.Command("ip", argv...), lines: make(chan string, 16), log: &syncBuffer{}}
	a.cmd.Env = append(os.Environ(), "TAPROCE_SOCKET="+p.node.cfg.Socket)
	a.cmd.Stderr = a.log
	out, err := a.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			fmt.Fprintln(a.log, sc.Text())
			a.lines <- sc.Text()
		}
		close(a.lines)
	}()
	t.Cleanup(func() { a.cmd.Process.Kill(); a.cmd.Wait() })
	return a
}

// await returns the application's first output line starting with
// prefix.
func (a *app) await(t *testing.T, who, prefix string) string {
	t.Helper()
	timeout := time.After(40 * time.Second)
	for {
		select {
		case l, ok := <-a.lines:
			if !ok {
				a.cmd.Wait()
				t.Fatalf("%s ended without %q:\n%s", who, prefix, a.log)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timeout:
			t.Fatalf("%s said no %q within 40 s:\n%s", who, prefix, a.log)
		}
	}
}

// exchange runs the RDMA check between two pods: the listener's and the
// dialer's application each WRITE to, READ from and FETCH_ADD on the
// other, and compare SHA-256 sums.
func exchange(t *testing.T, listener, dialer *pod, port int, dialerAsNobody bool) {
	t.Helper()
	addr := netip.AddrPortFrom(listener.ip, uint16(port)).String()
	l := startApp(t, listener, false, "listen", addr)
	l.await(t, listener.name, "LISTENING")
	d := startApp(t, dialer, dialerAsNobody, "dial", addr)
	for _, x := range []struct {
		a    *app
		name string
	}{{d, dialer.name}, {l, listener.name}} {
		res := x.a.await(t, x.name, "RESULT")
		if !strings.HasPrefix(res, "RESULT ok") {
			t.Fatalf("%s: %s\n%s", x.name, res, x.a.log)
		}
		if err := x.a.cmd.Wait(); err != nil {
			t.Fatalf("%s: %v\n%s", x.name, err, x.a.log)
		}
		t.Logf("%s: %s", x.name, res)
	}
}

// metric sums the series of a scrape whose name is name and whose labels
// contain each of labels (`device="taproce0"`).
func metric(text, name string, labels ...string) float64 {
	var sum float64
	for _, l := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(l, name)
		if !ok || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		series, value, _ := strings.Cut(rest, " ")
		if rest[0] == ' ' {
			series, value = "", strings.TrimSpace(rest)
		}
		match := true
		for _, lb := range labels {
			match = match && strings.Contains(series, lb)
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil && match {
			sum += v
		}
	}
	return sum
}

// rssKiB returns a process's resident set size.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	f := strings.Fields(procStatus(t, pid, "VmRSS"))
	n, _ := strconv.Atoi(f[0])
	return n
}

// TestCluster: two nodes, three pods, RDMA between them through the
// local switch and across the nodes, then everything deleted and nothing
// left.
func TestCluster(t *testing.T) {
	requireTools(t)
	t0 := time.Now()
	bins := binaries(t)
	t.Logf("binaries built in %v", time.Since(t0).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	base := workDir(t)

	step := time.Now()
	n1, n2 := newNode(t, 1, base), newNode(t, 2, base)
	link(t, n1, n2)
	stop1 := startInProcess(t, n1, bins)
	ep := startEntrypoint(t, n2, bins)
	applPID := ep.appliancePID(t)
	if caps := procStatus(t, applPID, "CapEff"); caps != fmt.Sprintf("%016x", daemonSetMask) {
		t.Fatalf("node 2's appliance runs with capabilities %s, want only the DaemonSet's %016x", caps, daemonSetMask)
	}
	// The DaemonSet's liveness probe, from the node: its host, port and path.
	_, c := daemonSetContainer(t)
	probe := images.Get(c, "livenessProbe", "httpGet").(map[string]any)
	probeAddr := net.JoinHostPort(probe["host"].(string), fmt.Sprint(probe["port"]))
	if code, body := httpGetIn(t, n2.path, probeAddr, probe["path"].(string)); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("node 2's liveness probe: %d %q", code, body)
	}
	idleRSS := rssKiB(t, applPID)
	t.Logf("nodes and appliances up in %v; node 2's appliance: %d KiB RSS idle", time.Since(step).Round(time.Millisecond), idleRSS)

	step = time.Now()
	a := addPod(t, ctx, n1, "a")
	b := addPod(t, ctx, n1, "b")
	c2 := addPod(t, ctx, n2, "c")
	pods := []*pod{a, b, c2}
	for _, p := range pods {
		names, filters, clsact := p.state(t)
		if !slices.Contains(names, "roce0") || filters != 3 || clsact != 2 {
			t.Fatalf("pod %s after ADD: %v, %d filters, %d clsact", p.name, names, filters, clsact)
		}
		if err := inNode(p.node, func() error { return p.node.cni.CheckNetworkList(ctx, p.node.list, p.rt) }); err != nil {
			t.Fatalf("CHECK %s: %v", p.name, err)
		}
	}
	t.Logf("pods a %v and b %v on node 1, c %v on node 2, attached and checked in %v", a.ip, b.ip, c2.ip, time.Since(step).Round(time.Millisecond))

	// Two pods of node 1: through the local switch.
	step = time.Now()
	m1 := n1.metrics(t)
	exchange(t, a, b, 18515, false)
	m1after := n1.metrics(t)
	if v0, v1 := metric(m1, "taproce_local_switch_frames_total"), metric(m1after, "taproce_local_switch_frames_total"); v1 <= v0 {
		t.Errorf("node 1's local switch carried nothing between a and b: %v → %v", v0, v1)
	}
	t.Logf("a ⇄ b on node 1 in %v", time.Since(step).Round(time.Millisecond))

	// A pod of node 2, running as nobody without capabilities, and a pod
	// of node 1: RoCEv2 leaves c's appliance through c's interface, is
	// routed by both nodes and redirected into b's port.
	step = time.Now()
	m1, m2 := n1.metrics(t), n2.metrics(t)
	exchange(t, b, c2, 18516, true)
	m1after, m2after := n1.metrics(t), n2.metrics(t)
	for _, x := range []struct {
		what     string
		before   string
		after    string
		name     string
		device   string
		atLeast  float64
		scrapeOf string
	}{
		{"b's port received", m1, m1after, "taproce_port_rx_frames_total", b.device, demoSize / 4096, "node 1"},
		{"b's port sent", m1, m1after, "taproce_port_tx_frames_total", b.device, demoSize / 4096, "node 1"},
		{"c's port received", m2, m2after, "taproce_port_rx_frames_total", c2.device, demoSize / 4096, "node 2"},
		{"c's port sent", m2, m2after, "taproce_port_tx_frames_total", c2.device, demoSize / 4096, "node 2"},
	} {
		label := fmt.Sprintf("device=%q", x.device)
		if d := metric(x.after, x.name, label) - metric(x.before, x.name, label); d < x.atLeast {
			t.Errorf("%s %v frames through its TAP (%s, %s), want at least %v", x.what, d, x.name, x.scrapeOf, x.atLeast)
		}
	}
	if v0, v1 := metric(m1, "taproce_local_switch_frames_total"), metric(m1after, "taproce_local_switch_frames_total"); v1 != v0 {
		t.Errorf("traffic between nodes crossed node 1's local switch: %v → %v", v0, v1)
	}
	loadedRSS := rssKiB(t, applPID)
	t.Logf("c (node 2) ⇄ b (node 1) in %v; node 2's appliance: %d KiB RSS after", time.Since(step).Round(time.Millisecond), loadedRSS)

	// DEL: nothing of taproce is left in the pods or the appliances.
	step = time.Now()
	for _, p := range pods {
		if err := inNode(p.node, func() error { return p.node.cni.DelNetworkList(ctx, p.node.list, p.rt) }); err != nil {
			t.Fatalf("DEL %s: %v", p.name, err)
		}
		names, filters, clsact := p.state(t)
		if slices.Contains(names, "roce0") || filters != 0 || clsact != 0 {
			t.Errorf("pod %s after DEL: %v, %d filters, %d clsact qdiscs", p.name, names, filters, clsact)
		}
	}
	for _, nd := range []*node{n1, n2} {
		if l, err := nd.admin.List(ctx); err != nil || len(l) != 0 {
			t.Errorf("node %d's attachments after DEL: %+v, %v", nd.n, l, err)
		}
		var st struct {
			Attachments []json.RawMessage `json:"attachments"`
		}
		if data, err := os.ReadFile(nd.cfg.StateFile); err != nil || json.Unmarshal(data, &st) != nil || len(st.Attachments) != 0 {
			t.Errorf("node %d's state file after DEL: %s, %v", nd.n, data, err)
		}
		t.Setenv("TAPROCE_SOCKET", nd.cfg.Socket)
		if devs, err := verbs.Devices(ctx); err != nil || len(devs) != 0 {
			t.Errorf("node %d's devices after DEL: %+v, %v", nd.n, devs, err)
		}
		m := nd.metrics(t)
		if metric(m, "taproce_attachments") != 0 || metric(m, "taproce_ports") != 0 || metric(m, "taproce_qps") != 0 {
			t.Errorf("node %d's metrics after DEL: attachments %v, ports %v, QPs %v", nd.n,
				metric(m, "taproce_attachments"), metric(m, "taproce_ports"), metric(m, "taproce_qps"))
		}
	}
	t.Logf("DEL of the three pods checked in %v", time.Since(step).Round(time.Millisecond))

	// The appliances stop cleanly: SIGTERM for node 2's, as the kubelet
	// sends it; their sockets go. The plugin stays installed for the next
	// run (the entrypoint's default).
	if code := ep.stop(t); code != 0 {
		t.Errorf("node 2's entrypoint exited with %d", code)
	}
	if err := stop1(); err != nil {
		t.Errorf("node 1's appliance: %v", err)
	}
	for _, nd := range []*node{n1, n2} {
		for _, s := range []string{nd.cfg.Socket, nd.cfg.AdminSocket} {
			if _, err := os.Stat(s); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("node %d: %s left (%v)", nd.n, s, err)
			}
		}
	}
	if !strings.Contains(string(n2.list.Bytes), "taproce-cni") {
		t.Error("the chained configuration was lost")
	}
	t.Logf("cluster simulation: %v in all; node 2's appliance RSS %d KiB idle, %d KiB after the transfers", time.Since(t0).Round(time.Millisecond), idleRSS, loadedRSS)
}
