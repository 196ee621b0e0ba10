package cli

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// registrar plays the kubelet's registration service.
type registrar struct {
	pluginapi.UnimplementedRegistrationServer
	regs chan *pluginapi.RegisterRequest
}

func (r *registrar) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r.regs <- req
	return &pluginapi.Empty{}, nil
}

// TestDevicePluginCommand: `taproce device-plugin` writes its CDI spec,
// registers taproce.io/roce with a kubelet (played here) in the directory
// it is given, answers its /healthz with 200 once registered, and exits 0
// on SIGTERM; a bad flag or setting is a usage error.
func TestDevicePluginCommand(t *testing.T) {
	for _, args := range [][]string{{"--slots=-1"}, {"--resource=roce"}, {"--kubelet-dir=relative"}, {"extra"}, {"--nonsense"}} {
		if code, _, _ := runCmd(append([]string{"device-plugin"}, args...)...); code != 2 {
			t.Errorf("device-plugin %v: exit %d, want 2", args, code)
		}
	}

	dir := t.TempDir()
	kubeletDir, cdiDir := filepath.Join(dir, "device-plugins"), filepath.Join(dir, "cdi")
	if err := os.Mkdir(kubeletDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(kubeletDir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	reg := &registrar{regs: make(chan *pluginapi.RegisterRequest, 4)}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, reg)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	adminLn, err := net.Listen("unix", filepath.Join(dir, "admin.sock"))
	if err != nil {
		t.Fatal(err)
	}
	admin := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })}
	go func() { _ = admin.Serve(adminLn) }()
	defer admin.Close()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	defer signal.Stop(sigs)
	health := freePort(t)
	var stderr syncBuffer
	exit := make(chan int, 1)
	go func() {
		exit <- Main([]string{"device-plugin", "--kubelet-dir", kubeletDir, "--admin-socket", filepath.Join(dir, "admin.sock"),
			"--cdi-dir", cdiDir, "--health-address", health, "--log-format", "text"}, io.Discard, &stderr)
	}()
	select {
	case r := <-reg.regs:
		if r.ResourceName != "taproce.io/roce" || r.Endpoint != "taproce.sock" || r.Version != pluginapi.Version {
			t.Errorf("registration %+v", r)
		}
	case c := <-exit:
		t.Fatalf("taproce device-plugin exited with %d:\n%s", c, stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatalf("no registration:\n%s", stderr.String())
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, body, err := httpGet("http://" + health + "/healthz")
		if err == nil && code == 200 && body == "ok\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz: %d %q %v\n%s", code, body, err, stderr.String())
		}
	}
	b, err := os.ReadFile(filepath.Join(cdiDir, "taproce.io-roce.json"))
	var spec struct {
		Kind    string `json:"kind"`
		Devices []struct {
			Name string `json:"name"`
		} `json:"devices"`
	}
	if err != nil || json.Unmarshal(b, &spec) != nil || spec.Kind != "taproce.io/roce" || len(spec.Devices) != 1 || spec.Devices[0].Name != "all" {
		t.Errorf("the CDI spec: %v\n%s", err, b)
	}

	stopOnSIGTERM(t, exit, &stderr, "device-plugin", 10*time.Second)
}
