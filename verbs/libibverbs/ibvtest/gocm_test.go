package ibvtest

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/verbs"
)

// TestGoRDMACM runs the verbs package's connections through the RDMA CM
// against Debian's unmodified rdma_server and rdma_client (rdmacm-utils,
// on taproce's librdmacm.so.1), over the fake wire and the local switch:
// a Go Dial to rdma_server, and rdma_client to a Go Listener. Each pair
// makes the programs' exchange — the client sends 16 bytes, the server
// answers with 16 once it has them — and each side's verdict is checked:
// the program's exit status and its "end 0", and on the Go side the
// message it got, exactly the server's or client's 16-byte buffer (one
// they never fill: 16 zero bytes), and ErrPeerClosed after it, once the
// program's rdma_disconnect came.
func TestGoRDMACM(t *testing.T) {
	l := Need(t, false)
	for _, local := range []bool{false, true} {
		t.Run(map[bool]string{false: "wire", true: "local-switch"}[local], func(t *testing.T) {
			r := appliancetest.New(t, appliancetest.Options{Namespace: "cm", LocalSwitch: local})
			env := l.Env(r.Socket)
			for i, tc := range []struct {
				name string
				run  func(t *testing.T, r *appliancetest.Rig, env []string, addr string)
			}{
				{"Dial to rdma_server", goDialRDMAServer},
				{"rdma_client to Listen", rdmaClientToGoListen},
			} {
				t.Run(tc.name, func(t *testing.T) {
					noListeners(t, r)
					tc.run(t, r, env, netip.AddrPortFrom(r.Addrs[1], uint16(7300+i)).String())
				})
			}
			if local && r.App.Switch().Frames() == 0 {
				t.Fatal("nothing crossed the local switch")
			}
		})
	}
}

// rdmaMessage is what rdma_server and rdma_client send: their 16-byte
// send_msg, a static buffer they never write.
var rdmaMessage = make([]byte, 16)

// goMessage is what the Go side sends them: 16 bytes, as much as their
// receive buffer takes.
var goMessage = []byte("taproce verbs go")

func goDialRDMAServer(t *testing.T, r *appliancetest.Rig, env []string, addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ap := netip.MustParseAddrPort(addr)
	srv := Start(t, env, timeout, "rdma_server", "-s", ap.Addr().String(), "-p", strconv.Itoa(int(ap.Port())))
	waitListener(t, r.NICs[1], srv)
	c, err := verbs.Dial(ctx, addr, verbs.WithRDMACM())
	if err != nil {
		t.Fatalf("dial: %v\n%s", err, srv.Out.String())
	}
	defer c.Close()
	checkExchange(t, ctx, c, true)
	if err := srv.Wait(); err != nil || !strings.Contains(srv.Out.String(), "rdma_server: end 0") {
		t.Fatalf("rdma_server: %v\n%s", err, srv.Out.String())
	}
}

func rdmaClientToGoListen(t *testing.T, r *appliancetest.Rig, env []string, addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ln, err := verbs.Listen(ctx, verbs.NetworkRDMACM, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ap := netip.MustParseAddrPort(addr)
	cli := Start(t, env, timeout, "rdma_client", "-s", ap.Addr().String(), "-p", strconv.Itoa(int(ap.Port())))
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
	checkExchange(t, ctx, c, false)
	if err := cli.Wait(); err != nil || !strings.Contains(cli.Out.String(), "rdma_client: end 0") {
		t.Fatalf("rdma_client: %v\n%s", err, cli.Out.String())
	}
}

// checkExchange makes the programs' exchange on c, from the client's side
// (send, then receive) or the server's (receive, then send), and then
// waits for the program's disconnect.
func checkExchange(t *testing.T, ctx context.Context, c *verbs.Conn, client bool) {
	t.Helper()
	if client {
		if err := c.Send(ctx, goMessage); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	got, err := c.Recv(ctx)
	if err != nil || !bytes.Equal(got, rdmaMessage) {
		t.Fatalf("received %q, %v; want %d zero bytes", got, err, len(rdmaMessage))
	}
	if !client {
		if err := c.Send(ctx, goMessage); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.Recv(bounded); !errors.Is(err, verbs.ErrPeerClosed) {
		t.Fatalf("after the exchange: %v, want the peer's disconnect", err)
	}
}
