package perf

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/internal/impair"
)

// rig is an appliance with two ports (taproce0 10.77.0.1, taproce1
// 10.77.0.2) on a fake wire, serving verbs on a socket in a temporary
// directory that TAPROCE_SOCKET names (as appliance/control's tests set it
// up).
type rig struct {
	app *appliance.Appliance
}

func newRig(t *testing.T, localSwitch bool, mtu int, poll appliance.PollMode) *rig {
	t.Helper()
	return newRigIngress(t, localSwitch, mtu, poll, impair.Spec{})
}

// newRigIngress is newRig whose first port (taproce0, the servers') impairs
// what it receives as in says.
func newRigIngress(t *testing.T, localSwitch bool, mtu int, poll appliance.PollMode, in impair.Spec) *rig {
	t.Helper()
	r := appliancetest.New(t, appliancetest.Options{LocalSwitch: localSwitch, MTU: mtu, Poll: poll, Depth: 4096, Namespace: "perf", Ingress: in})
	return &rig{app: r.App}
}

// pair is the outcome of a server and a client run against each other.
type pair struct {
	server, client       []Result
	serverOut, clientOut string
	serverErr, clientErr error
}

// runPair runs the server on taproce0 and the client on taproce1 with the
// given options (after the test's name) and returns both sides' results.
func runPair(t *testing.T, test string, opts ...string) pair {
	t.Helper()
	return runPairSides(t, test, opts, opts)
}

// runPairSides is runPair with options of each side's own.
func runPairSides(t *testing.T, test string, srvOpts, opts []string) pair {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	scfg, err := ParseArgs(append([]string{test, "-d", "taproce0"}, srvOpts...))
	if err != nil {
		t.Fatal(err)
	}
	scfg.Listener = ln
	scfg.IdleTimeout = 20 * time.Second
	ccfg, err := ParseArgs(append([]string{test, "-d", "taproce1"}, append(opts[:len(opts):len(opts)], ln.Addr().String())...))
	if err != nil {
		t.Fatal(err)
	}
	ccfg.IdleTimeout = 20 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var p pair
	var wg sync.WaitGroup
	var sb, cb bytes.Buffer
	wg.Add(2)
	go func() {
		defer wg.Done()
		p.server, p.serverErr = Run(ctx, scfg, &sb)
		if p.serverErr != nil {
			cancel()
		}
	}()
	go func() {
		defer wg.Done()
		p.client, p.clientErr = Run(ctx, ccfg, &cb)
		if p.clientErr != nil {
			cancel()
		}
	}()
	wg.Wait()
	p.serverOut, p.clientOut = sb.String(), cb.String()
	if p.serverErr != nil || p.clientErr != nil {
		t.Fatalf("%s %q: server: %v\n%s\nclient: %v\n%s", test, opts, p.serverErr, p.serverOut, p.clientErr, p.clientOut)
	}
	return p
}

var (
	bwLine  = regexp.MustCompile(`^ (\d+) +(\d+) +(\d+\.\d\d) +(\d+\.\d\d) *\t\t   (\d+\.\d{6}) *$`)
	latLine = regexp.MustCompile(`^ (\d+) +(\d+) +(\d+\.\d\d) +(\d+\.\d\d) +(\d+\.\d\d) +\t +(\d+\.\d\d) +\t(\d+\.\d\d) *\t\t(\d+\.\d\d) *\t\t(\d+\.\d\d) *$`)
)

