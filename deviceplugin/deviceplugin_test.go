package deviceplugin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdi "tags.cncf.io/container-device-interface/specs-go"
)

// kubelet plays the kubelet's registration service on dir/kubelet.sock.
type kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	srv  *grpc.Server
	regs chan *pluginapi.RegisterRequest
}

func startKubelet(t *testing.T, dir string) *kubelet {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{srv: grpc.NewServer(), regs: make(chan *pluginapi.RegisterRequest, 8)}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(ln) }()
	t.Cleanup(k.srv.Stop)
	return k
}

func (k *kubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.regs <- r
	return &pluginapi.Empty{}, nil
}

// registered waits for the plugin's next registration and checks it.
func (k *kubelet) registered(t *testing.T) {
	t.Helper()
	select {
	case r := <-k.regs:
		if r.Version != pluginapi.Version || r.Endpoint != DefaultEndpoint || r.ResourceName != DefaultResource ||
			r.Options == nil || !r.Options.GetPreferredAllocationAvailable || r.Options.PreStartRequired {
			t.Fatalf("registration %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin did not register")
	}
}

// appliance plays the appliance's admin API: /healthz answers while it
// runs.
type appliance struct {
	path string
	srv  *http.Server
}

func startAppliance(t *testing.T, path string) *appliance {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	a := &appliance{path: path, srv: &http.Server{Handler: mux}}
	go func() { _ = a.srv.Serve(ln) }()
	t.Cleanup(func() { a.srv.Close() })
	return a
}

// dial connects to the plugin's socket in dir.
func dial(t *testing.T, dir string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, DefaultEndpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// nextHealth reads ListAndWatch's answers until all slots have health
// want, and fails the test after 10 s.
func nextHealth(t *testing.T, stream pluginapi.DevicePlugin_ListAndWatchClient, slots int, want string) {
	t.Helper()
	for {
		r, err := stream.Recv()
		if err != nil {
			t.Fatalf("ListAndWatch, waiting for %s: %v", want, err)
		}
		if len(r.Devices) != slots {
			t.Fatalf("ListAndWatch: %d devices, want %d", len(r.Devices), slots)
		}
		all := true
		for i, d := range r.Devices {
			if d.ID != slotID(i) {
				t.Fatalf("device %d is %q", i, d.ID)
			}
			all = all && d.Health == want
		}
		if all {
			return
		}
	}
}

// TestPlugin plays the kubelet and the appliance around a plugin: it
// registers taproce.io/roce, lists its slots healthy while the appliance
// answers, unhealthy while it does not and healthy again when it is
// back; Allocate gives each container the appliance's socket directory
// and the libraries, mounted, and the environment that points programs
// at them; GetPreferredAllocation keeps what must be included and adds
// the lowest slots; a kubelet restarted (its socket, and the plugin's,
// made anew) gets the plugin's registration again, and the plugin serves
// on its socket again; Run ends when its context does.
func TestPlugin(t *testing.T) {
	dir := t.TempDir()
	adminSock := filepath.Join(t.TempDir(), "admin.sock")
	app := startAppliance(t, adminSock)
	k := startKubelet(t, dir)
	const slots = 4
	p, err := New(Config{Slots: slots, KubeletDir: dir, AdminSocket: adminSock, HealthInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not end with its context")
		}
	}()
	k.registered(t)
	for deadline := time.Now().Add(10 * time.Second); healthz(t, p) != http.StatusOK; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("/healthz once registered: not 200")
		}
	}

	c := dial(t, dir)
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	opts, err := c.GetDevicePluginOptions(sctx, &pluginapi.Empty{})
	if err != nil || !opts.GetPreferredAllocationAvailable || opts.PreStartRequired {
		t.Fatalf("options %+v, %v", opts, err)
	}
	stream, err := c.ListAndWatch(sctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	nextHealth(t, stream, slots, pluginapi.Healthy)
	app.srv.Close()
	nextHealth(t, stream, slots, pluginapi.Unhealthy)
	os.Remove(adminSock)
	startAppliance(t, adminSock)
	nextHealth(t, stream, slots, pluginapi.Healthy)

	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"roce-0"}}, {DevicesIds: []string{"roce-3", "roce-1"}}}})
	if err != nil || len(resp.ContainerResponses) != 2 {
		t.Fatalf("Allocate: %+v, %v", resp, err)
	}
	for _, r := range resp.ContainerResponses {
		if r.Envs["TAPROCE_SOCKET"] != "/run/taproce/taproce.sock" || r.Envs["LD_LIBRARY_PATH"] != "/opt/taproce/lib" || len(r.Envs) != 2 {
			t.Errorf("environment %v", r.Envs)
		}
		want := []*pluginapi.Mount{{ContainerPath: "/run/taproce", HostPath: "/run/taproce", ReadOnly: true},
			{ContainerPath: "/opt/taproce/lib", HostPath: "/opt/taproce/lib", ReadOnly: true}}
		if !slices.EqualFunc(r.Mounts, want, func(a, b *pluginapi.Mount) bool {
			return a.ContainerPath == b.ContainerPath && a.HostPath == b.HostPath && a.ReadOnly == b.ReadOnly
		}) {
			t.Errorf("mounts %v", r.Mounts)
		}
	}
	for _, id := range []string{"roce-4", "roce--1", "gpu-0", ""} {
		if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: []string{id}}}}); err == nil || !strings.Contains(err.Error(), ErrUnknownSlot.Error()) {
			t.Errorf("Allocate of %q: %v", id, err)
		}
	}

	pref, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"roce-3", "roce-1", "roce-2"}, MustIncludeDeviceIDs: []string{"roce-3"}, AllocationSize: 2},
		{AvailableDeviceIDs: []string{"roce-2", "roce-0"}, AllocationSize: 1}}})
	if err != nil || len(pref.ContainerResponses) != 2 ||
		!slices.Equal(pref.ContainerResponses[0].DeviceIDs, []string{"roce-3", "roce-1"}) ||
		!slices.Equal(pref.ContainerResponses[1].DeviceIDs, []string{"roce-0"}) {
		t.Fatalf("GetPreferredAllocation: %+v, %v", pref, err)
	}

	// The kubelet restarts: it clears the directory and listens anew.
	scancel()
	k.srv.Stop()
	for _, f := range []string{"kubelet.sock", DefaultEndpoint} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); healthz(t, p) != http.StatusServiceUnavailable; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("/healthz without a kubelet: still 200")
		}
	}
	k = startKubelet(t, dir)
	k.registered(t)
	if _, err := dial(t, dir).GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
		t.Fatalf("the plugin after the kubelet's restart: %v", err)
	}
}

