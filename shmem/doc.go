// Package shmem is the data path between a client process and the appliance:
// memfd-backed shared memory regions, single-producer/single-consumer rings laid
// out inside them, eventfd doorbells for the moments a side is asleep, and
// passing file descriptors over unix sockets with SCM_RIGHTS.
//
// The other process is not trusted. Everything read from shared memory or from
// a socket written by the peer is validated: malformed input yields an error
// (often wrapping one of the sentinel errors below), never a panic, an
// out-of-bounds access or a hang. In particular [MapRegion] refuses memfds
// that the peer could shrink under the mapping, [AttachRing] validates the
// header, and a [Ring] checks every index the peer publishes.
//
// # Ring layout
//
// A ring occupies [RingBytes](slots, slotSize) bytes, normally inside a
// [Region] shared by both processes. All integers are in host byte order (both
// sides run on one machine); indices and flags are accessed atomically. The
// first byte of the ring must be 8-byte aligned (64-byte alignment keeps the
// index words on cache lines of their own; offsets inside a page-aligned
// [Region] that are multiples of 64 give both).
//
//	offset  size  field
//	     0     4  magic "TRNG"                       ┐
//	     4     4  version (1)                        │ header, written once
//	     8     4  slot count n (power of two)        │ by InitRing, checked
//	    12     4  slot size s (multiple of 8)        │ by AttachRing
//	    16    48  reserved, zero                     ┘
//	    64     8  producer index  (uint64, free-running; written by the producer only)
//	    72    56  unused: the producer index owns this cache line
//	   128     8  consumer index  (uint64, free-running; written by the consumer only)
//	   136    56  unused: the consumer index owns this cache line
//	   192     4  consumer sleeps: set by the consumer, cleared by the producer's Commit
//	   196     4  producer waits for space: set by the producer, cleared by the consumer's Release
//	   200    56  unused
//	   256     s  slot 0
//	 256+s     s  slot 1
//	   ...
//	256+(n-1)s s  slot n-1
//
// Indices run freely (they are never reduced modulo n); slot i lives at
// 256 + (i mod n)·s. The ring is empty when the indices are equal and full
// when the producer index is n ahead. Each side keeps its own index in private
// memory and only publishes it, so a peer overwriting an index can at worst
// make the other side see an inconsistent ring, which it reports as
// [ErrCorrupt] from [Ring.Err].
//
// # Sleeping without lost wake-ups
//
// A consumer that finds the ring empty calls [Ring.PrepareSleep], checks
// [Ring.Len] once more, and only if it is still zero waits on its
// [Doorbell]; otherwise it calls [Ring.CancelSleep] and carries on. The
// producer's [Ring.Commit] publishes the index first and then tests and
// clears the flag; it returns true when the producer must ring the doorbell.
// Because both sides store before they load (sequentially consistent atomics),
// either the consumer sees the new slot or the producer sees the flag. A
// producer waiting for space uses [Ring.PrepareSpaceWait] and
// [Ring.CancelSpaceWait] with [Ring.Free] and [Ring.Release] the same way.
// Wake-ups may be spurious; waiters always re-check the ring.
//
// Region, Doorbell and the fd passing functions are Linux only; the ring code
// itself is portable.
package shmem