// checkTable checks that out is perftest's table with one line per
// result, in order.
func checkTable(t *testing.T, side, out string, test Test, results []Result) {
	t.Helper()
	head := resultFmt
	re := bwLine
	if test.Kind == Lat {
		head, re = resultFmtLat, latLine
	}
	lines := strings.Split(out, "\n")
	at := -1
	for i, l := range lines {
		if l == head {
			at = i
		}
	}
	if len(results) == 0 {
		if at >= 0 {
			t.Errorf("%s printed a results header without results:\n%s", side, out)
		}
		return
	}
	if at < 0 || at == 0 || lines[at-1]+"\n" != resultLine {
		t.Fatalf("%s output lacks the header %q after a %q line:\n%s", side, head, resultLine, out)
	}
	for i, r := range results {
		l := lines[at+1+i]
		m := re.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("%s line %q is not a %v result line", side, l, test.Kind)
			continue
		}
		if m[1] != fmt.Sprint(r.Size) || m[2] != fmt.Sprint(r.Iters) {
			t.Errorf("%s line %q: want %d bytes, %d iterations", side, l, r.Size, r.Iters)
		}
	}
	if l := lines[at+1+len(results)] + "\n"; l != resultLine {
		t.Errorf("%s: no %q after the results, %q", side, resultLine, l)
	}
	for _, want := range []string{test.title(FetchAndAdd), " Link type       : Ethernet", " local address: LID 0000 QPN 0x", " remote address: LID 0000 QPN 0x",
		" GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:77:00:0"} {
		if test.Verb == Atomic {
			want = strings.Replace(want, "FETCH_AND_ADD ", "", 1)
			want = strings.Replace(want, "CMP_AND_SWAP ", "", 1)
			if strings.HasPrefix(want, "Atomic") {
				want = "Atomic"
			}
		}
		if !strings.Contains(out, want) {
			t.Errorf("%s output lacks %q:\n%s", side, want, out)
		}
	}
}

