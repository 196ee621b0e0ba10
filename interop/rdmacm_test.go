package interop

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/gocm"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/matrix"
)

// This file runs rdmacm-utils' programs and perftest's -R runs on
// taproce's librdmacm.so.1 and libibverbs.so.1 against the same programs
// on rxe in the VM, both ways: the appliance's connection manager speaks
// to the kernel's CM (IBA ch. 12 MADs on QP1) and the connected QPs move
// data. The programs and their verdicts are the matrix's (CMPrograms,
// PerftestCM), which ibvtest and the lab run between taproce's own ports.

// cmInterops are the programs run against the VM: udaddy is not among
// them — between two rxe VMs it hangs too, the server never reporting its
// receives (shared/vectors/README.md, rxe-cm-udaddy.pcap); between
// taproce's ports it runs (ibvtest.TestRDMACMPrograms, lab.TestLabRDMACM).
func cmInterops() []matrix.CMProgram {
	var out []matrix.CMProgram
	for _, p := range matrix.CMPrograms() {
		if p.Name != "udaddy" {
			out = append(out, p)
		}
	}
	return out
}

// rxeCMTime is cmtime's report between the two rxe VMs (TestRxePair's
// cmtime run), which TestLibRDMACM logs beside taproce's.
var rxeCMTime string

// cmtimeRow is a row of cmtime's table ("connect      :  1234.56 …"),
// or its header.
var cmtimeRow = regexp.MustCompile(`^(step  |[a-z][a-z ]{12}: )`)

// cmtimeLines returns cmtime's table: its header and step rows.
func cmtimeLines(out string) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if cmtimeRow.MatchString(l) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// TestLibRDMACM: each program with taproce as the server and rxe as the
// client, then the other way round, judged by both sides' exit statuses
// and reports; cmtime's 100 connections each way are logged beside those
// between the two rxe VMs.
func TestLibRDMACM(t *testing.T) {
	p, _ := needPeer(t)
	r := newLibRig(t, rigConfig{})
	r.reach(t, p)
	for i, c := range cmInterops() {
		port := 7300 + i
		t.Run(c.Name+"/taproce-server", func(t *testing.T) {
			vm := cmOurServer(t, r, p, c, port)
			if c.Name == "cmtime" {
				t.Logf("cmtime -c 100, rxe client, taproce server:\n%s\nbetween the two rxe VMs:\n%s", cmtimeLines(vm), rxeCMTime)
			}
		})
		t.Run(c.Name+"/vm-server", func(t *testing.T) {
			out := cmVMServer(t, r, p, c, port)
			if c.Name == "cmtime" {
				t.Logf("cmtime -c 100, taproce client, rxe server:\n%s", cmtimeLines(out))
			}
		})
	}
	t.Run("nobody-listens", func(t *testing.T) { cmNobodyListens(t, r, p, 7399) })
}

// cmRejected is what rping prints of a REJ with reason 8, invalid service
// ID: nobody listens on the port.
const cmRejected = "cma event RDMA_CM_EVENT_REJECTED, error 8"

// cmNobodyListens: rping's client connecting to a port nobody listens on
// gets RDMA_CM_EVENT_REJECTED with reason 8 within a second, and fails —
// taproce's client from the VM's CM, and the VM's from taproce's (which
// holds an unheard REQ for cm.DefaultListenGrace before it rejects it).
func cmNobodyListens(t *testing.T, r *perfRig, p *Peer, port int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	b, err := r.command(ctx, "rping", "-c", "-a", p.IP.String(), "-p", strconv.Itoa(port), "-C", "1").CombinedOutput()
	if d := time.Since(start); err == nil || !strings.Contains(string(b), cmRejected) || d > time.Second {
		t.Errorf("taproce's rping to the VM's port %d, where nobody listens: after %v, %v:\n%s", port, d, err, b)
	}
	const ms = `$(( ($(date +%s%N) - s) / 1000000 ))`
	out, _, err := p.Exec(ctx, fmt.Sprintf("s=$(date +%%s%%N); rping -c -a %s -p %d -C 1 2>&1; echo exit $? after %s ms", perfAddr.Addr(), port, ms))
	var code, took int
	if err != nil || !strings.Contains(out, cmRejected) {
		t.Errorf("the VM's rping to taproce's port %d, where nobody listens: %v:\n%s", port, err, out)
	} else if i := strings.LastIndex(out, "exit "); i < 0 {
		t.Errorf("the VM's rping: no exit status:\n%s", out)
	} else if _, err := fmt.Sscanf(out[i:], "exit %d after %d ms", &code, &took); err != nil || code == 0 || took > 1000 {
		t.Errorf("the VM's rping to taproce's port %d, where nobody listens: exit %d after %d ms (%v):\n%s", port, code, took, err, out)
	}
}

