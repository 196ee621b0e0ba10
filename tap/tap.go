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

// Device is a source and sink of Ethernet frames.
type Device interface {
	// Read reads one or more frames: frame i into bufs[i][offset:] with its
	// length in sizes[i]. It returns how many it read. It blocks until at
	// least one frame arrives or the device is closed (ErrClosed).
	Read(bufs [][]byte, sizes []int, offset int) (int, error)
	// Write writes the frames bufs[i][offset:], batching them into as few
	// syscalls as the device allows, and returns how many it wrote. The
	// bytes in front of offset (Headroom of them) may be overwritten.
	Write(bufs [][]byte, offset int) (int, error)
	// BatchSize is the most frames one Read may return; callers size
	// bufs and sizes to it.
	BatchSize() int
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
