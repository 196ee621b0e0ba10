package impair

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// ErrInvalidSpec is wrapped by every error ParseSpec and Spec.Validate return.
var ErrInvalidSpec = errors.New("invalid impairment spec")

// Spec says how to impair one direction of a port's frames. The zero Spec
// impairs nothing.
//
// Loss applies to every frame; Corrupt, Duplicate and Reorder apply to the
// frames that are not lost, so the share of duplicated frames among the frames
// that survive loss is Duplicate, and likewise for Corrupt and Reorder.
//
// Rate, Queue and ECN model a bottleneck link behind those faults: a link of
// Rate bits/s fed by a drop-tail queue of Queue bytes that marks ECN-capable
// IP frames Congestion Experienced once ECN bytes wait in it. Queue and ECN
// mean nothing without Rate, so a Spec that sets them without it is invalid.
type Spec struct {
	// Loss is the probability that a frame is dropped, in [0,1] (1% = 0.01).
	Loss float64
	// Duplicate is the probability that a frame is emitted twice.
	Duplicate float64
	// Reorder is the probability that a frame is held back and emitted right
	// after the next frame that goes out.
	Reorder float64
	// Corrupt is the probability that one bit of a frame is flipped.
	Corrupt float64
	// Delay is a fixed extra delay for every frame; 0 means none. With Rate
	// it follows the link: a frame leaves Delay after the link has sent it,
	// as on a long line behind a bottleneck.
	Delay time.Duration
	// Rate is the modelled link's rate in bits per second; 0 means no link
	// (frames are not paced).
	Rate uint64
	// Queue is the drop-tail limit of the link's queue in bytes: a frame
	// that would make the bytes waiting for the link exceed it is dropped.
	// 0 means the default: the larger of DefaultQueue and the bytes Rate
	// sends in a millisecond (Spec.QueueLimit). It needs Rate and is at
	// most MaxQueue.
	Queue uint64
	// ECN is the backlog in bytes from which a frame entering the queue is
	// marked CE when its IP header says ECT(0) or ECT(1); 0 means no
	// marking. It needs Rate and must be below the queue's limit, or no
	// frame could ever be marked. Frames that are not ECN-capable are
	// queued unmarked, as a RED queue with ECN does.
	ECN uint64
	// Seed seeds the pseudo-random decisions; 0 means seed 1, so that runs
	// are reproducible by default.
	Seed uint64
}

// Spec keys, in the order String writes them: the random faults, then the
// delay and the link (rate, its queue, its marking threshold), then the seed
// of it all.
const (
	keyLoss      = "loss"
	keyDuplicate = "duplicate"
	keyReorder   = "reorder"
	keyCorrupt   = "corrupt"
	keyDelay     = "delay"
	keyRate      = "rate"
	keyQueue     = "queue"
	keyECN       = "ecn"
	keySeed      = "seed"
)

var knownKeys = keyLoss + ", " + keyDuplicate + ", " + keyReorder + ", " +
	keyCorrupt + ", " + keyDelay + ", " + keyRate + ", " + keyQueue + ", " +
	keyECN + ", " + keySeed

// Bounds of the link's queue.
const (
	// DefaultQueue is the least queue limit a Spec with a Rate and no
	// Queue gets: its limit is the larger of DefaultQueue and the bytes the
	// Rate sends in a millisecond, so that a fast link still holds a burst.
	DefaultQueue = 64 << 10
	// MaxQueue caps Spec.Queue: the queued frames are stored, and an
	// Impairer stores at most MaxHeldBytes.
	MaxQueue = MaxHeldBytes
)

