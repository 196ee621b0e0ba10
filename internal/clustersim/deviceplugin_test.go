package clustersim_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/taproce/taproce/images"
)

// kubelet plays the kubelet's registration service.
type kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	regs chan *pluginapi.RegisterRequest
}

func (k *kubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.regs <- r
	return &pluginapi.Empty{}, nil
}

// TestDevicePluginMemory measures `taproce device-plugin` as the
// DaemonSet runs it (its arguments, the kubelet's directory and the admin
// socket moved to the test's): registered with a kubelet (played here),
// with the kubelet's ListAndWatch stream open and a pod's Allocate
// answered, its VmRSS must fit in the DaemonSet's memory request for the
// container, which this measurement sets.
func TestDevicePluginMemory(t *testing.T) {
	bins := binaries(t)
	m, err := images.Find("DaemonSet", "taproce")
	if err != nil {
		t.Fatal(err)
	}
	c := images.Named(images.Get(m.Object, "spec", "template", "spec", "containers"), "device-plugin")
	req, _ := images.Get(c, "resources", "requests", "memory").(string)
	reqMiB, err := strconv.Atoi(strings.TrimSuffix(req, "Mi"))
	if c == nil || err != nil {
		t.Fatalf("the DaemonSet's device-plugin container, memory request %q: %v", req, err)
	}

	dir := t.TempDir()
	kdir := filepath.Join(dir, "device-plugins")
	if err := os.Mkdir(kdir, 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(kdir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{regs: make(chan *pluginapi.RegisterRequest, 1)}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, k)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	adminSock := filepath.Join(dir, "admin.sock")
	aln, err := net.Listen("unix", adminSock)
	if err != nil {
		t.Fatal(err)
	}
	admin := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })}
	go func() { _ = admin.Serve(aln) }()
	defer admin.Close()

	var args []string
	for _, a := range images.Strings(c["args"]) {
		switch {
		case strings.HasPrefix(a, "--admin-socket="):
			a = "--admin-socket=" + adminSock
		case strings.HasPrefix(a, "--health-address="):
			a = "--health-address=127.0.0.1:0"
		}
		args = append(args, a)
	}
	args = append(args, "--kubelet-dir="+kdir, "--cdi-dir="+filepath.Join(dir, "cdi"))
	cmd := exec.Command(filepath.Join(bins, "taproce"), append([]string{"device-plugin"}, args...)...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	select {
	case <-k.regs:
	case <-time.After(30 * time.Second):
		t.Fatalf("no registration:\n%s", out.String())
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(kdir, "taproce.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	plugin := pluginapi.NewDevicePluginClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := plugin.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		r, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Devices) > 0 && r.Devices[0].Health == pluginapi.Healthy {
			break
		}
	}
	if _, err := plugin.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"roce-0"}}}}); err != nil {
		t.Fatal(err)
	}
	rss := rssKiB(t, cmd.Process.Pid)
	t.Logf("taproce device-plugin RSS: %.1f MiB registered, listing and allocating (request %s)", float64(rss)/1024, req)
	if rss > reqMiB<<10 {
		t.Errorf("RSS %.1f MiB is above the DaemonSet's request %s", float64(rss)/1024, req)
	}
}
