// Package attach is the appliance's admin.Backend: it attaches ports to
// pods' network namespaces in redirect mode. An attached port is a TAP
// device in the pod's namespace with the pod interface's MAC and the
// pod's IPs as its GIDs, a silent station that resolves next hops through
// the namespace's routes and neighbours, and the tc redirect that moves
// RoCEv2 between the pod interface and the TAP (package redirect).
//
// Options.Open decides what serves an attached port: a bare port by
// default, a verbs device of the appliance in the daemon. With a state
// file the manager records every attachment, and Recover, in the next run,
// attaches again the pods that are still there and cleans up after those
// that are gone, so that no pod keeps filters that redirect its RoCEv2
// traffic to a TAP device that died with an earlier appliance.
package attach

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/admin"
	"github.com/taproce/taproce/appliance/redirect"
	"github.com/taproce/taproce/appliance/roce"
)

// Options configure a Manager.
type Options struct {
	// Logger for attachments and their ports (default slog.Default()).
	Logger *slog.Logger
	// Handler receives the RoCEv2 packets of every attached port, on
	// that port's reader goroutine, with the attachment's ID. The default
	// Open uses it; an Open of the caller's may ignore it.
	Handler func(id string, frame []byte, p *roce.Packet)
	// Offload opens the TAP devices with UDP GSO super-frames.
	Offload bool
	// Open opens the port of an attachment: the TAP device in the pod's
	// namespace described by cfg, and whatever serves it. The default
	// opens a bare port with appliance.OpenPort; the appliance daemon
	// passes one that makes the port a verbs device (Appliance.AddPort),
	// whose Close withdraws the device.
	Open func(cfg appliance.PortConfig) (Port, error)
	// StateFile, when set, is where the manager records its attachments
	// (JSON, rewritten on every attach and detach), so that Recover in a
	// later run finds what this one left behind.
	StateFile string
}

// Port is an attached port as Options.Open returns it.
type Port interface {
	// Port returns the appliance port: its TAP device and station.
	Port() *appliance.Port
	// Device returns the name of the verbs device serving the port, or ""
	// when it is not one.
	Device() string
	// Close closes the port and removes its TAP device.
	Close() error
}

// barePort is the Port of the default Open: a port and nothing else.
type barePort struct{ p *appliance.Port }

func (b barePort) Port() *appliance.Port { return b.p }
func (b barePort) Device() string        { return "" }
func (b barePort) Close() error          { return b.p.Close() }

// openBare is the default Options.Open.
func openBare(cfg appliance.PortConfig) (Port, error) {
	p, err := appliance.OpenPort(cfg)
	if err != nil {
		return nil, err
	}
	return barePort{p}, nil
}

// DevicePort is an attached port that is a verbs device of an appliance,
// what the appliance daemon and the lab's redirect mode make of their
// attachments (Options.Open).
type DevicePort struct {
	app *appliance.Appliance
	nic *appliance.NIC
}

// OpenDevice opens the port cfg describes as a device of app
// (Appliance.AddPort): an Options.Open that serves attached ports with
// verbs.
func OpenDevice(app *appliance.Appliance, cfg appliance.PortConfig) (*DevicePort, error) {
	n, err := app.AddPort(cfg)
	if err != nil {
		return nil, err
	}
	return &DevicePort{app: app, nic: n}, nil
}

// NIC returns the device: the port with its transport.
func (p *DevicePort) NIC() *appliance.NIC { return p.nic }

// Port implements Port.
func (p *DevicePort) Port() *appliance.Port { return p.nic.Port() }

// Device implements Port: the device's name.
func (p *DevicePort) Device() string { return p.nic.Name() }

// Close implements Port: it withdraws the device (its clients get a fatal
// event) and closes the port.
func (p *DevicePort) Close() error { return p.app.RemovePort(p.nic.Name()) }

// entry is one attachment and what it holds.
type entry struct {
	att  admin.Attachment
	port Port
	res  *redirect.Resolver
	cfg  redirect.Config
}

