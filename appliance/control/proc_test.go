package control_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/internal/testnet"
	"github.com/taproce/taproce/verbs"
)

// The test binary doubles as a client process: with TAPROCE_TEST_CHILD set,
// TestMain runs the child's part instead of the tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("TAPROCE_TEST_CHILD"); mode != "" {
		os.Exit(child(mode))
	}
	os.Exit(m.Run())
}

// child runs a client: "open" opens TAPROCE_TEST_DEVICE and prints "ok" or
// the errno; "stream" connects an RC QP to the parent's (TAPROCE_TEST_PEER
// = QPN/GID/addr/rkey), prints "qpn N", and WRITEs to the parent until
// it is killed.
func child(mode string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := verbs.Open(ctx, os.Getenv("TAPROCE_TEST_DEVICE"))
	if mode == "open" {
		if err != nil {
			var en syscall.Errno
			if errors.As(err, &en) {
				fmt.Println("errno", int(en))
				return 0
			}
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("ok")
		return 0
	}
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	f := strings.Split(os.Getenv("TAPROCE_TEST_PEER"), "/")
	qpn, _ := strconv.ParseUint(f[0], 10, 32)
	gid := netip.MustParseAddr(f[1])
	addr, _ := strconv.ParseUint(f[2], 10, 64)
	rkey, _ := strconv.ParseUint(f[3], 10, 32)
	e := newEnd(&childTB{}, c, verbs.RC, 1<<20)
	connectOne(&childTB{}, e, uint32(qpn), gid)
	fmt.Println("qpn", e.qp.Num())
	wcs := make([]verbs.WC, 16)
	for out := 0; ; {
		for out < 32 {
			if _, err := e.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{e.mr.SGE(0, 64<<10)}, RemoteAddr: addr, RKey: uint32(rkey)}}); err != nil {
				return 1
			}
			out++
		}
		out -= max(e.cq.Poll(wcs), 0)
		runtime.Gosched()
	}
}

// childTB lets the test helpers run in the child: a failure ends it.
type childTB struct{ testing.TB }

func (childTB) Helper()                           {}
func (childTB) Fatal(args ...any)                 { fmt.Println(args...); os.Exit(1) }
func (childTB) Fatalf(format string, args ...any) { fmt.Printf(format+"\n", args...); os.Exit(1) }
func (childTB) Cleanup(func())                    {}

// connectOne takes one RC QP to RTS towards a peer QP.
func connectOne(t testing.TB, e *end, dqpn uint32, dgid netip.Addr) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	all := verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	must(t, e.qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSInit, Port: 1, Access: all},
		verbs.QPStateMask|verbs.QPPKeyIndex|verbs.QPPort|verbs.QPAccessFlags))
	must(t, e.qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSRTR, PathMTU: verbs.MTU1024, DestQPN: dqpn,
		MaxDestRdAtomic: 16, MinRNRTimer: 12, AH: verbs.AHAttr{DGID: dgid, SGIDIndex: 1, Port: 1}},
		verbs.QPStateMask|verbs.QPAV|verbs.QPPathMTU|verbs.QPDestQPN|verbs.QPRQPSN|verbs.QPMaxDestRdAtomic|verbs.QPMinRNRTimer))
	must(t, e.qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSRTS, Timeout: 10, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
		verbs.QPStateMask|verbs.QPSQPSN|verbs.QPTimeout|verbs.QPRetryCnt|verbs.QPRNRRetry|verbs.QPMaxQPRdAtomic))
}

// startChild runs the test binary as a client with the given mode and
// environment, in namespace ns when not empty (which needs root).
func startChild(t testing.TB, ns, mode string, env ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var cmd *exec.Cmd
	if ns != "" {
		cmd = exec.Command("ip", "netns", "exec", ns, self, "-test.run=^$")
	} else {
		cmd = exec.Command(self, "-test.run=^$")
	}
	cmd.Env = append(append(os.Environ(), "TAPROCE_TEST_CHILD="+mode), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, bufio.NewScanner(out)
}

// TestIsolation: a client may open only the device of its own network
// namespace; the appliance's two ports live in two namespaces and a
// client process in the first is refused the second's device (EACCES).
func TestIsolation(t *testing.T) {
	testnet.RequireRoot(t)
	nsA, pathA := testnet.Namespace(t)
	_, pathB := testnet.Namespace(t)
	sock := filepath.Join(t.TempDir(), "taproce.sock")
	app, err := appliance.New(appliance.Options{Socket: sock})
	must(t, err)
	for i, p := range []string{pathA, pathB} {
		addr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 78, 0, byte(i + 1)}), 24)
		if _, err := app.AddPort(appliance.PortConfig{Namespace: filepath.Base(p), Netns: p, Addrs: []netip.Prefix{addr}}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Serve(ctx) }()
	defer func() { cancel(); <-done; app.Close() }()
	for _, c := range []struct{ dev, want string }{
		{"taproce0", "ok"},
		{"taproce1", fmt.Sprint("errno ", int(syscall.EACCES))},
		{"nosuch", fmt.Sprint("errno ", int(syscall.ENODEV))},
	} {
		cmd, out := startChild(t, nsA, "open", "TAPROCE_SOCKET="+sock, "TAPROCE_TEST_DEVICE="+c.dev)
		out.Scan()
		got := out.Text()
		cmd.Wait()
		if got != c.want {
			t.Errorf("open %s from the first namespace: %q, want %q", c.dev, got, c.want)
		}
	}
	// From the appliance's own namespace neither device is shown.
	t.Setenv("TAPROCE_SOCKET", sock)
	list, err := verbs.ListDevices(context.Background())
	if err != nil || len(list.Devices) != 0 || !list.OthersHidden {
		t.Fatalf("devices seen from outside: %+v, %v", list, err)
	}
}

