package appliance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/taproce/taproce/appliance/control"
	"github.com/taproce/taproce/appliance/poll"
	"github.com/taproce/taproce/internal/cpulist"
	"github.com/taproce/taproce/tap"
)

// PollMode is how the appliance waits for its clients' posts and its
// ports' frames (poll.Mode, config poll), named here for the programs
// that host an appliance, so that only the appliance imports its loop.
type PollMode = poll.Mode

// The poll modes (poll.Adaptive, poll.Block, poll.Spin).
const (
	PollAdaptive = poll.Adaptive
	PollBlock    = poll.Block
	PollSpin     = poll.Spin
)

// ParsePollMode reads "block", "spin" or "adaptive" (poll.ParseMode).
func ParsePollMode(s string) (PollMode, error) { return poll.ParseMode(s) }

// Options describe an appliance.
type Options struct {
	// Socket is the control socket (default control.DefaultSocket).
	Socket string
	// SocketMode and SocketGID give the socket file its permission bits
	// and group (control.Config).
	SocketMode os.FileMode
	SocketGID  int
	// Limits per client, and of all clients together (control.Config),
	// and how the appliance waits for their posts and for its ports'
	// frames.
	Limits          control.Limits
	ApplianceLimits control.ApplianceLimits
	Poll            PollMode
	// LocalSwitch lets traffic between the appliance's own ports cross in
	// memory instead of through their TAPs.
	LocalSwitch bool
	// ECN marks the ports' connected traffic ECN-capable
	// (transport.Config.ECT).
	ECN bool
	// ListAllDevices lists every device to every client
	// (control.Config).
	ListAllDevices bool
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Linger is how long a destroyed or dead client's QP answers its peer
	// (control.Config.Linger).
	Linger time.Duration
	// LingerQuiet is how long such a QP leaves a request it never
	// executed unanswered before it NAKs it (transport.Config.LingerQuiet;
	// 0: its default; tests shorten it).
	LingerQuiet time.Duration
	// PeerNetns replaces how the control server finds a client's
	// namespace (tests).
	PeerNetns func(pid int32) (uint64, error)
}

// Procs returns the GOMAXPROCS an appliance process should run with, or 0
// to leave the runtime's choice: configured when it is positive; else
// none when the GOMAXPROCS environment variable chose already; else what
// the poll mode takes (poll.Mode.Procs) of cpus processors — those
// the appliance is pinned to (config cpus) — or, for cpus 0, of those the
// runtime gave the process. Only the process that hosts the appliance can
// apply it: it is the whole process's setting.
func Procs(mode PollMode, configured, cpus int) int {
	switch {
	case configured > 0:
		return configured
	case os.Getenv("GOMAXPROCS") != "":
		return 0
	case cpus > 0:
		// Explicit: the runtime follows a new affinity only in time.
		return mode.Procs(cpus)
	}
	avail := runtime.GOMAXPROCS(0)
	if n := mode.Procs(avail); n != avail {
		return n
	}
	return 0
}

// Place runs the calling process as the host of an appliance whose poll
// mode is mode: every thread on the processors cpus lists (config cpus, a
// cpulist; "" leaves them where they are), and GOMAXPROCS as Procs chooses
// for procs (config procs). restore puts both back as they were. A list
// that names a processor the process may not use is an error wrapping
// cpulist.ErrNotAllowed; Place then changes nothing.
func Place(mode PollMode, procs int, cpus string) (restore func() error, err error) {
	unpin := func() error { return nil }
	n := 0
	if cpus != "" {
		set, err := cpulist.Parse(cpus)
		if err != nil {
			return nil, fmt.Errorf("appliance: cpus: %w", err)
		}
		if unpin, err = cpulist.Pin(set); err != nil {
			return nil, fmt.Errorf("appliance: cpus: %w", err)
		}
		n = set.Count()
	}
	prev := -1
	if p := Procs(mode, procs, n); p > 0 {
		prev = runtime.GOMAXPROCS(p)
	}
	return func() error {
		if prev > 0 {
			runtime.GOMAXPROCS(prev)
		}
		if err := unpin(); err != nil {
			return fmt.Errorf("appliance: cpus: %w", err)
		}
		return nil
	}, nil
}

// Appliance is the daemon's core: NICs (ports with their transports), the
// local switch between them, and the control server that gives clients
// verbs on them.
type Appliance struct {
	opt  Options
	log  *slog.Logger
	sw   *Switch
	ctrl *control.Server

	mu     sync.Mutex
	nics   map[string]*NIC
	next   int
	closed bool // Close was called

	// loop polls the ports and the clients' rings: spinning, or blocking
	// when the appliance sleeps. It runs from New to Close.
	loop     *poll.Loop
	loopStop context.CancelFunc
	loopDone chan struct{}
}

// ErrClosed is AddPort's and AddPortOn's error once Close was called.
var ErrClosed = errors.New("appliance: closed")

