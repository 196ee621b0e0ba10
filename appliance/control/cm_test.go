package control_test

import (
	"bytes"

	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/shmem"
	"github.com/taproce/taproce/verbs/abi"
)

// cmClient speaks the RDMA CM's ops on a control connection of its own,
// as librdmacm's event channel does: replies answer its requests in
// order, events come in between and wait in a queue.
type cmClient struct {
	t      *testing.T
	c      *net.UnixConn
	ev     *net.UnixConn // the event socket (OpCMChannel), when asked for
	seq    uint32
	events []abi.CMEvent
	fds    []int // what the last reply brought
}

func dialCM(t *testing.T, socket string) *cmClient {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &cmClient{t: t, c: c}
}

// channel moves the client's events to a socket of their own.
func (c *cmClient) channel() {
	c.t.Helper()
	var rep abi.ErrnoReply
	c.call(abi.OpCMChannel, nil, &rep)
	if rep.Errno != 0 || len(c.fds) != 1 {
		c.t.Fatalf("cm-channel: %v, %d descriptors", syscall.Errno(rep.Errno), len(c.fds))
	}
	f := os.NewFile(uintptr(c.fds[0]), "cm-events")
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		c.t.Fatal(err)
	}
	c.ev = fc.(*net.UnixConn)
	c.t.Cleanup(func() { c.ev.Close() })
}

// read reads one message within d from the connection, or with events
// from the event socket: an event is queued, a reply returned.
func (c *cmClient) read(d time.Duration, events bool) (abi.Header, []byte, error) {
	buf := make([]byte, abi.MaxMessage)
	conn := c.c
	if events && c.ev != nil {
		conn = c.ev
	}
	_ = conn.SetReadDeadline(time.Now().Add(d))
	n, fds, err := shmem.RecvMsg(conn, buf, 4)
	c.fds = fds
	if err != nil {
		return abi.Header{}, nil, err
	}
	h, body, err := abi.DecodeHeader(buf[:n])
	if err != nil {
		return h, nil, err
	}
	if h.Flags&abi.FlagEvent != 0 {
		var ev abi.CMEvent
		if h.Op != abi.OpCMEvent || abi.DecodeBody(body, &ev) != nil {
			c.t.Fatalf("event %v of %d bytes", h.Op, len(body))
		}
		c.events = append(c.events, ev)
	}
	return h, body, nil
}

// call sends req as op and decodes its reply into rep.
func (c *cmClient) call(op abi.Op, req, rep any) {
	c.t.Helper()
	c.seq++
	msg, err := abi.Encode(nil, abi.Header{Op: op, Seq: c.seq}, req)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := shmem.SendMsg(c.c, msg); err != nil {
		c.t.Fatal(err)
	}
	for {
		h, body, err := c.read(10*time.Second, false)
		if err != nil {
			c.t.Fatalf("%v: %v", op, err)
		}
		if h.Flags&abi.FlagEvent != 0 && c.ev != nil {
			c.t.Fatalf("an event on the connection of a client with an event socket")
		}
		if h.Flags&abi.FlagReply != 0 {
			if h.Op != op || h.Seq != c.seq {
				c.t.Fatalf("reply %v seq %d to %v seq %d", h.Op, h.Seq, op, c.seq)
			}
			if err := abi.DecodeBody(body, rep); err != nil {
				c.t.Fatalf("%v reply: %v", op, err)
			}
			return
		}
	}
}

// errnoOf calls op and returns its errno.
func (c *cmClient) errnoOf(op abi.Op, req any) syscall.Errno {
	c.t.Helper()
	var rep abi.ErrnoReply
	c.call(op, req, &rep)
	return syscall.Errno(rep.Errno)
}

func (c *cmClient) create(ctx uint64, ps uint16, qt abi.QPType) uint32 {
	c.t.Helper()
	var rep abi.CMIDReply
	c.call(abi.OpCMCreateID, &abi.CMCreateIDRequest{Context: ctx, PortSpace: ps, QPType: uint8(qt)}, &rep)
	if rep.Errno != 0 {
		c.t.Fatalf("create-id: %v", syscall.Errno(rep.Errno))
	}
	return rep.ID
}

