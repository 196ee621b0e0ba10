package pingpong

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Option is one option of a command line parsed the way getopt_long(3)
// parses the rdma-core tools' options.
type Option struct {
	// Short is the one-letter name (0 for none), Long the long name
	// ("" for none).
	Short byte
	Long  string
	// Arg says whether the option takes an argument.
	Arg bool
}

// Parsed is an option found on a command line: its short name (or, for
// a long-only option, its long name) and its argument.
type Parsed struct {
	Name  string
	Value string
}

// ErrUsage is wrapped by the errors of a command line that does not parse.
var ErrUsage = errors.New("usage")

// usageError is an error of the command line: its text is the message
// alone, worded to follow "taproce pingpong: ", and it is ErrUsage.
type usageError string

func (e usageError) Error() string        { return string(e) }
func (e usageError) Is(target error) bool { return target == ErrUsage }

func usagef(format string, args ...any) error { return usageError(fmt.Sprintf(format, args...)) }

// Getopt parses args as getopt_long does with GNU's argument permutation:
// options anywhere ("-s 64", "-s64", "-ec", "--size=64", "--size 64",
// unique prefixes of long names), operands collected in order, "--" ending
// the options.
func Getopt(args []string, opts []Option) ([]Parsed, []string, error) {
	var out []Parsed
	var operands []string
	name := func(o *Option) string {
		if o.Short != 0 {
			return string(o.Short)
		}
		return o.Long
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return out, append(operands, args[i+1:]...), nil
		case strings.HasPrefix(a, "--"):
			key, val, hasVal := strings.Cut(a[2:], "=")
			o, err := findLong(opts, key)
			if err != nil {
				return nil, nil, err
			}
			switch {
			case !o.Arg && hasVal:
				return nil, nil, usagef("option '--%s' doesn't allow an argument", o.Long)
			case o.Arg && !hasVal:
				if i+1 == len(args) {
					return nil, nil, usagef("option '--%s' requires an argument", o.Long)
				}
				i++
				val = args[i]
			}
			out = append(out, Parsed{name(o), val})
		case len(a) > 1 && a[0] == '-':
			for j := 1; j < len(a); j++ {
				o := findShort(opts, a[j])
				if o == nil {
					return nil, nil, usagef("invalid option -- '%c'", a[j])
				}
				if !o.Arg {
					out = append(out, Parsed{name(o), ""})
					continue
				}
				val := a[j+1:]
				if val == "" {
					if i+1 == len(args) {
						return nil, nil, usagef("option requires an argument -- '%c'", a[j])
					}
					i++
					val = args[i]
				}
				out = append(out, Parsed{name(o), val})
				break
			}
		default:
			operands = append(operands, a)
		}
	}
	return out, operands, nil
}

func findShort(opts []Option, c byte) *Option {
	for i := range opts {
		if opts[i].Short == c {
			return &opts[i]
		}
	}
	return nil
}

// findLong finds a long option by its name or an unambiguous prefix.
func findLong(opts []Option, key string) (*Option, error) {
	var found *Option
	for i := range opts {
		o := &opts[i]
		if o.Long == "" || !strings.HasPrefix(o.Long, key) {
			continue
		}
		if o.Long == key {
			return o, nil
		}
		if found != nil {
			return nil, usagef("option '--%s' is ambiguous", key)
		}
		found = o
	}
	if found == nil || key == "" {
		return nil, usagef("unrecognized option '--%s'", key)
	}
	return found, nil
}

// ParseNumber parses a number as strtol(s, NULL, 0) reads it (decimal,
// 0x hexadecimal, 0 octal), but refuses what is not a number.
func ParseNumber(s string) (int, error) {
	v, err := strconv.ParseInt(strings.TrimSpace(s), 0, 64)
	if err != nil || strings.Contains(s, "_") {
		return 0, usagef("%q is not a number", s)
	}
	if v != int64(int(v)) {
		return 0, usagef("%q is out of range", s)
	}
	return int(v), nil
}

// parseOption parses the number v of the option called name, as
// ParseNumber does, and checks that it lies in lo..hi. Its error is a
// usage error that names the option and quotes v, without strconv's
// words: `message size "9G": not a number`, `port "70000": too large
// (max 65535)`.
func parseOption(name, v string, lo, hi int) (int, error) {
	digits := strings.TrimSpace(v)
	n, err := strconv.ParseInt(digits, 0, 64)
	switch {
	case strings.Contains(v, "_"), err != nil && !errors.Is(err, strconv.ErrRange):
		return 0, usagef("%s %q: not a number", name, v)
	case err != nil && strings.HasPrefix(digits, "-"), err == nil && n < int64(lo):
		return 0, usagef("%s %q: too small (min %d)", name, v, lo)
	case err != nil, n > int64(hi):
		return 0, usagef("%s %q: too large (max %d)", name, v, hi)
	}
	return int(n), nil
}
