package control

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/shmem"
	"github.com/taproce/taproce/verbs/abi"
)

// session is one client connection and everything it made.
type session struct {
	srv   *Server
	conn  *net.UnixConn
	pid   int32
	uid   uint32
	netns uint64
	log   *slog.Logger

	wmu     sync.Mutex   // serialises writes to conn and evconn
	pending atomic.Int32 // events on their way to the client
	// evconn, when the client asked for it (abi.OpenEventSocket), is
	// where its events go instead of conn; set once, at open.
	evconn atomic.Pointer[net.UnixConn]
	// evIno is the inode of the client's end of evconn, by which a
	// request that brings that end names the session (OpCMMigrateID).
	evIno atomic.Uint64
	// closeAfterReply is a descriptor the reply being sent hands over
	// and the session must then close (-1: none); the session's reader
	// goroutine owns it.
	closeAfterReply int

	mu      sync.Mutex
	dev     *Device
	kick    *shmem.Doorbell // the client rings it after posting to a sleeping appliance
	next    abi.Handle
	pds     map[abi.Handle]*pdObj
	mrs     map[abi.Handle]*mrObj
	chans   map[abi.Handle]*chanObj
	cqs     map[abi.Handle]*cqObj
	qps     map[abi.Handle]*qpObj
	srqs    map[abi.Handle]*srqObj
	ahs     map[abi.Handle]*ahObj
	mrBytes int64
	gone    bool // the device was withdrawn

	ctx    context.Context
	cancel context.CancelFunc
	unpoll func()                     // takes pollOnce out of the server's loop (Config.Loop); under mu
	rings  atomic.Pointer[[]ringWork] // what the poller drains, rebuilt on change
	// cm is the session's RDMA CM state (cm.go), under cmMu.
	cmMu sync.Mutex
	cm   cmState
	cmQ  chan cmItem // CM events on their way, in order (cmSender); set once, under cmMu

	// opened is dev, for readers that must not wait for ss.mu: a port's
	// link events, delivered on the appliance's polling loop, while a
	// teardown may hold ss.mu for seconds.
	opened atomic.Pointer[Device]
}

// newSession makes the session of the client pid of user uid on c.
func (s *Server) newSession(c *net.UnixConn, pid int32, uid uint32) (*session, error) {
	ns, err := s.cfg.PeerNetns(pid)
	if err != nil {
		return nil, err
	}
	ss, err := s.newSessionFor(c, ns)
	if err != nil {
		return nil, err
	}
	ss.pid, ss.uid, ss.log = pid, uid, s.log.With("pid", pid, "uid", uid)
	return ss, nil
}

// newSessionFor makes the session of a client in namespace ns.
func (s *Server) newSessionFor(c *net.UnixConn, ns uint64) (*session, error) {
	ctx, cancel := context.WithCancel(context.Background())
	ss := &session{
		srv: s, conn: c, netns: ns, log: s.log,
		pds: map[abi.Handle]*pdObj{}, mrs: map[abi.Handle]*mrObj{}, chans: map[abi.Handle]*chanObj{},
		cqs: map[abi.Handle]*cqObj{}, qps: map[abi.Handle]*qpObj{}, srqs: map[abi.Handle]*srqObj{},
		ahs: map[abi.Handle]*ahObj{}, ctx: ctx, cancel: cancel, closeAfterReply: -1,
	}
	empty := []ringWork{}
	ss.rings.Store(&empty)
	return ss, nil
}

// device returns the device the client opened, nil before; it never
// waits for ss.mu.
func (ss *session) device() *Device { return ss.opened.Load() }

// requestBuf holds the largest request: each session reads into a
// buffer of its own, and one of abi.MaxMessage (64 KiB) made a thousand
// idle connections cost 64 MiB. A longer message is malformed
// (shmem.ErrTruncated) and ends the session.
var requestBuf = abi.HeaderLen + maxSize(&abi.OpenRequest{}, &abi.RegMRRequest{}, &abi.RegMRSegmentsRequest{}, &abi.CreateCQRequest{},
	&abi.CreateQPRequest{}, &abi.ModifyQPRequest{}, &abi.HandleRequest{}, &abi.CreateSRQRequest{},
	&abi.ModifySRQRequest{}, &abi.CreateAHRequest{}, &abi.CMCreateIDRequest{}, &abi.CMIDRequest{}, &abi.CMAddrRequest{},
	&abi.CMConnectRequest{})

