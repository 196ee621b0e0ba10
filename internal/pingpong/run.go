package pingpong

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/taproce/taproce/internal/devwatch"
	"github.com/taproce/taproce/internal/oobconn"
	"github.com/taproce/taproce/internal/spin"
	"github.com/taproce/taproce/verbs"
)

// Result is the outcome of a pingpong.
type Result struct {
	Local, Remote Dest
	Iters         int
	// Bytes is what the tools report: size × iters × 2.
	Bytes int64
	// Elapsed runs from the first post to the last completion, as the
	// tools measure it.
	Elapsed time.Duration
	// InvalidPages are the pages of the message -c found wrong, each
	// reported as "invalid data in page N".
	InvalidPages []int
	// Message is a copy of the message part of the buffer at the end.
	Message []byte
	// Sent, Received and Lost count the datagrams of a bounded UD
	// pingpong (Options.Timeout; Datagrams says what each counts).
	Sent, Received, Lost int
}

// Env holds what a caller other than the command line may change.
type Env struct {
	// Listener, when set, is where a server accepts its client instead of
	// listening on Options.Port.
	Listener net.Listener
	// OnReceive, when set, sees every receive completion (the n-th, from
	// 1) with the whole buffer (on UD the GRH area in front) before the
	// next SEND is posted; an error ends the pingpong.
	OnReceive func(n int, wc *verbs.WC, buf []byte) error
}

// Tuning of the polling loop: it busy-polls for pollSpinFor without a
// completion (yielding the processor between polls, spin.Spinner), then
// sleeps pollSleep between polls. The tools poll without ever sleeping; a
// millisecond covers any round trip of a working NIC, and after it a
// polling loop gives its core back (docs/performance-log.md, pingpong's
// polling).
const (
	pollSpinFor = time.Millisecond
	pollSleep   = 10 * time.Microsecond
)

// pollPacer tells a polling loop when to stop spinning and sleep; its
// zero value starts spinning.
type pollPacer struct {
	empty    int
	since    time.Time
	sleeping bool
	spin     spin.Spinner
}

// idle is called after each poll that found nothing; it reports whether
// the loop has spun long enough and should sleep, and gives the processor
// away while it spins. It reads the clock only every 64th time.
func (p *pollPacer) idle() (sleep bool) {
	p.empty++
	switch {
	case p.empty == 1:
		p.since = time.Now()
	case p.sleeping:
		return true
	case p.empty%64 == 0 && time.Since(p.since) > pollSpinFor:
		p.sleeping = true
		return true
	}
	p.spin.Idle()
	return false
}

// sendRetry bounds how long PostSend retries a full send queue: the
// appliance writes a SEND's completion before it counts the SEND as
// retired, so a SEND posted right after that completion can find the
// one-entry queue still full for a moment.
const sendRetry = time.Second

// side is one end: its QP, CQ and buffer, with the loop's posts.
type side struct {
	o      *Options
	vc     *verbs.Context
	ch     *verbs.CompChannel
	pd     *verbs.PD
	mr     *verbs.MR
	cq     *verbs.CQ
	qp     *verbs.QP
	ah     *verbs.AH
	inline bool
	// remoteQPN is the peer's QPN, where UD SENDs go.
	remoteQPN uint32
	send      [1]verbs.SendWR
	recv      []verbs.RecvWR
}

// message returns the part of the buffer a message occupies: behind the
// GRH area on UD.
func (s *side) message() []byte {
	if s.o.Type == verbs.UD {
		return s.mr.Bytes()[GRHLen : GRHLen+s.o.Size]
	}
	return s.mr.Bytes()[:s.o.Size]
}

func (s *side) PostSend() error { return s.postSend(verbs.WRSend, 0) }

// PostSendSeq posts the message as a SEND with immediate data seq: the
// bounded loop's sequence number (Datagrams).
func (s *side) PostSendSeq(seq uint32) error { return s.postSend(verbs.WRSendWithImm, seq) }

func (s *side) postSend(op verbs.Opcode, imm uint32) error {
	wr := &s.send[0]
	*wr = verbs.SendWR{ID: SendWRID, Opcode: op, Imm: imm, Flags: verbs.SendSignaled}
	off := 0
	if s.o.Type == verbs.UD {
		off = GRHLen
		wr.AH, wr.RemoteQPN, wr.RemoteQKey = s.ah, s.remoteQPN, QKey
	}
	if s.inline {
		wr.Flags |= verbs.SendInline
		wr.Inline = s.message()
	} else {
		wr.SGL = []verbs.SGE{s.mr.SGE(off, s.o.Size)}
	}
	var deadline time.Time
	for {
		_, err := s.qp.PostSend(s.send[:])
		if err == nil || !errors.Is(err, syscall.ENOMEM) {
			return err
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(sendRetry)
		} else if time.Now().After(deadline) {
			return err
		}
		runtime.Gosched()
	}
}

