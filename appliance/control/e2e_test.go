package control_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/appliance/control"
	"github.com/taproce/taproce/tap"
	"github.com/taproce/taproce/verbs"
)

// rig is an appliance with two ports on a fake wire, serving verbs on a
// socket in a temporary directory, and a client context on each port.
type rig struct {
	app    *appliance.Appliance
	ca, cb *verbs.Context
	ga, gb netip.Addr
}

func newRig(t testing.TB, localSwitch bool) *rig {
	return newRigOpts(t, localSwitch, 1500, appliance.PollAdaptive)
}

// newRigMTU is newRig with ports of the given netdev MTU.
func newRigMTU(t testing.TB, localSwitch bool, mtu int) *rig {
	return newRigOpts(t, localSwitch, mtu, appliance.PollAdaptive)
}

// newRigOpts is newRig with an MTU and a poll mode.
func newRigOpts(t testing.TB, localSwitch bool, mtu int, poll appliance.PollMode) *rig {
	t.Helper()
	app := appliancetest.New(t, appliancetest.Options{LocalSwitch: localSwitch, MTU: mtu, Poll: poll, Namespace: "e2e"}).App
	var err error
	r := &rig{app: app}
	tctx := testCtx(t)
	if r.ca, err = verbs.Open(tctx, "taproce0"); err != nil {
		t.Fatal(err)
	}
	if r.cb, err = verbs.Open(tctx, "taproce1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.ca.Close(); r.cb.Close() })
	r.ga, _ = r.ca.GID(1)
	r.gb, _ = r.cb.GID(1)
	return r
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// end is one side of a connection: PD, MR, CQ, QP.
type end struct {
	pd *verbs.PD
	mr *verbs.MR
	cq *verbs.CQ
	qp *verbs.QP
}

func newEnd(t testing.TB, c *verbs.Context, typ verbs.QPType, size int) *end {
	t.Helper()
	ctx := testCtx(t)
	e := &end{}
	var err error
	if e.pd, err = c.AllocPD(ctx); err != nil {
		t.Fatal(err)
	}
	if e.mr, err = e.pd.AllocMR(ctx, size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic); err != nil {
		t.Fatal(err)
	}
	if e.cq, err = c.CreateCQ(ctx, 256, nil); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = e.pd.CreateQP(ctx, verbs.QPInitAttr{Type: typ, SendCQ: e.cq, RecvCQ: e.cq,
		Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInline: 64}}); err != nil {
		t.Fatal(err)
	}
	return e
}

// connectRC takes two RC QPs through INIT, RTR and RTS to each other.
func connectRC(t testing.TB, a, b *end, ga, gb netip.Addr) {
	connectRCMTU(t, a, b, ga, gb, verbs.MTU1024)
}

// connectRCMTU is connectRC with a path MTU.
func connectRCMTU(t testing.TB, a, b *end, ga, gb netip.Addr, mtu verbs.MTU) {
	t.Helper()
	connectRCWith(t, a, b, ga, gb, mtu, 14, 7)
}

// connectRCWith is connectRC with a path MTU, a local ACK timeout and a
// retry count.
func connectRCWith(t testing.TB, a, b *end, ga, gb netip.Addr, mtu verbs.MTU, timeout, retry uint8) {
	t.Helper()
	ctx := testCtx(t)
	all := verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	for _, x := range []struct {
		e    *end
		peer *end
		dgid netip.Addr
	}{{a, b, gb}, {b, a, ga}} {
		q := x.e.qp
		must(t, q.Modify(ctx, &verbs.QPAttr{State: verbs.QPSInit, Port: 1, Access: all},
			verbs.QPStateMask|verbs.QPPKeyIndex|verbs.QPPort|verbs.QPAccessFlags))
		must(t, q.Modify(ctx, &verbs.QPAttr{State: verbs.QPSRTR, PathMTU: mtu, DestQPN: x.peer.qp.Num(), RQPSN: 0,
			MaxDestRdAtomic: 16, MinRNRTimer: 12, AH: verbs.AHAttr{DGID: x.dgid, SGIDIndex: 1, HopLimit: 1, Port: 1}},
			verbs.QPStateMask|verbs.QPAV|verbs.QPPathMTU|verbs.QPDestQPN|verbs.QPRQPSN|verbs.QPMaxDestRdAtomic|verbs.QPMinRNRTimer))
		must(t, q.Modify(ctx, &verbs.QPAttr{State: verbs.QPSRTS, SQPSN: 0, Timeout: timeout, RetryCnt: retry, RNRRetry: 7, MaxRdAtomic: 16},
			verbs.QPStateMask|verbs.QPSQPSN|verbs.QPTimeout|verbs.QPRetryCnt|verbs.QPRNRRetry|verbs.QPMaxQPRdAtomic))
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// wait polls cq until n completions came, or fails after a while.
func wait(t testing.TB, cq *verbs.CQ, n int) []verbs.WC {
	t.Helper()
	var out []verbs.WC
	wcs := make([]verbs.WC, 16)
	deadline := time.Now().Add(10 * time.Second)
	for len(out) < n {
		k := cq.Poll(wcs)
		if k < 0 {
			t.Fatal("CQ destroyed")
		}
		out = append(out, wcs[:k]...)
		if k == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d completions: %+v", len(out), n, out)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	return out
}

// TestHeldAcksGoOut: a spinning appliance holds the acknowledgement of a
// SEND back for the answer its client may post (AckDelay), and its ring
// pollers send it when no answer comes — nothing else does, the engines'
// timer loops watching only the queue pairs' timers. One-way SENDs, each
// waited for, complete without the requester's local ACK timeout (67 ms)
// ever running out.
func TestHeldAcksGoOut(t *testing.T) {
	r := newRigOpts(t, false, 1500, appliance.PollSpin)
	a, b := newEnd(t, r.ca, verbs.RC, 1<<20), newEnd(t, r.cb, verbs.RC, 1<<20)
	connectRC(t, a, b, r.ga, r.gb)
	for i := range 30 {
		_, err := b.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{b.mr.SGE(0, 64)}}})
		must(t, err)
		_, err = a.qp.PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled | verbs.SendInline, SGL: []verbs.SGE{a.mr.SGE(0, 8)}}})
		must(t, err)
		if wc := wait(t, a.cq, 1)[0]; wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCSend {
			t.Fatalf("send %d: %+v", i, wc)
		}
		if wc := wait(t, b.cq, 1)[0]; wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv {
			t.Fatalf("receive %d: %+v", i, wc)
		}
	}
	for _, n := range r.app.NICs() {
		if st := n.Engine().Stats(); st.Timeouts != 0 || st.Retransmits != 0 || st.DuplicateRequests != 0 {
			t.Errorf("%s: %+v: an acknowledgement was held until the requester's timeout", n.Name(), st)
		}
	}
}

