// Package daemon runs the appliance as `taproce run` does: an
// appliance.Appliance built from the configuration file, with its static
// ports, serving verbs on the control socket; the admin API, through which
// the CNI plugin attaches pods' ports (each a verbs device of the
// appliance); Prometheus metrics and a health check over HTTP.
//
// Start takes over what an earlier run left (see attach.Manager.Recover)
// and returns once every socket accepts; Wait shuts everything down when
// its context ends: clients disconnected, pods' redirects removed, ports
// and TAP devices closed, sockets removed. Run does both.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/admin"
	"github.com/taproce/taproce/appliance/attach"
	"github.com/taproce/taproce/appliance/control"
	"github.com/taproce/taproce/appliance/metrics"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/config"
)

// ShutdownTimeout bounds how long the HTTP servers wait for requests in
// flight when the daemon stops.
const ShutdownTimeout = 5 * time.Second

// healthTimeout bounds each check of /healthz.
const healthTimeout = 2 * time.Second

// Daemon is a running appliance.
type Daemon struct {
	cfg *config.Config
	log *slog.Logger
	ctx context.Context

	app *appliance.Appliance
	mgr *attach.Manager
	rec attach.Recovery

	adminLn    net.Listener
	adminSrv   *http.Server
	health     *http.Client // the admin API's client for /healthz, a new connection each time
	metricsLn  net.Listener
	metricsSrv *http.Server

	errs     chan error // a server that stopped on its own
	wg       sync.WaitGroup
	stopOnce sync.Once
	stopErr  error
}

// Run starts the daemon for cfg and serves until ctx ends, then shuts it
// down. It returns nil after a shutdown that ctx asked for and that went
// cleanly, and an error when the daemon could not start, a server failed,
// or the shutdown left something behind. While it runs, the process runs
// on the processors cfg's cpus lists, as many at once as its procs and
// poll choose (appliance.Place): the daemon owns its process.
func Run(ctx context.Context, cfg *config.Config, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.Default()
	}
	poll, err := checked(cfg)
	if err != nil {
		return err
	}
	restore, err := appliance.Place(poll, cfg.Procs, cfg.CPUs)
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	defer func() {
		if err := restore(); err != nil {
			logger.Warn("putting the process back on its processors", "err", err)
		}
	}()
	d, err := start(ctx, cfg, poll, logger)
	if err != nil {
		return err
	}
	return d.Wait()
}

// checked validates cfg and returns its poll mode.
func checked(cfg *config.Config) (appliance.PollMode, error) {
	if err := cfg.Validate(); err != nil {
		return 0, fmt.Errorf("daemon: %w", err)
	}
	mode, err := appliance.ParsePollMode(cfg.Poll)
	if err != nil {
		return 0, fmt.Errorf("daemon: %w", err)
	}
	return mode, nil
}

// limits returns the config's limits of one client, or of all clients'
// objects, as the control server takes them.
func limits(l config.Limits) control.Limits {
	return control.Limits{QPs: l.QPs, CQs: l.CQs, SRQs: l.SRQs, MRs: l.MRs, PDs: l.PDs, AHs: l.AHs, Channels: l.Channels, MRBytes: l.MRBytes}
}

// applianceLimits returns the config's appliance-wide limits as the
// control server takes them, with descriptors for clients that leave the
// appliance its own under nofile, the process's descriptor limit.
func applianceLimits(l config.ApplianceLimits, nofile uint64) (control.ApplianceLimits, error) {
	out := control.ApplianceLimits{Limits: limits(l.Limits), Connections: l.Connections, ConnectionsPerUID: l.ConnectionsPerUID,
		Descriptors: l.Descriptors}
	room := int64(nofile) - ownDescriptors
	switch {
	case out.Descriptors == 0:
		out.Descriptors = int(min(nofile/4*3, 1<<30))
	case int64(out.Descriptors) > room:
		return out, fmt.Errorf("appliance_limits.descriptors %d leaves the appliance fewer than %d of its descriptor limit %d (RLIMIT_NOFILE): %w",
			out.Descriptors, ownDescriptors, nofile, ErrDescriptors)
	}
	return out, nil
}