// maxSize returns the largest encoded size of vs.
func maxSize(vs ...any) int {
	n := 0
	for _, v := range vs {
		n = max(n, binary.Size(v))
	}
	return n
}

// maxRequestFds is the most descriptors a request may bring; more end
// the session (shmem.ErrTruncated), and the kernel closes what did not
// fit.
const maxRequestFds = abi.MaxMRSegments

// run serves the client's requests until it goes, then destroys its
// objects.
func (ss *session) run() {
	defer ss.teardown()
	buf := make([]byte, requestBuf)
	for {
		n, fds, err := shmem.RecvMsg(ss.conn, buf, maxRequestFds)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				ss.log.Debug("client gone", "err", err)
			}
			return
		}
		h, body, err := abi.DecodeHeader(buf[:n])
		if err != nil || h.Flags != 0 {
			closeFds(fds)
			ss.log.Warn("bad message, client disconnected", "err", err)
			return
		}
		in := received(fds)
		reply, rfds, err := ss.handle(h.Op, body, in)
		// What the request brought and its op did not keep is closed
		// before the reply goes, whatever the answer: a client cannot
		// make the appliance hold descriptors by attaching them.
		in.close()
		if err != nil {
			ss.log.Warn("bad request, client disconnected", "op", h.Op, "err", err)
			return
		}
		msg, err := abi.Encode(nil, abi.Header{Op: h.Op, Flags: abi.FlagReply, Seq: h.Seq}, reply)
		if err == nil {
			err = ss.send(msg, rfds...)
		}
		if ss.closeAfterReply >= 0 {
			_ = syscall.Close(ss.closeAfterReply) // the client's end of the event socket, sent
			ss.closeAfterReply = -1
		}
		if err != nil {
			ss.log.Debug("reply failed", "err", err)
			return
		}
	}
}

// send sends a message within the reply timeout. A client that leaves
// its replies unread for that long is disconnected: its session would
// otherwise hold a reply, a goroutine and its objects for as long as it
// liked.
func (ss *session) send(msg []byte, fds ...int) error {
	return ss.sendOn(ss.conn, msg, fds...)
}

// sendOn is send on c, the control connection or the event socket; a
// client that leaves either unread is disconnected.
func (ss *session) sendOn(c *net.UnixConn, msg []byte, fds ...int) error {
	ss.wmu.Lock()
	defer ss.wmu.Unlock()
	_ = c.SetWriteDeadline(time.Now().Add(ss.srv.cfg.ReplyTimeout))
	err := shmem.SendMsg(c, msg, fds...)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		ss.log.Warn("client left its replies or events unread; disconnected", "timeout", ss.srv.cfg.ReplyTimeout)
		ss.conn.Close() // ends run, which tears the session down
	}
	return err
}

// maxPendingEvents bounds the events on their way to one client; a
// client that lets more pile up is not reading them, and is
// disconnected.
const maxPendingEvents = 64

// event sends an asynchronous event, on the event socket when the client
// has one; a client that is gone misses it.
func (ss *session) event(typ uint32, h abi.Handle) {
	msg, err := abi.Encode(nil, abi.Header{Op: abi.OpEvent, Flags: abi.FlagEvent}, &abi.Event{Type: typ, Handle: h, Port: 1})
	if err != nil {
		return
	}
	if ss.pending.Add(1) > maxPendingEvents {
		ss.pending.Add(-1)
		ss.log.Warn("client left its events unread; disconnected", "events", maxPendingEvents)
		ss.conn.Close()
		return
	}
	go func() { // never block an engine callback on the socket
		defer ss.pending.Add(-1)
		if ev := ss.evconn.Load(); ev != nil {
			_ = ss.sendOn(ev, msg)
			return
		}
		_ = ss.send(msg)
	}()
}