// Units, largest first: String writes the largest that is exact, so a unit
// of 1 after another one of 1 is only read.
var (
	// rateUnits are the units of Spec.Rate, tc's decimal ones; "" is plain
	// bits/s. tc's bps, kbps, … are bytes per second, which is why the
	// key's units are never abbreviated.
	rateUnits = scale{"bits/s", []unit{{"tbit", 1e12}, {"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}, {"", 1}}}
	// sizeUnits are the units of Spec.Queue and Spec.ECN, binary ones; ""
	// is plain bytes. Decimal-looking "kb" or "k" are refused, since tc
	// reads them as 1024 and most people as 1000.
	sizeUnits = scale{"bytes", []unit{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"", 1}}}
)

// scale is a quantity and its units.
type scale struct {
	quantity string
	units    []unit
}

// unit is a suffix and what it multiplies by.
type unit struct {
	name string
	mult uint64
}

// ParseSpec parses a comma-separated list of key=value items:
//
//	loss=1%,duplicate=1%,reorder=5%,corrupt=0.1%,delay=200us,seed=7
//	rate=1gbit,queue=256KiB,ecn=32KiB
//
// Probabilities (loss, duplicate, reorder, corrupt) are percentages ("1%",
// within 0%..100%) or plain fractions ("0.01", within 0..1). delay is a
// non-negative Go duration ("200us", "1.5ms"); seed is a decimal uint64.
// rate is in bits per second as tc writes it: a number with unit bit, kbit,
// mbit, gbit or tbit (decimal: 1kbit = 1000 bit/s; any case), or a plain
// number of bits/s. queue and ecn are bytes: a plain number or one with unit
// KiB, MiB or GiB (binary: 1KiB = 1024 bytes; any case). A number may have a
// decimal fraction when it comes to a whole number of bits/s or bytes
// ("1.5gbit"). queue and ecn need rate; queue is at most MaxQueue, ecn below
// the queue's limit (Spec.QueueLimit).
// Spaces around items, keys and values are ignored. The empty string is the
// zero Spec (no impairment). Unknown keys, repeated keys, empty items and bad
// values are errors that name the key and wrap ErrInvalidSpec.
func ParseSpec(s string) (Spec, error) {
	var spec Spec
	if strings.TrimSpace(s) == "" {
		return spec, nil
	}
	seen := make(map[string]bool, 9)
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return Spec{}, fmt.Errorf("%w: empty item in %q", ErrInvalidSpec, s)
		}
		key, val, ok := strings.Cut(item, "=")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		if !ok {
			return Spec{}, fmt.Errorf("%w: %q is not key=value", ErrInvalidSpec, item)
		}
		if seen[key] {
			return Spec{}, fmt.Errorf("%w: %s: given twice", ErrInvalidSpec, key)
		}
		seen[key] = true
		var err error
		switch key {
		case keyLoss:
			spec.Loss, err = parseProbability(key, val)
		case keyDuplicate:
			spec.Duplicate, err = parseProbability(key, val)
		case keyReorder:
			spec.Reorder, err = parseProbability(key, val)
		case keyCorrupt:
			spec.Corrupt, err = parseProbability(key, val)
		case keyDelay:
			spec.Delay, err = parseDelay(val)
		case keyRate:
			spec.Rate, err = parseScaled(key, val, rateUnits, "a rate (a number of bits/s, or one with unit bit, kbit, mbit, gbit or tbit, e.g. 1gbit)")
			if err != nil && strings.HasSuffix(strings.ToLower(val), "bps") {
				err = fmt.Errorf("%w (tc's bps is bytes per second: write bit units)", err)
			}
		case keyQueue:
			spec.Queue, err = parseScaled(key, val, sizeUnits, "a size in bytes (a number, or one with unit KiB, MiB or GiB, e.g. 64KiB)")
		case keyECN:
			spec.ECN, err = parseScaled(key, val, sizeUnits, "a size in bytes (a number, or one with unit KiB, MiB or GiB, e.g. 32KiB)")
		case keySeed:
			spec.Seed, err = strconv.ParseUint(val, 10, 64)
			if err != nil {
				err = fmt.Errorf("%w: %s: %q is not an unsigned decimal integer", ErrInvalidSpec, key, val)
			}
		default:
			return Spec{}, fmt.Errorf("%w: unknown key %q (known keys: %s)", ErrInvalidSpec, key, knownKeys)
		}
		if err != nil {
			return Spec{}, err
		}
	}
	if err := spec.validateLink(); err != nil {
		return Spec{}, err
	}
	return spec, nil
}

