//go:build linux

package shmem

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Region is a shared memory region: a sealed memfd mapped read/write with
// MAP_SHARED. Its file descriptor can be sent to another process (SendMsg),
// which maps the same memory with MapRegion. The mapping and the descriptor
// are released only by Close, never by the garbage collector.
type Region struct {
	mu   sync.Mutex
	mem  []byte
	fd   int
	size int
	// more are the memfds of a region MapSegments pieced together, after
	// the first (fd); Close closes them too.
	more []int
}

// NewRegion creates a memfd named name (the name is only a label, visible in
// /proc/PID/fd and /proc/PID/maps), sizes it to size bytes rounded up to the
// page size, seals it against shrinking, growing and further sealing, and maps
// it. Size reports the rounded size. Errors wrap ErrSize for a size that is not
// positive or too large.
func NewRegion(name string, size int) (*Region, error) {
	ps := os.Getpagesize()
	if size <= 0 || size > maxInt-ps {
		return nil, fmt.Errorf("shmem: NewRegion %q: size %d: %w", name, size, ErrSize)
	}
	size = (size + ps - 1) &^ (ps - 1)
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("shmem: NewRegion %q: memfd_create: %w", name, err)
	}
	fail := func(op string, err error) (*Region, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("shmem: NewRegion %q: %s: %w", name, op, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("ftruncate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail("F_ADD_SEALS", err)
	}
	mem, err := mmapShared(fd, size)
	if err != nil {
		return fail("mmap", err)
	}
	return &Region{mem: mem, fd: fd, size: size}, nil
}

// MapRegion maps a memfd received from the peer, which claims it is size
// bytes long. The descriptor is checked first: it must be a regular file that
// supports sealing (else the error wraps ErrNotMemfd), carry F_SEAL_SHRINK so
// the peer cannot truncate it under the mapping (ErrNotSealed), and be exactly
// size bytes long (ErrSize). On success the Region owns fd and closes it in
// Close; on error fd is left open and still belongs to the caller.
func MapRegion(fd int, size int) (*Region, error) {
	if size <= 0 {
		return nil, fmt.Errorf("shmem: MapRegion fd %d: size %d: %w", fd, size, ErrSize)
	}
	if err := checkMemfd(fd, size); err != nil {
		return nil, fmt.Errorf("shmem: MapRegion: %w", err)
	}
	mem, err := mmapShared(fd, size)
	if err != nil {
		return nil, fmt.Errorf("shmem: MapRegion fd %d: mmap %d bytes: %w", fd, size, err)
	}
	return &Region{mem: mem, fd: fd, size: size}, nil
}

// mmapShared maps size bytes of fd, shared, read and write. It maps by
// address, not through unix.Mmap's records, so that Close unmaps every
// kind of Region the same way.
func mmapShared(fd, size int) ([]byte, error) {
	p, err := unix.MmapPtr(fd, 0, nil, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), size), nil
}

// Segment is a piece of a memfd: Length bytes at Offset of a memfd the
// peer claims is Size bytes long; Offset and Length are multiples of the
// memfd's page size (a huge page size for a hugetlb memfd), and so is the
// sum of the lengths of the segments before a segment of huge pages.
type Segment struct {
	Fd                   int
	Offset, Length, Size int
}