// Manager attaches and detaches redirect-mode ports; it implements
// admin.Backend. Attach and Detach are serialised; Check and List run
// alongside them.
type Manager struct {
	opts Options
	log  *slog.Logger

	op sync.Mutex // serialises Attach, Detach, Recover and Close
	// records are the attachments as the state file lists them, by ID;
	// under op.
	records map[string]admin.AttachRequest

	mu      sync.Mutex
	entries map[string]*entry
}

var _ admin.Backend = (*Manager)(nil)

// New returns a manager without attachments.
func New(opts Options) *Manager {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Open == nil {
		opts.Open = openBare
	}
	return &Manager{opts: opts, log: opts.Logger, entries: map[string]*entry{}, records: map[string]admin.AttachRequest{}}
}

func (m *Manager) get(id string) *entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.entries[id]
}

// Port returns the port of attachment id, nil when there is none.
func (m *Manager) Port(id string) *appliance.Port {
	if e := m.get(id); e != nil {
		return e.port.Port()
	}
	return nil
}

// Attach implements admin.Backend: it opens the port in the pod's
// namespace and installs the redirect. Asked again for an attachment it
// has, with the same namespace and port name, it reinstalls the redirect
// (repairing it if someone removed a filter) and returns the attachment.
//
// With a state file, the attachment is recorded there before Attach
// returns; when the file cannot be written, the attachment is undone and
// Attach fails, so that every attachment is one a later run can find.
func (m *Manager) Attach(ctx context.Context, req admin.AttachRequest) (admin.Attachment, error) {
	if err := req.Normalize(); err != nil {
		return admin.Attachment{}, err
	}
	m.op.Lock()
	defer m.op.Unlock()
	if err := ctx.Err(); err != nil {
		return admin.Attachment{}, err
	}
	return m.attachLocked(req)
}

// attachLocked is Attach with m.op held.
func (m *Manager) attachLocked(req admin.AttachRequest) (admin.Attachment, error) {
	id := req.ID()
	if e := m.get(id); e != nil {
		if e.att.Netns != req.Netns || e.att.PortName != req.PortName {
			return admin.Attachment{}, fmt.Errorf("%w: %s is attached as %s in %s", admin.ErrConflict, id, e.att.PortName, e.att.Netns)
		}
		if err := redirect.Install(e.cfg); err != nil {
			return admin.Attachment{}, backendErr(err)
		}
		return e.att, nil
	}
	pod, err := redirect.Inspect(req.Netns, req.IfName)
	if err != nil {
		return admin.Attachment{}, backendErr(err)
	}
	if len(pod.MAC) != 6 {
		return admin.Attachment{}, fmt.Errorf("%w: %s has no Ethernet address (%v)", admin.ErrInvalid, req.IfName, pod.MAC)
	}
	e := &entry{cfg: redirect.Config{Netns: req.Netns, Pod: req.IfName, TAP: req.PortName}}
	if e.res, err = redirect.NewResolver(req.Netns, req.IfName); err != nil {
		return admin.Attachment{}, backendErr(err)
	}
	var handler func([]byte, *roce.Packet)
	if h := m.opts.Handler; h != nil {
		handler = func(frame []byte, p *roce.Packet) { h(id, frame, p) }
	}
	e.port, err = m.opts.Open(appliance.PortConfig{
		Namespace: id,
		Netns:     req.Netns,
		Name:      req.PortName,
		MAC:       roce.MAC(pod.MAC),
		Addrs:     req.IPs,
		MTU:       pod.MTU,
		Offload:   m.opts.Offload,
		Resolver:  e.res,
		Handler:   handler,
		Logger:    m.log,
	})
	if err != nil {
		e.res.Close()
		return admin.Attachment{}, fmt.Errorf("opening port %s in %s: %w", req.PortName, req.Netns, err)
	}
	if err := redirect.Install(e.cfg); err != nil {
		e.close()
		return admin.Attachment{}, backendErr(err)
	}
	e.att = admin.Attachment{
		ID: id, ContainerID: req.ContainerID, IfName: req.IfName, Network: req.Network,
		Netns: req.Netns, PortName: req.PortName, Mode: admin.ModeRedirect,
		MAC: pod.MAC.String(), State: admin.StateActive, Device: e.port.Device(),
	}
	for _, g := range e.port.Port().Station().GIDs() {
		e.att.GIDs = append(e.att.GIDs, netip.AddrFrom16(g))
	}
	old, had := m.records[id]
	m.records[id] = req
	if err := m.saveLocked(); err != nil {
		if had {
			m.records[id] = old
		} else {
			delete(m.records, id)
		}
		err = errors.Join(err, e.close())
		return admin.Attachment{}, fmt.Errorf("attachment %s undone: %w", id, err)
	}
	m.mu.Lock()
	m.entries[id] = e
	m.mu.Unlock()
	return e.att, nil
}

