// Package verbs is the library applications use to reach a taproce
// appliance: an ibverbs-shaped API (devices, PDs, MRs, CQs with
// completion channels, QPs, SRQs, AHs) whose objects live in the
// appliance and whose data path is memory shared with it. Posting work
// requests and polling completions touch only shared rings: no system
// call, unless the appliance sleeps and must be woken.
//
// Memory regions are allocated by the library (AllocMR) in shared memory,
// so the appliance moves data straight between the network and the
// application's buffers.
package verbs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/taproce/taproce/shmem"
	"github.com/taproce/taproce/verbs/abi"
)

// DefaultSocket is the appliance's socket; TAPROCE_SOCKET overrides it.
const DefaultSocket = abi.DefaultSocket

// Socket returns the socket path the library uses.
func Socket() string {
	if s := os.Getenv(abi.SocketEnv); s != "" {
		return s
	}
	return DefaultSocket
}

// ErrClosed is returned for using a closed context or object.
var ErrClosed = errors.New("verbs: closed")

// ErrNoAppliance is wrapped by the errors of calls that found no appliance
// at the socket: no socket there, or one an appliance left behind.
var ErrNoAppliance = errors.New("verbs: no appliance is listening")

// NoApplianceError is the error of reaching for an appliance where none
// listens. It names the socket, so that a command can say where it looked
// and how to get one there; it wraps ErrNoAppliance and the dial's error.
type NoApplianceError struct {
	Socket string
	Err    error
}

func (e *NoApplianceError) Error() string {
	return fmt.Sprintf("verbs: no appliance is listening at %s", e.Socket)
}

func (e *NoApplianceError) Unwrap() []error { return []error{ErrNoAppliance, e.Err} }

// ErrDeviceGone is wrapped by the errors of a device whose appliance died
// or dropped the connection (see DeviceGoneError): every call that needs
// the appliance fails with it from then on.
var ErrDeviceGone = errors.New("verbs: device gone")

// errHungUp is the cause of a DeviceGoneError when the control socket
// reached its end: the appliance closed it, by exiting (a crash, a kill)
// or by dropping this client.
var errHungUp = errors.New("the appliance closed the control connection: it died or dropped this client")

// DeviceGoneError is the error of a device whose appliance is gone: its
// control connection ended (abi's package documentation says what a
// client sees then). It wraps ErrDeviceGone, syscall.EIO — what
// libibverbs returns for a command on a device the kernel disassociated —
// and the cause, so that errors.Is finds any of them.
type DeviceGoneError struct {
	// Device names the device ("" for a connection that opened none).
	Device string
	// Err is the cause: the end of the control connection, or its error.
	Err error
}

func (e *DeviceGoneError) Error() string {
	dev := "the device"
	if e.Device != "" {
		dev = "device " + e.Device
	}
	return fmt.Sprintf("verbs: %s is gone: %v", dev, e.Err)
}

func (e *DeviceGoneError) Unwrap() []error { return []error{ErrDeviceGone, syscall.EIO, e.Err} }

// conn is a control connection.
type conn struct {
	c *net.UnixConn
	// closing is set by close, so that the reader's end counts as this
	// side's and not as the appliance's.
	closing atomic.Bool

	mu      sync.Mutex
	name    string // the device opened on it, for errors
	seq     uint32
	waiting map[uint32]chan reply
	err     error // why the connection ended: ErrClosed or a *DeviceGoneError
	events  chan abi.Event
	done    chan struct{}
	// cmEvent, on an RDMA CM event channel, takes each OpCMEvent as it
	// comes, on the reader's goroutine: it must not wait, nor call the
	// appliance.
	cmEvent func(*abi.CMEvent)
}

type reply struct {
	body []byte
	fds  []int
}

func dial(ctx context.Context) (*conn, error) { return dialWith(ctx, nil) }

// dialWith connects to the appliance; cmEvent, when set, receives the
// RDMA CM's events (see conn.cmEvent).
func dialWith(ctx context.Context, cmEvent func(*abi.CMEvent)) (*conn, error) {
	sock := Socket()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", sock)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, &NoApplianceError{Socket: sock, Err: err}
	}
	if err != nil {
		return nil, fmt.Errorf("verbs: appliance at %s: %w", sock, err)
	}
	cn := &conn{c: c.(*net.UnixConn), waiting: map[uint32]chan reply{}, events: make(chan abi.Event, 64), done: make(chan struct{}),
		cmEvent: cmEvent}
	go cn.read()
	return cn, nil
}

