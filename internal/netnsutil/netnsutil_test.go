package netnsutil

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestNamespaceLifecycle(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces; run the tests as root to include it")
	}
	prefix := fmt.Sprintf("tpt-nsutil-%d-", os.Getpid())
	name := prefix + "a"
	if err := Create(name); err != nil {
		t.Fatal(err)
	}
	defer Delete(name)
	names, err := List(prefix)
	if err != nil || len(names) != 1 || names[0] != name {
		t.Fatalf("List = %v, %v", names, err)
	}
	// A bridge created inside is visible there and not here.
	err = Do(Path(name), func(h *netlink.Handle) error {
		return h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "dummy7"}})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName("dummy7"); err == nil {
		t.Fatal("the bridge appeared in the test's own namespace")
	}
	err = Do(Path(name), func(h *netlink.Handle) error {
		_, err := h.LinkByName("dummy7")
		return err
	})
	if err != nil {
		t.Fatalf("bridge not in the namespace: %v", err)
	}
	if err := Delete(name); err != nil {
		t.Fatal(err)
	}
	if err := Delete(name); err != nil {
		t.Fatalf("deleting twice: %v", err)
	}
	if names, _ := List(prefix); len(names) != 0 {
		t.Fatalf("still listed: %v", names)
	}
	if err := Do(Path(name), func(*netlink.Handle) error { return nil }); err == nil {
		t.Fatal("Do in a deleted namespace succeeded")
	}
}

// TestCreateBesideIPNetns: a namespace Create made before the first
// `ip netns add` can be deleted after it. Run where Dir was no mount
// point yet (a mount namespace of its own, Dir's mount undone there),
// Create must leave Dir a shared mount point, as iproute2 does; when it
// bound the namespace into the plain directory, the bind iproute2 then
// makes of Dir hid that mount, and Delete left a busy file behind.
func TestCreateBesideIPNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network and mount namespaces; run the tests as root to include it")
	}
	ipPath, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("no ip command (iproute2): scripts/setup installs it")
	}
	prefix := fmt.Sprintf("tpt-nsutil-%d-", os.Getpid())
	ours, theirs := prefix+"ours", prefix+"ip"
	// What a failure leaves in the shared directory is a plain file here.
	defer os.Remove(Path(ours))
	errc := make(chan error, 1)
	go func() {
		// This thread's mount namespace becomes its own; it is never
		// unlocked, so it ends with the goroutine.
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("unshare: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return fmt.Errorf("make / private: %w", err)
			}
			for unix.Unmount(Dir, unix.MNT_DETACH) == nil {
			}
			if err := Create(ours); err != nil {
				return err
			}
			defer os.Remove(Path(ours))
			shared, err := sharedMount(Dir)
			if err != nil {
				return err
			}
			if !shared {
				return fmt.Errorf("after Create, %s is no shared mount point", Dir)
			}
			for _, args := range [][]string{{"netns", "add", theirs}, {"netns", "delete", theirs}} {
				if out, err := exec.Command(ipPath, args...).CombinedOutput(); err != nil {
					return fmt.Errorf("ip %v: %w: %s", args, err, out)
				}
			}
			if err := Delete(ours); err != nil {
				return err
			}
			if _, err := os.Stat(Path(ours)); !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("after Delete, %s is still there (%v)", Path(ours), err)
			}
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// sharedMount reports whether path is a mount point with shared
// propagation in the calling thread's mount namespace.
func sharedMount(path string) (bool, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return false, err
	}
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return false, err
	}
	found, shared := false, false
	for _, line := range strings.Split(string(b), "\n") {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - ...
		f := strings.Fields(line)
		if len(f) < 6 || f[4] != real {
			continue
		}
		found, shared = true, false // the last mount on the path is the visible one
		for _, o := range f[6:] {
			if o == "-" {
				break
			}
			shared = shared || strings.HasPrefix(o, "shared:")
		}
	}
	return found && shared, nil
}

func TestProcTCPListens(t *testing.T) {
	const head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	for _, c := range []struct {
		name  string
		table string
		port  int
		want  bool
	}{
		{"listening", head + "   0: 00000000:4853 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 112 1 0 100 0 0 10 0\n", 18515, true},
		{"another port", head + "   0: 00000000:4854 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 112 1 0 100 0 0 10 0\n", 18515, false},
		{"established, not listening", head + "   0: 0200370A:4853 6600370A:D431 01 00000000:00000000 00:00000000 00000000     0        0 113 1 0 100 0 0 10 0\n", 18515, false},
		{"tcp6", "  sl  local_address                         remote_address                        st\n" +
			"   0: 00000000000000000000000000000000:4853 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 114 1 0\n", 18515, true},
		{"header only", head, 18515, false},
		{"empty", "", 18515, false},
		{"garbage", "x y z 0A\n: : 0A\n", 18515, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := procTCPListens([]byte(c.table), c.port); got != c.want {
				t.Errorf("procTCPListens(port %d) = %v, want %v", c.port, got, c.want)
			}
		})
	}
}

