package interop

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"regexp"
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
	ours, theirs := perfAddr.Addr().String(), p.IP.String()
	for i, c := range cmInterops() {
		port := 7300 + i
		t.Run(c.Name+"/taproce-server", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			server, client := c.Commands(ours, port)
			srv := r.command(ctx, server...)
			var out strings.Builder
			srv.Stdout, srv.Stderr = &out, &out
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- srv.Wait() }()
			for r.nic.CM().Stats().States[cm.StateListen] == 0 {
				select {
				case err := <-done:
					t.Fatalf("the server ended before it listened: %v\n%s", err, out.String())
				case <-time.After(10 * time.Millisecond):
				}
			}
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
			if c.Name == "cmtime" {
				t.Logf("cmtime -c 100, rxe client, taproce server:\n%s\nbetween the two rxe VMs:\n%s", cmtimeLines(vm), rxeCMTime)
			}
		})
		t.Run(c.Name+"/vm-server", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			server, client := c.Commands(theirs, port)
			job := p.Spawn(ctx, "cm-server", "timeout 120 "+strings.Join(server, " "))
			// The client again while the VM's server does not listen yet
			// (a REJ, "connect error"), as the perftest runs retry.
			var out string
			var err error
			for i := 0; ; i++ {
				cli := r.command(ctx, client...)
				b, e := cli.CombinedOutput()
				out, err = string(b), e
				if err == nil || i >= 100 || !strings.Contains(out, "REJECTED") && !strings.Contains(out, "error") && !strings.Contains(out, "refused") {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
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
			if c.Name == "cmtime" {
				t.Logf("cmtime -c 100, taproce client, rxe server:\n%s", cmtimeLines(out))
			}
		})
	}
}

// TestLibRDMACMPerftest: every perftest tool with -R (matrix.PerftestCM)
// on taproce against rxe in the VM, both ways, each judged by both sides'
// exit statuses and result rows. Through the CM each side's path MTU is
// its own link's (the active side's goes in the REQ, as Linux's
// cma_resolve_iboe_route takes its netdev's), so the VM's link gets the
// rig port's MTU, as one network has one. The VM's perftest waits for its peer's
// exchange, so the server starts first and the client connects once the
// server's CM listens (taproce's) or after a moment (the VM's, whose
// listener the appliance cannot see; a client that comes too early gets
// REJ 8, which perftest's own retry path does not survive).
func TestLibRDMACMPerftest(t *testing.T) {
	p, _ := needPeer(t)
	r := newLibRig(t, rigConfig{})
	r.reach(t, p)
	withPeerMTU(t, p, jumboMTU)
	ours, theirs := perfAddr.Addr().String(), p.IP.String()
	runs := matrix.PerftestCM(matrix.Port{IPv4GID: 1, ActiveMTU: 1024})
	for i, run := range runs {
		port := 7400 + i
		t.Run(run.Name()+"/taproce-server", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			srv := r.command(ctx, append([]string{"stdbuf", "-o0", run.Tool}, run.Command(libDevice, port, "")...)...)
			var out strings.Builder
			srv.Stdout, srv.Stderr = &out, &out
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- srv.Wait() }()
			for r.nic.CM().Stats().States[cm.StateListen] == 0 {
				select {
				case err := <-done:
					t.Fatalf("the server ended before it listened: %v\n%s", err, out.String())
				case <-time.After(10 * time.Millisecond):
				}
			}
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
			time.Sleep(time.Second) // the VM's perftest opens its device and listens
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
				srv, cli, refused = goDialVMServer(ctx, p, r, pair.ProgramCommand(theirs), pair.GoCommand(self, theirs))
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
	cmd := r.inNamespace(ctx, goSide...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for r.nic.CM().Stats().States[cm.StateListen] == 0 {
		select {
		case err := <-done:
			t.Fatalf("the Go side ended before it listened: %v\n%s", err, out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	vm, stderr, verr := p.Exec(ctx, "timeout 120 "+strings.Join(client, " ")+" 2>&1")
	if verr != nil {
		verr = fmt.Errorf("%w: %s", verr, stderr)
	}
	srv.Err = <-done // the helper's own timeout bounds it
	srv.Out = out.String()
	return srv, matrix.Result{Out: vm, Err: verr}
}

// goDialVMServer runs the VM's server and the Go side's dial to it, and
// returns their outcomes and how many dials were refused before it.
func goDialVMServer(ctx context.Context, p *Peer, r *perfRig, server, goSide []string) (srv, cli matrix.Result, refused int) {
	job := p.Spawn(ctx, "gocm-server", "timeout 120 "+strings.Join(server, " "))
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
