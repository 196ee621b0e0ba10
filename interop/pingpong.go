package interop

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/transport"
)

// This file speaks the protocol of rdma-core's ibv_rc_pingpong,
// ibv_uc_pingpong and ibv_ud_pingpong
// (libibverbs/examples/{rc,uc,ud}_pingpong.c, pingpong.c):
//
// Out of band, over TCP (port 18515 by default), the client writes its
// address as "%04x:%06x:%06x:%s" (LID, QPN, PSN, GID as 32 hex digits in
// byte order, pingpong.c's gid_to_wire_gid) with the terminating NUL, 52
// bytes in one write; the server reads them, connects its QP, answers the
// same way, and the client ends with "done" and its NUL. Then the client
// posts the first SEND of size bytes; each side posts its next SEND once
// both its previous SEND and a receive have completed, until iters SENDs
// and iters receives completed. Both sides send from and receive into one
// buffer, so the server echoes what it received. Receives are posted
// rx_depth at a time and topped up when one or fewer remain.
//
// RC: INIT with access flags 0; RTR with path MTU (-m), the peer's QPN
// and PSN, max_dest_rd_atomic 1, min_rnr_timer 12 and a GRH address
// vector (source GID index -g; hop limit 1, which the kernel makes 64,
// see RoCEv2HopLimit) when the peer's GID has a non-zero interface ID;
// RTS with timeout 14, retry_cnt 7, rnr_retry 7, max_rd_atomic 1 and the
// own PSN. UC: the same without the attributes of ACKs and RDMA READ
// (RTR without max_dest_rd_atomic and min_rnr_timer, RTS with the PSN
// alone). UD: Q_Key 0x11111111, RTR and RTS with the state and the PSN
// alone, an address handle of the same form, receive buffers of size+40
// bytes with the GRH area in front, SENDs of size bytes from behind that
// area.

// RoCEv2HopLimit is the hop limit of the address vectors a pingpong
// uses. The tools ask for 1, but for a RoCEv2 GID the kernel's ib_core
// replaces it with the hop limit of the route to the destination
// (ib_resolve_eth_dmac), so rxe sends TTL 64, and so does this side.
const RoCEv2HopLimit = 64

// DefaultPingpongPort is the TCP port of the pingpong tools.
const DefaultPingpongPort = 18515

// PingpongQKey is the Q_Key of ibv_ud_pingpong.
const PingpongQKey = 0x11111111

// GRHLen is the size of the GRH area in front of every UD receive.
const GRHLen = 40

// DestLen is the length of a pingpong address message, NUL included.
const DestLen = len("0000:000000:000000:00000000000000000000000000000000") + 1

// Dest is the address a pingpong tool exchanges (struct pingpong_dest).
type Dest struct {
	LID uint16
	QPN uint32
	PSN roce.PSN
	GID roce.GID
}

// Marshal returns the message for d: "%04x:%06x:%06x:%s" and a NUL.
func (d Dest) Marshal() []byte {
	s := fmt.Sprintf("%04x:%06x:%06x:%s", d.LID, d.QPN, uint32(d.PSN), hex.EncodeToString(d.GID[:]))
	return append([]byte(s), 0)
}

// String formats d as the tools print it.
func (d Dest) String() string {
	return fmt.Sprintf("LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %v", d.LID, d.QPN, uint32(d.PSN), netip.AddrFrom16(d.GID))
}

// ErrDest is returned for a malformed address message.
var ErrDest = errors.New("interop: malformed pingpong address")

// ParseDest parses an address message as the tools do (sscanf
// "%x:%x:%x:%s" and wire_gid_to_gid), but strictly: four fields, the GID
// of 32 hex digits, an optional NUL at the end.
func ParseDest(b []byte) (Dest, error) {
	s := string(b)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	f := strings.Split(s, ":")
	if len(f) != 4 || len(f[3]) != 32 {
		return Dest{}, fmt.Errorf("%w: %q", ErrDest, s)
	}
	var v [3]uint64
	for i, bits := range []int{16, 24, 24} {
		n, err := strconv.ParseUint(f[i], 16, bits)
		if err != nil {
			return Dest{}, fmt.Errorf("%w: %q: %w", ErrDest, s, err)
		}
		v[i] = n
	}
	var d Dest
	if _, err := hex.Decode(d.GID[:], []byte(f[3])); err != nil {
		return Dest{}, fmt.Errorf("%w: %q: %w", ErrDest, s, err)
	}
	d.LID, d.QPN, d.PSN = uint16(v[0]), uint32(v[1]), roce.PSN(v[2])
	return d, nil
}