// parseScaled parses a whole number with an optional decimal fraction and
// one of units (any case; "" is a bare number), and returns number × unit,
// which must be whole and fit in a uint64. what says what val should have
// been, for the error.
func parseScaled(key, val string, sc scale, what string) (uint64, error) {
	end := 0
	for end < len(val) && (val[end] >= '0' && val[end] <= '9' || val[end] == '.') {
		end++
	}
	num, suffix := val[:end], val[end:]
	mult := uint64(0)
	for _, u := range sc.units {
		if strings.EqualFold(suffix, u.name) {
			mult = u.mult
			break
		}
	}
	whole, frac, dot := strings.Cut(num, ".")
	if mult == 0 || whole == "" || dot && frac == "" || strings.Contains(frac, ".") {
		return 0, fmt.Errorf("%w: %s: %q is not %s", ErrInvalidSpec, key, val, what)
	}
	tooLarge := fmt.Errorf("%w: %s: %s is too large", ErrInvalidSpec, key, val)
	w, err := strconv.ParseUint(whole, 10, 64) // digits only: fails only when too large
	hi, v := bits.Mul64(w, mult)
	if err != nil || hi != 0 {
		return 0, tooLarge
	}
	frac = strings.TrimRight(frac, "0")
	if frac == "" {
		return v, nil
	}
	// v += frac × mult / 10^len(frac), which must be whole. 19 digits fit a
	// uint64 and are more than anyone writes.
	notWhole := fmt.Errorf("%w: %s: %s is not a whole number of %s", ErrInvalidSpec, key, val, sc.quantity)
	if len(frac) > 19 {
		return 0, notWhole
	}
	f, _ := strconv.ParseUint(frac, 10, 64)
	pow := uint64(1)
	for range len(frac) {
		pow *= 10
	}
	fhi, flo := bits.Mul64(f, mult)
	q, r := bits.Div64(fhi, flo, pow) // f < pow, so fhi < pow: the quotient fits
	if r != 0 {
		return 0, notWhole
	}
	sum, carry := bits.Add64(v, q, 0)
	if carry != 0 {
		return 0, tooLarge
	}
	return sum, nil
}

// formatScaled writes v > 0 with the largest of sc's units that divides it
// exactly; the units end with a unit of 1.
func formatScaled(v uint64, sc scale) string {
	for _, u := range sc.units {
		if v%u.mult == 0 {
			return strconv.FormatUint(v/u.mult, 10) + u.name
		}
	}
	return strconv.FormatUint(v, 10)
}

// parseProbability parses "1%" (0%..100%) or "0.01" (0..1).
func parseProbability(key, val string) (float64, error) {
	num, percent := strings.CutSuffix(val, "%")
	num = strings.TrimSpace(num)
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %q is not a number or percentage", ErrInvalidSpec, key, val)
	}
	if percent {
		if !(f >= 0 && f <= 100) {
			return 0, fmt.Errorf("%w: %s: %s is outside 0%%..100%%", ErrInvalidSpec, key, val)
		}
		f /= 100
	} else if !(f >= 0 && f <= 1) {
		if f > 1 && f <= 100 {
			return 0, fmt.Errorf("%w: %s: %s is outside 0..1 (write %s%% for a percentage)", ErrInvalidSpec, key, val, num)
		}
		return 0, fmt.Errorf("%w: %s: %s is outside 0..1", ErrInvalidSpec, key, val)
	}
	if f == 0 {
		f = 0 // no -0
	}
	return f, nil
}

func parseDelay(val string) (time.Duration, error) {
	d, err := time.ParseDuration(val)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %w", ErrInvalidSpec, keyDelay, err)
	}
	if d < 0 {
		return 0, fmt.Errorf("%w: %s: %s is negative", ErrInvalidSpec, keyDelay, val)
	}
	return d, nil
}

// String returns the canonical form of s, which ParseSpec turns back into s:
// the non-zero fields in the order loss, duplicate, reorder, corrupt, delay,
// rate, queue, ecn, seed; probabilities as percentages when that is exact, as
// fractions otherwise; the delay with ASCII units ("200us"); the rate and the
// sizes with the largest unit that is exact ("1gbit", "1500bit", "64KiB",
// "1500"). The zero Spec is "".
func (s Spec) String() string {
	var b strings.Builder
	item := func(key, val string) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(key)
		b.WriteByte('=')
		b.WriteString(val)
	}
	for _, p := range []struct {
		key string
		val float64
	}{{keyLoss, s.Loss}, {keyDuplicate, s.Duplicate}, {keyReorder, s.Reorder}, {keyCorrupt, s.Corrupt}} {
		if p.val != 0 {
			item(p.key, formatProbability(p.val))
		}
	}
	if s.Delay != 0 {
		item(keyDelay, strings.ReplaceAll(s.Delay.String(), "µ", "u"))
	}
	if s.Rate != 0 {
		item(keyRate, formatScaled(s.Rate, rateUnits))
	}
	if s.Queue != 0 {
		item(keyQueue, formatScaled(s.Queue, sizeUnits))
	}
	if s.ECN != 0 {
		item(keyECN, formatScaled(s.ECN, sizeUnits))
	}
	if s.Seed != 0 {
		item(keySeed, strconv.FormatUint(s.Seed, 10))
	}
	return b.String()
}

