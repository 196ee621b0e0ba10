package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/taproce/taproce/internal/ibvlib"
)

// perftest 4.5's client output, as Debian's ib_write_bw and ib_send_lat
// print it on taproce (the header's lines cut).
const (
	writeBWOut = `---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF		Device         : taproce0
 GID index       : 1
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      2000             116.63             86.03  		   0.001376
---------------------------------------------------------------------------------------
`
	sendLatOut = `---------------------------------------------------------------------------------------
                    Send Latency Test
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 2       1000          28.19          696.89       28.93    	       42.41       	21.52  		141.16  		696.89 
---------------------------------------------------------------------------------------
`
	// What perftest prints when the connection breaks: the header, an
	// error, no result row.
	brokenOut = `---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
Completion with error at client
Failed status 12: wr_id 0 syndrom 0x81
scnt=128, ccnt=0
`
)

// TestParsePerftest: the client's result row for the run's size and
// iterations gives the figures; a table without it is a failure, as is
// a row of another run.
func TestParsePerftest(t *testing.T) {
	bw := perfRun{"ib_write_bw", 65536, 2000}
	lat := perfRun{"ib_send_lat", 2, 1000}
	ok, b, rate, l, detail := parsePerftest(writeBWOut, bw)
	if !ok || b != 86.03 || rate != 0.001376 || l != 0 || detail != "2000 iterations, 86.03 MB/sec, 0.0014 Mpps" {
		t.Errorf("ib_write_bw: %v %v %v %v %q", ok, b, rate, l, detail)
	}
	ok, b, rate, l, detail = parsePerftest(sendLatOut, lat)
	if !ok || l != 28.93 || b != 0 || rate != 0 || detail != "1000 iterations, typical 28.93 µs, average 42.41 µs" {
		t.Errorf("ib_send_lat: %v %v %v %v %q", ok, b, rate, l, detail)
	}
	for _, c := range []struct {
		name string
		out  string
		run  perfRun
	}{
		{"broken", brokenOut, bw},
		{"another size", writeBWOut, perfRun{"ib_write_bw", 4096, 2000}},
		{"other iterations", sendLatOut, perfRun{"ib_send_lat", 2, 500}},
		{"a latency test's table for bandwidth", sendLatOut, perfRun{"ib_write_bw", 2, 1000}},
		{"nothing", "", lat},
	} {
		if ok, _, _, _, detail := parsePerftest(c.out, c.run); ok || !strings.HasPrefix(detail, "no result table") {
			t.Errorf("%s: %v %q", c.name, ok, detail)
		}
	}
}

// TestJudgePingpong: ibv_rc_pingpong passes when both sides print their
// result and neither reports invalid data (which -c prints while still
// exiting 0).
func TestJudgePingpong(t *testing.T) {
	const result = "  local address:  LID 0x0000, QPN 0x000012, PSN 0x955f3c, GID ::ffff:10.77.0.2\n" +
		"819200 bytes in 0.01 seconds = 543.96 Mbit/sec\n1000 iters in 0.12 seconds = 120.48 usec/iter\n"
	if ok, d := judgePingpong(result, result, nil); !ok || d != "1000 iters, 120.48 µs/iter, 543.96 Mbit/s" {
		t.Errorf("good: %v %q", ok, d)
	}
	for _, c := range []struct {
		name     string
		srv, cli string
		err      error
		detail   string
	}{
		{"invalid data at the server", "invalid data in page 0\n" + result, result, nil, "server: invalid data in page 0"},
		{"invalid data at the client", result, result + "invalid data in page 1\n", nil, "client: invalid data in page 1"},
		{"no result", result, "Couldn't connect to 10.55.0.2:18515\n", nil, "no result line: Couldn't connect"},
		{"server without result", "Failed to modify QP to RTR\n", result, nil, "no result line"},
		{"exit status", result, result, errors.New("client: exit status 1: x"), "client: exit status 1"},
	} {
		if ok, d := judgePingpong(c.srv, c.cli, c.err); ok || !strings.HasPrefix(d, c.detail) {
			t.Errorf("%s: %v %q", c.name, ok, d)
		}
	}
}

// TestWithDebian: each Debian row comes right after the taproce perf
// row it runs like; one without such a row comes last.
func TestWithDebian(t *testing.T) {
	rows := []perfRow{{run: perfRun{test: "write_bw"}}, {run: perfRun{test: "read_bw"}}, {run: perfRun{test: "send_lat"}}}
	debian := []perfRow{{run: perfRun{test: "ib_write_bw"}, like: "write_bw"}, {run: perfRun{test: "ib_send_lat"}, like: "send_lat"},
		{run: perfRun{test: "ib_x"}, like: "x"}}
	var got []string
	for _, r := range withDebian(rows, debian) {
		got = append(got, r.run.test)
	}
	if want := "write_bw ib_write_bw read_bw send_lat ib_send_lat ib_x"; strings.Join(got, " ") != want {
		t.Errorf("%v, want %s", got, want)
	}
}

