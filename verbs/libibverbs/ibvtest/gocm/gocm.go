// Package gocm is the Go side of rdmacm-utils' rdma_server and
// rdma_client exchange: the verbs package's connections through the RDMA
// CM (verbs.Dial with verbs.WithRDMACM, verbs.Listen with
// verbs.NetworkRDMACM) meeting Debian's unmodified programs, and the
// verdicts of both sides. Three places run it: ibvtest's TestGoRDMACM
// between the two devices of an in-process appliance, internal/lab's
// TestLabGoRDMACM between two lab namespaces, and interop's
// TestGoRDMACM against kernel rxe in the peer VM.
//
// The appliance serves a client the port of the network namespace its
// process is in (SO_PEERCRED's PID, then /proc/PID/ns/net), so a Go side
// that must be in another namespace than its test is a process of its
// own there: the test binary run again under `ip netns exec` with
// HelperEnv set (Pair.GoCommand), whose TestMain calls RunIfHelper before
// anything else. That is an application as any other — its own process,
// its own control connection, the same code TestGoRDMACM runs in-process
// — and needs no command in taproce's binary that only tests use.
package gocm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/verbs"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/matrix"
)

// programMessage is what rdma_server and rdma_client send: their 16-byte
// send_msg, a static buffer they never write.
var programMessage = make([]byte, 16)

// goMessage is what the Go side sends them: 16 bytes, as much as their
// receive buffer takes.
var goMessage = []byte("taproce verbs go")

// disconnectWait bounds the wait for the program's disconnect after the
// exchange: it disconnects as soon as its own completions are in.
const disconnectWait = 10 * time.Second

// Exchange makes the programs' exchange on c, from the client's side
// (send, then receive) or the server's (receive, then send), and then
// waits for the program's disconnect: the message received must be
// exactly the program's 16 zero bytes, and what follows it
// verbs.ErrPeerClosed.
func Exchange(ctx context.Context, c *verbs.Conn, client bool) error {
	if client {
		if err := c.Send(ctx, goMessage); err != nil {
			return fmt.Errorf("send: %w", err)
		}
	}
	got, err := c.Recv(ctx)
	if err != nil || !bytes.Equal(got, programMessage) {
		return fmt.Errorf("received %q, %v; want %d zero bytes", got, err, len(programMessage))
	}
	if !client {
		if err := c.Send(ctx, goMessage); err != nil {
			return fmt.Errorf("send: %w", err)
		}
	}
	bounded, cancel := context.WithTimeout(ctx, disconnectWait)
	defer cancel()
	if _, err := c.Recv(bounded); !errors.Is(err, verbs.ErrPeerClosed) {
		return fmt.Errorf("after the exchange: %v, want the peer's disconnect", err)
	}
	return nil
}

// Dial connects to rdma_server at addr through the RDMA CM and makes the
// client's exchange.
func Dial(ctx context.Context, addr string) error {
	c, err := verbs.Dial(ctx, addr, verbs.WithRDMACM())
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	return Exchange(ctx, c, true)
}

// Pair is one way the Go side meets the programs: a Go Dial to
// rdma_server, or rdma_client to a Go Listen.
type Pair struct {
	// Name names the run: "Dial to rdma_server", "rdma_client to Listen".
	Name string
	// GoListens: the Go side is the server and the program rdma_client;
	// else the Go side dials rdma_server.
	GoListens bool
}

// Pairs returns both ways.
func Pairs() []Pair {
	return []Pair{{Name: "Dial to rdma_server"}, {Name: "rdma_client to Listen", GoListens: true}}
}

// Program is the program the Go side meets.
func (p Pair) Program() string {
	if p.GoListens {
		return "rdma_client"
	}
	return "rdma_server"
}

// ProgramCommand is the program's command line, program first, for a
// server at addr: rdma_server listens there, rdma_client connects there.
func (p Pair) ProgramCommand(addr netip.AddrPort) []string {
	return []string{p.Program(), "-s", addr.Addr().String(), "-p", strconv.Itoa(int(addr.Port()))}
}

// GoCommand is the Go side's command line for a server at addr: the test
// binary exe run as a helper (RunIfHelper) that dials or listens there,
// through env(1), so that it runs where a program would.
func (p Pair) GoCommand(exe string, addr netip.AddrPort) []string {
	role := "dial"
	if p.GoListens {
		role = "listen"
	}
	return []string{"env", HelperEnv + "=" + role + " " + addr.String(), exe, "-test.run=^$"}
}

// Commands returns the server's and the client's command lines.
func (p Pair) Commands(exe string, addr netip.AddrPort) (server, client []string) {
	if p.GoListens {
		return p.GoCommand(exe, addr), p.ProgramCommand(addr)
	}
	return p.ProgramCommand(addr), p.GoCommand(exe, addr)
}

