package clustersim_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/taproce/taproce/appliance/admin"
	"github.com/taproce/taproce/deviceplugin"
	"github.com/taproce/taproce/images"
	"github.com/taproce/taproce/internal/ibvlib"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/internal/testnet"
)

// shimDir is where containerd 1.6's shims put their sockets (in s/),
// whatever containerd's configuration says.
const shimDir = "/run/containerd"

// The images TestCRI's pods run: the sandbox's, written by the test, and
// scripts/perftest-image's Debian bookworm with perftest and
// ibverbs-utils, exported from podman.
const (
	criPauseImage    = "localhost/taproce-pause:clustersim"
	criPerftestImage = "localhost/taproce-perftest:bookworm"
)

// TestCRI does on two simulated nodes what the kubelet does with Debian's
// containerd (1.6, its CRI plugin): each node runs containerd as a child
// of the test (its own root, state, socket and configuration: the CNI
// configuration directory holding images/10-taproce-bridge.conflist's
// chain — bridge, host-local, taproce-cni — and a directory of those
// plugins built from this module; the sandbox image a static pause
// program the test writes as an OCI archive; the perftest image exported
// from podman; both imported into containerd's k8s.io namespace) and
// `taproce run` with the DaemonSet's configuration, its directories in the
// node's. A CRI client plays the kubelet: RunPodSandbox, then
// CreateContainer for ibverbs-example.yaml's pods with their command
// lines, security context and resources and, for their taproce.io/roce,
// the mounts and environment the device plugin's Allocate answers — so the
// answer is shown to be enough — StartContainer, wait for the exit, read
// the log, StopPodSandbox and RemovePodSandbox.
//
// Debian's ib_write_bw server and client in two pods of node 4 must exit
// 0 with a bandwidth row (through the appliance's local switch), then
// ibv_rc_pingpong -g 1 -c; then a client pod on node 5, a second node with
// its own containerd, appliance and bridge, joined to node 4 by a veth,
// reaches a server pod on node 4 with each program in redirect mode,
// RoCEv2 crossing both pods' interfaces. Each pod's port is checked in
// redirect mode with the pod's IP as a GID, and its roce0 with its tc
// filters in the pod's namespace; removing the pods must leave no
// attachment (the admin API's list), no pod namespace, no veth on the
// node, no container or sandbox in containerd, no shim, no process in the
// pods' cgroups.
//
// Outside the test's directory containerd 1.6 uses, whatever its
// configuration: /var/run/netns (the pods' namespaces, cni-*),
// /run/containerd/s (the shims' sockets) and /var/lib/cni (libcni's
// cache); each pod's entries go with it.
//
// It needs root, Debian's containerd and runc (scripts/setup installs
// them), podman and scripts/perftest-image (which makes the perftest
// image), the C toolchain for taproce's libraries, and
// TAPROCE_IMAGE_TEST=1: the perftest image takes minutes to make the first
// time, and importing it into two containerds a minute.
func TestCRI(t *testing.T) {
	requireTools(t)
	if os.Getenv("TAPROCE_IMAGE_TEST") != "1" {
		t.Skip("set TAPROCE_IMAGE_TEST=1 to run pods through containerd's CRI (scripts/perftest-image makes the perftest image; takes minutes)")
	}
	for _, p := range []string{"containerd", "ctr", "containerd-shim-runc-v2", "runc"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("needs Debian's containerd and runc (scripts/setup installs them): %v", err)
		}
	}
	script, err := filepath.Abs("../../scripts/perftest-image")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("podman"); err != nil {
		t.Skipf("needs podman for the perftest image (scripts/perftest-image installs it): %v", err)
	}
	if _, err := os.Stat(script); err != nil {
		t.Skipf("needs scripts/perftest-image: %v", err)
	}
	if err := ibvlib.RDMACMToolchain(); err != nil {
		t.Skipf("needs the C toolchain for taproce's libraries (scripts/setup installs it): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	t0 := time.Now()
	cmd := exec.CommandContext(ctx, script)
	cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":/usr/local/go/bin")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	t.Logf("scripts/perftest-image: %s", lines[len(lines)-1])
	bins := binaries(t)
	checkout, ok := ibvlib.Checkout(".")
	if !ok {
		t.Skip("not in a source checkout: nothing to build taproce's libraries from")
	}
	libs, err := ibvlib.Build(ctx, checkout, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := workDir(t)
	pauseTar, perftestTar := filepath.Join(base, "pause.tar"), filepath.Join(base, "perftest.tar")
	writePauseImage(t, filepath.Join(bins, "pause"), pauseTar, criPauseImage)
	if out, err := exec.CommandContext(ctx, "podman", "--runtime", "runc", "save", "--format", "docker-archive",
		"-o", perftestTar, criPerftestImage).CombinedOutput(); err != nil {
		t.Fatalf("podman save: %v\n%s", err, out)
	}
	t.Logf("images and binaries ready in %v", time.Since(t0).Round(time.Millisecond))

	// The shims put their sockets in /run/containerd/s whatever the
	// configuration says; what they make there goes with them, the
	// directories when this test made them (empty, or not removed).
	if _, err := os.Stat(shimDir); errors.Is(err, fs.ErrNotExist) {
		t.Cleanup(func() {
			_ = os.Remove(filepath.Join(shimDir, "s"))
			_ = os.Remove(shimDir)
		})
	}
	step := time.Now()
	n4, n5 := newNode(t, 4, base), newNode(t, 5, base)
	link(t, n4, n5)
	c4 := startCRINode(t, ctx, n4, bins, libs.Dir, pauseTar, perftestTar)
	c5 := startCRINode(t, ctx, n5, bins, libs.Dir, pauseTar, perftestTar)
	t.Logf("two nodes with containerd and an appliance each, images imported, in %v", time.Since(step).Round(time.Millisecond))

	server, client := ibWriteBwPods(t)
	// Each pair runs, then before(sp, cp) checks what it wants while the
	// pods are still there (a port's metrics go with it), then both pods
	// are removed.
	ibWriteBw := func(srv, cli *criNode, name string, before func(sp, cp *criPod)) {
		sp, cp, srvOut, cliOut := runPair(t, ctx, srv, cli, name, server, nil, client, func(ip netip.Addr) []string {
			args := slices.Clone(images.Strings(client["args"]))
			args[len(args)-1] = ip.String()
			return append(images.Strings(client["command"]), args...)
		})
		row := regexp.MustCompile(`(?m)^\s*65536\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$`).FindStringSubmatch(cliOut)
		if row == nil || !strings.Contains(cliOut, "BW average[Gb/sec]") || row[3] == "0.00" {
			t.Fatalf("no result row with a bandwidth:\nclient:\n%s\nserver:\n%s", cliOut, srvOut)
		}
		t.Logf("%s: ib_write_bw client in pod %s (%v, node %d), server in %s (%v, node %d): %s Gb/s average\n%s",
			name, cp.name, cp.ip, cli.n, sp.name, sp.ip, srv.n, row[3], cliOut)
		before(sp, cp)
		sp.remove(t)
		cp.remove(t)
	}
	pingpong := func(srv, cli *criNode, name string, before func(sp, cp *criPod)) {
		cmd := []string{"/usr/bin/ibv_rc_pingpong", "-g", "1", "-c"}
		sp, cp, srvOut, cliOut := runPair(t, ctx, srv, cli, name, server, cmd, client, func(ip netip.Addr) []string {
			return append(slices.Clone(cmd), ip.String())
		})
		re := regexp.MustCompile(`(?m)^\d+ bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec$`)
		for who, out := range map[string]string{"server": srvOut, "client": cliOut} {
			if !re.MatchString(out) || !strings.Contains(out, "1000 iters in") || strings.Contains(out, "invalid data") {
				t.Fatalf("the %s printed no result:\nclient:\n%s\nserver:\n%s", who, cliOut, srvOut)
			}
		}
		t.Logf("%s: ibv_rc_pingpong -g 1 -c, client in pod %s (node %d), server in %s (node %d):\n%s",
			name, cp.name, cli.n, sp.name, srv.n, cliOut)
		before(sp, cp)
		sp.remove(t)
		cp.remove(t)
	}
	// Pods of one node talk through its appliance's local switch.
	local := func() func(sp, cp *criPod) {
		m := n4.metrics(t)
		return func(sp, cp *criPod) {
			if v0, v1 := metric(m, "taproce_local_switch_frames_total"), metric(n4.metrics(t), "taproce_local_switch_frames_total"); v1 <= v0 {
				t.Errorf("%s ⇄ %s: node 4's local switch carried nothing: %v → %v", sp.name, cp.name, v0, v1)
			}
		}
	}
	// Pods of two nodes: RoCEv2 through both ports' TAPs, redirected
	// between each pod's interface and its port; not through node 4's
	// local switch.
	redirect := func() func(sp, cp *criPod) {
		m := n4.metrics(t)
		return func(sp, cp *criPod) {
			m4, m5 := n4.metrics(t), n5.metrics(t)
			if v0, v1 := metric(m, "taproce_local_switch_frames_total"), metric(m4, "taproce_local_switch_frames_total"); v1 != v0 {
				t.Errorf("%s ⇄ %s: traffic between the nodes crossed node 4's local switch: %v → %v", sp.name, cp.name, v0, v1)
			}
			for _, x := range []struct {
				p       *criPod
				metrics string
			}{{sp, m4}, {cp, m5}} {
				dev := fmt.Sprintf("device=%q", x.p.device)
				for _, name := range []string{"taproce_port_rx_frames_total", "taproce_port_tx_frames_total"} {
					if v := metric(x.metrics, name, dev); v < 1000 {
						t.Errorf("pod %s's port %s (node %d): %s %v, want the transfer's frames through its TAP",
							x.p.name, x.p.device, x.p.node.n, name, v)
					}
				}
				t.Logf("pod %s's port (node %d): frames %v in, %v out; retransmits %v, timeouts %v, NAKs %v, drops %v",
					x.p.name, x.p.node.n, metric(x.metrics, "taproce_port_rx_frames_total", dev),
					metric(x.metrics, "taproce_port_tx_frames_total", dev), metric(x.metrics, "taproce_port_retransmits_total", dev),
					metric(x.metrics, "taproce_port_timeouts_total", dev), metric(x.metrics, "taproce_port_naks_total", dev),
					metric(x.metrics, "taproce_port_drops_total", dev))
			}
		}
	}

	// Two pods of node 4.
	step = time.Now()
	ibWriteBw(c4, c4, "ib-write-bw", local())
	pingpong(c4, c4, "pingpong", local())
	t.Logf("two pairs of pods on node 4 in %v", time.Since(step).Round(time.Millisecond))

	// A server pod on node 4, a client pod on node 5.
	step = time.Now()
	ibWriteBw(c4, c5, "redirect-ib-write-bw", redirect())
	pingpong(c4, c5, "redirect-pingpong", redirect())
	t.Logf("two pairs of pods across nodes 4 and 5 in %v", time.Since(step).Round(time.Millisecond))

	// Nothing is left: no attachment, port, sandbox, container, shim,
	// process in the pods' cgroups, pod namespace or veth.
	for _, c := range []*criNode{c4, c5} {
		c.checkEmpty(t, ctx)
	}
	t.Logf("TestCRI: %v in all", time.Since(t0).Round(time.Millisecond))
}

// ibWriteBwPods returns the containers of ibverbs-example.yaml's server
// and client pods.
func ibWriteBwPods(t *testing.T) (server, client map[string]any) {
	t.Helper()
	for _, x := range []struct {
		name string
		c    *map[string]any
	}{{"taproce-ib-write-bw-server", &server}, {"taproce-ib-write-bw-client", &client}} {
		m, err := images.Find("Pod", x.name)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := images.Get(m.Object, "spec", "containers", 0).(map[string]any)
		if c == nil {
			t.Fatalf("%v has no container", m)
		}
		*x.c = c
	}
	return server, client
}

// runPair runs a server pod on srv with the container c of a manifest
// and the command line srvCmd (nil: the manifest's), waits until it
// listens on perftest's port 18515, then a client pod on cli with
// cliCmd(the server pod's IP); both must exit 0. It returns the pods,
// not removed, and their output.
func runPair(t *testing.T, ctx context.Context, srv, cli *criNode, name string, srvC map[string]any, srvCmd []string,
	cliC map[string]any, cliCmd func(netip.Addr) []string) (sp, cp *criPod, srvOut, cliOut string) {
	t.Helper()
	sp = srv.runPodSandbox(t, ctx, name+"-server")
	sid := sp.startContainer(t, ctx, srvC, srvCmd)
	deadline := time.Now().Add(time.Minute)
	for {
		ok, err := netnsutil.Listening(sp.netns, 18515)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		st, err := srv.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: sid})
		if err == nil && st.Status.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Fatalf("the server exited with %d before listening:\n%s", st.Status.ExitCode, srv.containerLog(t, st.Status))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server never listened")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cp = cli.runPodSandbox(t, ctx, name+"-client")
	cid := cp.startContainer(t, ctx, cliC, cliCmd(sp.ip))
	cst := cli.wait(t, ctx, cid)
	sst := srv.wait(t, ctx, sid)
	cliOut, srvOut = cli.containerLog(t, cst), srv.containerLog(t, sst)
	if cst.ExitCode != 0 || sst.ExitCode != 0 {
		t.Fatalf("%s: client exited with %d (%s):\n%s\nserver exited with %d (%s):\n%s", name,
			cst.ExitCode, cst.Reason, cliOut, sst.ExitCode, sst.Reason, srvOut)
	}
	return sp, cp, srvOut, cliOut
}