// PingpongConfig holds a pingpong's options, named after the tools' flags.
type PingpongConfig struct {
	// Type is transport.RC (ibv_rc_pingpong), transport.UC
	// (ibv_uc_pingpong) or transport.UD (ibv_ud_pingpong).
	Type transport.QPType
	// Size is the message size, -s (default 4096 for RC, 1024 for UD).
	Size int
	// Iters is the number of exchanges, -n (default 1000).
	Iters int
	// RxDepth is the number of receives posted at a time, -r (default 500).
	RxDepth int
	// MTU is the path MTU of RC and UC, -m (default 1024).
	MTU roce.MTU
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
	if c.Type != transport.RC && c.Type != transport.UC && c.Type != transport.UD {
		return fmt.Errorf("interop: pingpong over %v", c.Type)
	}
	if c.Size == 0 {
		c.Size = 4096
		if c.Type == transport.UD {
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
		c.MTU = roce.MTU1024
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

// Work request IDs of the tools.
const (
	recvWRID = 1
	sendWRID = 2
)

// bufferVA is the virtual address the pingpong buffer is registered at.
const bufferVA = 0x10000000

// pingpong is one side of a pingpong on an endpoint.
type pingpong struct {
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
}

func (ep *Endpoint) newPingpong(cfg PingpongConfig) (*pingpong, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	pp := &pingpong{ep: ep, cfg: cfg, wake: make(chan struct{}, 1)}
	n := cfg.Size
	if cfg.Type == transport.UD {
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
	if pp.mr, err = mem.Register(pd, bufferVA, pp.buf, transport.AccessLocalWrite); err != nil {
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
	attr := transport.QPAttr{State: transport.StateInit, Port: 1}
	mask := transport.AttrState | transport.AttrPKeyIndex | transport.AttrPort
	if cfg.Type == transport.UD {
		attr.QKey, mask = PingpongQKey, mask|transport.AttrQKey
	} else {
		mask |= transport.AttrAccessFlags
	}
	if err := pp.qp.Modify(&attr, mask); err != nil {
		pp.close()
		return nil, fmt.Errorf("interop: QP to INIT: %w", err)
	}
	if got := pp.postRecv(cfg.RxDepth); got < cfg.RxDepth {
		pp.close()
		return nil, fmt.Errorf("interop: posted %d of %d receives", got, cfg.RxDepth)
	}
	gid, err := ep.GID(cfg.GIDIndex)
	if err != nil {
		pp.close()
		return nil, err
	}
	pp.local = Dest{QPN: pp.qp.Num(), PSN: roce.PSN(rand.Uint32() & roce.PSNMask), GID: gid}
	return pp, nil
}

// message returns the part of the buffer a message occupies: behind the
// GRH area on UD.
func (pp *pingpong) message() []byte {
	if pp.cfg.Type == transport.UD {
		return pp.buf[GRHLen : GRHLen+pp.cfg.Size]
	}
	return pp.buf[:pp.cfg.Size]
}

func (pp *pingpong) close() {
	pp.ep.Engine.DestroyQP(pp.qp)
	pp.ep.Engine.Memory().Deregister(pp.mr)
}

// postRecv posts up to n receives of the whole buffer and returns how many.
func (pp *pingpong) postRecv(n int) int {
	wr := transport.RecvWR{ID: recvWRID, SGL: []transport.SGE{{Addr: bufferVA, Length: uint32(len(pp.buf)), LKey: pp.mr.LKey}}}
	for i := 0; i < n; i++ {
		if _, err := pp.qp.PostRecv([]transport.RecvWR{wr}); err != nil {
			return i
		}
	}
	return n
}

func (pp *pingpong) postSend() error {
	wr := transport.SendWR{ID: sendWRID, Opcode: transport.OpSend, Flags: transport.SendSignaled,
		SGL: []transport.SGE{{Addr: bufferVA, Length: uint32(pp.cfg.Size), LKey: pp.mr.LKey}}}
	if pp.cfg.Type == transport.UD {
		wr.SGL[0].Addr += GRHLen
		wr.AH, wr.RemoteQPN, wr.RemoteQKey = pp.ah, pp.remote.QPN, PingpongQKey
	}
	if _, err := pp.qp.PostSend([]transport.SendWR{wr}); err != nil {
		return fmt.Errorf("interop: post send: %w", err)
	}
	return nil
}

// connect moves the QP to RTS towards the remote address (pp_connect_ctx).
func (pp *pingpong) connect(ctx context.Context, remote Dest) error {
	pp.remote = remote
	var zero [8]byte
	if bytes.Equal(remote.GID[8:], zero[:]) {
		return fmt.Errorf("interop: the peer sent no GID (%v): RoCE needs -g", remote)
	}
	dst := netip.AddrFrom16(remote.GID).Unmap()
	mac, err := pp.ep.Resolve(ctx, dst)
	if err != nil {
		return err
	}
	if pp.cfg.Type == transport.UD {
		if err := pp.qp.Modify(&transport.QPAttr{State: transport.StateRTR}, transport.AttrState); err != nil {
			return fmt.Errorf("interop: QP to RTR: %w", err)
		}
		if err := pp.qp.Modify(&transport.QPAttr{State: transport.StateRTS, SQPSN: pp.local.PSN}, transport.AttrState|transport.AttrSQPSN); err != nil {
			return fmt.Errorf("interop: QP to RTS: %w", err)
		}
		pp.ah = &transport.AH{DstIP: remote.GID, DstMAC: mac, SGIDIndex: uint8(pp.cfg.GIDIndex)}
		return nil
	}
	rtr := transport.QPAttr{State: transport.StateRTR, PathMTU: pp.cfg.MTU, DestQPN: remote.QPN, RQPSN: remote.PSN,
		MaxDestRdAtomic: 1, MinRNRTimer: 12,
		AV: transport.AddressVector{DstIP: dst, DstMAC: mac, SGIDIndex: uint8(pp.cfg.GIDIndex), HopLimit: RoCEv2HopLimit}}
	rtrMask := transport.AttrState | transport.AttrAV | transport.AttrPathMTU | transport.AttrDestQPN | transport.AttrRQPSN
	rts := transport.QPAttr{State: transport.StateRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, SQPSN: pp.local.PSN, MaxRdAtomic: 1}
	rtsMask := transport.AttrState | transport.AttrSQPSN
	if pp.cfg.Type == transport.RC {
		rtrMask |= transport.AttrMaxDestRdAtomic | transport.AttrMinRNRTimer
		rtsMask |= transport.AttrTimeout | transport.AttrRetryCnt | transport.AttrRNRRetry | transport.AttrMaxQPRdAtomic
	}
	if err := pp.qp.Modify(&rtr, rtrMask); err != nil {
		return fmt.Errorf("interop: QP to RTR: %w", err)
	}
	if err := pp.qp.Modify(&rts, rtsMask); err != nil {
		return fmt.Errorf("interop: QP to RTS: %w", err)
	}
	return nil
}

// run exchanges the messages (the tools' main loop and parse_single_wc).
func (pp *pingpong) run(ctx context.Context, client bool) (*PingpongResult, error) {
	res := &PingpongResult{Local: pp.local, Remote: pp.remote}
	iters := pp.cfg.Iters
	pending := recvWRID
	routs := pp.cfg.RxDepth
	start := time.Now()
	if client {
		if err := pp.postSend(); err != nil {
			return res, err
		}
		pending |= sendWRID
	}
	wcs := make([]transport.WC, 2)
	stall := time.NewTimer(pp.cfg.Stall)
	defer stall.Stop()
	for res.Received < iters || res.Sent < iters {
		n := pp.cq.Poll(wcs)
		if n == 0 {
			select {
			case <-pp.wake:
			case <-time.After(time.Millisecond):
			case <-stall.C:
				return res, fmt.Errorf("interop: pingpong stalled: no completion for %v after %d sends and %d receives completed (QP %v)",
					pp.cfg.Stall, res.Sent, res.Received, pp.qp.State())
			case <-ctx.Done():
				return res, fmt.Errorf("interop: pingpong after %d sends and %d receives: %w", res.Sent, res.Received, ctx.Err())
			}
			continue
		}
		stall.Reset(pp.cfg.Stall)
		for _, wc := range wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return res, fmt.Errorf("interop: failed status %v (%d) for wr_id %d after %d sends and %d receives",
					wc.Status, uint8(wc.Status), wc.ID, res.Sent, res.Received)
			}
			switch wc.ID {
			case sendWRID:
				res.Sent++
			case recvWRID:
				routs--
				if routs <= 1 {
					routs += pp.postRecv(pp.cfg.RxDepth - routs)
					if routs < pp.cfg.RxDepth {
						return res, fmt.Errorf("interop: could not post receives (%d)", routs)
					}
				}
				res.Received++
				if err := pp.received(&wc, res.Received); err != nil {
					return res, err
				}
			default:
				return res, fmt.Errorf("interop: completion for unknown wr_id %d", wc.ID)
			}
			pending &^= int(wc.ID)
			if res.Sent < iters && pending == 0 {
				if err := pp.postSend(); err != nil {
					return res, err
				}
				pending = recvWRID | sendWRID
			}
		}
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// received checks a receive completion and hands the message to Check.
func (pp *pingpong) received(wc *transport.WC, n int) error {
	want := uint32(pp.cfg.Size)
	if pp.cfg.Type == transport.UD {
		want += GRHLen
		if wc.Flags&transport.WCGRH == 0 {
			return fmt.Errorf("interop: UD receive %d without the GRH flag", n)
		}
		if wc.SrcQP != pp.remote.QPN {
			return fmt.Errorf("interop: UD receive %d from QP %#x, want %#x", n, wc.SrcQP, pp.remote.QPN)
		}
		// RoCEv2 over IPv4: the IPv4 header in the last 20 bytes of the
		// GRH area.
		ip := roce.IPv4(pp.buf[GRHLen-roce.IPv4Len : GRHLen])
		if ip.Version() != 4 || ip.Src() != netip.AddrFrom16(pp.remote.GID).Unmap() || ip.Dst() != pp.ep.IP() {
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
	remote, err := func() (Dest, error) {
		defer conn.Close()
		stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
		defer stop()
		if _, err := conn.Write(pp.local.Marshal()); err != nil {
			return Dest{}, fmt.Errorf("interop: sending the local address: %w", err)
		}
		msg := make([]byte, DestLen)
		if _, err := io.ReadFull(conn, msg); err != nil {
			return Dest{}, fmt.Errorf("interop: reading the remote address: %w", err)
		}
		if _, err := conn.Write([]byte("done\x00")); err != nil {
			return Dest{}, fmt.Errorf("interop: sending done: %w", err)
		}
		return ParseDest(msg)
	}()
	if err != nil {
		return nil, err
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
	err = func() error {
		defer conn.Close()
		stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
		defer stop()
		msg := make([]byte, DestLen)
		if _, err := io.ReadFull(conn, msg); err != nil {
			return fmt.Errorf("interop: reading the remote address: %w", err)
		}
		remote, err := ParseDest(msg)
		if err != nil {
			return err
		}
		if err := pp.connect(ctx, remote); err != nil {
			return err
		}
		if _, err := conn.Write(pp.local.Marshal()); err != nil {
			return fmt.Errorf("interop: sending the local address: %w", err)
		}
		done := make([]byte, 5)
		if _, err := io.ReadFull(conn, done); err != nil {
			return fmt.Errorf("interop: reading done: %w", err)
		}
		if string(done) != "done\x00" {
			return fmt.Errorf("interop: client ended the exchange with %q, want \"done\\x00\"", done)
		}
		return nil
	}()
	if err != nil {
		return nil, err
	}
	return pp.run(ctx, false)
}
