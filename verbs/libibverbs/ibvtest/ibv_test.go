package ibvtest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/matrix"
)

const timeout = 60 * time.Second

// freePort returns a TCP port nobody listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestSymbols: the library exports what rdma-core 44's libibverbs.so.1
// exports, each symbol with its version (symbols.txt), and the
// installed one agrees with that list.
func TestSymbols(t *testing.T) {
	l := Need(t, false)
	if _, err := exec.LookPath("objdump"); err != nil {
		t.Skip("no objdump")
	}
	syms := func(path string) []string {
		out, err := exec.Command("objdump", "-T", path).Output()
		if err != nil {
			t.Fatalf("objdump %s: %v", path, err)
		}
		var s []string
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 || strings.Contains(line, "*UND*") || !strings.Contains(f[len(f)-2], "IBVERBS") {
				continue
			}
			s = append(s, f[len(f)-2]+" "+f[len(f)-1])
		}
		sort.Strings(s)
		return s
	}
	ours := syms(l.Dir + "/libibverbs.so.1")
	want := strings.Fields(readFile(t, srcDir()+"/symbols.txt"))
	var pairs []string
	for i := 0; i+1 < len(want); i += 2 {
		pairs = append(pairs, want[i]+" "+want[i+1])
	}
	sort.Strings(pairs)
	if strings.Join(ours, "\n") != strings.Join(pairs, "\n") {
		t.Errorf("exported symbols differ from symbols.txt:\n%s", diff(pairs, ours))
	}
	for _, sys := range []string{"/usr/lib/x86_64-linux-gnu/libibverbs.so.1", "/usr/lib/aarch64-linux-gnu/libibverbs.so.1"} {
		if _, err := os.Stat(sys); err != nil {
			continue
		}
		if got := syms(sys); strings.Join(got, "\n") != strings.Join(pairs, "\n") {
			t.Errorf("%s exports other symbols than symbols.txt:\n%s", sys, diff(pairs, got))
		}
	}
}

func diff(want, got []string) string {
	w, g := map[string]bool{}, map[string]bool{}
	for _, s := range want {
		w[s] = true
	}
	for _, s := range got {
		g[s] = true
	}
	var b strings.Builder
	for _, s := range want {
		if !g[s] {
			fmt.Fprintf(&b, "  missing %s\n", s)
		}
	}
	for _, s := range got {
		if !w[s] {
			fmt.Fprintf(&b, "  extra %s\n", s)
		}
	}
	return b.String()
}

// TestNoAppliance: with no appliance the device list fails as rdma-core's
// does on a machine without kernel RDMA (ENOSYS), at once.
func TestNoAppliance(t *testing.T) {
	l := Need(t, false)
	env := append(l.Env(t.TempDir()+"/nothing.sock"), "TAPROCE_QUIET=1")
	out, err := Run(t, env, timeout, "ibv_devices")
	if err == nil || !strings.Contains(out, "Failed to get IB devices list: Function not implemented") {
		t.Fatalf("ibv_devices without an appliance: %v\n%s", err, out)
	}
}

// TestDevices: ibv_devices lists the appliance's devices with their node
// GUIDs, and ibv_devinfo -v reports them as rxe reports its own: RoCE v2
// GIDs, max_mtu 4096 and the link's active MTU; and both pass the
// matrix's judgement (matrix.Info).
func TestDevices(t *testing.T) {
	l := Need(t, false)
	r := appliancetest.New(t, appliancetest.Options{Namespace: "ibv"})
	env := l.Env(r.Socket)
	out, err := Run(t, env, timeout, "ibv_devices")
	if err != nil {
		t.Fatalf("ibv_devices: %v\n%s", err, out)
	}
	for _, n := range r.NICs {
		m := n.Port().MAC()
		guid := fmt.Sprintf("%02x%02x%02xfffe%02x%02x%02x", m[0]^2, m[1], m[2], m[3], m[4], m[5])
		if !strings.Contains(out, n.Name()) || !strings.Contains(out, guid) {
			t.Errorf("ibv_devices does not list %s with GUID %s:\n%s", n.Name(), guid, out)
		}
	}
	out, err = Run(t, env, timeout, "ibv_devinfo", "-v", "-d", "taproce0")
	if err != nil {
		t.Fatalf("ibv_devinfo: %v\n%s", err, out)
	}
	for _, want := range []string{"hca_id:\ttaproce0", "transport:\t\t\tInfiniBand (0)", "state:\t\t\tPORT_ACTIVE (4)",
		"max_mtu:\t\t4096 (5)", "active_mtu:\t\t1024 (3)", "link_layer:\t\tEthernet",
		"GID[  0]:\t\tfe80::", "GID[  1]:\t\t::ffff:10.77.0.1, RoCE v2"} {
		if !strings.Contains(out, want) {
			t.Errorf("ibv_devinfo -v lacks %q:\n%s", want, out)
		}
	}
	// The matrix's runs of both, on each device, as the lab runs them.
	for _, run := range matrix.Info() {
		for _, dev := range []string{"taproce0", "taproce1"} {
			out, err := Run(t, env, run.Timeout, run.Tool, run.Command(dev, 0, "")...)
			if err := run.Judge(matrix.Result{}, matrix.Result{Device: dev, Out: out, Err: err}); err != nil {
				t.Errorf("%s on %s: %v", run.Name(), dev, err)
			}
		}
	}
}