// checkBW checks a bandwidth result.
func checkBW(t *testing.T, r Result, size int, iters uint64) {
	t.Helper()
	if r.BW == nil || r.Size != size || r.Iters != iters || !(r.BW.Avg > 0) || !(r.BW.MsgRate > 0) || r.BW.Peak < 0 || r.BW.Unit != "MB/sec" {
		t.Errorf("result %+v (BW %+v): want %d bytes, %d iterations, positive bandwidth", r, r.BW, size, iters)
		return
	}
	// The average is the message rate times the size, in MB (2^20).
	if want := r.BW.MsgRate * 1e6 * float64(size) / (1 << 20); abs(r.BW.Avg-want) > 1e-6*want+1e-9 {
		t.Errorf("average %v MB/sec, message rate %v Mpps of %d bytes: want %v", r.BW.Avg, r.BW.MsgRate, size, want)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// checkLat checks a latency result.
func checkLat(t *testing.T, r Result, size int, iters uint64) {
	t.Helper()
	l := r.Lat
	if l == nil || r.Size != size || r.Iters != iters || !(l.Min > 0) || l.Min > l.Typical || l.Typical > l.Max ||
		l.Min > l.Avg || l.P99 < l.Typical || l.P999 < l.P99 {
		t.Errorf("result %+v (lat %+v): want %d bytes, %d iterations, ordered times", r, l, size, iters)
	}
}

// TestPairs runs server and client of every test at two sizes over the
// fake wire (path MTU 1024) and over the local switch (path MTU 4096),
// and checks the numbers and the tables.
func TestPairs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every test over an in-process appliance")
	}
	for _, c := range []struct {
		name  string
		local bool
		mtu   int
		poll  appliance.PollMode
	}{{"wire", false, 1500, appliance.PollAdaptive}, {"local-switch", true, 9000, appliance.PollBlock}} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, c.local, c.mtu, c.poll)
			before := r.app.NICs()[1].Engine().Stats()
			var minPackets uint64
			for _, test := range Tests {
				sizes := []int{2, 4500}
				if test.Kind == BW {
					sizes = []int{64, 65536}
				}
				if test.Verb == Atomic {
					sizes = []int{8}
				}
				for _, size := range sizes {
					t.Run(fmt.Sprintf("%v/%d", test, size), func(t *testing.T) {
						const iters = 40
						p := runPair(t, test.String(), "-s", fmt.Sprint(size), "-n", fmt.Sprint(iters), "-F")
						checkTable(t, "client", p.clientOut, test, p.client)
						checkTable(t, "server", p.serverOut, test, p.server)
						if len(p.client) != 1 {
							t.Fatalf("client results %+v", p.client)
						}
						cr := p.client[0]
						wantMTU := 1024
						if c.mtu == 9000 {
							wantMTU = 4096
						}
						if cr.MTU != wantMTU || !strings.Contains(p.clientOut, fmt.Sprintf(" Mtu             : %d[B]\n", wantMTU)) {
							t.Errorf("client ran at MTU %d, want %d", cr.MTU, wantMTU)
						}
						if test.Verb != Read {
							// READ requests are single packets; everything
							// else carries the data from the client.
							minPackets += iters * uint64((size+wantMTU-1)/wantMTU)
						}
						switch {
						case test.Kind == BW:
							checkBW(t, cr, size, iters)
							if len(p.server) != 1 {
								t.Fatalf("server results %+v", p.server)
							}
							sr := p.server[0]
							checkBW(t, sr, size, iters)
							if test.Verb != Send {
								// The server prints the client's numbers.
								if !sr.Remote || sr.BW.Avg != cr.BW.Avg || sr.BW.Peak != cr.BW.Peak || sr.BW.MsgRate != cr.BW.MsgRate {
									t.Errorf("server printed %+v %+v, client %+v %+v", sr, sr.BW, cr, cr.BW)
								}
							} else if sr.BW.Peak != 0 {
								t.Errorf("the SEND server's peak is %v, perftest prints 0", sr.BW.Peak)
							}
						case test.Verb == Read || test.Verb == Atomic:
							checkLat(t, cr, size, iters)
							if len(p.server) != 0 {
								t.Errorf("passive server results %+v", p.server)
							}
						default:
							checkLat(t, cr, size, iters)
							if len(p.server) != 1 {
								t.Fatalf("server results %+v", p.server)
							}
							checkLat(t, p.server[0], size, iters)
						}
					})
				}
			}
			after := r.app.NICs()[1].Engine().Stats()
			if c.local {
				if r.app.Switch().Frames() == 0 {
					t.Error("nothing crossed the local switch")
				}
			} else if sent := after.Sent - before.Sent; sent < minPackets {
				t.Errorf("the clients' NIC sent %d packets, the tests needed at least %d", sent, minPackets)
			}
		})
	}
}