// ownDescriptors is the least the appliance keeps of its descriptor limit
// for itself: ports, the admin and metrics servers and their clients.
const ownDescriptors = 256

// ErrDescriptors is the error of an appliance_limits.descriptors the
// process's descriptor limit has no room for.
var ErrDescriptors = errors.New("not enough descriptors")

// raiseNofile raises the soft RLIMIT_NOFILE to the hard limit, as servers
// do at start (Go's os package does as well when the process starts), and
// returns the limit, of which the descriptors for clients are a share.
func raiseNofile() (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("RLIMIT_NOFILE: %w", err)
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			return 0, fmt.Errorf("raising RLIMIT_NOFILE to %d: %w", rl.Max, err)
		}
	}
	return rl.Cur, nil
}

// ErrNoGroup is the error of a socket_group this host does not know.
var ErrNoGroup = errors.New("no such group")

// socketGID returns the group ID socket_group names: its number, or the
// ID of the group of that name on this host (in a container, the image's
// /etc/group: hence numeric IDs for pods' supplemental groups); 0 for "",
// which leaves the socket the appliance's group.
func socketGID(group string) (int, error) {
	if group == "" {
		return 0, nil
	}
	gid, err := config.ParseGroup(group)
	if err != nil {
		return 0, fmt.Errorf("socket_group: %w", err)
	}
	if gid < 0 {
		g, err := user.LookupGroup(group)
		if err != nil {
			return 0, fmt.Errorf("socket_group %q: %w (%w)", group, ErrNoGroup, err)
		}
		if gid, err = strconv.ParseInt(g.Gid, 10, 64); err != nil {
			return 0, fmt.Errorf("socket_group %q: group ID %q: %w", group, g.Gid, err)
		}
	}
	// The control server gives the socket a positive group; group 0 is
	// what an appliance running as root's group gives it anyway.
	if gid == 0 && os.Getegid() != 0 {
		return 0, fmt.Errorf("socket_group %q is group 0, and the appliance runs as group %d", group, os.Getegid())
	}
	return int(gid), nil
}

// Start validates cfg, binds the control socket, the admin socket and the
// metrics address (failing when another appliance serves a socket), opens
// the static ports, recovers the attachments of an earlier run, and starts
// serving. On error, everything it made is undone. logger nil means
// slog.Default().
func Start(ctx context.Context, cfg *config.Config, logger *slog.Logger) (_ *Daemon, err error) {
	if logger == nil {
		logger = slog.Default()
	}
	poll, err := checked(cfg)
	if err != nil {
		return nil, err
	}
	return start(ctx, cfg, poll, logger)
}

