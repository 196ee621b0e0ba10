package control_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/appliance/control"
	"github.com/taproce/taproce/internal/testnet"
	"github.com/taproce/taproce/shmem"
	"github.com/taproce/taproce/verbs"
	"github.com/taproce/taproce/verbs/abi"
)

// nobody is the user the tests' other clients run as.
const nobody = 65534

// dialAs connects to the control socket at path as user uid, which is
// what SO_PEERCRED then reports: a thread of its own takes the user's
// identity for connect(2) alone (a raw setresuid changes only the calling
// thread) and dies with its goroutine, whatever identity it was left with.
// It needs root, and a path the user may reach (openToAll).
func dialAs(path string, uid int) (*net.UnixConn, error) {
	type result struct {
		c   *net.UnixConn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
		fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			ch <- result{err: err}
			return
		}
		keep := ^uintptr(0)
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
			syscall.Close(fd)
			ch <- result{err: e}
			return
		}
		err = syscall.Connect(fd, &syscall.SockaddrUnix{Name: path})
		if err != nil {
			syscall.Close(fd)
			ch <- result{err: err}
			return
		}
		f := os.NewFile(uintptr(fd), "control")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			ch <- result{err: err}
			return
		}
		ch <- result{c: c.(*net.UnixConn)}
	}()
	r := <-ch
	return r.c, r.err
}

// openToAll lets every user reach the socket at path: the directories a
// test's temporary directory makes are its owner's alone.
func openToAll(t testing.TB, path string) {
	t.Helper()
	for d := filepath.Dir(path); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// listDevices sends list-devices on c and returns the reply's errno, or
// the error of a connection closed instead.
func listDevices(t testing.TB, c *net.UnixConn) (abi.Errno, error) {
	t.Helper()
	msg, err := abi.Encode(nil, abi.Header{Op: abi.OpListDevices, Seq: 7}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := shmem.SendMsg(c, msg); err != nil {
		return 0, err
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second)) // a guard against a hang
	buf := make([]byte, abi.MaxMessage)
	n, fds, err := shmem.RecvMsg(c, buf, 4)
	for _, fd := range fds {
		syscall.Close(fd)
	}
	if err != nil {
		return 0, err
	}
	h, body, err := abi.DecodeHeader(buf[:n])
	if err != nil || h.Seq != 7 || h.Op != abi.OpListDevices {
		t.Fatalf("reply %+v: %v", h, err)
	}
	var r abi.ListDevicesReply
	if err := abi.DecodeBody(body, &r); err != nil {
		t.Fatal(err)
	}
	return r.Errno, nil
}

// waitStats waits until the server's counts satisfy ok: connections are
// accepted, and refused, by the server's own goroutine.
func waitStats(t testing.TB, app *appliance.Appliance, ok func(control.Stats) bool) control.Stats {
	t.Helper()
	var st control.Stats
	waitUntil(t, func() bool { st = app.Control().Stats(); return ok(st) }, func() string { return fmt.Sprintf("the server's counts stayed at %+v", st) })
	return st
}

// waitUntil waits until ok holds, failing the test with what's words
// after a while.
func waitUntil(t testing.TB, ok func() bool, what func() string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(what())
		}
	}
}

// TestConnectionFlood: one user's flood of idle connections, more than
// the appliance takes, leaves room for others: the appliance holds the
// user's share and refuses the rest, and a client of another user still
// opens both devices and completes RDMA between them.
func TestConnectionFlood(t *testing.T) {
	testnet.RequireRoot(t)
	const perUID, flood = 8, 40
	r := appliancetest.New(t, appliancetest.Options{LocalSwitch: true, Namespace: "flood",
		ApplianceLimits: control.ApplianceLimits{Connections: 2 * perUID, ConnectionsPerUID: perUID}})
	openToAll(t, r.Socket)
	for range flood {
		c, err := dialAs(r.Socket, nobody)
		if err != nil {
			t.Fatalf("connecting as nobody: %v", err)
		}
		defer c.Close()
	}
	st := waitStats(t, r.App, func(st control.Stats) bool { return st.Clients+int(st.Refused) == flood })
	if st.Clients != perUID || st.Refused != flood-perUID {
		t.Fatalf("after %d connections of one user: %+v, want %d held and the rest refused", flood, st, perUID)
	}

	ctx := testCtx(t)
	ca, err := verbs.Open(ctx, "taproce0")
	must(t, err)
	defer ca.Close()
	cb, err := verbs.Open(ctx, "taproce1")
	must(t, err)
	defer cb.Close()
	ga, _ := ca.GID(1)
	gb, _ := cb.GID(1)
	a, b := newEnd(t, ca, verbs.RC, 4096), newEnd(t, cb, verbs.RC, 4096)
	connectRC(t, a, b, ga, gb)
	copy(a.mr.Bytes(), "past the flood")
	_, err = a.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{a.mr.SGE(0, 14)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey}})
	must(t, err)
	if wc := wait(t, a.cq, 1)[0]; wc.Status != verbs.WCSuccess {
		t.Fatalf("RDMA WRITE: %v", wc.Status)
	}
	if got := b.mr.Bytes()[:14]; !bytes.Equal(got, []byte("past the flood")) {
		t.Fatalf("the peer's memory holds %q", got)
	}
}

