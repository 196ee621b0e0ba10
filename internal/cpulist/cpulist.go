// Package cpulist reads and writes sets of processors in the kernel's
// list format ("0-3,6", as in /sys/devices/system/cpu/online, cpuset.cpus
// and taskset -c), and runs a whole process on such a set.
package cpulist

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Max is one more than the highest processor number a Set holds.
const Max = len(unix.CPUSet{}) * 64

// A Set is a set of processors (a sched_setaffinity(2) mask).
type Set = unix.CPUSet

// ErrSyntax is what Parse's errors wrap when the text is not a processor
// list.
var ErrSyntax = errors.New("not a processor list")

// Parse reads a processor list: comma-separated numbers and ranges
// "low-high", such as "0-3,6". Spaces around the items are allowed; an
// empty list is not.
func Parse(s string) (Set, error) {
	var set Set
	if strings.TrimSpace(s) == "" {
		return set, fmt.Errorf("cpulist: empty list: %w", ErrSyntax)
	}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		lo, hi, isRange := strings.Cut(item, "-")
		first, err := number(lo)
		if err != nil && isRange {
			return Set{}, fmt.Errorf("cpulist: %q: %w", item, err)
		} else if err != nil {
			return Set{}, fmt.Errorf("cpulist: %w", err)
		}
		last := first
		if isRange {
			if last, err = number(hi); err != nil {
				return Set{}, fmt.Errorf("cpulist: %q: %w", item, err)
			}
			if last < first {
				return Set{}, fmt.Errorf("cpulist: %q: the range runs backwards: %w", item, ErrSyntax)
			}
		}
		for c := first; c <= last; c++ {
			set.Set(c)
		}
	}
	return set, nil
}

// number reads one processor number.
func number(s string) (int, error) {
	s = strings.TrimSpace(s)
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a processor number: %w", s, ErrSyntax)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n >= Max {
		return 0, fmt.Errorf("processor %s is beyond the highest, %d: %w", s, Max-1, ErrSyntax)
	}
	return n, nil
}

// Format writes set as a processor list the way the kernel does, with a
// range for every run ("0-3,6,8-9"); the empty set is "".
func Format(set Set) string {
	var b strings.Builder
	for c := 0; c < Max; {
		if !set.IsSet(c) {
			c++
			continue
		}
		end := c
		for end+1 < Max && set.IsSet(end+1) {
			end++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if end == c {
			fmt.Fprintf(&b, "%d", c)
		} else {
			fmt.Fprintf(&b, "%d-%d", c, end)
		}
		c = end + 1
	}
	return b.String()
}

// List returns the processors of set in ascending order.
func List(set Set) []int {
	var out []int
	for c := range Max {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out
}

// Of returns the set of the given processors.
func Of(cpus ...int) Set {
	var set Set
	for _, c := range cpus {
		set.Set(c)
	}
	return set
}

// Without returns the processors of a that are not in b.
func Without(a, b Set) Set {
	var out Set
	for c := range Max {
		if a.IsSet(c) && !b.IsSet(c) {
			out.Set(c)
		}
	}
	return out
}

// Subset reports whether every processor of a is in b.
func Subset(a, b Set) bool {
	rest := Without(a, b)
	return rest.Count() == 0
}

// Allowed returns the processors the calling thread may run on: those of
// the process, unless something pinned the thread alone.
func Allowed() (Set, error) {
	var set Set
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return Set{}, fmt.Errorf("cpulist: sched_getaffinity: %w", err)
	}
	return set, nil
}

// ErrNotAllowed is what Allow's and Pin's errors wrap when the set holds a
// processor the process may not run on, or none.
var ErrNotAllowed = errors.New("processor not allowed")

// Allow checks that set is a non-empty subset of Allowed, and returns
// Allowed; otherwise its error wraps ErrNotAllowed.
func Allow(set Set) (allowed Set, err error) {
	if allowed, err = Allowed(); err != nil {
		return Set{}, err
	}
	if set.Count() == 0 || !Subset(set, allowed) {
		return Set{}, fmt.Errorf("cpulist: %q: %w: this process may run on %q", Format(set), ErrNotAllowed, Format(allowed))
	}
	return allowed, nil
}

// Pin runs every thread of the process on set — the threads it has and,
// since a new thread inherits its creator's mask, those it will make —
// and returns a function that puts them back on the processors the
// calling thread had. set must be a non-empty subset of Allowed. When
// Pin fails, the threads are where they were.
func Pin(set Set) (restore func() error, err error) {
	prev, err := Allow(set)
	if err != nil {
		return nil, fmt.Errorf("cpulist: pin: %w", err)
	}
	if err := setAll(&set); err != nil {
		// Some threads may have moved: put them back.
		return nil, errors.Join(err, setAll(&prev))
	}
	return func() error { return setAll(&prev) }, nil
}

// setAll sets the mask of every thread of the process. A thread that a
// thread not yet done creates meanwhile inherits the old mask, so it goes
// over the threads again until a pass finds no new one.
func setAll(set *Set) error {
	done := map[int]bool{}
	for pass := 0; ; pass++ {
		tids, err := threads()
		if err != nil {
			return err
		}
		fresh := 0
		for _, tid := range tids {
			if done[tid] {
				continue
			}
			fresh++
			if err := unix.SchedSetaffinity(tid, set); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("cpulist: sched_setaffinity thread %d: %w", tid, err)
			}
			done[tid] = true
		}
		if fresh == 0 {
			return nil
		}
		if pass == 100 {
			return fmt.Errorf("cpulist: the process kept making threads while they were pinned")
		}
	}
}

// threads lists the process's thread IDs.
func threads() ([]int, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("cpulist: threads: %w", err)
	}
	tids := make([]int, 0, len(ents))
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}