// healthz returns the status of the plugin's GET /healthz.
func healthz(t *testing.T, p *Plugin) int {
	t.Helper()
	w := httptest.NewRecorder()
	p.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	return w.Code
}

// TestConfig: settings that cannot work are refused with ErrConfig.
func TestConfig(t *testing.T) {
	for _, c := range []Config{
		{Resource: "roce"},
		{Resource: "taproce.io/"},
		{Slots: -1},
		{Slots: 100001},
		{KubeletDir: "device-plugins"},
		{AdminSocket: "admin.sock"},
		{SocketDir: "run/taproce"},
		{LibDir: "lib"},
		{Endpoint: "kubelet.sock"},
		{Endpoint: "../taproce.sock"},
		{HealthInterval: -time.Second},
	} {
		if _, err := New(c); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if c := p.Config(); c.Resource != DefaultResource || c.Slots != DefaultSlots || c.KubeletDir != pluginapi.DevicePluginPath {
		t.Errorf("defaults %+v", c)
	}
}

// TestCDISpec: the CDI spec names the resource as its kind, has one
// device, "all", with Allocate's environment and mounts; the file is
// replaced whole, and reads back as the spec.
func TestCDISpec(t *testing.T) {
	p, err := New(Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "cdi")
	for range 2 {
		path, err := p.WriteCDISpec(dir)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(path) != "taproce.io-roce.json" {
			t.Errorf("spec file %s", path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var s cdi.Spec
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			t.Fatal(err)
		}
		if s.Version != CDIVersion || s.Kind != "taproce.io/roce" || len(s.Devices) != 1 || s.Devices[0].Name != "all" {
			t.Fatalf("spec %+v", s)
		}
		e := s.Devices[0].ContainerEdits
		if !slices.Equal(e.Env, []string{"TAPROCE_SOCKET=/run/taproce/taproce.sock", "LD_LIBRARY_PATH=/opt/taproce/lib"}) {
			t.Errorf("environment %v", e.Env)
		}
		if len(e.Mounts) != 2 || e.Mounts[0].HostPath != "/run/taproce" || !slices.Equal(e.Mounts[0].Options, []string{"rbind", "ro"}) ||
			e.Mounts[1].ContainerPath != "/opt/taproce/lib" || !slices.Equal(e.Mounts[1].Options, []string{"rbind", "ro"}) {
			t.Errorf("mounts %+v %+v", e.Mounts[0], e.Mounts[1])
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("the CDI directory holds %d files, want the spec alone", len(ents))
	}
}
