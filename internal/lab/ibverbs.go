package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/taproce/taproce/internal/ibvlib"
)

// The lab also runs Debian's own RDMA programs — rdma-core's
// ibv_rc_pingpong and perftest's ib_write_bw and ib_send_lat, the
// binaries as packaged, unmodified — between its namespaces, on taproce's
// libibverbs.so.1 (verbs/libibverbs) instead of rdma-core's, with the
// same arguments as the runs of taproce's own tools, so that the table
// shows what a program linked to libibverbs gets beside what taproce's
// tools get. A program or library this machine lacks makes a row that
// says so, and the lab goes on.

// lookPath finds a program; tests replace it.
var lookPath = exec.LookPath

// debianTool is one of Debian's programs the lab runs: its name and the
// package that has it.
type debianTool struct{ name, pkg string }

var (
	rcPingpongTool = debianTool{"ibv_rc_pingpong", "ibverbs-utils"}
	writeBWTool    = debianTool{"ib_write_bw", "perftest"}
	sendLatTool    = debianTool{"ib_send_lat", "perftest"}
)

// debianPerf pairs a perftest program with the `taproce perf` test of
// labPerfRuns whose size and iterations it runs with, and after whose
// row its row comes.
var debianPerf = []struct {
	tool debianTool
	like string
}{{writeBWTool, "write_bw"}, {sendLatTool, "send_lat"}}

// library is what the Debian programs run on: the library's directory,
// or why there is none (skip: missing here, or fail: wrong).
type library struct {
	found ibvlib.Found
	why   string
	fail  bool
}

// ok reports whether the programs can run.
func (lib library) ok() bool { return lib.why == "" }

// env returns the environment a program in the lab needs to run on
// taproce: the library's directory first on the loader's path (before
// any the user set), the lab's socket.
func (lib library) env(socket string) []string {
	path := lib.found.Dir
	if old := os.Getenv("LD_LIBRARY_PATH"); old != "" {
		path += ":" + old
	}
	return append(os.Environ(), "LD_LIBRARY_PATH="+path, "TAPROCE_SOCKET="+socket)
}

// findLibrary looks for taproce's libibverbs.so.1 as `taproce exec` does
// (dir, the --lib flag; $TAPROCE_LIBDIR; beside binary; installed)
// and, where none is found and nothing names a directory, builds it with
// make in the source checkout the lab runs in, if it runs in one. A
// missing library (or toolchain to build one) is a skipped step; a file
// that is not taproce's library, or a build that fails, a failed one.
func findLibrary(ctx context.Context, dir, binary string) (library, Step) {
	start := time.Now()
	s := Step{Name: "taproce's libibverbs.so.1 for Debian's programs"}
	lib := library{}
	found, err := ibvlib.Find(dir, binary)
	named := dir != "" || os.Getenv(ibvlib.EnvDir) != ""
	if errors.Is(err, ibvlib.ErrNotFound) && !named {
		wd, _ := os.Getwd()
		if top, ok := ibvlib.Checkout(wd); ok {
			var berr error
			found, berr = ibvlib.Build(ctx, top, nil)
			switch {
			case berr == nil:
				err = nil
			case errors.Is(berr, ibvlib.ErrNoToolchain):
				err = fmt.Errorf("%w; and %w", err, berr)
			default:
				err = berr
			}
		}
	}
	s.Took = time.Since(start)
	switch {
	case err == nil:
		lib.found = found
		s.OK, s.Detail = true, found.String()
	case errors.Is(err, ibvlib.ErrNotFound):
		lib.why = "no taproce libibverbs.so.1"
		s.OK, s.Skipped = true, true
		s.Detail = "not run: " + err.Error()
		if !named {
			s.Detail += " (--lib or " + ibvlib.EnvDir + " names one; make -C verbs/libibverbs in a checkout builds one)"
		}
	default:
		lib.why, lib.fail = "no usable taproce libibverbs.so.1", true
		s.Detail = err.Error()
	}
	return lib, s
}

// notRun returns the step of a Debian program that cannot run here, and
// whether it can: skipped when the program or the library is missing,
// failed when the library is wrong.
func (lib library) notRun(name string, tool debianTool) (string, Step, bool) {
	path, err := lookPath(tool.name)
	s := Step{Name: name}
	switch {
	case err != nil:
		s.OK, s.Skipped = true, true
		s.Detail = fmt.Sprintf("not run: %s is not installed (Debian's %s; scripts/setup installs it)", tool.name, tool.pkg)
	case !lib.ok():
		s.OK, s.Skipped = !lib.fail, !lib.fail
		s.Detail = "not run: " + lib.why
	default:
		return path, s, true
	}
	return "", s, false
}

// debianPingpong runs ibv_rc_pingpong between the first two hosts with
// the arguments of the lab's own RC pingpong: 1000 round trips of 4 KiB,
// each side checking what it received (-c). Its verdict is its own: both
// sides exit 0, print their result lines, and report no invalid data
// (-c prints "invalid data in page N" and still exits 0).
func (l *Lab) debianPingpong(ctx context.Context, lib library) Step {
	a, b := l.Hosts[0], l.Hosts[1]
	name := fmt.Sprintf("ibv_rc_pingpong (Debian's, on taproce's libibverbs) %s → %s", a.Namespace, b.Namespace)
	path, s, ok := lib.notRun(name, rcPingpongTool)
	if !ok {
		return s
	}
	start := time.Now()
	args := []string{"-g", "1", "-n", "1000", "-s", "4096", "-c"}
	srvOut, out, err := l.pairEnv(ctx, lib.env(l.Socket), path, a, b, append([]string{"-d", b.Device}, args...),
		append([]string{"-d", a.Device}, args...), exchangePort, 60*time.Second)
	s.Took = time.Since(start)
	s.OK, s.Detail = judgePingpong(srvOut, out, err)
	return s
}

