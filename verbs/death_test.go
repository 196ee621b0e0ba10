package verbs_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/verbs"
)

// TestApplianceProcess is not a test: it is the appliance process that
// the tests of a dying appliance start and kill (appliancetest.StartProcess).
func TestApplianceProcess(t *testing.T) { appliancetest.ServeProcess(t) }

// startAppliance starts an appliance in a child process; killing it is
// how an appliance dies.
func startAppliance(t *testing.T) *appliancetest.Process {
	t.Helper()
	return appliancetest.StartProcess(t, "TestApplianceProcess", appliancetest.Options{Namespace: "death"})
}

// deathCtx bounds a test of a dying appliance: its end turns a client
// that never learns into a failure; no step is timed.
func deathCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// qpEnd is a context's PD, CQ (with a channel when asked) and RC QP.
type qpEnd struct {
	vc *verbs.Context
	pd *verbs.PD
	mr *verbs.MR
	ch *verbs.CompChannel
	cq *verbs.CQ
	qp *verbs.QP
}

func newQPEnd(t *testing.T, ctx context.Context, dev string, channel bool) *qpEnd {
	t.Helper()
	e := &qpEnd{}
	var err error
	if e.vc, err = verbs.Open(ctx, dev); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.vc.Close() })
	if e.pd, err = e.vc.AllocPD(ctx); err != nil {
		t.Fatal(err)
	}
	if e.mr, err = e.pd.AllocMR(ctx, 4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	if channel {
		if e.ch, err = e.vc.CreateCompChannel(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if e.cq, err = e.vc.CreateCQ(ctx, 64, e.ch); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = e.pd.CreateQP(ctx, verbs.QPInitAttr{Type: verbs.RC, SendCQ: e.cq, RecvCQ: e.cq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := e.qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSInit, Port: 1, Access: verbs.AccessRemoteWrite},
		verbs.QPStateMask|verbs.QPPKeyIndex|verbs.QPPort|verbs.QPAccessFlags); err != nil {
		t.Fatal(err)
	}
	return e
}

// connect takes e's QP (in INIT) to RTS towards peer's; RNR retries
// without end keep a SEND to a peer without receives outstanding.
func (e *qpEnd) connect(t *testing.T, ctx context.Context, peer *qpEnd) {
	t.Helper()
	g, err := peer.vc.GID(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSRTR, PathMTU: verbs.MTU1024, DestQPN: peer.qp.Num(),
		MinRNRTimer: 14, AH: verbs.AHAttr{DGID: g, SGIDIndex: 1, HopLimit: 1, Port: 1}},
		verbs.QPStateMask|verbs.QPAV|verbs.QPPathMTU|verbs.QPDestQPN|verbs.QPRQPSN|verbs.QPMaxDestRdAtomic|verbs.QPMinRNRTimer); err != nil {
		t.Fatal(err)
	}
	if err := e.qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7},
		verbs.QPStateMask|verbs.QPSQPSN|verbs.QPTimeout|verbs.QPRetryCnt|verbs.QPRNRRetry|verbs.QPMaxQPRdAtomic); err != nil {
		t.Fatal(err)
	}
}

// checkGone checks that err says the device is gone, as libibverbs says
// it of a device the kernel disassociated (EIO).
func checkGone(err error) error {
	if !errors.Is(err, verbs.ErrDeviceGone) || !errors.Is(err, syscall.EIO) {
		return fmt.Errorf("%v: not ErrDeviceGone and EIO", err)
	}
	var dg *verbs.DeviceGoneError
	if !errors.As(err, &dg) || dg.Device == "" {
		return fmt.Errorf("%v: not a DeviceGoneError naming the device", err)
	}
	return nil
}

// fatalOnce checks that the context's async events end with one
// EventDeviceFatal, and then with the error of a gone device.
func fatalOnce(ctx context.Context, vc *verbs.Context) error {
	ev, err := vc.AsyncEvent(ctx)
	if err != nil || ev.Type != verbs.EventDeviceFatal {
		return fmt.Errorf("first async event: %+v, %v; want EventDeviceFatal", ev, err)
	}
	ev, err = vc.AsyncEvent(ctx)
	if err == nil {
		return fmt.Errorf("second async event %+v; want the end", ev)
	}
	if err := checkGone(err); err != nil {
		return fmt.Errorf("after the fatal event: %w", err)
	}
	if err := checkGone(vc.Err()); err != nil {
		return fmt.Errorf("Err: %w", err)
	}
	select {
	case <-vc.Done():
	default:
		return errors.New("Done is not closed")
	}
	return nil
}

// flushedIDs checks that wcs are flush errors of qp and returns their IDs.
func flushedIDs(wcs []verbs.WC, qp *verbs.QP) ([]uint64, error) {
	var ids []uint64
	for _, wc := range wcs {
		if wc.Status != verbs.WCWRFlushErr || wc.QPNum != qp.Num() {
			return nil, fmt.Errorf("completion %+v, want a flush error of QP %#x", wc, qp.Num())
		}
		ids = append(ids, wc.ID)
	}
	return ids, nil
}

