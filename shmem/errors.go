package shmem

import "errors"

// Sentinel errors. Functions wrap them with context; test with errors.Is.
var (
	// ErrSize reports a region size that is not positive, too large, or
	// different from the size of the memfd received from the peer.
	ErrSize = errors.New("shmem: bad region size")

	// ErrNotMemfd reports a file descriptor that is not a sealable shared
	// memory file (memfd), for example a pipe, a socket or a disk file.
	ErrNotMemfd = errors.New("shmem: not a memfd")

	// ErrNotSealed reports a memfd without F_SEAL_SHRINK: its owner could
	// truncate it and the mapping process would die of SIGBUS.
	ErrNotSealed = errors.New("shmem: memfd not sealed against shrinking")

	// ErrBadRing reports ring parameters or a ring header that are invalid:
	// wrong magic or version, a slot count that is not a power of two, a slot
	// size that is not a multiple of 8, a ring larger than its memory, or
	// memory that is not 8-byte aligned.
	ErrBadRing = errors.New("shmem: invalid ring")

	// ErrCorrupt reports a ring index published by the peer that is
	// inconsistent with the ring: ahead of the producer, more than the slot
	// count ahead of the consumer, or moving backwards.
	ErrCorrupt = errors.New("shmem: corrupt ring index")

	// ErrNotEventfd reports a file descriptor given as a doorbell that is
	// neither an eventfd nor the write end of a pipe.
	ErrNotEventfd = errors.New("shmem: not an eventfd or a pipe's write end")

	// ErrTruncated reports a message received with data or file descriptors
	// cut off: more descriptors than the caller allowed, a control message
	// truncated by the kernel, or a datagram longer than the buffer. Any
	// descriptors that did arrive have been closed.
	ErrTruncated = errors.New("shmem: message truncated")
)