// cmOurServer runs c's server on taproce and its client in the VM,
// reaching it on port, judged by both sides' exit statuses and reports;
// it returns the client's output.
func cmOurServer(t *testing.T, r *perfRig, p *Peer, c matrix.CMProgram, port int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	server, client := c.Commands(perfAddr.Addr().String(), port)
	out, done := ourServer(t, r, r.command(ctx, server...))
	vm, stderr, verr := p.Exec(ctx, "timeout 120 "+strings.Join(client, " ")+" 2>&1")
	var serr error
	wait := 30 * time.Second
	if c.ServerStays {
		wait = time.Second
	}
	select {
	case serr = <-done:
	case <-time.After(wait):
		cancel()
		serr = <-done
	}
	if verr != nil {
		t.Fatalf("VM client: %v %s\n%s\ntaproce server: %v\n%s", verr, stderr, vm, serr, out.String())
	}
	if err := c.Judge(matrix.Result{Out: out.String(), Err: serr}, matrix.Result{Out: vm}); err != nil {
		t.Fatalf("%v\nVM client:\n%s\ntaproce server:\n%s", err, vm, out.String())
	}
	return vm
}

// cmVMServer runs c's server in the VM and its client on taproce, once
// the VM's CM listens on port, judged as cmOurServer; it returns the
// client's output.
func cmVMServer(t *testing.T, r *perfRig, p *Peer, c matrix.CMProgram, port int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	server, client := c.Commands(p.IP.String(), port)
	job := p.Spawn(ctx, "cm-server", "timeout 120 "+strings.Join(server, " "))
	if err := vmListener(ctx, p, port, job); err != nil {
		t.Fatal(err)
	}
	b, err := r.command(ctx, client...).CombinedOutput()
	out := string(b)
	wait := time.Minute
	if c.ServerStays {
		wait = time.Second
	}
	code, vm, werr := job.Wait(ctx, wait)
	var serr error
	if werr != nil && !c.ServerStays || code != 0 && !c.ServerStays {
		serr = fmt.Errorf("exit %d, %v", code, werr)
	}
	if jerr := c.Judge(matrix.Result{Out: vm, Err: serr}, matrix.Result{Out: out, Err: err}); jerr != nil {
		t.Fatalf("%v\ntaproce client:\n%s\nVM server:\n%s", jerr, out, vm)
	}
	return out
}

// TestLibRDMACMLoss: 5 % of the CM's MADs are lost each way between
// taproce and rxe — nftables in the bridge's namespace drops them as they
// leave either side's TAP (madLoss) — and connections still establish:
// cmtime's 100 and rping's, each role each way. The drops are counted, and
// so are the retransmissions and duplicates that made up for them, in
// taproce's CM and in the kernel's (cm_tx_retries, cm_rx_duplicates).
func TestLibRDMACMLoss(t *testing.T) {
	p, _ := needPeer(t)
	r := newLibRig(t, rigConfig{})
	r.reach(t, p)
	drops := madLoss(t, p, 5)
	ours := r.nic.CM().Stats()
	theirs := vmCMCounters(t, p)
	for i, c := range cmInterops() {
		if c.Name != "cmtime" && c.Name != "rping" {
			continue
		}
		// A DREQ lost as its sender's process exits is not sent again —
		// Linux's CM cancels it when the ID goes (cm_destroy_id in
		// DREQ_SENT enters TimeWait) — and then rping's server, rxe's as
		// taproce's, waits for a disconnection it never hears of: under
		// loss its exit is not judged; its client's 100 verified pings are.
		c.ServerStays = true
		port := 7350 + i
		t.Run(c.Name+"/taproce-server", func(t *testing.T) { cmOurServer(t, r, p, c, port) })
		t.Run(c.Name+"/vm-server", func(t *testing.T) { cmVMServer(t, r, p, c, port) })
	}
	now := r.nic.CM().Stats()
	var retries, dups uint64
	for a := range now.Retries {
		retries += now.Retries[a] - ours.Retries[a]
		dups += now.Duplicates[a] - ours.Duplicates[a]
	}
	vm := vmCMCounters(t, p)
	ourDrops, vmDrops := drops()
	t.Logf("MADs dropped: %d of taproce's, %d of rxe's; taproce's CM sent %d again and took %d duplicates; "+
		"rxe's CM sent %d again and took %d duplicates", ourDrops, vmDrops, retries, dups,
		vm.retries-theirs.retries, vm.duplicates-theirs.duplicates)
	if ourDrops == 0 || vmDrops == 0 {
		t.Errorf("the loss dropped %d of taproce's MADs and %d of rxe's; want some of each", ourDrops, vmDrops)
	}
	if retries+dups+vm.retries-theirs.retries+vm.duplicates-theirs.duplicates == 0 {
		t.Error("MADs were lost, yet neither CM counted a retransmission or a duplicate")
	}
}

