package roce

import "errors"

// Sentinel errors returned by Parse and the length checks. Each names the
// check that failed, so callers can count drops by reason with errors.Is or a
// plain comparison; none of them allocates.
var (
	// ErrNotRoCE: the frame is not IPv4/IPv6 + UDP to port 4791. Not an
	// error for a station, which hands such frames to its other handlers.
	ErrNotRoCE = errors.New("roce: not a RoCEv2 frame")
	// ErrTruncated: the frame ends before a header that must be there.
	ErrTruncated = errors.New("roce: frame truncated")
	// ErrIPVersion: the IP version nibble disagrees with the EtherType.
	ErrIPVersion = errors.New("roce: IP version does not match EtherType")
	// ErrIPv4Options: the IPv4 header carries options (IHL != 5); RoCEv2
	// packets never do and the ICRC rules assume a 20-byte header.
	ErrIPv4Options = errors.New("roce: IPv4 header has options")
	// ErrFragment: an IPv4 fragment (MF set or non-zero offset). RoCEv2
	// is sent with DF set and is never fragmented.
	ErrFragment = errors.New("roce: IPv4 fragment")
	// ErrIPChecksum: the IPv4 header checksum is wrong.
	ErrIPChecksum = errors.New("roce: bad IPv4 header checksum")
	// ErrLength: the IP and UDP length fields disagree with each other or
	// with the frame.
	ErrLength = errors.New("roce: IP/UDP lengths disagree with the frame")
	// ErrTVer: the BTH transport header version is not 0 (IBA 9.2.4).
	ErrTVer = errors.New("roce: unsupported BTH transport version")
	// ErrOpcode: the BTH opcode is not one taproce knows (RD and XRC
	// opcodes, reserved values).
	ErrOpcode = errors.New("roce: unknown or unsupported opcode")
	// ErrHeaderLength: the packet is too short for the extension headers
	// and ICRC its opcode requires.
	ErrHeaderLength = errors.New("roce: packet too short for its opcode's headers")
	// ErrPadCount: the BTH pad count is larger than the bytes between the
	// headers and the ICRC.
	ErrPadCount = errors.New("roce: pad count beyond the payload")
	// ErrUnexpectedPayload: an opcode that carries no payload (ACK, READ
	// request, atomic) has payload bytes.
	ErrUnexpectedPayload = errors.New("roce: payload on an opcode without one")
	// ErrPayloadLength: the payload length breaks the IBA rule for its
	// position in the message (IBA 9.7.7, C9-33…C9-36): FIRST and MIDDLE
	// packets carry exactly the path MTU, LAST 1…MTU, ONLY 0…MTU.
	ErrPayloadLength = errors.New("roce: payload length breaks the path MTU rules")
	// ErrICRC: the invariant CRC does not match.
	ErrICRC = errors.New("roce: bad ICRC")
	// ErrAddress: Encode was given source or destination addresses that
	// do not match the packet's IP version.
	ErrAddress = errors.New("roce: addresses do not match the IP version")
	// ErrBufferTooSmall: Encode or Build was given a buffer too small for
	// the frame.
	ErrBufferTooSmall = errors.New("roce: buffer too small for the frame")
)