// criNode is a simulated node with containerd and an appliance.
type criNode struct {
	*node
	libDir string // taproce's libraries, where the DaemonSet's entrypoint puts them
	cgroup string // the pods' cgroups' parent
	sock   string // containerd's
	rt     runtimeapi.RuntimeServiceClient
	img    runtimeapi.ImageServiceClient
	plugin *deviceplugin.Plugin
	netns  []string // the pods' namespaces, to be gone
}

// child is a process of a node started by the test.
type child struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// startChild starts cmd in the node's network namespace and stops it
// with SIGTERM when the test ends, logging its output if the test failed.
func startChild(t *testing.T, nd *node, who string, cmd *exec.Cmd) *child {
	t.Helper()
	c := &child{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	if err := netnsutil.Do(nd.path, func(*netlink.Handle) error { return cmd.Start() }); err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	go func() { _ = cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(30 * time.Second):
			t.Errorf("node %d's %s ignored SIGTERM", nd.n, who)
			_ = cmd.Process.Kill()
			<-c.done
		}
		if t.Failed() {
			t.Logf("node %d's %s:\n%s", nd.n, who, c.out)
		}
	})
	return c
}

// exited reports whether the process has ended.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// startCRINode puts taproce's libraries where the DaemonSet's entrypoint
// would, starts the node's appliance (`taproce run` with the DaemonSet's
// configuration) and containerd with the chained conflist, imports the
// image archives into containerd and makes the node's device plugin.
func startCRINode(t *testing.T, ctx context.Context, nd *node, bins, libs string, archives ...string) *criNode {
	t.Helper()
	c := &criNode{node: nd, libDir: filepath.Join(nd.dir, "opt/taproce/lib"), cgroup: "/" + testnet.Name() + "-pods"}
	if err := os.MkdirAll(c.libDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range ibvlib.Names {
		data, err := os.ReadFile(filepath.Join(libs, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(c.libDir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	nd.metrics = func(t *testing.T) string {
		t.Helper()
		code, body := httpGetIn(t, nd.path, nd.cfg.MetricsAddress, "/metrics")
		if code != http.StatusOK {
			t.Fatalf("node %d /metrics: %d %s", nd.n, code, body)
		}
		return body
	}

	appl := startChild(t, nd, "appliance", exec.Command(filepath.Join(bins, "taproce"), "run",
		"--config", filepath.Join(nd.dir, "taproce.toml"), "--log-format=text"))
	for nd.admin.Health(ctx) != nil {
		if appl.exited() || ctx.Err() != nil {
			t.Fatalf("node %d's appliance did not come up:\n%s", nd.n, appl.out)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The CNI configuration containerd reads: images/' chain.
	cniBin, cniConf := filepath.Join(nd.dir, "cni/bin"), filepath.Join(nd.dir, "cni/net.d")
	for _, d := range []string{cniBin, cniConf} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback", "taproce-cni"} {
		if err := os.Symlink(filepath.Join(bins, p), filepath.Join(cniBin, p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(cniConf, "10-taproce-bridge.conflist"), bridgeConflist(t, nd), 0o644); err != nil {
		t.Fatal(err)
	}

	// containerd, its directories the node's. What it leaves behind when
	// the test fails — shims, containers' processes, mounts, cgroups — is
	// removed after it stops (cleanups run last first).
	dir := filepath.Join(nd.dir, "containerd")
	c.sock = filepath.Join(dir, "containerd.sock")
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(containerdConfig(dir, c.sock, runc, cniBin, cniConf)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.leftovers(t) })
	ctrd := startChild(t, nd, "containerd", exec.Command("containerd", "--config", cfg))
	conn, err := grpc.NewClient("unix://"+c.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c.rt, c.img = runtimeapi.NewRuntimeServiceClient(conn), runtimeapi.NewImageServiceClient(conn)
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := c.rt.Status(ctx, &runtimeapi.StatusRequest{})
		ready := 0
		if err == nil {
			for _, cond := range st.Status.Conditions {
				if (cond.Type == runtimeapi.RuntimeReady || cond.Type == runtimeapi.NetworkReady) && cond.Status {
					ready++
				}
			}
		}
		if ready == 2 {
			break
		}
		if ctrd.exited() || time.Now().After(deadline) {
			t.Fatalf("node %d's containerd is not ready: %v %v\n%s", nd.n, st, err, ctrd.out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	v, err := c.rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}

	step := time.Now()
	for _, a := range archives {
		out, err := exec.CommandContext(ctx, "ctr", "--address", c.sock, "--namespace", "k8s.io", "images", "import", a).CombinedOutput()
		if err != nil {
			t.Fatalf("ctr images import %s: %v\n%s", a, err, out)
		}
	}
	for _, ref := range []string{criPauseImage, criPerftestImage} {
		deadline := time.Now().Add(30 * time.Second)
		for {
			st, err := c.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
			if err == nil && st.Image != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d: the CRI does not see %s: %v", nd.n, ref, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	t.Logf("node %d: %s %s (CRI %s), images imported in %v", nd.n, v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion,
		time.Since(step).Round(time.Millisecond))

	// The node's device plugin: what the kubelet's Allocate gets.
	c.plugin, err = deviceplugin.New(deviceplugin.Config{KubeletDir: filepath.Join(nd.dir, "device-plugins"),
		AdminSocket: nd.cfg.AdminSocket, SocketDir: filepath.Dir(nd.cfg.Socket), Socket: filepath.Base(nd.cfg.Socket),
		LibDir: c.libDir})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// containerdConfig is containerd's configuration for a node: root, state
// and sockets in dir; the CRI plugin with runc, the overlayfs
// snapshotter, the node's CNI directories, the test's sandbox image;
// neither AppArmor (not on this kernel) nor metrics. Without
// CAP_SYS_RESOURCE (as here) no process may lower its oom_score_adj, and
// runc fails the sandbox (oom_score_adj -998) with "can't get final
// child's PID from pipe: EOF": restrict_oom_score_adj keeps the pods'
// at containerd's or above.
func containerdConfig(dir, sock, runc, cniBin, cniConf string) string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[3]q

[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = %[4]q
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = %[5]q
    disable_apparmor = true
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          BinaryName = %[6]q
          Root = %[7]q
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = %[8]q
      conf_dir = %[9]q
      max_conf_num = 1
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, filepath.Join(dir, "opt"), criPauseImage,
		runc, filepath.Join(dir, "state", "runc"), cniBin, cniConf)
}

// criPod is a pod sandbox run through the CRI.
type criPod struct {
	node    *criNode
	name    string
	id      string
	config  *runtimeapi.PodSandboxConfig
	ip      netip.Addr
	netns   string
	device  string
	removed bool
}

// runPodSandbox is the kubelet's RunPodSandbox for a pod named name: its
// log directory made first, its cgroup under the node's parent, its
// network the pod network's. The pod's port must then be attached in
// redirect mode with the pod's IP as a GID, its roce0 in the pod's
// namespace with the redirect's filters.
func (c *criNode) runPodSandbox(t *testing.T, ctx context.Context, name string) *criPod {
	t.Helper()
	uid := fmt.Sprintf("%s-%d", name, time.Now().UnixNano())
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Uid: uid, Namespace: "default"},
		Hostname:     name,
		LogDirectory: filepath.Join(c.dir, "pods", "default_"+name+"_"+uid),
		Labels: map[string]string{"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "default",
			"io.kubernetes.pod.uid": uid},
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: c.cgroup + "/pod" + uid,
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_POD,
					Pid: runtimeapi.NamespaceMode_CONTAINER, Ipc: runtimeapi.NamespaceMode_POD},
				Seccomp: &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault},
			},
		},
	}
	if err := os.MkdirAll(cfg.LogDirectory, 0o755); err != nil {
		t.Fatal(err)
	}
	resp, err := c.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		t.Fatalf("RunPodSandbox %s on node %d: %v", name, c.n, err)
	}
	p := &criPod{node: c, name: name, id: resp.PodSandboxId, config: cfg}
	t.Cleanup(func() { p.remove(t) })
	st, err := c.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.id, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if p.ip, err = netip.ParseAddr(st.Status.GetNetwork().GetIp()); err != nil || !podSubnet[c.n].Contains(p.ip) {
		t.Fatalf("pod %s: IP %q (%v), want one of node %d's %v", name, st.Status.GetNetwork().GetIp(), err, c.n, podSubnet[c.n])
	}
	var info struct {
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct{ Type, Path string }
			}
		}
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
		t.Fatalf("pod %s: verbose status: %v", name, err)
	}
	for _, ns := range info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			p.netns = ns.Path
		}
	}
	if p.netns == "" {
		t.Fatalf("pod %s: no network namespace in the sandbox's spec", name)
	}
	c.netns = append(c.netns, p.netns)

	att, err := c.admin.Check(ctx, admin.CheckRequest{ContainerID: p.id, IfName: "eth0"})
	if err != nil {
		t.Fatalf("pod %s: the appliance has no attachment for the sandbox: %v", name, err)
	}
	if !slices.Contains(att.GIDs, netip.AddrFrom16(p.ip.As16())) || att.Device == "" || att.Mode != admin.ModeRedirect {
		t.Fatalf("pod %s: attachment %+v: want the pod's IP %v as a GID in redirect mode", name, att, p.ip)
	}
	p.device = att.Device
	names, filters, clsact := (&pod{path: p.netns}).state(t)
	if !slices.Contains(names, "roce0") || filters != 3 || clsact != 2 {
		t.Fatalf("pod %s: %v, %d filters, %d clsact qdiscs; want roce0 and the redirect's", name, names, filters, clsact)
	}
	return p
}