// MapSegments maps pieces of memfds received from the peer one after the
// other into one contiguous region: the pages a client registers may lie
// on several memfds of its own. Each descriptor is checked as MapRegion
// checks it. On success the Region owns the descriptors; on error they are
// left open and still belong to the caller. Fd then returns the first.
func MapSegments(segs []Segment) (*Region, error) {
	total, align := 0, os.Getpagesize()
	if len(segs) == 0 {
		return nil, fmt.Errorf("shmem: MapSegments: no segment: %w", ErrSize)
	}
	for i, sg := range segs {
		if err := checkMemfd(sg.Fd, sg.Size); err != nil {
			return nil, fmt.Errorf("shmem: MapSegments: segment %d: %w", i, err)
		}
		// A memfd of huge pages maps at offsets and addresses of whole
		// huge pages only.
		ps := os.Getpagesize()
		var fs unix.Statfs_t
		if unix.Fstatfs(sg.Fd, &fs) == nil && fs.Type == unix.HUGETLBFS_MAGIC && fs.Bsize > int64(ps) {
			ps = int(fs.Bsize)
		}
		if sg.Length <= 0 || sg.Offset < 0 || sg.Offset%ps != 0 || sg.Length%ps != 0 || sg.Offset > sg.Size-sg.Length ||
			sg.Length > maxInt-total || total%ps != 0 {
			return nil, fmt.Errorf("shmem: MapSegments: segment %d: %d bytes at %d of %d, %d bytes in, pages of %d: %w",
				i, sg.Length, sg.Offset, sg.Size, total, ps, ErrSize)
		}
		total += sg.Length
		align = max(align, ps)
	}
	if total > maxInt-align {
		return nil, fmt.Errorf("shmem: MapSegments: %d bytes: %w", total, ErrSize)
	}
	// Reserve the whole range, aligned for the largest pages, then put
	// each piece in its place: no other mapping can take a hole between
	// two pieces meanwhile.
	span := total + align - os.Getpagesize()
	res, err := unix.MmapPtr(-1, 0, nil, uintptr(span), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("shmem: MapSegments: reserving %d bytes: %w", span, err)
	}
	skip := int(-uintptr(res) & uintptr(align-1))
	base := unsafe.Add(res, skip)
	if skip > 0 {
		_ = unix.MunmapPtr(res, uintptr(skip))
	}
	if tail := span - skip - total; tail > 0 {
		_ = unix.MunmapPtr(unsafe.Add(base, total), uintptr(tail))
	}
	off := 0
	for i, sg := range segs {
		at := unsafe.Add(base, off)
		p, err := unix.MmapPtr(sg.Fd, int64(sg.Offset), at, uintptr(sg.Length), unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_SHARED|unix.MAP_FIXED)
		if err != nil || p != at {
			_ = unix.MunmapPtr(base, uintptr(total))
			return nil, fmt.Errorf("shmem: MapSegments: segment %d: mmap: %w", i, err)
		}
		off += sg.Length
	}
	r := &Region{mem: unsafe.Slice((*byte)(base), total), fd: segs[0].Fd, size: total}
	for _, sg := range segs[1:] {
		r.more = append(r.more, sg.Fd)
	}
	return r, nil
}

// checkMemfd checks what MapRegion checks of a memfd: a regular file that
// supports sealing, sealed against shrinking, size bytes long.
func checkMemfd(fd, size int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fd %d: fstat: %w", fd, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("fd %d: file mode %#o: %w", fd, st.Mode, ErrNotMemfd)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("fd %d: F_GET_SEALS: %w (%w)", fd, ErrNotMemfd, err)
	}
	if err != nil {
		return fmt.Errorf("fd %d: F_GET_SEALS: %w", fd, err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return fmt.Errorf("fd %d: seals %#x: %w", fd, seals, ErrNotSealed)
	}
	// Check the size only now: with F_SEAL_SHRINK in place it can no longer
	// drop below what we see.
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fd %d: fstat: %w", fd, err)
	}
	if st.Size != int64(size) {
		return fmt.Errorf("fd %d: file has %d bytes, want %d: %w", fd, st.Size, size, ErrSize)
	}
	return nil
}

// Bytes returns the mapped memory, or nil after Close. The slice must not be
// used after Close.
func (r *Region) Bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mem
}

// Size returns the size of the region in bytes.
func (r *Region) Size() int { return r.size }

// Fd returns the memfd, for sending to the peer, or -1 after Close. The
// Region keeps ownership: do not close it.
func (r *Region) Fd() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fd
}

// Close unmaps the region and closes its memfd. Calling Close again does
// nothing and returns nil.
func (r *Region) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fd < 0 {
		return nil
	}
	var errs []error
	if err := unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(r.mem)), uintptr(len(r.mem))); err != nil {
		errs = append(errs, fmt.Errorf("munmap: %w", err))
	}
	if err := unix.Close(r.fd); err != nil {
		errs = append(errs, fmt.Errorf("close: %w", err))
	}
	for _, fd := range r.more {
		if err := unix.Close(fd); err != nil {
			errs = append(errs, fmt.Errorf("close: %w", err))
		}
	}
	r.mem, r.fd, r.more = nil, -1, nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("shmem: Region.Close: %w", err)
	}
	return nil
}
