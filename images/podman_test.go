package images

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/taproce/taproce/deviceplugin"
	"github.com/taproce/taproce/internal/ibvlib"
	"github.com/taproce/taproce/internal/lab"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/internal/testnet"
)

// TestPodmanBuild builds the image with podman from a clean clone of
// HEAD, as scripts/image does it on this kind of machine (installing
// podman and making the local Go builder image the first time), and
// checks that `taproce --version` runs in it and prints the clone's
// version. It needs root and TAPROCE_IMAGE_TEST=1: the first run takes
// minutes (debootstrap, the module download), later ones a minute or two.
func TestPodmanBuild(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: podman builds and runs the image as root here")
	}
	if os.Getenv("TAPROCE_IMAGE_TEST") != "1" {
		t.Skip("set TAPROCE_IMAGE_TEST=1 to build the image with podman (scripts/image; takes minutes)")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skipf("needs git for a clean clone: %v", err)
	}
	top, err := exec.Command("git", "-C", "..", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout (%v): nothing to clone", err)
	}
	script, err := filepath.Abs("../scripts/image")
	if err != nil {
		t.Fatal(err)
	}

	src := filepath.Join(t.TempDir(), "taproce")
	if out, err := exec.Command("git", "clone", "-q", strings.TrimSpace(string(top)), src).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	desc, err := exec.Command("git", "-C", src, "describe", "--always", "--dirty").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "taproce " + strings.TrimSpace(string(desc))

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, script, src)
	cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":/usr/local/go/bin")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/image: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if got := lines[len(lines)-1]; got != want {
		t.Fatalf("taproce --version in the image printed %q, want %q\n%s", got, want, out)
	}
	for _, l := range lines {
		if regexp.MustCompile(`^image: .* (made|built) in \d+ s$`).MatchString(l) {
			t.Log(l)
		}
	}

	// podman run --rm: no container is left behind.
	ps, err := exec.Command("podman", "--runtime", "runc", "ps", "-a", "-q", "--filter", "ancestor=localhost/taproce:dev").CombinedOutput()
	if err != nil || strings.TrimSpace(string(ps)) != "" {
		t.Errorf("containers of the image left: %q (%v)", ps, err)
	}
	t.Logf("image built from a clean clone and %q printed in %v", want, time.Since(t0).Round(time.Second))
}

// podman runs podman with this machine's flags (scripts/image says why)
// and returns its combined output.
func podman(ctx context.Context, args ...string) (string, error) {
	full := append([]string{"--runtime", "runc"}, args...)
	out, err := exec.CommandContext(ctx, "podman", full...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("podman %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// podmanLimits are the explicit limits a container needs here.
var podmanLimits = []string{"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"}

// podContainer returns podman create's (or run's) arguments for a pod of
// ibverbs-example.yaml on this machine: in the network namespace at
// netns, as the pod's user without capabilities, read-only; when the pod
// asks for the device plugin's resource (deviceplugin.DefaultResource),
// with the mounts, devices and environment of plugin's Allocate answer,
// as the kubelet passes them to the runtime (the plugin, configured with
// this machine's directories for the node's, mounts each at its own
// path); then with the pod's own environment and its hostPath mounts taken
// from the directories hosts gives for the node's paths; then the image
// and the program's command line, args replacing the manifest's when
// given.
func podContainer(t *testing.T, p ibverbsPod, name, image, netns string, plugin *deviceplugin.Plugin, hosts map[string]string, args []string) []string {
	t.Helper()
	sc, _ := p.c["securityContext"].(map[string]any)
	run := append([]string{"--name", name, "--network", "ns:" + netns,
		"--user", fmt.Sprintf("%v:%v", sc["runAsUser"], sc["runAsGroup"]), "--cap-drop", "all",
		"--security-opt", "no-new-privileges", "--read-only"}, podmanLimits...)
	limits, _ := Get(p.c, "resources", "limits").(map[string]any)
	if q, ok := limits[deviceplugin.DefaultResource]; ok {
		if fmt.Sprint(q) != "1" {
			t.Fatalf("%v asks for %v %s, this test stands in for one", p.m, q, deviceplugin.DefaultResource)
		}
		alloc, err := plugin.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: []string{"roce-0"}}}})
		if err != nil {
			t.Fatal(err)
		}
		edits := alloc.ContainerResponses[0]
		if len(edits.Envs) == 0 || len(edits.Mounts) == 0 {
			t.Fatalf("the device plugin's answer: %v", edits)
		}
		for _, k := range slices.Sorted(maps.Keys(edits.Envs)) {
			run = append(run, "--env", k+"="+edits.Envs[k])
		}
		for _, m := range edits.Mounts {
			opt := ""
			if m.ReadOnly {
				opt = ":ro"
			}
			run = append(run, "--volume", m.HostPath+":"+m.ContainerPath+opt)
		}
		for _, d := range edits.Devices {
			run = append(run, "--device", d.HostPath+":"+d.ContainerPath+":"+d.Permissions)
		}
	}
	envs, _ := p.c["env"].([]any)
	for _, e := range envs {
		env := e.(map[string]any)
		run = append(run, "--env", fmt.Sprintf("%v=%v", env["name"], env["value"]))
	}
	mounts, _ := p.c["volumeMounts"].([]any)
	for _, vm := range mounts {
		m := vm.(map[string]any)
		hostPath, _ := Get(Named(p.spec["volumes"], m["name"].(string)), "hostPath", "path").(string)
		dir, ok := hosts[hostPath]
		if !ok {
			t.Fatalf("%v mounts the node's %q, which this test does not stand in for", p.m, hostPath)
		}
		opt := ""
		if m["readOnly"] == true {
			opt = ":ro"
		}
		run = append(run, "--volume", dir+":"+m["mountPath"].(string)+opt)
	}
	cmd := p.cmd
	if args != nil {
		cmd = append(Strings(p.c["command"]), args...)
	}
	return append(append(run, image), cmd...)
}

