package verbs_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/appliance/control"
	"github.com/taproce/taproce/verbs"
)

// cmRig is an appliance whose two devices connect through the RDMA CM: a
// listener on taproce1's address, dialled from the other.
type cmRig struct {
	*appliancetest.Rig
	next int // the next port to listen on
}

func newCMRig(t testing.TB, localSwitch bool) *cmRig {
	t.Helper()
	return &cmRig{Rig: appliancetest.New(t, appliancetest.Options{LocalSwitch: localSwitch, Namespace: "cm"}), next: 7400}
}

// addr is taproce1's address with a port of its own to each call.
func (r *cmRig) addr() string {
	r.next++
	return netip.AddrPortFrom(r.Addrs[1], uint16(r.next)).String()
}

// listen listens through the CM; the listener closes when the test ends.
func (r *cmRig) listen(t testing.TB, opts ...verbs.ConnOption) *verbs.Listener {
	t.Helper()
	ln, err := verbs.Listen(testCtx(t), verbs.NetworkRDMACM, r.addr(), opts...)
	must(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln
}

// pair connects a (accepted) and b (dialled) through the CM; both close
// when the test ends.
func (r *cmRig) pair(t testing.TB, opts ...verbs.ConnOption) (a, b *verbs.Conn) {
	t.Helper()
	ctx := testCtx(t)
	ln := r.listen(t, opts...)
	type res struct {
		c   *verbs.Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := ln.Accept(ctx)
		acc <- res{c, err}
	}()
	b, err := verbs.Dial(ctx, ln.Addr().String(), append([]verbs.ConnOption{verbs.WithRDMACM()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ac := <-acc
	if ac.err != nil {
		b.Close()
		t.Fatal(ac.err)
	}
	a = ac.c
	t.Cleanup(func() {
		must(t, a.Close())
		must(t, b.Close())
	})
	return a, b
}

// TestConnCM runs Go connections through the appliance's RDMA CM between
// its two devices, over the fake wire and the local switch.
func TestConnCM(t *testing.T) {
	for _, local := range []bool{false, true} {
		t.Run(map[bool]string{false: "wire", true: "local-switch"}[local], func(t *testing.T) {
			r := newCMRig(t, local)
			for _, tc := range []struct {
				name string
				run  func(*testing.T, *cmRig)
			}{
				{"Messages", testCMMessages},
				{"RNR", testCMRNR},
				{"RemoteMemory", testCMRemoteMemory},
				{"Rejected", testCMRejected},
				{"PeerClose", testCMPeerClose},
				{"Cancel", testCMCancel},
				{"ListenerClose", testCMListenerClose},
			} {
				t.Run(tc.name, func(t *testing.T) { tc.run(t, r) })
			}
			if local && r.App.Switch().Frames() == 0 {
				t.Fatal("nothing crossed the local switch")
			}
		})
	}
}

// testCMMessages: raw messages both ways at once, each exactly the bytes
// sent (empty ones too), in order; the addresses each side reports.
func testCMMessages(t *testing.T, r *cmRig) {
	a, b := r.pair(t)
	ctx := testCtx(t)
	if a.MaxMessage() != verbs.DefaultMaxMessage || a.PathMTU() != verbs.MTU1024 || b.PathMTU() != verbs.MTU1024 {
		t.Fatalf("max message %d, path MTUs %v %v", a.MaxMessage(), a.PathMTU(), b.PathMTU())
	}
	la, lb := a.LocalAddr(), b.LocalAddr()
	ra, rb := a.RemoteAddr(), b.RemoteAddr()
	if la.Network() != verbs.NetworkRDMACM || la.String() != rb.String() || lb.String() != ra.String() {
		t.Fatalf("addresses: accepted %v→%v, dialled %v→%v", la, ra, lb, rb)
	}
	if ap, err := netip.ParseAddrPort(la.String()); err != nil || ap.Addr() != r.Addrs[1] {
		t.Fatalf("the accepted connection's address %v, want %v", la, r.Addrs[1])
	}
	if ap, err := netip.ParseAddrPort(lb.String()); err != nil || ap.Addr() != r.Addrs[0] || ap.Port() == 0 {
		t.Fatalf("the dialled connection's address %v, want %v and a port", lb, r.Addrs[0])
	}
	sizes := []int{0, 1, 16, 55, 300, 1024, 1025, 4096, 65535, a.MaxMessage()}
	const rounds = 5 // more messages than receive slots
	sendBothWays(ctx, t, a, b, sizes, rounds, false)
	if err := a.Send(ctx, make([]byte, a.MaxMessage()+1)); !errors.Is(err, verbs.ErrMessageTooLarge) {
		t.Fatalf("oversized send: %v", err)
	}
	mr := alloc(t, a, 64, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err := a.SendMR(ctx, mr, verbs.AccessRemoteRead); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("SendMR through the CM: %v", err)
	}
	if _, err := b.ReceiveMR(ctx); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("ReceiveMR through the CM: %v", err)
	}
	// Still a connection.
	must(t, b.Send(ctx, []byte("still here")))
	if p, err := a.Recv(ctx); err != nil || string(p) != "still here" {
		t.Fatalf("after the refusals: %q %v", p, err)
	}
}

// testCMRNR: without credits, a sender whose peer has no receive posted
// is paced by RNR NAKs, which its QP retries for ever: the message the
// receiver did not make room for goes when it does, even after the Send
// that posted it gave up.
func testCMRNR(t *testing.T, r *cmRig) {
	const depth = 4
	a, b := r.pair(t, verbs.WithRecvDepth(depth), verbs.WithMaxMessage(512))
	ctx := testCtx(t)
	nakked := r.NICs[1].Engine().Stats().RNRNAKsSent
	for i := range depth {
		must(t, b.Send(ctx, message(1, i, 100)))
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := b.Send(short, message(1, depth, 100)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a send to a peer with no receive posted: %v", err)
	}
	waitCM(t, "an RNR NAK", func() bool { return r.NICs[1].Engine().Stats().RNRNAKsSent > nakked })
	sent := make(chan error, 1)
	go func() {
		var err error
		for i := depth + 1; i < 30 && err == nil; i++ {
			err = b.Send(ctx, message(1, i, 100))
		}
		sent <- err
	}()
	for i := range 30 {
		got, err := a.Recv(ctx)
		if err != nil {
			t.Logf("receiver %+v", r.NICs[1].Engine().Stats())
			t.Logf("sender %+v", r.NICs[0].Engine().Stats())
			t.Fatalf("message %d: %v", i, err)
		}
		if !bytes.Equal(got, message(1, i, 100)) {
			t.Fatalf("message %d differs: %d bytes", i, len(got))
		}
	}
	must(t, <-sent)
}

// testCMRemoteMemory: RDMA WRITE, READ and the atomics on a region whose
// address and rkey the application sent in a message of its own.
func testCMRemoteMemory(t *testing.T, r *cmRig) {
	a, b := r.pair(t)
	ctx := testCtx(t)
	const n = 256 << 10
	rmr := alloc(t, a, n, verbs.AccessLocalWrite|remoteAll)
	var desc [16]byte
	binary.BigEndian.PutUint64(desc[:], rmr.Addr())
	binary.BigEndian.PutUint32(desc[8:], rmr.RKey)
	binary.BigEndian.PutUint32(desc[12:], n)
	must(t, a.Send(ctx, desc[:]))
	got, err := b.Recv(ctx)
	must(t, err)
	remote := verbs.RemoteMR{Addr: binary.BigEndian.Uint64(got), RKey: binary.BigEndian.Uint32(got[8:]), Len: uint64(binary.BigEndian.Uint32(got[12:]))}
	lmr := alloc(t, b, 2*n, verbs.AccessLocalWrite)
	for i := range n {
		lmr.Bytes()[i] = byte(i*13 + i>>9)
	}
	must(t, b.Write(ctx, lmr, 0, n, remote, 0))
	if !bytes.Equal(rmr.Bytes(), lmr.Bytes()[:n]) {
		t.Fatal("RDMA WRITE: data differs")
	}
	for i := range n {
		rmr.Bytes()[i] = byte(i * 7)
	}
	must(t, b.Read(ctx, lmr, n, n, remote, 0))
	if !bytes.Equal(lmr.Bytes()[n:], rmr.Bytes()) {
		t.Fatal("RDMA READ: data differs")
	}
	binary.LittleEndian.PutUint64(rmr.Bytes()[64:], 40)
	if old, err := b.FetchAdd(ctx, remote, 64, 2); err != nil || old != 40 {
		t.Fatalf("fetch-add: %d %v", old, err)
	}
	if old, err := b.CompareAndSwap(ctx, remote, 64, 42, 7); err != nil || old != 42 {
		t.Fatalf("compare-and-swap: %d %v", old, err)
	}
	if v := binary.LittleEndian.Uint64(rmr.Bytes()[64:]); v != 7 {
		t.Fatalf("the counter is %d, want 7", v)
	}
}

// testCMRejected: a Dial to a port nobody listens on is refused at once by
// the peer's CM with reason 8 (invalid service ID), as Linux's refuses it.
func testCMRejected(t *testing.T, r *cmRig) {
	ctx := testCtx(t)
	start := time.Now()
	_, err := verbs.Dial(ctx, r.addr(), verbs.WithRDMACM())
	var rej *verbs.RejectedError
	if !errors.Is(err, verbs.ErrRejected) || !errors.Is(err, syscall.ECONNREFUSED) || !errors.As(err, &rej) || rej.Reason != verbs.RejectInvalidServiceID {
		t.Fatalf("dial to a port nobody listens on: %v", err)
	}
	if d := time.Since(start); d > 4*time.Second { // a REQ sent again waits 6 s
		t.Fatalf("the rejection took %v", d)
	}
	// Neither a port nor a host: refused before the CM.
	for _, addr := range []string{r.Addrs[1].String(), ":7471", net.JoinHostPort(r.Addrs[1].String(), "0")} {
		if _, err := verbs.Dial(ctx, addr, verbs.WithRDMACM()); err == nil {
			t.Fatalf("dial %q: no error", addr)
		}
	}
	if _, err := verbs.Listen(ctx, "tcp", "127.0.0.1:0", verbs.WithRDMACM()); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("listen on tcp with WithRDMACM: %v", err)
	}
	// An address no device of the namespace has.
	if _, err := verbs.Listen(ctx, verbs.NetworkRDMACM, "10.1.2.3:7471"); !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Fatalf("listen on an address no device has: %v", err)
	}
}

// testCMPeerClose: the messages sent before a Close are received, then
// ErrPeerClosed, whichever side closes; the closed side's calls fail with
// ErrClosed.
func testCMPeerClose(t *testing.T, r *cmRig) {
	for _, accepted := range []bool{true, false} {
		t.Run(map[bool]string{true: "accepted closes", false: "dialled closes"}[accepted], func(t *testing.T) {
			a, b := r.pair(t)
			if !accepted {
				a, b = b, a
			}
			ctx := testCtx(t)
			for i := range 3 {
				must(t, a.Send(ctx, message(2, i, 1000)))
			}
			must(t, a.Close())
			for i := range 3 {
				got, err := b.Recv(ctx)
				if err != nil || !bytes.Equal(got, message(2, i, 1000)) {
					t.Fatalf("message %d sent before the close: %d bytes, %v", i, len(got), err)
				}
			}
			bounded, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if _, err := b.Recv(bounded); !errors.Is(err, verbs.ErrPeerClosed) {
				t.Fatalf("receive from a closed peer: %v", err)
			}
			if err := b.Send(bounded, []byte("anyone?")); !errors.Is(err, verbs.ErrPeerClosed) {
				t.Fatalf("send to a closed peer: %v", err)
			}
			if _, err := a.Recv(ctx); !errors.Is(err, verbs.ErrClosed) {
				t.Fatalf("receive on a closed connection: %v", err)
			}
		})
	}
}

// testCMCancel: Accept and Dial give up with their contexts. A Dial that
// gave up while its request waited destroys it, so that the listener's
// next Accept fails on it rather than connect to nobody, and the one
// after connects.
func testCMCancel(t *testing.T, r *cmRig) {
	ctx := testCtx(t)
	ln := r.listen(t)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := ln.Accept(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("accept timing out: %v", err)
	}
	// Nobody accepts: the request waits at the listener until the Dial
	// gives up.
	dctx, dcancel := context.WithCancel(ctx)
	defer dcancel()
	dialed := make(chan error, 1)
	go func() {
		c, err := verbs.Dial(dctx, ln.Addr().String(), verbs.WithRDMACM())
		if err == nil {
			c.Close()
		}
		dialed <- err
	}()
	waitCM(t, "the request at the listener", func() bool { return pendingRequests(r) == 1 })
	dcancel()
	select {
	case err := <-dialed:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("dial nobody accepts, cancelled: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the dial did not give up with its context")
	}
	bounded, cancel3 := context.WithTimeout(ctx, 10*time.Second)
	defer cancel3()
	if c, err := ln.Accept(bounded); err == nil {
		c.Close()
		t.Fatal("accepted the request of a dial that gave up")
	} else if bounded.Err() != nil {
		t.Fatalf("accepting the request of a dial that gave up: %v", err)
	}
	acc := make(chan error, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err == nil {
			err = c.Send(ctx, []byte("hello"))
			c.Close()
		}
		acc <- err
	}()
	c, err := verbs.Dial(ctx, ln.Addr().String(), verbs.WithRDMACM())
	must(t, err)
	defer c.Close()
	if p, err := c.Recv(ctx); err != nil || string(p) != "hello" {
		t.Fatalf("after a dial that gave up: %q %v", p, err)
	}
	must(t, <-acc)
}

// testCMListenerClose: closing a listener rejects the requests it had not
// accepted (reason 28, the consumer's) and ends Accept; a connection it
// accepted stays.
func testCMListenerClose(t *testing.T, r *cmRig) {
	ctx := testCtx(t)
	ln, err := verbs.Listen(ctx, verbs.NetworkRDMACM, r.addr())
	must(t, err)
	addr := ln.Addr().String()
	acc := make(chan *verbs.Conn, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			t.Error(err)
		}
		acc <- c
	}()
	kept, err := verbs.Dial(ctx, addr, verbs.WithRDMACM())
	must(t, err)
	defer kept.Close()
	a := <-acc
	if a == nil {
		t.FailNow()
	}
	defer a.Close()
	dialed := make(chan error, 1)
	go func() {
		c, err := verbs.Dial(ctx, addr, verbs.WithRDMACM())
		if err == nil {
			c.Close()
		}
		dialed <- err
	}()
	// Once the second request waits at the listener, close it.
	waitCM(t, "the second request at the listener", func() bool { return pendingRequests(r) == 1 })
	must(t, ln.Close())
	var rej *verbs.RejectedError
	if err := <-dialed; !errors.As(err, &rej) || rej.Reason != verbs.RejectConsumer {
		t.Fatalf("a request the closed listener did not accept: %v", err)
	}
	if _, err := ln.Accept(ctx); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("accept on a closed listener: %v", err)
	}
	must(t, kept.Send(ctx, []byte("still connected")))
	if p, err := a.Recv(ctx); err != nil || string(p) != "still connected" {
		t.Fatalf("the accepted connection after its listener closed: %q %v", p, err)
	}
}

