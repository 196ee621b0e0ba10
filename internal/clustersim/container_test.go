package clustersim_test

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/appliance/admin"
	"github.com/taproce/taproce/appliance/redirect/redirecttest"
	"github.com/taproce/taproce/internal/netnsutil"
)

// containerEnv, set in the environment of the test binary, makes it
// enter a mount namespace set up as a container runtime sets up the
// DaemonSet's container, and exec the command line.
const containerEnv = "TAPROCE_CLUSTERSIM_CONTAINER"

func init() {
	if os.Getenv(containerEnv) == "" {
		return
	}
	// The namespace and mounts belong to this thread, which then execs.
	runtime.LockOSThread()
	if err := containerMounts(); err != nil {
		fmt.Fprintf(os.Stderr, "container: %v\n", err)
		os.Exit(111)
	}
	os.Unsetenv(containerEnv)
	err := syscall.Exec(os.Args[1], os.Args[1:], os.Environ())
	fmt.Fprintf(os.Stderr, "container: exec %s: %v\n", os.Args[1], err)
	os.Exit(111)
}

// containerMounts makes a mount namespace like the one of a
// non-privileged container: the host's mounts as slaves (so namespaces
// bind-mounted under /var/run/netns later appear, as HostToContainer
// propagation makes them appear), and /proc/sys read-only, as runc,
// crun and containerd's default spec make it (readonlyPaths).
func containerMounts() error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making mounts slaves: %w", err)
	}
	if err := unix.Mount("/proc/sys", "/proc/sys", "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding /proc/sys: %w", err)
	}
	if err := unix.Mount("", "/proc/sys", "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("/proc/sys read-only: %w", err)
	}
	return nil
}

// sharedNetnsDir makes /var/run/netns a shared mount, as `ip netns add`
// does on its first use, so that namespaces created later propagate
// into the appliance's mount namespace.
func sharedNetnsDir(t *testing.T) {
	t.Helper()
	dir, err := filepath.EvalSymlinks(netnsutil.Dir)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 6 && fields[4] == dir && strings.Contains(strings.Join(fields[6:], " "), "shared:") {
			return
		}
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		t.Fatalf("binding %s on itself: %v", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		t.Fatalf("making %s shared: %v", dir, err)
	}
}

// TestContainerMounts: the appliance, run as the DaemonSet's container
// runs it — the DaemonSet's capabilities, its own mount namespace with
// /proc/sys read-only, pods' namespaces propagated into it — attaches a
// pod, and an application in the pod uses the device.
func TestContainerMounts(t *testing.T) {
	requireTools(t)
	bins := binaries(t)
	sharedNetnsDir(t)
	base := workDir(t)
	nd := newNode(t, 3, base)
	sock := nd.cfg.AdminSocket

	cmd := exec.Command("setpriv", "--bounding-set=-all,"+daemonSetCaps, "--inh-caps=-all", "--",
		os.Args[0], filepath.Join(bins, "taproce"), "run", "--config", filepath.Join(nd.dir, "taproce.toml"), "--log-format=text")
	cmd.Env = append(os.Environ(), containerEnv+"=1")
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := netnsutil.Do(nd.path, func(*netlink.Handle) error { return cmd.Start() }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Logf("appliance log:\n%s", out)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for admin.NewClient(sock).Health(ctx) != nil {
		if ctx.Err() != nil {
			t.Fatalf("the appliance did not come up:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The appliance sees /proc/sys as a container does.
	// (/proc/PID/root leads into the appliance's mounts.)
	if err := unix.Access(fmt.Sprintf("/proc/%d/root/proc/sys/net/ipv4/ip_forward", cmd.Process.Pid), unix.W_OK); err != unix.EROFS {
		t.Fatalf("/proc/sys in the appliance's mount namespace: %v, want read-only", err)
	}

	// Pods created after the appliance started, as in a cluster.
	a, b := redirecttest.Pair(t, 94, "eth0", "eth0")
	for _, p := range []redirecttest.End{a, b} {
		_, err := nd.admin.Attach(ctx, admin.AttachRequest{ContainerID: "ctr-" + p.NS, IfName: "eth0", Netns: p.Path,
			IPs: []netip.Prefix{p.V4}, Network: "container-test"})
		if err != nil && strings.Contains(err.Error(), "/proc/sys") {
			t.Fatalf("attaching %s: %v\n"+
				"Containers get /proc/sys read-only (runc's and containerd's readonlyPaths), so the appliance of the DaemonSet "+
				"cannot write sysctls; the attach path must not need to (IPv6 off on the TAP could be had through netlink, "+
				"IFLA_INET6_ADDR_GEN_MODE none, or the write's EROFS tolerated)", p.NS, err)
		}
		if err != nil {
			t.Fatalf("attaching %s in a container's mounts: %v", p.NS, err)
		}
	}
	pa := &pod{name: "a", node: nd, ns: a.NS, path: a.Path, ip: a.V4.Addr()}
	pb := &pod{name: "b", node: nd, ns: b.NS, path: b.Path, ip: b.V4.Addr()}
	exchange(t, pa, pb, 18517, true)
	for _, p := range []redirecttest.End{a, b} {
		if err := nd.admin.Detach(ctx, admin.DetachRequest{ContainerID: "ctr-" + p.NS, IfName: "eth0", Netns: p.Path}); err != nil {
			t.Fatal(err)
		}
	}
}
