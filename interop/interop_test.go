package interop

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/verbs/abi"
)

// TestStationReachable: the VM pings the port's address and then has the
// port's MAC in its neighbour table (our station answers ARP and ICMP
// echo), and the station resolves the VM.
func TestStationReachable(t *testing.T) {
	p, ep := needPeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ip := ep.IP().String()
	out, stderr, err := p.Exec(ctx, "ping -c 3 -i 0.2 -W 2 "+ip+"; echo rc=$?; ip neigh show "+ip)
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	t.Logf("VM:\n%s", out)
	if !strings.Contains(out, "rc=0") || !strings.Contains(out, "3 received") {
		t.Errorf("the VM's pings of %s were not all answered", ip)
	}
	mac := ep.Port.MAC().String()
	var neigh string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, ip+" ") {
			neigh = l
		}
	}
	if !strings.Contains(neigh, "lladdr "+mac) || strings.Contains(neigh, "FAILED") || strings.Contains(neigh, "INCOMPLETE") {
		t.Errorf("VM neighbour entry for %s is %q, want lladdr %s", ip, neigh, mac)
	}
	vmMAC, err := ep.Resolve(ctx, p.IP)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("52:54:00:63:00:%02x", p.IP.As4()[3]); vmMAC.String() != want {
		t.Errorf("station resolved %v to %v, want %s", p.IP, vmMAC, want)
	}
	if st := ep.Port.Stats().Station; st.EchoReplies == 0 {
		t.Errorf("station stats %+v: no echo replies counted", st)
	}
}

// ppCase is one pingpong run.
type ppCase struct {
	typ   abi.QPType
	mtu   int // path MTU (-m) of RC and UC
	size  int
	iters int
	rx    int // receive depth (-r); 0 for the default, 500
}

func (c ppCase) tool() string {
	return "ibv_" + strings.ToLower(c.typ.String()) + "_pingpong"
}

// args returns the tool's options.
func (c ppCase) args() string {
	s := fmt.Sprintf("-g 1 -n %d -s %d", c.iters, c.size)
	if c.typ != abi.UD {
		s += fmt.Sprintf(" -m %d", c.mtu)
	}
	if c.rx != 0 {
		s += fmt.Sprintf(" -r %d", c.rx)
	}
	return s
}

func (c ppCase) name() string {
	s := fmt.Sprintf("s%d", c.size)
	if c.rx != 0 {
		s += fmt.Sprintf("-r%d-n%d", c.rx, c.iters)
	}
	return s
}

func (c ppCase) config() PingpongConfig {
	cfg := PingpongConfig{Type: c.typ, Size: c.size, Iters: c.iters, RxDepth: c.rx, GIDIndex: 1}
	if c.typ != abi.UD {
		m, ok := abi.MTUFromBytes(c.mtu)
		if !ok {
			panic(fmt.Sprintf("path MTU %d", c.mtu))
		}
		cfg.MTU = m
	}
	return cfg
}

// vmServer runs the tool as server in the VM and our side as its client.
// Our message is random; the server echoes it, so every reply must be it.
func vmServer(t *testing.T, p *Peer, ep *Endpoint, c ppCase) *PingpongResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	check := startCheck(ep, c.iters)
	job := p.Spawn(ctx, "pingpong-server", withCounters(c.tool()+" "+c.args()))
	msg := make([]byte, c.size)
	for i := range msg {
		msg[i] = byte(rand.Uint32())
	}
	cfg := c.config()
	cfg.Fill = msg
	cfg.Check = func(n int, got []byte) error {
		if !bytes.Equal(got, msg) {
			return fmt.Errorf("echo differs from what was sent at byte %d", firstDiff(got, msg))
		}
		return nil
	}
	dctx, dcancel := context.WithTimeout(ctx, 90*time.Second)
	res, err := ep.PingpongClient(dctx, net.JoinHostPort(p.IP.String(), strconv.Itoa(DefaultPingpongPort)), cfg)
	dcancel()
	if err != nil {
		t.Errorf("taproce client: %v", err)
	} else {
		t.Logf("taproce client: %v", res)
	}
	code, out, werr := job.Wait(ctx, 30*time.Second)
	before, out, after, ok := splitCounters(out)
	t.Logf("VM %s %s (exit %d):\n%s", c.tool(), c.args(), code, strings.TrimSpace(out))
	switch {
	case werr != nil:
		t.Error(werr)
	case code != 0 || !strings.Contains(out, fmt.Sprintf("%d iters in", c.iters)):
		t.Errorf("VM server exited with %d", code)
	case !ok:
		t.Error("VM output lacks the rxe counters")
	default:
		check.finish(t, before, after)
	}
	return res
}

