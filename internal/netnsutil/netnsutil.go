// Package netnsutil runs code inside network namespaces and manages named
// ones (the /var/run/netns/NAME files of `ip netns`), for the TAP devices,
// the lab and the tests.
package netnsutil

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Dir is where `ip netns` keeps its named namespaces.
const Dir = "/var/run/netns"

// Path returns the path of the named namespace.
func Path(name string) string { return filepath.Join(Dir, name) }

// Do runs fn on an OS thread inside the namespace at path (the caller's
// own when path is empty), with a netlink handle for that namespace. The
// thread returns to its namespace afterwards; one that cannot stays locked
// and ends with its goroutine, so no other goroutine runs in the wrong
// namespace.
func Do(path string, fn func(h *netlink.Handle) error) error {
	if path == "" {
		h, err := netlink.NewHandle()
		if err != nil {
			return fmt.Errorf("netlink: %w", err)
		}
		defer h.Close()
		return fn(h)
	}
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer target.Close()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("current network namespace: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering %s: %w", path, err)
	}
	defer func() {
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
	}()
	h, err := netlink.NewHandleAt(target)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer h.Close()
	return fn(h)
}

// Create creates a named network namespace, as `ip netns add` does,
// without leaving the calling thread in it. Like `ip netns add`, it first
// makes Dir a shared mount point of its own (prepareDir).
func Create(name string) error {
	if err := prepareDir(); err != nil {
		return err
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("current network namespace: %w", err)
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	if err != nil {
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		return fmt.Errorf("creating network namespace %s: %w", name, err)
	}
	h.Close()
	if err := netns.Set(orig); err != nil {
		return fmt.Errorf("returning from network namespace %s: %w", name, err)
	}
	runtime.UnlockOSThread()
	return nil
}

// prepareDir makes Dir a mount point of its own with shared propagation,
// as `ip netns add` does before it binds a namespace there (iproute2's
// netns_add: make it shared; when that fails with EINVAL, Dir is no mount
// point: bind it onto itself, then make it shared). A namespace file bound
// into a plain Dir would be hidden, still mounted, under the bind that the
// next `ip netns add` makes of Dir; deleting the name then unmounts only
// the bind's copy, and the file stays, busy, for good. Processes of this
// module take a lock on Dir for it, so that two of them do not both bind.
func prepareDir() error {
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return fmt.Errorf("network namespaces: %w", err)
	}
	dir, err := os.Open(Dir)
	if err != nil {
		return fmt.Errorf("network namespaces: %w", err)
	}
	defer dir.Close() // and unlocks
	if err := unix.Flock(int(dir.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("network namespaces: lock %s: %w", Dir, err)
	}
	for bound := false; ; bound = true {
		err := unix.Mount("", Dir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EINVAL) || bound {
			return fmt.Errorf("network namespaces: make %s shared: %w", Dir, err)
		}
		if err := unix.Mount(Dir, Dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("network namespaces: bind %s onto itself: %w", Dir, err)
		}
	}
}

// Delete removes a named namespace; a missing one is not an error.
func Delete(name string) error {
	err := netns.DeleteNamed(name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("deleting network namespace %s: %w", name, err)
	}
	return nil
}

// List returns the named namespaces whose names start with prefix.
func List(prefix string) ([]string, error) {
	entries, err := os.ReadDir(Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// Listening reports whether a TCP socket listens on port in the
// namespace at path (the caller's own when path is empty), from the
// namespace's /proc/net/tcp and tcp6.
func Listening(path string, port int) (bool, error) {
	found := false
	err := Do(path, func(*netlink.Handle) error {
		for _, f := range []string{"tcp", "tcp6"} {
			b, err := os.ReadFile("/proc/thread-self/net/" + f)
			if errors.Is(err, os.ErrNotExist) && f == "tcp6" {
				continue // IPv6 disabled
			} else if err != nil {
				return err
			}
			if procTCPListens(b, port) {
				found = true
				return nil
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("listening sockets in %s: %w", path, err)
	}
	return found, nil
}

// procTCPListens reports whether a /proc/net/tcp (or tcp6) table has a
// socket in state LISTEN (0A) on local port port. Each row reads
// "sl local_address rem_address st ...", the addresses as HEX:PORT.
func procTCPListens(table []byte, port int) bool {
	for _, line := range strings.Split(string(table), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[3] != "0A" {
			continue
		}
		i := strings.LastIndexByte(f[1], ':')
		if p, err := strconv.ParseUint(f[1][i+1:], 16, 16); err == nil && int(p) == port {
			return true
		}
	}
	return false
}

// WriteSysctl writes value to a /proc/sys path. Inside Do, per-namespace
// settings (net/ipv6/conf/DEV/…) apply to that namespace.
func WriteSysctl(path, value string) error {
	return os.WriteFile(filepath.Join("/proc/sys", path), []byte(value), 0o644)
}

// AttachToBridge makes device dev a port of bridge br, inside the
// namespace at path, with IPv6 off on it: a bridge port carries no
// addresses of its own.
func AttachToBridge(path, dev, br string) error {
	return Do(path, func(h *netlink.Handle) error {
		_ = WriteSysctl("net/ipv6/conf/"+dev+"/disable_ipv6", "1")
		link, err := h.LinkByName(dev)
		if err != nil {
			return err
		}
		bridge, err := h.LinkByName(br)
		if err != nil {
			return err
		}
		if err := h.LinkSetMaster(link, bridge); err != nil {
			return fmt.Errorf("attaching %s to %s: %w", dev, br, err)
		}
		return nil
	})
}

// ErrNoRoute is RouteTo's error when the namespace has no route to the
// destination (the kernel's ENETUNREACH, EHOSTUNREACH and kin).
var ErrNoRoute = errors.New("no route")

// Route is what a namespace's routing picks for a destination, as `ip
// route get` shows it.
type Route struct {
	// Src is the source address the kernel would send from (the route's
	// preferred source, or the one it selects).
	Src netip.Addr
	// NextHop is the route's gateway, or the destination itself when it
	// is on link (or local).
	NextHop netip.Addr
	// Link is the device the route leaves through ("lo" for a local
	// address).
	Link string
	// Local tells that the destination is an address of the namespace
	// (RTN_LOCAL).
	Local bool
}

// RouteTo asks the routing of the namespace at path (the caller's own
// when path is empty) for dst, with an RTM_GETROUTE as `ip route get`
// sends: the source address, the next hop and the device. IPv4-mapped
// addresses count as IPv4 ones. Errors wrap ErrNoRoute when there is
// none. It enters the namespace on a thread of its own (Do): a control
// path's call, not a packet's.
func RouteTo(path string, dst netip.Addr) (Route, error) {
	dst = dst.Unmap()
	if !dst.IsValid() {
		return Route{}, fmt.Errorf("%w to the zero address", ErrNoRoute)
	}
	var r Route
	err := Do(path, func(h *netlink.Handle) error {
		routes, err := h.RouteGet(net.IP(dst.AsSlice()))
		if err != nil {
			return fmt.Errorf("%w to %v: %w", ErrNoRoute, dst, err)
		}
		if len(routes) == 0 {
			return fmt.Errorf("%w to %v", ErrNoRoute, dst)
		}
		rt := routes[0]
		r.Local = rt.Type == unix.RTN_LOCAL
		r.Src, _ = netip.AddrFromSlice(rt.Src)
		r.Src = r.Src.Unmap()
		r.NextHop = dst
		if gw, ok := netip.AddrFromSlice(rt.Gw); ok && !gw.IsUnspecified() {
			r.NextHop = gw.Unmap()
		}
		if l, err := h.LinkByIndex(rt.LinkIndex); err == nil {
			r.Link = l.Attrs().Name
		}
		return nil
	})
	if err != nil {
		return Route{}, fmt.Errorf("route in %s: %w", nsName(path), err)
	}
	return r, nil
}

// nsName names the namespace at path for messages.
func nsName(path string) string {
	if path == "" {
		return "the current namespace"
	}
	return path
}
