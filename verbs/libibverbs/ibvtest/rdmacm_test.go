package ibvtest

import (
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/matrix"
)

// TestRDMACMSymbols: taproce's librdmacm.so.1 exports what Debian's
// rdma-core 44 librdmacm.so.1 exports, each symbol with its version, so
// that a program linked to it (with BIND_NOW, as Debian builds them) loads.
func TestRDMACMSymbols(t *testing.T) {
	l := Need(t, false)
	if _, err := exec.LookPath("nm"); err != nil {
		t.Skip("no nm")
	}
	syms := func(path string) []string {
		out, err := exec.Command("nm", "-D", "--defined-only", path).Output()
		if err != nil {
			t.Fatalf("nm %s: %v", path, err)
		}
		var s []string
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) == 3 {
				s = append(s, f[2])
			}
		}
		sort.Strings(s)
		return s
	}
	deb := "/usr/lib/x86_64-linux-gnu/librdmacm.so.1"
	ours := syms(l.Dir + "/librdmacm.so.1")
	if _, err := exec.Command("test", "-e", deb).Output(); err != nil {
		t.Skipf("no %s to compare with (librdmacm1)", deb)
	}
	want := syms(deb)
	if strings.Join(ours, " ") != strings.Join(want, " ") {
		t.Errorf("exports differ:\nours: %v\nDebian's: %v", ours, want)
	}
	if len(ours) < 60 {
		t.Errorf("only %d exports", len(ours))
	}
}