// event returns the next event, which must be of type want for ID id (0:
// any ID).
func (c *cmClient) event(want uint32, id uint32) abi.CMEvent {
	c.t.Helper()
	for len(c.events) == 0 {
		if _, _, err := c.read(10*time.Second, true); err != nil {
			c.t.Fatalf("waiting for event %d: %v", want, err)
		}
	}
	ev := c.events[0]
	c.events = c.events[1:]
	if ev.Event != want || (id != 0 && ev.ID != id) {
		c.t.Fatalf("event %d for ID %d (status %d), want %d for ID %d", ev.Event, ev.ID, ev.Status, want, id)
	}
	return ev
}

func sa(a netip.Addr, port uint16) abi.SockAddr {
	return abi.SockAddr{Family: abi.AFInet, Port: port, Addr: a.As16()}
}

func private(s string) (p abi.CMConnParam) {
	p.PrivateDataLen = uint8(copy(p.PrivateData[:], s))
	return p
}

// TestRDMACM runs the RDMA CM's ops as librdmacm's rping does them, a
// server and a client on two control connections, over the appliance's two
// ports (fake wire and local switch): bind and listen, resolve address
// and route, a REJ with reason 8 from a port nobody listens on, connect
// with private data, accept, the QP attributes of
// INIT, RTR and RTS that each side's init_qp_attr gives (each side's send
// PSN the other's receive PSN), establish, disconnect from both sides, and
// destroy; then a client whose connection ends without a disconnect
// leaves its peer a DISCONNECTED.
func TestRDMACM(t *testing.T) {
	for _, local := range []bool{false, true} {
		name := "fake wire"
		if local {
			name = "local switch"
		}
		t.Run(name, func(t *testing.T) {
			rig := appliancetest.New(t, appliancetest.Options{LocalSwitch: local, Namespace: "cm"})
			a, b := rig.Addrs[0], rig.Addrs[1]
			srv, cli := dialCM(t, rig.Socket), dialCM(t, rig.Socket)
			srv.channel() // the server's events on a socket of their own, the client's on its connection

			lid := srv.create(0x5e, abi.CMPortSpaceTCP, abi.RC)
			if e := srv.errnoOf(abi.OpCMBind, &abi.CMAddrRequest{ID: lid, Src: sa(netip.IPv4Unspecified(), 7471)}); e != 0 {
				t.Fatalf("bind: %v", e)
			}
			if e := srv.errnoOf(abi.OpCMListen, &abi.CMIDRequest{ID: lid}); e != 0 {
				t.Fatalf("listen: %v", e)
			}
			// A second listener on the port: EADDRINUSE, as the kernel's.
			l2 := srv.create(0, abi.CMPortSpaceTCP, abi.RC)
			srv.errnoOf(abi.OpCMBind, &abi.CMAddrRequest{ID: l2, Src: sa(netip.IPv4Unspecified(), 7471)})
			if e := srv.errnoOf(abi.OpCMListen, &abi.CMIDRequest{ID: l2}); e != syscall.EADDRINUSE {
				t.Errorf("second listener: %v, want EADDRINUSE", e)
			}

			cid := cli.create(0xc1, abi.CMPortSpaceTCP, abi.RC)
			if e := cli.errnoOf(abi.OpCMConnect, &abi.CMConnectRequest{ID: cid}); e != syscall.EINVAL {
				t.Errorf("connect before resolving: %v, want EINVAL", e)
			}
			if e := cli.errnoOf(abi.OpCMBind, &abi.CMAddrRequest{ID: cid, Src: sa(netip.MustParseAddr("10.1.2.3"), 0)}); e != syscall.EADDRNOTAVAIL {
				t.Errorf("bind to an address no port has: %v, want EADDRNOTAVAIL", e)
			}
			if e := cli.errnoOf(abi.OpCMResolveAddr, &abi.CMAddrRequest{ID: cid, TimeoutMs: 2000, Src: sa(a, 0), Dst: sa(b, 7471)}); e != 0 {
				t.Fatalf("resolve-addr: %v", e)
			}
			if ev := cli.event(abi.CMEventAddrResolved, cid); ev.Context != 0xc1 {
				t.Errorf("ADDR_RESOLVED context %#x", ev.Context)
			}
			if e := cli.errnoOf(abi.OpCMResolveRoute, &abi.CMIDRequest{ID: cid, Arg: 2000}); e != 0 {
				t.Fatalf("resolve-route: %v", e)
			}
			cli.event(abi.CMEventRouteResolved, cid)
			var q abi.CMQueryReply
			cli.call(abi.OpCMQuery, &abi.CMIDRequest{ID: cid}, &q)
			if q.Errno != 0 || q.Device.String() != "taproce0" || q.PathMTU != uint8(abi.MTU1024) || netip.AddrFrom16(q.DGID).Unmap() != b {
				t.Errorf("query: %+v", q)
			}

			// A port nobody listens on: the peer's CM rejects the REQ with
			// reason 8, invalid service ID, as Linux's does.
			nid := cli.create(0, abi.CMPortSpaceTCP, abi.RC)
			cli.errnoOf(abi.OpCMResolveAddr, &abi.CMAddrRequest{ID: nid, Src: sa(a, 0), Dst: sa(b, 7999)})
			cli.event(abi.CMEventAddrResolved, nid)
			cli.errnoOf(abi.OpCMResolveRoute, &abi.CMIDRequest{ID: nid})
			cli.event(abi.CMEventRouteResolved, nid)
			if e := cli.errnoOf(abi.OpCMConnect, &abi.CMConnectRequest{ID: nid, Param: private("anyone?")}); e != 0 {
				t.Fatalf("connect to a port nobody listens on: %v", e)
			}
			if rej := cli.event(abi.CMEventRejected, nid); rej.Status != 8 {
				t.Errorf("REJECTED with status %d, want 8 (invalid service ID)", rej.Status)
			}
			var dr abi.CMDestroyReply
			cli.call(abi.OpCMDestroyID, &abi.CMIDRequest{ID: nid}, &dr)

			// Another session may not use the client's ID.
			if e := srv.errnoOf(abi.OpCMDisconnect, &abi.CMIDRequest{ID: cid + 100}); e != syscall.EINVAL {
				t.Errorf("an ID the session does not have: %v, want EINVAL", e)
			}

			attrs := func(c *cmClient, id uint32, st abi.QPState) abi.CMInitQPAttrReply {
				t.Helper()
				var r abi.CMInitQPAttrReply
				c.call(abi.OpCMInitQPAttr, &abi.CMIDRequest{ID: id, Arg: uint32(st)}, &r)
				if r.Errno != 0 || r.Attr.State != uint8(st) || r.Mask&uint32(abi.QPStateMask) == 0 {
					t.Fatalf("init-qp-attr %v: %+v", st, r)
				}
				return r
			}
			cp := private("hello, rping")
			cp.QPN, cp.ResponderResources, cp.InitiatorDepth, cp.RetryCount, cp.RNRRetryCount = 0x111, 1, 1, 7, 7
			if e := cli.errnoOf(abi.OpCMConnect, &abi.CMConnectRequest{ID: cid, Param: cp}); e != 0 {
				t.Fatalf("connect: %v", e)
			}
			req := srv.event(abi.CMEventConnectRequest, 0)
			if req.Listener != lid || req.Context != 0x5e || req.Param.QPN != 0x111 ||
				!bytes.HasPrefix(req.Param.PrivateData[:req.Param.PrivateDataLen], []byte("hello, rping")) {
				t.Fatalf("connect request %+v", req)
			}
			if s, ok := addrOf(req.Src); !ok || s.Addr() != b || s.Port() != 7471 {
				t.Errorf("connect request's local address %v", s)
			}
			if d, ok := addrOf(req.Dst); !ok || d.Addr() != a {
				t.Errorf("connect request's remote address %v", d)
			}
			sid := req.ID
			// librdmacm's rdma_accept moves the QP to RTR and RTS before the
			// REP: the attributes are the same before the accept as after.
			earlyRTR, earlyRTS := attrs(srv, sid, abi.QPSRTR), attrs(srv, sid, abi.QPSRTS)
			ap := private("welcome")
			ap.QPN, ap.ResponderResources, ap.InitiatorDepth, ap.RNRRetryCount = 0x222, 1, 1, 7
			if e := srv.errnoOf(abi.OpCMAccept, &abi.CMConnectRequest{ID: sid, Param: ap}); e != 0 {
				t.Fatalf("accept: %v", e)
			}
			rep := cli.event(abi.CMEventConnectResponse, cid)
			if rep.Param.QPN != 0x222 || !bytes.HasPrefix(rep.Param.PrivateData[:rep.Param.PrivateDataLen], []byte("welcome")) {
				t.Fatalf("connect response %+v", rep.Param)
			}

			ci, si := attrs(cli, cid, abi.QPSInit), attrs(srv, sid, abi.QPSInit)
			if ci.Attr.Access&uint32(abi.AccessRemoteRead) == 0 || si.Attr.Port != 1 {
				t.Errorf("INIT: client %+v, server %+v", ci.Attr, si.Attr)
			}
			cr, sr := attrs(cli, cid, abi.QPSRTR), attrs(srv, sid, abi.QPSRTR)
			cs, ss := attrs(cli, cid, abi.QPSRTS), attrs(srv, sid, abi.QPSRTS)
			switch {
			case cr.Attr.DestQPN != 0x222 || sr.Attr.DestQPN != 0x111:
				t.Errorf("RTR dest QPNs %#x, %#x", cr.Attr.DestQPN, sr.Attr.DestQPN)
			case cs.Attr.SQPSN != sr.Attr.RQPSN || ss.Attr.SQPSN != cr.Attr.RQPSN:
				t.Errorf("PSNs: client sends from %#x, server expects %#x; server sends from %#x, client expects %#x",
					cs.Attr.SQPSN, sr.Attr.RQPSN, ss.Attr.SQPSN, cr.Attr.RQPSN)
			case netip.AddrFrom16(cr.Attr.DGID).Unmap() != b || netip.AddrFrom16(sr.Attr.DGID).Unmap() != a:
				t.Errorf("RTR DGIDs %v, %v", netip.AddrFrom16(cr.Attr.DGID), netip.AddrFrom16(sr.Attr.DGID))
			case earlyRTR != sr || earlyRTS != ss:
				t.Errorf("the server's attributes before its accept: RTR %+v, RTS %+v; after: %+v, %+v", earlyRTR.Attr, earlyRTS.Attr, sr.Attr, ss.Attr)
			case cr.Attr.PathMTU != uint8(abi.MTU1024) || cs.Attr.RetryCnt != 7 || cs.Attr.RNRRetry != 7 || cs.Attr.MaxRdAtomic != 1:
				t.Errorf("RTR/RTS: %+v %+v", cr.Attr, cs.Attr)
			}

			if e := cli.errnoOf(abi.OpCMEstablish, &abi.CMIDRequest{ID: cid}); e != 0 {
				t.Fatalf("establish: %v", e)
			}
			srv.event(abi.CMEventEstablished, sid)

			if e := cli.errnoOf(abi.OpCMDisconnect, &abi.CMIDRequest{ID: cid}); e != 0 {
				t.Fatalf("disconnect: %v", e)
			}
			srv.event(abi.CMEventDisconnected, sid)
			if e := srv.errnoOf(abi.OpCMDisconnect, &abi.CMIDRequest{ID: sid}); e != 0 {
				t.Fatalf("server's disconnect: %v", e)
			}
			cli.event(abi.CMEventDisconnected, cid)
			var d abi.CMDestroyReply
			cli.call(abi.OpCMDestroyID, &abi.CMIDRequest{ID: cid}, &d)
			if d.Errno != 0 || d.EventsReported != 4 { // ADDR_RESOLVED, ROUTE_RESOLVED, CONNECT_RESPONSE, DISCONNECTED
				t.Errorf("destroy: %+v, want 4 events reported", d)
			}
			srv.call(abi.OpCMDestroyID, &abi.CMIDRequest{ID: sid}, &d)

			// A client that goes while connected: its peer hears DISCONNECTED.
			cli2 := dialCM(t, rig.Socket)
			c2 := cli2.create(0, abi.CMPortSpaceTCP, abi.RC)
			cli2.errnoOf(abi.OpCMResolveAddr, &abi.CMAddrRequest{ID: c2, Src: sa(a, 0), Dst: sa(b, 7471)})
			cli2.event(abi.CMEventAddrResolved, c2)
			cli2.errnoOf(abi.OpCMResolveRoute, &abi.CMIDRequest{ID: c2})
			cli2.event(abi.CMEventRouteResolved, c2)
			cp.QPN = 0x333
			if e := cli2.errnoOf(abi.OpCMConnect, &abi.CMConnectRequest{ID: c2, Param: cp}); e != 0 {
				t.Fatalf("connect: %v", e)
			}
			req = srv.event(abi.CMEventConnectRequest, 0)
			ap.QPN = 0x444
			srv.errnoOf(abi.OpCMAccept, &abi.CMConnectRequest{ID: req.ID, Param: ap})
			cli2.event(abi.CMEventConnectResponse, c2)
			cli2.errnoOf(abi.OpCMEstablish, &abi.CMIDRequest{ID: c2})
			srv.event(abi.CMEventEstablished, req.ID)
			cli2.c.Close()
			srv.event(abi.CMEventDisconnected, req.ID)
		})
	}
}

