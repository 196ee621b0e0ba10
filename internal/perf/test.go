package perf

import (
	"fmt"
	"strings"
)

// Verb is the operation a test measures, in perftest's order (VerbType).
type Verb int

// Verbs.
const (
	Send Verb = iota
	Write
	Read
	Atomic
)

// verbNames are perftest's testsStr.
var verbNames = [...]string{"Send", "RDMA_Write", "RDMA_Read", "Atomic"}

var verbKeys = [...]string{"send", "write", "read", "atomic"}

// Kind says whether a test measures bandwidth or latency.
type Kind int

// Kinds.
const (
	BW Kind = iota
	Lat
)

// Test is one of the eight tests.
type Test struct {
	Verb Verb
	Kind Kind
}

// Tests lists every test, bandwidth first.
var Tests = []Test{
	{Write, BW}, {Read, BW}, {Send, BW}, {Atomic, BW},
	{Write, Lat}, {Read, Lat}, {Send, Lat}, {Atomic, Lat},
}

// ParseTest parses a test name: write_bw, read_bw, send_bw, atomic_bw,
// write_lat, read_lat, send_lat or atomic_lat, also with perftest's "ib_"
// prefix and with '-' for '_'.
func ParseTest(s string) (Test, error) {
	n := strings.ReplaceAll(strings.ToLower(s), "-", "_")
	n = strings.TrimPrefix(n, "ib_")
	for _, t := range Tests {
		if n == t.String() {
			return t, nil
		}
	}
	return Test{}, fmt.Errorf("unknown test %q (want one of write_bw, read_bw, send_bw, atomic_bw, write_lat, read_lat, send_lat, atomic_lat)", s)
}

// String returns the test's name, e.g. "write_bw".
func (t Test) String() string {
	k := "bw"
	if t.Kind == Lat {
		k = "lat"
	}
	return verbKeys[t.Verb] + "_" + k
}

// Tool returns the name of the perftest program of the test, e.g.
// "ib_write_bw".
func (t Test) Tool() string { return "ib_" + t.String() }

// AtomicType is the operation of the atomic tests (perftest -A).
type AtomicType int

// Atomic types, in perftest's order (atomicTypesStr).
const (
	CmpAndSwap AtomicType = iota
	FetchAndAdd
)

// String is perftest's name of the type.
func (a AtomicType) String() string {
	if a == CmpAndSwap {
		return "CMP_AND_SWAP"
	}
	return "FETCH_AND_ADD"
}

// ParseAtomicType parses CMP_AND_SWAP or FETCH_AND_ADD.
func ParseAtomicType(s string) (AtomicType, error) {
	switch s {
	case "CMP_AND_SWAP":
		return CmpAndSwap, nil
	case "FETCH_AND_ADD":
		return FetchAndAdd, nil
	}
	return 0, fmt.Errorf("atomic type %q: choose from CMP_AND_SWAP or FETCH_AND_ADD", s)
}

// title is the line ctx_print_test_info prints, e.g. "RDMA_Write BW Test".
func (t Test) title(a AtomicType) string {
	s := verbNames[t.Verb] + " "
	if t.Verb == Atomic {
		s += a.String() + " "
	}
	if t.Kind == BW {
		s += "BW "
	} else {
		s += "Latency "
	}
	return s + "Test"
}
