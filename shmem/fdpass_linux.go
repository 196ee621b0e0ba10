//go:build linux

package shmem

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"
)

// MaxFds is the largest number of descriptors one message may carry
// (the kernel's SCM_MAX_FD).
const MaxFds = 253

// SendMsg sends msg with the descriptors fds attached (SCM_RIGHTS) over c.
// The descriptors stay open in the sender. msg must not be empty: a stream
// socket cannot carry descriptors without data, and an empty message reads
// as end of file on the other side. On a
// stream socket a message the kernel accepts only partly is completed with
// further writes; the descriptors travel with its first byte. SOCK_SEQPACKET
// sockets keep message boundaries and are the better choice for a control
// protocol.
func SendMsg(c *net.UnixConn, msg []byte, fds ...int) error {
	if len(msg) == 0 {
		return errors.New("shmem: SendMsg: empty message")
	}
	if len(fds) > MaxFds {
		return fmt.Errorf("shmem: SendMsg: %d descriptors, at most %d", len(fds), MaxFds)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("shmem: SendMsg: %w", err)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	for sent := 0; sent < len(msg); {
		var n int
		var serr error
		err := rc.Write(func(fd uintptr) bool {
			for {
				n, serr = unix.SendmsgN(int(fd), msg[sent:], oob, nil, unix.MSG_NOSIGNAL)
				switch serr {
				case unix.EINTR:
					continue
				case unix.EAGAIN:
					return false
				}
				return true
			}
		})
		if err == nil {
			err = serr
		}
		if err != nil {
			return fmt.Errorf("shmem: SendMsg (%d of %d bytes sent, %d fds): %w", sent, len(msg), len(fds), err)
		}
		if n <= 0 {
			return fmt.Errorf("shmem: SendMsg: sendmsg sent %d bytes: %w", n, io.ErrShortWrite)
		}
		sent += n
		oob = nil // the descriptors went with the first chunk
	}
	return nil
}

// RecvMsg receives one message from c into buf, accepting up to maxFds
// descriptors (at most MaxFds). Received descriptors are close-on-exec
// (MSG_CMSG_CLOEXEC) and belong to the caller.
//
// It returns io.EOF when the peer has closed the connection (no data and no
// descriptors). If the peer sent more than maxFds descriptors, or the kernel
// truncated the control data, or a datagram did not fit in buf, every
// descriptor that arrived is closed and the error wraps ErrTruncated; n still
// reports the bytes read. On a stream socket a message may arrive in pieces
// (a short read is not an error) and descriptors arrive with the first byte
// of the message they were sent with.
func RecvMsg(c *net.UnixConn, buf []byte, maxFds int) (n int, fds []int, err error) {
	if len(buf) == 0 {
		return 0, nil, errors.New("shmem: RecvMsg: empty buffer")
	}
	if maxFds < 0 || maxFds > MaxFds {
		return 0, nil, fmt.Errorf("shmem: RecvMsg: maxFds %d not in [0, %d]", maxFds, MaxFds)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, nil, fmt.Errorf("shmem: RecvMsg: %w", err)
	}
	var oob []byte
	if maxFds > 0 {
		oob = make([]byte, unix.CmsgSpace(4*maxFds))
	}
	var oobn, flags int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		for {
			n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_CMSG_CLOEXEC)
			switch rerr {
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return false
			}
			return true
		}
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, nil, fmt.Errorf("shmem: RecvMsg: %w", err)
	}
	if oobn < 0 || oobn > len(oob) || n < 0 || n > len(buf) {
		return 0, nil, fmt.Errorf("shmem: RecvMsg: recvmsg returned %d data and %d control bytes", n, oobn)
	}
	fds, perr := parseRights(oob[:oobn])
	switch {
	case perr != nil:
		err = fmt.Errorf("shmem: RecvMsg: %w", perr)
	case flags&unix.MSG_CTRUNC != 0:
		err = fmt.Errorf("shmem: RecvMsg: control data truncated (%d fds kept of at most %d): %w", len(fds), maxFds, ErrTruncated)
	case len(fds) > maxFds:
		err = fmt.Errorf("shmem: RecvMsg: %d fds, at most %d allowed: %w", len(fds), maxFds, ErrTruncated)
	case flags&unix.MSG_TRUNC != 0:
		err = fmt.Errorf("shmem: RecvMsg: message longer than the %d-byte buffer: %w", len(buf), ErrTruncated)
	case n == 0 && len(fds) == 0:
		return 0, nil, io.EOF
	}
	if err != nil {
		closeFds(fds)
		return n, nil, err
	}
	if len(fds) == 0 {
		fds = nil
	}
	return n, fds, nil
}

func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// cmsgAlign rounds n up to the alignment of control message headers and
// data (the size of a C long).
func cmsgAlign(n int) int {
	const a = unix.SizeofCmsghdr - 8 // the cmsg_len field is a C size_t
	return (n + a - 1) &^ (a - 1)
}

// parseRights walks the control messages in oob, as filled in by recvmsg,
// and returns the descriptors of every SCM_RIGHTS message; other control
// messages are skipped. It does not trust the lengths it reads: on malformed
// input it returns the descriptors found before the fault together with an
// error, so that the caller can close them.
func parseRights(oob []byte) (fds []int, err error) {
	const hdrLen = unix.SizeofCmsghdr
	dataOff := cmsgAlign(hdrLen)
	for len(oob) >= hdrLen {
		var l uint64
		var level, typ int32
		if hdrLen == 16 {
			l = binary.NativeEndian.Uint64(oob[0:8])
			level = int32(binary.NativeEndian.Uint32(oob[8:12]))
			typ = int32(binary.NativeEndian.Uint32(oob[12:16]))
		} else {
			l = uint64(binary.NativeEndian.Uint32(oob[0:4]))
			level = int32(binary.NativeEndian.Uint32(oob[4:8]))
			typ = int32(binary.NativeEndian.Uint32(oob[8:12]))
		}
		if l < uint64(dataOff) || l > uint64(len(oob)) {
			return fds, fmt.Errorf("control message length %d with %d bytes left", l, len(oob))
		}
		if level == unix.SOL_SOCKET && typ == unix.SCM_RIGHTS {
			data := oob[dataOff:int(l)]
			if len(data)%4 != 0 {
				return fds, fmt.Errorf("SCM_RIGHTS payload of %d bytes", len(data))
			}
			for i := 0; i < len(data); i += 4 {
				fd := int32(binary.NativeEndian.Uint32(data[i:]))
				if fd < 0 {
					return fds, fmt.Errorf("SCM_RIGHTS carries descriptor %d", fd)
				}
				fds = append(fds, int(fd))
			}
		}
		next := cmsgAlign(int(l))
		if next >= len(oob) {
			return fds, nil
		}
		oob = oob[next:]
	}
	if len(oob) != 0 {
		return fds, fmt.Errorf("%d stray bytes after the last control message", len(oob))
	}
	return fds, nil
}