// madLoss makes the bridge's namespace drop pct percent of the CM's MADs
// leaving taproce's TAP and the VM's, until the test ends: an nftables
// netdev ingress chain on each TAP (what its owner writes into it) drops
// RoCE packets to QP1 (the BTH's destination QP, bytes 5–7 after the UDP
// header) at random. It returns the drops so far: taproce's, the VM's.
func madLoss(t *testing.T, p *Peer, pct int) func() (ours, theirs int) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (scripts/setup installs nftables)")
	}
	chain := func(name, dev string) string {
		return fmt.Sprintf(`	chain %s {
		type filter hook ingress device %q priority 0; policy accept;
		udp dport 4791 @th,104,24 1 numgen random mod 100 < %d counter drop
	}
`, name, dev, pct)
	}
	rules := "table netdev taproce_madloss {\n" + chain("ours", perfPortName) + chain("theirs", "tap-"+p.Name) + "}\n"
	nft := func(stdin string, args ...string) string {
		t.Helper()
		c := exec.Command("ip", append([]string{"netns", "exec", Namespace, "nft"}, args...)...)
		c.Stdin = strings.NewReader(stdin)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	nft(rules, "-f", "-")
	t.Cleanup(func() { nft("", "delete", "table", "netdev", "taproce_madloss") })
	return func() (int, int) {
		var n [2]int
		for i, name := range []string{"ours", "theirs"} {
			out := nft("", "list", "chain", "netdev", "taproce_madloss", name)
			if m := nftCounter.FindStringSubmatch(out); m != nil {
				n[i], _ = strconv.Atoi(m[1])
			}
		}
		return n[0], n[1]
	}
}

var nftCounter = regexp.MustCompile(`counter packets (\d+)`)

// cmCounters are the kernel CM's totals on the VM's rxe0 port 1.
type cmCounters struct{ retries, duplicates uint64 }

// vmCMCounters reads the VM's CM counters: every attribute's
// retransmissions and received duplicates (ib_cm's sysfs counters,
// under the port since Linux 5.14).
func vmCMCounters(t *testing.T, p *Peer) cmCounters {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sum := func(dir string) uint64 {
		// Linux 5.14 moved them from infiniband_cm's class to the port's.
		out, stderr, err := p.Exec(ctx, fmt.Sprintf("cat $(ls -d /sys/class/infiniband/rxe0/ports/1/%[1]s /sys/class/infiniband_cm/rxe0/1/%[1]s 2>/dev/null | head -1)/*", dir))
		if err != nil {
			t.Fatalf("the VM's CM counters %s: %v %s", dir, err, stderr)
		}
		var n uint64
		for _, f := range strings.Fields(out) {
			v, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				t.Fatalf("the VM's CM counters %s: %q", dir, out)
			}
			n += v
		}
		return n
	}
	return cmCounters{retries: sum("cm_tx_retries"), duplicates: sum("cm_rx_duplicates")}
}