// TestPodContainer: the podman arguments TestPodmanIbWriteBw gives
// ibverbs-example.yaml's pods, which ask for taproce.io/roce, are the
// device plugin's answer — its environment and read-only mounts of the
// directories standing for the node's — and no mount or environment of
// the pod's own, then the image and the command line. It runs no podman.
func TestPodContainer(t *testing.T) {
	run, lib := t.TempDir(), t.TempDir()
	plugin, err := deviceplugin.New(deviceplugin.Config{SocketDir: run, Socket: "taproce.sock", LibDir: lib})
	if err != nil {
		t.Fatal(err)
	}
	server, client := ibverbsPods(t)
	for _, p := range []ibverbsPod{server, client} {
		args := podContainer(t, p, "pod", perftestImage, "/var/run/netns/x", plugin, nil, nil)
		var envs, volumes []string
		for i := 0; i+1 < len(args); i++ {
			switch args[i] {
			case "--env":
				envs = append(envs, args[i+1])
			case "--volume":
				volumes = append(volumes, args[i+1])
			}
		}
		slices.Sort(envs)
		slices.Sort(volumes)
		if want := []string{"LD_LIBRARY_PATH=" + lib, "TAPROCE_SOCKET=" + filepath.Join(run, "taproce.sock")}; !slices.Equal(envs, want) {
			t.Errorf("%v: environment %v, want %v", p.m, envs, want)
		}
		want := []string{run + ":" + run + ":ro", lib + ":" + lib + ":ro"}
		slices.Sort(want)
		if !slices.Equal(volumes, want) {
			t.Errorf("%v: volumes %v, want %v", p.m, volumes, want)
		}
		if i := slices.Index(args, perftestImage); i < 0 || !slices.Equal(args[i+1:], p.cmd) {
			t.Errorf("%v: %v does not end with the image and %v", p.m, args, p.cmd)
		}
	}
}