// vmClient runs our side as server (its out-of-band socket on HostIP) and
// the tool in the VM as its client with -c, which validates the buffer at
// the end. The client's message is 0x7b bytes with a zero at every page
// start (its -c marks); we echo it.
func vmClient(t *testing.T, p *Peer, ep *Endpoint, c ppCase) *PingpongResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	check := startCheck(ep, c.iters)
	ln, err := ListenTCP(net.JoinHostPort(HostIP, strconv.Itoa(DefaultPingpongPort)))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	want := bytes.Repeat([]byte{0x7b}, c.size)
	for i := 0; i < c.size; i += 4096 {
		want[i] = 0
	}
	cfg := c.config()
	cfg.Check = func(n int, got []byte) error {
		if !bytes.Equal(got, want) {
			return fmt.Errorf("differs from the client's buffer at byte %d", firstDiff(got, want))
		}
		return nil
	}
	type result struct {
		res *PingpongResult
		err error
	}
	done := make(chan result, 1)
	sctx, scancel := context.WithTimeout(ctx, 90*time.Second)
	defer scancel()
	go func() {
		res, err := ep.PingpongServer(sctx, ln, cfg)
		done <- result{res, err}
	}()
	cmd := fmt.Sprintf("timeout 90 %s %s -c %s", c.tool(), c.args(), HostIP)
	out, stderr, err := p.Exec(ctx, withCounters(cmd))
	before, out, after, ok := splitCounters(out)
	t.Logf("VM %s (exit %d):\n%s%s", cmd, max(ExitCode(err), 0), strings.TrimSpace(out), stderr)
	if err != nil {
		t.Errorf("VM client: %v", err)
		scancel()
	} else if !strings.Contains(out, fmt.Sprintf("%d iters in", c.iters)) || strings.Contains(out, "invalid data") {
		t.Errorf("VM client did not complete cleanly")
	}
	r := <-done
	if r.err != nil {
		t.Errorf("taproce server: %v", r.err)
	} else {
		t.Logf("taproce server: %v", r.res)
	}
	if err == nil && r.err == nil {
		if !ok {
			t.Error("VM output lacks the rxe counters")
		} else {
			check.finish(t, before, after)
		}
	}
	return r.res
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// both runs c in both directions: the tool as server with our side as
// client, then the other way round.
func both(t *testing.T, p *Peer, ep *Endpoint, c ppCase) {
	t.Run(c.name()+"/vm-server", func(t *testing.T) { vmServer(t, p, ep, c) })
	t.Run(c.name()+"/vm-client", func(t *testing.T) { vmClient(t, p, ep, c) })
}

// TestRCPingpong: ibv_rc_pingpong against our transport in both
// directions, at path MTU 1024 (netdev MTU 1500 on both sides) and 4096
// (9000), with messages of one packet, of several, and of 64 KiB; with
// padded payloads; with a receive depth that makes both sides post
// receives again and again; at path MTUs 256 and 2048.
func TestRCPingpong(t *testing.T) {
	p, ep := needPeer(t)
	t.Run("m1024", func(t *testing.T) {
		for _, c := range []ppCase{
			{size: 1, iters: 20},
			{size: 64, iters: 50},
			{size: 4093, iters: 10},
			{size: 4096, iters: 20},
			{size: 65536, iters: 5},
			{size: 64, iters: 200, rx: 4},
		} {
			c.typ, c.mtu = abi.RC, 1024
			both(t, p, ep, c)
		}
	})
	t.Run("m256", func(t *testing.T) {
		both(t, p, ep, ppCase{typ: abi.RC, mtu: 256, size: 4096, iters: 10})
	})
	t.Run("m4096", func(t *testing.T) {
		jumbo := needJumbo(t)
		withPeerMTU(t, p, jumboMTU)
		for _, c := range []ppCase{{size: 64, iters: 50}, {size: 4096, iters: 20}, {size: 65536, iters: 5}} {
			c.typ, c.mtu = abi.RC, 4096
			both(t, p, jumbo, c)
		}
		t.Run("m2048", func(t *testing.T) {
			both(t, p, jumbo, ppCase{typ: abi.RC, mtu: 2048, size: 4096, iters: 10})
		})
	})
}

// TestUCPingpong: ibv_uc_pingpong in both directions (no ACKs: each side
// completes its SEND when it leaves).
func TestUCPingpong(t *testing.T) {
	p, ep := needPeer(t)
	for _, c := range []ppCase{{size: 1, iters: 20}, {size: 64, iters: 50}, {size: 4093, iters: 10}, {size: 65536, iters: 5}} {
		c.typ, c.mtu = abi.UC, 1024
		both(t, p, ep, c)
	}
}

