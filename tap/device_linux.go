package tap

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/internal/spin"
)

// Config describes a TAP device to create.
type Config struct {
	// Name of the interface (at most 15 bytes).
	Name string
	// Netns is the path of the network namespace to create it in
	// (/var/run/netns/NAME, /proc/PID/ns/net); empty means the caller's.
	Netns string
	// MAC, when set, becomes the interface's address.
	MAC net.HardwareAddr
	// MTU, when non-zero, becomes the interface's MTU.
	MTU int
	// TxQueueLen, when non-zero, becomes the interface's transmit queue
	// length: how many frames (or super-frames) the kernel holds for the
	// reader before it drops (default 1000).
	TxQueueLen int
	// Offload asks for a virtio-net header with checksum and UDP
	// segmentation offloads, so that writes and reads carry UDP GSO
	// super-frames. A kernel that refuses falls back to one frame per
	// syscall; Offloaded tells which one the device got.
	Offload bool
	// MultiQueue opens the device with IFF_MULTI_QUEUE.
	MultiQueue bool
	// Unpolled keeps the descriptor out of the Go runtime's poller: only
	// a loop that polls it itself (TryReadEach, Fd) reads such a device.
	Unpolled bool
	// Down leaves the interface down.
	Down bool
}

// Tap is a Linux TAP device. Read and Write may be called from different
// goroutines; concurrent Writes are serialised.
type Tap struct {
	file      *os.File
	fd        int
	name      string
	mtu       int
	offloaded bool
	unpolled  bool // out of the runtime's poller (Config.Unpolled)

	wmu   sync.Mutex
	super []byte   // virtio-net header and headers of a super-frame
	one   [][]byte // scratch for single-frame writes
	raw   syscall.RawConn
	iov   []unix.Iovec // writev: the headers, then each frame's payload
	iovN  int
	wvN   int
	wvErr syscall.Errno
	wvFn  func(uintptr) bool

	rmu    sync.Mutex
	rbuf   []byte // whole read, header included, when offloaded
	rdst   []byte // the buffer of the read in progress
	rn     int
	rerr   error
	rFn    func(uintptr) bool // readRaw
	rNowFn func(uintptr) bool // readNow
	spin   atomic.Int64       // ns a read busy-polls before it sleeps; <0: forever
	closed atomic.Bool
}

// tunPath is the clone device.
const tunPath = "/dev/net/tun"

// maxSuper is the largest super-frame: an IP datagram of 64 KiB plus the
// Ethernet header.
const maxSuper = 14 + 65535

