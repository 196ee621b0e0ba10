package interop

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/verbs/abi"
)

// toolAddr is the address of the appliance's port in TestToolPingpong.
var toolAddr = netip.MustParsePrefix("10.99.0.13/24")

// buildTaproce builds the taproce command into a temporary directory.
func buildTaproce(t *testing.T) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "taproce")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// bridgeAppliance runs an appliance in this process with one port
// (taproce0, toolAddr) on the peers' bridge, serving verbs on a socket in
// a temporary directory to clients in Namespace. It returns the socket and
// the port's transport engine.
func bridgeAppliance(t *testing.T) (sock string, engine *transport.Engine) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "taproce.sock")
	app, err := appliance.New(appliance.Options{Socket: sock, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("taproce%d", toolAddr.Addr().As4()[3])
	nic, err := app.AddPort(appliance.PortConfig{Namespace: Namespace, Netns: netnsutil.Path(Namespace), Name: name,
		Addrs: []netip.Prefix{toolAddr}, MTU: 1500})
	if err != nil {
		t.Fatal(err)
	}
	if err := netnsutil.AttachToBridge(netnsutil.Path(Namespace), name, Bridge); err != nil {
		app.Close()
		t.Fatal(err)
	}
	// The TAP joined the bridge after the station announced itself.
	nic.Port().Station().Announce()
	if err := app.Control().Listen(); err != nil {
		app.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		app.Close()
	})
	return sock, nic.Engine()
}