// startContainer is the kubelet's CreateContainer and StartContainer for
// the manifest's container c in the pod, cmd replacing its command line
// when given. The container asks for one taproce.io/roce slot: its mounts,
// devices and environment are the device plugin's Allocate answer, as the
// kubelet passes them on (the manifest has none of its own). Its user, read-only root, capabilities, no_new_privs, seccomp
// profile and resources are the manifest's, as the kubelet turns them
// into the CRI's.
func (p *criPod) startContainer(t *testing.T, ctx context.Context, c map[string]any, cmd []string) string {
	t.Helper()
	alloc, err := p.node.plugin.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"roce-0"}}}})
	if err != nil {
		t.Fatal(err)
	}
	edits := alloc.ContainerResponses[0]
	name, _ := c["name"].(string)
	cfg := &runtimeapi.ContainerConfig{
		Metadata:    &runtimeapi.ContainerMetadata{Name: name},
		Image:       &runtimeapi.ImageSpec{Image: criPerftestImage},
		Command:     images.Strings(c["command"]),
		Args:        images.Strings(c["args"]),
		LogPath:     filepath.Join(name, "0.log"),
		Labels:      map[string]string{"io.kubernetes.container.name": name, "io.kubernetes.pod.name": p.name},
		Annotations: edits.Annotations,
	}
	if cmd != nil {
		cfg.Command, cfg.Args = cmd[:1], cmd[1:]
	}
	for _, k := range slices.Sorted(maps.Keys(edits.Envs)) {
		cfg.Envs = append(cfg.Envs, &runtimeapi.KeyValue{Key: k, Value: []byte(edits.Envs[k])})
	}
	for _, m := range edits.Mounts {
		cfg.Mounts = append(cfg.Mounts, &runtimeapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, Readonly: m.ReadOnly})
	}
	for _, d := range edits.Devices {
		cfg.Devices = append(cfg.Devices, &runtimeapi.Device{ContainerPath: d.ContainerPath, HostPath: d.HostPath, Permissions: d.Permissions})
	}
	if len(cfg.Envs) != 2 || len(cfg.Mounts) != 2 {
		t.Fatalf("the device plugin's answer: %v", edits)
	}
	sc, _ := c["securityContext"].(map[string]any)
	asInt := func(v any) int64 { n, _ := strconv.ParseInt(fmt.Sprint(v), 10, 64); return n }
	cfg.Linux = &runtimeapi.LinuxContainerConfig{
		Resources: &runtimeapi.LinuxContainerResources{
			CpuShares:          quantity(t, images.Get(c, "resources", "requests", "cpu")),
			MemoryLimitInBytes: quantity(t, images.Get(c, "resources", "limits", "memory")),
		},
		SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
			RunAsUser:      &runtimeapi.Int64Value{Value: asInt(sc["runAsUser"])},
			RunAsGroup:     &runtimeapi.Int64Value{Value: asInt(sc["runAsGroup"])},
			ReadonlyRootfs: sc["readOnlyRootFilesystem"] == true,
			NoNewPrivs:     sc["allowPrivilegeEscalation"] == false,
			Capabilities:   &runtimeapi.Capability{DropCapabilities: images.Strings(images.Get(sc, "capabilities", "drop"))},
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_POD,
				Pid: runtimeapi.NamespaceMode_CONTAINER, Ipc: runtimeapi.NamespaceMode_POD},
		},
	}
	if images.Get(sc, "seccompProfile", "type") == "RuntimeDefault" {
		cfg.Linux.SecurityContext.Seccomp = &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault}
	}
	if err := os.MkdirAll(filepath.Join(p.config.LogDirectory, name), 0o755); err != nil {
		t.Fatal(err)
	}
	resp, err := p.node.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.id, Config: cfg, SandboxConfig: p.config})
	if err != nil {
		t.Fatalf("CreateContainer in pod %s: %v", p.name, err)
	}
	if _, err := p.node.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		t.Fatalf("StartContainer in pod %s: %v", p.name, err)
	}
	return resp.ContainerId
}

