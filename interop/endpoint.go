package interop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/tap"
)

// EndpointConfig describes a taproce port on the peers' bridge.
type EndpointConfig struct {
	// Addr is the port's address and prefix, e.g. 10.99.0.10/24; its GID
	// index 1 is ::ffff: of it.
	Addr netip.Prefix
	// Name is the TAP device name (default "taproce" and the last octet).
	Name string
	// MTU of the TAP device (default 1500); it bounds the path MTU.
	MTU int
	// Capture, when set, records every frame the port sends and receives.
	Capture *capture.Writer
	// Logger for the port (default: discard).
	Logger *slog.Logger
}

// Endpoint is a taproce port on the bridge of the peers (its TAP a port of
// Bridge in Namespace) with a transport engine on it: the RoCEv2 endpoint
// the suite pits against rxe.
type Endpoint struct {
	Port   *appliance.Port
	Engine *transport.Engine
	Addr   netip.Prefix

	eng     atomic.Pointer[transport.Engine]
	observe atomic.Pointer[func(frame []byte, p *roce.Packet)]

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// OpenEndpoint opens a port in Namespace, makes its TAP a port of Bridge
// and starts a transport engine on it.
func OpenEndpoint(cfg EndpointConfig) (*Endpoint, error) {
	if !cfg.Addr.Addr().Is4() {
		return nil, fmt.Errorf("interop: endpoint address %v is not IPv4", cfg.Addr)
	}
	if cfg.Name == "" {
		cfg.Name = fmt.Sprintf("taproce%d", cfg.Addr.Addr().As4()[3])
	}
	if cfg.MTU == 0 {
		cfg.MTU = 1500
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ep := &Endpoint{Addr: cfg.Addr, stop: make(chan struct{})}
	port, err := appliance.OpenPort(appliance.PortConfig{
		Namespace: Namespace,
		Netns:     netnsutil.Path(Namespace),
		Name:      cfg.Name,
		Addrs:     []netip.Prefix{cfg.Addr},
		MTU:       cfg.MTU,
		Capture:   cfg.Capture,
		Handler:   ep.receive,
		Logger:    cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("interop: %w", err)
	}
	ep.Port = port
	if err := netnsutil.AttachToBridge(netnsutil.Path(Namespace), cfg.Name, Bridge); err != nil {
		port.Close()
		return nil, fmt.Errorf("interop: attaching %s to %s: %w", cfg.Name, Bridge, err)
	}
	// The TAP joined the bridge after the station announced itself on an
	// unattached device: announce again now that the link is complete.
	port.Station().Announce()
	ep.Engine = transport.NewEngine(transport.Config{
		MAC:  port.MAC(),
		GIDs: port.Station().GIDs(),
		MTU:  port.Device().MTU(),
		Out:  portOutput{port},
	})
	ep.eng.Store(ep.Engine)
	ep.wg.Add(1)
	go ep.tickLoop()
	return ep, nil
}

// receive hands the port's RoCE packets to the engine (and the observer).
func (ep *Endpoint) receive(frame []byte, p *roce.Packet) {
	if fn := ep.observe.Load(); fn != nil {
		(*fn)(frame, p)
	}
	if e := ep.eng.Load(); e != nil {
		e.Receive(frame, p)
	}
}

// Observe sets (or, with nil, clears) a function that sees every RoCE
// packet the port receives before the engine does, on the port's reader
// goroutine; frame is valid only during the call.
func (ep *Endpoint) Observe(fn func(frame []byte, p *roce.Packet)) {
	if fn == nil {
		ep.observe.Store(nil)
		return
	}
	ep.observe.Store(&fn)
}

// IP returns the port's IPv4 address.
func (ep *Endpoint) IP() netip.Addr { return ep.Addr.Addr() }

// GID returns the port's GID of index i (0 the link-local one, 1 the
// IPv4 one).
func (ep *Endpoint) GID(i int) (roce.GID, error) {
	gids := ep.Port.Station().GIDs()
	if i < 0 || i >= len(gids) {
		return roce.GID{}, fmt.Errorf("interop: GID index %d of %d", i, len(gids))
	}
	return gids[i], nil
}

// Resolve returns the MAC of a neighbour, asking by ARP when needed.
func (ep *Endpoint) Resolve(ctx context.Context, ip netip.Addr) (roce.MAC, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	mac, err := ep.Port.Station().Resolve(ctx, ip)
	if err != nil {
		return mac, fmt.Errorf("interop: resolving %v: %w", ip, err)
	}
	return mac, nil
}

// tickLoop runs the engine's timers until Close. (internal/lab runs its
// engines the same way.)
func (ep *Endpoint) tickLoop() {
	defer ep.wg.Done()
	t := time.NewTimer(time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ep.stop:
			return
		case <-t.C:
		}
		ep.Engine.Tick()
		d := time.Millisecond
		if next, ok := ep.Engine.NextDeadline(); ok {
			d = min(max(time.Until(next), 50*time.Microsecond), time.Millisecond)
		}
		t.Reset(d)
	}
}

// Close stops the engine and closes the port, which removes its TAP.
func (ep *Endpoint) Close() error {
	ep.closeOnce.Do(func() {
		close(ep.stop)
		ep.wg.Wait()
		ep.eng.Store(nil)
		ep.closeErr = ep.Port.Close()
	})
	return ep.closeErr
}

// portOutput hands an engine's frames to its port. (A copy of the
// unexported type of internal/lab.)
type portOutput struct{ port *appliance.Port }

func (o portOutput) Headroom() int { return tap.Headroom }
func (o portOutput) Send(frames [][]byte) {
	_ = o.port.Send(frames, tap.Headroom)
}

// ListenTCP listens on addr (host:port) inside Namespace, where the kernel
// owns HostIP: the out-of-band side of the rdma-core tools.
func ListenTCP(addr string) (net.Listener, error) {
	var ln net.Listener
	err := netnsutil.Do(netnsutil.Path(Namespace), func(*netlink.Handle) error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("interop: listening on %s in %s: %w", addr, Namespace, err)
	}
	return ln, nil
}

// DialTCP connects to addr (host:port) from inside Namespace, retrying
// while the connection is refused (the server is not listening yet) until
// ctx ends.
func DialTCP(ctx context.Context, addr string) (net.Conn, error) {
	for {
		var c net.Conn
		err := netnsutil.Do(netnsutil.Path(Namespace), func(*netlink.Handle) error {
			var err error
			d := net.Dialer{Timeout: 5 * time.Second}
			c, err = d.DialContext(ctx, "tcp4", addr)
			return err
		})
		if err == nil {
			return c, nil
		}
		if !isRefused(err) || ctx.Err() != nil {
			return nil, fmt.Errorf("interop: connecting to %s from %s: %w", addr, Namespace, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("interop: connecting to %s from %s: %w", addr, Namespace, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func isRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH)
}