// TestAppliancePolls: a client learns whether the appliance busy-polls its
// rings (DeviceAttr.Polls) — only in spin mode.
func TestAppliancePolls(t *testing.T) {
	for _, c := range []struct {
		mode appliance.PollMode
		want bool
	}{{appliance.PollSpin, true}, {appliance.PollBlock, false}, {appliance.PollAdaptive, false}} {
		t.Run(c.mode.String(), func(t *testing.T) {
			r := newRigOpts(t, false, 1500, c.mode)
			for _, vc := range []*verbs.Context{r.ca, r.cb} {
				if got := vc.AppliancePolls(); got != c.want {
					t.Errorf("%s: AppliancePolls() = %v, want %v", vc.Name(), got, c.want)
				}
			}
		})
	}
}

// TestVerbsRC: through the control socket and the shared rings, two
// clients connect RC QPs and run SEND with immediate, WRITE, READ and
// both atomics, with the data checked — over the fake wire and over the
// local switch, and over the wire with the appliance spinning and
// blocking.
func TestVerbsRC(t *testing.T) {
	for _, c := range []struct {
		name  string
		local bool
		poll  appliance.PollMode
	}{
		{"wire", false, appliance.PollAdaptive}, {"local switch", true, appliance.PollAdaptive},
		// Spinning, one loop polls the ports and the clients' rings;
		// blocking, one loop sleeps on the clients' doorbells.
		{"wire, spinning", false, appliance.PollSpin}, {"wire, blocking", false, appliance.PollBlock},
	} {
		local := c.local
		t.Run(c.name, func(t *testing.T) {
			r := newRigOpts(t, local, 1500, c.poll)
			if r.app.Loop() == nil || r.app.Loop().Blocking() == (c.poll == appliance.PollSpin) {
				t.Fatalf("appliance loop %v in mode %s", r.app.Loop(), c.poll)
			}
			a, b := newEnd(t, r.ca, verbs.RC, 1<<20), newEnd(t, r.cb, verbs.RC, 1<<20)
			connectRC(t, a, b, r.ga, r.gb)
			// SEND with immediate.
			_, err := b.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{b.mr.SGE(0, 4096)}}})
			must(t, err)
			copy(a.mr.Bytes(), "hello over shared memory")
			_, err = a.qp.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRSendWithImm, Flags: verbs.SendSignaled, Imm: 0x01020304,
				SGL: []verbs.SGE{a.mr.SGE(0, 24)}}})
			must(t, err)
			got := wait(t, b.cq, 1)[0]
			if got.Status != verbs.WCSuccess || got.Opcode != verbs.WCRecv || got.ByteLen != 24 || got.Imm != 0x01020304 ||
				got.Flags&verbs.WCWithImm == 0 || string(b.mr.Bytes()[:24]) != "hello over shared memory" {
				t.Fatalf("receive %+v %q", got, b.mr.Bytes()[:24])
			}
			if wc := wait(t, a.cq, 1)[0]; wc.ID != 2 || wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCSend {
				t.Fatalf("send %+v", wc)
			}
			// A SEND of several packets (one whole-message frame on the
			// local switch).
			_, err = b.qp.PostRecv([]verbs.RecvWR{{ID: 10, SGL: []verbs.SGE{b.mr.SGE(16384, 8192)}}})
			must(t, err)
			for i := range 5000 {
				a.mr.Bytes()[4096+i] = byte(i * 7)
			}
			_, err = a.qp.PostSend([]verbs.SendWR{{ID: 11, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(4096, 5000)}}})
			must(t, err)
			if wc := wait(t, b.cq, 1)[0]; wc.ID != 10 || wc.Status != verbs.WCSuccess || wc.ByteLen != 5000 ||
				!bytes.Equal(b.mr.Bytes()[16384:16384+5000], a.mr.Bytes()[4096:4096+5000]) {
				t.Fatalf("SEND of 5000 bytes: %+v", wc)
			}
			wait(t, a.cq, 1)
			// WRITE 256 KiB, READ it back elsewhere.
			const n = 256 << 10
			for i := range n {
				a.mr.Bytes()[i] = byte(i*13 + i>>9)
			}
			_, err = a.qp.PostSend([]verbs.SendWR{
				{ID: 3, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(0, n)}, RemoteAddr: b.mr.Addr() + 8192, RKey: b.mr.RKey},
				{ID: 4, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(n, n)}, RemoteAddr: b.mr.Addr() + 8192, RKey: b.mr.RKey},
			})
			must(t, err)
			for _, wc := range wait(t, a.cq, 2) {
				if wc.Status != verbs.WCSuccess {
					t.Fatalf("%+v", wc)
				}
			}
			if !bytes.Equal(b.mr.Bytes()[8192:8192+n], a.mr.Bytes()[:n]) || !bytes.Equal(a.mr.Bytes()[n:2*n], a.mr.Bytes()[:n]) {
				t.Fatal("WRITE/READ data differs")
			}
			// Atomics on B's counter.
			binary.LittleEndian.PutUint64(b.mr.Bytes()[512<<10:], 40)
			ctr := b.mr.Addr() + 512<<10
			_, err = a.qp.PostSend([]verbs.SendWR{
				{ID: 5, Opcode: verbs.WRAtomicFetchAdd, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(600<<10, 8)}, RemoteAddr: ctr, RKey: b.mr.RKey, CompareAdd: 2},
				{ID: 6, Opcode: verbs.WRAtomicCmpAndSwp, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(601<<10, 8)}, RemoteAddr: ctr, RKey: b.mr.RKey, CompareAdd: 42, Swap: 7},
			})
			must(t, err)
			wait(t, a.cq, 2)
			if f, c, v := binary.LittleEndian.Uint64(a.mr.Bytes()[600<<10:]), binary.LittleEndian.Uint64(a.mr.Bytes()[601<<10:]),
				binary.LittleEndian.Uint64(b.mr.Bytes()[512<<10:]); f != 40 || c != 42 || v != 7 {
				t.Fatalf("atomics: fetch-add %d, cmp-swap %d, counter %d", f, c, v)
			}
			if local && r.app.Switch().Frames() == 0 {
				t.Fatal("nothing crossed the local switch")
			}
		})
	}
}

