package interop

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/internal/pingpong"
	"github.com/taproce/taproce/verbs/abi"
)

// This file runs rdma-core's ibv_rc_pingpong, ibv_uc_pingpong and
// ibv_ud_pingpong (libibverbs/examples/{rc,uc,ud}_pingpong.c) on the raw
// transport engine: the protocol, its out-of-band exchange and its loop
// are internal/pingpong's (see there), shared with `taproce pingpong`,
// which runs the same on the verbs library.

// RoCEv2HopLimit is the hop limit of the address vectors a pingpong
// uses. The tools ask for 1, but for a RoCEv2 GID the kernel's ib_core
// replaces it with the hop limit of the route to the destination
// (ib_resolve_eth_dmac), so rxe sends TTL 64, and so does this side.
const RoCEv2HopLimit = 64

// DefaultPingpongPort is the TCP port of the pingpong tools.
const DefaultPingpongPort = pingpong.DefaultPort

// PingpongQKey is the Q_Key of ibv_ud_pingpong.
const PingpongQKey = pingpong.QKey

// GRHLen is the size of the GRH area in front of every UD receive.
const GRHLen = pingpong.GRHLen

// Dest is the address a pingpong tool exchanges (struct pingpong_dest).
type Dest = pingpong.Dest

// PingpongConfig holds a pingpong's options, named after the tools' flags.
type PingpongConfig struct {
	// Type is transport.RC (ibv_rc_pingpong), transport.UC
	// (ibv_uc_pingpong) or transport.UD (ibv_ud_pingpong).
	Type abi.QPType
	// Size is the message size, -s (default 4096 for RC, 1024 for UD).
	Size int
	// Iters is the number of exchanges, -n (default 1000).
	Iters int
	// RxDepth is the number of receives posted at a time, -r (default 500).
	RxDepth int
	// MTU is the path MTU of RC and UC, -m (default 1024).
	MTU abi.MTU
	// GIDIndex is the source GID index, -g (default 1, the IPv4 GID).
	GIDIndex int
	// Fill is the initial content of the message, repeated (default
	// 0x7b, as the tools fill their buffers).
	Fill []byte
	// Check, when set, is called with every message received (the n-th,
	// from 1); an error ends the pingpong.
	Check func(n int, msg []byte) error
	// Stall ends the pingpong with an error when no completion arrives
	// for that long (default 30 s).
	Stall time.Duration
}

func (c *PingpongConfig) defaults() error {
	if c.Type != abi.RC && c.Type != abi.UC && c.Type != abi.UD {
		return fmt.Errorf("interop: pingpong over %v", c.Type)
	}
	if c.Size == 0 {
		c.Size = 4096
		if c.Type == abi.UD {
			c.Size = 1024
		}
	}
	if c.Iters == 0 {
		c.Iters = 1000
	}
	if c.RxDepth == 0 {
		c.RxDepth = 500
	}
	if c.MTU == 0 {
		c.MTU = abi.MTU1024
	}
	if c.GIDIndex == 0 {
		c.GIDIndex = 1
	}
	if len(c.Fill) == 0 {
		c.Fill = []byte{0x7b}
	}
	if c.Stall == 0 {
		c.Stall = 30 * time.Second
	}
	if c.Size < 0 || c.Iters < 0 || c.RxDepth < 2 || !c.MTU.Valid() {
		return fmt.Errorf("interop: pingpong options %+v", *c)
	}
	return nil
}

// PingpongResult is the outcome of a pingpong.
type PingpongResult struct {
	Local, Remote  Dest
	Sent, Received int
	// Elapsed is the time from the first post to the last completion, as
	// the tools measure it.
	Elapsed time.Duration
}

func (r *PingpongResult) String() string {
	return fmt.Sprintf("%d iters in %.2f s = %.2f µs/iter (local %v; remote %v)", r.Sent, r.Elapsed.Seconds(),
		float64(r.Elapsed.Microseconds())/float64(max(r.Sent, 1)), r.Local, r.Remote)
}

// bufferVA is the virtual address the pingpong buffer is registered at.
const bufferVA = 0x10000000