// TestOptions runs the options that change the flow: -a (all sizes, with
// the per-size barriers of the SEND tests), -q, -D, -A and --json.
func TestOptions(t *testing.T) {
	if testing.Short() {
		t.Skip("runs tests over an in-process appliance")
	}
	newRig(t, true, 9000, appliance.PollBlock)
	t.Run("write_bw -a", func(t *testing.T) {
		p := runPair(t, "write_bw", "-a", "-n", "5")
		if len(p.client) != 23 {
			t.Fatalf("%d client results, want 23", len(p.client))
		}
		for i, r := range p.client {
			checkBW(t, r, 2<<i, 5)
		}
		checkTable(t, "client", p.clientOut, Test{Write, BW}, p.client)
		// The server prints the last size's results, the client's.
		if len(p.server) != 1 || p.server[0].Size != MaxSize {
			t.Errorf("server results %+v", p.server)
		}
	})
	for _, test := range []string{"send_bw", "send_lat", "write_lat", "read_lat"} {
		t.Run(test+" -a", func(t *testing.T) {
			p := runPair(t, test, "-a", "-n", "5")
			if len(p.client) != 23 {
				t.Fatalf("%d client results, want 23", len(p.client))
			}
			tt, _ := ParseTest(test)
			checkTable(t, "client", p.clientOut, tt, p.client)
			checkTable(t, "server", p.serverOut, tt, p.server)
		})
	}
	t.Run("write_bw -q 3", func(t *testing.T) {
		p := runPair(t, "write_bw", "-q", "3", "-n", "50", "-s", "4096")
		checkBW(t, p.client[0], 4096, 150)
		if strings.Count(p.clientOut, " remote address:") != 3 {
			t.Errorf("want three remote QPs:\n%s", p.clientOut)
		}
	})
	t.Run("send_bw -q 2", func(t *testing.T) {
		p := runPair(t, "send_bw", "-q", "2", "-n", "50", "-s", "1000")
		checkBW(t, p.client[0], 1000, 100)
		checkBW(t, p.server[0], 1000, 100)
	})
	t.Run("atomic_bw CMP_AND_SWAP", func(t *testing.T) {
		p := runPair(t, "atomic_bw", "-A", "CMP_AND_SWAP", "-n", "100")
		checkBW(t, p.client[0], 8, 100)
		if !strings.Contains(p.clientOut, "Atomic CMP_AND_SWAP BW Test") {
			t.Errorf("title:\n%s", p.clientOut)
		}
	})
	t.Run("atomic_lat", func(t *testing.T) {
		p := runPair(t, "atomic_lat", "-A", "CMP_AND_SWAP", "-n", "100")
		checkLat(t, p.client[0], 8, 100)
	})
	for _, test := range []string{"write_bw", "send_bw", "read_bw", "write_lat", "send_lat", "read_lat"} {
		t.Run(test+" -D", func(t *testing.T) {
			start := time.Now()
			p := runPair(t, test, "-D", "2", "-s", "1024")
			if d := time.Since(start); d < 2*time.Second || d > 10*time.Second {
				t.Errorf("a 2 s run took %v", d)
			}
			r := p.client[0]
			if r.Duration != 2 || r.Iters == 0 {
				t.Fatalf("client %+v", r)
			}
			if r.BW != nil && (r.BW.Avg <= 0 || r.BW.Peak != 0) {
				t.Errorf("BW %+v", r.BW)
			}
			if r.Lat != nil && (r.Lat.Avg <= 0 || r.Lat.TPS <= 0) {
				t.Errorf("lat %+v", r.Lat)
			}
			if r.Lat != nil && !strings.Contains(p.clientOut, resultFmtLatDur) {
				t.Errorf("no -D header:\n%s", p.clientOut)
			}
		})
	}
	t.Run("json", func(t *testing.T) {
		p := runPair(t, "send_lat", "--json", "-n", "20", "-s", "100")
		lines := strings.Split(strings.TrimSpace(p.clientOut), "\n")
		if len(lines) != 1 || !strings.HasPrefix(lines[0], `{"test":"send_lat","side":"client","bytes":100,"iterations":20,`) ||
			!strings.Contains(lines[0], `"t_typical_usec":`) {
			t.Errorf("JSON output %q", p.clientOut)
		}
	})
}

// TestLatDurationPeerGone is the end of a write_lat -D run, which closes
// with no message (as perftest's does): the server stops at its own end
// and destroys its QP while the client, behind, answers the server's last
// WRITE with one more. Here the client's run is a second longer and every
// frame the server receives is 20 ms late, so that WRITE always finds the
// QP destroyed and the client is still polling for its completion. The
// lingering QP leaves it unanswered, as rxe does once a QP is gone, and
// the client runs to its own end; a NAK would fail the client's run with
// a remote operation error.
func TestLatDurationPeerGone(t *testing.T) {
	if testing.Short() {
		t.Skip("runs tests over an in-process appliance")
	}
	newRigIngress(t, false, 9000, appliance.PollBlock, impair.Spec{Delay: 20 * time.Millisecond})
	p := runPairSides(t, "write_lat", []string{"-D", "2", "-s", "64"}, []string{"-D", "3", "-s", "64"})
	if r := p.client[0]; r.Duration != 3 || r.Iters == 0 {
		t.Fatalf("client %+v", r)
	}
}
