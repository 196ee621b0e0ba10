package verbs_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/taproce/taproce/verbs"
)

// TestNoAppliance: where no appliance listens — no socket, or a socket an
// appliance left behind — Devices and Open fail with a NoApplianceError
// naming the socket, which wraps ErrNoAppliance and the dial's error; a
// socket that refuses this process for another reason is not one.
func TestNoAppliance(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: stale, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	for _, c := range []struct {
		name, sock string
		errno      syscall.Errno
		none       bool
	}{
		{"no socket", filepath.Join(dir, "none.sock"), syscall.ENOENT, true},
		{"stale socket", stale, syscall.ECONNREFUSED, true},
		{"not a directory", filepath.Join(stale, "x.sock"), syscall.ENOTDIR, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("TAPROCE_SOCKET", c.sock)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, derr := verbs.Devices(ctx)
			_, oerr := verbs.Open(ctx, "taproce0")
			for _, err := range []error{derr, oerr} {
				var na *verbs.NoApplianceError
				if got := errors.As(err, &na); got != c.none || errors.Is(err, verbs.ErrNoAppliance) != c.none {
					t.Fatalf("%v: a NoApplianceError: %v, want %v", err, got, c.none)
				}
				if !errors.Is(err, c.errno) {
					t.Errorf("%v: does not wrap %v", err, c.errno)
				}
				if c.none && (na.Socket != c.sock || err.Error() != "verbs: no appliance is listening at "+c.sock) {
					t.Errorf("%q names socket %q, want %q", err, na.Socket, c.sock)
				}
			}
		})
	}
}