// ppSide is one side of a pingpong on an endpoint; it gives the shared
// loop (pingpong.Loop) its posts.
type ppSide struct {
	ep     *Endpoint
	cfg    PingpongConfig
	qp     *transport.QP
	cq     *transport.CQ
	mr     *transport.MR
	buf    []byte
	wake   chan struct{}
	local  Dest
	remote Dest
	ah     *transport.AH
	loop   *pingpong.Loop
}

func (ep *Endpoint) newPingpong(cfg PingpongConfig) (*ppSide, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	pp := &ppSide{ep: ep, cfg: cfg, wake: make(chan struct{}, 1)}
	n := cfg.Size
	if cfg.Type == abi.UD {
		n += GRHLen
	}
	pp.buf = make([]byte, n)
	for i := range pp.buf {
		pp.buf[i] = 0x7b
	}
	for i := range pp.message() {
		pp.message()[i] = cfg.Fill[i%len(cfg.Fill)]
	}
	mem := ep.Engine.Memory()
	pd := mem.NewPD()
	var err error
	if pp.mr, err = mem.Register(pd, bufferVA, pp.buf, abi.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("interop: %w", err)
	}
	pp.cq = transport.NewCQ(cfg.RxDepth+1, func() {
		select {
		case pp.wake <- struct{}{}:
		default:
		}
	})
	pp.qp, err = ep.Engine.CreateQP(transport.QPConfig{Type: cfg.Type, PD: pd, SendCQ: pp.cq, RecvCQ: pp.cq, MaxSendWR: 1, MaxRecvWR: cfg.RxDepth})
	if err != nil {
		mem.Deregister(pp.mr)
		return nil, fmt.Errorf("interop: %w", err)
	}
	attr := transport.QPAttr{State: abi.QPSInit, Port: 1}
	mask := abi.QPStateMask | abi.QPPKeyIndex | abi.QPPort
	if cfg.Type == abi.UD {
		attr.QKey, mask = PingpongQKey, mask|abi.QPQKey
	} else {
		mask |= abi.QPAccessFlags
	}
	if err := pp.qp.Modify(&attr, mask); err != nil {
		pp.close()
		return nil, fmt.Errorf("interop: QP to INIT: %w", err)
	}
	if pp.loop, err = pingpong.NewLoop(pp, cfg.Iters, cfg.RxDepth); err != nil {
		pp.close()
		return nil, fmt.Errorf("interop: %w", err)
	}
	gid, err := ep.GID(cfg.GIDIndex)
	if err != nil {
		pp.close()
		return nil, err
	}
	pp.local = Dest{QPN: pp.qp.Num(), PSN: rand.Uint32() & roce.PSNMask, GID: gid}
	return pp, nil
}

// message returns the part of the buffer a message occupies: behind the
// GRH area on UD.
func (pp *ppSide) message() []byte {
	if pp.cfg.Type == abi.UD {
		return pp.buf[GRHLen : GRHLen+pp.cfg.Size]
	}
	return pp.buf[:pp.cfg.Size]
}

func (pp *ppSide) close() {
	pp.ep.Engine.DestroyQP(pp.qp)
	pp.ep.Engine.Memory().Deregister(pp.mr)
}

// PostRecv posts up to n receives of the whole buffer and returns how many.
func (pp *ppSide) PostRecv(n int) int {
	wr := transport.RecvWR{ID: pingpong.RecvWRID, SGL: []transport.SGE{{Addr: bufferVA, Length: uint32(len(pp.buf)), LKey: pp.mr.LKey}}}
	for i := 0; i < n; i++ {
		if _, err := pp.qp.PostRecv([]transport.RecvWR{wr}); err != nil {
			return i
		}
	}
	return n
}

