package gocm

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/verbs"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/matrix"
)

// TestPairs: each way's command lines put the program and the helper on
// the right sides, and its verdict reads each side's own.
func TestPairs(t *testing.T) {
	addr := netip.MustParseAddrPort("10.55.0.102:7300")
	ps := Pairs()
	if len(ps) != 2 || ps[0].GoListens || !ps[1].GoListens {
		t.Fatalf("pairs: %+v", ps)
	}
	srv, cli := ps[0].Commands("/bin/x.test", addr)
	if want := []string{"rdma_server", "-s", "10.55.0.102", "-p", "7300"}; !slices.Equal(srv, want) {
		t.Errorf("dial's server %q, want %q", srv, want)
	}
	if want := []string{"env", HelperEnv + "=dial 10.55.0.102:7300", "/bin/x.test", "-test.run=^$"}; !slices.Equal(cli, want) {
		t.Errorf("dial's client %q, want %q", cli, want)
	}
	srv, cli = ps[1].Commands("/bin/x.test", addr)
	if srv[1] != HelperEnv+"=listen 10.55.0.102:7300" || cli[0] != "rdma_client" {
		t.Errorf("listen's commands %q, %q", srv, cli)
	}

	good := func(name string) matrix.Result { return matrix.Result{Out: name + ": start\n" + name + ": end 0\n"} }
	goOK := matrix.Result{Out: "go verbs: Dial …\n" + goEnd + "\n"}
	for _, c := range []struct {
		name     string
		p        Pair
		srv, cli matrix.Result
		bad      string
	}{
		{"dial passes", ps[0], good("rdma_server"), goOK, ""},
		{"listen passes", ps[1], goOK, good("rdma_client"), ""},
		{"program failed", ps[0], matrix.Result{Out: "rdma_server: end -1\n", Err: errors.New("exit status 1")}, goOK, "rdma_server"},
		{"program without its end", ps[1], goOK, matrix.Result{Out: "rdma_client: start\n"}, "rdma_client"},
		{"go side failed", ps[0], good("rdma_server"), matrix.Result{Out: "go verbs: dial: refused\n", Err: errors.New("exit status 3")}, "go side"},
		{"go side silent", ps[1], matrix.Result{}, good("rdma_client"), "go side"},
		{"sides swapped", ps[0], goOK, good("rdma_server"), "rdma_server"},
	} {
		err := c.p.Judge(c.srv, c.cli)
		if (err == nil) != (c.bad == "") || err != nil && !strings.Contains(err.Error(), c.bad) {
			t.Errorf("%s: %v, want an error naming %q", c.name, err, c.bad)
		}
	}
}

// TestHelper runs the helper's two sides in-process against a Go stand-in
// for each program (16 zero bytes each way, then its disconnect): both
// pass; a dial nobody listens for is ExitRefused, a bad spec ExitFailed.
func TestHelper(t *testing.T) {
	r := appliancetest.New(t, appliancetest.Options{Namespace: "gocm"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := netip.AddrPortFrom(r.Addrs[1], 7300)

	t.Run("dial", func(t *testing.T) {
		ln, err := verbs.Listen(ctx, verbs.NetworkRDMACM, addr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		served := make(chan error, 1)
		go func() { served <- standIn(ctx, ln) }()
		var out bytes.Buffer
		if code := runHelper("dial "+addr.String(), &out); code != 0 || !strings.HasSuffix(out.String(), goEnd+"\n") {
			t.Fatalf("exit %d:\n%s", code, out.String())
		}
		if err := <-served; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("listen", func(t *testing.T) {
		waitNoListener(t, r)
		var out bytes.Buffer
		code := make(chan int, 1)
		go func() { code <- runHelper("listen "+addr.String(), &out) }()
		waitListener(t, r)
		c, err := verbs.Dial(ctx, addr.String(), verbs.WithRDMACM())
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Send(ctx, programMessage); err != nil {
			t.Fatal(err)
		}
		if got, err := c.Recv(ctx); err != nil || !bytes.Equal(got, goMessage) {
			t.Fatalf("received %q, %v", got, err)
		}
		c.Close()
		if n := <-code; n != 0 || !strings.HasSuffix(out.String(), goEnd+"\n") {
			t.Fatalf("exit %d:\n%s", n, out.String())
		}
	})
	t.Run("refused", func(t *testing.T) {
		waitNoListener(t, r)
		var out bytes.Buffer
		if code := runHelper("dial "+addr.String(), &out); code != ExitRefused {
			t.Fatalf("exit %d, want %d:\n%s", code, ExitRefused, out.String())
		}
	})
	t.Run("bad spec", func(t *testing.T) {
		var out bytes.Buffer
		if code := runHelper("connect "+addr.String(), &out); code != ExitFailed || !strings.Contains(out.String(), HelperEnv) {
			t.Fatalf("exit %d:\n%s", code, out.String())
		}
	})
}

// standIn serves one connection of ln as rdma_server does: it receives
// the client's message, answers with its 16 zero bytes, and disconnects.
func standIn(ctx context.Context, ln *verbs.Listener) error {
	c, err := ln.Accept(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if got, err := c.Recv(ctx); err != nil || !bytes.Equal(got, goMessage) {
		return errors.Join(err, errors.New("the stand-in received "+string(got)))
	}
	return c.Send(ctx, programMessage)
}

func listeners(r *appliancetest.Rig) uint64 { return r.NICs[1].CM().Stats().States[cm.StateListen] }

func waitListener(t *testing.T, r *appliancetest.Rig) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); listeners(r) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no listener")
		}
	}
}

func waitNoListener(t *testing.T, r *appliancetest.Rig) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); listeners(r) != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a listener is left")
		}
	}
}
