// Package abi is the contract between the verbs client library and the
// appliance: the control messages on the unix socket and the layout of the
// work queue, receive queue and completion queue entries in the shared
// rings. It depends on nothing else of taproce; both sides import it.
//
// # Control messages
//
// The control socket is a SOCK_SEQPACKET unix socket, so each message is
// one packet. A message is a 16-byte header and a body of header.Len bytes,
// all integers little-endian:
//
//	 0       2       4       6       8              12             16
//	+-------+-------+-------+-------+--------------+--------------+
//	| magic |version|  op   | flags |     seq      |   body len   |
//	+-------+-------+-------+-------+--------------+--------------+
//	| body: the op's request, or a reply (Errno first), or an Event |
//	+--------------------------------------------------------------+
//
// A request carries a fresh seq; its reply has the same op and seq and the
// Reply flag, and starts with an Errno (0, or a Linux errno value as
// libibverbs would return it). Events (FlagEvent) come unasked, with seq 0.
// File descriptors travel with a message as SCM_RIGHTS.
//
// # When the appliance dies
//
// The appliance says nothing when it dies (a crash, SIGKILL) or drops a
// client: the kernel closes its end of the control socket, and that end
// is the only notice a client gets. What a client sees then:
//
//   - The control socket: recvmsg returns 0 bytes and no descriptors (end
//     of file), or fails once with ECONNRESET first when the appliance
//     left messages of this client unread; poll reports POLLIN|POLLHUP
//     (and POLLRDHUP). sendmsg fails with EPIPE and raises SIGPIPE unless
//     sent with MSG_NOSIGNAL. Requests in flight get no reply.
//   - The completion channel's eventfd is never signalled again, so a
//     client asleep on it alone sleeps for good: a waiter must watch the
//     socket too, or be woken by whoever reads it (the eventfd is shared:
//     the client may write it itself).
//   - The doorbell to the appliance (the pipe's write end Open returns)
//     has no reader: writing it fails with EPIPE and raises SIGPIPE.
//   - The shared regions stay valid: they are memfd mappings the client
//     holds, whose pages live while mapped and are never truncated, so
//     reading and writing them does not fault. They stop moving: the CQ
//     rings keep the completions written before the death, and the QP
//     and SRQ state blocks keep the retire counts, so the work requests a
//     client posted and the appliance never finished are those from the
//     retired count to the number posted, still in their ring slots (a
//     queue holds at most its depth; its ring has at least as many
//     slots).
//
// The client libraries make of it what libibverbs reports for a device
// the kernel disassociated, and tell the application at once, however it
// waits: one IBV_EVENT_DEVICE_FATAL on the async event queue, after which
// reading it fails with EIO; the outstanding work requests completed
// with IBV_WC_WR_FLUSH_ERR after the ring's completions; a completion
// channel's waiter woken, given an armed CQ that has such completions,
// and then EIO; posting, arming a CQ and every request failing with EIO.
// The end of the connection does not say whether the appliance died or
// dropped the client; to the client both are the end of the device.
package abi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
)

// Magic and Version identify the protocol; a peer with another version is
// refused with EPROTO.
const (
	Magic   = 0x5254 // "TR" little-endian
	Version = 1
)

// DefaultSocket is the control socket's path when neither side is told
// another (the appliance's config socket, a client's TAPROCE_SOCKET).
const DefaultSocket = "/run/taproce/taproce.sock"

// SocketEnv names the environment variable that tells a client where the
// appliance's control socket is.
const SocketEnv = "TAPROCE_SOCKET"

// HeaderLen is the size of a message header; MaxMessage bounds a whole
// message.
const (
	HeaderLen  = 16
	MaxMessage = 64 << 10
)

// Op names a control message.
type Op uint16

// The operations.
const (
	OpListDevices Op = iota + 1
	OpOpen
	OpQueryPort
	OpAllocPD
	OpDeallocPD
	OpRegMR
	OpDeregMR
	OpCreateChannel
	OpDestroyChannel
	OpCreateCQ
	OpDestroyCQ
	OpCreateQP
	OpModifyQP
	OpQueryQP
	OpDestroyQP
	OpCreateSRQ
	OpModifySRQ
	OpDestroySRQ
	OpCreateAH
	OpDestroyAH
	OpEvent
	OpRegMRSegments
	OpCMCreateID
	OpCMDestroyID
	OpCMBind
	OpCMResolveAddr
	OpCMResolveRoute
	OpCMQuery
	OpCMListen
	OpCMConnect
	OpCMAccept
	OpCMReject
	OpCMDisconnect
	OpCMEstablish
	OpCMInitQPAttr
	OpCMEvent
	OpCMChannel
	OpCMMigrateID
	OpCMNotify
	opMax
)

