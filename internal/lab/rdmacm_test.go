package lab

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/gocm"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/matrix"
)

// TestLabRDMACM runs Debian's RDMA CM programs, unmodified, between two
// lab namespaces over their TAPs, bridges and veth, on taproce's
// libibverbs.so.1 and librdmacm.so.1 built from this checkout: the server
// in the second namespace on its port's address, its client in the first
// reaching it through the CM's MADs on QP1 — rdmacm-utils' rping,
// ucmatose, udaddy, rdma_server/rdma_client and cmtime, then every
// perftest tool with -R — each judged by the programs' own verdict.
func TestLabRDMACM(t *testing.T) {
	l, env := debianLab(t)
	ctx := context.Background()
	a, b := l.Hosts[0], l.Hosts[1]
	addr := b.PortIPv4().String()

	for i, prog := range matrix.CMPrograms() {
		t.Run(prog.Name, func(t *testing.T) {
			server, client := prog.Commands(addr, 7300+i)
			srv, cli, err := l.pairCM(ctx, env, a, b, server, client, prog.Timeout, prog.ServerStays)
			if err == nil {
				err = prog.Judge(srv, cli)
			}
			if err != nil {
				t.Fatalf("%v\nclient %q in %s:\n%s\nserver %q in %s:\n%s", err, client, a.Namespace, cli.Out, server, b.Namespace, srv.Out)
			}
		})
	}

	port, err := l.devinfo(ctx, env, a)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range matrix.PerftestCM(port) {
		t.Run(r.Name(), func(t *testing.T) {
			server := append([]string{r.Tool}, r.Command(b.Device, 7400+i, "")...)
			client := append([]string{r.Tool}, r.Command(a.Device, 7400+i, addr)...)
			srv, cli, err := l.pairCM(ctx, env, a, b, server, client, r.Timeout, false)
			if err == nil {
				err = r.Judge(srv, cli)
			}
			if err != nil {
				t.Fatalf("%v\nclient in %s:\n%s\nserver in %s:\n%s", err, a.Namespace, cli.Out, b.Namespace, srv.Out)
			}
		})
	}
}

// TestLabGoRDMACM runs the verbs package's connections through the RDMA
// CM between two lab namespaces against Debian's unmodified rdma_server
// and rdma_client (on taproce's librdmacm.so.1): a Go verbs.Dial in the
// first namespace to rdma_server in the second, and rdma_client in the
// first to a Go verbs.Listen in the second, over the TAPs, bridges and
// veth. The appliance serves a client the port of its process's
// namespace, so the Go side is a process in its namespace: this test
// binary again, as package gocm's helper (gocm.RunIfHelper in TestMain),
// run there with `ip netns exec` as the programs are. Each side is judged
// by its own verdict, as TestGoRDMACM judges them: the program's exit
// status and "end 0", the Go side's exact 16 bytes received and the
// program's disconnect after them (its exit status and "go verbs: end
// 0").
func TestLabGoRDMACM(t *testing.T) {
	gocm.NeedPrograms(t)
	l, env := debianLab(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	a, b := l.Hosts[0], l.Hosts[1]
	for i, p := range gocm.Pairs() {
		t.Run(p.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*gocm.HelperTimeout)
			defer cancel()
			server, client := p.Commands(self, netip.AddrPortFrom(b.PortIPv4(), uint16(7300+i)))
			srv, cli, err := l.pairCM(ctx, env, a, b, server, client, gocm.HelperTimeout, false)
			if err == nil {
				err = p.Judge(srv, cli)
			}
			if err != nil {
				t.Fatalf("%v\nclient %q in %s:\n%s\nserver %q in %s:\n%s", err, client, a.Namespace, cli.Out, server, b.Namespace, srv.Out)
			}
			t.Logf("client in %s:\n%s\nserver in %s:\n%s", a.Namespace, cli.Out, b.Namespace, srv.Out)
		})
	}
}

// devinfo returns what the matrix needs of host h's port, from Debian's
// ibv_devinfo -v.
func (l *Lab) devinfo(ctx context.Context, env []string, h *Host) (matrix.Port, error) {
	c, err := l.startClientEnv(ctx, env, "ibv_devinfo", h, "-v", "-d", h.Device)
	if err != nil {
		return matrix.Port{}, err
	}
	if err := c.wait(30 * time.Second); err != nil {
		return matrix.Port{}, fmt.Errorf("ibv_devinfo -v in %s: %w: %s", h.Namespace, err, c.output())
	}
	return matrix.ParseDevinfo(c.output())
}

// pairCM runs a server in b and its client in a, which connect through
// the RDMA CM: the client starts once b's port has a CM listener (none
// being left from an earlier server, whose IDs the appliance ends when
// its process is gone). A server that stays is killed once its client
// ended.
func (l *Lab) pairCM(ctx context.Context, env []string, a, b *Host, server, client []string, timeout time.Duration, stays bool) (srv, cli matrix.Result, err error) {
	listeners := func() uint64 { return b.NIC.CM().Stats().States[cm.StateListen] }
	for deadline := time.Now().Add(serverStart); listeners() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return srv, cli, fmt.Errorf("%s still has a listener after %v", b.Device, serverStart)
		}
	}
	s, err := l.startClientEnv(ctx, env, server[0], b, server[1:]...)
	if err != nil {
		return srv, cli, err
	}
	srv.Device, cli.Device = b.Device, a.Device
	for deadline := time.Now().Add(serverStart); listeners() == 0; time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-s.done:
			srv.Out, srv.Err = s.output(), err
			return srv, cli, fmt.Errorf("the server ended before it listened: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			srv.Err = s.wait(time.Millisecond)
			srv.Out = s.output()
			return srv, cli, fmt.Errorf("no CM listener on %s after %v", b.Device, serverStart)
		}
	}
	c, err := l.startClientEnv(ctx, env, client[0], a, client[1:]...)
	if err != nil {
		srv.Err = s.wait(time.Millisecond)
		srv.Out = s.output()
		return srv, cli, err
	}
	cli.Err = c.wait(timeout)
	srvTimeout := timeout
	if cli.Err != nil || stays {
		srvTimeout = time.Second // it may wait for a client that is gone
	}
	srv.Err = s.wait(srvTimeout)
	srv.Out, cli.Out = s.output(), c.output()
	return srv, cli, nil
}
