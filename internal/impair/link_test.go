package impair

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// ipv4Frame returns an Ethernet II frame of n bytes carrying an IPv4 header
// of ihl 32-bit words with TOS tos and a valid header checksum.
func ipv4Frame(tos byte, ihl, n int) []byte {
	b := make([]byte, n)
	copy(b[0:6], []byte{2, 0, 0, 0, 0, 2})
	copy(b[6:12], []byte{2, 0, 0, 0, 0, 1})
	binary.BigEndian.PutUint16(b[12:14], 0x0800)
	ip := b[14:]
	ip[0] = 0x40 | byte(ihl)
	ip[1] = tos
	binary.BigEndian.PutUint16(ip[2:4], uint16(n-14))
	binary.BigEndian.PutUint16(ip[4:6], 0x1234) // identification
	ip[6] = 0x40                                // DF
	ip[8], ip[9] = 64, 17                       // TTL, UDP
	copy(ip[12:16], []byte{10, 55, 0, 1})
	copy(ip[16:20], []byte{10, 55, 0, 2})
	for i := 20; i < 4*ihl; i++ {
		ip[i] = 1 // NOP options
	}
	for i := 4 * ihl; i < len(ip); i++ {
		ip[i] = byte(i)
	}
	binary.BigEndian.PutUint16(ip[10:12], ipv4Checksum(ip[:4*ihl]))
	return b
}

// ipv4Checksum computes the header checksum of h from scratch, as RFC 791
// defines it: the complement of the one's complement sum of the header's
// 16-bit words, the checksum field taken as 0.
func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		if i == 10 {
			continue
		}
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// ipv4ChecksumOK reports whether header h, checksum included, sums to
// 0xffff, as a receiver checks it.
func ipv4ChecksumOK(h []byte) bool {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return sum == 0xffff
}

// ipv6Frame returns an Ethernet II frame of n bytes carrying an IPv6 header
// with traffic class tc and flow label 0xabcde.
func ipv6Frame(tc byte, n int) []byte {
	b := make([]byte, n)
	binary.BigEndian.PutUint16(b[12:14], 0x86dd)
	ip := b[14:]
	binary.BigEndian.PutUint32(ip[0:4], 6<<28|uint32(tc)<<20|0xabcde)
	binary.BigEndian.PutUint16(ip[4:6], uint16(n-14-40))
	ip[6], ip[7] = 17, 64
	ip[8], ip[39] = 0xfd, 1
	for i := 40; i < len(ip); i++ {
		ip[i] = byte(i)
	}
	return b
}

// filler returns a frame of n bytes that is not IP (EtherType 0), so that
// it is never marked.
func filler(n int) []byte { return make([]byte, n) }

// drain flushes im at each NextDue until nothing is held and returns the
// due times it flushed at, one per emitted frame (a Flush that emits more
// than one frame repeats its time). It gives up after limit rounds.
func drain(t *testing.T, im *Impairer, r *recorder, limit int) []time.Time {
	t.Helper()
	return flushUntil(t, im, r, t0.Add(1000*time.Hour), limit)
}

// flushUntil is drain for the frames due by until: it leaves held what is
// due later, so that the next Apply at until finds nothing to release and
// every frame's time is known.
func flushUntil(t *testing.T, im *Impairer, r *recorder, until time.Time, limit int) []time.Time {
	t.Helper()
	var at []time.Time
	for range limit {
		due, ok := im.NextDue()
		if !ok || due.After(until) {
			return at
		}
		n := len(r.got)
		im.Flush(due.Add(-time.Nanosecond), r.emit)
		if len(r.got) != n {
			t.Fatalf("Flush just before NextDue() %v emitted %d frames", due.Sub(t0), len(r.got)-n)
		}
		im.Flush(due, r.emit)
		for range len(r.got) - n {
			at = append(at, due)
		}
	}
	t.Fatalf("frames still held after %d flushes", limit)
	return nil
}

// offsets returns the times in ts as offsets from t0.
func offsets(ts []time.Time) []time.Duration {
	d := make([]time.Duration, len(ts))
	for i, t := range ts {
		d[i] = t.Sub(t0)
	}
	return d
}