// TestWrongKeys: an rkey of another PD is refused by the responder with
// nothing written, and an lkey or address the client was not given fails
// locally.
func TestWrongKeys(t *testing.T) {
	r := newRig(t, true)
	ctx := testCtx(t)
	a, b := newEnd(t, r.ca, verbs.RC, 4096), newEnd(t, r.cb, verbs.RC, 4096)
	connectRC(t, a, b, r.ga, r.gb)
	pd2, err := r.cb.AllocPD(ctx)
	must(t, err)
	other, err := pd2.AllocMR(ctx, 4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	must(t, err)
	// A remote write with the other PD's rkey: REM_ACCESS_ERR, memory untouched.
	_, err = a.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{a.mr.SGE(0, 16)}, RemoteAddr: other.Addr(), RKey: other.RKey}})
	must(t, err)
	if wc := wait(t, a.cq, 1)[0]; wc.Status != verbs.WCRemAccessErr {
		t.Fatalf("write with another PD's rkey: %v", wc.Status)
	}
	for _, x := range other.Bytes() {
		if x != 0 {
			t.Fatal("memory of the other PD changed")
		}
	}
	// A fresh connection for the local checks.
	a, b = newEnd(t, r.ca, verbs.RC, 4096), newEnd(t, r.cb, verbs.RC, 4096)
	connectRC(t, a, b, r.ga, r.gb)
	for _, s := range []verbs.SGE{
		{Addr: a.mr.Addr() + 4000, Length: 200, LKey: a.mr.LKey}, // beyond the region
		{Addr: other.Addr(), Length: 8, LKey: other.LKey},        // another client's region
	} {
		_, err = a.qp.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s}}})
		must(t, err)
		if wc := wait(t, a.cq, 1)[0]; wc.Status != verbs.WCLocProtErr {
			t.Fatalf("send from %+v: %v", s, wc.Status)
		}
		a, b = newEnd(t, r.ca, verbs.RC, 4096), newEnd(t, r.cb, verbs.RC, 4096)
		connectRC(t, a, b, r.ga, r.gb)
	}
}