// Create creates the TAP device described by cfg, sets its MAC and MTU and
// brings it up, all inside cfg.Netns. The device disappears when the Tap is
// closed.
func Create(cfg Config) (*Tap, error) {
	if cfg.Name == "" || len(cfg.Name) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("tap: invalid interface name %q", cfg.Name)
	}
	var t *Tap
	err := netnsutil.Do(cfg.Netns, func(h *netlink.Handle) error {
		var err error
		t, err = open(cfg)
		if err != nil {
			return err
		}
		if err := configure(h, cfg); err != nil {
			t.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("tap: %w", err)
	}
	if cfg.MTU != 0 {
		t.mtu = cfg.MTU
	}
	return t, nil
}

// open opens the clone device and attaches it to the interface, with the
// offloads when asked and allowed.
func open(cfg Config) (*Tap, error) {
	if cfg.Offload {
		t, err := openFlags(cfg, unix.IFF_VNET_HDR)
		if err == nil {
			const offloads = unix.TUN_F_CSUM | unix.TUN_F_USO4 | unix.TUN_F_USO6
			if err = unix.IoctlSetInt(t.fd, unix.TUNSETOFFLOAD, offloads); err == nil {
				t.offloaded = true
				t.super = make([]byte, Headroom+256)
				t.rbuf = make([]byte, Headroom+maxSuper)
				t.iov = make([]unix.Iovec, 1+maxSegments)
				t.wvFn = t.writev
				return t, nil
			}
			t.file.Close()
		}
		// Fall through: a kernel without USO gets one frame per syscall.
	}
	return openFlags(cfg, 0)
}

func openFlags(cfg Config, extra uint16) (*Tap, error) {
	oflags := unix.O_RDWR | unix.O_CLOEXEC | unix.O_NONBLOCK
	if cfg.Unpolled {
		oflags &^= unix.O_NONBLOCK
	}
	fd, err := unix.Open(tunPath, oflags, 0)
	if err != nil {
		return nil, fmt.Errorf("tap: opening %s: %w", tunPath, err)
	}
	ifr, err := unix.NewIfreq(cfg.Name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tap: %w", err)
	}
	flags := uint16(unix.IFF_TAP|unix.IFF_NO_PI) | extra
	if cfg.MultiQueue {
		flags |= unix.IFF_MULTI_QUEUE
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tap: creating %s: %w", cfg.Name, err)
	}
	if extra&unix.IFF_VNET_HDR != 0 {
		if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, VirtioNetHdrLen); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("tap: setting the virtio-net header size: %w", err)
		}
	}
	// A non-blocking fd in os.File goes through the runtime poller, so a
	// sleeping Read returns when the file is closed. The fd stays
	// non-blocking: reads busy-poll it (SetSpin) or wait in the poller.
	t := &Tap{file: os.NewFile(uintptr(fd), tunPath), fd: fd, name: ifr.Name(), mtu: 1500, one: make([][]byte, 1)}
	if cfg.Unpolled {
		// Opened blocking, the file stays out of the runtime's poller; the
		// descriptor is made non-blocking only now.
		if err := unix.SetNonblock(fd, true); err != nil {
			t.file.Close()
			return nil, fmt.Errorf("tap: %w", err)
		}
		t.unpolled = true
	}
	t.rFn, t.rNowFn = t.readRaw, t.readNow
	if t.raw, err = t.file.SyscallConn(); err != nil {
		t.file.Close()
		return nil, fmt.Errorf("tap: %w", err)
	}
	return t, nil
}

func configure(h *netlink.Handle, cfg Config) error {
	link, err := h.LinkByName(cfg.Name)
	if err != nil {
		return fmt.Errorf("tap: finding %s: %w", cfg.Name, err)
	}
	if len(cfg.MAC) != 0 {
		if err := h.LinkSetHardwareAddr(link, cfg.MAC); err != nil {
			return fmt.Errorf("tap: setting MAC of %s: %w", cfg.Name, err)
		}
	}
	if cfg.MTU != 0 {
		if err := h.LinkSetMTU(link, cfg.MTU); err != nil {
			return fmt.Errorf("tap: setting MTU of %s to %d: %w", cfg.Name, cfg.MTU, err)
		}
	}
	if cfg.TxQueueLen != 0 {
		if err := h.LinkSetTxQLen(link, cfg.TxQueueLen); err != nil {
			return fmt.Errorf("tap: setting the queue length of %s to %d: %w", cfg.Name, cfg.TxQueueLen, err)
		}
	}
	if !cfg.Down {
		if err := h.LinkSetUp(link); err != nil {
			return fmt.Errorf("tap: bringing %s up: %w", cfg.Name, err)
		}
	}
	return nil
}

// Offloaded reports whether the device carries virtio-net headers and UDP
// GSO super-frames.
func (t *Tap) Offloaded() bool { return t.offloaded }

// Fd returns the device's descriptor, for a loop that polls it
// (Config.Unpolled).
func (t *Tap) Fd() int { return t.fd }

// Unpolled reports whether the device was opened with Config.Unpolled.
func (t *Tap) Unpolled() bool { return t.unpolled }

// Name implements Device.
func (t *Tap) Name() string { return t.name }

// MTU implements Device.
func (t *Tap) MTU() int { return t.mtu }

// BatchSize implements Device: one frame per read without offloads, the
// segments of one super-frame with them.
func (t *Tap) BatchSize() int {
	if t.offloaded {
		return maxReadSegments
	}
	return 1
}

// Close implements Device.
func (t *Tap) Close() error {
	t.closed.Store(true)
	return t.file.Close()
}

