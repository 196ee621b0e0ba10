//go:build linux

package shmem

import (
	"errors"
	"os"
	"strconv"
	"sync"
	"testing"
	"unsafe"

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

// sealedMemfd makes a memfd of n pages sealed against shrinking whose
// bytes are fill(i) at offset i.
func sealedMemfd(t *testing.T, n int, fill func(int) byte) int {
	t.Helper()
	ps := os.Getpagesize()
	fd, err := unix.MemfdCreate("seg", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, n*ps)
	for i := range b {
		b[i] = fill(i)
	}
	if _, err := unix.Pwrite(fd, b, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		t.Fatal(err)
	}
	return fd
}

// TestMapSegments: pieces of several memfds appear end to end, in order,
// sharing their pages with the memfds; bad pieces are refused with the
// descriptors left to the caller; Close closes them all.
func TestMapSegments(t *testing.T) {
	checkNoFdLeak(t)
	ps := os.Getpagesize()
	a := sealedMemfd(t, 3, func(i int) byte { return byte(i / ps) })    // pages 0 1 2
	b := sealedMemfd(t, 2, func(i int) byte { return byte(10 + i/ps) }) // pages 10 11
	c := sealedMemfd(t, 1, func(i int) byte { return 20 })              // page 20
	r, err := MapSegments([]Segment{{a, ps, 2 * ps, 3 * ps}, {b, 0, ps, 2 * ps}, {c, 0, ps, ps}})
	if err != nil {
		t.Fatal(err)
	}
	mem := r.Bytes()
	if len(mem) != 4*ps || r.Size() != 4*ps || r.Fd() != a {
		t.Fatalf("%d bytes, size %d, fd %d", len(mem), r.Size(), r.Fd())
	}
	for i, want := range []byte{1, 2, 10, 20} {
		if mem[i*ps] != want || mem[i*ps+ps-1] != want {
			t.Errorf("page %d holds %d, want %d", i, mem[i*ps], want)
		}
	}
	// Shared both ways with the memfds.
	mem[2*ps+5] = 99
	got := make([]byte, 1)
	if _, err := unix.Pread(b, got, 5); err != nil || got[0] != 99 {
		t.Errorf("memfd b at 5: %v %v, want 99", got, err)
	}
	if _, err := unix.Pwrite(a, []byte{77}, int64(2*ps)); err != nil || mem[ps] != 77 {
		t.Errorf("mapping at page 1: %d %v, want 77", mem[ps], err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	for _, fd := range []int{a, b, c} {
		if fdOpen(fd) {
			t.Errorf("fd %d open after Close", fd)
		}
	}

	for _, tc := range []struct {
		name string
		segs func(fd int) []Segment
		want error
	}{
		{"none", func(int) []Segment { return nil }, ErrSize},
		{"unaligned offset", func(fd int) []Segment { return []Segment{{fd, 1, ps, 2 * ps}} }, ErrSize},
		{"unaligned length", func(fd int) []Segment { return []Segment{{fd, 0, ps + 1, 2 * ps}} }, ErrSize},
		{"empty", func(fd int) []Segment { return []Segment{{fd, 0, 0, 2 * ps}} }, ErrSize},
		{"beyond the file", func(fd int) []Segment { return []Segment{{fd, ps, 2 * ps, 2 * ps}} }, ErrSize},
		{"wrong size", func(fd int) []Segment { return []Segment{{fd, 0, ps, 3 * ps}} }, ErrSize},
		{"negative offset", func(fd int) []Segment { return []Segment{{fd, -ps, ps, 2 * ps}} }, ErrSize},
		{"second bad", func(fd int) []Segment { return []Segment{{fd, 0, ps, 2 * ps}, {-1, 0, ps, ps}} }, unix.EBADF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd := sealedMemfd(t, 2, func(int) byte { return 0 })
			defer unix.Close(fd)
			if _, err := MapSegments(tc.segs(fd)); !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if !fdOpen(fd) {
				t.Fatal("MapSegments closed a descriptor on error")
			}
		})
	}
}

// TestMapSegmentsHugePages: a memfd of huge pages maps where whole huge
// pages lie — first, or after segments of whole huge pages — and is
// refused after a piece of base pages that would leave it misaligned.
func TestMapSegmentsHugePages(t *testing.T) {
	checkNoFdLeak(t)
	const huge = 2 << 20
	hfd, err := unix.MemfdCreate("huge", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_HUGETLB)
	if err == nil {
		err = unix.Ftruncate(hfd, huge)
	}
	if err == nil { // a huge page to map, or ENOMEM
		var p unsafe.Pointer
		if p, err = unix.MmapPtr(hfd, 0, nil, huge, unix.PROT_READ, unix.MAP_SHARED); err == nil {
			_ = unix.MunmapPtr(p, huge)
		}
	}
	if err != nil {
		if hfd > 0 {
			unix.Close(hfd)
		}
		t.Skipf("no huge pages here (%v): as root, echo 8 > /proc/sys/vm/nr_hugepages", err)
	}
	defer unix.Close(hfd)
	if _, err := unix.FcntlInt(uintptr(hfd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		t.Fatal(err)
	}
	ps := os.Getpagesize()
	fd := sealedMemfd(t, 1, func(int) byte { return 3 })
	defer unix.Close(fd)
	if _, err := MapSegments([]Segment{{fd, 0, ps, ps}, {hfd, 0, huge, huge}}); !errors.Is(err, ErrSize) {
		t.Errorf("huge pages after a base page: %v, want ErrSize", err)
	}
	if _, err := MapSegments([]Segment{{hfd, 0, ps, huge}}); !errors.Is(err, ErrSize) {
		t.Errorf("part of a huge page: %v, want ErrSize", err)
	}
	hd, d := dupFd(t, hfd), dupFd(t, fd)
	r, err := MapSegments([]Segment{{hd, 0, huge, huge}, {d, 0, ps, ps}})
	if err != nil {
		unix.Close(hd)
		unix.Close(d)
		t.Fatal(err)
	}
	defer r.Close()
	mem := r.Bytes()
	if uintptr(unsafe.Pointer(&mem[0]))%huge != 0 || len(mem) != huge+ps || mem[huge] != 3 {
		t.Fatalf("at %p, %d bytes, %d after the huge page", &mem[0], len(mem), mem[huge])
	}
	mem[5] = 9
	got := make([]byte, 1)
	if _, err := unix.Pread(hfd, got, 5); err != nil || got[0] != 9 {
		t.Errorf("huge memfd at 5: %v %v, want 9", got, err)
	}
}
