package impair

import (
	"errors"
	"fmt"
	"math"
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
	// Delay is a fixed extra delay for every frame; 0 means none.
	Delay time.Duration
	// Seed seeds the pseudo-random decisions; 0 means seed 1, so that runs
	// are reproducible by default.
	Seed uint64
}

// Spec keys, in the order String writes them.
const (
	keyLoss      = "loss"
	keyDuplicate = "duplicate"
	keyReorder   = "reorder"
	keyCorrupt   = "corrupt"
	keyDelay     = "delay"
	keySeed      = "seed"
)

var knownKeys = keyLoss + ", " + keyDuplicate + ", " + keyReorder + ", " +
	keyCorrupt + ", " + keyDelay + ", " + keySeed

// ParseSpec parses a comma-separated list of key=value items:
//
//	loss=1%,duplicate=1%,reorder=5%,corrupt=0.1%,delay=200us,seed=7
//
// Probabilities (loss, duplicate, reorder, corrupt) are percentages ("1%",
// within 0%..100%) or plain fractions ("0.01", within 0..1). delay is a
// non-negative Go duration ("200us", "1.5ms"); seed is a decimal uint64.
// Spaces around items, keys and values are ignored. The empty string is the
// zero Spec (no impairment). Unknown keys, repeated keys, empty items and bad
// values are errors that name the key and wrap ErrInvalidSpec.
func ParseSpec(s string) (Spec, error) {
	var spec Spec
	if strings.TrimSpace(s) == "" {
		return spec, nil
	}
	seen := make(map[string]bool, 6)
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
	return spec, nil
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
// seed; probabilities as percentages when that is exact, as fractions
// otherwise; the delay with ASCII units ("200us"). The zero Spec is "".
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
	return s.Loss > 0 || s.Duplicate > 0 || s.Reorder > 0 || s.Corrupt > 0 || s.Delay > 0
}

// Validate reports whether s is a Spec ParseSpec could have returned:
// probabilities within [0,1] (not NaN) and a non-negative delay. It is meant
// for Specs built in code; New accepts any Spec and clamps what is out of
// range.
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