// countFds counts this process's open descriptors.
func countFds(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// countMaps counts this process's memory mappings.
func countMaps(t testing.TB) int {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// waitDump is wait, which on a timeout also shows what the appliance's
// engines counted.
func waitDump(t *testing.T, app *appliance.Appliance, cq *verbs.CQ, n int) []verbs.WC {
	t.Helper()
	var out []verbs.WC
	wcs := make([]verbs.WC, 16)
	for deadline := time.Now().Add(10 * time.Second); len(out) < n; {
		k := cq.Poll(wcs)
		if k < 0 {
			t.Fatal("CQ destroyed")
		}
		out = append(out, wcs[:k]...)
		if k == 0 && time.Now().After(deadline) {
			for _, nic := range app.NICs() {
				t.Logf("%s: %+v, %d QPs", nic.Name(), nic.Engine().Stats(), nic.Engine().QPCount())
			}
			t.Fatalf("%d of %d completions: %+v", len(out), n, out)
		}
	}
	return out
}

// TestClientKilled: 200 times, a client process streaming RDMA WRITEs to a
// QP of this process is killed mid-transfer. Its objects are destroyed,
// the peer QP — which keeps writing back — ends in error instead of
// retrying forever, and afterwards the appliance holds no more
// descriptors, goroutines, QPs, mappings or memory than before.
func TestClientKilled(t *testing.T) {
	cycles := 200
	if testing.Short() {
		cycles = 20
	}
	// The killed QPs linger long enough for the peer's SEND to reach them
	// on a loaded machine: once one is gone, the SEND would go unanswered
	// (as at rxe) and retry forever.
	// They NAK at once, without the quiet spell (transport.Config.LingerQuiet)
	// that would cost every cycle a second.
	const linger = 2 * time.Second
	app := appliancetest.New(t, appliancetest.Options{LocalSwitch: true, Linger: linger, LingerQuiet: -1, Namespace: "crash", Net: 79}).App
	parent, err := verbs.Open(testCtx(t), "taproce1")
	must(t, err)
	defer parent.Close()
	gParent, _ := parent.GID(1)
	gChild := netip.MustParseAddr("10.79.0.1")

	cycle := func() {
		p := newEnd(t, parent, verbs.RC, 1<<20)
		cmd, out := startChild(t, "", "stream", "TAPROCE_TEST_DEVICE=taproce0",
			fmt.Sprintf("TAPROCE_TEST_PEER=%d/%s/%d/%d", p.qp.Num(), gParent, p.mr.Addr(), p.mr.RKey))
		var qpn uint64
		for out.Scan() {
			if f := strings.Fields(out.Text()); len(f) == 2 && f[0] == "qpn" {
				qpn, _ = strconv.ParseUint(f[1], 10, 32)
				break
			}
		}
		if qpn == 0 {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("the child never said its QPN")
		}
		connectOne(t, p, uint32(qpn), gChild)
		// Let the child's WRITEs flow, then kill it mid-stream.
		time.Sleep(2 * time.Millisecond)
		must(t, cmd.Process.Kill())
		cmd.Wait()
		// The peer QP must fail: a WRITE towards the dead client's QP is
		// answered with a NAK by its lingering QP.
		sendTo := []verbs.SendWR{{ID: 8, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{p.mr.SGE(0, 64)}}}
		_, err := p.qp.PostSend(sendTo)
		must(t, err)
		wc := waitDump(t, app, p.cq, 1)[0]
		if wc.Status == verbs.WCSuccess {
			t.Fatalf("SEND to a killed client's QP succeeded")
		}
		qctx := testCtx(t)
		if attr, _, err := p.qp.Query(qctx); err != nil || attr.State != verbs.QPSErr {
			t.Fatalf("peer QP in %v (%v), want ERR", attr.State, err)
		}
		must(t, p.qp.Destroy(qctx))
		must(t, p.cq.Destroy(qctx))
		must(t, p.mr.Dereg(qctx))
		must(t, p.pd.Dealloc(qctx))
	}
	cycle() // warm up: the first cycle makes what stays (goroutines of the runtime, buffers)
	waitClients(t, app, 0)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	fds, gor, maps := countFds(t), runtime.NumGoroutine(), countMaps(t)
	for range cycles {
		cycle()
	}
	waitClients(t, app, 0)
	time.Sleep(linger + 200*time.Millisecond) // the killed QPs' linger
	for _, n := range app.NICs() {
		n.Engine().Tick()
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	st := app.Control().Stats()
	t.Logf("after %d kills: fds %d→%d, goroutines %d→%d, maps %d→%d, heap %d→%d KiB, %+v",
		cycles, fds, countFds(t), gor, runtime.NumGoroutine(), maps, countMaps(t), before.HeapInuse>>10, after.HeapInuse>>10, st)
	if st.Clients != 1 || st.QPs != 0 || st.MRs != 0 || st.CQs != 0 { // the parent's own context stays
		t.Fatalf("objects left: %+v", st)
	}
	if n := countFds(t); n > fds+2 {
		t.Fatalf("descriptors grew: %d → %d", fds, n)
	}
	if n := runtime.NumGoroutine(); n > gor+2 {
		t.Fatalf("goroutines grew: %d → %d", gor, n)
	}
	if n := countMaps(t); n > maps+32 { // the runtime's arenas may grow a little; 200 leaked regions would be 600
		t.Fatalf("mappings grew: %d → %d", maps, n)
	}
	if after.HeapInuse > before.HeapInuse+16<<20 {
		t.Fatalf("heap grew: %d → %d KiB", before.HeapInuse>>10, after.HeapInuse>>10)
	}
	for _, n := range app.NICs() {
		if q := n.Engine().QPCount(); q != 0 {
			t.Fatalf("%s: %d QPs left in the engine", n.Name(), q)
		}
	}
}

// waitClients waits until the server has n clients.
func waitClients(t testing.TB, app *appliance.Appliance, n int) {
	deadline := time.Now().Add(10 * time.Second)
	for app.Control().Stats().Clients > n+1 { // the parent's own context stays
		if time.Now().After(deadline) {
			t.Fatalf("clients: %+v", app.Control().Stats())
		}
		time.Sleep(time.Millisecond)
	}
}