// TestVerbsMisuse: what libibverbs refuses, refused the same way.
func TestVerbsMisuse(t *testing.T) {
	r := newRig(t, true)
	ctx := testCtx(t)
	a := newEnd(t, r.ca, verbs.RC, 4096)
	// Posting on a RESET QP.
	if _, err := a.qp.PostSend([]verbs.SendWR{{Opcode: verbs.WRSend, SGL: []verbs.SGE{a.mr.SGE(0, 1)}}}); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("post send in RESET: %v", err)
	}
	if _, err := a.qp.PostRecv([]verbs.RecvWR{{SGL: []verbs.SGE{a.mr.SGE(0, 1)}}}); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("post receive in RESET: %v", err)
	}
	// A transition with a missing attribute (INIT needs the port etc.).
	if err := a.qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSInit}, verbs.QPStateMask); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("RESET→INIT without attributes: %v", err)
	}
	// RESET→RTS is no transition at all.
	if err := a.qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPStateMask); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("RESET→RTS: %v", err)
	}
	must(t, a.qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSInit, Port: 1}, verbs.QPStateMask|verbs.QPPKeyIndex|verbs.QPPort|verbs.QPAccessFlags))
	// Overrunning the receive queue.
	wrs := make([]verbs.RecvWR, 65)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{a.mr.SGE(0, 8)}}
	}
	if n, err := a.qp.PostRecv(wrs); n != 64 || !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("overrun: posted %d, %v", n, err)
	}
	// Destroying what is in use, then double destroy.
	if err := a.cq.Destroy(ctx); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("destroy a CQ in use: %v", err)
	}
	if err := a.pd.Dealloc(ctx); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("dealloc a PD in use: %v", err)
	}
	must(t, a.qp.Destroy(ctx))
	if err := a.qp.Destroy(ctx); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("double destroy QP: %v", err)
	}
	must(t, a.cq.Destroy(ctx))
	if n := a.cq.Poll(make([]verbs.WC, 1)); n != -1 {
		t.Fatalf("poll a destroyed CQ: %d", n)
	}
	if err := a.cq.Destroy(ctx); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("double destroy CQ: %v", err)
	}
	must(t, a.mr.Dereg(ctx))
	must(t, a.pd.Dealloc(ctx))
	if err := a.pd.Dealloc(ctx); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("double dealloc PD: %v", err)
	}
	if st := r.app.Control().Stats(); st.QPs != 0 || st.CQs != 0 || st.MRs != 0 || st.PDs != 0 {
		t.Fatalf("objects left: %+v", st)
	}
}