func (s *side) PostRecv(n int) int {
	if n <= 0 {
		return 0
	}
	k, _ := s.qp.PostRecv(s.recv[:min(n, len(s.recv))])
	return k
}

// poll waits for completions: by spinning on the CQ, or, with -e, on the
// completion channel (ibv_get_cq_event, ibv_req_notify_cq, then one
// ibv_poll_cq that may find nothing).
func (s *side) poll(ctx context.Context, wcs []verbs.WC) (int, error) {
	if s.ch != nil {
		cq, err := s.ch.Wait(ctx)
		if err != nil {
			if ctx.Err() != nil {
				err = context.Cause(ctx) // the device's death, devwatch.Context
			}
			return 0, fmt.Errorf("failed to get cq_event: %w", err)
		}
		if cq != s.cq {
			return 0, errors.New("CQ event for unknown CQ")
		}
		if err := s.cq.ReqNotify(false); err != nil {
			return 0, fmt.Errorf("couldn't request CQ notification: %w", err)
		}
		n := s.cq.Poll(wcs)
		if n < 0 {
			return 0, fmt.Errorf("poll CQ failed %d", n)
		}
		return n, nil
	}
	var pace pollPacer
	for {
		n := s.cq.Poll(wcs)
		if n < 0 {
			return 0, fmt.Errorf("poll CQ failed %d", n)
		}
		if n > 0 {
			return n, nil
		}
		// The NIC is a process too: a spinning tool gives its core away
		// between polls, or on a small machine the appliance waits for
		// the scheduler's tick to run at all.
		if !pace.idle() {
			continue
		}
		if ctx.Err() != nil {
			return 0, context.Cause(ctx)
		}
		time.Sleep(pollSleep)
	}
}

// Run runs one side of a pingpong: the server when o.Server is empty,
// else the client. It writes the tools' output to stdout: the local and
// remote addresses, the two result lines, and with -c "invalid data in
// page N" for each page of the message found wrong (the tools check only
// the page's first byte, on the server; this checks every byte, on both
// sides). Errors use the tools' words, led by the device's error when its
// appliance dies (verbs.ErrDeviceGone): that ends every wait at once.
func Run(ctx context.Context, o Options, env Env, stdout io.Writer) (_ *Result, err error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	client := o.Server != ""
	s := &side{o: &o}
	if err := s.open(ctx); err != nil {
		return nil, err
	}
	defer s.vc.Close()
	defer func() { err = devwatch.Explain(s.vc, err) }()
	ctx, stopDev := devwatch.Context(ctx, s.vc)
	defer stopDev()
	var (
		loop *Loop
		dg   *Datagrams
	)
	if o.Timeout > 0 {
		dg, err = NewDatagrams(s, client, o.Iters, o.RxDepth, o.Timeout)
	} else {
		loop, err = NewLoop(s, o.Iters, o.RxDepth)
	}
	if err != nil {
		return nil, err
	}
	if s.ch != nil {
		if err := s.cq.ReqNotify(false); err != nil {
			return nil, fmt.Errorf("couldn't request CQ notification: %w", err)
		}
	}
	local, err := s.localDest(ctx)
	if err != nil {
		return nil, err
	}
	sep := ","
	if o.Type == verbs.UD {
		sep = ":" // ibv_ud_pingpong's own punctuation
	}
	fmt.Fprintf(stdout, "  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x%s GID %s\n",
		local.LID, local.QPN, local.PSN, sep, local.GIDString())

	var remote Dest
	if client {
		remote, err = s.clientExchange(ctx, local)
	} else {
		remote, err = s.serverExchange(ctx, env.Listener, local)
	}
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "  remote address: %v\n", remote)
	if client {
		if err := s.connect(ctx, local, remote); err != nil {
			return nil, err
		}
		if o.Validate {
			mark(s.message())
		}
	}
	res := &Result{Local: local, Remote: remote, Iters: o.Iters, Bytes: int64(o.Size) * int64(o.Iters) * 2}
	var received func(n int) error
	var wc *verbs.WC
	if env.OnReceive != nil {
		received = func(n int) error { return env.OnReceive(n, wc, s.mr.Bytes()) }
	}
	wcs := make([]verbs.WC, 2)
	start := time.Now()
	if dg != nil {
		if err := s.runDatagrams(ctx, dg, wcs, &wc, received); err != nil {
			return res, err
		}
		res.Sent, res.Received, res.Lost = dg.Sent, dg.Received, dg.Lost()
		res.Bytes = int64(o.Size) * int64(dg.Sent+dg.Received)
	} else {
		if err := loop.Start(client); err != nil {
			return res, err
		}
		start = time.Now()
		for !loop.Done() {
			n, err := s.poll(ctx, wcs)
			if err != nil {
				return res, fmt.Errorf("after %d sends and %d receives completed: %w", loop.Sent, loop.Received, err)
			}
			for i := range wcs[:n] {
				wc = &wcs[i]
				if wc.Status != verbs.WCSuccess {
					return res, StatusError(wc.Status.String(), int(wc.Status), wc.ID)
				}
				if err := loop.Complete(wc.ID, received); err != nil {
					return res, err
				}
			}
		}
	}
	res.Elapsed = time.Since(start)
	usec := float64(res.Elapsed.Nanoseconds()) / 1e3
	fmt.Fprintf(stdout, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", res.Bytes, usec/1e6, float64(res.Bytes)*8/usec)
	fmt.Fprintf(stdout, "%d iters in %.2f seconds = %.2f usec/iter\n", o.Iters, usec/1e6, usec/float64(o.Iters))
	if dg != nil {
		fmt.Fprintf(stdout, "datagrams: %d sent, %d received, %d lost (each waited for %v at most)\n",
			res.Sent, res.Received, res.Lost, o.Timeout)
	}
	res.Message = append([]byte(nil), s.message()...)
	if o.Validate {
		res.InvalidPages = invalidPages(res.Message)
		for _, p := range res.InvalidPages {
			fmt.Fprintf(stdout, "invalid data in page %d\n", p)
		}
	}
	return res, nil
}

