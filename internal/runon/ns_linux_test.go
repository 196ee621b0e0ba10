package runon

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// inMountNamespace runs f on a thread of its own in a mount namespace of
// its own, which the thread takes with it when it ends (its goroutine
// never unlocks it), and returns f's error.
func inMountNamespace(t *testing.T, f func() error) error {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (a mount namespace)")
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // for good: the thread dies with its namespace
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			done <- fmt.Errorf("unshare: %w", err)
			return
		}
		done <- f()
	}()
	return <-done
}

// TestInstall: in its mount namespace the tree is there — the devices'
// sysfs attributes, their uverbs character devices — beside everything
// /sys/class and /dev held (a network interface's attributes, the null
// device, /dev/pts and /dev/shm with their mounts); outside it, nothing
// changed.
func TestInstall(t *testing.T) {
	hadIB := exists("/sys/class/infiniband/taproce0")
	hadDev := exists("/dev/infiniband/uverbs0")
	before, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil || !strings.Contains(string(before), " /sys ") {
		t.Fatalf("the mounts: %v\n%s", err, before)
	}
	err = inMountNamespace(t, func() error {
		if err := install(testDevices()); err != nil {
			return err
		}
		if got, err := os.ReadFile("/sys/class/infiniband/taproce0/ports/1/gids/1"); err != nil ||
			string(got) != "0000:0000:0000:0000:0000:ffff:0a4d:0001\n" {
			return fmt.Errorf("the tree's GID: %q, %v", got, err)
		}
		var st unix.Stat_t
		if err := unix.Stat("/dev/infiniband/uverbs1", &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR ||
			unix.Major(st.Rdev) != 231 || unix.Minor(st.Rdev) != 193 {
			return fmt.Errorf("uverbs1: mode %#o rdev %#x, %v", st.Mode, st.Rdev, err)
		}
		if err := unix.Access("/dev/infiniband/uverbs0", unix.R_OK|unix.W_OK); err != nil {
			return fmt.Errorf("uverbs0 not readable and writable: %w", err)
		}
		// What was there still works.
		if b, err := os.ReadFile("/sys/class/net/lo/address"); err != nil || !strings.HasPrefix(string(b), "00:00:00") {
			return fmt.Errorf("lo's sysfs attributes: %q, %v", b, err)
		}
		f, err := os.OpenFile("/dev/null", os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		if _, err := f.Write([]byte("x")); err != nil {
			return err
		}
		f.Close()
		for _, dir := range []string{"/dev/pts", "/dev/shm"} {
			var s, orig unix.Statfs_t
			if err := unix.Statfs(dir, &s); err != nil {
				return err
			}
			if err := unix.Statfs("/proc/1/root"+dir, &orig); err == nil && s.Type != orig.Type {
				return fmt.Errorf("%s is a %#x now, %#x before", dir, s.Type, orig.Type)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if exists("/sys/class/infiniband/taproce0") != hadIB || exists("/dev/infiniband/uverbs0") != hadDev {
		t.Fatal("the tree leaked out of its mount namespace")
	}
	after, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(before) {
		t.Fatalf("the mounts outside changed:\nbefore\n%s\nafter\n%s", before, after)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
