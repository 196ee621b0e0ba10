package impair

import (
	"encoding/binary"
	"math"
	"math/bits"
	"time"
)

// The link model: one sender of Spec.Rate bits/s fed by a FIFO of at most
// QueueLimit bytes, in the fluid form netem's rate uses. The backlog at time
// t, the bytes given to the link and not yet sent, is (end − t) × Rate / 8
// where end is when the link will have sent everything; a frame of n bytes
// that finds backlog + n over the limit is dropped (drop-tail), else the link
// sends it from max(t, end) on and end moves n×8/Rate later. Because the
// backlog follows from end alone, the queue needs no list of its own: its
// frames are the held frames in the delayed queue, due when they are sent.

const (
	// byteNs is bits per byte × nanoseconds per second: n bytes take
	// n × byteNs / Rate ns on the link.
	byteNs = 8 * uint64(time.Second)
	// maxTransmit caps one frame's time on the link (about 13 days), far
	// beyond any rate worth modelling, so that the link's end stays a
	// time.Time that Add and Sub handle whatever the Rate.
	maxTransmit = 1 << 50
	// linkSlack is room for one more frame than the link holds: the arena
	// is a ring, and a frame that does not fit at its end goes to its start,
	// leaving up to a frame's worth of bytes unused for a while.
	linkSlack = 64 << 10
	// linkFrameBytes is the frame length the default Limits assume when
	// they count the link's bytes in frames: the shortest Ethernet frame
	// without its FCS (a RoCE ACK is 62 bytes), so that a queue full of
	// ACKs fits too.
	linkFrameBytes = 60
)

// Ethernet II and IP fields markCE reads.
const (
	ethHeaderLen  = 14
	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86dd
	ipv4MinHeader = 20
	ipv6Header    = 40

	// ECN codepoints (RFC 3168): the two low bits of IPv4's TOS byte and of
	// IPv6's traffic class.
	ecnECT1 = 0b01
	ecnECT0 = 0b10
	ecnCE   = 0b11
)

// linkBytes returns the most bytes spec's link holds at once, plus
// linkSlack: what waits in its queue, and what it has sent during the Delay
// that follows; at most MaxHeldBytes, and 0 without a Rate.
func linkBytes(spec Spec) int {
	if spec.Rate == 0 {
		return 0
	}
	hi, lo := bits.Mul64(spec.Rate, uint64(spec.Delay))
	delayed := uint64(MaxHeldBytes)
	if hi < byteNs {
		delayed, _ = bits.Div64(hi, lo, byteNs)
	}
	return int(min(spec.QueueLimit()+min(delayed, MaxHeldBytes)+linkSlack, MaxHeldBytes))
}

// linkTime returns the time the link runs on for an event at t: t, or the
// latest time it has seen when t is earlier.
func (im *Impairer) linkTime(t time.Time) time.Time {
	if t.After(im.linkAt) {
		im.linkAt = t
	}
	return im.linkAt
}

// applyLink is Apply's second half with a Rate: frame, past loss and the
// random faults, waits for a successor when reordered, else enters the link,
// and the frames waiting for a successor follow it in. Then what the link
// has sent by now goes out, in case a frame took less than a nanosecond.
func (im *Impairer) applyLink(frame []byte, now time.Time, flipAt int, flip byte, dup, reorder bool, emit func([]byte)) {
	at := im.linkTime(now)
	if reorder {
		if i, ok := im.store(frame); ok {
			h := &im.slots[i]
			h.at, h.flipAt, h.flip, h.dup = now, flipAt, flip, dup
			h.due = now.Add(im.hold)
			im.reordered.Add(1)
			im.pending.push(i)
			return
		}
	} else {
		backlog, ok, dupOK := im.admit(at, len(frame), dup)
		if !ok {
			return // the frames waiting for a successor wait on
		}
		dup = dupOK
		if i, ok := im.store(frame); ok {
			h := &im.slots[i]
			h.at, h.flipAt, h.flip, h.dup = now, flipAt, flip, dup
			im.send(i, at, backlog)
			im.pendingToLink(at)
			im.Flush(now, emit)
			return
		}
	}
	im.overflowed.Add(1)
	emitFrame(frame, flipAt, flip, dup, emit)
	im.pendingToLink(at)
	im.Flush(now, emit)
}

// pendingToLink lets the frames waiting for a successor enter the link at
// time at, in their order, right behind the frame that just did.
func (im *Impairer) pendingToLink(at time.Time) {
	for {
		p, ok := im.pending.peek()
		if !ok {
			return
		}
		im.pending.pop()
		im.enterLink(p, at)
	}
}

// enterLink puts held frame i into the link at time at, or frees it when
// the queue has no room for it.
func (im *Impairer) enterLink(i int, at time.Time) {
	h := &im.slots[i]
	backlog, ok, dup := im.admit(at, h.n, h.dup)
	if !ok {
		im.free(i)
		return
	}
	h.dup = dup
	im.send(i, at, backlog)
}

