package tap

import (
	"sync"
)

// Fake is one end of an in-memory device pair: what one end writes, the
// other reads, frame by frame, in order. It is the TAP of unit tests: a
// station or port under test holds one end and the test the other.
type Fake struct {
	name string
	mtu  int
	in   chan []byte
	peer *Fake

	closed    chan struct{}
	closeOnce sync.Once
}

// NewFakePair returns two connected fake devices with the given MTU; each
// end queues up to depth frames before a Write blocks.
func NewFakePair(mtu, depth int) (*Fake, *Fake) {
	a := &Fake{name: "fake0", mtu: mtu, in: make(chan []byte, depth), closed: make(chan struct{})}
	b := &Fake{name: "fake1", mtu: mtu, in: make(chan []byte, depth), closed: make(chan struct{})}
	a.peer, b.peer = b, a
	return a, b
}

// Read implements Device: it returns the frames queued so far, at least one.
func (f *Fake) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if f.isClosed() {
		return 0, ErrClosed
	}
	var frame []byte
	select {
	case frame = <-f.in:
	case <-f.closed:
		return 0, ErrClosed
	}
	n := 0
	for {
		if len(bufs[n])-offset < len(frame) {
			return n, ErrShortBuffer
		}
		sizes[n] = copy(bufs[n][offset:], frame)
		n++
		if n == len(bufs) {
			return n, nil
		}
		select {
		case frame = <-f.in:
		default:
			return n, nil
		}
	}
}

// TryReadEach hands fn the next queued frame, if there is one, without
// waiting, as tap.Tap.TryReadEach does: 0 and no error when none is
// queued, ErrClosed once the device is closed.
func (f *Fake) TryReadEach(fn func(frame []byte)) (int, error) {
	if f.isClosed() {
		return 0, ErrClosed
	}
	select {
	case frame := <-f.in:
		fn(frame)
		return 1, nil
	default:
		return 0, nil
	}
}

// Write implements Device: each frame is copied to the peer's queue.
func (f *Fake) Write(bufs [][]byte, offset int) (int, error) {
	for i, b := range bufs {
		if f.isClosed() {
			return i, ErrClosed
		}
		frame := append([]byte(nil), b[offset:]...)
		select {
		case <-f.closed:
			return i, ErrClosed
		case <-f.peer.closed:
			// Like a cable to a dead port: frames vanish.
		case f.peer.in <- frame:
		}
	}
	return len(bufs), nil
}

func (f *Fake) isClosed() bool {
	select {
	case <-f.closed:
		return true
	default:
		return false
	}
}

// BatchSize implements Device.
func (f *Fake) BatchSize() int { return 16 }

// Name implements Device.
func (f *Fake) Name() string { return f.name }

// MTU implements Device.
func (f *Fake) MTU() int { return f.mtu }

// Close implements Device.
func (f *Fake) Close() error {
	f.closeOnce.Do(func() { close(f.closed) })
	return nil
}