// runDatagrams runs the bounded exchange (--timeout): the completions
// go to dg as they come, and each time its deadline passes first, the
// wait it was for ends (Datagrams.Expire). *wc is the completion being
// handled, for received.
func (s *side) runDatagrams(ctx context.Context, dg *Datagrams, wcs []verbs.WC, wc **verbs.WC, received func(n int) error) error {
	if err := dg.Start(time.Now()); err != nil {
		return err
	}
	for !dg.Done() {
		wctx, cancel := context.WithDeadline(ctx, dg.Deadline())
		n, err := s.poll(wctx, wcs)
		cancel()
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				err = dg.Expire(time.Now())
			}
			if err != nil {
				return fmt.Errorf("after %d sends and %d receives completed: %w", dg.Sent, dg.Received, err)
			}
			continue
		}
		now := time.Now()
		for i := range wcs[:n] {
			*wc = &wcs[i]
			if wcs[i].Status != verbs.WCSuccess {
				return StatusError(wcs[i].Status.String(), int(wcs[i].Status), wcs[i].ID)
			}
			if err := dg.Complete(&wcs[i], now, received); err != nil {
				return err
			}
		}
	}
	return nil
}

func (o *Options) check() error {
	switch {
	case o.Type != verbs.RC && o.Type != verbs.UC && o.Type != verbs.UD:
		return usagef("QP type %d: want RC, UC or UD", o.Type)
	case o.ODP:
		return errors.New("the device isn't ODP capable or does not support RC send and receive with ODP")
	case o.Size < 0 || o.Iters < 0 || o.RxDepth < 1 || o.Port < 0 || o.Port > 65535 || o.Timeout < 0:
		return usagef("size %d, iterations %d, rx depth %d, port %d or timeout %v out of range", o.Size, o.Iters, o.RxDepth, o.Port, o.Timeout)
	case o.Timeout > 0 && o.Type != verbs.UD:
		return usagef("--timeout applies to UD pingpong only")
	}
	if _, ok := verbs.MTUFromBytes(o.MTU); !ok {
		return usagef("path MTU %d: choose from 256, 512, 1024, 2048 or 4096", o.MTU)
	}
	return nil
}