// TestLibRDMACMPerftest: every perftest tool with -R (matrix.PerftestCM)
// on taproce against rxe in the VM, both ways, each judged by both sides'
// exit statuses and result rows. Through the CM each side's path MTU is
// its own link's (the active side's goes in the REQ, as Linux's
// cma_resolve_iboe_route takes its netdev's), so the VM's link gets the
// rig port's MTU, as one network has one. The server starts first and the
// client connects once the server's CM listens (ourServer, vmListener): a
// client that comes too early gets REJ 8, which perftest's own retry path
// does not survive.
func TestLibRDMACMPerftest(t *testing.T) {
	p, _ := needPeer(t)
	r := newLibRig(t, rigConfig{})
	r.reach(t, p)
	withPeerMTU(t, p, jumboMTU)
	ours, theirs := perfAddr.Addr().String(), p.IP.String()
	b, err := r.command(context.Background(), "ibv_devinfo", "-v", "-d", libDevice).CombinedOutput()
	if err != nil {
		t.Fatalf("ibv_devinfo -v: %v\n%s", err, b)
	}
	port, err := matrix.ParseDevinfo(string(b))
	if err != nil {
		t.Fatal(err)
	}
	runs := matrix.PerftestCM(port)
	for i, run := range runs {
		port := 7400 + i
		t.Run(run.Name()+"/taproce-server", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			out, done := ourServer(t, r, r.command(ctx, append([]string{"stdbuf", "-o0", run.Tool}, run.Command(libDevice, port, "")...)...))
			vm, _, verr := p.Exec(ctx, "timeout 120 stdbuf -o0 "+run.Tool+" "+strings.Join(run.Command("rxe0", port, ours), " ")+" 2>&1")
			var serr error
			select {
			case serr = <-done:
			case <-time.After(30 * time.Second):
				cancel()
				serr = <-done
			}
			if err := run.Judge(matrix.Result{Device: libDevice, Out: out.String(), Err: serr}, matrix.Result{Device: "rxe0", Out: vm, Err: verr}); err != nil {
				t.Fatalf("%v\nVM client:\n%s\ntaproce server:\n%s", err, vm, out.String())
			}
		})
		t.Run(run.Name()+"/vm-server", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			job := p.Spawn(ctx, "cm-perftest", "timeout 120 stdbuf -o0 "+run.Tool+" "+strings.Join(run.Command("rxe0", port, ""), " "))
			if err := vmListener(ctx, p, port, job); err != nil {
				t.Fatal(err)
			}
			cli := r.command(ctx, append([]string{"stdbuf", "-o0", run.Tool}, run.Command(libDevice, port, theirs)...)...)
			b, cerr := cli.CombinedOutput()
			code, vm, werr := job.Wait(ctx, time.Minute)
			var serr error
			if werr != nil || code != 0 {
				serr = fmt.Errorf("exit %d, %v", code, werr)
			}
			if err := run.Judge(matrix.Result{Device: "rxe0", Out: vm, Err: serr}, matrix.Result{Device: libDevice, Out: string(b), Err: cerr}); err != nil {
				t.Fatalf("%v\ntaproce client:\n%s\nVM server:\n%s", err, b, vm)
			}
		})
	}
}

// TestGoRDMACM: the verbs package's connections through the RDMA CM
// against Debian's rdma_server and rdma_client on rxe in the VM — a Go
// verbs.Dial to the VM's rdma_server, and the VM's rdma_client to a Go
// verbs.Listen on the rig's port — each side judged by its own verdict
// as ibvtest's TestGoRDMACM judges them (package gocm): the program's
// exit status and "end 0", the Go side's exact 16 bytes received and the
// program's disconnect after them. The Go side is this test binary again,
// as gocm's helper (gocm.RunIfHelper in TestMain), run as a client process
// of the rig's appliance in the bridge's namespace, where the library's
// programs run (the appliance serves a process its own namespace's port).
// The dial goes again while the VM's server does not listen yet (REJ 8,
// gocm.ExitRefused), as TestLibRDMACM's clients do.
func TestGoRDMACM(t *testing.T) {
	p, _ := needPeer(t)
	r := newPerfRig(t, rigConfig{})
	r.reach(t, p)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := netip.AddrPortFrom(perfAddr.Addr(), 7360), netip.AddrPortFrom(p.IP, 7361)
	for _, pair := range gocm.Pairs() {
		t.Run(pair.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			var srv, cli matrix.Result
			if pair.GoListens {
				srv, cli = goListenVMClient(ctx, t, p, r, pair.GoCommand(self, ours), pair.ProgramCommand(ours))
			} else {
				var refused int
				srv, cli, refused = goDialVMServer(ctx, p, r, int(theirs.Port()), pair.ProgramCommand(theirs), pair.GoCommand(self, theirs))
				t.Logf("dials refused before the VM's server listened: %d", refused)
			}
			if err := pair.Judge(srv, cli); err != nil {
				t.Fatalf("%v\nclient:\n%s\nserver:\n%s", err, cli.Out, srv.Out)
			}
			t.Logf("client:\n%s\nserver:\n%s", cli.Out, srv.Out)
		})
	}
}

