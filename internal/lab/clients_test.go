package lab

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/internal/perf"
	"github.com/taproce/taproce/internal/pingpong"
	"github.com/taproce/taproce/internal/testnet"
)

// listenEnv makes this test binary, run as a helper process, listen on
// TCP port "PORT" after "DELAY" (a time.Duration) and wait to be killed:
// a server that starts slowly.
const listenEnv = "TAPROCE_LAB_TEST_LISTEN"

func TestMain(m *testing.M) {
	if v := os.Getenv(listenEnv); v != "" {
		port, delay, _ := strings.Cut(v, " ")
		d, err := time.ParseDuration(delay)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		time.Sleep(d)
		ln, err := net.Listen("tcp", ":"+port)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		defer ln.Close()
		time.Sleep(time.Minute)
		return
	}
	code := m.Run()
	if buildPath != "" {
		os.RemoveAll(filepath.Dir(buildPath))
	}
	os.Exit(code)
}

func TestExchangePort(t *testing.T) {
	for tool, port := range map[string]int{"pingpong": pingpong.DefaultPort, "perf": perf.DefaultPort} {
		if port != exchangePort {
			t.Errorf("lab waits on port %d; %s listens on %d", exchangePort, tool, port)
		}
	}
}

// TestWaitListen: a server is waited for until it listens in its own
// namespace — however slowly it starts — and a server that ends or never
// listens on the port is an error, not a hang.
func TestWaitListen(t *testing.T) {
	ns, _ := testnet.Namespace(t)
	const port = 18515
	for _, c := range []struct {
		name    string
		env     string
		timeout time.Duration
		ok      bool
	}{
		{"slow start", fmt.Sprintf("%d 700ms", port), 20 * time.Second, true},
		{"another port", fmt.Sprintf("%d 0s", port+1), time.Second, false},
		{"ends", "bad", 20 * time.Second, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := startListener(t, ns, c.env)
			start := time.Now()
			err := cl.waitListen(ns, port, c.timeout)
			if (err == nil) != c.ok {
				t.Fatalf("waitListen: %v (output %q)", err, cl.output())
			}
			if c.ok && time.Since(start) < 700*time.Millisecond {
				t.Errorf("listening after %v, before the server listened", time.Since(start))
			}
			if !c.ok && time.Since(start) > c.timeout+5*time.Second {
				t.Errorf("took %v", time.Since(start))
			}
			t.Logf("%v after %v", err, time.Since(start))
		})
	}
	// A listener on the port outside the namespace does not count.
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		t.Skipf("port %d in use here: %v", port, err)
	}
	defer ln.Close()
	cl := startListener(t, ns, fmt.Sprintf("%d 1h", port))
	if err := cl.waitListen(ns, port, 500*time.Millisecond); err == nil {
		t.Error("a listener in another namespace was taken for the server")
	}
}

// startListener runs this test binary in namespace ns as a helper that
// listens as env (listenEnv) says; it is killed when the test ends.
func startListener(t *testing.T, ns, env string) *client {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, self, "-test.run=^$")
	cmd.Env = append(os.Environ(), listenEnv+"="+env)
	cl, err := runClient(cmd, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.wait(time.Millisecond) })
	return cl
}
