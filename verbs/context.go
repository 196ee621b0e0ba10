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
	"net"
	"net/netip"
	"os"
	"sync"
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

// conn is a control connection.
type conn struct {
	c *net.UnixConn

	mu      sync.Mutex
	seq     uint32
	waiting map[uint32]chan reply
	err     error
	events  chan abi.Event
	done    chan struct{}
}

type reply struct {
	body []byte
	fds  []int
}

func dial(ctx context.Context) (*conn, error) {
	sock := Socket()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", sock)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, &NoApplianceError{Socket: sock, Err: err}
	}
	if err != nil {
		return nil, fmt.Errorf("verbs: appliance at %s: %w", sock, err)
	}
	cn := &conn{c: c.(*net.UnixConn), waiting: map[uint32]chan reply{}, events: make(chan abi.Event, 64), done: make(chan struct{})}
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
		cn.err = fmt.Errorf("verbs: connection to the appliance: %w", err)
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
		return nil, fmt.Errorf("verbs: %v: %w", op, err)
	}
	select {
	case r, ok := <-ch:
		if !ok {
			cn.mu.Lock()
			defer cn.mu.Unlock()
			return nil, cn.err
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
	defer cn.c.Close()
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
type Context struct {
	cn   *conn
	name string
	kick *shmem.Doorbell
	attr DeviceAttr
	port PortAttr

	mu      sync.Mutex
	closed  bool
	qps     map[uint32]*QP // by handle
	cqs     map[uint32]*CQ
	srqs    map[uint32]*SRQ
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
		cn.c.Close()
		return nil, fmt.Errorf("verbs: open %s: %w", name, err)
	}
	kick, err := shmem.DoorbellFromFd(fds[0])
	if err != nil {
		closeFds(fds)
		cn.c.Close()
		return nil, err
	}
	c := &Context{cn: cn, name: name, kick: kick, attr: r.Device, port: portAttrOf(&r.Port),
		qps: map[uint32]*QP{}, cqs: map[uint32]*CQ{}, srqs: map[uint32]*SRQ{}, events: make(chan AsyncEvent, 64),
		regions: map[*shmem.Region]struct{}{}}
	go c.dispatchEvents()
	return c, nil
}

func (c *Context) dispatchEvents() {
	for {
		select {
		case ev := <-c.cn.events:
			out := AsyncEvent{Type: ev.Type, Port: ev.Port}
			c.mu.Lock()
			out.QP, out.CQ, out.SRQ = c.qps[uint32(ev.Handle)], c.cqs[uint32(ev.Handle)], c.srqs[uint32(ev.Handle)]
			c.mu.Unlock()
			select {
			case c.events <- out:
			default:
			}
		case <-c.cn.done:
			return
		}
	}
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
func (c *Context) AsyncEvent(ctx context.Context) (AsyncEvent, error) {
	select {
	case ev := <-c.events:
		return ev, nil
	case <-c.cn.done:
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
	err := c.cn.c.Close()
	<-c.cn.done
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
