package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/taproce/taproce/internal/devwatch"
	"github.com/taproce/taproce/internal/oobconn"
	"github.com/taproce/taproce/verbs"
)

// driver is the RDMA side of a test, as the exchange drives it.
type driver interface {
	// connect takes the QPs to RTR, and to RTS where perftest does (the
	// latency tests and a bandwidth client), towards the peer's QPs.
	connect(rem []Dest) error
	// prepare posts the receives of one message size (SEND tests),
	// before the barrier that lets the peer send.
	prepare(size int) error
	// run runs one message size and returns this side's result, or nil
	// when this side only serves (a read or atomic latency server never
	// runs).
	run(size int) (*Result, error)
}

// peerLastWait bounds how long a write_lat -D run waits at its end for the
// peer's answer to its last WRITE (rdma.awaitPeerLast).
const peerLastWait = 2 * time.Second

// cacheLineSize is what perftest's get_cache_line_size finds on x86.
const cacheLineSize = 64

// Run runs a test against a peer, a perftest program or another taproce
// perf, and writes perftest's output (or JSON lines) to w. It returns the
// result lines it printed. When the device's appliance dies it fails with
// an error that says so (wrapping verbs.ErrDeviceGone), whatever it was
// waiting for, as perftest fails on a device that reports a fatal error.
func Run(ctx context.Context, cfg Config, w io.Writer) (_ []Result, err error) {
	p, err := resolve(cfg)
	if err != nil {
		return nil, err
	}
	pr := &printer{w: w, json: cfg.JSON}
	vc, err := verbs.Open(ctx, cfg.Device)
	if err != nil {
		return nil, err
	}
	defer vc.Close()
	defer func() { err = devwatch.Explain(vc, err) }()
	ctx, stopDev := devwatch.Context(ctx, vc)
	defer stopDev()
	port, err := vc.QueryPort(ctx)
	if err != nil {
		return nil, err
	}
	gidIndex := cfg.GIDIndex
	if gidIndex < 0 {
		gidIndex = bestGID(port.GIDs)
	}
	if gidIndex >= len(port.GIDs) {
		return nil, fmt.Errorf("GID index %d: the port has %d GIDs", gidIndex, len(port.GIDs))
	}
	gid := port.GIDs[gidIndex]
	cur := int(port.ActiveMTU)
	if p.MTU != 0 {
		if m := mtuEnum(p.MTU); m > cur {
			pr.text("Requested mtu is higher than active mtu \nChanging to active mtu - %d\n", cur)
		} else {
			cur = m
		}
	}

	conn, err := connect(ctx, p, pr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	o := newOOB(conn, !p.IsServer(), p.IdleTimeout)
	cycle, cacheLine, mtu, err := o.setup(os.Getpagesize(), cacheLineSize, cur)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	d, err := newRDMA(ctx, vc, p, rdmaConfig{cycle: cycle, cacheLine: cacheLine, mtu: verbs.MTU(mtu), gidIndex: gidIndex, gid: gid})
	if err != nil {
		return nil, err
	}
	defer d.close()
	p.pathMTU = verbs.MTU(mtu).Bytes()
	pr.text("%s", testInfo(p, vc.Name(), verbs.MTU(mtu).Bytes(), gidIndex, d.inline, d.outReads))
	res, err := exchange(o, p, d.dests(), d, pr)
	return res, ctxErr(ctx, err)
}

// ctxErr prefers the context's cause (its error, or the device's death,
// devwatch.Context) to the failure it caused, unless that says it.
func ctxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		if cause := context.Cause(ctx); !errors.Is(err, cause) {
			return fmt.Errorf("%w (%w)", cause, err)
		}
	}
	return err
}