// quantity converts a manifest's CPU request to CPU shares (as the
// kubelet: 1024 per CPU) and a memory quantity to bytes.
func quantity(t *testing.T, v any) int64 {
	t.Helper()
	s := fmt.Sprint(v)
	for suffix, mul := range map[string]int64{"Mi": 1 << 20, "Gi": 1 << 30, "m": -1} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			x, err := strconv.ParseInt(n, 10, 64)
			if err != nil {
				break
			}
			if mul < 0 {
				return x * 1024 / 1000
			}
			return x * mul
		}
	}
	t.Fatalf("quantity %q", s)
	return 0
}

// wait polls the container's status until it has exited.
func (c *criNode) wait(t *testing.T, ctx context.Context, id string) *runtimeapi.ContainerStatus {
	t.Helper()
	for {
		st, err := c.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			t.Fatal(err)
		}
		if st.Status.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			return st.Status
		}
		select {
		case <-ctx.Done():
			t.Fatalf("container %s did not exit: %v", id, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// containerLog reads a container's log as the kubelet's `logs` shows it:
// the CRI log format's lines ("TIME STREAM P|F TEXT") joined.
func (c *criNode) containerLog(t *testing.T, st *runtimeapi.ContainerStatus) string {
	t.Helper()
	data, err := os.ReadFile(st.LogPath)
	if err != nil {
		t.Errorf("the log of %s: %v", st.Metadata.GetName(), err)
		return ""
	}
	var b strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 4)
		if len(f) < 4 {
			continue
		}
		b.WriteString(f[3])
		if f[2] == "F" {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// remove is the kubelet's StopPodSandbox and RemovePodSandbox; then the
// pod's namespace must be gone and the appliance hold no attachment for
// it. A pod removed already is left alone.
func (p *criPod) remove(t *testing.T) {
	t.Helper()
	if p.removed {
		return
	}
	p.removed = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := p.node.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.id}); err != nil {
		t.Errorf("StopPodSandbox %s: %v", p.name, err)
	}
	if _, err := p.node.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.id}); err != nil {
		t.Errorf("RemovePodSandbox %s: %v", p.name, err)
	}
	if p.netns != "" {
		if _, err := os.Stat(p.netns); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("pod %s: its network namespace %s is left (%v)", p.name, p.netns, err)
		}
	}
	atts, err := p.node.admin.List(ctx)
	if err != nil {
		t.Error(err)
	}
	for _, a := range atts {
		if a.ContainerID == p.id {
			t.Errorf("pod %s: attachment %+v left", p.name, a)
		}
	}
}

