package ibvtest

import (
	"context"
	"net/netip"
	"testing"

	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/verbs"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/gocm"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/matrix"
)

// TestGoRDMACM runs the verbs package's connections through the RDMA CM
// against Debian's unmodified rdma_server and rdma_client (rdmacm-utils,
// on taproce's librdmacm.so.1), over the fake wire and the local switch:
// a Go Dial to rdma_server, and rdma_client to a Go Listener. Each pair
// makes the programs' exchange — the client sends 16 bytes, the server
// answers with 16 once it has them — and each side's verdict is checked
// (package gocm, which the lab and the interop suite run too): the
// program's exit status and its "end 0", and on the Go side the message
// it got, exactly the server's or client's 16-byte buffer (one they never
// fill: 16 zero bytes), and ErrPeerClosed after it, once the program's
// rdma_disconnect came.
func TestGoRDMACM(t *testing.T) {
	l := Need(t, false)
	gocm.NeedPrograms(t)
	for _, local := range []bool{false, true} {
		t.Run(map[bool]string{false: "wire", true: "local-switch"}[local], func(t *testing.T) {
			r := appliancetest.New(t, appliancetest.Options{Namespace: "cm", LocalSwitch: local})
			env := l.Env(r.Socket)
			for i, p := range gocm.Pairs() {
				t.Run(p.Name, func(t *testing.T) {
					noListeners(t, r)
					addr := netip.AddrPortFrom(r.Addrs[1], uint16(7300+i))
					if p.GoListens {
						rdmaClientToGoListen(t, env, p, addr)
					} else {
						goDialRDMAServer(t, r, env, p, addr)
					}
				})
			}
			if local && r.App.Switch().Frames() == 0 {
				t.Fatal("nothing crossed the local switch")
			}
		})
	}
}

func goDialRDMAServer(t *testing.T, r *appliancetest.Rig, env []string, p gocm.Pair, addr netip.AddrPort) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := p.ProgramCommand(addr)
	srv := Start(t, env, timeout, cmd[0], cmd[1:]...)
	waitListener(t, r.NICs[1], srv)
	if err := gocm.Dial(ctx, addr.String()); err != nil {
		t.Fatalf("%v\n%s", err, srv.Out.String())
	}
	werr := srv.Wait() // before its output is read
	if err := gocm.JudgeProgram(p.Program(), matrix.Result{Out: srv.Out.String(), Err: werr}); err != nil {
		t.Fatalf("%v\n%s", err, srv.Out.String())
	}
}

func rdmaClientToGoListen(t *testing.T, env []string, p gocm.Pair, addr netip.AddrPort) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ln, err := verbs.Listen(ctx, verbs.NetworkRDMACM, addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd := p.ProgramCommand(addr)
	cli := Start(t, env, timeout, cmd[0], cmd[1:]...)
	acc := make(chan *verbs.Conn, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			t.Errorf("accept: %v", err)
		}
		acc <- c
	}()
	var c *verbs.Conn
	select {
	case c = <-acc:
	case <-cli.done:
		t.Fatalf("rdma_client ended before it was accepted: %v\n%s", cli.err, cli.Out.String())
	}
	if c == nil {
		t.Fatalf("rdma_client:\n%s", cli.Out.String())
	}
	defer c.Close()
	if err := gocm.Exchange(ctx, c, false); err != nil {
		t.Fatalf("%v\n%s", err, cli.Out.String())
	}
	werr := cli.Wait() // before its output is read
	if err := gocm.JudgeProgram(p.Program(), matrix.Result{Out: cli.Out.String(), Err: werr}); err != nil {
		t.Fatalf("%v\n%s", err, cli.Out.String())
	}
}
