//go:build linux

package shmem

import (
	"errors"
	"os"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// openFds counts this process's open descriptors.
func openFds(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

var pollerWarm sync.Once

// checkNoFdLeak fails the test if it ends with more descriptors open than it
// started with.
func checkNoFdLeak(t *testing.T) {
	t.Helper()
	// The runtime opens its poller's descriptors on first use; do that now.
	pollerWarm.Do(func() {
		if r, w, err := os.Pipe(); err == nil {
			r.Close()
			w.Close()
		}
	})
	before := openFds(t)
	t.Cleanup(func() {
		if after := openFds(t); after > before {
			t.Errorf("descriptor leak: %d open before, %d after", before, after)
		}
	})
}

func fdOpen(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return err == nil
}

func dupFd(t testing.TB, fd int) int {
	t.Helper()
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestNewRegionSizes(t *testing.T) {
	ps := os.Getpagesize()
	for _, tc := range []struct {
		size, want int
	}{
		{1, ps},
		{ps - 1, ps},
		{ps, ps},
		{ps + 1, 2 * ps},
		{5*ps + 3, 6 * ps},
		{0, -1},
		{-1, -1},
		{maxInt, -1},
		{maxInt - ps + 1, -1},
	} {
		t.Run(strconv.Itoa(tc.size), func(t *testing.T) {
			checkNoFdLeak(t)
			r, err := NewRegion("test", tc.size)
			if tc.want < 0 {
				if !errors.Is(err, ErrSize) {
					t.Fatalf("err = %v, want ErrSize", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if r.Size() != tc.want || len(r.Bytes()) != tc.want {
				t.Fatalf("Size %d, len(Bytes) %d, want %d", r.Size(), len(r.Bytes()), tc.want)
			}
			seals, err := unix.FcntlInt(uintptr(r.Fd()), unix.F_GET_SEALS, 0)
			if err != nil {
				t.Fatal(err)
			}
			if want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL; seals != want {
				t.Fatalf("seals %#x, want %#x", seals, want)
			}
			if err := unix.Ftruncate(r.Fd(), 0); err == nil {
				t.Fatal("sealed memfd could be truncated")
			}
			flags, _ := unix.FcntlInt(uintptr(r.Fd()), unix.F_GETFD, 0)
			if flags&unix.FD_CLOEXEC == 0 {
				t.Fatal("memfd not close-on-exec")
			}
		})
	}
}

func TestRegionSharedMappings(t *testing.T) {
	checkNoFdLeak(t)
	r, err := NewRegion("shared", 3*os.Getpagesize())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	// A second mapping through a duplicate of the descriptor.
	r2, err := MapRegion(dupFd(t, r.Fd()), r.Size())
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()

	// A third through a fresh open of /proc/self/fd/N, as a process that got
	// the path instead of the descriptor would do.
	pfd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(r.Fd()), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	r3, err := MapRegion(pfd, r.Size())
	if err != nil {
		unix.Close(pfd)
		t.Fatal(err)
	}
	defer r3.Close()

	a, b, c := r.Bytes(), r2.Bytes(), r3.Bytes()
	if &a[0] == &b[0] || &a[0] == &c[0] {
		t.Fatal("mappings share an address")
	}
	for i := range a {
		a[i] = byte(i * 7)
	}
	for i := range b {
		if b[i] != byte(i*7) || c[i] != byte(i*7) {
			t.Fatalf("byte %d differs between mappings", i)
		}
	}
	c[len(c)-1] = 0xA5
	if a[len(a)-1] != 0xA5 || b[len(b)-1] != 0xA5 {
		t.Fatal("write through the third mapping not seen")
	}
}

func TestMapRegionRejects(t *testing.T) {
	ps := os.Getpagesize()
	memfd := func(flags int, seals int) func(t *testing.T) int {
		return func(t *testing.T) int {
			fd, err := unix.MemfdCreate("t", flags|unix.MFD_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			if err := unix.Ftruncate(fd, int64(ps)); err != nil {
				t.Fatal(err)
			}
			if seals != 0 {
				if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
					t.Fatal(err)
				}
			}
			return fd
		}
	}
	for _, tc := range []struct {
		name string
		open func(t *testing.T) int
		size int
		want error
	}{
		{"sealed memfd", memfd(unix.MFD_ALLOW_SEALING, unix.F_SEAL_SHRINK), ps, nil},
		{"memfd without sealing", memfd(0, 0), ps, ErrNotSealed},
		{"sealable memfd not sealed", memfd(unix.MFD_ALLOW_SEALING, 0), ps, ErrNotSealed},
		{"memfd sealed against growing only", memfd(unix.MFD_ALLOW_SEALING, unix.F_SEAL_GROW|unix.F_SEAL_SEAL), ps, ErrNotSealed},
		{"size too small", memfd(unix.MFD_ALLOW_SEALING, unix.F_SEAL_SHRINK), ps - 1, ErrSize},
		{"size too large", memfd(unix.MFD_ALLOW_SEALING, unix.F_SEAL_SHRINK), 2 * ps, ErrSize},
		{"zero size", memfd(unix.MFD_ALLOW_SEALING, unix.F_SEAL_SHRINK), 0, ErrSize},
		{"pipe", func(t *testing.T) int {
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			unix.Close(p[1])
			return p[0]
		}, ps, ErrNotMemfd},
		{"eventfd", func(t *testing.T) int {
			fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			return fd
		}, 8, ErrNotMemfd},
		{"directory", func(t *testing.T) int {
			fd, err := unix.Open(t.TempDir(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			return fd
		}, ps, ErrNotMemfd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoFdLeak(t)
			fd := tc.open(t)
			r, err := MapRegion(fd, tc.size)
			if tc.want == nil {
				if err != nil {
					unix.Close(fd)
					t.Fatal(err)
				}
				r.Close()
				return
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if !fdOpen(fd) {
				t.Fatal("MapRegion closed the descriptor on error")
			}
			unix.Close(fd)
		})
	}

	t.Run("regular file", func(t *testing.T) {
		checkNoFdLeak(t)
		f, err := os.CreateTemp(t.TempDir(), "region")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(int64(ps)); err != nil {
			t.Fatal(err)
		}
		// On tmpfs a plain file reports F_SEAL_SEAL only; elsewhere F_GET_SEALS
		// fails. Either way it must be refused.
		_, err = MapRegion(int(f.Fd()), ps)
		if !errors.Is(err, ErrNotMemfd) && !errors.Is(err, ErrNotSealed) {
			t.Fatalf("err = %v, want ErrNotMemfd or ErrNotSealed", err)
		}
	})

	t.Run("bad descriptor", func(t *testing.T) {
		if _, err := MapRegion(-1, ps); err == nil {
			t.Fatal("MapRegion(-1) succeeded")
		}
	})
}

func TestRegionClose(t *testing.T) {
	checkNoFdLeak(t)
	r, err := NewRegion("close", 100)
	if err != nil {
		t.Fatal(err)
	}
	fd := r.Fd()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if fdOpen(fd) {
		t.Fatal("memfd still open after Close")
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if r.Bytes() != nil || r.Fd() != -1 {
		t.Fatal("closed region still exposes memory or descriptor")
	}
}