// admit decides at time at whether a frame of n bytes, and its duplicate
// when dup, fit into the queue: the frame when backlog + n ≤ QueueLimit, its
// duplicate when backlog + 2n ≤ QueueLimit. What does not fit is counted in
// QueueDropped. It returns the backlog the frame finds, for send.
func (im *Impairer) admit(at time.Time, n int, dup bool) (backlog uint64, ok, dupOK bool) {
	backlog = im.backlog(at)
	var room uint64
	if backlog < im.queueLimit {
		room = im.queueLimit - backlog
	}
	switch size := uint64(n); {
	case size > room:
		if dup {
			im.queueDropped.Add(2)
		} else {
			im.queueDropped.Add(1)
		}
		return backlog, false, false
	case dup && size > room-size: // 2n > room without overflow: n ≤ room
		im.queueDropped.Add(1)
		dup = false
	}
	return backlog, true, dup
}

// send puts held frame i, admitted at time at behind backlog bytes, on the
// link: marked CE when backlog ≥ ECN, due when the link has sent it (and its
// duplicate) plus Delay. The link's end only moves later, so the delayed
// queue stays in order.
func (im *Impairer) send(i int, at time.Time, backlog uint64) {
	h := &im.slots[i]
	if im.spec.ECN > 0 && backlog >= im.spec.ECN && markCE(im.arena[h.off:h.off+h.n]) {
		im.marked.Add(1)
	}
	n := uint64(h.n)
	if h.dup {
		n *= 2
	}
	sent := im.transmit(at, n)
	if im.spec.Delay > 0 {
		im.delayedN.Add(1)
	}
	im.enqueueDelayed(i, sent.Add(im.spec.Delay))
}

// backlog returns the bytes the link has not yet sent at time at:
// (busyUntil + busyFrac/Rate ns − at) × Rate / 8, rounded down, 0 when idle
// and MaxUint64 when that does not fit.
func (im *Impairer) backlog(at time.Time) uint64 {
	d := im.busyUntil.Sub(at)
	if d < 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(d), im.spec.Rate)
	lo, carry := bits.Add64(lo, im.busyFrac, 0)
	hi += carry
	if hi >= byteNs {
		return math.MaxUint64
	}
	q, _ := bits.Div64(hi, lo, byteNs)
	return q
}

// transmit gives the link n bytes at time at and returns when it will have
// sent them, rounded up to the nanosecond: it starts on them at at when idle,
// else when it has sent what it has. The remainder below a nanosecond is
// kept in busyFrac, so that the link keeps exactly to Rate over any number
// of frames.
func (im *Impairer) transmit(at time.Time, n uint64) time.Time {
	if im.busyUntil.Before(at) {
		im.busyUntil, im.busyFrac = at, 0
	}
	rate := im.spec.Rate
	hi, lo := bits.Mul64(n, byteNs)
	lo, carry := bits.Add64(lo, im.busyFrac, 0)
	hi += carry
	ns, frac := uint64(maxTransmit), uint64(0)
	if hi < rate {
		if q, r := bits.Div64(hi, lo, rate); q < maxTransmit {
			ns, frac = q, r
		}
	}
	im.busyUntil = im.busyUntil.Add(time.Duration(ns))
	im.busyFrac = frac
	if frac > 0 {
		return im.busyUntil.Add(1)
	}
	return im.busyUntil
}

// markCE sets the ECN field of frame's IP header to CE (0b11) when it is
// ECT(0) or ECT(1), and reports whether it did. frame is an Ethernet II
// frame; one with a VLAN tag, one too short for its IP header and one that
// is not IPv4 or IPv6 is left alone. So are Not-ECT frames, whose ends do
// not understand ECN (a RED queue marks only ECN-capable ones, RFC 3168
// §5, and merely queues the rest), and frames already CE. IPv4's header
// checksum is updated incrementally (RFC 1624, eqn. 3), so that a header
// whose checksum was wrong stays wrong by the same amount, and a receiver
// still sees the damage. Nothing else needs updating: UDP's pseudo-header
// leaves out the TOS and traffic class, and RoCEv2's ICRC masks them (and
// IPv4's checksum), as routers may change them.
func markCE(frame []byte) bool {
	if len(frame) < ethHeaderLen {
		return false
	}
	ip := frame[ethHeaderLen:]
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case etherTypeIPv4:
		if len(ip) < ipv4MinHeader || ip[0]>>4 != 4 {
			return false
		}
		if ihl := int(ip[0]&0x0f) * 4; ihl < ipv4MinHeader || len(ip) < ihl {
			return false
		}
		if ecn := ip[1] & 0b11; ecn != ecnECT0 && ecn != ecnECT1 {
			return false
		}
		old := binary.BigEndian.Uint16(ip[0:2]) // version, IHL, TOS
		ip[1] |= ecnCE
		sum := uint32(^binary.BigEndian.Uint16(ip[10:12])) + uint32(^old) + uint32(old|ecnCE)
		sum = sum&0xffff + sum>>16
		sum = sum&0xffff + sum>>16
		binary.BigEndian.PutUint16(ip[10:12], ^uint16(sum))
		return true
	case etherTypeIPv6:
		if len(ip) < ipv6Header || ip[0]>>4 != 6 {
			return false
		}
		// The traffic class is the low nibble of byte 0 and the high nibble
		// of byte 1; its ECN bits are bits 5 and 4 of byte 1.
		if ecn := ip[1] >> 4 & 0b11; ecn != ecnECT0 && ecn != ecnECT1 {
			return false
		}
		ip[1] |= ecnCE << 4
		return true
	}
	return false
}