// TestConnectionLimits: a connection over a limit is answered with the
// errno libibverbs' callers know for it, then closed: EAGAIN over the
// appliance's or a user's connections, ENFILE when its descriptors for
// clients are spent; objects beyond the appliance's descriptors get
// ENOMEM. What the clients held is given back when they go.
func TestConnectionLimits(t *testing.T) {
	t.Run("per user", func(t *testing.T) {
		testnet.RequireRoot(t)
		r := appliancetest.New(t, appliancetest.Options{ApplianceLimits: control.ApplianceLimits{Connections: 16, ConnectionsPerUID: 2}})
		openToAll(t, r.Socket)
		for range 2 {
			c, err := dialAs(r.Socket, nobody)
			must(t, err)
			defer c.Close()
		}
		c, err := dialAs(r.Socket, nobody)
		must(t, err)
		defer c.Close()
		if e, err := listDevices(t, c); e != abi.Errno(syscall.EAGAIN) {
			t.Fatalf("the user's third connection: errno %d, %v; want EAGAIN", e, err)
		}
		if _, err := listDevices(t, c); err == nil {
			t.Fatal("the refused connection stays open")
		}
		// Another user is not refused.
		if _, err := verbs.Devices(testCtx(t)); err != nil {
			t.Fatalf("root's listing: %v", err)
		}
	})
	t.Run("appliance", func(t *testing.T) {
		r := appliancetest.New(t, appliancetest.Options{ApplianceLimits: control.ApplianceLimits{Connections: 3}})
		for range 3 {
			c, err := net.Dial("unixpacket", r.Socket)
			must(t, err)
			defer c.Close()
		}
		waitStats(t, r.App, func(st control.Stats) bool { return st.Clients == 3 })
		if _, err := verbs.Open(testCtx(t), "taproce0"); !errors.Is(err, syscall.EAGAIN) {
			t.Fatalf("open beyond the appliance's connections: %v, want EAGAIN", err)
		}
		if _, err := verbs.Devices(testCtx(t)); !errors.Is(err, syscall.EAGAIN) {
			t.Fatalf("listing beyond the appliance's connections: %v, want EAGAIN", err)
		}
	})
	t.Run("descriptors", func(t *testing.T) {
		// A connection holds 1, an open device 2 more, a CQ 1.
		r := appliancetest.New(t, appliancetest.Options{ApplianceLimits: control.ApplianceLimits{Descriptors: 5}})
		ctx := testCtx(t)
		c1, err := verbs.Open(ctx, "taproce0")
		must(t, err)
		_, err = c1.CreateCQ(ctx, 16, nil)
		must(t, err)
		_, err = c1.CreateCQ(ctx, 16, nil)
		must(t, err)
		if st := r.App.Control().Stats(); st.Descriptors != 5 {
			t.Fatalf("a client with two CQs: %+v, want 5 descriptors", st)
		}
		if _, err := c1.CreateCQ(ctx, 16, nil); !errors.Is(err, syscall.ENOMEM) {
			t.Fatalf("a CQ beyond the descriptors: %v, want ENOMEM", err)
		}
		if _, err := c1.CreateCompChannel(ctx); !errors.Is(err, syscall.ENFILE) {
			t.Fatalf("a channel beyond the descriptors: %v, want ENFILE", err)
		}
		if _, err := verbs.Open(ctx, "taproce1"); !errors.Is(err, syscall.ENFILE) {
			t.Fatalf("a connection beyond the descriptors: %v, want ENFILE", err)
		}
		must(t, c1.Close())
		waitStats(t, r.App, func(st control.Stats) bool { return st.Clients == 0 })
		if st := r.App.Control().Stats(); st.Descriptors != 0 {
			t.Fatalf("after the client closed: %+v", st)
		}
		c2, err := verbs.Open(ctx, "taproce1")
		must(t, err)
		defer c2.Close()
		_, err = c2.CreateCompChannel(ctx)
		must(t, err)
	})
}