// TestPingpong runs rdma-core's pingpong examples, unmodified, between
// the appliance's two devices: the matrix's runs (matrix.Pingpong), each
// at every GID index and size the ports offer, checking what it received
// (-c), judged by its own verdict.
func TestPingpong(t *testing.T) {
	l := Need(t, false)
	r := appliancetest.New(t, appliancetest.Options{Namespace: "ibv", Depth: matrixDepth})
	env := l.Env(r.Socket)
	runMatrix(t, env, matrix.Pingpong(matrixPort(t, env)))
}

// matrixDepth is how many frames each end of the fake wire the matrix
// runs over queues before it drops: as many bytes as a port's TAP
// queues (appliance.RxQueueFrames frames of up to 64 KiB, as the kernel
// hands a TAP with super-frames a GSO frame whole), where the fake wire
// queues single frames of up to 4 KiB. UC and UD senders have no window,
// so a shallower queue loses what a TAP would hold.
const matrixDepth = 1 << 16

// matrixPort returns the port the matrix runs over, as ibv_devinfo -v
// reports taproce1's.
func matrixPort(t *testing.T, env []string) matrix.Port {
	t.Helper()
	out, err := Run(t, env, timeout, "ibv_devinfo", "-v", "-d", "taproce1")
	if err != nil {
		t.Fatalf("ibv_devinfo: %v\n%s", err, out)
	}
	p, err := matrix.ParseDevinfo(out)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// runMatrix runs each of runs between the appliance's devices, a server
// on taproce0 and its client on taproce1, in a subtest of its own, and
// judges it by the programs' own verdict (matrix.Run.Judge).
func runMatrix(t *testing.T, env []string, runs []matrix.Run) {
	t.Helper()
	start := time.Now()
	for _, run := range runs {
		t.Run(run.Name(), func(t *testing.T) {
			port := freePort(t)
			srv := Start(t, env, run.Timeout, run.Tool, run.Command("taproce0", port, "")...)
			WaitListen(t, srv, port, timeout)
			cli := Start(t, env, run.Timeout, run.Tool, run.Command("taproce1", port, "127.0.0.1")...)
			cerr := cli.Wait()
			if cerr != nil {
				// A server whose client failed may wait for it for ever.
				select {
				case <-srv.done:
				case <-time.After(time.Second):
					srv.cancel()
				}
			}
			serr := srv.Wait()
			err := run.Judge(matrix.Result{Device: "taproce0", Out: srv.Out.String(), Err: serr},
				matrix.Result{Device: "taproce1", Out: cli.Out.String(), Err: cerr})
			if err != nil {
				t.Fatalf("%v\nclient:\n%s\nserver:\n%s", err, cli.Out.String(), srv.Out.String())
			}
		})
	}
	t.Logf("%d runs in %v", len(runs), time.Since(start).Round(time.Millisecond))
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := exec.Command("cat", path).Output()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPerftest runs every perftest 4.5 tool, unmodified — Debian's
// binaries, which link libmlx5 and libefa too — between the appliance's
// two devices, with every option of the matrix that perftest allows
// (matrix.Perftest: -a, -b, -q 4, -D, -c UC and UD, both atomics); each
// run is judged by both sides' exit statuses and results tables.
func TestPerftest(t *testing.T) {
	l := Need(t, false)
	r := appliancetest.New(t, appliancetest.Options{Namespace: "ibv", Depth: matrixDepth})
	env := l.Env(r.Socket)
	runMatrix(t, env, matrix.Perftest(matrixPort(t, env)))
}

// TestSanitized runs the pingpong tools, two perftest tools and the
// test's own programs (every kind of memory, fork, misuse) on the library
// built with AddressSanitizer and UndefinedBehaviorSanitizer: a bad access
// or undefined behaviour in it ends the program with a report.
func TestSanitized(t *testing.T) {
	l := Need(t, true)
	r := appliancetest.New(t, appliancetest.Options{Namespace: "ibv"})
	env := l.Env(r.Socket)
	for _, c := range []struct {
		tool string
		args []string
	}{
		{"ibv_rc_pingpong", []string{"-g", "1", "-n", "100", "-e", "-c"}},
		{"ibv_ud_pingpong", []string{"-g", "1", "-n", "100", "-c"}},
		{"ibv_srq_pingpong", []string{"-g", "1", "-n", "50", "-c"}},
		{"ib_write_bw", []string{"-x", "1", "-F", "-s", "65536", "-n", "100"}},
		{"ib_send_lat", []string{"-x", "1", "-F", "-s", "2", "-n", "200"}},
	} {
		t.Run(c.tool, func(t *testing.T) {
			port := freePort(t)
			args := append([]string{"-p", fmt.Sprint(port)}, c.args...)
			srv := Start(t, env, timeout, c.tool, append([]string{"-d", "taproce0"}, args...)...)
			WaitListen(t, srv, port, timeout)
			cli := Start(t, env, timeout, c.tool, append(append([]string{"-d", "taproce1"}, args...), "127.0.0.1")...)
			cerr, serr := cli.Wait(), srv.Wait()
			for _, p := range []*Program{cli, srv} {
				if strings.Contains(p.Out.String(), "Sanitizer") || strings.Contains(p.Out.String(), "runtime error") {
					t.Errorf("a sanitizer reported:\n%s", p.Out.String())
				}
			}
			if cerr != nil || serr != nil {
				t.Fatalf("client: %v\n%s\nserver: %v\n%s", cerr, cli.Out.String(), serr, srv.Out.String())
			}
		})
	}
	for _, c := range [][]string{{"memreg", "plain"}, {"memreg", "fork"}, {"misuse"}, {"extended"}} {
		t.Run(strings.Join(c, "-"), func(t *testing.T) {
			bin := userProgram(t, c[0])
			out, err := Run(t, append(env, "TMPDIR="+t.TempDir()), timeout, bin, c[1:]...)
			if strings.Contains(out, "Sanitizer") || strings.Contains(out, "runtime error") {
				t.Errorf("a sanitizer reported:\n%s", out)
			}
			if err != nil || !strings.HasSuffix(strings.TrimSpace(out), "ok") && !strings.Contains(out, "ok (") {
				t.Fatalf("%s: %v\n%s", c[0], err, out)
			}
		})
	}
}

// userProgram compiles testdata/NAME.c as a user would, against Debian's
// libibverbs-dev (-libverbs) and the libraries libs names (-lrdmacm), and
// returns the binary.
func userProgram(t testing.TB, name string, libs ...string) string {
	t.Helper()
	bin := t.TempDir() + "/" + name
	args := []string{"-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-o", bin, "testdata/" + name + ".c"}
	out, err := exec.Command("cc", append(append(args, libs...), "-libverbs")...).CombinedOutput()
	if err != nil {
		t.Fatalf("cc %s.c: %v\n%s", name, err, out)
	}
	return bin
}

// TestMemoryKinds: a user's program registers every kind of memory it has
// — heap (unaligned, small, large), anonymous and file mmaps, globals,
// huge pages where the machine has them — and moves data into each with
// SEND with immediate, WRITE, READ and both atomics, checking both ends;
// once more with a fork after registration (ibv_fork_init's behaviour:
// the parent's RDMA goes on, the child keeps its own memory).
func TestMemoryKinds(t *testing.T) {
	l := Need(t, false)
	bin := userProgram(t, "memreg")
	huge := hugePages(t, 8)
	for _, mode := range []string{"plain", "fork"} {
		t.Run(mode, func(t *testing.T) {
			r := appliancetest.New(t, appliancetest.Options{Namespace: "ibv"})
			env := append(l.Env(r.Socket), "TMPDIR="+t.TempDir())
			out, err := Run(t, env, timeout, bin, mode)
			if err != nil || !strings.HasPrefix(out, "ok") {
				t.Fatalf("memreg %s: %v\n%s", mode, err, out)
			}
			// Registered huge pages stay huge pages.
			if huge && !strings.Contains(out, "2048 kB pages after registration") {
				t.Fatalf("memreg %s: huge pages lost:\n%s", mode, out)
			}
			t.Log(strings.TrimSpace(out))
		})
	}
}

// TestMisuse: a user's program misuses the verbs (posting in RESET,
// after destroy, beyond the queue, with bad keys and SGEs; overrunning a
// CQ; deregistering a region in use; freeing what is still used) and
// checks it gets libibverbs' answers, not a crash or a hang.
func TestMisuse(t *testing.T) {
	l := Need(t, false)
	bin := userProgram(t, "misuse")
	r := appliancetest.New(t, appliancetest.Options{Namespace: "ibv"})
	out, err := Run(t, l.Env(r.Socket), timeout, bin)
	if err != nil || !strings.HasSuffix(strings.TrimSpace(out), "\nok") {
		t.Fatalf("misuse: %v\n%s", err, out)
	}
}

// TestExtended: a user's program uses the extended CQ (ibv_create_cq_ex,
// ibv_start_poll …) and the work request API of an extended QP
// (ibv_create_qp_ex, ibv_wr_start … ibv_wr_complete), as rxe offers them.
func TestExtended(t *testing.T) {
	l := Need(t, false)
	bin := userProgram(t, "extended")
	r := appliancetest.New(t, appliancetest.Options{Namespace: "ibv"})
	out, err := Run(t, l.Env(r.Socket), timeout, bin)
	if err != nil || !strings.HasSuffix(strings.TrimSpace(out), "ok") {
		t.Fatalf("extended: %v\n%s", err, out)
	}
}

// TestTables: libibverbs' pure functions (status, event, node type and
// port state names; rate conversions) answer on taproce's library exactly
// as on Debian's, over their whole ranges and beyond.
func TestTables(t *testing.T) {
	l := Need(t, false)
	bin := userProgram(t, "tables")
	theirs, err := exec.Command(bin).CombinedOutput()
	if err != nil {
		t.Fatalf("on Debian's libibverbs: %v\n%s", err, theirs)
	}
	ours, err := Run(t, l.Env("/nonexistent"), timeout, bin)
	if err != nil {
		t.Fatalf("on taproce's: %v\n%s", err, ours)
	}
	if ours != string(theirs) {
		a, b := strings.Split(string(theirs), "\n"), strings.Split(ours, "\n")
		for i := range min(len(a), len(b)) {
			if a[i] != b[i] {
				t.Errorf("Debian's: %s\ntaproce's: %s", a[i], b[i])
			}
		}
		if len(a) != len(b) {
			t.Errorf("%d lines from Debian's, %d from taproce's", len(a), len(b))
		}
	}
}

// TestNoSyscalls: while the appliance polls (poll mode spin), posting and
// polling make no system call. Debian's ib_send_lat and ib_write_bw run
// under strace -c twice, with 200 iterations and with 2200; the calls
// they make are their set-up's, as many in both runs. sched_yield is not
// counted: a poll that has found nothing for 50 µs — the appliance off
// the processor, on a machine with fewer processors than busy pollers,
// as here — gives the processor away (cq.c), which is no part of posting
// or polling.
func TestNoSyscalls(t *testing.T) {
	l := Need(t, false)
	if _, err := exec.LookPath("strace"); err != nil {
		t.Skip("strace is not installed (scripts/setup installs it)")
	}
	r := appliancetest.New(t, appliancetest.Options{Namespace: "ibv", Poll: appliance.PollSpin})
	env := l.Env(r.Socket)
	for _, c := range []struct {
		tool string
		args []string
	}{
		{"ib_send_lat", []string{"-x", "1", "-F", "-s", "2"}},
		{"ib_write_bw", []string{"-x", "1", "-F", "-s", "4096"}},
	} {
		t.Run(c.tool, func(t *testing.T) {
			calls := func(iters int) (client, server int) {
				port := freePort(t)
				args := append([]string{"-p", fmt.Sprint(port), "-n", fmt.Sprint(iters)}, c.args...)
				dir := t.TempDir()
				strace := func(side string, args ...string) []string {
					return append([]string{"-f", "-c", "-o", filepath.Join(dir, side), c.tool}, args...)
				}
				srv := Start(t, env, timeout, "strace", strace("server", append([]string{"-d", "taproce0"}, args...)...)...)
				WaitListen(t, srv, port, timeout)
				cli := Start(t, env, timeout, "strace", strace("client", append(append([]string{"-d", "taproce1"}, args...), "127.0.0.1")...)...)
				if cerr, serr := cli.Wait(), srv.Wait(); cerr != nil || serr != nil {
					t.Fatalf("client: %v\n%s\nserver: %v\n%s", cerr, cli.Out.String(), serr, srv.Out.String())
				}
				return straceCalls(t, filepath.Join(dir, "client")), straceCalls(t, filepath.Join(dir, "server"))
			}
			c1, s1 := calls(200)
			c2, s2 := calls(2200)
			t.Logf("system calls: client %d and %d, server %d and %d, for 200 and 2200 iterations", c1, c2, s1, s2)
			// 2000 iterations more may not cost 200 calls more: what
			// differs between two runs is set-up's noise, not a call per
			// post or poll.
			if c2-c1 > 200 || s2-s1 > 200 {
				t.Errorf("2000 iterations more made %d system calls more in the client, %d in the server", c2-c1, s2-s1)
			}
		})
	}
}

// straceCalls reads strace -c's table: the calls of every system call
// but sched_yield.
func straceCalls(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	total, yields := -1, 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		n, err := strconv.Atoi(f[3])
		if err != nil {
			continue
		}
		switch f[len(f)-1] {
		case "total":
			total = n
		case "sched_yield":
			yields = n
		}
	}
	if total < 0 {
		t.Fatalf("no total in strace's table:\n%s", b)
	}
	return total - yields
}

// TestApplianceProcess is the appliance the death tests start in a child
// process and kill (appliancetest.StartProcess).
func TestApplianceProcess(t *testing.T) { appliancetest.ServeProcess(t) }

// TestApplianceKilled: the appliance killed under a program, which learns
// at once however it waits — asleep on a completion channel or the async
// event queue, spinning on a CQ — as libibverbs reports a device taken
// away (death.c says what), and Debian's tools in the middle of a run
// end with an error instead of hanging.
func TestApplianceKilled(t *testing.T) {
	l := Need(t, false)
	for _, sanitized := range []bool{false, true} {
		t.Run(fmt.Sprintf("death.c sanitized=%v", sanitized), func(t *testing.T) {
			lib := l
			if sanitized {
				lib = Need(t, true)
			}
			bin := userProgram(t, "death")
			p := appliancetest.StartProcess(t, "TestApplianceProcess", appliancetest.Options{Namespace: "ibvd"})
			prog := Start(t, lib.Env(p.Socket), timeout, bin)
			WaitOutput(t, prog, "ready", timeout)
			if err := p.Kill(); err != nil {
				t.Fatal(err)
			}
			err := prog.Wait()
			out := prog.Out.String()
			if strings.Contains(out, "Sanitizer") || strings.Contains(out, "runtime error") {
				t.Errorf("a sanitizer reported:\n%s", out)
			}
			if err != nil || !strings.HasSuffix(strings.TrimSpace(out), "ok") {
				t.Fatalf("death: %v\n%s", err, out)
			}
		})
	}
	for _, c := range []struct {
		tool string
		args []string
	}{
		{"ib_write_bw", []string{"-x", "1", "-F", "-D", "30"}},
		{"ib_send_lat", []string{"-x", "1", "-F", "-D", "30"}},
		{"ibv_rc_pingpong", []string{"-g", "1", "-n", "100000000", "-e"}},
		{"ibv_rc_pingpong", []string{"-g", "1", "-n", "100000000"}},
	} {
		t.Run(strings.Join(append([]string{c.tool}, c.args...), " "), func(t *testing.T) {
			p := appliancetest.StartProcess(t, "TestApplianceProcess", appliancetest.Options{Namespace: "ibvd"})
			env := l.Env(p.Socket)
			port := freePort(t)
			args := append([]string{"-p", fmt.Sprint(port)}, c.args...)
			srv := Start(t, env, timeout, c.tool, append([]string{"-d", "taproce0"}, args...)...)
			WaitListen(t, srv, port, timeout)
			cli := Start(t, env, timeout, c.tool, append(append([]string{"-d", "taproce1"}, args...), "127.0.0.1")...)
			// Mid-run: a while after the client connected.
			time.Sleep(time.Second)
			if err := p.Kill(); err != nil {
				t.Fatal(err)
			}
			cerr, serr := cli.Wait(), srv.Wait()
			for _, x := range []struct {
				side string
				err  error
				out  string
			}{{"client", cerr, cli.Out.String()}, {"server", serr, srv.Out.String()}} {
				var ee *exec.ExitError
				if !errors.As(x.err, &ee) || ee.ExitCode() <= 0 {
					t.Errorf("%s: %v, want an exit with an error status\n%s", x.side, x.err, x.out)
				}
			}
		})
	}
}

// hugePages makes sure the machine has n free 2 MiB huge pages for the
// test, reserving them as root (and giving them back after) when it has
// not; it reports whether it has.
func hugePages(t *testing.T, n int) bool {
	const path = "/proc/sys/vm/nr_hugepages"
	free := func() int {
		b, _ := os.ReadFile("/proc/meminfo")
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "HugePages_Free:" {
				v, _ := strconv.Atoi(f[1])
				return v
			}
		}
		return 0
	}
	if free() >= n {
		return true
	}
	old, err := os.ReadFile(path)
	if err != nil || os.Geteuid() != 0 {
		t.Logf("no free huge pages and not root: huge pages untested")
		return false
	}
	cur, _ := strconv.Atoi(strings.TrimSpace(string(old)))
	if err := os.WriteFile(path, []byte(strconv.Itoa(cur+n)), 0); err != nil {
		t.Logf("reserving huge pages: %v: huge pages untested", err)
		return false
	}
	t.Cleanup(func() { _ = os.WriteFile(path, old, 0) })
	if free() < n {
		t.Logf("the kernel reserved fewer than %d huge pages: huge pages untested", n)
		return false
	}
	return true
}