// toolCmd returns `taproce pingpong args...` run in Namespace as a client
// process of the appliance at sock.
func toolCmd(ctx context.Context, bin, sock string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", Namespace, bin, "pingpong"}, args...)...)
	cmd.Env = append(os.Environ(), "TAPROCE_SOCKET="+sock)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// lockedBuffer is a bytes.Buffer a process writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestToolPingpong: `taproce pingpong`, built with go build and run as a
// separate client process (in the namespace of the peers' bridge) of an
// appliance in this process, against ibv_rc_pingpong, ibv_uc_pingpong and
// ibv_ud_pingpong in the rxe VM, in both directions, both sides with -c
// (taproce checks every byte of the echo, the rxe server every page's
// mark): exit status, output lines, no invalid data, no error counted by
// rxe or the appliance's transport, packet counts equal both ways.
func TestToolPingpong(t *testing.T) {
	p, _ := needPeer(t)
	bin := buildTaproce(t)
	sock, engine := bridgeAppliance(t)
	ep := &Endpoint{Engine: engine} // for the counter checks
	side := toolSide{bin: bin, sock: sock, local: toolAddr.Addr(),
		check: func(iters int) counterCheck { return startCheck(ep, iters) }}
	for _, c := range []ppCase{
		{typ: abi.RC, mtu: 1024, size: 64, iters: 50},
		{typ: abi.RC, mtu: 1024, size: 4096, iters: 20},
		{typ: abi.RC, mtu: 1024, size: 65536, iters: 5},
		{typ: abi.UC, mtu: 1024, size: 4096, iters: 20},
		{typ: abi.UD, size: 1, iters: 20},
		{typ: abi.UD, size: 1024, iters: 50},
	} {
		name := strings.ToLower(c.typ.String()) + "/" + c.name()
		t.Run(name+"/vm-server", func(t *testing.T) { toolVMServer(t, p, side, c) })
		t.Run(name+"/vm-client", func(t *testing.T) { toolVMClient(t, p, side, c) })
	}
}

// counterCheck compares the rxe and taproce counters around an exchange;
// it took taproce's when it was made.
type counterCheck interface {
	finish(t *testing.T, before, after Counters)
}

// toolSide is where `taproce pingpong` runs: the command, the socket of
// its appliance, the address of the appliance's port (the tool's GID),
// and the counter check of a run of iters iterations, begun when called.
type toolSide struct {
	bin, sock string
	// lib, when set, is the directory of taproce's libibverbs.so.1: the
	// side then runs Debian's ibv_*_pingpong on it instead of taproce
	// pingpong, on the appliance's first device (lib_test.go).
	lib   string
	local netip.Addr
	check func(iters int) counterCheck
}

// command returns the side's pingpong for c with extra options.
func (s toolSide) command(ctx context.Context, c ppCase, extra ...string) *exec.Cmd {
	if s.lib == "" {
		return toolCmd(ctx, s.bin, s.sock, append(c.toolArgs(), extra...)...)
	}
	args := append(append([]string{"netns", "exec", Namespace, "env", "LD_LIBRARY_PATH=" + s.lib, c.tool(), "-d", libDevice},
		strings.Fields(c.args())...), extra...)
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Env = append(os.Environ(), "TAPROCE_SOCKET="+s.sock)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// toolArgs returns the options of both sides (the tool's, and -t for
// taproce's transport).
func (c ppCase) toolArgs() []string {
	return append([]string{"-t", strings.ToLower(c.typ.String())}, strings.Fields(c.args())...)
}

// checkToolOutput checks taproce pingpong's output: the four lines of the
// tools, the local GID the port's, the remote GID the VM's, no invalid
// data.
func checkToolOutput(t *testing.T, c ppCase, local netip.Addr, out string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "  local address:  LID 0x0000, QPN ") ||
		!strings.HasSuffix(lines[0], " GID ::ffff:"+local.String()) ||
		!strings.HasSuffix(lines[1], " GID ::ffff:"+peerIP) ||
		!strings.Contains(lines[2], fmt.Sprintf("%d bytes in ", 2*c.size*c.iters)) ||
		!strings.HasPrefix(lines[3], fmt.Sprintf("%d iters in ", c.iters)) {
		t.Errorf("taproce pingpong output:\n%s", out)
	}
}

// toolVMServer runs the tool as server in the VM and taproce pingpong as
// its client.
func toolVMServer(t *testing.T, p *Peer, side toolSide, c ppCase) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	check := side.check(c.iters)
	job := p.Spawn(ctx, "tool-server", withCounters(c.tool()+" -c "+c.args()))
	// The tool listens once its QP is ready: retry while refused.
	var out, errOut string
	var runErr error
	for deadline := time.Now().Add(90 * time.Second); ; {
		var o, e bytes.Buffer
		cmd := side.command(ctx, c, "-c", peerIP)
		cmd.Stdout, cmd.Stderr = &o, &e
		runErr = cmd.Run()
		out, errOut = o.String(), e.String()
		refused := strings.Contains(strings.ToLower(errOut+out), "couldn't connect")
		if runErr == nil || !refused || time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if runErr != nil {
		t.Errorf("taproce pingpong: %v\n%s%s", runErr, out, errOut)
	} else {
		t.Logf("taproce pingpong %s %s:\n%s", strings.Join(c.toolArgs(), " "), peerIP, strings.TrimSpace(out))
		checkToolOutput(t, c, side.local, out)
	}
	code, vmOut, werr := job.Wait(ctx, 60*time.Second)
	before, vmOut, after, ok := splitCounters(vmOut)
	t.Logf("VM %s -c %s (exit %d):\n%s", c.tool(), c.args(), code, strings.TrimSpace(vmOut))
	switch {
	case werr != nil:
		t.Error(werr)
	case code != 0 || !strings.Contains(vmOut, fmt.Sprintf("%d iters in", c.iters)) || strings.Contains(vmOut, "invalid data"):
		t.Errorf("VM server exited with %d", code)
	case !ok:
		t.Error("VM output lacks the rxe counters")
	case runErr == nil:
		check.finish(t, before, after)
	}
}

// toolVMClient runs taproce pingpong as server (its exchange on the
// namespace's address) and the tool in the VM as its client.
func toolVMClient(t *testing.T, p *Peer, side toolSide, c ppCase) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	check := side.check(c.iters)
	var out, errOut lockedBuffer
	cmd := side.command(ctx, c, "-c")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// It prints its address, then listens (Debian's tools print into a
	// buffer: only the listening shows).
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	var err error
	for side.lib == "" && !strings.Contains(out.String(), "local address:") && err == nil {
		select {
		case <-wctx.Done():
			err = wctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err == nil {
		err = waitListening(wctx, DefaultPingpongPort)
	}
	wcancel()
	if err != nil {
		cancel()
		<-done
		t.Fatalf("taproce pingpong server did not start: %v\n%s%s", err, out.String(), errOut.String())
	}
	vmCmd := fmt.Sprintf("timeout 90 %s %s -c %s", c.tool(), c.args(), HostIP)
	vmOut, vmErr, err := p.Exec(ctx, withCounters(vmCmd))
	before, vmOut, after, ok := splitCounters(vmOut)
	t.Logf("VM %s (exit %d):\n%s%s", vmCmd, max(ExitCode(err), 0), strings.TrimSpace(vmOut), vmErr)
	if err != nil {
		t.Errorf("VM client: %v", err)
		cancel()
	} else if !strings.Contains(vmOut, fmt.Sprintf("%d iters in", c.iters)) {
		t.Error("VM client did not complete cleanly")
	}
	serr := <-done
	if serr != nil {
		t.Errorf("taproce pingpong server: %v\n%s%s", serr, out.String(), errOut.String())
	} else {
		t.Logf("taproce pingpong %s:\n%s", strings.Join(c.toolArgs(), " "), strings.TrimSpace(out.String()))
		checkToolOutput(t, c, side.local, out.String())
	}
	if err == nil && serr == nil {
		if !ok {
			t.Error("VM output lacks the rxe counters")
		} else {
			check.finish(t, before, after)
		}
	}
}