// start is Start for a checked cfg.
func start(ctx context.Context, cfg *config.Config, poll appliance.PollMode, logger *slog.Logger) (_ *Daemon, err error) {
	d := &Daemon{cfg: cfg, log: logger, ctx: ctx, errs: make(chan error, 3), health: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dialer net.Dialer
			return dialer.DialContext(ctx, "unix", cfg.AdminSocket)
		},
		DisableKeepAlives: true,
	}}}
	gid, err := socketGID(cfg.SocketGroup)
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	nofile, err := raiseNofile()
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	all, err := applianceLimits(cfg.ApplianceLimits, nofile)
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	if d.app, err = appliance.New(appliance.Options{
		Socket:          cfg.Socket,
		SocketMode:      cfg.SocketMode,
		SocketGID:       gid,
		ListAllDevices:  cfg.ListAllDevices,
		Limits:          limits(cfg.Limits),
		ApplianceLimits: all,
		Poll:            poll,
		LocalSwitch:     cfg.LocalSwitch,
		ECN:             cfg.ECN,
		Linger:          cfg.Linger,
		Logger:          logger,
	}); err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	defer func() {
		if err != nil {
			d.undo()
		}
	}()
	if err := d.app.Control().Listen(); err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	if d.adminLn, err = admin.Listen(cfg.AdminSocket); err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	if cfg.MetricsAddress != "" {
		if d.metricsLn, err = net.Listen("tcp", cfg.MetricsAddress); err != nil {
			return nil, fmt.Errorf("daemon: metrics: %w", err)
		}
	}
	for i, p := range cfg.Ports {
		pc := appliance.PortConfig{
			Namespace: p.Namespace,
			Netns:     p.NamespacePath(),
			Name:      p.Name,
			Addrs:     p.Addresses,
			MTU:       p.MTU,
			Ingress:   p.Impair.Ingress,
			Egress:    p.Impair.Egress,
			Logger:    logger,
		}
		if p.MAC != nil {
			pc.MAC = roce.MAC(p.MAC)
		}
		n, err := d.app.AddPort(pc)
		if err != nil {
			return nil, fmt.Errorf("daemon: port[%d] %s/%s: %w", i, p.Namespace, p.Name, err)
		}
		logger.Info("static port added", "device", n.Name(), "namespace", p.Namespace, "tap", p.Name, "addrs", p.Addresses)
	}

	d.mgr = attach.New(attach.Options{Logger: logger, Open: d.openPort, StateFile: cfg.StateFile})
	if d.rec, err = d.mgr.Recover(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("daemon: %w", err)
		}
		// A state file that cannot be read must not keep the appliance
		// from starting; CNI DEL still removes each pod's leftovers.
		logger.Error("attachments of the previous run not recovered", "state_file", cfg.StateFile, "err", err)
	} else if len(d.rec.Adopted)+len(d.rec.Cleaned) > 0 {
		logger.Info("attachments of the previous run recovered", "adopted", d.rec.Adopted, "cleaned", d.rec.Cleaned, "failed", d.rec.Failed)
	}

	d.adminSrv = &http.Server{Handler: admin.NewServer(d.mgr, admin.WithLogger(logger)), ReadHeaderTimeout: 10 * time.Second}
	d.serve("admin API", func() error { return d.adminSrv.Serve(d.adminLn) })
	if d.metricsLn != nil {
		mux := http.NewServeMux()
		reg := metrics.NewRegistry(d.app, metrics.Options{Attachments: d.attachments})
		mux.Handle("GET /metrics", metrics.Handler(reg))
		mux.HandleFunc("GET /healthz", d.healthz)
		d.metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		d.serve("metrics", func() error { return d.metricsSrv.Serve(d.metricsLn) })
	}
	d.serve("control", func() error { return d.app.Serve(context.WithoutCancel(ctx)) })
	attrs := []any{"socket", cfg.Socket, "admin_socket", cfg.AdminSocket, "devices", len(d.app.NICs()),
		"descriptors", nofile, "client_descriptors", all.Descriptors,
		"local_switch", cfg.LocalSwitch, "poll", cfg.Poll, "procs", runtime.GOMAXPROCS(0)}
	if d.metricsLn != nil {
		attrs = append(attrs, "metrics", d.metricsLn.Addr().String())
	}
	logger.Info("appliance ready", attrs...)
	return d, nil
}

// serve runs a server on a goroutine of its own; when it stops for any
// reason but a shutdown, Wait learns of it.
func (d *Daemon) serve(name string, fn func() error) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		err := fn()
		if err == nil || errors.Is(err, http.ErrServerClosed) {
			return
		}
		select {
		case d.errs <- fmt.Errorf("%s: %w", name, err):
		default:
		}
	}()
}

