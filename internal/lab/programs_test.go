package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/internal/ibvlib"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/matrix"
)

// programsLab builds a two-host lab — in redirect mode with redirect,
// else in bridge mode — serving its appliance, and finds taproce's
// libibverbs.so.1 and librdmacm.so.1 built from this checkout; it skips
// without root, without Debian's programs progs, or without the
// libraries.
func programsLab(t *testing.T, redirect bool, progs ...debianTool) (*Lab, library) {
	t.Helper()
	for _, tool := range progs {
		if _, err := exec.LookPath(tool.name); err != nil {
			t.Skipf("needs Debian's %s (%s; scripts/setup installs it): %v", tool.name, tool.pkg, err)
		}
	}
	return servingLab(t, func(tp *Topology) { tp.Redirect = redirect })
}

// debianLab is servingLab for the matrix's programs (which it needs,
// matrix.NeedPrograms); env is their environment.
func debianLab(t *testing.T, tune ...func(*Topology)) (*Lab, []string) {
	t.Helper()
	matrix.NeedPrograms(t)
	l, lib := servingLab(t, tune...)
	return l, lib.env(l.Socket)
}

// servingLab builds a lab of two hosts, bridged and offloading, whose
// appliance serves its control socket to programs in its namespaces, each
// tune changing the topology first; and finds taproce's libibverbs.so.1
// and librdmacm.so.1 (skipping the test where there are none, or without
// root).
func servingLab(t *testing.T, tune ...func(*Topology)) (*Lab, library) {
	t.Helper()
	p := prefix(t)
	t.Setenv(ibvlib.EnvDir, "")
	old := ibvlib.SystemDirs
	ibvlib.SystemDirs = nil
	t.Cleanup(func() { ibvlib.SystemDirs = old })
	ctx := context.Background()
	lib, s := findLibrary(ctx, "", "")
	if !lib.ok() {
		t.Skipf("no library to run them on: %s", s.Detail)
	}
	if _, err := os.Stat(filepath.Join(lib.found.Dir, "librdmacm.so.1")); err != nil {
		t.Skipf("no taproce librdmacm.so.1 beside %s (make -C verbs/librdmacm, with librdmacm-dev's headers): %v", lib.found.Dir, err)
	}
	tp := Topology{Prefix: p, Hosts: 2, Offload: true, Socket: filepath.Join(t.TempDir(), "lab.sock"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, f := range tune {
		f(&tp)
	}
	l, err := Build(tp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	steps, stop := l.serveClients(ctx, "-", "")
	t.Cleanup(stop)
	if len(steps) > 0 {
		t.Fatalf("serving the lab's appliance: %s: %s", steps[0].Name, steps[0].Detail)
	}
	return l, lib
}

var (
	ucxPerftestTool = debianTool{matrix.UCXTool.Name, matrix.UCXTool.Package}
	ucxInfoTool     = debianTool{"ucx_info", matrix.UCXTool.Package}
)

// execArgs returns the arguments of `taproce exec` running program with
// args on lib's libraries and the lab's appliance: the program gets the
// /sys/class/infiniband and /dev/infiniband of the devices its namespace
// may use, in a mount namespace of its own, which UCX reads.
func (l *Lab) execArgs(lib library, program string, args ...string) []string {
	return append([]string{"exec", "--lib", lib.found.Dir, "--socket", l.Socket, "--", program}, args...)
}

// finalRe matches ucx_perftest's final result line.
var finalRe = regexp.MustCompile(`(?m)^Final:.*$`)

// TestLabUCX runs UCX 1.13's ucx_perftest, unmodified, between two lab
// namespaces on taproce's libraries, each side through `taproce exec` run
// inside its namespace (ip netns exec), which gives UCX the sysfs tree
// and character devices of the namespace's own device: ucx_info -d
// lists rc_verbs and ud_verbs there on the namespace's device and no
// other. Then the server in the second namespace, the client in the
// first, the runs of matrix.UCXRuns, each judged as TestUCX judges them
// between the appliance's two devices (exit statuses, "Final:", the
// client's lane on its device) — but UCT's own runs, whose server opens
// the device the client names, which the second namespace does not have.
//
// The lab is in bridge mode, its default: ucx_perftest's TCP connection
// goes to the server namespace's kernel address (its bridge's), as
// ibv_rc_pingpong's does, and UCX takes the peer's GID from the worker
// address it exchanges over that connection, so the port's addresses
// need not be the kernel's (qperf -cm1 and libfabric, which reach the
// RDMA peer at the address of their socket, need the redirect mode).
// Both sides set UCX_IB_GID_INDEX=0 (matrix.UCXRun.Env), the link-local
// GID: with the IPv4 GID UCX prefers, its UD (and RC's wireup over UD)
// drops every packet, on rxe as on taproce.
func TestLabUCX(t *testing.T) {
	l, lib := programsLab(t, false, ucxPerftestTool, ucxInfoTool)
	bin := taproceBinary(t)
	a, b := l.Hosts[0], l.Hosts[1]
	ctx := context.Background()
	for _, h := range l.Hosts {
		c, err := l.startClientEnv(ctx, os.Environ(), bin, h, l.execArgs(lib, "ucx_info", "-d")...)
		if err != nil {
			t.Fatal(err)
		}
		err = c.wait(time.Minute)
		out := c.output()
		if err != nil {
			t.Fatalf("ucx_info -d in %s: %v\n%s", h.Namespace, err, out)
		}
		for _, o := range l.Hosts {
			for _, tl := range []string{"rc_verbs", "ud_verbs"} {
				line := "Transport: " + tl + "\n#         Device: " + o.Device + ":1"
				if strings.Contains(out, line) != (o == h) {
					t.Errorf("ucx_info -d in %s: %q listed %v, want %v:\n%s", h.Namespace, line, o != h, o == h, out)
				}
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	for i, r := range matrix.UCXRuns() {
		t.Run(r.Name, func(t *testing.T) {
			if r.UCT {
				t.Skipf("ucx_perftest's server opens the UCT device its client names (%s), which %s, with only %s, lacks", a.Device, b.Namespace, b.Device)
			}
			port := 13337 + i
			srvOut, cliOut, err := l.pairEnvs(ctx, append(os.Environ(), r.Env(b.Device)...), append(os.Environ(), r.Env(a.Device)...), bin, a, b,
				l.execArgs(lib, ucxPerftestTool.name, r.Server(b.Device, port)...),
				l.execArgs(lib, ucxPerftestTool.name, r.Client(a.Device, port, "")...), port, time.Minute)
			if err == nil {
				err = r.Judge(matrix.Result{Device: b.Device, Out: srvOut}, matrix.Result{Device: a.Device, Out: cliOut})
			}
			if err != nil {
				t.Fatalf("%v\nclient in %s:\n%s\nserver in %s:\n%s", err, a.Namespace, cliOut, b.Namespace, srvOut)
			}
			t.Log("ucx_perftest " + strings.Join(strings.Fields(finalRe.FindString(cliOut)), " "))
		})
	}
}

// TestLabPyverbs runs rdma-core's Python bindings (python3-pyverbs),
// unmodified, on Debian's /usr/bin/python3, between two lab namespaces
// on taproce's libraries: matrix.PyverbsRC's server in the second
// namespace, its client in the first, which exchange their QPs' numbers,
// PSNs, GIDs and regions over TCP (to the server namespace's kernel
// address, as ibv_rc_pingpong) and move data over an RC QP — SEND with
// immediate, RDMA WRITE, RDMA READ, FETCH_ADD, each checked at both ends —
// at each GID the ports have (link-local, IPv4, IPv6). Each side exits 0
// and prints "ok" only when every check of its own held.
func TestLabPyverbs(t *testing.T) {
	script := matrix.PyverbsRC(t)
	l, lib := programsLab(t, false, debianTool{"ibv_devinfo", "ibverbs-utils"})
	a, b := l.Hosts[0], l.Hosts[1]
	ctx := context.Background()
	env := lib.env(l.Socket)
	port, err := l.devinfo(ctx, env, a)
	if err != nil {
		t.Fatal(err)
	}
	for i, gid := range port.GIDs {
		t.Run(fmt.Sprintf("gid %d", gid), func(t *testing.T) {
			tcp := 18600 + i
			args := []string{script, "-g", strconv.Itoa(gid), "-p", strconv.Itoa(tcp)}
			srvOut, cliOut, err := l.pairEnv(ctx, env, matrix.Python, a, b, slices.Concat(args, []string{"-d", b.Device}),
				slices.Concat(args, []string{"-d", a.Device}), tcp, time.Minute)
			if err == nil && (strings.TrimSpace(srvOut) != "ok" || strings.TrimSpace(cliOut) != "ok") {
				err = errors.New(`a side did not print "ok" alone`)
			}
			if err != nil {
				t.Fatalf("%v\nclient in %s:\n%s\nserver in %s:\n%s", err, a.Namespace, cliOut, b.Namespace, srvOut)
			}
		})
	}
}