// New returns an appliance with no ports, its polling loop running; the
// error is the loop's, which a blocking mode makes with an eventfd.
func New(opt Options) (*Appliance, error) {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	a := &Appliance{opt: opt, log: opt.Logger, nics: map[string]*NIC{}}
	if opt.LocalSwitch {
		a.sw = NewSwitch()
	}
	// One loop polls every port and client: spinning, or sleeping in
	// ppoll when it finds nothing (after lingering, adaptive).
	loop, err := poll.New(opt.Poll)
	if err != nil {
		return nil, fmt.Errorf("appliance: %w", err)
	}
	a.loop = loop
	ctx, stop := context.WithCancel(context.Background())
	a.loopStop, a.loopDone = stop, make(chan struct{})
	go func() {
		defer close(a.loopDone)
		a.loop.Run(ctx)
	}()
	a.ctrl = control.New(control.Config{Socket: opt.Socket, SocketMode: opt.SocketMode, SocketGID: opt.SocketGID, Limits: opt.Limits,
		ApplianceLimits: opt.ApplianceLimits, ListAllDevices: opt.ListAllDevices, Loop: a.loop, Logger: opt.Logger,
		PeerNetns: opt.PeerNetns, Linger: opt.Linger})
	return a, nil
}

// Control returns the control server.
func (a *Appliance) Control() *control.Server { return a.ctrl }

// Switch returns the local switch, nil when it is off.
func (a *Appliance) Switch() *Switch { return a.sw }

// AddPort opens a port and makes it a device clients can open, named
// taproce0, taproce1, … in order.
func (a *Appliance) AddPort(cfg PortConfig) (*NIC, error) { return a.AddPortOn(nil, cfg) }

// AddPortOn is AddPort on an existing device (a fake in tests); nil opens
// a TAP as AddPort does.
func (a *Appliance) AddPortOn(dev tap.Device, cfg PortConfig) (*NIC, error) {
	nsPath := cfg.Netns
	if nsPath == "" {
		nsPath = "/proc/self/ns/net"
	}
	ino, err := control.NetnsInode(nsPath)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, ErrClosed
	}
	name := fmt.Sprintf("taproce%d", a.next)
	a.next++
	a.mu.Unlock()
	if cfg.Logger == nil {
		cfg.Logger = a.log
	}
	// The appliance's poll mode says how it waits for frames as well as
	// for its clients' posts.
	cfg.Loop = a.loop
	cfg.AckDelay = a.opt.Poll.AckDelay()
	cfg.LingerQuiet = a.opt.LingerQuiet
	cfg.ECT = a.opt.ECN
	user := cfg.OnLink
	cfg.OnLink = func(up bool) {
		a.ctrl.PortEvent(name, up)
		if user != nil {
			user(up)
		}
	}
	var n *NIC
	if dev == nil {
		n, err = OpenNIC(name, cfg, a.sw)
	} else {
		n, err = NewNIC(name, dev, cfg, a.sw)
	}
	if err != nil {
		return nil, err
	}
	n.netns = ino
	a.mu.Lock()
	if a.closed { // closed meanwhile: its loop no longer polls
		a.mu.Unlock()
		return nil, errors.Join(ErrClosed, n.Close())
	}
	a.nics[name] = n
	a.mu.Unlock()
	a.ctrl.AddDevice(&control.Device{Name: name, Netns: ino, Engine: n.Engine(), MAC: n.Port().MAC(), MTU: n.MTU(),
		GIDs: n.GIDs, Resolve: n.Resolve, Up: n.Port().Up, CM: n.CM(), SetCMEvents: n.SetCMEvents,
		Route: func(dst netip.Addr) (netip.Addr, error) {
			r, err := n.Route(dst)
			return r.Src, err
		}})
	return n, nil
}

// RemovePort withdraws a device (its clients get a fatal event) and closes
// its port.
func (a *Appliance) RemovePort(name string) error {
	a.mu.Lock()
	n := a.nics[name]
	delete(a.nics, name)
	a.mu.Unlock()
	if n == nil {
		return fmt.Errorf("appliance: no device %q", name)
	}
	a.ctrl.RemoveDevice(name)
	return n.Close()
}

// NICs returns the devices, sorted by name.
func (a *Appliance) NICs() []*NIC {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]*NIC, 0, len(a.nics))
	for _, n := range a.nics {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// Serve runs the control server until ctx ends.
func (a *Appliance) Serve(ctx context.Context) error { return a.ctrl.Serve(ctx) }

// Close disconnects the clients and closes every port; afterwards no port
// can be added (ErrClosed).
func (a *Appliance) Close() error {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	err := a.ctrl.Close()
	for _, n := range a.NICs() {
		a.ctrl.RemoveDevice(n.name)
		err = errors.Join(err, n.Close())
	}
	a.mu.Lock()
	clear(a.nics)
	a.mu.Unlock()
	a.loopStop()
	<-a.loopDone
	err = errors.Join(err, a.loop.Close())
	return err
}

// Loop returns the loop that polls the ports and the clients' rings: a
// spinning loop when the appliance spins, a blocking one otherwise.
func (a *Appliance) Loop() *poll.Loop { return a.loop }

// Namespace returns the name the port was configured with in
// PortConfig.Namespace (a namespace's name, or an attachment's ID), which
// logs and metrics use to name the port.
func (p *Port) Namespace() string { return p.cfg.Namespace }
