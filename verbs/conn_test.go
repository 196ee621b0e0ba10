package verbs_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/appliance/control"
	"github.com/taproce/taproce/verbs"
)

// newApp starts an appliance with two ports on a fake wire (taproce0 at
// 10.77.0.1, taproce1 at 10.77.0.2) that TAPROCE_SOCKET points at.
func newApp(t testing.TB, localSwitch bool) *appliance.Appliance {
	t.Helper()
	return appliancetest.New(t, appliancetest.Options{LocalSwitch: localSwitch, Namespace: "conn"}).App
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pair connects a (accepted on taproce0) and b (dialled from taproce1)
// over TCP on 127.0.0.1; both close when the test ends.
func pair(t testing.TB, opts ...verbs.ConnOption) (a, b *verbs.Conn) {
	t.Helper()
	ctx := testCtx(t)
	ln, err := verbs.Listen(ctx, "tcp", "127.0.0.1:0", append([]verbs.ConnOption{verbs.WithDevice("taproce0")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   *verbs.Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := ln.Accept(ctx)
		acc <- res{c, err}
	}()
	b, err = verbs.Dial(ctx, ln.Addr().String(), append([]verbs.ConnOption{verbs.WithDevice("taproce1")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	r := <-acc
	if r.err != nil {
		b.Close()
		t.Fatal(r.err)
	}
	a = r.c
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Error(err)
		}
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return a, b
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func alloc(t testing.TB, c *verbs.Conn, size int, access verbs.Access) *verbs.MR {
	t.Helper()
	mr, err := c.AllocMR(testCtx(t), size, access)
	must(t, err)
	return mr
}

// share allocates a region on owner, sends it and returns it as the
// other side received it.
func share(t testing.TB, owner, other *verbs.Conn, size int, access verbs.Access) (*verbs.MR, verbs.RemoteMR) {
	t.Helper()
	ctx := testCtx(t)
	mr := alloc(t, owner, size, verbs.AccessLocalWrite|access)
	must(t, owner.SendMR(ctx, mr, access))
	r, err := other.ReceiveMR(ctx)
	must(t, err)
	return mr, r
}

const remoteAll = verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic

// TestConn runs the connection helper over the fake wire and over the
// local switch.
func TestConn(t *testing.T) {
	for _, local := range []bool{false, true} {
		t.Run(map[bool]string{false: "wire", true: "local-switch"}[local], func(t *testing.T) {
			app := newApp(t, local)
			t.Run("WriteRead", testWriteRead)
			t.Run("SendRecv", testSendRecv)
			t.Run("Credits", testCredits)
			t.Run("Atomics", testAtomics)
			t.Run("AccessViolation", testAccessViolation)
			t.Run("Concurrent", testConcurrent)
			t.Run("Cancel", testCancel)
			t.Run("Close", func(t *testing.T) { testClose(t, app) })
			if local && app.Switch().Frames() == 0 {
				t.Fatal("nothing crossed the local switch")
			}
		})
	}
}

func testWriteRead(t *testing.T) {
	a, b := pair(t)
	ctx := testCtx(t)
	if a.PathMTU() != verbs.MTU1024 || a.PathMTU() != b.PathMTU() {
		t.Fatalf("path MTU %v and %v", a.PathMTU(), b.PathMTU())
	}
	const n = 1 << 20
	lmr := alloc(t, a, 2*n, verbs.AccessLocalWrite)
	rmr, remote := share(t, b, a, n, verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	if want := (verbs.RemoteMR{Addr: rmr.Addr(), Len: n, RKey: rmr.RKey, Access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead}); remote != want {
		t.Fatalf("received %+v, sent %+v", remote, want)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		lmr.Bytes()[i] = byte(rng.Uint32())
	}
	must(t, a.Write(ctx, lmr, 0, n, remote, 0))
	if !bytes.Equal(rmr.Bytes(), lmr.Bytes()[:n]) {
		t.Fatal("RDMA WRITE of 1 MiB: data differs")
	}
	for i := range n {
		rmr.Bytes()[i] = byte(i*7 + i>>11)
	}
	must(t, a.Read(ctx, lmr, n, n, remote, 0))
	if !bytes.Equal(lmr.Bytes()[n:], rmr.Bytes()) {
		t.Fatal("RDMA READ of 1 MiB: data differs")
	}
	// Unaligned pieces.
	must(t, a.Read(ctx, lmr, 7, 1000, remote, 12345))
	if !bytes.Equal(lmr.Bytes()[7:1007], rmr.Bytes()[12345:13345]) {
		t.Fatal("RDMA READ at offsets: data differs")
	}
	sub, err := remote.Slice(4096, 100)
	must(t, err)
	must(t, a.Write(ctx, lmr, 3, 100, sub, 0))
	if !bytes.Equal(rmr.Bytes()[4096:4196], lmr.Bytes()[3:103]) {
		t.Fatal("RDMA WRITE to a slice: data differs")
	}
	// Out of range, locally or remotely, and a region of another
	// connection: refused before posting, the connection intact.
	for _, err := range []error{
		a.Write(ctx, lmr, 0, 16, remote, n-8),
		a.Write(ctx, lmr, 2*n-8, 16, remote, 0),
		a.Read(ctx, lmr, -1, 16, remote, 0),
		a.Write(ctx, rmr, 0, 16, remote, 0),
		a.SendMR(ctx, rmr, verbs.AccessRemoteRead),
		func() error { _, err := sub.Slice(50, 51); return err }(),
	} {
		if !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("misuse: %v", err)
		}
	}
	must(t, a.Write(ctx, lmr, 0, 8, remote, n-8))
	must(t, a.Write(ctx, lmr, 0, 0, remote, n))
}

func message(round, i, size int) []byte {
	p := make([]byte, size)
	for j := range p {
		p[j] = byte(round*131 + i*31 + j)
	}
	return p
}

func testSendRecv(t *testing.T) {
	a, b := pair(t)
	ctx := testCtx(t)
	if a.MaxMessage() != verbs.DefaultMaxMessage {
		t.Fatalf("max message %d", a.MaxMessage())
	}
	sizes := []int{0, 1, 7, 55, 56, 300, 313, 1000, 4096, 65535, a.MaxMessage()}
	const rounds = 4 // more messages than credits
	sendBothWays(ctx, t, a, b, sizes, rounds, true)
	if err := a.Send(ctx, make([]byte, a.MaxMessage()+1)); !errors.Is(err, verbs.ErrMessageTooLarge) {
		t.Fatalf("oversized send: %v", err)
	}
	// A buffer too short leaves the message for the next call.
	must(t, a.Send(ctx, message(9, 9, 100)))
	if _, err := b.RecvInto(ctx, make([]byte, 10)); !errors.Is(err, io.ErrShortBuffer) {
		t.Fatalf("short buffer: %v", err)
	}
	got, err := b.Recv(ctx)
	must(t, err)
	if !bytes.Equal(got, message(9, 9, 100)) {
		t.Fatal("message after a short buffer differs")
	}
}

// testCredits: a sender runs out of credits while the receiver does not
// receive, and resumes when it does.
func testCredits(t *testing.T) {
	a, b := pair(t, verbs.WithRecvDepth(8), verbs.WithMaxMessage(1024))
	ctx := testCtx(t)
	if a.MaxMessage() != 1024 {
		t.Fatalf("max message %d", a.MaxMessage())
	}
	// Eight receive slots: seven messages, the eighth credit being kept
	// for returning credits.
	for i := range 7 {
		must(t, a.Send(ctx, message(0, i, 500)))
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := a.Send(short, message(0, 7, 500)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send without credits: %v", err)
	}
	sent := make(chan error, 1)
	go func() {
		var err error
		for i := 7; i < 40 && err == nil; i++ {
			err = a.Send(ctx, message(0, i, 500))
		}
		sent <- err
	}()
	for i := range 40 {
		got, err := b.Recv(ctx)
		must(t, err)
		if !bytes.Equal(got, message(0, i, 500)) {
			t.Fatalf("message %d differs", i)
		}
	}
	must(t, <-sent)
}

func testAtomics(t *testing.T) {
	a, b := pair(t)
	ctx := testCtx(t)
	rmr, remote := share(t, b, a, 64, verbs.AccessRemoteAtomic|verbs.AccessRemoteRead)
	ctr := func() uint64 { return binary.LittleEndian.Uint64(rmr.Bytes()[8:]) }
	binary.LittleEndian.PutUint64(rmr.Bytes()[8:], 40)
	check := func(what string, old uint64, err error, wantOld, wantNow uint64) {
		t.Helper()
		must(t, err)
		if old != wantOld || ctr() != wantNow {
			t.Fatalf("%s: returned %d, counter %d; want %d, %d", what, old, ctr(), wantOld, wantNow)
		}
	}
	old, err := a.FetchAdd(ctx, remote, 8, 2)
	check("fetch-add", old, err, 40, 42)
	old, err = a.CompareAndSwap(ctx, remote, 8, 42, 7)
	check("compare-and-swap", old, err, 42, 7)
	old, err = a.CompareAndSwap(ctx, remote, 8, 42, 9)
	check("failed compare-and-swap", old, err, 7, 7)
	binary.LittleEndian.PutUint64(rmr.Bytes()[8:], ^uint64(0))
	old, err = a.FetchAdd(ctx, remote, 8, 1)
	check("fetch-add wrapping", old, err, ^uint64(0), 0)
	if _, err := a.FetchAdd(ctx, remote, 4, 1); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("unaligned atomic: %v", err)
	}
	if _, err := a.CompareAndSwap(ctx, remote, 64, 0, 1); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("atomic out of range: %v", err)
	}
	old, err = a.FetchAdd(ctx, remote, 56, 5)
	if must(t, err); old != 0 {
		t.Fatalf("last word: %d", old)
	}
}

func testAccessViolation(t *testing.T) {
	a, b := pair(t)
	ctx := testCtx(t)
	rmr, remote := share(t, b, a, 4096, verbs.AccessRemoteRead)
	if err := b.SendMR(ctx, rmr, verbs.AccessRemoteWrite); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("granting more than the region has: %v", err)
	}
	lmr := alloc(t, a, 4096, verbs.AccessLocalWrite)
	copy(rmr.Bytes(), "readable")
	must(t, a.Read(ctx, lmr, 0, 8, remote, 0))
	if string(lmr.Bytes()[:8]) != "readable" {
		t.Fatalf("read %q", lmr.Bytes()[:8])
	}
	err := a.Write(ctx, lmr, 0, 64, remote, 0)
	var wce *verbs.WCError
	if !errors.Is(err, verbs.ErrRemoteAccess) || !errors.As(err, &wce) || wce.Status != verbs.WCRemAccessErr {
		t.Fatalf("write to a read-only region: %v", err)
	}
	t.Logf("write to a read-only region: %v", err)
	if string(rmr.Bytes()[:8]) != "readable" {
		t.Fatal("the read-only region was written")
	}
	// The QP is in the error state: the connection is broken.
	err = a.Read(ctx, lmr, 0, 8, remote, 0)
	if !errors.Is(err, verbs.ErrBroken) || !errors.Is(err, verbs.ErrRemoteAccess) {
		t.Fatalf("after the violation: %v", err)
	}
	if err := a.Send(ctx, []byte("x")); !errors.Is(err, verbs.ErrBroken) {
		t.Fatalf("send after the violation: %v", err)
	}
}

func testConcurrent(t *testing.T) {
	// Small queues, so that calls wait for send queue entries, atomic
	// slots and credits.
	a, b := pair(t, verbs.WithQueueDepth(4), verbs.WithRecvDepth(4), verbs.WithMaxMessage(256))
	ctx := testCtx(t)
	const workers, iters, chunk = 8, 40, 4096
	rmr, remote := share(t, b, a, workers*chunk+8, remoteAll)
	lmr := alloc(t, a, 2*workers*chunk, verbs.AccessLocalWrite)
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src, dst, roff := w*chunk, (workers+w)*chunk, uint64(8+w*chunk)
			for i := range iters {
				for j := range chunk {
					lmr.Bytes()[src+j] = byte(w*17 + i*3 + j)
				}
				if err := a.Write(ctx, lmr, src, chunk, remote, roff); err != nil {
					errs <- err
					return
				}
				if err := a.Read(ctx, lmr, dst, chunk, remote, roff); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(lmr.Bytes()[src:src+chunk], lmr.Bytes()[dst:dst+chunk]) {
					errs <- fmt.Errorf("worker %d, iteration %d: data differs", w, i)
					return
				}
				if _, err := a.FetchAdd(ctx, remote, 0, 1); err != nil {
					errs <- err
					return
				}
				if err := a.Send(ctx, []byte(fmt.Sprintf("%d %d", w, i))); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		next := make([]int, workers)
		for range workers * iters {
			p, err := b.Recv(ctx)
			if err != nil {
				errs <- err
				return
			}
			var w, i int
			if _, err := fmt.Sscanf(string(p), "%d %d", &w, &i); err != nil || w < 0 || w >= workers || i != next[w] {
				errs <- fmt.Errorf("message %q out of order (%v)", p, err)
				return
			}
			next[w]++
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := binary.LittleEndian.Uint64(rmr.Bytes()); n != workers*iters {
		t.Fatalf("counter %d, want %d", n, workers*iters)
	}
}

func testCancel(t *testing.T) {
	a, b := pair(t)
	ctx := testCtx(t)
	rmr, remote := share(t, b, a, 1<<20, remoteAll)
	lmr := alloc(t, a, 2<<20, verbs.AccessLocalWrite)
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := a.Write(done, lmr, 0, 64, remote, 64); !errors.Is(err, context.Canceled) {
		t.Fatalf("write with a cancelled context: %v", err)
	}
	// A receive that times out takes nothing from the next one.
	short, cancel2 := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel2()
	if _, err := b.Recv(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("receive timing out: %v", err)
	}
	must(t, a.Send(ctx, []byte("after the timeout")))
	if p, err := b.Recv(ctx); err != nil || string(p) != "after the timeout" {
		t.Fatalf("receive after a timeout: %q %v", p, err)
	}
	// Atomics and reads cancelled in flight: their completions, when they
	// come, go to nobody else.
	for i := range rmr.Bytes() {
		rmr.Bytes()[i] = byte(i * 11)
	}
	succeeded := 0
	for i := range 100 {
		cctx, cancel := context.WithCancel(ctx)
		go func() {
			if i%3 != 0 {
				time.Sleep(time.Duration(i%5) * 10 * time.Microsecond)
			}
			cancel()
		}()
		if _, err := a.FetchAdd(cctx, remote, 0, 1); err == nil {
			succeeded++
		} else if !errors.Is(err, context.Canceled) {
			t.Fatalf("fetch-add %d: %v", i, err)
		}
		if err := a.Read(cctx, lmr, 1<<20, 1<<20, remote, 0); err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("read %d: %v", i, err)
		}
		cancel()
	}
	v, err := a.FetchAdd(ctx, remote, 0, 0)
	must(t, err)
	for i := range uint64(10) {
		old, err := a.FetchAdd(ctx, remote, 0, 1)
		must(t, err)
		if old != v+i {
			t.Fatalf("fetch-add after cancellations returned %d, want %d", old, v+i)
		}
	}
	if got := binary.LittleEndian.Uint64(rmr.Bytes()); got != v+10 {
		t.Fatalf("counter %d, want %d", got, v+10)
	}
	t.Logf("%d of 100 cancelled fetch-adds completed before their cancellation", succeeded)
	must(t, a.Read(ctx, lmr, 0, 1<<20, remote, 0))
	if !bytes.Equal(lmr.Bytes()[8:1<<20], rmr.Bytes()[8:]) {
		t.Fatal("read after cancellations: data differs")
	}
}

func testClose(t *testing.T, app *appliance.Appliance) {
	a, b := pair(t)
	ctx := testCtx(t)
	_, remote := share(t, b, a, 1<<20, remoteAll)
	lmr := alloc(t, a, 1<<20, verbs.AccessLocalWrite)
	_, aRemote := share(t, a, b, 4096, remoteAll)
	blmr := alloc(t, b, 4096, verbs.AccessLocalWrite)
	// b writes continuously; a sends a last message, then closes.
	writes := make(chan error, 1)
	go func() {
		for {
			if err := b.Write(ctx, blmr, 0, 4096, aRemote, 0); err != nil {
				writes <- err
				return
			}
		}
	}()
	must(t, a.Write(ctx, lmr, 0, 1<<20, remote, 0))
	must(t, a.Send(ctx, []byte("last")))
	time.Sleep(10 * time.Millisecond)
	start := time.Now()
	must(t, a.Close())
	select {
	case err := <-writes:
		// A WRITE that reaches a's QP after its destroy goes unanswered
		// (ErrPeerClosed when the notice comes first, ErrRetryExceeded
		// otherwise); one that reaches it between the deregistration of its
		// region and the destroy is refused by the region check
		// (ErrRemoteAccess).
		if !errors.Is(err, verbs.ErrPeerClosed) && !errors.Is(err, verbs.ErrRetryExceeded) &&
			!errors.Is(err, verbs.ErrRemoteAccess) && !errors.Is(err, verbs.ErrBroken) {
			t.Fatalf("write in flight when the peer closed: %v", err)
		}
		t.Logf("write in flight when the peer closed: %v after %v", err, time.Since(start))
	case <-time.After(5 * time.Second):
		t.Fatal("write to a closed peer did not fail")
	}
	if p, err := b.Recv(ctx); err != nil || string(p) != "last" {
		t.Fatalf("last message: %q %v", p, err)
	}
	bounded, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := b.Recv(bounded); !errors.Is(err, verbs.ErrPeerClosed) && !errors.Is(err, verbs.ErrBroken) {
		t.Fatalf("receive from a closed peer: %v", err)
	}
	if err := b.Write(bounded, blmr, 0, 8, aRemote, 0); err == nil || bounded.Err() != nil {
		t.Fatalf("write to a closed peer: %v", err)
	}
	if _, err := b.FetchAdd(bounded, aRemote, 0, 1); err == nil || bounded.Err() != nil {
		t.Fatalf("atomic on a closed peer: %v", err)
	}
	if err := a.Write(ctx, lmr, 0, 8, remote, 0); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("write on a closed connection: %v", err)
	}
	if _, err := a.Recv(ctx); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("receive on a closed connection: %v", err)
	}
	must(t, a.Close())
	must(t, b.Close())
	if st := app.Control().Stats(); st.QPs != 0 || st.CQs != 0 || st.MRs != 0 || st.PDs != 0 {
		t.Fatalf("objects left after closing: %+v", st)
	}
}

// TestConnSetup: the out-of-band side of connecting.
func TestConnSetup(t *testing.T) {
	newApp(t, true)
	ctx := testCtx(t)
	ln, err := verbs.Listen(ctx, "tcp", "127.0.0.1:0", verbs.WithDevice("taproce0"))
	must(t, err)
	// Accept gives up with its context.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := ln.Accept(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("accept timing out: %v", err)
	}
	// A peer that speaks something else.
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err == nil {
			c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
			time.Sleep(time.Second)
			c.Close()
		}
	}()
	if _, err := ln.Accept(ctx); !errors.Is(err, verbs.ErrHandshake) {
		t.Fatalf("accepting a stranger: %v", err)
	}
	// A listener that never answers: Dial gives up with its context.
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer tl.Close()
	short2, cancel2 := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel2()
	if _, err := verbs.Dial(short2, tl.Addr().String(), verbs.WithDevice("taproce1")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial a silent listener: %v", err)
	}
	// Bad options, a GID index with no GID.
	if _, err := verbs.Dial(ctx, ln.Addr().String(), verbs.WithRecvDepth(2)); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("two receive credits: %v", err)
	}
	must(t, ln.Close())
	if _, err := ln.Accept(ctx); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("accept on a closed listener: %v", err)
	}
}

