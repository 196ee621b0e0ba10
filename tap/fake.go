package tap

import (
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// Fake is one end of an in-memory device pair: what one end writes, the
// other reads, frame by frame, in order. It is the TAP of unit tests: a
// port under test holds one end and the test the other. It offers what a
// Tap offers a port — TryReadEach, and a descriptor (an eventfd) readable
// while frames wait, which a blocking loop sleeps on — so a port on a fake
// runs the same receive path as on a TAP.
//
// As a TAP's, a Fake's writes never wait for the reader: a frame that
// finds the peer's queue full is dropped and counted (Dropped), as the
// kernel drops what a TAP's reader leaves unread.
type Fake struct {
	name  string
	mtu   int
	depth int
	peer  *Fake

	mu      sync.Mutex
	cond    *sync.Cond // signalled when a frame is queued or the device closes
	q       [][]byte   // frames waiting to be read
	efd     int        // readable (counter 1) exactly while q is not empty
	closed  bool
	dropped uint64
}

// NewFakePair returns two connected fake devices with the given MTU; each
// end queues up to depth frames before writes to it are dropped.
func NewFakePair(mtu, depth int) (*Fake, *Fake) {
	a, b := newFake("fake0", mtu, depth), newFake("fake1", mtu, depth)
	a.peer, b.peer = b, a
	return a, b
}

func newFake(name string, mtu, depth int) *Fake {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		// A test machine out of descriptors cannot run the test at all.
		panic(fmt.Sprintf("tap: fake device: eventfd: %v", err))
	}
	f := &Fake{name: name, mtu: mtu, depth: max(depth, 1), efd: fd}
	f.cond = sync.NewCond(&f.mu)
	runtime.AddCleanup(f, func(fd int) { unix.Close(fd) }, fd)
	return f
}

// push queues frame for reading; the caller gave up ownership of it.
func (f *Fake) push(frame []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return // like a cable to a dead port: frames vanish
	}
	if len(f.q) >= f.depth {
		f.dropped++
		return
	}
	f.q = append(f.q, frame)
	if len(f.q) == 1 {
		one := [8]byte{1}
		_, _ = unix.Write(f.efd, one[:])
	}
	f.cond.Signal()
}

// popLocked takes the oldest frame; f.mu is held and q is not empty.
func (f *Fake) popLocked() []byte {
	frame := f.q[0]
	f.q[0] = nil
	f.q = f.q[1:]
	if len(f.q) == 0 {
		var b [8]byte
		_, _ = unix.Read(f.efd, b[:])
		f.q = nil
	}
	return frame
}

// TryReadEach hands fn the frames queued so far, without waiting, as
// Tap.TryReadEach does: 0 and no error when none is queued, ErrClosed
// once the device is closed.
func (f *Fake) TryReadEach(fn func(frame []byte)) (int, error) {
	n := 0
	for ; n < maxReadSegments; n++ {
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			return n, ErrClosed
		}
		if len(f.q) == 0 {
			f.mu.Unlock()
			break
		}
		frame := f.popLocked()
		f.mu.Unlock()
		fn(frame)
	}
	return n, nil
}

// Read waits for at least one frame and copies the frames queued so far
// into bufs[i][offset:], their lengths in sizes: the blocking read of a
// test that plays the far end of the wire.
func (f *Fake) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.q) == 0 && !f.closed {
		f.cond.Wait()
	}
	if f.closed {
		return 0, ErrClosed
	}
	n := 0
	for n < len(bufs) && len(f.q) > 0 {
		if len(bufs[n])-offset < len(f.q[0]) {
			return n, ErrShortBuffer
		}
		sizes[n] = copy(bufs[n][offset:], f.popLocked())
		n++
	}
	return n, nil
}

// Fd implements Device: an eventfd, readable while a frame waits.
func (f *Fake) Fd() int { return f.efd }

// Write implements Device: each frame is copied to the peer's queue, or
// dropped when that queue is full or the peer closed.
func (f *Fake) Write(bufs [][]byte, offset int) (int, error) {
	f.mu.Lock()
	closed := f.closed
	f.mu.Unlock()
	if closed {
		return 0, ErrClosed
	}
	for _, b := range bufs {
		f.peer.push(append([]byte(nil), b[offset:]...))
	}
	return len(bufs), nil
}

// Dropped counts the frames written to this end that its full queue
// dropped.
func (f *Fake) Dropped() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dropped
}

// Name implements Device.
func (f *Fake) Name() string { return f.name }

// MTU implements Device.
func (f *Fake) MTU() int { return f.mtu }

// Close implements Device. The eventfd stays open, readable, so that a
// loop still asleep on it wakes and finds the device closed; it is closed
// when the Fake is garbage (runtime.AddCleanup).
func (f *Fake) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	f.q = nil
	one := [8]byte{1}
	_, _ = unix.Write(f.efd, one[:])
	f.cond.Broadcast()
	return nil
}