// connect makes the out-of-band connection: a server waits, without end
// as perftest's does, for one client on its port (or Config.Listener),
// until ctx ends; a client connects to the server, giving up after
// oobconn's few tries where nothing listens.
func connect(ctx context.Context, p *params, pr *printer) (net.Conn, error) {
	if !p.IsServer() {
		addr := p.Server
		if _, _, err := net.SplitHostPort(addr); err != nil {
			addr = net.JoinHostPort(addr, strconv.Itoa(p.Port))
		}
		return oobconn.Dial(ctx, addr)
	}
	pr.text("\n************************************\n* Waiting for client to connect... *\n************************************\n")
	ln := p.Listener
	if ln == nil {
		var lc net.ListenConfig
		var err error
		ln, err = lc.Listen(ctx, "tcp4", ":"+strconv.Itoa(p.Port))
		if err != nil {
			return nil, oobconn.Wrapf(err, "couldn't listen to port %d", p.Port)
		}
	}
	defer ln.Close()
	c, err := oobconn.Accept(ctx, ln)
	if err != nil {
		return nil, ctxErr(ctx, oobconn.Wrapf(err, "couldn't accept the client"))
	}
	return c, nil
}

// bestGID is perftest's get_best_gid_index without -x: the first IPv4
// GID, else index 0.
func bestGID(gids []netip.Addr) int {
	for i, g := range gids {
		if g.Unmap().Is4() {
			return i
		}
	}
	return 0
}

// gidBytes returns a GID's 16 bytes (IPv4 as ::ffff:a.b.c.d).
func gidBytes(a netip.Addr) [16]byte { return a.As16() }

// isV4Mapped is ipv6_addr_v4mapped.
func isV4Mapped(g [16]byte) bool { return netip.AddrFrom16(g).Is4In6() }

// mtuEnum returns the enum ibv_mtu of a path MTU in bytes, 0 if invalid.
func mtuEnum(n int) int {
	if m, ok := verbs.MTUFromBytes(n); ok {
		return int(m)
	}
	return 0
}

// errGIDTypes is ctx_check_gid_compatibility's complaint.
var errGIDTypes = errors.New("found incompatibility issue with GID types: one side uses IPv4, the other IPv6; use the same IP version on both")