// TestUDPingpong: ibv_ud_pingpong in both directions; messages up to the
// active MTU (1024 at netdev MTU 1500, 4096 at 9000).
func TestUDPingpong(t *testing.T) {
	p, ep := needPeer(t)
	t.Run("mtu1500", func(t *testing.T) {
		for _, c := range []ppCase{{size: 1, iters: 20}, {size: 64, iters: 50}, {size: 1024, iters: 20}, {size: 64, iters: 200, rx: 4}} {
			c.typ = abi.UD
			both(t, p, ep, c)
		}
	})
	t.Run("mtu9000", func(t *testing.T) {
		jumbo := needJumbo(t)
		withPeerMTU(t, p, jumboMTU)
		both(t, p, jumbo, ppCase{typ: abi.UD, size: 4096, iters: 20})
	})
}

// TestCaptureICRC records the traffic of RC and UD pingpongs with the
// port's capture option and checks every RoCE frame of it: it parses, its
// ICRC verifies, it has UDP checksum 0 and DF, and each RC connection uses
// one UDP source port in both directions, as rxe picks it.
func TestCaptureICRC(t *testing.T) {
	p, _ := needPeer(t)
	path := filepath.Join(t.TempDir(), "interop.pcap")
	w, err := capture.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := OpenEndpoint(EndpointConfig{Addr: captureAddr, Capture: w})
	if err != nil {
		w.Close()
		t.Fatal(err)
	}
	closed := false
	closeAll := func() {
		if !closed {
			closed = true
			ep.Close()
			if err := w.Close(); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(closeAll)

	rc1 := vmClient(t, p, ep, ppCase{typ: abi.RC, mtu: 1024, size: 2500, iters: 5})
	rc2 := vmServer(t, p, ep, ppCase{typ: abi.RC, mtu: 1024, size: 64, iters: 5})
	ud := vmServer(t, p, ep, ppCase{typ: abi.UD, size: 64, iters: 5})
	closeAll()
	if t.Failed() {
		t.FailNow()
	}

	r, err := CheckCapture(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("capture %s: %v", path, r)
	for _, pr := range r.Problems {
		t.Error(pr)
	}
	// 5 round trips of 2500 bytes (FIRST, MIDDLE, LAST at path MTU
	// 1024) and 5 of 64 bytes (ONLY) each way, each message acknowledged
	// once; 5 UD round trips. Retransmissions may add some.
	for op, n := range map[roce.Opcode]int{roce.RCSendFirst: 10, roce.RCSendMiddle: 10, roce.RCSendLast: 10,
		roce.RCSendOnly: 10, roce.RCAcknowledge: 20, roce.UDSendOnly: 10} {
		if r.Opcodes[op] < n {
			t.Errorf("%d %v in the capture, want %d", r.Opcodes[op], op, n)
		}
	}
	for _, res := range []*PingpongResult{rc1, rc2} {
		if res == nil {
			continue
		}
		ours := r.SourcePorts[Flow{Src: ep.IP(), Dst: p.IP, DestQP: res.Remote.QPN}]
		theirs := r.SourcePorts[Flow{Src: p.IP, Dst: ep.IP(), DestQP: res.Local.QPN}]
		t.Logf("RC QP %#x ⇄ %#x: our source ports %v, rxe's %v, expected %d", res.Local.QPN, res.Remote.QPN, ours, theirs,
			roce.ConnectedSourcePort(0, res.Local.QPN, res.Remote.QPN))
		if len(ours) != 1 || len(theirs) != 1 || !slices.Equal(ours, theirs) {
			t.Errorf("RC connection QP %#x ⇄ %#x: source ports ours %v, rxe's %v: want one and the same", res.Local.QPN, res.Remote.QPN, ours, theirs)
		}
	}
	// A UD QP sends from a port hashed from its own QPN, on both sides.
	if ud != nil {
		for _, x := range []struct {
			fl  Flow
			qpn uint32
		}{
			{Flow{Src: ep.IP(), Dst: p.IP, DestQP: ud.Remote.QPN}, ud.Local.QPN},
			{Flow{Src: p.IP, Dst: ep.IP(), DestQP: ud.Local.QPN}, ud.Remote.QPN},
		} {
			got, want := r.SourcePorts[x.fl], roce.DatagramSourcePort(x.qpn)
			t.Logf("UD QP %#x → %v: source ports %v, expected %d", x.qpn, x.fl.Dst, got, want)
			if !slices.Equal(got, []uint16{want}) {
				t.Errorf("UD QP %#x → %v: source ports %v, want %d", x.qpn, x.fl.Dst, got, want)
			}
		}
	}
	// Every flow leaves with the TTL rxe uses.
	for fl, ttls := range r.TTLs {
		if !slices.Equal(ttls, []uint8{RoCEv2HopLimit}) {
			t.Errorf("%v → %v (QP %#x): TTLs %v, want %d", fl.Src, fl.Dst, fl.DestQP, ttls, RoCEv2HopLimit)
		}
	}
}