func TestLinkPacing(t *testing.T) {
	type arrival struct {
		at   time.Duration
		size int
	}
	us := time.Microsecond
	tests := []struct {
		name     string
		spec     Spec
		arrivals []arrival
		want     []time.Duration // when each frame leaves, in order
	}{
		{
			// 1gbit: a byte takes 8 ns.
			name:     "burst at 1gbit",
			spec:     Spec{Rate: 1e9},
			arrivals: []arrival{{0, 1500}, {0, 64}, {0, 9000}, {0, 1000}},
			want:     []time.Duration{12000, 12512, 84512, 92512},
		},
		{
			name:     "burst at 1gbit with a delay",
			spec:     Spec{Rate: 1e9, Delay: time.Millisecond},
			arrivals: []arrival{{0, 1500}, {0, 64}, {0, 9000}, {0, 1000}},
			want:     []time.Duration{1_012_000, 1_012_512, 1_084_512, 1_092_512},
		},
		{
			name:     "the link idles between spaced frames",
			spec:     Spec{Rate: 100e6}, // 80 ns a byte
			arrivals: []arrival{{0, 1000}, {100 * us, 1000}, {150 * us, 1000}, {300 * us, 1000}},
			want:     []time.Duration{80 * us, 180 * us, 260 * us, 380 * us},
		},
		{
			// 1000 bytes at 3gbit take 2666⅔ ns: each frame leaves when its
			// last bit is out, rounded up, and the thirds add up.
			name:     "fractions of a nanosecond carry",
			spec:     Spec{Rate: 3e9},
			arrivals: []arrival{{0, 1000}, {0, 1000}, {0, 1000}, {0, 1000}},
			want:     []time.Duration{2667, 5334, 8000, 10667},
		},
		{
			name:     "a clock that steps back does not refill the link",
			spec:     Spec{Rate: 1e9},
			arrivals: []arrival{{100 * us, 1000}, {0, 1000}},
			want:     []time.Duration{108 * us, 116 * us},
		},
		{
			// 100 bytes at 1tbit take 0.8 ns: a frame leaves in the
			// nanosecond its last bit does.
			name:     "frames shorter than a nanosecond",
			spec:     Spec{Rate: 1e12},
			arrivals: []arrival{{0, 100}, {0, 100}, {0, 100}, {0, 100}, {0, 100}},
			want:     []time.Duration{1, 2, 3, 4, 4},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			im := New(tt.spec)
			r := &recorder{}
			var at []time.Time
			for id, a := range tt.arrivals {
				at = append(at, flushUntil(t, im, r, t0.Add(a.at), 100)...)
				im.Apply(makeFrame(uint64(id), a.size), t0.Add(a.at), r.emit)
			}
			at = append(at, drain(t, im, r, 100)...)
			if got := offsets(at); !slices.Equal(got, tt.want) {
				t.Errorf("frames left at %v, want %v", got, tt.want)
			}
			if want := seq(0, uint64(len(tt.arrivals))); !slices.Equal(r.ids(), want) {
				t.Errorf("frames left in the order %v, want %v", r.ids(), want)
			}
			if c := im.Counters(); c.QueueDropped != 0 || c.Marked != 0 || c.Overflowed != 0 {
				t.Errorf("Counters() = %+v, want nothing dropped, marked or overflowed", c)
			}
		})
	}

	// An empty frame takes no time on an idle link: Apply emits it.
	im := New(Spec{Rate: 1e9})
	n := 0
	im.Apply(nil, t0, func(b []byte) { n++ })
	if _, held := im.NextDue(); n != 1 || held {
		t.Errorf("an empty frame on an idle link: %d emitted, held %v; want it emitted at once", n, held)
	}
}