// PostSend posts the SEND of the message.
func (pp *ppSide) PostSend() error {
	wr := transport.SendWR{ID: pingpong.SendWRID, Opcode: abi.WRSend, Flags: abi.SendSignaled,
		SGL: []transport.SGE{{Addr: bufferVA, Length: uint32(pp.cfg.Size), LKey: pp.mr.LKey}}}
	if pp.cfg.Type == abi.UD {
		wr.SGL[0].Addr += GRHLen
		wr.AH, wr.RemoteQPN, wr.RemoteQKey = pp.ah, pp.remote.QPN, PingpongQKey
	}
	if _, err := pp.qp.PostSend([]transport.SendWR{wr}); err != nil {
		return fmt.Errorf("interop: post send: %w", err)
	}
	return nil
}

// connect moves the QP to RTS towards the remote address (pp_connect_ctx).
func (pp *ppSide) connect(ctx context.Context, remote Dest) error {
	pp.remote = remote
	if !remote.HasGID() {
		return fmt.Errorf("interop: the peer sent no GID (%v): RoCE needs -g", remote)
	}
	dst := remote.Addr()
	mac, err := pp.ep.Resolve(ctx, dst)
	if err != nil {
		return err
	}
	if pp.cfg.Type == abi.UD {
		if err := pp.qp.Modify(&transport.QPAttr{State: abi.QPSRTR}, abi.QPStateMask); err != nil {
			return fmt.Errorf("interop: QP to RTR: %w", err)
		}
		if err := pp.qp.Modify(&transport.QPAttr{State: abi.QPSRTS, SQPSN: roce.PSN(pp.local.PSN)}, abi.QPStateMask|abi.QPSQPSN); err != nil {
			return fmt.Errorf("interop: QP to RTS: %w", err)
		}
		pp.ah = &transport.AH{DstIP: remote.GID, DstMAC: mac, SGIDIndex: uint8(pp.cfg.GIDIndex)}
		return nil
	}
	rtr := transport.QPAttr{State: abi.QPSRTR, PathMTU: pp.cfg.MTU, DestQPN: remote.QPN, RQPSN: roce.PSN(remote.PSN),
		MaxDestRdAtomic: 1, MinRNRTimer: 12,
		AV: transport.AddressVector{DstIP: dst, DstMAC: mac, SGIDIndex: uint8(pp.cfg.GIDIndex), HopLimit: RoCEv2HopLimit}}
	rtrMask := abi.QPStateMask | abi.QPAV | abi.QPPathMTU | abi.QPDestQPN | abi.QPRQPSN
	rts := transport.QPAttr{State: abi.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, SQPSN: roce.PSN(pp.local.PSN), MaxRdAtomic: 1}
	rtsMask := abi.QPStateMask | abi.QPSQPSN
	if pp.cfg.Type == abi.RC {
		rtrMask |= abi.QPMaxDestRdAtomic | abi.QPMinRNRTimer
		rtsMask |= abi.QPTimeout | abi.QPRetryCnt | abi.QPRNRRetry | abi.QPMaxQPRdAtomic
	}
	if err := pp.qp.Modify(&rtr, rtrMask); err != nil {
		return fmt.Errorf("interop: QP to RTR: %w", err)
	}
	if err := pp.qp.Modify(&rts, rtsMask); err != nil {
		return fmt.Errorf("interop: QP to RTS: %w", err)
	}
	return nil
}

