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

// waitListener waits until n's connection manager has a listener.
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

// TestRping runs rdmacm-utils' rping, unmodified, between the appliance's
// two devices: the server listens on taproce1's address, the client
// connects from taproce0's through the RDMA CM, and they ping-pong 10
// times with RDMA READ and WRITE, verifying the data (-V), each judged by
// its exit status and its own output.
func TestRping(t *testing.T) {
	l := Need(t, false)
	r := appliancetest.New(t, appliancetest.Options{Namespace: "cm"})
	env := l.Env(r.Socket)
	srvAddr, cliAddr := r.Addrs[1].String(), r.Addrs[0].String()
	srv := Start(t, env, timeout, "rping", "-s", "-a", srvAddr, "-p", "7174", "-C", "10", "-V", "-v")
	waitListener(t, r.NICs[1], srv)
	cli := Start(t, env, timeout, "rping", "-c", "-a", srvAddr, "-I", cliAddr, "-p", "7174", "-C", "10", "-V", "-v")
	cerr := cli.Wait()
	serr := srv.Wait()
	if cerr != nil || serr != nil {
		for i, n := range r.NICs {
			t.Logf("NIC %d: %+v", i, n.Engine().Stats())
		}
		t.Fatalf("client: %v\n%s\nserver: %v\n%s", cerr, cli.Out.String(), serr, srv.Out.String())
	}
	for _, p := range []*Program{cli, srv} {
		if n := strings.Count(p.Out.String(), "ping data: rdma-ping-"); n != 10 {
			t.Errorf("%s printed %d pings, want 10:\n%s", p.Cmd.Args[1], n, p.Out.String())
		}
	}
}