// TestPodmanIbWriteBw runs ibverbs-example.yaml on this machine with
// podman, as a node of the DaemonSet would run it: the taproce image's
// entrypoint (-install-only) installs the image's libibverbs.so.1 and
// librdmacm.so.1 into a directory standing for the node's
// /opt/taproce/lib; a lab (two network namespaces with a taproce port
// each, its appliance serving on a socket in a directory standing for the
// node's /run/taproce) stands for the node's appliance and the two pods'
// networks; the perftest image (scripts/perftest-image: Debian bookworm,
// perftest unmodified) runs the server and the client pods' command lines
// in containers joining those namespaces, with the pods' user, read-only
// root and no capabilities and, for their taproce.io/roce, the mounts
// and environment of the device plugin's Allocate answer (the plugin
// configured with those two directories) — the client's Service name
// replaced by the server namespace's address. Both must exit 0 and the
// client print perftest's result row with a bandwidth. It needs root and
// TAPROCE_IMAGE_TEST=1 (scripts/image and scripts/perftest-image take
// minutes the first time).
func TestPodmanIbWriteBw(t *testing.T) {
	ctx, n := podmanNode(t)
	cfg := applianceConfig(t)
	plugin, err := deviceplugin.New(deviceplugin.Config{SocketDir: n.run, Socket: filepath.Base(cfg.Socket), LibDir: n.libDir})
	if err != nil {
		t.Fatal(err)
	}
	hosts := map[string]string{path.Dir(cfg.Socket): n.run, NodeLibDir: n.libDir}
	n.ibWriteBw(ctx, t, func(p ibverbsPod, name, netns string, args []string) []string {
		return podContainer(t, p, name, perftestImage, netns, plugin, hosts, args)
	})
}

// TestPodmanIbWriteBwCDI runs the pods of TestPodmanIbWriteBw with
// neither mounts nor environment of their own: each container names the
// device plugin's CDI device (podman run --device taproce.io/…=all), whose
// spec, written by the plugin into /var/run/cdi, gives them the node's
// socket directory and libraries and the environment that points
// ib_write_bw at them. It needs what TestPodmanIbWriteBw needs.
func TestPodmanIbWriteBwCDI(t *testing.T) {
	ctx, n := podmanNode(t)
	// A kind of the test's own: the machine's CDI directory is shared.
	p, err := deviceplugin.New(deviceplugin.Config{Resource: "taproce.io/roce-" + testnet.Name(), SocketDir: n.run,
		Socket: filepath.Base(applianceConfig(t).Socket), LibDir: n.libDir})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := p.WriteCDISpec(deviceplugin.DefaultCDIDir)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(spec)
	device := p.Config().Resource + "=" + deviceplugin.CDIDevice
	n.ibWriteBw(ctx, t, func(pod ibverbsPod, name, netns string, args []string) []string {
		sc, _ := pod.c["securityContext"].(map[string]any)
		run := append([]string{"--name", name, "--network", "ns:" + netns, "--device", device,
			"--user", fmt.Sprintf("%v:%v", sc["runAsUser"], sc["runAsGroup"]), "--cap-drop", "all",
			"--security-opt", "no-new-privileges", "--read-only"}, podmanLimits...)
		cmd := pod.cmd
		if args != nil {
			cmd = append(Strings(pod.c["command"]), args...)
		}
		return append(append(run, perftestImage), cmd...)
	})
}

const (
	taproceImage  = "localhost/taproce:dev"
	perftestImage = "localhost/taproce-perftest:bookworm"
)

// podNode is a node of the DaemonSet on this machine: taproce's libraries
// where the entrypoint installed them (libDir, for the node's
// /opt/taproce/lib), and a lab whose appliance serves on a socket in run
// (for the node's /run/taproce), its namespaces the pods' networks.
type podNode struct {
	libDir, run string
	lab         *lab.Lab
}

