// Package deviceplugin is taproce's Kubernetes device plugin (the
// kubelet's device-plugin API, v1beta1): it registers the resource
// taproce.io/roce with the kubelet as a number of shared slots, each
// healthy while the node's appliance answers its health check, and answers
// Allocate with what a container needs to run an unmodified RDMA program
// on taproce — the appliance's socket directory and taproce's libraries
// mounted from the node, TAPROCE_SOCKET and LD_LIBRARY_PATH set — so that
// a pod asks for `taproce.io/roce: 1` instead of mounting host paths of
// its own, as with k8s-rdma-shared-dev-plugin. The slots are shared: each
// pod gets its own verbs device from the CNI plugin (the port of its
// network), so a slot is a seat at the appliance, not a device.
//
// The plugin serves on a socket of its own in the kubelet's device-plugin
// directory, registers on the kubelet's socket there, and registers again
// whenever the kubelet's socket is made anew (a kubelet restart removes
// every socket of the directory, the plugin's included, which it then
// serves again). It talks to the appliance only through its admin API
// (GET /healthz), as the CNI plugin does.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/taproce/taproce/appliance/admin"
)

// Defaults of Config.
const (
	DefaultResource       = "taproce.io/roce"
	DefaultSlots          = 64
	DefaultEndpoint       = "taproce.sock"
	DefaultHealthInterval = 5 * time.Second
	// DefaultSocketDir holds the appliance's control socket on the node
	// and in the container; DefaultLibDir taproce's libibverbs.so.1 and
	// librdmacm.so.1 (the DaemonSet's entrypoint installs them there).
	DefaultSocketDir = "/run/taproce"
	DefaultLibDir    = "/opt/taproce/lib"
)

// Errors of New.
var (
	// ErrConfig: a setting that cannot work (a resource name that is not
	// domain/name, no slots, relative paths).
	ErrConfig = errors.New("deviceplugin: invalid configuration")
)

// Config describes a plugin; zero fields take the defaults.
type Config struct {
	// Resource is the extended resource's name, "domain/name".
	Resource string
	// Slots is how many pods of the node may hold the resource at once.
	Slots int
	// KubeletDir is the kubelet's device-plugin directory, which holds
	// its registration socket (kubelet.sock) and the plugin's.
	KubeletDir string
	// Endpoint is the name of the plugin's socket in KubeletDir.
	Endpoint string
	// AdminSocket is the appliance's admin API, whose /healthz makes the
	// slots healthy.
	AdminSocket string
	// SocketDir is the directory of the appliance's control socket on the
	// node, mounted at the same path in containers; Socket the socket's
	// name in it.
	SocketDir, Socket string
	// LibDir is the directory of taproce's C libraries on the node,
	// mounted read-only at the same path in containers and put first in
	// their LD_LIBRARY_PATH.
	LibDir string
	// HealthInterval is how often the appliance's health is checked.
	HealthInterval time.Duration
	// Logger receives the plugin's log (default: slog.Default()).
	Logger *slog.Logger
}