// TestVerbsLoopback: two QPs of one device connect to each other (the
// port's own GID), as rxe allows: their traffic loops back in memory,
// without the local switch and without the wire.
func TestVerbsLoopback(t *testing.T) {
	r := newRig(t, false)
	a, b := newEnd(t, r.ca, verbs.RC, 1<<20), newEnd(t, r.ca, verbs.RC, 1<<20)
	connectRC(t, a, b, r.ga, r.ga)
	for i := range 100000 {
		a.mr.Bytes()[i] = byte(i * 3)
	}
	_, err := b.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{b.mr.SGE(0, 4096)}}})
	must(t, err)
	_, err = a.qp.PostSend([]verbs.SendWR{
		{ID: 2, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(0, 100000)}, RemoteAddr: b.mr.Addr() + 8192, RKey: b.mr.RKey},
		{ID: 3, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(0, 100)}},
	})
	must(t, err)
	wait(t, a.cq, 2)
	if wc := wait(t, b.cq, 1)[0]; wc.Status != verbs.WCSuccess || wc.ByteLen != 100 {
		t.Fatalf("receive %+v", wc)
	}
	if !bytes.Equal(b.mr.Bytes()[8192:8192+100000], a.mr.Bytes()[:100000]) {
		t.Fatal("loopback WRITE data differs")
	}
}

// flaky is a fake device whose reads fail while fail is set.
type flaky struct {
	*tap.Fake
	fail atomic.Bool
}