// Judge returns nil when both sides passed by their own verdicts
// (JudgeProgram, JudgeGo).
func (p Pair) Judge(srv, cli matrix.Result) error {
	goSide, prog := cli, srv
	if p.GoListens {
		goSide, prog = srv, cli
	}
	return errors.Join(JudgeProgram(p.Program(), prog), JudgeGo(goSide))
}

// JudgeProgram returns nil when rdma_server or rdma_client (name) passed
// by its own verdict: exit status 0 and "NAME: end 0", which it prints
// once its exchange and disconnect are done.
func JudgeProgram(name string, r matrix.Result) error {
	if r.Err != nil || !strings.Contains(r.Out, name+": end 0") {
		return fmt.Errorf("%s: %v: %s", name, r.Err, tail(r.Out))
	}
	return nil
}

// goEnd is the helper's last line when its side passed, as the programs
// print theirs.
const goEnd = "go verbs: end 0"

// JudgeGo returns nil when a helper's Go side passed: exit status 0 and
// its goEnd line.
func JudgeGo(r matrix.Result) error {
	if r.Err != nil || !strings.Contains(r.Out, goEnd) {
		return fmt.Errorf("go side: %v: %s", r.Err, tail(r.Out))
	}
	return nil
}

// tail returns the last lines of s, joined by " | ".
func tail(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	return strings.Join(lines, " | ")
}

// HelperEnv makes a test binary whose TestMain calls RunIfHelper the Go
// side: "dial HOST:PORT" dials rdma_server there, "listen HOST:PORT"
// listens there for rdma_client, each making the exchange once.
const HelperEnv = "TAPROCE_GOCM_HELPER"

// HelperTimeout bounds a helper's run.
const HelperTimeout = 60 * time.Second

// Exit statuses of a helper besides 0 (passed).
const (
	// ExitFailed: the exchange or its setup failed.
	ExitFailed = 1
	// ExitRefused: the dial met a REJ with reason 8, nobody listening on
	// the port — a server that does not listen yet, which a caller that
	// cannot see the server's CM (the VM's) may try again.
	ExitRefused = 3
)

// RunIfHelper runs the Go side and exits when HelperEnv is set, and
// returns at once otherwise. A test binary's TestMain calls it first.
func RunIfHelper() {
	v, ok := os.LookupEnv(HelperEnv)
	if !ok {
		return
	}
	os.Exit(runHelper(v, os.Stdout))
}

// runHelper runs the Go side spec (HelperEnv's value) and returns its
// exit status, reporting on w.
func runHelper(spec string, w io.Writer) int {
	ctx, cancel := context.WithTimeout(context.Background(), HelperTimeout)
	defer cancel()
	role, addr, _ := strings.Cut(spec, " ")
	var err error
	switch role {
	case "dial":
		fmt.Fprintf(w, "go verbs: Dial %s through the RDMA CM\n", addr)
		err = Dial(ctx, addr)
	case "listen":
		err = listenOnce(ctx, w, addr)
	default:
		err = fmt.Errorf("%s=%q: want \"dial HOST:PORT\" or \"listen HOST:PORT\"", HelperEnv, spec)
	}
	if err != nil {
		fmt.Fprintf(w, "go verbs: %v\n", err)
		var rej *verbs.RejectedError
		if errors.As(err, &rej) && rej.Reason == verbs.RejectInvalidServiceID {
			return ExitRefused
		}
		return ExitFailed
	}
	fmt.Fprintf(w, "go verbs: sent %d bytes, received %d zero bytes, then the peer's disconnect\n%s\n",
		len(goMessage), len(programMessage), goEnd)
	return 0
}

// listenOnce listens at addr through the RDMA CM, accepts one
// connection and makes the server's exchange on it.
func listenOnce(ctx context.Context, w io.Writer, addr string) error {
	ln, err := verbs.Listen(ctx, verbs.NetworkRDMACM, addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	fmt.Fprintf(w, "go verbs: Listen %s through the RDMA CM\n", ln.Addr())
	c, err := ln.Accept(ctx)
	if err != nil {
		return fmt.Errorf("accept: %w", err)
	}
	defer c.Close()
	fmt.Fprintf(w, "go verbs: accepted %s\n", c.RemoteAddr())
	return Exchange(ctx, c, false)
}

// NeedPrograms skips the test unless Debian's rdma_server and
// rdma_client are on the PATH.
func NeedPrograms(t testing.TB) {
	t.Helper()
	for _, p := range Pairs() {
		if _, err := exec.LookPath(p.Program()); err != nil {
			t.Skipf("needs Debian's %s (rdmacm-utils; scripts/setup installs it): %v", p.Program(), err)
		}
	}
}