func (c *Config) defaults() error {
	if c.Resource == "" {
		c.Resource = DefaultResource
	}
	if c.Slots == 0 {
		c.Slots = DefaultSlots
	}
	if c.KubeletDir == "" {
		c.KubeletDir = pluginapi.DevicePluginPath
	}
	if c.Endpoint == "" {
		c.Endpoint = DefaultEndpoint
	}
	if c.AdminSocket == "" {
		c.AdminSocket = admin.DefaultSocket
	}
	if c.SocketDir == "" {
		c.SocketDir = DefaultSocketDir
	}
	if c.Socket == "" {
		c.Socket = "taproce.sock"
	}
	if c.LibDir == "" {
		c.LibDir = DefaultLibDir
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = DefaultHealthInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	var errs []error
	if domain, name, ok := cut(c.Resource); !ok || domain == "" || name == "" {
		errs = append(errs, fmt.Errorf("resource %q is not domain/name", c.Resource))
	}
	if c.Slots < 0 || c.Slots > 100000 {
		errs = append(errs, fmt.Errorf("slots %d outside 1…100000", c.Slots))
	}
	for _, p := range []struct{ name, path string }{{"kubelet_dir", c.KubeletDir}, {"admin_socket", c.AdminSocket},
		{"socket_dir", c.SocketDir}, {"lib_dir", c.LibDir}} {
		if !filepath.IsAbs(p.path) {
			errs = append(errs, fmt.Errorf("%s %q is not an absolute path", p.name, p.path))
		}
	}
	if c.Endpoint != filepath.Base(c.Endpoint) || c.Endpoint == pluginapi.KubeletSocket || c.Endpoint == "kubelet.sock" {
		errs = append(errs, fmt.Errorf("endpoint %q is not a socket name of its own", c.Endpoint))
	}
	if c.HealthInterval < 0 {
		errs = append(errs, fmt.Errorf("health interval %v is negative", c.HealthInterval))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	return nil
}

// cut splits a resource name at its slash.
func cut(s string) (domain, name string, ok bool) {
	i := len(s) - 1
	for i >= 0 && s[i] != '/' {
		i--
	}
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// Plugin is a device plugin; Run serves it.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	cfg    Config
	log    *slog.Logger
	health *admin.Client

	mu      sync.Mutex
	healthy bool
	changed chan struct{} // closed and replaced when healthy changes

	registered atomic.Bool // with the kubelet, whose socket has not changed since
}

// New returns a plugin for cfg.
func New(cfg Config) (*Plugin, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	return &Plugin{cfg: cfg, log: cfg.Logger, health: admin.NewClient(cfg.AdminSocket), changed: make(chan struct{})}, nil
}

// Config returns the plugin's configuration, defaults filled in.
func (p *Plugin) Config() Config { return p.cfg }

// Run serves the plugin until ctx ends: it checks the appliance's health
// every HealthInterval, serves the device-plugin API on its socket,
// registers with the kubelet, and serves and registers anew each time the
// kubelet's socket is made again. It returns nil when ctx ends.
func (p *Plugin) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.watchHealth(ctx)
	}()
	defer wg.Wait()
	kubelet := filepath.Join(p.cfg.KubeletDir, filepath.Base(pluginapi.KubeletSocket))
	for {
		// Wait for a kubelet to register with.
		id, err := waitSocket(ctx, kubelet, nil)
		if err != nil {
			return nil
		}
		srv, err := p.serve()
		if err != nil {
			return err
		}
		if err := p.register(ctx, kubelet); err != nil {
			p.log.Warn("device plugin: registering with the kubelet failed; trying again", "err", err)
			srv.Stop()
			if sleep(ctx, time.Second) != nil {
				return nil
			}
			continue
		}
		p.log.Info("device plugin: registered with the kubelet", "resource", p.cfg.Resource, "slots", p.cfg.Slots,
			"endpoint", filepath.Join(p.cfg.KubeletDir, p.cfg.Endpoint))
		p.registered.Store(true)
		// Serve until the kubelet's socket goes or is made anew: a
		// restarted kubelet, which clears the directory of ours too.
		_, err = waitSocket(ctx, kubelet, &id)
		p.registered.Store(false)
		srv.Stop()
		if err != nil {
			return nil
		}
		p.log.Info("device plugin: the kubelet's socket changed; registering again once it is there")
	}
}

// ServeHTTP answers the plugin's own health check (GET /healthz, for
// the DaemonSet's probes): 200 while it is registered with the kubelet,
// 503 while it waits for one. The slots' health is the appliance's, in
// ListAndWatch.
func (p *Plugin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path != "/healthz":
		http.NotFound(w, r)
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	case !p.registered.Load():
		http.Error(w, "not registered with the kubelet", http.StatusServiceUnavailable)
	default:
		_, _ = io.WriteString(w, "ok\n")
	}
}