func (f *flaky) TryReadEach(fn func([]byte)) (int, error) {
	if f.fail.Load() {
		return 0, errors.New("device gone away")
	}
	return f.Fake.TryReadEach(fn)
}

// TestPortEvents: a port whose device fails shows DOWN and its clients
// get IBV_EVENT_PORT_ERR; when it works again, ACTIVE and
// IBV_EVENT_PORT_ACTIVE.
func TestPortEvents(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "taproce.sock")
	t.Setenv("TAPROCE_SOCKET", sock)
	self, err := control.NetnsInode("/proc/self/ns/net")
	must(t, err)
	app, err := appliance.New(appliance.Options{Socket: sock, PeerNetns: func(int32) (uint64, error) { return self, nil }})
	must(t, err)
	a, b := tap.NewFakePair(1500, 64)
	defer b.Close()
	dev := &flaky{Fake: a}
	_, err = app.AddPortOn(dev, appliance.PortConfig{Namespace: "ev", Name: "fake0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.80.0.1/24")}})
	must(t, err)
	must(t, app.Control().Listen())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Serve(ctx) }()
	defer func() { cancel(); <-done; app.Close() }()
	c, err := verbs.Open(testCtx(t), "taproce0")
	must(t, err)
	defer c.Close()
	for _, step := range []struct {
		fail  bool
		event uint32
		state uint8
	}{{true, verbs.EventPortErr, 1}, {false, verbs.EventPortActive, 4}} {
		dev.fail.Store(step.fail)
		// A frame wakes the loop asleep on the port; its read fails, or,
		// once the device works again, reads it.
		if _, err := b.Write([][]byte{make([]byte, 64)}, 0); err != nil {
			t.Fatal(err)
		}
		ev, err := c.AsyncEvent(testCtx(t))
		must(t, err)
		if ev.Type != step.event {
			t.Fatalf("event %d, want %d", ev.Type, step.event)
		}
		pa, err := c.QueryPort(testCtx(t))
		must(t, err)
		if pa.State != step.state {
			t.Fatalf("port state %d, want %d", pa.State, step.state)
		}
	}
}

// TestRecvFlushInError: receives posted to a QP in ERROR complete at once
// with WR_FLUSH_ERR, as libibverbs has it — whether posted before the QP
// failed, just after, or while the appliance's poller sleeps (clients ring
// for receive posts only in ERROR), in each poll mode.
func TestRecvFlushInError(t *testing.T) {
	for _, mode := range []appliance.PollMode{appliance.PollBlock, appliance.PollAdaptive, appliance.PollSpin} {
		t.Run(mode.String(), func(t *testing.T) {
			r := newRigOpts(t, true, 1500, mode)
			ctx := testCtx(t)
			a := newEnd(t, r.ca, verbs.RC, 4096)
			must(t, a.qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSInit, Port: 1}, verbs.QPStateMask|verbs.QPPKeyIndex|verbs.QPPort|verbs.QPAccessFlags))
			post := func(id uint64) {
				t.Helper()
				if _, err := a.qp.PostRecv([]verbs.RecvWR{{ID: id, SGL: []verbs.SGE{a.mr.SGE(0, 8)}}}); err != nil {
					t.Fatal(err)
				}
			}
			post(1) // in INIT: waits in the queue
			must(t, a.qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSErr}, verbs.QPStateMask))
			post(2)                           // just after the failure
			time.Sleep(20 * time.Millisecond) // the poller sleeps
			post(3)
			wcs := make([]verbs.WC, 4)
			var got []uint64
			deadline := time.Now().Add(5 * time.Second)
			for len(got) < 3 && time.Now().Before(deadline) {
				k := a.cq.Poll(wcs)
				for _, wc := range wcs[:max(k, 0)] {
					if wc.Status != verbs.WCWRFlushErr || wc.Opcode != verbs.WCRecv {
						t.Errorf("completion %+v, want a flushed receive", wc)
					}
					got = append(got, wc.ID)
				}
				if k == 0 {
					time.Sleep(100 * time.Microsecond)
				}
			}
			if !slices.Equal(got, []uint64{1, 2, 3}) {
				t.Fatalf("flushed receives %v, want [1 2 3]", got)
			}
		})
	}
}

