package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/internal/testnet"
	"github.com/taproce/taproce/verbs"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// freePort returns a loopback TCP address nobody listens on right now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func httpGet(url string) (int, string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// TestRunHelperOpen is not a test: TestRunCommand runs the test binary
// with it inside the port's namespace, as an application there.
func TestRunHelperOpen(t *testing.T) {
	name := os.Getenv("TAPROCE_TEST_RUN_OPEN")
	if name == "" {
		t.Skip("helper process of TestRunCommand")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := verbs.Open(ctx, name)
	if err != nil {
		fmt.Printf("RESULT error %v\n", err)
		return
	}
	defer c.Close()
	g, err := c.GID(1)
	fmt.Printf("RESULT opened %s gid1 %v %v\n", name, g, err)
}

// TestRunCommand runs `taproce run` in this process with one static port
// in a namespace made here: /healthz and /metrics answer, an application
// in the namespace opens the port's device, and SIGTERM shuts it down
// with exit status 0, taking the sockets and the TAP device with it.
func TestRunCommand(t *testing.T) {
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skipf("needs ip (iproute2) to run the application in the namespace: %v", err)
	}
	ns, nsPath := testnet.Namespace(t)
	dir := t.TempDir()
	socket, adminSocket := filepath.Join(dir, "taproce.sock"), filepath.Join(dir, "admin.sock")
	metrics := freePort(t)
	cfgPath := filepath.Join(dir, "taproce.toml")
	cfgText := fmt.Sprintf(`socket = %q
admin_socket = %q
state_file = %q
metrics_address = %q
poll = "block"

[limits]
qps = 8

[[port]]
namespace = %q
addresses = ["10.95.0.1/24"]
mtu = 4200
`, socket, adminSocket, filepath.Join(dir, "attachments.json"), metrics, ns)
	if err := os.WriteFile(cfgPath, []byte(cfgText), 0o644); err != nil {
		t.Fatal(err)
	}

	// SIGTERM reaches this channel too, so that the test process survives
	// it whatever happens to the command.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	defer signal.Stop(sigs)

	var stderr syncBuffer
	exit := make(chan int, 1)
	go func() {
		exit <- Main([]string{"run", "--config", cfgPath, "--log-level", "debug"}, io.Discard, &stderr)
	}()

	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body, err := httpGet("http://" + metrics + "/healthz")
		if err == nil && code == 200 && body == "ok\n" {
			break
		}
		select {
		case c := <-exit:
			t.Fatalf("taproce run exited with %d:\n%s", c, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz: %d %q %v\n%s", code, body, err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	code, text, err := httpGet("http://" + metrics + "/metrics")
	series := fmt.Sprintf(`device="taproce0",port="%s/roce0"`, ns)
	for _, want := range []string{
		"taproce_port_rx_frames_total{" + series + "} ",
		"taproce_port_tx_frames_total{" + series + "} ",
		"taproce_port_mtu_bytes{" + series + "} 4200",
		"taproce_transport_retransmits_total{" + series + "} 0",
		"taproce_ports 1",
	} {
		if err != nil || code != 200 || !strings.Contains(text, want) {
			t.Fatalf("/metrics (%d, %v) has no %q:\n%s", code, err, want, text)
		}
	}

	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestRunHelperOpen$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "TAPROCE_SOCKET="+socket, "TAPROCE_TEST_RUN_OPEN=taproce0")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "RESULT opened taproce0 gid1 10.95.0.1 <nil>") {
		t.Fatalf("the application in %s: %v\n%s", ns, err, out)
	}

	stopOnSIGTERM(t, exit, &stderr, "run", 20*time.Second)
	for _, p := range []string{socket, adminSocket} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind (%v)", p, err)
		}
	}
	err = netnsutil.Do(nsPath, func(h *netlink.Handle) error {
		if l, err := h.LinkByName("roce0"); err == nil {
			return fmt.Errorf("TAP device %s left behind", l.Attrs().Name)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	logs := stderr.String()
	for _, want := range []string{`"msg":"appliance ready"`, `"msg":"client opened device"`, `"msg":"shutting down"`, `"msg":"appliance stopped"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("no %s in the logs:\n%s", want, logs)
		}
	}
}

// TestRunCommandLine: the command's usage errors and a configuration that
// does not load.
func TestRunCommandLine(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(bad, []byte("poll = \"busy\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(t.TempDir(), "good.toml")
	if err := os.WriteFile(good, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"run"}, 2, "taproce run: --config FILE is required (config/taproce.toml in the source tree is an example; `taproce config FILE` checks one)\n\nUsage: taproce run --config FILE"},
		{[]string{"run", "--log-level", "info"}, 2, "taproce run: --config FILE is required"},
		{[]string{"run", "-h"}, 0, "Usage"},
		{[]string{"run", "--config", bad, "extra"}, 2, "taproce run: unexpected arguments [\"extra\"]\n\nUsage"},
		{[]string{"run", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"run", "--config", "/nonexistent.toml"}, 1, "no such file"},
		{[]string{"run", "--config", bad}, 1, bad + `:1: poll: "busy" is not one of adaptive, block, spin`},
		{[]string{"run", "--config", good, "--log-level", "loud"}, 2, `log level "loud"`},
		{[]string{"run", "--config", good, "--log-format", "xml"}, 2, `log format "xml"`},
	} {
		code, _, errOut := runCmd(tt.args...)
		if code != tt.code || !strings.Contains(errOut, tt.err) {
			t.Errorf("taproce %v: exit %d, stderr %q; want %d and %q", tt.args, code, errOut, tt.code, tt.err)
		}
	}
}

// stopOnSIGTERM sends this process SIGTERM, which the command running in
// Main (reporting on exit) must take as its signal to stop: it must exit
// 0 within wait.
func stopOnSIGTERM(t *testing.T, exit <-chan int, stderr *syncBuffer, name string, wait time.Duration) {
	t.Helper()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-exit:
		if c != 0 {
			t.Fatalf("exit status %d after SIGTERM:\n%s", c, stderr.String())
		}
	case <-time.After(wait):
		t.Fatalf("taproce %s did not stop on SIGTERM:\n%s", name, stderr.String())
	}
}