func (cn *conn) read() {
	defer close(cn.done)
	buf := make([]byte, abi.MaxMessage)
	for {
		n, fds, err := shmem.RecvMsg(cn.c, buf, 4)
		if err == nil {
			var h abi.Header
			var body []byte
			h, body, err = abi.DecodeHeader(buf[:n])
			if err == nil {
				switch {
				case h.Flags&abi.FlagEvent != 0 && h.Op == abi.OpCMEvent:
					// An event that does not decode is dropped, as one for
					// an ID this side does not know.
					var ev abi.CMEvent
					if cn.cmEvent != nil && abi.DecodeBody(body, &ev) == nil {
						cn.cmEvent(&ev)
					}
					closeFds(fds)
					continue
				case h.Flags&abi.FlagEvent != 0:
					var ev abi.Event
					if abi.DecodeBody(body, &ev) == nil {
						select {
						case cn.events <- ev:
						default: // a client that never reads events loses the oldest news
						}
					}
					closeFds(fds)
					continue
				case h.Flags&abi.FlagReply != 0:
					cn.mu.Lock()
					ch := cn.waiting[h.Seq]
					delete(cn.waiting, h.Seq)
					cn.mu.Unlock()
					if ch != nil {
						ch <- reply{body: append([]byte(nil), body...), fds: fds}
						continue
					}
				}
			}
			closeFds(fds)
			if err == nil {
				continue
			}
		}
		cn.mu.Lock()
		switch {
		case cn.closing.Load():
			cn.err = ErrClosed
		case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
			// ECONNRESET: it left messages of ours unread.
			cn.err = &DeviceGoneError{Device: cn.name, Err: errHungUp}
		default:
			cn.err = &DeviceGoneError{Device: cn.name, Err: fmt.Errorf("the control connection failed: %w", err)}
		}
		for s, ch := range cn.waiting {
			close(ch)
			delete(cn.waiting, s)
		}
		cn.mu.Unlock()
		return
	}
}

// call sends a request with fds and decodes the reply into out (whose
// first field is the errno); the reply's descriptors are returned.
func (cn *conn) call(ctx context.Context, op abi.Op, req, out any, fds ...int) ([]int, error) {
	ch := make(chan reply, 1)
	cn.mu.Lock()
	if cn.err != nil {
		cn.mu.Unlock()
		return nil, cn.err
	}
	cn.seq++
	seq := cn.seq
	cn.waiting[seq] = ch
	cn.mu.Unlock()
	msg, err := abi.Encode(nil, abi.Header{Op: op, Seq: seq}, req)
	if err == nil {
		err = shmem.SendMsg(cn.c, msg, fds...)
	}
	if err != nil {
		cn.forget(seq)
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
			// The appliance has gone; the reader is about to see the
			// end of the connection and say so.
			select {
			case <-cn.done:
				return nil, cn.ended()
			case <-ctx.Done():
			}
		}
		return nil, fmt.Errorf("verbs: %v: %w", op, err)
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return nil, cn.ended()
		}
		if err := abi.DecodeBody(r.body, out); err != nil {
			closeFds(r.fds)
			return nil, fmt.Errorf("verbs: %v reply: %w", op, err)
		}
		return r.fds, nil
	case <-ctx.Done():
		cn.forget(seq)
		return nil, ctx.Err()
	}
}

// ended returns why the connection ended, once the reader has.
func (cn *conn) ended() error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.err
}

// close closes the connection from this side.
func (cn *conn) close() error {
	cn.closing.Store(true)
	return cn.c.Close()
}

func (cn *conn) forget(seq uint32) {
	cn.mu.Lock()
	delete(cn.waiting, seq)
	cn.mu.Unlock()
}

func closeFds(fds []int) {
	for _, fd := range fds {
		_ = syscall.Close(fd)
	}
}

// errnoOf turns a reply's errno into an error naming the operation.
func errnoOf(op abi.Op, e abi.Errno) error {
	if e == 0 {
		return nil
	}
	return fmt.Errorf("verbs: %v: %w", op, syscall.Errno(e))
}

// DeviceInfo describes a device of the appliance (ibv_get_device_list).
type DeviceInfo struct {
	Name     string
	NodeGUID uint64
	MAC      net.HardwareAddr
	// Usable says whether this process may open it: a device serves the
	// processes of its own network namespace. Others are listed only by
	// an appliance that lists all devices.
	Usable bool
	PortUp bool
	MTU    int
	GIDs   []netip.Addr
}