// TestListening: a socket listening in a namespace is seen there and not
// from outside it, and no longer once it is closed.
func TestListening(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces; run the tests as root to include it")
	}
	name := fmt.Sprintf("tpt-nsutil-%d-listen", os.Getpid())
	if err := Create(name); err != nil {
		t.Fatal(err)
	}
	defer Delete(name)
	var ln net.Listener
	err := Do(Path(name), func(*netlink.Handle) error {
		var err error
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	for _, c := range []struct {
		path string
		want bool
	}{{Path(name), true}, {"", false}} {
		if got, err := Listening(c.path, port); err != nil || got != c.want {
			t.Errorf("Listening(%q, %d) = %v, %v; want %v", c.path, port, got, err, c.want)
		}
	}
	ln.Close()
	if got, err := Listening(Path(name), port); err != nil || got {
		t.Errorf("after Close: Listening = %v, %v", got, err)
	}
	if _, err := Listening(Path(name+"-none"), port); err == nil {
		t.Error("Listening in a namespace that does not exist: no error")
	}
}

// TestRouteTo: the routing of a namespace with a veth pair
// (10.66.0.1/24, fd66::1/64) and a default route via 10.66.0.254 gives,
// for a neighbour, the address itself as the next hop and the veth's
// address as the source; for an address elsewhere, the gateway; for its
// own address, a local route; for an IPv6 address off every link (no IPv6
// default route), no route.
func TestRouteTo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces; run the tests as root to include it")
	}
	name := fmt.Sprintf("tpt-nsutil-%d-route", os.Getpid())
	if err := Create(name); err != nil {
		t.Fatal(err)
	}
	defer Delete(name)
	err := Do(Path(name), func(h *netlink.Handle) error {
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "rt0"}, PeerName: "rt1"}); err != nil {
			return err
		}
		for _, dev := range []string{"lo", "rt0", "rt1"} {
			l, err := h.LinkByName(dev)
			if err != nil {
				return err
			}
			if err := h.LinkSetUp(l); err != nil {
				return err
			}
			if dev != "rt0" {
				continue
			}
			for _, a := range []string{"10.66.0.1/24", "fd66::1/64"} {
				addr, err := netlink.ParseAddr(a)
				if err != nil {
					return err
				}
				addr.Flags = unix.IFA_F_NODAD
				if err := h.AddrAdd(l, addr); err != nil {
					return err
				}
			}
			gw := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP("10.66.0.254")}
			if err := h.RouteAdd(gw); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dst  string
		want Route
	}{
		{"10.66.0.7", Route{Src: netip.MustParseAddr("10.66.0.1"), NextHop: netip.MustParseAddr("10.66.0.7"), Link: "rt0"}},
		{"::ffff:10.66.0.7", Route{Src: netip.MustParseAddr("10.66.0.1"), NextHop: netip.MustParseAddr("10.66.0.7"), Link: "rt0"}},
		{"192.0.2.9", Route{Src: netip.MustParseAddr("10.66.0.1"), NextHop: netip.MustParseAddr("10.66.0.254"), Link: "rt0"}},
		{"fd66::7", Route{Src: netip.MustParseAddr("fd66::1"), NextHop: netip.MustParseAddr("fd66::7"), Link: "rt0"}},
		{"10.66.0.1", Route{Src: netip.MustParseAddr("10.66.0.1"), NextHop: netip.MustParseAddr("10.66.0.1"), Link: "lo", Local: true}},
	} {
		got, err := RouteTo(Path(name), netip.MustParseAddr(c.dst))
		if err != nil || got != c.want {
			t.Errorf("RouteTo(%s) = %+v, %v; want %+v", c.dst, got, err, c.want)
		}
	}
	if r, err := RouteTo(Path(name), netip.MustParseAddr("2001:db8::1")); !errors.Is(err, ErrNoRoute) {
		t.Errorf("RouteTo(2001:db8::1) = %+v, %v; want ErrNoRoute", r, err)
	}
}