// TestDebianRunsLikeTaproce: each Debian perftest program runs with the
// size and iterations of its taproce perf counterpart, which exists.
func TestDebianRunsLikeTaproce(t *testing.T) {
	for _, d := range debianPerf {
		found := false
		for _, r := range labPerfRuns {
			found = found || r.test == d.like
		}
		if !found || !strings.HasSuffix(d.tool.name, d.like) {
			t.Errorf("%s runs like %q, which the lab does not run", d.tool.name, d.like)
		}
	}
}

// fakeLab is a lab of two named hosts, enough for the steps that do not
// run.
func fakeLab() *Lab {
	return &Lab{Hosts: []*Host{{Index: 1, Namespace: "lab-1", Device: "taproce0"}, {Index: 2, Namespace: "lab-2", Device: "taproce1"}}}
}

// TestDebianNotRun: without the library, or without the programs, every
// Debian program has a row that says why it did not run, and none of it
// is a failure; a library that is not taproce's is one.
func TestDebianNotRun(t *testing.T) {
	ctx := context.Background()
	lib, s := findLibrary(ctx, t.TempDir(), "")
	if !s.OK || !s.Skipped || lib.ok() || !strings.Contains(s.Detail, "no taproce libibverbs.so.1 in") || !strings.Contains(s.Detail, "--lib") {
		t.Fatalf("an empty --lib: %+v", s)
	}
	check := func(what string, lib library, want string) {
		t.Helper()
		l := fakeLab()
		steps := []Step{l.debianPingpong(ctx, lib)}
		ds, rows := l.debianPerfSteps(ctx, lib)
		steps = append(steps, ds...)
		if len(steps) != 3 || len(rows) != 2 {
			t.Fatalf("%s: %d steps, %d rows", what, len(steps), len(rows))
		}
		for _, s := range steps {
			if !s.OK || !s.Skipped || !strings.Contains(s.Detail, want) {
				t.Errorf("%s: %+v, want skipped for %q", what, s, want)
			}
		}
		var out strings.Builder
		printPerf(&out, withDebian([]perfRow{{run: perfRun{"write_bw", 65536, 2000}, ok: true, bw: 900}}, rows), 0, perfConfig{mtu: 9000, superFrames: true})
		flat := strings.ReplaceAll(out.String(), "\n ", " ")
		if !regexp.MustCompile(`ib_write_bw\s+65536\s+2000\s+not run`).MatchString(out.String()) ||
			!regexp.MustCompile(`ib_send_lat: not run: [^.]*`+regexp.QuoteMeta(want)).MatchString(flat) {
			t.Errorf("%s: the table does not say so:\n%s", what, out.String())
		}
	}
	check("no library", lib, "no taproce libibverbs.so.1")

	old := lookPath
	lookPath = func(name string) (string, error) { return "", fmt.Errorf("%s: %w", name, exec.ErrNotFound) }
	defer func() { lookPath = old }()
	check("no programs", library{found: ibvlib.Found{Dir: "/x"}}, "is not installed (Debian's")

	// rdma-core's library named as taproce's: a failure.
	lookPath = old
	for _, sys := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"} {
		if _, err := os.Stat(filepath.Join(sys, ibvlib.Name)); err != nil {
			continue
		}
		lib, s := findLibrary(ctx, sys, "")
		if s.OK || s.Skipped || !strings.Contains(s.Detail, "not taproce's library") {
			t.Errorf("rdma-core's library: %+v", s)
		}
		if s := fakeLab().debianPingpong(ctx, lib); s.OK || s.Skipped {
			t.Errorf("ibv_rc_pingpong on rdma-core's library: %+v", s)
		}
	}
}

// TestFindLibraryBuilds: where nothing names a directory and none is
// installed, the lab, run in a source checkout (as the tests run),
// builds the library with make.
func TestFindLibraryBuilds(t *testing.T) {
	t.Setenv(ibvlib.EnvDir, "")
	old := ibvlib.SystemDirs
	ibvlib.SystemDirs = []string{t.TempDir()}
	defer func() { ibvlib.SystemDirs = old }()
	lib, s := findLibrary(context.Background(), "", filepath.Join(t.TempDir(), "bin", "taproce"))
	if s.Skipped && strings.Contains(s.Detail, "toolchain") {
		t.Skip(s.Detail)
	}
	if !s.OK || s.Skipped || !lib.ok() || !strings.Contains(s.Detail, "(built in ") {
		t.Fatalf("%+v", s)
	}
	if err := ibvlib.Check(lib.found.Path()); err != nil {
		t.Error(err)
	}
	env := strings.Join(lib.env("/run/x.sock"), "\n")
	if !regexp.MustCompile(`\nLD_LIBRARY_PATH=`+regexp.QuoteMeta(lib.found.Dir)+`[:\n]`).MatchString(env) || !strings.HasSuffix(env, "\nTAPROCE_SOCKET=/run/x.sock") {
		t.Errorf("environment without the library's directory or the socket")
	}
}