// serve starts the gRPC server on the plugin's socket.
func (p *Plugin) serve() (*grpc.Server, error) {
	path := filepath.Join(p.cfg.KubeletDir, p.cfg.Endpoint)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("deviceplugin: removing the old socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("deviceplugin: %w", err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(ln) }()
	return srv, nil
}

// register calls the kubelet's Register.
func (p *Plugin) register(ctx context.Context, kubelet string) error {
	conn, err := grpc.NewClient("unix://"+kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("deviceplugin: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: p.cfg.Endpoint, ResourceName: p.cfg.Resource,
		Options: p.options(),
	})
	if err != nil {
		return fmt.Errorf("deviceplugin: Register: %w", err)
	}
	return nil
}

// socketID tells a socket file from one made anew at the same path: a
// file removed and made again at once may get the same inode number, not
// the same change time.
type socketID struct {
	dev, ino    uint64
	ctime, nsec int64
}

// waitSocket waits until path is a socket and returns its identity; with
// last, until it is no longer that one (gone, or made anew). It returns
// an error when ctx ends.
func waitSocket(ctx context.Context, path string, last *socketID) (socketID, error) {
	for {
		var st syscall.Stat_t
		err := syscall.Stat(path, &st)
		isSocket := err == nil && st.Mode&syscall.S_IFMT == syscall.S_IFSOCK
		id := socketID{uint64(st.Dev), st.Ino, st.Ctim.Sec, st.Ctim.Nsec}
		switch {
		case last == nil && isSocket:
			return id, nil
		case last != nil && (!isSocket || id != *last):
			return id, nil
		}
		if err := sleep(ctx, socketPoll); err != nil {
			return socketID{}, err
		}
	}
}

// socketPoll is how often the kubelet's socket is looked at.
const socketPoll = 500 * time.Millisecond

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// watchHealth checks the appliance's health now and every HealthInterval.
func (p *Plugin) watchHealth(ctx context.Context) {
	for {
		cctx, cancel := context.WithTimeout(ctx, p.cfg.HealthInterval)
		err := p.health.Health(cctx)
		if err != nil && errors.Is(err, admin.ErrUnavailable) && ctx.Err() == nil {
			// A kept connection to an appliance that restarted fails
			// once; a new one tells.
			err = p.health.Health(cctx)
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		p.setHealthy(err == nil, err)
		if sleep(ctx, p.cfg.HealthInterval) != nil {
			return
		}
	}
}

func (p *Plugin) setHealthy(ok bool, why error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ok == p.healthy {
		return
	}
	p.healthy = ok
	close(p.changed)
	p.changed = make(chan struct{})
	if ok {
		p.log.Info("device plugin: the appliance answers; the slots are healthy")
	} else {
		p.log.Warn("device plugin: the appliance does not answer; the slots are unhealthy", "err", why)
	}
}

// state returns the slots' health and a channel closed when it changes.
func (p *Plugin) state() (bool, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.healthy, p.changed
}

// devices lists the slots with health h.
func (p *Plugin) devices(healthy bool) []*pluginapi.Device {
	h := pluginapi.Unhealthy
	if healthy {
		h = pluginapi.Healthy
	}
	ds := make([]*pluginapi.Device, p.cfg.Slots)
	for i := range ds {
		ds[i] = &pluginapi.Device{ID: slotID(i), Health: h}
	}
	return ds
}

// slotID names slot i.
func slotID(i int) string { return "roce-" + strconv.Itoa(i) }

func (p *Plugin) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions implements the device-plugin API: no
// PreStartContainer, a preferred allocation.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.options(), nil
}

// ListAndWatch implements the device-plugin API: the slots, and again
// whenever their health changes, until the kubelet hangs up.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		healthy, changed := p.state()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices(healthy)}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// GetPreferredAllocation implements the device-plugin API: the slots
// that must be included, then the lowest-numbered available ones — any
// slot is as good as another.
func (p *Plugin) GetPreferredAllocation(_ context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range r.ContainerRequests {
		ids := slices.Clone(c.MustIncludeDeviceIDs)
		avail := slices.Clone(c.AvailableDeviceIDs)
		slices.SortFunc(avail, func(a, b string) int { return slotNumber(a) - slotNumber(b) })
		for _, id := range avail {
			if len(ids) >= int(c.AllocationSize) {
				break
			}
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// slotNumber is the number of a slot's ID; IDs not of a slot sort last.
func slotNumber(id string) int {
	if len(id) > 5 && id[:5] == "roce-" {
		if n, err := strconv.Atoi(id[5:]); err == nil {
			return n
		}
	}
	return 1 << 30
}

// ErrUnknownSlot: Allocate named a device the plugin does not have.
var ErrUnknownSlot = errors.New("deviceplugin: no such slot")

// Allocate implements the device-plugin API: for each container, the
// appliance's socket directory and taproce's libraries, mounted read-only
// from the node at the same paths, TAPROCE_SOCKET and LD_LIBRARY_PATH.
func (p *Plugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range r.ContainerRequests {
		for _, id := range c.DevicesIds {
			if n := slotNumber(id); n < 0 || n >= p.cfg.Slots {
				return nil, fmt.Errorf("%w: %q", ErrUnknownSlot, id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, p.containerEdits())
	}
	return resp, nil
}

// containerEdits is what a container holding a slot gets.
func (p *Plugin) containerEdits() *pluginapi.ContainerAllocateResponse {
	return &pluginapi.ContainerAllocateResponse{
		Envs: map[string]string{
			"TAPROCE_SOCKET":  filepath.Join(p.cfg.SocketDir, p.cfg.Socket),
			"LD_LIBRARY_PATH": p.cfg.LibDir,
		},
		Mounts: []*pluginapi.Mount{
			// Read-only as the example pods mount it: connecting to a
			// socket needs no write access to its file system.
			{ContainerPath: p.cfg.SocketDir, HostPath: p.cfg.SocketDir, ReadOnly: true},
			{ContainerPath: p.cfg.LibDir, HostPath: p.cfg.LibDir, ReadOnly: true},
		},
	}
}