// TestDestroyLingers: a client destroys its connected RC QP; the QP stays
// in its port's engine for the linger (transport.Engine.Close), answering
// only retransmissions of what it executed: a new request that arrives for
// it goes unanswered, as at rxe, and the peer's retries run out.
func TestDestroyLingers(t *testing.T) {
	r := newRig(t, false)
	a, b := newEnd(t, r.ca, verbs.RC, 1<<16), newEnd(t, r.cb, verbs.RC, 1<<16)
	// Retries that run out (16.8 ms, three tries): what the destroyed QP
	// does not answer fails.
	connectRCWith(t, a, b, r.ga, r.gb, verbs.MTU1024, 12, 2)
	write := func(id uint64) verbs.WC {
		_, err := a.qp.PostSend([]verbs.SendWR{{ID: id, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{a.mr.SGE(0, 4096)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey}})
		must(t, err)
		return wait(t, a.cq, 1)[0]
	}
	if wc := write(1); wc.Status != verbs.WCSuccess {
		t.Fatalf("WRITE before the destroy: %+v", wc)
	}
	count := func() int {
		n := 0
		for _, nic := range r.app.NICs() {
			n += nic.Engine().QPCount()
		}
		return n
	}
	before := count()
	must(t, b.qp.Destroy(testCtx(t)))
	if got := count(); got != before {
		t.Fatalf("%d QPs in the engines after the destroy, want %d (the destroyed one lingering)", got, before)
	}
	// A new request goes unanswered, as at rxe once the QP is gone.
	if wc := write(2); wc.Status != verbs.WCRetryExcErr {
		t.Fatalf("WRITE to the destroyed QP: %+v, want RETRY_EXC_ERR", wc)
	}
}

// TestOneWayQPs: a QP with an empty receive queue and one with an empty
// send queue are created, as rxe creates them (qperf's one-way tests ask
// for max_recv_wr 0 on the sender and max_send_wr 0 on the receiver);
// the sender's RDMA WRITE and SEND reach the receiver, and posting to an
// empty queue answers ENOMEM, the answer of a full one.
func TestOneWayQPs(t *testing.T) {
	r := newRig(t, false)
	ctx := testCtx(t)
	oneWay := func(c *verbs.Context, send, recv uint32) *end {
		e := newEnd(t, c, verbs.RC, 1<<16)
		must(t, e.qp.Destroy(ctx))
		var err error
		e.qp, err = e.pd.CreateQP(ctx, verbs.QPInitAttr{Type: verbs.RC, SendCQ: e.cq, RecvCQ: e.cq,
			Cap: verbs.QPCap{MaxSendWR: send, MaxRecvWR: recv, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatalf("create a QP with queues %d/%d: %v", send, recv, err)
		}
		return e
	}
	a, b := oneWay(r.ca, 16, 0), oneWay(r.cb, 0, 16)
	connectRC(t, a, b, r.ga, r.gb)
	if _, err := a.qp.PostRecv([]verbs.RecvWR{{SGL: []verbs.SGE{a.mr.SGE(0, 8)}}}); !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("post receive to an empty receive queue: %v", err)
	}
	if _, err := b.qp.PostSend([]verbs.SendWR{{Opcode: verbs.WRSend, SGL: []verbs.SGE{b.mr.SGE(0, 8)}}}); !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("post send to an empty send queue: %v", err)
	}
	copy(a.mr.Bytes(), "one way")
	_, err := a.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{a.mr.SGE(0, 7)}, RemoteAddr: b.mr.Addr() + 100, RKey: b.mr.RKey}})
	must(t, err)
	if wc := wait(t, a.cq, 1)[0]; wc.Status != verbs.WCSuccess || string(b.mr.Bytes()[100:107]) != "one way" {
		t.Fatalf("RDMA WRITE: %+v, %q", wc, b.mr.Bytes()[100:107])
	}
	_, err = b.qp.PostRecv([]verbs.RecvWR{{ID: 2, SGL: []verbs.SGE{b.mr.SGE(0, 64)}}})
	must(t, err)
	_, err = a.qp.PostSend([]verbs.SendWR{{ID: 3, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(0, 7)}}})
	must(t, err)
	if wc := wait(t, b.cq, 1)[0]; wc.Status != verbs.WCSuccess || wc.ByteLen != 7 || string(b.mr.Bytes()[:7]) != "one way" {
		t.Fatalf("SEND: %+v, %q", wc, b.mr.Bytes()[:7])
	}
}