// run exchanges the messages: the tools' main loop, polling the CQ.
func (pp *ppSide) run(ctx context.Context, client bool) (*PingpongResult, error) {
	res := &PingpongResult{Local: pp.local, Remote: pp.remote}
	l := pp.loop
	count := func() { res.Sent, res.Received = l.Sent, l.Received }
	defer count()
	start := time.Now()
	if err := l.Start(client); err != nil {
		return res, fmt.Errorf("interop: %w", err)
	}
	wcs := make([]transport.WC, 2)
	stall := time.NewTimer(pp.cfg.Stall)
	defer stall.Stop()
	for !l.Done() {
		n := pp.cq.Poll(wcs)
		if n == 0 {
			select {
			case <-pp.wake:
			case <-time.After(time.Millisecond):
			case <-stall.C:
				return res, fmt.Errorf("interop: pingpong stalled: no completion for %v after %d sends and %d receives completed (QP %v)",
					pp.cfg.Stall, l.Sent, l.Received, pp.qp.State())
			case <-ctx.Done():
				return res, fmt.Errorf("interop: pingpong after %d sends and %d receives: %w", l.Sent, l.Received, ctx.Err())
			}
			continue
		}
		stall.Reset(pp.cfg.Stall)
		for i := range wcs[:n] {
			wc := &wcs[i]
			if wc.Status != abi.WCSuccess {
				return res, fmt.Errorf("interop: %w after %d sends and %d receives", pingpong.StatusError(wc.Status.String(), int(wc.Status), wc.ID),
					l.Sent, l.Received)
			}
			if err := l.Complete(wc.ID, func(n int) error { return pp.received(wc, n) }); err != nil {
				return res, fmt.Errorf("interop: %w", err)
			}
		}
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// received checks a receive completion and hands the message to Check.
func (pp *ppSide) received(wc *transport.WC, n int) error {
	want := uint32(pp.cfg.Size)
	if pp.cfg.Type == abi.UD {
		want += GRHLen
		if wc.Flags&abi.WCGRH == 0 {
			return fmt.Errorf("interop: UD receive %d without the GRH flag", n)
		}
		if wc.SrcQP != pp.remote.QPN {
			return fmt.Errorf("interop: UD receive %d from QP %#x, want %#x", n, wc.SrcQP, pp.remote.QPN)
		}
		// RoCEv2 over IPv4: the IPv4 header in the last 20 bytes of the
		// GRH area.
		ip := roce.IPv4(pp.buf[GRHLen-roce.IPv4Len : GRHLen])
		if ip.Version() != 4 || ip.Src() != pp.remote.Addr() || ip.Dst() != pp.ep.IP() {
			return fmt.Errorf("interop: UD receive %d: GRH area holds % x", n, pp.buf[:GRHLen])
		}
	}
	if wc.ByteLen != want {
		return fmt.Errorf("interop: receive %d of %d bytes, want %d", n, wc.ByteLen, want)
	}
	if pp.cfg.Check != nil {
		if err := pp.cfg.Check(n, pp.message()); err != nil {
			return fmt.Errorf("interop: message %d: %w", n, err)
		}
	}
	return nil
}

// PingpongClient runs the client side of a pingpong against the server at
// addr (host:port, reached from Namespace): the tools with a server name.
func (ep *Endpoint) PingpongClient(ctx context.Context, addr string, cfg PingpongConfig) (*PingpongResult, error) {
	pp, err := ep.newPingpong(cfg)
	if err != nil {
		return nil, err
	}
	defer pp.close()
	conn, err := DialTCP(ctx, addr)
	if err != nil {
		return nil, err
	}
	remote, err := pingpong.ClientExchange(ctx, conn, pp.local)
	conn.Close()
	if err != nil {
		return nil, fmt.Errorf("interop: %w", err)
	}
	if err := pp.connect(ctx, remote); err != nil {
		return nil, err
	}
	return pp.run(ctx, true)
}

// PingpongServer runs the server side of a pingpong: it accepts one
// connection on ln (see ListenTCP), exchanges addresses and answers the
// client's messages. ln stays open.
func (ep *Endpoint) PingpongServer(ctx context.Context, ln net.Listener, cfg PingpongConfig) (*PingpongResult, error) {
	pp, err := ep.newPingpong(cfg)
	if err != nil {
		return nil, err
	}
	defer pp.close()
	if tl, ok := ln.(*net.TCPListener); ok {
		stop := context.AfterFunc(ctx, func() { tl.SetDeadline(time.Now()) })
		defer stop()
		defer tl.SetDeadline(time.Time{})
	}
	conn, err := ln.Accept()
	if err != nil {
		return nil, fmt.Errorf("interop: accepting the pingpong client: %w", err)
	}
	_, err = pingpong.ServerExchange(ctx, conn, pp.local, func(remote Dest) error { return pp.connect(ctx, remote) })
	conn.Close()
	if err != nil {
		return nil, fmt.Errorf("interop: %w", err)
	}
	return pp.run(ctx, false)
}