// Devices lists the appliance's devices that this process is shown:
// those it may use, or all of them when the appliance lists all
// (ListDevices tells which).
func Devices(ctx context.Context) ([]DeviceInfo, error) {
	l, err := ListDevices(ctx)
	return l.Devices, err
}

// DeviceList is what the appliance shows this process of its devices.
type DeviceList struct {
	Devices []DeviceInfo
	// OthersHidden says the appliance showed only the devices of this
	// process's network namespace, as it does unless its operator lets it
	// list all (list_all_devices): whether others exist, this process
	// cannot tell.
	OthersHidden bool
}

// ListDevices lists the appliance's devices that this process is shown,
// and whether the devices of other namespaces were left out.
func ListDevices(ctx context.Context) (DeviceList, error) {
	cn, err := dial(ctx)
	if err != nil {
		return DeviceList{}, err
	}
	defer cn.close()
	var r abi.ListDevicesReply
	if _, err := cn.call(ctx, abi.OpListDevices, nil, &r); err != nil {
		return DeviceList{}, err
	}
	if err := errnoOf(abi.OpListDevices, r.Errno); err != nil {
		return DeviceList{}, err
	}
	out := DeviceList{Devices: make([]DeviceInfo, 0, r.Count), OthersHidden: r.OthersHidden == 1}
	for _, d := range r.Devices[:min(int(r.Count), len(r.Devices))] {
		info := DeviceInfo{Name: d.Name.String(), NodeGUID: d.NodeGUID, MAC: net.HardwareAddr(append([]byte(nil), d.MAC[:]...)),
			Usable: d.Usable == 1, PortUp: d.PortUp == 1, MTU: int(d.MTU)}
		for _, g := range d.GIDs[:min(int(d.NumGIDs), len(d.GIDs))] {
			info.GIDs = append(info.GIDs, netip.AddrFrom16(g).Unmap())
		}
		out.Devices = append(out.Devices, info)
	}
	return out, nil
}

// DeviceAttr is what QueryDevice reports (struct ibv_device_attr).
type DeviceAttr = abi.DeviceAttr

// PortAttr is what QueryPort reports (struct ibv_port_attr); GIDs[i] is
// GID index i.
type PortAttr struct {
	State, MaxMTU, ActiveMTU, LinkLayer, PhysState uint8
	ActiveWidth, ActiveSpeed                       uint8
	GIDTblLen, PortCapFlags, MaxMsgSz              uint32
	PKeyTblLen, LID                                uint16
	GIDs                                           []netip.Addr
}

func portAttrOf(p *abi.PortAttr) PortAttr {
	out := PortAttr{State: p.State, MaxMTU: p.MaxMTU, ActiveMTU: p.ActiveMTU, LinkLayer: p.LinkLayer, PhysState: p.PhysState,
		ActiveWidth: p.ActiveWidth, ActiveSpeed: p.ActiveSpeed, GIDTblLen: p.GIDTblLen, PortCapFlags: p.PortCapFlags,
		MaxMsgSz: p.MaxMsgSz, PKeyTblLen: p.PKeyTblLen, LID: p.LID}
	for _, g := range p.GIDs[:min(int(p.NumGIDs), len(p.GIDs))] {
		out.GIDs = append(out.GIDs, netip.AddrFrom16(g).Unmap())
	}
	return out
}

// Context is an open device (struct ibv_context).
//
// When its appliance dies (or drops the connection), the context learns
// it from the control socket's end, as libibverbs learns of a device the
// kernel disassociated, and then:
//   - AsyncEvent delivers one EventDeviceFatal, after the events that came
//     before, and then fails with the DeviceGoneError;
//   - every work request still outstanding completes with WCWRFlushErr
//     (its CQ's Poll returns them after the completions the appliance
//     wrote), and a completion channel's Wait wakes: it returns a CQ
//     armed before that has such completions, and then the error;
//   - posting, arming a CQ and every call to the appliance fail with a
//     *DeviceGoneError (ErrDeviceGone, syscall.EIO);
//   - Err reports it and Done is closed.
//
// Close still releases everything, as after any other end.
type Context struct {
	cn   *conn
	name string
	kick *shmem.Doorbell
	attr DeviceAttr
	port PortAttr

	// lost holds the *DeviceGoneError once the appliance is gone: posting
	// and arming read it with one atomic load.
	lost atomic.Pointer[DeviceGoneError]
	// done is closed when the context has ended (lost, or closed) and the
	// goroutine that handles the end has finished; fatal holds the one
	// EventDeviceFatal until AsyncEvent takes it.
	done  chan struct{}
	fatal chan AsyncEvent

	mu      sync.Mutex
	closed  bool
	qps     map[uint32]*QP // by handle
	cqs     map[uint32]*CQ
	srqs    map[uint32]*SRQ
	chans   map[*CompChannel]struct{}
	events  chan AsyncEvent
	regions map[*shmem.Region]struct{} // shared memory to unmap on Close
}