// TestConnCMLeak: connections through the CM set up and closed leave no
// objects in the appliance, no CM IDs and no goroutines behind.
func TestConnCMLeak(t *testing.T) {
	r := newCMRig(t, true)
	ctx := testCtx(t)
	cycle := func() {
		ln, err := verbs.Listen(ctx, verbs.NetworkRDMACM, r.addr())
		must(t, err)
		acc := make(chan *verbs.Conn, 1)
		go func() {
			c, err := ln.Accept(ctx)
			if err != nil {
				t.Error(err)
			}
			acc <- c
		}()
		b, err := verbs.Dial(ctx, ln.Addr().String(), verbs.WithRDMACM())
		must(t, err)
		a := <-acc
		if a == nil {
			t.FailNow()
		}
		must(t, ln.Close())
		must(t, b.Send(ctx, []byte("bye")))
		if _, err := a.Recv(ctx); err != nil {
			t.Fatal(err)
		}
		must(t, b.Close())
		must(t, a.Close())
	}
	cycle()
	before := runtime.NumGoroutine()
	for range 10 {
		cycle()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := r.App.Control().Stats()
		n := runtime.NumGoroutine()
		ids := cmIDs(r)
		if st == (control.Stats{}) && n <= before && ids == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 connections: %+v, %d CM IDs, %d goroutines (%d before)", st, ids, n, before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cmIDs counts the IDs the devices' connection managers hold that are
// not on their way out (TimeWait ends by itself).
func cmIDs(r *cmRig) int {
	n := 0
	for _, nic := range r.NICs {
		for s, k := range nic.CM().Stats().States {
			if s := cm.State(s); s != cm.StateTimeWait && s != cm.StateIdle {
				n += int(k)
			}
		}
	}
	return n
}

// waitCM waits until ok holds, failing the test after 10 s.
func waitCM(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened", what)
		}
	}
}

// pendingRequests counts the requests taproce1's manager has handed up and
// not yet answered.
func pendingRequests(r *cmRig) int {
	return int(r.NICs[1].CM().Stats().States[cm.StateMRAReqSent])
}