// goListenVMClient runs the Go side's listener on the rig's port and, once
// it listens, the VM's client, and returns their outcomes.
func goListenVMClient(ctx context.Context, t *testing.T, p *Peer, r *perfRig, goSide, client []string) (srv, cli matrix.Result) {
	t.Helper()
	out, done := ourServer(t, r, r.inNamespace(ctx, goSide...))
	vm, stderr, verr := p.Exec(ctx, "timeout 120 "+strings.Join(client, " ")+" 2>&1")
	if verr != nil {
		verr = fmt.Errorf("%w: %s", verr, stderr)
	}
	srv.Err = <-done // the helper's own timeout bounds it
	srv.Out = out.String()
	return srv, matrix.Result{Out: vm, Err: verr}
}

// goDialVMServer runs the VM's server and, once it listens, the Go side's
// dial to it, and returns their outcomes and how many dials were refused
// (REJ 8) before one was accepted.
func goDialVMServer(ctx context.Context, p *Peer, r *perfRig, port int, server, goSide []string) (srv, cli matrix.Result, refused int) {
	job := p.Spawn(ctx, "gocm-server", "timeout 120 "+strings.Join(server, " "))
	if err := vmListener(ctx, p, port, job); err != nil {
		srv.Err = err
		return srv, cli, 0
	}
	for ; ; refused++ {
		b, err := r.inNamespace(ctx, goSide...).CombinedOutput()
		cli = matrix.Result{Out: string(b), Err: err}
		if ExitCode(err) != gocm.ExitRefused || refused >= 100 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	code, vm, werr := job.Wait(ctx, time.Minute)
	srv.Out = vm
	if werr != nil || code != 0 {
		srv.Err = fmt.Errorf("exit %d, %v", code, werr)
	}
	return srv, cli, refused
}

// ourServer starts srv, a server on the rig's device, and returns once
// the rig's port has a CM listener — none being left from an earlier
// server, whose IDs the appliance ends when its process is gone — with
// the server's output and its exit status when it ends.
func ourServer(t *testing.T, r *perfRig, srv *exec.Cmd) (*strings.Builder, <-chan error) {
	t.Helper()
	listeners := func() uint64 { return r.nic.CM().Stats().States[cm.StateListen] }
	for deadline := time.Now().Add(10 * time.Second); listeners() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the rig's port still has %d CM listeners after 10 s", listeners())
		}
	}
	out := new(strings.Builder)
	srv.Stdout, srv.Stderr = out, out
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	for listeners() == 0 {
		select {
		case err := <-done:
			t.Fatalf("the server ended before it listened: %v\n%s", err, out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return out, done
}

// vmListen is a line of `rdma resource show cm_id` for a listening ID.
var vmListen = regexp.MustCompile(`state LISTEN .*src-addr \S+:(\d+)`)

// vmListener waits until the VM's server, job, listens on port: the
// kernel's own account of its CM IDs (`rdma resource show cm_id`) has a
// LISTEN ID on that port. A client that comes before gets REJ 8, which
// perftest's retry path does not survive and cmtime counts as a
// connection made.
func vmListener(ctx context.Context, p *Peer, port int, job *Task) error {
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		select {
		case <-job.done:
			return fmt.Errorf("the VM's server ended before it listened: %v\n%s%s", job.err, job.out, job.stderr)
		default:
		}
		out, _, err := p.Exec(ctx, "rdma resource show cm_id")
		if err != nil {
			return fmt.Errorf("rdma resource show cm_id: %w", err)
		}
		for _, m := range vmListen.FindAllStringSubmatch(out, -1) {
			if m[1] == strconv.Itoa(port) {
				return nil
			}
		}
		last = out
	}
	return fmt.Errorf("no CM listener on port %d in the VM after 30 s:\n%s", port, last)
}