// TestApplianceDeath kills the appliance (SIGKILL) under three clients:
// one busy-polling its CQ for SENDs that RNR retries keep outstanding, one
// asleep on a completion channel for receives, one waiting in AsyncEvent.
// Each learns of the death without help: its outstanding work requests
// come back flushed (the sleeper woken to poll them), one EventDeviceFatal
// arrives, and posting, arming and calls to the appliance fail with
// ErrDeviceGone and EIO. The rings, memfd mappings of the dead process,
// stay readable.
func TestApplianceDeath(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an appliance process")
	}
	app := startAppliance(t)
	ctx := deathCtx(t)
	poller := newQPEnd(t, ctx, "taproce0", false)
	waiter := newQPEnd(t, ctx, "taproce1", false) // waits in AsyncEvent; never posts a receive
	sleeper := newQPEnd(t, ctx, "taproce1", true)
	poller.connect(t, ctx, waiter)
	waiter.connect(t, ctx, poller)

	sends := []uint64{1, 2, 3, 4}
	for _, id := range sends {
		if _, err := poller.qp.PostSend([]verbs.SendWR{{ID: id, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{poller.mr.SGE(0, 64)}}}); err != nil {
			t.Fatal(err)
		}
	}
	recvs := []uint64{11, 12, 13}
	for _, id := range recvs {
		if _, err := sleeper.qp.PostRecv([]verbs.RecvWR{{ID: id, SGL: []verbs.SGE{sleeper.mr.SGE(0, 64)}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := sleeper.cq.ReqNotify(false); err != nil {
		t.Fatal(err)
	}

	type outcome struct {
		who string
		err error
	}
	out := make(chan outcome, 3)
	started := make(chan struct{}, 3)
	go func() { // the busy-poller
		started <- struct{}{}
		wcs := make([]verbs.WC, 8)
		var got []verbs.WC
		for len(got) < len(sends) && ctx.Err() == nil {
			n := poller.cq.Poll(wcs)
			if n < 0 {
				out <- outcome{"poller", fmt.Errorf("poll: %d", n)}
				return
			}
			got = append(got, wcs[:n]...)
			runtime.Gosched()
		}
		out <- outcome{"poller", func() error {
			ids, err := flushedIDs(got, poller.qp)
			switch {
			case err != nil:
				return err
			case !slices.Equal(ids, sends):
				return fmt.Errorf("flushed %v, want %v", ids, sends)
			}
			if _, err := poller.qp.PostSend([]verbs.SendWR{{ID: 9, Opcode: verbs.WRSend, SGL: []verbs.SGE{poller.mr.SGE(0, 8)}}}); checkGone(err) != nil {
				return fmt.Errorf("post send: %w", checkGone(err))
			}
			if st := poller.qp.State(); st != verbs.QPSErr {
				return fmt.Errorf("QP state %v, want ERR", st)
			}
			return fatalOnce(ctx, poller.vc)
		}()}
	}()
	go func() { // the sleeper on its completion channel
		started <- struct{}{}
		out <- outcome{"sleeper", func() error {
			cq, err := sleeper.ch.Wait(ctx)
			if err != nil || cq != sleeper.cq {
				return fmt.Errorf("channel wait: %v, %v; want the CQ", cq, err)
			}
			wcs := make([]verbs.WC, 8)
			ids, err := flushedIDs(wcs[:max(sleeper.cq.Poll(wcs), 0)], sleeper.qp)
			switch {
			case err != nil:
				return err
			case !slices.Equal(ids, recvs):
				return fmt.Errorf("flushed %v, want %v", ids, recvs)
			}
			if err := sleeper.cq.ReqNotify(false); checkGone(err) != nil {
				return fmt.Errorf("arm the CQ: %w", checkGone(err))
			}
			if _, err := sleeper.ch.Wait(ctx); checkGone(err) != nil {
				return fmt.Errorf("channel wait again: %w", checkGone(err))
			}
			if _, err := sleeper.qp.PostRecv([]verbs.RecvWR{{ID: 19, SGL: []verbs.SGE{sleeper.mr.SGE(0, 8)}}}); checkGone(err) != nil {
				return fmt.Errorf("post receive: %w", checkGone(err))
			}
			return fatalOnce(ctx, sleeper.vc)
		}()}
	}()
	go func() { // the async event waiter
		started <- struct{}{}
		out <- outcome{"event waiter", func() error {
			if err := fatalOnce(ctx, waiter.vc); err != nil {
				return err
			}
			if _, err := waiter.vc.AllocPD(ctx); checkGone(err) != nil {
				return fmt.Errorf("alloc PD: %w", checkGone(err))
			}
			if _, err := waiter.vc.QueryPort(ctx); checkGone(err) != nil {
				return fmt.Errorf("query port: %w", checkGone(err))
			}
			if _, err := waiter.qp.PostSend([]verbs.SendWR{{ID: 9, Opcode: verbs.WRSend, SGL: []verbs.SGE{waiter.mr.SGE(0, 8)}}}); checkGone(err) != nil {
				return fmt.Errorf("post send: %w", checkGone(err))
			}
			return nil
		}()}
	}()
	for range 3 {
		<-started
	}
	if err := app.Kill(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		o := <-out
		if o.err != nil {
			t.Errorf("%s: %v", o.who, o.err)
		}
	}
	// What the clients made is theirs to release, as after any end.
	for _, e := range []*qpEnd{poller, waiter, sleeper} {
		if err := e.vc.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}
}

// TestApplianceDeathConn: the calls of a verbs.Conn waiting for the peer
// — a Recv on each side — and the ones after fail with ErrDeviceGone
// when the appliance dies.
func TestApplianceDeathConn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an appliance process")
	}
	app := startAppliance(t)
	ctx := deathCtx(t)
	a, b := pair(t)
	errs := make(chan error, 2)
	for _, c := range []*verbs.Conn{a, b} {
		go func() {
			_, err := c.Recv(ctx)
			errs <- err
		}()
	}
	if err := app.Kill(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := checkGone(<-errs); err != nil {
			t.Errorf("recv: %v", err)
		}
	}
	if err := checkGone(a.Send(ctx, []byte("hello"))); err != nil {
		t.Errorf("send: %v", err)
	}
	for _, c := range []*verbs.Conn{a, b} {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}
}
