package ibvtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/matrix"
)

// TestUCX runs UCX 1.13's ucx_perftest, unmodified, between the
// appliance's two devices through `taproce exec` — which gives UCX the
// /sys/class/infiniband and /dev/infiniband it looks for — over RC and
// over UD: tag matching bandwidth and latency, UCP put and get; and
// UCT's own RDMA WRITE and READ over rc_verbs (matrix.UCXRuns). Each run
// checks ucx_perftest's verdict (exit status, its "Final:" line) and,
// from UCX's log, that the endpoint's lanes are the transport asked for
// on the taproce device (matrix.UCXRun.Judge).
func TestUCX(t *testing.T) {
	l := Need(t, false)
	r := appliancetest.New(t, appliancetest.Options{Namespace: "ibv"})
	for _, c := range matrix.UCXRuns() {
		t.Run(c.Name, func(t *testing.T) {
			port := freePort(t)
			srv := l.Exec(t, r.Socket, c.Env("taproce0"), timeout, matrix.UCXTool.Name, c.Server("taproce0", port)...)
			WaitListen(t, srv, port, timeout)
			cli := l.Exec(t, r.Socket, c.Env("taproce1"), timeout, matrix.UCXTool.Name, c.Client("taproce1", port, "127.0.0.1")...)
			cerr, serr := cli.Wait(), srv.Wait()
			err := c.Judge(matrix.Result{Device: "taproce0", Out: srv.Out.String(), Err: serr},
				matrix.Result{Device: "taproce1", Out: cli.Out.String(), Err: cerr})
			if err != nil {
				t.Fatalf("%v\nclient:\n%s\nserver:\n%s", err, cli.Out.String(), srv.Out.String())
			}
		})
	}
}

// TestUCXNeedsSysfs: UCX takes a device as usable only where
// /dev/infiniband/<dev_name> is a character device it may read and write,
// and reads each GID's RoCE version from /sys/class/infiniband; through
// `taproce exec` ucx_info lists rc_verbs and ud_verbs on both devices,
// with --no-sysfs (the machine's own /sys and /dev: no kernel RDMA here)
// none of them.
func TestUCXNeedsSysfs(t *testing.T) {
	l := Need(t, false)
	r := appliancetest.New(t, appliancetest.Options{Namespace: "ibv"})
	p := l.Exec(t, r.Socket, nil, timeout, "ucx_info", "-d")
	if err := p.Wait(); err != nil {
		t.Fatalf("ucx_info -d: %v\n%s", err, p.Out.String())
	}
	out := p.Out.String()
	for _, dev := range []string{"taproce0", "taproce1"} {
		for _, want := range []string{"# Memory domain: " + dev, "Transport: rc_verbs\n#         Device: " + dev + ":1",
			"Transport: ud_verbs\n#         Device: " + dev + ":1"} {
			if !strings.Contains(out, want) {
				t.Errorf("ucx_info -d lacks %q:\n%s", want, out)
			}
		}
	}
	p = Start(t, nil, timeout, Taproce(t), "exec", "--lib", l.Dir, "--socket", r.Socket, "--no-sysfs", "--", "ucx_info", "-d")
	if err := p.Wait(); err != nil {
		t.Fatalf("ucx_info -d: %v\n%s", err, p.Out.String())
	}
	if strings.Contains(p.Out.String(), "taproce0") {
		t.Errorf("without the tree ucx_info -d finds taproce0 — then the tree is not what makes UCX find it:\n%s", p.Out.String())
	}
}

// TestPyverbs: rdma-core's Python bindings (python3-pyverbs), unmodified,
// move data over an RC QP between the appliance's two devices, a process
// on each (matrix.PyverbsRC: SEND with immediate, RDMA WRITE, RDMA READ,
// FETCH_ADD, each checked at both ends), with the IPv4 GID and the IPv6
// one.
func TestPyverbs(t *testing.T) {
	l := Need(t, false)
	script := matrix.PyverbsRC(t)
	r := appliancetest.New(t, appliancetest.Options{Namespace: "ibv"})
	for _, gid := range []string{"1", "0"} {
		t.Run("gid "+gid, func(t *testing.T) {
			port := freePort(t)
			args := []string{script, "-g", gid, "-p", strconv.Itoa(port)}
			srv := l.Exec(t, r.Socket, nil, timeout, matrix.Python, append(args, "-d", "taproce1")...)
			WaitListen(t, srv, port, timeout)
			cli := l.Exec(t, r.Socket, nil, timeout, matrix.Python, append(args, "-d", "taproce0", "127.0.0.1")...)
			cerr, serr := cli.Wait(), srv.Wait()
			if cerr != nil || serr != nil || strings.TrimSpace(cli.Out.String()) != "ok" || strings.TrimSpace(srv.Out.String()) != "ok" {
				t.Fatalf("client: %v\n%s\nserver: %v\n%s", cerr, cli.Out.String(), serr, srv.Out.String())
			}
		})
	}
}