// SetSpin sets how reads wait for frames: a read that finds the device
// empty busy-polls it for d before it sleeps in the runtime's poller; 0
// sleeps at once, a negative d never sleeps (a core per reader, for the
// lowest latency). It may be called while a read waits; that read
// follows the new setting at its next poll.
func (t *Tap) SetSpin(d time.Duration) { t.spin.Store(int64(d)) }

// read reads one frame or super-frame into b, waiting as SetSpin says.
func (t *Tap) read(b []byte) (int, error) { return t.readWith(b, t.rFn) }

// readWith reads into b with raw read function fn (readRaw or readNow).
func (t *Tap) readWith(b []byte, fn func(uintptr) bool) (int, error) {
	if len(b) == 0 {
		return 0, ErrShortBuffer
	}
	t.rdst = b
	err := t.raw.Read(fn)
	t.rdst = nil
	if err != nil {
		if t.closed.Load() {
			return 0, ErrClosed
		}
		return 0, mapClosed(err)
	}
	if t.rerr != nil {
		return 0, t.rerr
	}
	return t.rn, nil
}

// errEmpty is readNow's report that nothing was waiting.
var errEmpty = errors.New("tap: nothing to read")

// readNow is the raw read of TryReadEach: one read, never a wait.
func (t *Tap) readNow(fd uintptr) bool {
	n, _, e := unix.Syscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&t.rdst[0])), uintptr(len(t.rdst)))
	switch e {
	case 0:
		t.rn, t.rerr = int(n), nil
	case unix.EAGAIN, unix.EINTR:
		t.rn, t.rerr = 0, errEmpty
		if t.closed.Load() {
			t.rerr = ErrClosed
		}
	default:
		t.rn, t.rerr = 0, fmt.Errorf("tap: read: %w", e)
	}
	return true
}

// readRaw is the raw read of read: it returns false to sleep in the
// poller until the device is readable, after busy-polling as long as
// SetSpin says.
func (t *Tap) readRaw(fd uintptr) bool {
	var start time.Time
	var sp spin.Spinner
	for polls := 0; ; polls++ {
		n, _, e := unix.Syscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&t.rdst[0])), uintptr(len(t.rdst)))
		switch e {
		case 0:
			t.rn, t.rerr = int(n), nil
			return true
		case unix.EAGAIN, unix.EINTR:
		default:
			t.rn, t.rerr = 0, fmt.Errorf("tap: read: %w", e)
			return true
		}
		budget := t.spin.Load()
		if budget == 0 {
			return false
		}
		if t.closed.Load() {
			t.rn, t.rerr = 0, ErrClosed
			return true
		}
		if budget > 0 {
			if polls == 0 {
				start = time.Now()
			} else if time.Since(start) > time.Duration(budget) {
				return false
			}
		}
		sp.Idle()
	}
}

func mapClosed(err error) error {
	if errors.Is(err, os.ErrClosed) {
		return ErrClosed
	}
	return err
}

// Read implements Device. With offloads, one read may return a UDP GSO
// super-frame, which is split into its datagrams.
func (t *Tap) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if !t.offloaded {
		n, err := t.read(bufs[0][offset:])
		if err != nil {
			return 0, err
		}
		sizes[0] = n
		return 1, nil
	}
	t.rmu.Lock()
	defer t.rmu.Unlock()
	h, frame, err := t.readOffloaded(t.rFn)
	if err != nil {
		return 0, err
	}
	return SplitUSO(&h, frame, bufs, sizes, offset)
}

// readOffloaded reads one frame or super-frame with its virtio-net header
// into rbuf, with raw read function fn. t.rmu is held.
func (t *Tap) readOffloaded(fn func(uintptr) bool) (VirtioNetHdr, []byte, error) {
	var h VirtioNetHdr
	n, err := t.readWith(t.rbuf, fn)
	if err != nil {
		return h, nil, err
	}
	if n < VirtioNetHdrLen {
		return h, nil, fmt.Errorf("tap: read %d bytes, shorter than the virtio-net header", n)
	}
	if err := h.Decode(t.rbuf[:VirtioNetHdrLen]); err != nil {
		return h, nil, err
	}
	return h, t.rbuf[VirtioNetHdrLen:n], nil
}