// formatProbability writes p as a percentage with the fewest significant
// digits (up to 15) that parse back to exactly p, and as the shortest exact
// fraction when no such percentage exists.
func formatProbability(p float64) string {
	for prec := 1; prec <= 15; prec++ {
		pct := strconv.FormatFloat(p*100, 'g', prec, 64)
		if back, err := strconv.ParseFloat(pct, 64); err == nil && back/100 == p {
			return strconv.FormatFloat(back, 'g', -1, 64) + "%"
		}
	}
	return strconv.FormatFloat(p, 'g', -1, 64)
}

// Enabled reports whether s impairs anything at all.
func (s Spec) Enabled() bool {
	return s.Loss > 0 || s.Duplicate > 0 || s.Reorder > 0 || s.Corrupt > 0 || s.Delay > 0 || s.Rate > 0
}

// Holds reports whether an Impairer for s may hold frames back for later
// (to delay, reorder or pace them), so that its user must call Flush when
// NextDue says, or those frames stay held until the next Apply.
func (s Spec) Holds() bool {
	return s.Delay > 0 || s.Reorder > 0 || s.Rate > 0
}

// QueueLimit returns the drop-tail limit of s's link in bytes: Queue when
// set, else the larger of DefaultQueue and the bytes Rate sends in a
// millisecond, at most MaxQueue; 0 without a Rate.
func (s Spec) QueueLimit() uint64 {
	switch {
	case s.Rate == 0:
		return 0
	case s.Queue != 0:
		return min(s.Queue, MaxQueue)
	}
	return min(max(DefaultQueue, s.Rate/8/1000), MaxQueue)
}

// validateLink checks what ties Queue and ECN to Rate: both need it, Queue is
// at most MaxQueue and ECN below the queue's limit, so that some frame can
// be marked.
func (s Spec) validateLink() error {
	var errs []error
	if s.Queue != 0 && s.Rate == 0 {
		errs = append(errs, fmt.Errorf("%w: %s: needs a %s", ErrInvalidSpec, keyQueue, keyRate))
	}
	if s.Queue > MaxQueue {
		errs = append(errs, fmt.Errorf("%w: %s: %s exceeds %s", ErrInvalidSpec, keyQueue,
			formatScaled(s.Queue, sizeUnits), formatScaled(MaxQueue, sizeUnits)))
	}
	if s.ECN != 0 && s.Rate == 0 {
		errs = append(errs, fmt.Errorf("%w: %s: needs a %s", ErrInvalidSpec, keyECN, keyRate))
	}
	if q := s.QueueLimit(); s.ECN != 0 && s.Rate != 0 && s.ECN >= q {
		errs = append(errs, fmt.Errorf("%w: %s: %s is not below the queue's limit of %s, so no frame would be marked",
			ErrInvalidSpec, keyECN, formatScaled(s.ECN, sizeUnits), formatScaled(q, sizeUnits)))
	}
	return errors.Join(errs...)
}

// Validate reports whether s is a Spec ParseSpec could have returned:
// probabilities within [0,1] (not NaN), a non-negative delay, and Queue and
// ECN only with a Rate, within their bounds. It is meant for Specs built in
// code; New accepts any Spec and clamps what is out of range.
func (s Spec) Validate() error {
	var errs []error
	for _, p := range []struct {
		key string
		val float64
	}{{keyLoss, s.Loss}, {keyDuplicate, s.Duplicate}, {keyReorder, s.Reorder}, {keyCorrupt, s.Corrupt}} {
		if !(p.val >= 0 && p.val <= 1) {
			errs = append(errs, fmt.Errorf("%w: %s: %v is outside 0..1", ErrInvalidSpec, p.key, p.val))
		}
	}
	if s.Delay < 0 {
		errs = append(errs, fmt.Errorf("%w: %s: %v is negative", ErrInvalidSpec, keyDelay, s.Delay))
	}
	if err := s.validateLink(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// clampProbability maps p into [0,1]; NaN becomes 0.
func clampProbability(p float64) float64 {
	switch {
	case math.IsNaN(p) || p <= 0:
		return 0
	case p >= 1:
		return 1
	}
	return p
}