// TestPrintSteps: a skipped step reads "skip", a failed one "FAIL".
func TestPrintSteps(t *testing.T) {
	var out strings.Builder
	printSteps(&out, []Step{{Name: "a", OK: true}, {Name: "b", OK: true, Skipped: true, Detail: "not run: x"}, {Name: "c"}})
	for _, re := range []string{`(?m)^a\s+ok\s`, `(?m)^b\s+skip\s.*not run: x$`, `(?m)^c\s+FAIL\s`} {
		if !regexp.MustCompile(re).MatchString(out.String()) {
			t.Errorf("no %s:\n%s", re, out.String())
		}
	}
}

// TestLabDebianPrograms runs the lab as `taproce lab` does, from this
// source checkout with nothing installed, so that it builds taproce's
// libibverbs.so.1 with make, and checks Debian's programs on it between
// the namespaces: ibv_rc_pingpong's step beside the lab's own RC
// pingpong, and ib_write_bw and ib_send_lat each in the perf table right
// after the taproce perf run of the same size and iterations, with
// figures, judged by the programs' own output.
func TestLabDebianPrograms(t *testing.T) {
	p := prefix(t)
	for _, tool := range []debianTool{rcPingpongTool, writeBWTool, sendLatTool} {
		if _, err := exec.LookPath(tool.name); err != nil {
			t.Skipf("needs Debian's %s (%s; scripts/setup installs it): %v", tool.name, tool.pkg, err)
		}
	}
	t.Setenv(ibvlib.EnvDir, "")
	old := ibvlib.SystemDirs
	ibvlib.SystemDirs = nil
	defer func() { ibvlib.SystemDirs = old }()
	if lib, s := findLibrary(context.Background(), "", ""); !lib.ok() {
		t.Skipf("no library to run them on: %s", s.Detail)
	}
	var out strings.Builder
	steps, err := Run(context.Background(), Options{Prefix: p, Hosts: 2, Offload: true, Frames: 200, RDMA: -1, Out: &out,
		Binary: taproceBinary(t), Socket: filepath.Join(t.TempDir(), "lab.sock")})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	want := map[string]*regexp.Regexp{
		"taproce's libibverbs.so.1 for Debian's programs": regexp.MustCompile(`/verbs/libibverbs/build/libibverbs\.so\.1 \(built in /`),
		"ibv_rc_pingpong (Debian's":                       regexp.MustCompile(`^1000 iters, [0-9.]+ µs/iter, [0-9.]+ Mbit/s$`),
		"ib_write_bw 65536 B (Debian's perftest":          regexp.MustCompile(`^2000 iterations, [0-9.]+ MB/sec, [0-9.]+ Mpps$`),
		"ib_send_lat 2 B (Debian's perftest":              regexp.MustCompile(`^1000 iterations, typical [0-9.]+ µs, average [0-9.]+ µs$`),
	}
	for _, s := range steps {
		for name, re := range want {
			if strings.HasPrefix(s.Name, name) {
				if !s.OK || s.Skipped || !re.MatchString(s.Detail) {
					t.Errorf("%s: ok %v, skipped %v, %q", s.Name, s.OK, s.Skipped, s.Detail)
				}
				delete(want, name)
			}
		}
	}
	for name := range want {
		t.Errorf("no step %q", name)
	}
	// The table: each Debian row right after its taproce perf row, with a
	// figure in the column its kind of test fills.
	table := out.String()
	for _, re := range []string{
		`\n\s+write_bw\s+65536\s+2000\s+[0-9.]+\s+[0-9.]+\s*\n\s+ib_write_bw\s+65536\s+2000\s+[0-9.]+\s+[0-9.]+\s*\n`,
		`\n\s+send_lat\s+2\s+1000\s+[0-9.]+\s*\n\s+ib_send_lat\s+2\s+1000\s+[0-9.]+\s*\n`,
		`Debian's ib_write_bw \(as write_bw\), ib_send_lat \(as send_lat\) ran unmodified`,
	} {
		if !regexp.MustCompile(re).MatchString(strings.ReplaceAll(table, "\n taproce's", " taproce's")) {
			t.Errorf("the table lacks %s", re)
		}
	}
	t.Logf("\n%s", table)
}