// ReadEach reads once and hands fn every frame of what it read — the
// datagrams of a UDP GSO super-frame cut in place (SplitUSOEach), with no
// copy. fn must not keep the slice. Without offloads it reads one frame.
func (t *Tap) ReadEach(fn func(frame []byte)) (int, error) { return t.readEach(fn, t.rFn) }

// TryReadEach is ReadEach that never waits: when no frame is waiting it
// returns 0 and no error at once, whatever SetSpin says. It is the read of
// a loop that polls many sources (spin.Loop).
func (t *Tap) TryReadEach(fn func(frame []byte)) (int, error) {
	n, err := t.readEach(fn, t.rNowFn)
	if err == errEmpty {
		return 0, nil
	}
	return n, err
}

func (t *Tap) readEach(fn func(frame []byte), raw func(uintptr) bool) (int, error) {
	t.rmu.Lock()
	defer t.rmu.Unlock()
	if !t.offloaded {
		if t.rbuf == nil {
			t.rbuf = make([]byte, maxSuper)
		}
		n, err := t.readWith(t.rbuf, raw)
		if err != nil {
			return 0, err
		}
		fn(t.rbuf[:n])
		return 1, nil
	}
	h, frame, err := t.readOffloaded(raw)
	if err != nil {
		return 0, err
	}
	return SplitUSOEach(&h, frame, fn)
}

// Write implements Device. With offloads, runs of RoCE frames of one flow
// (equal sizes, consecutive IP IDs) go out as one UDP GSO super-frame each,
// every other frame with an empty virtio-net header; without, one frame
// per syscall.
func (t *Tap) Write(bufs [][]byte, offset int) (int, error) {
	if !t.offloaded {
		for i, b := range bufs {
			if _, err := t.file.Write(b[offset:]); err != nil {
				return i, mapClosed(err)
			}
		}
		return len(bufs), nil
	}
	if offset < Headroom {
		return 0, ErrOffset
	}
	t.wmu.Lock()
	defer t.wmu.Unlock()
	frames := t.one[:0]
	defer func() { t.one = frames[:0] }()
	written := 0
	for written < len(bufs) {
		frames = frames[:0]
		for _, b := range bufs[written:min(len(bufs), written+maxSegments)] {
			frames = append(frames, b[offset:])
		}
		k := CoalesceRun(frames, maxSegments)
		if k <= 1 {
			b := bufs[written]
			var h VirtioNetHdr
			h.Encode(b[offset-VirtioNetHdrLen : offset])
			if _, err := t.file.Write(b[offset-VirtioNetHdrLen:]); err != nil {
				return written, mapClosed(err)
			}
			written++
			continue
		}
		// One writev: the virtio-net header and the super-frame's headers,
		// then the payload of each frame where it lies — no copy.
		hl, h, err := CoalesceHeader(t.super[VirtioNetHdrLen:], frames[:k])
		if err != nil {
			return written, err
		}
		h.Encode(t.super[:VirtioNetHdrLen])
		t.iov[0].Base = &t.super[0]
		t.iov[0].SetLen(VirtioNetHdrLen + hl)
		t.iovN = 1
		for _, f := range frames[:k] {
			if len(f) > hl {
				t.iov[t.iovN].Base = &f[hl]
				t.iov[t.iovN].SetLen(len(f) - hl)
				t.iovN++
			}
		}
		if err := t.raw.Write(t.wvFn); err != nil {
			return written, mapClosed(err)
		}
		if t.wvErr != 0 {
			return written, fmt.Errorf("tap: writev: %w", t.wvErr)
		}
		written += k
	}
	return written, nil
}

// writev is the raw write of a gathered super-frame; it returns false to
// wait for the device to take more (EAGAIN).
func (t *Tap) writev(fd uintptr) bool {
	n, _, e := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&t.iov[0])), uintptr(t.iovN))
	if e == unix.EAGAIN {
		return false
	}
	t.wvN, t.wvErr = int(n), e
	return true
}

// maxSegments bounds the datagrams of one super-frame we write (older
// kernels take at most 64); maxReadSegments those of one we read (newer
// kernels let other writers send up to 128).
const (
	maxSegments     = MaxGSOSegments
	maxReadSegments = 128
)