// checkEmpty checks that the node holds nothing of its pods: no
// attachment or port in the appliance, no sandbox or container in the
// CRI nor in containerd's k8s.io namespace, no shim, no process in the
// pods' cgroups, no pod namespace, no veth but the node's link.
func (c *criNode) checkEmpty(t *testing.T, ctx context.Context) {
	t.Helper()
	if l, err := c.admin.List(ctx); err != nil || len(l) != 0 {
		t.Errorf("node %d's attachments: %+v, %v", c.n, l, err)
	}
	m := c.metrics(t)
	if metric(m, "taproce_attachments") != 0 || metric(m, "taproce_ports") != 0 || metric(m, "taproce_qps") != 0 {
		t.Errorf("node %d's metrics: attachments %v, ports %v, QPs %v", c.n,
			metric(m, "taproce_attachments"), metric(m, "taproce_ports"), metric(m, "taproce_qps"))
	}
	if l, err := c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err != nil || len(l.Items) != 0 {
		t.Errorf("node %d's sandboxes: %v, %v", c.n, l, err)
	}
	if l, err := c.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); err != nil || len(l.Containers) != 0 {
		t.Errorf("node %d's containers: %v, %v", c.n, l, err)
	}
	for _, what := range []string{"containers", "tasks"} {
		out, err := exec.CommandContext(ctx, "ctr", "--address", c.sock, "--namespace", "k8s.io", what, "list", "--quiet").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("node %d: ctr %s list: %q, %v", c.n, what, out, err)
		}
	}
	if pids := c.shims(); len(pids) != 0 {
		t.Errorf("node %d: shims left: %v", c.n, pids)
	}
	if pids := cgroupProcs(c.cgroup); len(pids) != 0 {
		t.Errorf("node %d: processes left in the pods' cgroups: %v", c.n, pids)
	}
	for _, ns := range c.netns {
		if _, err := os.Stat(ns); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("node %d: pod namespace %s left (%v)", c.n, ns, err)
		}
	}
	left, err := netnsutil.List("cni-")
	if err != nil {
		t.Error(err)
	}
	for _, l := range left {
		if slices.Contains(c.netns, netnsutil.Path(l)) {
			t.Errorf("node %d: `ip netns` lists %s", c.n, l)
		}
	}
	err = netnsutil.Do(c.path, func(h *netlink.Handle) error {
		ls, err := h.LinkList()
		if err != nil {
			return err
		}
		for _, l := range ls {
			if l.Type() == "veth" && l.Attrs().Name != "eth0" || l.Type() == "tuntap" {
				t.Errorf("node %d: %s %s left", c.n, l.Type(), l.Attrs().Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// shims returns the PIDs of containerd's shims for this node's
// containerd (their command line names its socket).
func (c *criNode) shims() []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(data), "\x00")
		if i := slices.Index(args, "-address"); i >= 0 && i+1 < len(args) && args[i+1] == c.sock && strings.Contains(args[0], "shim") {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			pids = append(pids, pid)
		}
	}
	return pids
}

// cgroupDirs returns the directories of the cgroup at path in each
// hierarchy mounted under /sys/fs/cgroup.
func cgroupDirs(path string) []string {
	var dirs []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, r := range append(roots, "/sys/fs/cgroup") {
		if st, err := os.Stat(filepath.Join(r, path)); err == nil && st.IsDir() {
			dirs = append(dirs, filepath.Join(r, path))
		}
	}
	return dirs
}

// cgroupProcs returns the processes in the cgroup at path and below.
func cgroupProcs(path string) []int {
	var pids []int
	for _, d := range cgroupDirs(path) {
		_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || e.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// leftovers removes what a failed test may leave of the node's
// containerd once it has stopped: its shims and the pods' processes
// (killed by PID), the pods' cgroups, the mounts under the node's
// directory (containers' root file systems, sandboxes' /dev/shm) and the
// pods' namespaces.
func (c *criNode) leftovers(t *testing.T) {
	for _, pid := range append(c.shims(), cgroupProcs(c.cgroup)...) {
		t.Logf("node %d: killing leftover process %d", c.n, pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, d := range cgroupDirs(c.cgroup) {
		var all []string
		_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		for i := len(all) - 1; i >= 0; i-- {
			for try := 0; try < 50; try++ {
				if err := syscall.Rmdir(all[i]); err == nil || errors.Is(err, fs.ErrNotExist) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	var mounts []string
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Fields(sc.Text()); len(fields) > 4 &&
				(strings.HasPrefix(fields[4], c.dir+"/") || slices.Contains(c.netns, fields[4])) {
				mounts = append(mounts, fields[4])
			}
		}
		f.Close()
	}
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
	for _, m := range mounts {
		t.Logf("node %d: unmounting leftover %s", c.n, m)
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
	for _, ns := range c.netns {
		if err := os.Remove(ns); err == nil {
			t.Logf("node %d: removed leftover %s", c.n, ns)
		}
	}
}

// writePauseImage writes an OCI image layout archive, as `ctr images
// import` reads it, of an image named ref holding the static program
// pause as /pause, its entrypoint, run as user 65535 as the kubelet's
// pause image is.
func writePauseImage(t *testing.T, pause, path, ref string) {
	t.Helper()
	bin, err := os.ReadFile(pause)
	if err != nil {
		t.Fatal(err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: "pause", Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg,
		ModTime: time.Unix(0, 0)}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(bin); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	blobs := map[string][]byte{}
	add := func(mediaType string, data []byte) map[string]any {
		sum := sha256.Sum256(data)
		d := hex.EncodeToString(sum[:])
		blobs[d] = data
		return map[string]any{"mediaType": mediaType, "digest": "sha256:" + d, "size": len(data)}
	}
	mustJSON := func(v any) []byte {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	layerDesc := add("application/vnd.oci.image.layer.v1.tar", layer.Bytes())
	config := add("application/vnd.oci.image.config.v1+json", mustJSON(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"config": map[string]any{"Entrypoint": []string{"/pause"}, "User": "65535:65535"},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []any{layerDesc["digest"]}},
	}))
	manifest := add("application/vnd.oci.image.manifest.v1+json", mustJSON(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": config, "layers": []any{layerDesc},
	}))
	manifest["annotations"] = map[string]string{"io.containerd.image.name": ref}
	manifest["platform"] = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", mustJSON(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
			"manifests": []any{manifest}})},
	}
	for _, d := range slices.Sorted(maps.Keys(blobs)) {
		files = append(files, struct {
			name string
			data []byte
		}{"blobs/sha256/" + d, blobs[d]})
	}
	var out bytes.Buffer
	tw = tar.NewWriter(&out)
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: dir, Mode: 0o755, Typeflag: tar.TypeDir, ModTime: time.Unix(0, 0)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg,
			ModTime: time.Unix(0, 0)}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