// eventSocket makes the session's event socket (abi.OpenEventSocket) and
// returns the client's end, which the caller sends and then closes.
func (ss *session) eventSocket() (int, error) {
	if ss.evconn.Load() != nil {
		return -1, errno(syscall.EBUSY, "the event socket exists")
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("control: event socket: %w", err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fds[1], &st); err != nil {
		closeFds(fds[:])
		return -1, fmt.Errorf("control: event socket: %w", err)
	}
	f := os.NewFile(uintptr(fds[0]), "events")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		syscall.Close(fds[1])
		return -1, fmt.Errorf("control: event socket: %w", err)
	}
	ss.evIno.Store(st.Ino)
	ss.evconn.Store(c.(*net.UnixConn))
	return fds[1], nil
}

func closeFds(fds []int) {
	for _, fd := range fds {
		_ = syscall.Close(fd)
	}
}

// received are the descriptors a request brought. The op that keeps one
// takes it; the session closes the rest once the request is handled, on
// every path, so that what a client attaches cannot pile up here.
type received []int

// take hands descriptor i over to the caller, who then owns it.
func (r received) take(i int) int {
	fd := r[i]
	r[i] = -1
	return fd
}

// close closes the descriptors not taken.
func (r received) close() {
	for i, fd := range r {
		if fd >= 0 {
			_ = syscall.Close(fd)
			r[i] = -1
		}
	}
}

// errno makes an errno reply error.
func errno(e syscall.Errno, format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{e}, args...)...)
}