// TestQperf runs qperf 0.4.11, unmodified, between the appliance's two
// devices, and gets what it gets on rxe (checked on Linux 6.1's rxe with
// rdma-core 44): qperf addresses its peer by LID alone — no GRH — unless
// it runs over RDMA CM (-cm1), so on RoCE, where an address vector needs
// the GRH, the RC tests end with "failed to modify QP to RTR: Invalid
// argument" and ud_lat with "failed to create address handle: Invalid
// argument", exit status 1. (Its RC tests run on rxe with -cm1, which
// needs librdmacm, which taproce does not have yet.) Before the QP's
// transition, qperf creates one-way QPs (max_recv_wr 0 on the sender,
// max_send_wr 0 on the receiver), which rxe creates and so must taproce.
func TestQperf(t *testing.T) {
	l := Need(t, false)
	r := appliancetest.New(t, appliancetest.Options{Namespace: "ibv"})
	port := freePort(t)
	srv := l.Exec(t, r.Socket, nil, timeout, "qperf", "-lp", fmt.Sprint(port))
	WaitListen(t, srv, port, timeout)
	for _, c := range []struct{ test, want string }{
		{"rc_bw", "failed to modify QP to RTR: Invalid argument"},
		{"rc_lat", "failed to modify QP to RTR: Invalid argument"},
		{"rc_rdma_write_bw", "failed to modify QP to RTR: Invalid argument"},
		{"rc_rdma_read_lat", "failed to modify QP to RTR: Invalid argument"},
		{"ud_lat", "failed to create address handle: Invalid argument"},
	} {
		t.Run(c.test, func(t *testing.T) {
			cli := l.Exec(t, r.Socket, nil, timeout, "qperf", "-lp", fmt.Sprint(port), "-t", "1",
				"-i", "taproce1:1", "-ri", "taproce0:1", "127.0.0.1", c.test)
			err := cli.Wait()
			var ee *exec.ExitError
			out := cli.Out.String()
			if !strings.HasPrefix(out, c.test+":\n") && !strings.Contains(out, "\n"+c.test+":\n") {
				t.Errorf("qperf did not run %s:\n%s", c.test, out)
			}
			// Both ends fail the same way; when the server's failure
			// reaches the client first, qperf prints it behind
			// "server:" (at times with its text cut off) instead of its own.
			failed := strings.Contains(out, c.want) || strings.HasPrefix(out, "server:") || strings.Contains(out, "\nserver:")
			if !errors.As(err, &ee) || ee.ExitCode() != 1 || !failed {
				t.Fatalf("qperf %s: %v\n%s\nwant exit status 1 and %q, as on rxe", c.test, err, out, c.want)
			}
		})
	}
}

// TestInstall: `make install PREFIX=…` puts the library in PREFIX/lib/taproce,
// and a taproce binary in PREFIX/bin finds it there by itself (no --lib,
// no TAPROCE_LIBDIR) and runs ibv_devices on the appliance's devices.
func TestInstall(t *testing.T) {
	l := Need(t, false)
	prefix := t.TempDir()
	if out, err := exec.Command("make", "-C", srcDir(), "install", "PREFIX="+prefix).CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	installed := filepath.Join(prefix, "lib", "taproce", "libibverbs.so.1")
	if a, b := readFile(t, installed), readFile(t, filepath.Join(l.Dir, "libibverbs.so.1")); a != b {
		t.Fatalf("%s is not the library built", installed)
	}
	bin := filepath.Join(prefix, "bin", "taproce")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("cp", Taproce(t), bin).Run(); err != nil {
		t.Fatal(err)
	}
	r := appliancetest.New(t, appliancetest.Options{Namespace: "ibv"})
	env := append(os.Environ(), "TAPROCE_LIBDIR=", "TAPROCE_SOCKET="+r.Socket)
	out, err := Run(t, env, timeout, bin, "exec", "ibv_devices")
	if err != nil || !strings.Contains(out, "taproce0") || !strings.Contains(out, "taproce1") {
		t.Fatalf("%s exec ibv_devices: %v\n%s", bin, err, out)
	}
}

// TestExecUnprivileged: `taproce exec` run by a user other than root
// gives the program the tree in a user namespace of its own (where the
// kernel allows one): ucx_info finds both devices, the program has no
// capabilities, and its exit status is taproce exec's.
func TestExecUnprivileged(t *testing.T) {
	l := Need(t, false)
	if os.Geteuid() != 0 {
		t.Skip("needs root to run it as another user")
	}
	asNobody := []string{"--reuid", "65534", "--regid", "65534", "--clear-groups"}
	if out, err := exec.Command("setpriv", append(asNobody, "unshare", "--user", "true")...).CombinedOutput(); err != nil {
		t.Skipf("no user namespace for an unprivileged user here: %v\n%s", err, out)
	}
	r := appliancetest.New(t, appliancetest.Options{Namespace: "ibv"})
	// The socket's directories, the test's own, are root's alone.
	for dir := filepath.Dir(r.Socket); dir != os.TempDir() && dir != "/"; dir = filepath.Dir(dir) {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) (string, error) {
		t.Helper()
		all := append(append(asNobody, Taproce(t), "exec", "--lib", l.Dir, "--socket", r.Socket, "--"), args...)
		return Run(t, nil, timeout, "setpriv", all...)
	}
	if _, err := exec.LookPath("ucx_info"); err == nil {
		out, err := run("ucx_info", "-d")
		if err != nil || strings.Contains(out, "taproce exec:") {
			t.Fatalf("ucx_info -d as nobody: %v\n%s", err, out)
		}
		for _, want := range []string{"Transport: rc_verbs\n#         Device: taproce0:1", "Transport: ud_verbs\n#         Device: taproce1:1"} {
			if !strings.Contains(out, want) {
				t.Errorf("ucx_info -d as nobody lacks %q:\n%s", want, out)
			}
		}
	}
	out, err := run("sh", "-c", "id -u; grep CapEff /proc/self/status; test -c /dev/infiniband/uverbs1 -a -w /dev/infiniband/uverbs1 && "+
		"cat /sys/class/infiniband/taproce1/ports/1/gid_attrs/types/1; exit 7")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 || out != "65534\nCapEff:\t0000000000000000\nRoCE v2\n" {
		t.Fatalf("as nobody: %v (want exit status 7)\n%q", err, out)
	}
}