// open makes the side's objects as pp_init_ctx does, and moves the QP to
// INIT.
func (s *side) open(ctx context.Context) error {
	o := s.o
	name := o.Device
	if name != "" {
		devs, err := verbs.Devices(ctx)
		if err != nil {
			return fmt.Errorf("failed to get IB devices list: %w", err)
		}
		found := false
		for _, d := range devs {
			found = found || d.Name == name
		}
		if !found {
			return fmt.Errorf("IB device %s not found", name)
		}
	}
	vc, err := verbs.Open(ctx, name)
	if err != nil {
		return fmt.Errorf("couldn't get context for %s: %w", orDefault(name, "the first device"), err)
	}
	s.vc = vc
	if o.IBPort != 1 {
		return fmt.Errorf("unable to query port info for port %d: %s has one port: %w", o.IBPort, vc.Name(), syscall.EINVAL)
	}
	port, err := vc.QueryPort(ctx)
	if err != nil {
		return fmt.Errorf("unable to query port info for port %d: %w", o.IBPort, err)
	}
	bufLen := o.Size
	if o.Type == verbs.UD {
		mtu := verbs.MTU(port.ActiveMTU).Bytes()
		if o.Size > mtu {
			return fmt.Errorf("requested size larger than port MTU (%d)", mtu)
		}
		bufLen += GRHLen
	}
	if o.Events {
		if s.ch, err = vc.CreateCompChannel(ctx); err != nil {
			return fmt.Errorf("couldn't create completion channel: %w", err)
		}
	}
	if s.pd, err = vc.AllocPD(ctx); err != nil {
		return fmt.Errorf("couldn't allocate PD: %w", err)
	}
	// A region cannot be empty; a message of size 0 leaves it unused.
	if s.mr, err = s.pd.AllocMR(ctx, max(bufLen, 1), verbs.AccessLocalWrite); err != nil {
		return fmt.Errorf("couldn't register MR: %w", err)
	}
	fill(s.mr.Bytes(), 0x7b)
	if s.cq, err = vc.CreateCQ(ctx, o.RxDepth+1, s.ch); err != nil {
		return fmt.Errorf("couldn't create CQ: %w", err)
	}
	s.qp, err = s.pd.CreateQP(ctx, verbs.QPInitAttr{Type: o.Type, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: uint32(o.RxDepth), MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return fmt.Errorf("couldn't create QP: %w", err)
	}
	s.inline = int(s.qp.Cap().MaxInline) >= o.Size
	wr := verbs.RecvWR{ID: RecvWRID, SGL: []verbs.SGE{s.mr.SGE(0, bufLen)}}
	s.recv = make([]verbs.RecvWR, o.RxDepth)
	for i := range s.recv {
		s.recv[i] = wr
	}
	attr := verbs.QPAttr{State: verbs.QPSInit, Port: uint8(o.IBPort)}
	mask := verbs.QPStateMask | verbs.QPPKeyIndex | verbs.QPPort
	if o.Type == verbs.UD {
		attr.QKey, mask = QKey, mask|verbs.QPQKey
	} else {
		mask |= verbs.QPAccessFlags
	}
	if err := s.qp.Modify(ctx, &attr, mask); err != nil {
		return fmt.Errorf("failed to modify QP to INIT: %w", err)
	}
	return nil
}

func orDefault(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// gidIndex returns the GID index to use: -g, or the IPv4 GID (index 1)
// when the port has one, else 0.
func (s *side) gidIndex() int {
	if s.o.GIDIndex >= 0 {
		return s.o.GIDIndex
	}
	if g, err := s.vc.GID(1); err == nil && g.Is4() {
		return 1
	}
	return 0
}

// localDest returns this side's address: the port's LID (0 on RoCE), the
// QPN, a random PSN and the GID.
func (s *side) localDest(ctx context.Context) (Dest, error) {
	port, err := s.vc.QueryPort(ctx)
	if err != nil {
		return Dest{}, fmt.Errorf("couldn't get port info: %w", err)
	}
	idx := s.gidIndex()
	gid, err := s.vc.GID(idx)
	if err != nil {
		return Dest{}, fmt.Errorf("can't read sgid of index %d: %w", idx, err)
	}
	return Dest{LID: port.LID, QPN: s.qp.Num(), PSN: rand.Uint32() & 0xffffff, GID: gid.As16()}, nil
}

// connect moves the QP to RTS towards remote (pp_connect_ctx), and on UD
// makes the address handle.
func (s *side) connect(ctx context.Context, local, remote Dest) error {
	o := s.o
	av := verbs.AHAttr{Port: uint8(o.IBPort)}
	if remote.HasGID() {
		av.DGID, av.SGIDIndex, av.HopLimit = remote.Addr(), uint8(s.gidIndex()), 1
	}
	if o.Type == verbs.UD {
		if err := s.qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSRTR}, verbs.QPStateMask); err != nil {
			return fmt.Errorf("failed to modify QP to RTR: %w", err)
		}
		if err := s.qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSRTS, SQPSN: local.PSN}, verbs.QPStateMask|verbs.QPSQPSN); err != nil {
			return fmt.Errorf("failed to modify QP to RTS: %w", err)
		}
		if remote.HasGID() {
			av.HopLimit = 64
		}
		ah, err := s.pd.CreateAH(ctx, av)
		if err != nil {
			return fmt.Errorf("failed to create AH: %w", err)
		}
		s.ah = ah
		s.remoteQPN = remote.QPN
		return nil
	}
	mtu, _ := verbs.MTUFromBytes(o.MTU)
	rtr := verbs.QPAttr{State: verbs.QPSRTR, PathMTU: mtu, DestQPN: remote.QPN, RQPSN: remote.PSN,
		MaxDestRdAtomic: 1, MinRNRTimer: 12, AH: av}
	rtrMask := verbs.QPStateMask | verbs.QPAV | verbs.QPPathMTU | verbs.QPDestQPN | verbs.QPRQPSN
	rts := verbs.QPAttr{State: verbs.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, SQPSN: local.PSN, MaxRdAtomic: 1}
	rtsMask := verbs.QPStateMask | verbs.QPSQPSN
	if o.Type == verbs.RC {
		rtrMask |= verbs.QPMaxDestRdAtomic | verbs.QPMinRNRTimer
		rtsMask |= verbs.QPTimeout | verbs.QPRetryCnt | verbs.QPRNRRetry | verbs.QPMaxQPRdAtomic
	}
	if err := s.qp.Modify(ctx, &rtr, rtrMask); err != nil {
		return fmt.Errorf("failed to modify QP to RTR: %w", err)
	}
	if err := s.qp.Modify(ctx, &rts, rtsMask); err != nil {
		return fmt.Errorf("failed to modify QP to RTS: %w", err)
	}
	return nil
}

