//go:build linux

package shmem

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Doorbell wakes a sleeping peer. One side rings it, the other waits on
// it. It is an eventfd, which both sides share (NewDoorbell), or a pipe,
// whose write end the ringing side gets (NewPipeDoorbell). The descriptor
// is non-blocking and registered with the Go runtime's poller, so a
// goroutine in Wait does not hold an OS thread.
//
// Ring, Drain and Close may be called from any goroutine; at most one
// goroutine should be in Wait at a time.
type Doorbell struct {
	f      *os.File
	rc     syscall.RawConn
	fd     int
	closed atomic.Bool
	once   sync.Once
	cerr   error

	// A pipe doorbell: pipe says the descriptor is a pipe's end (the read
	// end on the waiting side, the write end on the ringing side); wf,
	// wrc and wfd are the waiting side's write end (Fd, Ring), nil and -1
	// otherwise.
	pipe bool
	wf   *os.File
	wrc  syscall.RawConn
	wfd  int

	// The read in progress (read holds rmu): made once, so that waiting
	// allocates nothing. An eventfd read takes 8 bytes; a pipe read takes
	// up to the whole buffer's worth of rings at once.
	rmu    sync.Mutex
	rbuf   [64]byte
	rerr   error
	rblock bool
	readFn func(uintptr) bool
	// Ring's write, likewise (Ring holds wmu).
	wmu     sync.Mutex
	werr    error
	writeFn func(uintptr) bool
}

// eventfdOne is the 8-byte value 1 in host byte order, what Ring writes
// to an eventfd; to a pipe it writes one byte.
var eventfdOne = binary.NativeEndian.AppendUint64(nil, 1)

// NewPipeDoorbell creates a doorbell that this side waits on and the peer
// rings, on a new pipe (O_CLOEXEC|O_NONBLOCK): Fd is the pipe's write end,
// for the peer, and the doorbell keeps both ends (Ring works on this side
// too). A pipe's wakeup is a synchronous one — the kernel expects the
// writer to sleep soon and does not preempt it for the woken reader — so
// it costs less than an eventfd's where a client posts and then polls for
// the answer (docs/performance-log.md, the pipe doorbell).
func NewPipeDoorbell() (*Doorbell, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, fmt.Errorf("shmem: NewPipeDoorbell: pipe: %w", err)
	}
	d, err := newDoorbell(p[0])
	if err != nil {
		unix.Close(p[1])
		return nil, fmt.Errorf("shmem: NewPipeDoorbell: %w", err)
	}
	// The write end is an os.File too: a Ring racing Close then fails
	// cleanly instead of writing to a descriptor number reused meanwhile.
	d.wf = os.NewFile(uintptr(p[1]), "pipe")
	if d.wrc, err = d.wf.SyscallConn(); err != nil {
		d.wf.Close()
		d.f.Close()
		return nil, fmt.Errorf("shmem: NewPipeDoorbell: raw conn: %w", err)
	}
	d.pipe, d.wfd = true, p[1]
	return d, nil
}

// NewUnpolledPipeDoorbell is NewPipeDoorbell for a waiter that polls the
// read end itself (ReadFd, Drain) instead of waiting in Wait: the read
// end stays out of the Go runtime's poller, so that a ring wakes only
// that waiter.
func NewUnpolledPipeDoorbell() (*Doorbell, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("shmem: NewUnpolledPipeDoorbell: pipe: %w", err)
	}
	// Wrapped while blocking, the files stay out of the runtime's poller;
	// the descriptors are made non-blocking only then.
	f, wf := os.NewFile(uintptr(p[0]), "pipe"), os.NewFile(uintptr(p[1]), "pipe")
	fail := func(err error) (*Doorbell, error) {
		f.Close()
		wf.Close()
		return nil, fmt.Errorf("shmem: NewUnpolledPipeDoorbell: %w", err)
	}
	for _, fd := range p {
		if err := unix.SetNonblock(fd, true); err != nil {
			return fail(err)
		}
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return fail(err)
	}
	wrc, err := wf.SyscallConn()
	if err != nil {
		return fail(err)
	}
	d := &Doorbell{f: f, rc: rc, fd: p[0], pipe: true, wf: wf, wrc: wrc, wfd: p[1]}
	d.readFn, d.writeFn = d.readRaw, d.writeRaw
	return d, nil
}