// TestExampleDial runs ExampleDial against an appliance, where both
// sides open the first device, and checks what it prints.
func TestExampleDial(t *testing.T) {
	for _, local := range []bool{false, true} {
		t.Run(map[bool]string{false: "wire", true: "local-switch"}[local], func(t *testing.T) {
			newApp(t, local)
			r, w, err := os.Pipe()
			must(t, err)
			stdout := os.Stdout
			os.Stdout = w
			out := make(chan string)
			go func() {
				b, _ := io.ReadAll(r)
				out <- string(b)
			}()
			func() {
				defer func() { os.Stdout = stdout; w.Close() }()
				ExampleDial()
			}()
			const want = "server: written: \"hello, RDMA\", counter 3\nclient: counter was 0, server said thanks\n"
			if got := <-out; got != want {
				t.Fatalf("printed %q, want %q", got, want)
			}
		})
	}
}

// TestConnLeak: connections set up and closed leave no objects in the
// appliance and no goroutines behind.
func TestConnLeak(t *testing.T) {
	app := newApp(t, true)
	ctx := testCtx(t)
	cycle := func() {
		ln, err := verbs.Listen(ctx, "tcp", "127.0.0.1:0", verbs.WithDevice("taproce0"))
		must(t, err)
		defer ln.Close()
		acc := make(chan *verbs.Conn, 1)
		go func() {
			c, err := ln.Accept(ctx)
			if err != nil {
				t.Error(err)
			}
			acc <- c
		}()
		b, err := verbs.Dial(ctx, ln.Addr().String(), verbs.WithDevice("taproce1"))
		must(t, err)
		a := <-acc
		if a == nil {
			t.FailNow()
		}
		_, remote := share(t, a, b, 4096, remoteAll)
		if _, err := b.FetchAdd(ctx, remote, 0, 1); err != nil {
			t.Fatal(err)
		}
		must(t, b.Send(ctx, []byte("bye")))
		must(t, b.Close())
		must(t, a.Close())
	}
	cycle()
	before := runtime.NumGoroutine()
	for range 20 {
		cycle()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := app.Control().Stats()
		n := runtime.NumGoroutine()
		if st == (control.Stats{}) && n <= before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20 connections: %+v, %d goroutines (%d before)", st, n, before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkConn measures, over the local switch, an RDMA WRITE of 1 MiB
// and a 2-byte Send/Recv round trip through the connection helper.
func BenchmarkConn(b *testing.B) {
	newApp(b, true)
	ctx := testCtx(b)
	b.Run("Write1MiB", func(b *testing.B) {
		x, y := pair(b)
		_, remote := share(b, y, x, 1<<20, remoteAll)
		lmr := alloc(b, x, 1<<20, verbs.AccessLocalWrite)
		b.SetBytes(1 << 20)
		for b.Loop() {
			if err := x.Write(ctx, lmr, 0, 1<<20, remote, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("PingPong2B", func(b *testing.B) {
		x, y := pair(b)
		done := make(chan error, 1)
		go func() {
			buf := make([]byte, 16)
			for {
				n, err := y.RecvInto(ctx, buf)
				if err == nil {
					err = y.Send(ctx, buf[:n])
				}
				if err != nil {
					done <- err
					return
				}
			}
		}()
		buf := make([]byte, 16)
		for b.Loop() {
			if err := x.Send(ctx, []byte("hi")); err != nil {
				b.Fatal(err)
			}
			if _, err := x.RecvInto(ctx, buf); err != nil {
				b.Fatal(err)
			}
		}
		x.Close()
		<-done
	})
}

// sendBothWays sends rounds × sizes messages each way at once between a
// and b and checks that each arrives, in order and byte for byte; with
// into, every other one is received with RecvInto, the rest with Recv.
func sendBothWays(ctx context.Context, t *testing.T, a, b *verbs.Conn, sizes []int, rounds int, into bool) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for _, dir := range []struct {
		from, to *verbs.Conn
		tag      int
	}{{a, b, 0}, {b, a, 1}} {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for r := range rounds {
				for i, n := range sizes {
					if err := dir.from.Send(ctx, message(r+dir.tag*rounds, i, n)); err != nil {
						errs <- fmt.Errorf("send %d/%d: %w", r, i, err)
						return
					}
				}
			}
		}()
		go func() {
			defer wg.Done()
			buf := make([]byte, dir.to.MaxMessage())
			for r := range rounds {
				for i, n := range sizes {
					var got []byte
					var err error
					if into && i%2 == 1 {
						var k int
						k, err = dir.to.RecvInto(ctx, buf)
						got = buf[:k]
					} else {
						got, err = dir.to.Recv(ctx)
					}
					if err != nil {
						errs <- fmt.Errorf("receive %d/%d: %w", r, i, err)
						return
					}
					if want := message(r+dir.tag*rounds, i, n); !bytes.Equal(got, want) {
						errs <- fmt.Errorf("message %d/%d: %d bytes, want %d (or data differs)", r, i, len(got), len(want))
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