var opNames = [...]string{"", "list-devices", "open", "query-port", "alloc-pd", "dealloc-pd", "reg-mr",
	"dereg-mr", "create-channel", "destroy-channel", "create-cq", "destroy-cq", "create-qp", "modify-qp",
	"query-qp", "destroy-qp", "create-srq", "modify-srq", "destroy-srq", "create-ah", "destroy-ah", "event", "reg-mr-segments",
	"cm-create-id", "cm-destroy-id", "cm-bind", "cm-resolve-addr", "cm-resolve-route", "cm-query", "cm-listen",
	"cm-connect", "cm-accept", "cm-reject", "cm-disconnect", "cm-establish", "cm-init-qp-attr", "cm-event", "cm-channel", "cm-migrate-id", "cm-notify"}

func (o Op) String() string {
	if o < opMax {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint16(o))
}

// Header flags.
const (
	FlagReply uint16 = 1
	FlagEvent uint16 = 2
)

// Header starts every message.
type Header struct {
	Magic   uint16
	Version uint16
	Op      Op
	Flags   uint16
	Seq     uint32
	Len     uint32
}

// Errors of decoding.
var (
	ErrShort   = errors.New("abi: message too short")
	ErrMagic   = errors.New("abi: not a taproce message")
	ErrVersion = errors.New("abi: protocol version mismatch")
	ErrOp      = errors.New("abi: unknown operation")
	ErrLength  = errors.New("abi: length does not match")
)

// Encode appends a message with header h (its Len is set) and body to b.
func Encode(b []byte, h Header, body any) ([]byte, error) {
	h.Magic, h.Version = Magic, Version
	n := 0
	if body != nil {
		n = binary.Size(body)
		if n < 0 {
			return nil, fmt.Errorf("abi: %T cannot be encoded", body)
		}
	}
	h.Len = uint32(n)
	b, err := binary.Append(b, binary.LittleEndian, h)
	if err != nil {
		return nil, err
	}
	if body != nil {
		if b, err = binary.Append(b, binary.LittleEndian, body); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// DecodeHeader checks a message's header and returns it with the body.
func DecodeHeader(msg []byte) (Header, []byte, error) {
	var h Header
	if len(msg) < HeaderLen {
		return h, nil, fmt.Errorf("%w: %d bytes", ErrShort, len(msg))
	}
	if _, err := binary.Decode(msg, binary.LittleEndian, &h); err != nil {
		return h, nil, fmt.Errorf("abi: header: %w", err)
	}
	switch {
	case h.Magic != Magic:
		return h, nil, fmt.Errorf("%w: magic %#04x", ErrMagic, h.Magic)
	case h.Version != Version:
		return h, nil, fmt.Errorf("%w: version %d, this side speaks %d", ErrVersion, h.Version, Version)
	case h.Op == 0 || h.Op >= opMax:
		return h, nil, fmt.Errorf("%w: %d", ErrOp, h.Op)
	case int(h.Len) != len(msg)-HeaderLen:
		return h, nil, fmt.Errorf("%w: header says %d body bytes, message has %d", ErrLength, h.Len, len(msg)-HeaderLen)
	}
	return h, msg[HeaderLen:], nil
}

// DecodeBody decodes body into v, a pointer to the op's fixed-size
// structure; the sizes must match exactly.
func DecodeBody(body []byte, v any) error {
	n := binary.Size(v)
	if n < 0 {
		return fmt.Errorf("abi: %T cannot be decoded", v)
	}
	if len(body) != n {
		return fmt.Errorf("%w: %T is %d bytes, body %d", ErrLength, v, n, len(body))
	}
	_, err := binary.Decode(body, binary.LittleEndian, v)
	return err
}

// Errno is the first field of every reply: 0, or the errno libibverbs
// would return.
type Errno int32

// Err returns the error the errno stands for, or nil.
func (e Errno) Err() error {
	if e == 0 {
		return nil
	}
	return syscall.Errno(e)
}

// ErrnoOf maps an error to an errno: a syscall.Errno in its chain, or
// EINVAL.
func ErrnoOf(err error) Errno {
	if err == nil {
		return 0
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return Errno(en)
	}
	return Errno(syscall.EINVAL)
}

// Name is a fixed-size device name.
type Name [32]byte

// MakeName returns s as a Name (cut at 31 bytes).
func MakeName(s string) Name {
	var n Name
	copy(n[:len(n)-1], s)
	return n
}

func (n Name) String() string {
	for i, c := range n {
		if c == 0 {
			return string(n[:i])
		}
	}
	return string(n[:])
}