// waitListener waits until n's connection manager has a listener: p's,
// when noListeners saw those of the servers before it gone.
func waitListener(t *testing.T, n *appliance.NIC, p *Program) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for n.CM().Stats().States[cm.StateListen] == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no listener after %v\n%s", timeout, p.Out.String())
		}
		select {
		case <-p.done:
			t.Fatalf("the server ended: %v\n%s", p.err, p.Out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// noListeners waits until no connection manager of r has a listener left
// from an earlier server (the appliance ends a finished program's IDs
// once its connection closes), so that waitListener sees the next one's.
func noListeners(t *testing.T, r *appliancetest.Rig) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for _, n := range r.NICs {
		for n.CM().Stats().States[cm.StateListen] != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s still has a listener after %v", n.Name(), timeout)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// TestRDMACMPrograms runs rdmacm-utils' programs, unmodified, between the
// appliance's two devices through taproce's librdmacm.so.1: the server on
// taproce1's address, the client on taproce0 connecting through the RDMA
// CM — rping's 100 verified ping-pongs by RDMA READ and WRITE, ucmatose's
// RC and udaddy's UD (SIDR) data transfers, rdma_server and rdma_client on
// synchronous IDs (rdma_create_ep, rdma_get_request), cmtime's 100
// connections — each judged by its exit status and its own report; and
// again on the libraries built with AddressSanitizer and
// UndefinedBehaviorSanitizer, which must report nothing.
func TestRDMACMPrograms(t *testing.T) {
	for _, san := range []bool{false, true} {
		name := "plain"
		if san {
			name = "sanitized"
		}
		t.Run(name, func(t *testing.T) { runCMPrograms(t, san) })
	}
}

func runCMPrograms(t *testing.T, sanitize bool) {
	l := Need(t, sanitize)
	r := appliancetest.New(t, appliancetest.Options{Namespace: "cm"})
	env := l.Env(r.Socket)
	for i, p := range matrix.CMPrograms() {
		t.Run(p.Name, func(t *testing.T) {
			sa, ca := p.Commands(r.Addrs[1].String(), 7200+i)
			noListeners(t, r)
			srv := Start(t, env, p.Timeout, sa[0], sa[1:]...)
			waitListener(t, r.NICs[1], srv)
			cli := Start(t, env, p.Timeout, ca[0], ca[1:]...)
			cerr := cli.Wait()
			if p.ServerStays {
				srv.cancel()
			}
			serr := srv.Wait()
			fail := func(format string, args ...any) {
				t.Helper()
				for i, n := range r.NICs {
					t.Logf("taproce%d: %+v", i, n.Engine().Stats())
				}
				t.Fatalf(format+"\nclient %v:\n%s\nserver %v:\n%s", append(args, ca, cli.Out.String(), sa, srv.Out.String())...)
			}
			for _, p := range []*Program{cli, srv} {
				if strings.Contains(p.Out.String(), "Sanitizer") || strings.Contains(p.Out.String(), "runtime error") {
					fail("a sanitizer reported")
				}
			}
			if err := p.Judge(matrix.Result{Out: srv.Out.String(), Err: serr}, matrix.Result{Out: cli.Out.String(), Err: cerr}); err != nil {
				fail("%v", err)
			}
		})
	}
}

// TestRDMACMMigrate: a user's program moves RDMA CM IDs between event
// channels with rdma_migrate_id, as libfabric's verbs provider does — a
// listener, a client ID resolved synchronously and then connected from an
// event channel, that ID back to a channel of its own to disconnect — and
// asks rdma_getaddrinfo for the destination of its hints alone, and
// rdma_notify gets Linux's answers (testdata/migrate.c); plain and under
// the sanitizers.
func TestRDMACMMigrate(t *testing.T) {
	for _, san := range []bool{false, true} {
		name := "plain"
		if san {
			name = "sanitized"
		}
		t.Run(name, func(t *testing.T) {
			l := Need(t, san)
			bin := userProgram(t, "migrate", "-lrdmacm")
			r := appliancetest.New(t, appliancetest.Options{Namespace: "cm"})
			out, err := Run(t, l.Env(r.Socket), timeout, bin, r.Addrs[1].String(), r.Addrs[0].String(), "7300")
			if err != nil || strings.TrimSpace(out) != "ok" {
				t.Fatalf("migrate: %v\n%s", err, out)
			}
		})
	}
}

// TestInterrupted: a signal interrupts a program's waits for events —
// ibv_get_cq_event, ibv_get_async_event, rdma_get_cm_event — which fail
// with EINTR, as rdma-core's do (testdata/interrupt.c): qperf ends its
// event-driven tests on its SIGALRM timer so, and its server waited for
// ever for a completion that would not come while the library read again.
func TestInterrupted(t *testing.T) {
	l := Need(t, false)
	bin := userProgram(t, "interrupt", "-lrdmacm")
	r := appliancetest.New(t, appliancetest.Options{Namespace: "ibv"})
	out, err := Run(t, l.Env(r.Socket), timeout, bin)
	if err != nil || strings.TrimSpace(out) != "ok" {
		t.Fatalf("interrupt: %v\n%s", err, out)
	}
}

// TestRDMACMPeerKilled: a client killed in the middle of rping's
// ping-pongs leaves its server a DISCONNECTED event — the appliance ends
// the dead process's connections with a DREQ, as the kernel ends those of
// a process holding CM IDs — and the server ends instead of waiting.
func TestRDMACMPeerKilled(t *testing.T) {
	l := Need(t, false)
	r := appliancetest.New(t, appliancetest.Options{Namespace: "cm"})
	env := l.Env(r.Socket)
	addr := r.Addrs[1].String()
	srv := Start(t, env, timeout, "rping", "-s", "-a", addr, "-p", "7280", "-C", "1000000", "-d")
	waitListener(t, r.NICs[1], srv)
	cli := Start(t, env, timeout, "rping", "-c", "-a", addr, "-p", "7280", "-C", "1000000")
	deadline := time.Now().Add(timeout)
	for r.NICs[1].Engine().Stats().Received < 200 {
		if time.Now().After(deadline) {
			t.Fatalf("no ping-pongs:\n%s\n%s", cli.Out.String(), srv.Out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cli.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cli.Wait()
	done := make(chan struct{})
	go func() { srv.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("the server still runs 20 s after its client was killed:\n%s", srv.Out.String())
	}
	if !strings.Contains(srv.Out.String(), "RDMA_CM_EVENT_DISCONNECTED") {
		t.Errorf("the server heard no DISCONNECTED:\n%s", srv.Out.String())
	}
}

// TestRDMACMLoss: rping and cmtime while each port loses 5 % of the frames
// it sends (seeded): the CM's lost MADs are sent again on its timers
// (REQ, REP, DREQ; a lost RTU is made up by the REP sent again), the
// connected QPs retransmit, and both programs still end well.
func TestRDMACMLoss(t *testing.T) {
	l := Need(t, false)
	r := appliancetest.New(t, appliancetest.Options{Namespace: "cm", Egress: impair.Spec{Loss: 0.05, Seed: 3}})
	env := l.Env(r.Socket)
	addr := r.Addrs[1].String()
	srv := Start(t, env, 3*timeout, "rping", "-s", "-a", addr, "-p", "7290", "-C", "20", "-V", "-v")
	waitListener(t, r.NICs[1], srv)
	cli := Start(t, env, 3*timeout, "rping", "-c", "-a", addr, "-p", "7290", "-C", "20", "-V", "-v")
	cerr, serr := cli.Wait(), srv.Wait()
	if cerr != nil || serr != nil || strings.Count(cli.Out.String(), "ping data: rdma-ping-") != 20 {
		t.Fatalf("rping: client %v\n%s\nserver %v\n%s", cerr, cli.Out.String(), serr, srv.Out.String())
	}
	noListeners(t, r)
	ct := Start(t, env, 3*timeout, "cmtime", "-b", addr, "-p", "7291")
	waitListener(t, r.NICs[1], ct)
	out, err := Run(t, env, 3*timeout, "cmtime", "-s", addr, "-p", "7291", "-c", "20")
	if err != nil || !strings.Contains(out, "disconnect   :") {
		t.Fatalf("cmtime: %v\n%s", err, out)
	}
	var retries uint64
	for _, n := range r.NICs {
		for _, v := range n.CM().Stats().Retries {
			retries += v
		}
	}
	dropped := r.NICs[0].Port().Stats().Egress.Dropped + r.NICs[1].Port().Stats().Egress.Dropped
	if dropped == 0 {
		t.Error("the impairment dropped nothing")
	}
	t.Logf("the ports dropped %d frames; the managers sent %d MADs again", dropped, retries)
}

// TestRDMACMPerftest runs every perftest tool with -R between the
// appliance's devices (matrix.PerftestCM), each judged by both sides' exit
// statuses and result rows.
func TestRDMACMPerftest(t *testing.T) {
	l := Need(t, false)
	r := appliancetest.New(t, appliancetest.Options{Namespace: "cm"})
	env := l.Env(r.Socket)
	out, err := Run(t, env, timeout, "ibv_devinfo", "-v", "-d", "taproce0")
	if err != nil {
		t.Fatalf("ibv_devinfo -v: %v\n%s", err, out)
	}
	port, err := matrix.ParseDevinfo(out)
	if err != nil {
		t.Fatal(err)
	}
	for i, run := range matrix.PerftestCM(port) {
		t.Run(run.Name(), func(t *testing.T) {
			sa := run.Command("taproce1", 7400+i, "")
			ca := run.Command("taproce0", 7400+i, r.Addrs[1].String())
			noListeners(t, r)
			srv := Start(t, env, run.Timeout, run.Tool, sa...)
			waitListener(t, r.NICs[1], srv)
			cli := Start(t, env, run.Timeout, run.Tool, ca...)
			cerr, serr := cli.Wait(), srv.Wait()
			if err := run.Judge(matrix.Result{Device: "taproce1", Out: srv.Out.String(), Err: serr}, matrix.Result{Device: "taproce0", Out: cli.Out.String(), Err: cerr}); err != nil {
				for _, n := range r.NICs {
					t.Logf("%s's CM: %+v", n.Name(), n.CM().Stats())
				}
				t.Fatalf("%v\nclient %v:\n%s\nserver %v:\n%s", err, ca, cli.Out.String(), sa, srv.Out.String())
			}
		})
	}
}
