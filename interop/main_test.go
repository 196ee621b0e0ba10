package interop

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/gocm"
)

// The suite's network: the rxe VM the tests run against, taproce ports at
// .10 (MTU 1500) and .11 (MTU 9000, for path MTU 4096); tests that need a
// port of their own use .12–.19.
const (
	peerName = "iop1"
	peerIP   = "10.99.0.20"
)

// The second rxe VM, for the runs between two rxe VMs (TestRxePair). It
// boots alongside the first, when the run may select that test.
const (
	peer2Name = "iop2"
	peer2IP   = "10.99.0.21"
)

var (
	portAddr    = netip.MustParsePrefix("10.99.0.10/24")
	jumboAddr   = netip.MustParsePrefix("10.99.0.11/24")
	captureAddr = netip.MustParsePrefix("10.99.0.12/24")
)

// jumboMTU is the netdev MTU of the path MTU 4096 tests: rxe's active MTU
// is 4096 from 4096+80 on.
const jumboMTU = 9000

// suite holds what the package's tests share: the VM and the ports on its
// bridge, set up by the first test that needs them and torn down by
// TestMain, whether the tests pass or fail (and by a watchdog shortly
// before the test binary's timeout, or on SIGINT/SIGTERM).
var suite struct {
	mu      sync.Mutex
	started bool
	err     error // why the suite cannot run (a setup failure)
	unlock  func()
	peer    *Peer
	ep      *Endpoint
	// The second VM: peer2Done is closed when its boot has ended, with
	// peer2 or peer2Err set; peer2Cancel ends a boot under way.
	peer2       *Peer
	peer2Err    error
	peer2Done   chan struct{}
	peer2Cancel context.CancelFunc

	jumbo    *Endpoint
	captures []*capture.Writer
	down     bool
}

func TestMain(m *testing.M) {
	gocm.RunIfHelper() // TestGoRDMACM's Go side
	flag.Parse()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sig
		teardown()
		fmt.Fprintf(os.Stderr, "interop: %v: peers stopped\n", s)
		os.Exit(2)
	}()
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, ok := f.Value.(flag.Getter).Get().(time.Duration); ok && d > time.Minute {
			time.AfterFunc(d-30*time.Second, func() {
				fmt.Fprintln(os.Stderr, "interop: test timeout near: stopping the peers")
				teardown()
			})
		}
	}
	code := m.Run()
	teardown()
	os.Exit(code)
}

// teardown closes the ports and stops the VM; it is idempotent.
func teardown() {
	suite.mu.Lock()
	defer suite.mu.Unlock()
	if suite.down {
		return
	}
	suite.down = true
	for _, ep := range []*Endpoint{suite.ep, suite.jumbo} {
		if ep != nil {
			ep.Close()
		}
	}
	for _, w := range suite.captures {
		w.Close()
	}
	if suite.peer2Done != nil {
		suite.peer2Cancel()
		<-suite.peer2Done
		if suite.peer2 != nil {
			if err := suite.peer2.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
	}
	if suite.peer != nil {
		if err := suite.peer.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	if suite.unlock != nil {
		suite.unlock()
	}
}

// needPeer skips the test when the suite cannot run here, boots the
// shared VM and opens the shared port on first use, and returns them.
func needPeer(t *testing.T) (*Peer, *Endpoint) {
	t.Helper()
	if testing.Short() {
		t.Skip("interop: boots a VM running Linux rxe; skipped in -short mode")
	}
	if err := Available(); err != nil {
		t.Skipf("interop suite cannot run here: %v", err)
	}
	suite.mu.Lock()
	defer suite.mu.Unlock()
	if suite.down {
		t.Fatal("interop: the suite was torn down")
	}
	if !suite.started {
		suite.started = true
		suite.err = setup()
	}
	if errors.Is(suite.err, errBusy) {
		t.Skipf("interop suite cannot run now: %v", suite.err)
	}
	if suite.err != nil {
		t.Fatalf("interop setup: %v", suite.err)
	}
	// A VM that went down in an earlier test is booted again, so that
	// one crash of its kernel fails one test, not all that follow.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, _, err := suite.peer.Exec(ctx, "true"); err != nil {
		recoverPeer(t, suite.peer)
	}
	return suite.peer, suite.ep
}

// errBusy: another process runs the suite.
var errBusy = errors.New("another process runs the interop suite")

// lockWait is how long the suite waits for another run to finish.
const lockWait = 5 * time.Minute

func setup() error {
	ctx := context.Background()
	lctx, cancel := context.WithTimeout(ctx, lockWait)
	unlock, err := Lock(lctx)
	cancel()
	if err != nil {
		return fmt.Errorf("%w: %w", errBusy, err)
	}
	suite.unlock = unlock
	start := time.Now()
	if wantsTest(pairTestName) {
		bootPeer2(start)
	}
	p, err := Start(ctx, peerName, peerIP)
	if err != nil {
		return err
	}
	suite.peer = p
	fmt.Fprintf(os.Stderr, "interop: peer %s (%s) ready after %v\n", p.Name, p.IP, time.Since(start).Round(100*time.Millisecond))
	suite.ep, err = OpenEndpoint(EndpointConfig{Addr: portAddr, Capture: debugCapture("port")})
	return err
}

// bootPeer2 boots the second VM in the background; needPeer2 waits for
// it, teardown stops it (ending its boot if it is still under way).
func bootPeer2(start time.Time) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	suite.peer2Cancel, suite.peer2Done = cancel, done
	go func() {
		defer close(done)
		// start-peer.sh creates the namespace and the bridge when they
		// are missing: leave that to the first VM's, so that the two
		// scripts do not race.
		if err := waitBridge(ctx, time.Minute); err != nil {
			suite.peer2Err = err
			return
		}
		p, err := Start(ctx, peer2Name, peer2IP)
		if err != nil {
			suite.peer2Err = err
			return
		}
		suite.peer2 = p
		fmt.Fprintf(os.Stderr, "interop: peer %s (%s) ready after %v\n", p.Name, p.IP, time.Since(start).Round(100*time.Millisecond))
	}()
}

