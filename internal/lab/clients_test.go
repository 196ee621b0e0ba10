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

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/internal/perf"
	"github.com/taproce/taproce/internal/pingpong"
	"github.com/taproce/taproce/internal/testnet"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/gocm"
)

// listenEnv makes this test binary, run as a helper process, listen on
// TCP port "PORT" after "DELAY" (a time.Duration) and wait to be killed:
// a server that starts slowly.
const listenEnv = "TAPROCE_LAB_TEST_LISTEN"

func TestMain(m *testing.M) {
	gocm.RunIfHelper() // TestLabGoRDMACM's Go side
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

// TestParseDatagrams: a bounded UD pingpong's count adds up both sides'
// datagrams lines; a side without one is no count.
func TestParseDatagrams(t *testing.T) {
	const line = "datagrams: %d sent, %d received, %d lost (each waited for 50ms at most)\n"
	for _, c := range []struct {
		name string
		outs []string
		want datagrams
		ok   bool
		str  string
	}{
		{"both sides", []string{
			"  local address: …\n" + fmt.Sprintf(line, 990, 990, 10),
			fmt.Sprintf(line, 1000, 978, 22) + "1000 iters in 0.20 seconds = 200.00 usec/iter\n",
		}, datagrams{1990, 1968}, true, "1968 of 1990 datagrams, 22 lost"},
		{"nothing lost", []string{fmt.Sprintf(line, 5, 5, 0), fmt.Sprintf(line, 5, 5, 0)}, datagrams{10, 10}, true, "10 of 10 datagrams, 0 lost"},
		{"a side without the line", []string{fmt.Sprintf(line, 5, 5, 0), "1000 iters in 0.20 seconds = 200.00 usec/iter\n"}, datagrams{}, false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := parseDatagrams(c.outs...)
			if ok != c.ok || ok && (got != c.want || got.String() != c.str) {
				t.Errorf("%+v %v %q; want %+v %v %q", got, ok, got.String(), c.want, c.ok, c.str)
			}
		})
	}
}

// TestFaults: what the lab calls its faults, which makes its UD pingpong
// count lost datagrams, and how long that waits for each.
func TestFaults(t *testing.T) {
	loss := impair.Spec{Loss: 0.01}
	for _, c := range []struct {
		spec       impair.Spec
		kernelLoss int
		what       string
		wait       time.Duration
	}{
		{impair.Spec{}, 0, "", 50 * time.Millisecond},
		{loss, 0, "impaired link", 50 * time.Millisecond},
		{impair.Spec{Delay: 10 * time.Millisecond}, 0, "impaired link", 90 * time.Millisecond},
		{impair.Spec{}, 1, "kernel loss", 50 * time.Millisecond},
		{loss, 1, "impaired link, kernel loss", 50 * time.Millisecond},
	} {
		f := newFaults(c.spec, c.kernelLoss)
		if f.what != c.what || f.udWait() != c.wait || f.delivery != expectedDelivery(c.spec, c.kernelLoss) {
			t.Errorf("%v, kernel loss %d%%: %q, wait %v, delivery %v; want %q, %v", c.spec, c.kernelLoss, f.what, f.udWait(), f.delivery, c.what, c.wait)
		}
	}
}

// TestPrintPerf: the perf table states the configuration its figures
// were measured in, and says why they are not the measured ones where
// they may not be — at MTU 1500 pointing to --mtu 9000 — and nothing
// when the configuration is the measured one.
func TestPrintPerf(t *testing.T) {
	rows := []perfRow{
		{run: perfRun{"write_bw", 65536, 2000}, ok: true, bw: 920, rate: 0.0147},
		{run: perfRun{"send_lat", 2, 1000}, ok: true, lat: 9.5},
	}
	measured := perfConfig{mtu: 9000, pathMTU: 4096, superFrames: true, poll: appliance.PollAdaptive, procs: 2}
	for _, c := range []struct {
		name  string
		conf  func(c *perfConfig)
		at    string
		notes []string
	}{
		{"measured", func(*perfConfig) {}, "MTU 9000 (RoCE path MTU 4096), super-frames on, poll adaptive, appliance on 2 processors, local switch off", nil},
		{"default MTU", func(c *perfConfig) { c.mtu, c.pathMTU = 1500, 1024 },
			"MTU 1500 (RoCE path MTU 1024)", []string{"At MTU 1500 a 64 KiB message is 64 RoCE packets", "GSO/GRO", "taproce lab --mtu 9000"}},
		{"no super-frames", func(c *perfConfig) { c.superFrames = false }, "super-frames off", []string{"taproce lab --mtu 9000"}},
		{"local switch", func(c *perfConfig) { c.localSwitch = true }, "local switch on", []string{"crossed in memory"}},
		{"faults, own processors", func(c *perfConfig) { c.faults, c.cpus, c.procs = "impaired link", "1", 1 },
			"poll adaptive, appliance on 1 processor (cpus 1, the clients on the others), local switch off, impaired link", []string{"measure retransmission"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			conf := measured
			c.conf(&conf)
			var b strings.Builder
			printPerf(&b, rows, 2044<<20, conf)
			out := b.String()
			flat := strings.ReplaceAll(out, "\n ", " ")
			if !strings.Contains(out, "\n at MTU") || !strings.Contains(flat, c.at) || !strings.Contains(out, "TCP (same veth, median of 5)") {
				t.Errorf("no %q:\n%s", c.at, out)
			}
			notes := strings.Join(conf.notes(), " ")
			if (len(c.notes) == 0) != (notes == "") {
				t.Errorf("notes %q", notes)
			}
			for _, n := range c.notes {
				if !strings.Contains(notes, n) {
					t.Errorf("notes without %q: %q", n, notes)
				}
			}
			// The notes under the table's last rule, wrapped to its width.
			const rule = "-------\n"
			for _, line := range strings.Split(out[strings.LastIndex(out, rule)+len(rule):], "\n") {
				if len(line) > 88 {
					t.Errorf("note line of %d bytes: %q", len(line), line)
				}
			}
		})
	}
}