// close takes an entry's redirect down and closes its port and resolver.
func (e *entry) close() error {
	errs := []error{redirect.Remove(e.cfg)}
	if err := e.port.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing port %s: %w", e.cfg.TAP, err))
	}
	e.res.Close()
	return errors.Join(errs...)
}

// Detach implements admin.Backend. For an attachment it does not know
// but whose namespace the request names, it still removes the redirect's
// filters there: leftovers of an earlier run of the appliance, whose TAP
// went with it. The attachment leaves the state file too; an error
// writing it is returned after the detach is done, and a repeated detach
// writes the file again.
func (m *Manager) Detach(ctx context.Context, req admin.DetachRequest) error {
	if err := req.Normalize(); err != nil {
		return err
	}
	m.op.Lock()
	defer m.op.Unlock()
	id := req.ID()
	var err error
	if e := m.get(id); e != nil {
		m.mu.Lock()
		delete(m.entries, id)
		m.mu.Unlock()
		err = backendErr(e.close())
	} else if req.Netns != "" {
		err = backendErr(redirect.Remove(redirect.Config{Netns: req.Netns, Pod: req.IfName, TAP: req.PortName}))
	}
	if _, ok := m.records[id]; ok && err == nil {
		delete(m.records, id)
		err = m.saveLocked()
	}
	return err
}

// Check implements admin.Backend: the namespace, the pod interface with
// the port's MAC, the TAP device, the qdiscs and the filters must all be
// there.
func (m *Manager) Check(ctx context.Context, req admin.CheckRequest) (admin.Attachment, error) {
	if err := req.Normalize(); err != nil {
		return admin.Attachment{}, err
	}
	e := m.get(req.ID())
	if e == nil {
		return admin.Attachment{}, fmt.Errorf("%w: %s", admin.ErrNotFound, req.ID())
	}
	var missing []error
	if err := redirect.Verify(e.cfg); err != nil {
		missing = append(missing, err)
	}
	if pod, err := redirect.Inspect(e.cfg.Netns, e.cfg.Pod); err == nil && pod.MAC.String() != e.att.MAC {
		missing = append(missing, fmt.Errorf("%s now has MAC %v, the port uses %s", e.cfg.Pod, pod.MAC, e.att.MAC))
	}
	if err := errors.Join(missing...); err != nil {
		return admin.Attachment{}, fmt.Errorf("%w: %s: %w", admin.ErrIncomplete, req.ID(), err)
	}
	return e.att, nil
}

// List implements admin.Backend.
func (m *Manager) List(context.Context) ([]admin.Attachment, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]admin.Attachment, 0, len(m.entries))
	for _, e := range m.entries {
		out = append(out, e.att)
	}
	slices.SortFunc(out, func(a, b admin.Attachment) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// Close takes every attachment down: the pods keep their own networking,
// and no filter is left pointing at a TAP that goes away with the
// appliance. The state file keeps listing them, so that the appliance's
// next run (Recover) attaches them again: an appliance restarted, as a
// DaemonSet's pod is on an upgrade, gives the pods their ports back.
func (m *Manager) Close() error {
	m.op.Lock()
	defer m.op.Unlock()
	m.mu.Lock()
	entries := m.entries
	m.entries = map[string]*entry{}
	m.mu.Unlock()
	var errs []error
	for id, e := range entries {
		if err := e.close(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

// backendErr classifies the redirect's errors for the admin API: a
// missing namespace or pod interface is admin.ErrNetnsGone.
func backendErr(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, redirect.ErrNoNetns) || errors.Is(err, redirect.ErrNoLink) {
		return fmt.Errorf("%w: %w", admin.ErrNetnsGone, err)
	}
	return err
}