// podmanNode builds the images, skips without podman, root or
// TAPROCE_IMAGE_TEST=1, and makes a node, removed when the test ends.
func podmanNode(t *testing.T) (context.Context, *podNode) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: podman runs the containers as root here, and the lab's namespaces need root")
	}
	if os.Getenv("TAPROCE_IMAGE_TEST") != "1" {
		t.Skip("set TAPROCE_IMAGE_TEST=1 to build the images and run ib_write_bw in containers (scripts/image, scripts/perftest-image; takes minutes)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	t.Cleanup(cancel)
	for _, script := range []string{"../scripts/image", "../scripts/perftest-image"} {
		cmd := exec.CommandContext(ctx, script)
		cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":/usr/local/go/bin")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
		t.Logf("%s: %s", script, lastLine(string(out)))
	}
	if out, err := podman(ctx, append(append([]string{"run", "--rm", "--network", "none"}, podmanLimits...), perftestImage, "true")...); err != nil {
		t.Skipf("podman cannot run a container on this machine: %v\n%s", err, out)
	}

	// The node: the DaemonSet's entrypoint installs the libraries.
	node := t.TempDir()
	n := &podNode{libDir: filepath.Join(node, "opt/taproce/lib"), run: filepath.Join(node, "run/taproce")}
	cniBin := filepath.Join(node, "opt/cni/bin")
	for _, d := range []string{n.libDir, cniBin, n.run} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		// Bind-mounted for user 65534.
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	text, err := ConfigTOML()
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(node, "taproce.toml")
	if err := os.WriteFile(cfgFile, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := podman(ctx, append(append([]string{"run", "--rm", "--network", "none"}, podmanLimits...),
		"--volume", cfgFile+":/etc/taproce/taproce.toml:ro", "--volume", n.libDir+":"+entrypointLibDir, "--volume", cniBin+":/host/opt/cni/bin",
		taproceImage, "-install-only", "-mode=none", "-config=/etc/taproce/taproce.toml")...)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range ibvlib.Names {
		if err := ibvlib.Check(filepath.Join(n.libDir, name)); err != nil {
			t.Fatalf("the entrypoint did not install taproce's %s: %v\n%s", name, err, out)
		}
	}

	// The node's appliance and the pods' networks.
	cfg := applianceConfig(t)
	testnet.RequireRoot(t)
	prefix := testnet.Name() + "-"
	l, err := lab.Build(lab.Topology{Prefix: prefix, Hosts: 2, Offload: true, Socket: filepath.Join(n.run, filepath.Base(cfg.Socket)),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
		if left, _ := netnsutil.List(prefix); len(left) > 0 {
			t.Errorf("namespaces left: %v", left)
		}
	})
	if err := l.App.Control().Listen(); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- l.App.Serve(sctx) }()
	t.Cleanup(func() { stop(); <-served })
	n.lab = l
	return ctx, n
}

// ibWriteBw runs ibverbs-example.yaml's server and client pods as
// containers joining the lab's namespaces, container giving podman
// run's arguments for each (its name, the namespace, and the client's
// command line with the server namespace's address for the Service's
// name); both must exit 0 and the client print perftest's result row
// with a bandwidth.
func (n *podNode) ibWriteBw(ctx context.Context, t *testing.T, container func(p ibverbsPod, name, netns string, args []string) []string) {
	t.Helper()
	server, client := ibverbsPods(t)
	srvHost, cliHost := n.lab.Hosts[1], n.lab.Hosts[0]
	names := []string{testnet.Name() + "-server", testnet.Name() + "-client"}
	defer func() {
		for _, name := range names {
			_, _ = podman(context.Background(), "rm", "--force", "--ignore", name)
		}
	}()
	if out, err := podman(ctx, append([]string{"create"}, container(server, names[0], netnsutil.Path(srvHost.Namespace), nil)...)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := podman(ctx, "start", names[0]); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		ok, err := netnsutil.Listening(netnsutil.Path(srvHost.Namespace), 18515)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			logs, _ := podman(ctx, "logs", names[0])
			t.Fatalf("the server never listened:\n%s", logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	args := slices.Clone(Strings(client.c["args"]))
	args[len(args)-1] = srvHost.KernelAddrs[0].Addr().String()
	cliOut, cerr := podman(ctx, append([]string{"run"}, container(client, names[1], netnsutil.Path(cliHost.Namespace), args)...)...)
	code, werr := podman(ctx, "wait", names[0])
	srvOut, _ := podman(ctx, "logs", names[0])
	if cerr != nil || werr != nil || strings.TrimSpace(code) != "0" {
		t.Fatalf("client: %v\n%s\nserver (exit %q, %v):\n%s", cerr, cliOut, strings.TrimSpace(code), werr, srvOut)
	}
	row := regexp.MustCompile(`(?m)^\s*65536\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$`).FindStringSubmatch(cliOut)
	if row == nil || !strings.Contains(cliOut, "BW average[Gb/sec]") || row[3] == "0.00" {
		t.Fatalf("no result row with a bandwidth:\n%s", cliOut)
	}
	t.Logf("Debian's ib_write_bw in two containers on the image's libibverbs.so.1:\n%s", cliOut)
}

// lastLine returns the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
