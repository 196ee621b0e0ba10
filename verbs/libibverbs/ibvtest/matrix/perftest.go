package matrix

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Verb is what a perftest tool measures with.
type Verb string

// perftest's verbs.
const (
	Write  Verb = "write"
	Read   Verb = "read"
	Send   Verb = "send"
	Atomic Verb = "atomic"
)

// Tool is one of perftest's programs: ib_VERB_bw or ib_VERB_lat.
type Tool struct {
	Verb Verb
	// BW: a bandwidth test; else a latency test.
	BW bool
}

// Name is the program's name.
func (t Tool) Name() string {
	if t.BW {
		return "ib_" + string(t.Verb) + "_bw"
	}
	return "ib_" + string(t.Verb) + "_lat"
}

// Tools are perftest 4.5's RDMA tools: all but raw_ethernet_*, whose raw
// packet QPs taproce's devices do not offer (nor do rxe's); nor do they
// offer the connection types DC, XRC and SRD or multicast.
var Tools = []Tool{
	{Write, true}, {Read, true}, {Send, true}, {Atomic, true},
	{Write, false}, {Read, false}, {Send, false}, {Atomic, false},
}

// Connections are the connection types of perftest's -c that taproce's
// devices offer; RC is perftest's default, given without -c.
var Connections = []string{"RC", "UC", "UD"}

// AtomicOps are the atomic tools' -A operations.
var AtomicOps = []string{"CMP_AND_SWAP", "FETCH_AND_ADD"}

// Mode is how a perftest run measures: at one size for a number of
// iterations, or with one of the options the matrix varies.
type Mode string

// The modes: Base is one message size for a number of iterations
// (perftest's default method).
const (
	Base     Mode = ""
	All      Mode = "-a"   // every size from 2 bytes to 8 MiB (UD: to the MTU)
	Bidir    Mode = "-b"   // both sides send at once
	QPs      Mode = "-q 4" // four QPs
	Duration Mode = "-D 1" // for a second instead of a number of iterations
)

// Modes are the modes the matrix runs.
var Modes = []Mode{Base, All, Bidir, QPs, Duration}

// Options are a perftest run's options that the matrix varies.
type Options struct {
	Conn     string // "RC", "UC" or "UD"
	AtomicOp string // -A, atomic tools only; "" otherwise
	// Mode is one of Modes, or options of several ("-a -D 1").
	Mode Mode
	// Size is -s, given when not 0 (an atomic's other than 8 is
	// refused); the matrix's runs choose their sizes themselves.
	Size int
}

// Refusal returns what perftest 4.5 (Debian's 4.5-0.17; its parser,
// src/perftest_parameters.c) says when it refuses the options o for tool
// t and exits with status 1 before it looks for a device — a message for
// each reason, of which it prints the first it checks — or nothing when
// it accepts them:
//
//   - -c UD: change_conn_type allows UD for SEND only;
//   - -c UC: and UC not for READ and ATOMIC;
//   - -q and -b: the parser allows them in bandwidth tests only;
//   - -A: the parser allows it in the atomic tests only;
//   - -a or -s in an atomic test: force_dependecies sets the size of -a
//     (8 MiB) and then refuses any size but 8 bytes for atomics;
//   - -a with -D (not a mode of the matrix, but checked): duration mode
//     runs one size.
func Refusal(t Tool, o Options) []string {
	var why []string
	switch {
	case o.Conn == "UD" && t.Verb != Send:
		why = append(why, "UD connection only possible in SEND verb")
	case o.Conn == "UC" && (t.Verb == Read || t.Verb == Atomic):
		why = append(why, "UC connection not possible in READ/ATOMIC verbs")
	}
	opts := strings.Fields(string(o.Mode))
	if !t.BW && slices.Contains(opts, "-q") {
		why = append(why, "Multiple QPs only available on bw tests")
	}
	if !t.BW && slices.Contains(opts, "-b") {
		why = append(why, "Bidirectional is only available in BW test")
	}
	if o.AtomicOp != "" && t.Verb != Atomic {
		why = append(why, "You are not running the atomic_lat/bw test!")
	}
	if t.Verb == Atomic && (slices.Contains(opts, "-a") || o.Size != 0 && o.Size != atomicLen) {
		why = append(why, "Message size cannot be changed for Atomic tests")
	}
	if slices.Contains(opts, "-a") && slices.Contains(opts, "-D") {
		why = append(why, "Duration mode currently doesn't support running on all sizes")
	}
	return why
}

// perftest's iterations and sizes in the matrix: small, so that a run
// takes a second or so.
const (
	bwIters   = 200 // a bandwidth test at one size
	latIters  = 200 // a latency test at one size
	allIters  = 5   // each size of -a (perftest's least)
	qpsIters  = 100 // each QP's of -q 4
	bwSize    = 65536
	latSize   = 2
	atomicLen = 8  // an atomic's size, the only one perftest allows
	maxAllPow = 23 // -a's largest size is 2^23 bytes
)

// Combinations returns t's options crossed: every Connection, every
// atomic operation (an atomic tool's; else none) and every Mode, in that
// nesting, so that the first is the first of each.
func (t Tool) Combinations() []Options {
	ops := []string{""}
	if t.Verb == Atomic {
		ops = AtomicOps
	}
	var out []Options
	for _, conn := range Connections {
		for _, op := range ops {
			for _, mode := range Modes {
				out = append(out, Options{Conn: conn, AtomicOp: op, Mode: mode})
			}
		}
	}
	return out
}