// ReadFd returns the descriptor a waiter polls: the eventfd, or a pipe's
// read end.
func (d *Doorbell) ReadFd() int { return d.fd }

// NewDoorbell creates a doorbell on a new eventfd (EFD_CLOEXEC|EFD_NONBLOCK).
func NewDoorbell() (*Doorbell, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("shmem: NewDoorbell: eventfd: %w", err)
	}
	d, err := newDoorbell(fd)
	if err != nil {
		return nil, fmt.Errorf("shmem: NewDoorbell: %w", err)
	}
	return d, nil
}

// DoorbellFromFd makes a doorbell of a descriptor received from the peer:
// an eventfd (NewDoorbell's), or the write end of a pipe
// (NewPipeDoorbell's), which can only be rung. The descriptor is checked
// to be one of those (else the error wraps ErrNotEventfd); it is switched
// to non-blocking mode, which the peer's descriptor shares. On success the
// Doorbell owns fd and closes it in Close; on error fd is left open and
// still belongs to the caller.
func DoorbellFromFd(fd int) (*Doorbell, error) {
	if fd < 0 {
		return nil, fmt.Errorf("shmem: DoorbellFromFd %d: %w", fd, ErrNotEventfd)
	}
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return nil, fmt.Errorf("shmem: DoorbellFromFd %d: %w", fd, err)
	}
	pipe := strings.HasPrefix(link, "pipe:")
	if pipe {
		fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		if err != nil {
			return nil, fmt.Errorf("shmem: DoorbellFromFd %d: %w", fd, err)
		}
		if fl&unix.O_ACCMODE != unix.O_WRONLY {
			return nil, fmt.Errorf("shmem: DoorbellFromFd %d: descriptor is a pipe's read end: %w", fd, ErrNotEventfd)
		}
	} else if link != "anon_inode:[eventfd]" {
		return nil, fmt.Errorf("shmem: DoorbellFromFd %d: descriptor is %q: %w", fd, link, ErrNotEventfd)
	}
	// Work on a duplicate so that fd stays untouched if anything fails.
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shmem: DoorbellFromFd %d: dup: %w", fd, err)
	}
	if err := unix.SetNonblock(dup, true); err != nil {
		unix.Close(dup)
		return nil, fmt.Errorf("shmem: DoorbellFromFd %d: set non-blocking: %w", fd, err)
	}
	d, err := newDoorbell(dup)
	if err != nil {
		return nil, fmt.Errorf("shmem: DoorbellFromFd %d: %w", fd, err)
	}
	d.pipe = pipe
	unix.Close(fd)
	return d, nil
}

// newDoorbell wraps a non-blocking eventfd and takes ownership of fd, even on
// error.
func newDoorbell(fd int) (*Doorbell, error) {
	f := os.NewFile(uintptr(fd), "eventfd")
	// Deadlines work only on descriptors the poller accepted.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("register with poller: %w", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("raw conn: %w", err)
	}
	d := &Doorbell{f: f, rc: rc, fd: fd, wfd: -1}
	d.readFn, d.writeFn = d.readRaw, d.writeRaw
	return d, nil
}

// Fd returns the descriptor to send to the peer: the eventfd, or a pipe
// doorbell's write end. The Doorbell keeps ownership: do not close it.
func (d *Doorbell) Fd() int {
	if d.wfd >= 0 {
		return d.wfd
	}
	return d.fd
}

// Ring wakes the waiter: it adds 1 to the eventfd counter, or writes one
// byte into the pipe. Ringing a doorbell whose counter is saturated, or
// whose pipe is full, is not an error: it is rung already.
func (d *Doorbell) Ring() error {
	rc := d.rc
	if d.wrc != nil {
		rc = d.wrc // the waiting side's own write end
	}
	d.wmu.Lock()
	err := rc.Write(d.writeFn)
	werr := d.werr
	d.wmu.Unlock()
	if err == nil {
		err = werr
	}
	if err != nil {
		return fmt.Errorf("shmem: Doorbell.Ring: %w", d.closedErr(err))
	}
	return nil
}

// writeRaw is Ring's raw write; wmu is held. EAGAIN, a full pipe or a
// saturated counter, leaves werr nil.
func (d *Doorbell) writeRaw(fd uintptr) bool {
	b := eventfdOne
	if d.pipe {
		b = eventfdOne[:1]
	}
	for {
		_, d.werr = unix.Write(int(fd), b)
		switch d.werr {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			d.werr = nil
		}
		return true
	}
}