// handle dispatches one request. It returns the reply body and the fds to
// send with it; an error means the request was malformed and the client
// is cut off. A verbs failure is not an error here: it is an errno in the
// reply. The op that keeps a descriptor of fds takes it (reg-mr, its
// region's memfd); the caller closes the others.
func (ss *session) handle(op abi.Op, body []byte, fds received) (any, []int, error) {
	if op == abi.OpEvent {
		return nil, nil, fmt.Errorf("%w: events go to clients, not from them", abi.ErrOp)
	}
	if op == abi.OpRegMRSegments {
		if len(fds) == 0 || len(fds) > abi.MaxMRSegments {
			return nil, nil, fmt.Errorf("%w: %v with %d descriptors, it takes 1 to %d", errDescriptors, op, len(fds), abi.MaxMRSegments)
		}
	} else if want := fdsOf(op); len(fds) != want {
		return nil, nil, fmt.Errorf("%w: %v with %d descriptors, it takes %d", errDescriptors, op, len(fds), want)
	}
	decode := func(v any) error { return abi.DecodeBody(body, v) }
	if op >= abi.OpCMCreateID && op <= abi.OpCMInitQPAttr || op == abi.OpCMNotify {
		// The RDMA CM's ops need no opened device (an event channel).
		reply, err := ss.cmHandle(op, decode)
		return reply, nil, err
	}
	if op == abi.OpCMEvent {
		return nil, nil, fmt.Errorf("%w: events go to clients, not from them", abi.ErrOp)
	}
	if op == abi.OpCMMigrateID {
		var r abi.CMIDRequest
		if err := decode(&r); err != nil {
			return nil, nil, err
		}
		return ss.cmMigrate(fds[0], r.ID), nil, nil
	}
	if op == abi.OpCMChannel {
		if len(body) != 0 {
			return nil, nil, abi.ErrLength
		}
		theirs, err := ss.eventSocket()
		if err != nil {
			return &abi.ErrnoReply{Errno: abi.ErrnoOf(err)}, nil, nil
		}
		ss.closeAfterReply = theirs
		return &abi.ErrnoReply{}, []int{theirs}, nil
	}
	if op != abi.OpListDevices && op != abi.OpOpen {
		ss.mu.Lock()
		opened := ss.dev != nil
		ss.mu.Unlock()
		if !opened {
			return &abi.ErrnoReply{Errno: abi.Errno(syscall.EBADF)}, nil, nil
		}
	}
	switch op {
	case abi.OpListDevices:
		if len(body) != 0 {
			return nil, nil, abi.ErrLength
		}
		return ss.listDevices(), nil, nil
	case abi.OpOpen:
		var r abi.OpenRequest
		if err := decode(&r); err != nil {
			return nil, nil, err
		}
		rep, fd, err := ss.open(r.Name.String())
		if err != nil {
			return &abi.OpenReply{Errno: abi.ErrnoOf(err)}, nil, nil
		}
		if r.Flags&abi.OpenEventSocket == 0 {
			return rep, []int{fd}, nil
		}
		theirs, err := ss.eventSocket()
		if err != nil {
			return &abi.OpenReply{Errno: abi.ErrnoOf(err)}, nil, nil
		}
		ss.closeAfterReply = theirs
		return rep, []int{fd, theirs}, nil
	case abi.OpQueryPort:
		if len(body) != 0 {
			return nil, nil, abi.ErrLength
		}
		return &abi.QueryPortReply{Port: portAttr(ss.device())}, nil, nil
	case abi.OpAllocPD:
		if len(body) != 0 {
			return nil, nil, abi.ErrLength
		}
		h, err := ss.allocPD()
		return &abi.HandleReply{Errno: abi.ErrnoOf(err), Handle: h}, nil, nil
	case abi.OpRegMR:
		var r abi.RegMRRequest
		if err := decode(&r); err != nil {
			return nil, nil, err
		}
		rep, err := ss.regMR(&r, fds)
		if err != nil {
			return &abi.RegMRReply{Errno: abi.ErrnoOf(err)}, nil, nil
		}
		return rep, nil, nil
	case abi.OpRegMRSegments:
		var r abi.RegMRSegmentsRequest
		if err := decode(&r); err != nil {
			return nil, nil, err
		}
		if int(r.NumSegments) != len(fds) {
			return nil, nil, fmt.Errorf("%w: %v of %d segments with %d descriptors", errDescriptors, op, r.NumSegments, len(fds))
		}
		rep, err := ss.regMRSegments(&r, fds)
		if err != nil {
			return &abi.RegMRReply{Errno: abi.ErrnoOf(err)}, nil, nil
		}
		return rep, nil, nil
	case abi.OpCreateChannel:
		if len(body) != 0 {
			return nil, nil, abi.ErrLength
		}
		h, fd, err := ss.createChannel()
		if err != nil {
			return &abi.HandleReply{Errno: abi.ErrnoOf(err)}, nil, nil
		}
		return &abi.HandleReply{Handle: h}, []int{fd}, nil
	case abi.OpCreateCQ:
		var r abi.CreateCQRequest
		if err := decode(&r); err != nil {
			return nil, nil, err
		}
		rep, fd, err := ss.createCQ(&r)
		if err != nil {
			return &abi.CreateCQReply{Errno: abi.ErrnoOf(err)}, nil, nil
		}
		return rep, []int{fd}, nil
	case abi.OpCreateQP:
		var r abi.CreateQPRequest
		if err := decode(&r); err != nil {
			return nil, nil, err
		}
		rep, fd, err := ss.createQP(&r)
		if err != nil {
			return &abi.CreateQPReply{Errno: abi.ErrnoOf(err)}, nil, nil
		}
		return rep, []int{fd}, nil
	case abi.OpModifyQP:
		var r abi.ModifyQPRequest
		if err := decode(&r); err != nil {
			return nil, nil, err
		}
		return &abi.ErrnoReply{Errno: abi.ErrnoOf(ss.modifyQP(&r))}, nil, nil
	case abi.OpQueryQP:
		var r abi.HandleRequest
		if err := decode(&r); err != nil {
			return nil, nil, err
		}
		rep, err := ss.queryQP(r.Handle)
		if err != nil {
			return &abi.QueryQPReply{Errno: abi.ErrnoOf(err)}, nil, nil
		}
		return rep, nil, nil
	case abi.OpCreateSRQ:
		var r abi.CreateSRQRequest
		if err := decode(&r); err != nil {
			return nil, nil, err
		}
		rep, fd, err := ss.createSRQ(&r)
		if err != nil {
			return &abi.CreateSRQReply{Errno: abi.ErrnoOf(err)}, nil, nil
		}
		return rep, []int{fd}, nil
	case abi.OpModifySRQ:
		var r abi.ModifySRQRequest
		if err := decode(&r); err != nil {
			return nil, nil, err
		}
		return &abi.ErrnoReply{Errno: abi.ErrnoOf(ss.modifySRQ(&r))}, nil, nil
	case abi.OpCreateAH:
		var r abi.CreateAHRequest
		if err := decode(&r); err != nil {
			return nil, nil, err
		}
		h, err := ss.createAH(&r)
		return &abi.HandleReply{Errno: abi.ErrnoOf(err), Handle: h}, nil, nil
	case abi.OpDeallocPD, abi.OpDeregMR, abi.OpDestroyChannel, abi.OpDestroyCQ, abi.OpDestroyQP, abi.OpDestroySRQ, abi.OpDestroyAH:
		var r abi.HandleRequest
		if err := decode(&r); err != nil {
			return nil, nil, err
		}
		return &abi.ErrnoReply{Errno: abi.ErrnoOf(ss.destroy(op, r.Handle))}, nil, nil
	}
	return nil, nil, fmt.Errorf("%w: %v from a client", abi.ErrOp, op)
}

