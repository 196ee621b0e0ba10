package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// netnsDir is where `ip netns` keeps its named namespaces.
const netnsDir = "/var/run/netns"

// nsPath returns the path of the named namespace.
func nsPath(name string) string { return filepath.Join(netnsDir, name) }

// createNS creates a named network namespace, as `ip netns add` does,
// without leaving the calling thread in it.
func createNS(name string) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return fmt.Errorf("current namespace: %w", err)
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	if err != nil {
		_ = netns.Set(orig)
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	h.Close()
	if err := netns.Set(orig); err != nil {
		// Keep the thread locked so it dies with this goroutine.
		runtime.LockOSThread()
		return fmt.Errorf("returning from namespace %s: %w", name, err)
	}
	return nil
}

// deleteNS removes a named namespace; a missing one is not an error.
func deleteNS(name string) error {
	err := netns.DeleteNamed(name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("deleting namespace %s: %w", name, err)
	}
	return nil
}

// listNS returns the named namespaces whose names start with prefix.
func listNS(prefix string) ([]string, error) {
	entries, err := os.ReadDir(netnsDir)
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

// inNS runs fn on a thread inside the named namespace, with a netlink
// handle for it.
func inNS(name string, fn func(h *netlink.Handle) error) error {
	target, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("namespace %s: %w", name, err)
	}
	defer target.Close()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering %s: %w", name, err)
	}
	defer func() {
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
	}()
	h, err := netlink.NewHandleAt(target)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", name, err)
	}
	defer h.Close()
	return fn(h)
}

// writeSysctl writes value to a /proc/sys path; call it inside inNS for
// per-namespace settings.
func writeSysctl(path, value string) error {
	return os.WriteFile(filepath.Join("/proc/sys", path), []byte(value), 0o644)
}