// TestApplianceObjectLimits: two clients, each within its own limits,
// together meet the appliance's limit of each kind of object: the next
// one gets ENOMEM (ENFILE for a completion channel), and everything is
// given back when the clients go, so that a new client gets as many.
func TestApplianceObjectLimits(t *testing.T) {
	type maker func(ctx context.Context, c *verbs.Context, pd *verbs.PD) error
	cq := func(ctx context.Context, c *verbs.Context, _ *verbs.PD) error {
		_, err := c.CreateCQ(ctx, 16, nil)
		return err
	}
	for _, k := range []struct {
		name  string
		all   control.Limits
		make  maker
		errno syscall.Errno
	}{
		{"PDs", control.Limits{PDs: 4}, func(ctx context.Context, c *verbs.Context, _ *verbs.PD) error {
			_, err := c.AllocPD(ctx)
			return err
		}, syscall.ENOMEM},
		{"MRs", control.Limits{MRs: 2}, func(ctx context.Context, _ *verbs.Context, pd *verbs.PD) error {
			_, err := pd.AllocMR(ctx, 4096, verbs.AccessLocalWrite)
			return err
		}, syscall.ENOMEM},
		{"MR bytes", control.Limits{MRBytes: 4 << 12}, func(ctx context.Context, _ *verbs.Context, pd *verbs.PD) error {
			_, err := pd.AllocMR(ctx, 2<<12, verbs.AccessLocalWrite)
			return err
		}, syscall.ENOMEM},
		{"CQs", control.Limits{CQs: 2}, cq, syscall.ENOMEM},
		{"QPs", control.Limits{QPs: 2}, func(ctx context.Context, c *verbs.Context, pd *verbs.PD) error {
			cq, err := c.CreateCQ(ctx, 16, nil)
			if err != nil {
				return err
			}
			_, err = pd.CreateQP(ctx, verbs.QPInitAttr{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
			return err
		}, syscall.ENOMEM},
		{"SRQs", control.Limits{SRQs: 2}, func(ctx context.Context, _ *verbs.Context, pd *verbs.PD) error {
			_, err := pd.CreateSRQ(ctx, 16, 0)
			return err
		}, syscall.ENOMEM},
		{"AHs", control.Limits{AHs: 2}, func(ctx context.Context, _ *verbs.Context, pd *verbs.PD) error {
			_, err := pd.CreateAH(ctx, verbs.AHAttr{DGID: netip.MustParseAddr("10.77.0.2"), SGIDIndex: 1, Port: 1})
			return err
		}, syscall.ENOMEM},
		{"channels", control.Limits{Channels: 2}, func(ctx context.Context, c *verbs.Context, _ *verbs.PD) error {
			_, err := c.CreateCompChannel(ctx)
			return err
		}, syscall.ENFILE},
	} {
		t.Run(k.name, func(t *testing.T) {
			r := appliancetest.New(t, appliancetest.Options{ApplianceLimits: control.ApplianceLimits{Limits: k.all}})
			ctx := testCtx(t)
			open := func() (*verbs.Context, *verbs.PD) {
				c, err := verbs.Open(ctx, "taproce0")
				must(t, err)
				pd, err := c.AllocPD(ctx)
				must(t, err)
				return c, pd
			}
			c1, pd1 := open()
			c2, pd2 := open()
			must(t, k.make(ctx, c1, pd1))
			must(t, k.make(ctx, c2, pd2))
			if err := k.make(ctx, c1, pd1); !errors.Is(err, k.errno) {
				t.Fatalf("beyond the appliance's limit: %v, want %v", err, k.errno)
			}
			must(t, c1.Close())
			must(t, c2.Close())
			waitStats(t, r.App, func(st control.Stats) bool { return st.Clients == 0 })
			if st := r.App.Control().Stats(); st.Descriptors != 0 {
				t.Fatalf("after the clients closed: %+v", st)
			}
			c3, pd3 := open()
			defer c3.Close()
			must(t, k.make(ctx, c3, pd3))
			must(t, k.make(ctx, c3, pd3))
		})
	}
}

// TestClientChannelLimit: a client at its own completion channel limit
// gets EMFILE, as a process whose descriptor table is full does (a channel
// is a descriptor in the kernel's verbs); another client is not held back.
func TestClientChannelLimit(t *testing.T) {
	appliancetest.New(t, appliancetest.Options{Limits: control.Limits{Channels: 2}})
	ctx := testCtx(t)
	c1, err := verbs.Open(ctx, "taproce0")
	must(t, err)
	defer c1.Close()
	for range 2 {
		_, err := c1.CreateCompChannel(ctx)
		must(t, err)
	}
	if _, err := c1.CreateCompChannel(ctx); !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("a channel beyond the client's limit: %v, want EMFILE", err)
	}
	c2, err := verbs.Open(ctx, "taproce0")
	must(t, err)
	defer c2.Close()
	_, err = c2.CreateCompChannel(ctx)
	must(t, err)
}
