//go:build linux

package shmem

import (
	"errors"
	"fmt"
	"os"
	"sync"

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
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
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
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shmem: MapRegion fd %d: fstat: %w", fd, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("shmem: MapRegion fd %d: file mode %#o: %w", fd, st.Mode, ErrNotMemfd)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if errors.Is(err, unix.EINVAL) {
		return nil, fmt.Errorf("shmem: MapRegion fd %d: F_GET_SEALS: %w (%w)", fd, ErrNotMemfd, err)
	}
	if err != nil {
		return nil, fmt.Errorf("shmem: MapRegion fd %d: F_GET_SEALS: %w", fd, err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("shmem: MapRegion fd %d: seals %#x: %w", fd, seals, ErrNotSealed)
	}
	// Check the size only now: with F_SEAL_SHRINK in place it can no longer
	// drop below what we see.
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shmem: MapRegion fd %d: fstat: %w", fd, err)
	}
	if st.Size != int64(size) {
		return nil, fmt.Errorf("shmem: MapRegion fd %d: file has %d bytes, want %d: %w", fd, st.Size, size, ErrSize)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shmem: MapRegion fd %d: mmap %d bytes: %w", fd, size, err)
	}
	return &Region{mem: mem, fd: fd, size: size}, nil
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
	if err := unix.Munmap(r.mem); err != nil {
		errs = append(errs, fmt.Errorf("munmap: %w", err))
	}
	if err := unix.Close(r.fd); err != nil {
		errs = append(errs, fmt.Errorf("close: %w", err))
	}
	r.mem, r.fd = nil, -1
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("shmem: Region.Close: %w", err)
	}
	return nil
}