// clientExchange connects to the server, giving up after oobconn's few
// tries where nothing listens, and exchanges addresses with it.
func (s *side) clientExchange(ctx context.Context, local Dest) (Dest, error) {
	c, err := oobconn.Dial(ctx, net.JoinHostPort(s.o.Server, strconv.Itoa(s.o.Port)))
	if err != nil {
		return Dest{}, err
	}
	defer c.Close()
	return ClientExchange(ctx, c, local)
}

// serverExchange waits, without end as the tools' servers do, for a client
// on the port (or ln) until ctx ends, and exchanges addresses with it.
func (s *side) serverExchange(ctx context.Context, ln net.Listener, local Dest) (Dest, error) {
	if ln == nil {
		var lc net.ListenConfig
		l, err := lc.Listen(ctx, "tcp", net.JoinHostPort("", strconv.Itoa(s.o.Port)))
		if err != nil {
			return Dest{}, oobconn.Wrapf(err, "couldn't listen to port %d", s.o.Port)
		}
		defer l.Close()
		ln = l
	}
	c, err := oobconn.Accept(ctx, ln)
	if err != nil {
		return Dest{}, oobconn.Wrapf(err, "accept() failed")
	}
	defer c.Close()
	return ServerExchange(ctx, c, local, func(remote Dest) error {
		if err := s.connect(ctx, local, remote); err != nil {
			return err
		}
		if s.o.Type == verbs.UD {
			// The client sends as soon as it has our answer, and a UD SEND
			// that finds no receive is lost for good.
			return settleReceives(ctx)
		}
		return nil
	})
}

// receiveSettle is how long a UD server waits, before it answers, for the
// appliance to take the receives it posted. The verbs library hands posts
// to the appliance through a shared ring that the appliance drains
// asynchronously, so a receive is not usable the moment PostRecv returns
// as ibv_post_recv's is; RC hides this (an RNR NAK, then a retry), UD
// does not. The appliance drains a ring within about 100 µs, more when
// busy.
const receiveSettle = 2 * time.Millisecond

func settleReceives(ctx context.Context) error {
	t := time.NewTimer(receiveSettle)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fill sets every byte of b to v.
func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// pageSize is the tools' sysconf(_SC_PAGESIZE).
var pageSize = os.Getpagesize()

// mark writes the client's -c pattern: a zero at the start of every page
// of the message (the tools' "i / page_size % sizeof(char)").
func mark(msg []byte) {
	for i := 0; i < len(msg); i += pageSize {
		msg[i] = 0
	}
}

// invalidPages returns the pages of msg that differ from the -c pattern:
// 0x7b bytes with a zero at the start of every page.
func invalidPages(msg []byte) []int {
	var bad []int
	for p := 0; p*pageSize < len(msg); p++ {
		page := msg[p*pageSize : min((p+1)*pageSize, len(msg))]
		ok := page[0] == 0
		for _, b := range page[1:] {
			ok = ok && b == 0x7b
		}
		if !ok {
			bad = append(bad, p)
		}
	}
	return bad
}