// waitBridge waits until Bridge exists in Namespace.
func waitBridge(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := netnsutil.Do(netnsutil.Path(Namespace), func(h *netlink.Handle) error {
			_, err := h.LinkByName(Bridge)
			return err
		})
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("interop: no bridge %s in %s: %w (%w)", Bridge, Namespace, err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// wantsTest reports whether the run may select the top-level test name:
// whether -test.run is empty or its first part matches name (a pattern
// that does not compile counts as a match).
func wantsTest(name string) bool {
	f := flag.Lookup("test.run")
	if f == nil || f.Value.String() == "" {
		return true
	}
	re, err := regexp.Compile(strings.Split(f.Value.String(), "/")[0])
	return err != nil || re.MatchString(name)
}

// needPeer2 is needPeer for the second VM: it waits for the VM's boot to
// end and returns the VM.
func needPeer2(t *testing.T) *Peer {
	t.Helper()
	needPeer(t)
	suite.mu.Lock()
	done := suite.peer2Done
	suite.mu.Unlock()
	if done == nil {
		t.Fatal("interop: the second VM was not booted")
	}
	select {
	case <-done:
	case <-time.After(StartTimeout):
		t.Fatal("interop: the second VM is still booting")
	}
	if suite.peer2Err != nil {
		t.Fatalf("interop setup: %v", suite.peer2Err)
	}
	return suite.peer2
}

// CaptureDirEnv names the environment variable that, when set, makes the
// shared ports record their traffic as pcap files in that directory.
const CaptureDirEnv = "TAPROCE_INTEROP_CAPTURE"

// debugCapture returns a capture writer for the shared port name when
// $TAPROCE_INTEROP_CAPTURE is set; teardown closes it.
func debugCapture(name string) *capture.Writer {
	dir := os.Getenv(CaptureDirEnv)
	if dir == "" {
		return nil
	}
	w, err := capture.Create(filepath.Join(dir, "interop-"+name+".pcap"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "interop: %v\n", err)
		return nil
	}
	suite.captures = append(suite.captures, w)
	return w
}

// needJumbo returns the MTU 9000 port, opened on first use.
func needJumbo(t *testing.T) *Endpoint {
	t.Helper()
	needPeer(t)
	suite.mu.Lock()
	defer suite.mu.Unlock()
	if suite.jumbo == nil {
		ep, err := OpenEndpoint(EndpointConfig{Addr: jumboAddr, MTU: jumboMTU, Capture: debugCapture("jumbo")})
		if err != nil {
			t.Fatal(err)
		}
		suite.jumbo = ep
	}
	return suite.jumbo
}

// withPeerMTU sets the VM's MTU for the rest of the test and restores
// 1500 after it.
func withPeerMTU(t *testing.T, p *Peer, mtu int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.SetMTU(ctx, mtu); err != nil {
		t.Fatal(err)
	}
	remove := p.OnRestart(func(ctx context.Context) error { return p.SetMTU(ctx, mtu) })
	t.Cleanup(func() {
		remove()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := p.SetMTU(ctx, 1500); err != nil {
			t.Error(err)
		}
	})
}

// errorCounters are the rxe counters that show a disagreement: NAKs, RNR
// NAKs, sequence errors, exhausted retries and send failures.
var errorCounters = []string{
	"out_of_seq_request", "rcvd_rnr_err", "send_rnr_err", "rcvd_seq_err",
	"retry_exceeded_err", "retry_rnr_exceeded_err", "send_err", "link_downed",
}

// Retransmissions after an ACK timeout are expected now and then: under
// TCG the VM stalls for longer than the 67 ms timeout the tools set, and
// rxe arms its retransmit timer only when it is not pending and does not
// stop it when the ACK comes (rxe_req.c update_state, rxe_comp.c), so a
// request that leaves just before a stale timer fires is sent again at
// once. They are logged; more timeouts than maxTimeouts(iters) on either
// side fail the test, as a peer ignoring the other's ACKs would cause.
func maxTimeouts(iters int) uint64 { return uint64(2 + iters/4) }

// lateRetries returns how many of the dropped packets taproce counted
// in a run may be rxe's retries that came after taproce's queue pair was
// gone: a request rxe sent again after an ACK timeout (completer_retry_err,
// allowed up to maxTimeouts: the emulated VM stalls) can reach taproce
// once its side of the test has ended and destroyed the QP, and a packet
// for a QP that no longer exists is dropped, as rxe drops it. The
// original ACK completed rxe's request; the retry needs no answer.
func lateRetries(t *testing.T, d Counters, dropped uint64) uint64 {
	t.Helper()
	n := min(dropped, d["completer_retry_err"])
	if n > 0 {
		t.Logf("%d of taproce's %d dropped packets may be rxe's late retries (completer_retry_err %d)", n, dropped, d["completer_retry_err"])
	}
	return n
}

// exchangeCheck compares the rxe and taproce counters around an exchange
// and reports every sign of disagreement: an rxe error counter that moved,
// retries beyond a few, a NAK or drop on our side, or packet counts that
// differ (rxe counts only the packets it accepted).
type exchangeCheck struct {
	ep    *Endpoint
	iters int
	ours  transport.Stats
}

func startCheck(ep *Endpoint, iters int) *exchangeCheck {
	return &exchangeCheck{ep: ep, iters: iters, ours: ep.Engine.Stats()}
}

// mark separates the parts of withCounters' output.
const mark = "@@@interop@@@"

// withCounters wraps a command for the VM so that the rxe counters are
// printed before and after it (with a moment for the last ACK to leave);
// the exit status stays the command's.
func withCounters(cmd string) string {
	return fmt.Sprintf("(%s; echo %s; %s 2>&1; rc=$?; sleep 0.2; echo %s; %s; exit $rc)", CountersCommand, mark, cmd, mark, CountersCommand)
}

// splitCounters splits the output of withCounters.
func splitCounters(out string) (before Counters, output string, after Counters, ok bool) {
	parts := strings.Split(out, mark+"\n")
	if len(parts) != 3 {
		return nil, out, nil, false
	}
	return ParseCounters(parts[0]), parts[1], ParseCounters(parts[2]), true
}

func (c *exchangeCheck) finish(t *testing.T, before, after Counters) {
	t.Helper()
	d := after.Sub(before)
	s := c.ep.Engine.Stats()
	o := c.ours
	t.Logf("rxe counters: %v", d)
	t.Logf("taproce: sent %d received %d dropped %d retransmits %d timeouts %d NAKs sent %d received %d RNR NAKs sent %d received %d duplicate requests %d responses %d",
		s.Sent-o.Sent, s.Received-o.Received, s.Dropped-o.Dropped, s.Retransmits-o.Retransmits, s.Timeouts-o.Timeouts,
		s.NAKsSent-o.NAKsSent, s.NAKsReceived-o.NAKsReceived, s.RNRNAKsSent-o.RNRNAKsSent, s.RNRNAKsReceived-o.RNRNAKsReceived,
		s.DuplicateRequests-o.DuplicateRequests, s.DuplicateResponses-o.DuplicateResponses)
	for _, k := range errorCounters {
		if d[k] != 0 {
			t.Errorf("rxe counter %s rose by %d", k, d[k])
		}
	}
	if n := d["completer_retry_err"]; n > maxTimeouts(c.iters) {
		t.Errorf("rxe retransmitted after %d ACK timeouts in %d iterations", n, c.iters)
	}
	if n := s.Timeouts - o.Timeouts; n > maxTimeouts(c.iters) {
		t.Errorf("taproce retransmitted after %d ACK timeouts in %d iterations", n, c.iters)
	}
	dropped := s.Dropped - o.Dropped - lateRetries(t, d, s.Dropped-o.Dropped)
	if n := s.NAKsSent - o.NAKsSent + s.NAKsReceived - o.NAKsReceived + s.RNRNAKsSent - o.RNRNAKsSent +
		s.RNRNAKsReceived - o.RNRNAKsReceived + dropped; n != 0 {
		t.Errorf("taproce sent or received %d NAKs or RNR NAKs, or dropped packets", n)
	}
	if d["rcvd_pkts"] != s.Sent-o.Sent {
		t.Errorf("taproce sent %d packets, rxe accepted %d", s.Sent-o.Sent, d["rcvd_pkts"])
	}
	if d["sent_pkts"] != s.Received-o.Received {
		t.Errorf("rxe sent %d packets, taproce received %d", d["sent_pkts"], s.Received-o.Received)
	}
}