// Wait blocks until the doorbell is rung or ctx is done, and consumes all
// rings so far. It returns nil when rung, ctx's error when ctx ends first
// (even if the doorbell was rung at the same time; the ring then stays
// pending), and an error wrapping os.ErrClosed if the doorbell is closed.
func (d *Doorbell) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ctx.Done() != nil {
		done := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			// A deadline in the past wakes the blocked Read below.
			d.f.SetReadDeadline(time.Unix(1, 0))
			close(done)
		})
		defer func() {
			if !stop() {
				<-done
			}
			d.f.SetReadDeadline(time.Time{})
		}()
	}
	if err := d.waitRead(ctx.Err); err != nil {
		if cerr := ctx.Err(); cerr != nil && err == cerr {
			return cerr
		}
		return fmt.Errorf("shmem: Doorbell.Wait: %w", err)
	}
	return nil
}

// waitRead reads the doorbell until it was rung. A read deadline ends it
// with stop's error if stop has one; a deadline left over from another
// waiter is waited out.
func (d *Doorbell) waitRead(stop func() error) error {
	for {
		rung, err := d.read(true)
		switch {
		case err == nil && rung:
			return nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			if serr := stop(); serr != nil {
				return serr
			}
			time.Sleep(time.Millisecond)
		case err != nil:
			return d.closedErr(err)
		}
	}
}

// noStop is waitRead's stop for a wait without a context.
func noStop() error { return nil }

// Drain consumes pending rings without blocking and reports whether there
// were any.
func (d *Doorbell) Drain() (rung bool, err error) {
	rung, err = d.read(false)
	if err != nil {
		return false, fmt.Errorf("shmem: Doorbell.Drain: %w", d.closedErr(err))
	}
	return rung, nil
}

// read reads the eventfd counter once. With block it waits for the
// descriptor to become readable; without, it reports rung == false when the
// counter is zero.
func (d *Doorbell) read(block bool) (rung bool, err error) {
	d.rmu.Lock()
	defer d.rmu.Unlock()
	d.rblock = block
	if err := d.rc.Read(d.readFn); err != nil {
		return false, err
	}
	switch d.rerr {
	case nil:
		return true, nil
	case unix.EAGAIN:
		return false, nil
	}
	return false, d.rerr
}

// readRaw is read's raw read; rmu is held. A pipe is read until it is
// empty, so that one read consumes every ring so far, as an eventfd's does.
func (d *Doorbell) readRaw(fd uintptr) bool {
	rung := false
	for {
		var n int
		n, d.rerr = unix.Read(int(fd), d.rbuf[:])
		switch {
		case d.rerr == unix.EINTR:
			continue
		case d.rerr == unix.EAGAIN && rung:
			d.rerr = nil
			return true
		case d.rerr == unix.EAGAIN:
			return !d.rblock
		case d.rerr == nil && d.pipe && n == len(d.rbuf):
			rung = true
			continue
		case d.rerr == nil && d.pipe && n == 0:
			// Every write end is closed: nobody can ring any more.
			d.rerr = os.ErrClosed
		}
		return true
	}
}

// WaitRung blocks until the doorbell is rung, and consumes all rings so
// far, like Wait without a context: it returns nil when rung and an error
// wrapping os.ErrClosed if the doorbell is closed. It allocates nothing,
// for a poller that sleeps and wakes at every message; such a poller's
// owner wakes it to stop by ringing.
func (d *Doorbell) WaitRung() error {
	if err := d.waitRead(noStop); err != nil {
		return fmt.Errorf("shmem: Doorbell.WaitRung: %w", err)
	}
	return nil
}

// Close closes the eventfd; a goroutine blocked in Wait returns an error
// wrapping os.ErrClosed. Calling Close again does nothing and returns nil.
func (d *Doorbell) Close() error {
	d.once.Do(func() {
		d.closed.Store(true)
		err := d.f.Close()
		if d.wf != nil {
			err = errors.Join(err, d.wf.Close())
		}
		if err != nil {
			d.cerr = fmt.Errorf("shmem: Doorbell.Close: %w", err)
		}
	})
	return d.cerr
}

// closedErr maps the poller's "use of closed file", which the raw connection
// does not translate, to os.ErrClosed.
func (d *Doorbell) closedErr(err error) error {
	if d.closed.Load() && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("%w (%w)", os.ErrClosed, err)
	}
	return err
}