// TestLinkLongRun: the link keeps to its rate over many frames whose time on
// it is not a whole number of nanoseconds.
func TestLinkLongRun(t *testing.T) {
	im := New(Spec{Rate: 3e9, Queue: 2 << 20})
	r := &recorder{}
	for id := range uint64(1000) {
		im.Apply(makeFrame(id, 1000), t0, r.emit)
	}
	due, ok := im.NextDue()
	if !ok || due.Sub(t0) != 2667 {
		t.Fatalf("NextDue() = %v, %v; want 2667ns", due.Sub(t0), ok)
	}
	at := drain(t, im, r, 2000)
	// 1000 frames × 1000 bytes × 8 bits / 3 Gbit/s = 2666666⅔ ns.
	if got := at[len(at)-1].Sub(t0); got != 2_666_667 {
		t.Errorf("the last frame left at %v, want 2.666667ms", got)
	}
	if len(r.got) != 1000 || im.Counters().QueueDropped != 0 {
		t.Errorf("%d frames left, counters %+v; want all 1000", len(r.got), im.Counters())
	}
}

func TestLinkQueue(t *testing.T) {
	type burst struct {
		at     time.Duration
		n      int    // frames
		size   int    // bytes each
		accept []bool // which of them the queue takes
	}
	yes, no := true, false
	us := time.Microsecond
	tests := []struct {
		name   string
		spec   Spec
		bursts []burst
	}{
		{
			// 1500 bytes take 12 µs.
			name: "three of five fit, then the queue drains",
			spec: Spec{Rate: 1e9, Queue: 4500},
			bursts: []burst{
				{0, 5, 1500, []bool{yes, yes, yes, no, no}},
				{12 * us, 2, 1500, []bool{yes, no}}, // one has gone out
				{18 * us, 1, 1500, []bool{no}},      // half of the next one is out
				{24 * us, 1, 1500, []bool{yes}},
				{time.Millisecond, 4, 1500, []bool{yes, yes, yes, no}}, // empty again
			},
		},
		{
			name: "small frames fill the gaps big ones leave",
			spec: Spec{Rate: 1e9, Queue: 4000},
			bursts: []burst{
				{0, 3, 1500, []bool{yes, yes, no}},
				{0, 3, 500, []bool{yes, yes, no}},
			},
		},
		{
			name: "a frame longer than the queue never fits",
			spec: Spec{Rate: 1e9, Queue: 1000},
			bursts: []burst{
				{0, 1, 1001, []bool{no}},
				{0, 1, 1000, []bool{yes}},
			},
		},
		{
			// The default queue: 64KiB at 1mbit (125 bytes a millisecond).
			name: "default queue",
			spec: Spec{Rate: 1e6},
			bursts: []burst{
				{0, 66, 1000, append(slices.Repeat([]bool{yes}, 65), no)},
				{8 * time.Millisecond, 2, 1000, []bool{yes, no}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			im := New(tt.spec)
			r := &recorder{}
			var want []uint64
			var id uint64
			dropped := 0
			for _, b := range tt.bursts {
				for k := range b.n {
					before := im.Counters().QueueDropped
					im.Apply(makeFrame(id, b.size), t0.Add(b.at), r.emit)
					took := im.Counters().QueueDropped == before
					if took != b.accept[k] {
						t.Errorf("frame %d (%d bytes at %v): taken %v, want %v", id, b.size, b.at, took, b.accept[k])
					}
					if b.accept[k] {
						want = append(want, id)
					} else {
						dropped++
					}
					id++
				}
			}
			drain(t, im, r, 1000)
			if !slices.Equal(r.ids(), want) {
				t.Errorf("emitted %v, want %v", r.ids(), want)
			}
			c := im.Counters()
			if c.QueueDropped != uint64(dropped) || c.Dropped != 0 {
				t.Errorf("Counters() = %+v, want QueueDropped %d and Dropped 0", c, dropped)
			}
		})
	}
}

// TestLinkDuplicate: a duplicate takes its own room in the queue and its own
// time on the link, and leaves right behind its original.
func TestLinkDuplicate(t *testing.T) {
	im := New(Spec{Rate: 1e9, Queue: 4500, Duplicate: 1})
	r := &recorder{}
	for id := range uint64(3) {
		im.Apply(makeFrame(id, 1500), t0, r.emit)
	}
	// Frame 0 and its copy fit (3000 bytes); frame 1 fits, its copy does
	// not; frame 2 and its copy find the queue full.
	at := offsets(drain(t, im, r, 10))
	if want := []uint64{0, 0, 1}; !slices.Equal(r.ids(), want) {
		t.Errorf("emitted %v, want %v", r.ids(), want)
	}
	if want := []time.Duration{24000, 24000, 36000}; !slices.Equal(at, want) {
		t.Errorf("frames left at %v, want %v", at, want)
	}
	c := im.Counters()
	if c.Duplicated != 3 || c.QueueDropped != 3 {
		t.Errorf("Counters() = %+v, want Duplicated 3, QueueDropped 3", c)
	}
	if got, want := uint64(len(r.got)), c.Frames-c.Dropped-c.QueueDropped+c.Duplicated; got != want {
		t.Errorf("emitted %d frames, want %d", got, want)
	}
}

// TestLinkReorder: a reordered frame enters the link right behind its
// successor, and the link paces both.
func TestLinkReorder(t *testing.T) {
	im := New(Spec{Rate: 1e9, Reorder: 0.3, Seed: 11})
	r := &recorder{}
	var order, pending []uint64
	var at []time.Time
	for id := range uint64(300) {
		now := t0.Add(time.Duration(id) * 20 * time.Microsecond)
		at = append(at, flushUntil(t, im, r, now, 1000)...)
		before := im.Counters()
		im.Apply(makeFrame(id, 1500), now, r.emit)
		if decide(before, im.Counters()).reordered {
			pending = append(pending, id)
			continue
		}
		order = append(append(order, id), pending...)
		pending = pending[:0]
	}
	order = append(order, pending...) // those wait for the hold limit
	at = append(at, drain(t, im, r, 1000)...)
	if !slices.Equal(r.ids(), order) {
		t.Fatalf("emitted %v,\nwant %v", r.ids(), order)
	}
	if len(at) != len(r.got) {
		t.Fatalf("%d frames left, %d of them at a known time", len(r.got), len(at))
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < 12*time.Microsecond {
			t.Fatalf("frames %d and %d left %v apart, less than a 1500-byte frame's 12µs", r.got[i-1].id, r.got[i].id, gap)
		}
	}
	if c := im.Counters(); c.Reordered == 0 || c.QueueDropped != 0 {
		t.Errorf("Counters() = %+v, want some reordered, none dropped", c)
	}

	// Without a successor, a reordered frame enters the link at the hold
	// limit and leaves when it has been sent.
	im = New(Spec{Rate: 1e9, Reorder: 1})
	r = &recorder{}
	im.Apply(makeFrame(1, 1500), t0, r.emit)
	if due, ok := im.NextDue(); !ok || !due.Equal(t0.Add(MinReorderHold)) {
		t.Fatalf("NextDue() = %v, %v; want the hold limit", due.Sub(t0), ok)
	}
	im.Flush(t0.Add(MinReorderHold), r.emit)
	if len(r.got) != 0 {
		t.Fatalf("the frame left at the hold limit, before the link sent it")
	}
	want := t0.Add(MinReorderHold + 12*time.Microsecond)
	if due, ok := im.NextDue(); !ok || !due.Equal(want) {
		t.Fatalf("NextDue() = %v, %v; want %v", due.Sub(t0), ok, want.Sub(t0))
	}
	im.Flush(want, r.emit)
	if !slices.Equal(r.ids(), []uint64{1}) {
		t.Errorf("emitted %v, want [1]", r.ids())
	}
}

// ecnOf returns the ECN field of an IPv4 or IPv6 frame made by ipv4Frame or
// ipv6Frame.
func ecnOf(b []byte) byte {
	if binary.BigEndian.Uint16(b[12:14]) == 0x86dd {
		return b[15] >> 4 & 3
	}
	return b[15] & 3
}

func TestLinkECN(t *testing.T) {
	const (
		notECT = 0b00
		ect1   = 0b01
		ect0   = 0b10
		ce     = 0b11
	)
	vlan := ipv4Frame(ect0, 5, 100)
	vlan = slices.Insert(vlan, 12, 0x81, 0x00, 0x00, 0x07) // 802.1Q tag, VLAN 7
	badVersion := ipv4Frame(ect0, 5, 100)
	badVersion[14] = 0x65
	shortIHL := ipv4Frame(ect0, 5, 100)
	shortIHL[14] = 0x44
	arp := ipv4Frame(ect0, 5, 100)
	binary.BigEndian.PutUint16(arp[12:14], 0x0806)
	tests := []struct {
		name  string
		frame []byte
		mark  bool
	}{
		{"IPv4 ECT(0)", ipv4Frame(ect0, 5, 1000), true},
		{"IPv4 ECT(1)", ipv4Frame(ect1, 5, 1000), true},
		{"IPv4 ECT(0) DSCP 46", ipv4Frame(46<<2|ect0, 5, 1000), true},
		{"IPv4 ECT(1) with options", ipv4Frame(ect1, 8, 1000), true},
		{"IPv4 header only", ipv4Frame(ect0, 5, 34), true},
		{"IPv4 Not-ECT", ipv4Frame(notECT, 5, 1000), false},
		{"IPv4 CE", ipv4Frame(ce, 5, 1000), false},
		{"IPv4 cut short", ipv4Frame(ect0, 5, 1000)[:33], false},
		{"IPv4 options cut short", ipv4Frame(ect0, 8, 1000)[:14+31], false},
		{"IPv4 IHL below 5", shortIHL, false},
		{"IPv4 EtherType, version 6", badVersion, false},
		{"VLAN-tagged IPv4 ECT(0)", vlan, false},
		{"ARP", arp, false},
		{"IPv6 ECT(0)", ipv6Frame(ect0, 1000), true},
		{"IPv6 ECT(1)", ipv6Frame(ect1, 1000), true},
		{"IPv6 ECT(1) DSCP 63", ipv6Frame(63<<2|ect1, 1000), true},
		{"IPv6 header only", ipv6Frame(ect0, 54), true},
		{"IPv6 Not-ECT", ipv6Frame(notECT, 1000), false},
		{"IPv6 Not-ECT DSCP 63", ipv6Frame(63<<2|notECT, 1000), false},
		{"IPv6 CE", ipv6Frame(ce, 1000), false},
		{"IPv6 cut short", ipv6Frame(ect0, 1000)[:53], false},
		{"Ethernet header only", ipv6Frame(ect0, 1000)[:14], false},
		{"runt", []byte{1, 2, 3}, false},
		{"empty", nil, false},
	}
	// 1000 bytes queued (two fillers of 500) reach the threshold; one
	// filler does not.
	for _, fillers := range []int{1, 2} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/%d queued", tt.name, 500*fillers), func(t *testing.T) {
				im := New(Spec{Rate: 1e9, Queue: 64 << 10, ECN: 1000})
				r := &recorder{}
				for range fillers {
					im.Apply(filler(500), t0, r.emit)
				}
				frame := bytes.Clone(tt.frame)
				im.Apply(frame, t0, r.emit)
				if !bytes.Equal(frame, tt.frame) {
					t.Fatal("Apply changed the caller's frame")
				}
				drain(t, im, r, 10)
				if len(r.got) != fillers+1 {
					t.Fatalf("%d frames left, want %d", len(r.got), fillers+1)
				}
				got := r.got[fillers].bytes
				mark := tt.mark && fillers == 2
				if c := im.Counters(); c.Marked != uint64(b2i(mark)) {
					t.Errorf("Counters().Marked = %d, want %d", c.Marked, b2i(mark))
				}
				if !mark {
					if !bytes.Equal(got, tt.frame) {
						t.Errorf("the frame changed:\n got %x\nwant %x", got, tt.frame)
					}
					return
				}
				if e := ecnOf(got); e != ce {
					t.Errorf("ECN field %02b, want CE", e)
				}
				// Only the ECN bits, and in IPv4 the checksum, changed.
				want := bytes.Clone(tt.frame)
				if binary.BigEndian.Uint16(want[12:14]) == 0x86dd {
					want[15] |= ce << 4
				} else {
					want[15] |= ce
					ihl := int(want[14]&0xf) * 4
					hdr := got[14 : 14+ihl]
					if !ipv4ChecksumOK(hdr) {
						t.Errorf("the marked header's checksum %#04x does not verify", binary.BigEndian.Uint16(hdr[10:12]))
					}
					binary.BigEndian.PutUint16(want[24:26], ipv4Checksum(want[14:14+ihl]))
				}
				if !bytes.Equal(got, want) {
					t.Errorf("the marked frame is\n %x\nwant\n %x", got, want)
				}
			})
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// onesSum is the one's complement sum of h's 16-bit words.
func onesSum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// TestMarkCEChecksum compares markCE's incremental IPv4 checksum with one
// computed from scratch, over many headers, and checks that a wrong
// checksum stays wrong by the same amount: the sum over the header, which
// a receiver checks, does not change.
func TestMarkCEChecksum(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20_000 {
		ihl := 5 + rng.IntN(11)
		f := ipv4Frame(byte(rng.IntN(64))<<2|byte(1+rng.IntN(2)), ihl, 14+4*ihl)
		for j := 16; j < len(f); j++ { // everything but version, IHL and TOS
			if j != 24 && j != 25 {
				f[j] = byte(rng.Uint32())
			}
		}
		hdr := f[14:]
		binary.BigEndian.PutUint16(hdr[10:12], ipv4Checksum(hdr))
		broken := i%2 == 1
		if broken {
			hdr[10] ^= 0x10
		}
		orig := bytes.Clone(f)
		sum := onesSum(hdr)
		if !markCE(f) {
			t.Fatalf("header %x was not marked", orig[14:])
		}
		if got := onesSum(hdr); got != sum {
			t.Fatalf("header %x: sums to %#04x after marking, %#04x before", orig[14:], got, sum)
		}
		if broken {
			continue
		}
		if got, want := binary.BigEndian.Uint16(hdr[10:12]), ipv4Checksum(hdr); got != want {
			t.Fatalf("header %x: checksum %#04x after marking, want %#04x", orig[14:], got, want)
		}
		if !ipv4ChecksumOK(hdr) {
			t.Fatalf("header %x: checksum does not verify after marking", orig[14:])
		}
	}
}