// openPort is the attach manager's Options.Open: a pod's port becomes a
// device of the appliance.
func (d *Daemon) openPort(cfg appliance.PortConfig) (attach.Port, error) {
	p, err := attach.OpenDevice(d.app, cfg)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// attachments counts the attachments, for the metrics.
func (d *Daemon) attachments() int {
	l, _ := d.mgr.List(context.Background())
	return len(l)
}

// Appliance returns the daemon's appliance.
func (d *Daemon) Appliance() *appliance.Appliance { return d.app }

// Attachments returns the manager of the pods' attachments.
func (d *Daemon) Attachments() *attach.Manager { return d.mgr }

// Recovery returns what Start did with the attachments of an earlier run.
func (d *Daemon) Recovery() attach.Recovery { return d.rec }

// MetricsAddr returns the address the metrics server listens on, nil
// when it is off.
func (d *Daemon) MetricsAddr() net.Addr {
	if d.metricsLn == nil {
		return nil
	}
	return d.metricsLn.Addr()
}

// Health checks what /healthz reports: that the control socket and the
// admin socket accept connections, and the admin API answers.
func (d *Daemon) Health(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	var errs []error
	var dialer net.Dialer
	if c, err := dialer.DialContext(ctx, "unixpacket", d.cfg.Socket); err != nil {
		errs = append(errs, fmt.Errorf("control socket: %w", err))
	} else {
		c.Close()
	}
	if err := d.adminHealth(ctx); err != nil {
		errs = append(errs, fmt.Errorf("admin socket: %w", err))
	}
	return errors.Join(errs...)
}

// adminHealth asks the admin API for its /healthz over a new connection.
func (d *Daemon) adminHealth(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://taproce/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := d.health.Do(req)
	if err != nil {
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err // its text names the made-up URL
		}
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %s", resp.Status)
	}
	return nil
}

// healthz serves /healthz: 200 "ok" when Health passes, 503 with the
// reasons otherwise.
func (d *Daemon) healthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := d.Health(r.Context()); err != nil {
		d.log.Warn("health check failed", "err", err)
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, strings.ReplaceAll(err.Error(), "\n", "; "))
		return
	}
	fmt.Fprintln(w, "ok")
}

// Wait serves until the context given to Start ends or a server fails,
// then shuts the daemon down (Stop). It returns nil when the context
// ended and the shutdown was clean.
func (d *Daemon) Wait() error {
	var cause error
	select {
	case <-d.ctx.Done():
		d.log.Info("shutting down", "reason", context.Cause(d.ctx))
	case cause = <-d.errs:
		d.log.Error("server failed, shutting down", "err", cause)
	}
	if err := d.Stop(); err != nil {
		cause = errors.Join(cause, err)
	}
	if cause != nil {
		return fmt.Errorf("daemon: %w", cause)
	}
	return nil
}

// Stop shuts the daemon down: the admin API stops taking requests, the
// pods' attachments are taken down (their filters removed, so their
// RoCEv2 traffic goes to their own kernel until the next run adopts them
// again), the control server disconnects its clients and removes its
// socket, the ports close and take their TAP devices with them, and the
// HTTP servers finish. Calling it again returns the first result.
func (d *Daemon) Stop() error {
	d.stopOnce.Do(func() { d.stopErr = d.stop() })
	return d.stopErr
}

func (d *Daemon) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	var errs []error
	if err := d.adminSrv.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("admin API: %w", err))
	}
	if err := d.mgr.Close(); err != nil {
		errs = append(errs, fmt.Errorf("detaching pods' ports: %w", err))
	}
	if d.metricsSrv != nil {
		if err := d.metricsSrv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("metrics: %w", err))
		}
	}
	if err := d.app.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing the appliance: %w", err))
	}
	d.wg.Wait()
	errs = append(errs, removeSocket(d.cfg.AdminSocket), removeSocket(d.cfg.Socket))
	err := errors.Join(errs...)
	if err != nil {
		d.log.Error("shutdown incomplete", "err", err)
	} else {
		d.log.Info("appliance stopped")
	}
	return err
}

// undo releases what a failed Start made.
func (d *Daemon) undo() {
	if d.mgr != nil {
		if err := d.mgr.Close(); err != nil {
			d.log.Warn("undoing start: detaching", "err", err)
		}
	}
	if err := d.app.Close(); err != nil {
		d.log.Warn("undoing start: closing the appliance", "err", err)
	}
	if d.adminLn != nil {
		d.adminLn.Close()
	}
	if d.metricsLn != nil {
		d.metricsLn.Close()
	}
}

// removeSocket removes a socket file that closing its listener left (an
// abstract socket has none).
func removeSocket(path string) error {
	if path == "" || strings.HasPrefix(path, "@") {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing socket: %w", err)
	}
	return nil
}