// judgePingpong reads ibv_rc_pingpong's verdict from both sides' output
// and the pair's error.
func judgePingpong(srvOut, cliOut string, err error) (bool, string) {
	if err != nil {
		return false, err.Error()
	}
	for _, side := range []struct{ name, out string }{{"server", srvOut}, {"client", cliOut}} {
		for _, line := range strings.Split(side.out, "\n") {
			if strings.Contains(line, "invalid data") {
				return false, side.name + ": " + strings.TrimSpace(line)
			}
		}
	}
	m, n := itersRe.FindStringSubmatch(cliOut), bytesRe.FindStringSubmatch(cliOut)
	if m == nil || n == nil || !itersRe.MatchString(srvOut) {
		return false, "no result line: " + lastLine(cliOut)
	}
	return true, fmt.Sprintf("%s iters, %s µs/iter, %s Mbit/s", m[1], m[3], n[3])
}

// debianPerfSteps runs each of debianPerf between the first two hosts,
// its server in the second, with the size and iterations of its
// counterpart in labPerfRuns, and returns a step per program and the
// table's rows.
func (l *Lab) debianPerfSteps(ctx context.Context, lib library) ([]Step, []perfRow) {
	a, b := l.Hosts[0], l.Hosts[1]
	var steps []Step
	var rows []perfRow
	for _, d := range debianPerf {
		r := perfRun{test: d.tool.name}
		for _, like := range labPerfRuns {
			if like.test == d.like {
				r.size, r.iters = like.size, like.iters
			}
		}
		name := fmt.Sprintf("%s %d B (Debian's perftest, on taproce's libibverbs) %s → %s", r.test, r.size, a.Namespace, b.Namespace)
		row := perfRow{run: r, like: d.like}
		path, s, ok := lib.notRun(name, d.tool)
		if !ok {
			row.notRun = true
			row.detail = s.Detail
			steps, rows = append(steps, s), append(rows, row)
			continue
		}
		start := time.Now()
		args := []string{"-x", "1", "-F", "-s", fmt.Sprint(r.size), "-n", fmt.Sprint(r.iters)}
		_, out, err := l.pairEnv(ctx, lib.env(l.Socket), path, a, b, append([]string{"-d", b.Device}, args...),
			append([]string{"-d", a.Device}, args...), exchangePort, 120*time.Second)
		s.Took = time.Since(start)
		if err != nil {
			row.detail = err.Error()
		} else {
			row.ok, row.bw, row.rate, row.lat, row.detail = parsePerftest(out, r)
		}
		s.OK, s.Detail = row.ok, row.detail
		steps, rows = append(steps, s), append(rows, row)
	}
	return steps, rows
}

var perftestFloat = `\s+([0-9]+(?:\.[0-9]+)?)`

// parsePerftest reads the result row of a perftest client's table for
// run r: a bandwidth test's "#bytes #iterations BW peak, BW average
// [MB/sec], MsgRate[Mpps]" or a latency test's "#bytes #iterations
// t_min t_max t_typical t_avg …[usec]". perftest's MB are 2^20 bytes, as
// taproce perf's. No row for r's size and iterations, as perftest prints
// after a run that failed, is a failure.
func parsePerftest(out string, r perfRun) (ok bool, bw, rate, lat float64, detail string) {
	lead := fmt.Sprintf(`(?m)^\s*%d\s+%d`, r.size, r.iters)
	if strings.HasSuffix(r.test, "_lat") {
		m := regexp.MustCompile(lead + strings.Repeat(perftestFloat, 4)).FindStringSubmatch(out)
		if m == nil || !strings.Contains(out, "t_typical[usec]") {
			return false, 0, 0, 0, "no result table: " + lastLine(out)
		}
		typ, _ := strconv.ParseFloat(m[3], 64)
		avg, _ := strconv.ParseFloat(m[4], 64)
		return true, 0, 0, typ, fmt.Sprintf("%d iterations, typical %.2f µs, average %.2f µs", r.iters, typ, avg)
	}
	m := regexp.MustCompile(lead + strings.Repeat(perftestFloat, 3)).FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "BW average[MB/sec]") {
		return false, 0, 0, 0, "no result table: " + lastLine(out)
	}
	bw, _ = strconv.ParseFloat(m[2], 64)
	rate, _ = strconv.ParseFloat(m[3], 64)
	return true, bw, rate, 0, fmt.Sprintf("%d iterations, %.2f MB/sec, %.4f Mpps", r.iters, bw, rate)
}

// withDebian returns the table's rows with each Debian program's row
// right after the row of the taproce perf test it runs like.
func withDebian(rows, debian []perfRow) []perfRow {
	out := make([]perfRow, 0, len(rows)+len(debian))
	placed := make([]bool, len(debian))
	for _, r := range rows {
		out = append(out, r)
		for i, d := range debian {
			if !placed[i] && d.like == r.run.test {
				out, placed[i] = append(out, d), true
			}
		}
	}
	for i, d := range debian {
		if !placed[i] {
			out = append(out, d)
		}
	}
	return out
}