// Perftest returns the runs of every perftest tool between ports like p:
// at p's IPv4 GID (-x), the cross product of Tools, Connections,
// AtomicOps (the atomic tools) and Modes, less what perftest refuses
// (Refusal); and each tool's first run (RC, one size) at each of p's
// other GIDs.
func Perftest(p Port) []Run {
	var runs []Run
	for _, t := range Tools {
		all := t.Combinations()
		for _, o := range all {
			if len(Refusal(t, o)) == 0 {
				runs = append(runs, perftestRun(t, o, p, p.IPv4GID))
			}
		}
		for _, gid := range p.GIDs {
			if gid != p.IPv4GID {
				runs = append(runs, perftestRun(t, Options{Conn: "RC", AtomicOp: all[0].AtomicOp, Mode: Base}, p, gid))
			}
		}
	}
	return runs
}

// perftestRun is the run of tool t with options o at GID index gid.
func perftestRun(t Tool, o Options, p Port, gid int) Run {
	args := []string{"-x", strconv.Itoa(gid), "-F"}
	if o.Conn != "RC" {
		args = append(args, "-c", o.Conn)
	}
	if o.AtomicOp != "" {
		args = append(args, "-A", o.AtomicOp)
	}
	size := bwSize
	switch {
	case t.Verb == Atomic:
		size = atomicLen
	case !t.BW:
		size = latSize
	case o.Conn == "UD":
		size = p.ActiveMTU // perftest makes a larger one the MTU
	}
	sizes := []int{size}
	iters := bwIters
	if !t.BW {
		iters = latIters
	}
	switch o.Mode {
	case All:
		sizes, iters = nil, allIters
		for s := 2; s <= 1<<maxAllPow && (o.Conn != "UD" || s <= p.ActiveMTU); s *= 2 {
			sizes = append(sizes, s)
		}
		args = append(args, "-a", "-n", strconv.Itoa(iters))
	case Duration:
		iters = 0
		args = append(args, strings.Fields(string(o.Mode))...)
	case QPs:
		iters = qpsIters
		args = append(args, strings.Fields(string(o.Mode))...)
		args = append(args, "-n", strconv.Itoa(iters))
	case Bidir:
		args = append(args, "-b", "-n", strconv.Itoa(iters))
	default:
		args = append(args, "-n", strconv.Itoa(iters))
	}
	if t.Verb != Atomic && o.Mode != All {
		args = append(args, "-s", strconv.Itoa(size))
	}
	rows := iters
	if o.Mode == QPs {
		rows *= 4 // a bandwidth test counts the iterations of all its QPs
	}
	r := Run{Tool: t.Name(), Package: "perftest", Args: args, Pair: true, Timeout: 120 * time.Second,
		check: checkPerftest(t, o, sizes, rows)}
	return r
}

// perftest's result tables (perftest_parameters.h: RESULT_FMT,
// RESULT_FMT_LAT, RESULT_FMT_LAT_DUR and their REPORT_FMT rows).
const (
	bwHeader     = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
	latHeader    = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]"
	latDurHeader = " #bytes        #iterations       t_avg[usec]    tps average"
)

// number is a figure of a row: perftest prints inf and -nan where its
// clock's calibration failed on a busy machine (get_cpu_mhz finds no
// steady frequency and returns 0, "Correlation coefficient r^2: … <
// 0.9"), which says nothing of the run: its row comes after all its
// iterations completed.
var number = `\s+(?:[0-9]+\.[0-9]+|-?inf|-?nan)`

// calibration is that warning as perftest writes it to stderr: captured
// with stdout, it may land inside a row, between its last figure and its
// newline, so it goes before the rows are read.
var calibration = regexp.MustCompile(`Correlation coefficient r\^2: [^\n]* < [0-9.]+\n`)

// checkPerftest: the client prints perftest's results table with a row
// for every size of the run, of the iterations asked for (any number in
// duration mode); so does the server where perftest has it report too —
// the SEND tests, whose server measures what it receives, the latency
// tests but READ's and ATOMIC's, which the client alone measures, and
// the bidirectional ones.
func checkPerftest(t Tool, o Options, sizes []int, iters int) func(srv, cli Result) error {
	header, cols := bwHeader, 3
	switch {
	case !t.BW && o.Mode == Duration:
		header, cols = latDurHeader, 2
	case !t.BW:
		header, cols = latHeader, 7
	}
	rowRe := func(size int) *regexp.Regexp {
		return regexp.MustCompile(fmt.Sprintf(`(?m)^\s*%d\s+(\d+)(?:%s){%d}\s*$`, size, number, cols))
	}
	server := t.Verb == Send || o.Mode == Bidir || (!t.BW && t.Verb != Read && t.Verb != Atomic)
	return func(srv, cli Result) error {
		sides := []struct {
			name string
			out  string
		}{{"client", cli.Out}}
		if server {
			sides = append(sides, struct {
				name string
				out  string
			}{"server", srv.Out})
		}
		for _, side := range sides {
			side.out = calibration.ReplaceAllString(side.out, "")
			if !strings.Contains(side.out, header) {
				return fmt.Errorf("%s: no results table: %s", side.name, lastLines(side.out, 3))
			}
			for _, size := range sizes {
				m := rowRe(size).FindStringSubmatch(side.out)
				if m == nil {
					return fmt.Errorf("%s: no result row for %d bytes: %s", side.name, size, lastLines(side.out, 3))
				}
				n, _ := strconv.Atoi(m[1])
				if iters > 0 && n != iters || n <= 0 {
					return fmt.Errorf("%s: %d iterations of %d bytes, want %d: %s", side.name, n, size, iters, strings.TrimSpace(m[0]))
				}
			}
		}
		return nil
	}
}