// errDescriptors is the error of a request with descriptors its op does
// not take, or without the one it needs.
var errDescriptors = errors.New("wrong number of descriptors")

// fdsOf returns how many descriptors a request of op brings: reg-mr its
// region's memfd, cm-migrate-id the ID's event channel, the others none.
func fdsOf(op abi.Op) int {
	if op == abi.OpRegMR || op == abi.OpCMMigrateID {
		return 1
	}
	return 0
}

// handle allocates the next object handle; ss.mu is held.
func (ss *session) newHandle() abi.Handle {
	ss.next++
	return ss.next
}

// teardown destroys everything the client made. Its QPs are killed, so
// their peers get NAKs and fail instead of retrying into the void.
func (ss *session) teardown() {
	ss.cmTeardown()
	ss.cancel()
	ss.mu.Lock()
	unpoll := ss.unpoll
	ss.mu.Unlock()
	if unpoll != nil {
		unpoll()
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.giveAll()
	dev := ss.dev
	for h, q := range ss.qps {
		q.kill(dev, ss.srv.cfg.Linger)
		delete(ss.qps, h)
	}
	for h, s := range ss.srqs {
		if dev != nil {
			_ = dev.Engine.DestroySRQ(s.srq)
		}
		s.close()
		delete(ss.srqs, h)
	}
	for h, c := range ss.cqs {
		c.close()
		delete(ss.cqs, h)
	}
	for h, c := range ss.chans {
		c.close()
		delete(ss.chans, h)
	}
	var eng *transport.Engine
	if dev != nil {
		eng = dev.Engine
	}
	for h, m := range ss.mrs {
		if eng != nil {
			_ = eng.Memory().Deregister(m.mr)
		}
		m.release(eng)
		delete(ss.mrs, h)
	}
	clear(ss.pds)
	clear(ss.ahs)
	ss.mrBytes = 0
	if ss.kick != nil {
		ss.kick.Close()
		ss.kick = nil
	}
	if ev := ss.evconn.Load(); ev != nil {
		ev.Close()
	}
	ss.conn.Close()
}

// giveAll returns to the appliance's pools what the session's objects
// and doorbell took; ss.mu is held, and they are about to go.
func (ss *session) giveAll() {
	ps := ss.srv.pools
	for _, x := range []struct {
		p *pool
		n int
	}{{&ps.qps, len(ss.qps)}, {&ps.cqs, len(ss.cqs)}, {&ps.srqs, len(ss.srqs)}, {&ps.mrs, len(ss.mrs)}, {&ps.channels, len(ss.chans)}} {
		x.p.give(int64(x.n))
		ps.fds.give(int64(x.n * fdsObject))
	}
	ps.pds.give(int64(len(ss.pds)))
	ps.ahs.give(int64(len(ss.ahs)))
	ps.mrBytes.give(ss.mrBytes)
	if ss.kick != nil {
		ps.fds.give(fdsOpen)
	}
}

// deviceGone handles the withdrawal of the session's device.
func (ss *session) deviceGone() {
	ss.mu.Lock()
	ss.gone = true
	for _, q := range ss.qps {
		_ = q.qp.Modify(&transport.QPAttr{State: abi.QPSErr}, abi.QPStateMask)
	}
	ss.mu.Unlock()
	ss.event(abi.EventDeviceFatal, 0)
}