// TestLinkLimits: the default Limits hold what the link holds, so that the
// queue and not the storage drops frames, even when they are all minimal.
func TestLinkLimits(t *testing.T) {
	us := time.Microsecond
	tests := []struct {
		spec Spec
		size int
		step time.Duration
		n    int
		fit  int // frames the queue takes
	}{
		{Spec{Rate: 1e9, Queue: 4 << 20}, 60, 0, 4<<20/60 + 10, 4 << 20 / 60},
		{Spec{Rate: 1e9, Queue: 4 << 20}, 1500, 0, 3000, 4 << 20 / 1500},
		{Spec{Rate: 100e9}, 9000, 0, 2000, 12_500_000 / 9000},
		// A link kept busy for 60 ms: 50 ms of it (6.25 MB, more than
		// DefaultHeldBytes) is in Delay.
		{Spec{Rate: 1e9, Queue: 1 << 20, Delay: 50 * time.Millisecond}, 1500, 12 * us, 5000, 5000},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%dB", tt.spec, tt.size), func(t *testing.T) {
			im := New(tt.spec)
			frame := make([]byte, tt.size)
			emitted := 0
			emit := func([]byte) { emitted++ }
			for i := range tt.n {
				im.Apply(frame, t0.Add(time.Duration(i)*tt.step), emit)
			}
			for range 2 * tt.n {
				due, ok := im.NextDue()
				if !ok {
					break
				}
				im.Flush(due, emit)
			}
			c := im.Counters()
			if c.Overflowed != 0 || emitted != tt.fit || c.QueueDropped != uint64(tt.n-tt.fit) {
				t.Errorf("%d of %d frames went out; Counters() = %+v; want %d, none overflowed", emitted, tt.n, c, tt.fit)
			}
		})
	}
}