// addrOf is the address of a SockAddr.
func addrOf(s abi.SockAddr) (netip.AddrPort, bool) {
	switch s.Family {
	case abi.AFInet:
		return netip.AddrPortFrom(netip.AddrFrom16(s.Addr).Unmap(), s.Port), true
	case abi.AFInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(s.Addr), s.Port), true
	}
	return netip.AddrPort{}, false
}

// callFds is call with descriptors sent along.
func (c *cmClient) callFds(op abi.Op, req, rep any, fds ...int) {
	c.t.Helper()
	c.seq++
	msg, err := abi.Encode(nil, abi.Header{Op: op, Seq: c.seq}, req)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := shmem.SendMsg(c.c, msg, fds...); err != nil {
		c.t.Fatal(err)
	}
	for {
		h, body, err := c.read(10*time.Second, false)
		if err != nil {
			c.t.Fatalf("%v: %v", op, err)
		}
		if h.Flags&abi.FlagReply != 0 {
			if err := abi.DecodeBody(body, rep); err != nil {
				c.t.Fatalf("%v reply: %v", op, err)
			}
			return
		}
	}
}

// evFd returns a descriptor of the client's end of its event socket, as
// librdmacm has it as the channel's fd.
func (c *cmClient) evFd() int {
	c.t.Helper()
	f, err := c.ev.File()
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

// migrate moves ID id of channel from to c (rdma_migrate_id).
func (c *cmClient) migrate(from *cmClient, id uint32) abi.CMMigrateReply {
	c.t.Helper()
	var rep abi.CMMigrateReply
	c.callFds(abi.OpCMMigrateID, &abi.CMIDRequest{ID: id}, &rep, from.evFd())
	if rep.Errno != 0 {
		c.t.Fatalf("migrate ID %d: %v", id, syscall.Errno(rep.Errno))
	}
	return rep
}

// TestCMBind: rdma_bind_addr with port 0 gets its ephemeral port at once,
// as the kernel's does (qperf's server tells its client the port between
// bind and listen); a bind to a loopback address binds no device, as the
// kernel's cma_any_addr has it, and its listener takes requests for any
// address of the family (libfabric's verbs provider binds to localhost).
func TestCMBind(t *testing.T) {
	rig := appliancetest.New(t, appliancetest.Options{Namespace: "cm"})
	a, b := rig.Addrs[0], rig.Addrs[1]
	srv, cli := dialCM(t, rig.Socket), dialCM(t, rig.Socket)
	srv.channel()

	lid := srv.create(0, abi.CMPortSpaceTCP, abi.RC)
	if e := srv.errnoOf(abi.OpCMBind, &abi.CMAddrRequest{ID: lid, Src: sa(netip.MustParseAddr("127.0.0.1"), 0)}); e != 0 {
		t.Fatalf("bind to 127.0.0.1: %v", e)
	}
	var q abi.CMQueryReply
	srv.call(abi.OpCMQuery, &abi.CMIDRequest{ID: lid}, &q)
	src, ok := addrOf(q.Src)
	if q.Errno != 0 || !ok || src.Addr() != netip.MustParseAddr("127.0.0.1") || src.Port() == 0 || q.Device.String() != "" {
		t.Fatalf("bound to 127.0.0.1:0: %+v (source %v), want a port and no device", q, src)
	}
	if e := srv.errnoOf(abi.OpCMListen, &abi.CMIDRequest{ID: lid}); e != 0 {
		t.Fatalf("listen: %v", e)
	}

	cid := cli.create(0, abi.CMPortSpaceTCP, abi.RC)
	cli.errnoOf(abi.OpCMResolveAddr, &abi.CMAddrRequest{ID: cid, Src: sa(a, 0), Dst: sa(b, src.Port())})
	cli.event(abi.CMEventAddrResolved, cid)
	cli.errnoOf(abi.OpCMResolveRoute, &abi.CMIDRequest{ID: cid})
	cli.event(abi.CMEventRouteResolved, cid)
	if e := cli.errnoOf(abi.OpCMConnect, &abi.CMConnectRequest{ID: cid}); e != 0 {
		t.Fatalf("connect: %v", e)
	}
	if req := srv.event(abi.CMEventConnectRequest, 0); req.Listener != lid {
		t.Errorf("connect request for listener %d, want %d", req.Listener, lid)
	}

	any := srv.create(0, abi.CMPortSpaceTCP, abi.RC)
	srv.errnoOf(abi.OpCMBind, &abi.CMAddrRequest{ID: any, Src: sa(netip.IPv4Unspecified(), 0)})
	srv.call(abi.OpCMQuery, &abi.CMIDRequest{ID: any}, &q)
	if p, _ := addrOf(q.Src); p.Port() == 0 || p.Port() == src.Port() {
		t.Errorf("bound to 0.0.0.0:0: port %d (the first bind's %d)", p.Port(), src.Port())
	}
}

// TestCMMigrate moves IDs between event channels (rdma_migrate_id): a
// listener, whose connect requests then come to its new channel; an ID
// resolved on a channel of its own (as librdmacm's synchronous IDs are,
// and libfabric's verbs provider migrates), which connects from its new
// channel; and a connected ID, whose DISCONNECTED comes to its new channel
// under its new handle. A descriptor that is no event channel's, or an ID
// the old channel does not have, is EINVAL.
func TestCMMigrate(t *testing.T) {
	rig := appliancetest.New(t, appliancetest.Options{Namespace: "cm"})
	a, b := rig.Addrs[0], rig.Addrs[1]
	srvOld, srv := dialCM(t, rig.Socket), dialCM(t, rig.Socket)
	srvOld.channel()
	srv.channel()

	lid := srvOld.create(0x1, abi.CMPortSpaceTCP, abi.RC)
	srvOld.errnoOf(abi.OpCMBind, &abi.CMAddrRequest{ID: lid, Src: sa(b, 7480)})
	if e := srvOld.errnoOf(abi.OpCMListen, &abi.CMIDRequest{ID: lid}); e != 0 {
		t.Fatalf("listen: %v", e)
	}
	ml := srv.migrate(srvOld, lid)
	if ml.EventsReported != 0 {
		t.Errorf("listener migrated with %d events reported", ml.EventsReported)
	}

	cliOld, cli := dialCM(t, rig.Socket), dialCM(t, rig.Socket)
	cliOld.channel()
	cli.channel()
	cid := cliOld.create(0x2, abi.CMPortSpaceTCP, abi.RC)
	cliOld.errnoOf(abi.OpCMResolveAddr, &abi.CMAddrRequest{ID: cid, Src: sa(a, 0), Dst: sa(b, 7480)})
	cliOld.event(abi.CMEventAddrResolved, cid)
	cliOld.errnoOf(abi.OpCMResolveRoute, &abi.CMIDRequest{ID: cid})
	cliOld.event(abi.CMEventRouteResolved, cid)
	mc := cli.migrate(cliOld, cid)
	if mc.EventsReported != 2 {
		t.Errorf("resolved ID migrated with %d events reported, want 2", mc.EventsReported)
	}
	if e := cliOld.errnoOf(abi.OpCMConnect, &abi.CMConnectRequest{ID: cid}); e != syscall.EINVAL {
		t.Errorf("connect on the old channel: %v, want EINVAL", e)
	}
	cp := private("moved")
	cp.QPN = 0x555
	if e := cli.errnoOf(abi.OpCMConnect, &abi.CMConnectRequest{ID: mc.ID, Param: cp}); e != 0 {
		t.Fatalf("connect on the new channel: %v", e)
	}
	req := srv.event(abi.CMEventConnectRequest, 0)
	if req.Listener != ml.ID || req.Context != 0x1 || req.Param.QPN != 0x555 {
		t.Fatalf("connect request %+v, want one for listener %d", req, ml.ID)
	}
	ap := private("ok")
	ap.QPN = 0x666
	if e := srv.errnoOf(abi.OpCMAccept, &abi.CMConnectRequest{ID: req.ID, Param: ap}); e != 0 {
		t.Fatalf("accept: %v", e)
	}
	if rep := cli.event(abi.CMEventConnectResponse, mc.ID); rep.Context != 0x2 || rep.Param.QPN != 0x666 {
		t.Errorf("connect response %+v", rep)
	}
	cli.errnoOf(abi.OpCMEstablish, &abi.CMIDRequest{ID: mc.ID})
	srv.event(abi.CMEventEstablished, req.ID)

	// The connected ID moves on to a third channel; the server's
	// disconnect reaches it there.
	cli3 := dialCM(t, rig.Socket)
	cli3.channel()
	m3 := cli3.migrate(cli, mc.ID)
	if m3.EventsReported != 3 {
		t.Errorf("connected ID migrated with %d events reported, want 3", m3.EventsReported)
	}
	srv.errnoOf(abi.OpCMDisconnect, &abi.CMIDRequest{ID: req.ID})
	cli3.event(abi.CMEventDisconnected, m3.ID)
	var d abi.CMDestroyReply
	cli3.call(abi.OpCMDestroyID, &abi.CMIDRequest{ID: m3.ID}, &d)
	if d.Errno != 0 || d.EventsReported != 4 {
		t.Errorf("destroy: %+v, want 4 events reported", d)
	}

	var rep abi.CMMigrateReply
	cli.callFds(abi.OpCMMigrateID, &abi.CMIDRequest{ID: 999}, &rep, cli3.evFd())
	if syscall.Errno(rep.Errno) != syscall.EINVAL {
		t.Errorf("an ID the channel does not have: %v, want EINVAL", syscall.Errno(rep.Errno))
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	cli.callFds(abi.OpCMMigrateID, &abi.CMIDRequest{ID: m3.ID}, &rep, int(devnull.Fd()))
	if syscall.Errno(rep.Errno) != syscall.EINVAL {
		t.Errorf("a descriptor of no event channel: %v, want EINVAL", syscall.Errno(rep.Errno))
	}
}