// exchange runs a test's out-of-band protocol in perftest's order (the
// main functions of write_bw.c, send_bw.c, write_lat.c, read_lat.c,
// send_lat.c, atomic_lat.c), calling d for the RDMA parts and printing
// with pr. my holds this side's QPs' keys.
func exchange(o *oob, p *params, my []Dest, d driver, pr *printer) ([]Result, error) {
	t := p.Test
	server := p.IsServer()
	rem := make([]Dest, len(my))
	hs := func(i int) error {
		r, err := o.handshake(my[i])
		if err != nil {
			return err
		}
		rem[i] = r
		return nil
	}
	each := func() error {
		for i := range my {
			if err := hs(i); err != nil {
				return err
			}
		}
		return nil
	}
	connect := func() error {
		if isV4Mapped(my[0].GID) != isV4Mapped(rem[0].GID) {
			return errGIDTypes
		}
		return d.connect(rem)
	}
	printLocal := func() {
		for _, m := range my {
			pr.text("%s", addressLine(m, false, t.Verb))
		}
	}
	remote := func() error {
		for i := range my {
			if err := hs(i); err != nil {
				return err
			}
			pr.text("%s", addressLine(rem[i], true, t.Verb))
		}
		return nil
	}
	var results []Result
	emit := func(r *Result) {
		if r != nil {
			pr.result(*r, p.ReportGbits)
			results = append(results, *r)
		}
	}
	head := header(t, p.duration, p.ReportGbits)

	switch {
	case t.Kind == BW && t.Verb != Send:
		if err := each(); err != nil {
			return nil, err
		}
		if err := connect(); err != nil {
			return nil, err
		}
		printLocal()
		if err := remote(); err != nil {
			return nil, err
		}
		// "An additional handshake is required after moving qp to RTR."
		if err := hs(0); err != nil {
			return nil, err
		}
		pr.text("%s", head)
		if server {
			// The server only waits for the client to finish, then
			// prints the client's results.
			r, err := o.awaitPeer(my[0])
			if err != nil {
				return nil, err
			}
			rem[0] = r
			rep, err := o.xchgBWReports(bwReport{Size: uint64(p.sizes[len(p.sizes)-1])})
			if err != nil {
				return nil, err
			}
			unit := "MB/sec"
			if p.ReportGbits {
				unit = "Gb/sec"
			}
			emit(&Result{Test: t.String(), Side: "server", Remote: true, Size: int(rep.Size), Iters: rep.Iters,
				MTU: p.pathMTU, QPs: p.QPs, Duration: p.Duration,
				BW: &BWResult{Unit: unit, Peak: rep.Peak, Avg: rep.Avg, MsgRate: rep.MsgRate}})
			if err := o.closeConn(my[0], false); err != nil {
				return results, err
			}
			pr.text("%s", resultLine)
			return results, nil
		}
		var last bwReport
		for _, size := range p.sizes {
			r, err := d.run(size)
			if err != nil {
				return results, err
			}
			emit(r)
			if r != nil && r.BW != nil {
				last = bwReport{Size: uint64(r.Size), Iters: r.Iters, Peak: r.BW.Peak, Avg: r.BW.Avg, MsgRate: r.BW.MsgRate}
			}
		}
		pr.text("%s", resultLine)
		if err := hs(0); err != nil {
			return results, err
		}
		if _, err := o.xchgBWReports(last); err != nil {
			return results, err
		}
		return results, o.closeConn(my[0], false)

	case t.Kind == BW: // send_bw
		if err := each(); err != nil {
			return nil, err
		}
		if err := connect(); err != nil {
			return nil, err
		}
		if err := hs(0); err != nil {
			return nil, err
		}
		printLocal()
		if err := remote(); err != nil {
			return nil, err
		}
		pr.text("%s", head)
		for _, size := range p.sizes {
			if server {
				if err := d.prepare(size); err != nil {
					return results, err
				}
			}
			if err := hs(0); err != nil {
				return results, err
			}
			r, err := d.run(size)
			if err != nil {
				return results, err
			}
			emit(r)
			// Only the loop over all sizes synchronises after each.
			if p.all {
				if err := hs(0); err != nil {
					return results, err
				}
			}
		}
		pr.text("%s", resultLine)
		return results, o.closeConn(my[0], false)

	case t.Verb == Send: // send_lat
		if err := each(); err != nil {
			return nil, err
		}
		if err := connect(); err != nil {
			return nil, err
		}
		if err := hs(0); err != nil {
			return nil, err
		}
		printLocal()
		if err := remote(); err != nil {
			return nil, err
		}
		pr.text("%s", head)
		for _, size := range p.sizes {
			// Receives first, then the barrier: the client must not send
			// before the server has posted its receives.
			if err := d.prepare(size); err != nil {
				return results, err
			}
			if err := hs(0); err != nil {
				return results, err
			}
			r, err := d.run(size)
			if err != nil {
				return results, err
			}
			emit(r)
		}
		pr.text("%s", resultLine)
		return results, o.closeConn(my[0], false)

	default: // write_lat, read_lat, atomic_lat
		if err := hs(0); err != nil {
			return nil, err
		}
		if err := each(); err != nil {
			return nil, err
		}
		if err := connect(); err != nil {
			return nil, err
		}
		printLocal()
		if err := remote(); err != nil {
			return nil, err
		}
		if err := hs(0); err != nil {
			return nil, err
		}
		passive := t.Verb != Write && server
		if passive {
			// Only the client of read_lat and atomic_lat posts; the
			// server waits for its end.
			if err := o.closeConn(my[0], true); err != nil {
				return nil, err
			}
			pr.text("%s", resultLine)
			return nil, nil
		}
		pr.text("%s", head)
		for _, size := range p.sizes {
			r, err := d.run(size)
			if err != nil {
				return results, err
			}
			emit(r)
		}
		if t.Verb == Write {
			// write_lat ends without another message.
			pr.text("%s", resultLine)
			if a, ok := d.(interface {
				awaitPeerLast(<-chan struct{}, time.Duration)
			}); ok && p.duration {
				gone := make(chan struct{})
				go func() {
					_, _ = io.Copy(io.Discard, o.c) // the peer's exit closes it
					close(gone)
				}()
				a.awaitPeerLast(gone, peerLastWait)
			}
			return results, o.c.Close()
		}
		if err := o.closeConn(my[0], false); err != nil {
			return results, err
		}
		pr.text("%s", resultLine)
		return results, nil
	}
}