// Open opens a device by name; "" opens the first device this process may
// use (ibv_open_device).
func Open(ctx context.Context, name string) (*Context, error) {
	if name == "" {
		devs, err := Devices(ctx)
		if err != nil {
			return nil, err
		}
		for _, d := range devs {
			if d.Usable {
				name = d.Name
				break
			}
		}
		if name == "" {
			return nil, fmt.Errorf("verbs: no device in this network namespace: %w", syscall.ENODEV)
		}
	}
	cn, err := dial(ctx)
	if err != nil {
		return nil, err
	}
	var r abi.OpenReply
	fds, err := cn.call(ctx, abi.OpOpen, &abi.OpenRequest{Name: abi.MakeName(name)}, &r)
	if err == nil {
		err = errnoOf(abi.OpOpen, r.Errno)
	}
	if err == nil && len(fds) != 1 {
		err = fmt.Errorf("verbs: open: %d descriptors", len(fds))
	}
	if err != nil {
		closeFds(fds)
		cn.close()
		return nil, fmt.Errorf("verbs: open %s: %w", name, err)
	}
	kick, err := shmem.DoorbellFromFd(fds[0])
	if err != nil {
		closeFds(fds)
		cn.close()
		return nil, err
	}
	cn.mu.Lock()
	cn.name = name
	cn.mu.Unlock()
	c := &Context{cn: cn, name: name, kick: kick, attr: r.Device, port: portAttrOf(&r.Port),
		done: make(chan struct{}), fatal: make(chan AsyncEvent, 1),
		qps: map[uint32]*QP{}, cqs: map[uint32]*CQ{}, srqs: map[uint32]*SRQ{}, chans: map[*CompChannel]struct{}{},
		events: make(chan AsyncEvent, 64), regions: map[*shmem.Region]struct{}{}}
	go c.dispatchEvents()
	return c, nil
}

// dispatchEvents hands the appliance's events to AsyncEvent until the
// connection ends, and then, unless this side closed it, handles the
// appliance's end (lose).
func (c *Context) dispatchEvents() {
	defer close(c.done)
	for {
		select {
		case ev := <-c.cn.events:
			c.dispatch(ev)
		case <-c.cn.done:
			for drained := false; !drained; {
				select {
				case ev := <-c.cn.events:
					c.dispatch(ev)
				default:
					drained = true
				}
			}
			if err, ok := c.cn.ended().(*DeviceGoneError); ok {
				c.lose(err)
			}
			return
		}
	}
}

func (c *Context) dispatch(ev abi.Event) {
	out := AsyncEvent{Type: ev.Type, Port: ev.Port}
	c.mu.Lock()
	out.QP, out.CQ, out.SRQ = c.qps[uint32(ev.Handle)], c.cqs[uint32(ev.Handle)], c.srqs[uint32(ev.Handle)]
	c.mu.Unlock()
	select {
	case c.events <- out:
	default: // a client that never reads events loses the newest news
	}
}

// lose ends the context whose appliance is gone: it publishes err, which
// makes posting fail; flushes every work request posted before into its
// CQ (each queue's lock orders the posts that saw no error before the
// flush); wakes the completion channels' waiters; and queues the fatal
// event. A Close under way first leaves nothing to do.
func (c *Context) lose(err *DeviceGoneError) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	// Published before the objects are listed: an object made after this
	// sees it at its first post.
	c.lost.Store(err)
	qps := make([]*QP, 0, len(c.qps))
	for _, qp := range c.qps {
		qps = append(qps, qp)
	}
	cqs := make([]*CQ, 0, len(c.cqs))
	for _, cq := range c.cqs {
		cqs = append(cqs, cq)
	}
	chans := make([]*CompChannel, 0, len(c.chans))
	for ch := range c.chans {
		chans = append(chans, ch)
	}
	c.mu.Unlock()
	for _, qp := range qps {
		qp.flush()
	}
	for _, cq := range cqs {
		cq.lose()
	}
	for _, ch := range chans {
		_ = ch.bell.Ring() // a destroyed channel's bell is closed: nobody waits
	}
	c.fatal <- AsyncEvent{Type: EventDeviceFatal, Port: 1}
}

