// Package tap gives taproce's ports their network devices: Linux TAP
// devices created inside a chosen network namespace, read and written in
// batches, with UDP GSO super-frames so that one syscall moves many RoCE
// packets. A channel-backed fake pair stands in for tests without root.
//
// The batched interface follows wireguard-go's tun.Device: frames live in
// caller-owned buffers at an offset that leaves headroom for the
// virtio-net header, so a frame goes to the kernel without being copied.
package tap

import "errors"

// Headroom is the space Read and Write need in front of each frame's offset:
// room for the virtio-net header.
const Headroom = VirtioNetHdrLen

// Device is a source and sink of Ethernet frames: what a port needs of
// its link. A Tap is one; a Fake pair stands in for tests with the same
// contract, so that a port on a fake runs the code it runs on a TAP.
type Device interface {
	// TryReadEach hands fn, in place, each frame that has arrived — the
	// frames of one read, never waiting for more — and returns how many:
	// 0 and no error when none waits, ErrClosed once the device is
	// closed. fn must not keep the slice.
	TryReadEach(fn func(frame []byte)) (int, error)
	// Fd is a descriptor that polls readable while a frame waits (or
	// the device is closed): what a loop sleeps on in ppoll(2).
	Fd() int
	// Write writes the frames bufs[i][offset:], batching them into as few
	// syscalls as the device allows, and returns how many it wrote. The
	// bytes in front of offset (Headroom of them) may be overwritten.
	Write(bufs [][]byte, offset int) (int, error)
	// Name is the interface name.
	Name() string
	// MTU is the interface MTU.
	MTU() int
	// Close releases the device; a TAP device disappears with it.
	Close() error
}

// Errors of the package.
var (
	// ErrClosed: the device was closed.
	ErrClosed = errors.New("tap: device closed")
	// ErrOffset: the offset leaves less than Headroom in front of a frame.
	ErrOffset = errors.New("tap: offset smaller than the headroom")
	// ErrShortBuffer: a buffer cannot hold the frame.
	ErrShortBuffer = errors.New("tap: buffer too small for the frame")
)