// TestSysfsReadsAsRdmaCore: ibv_get_sysfs_path and ibv_read_sysfs_file,
// which programs call to read sysfs (taproce exec's tree among it), answer
// as rdma-core 44's do — checked against Debian's libibverbs.so.1 itself —
// for files of every shape (testdata/sysfs.c: a final newline or none,
// empty, filling the buffer, missing, a directory) and every SYSFS_PATH.
func TestSysfsReadsAsRdmaCore(t *testing.T) {
	l := Need(t, false)
	const stock = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1"
	if _, err := os.Stat(stock); err != nil {
		t.Skipf("no rdma-core libibverbs.so.1 to compare with: %v", err)
	}
	bin := userProgram(t, "sysfs")
	var base []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LD_LIBRARY_PATH=") && !strings.HasPrefix(kv, "SYSFS_PATH=") {
			base = append(base, kv)
		}
	}
	for _, sysfs := range []string{"", "SYSFS_PATH=/x//", "SYSFS_PATH=", "SYSFS_PATH=/y"} {
		t.Run(sysfs, func(t *testing.T) {
			env := base
			if sysfs != "" {
				env = append(env[:len(env):len(env)], sysfs)
			}
			theirs, err := Run(t, env, timeout, bin, t.TempDir())
			if err != nil {
				t.Fatalf("with rdma-core's library: %v\n%s", err, theirs)
			}
			ours, err := Run(t, append(env[:len(env):len(env)], "LD_LIBRARY_PATH="+l.Dir), timeout, bin, t.TempDir())
			if err != nil {
				t.Fatalf("with taproce's library: %v\n%s", err, ours)
			}
			if ours != theirs {
				t.Errorf("taproce's library answers\n%s\nrdma-core's\n%s", ours, theirs)
			}
		})
	}
}