// Err returns nil while the device works, a *DeviceGoneError (wrapping
// ErrDeviceGone and syscall.EIO) once its appliance is gone, and
// ErrClosed after Close. It takes no lock and makes no system call, for
// loops that check it between polls.
func (c *Context) Err() error {
	if err := c.lost.Load(); err != nil {
		return err
	}
	select {
	case <-c.done:
		return ErrClosed
	default:
		return nil
	}
}

// Done returns a channel closed when the context has ended: its
// appliance is gone (Err says so) or it was closed. A program that
// blocks elsewhere (on a socket to its peer, say) can watch it to learn
// that its device died.
func (c *Context) Done() <-chan struct{} { return c.done }

// gone returns the *DeviceGoneError once the appliance is gone, else nil;
// it is one atomic load, for the data path.
func (c *Context) gone() error {
	if err := c.lost.Load(); err != nil {
		return err
	}
	return nil
}

// Name returns the device name.
func (c *Context) Name() string { return c.name }

// QueryDevice returns the device attributes.
func (c *Context) QueryDevice() DeviceAttr { return c.attr }

// AppliancePolls reports whether the appliance busy-polls this context's
// rings on processors of its own (DeviceAttr.Polls): a client may then
// busy-poll its completion queues without taking processor time from
// the appliance, where against a sleeping appliance it had better sleep
// on a completion channel soon on a machine with few cores.
func (c *Context) AppliancePolls() bool { return c.attr.Polls != 0 }

// QueryPort asks the appliance for the port's current attributes (the
// port number is always 1).
func (c *Context) QueryPort(ctx context.Context) (PortAttr, error) {
	var r abi.QueryPortReply
	if _, err := c.cn.call(ctx, abi.OpQueryPort, nil, &r); err != nil {
		return PortAttr{}, err
	}
	if err := errnoOf(abi.OpQueryPort, r.Errno); err != nil {
		return PortAttr{}, err
	}
	c.port = portAttrOf(&r.Port)
	return c.port, nil
}

// GID returns GID index i of the port, from the attributes last queried.
func (c *Context) GID(i int) (netip.Addr, error) {
	if i < 0 || i >= len(c.port.GIDs) {
		return netip.Addr{}, fmt.Errorf("verbs: GID index %d of %d: %w", i, len(c.port.GIDs), syscall.EINVAL)
	}
	return c.port.GIDs[i], nil
}

// AsyncEvent waits for the next asynchronous event (ibv_get_async_event).
// When the appliance is gone it returns the events that came before, then
// one EventDeviceFatal, then the *DeviceGoneError; after Close, ErrClosed.
func (c *Context) AsyncEvent(ctx context.Context) (AsyncEvent, error) {
	select {
	case ev := <-c.events:
		return ev, nil
	case <-c.done:
		select {
		case ev := <-c.events:
			return ev, nil
		default:
		}
		select {
		case ev := <-c.fatal:
			return ev, nil
		default:
		}
		if err := c.gone(); err != nil {
			return AsyncEvent{}, err
		}
		return AsyncEvent{}, ErrClosed
	case <-ctx.Done():
		return AsyncEvent{}, ctx.Err()
	}
}

// Close closes the device: the appliance destroys every object made
// through it, and the shared memory of its MRs, CQs and QPs is unmapped
// (using them afterwards is an error, as after ibv_close_device).
func (c *Context) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	err := c.cn.close()
	<-c.cn.done
	// The end's handling (lose) reads the rings: it must be over before
	// they are unmapped.
	<-c.done
	c.kick.Close()
	c.mu.Lock()
	for r := range c.regions {
		r.Close()
	}
	clear(c.regions)
	c.mu.Unlock()
	return err
}

// track records shared memory to unmap on Close; untrack forgets it once
// its object is gone.
func (c *Context) track(r *shmem.Region) {
	c.mu.Lock()
	c.regions[r] = struct{}{}
	c.mu.Unlock()
}

func (c *Context) untrack(r *shmem.Region) error {
	c.mu.Lock()
	delete(c.regions, r)
	c.mu.Unlock()
	return r.Close()
}

// ring wakes the appliance.
func (c *Context) ring() { _ = c.kick.Ring() }
