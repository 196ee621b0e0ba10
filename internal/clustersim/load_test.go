package clustersim_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/taproce/taproce/appliance/admin"
	"github.com/taproce/taproce/images"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/internal/testnet"
	"github.com/taproce/taproce/verbs"
)

// loadPods is how many pods the load and memory tests attach at once:
// a node filling up.
const loadPods = 64

// qpsPerPod is how many connected RC QPs each pod's client holds in the
// memory test.
const qpsPerPod = 16

// The memory targets for the appliance's resident set.
const (
	idleTargetKiB   = 30 << 10
	loadedTargetKiB = 100 << 10
)

// ibvPortActive is IBV_PORT_ACTIVE, a working port's state.
const ibvPortActive = 4

// clientEnv makes the test binary a verbs client (runClient) instead of
// running the tests: its value is the number of connected QPs to hold,
// followed by "/conn" for one verbs.Conn each (its own context, PD, CQ and
// registered area) or "/qp" for QPs of one context sharing its PD, CQ and
// memory region.
const clientEnv = "TAPROCE_CLUSTERSIM_CLIENT"

// runClient is the verbs client the load and memory tests run in each
// pod's namespace: it opens the one device this namespace may use, asks
// for its port's attributes ("PORT device state gids"), connects the RC
// QPs $TAPROCE_CLUSTERSIM_CLIENT asks for in pairs to each other through
// its port, sends a message on each and receives one on each
// ("CONNECTED n"), holds them until its standard input closes, and exits
// 0.
func runClient() int {
	fail := func(err error) int { fmt.Println("ERROR", err); return 1 }
	count, kind, _ := strings.Cut(os.Getenv(clientEnv), "/")
	n, err := strconv.Atoi(count)
	if err != nil || n < 0 || n%2 != 0 || (n > 0 && kind != "conn" && kind != "qp") {
		return fail(fmt.Errorf("%s=%q: want an even number, /conn or /qp", clientEnv, os.Getenv(clientEnv)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	devs, err := verbs.Devices(ctx)
	if err != nil {
		return fail(err)
	}
	var usable []verbs.DeviceInfo
	for _, d := range devs {
		if d.Usable {
			usable = append(usable, d)
		}
	}
	if len(usable) != 1 {
		return fail(fmt.Errorf("%d devices usable in this namespace, want 1: %+v", len(usable), devs))
	}
	dev := usable[0]
	vc, err := verbs.Open(ctx, dev.Name)
	if err != nil {
		return fail(err)
	}
	defer vc.Close()
	pa, err := vc.QueryPort(ctx)
	if err != nil {
		return fail(err)
	}
	fmt.Printf("PORT %s %d %v\n", dev.Name, pa.State, pa.GIDs)

	var conns []*verbs.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// The pod's IP, not the port's link-local GID.
	gid := slices.IndexFunc(dev.GIDs, netip.Addr.Is4)
	if n > 0 && gid < 0 {
		return fail(fmt.Errorf("the port has no IPv4 GID: %v", dev.GIDs))
	}
	if n > 0 && kind == "qp" {
		if err := pairedQPs(ctx, vc, gid, n, pa); err != nil {
			return fail(err)
		}
		fmt.Printf("CONNECTED %d\n", n)
	}
	if n > 0 && kind == "conn" {
		opts := []verbs.ConnOption{verbs.WithDevice(dev.Name), verbs.WithGIDIndex(gid)}
		l, err := verbs.Listen(ctx, "tcp", net.JoinHostPort(dev.GIDs[gid].String(), "0"), opts...)
		if err != nil {
			return fail(err)
		}
		defer l.Close()
		accepted := make(chan error, 1)
		var acc []*verbs.Conn
		go func() {
			for range n / 2 {
				c, err := l.Accept(ctx)
				if err != nil {
					accepted <- err
					return
				}
				acc = append(acc, c)
			}
			accepted <- nil
		}()
		for range n / 2 {
			c, err := verbs.Dial(ctx, l.Addr().String(), opts...)
			if err != nil {
				return fail(fmt.Errorf("dial: %w", err))
			}
			conns = append(conns, c)
		}
		if err := <-accepted; err != nil {
			return fail(fmt.Errorf("accept: %w", err))
		}
		conns = append(conns, acc...)
		// A message each way on every QP: connected means carrying.
		for _, c := range conns {
			if err := c.Send(ctx, []byte("ping")); err != nil {
				return fail(fmt.Errorf("send: %w", err))
			}
		}
		for _, c := range conns {
			if m, err := c.Recv(ctx); err != nil || string(m) != "ping" {
				return fail(fmt.Errorf("recv: %q, %v", m, err))
			}
		}
		fmt.Printf("CONNECTED %d\n", len(conns))
	}
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// pairedQPs creates n RC QPs in one context, sharing a PD, a CQ and a
// memory region, connects them in pairs through the port (the pod's IP as
// GID), and sends a message each way on each pair. The QPs live as long
// as the context.
func pairedQPs(ctx context.Context, vc *verbs.Context, gidIndex, n int, pa verbs.PortAttr) error {
	pd, err := vc.AllocPD(ctx)
	if err != nil {
		return err
	}
	cq, err := vc.CreateCQ(ctx, 4*n, nil)
	if err != nil {
		return err
	}
	const slot = 64
	mr, err := pd.AllocMR(ctx, 2*n*slot, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	mtu := verbs.MTU(pa.ActiveMTU)
	if mtu.Bytes() == 0 {
		mtu = verbs.MTU1024
	}
	gid, err := vc.GID(gidIndex)
	if err != nil {
		return err
	}
	qps := make([]*verbs.QP, n)
	for i := range qps {
		if qps[i], err = pd.CreateQP(ctx, verbs.QPInitAttr{Type: verbs.RC, SendCQ: cq, RecvCQ: cq,
			Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
			return err
		}
		if err := qps[i].Modify(ctx, &verbs.QPAttr{State: verbs.QPSInit, Port: 1, Access: verbs.AccessRemoteWrite},
			verbs.QPStateMask|verbs.QPPKeyIndex|verbs.QPPort|verbs.QPAccessFlags); err != nil {
			return err
		}
		if _, err := qps[i].PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{mr.SGE(i*slot, slot)}}}); err != nil {
			return err
		}
	}
	const psn = 0x1234
	for i, qp := range qps {
		peer := qps[i^1]
		if err := qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSRTR, PathMTU: mtu, DestQPN: peer.Num(), RQPSN: psn,
			MaxDestRdAtomic: 1, MinRNRTimer: 12, AH: verbs.AHAttr{DGID: gid, SGIDIndex: uint8(gidIndex), HopLimit: 64, Port: 1}},
			verbs.QPStateMask|verbs.QPAV|verbs.QPPathMTU|verbs.QPDestQPN|verbs.QPRQPSN|verbs.QPMaxDestRdAtomic|verbs.QPMinRNRTimer); err != nil {
			return err
		}
		if err := qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSRTS, SQPSN: psn, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
			verbs.QPStateMask|verbs.QPSQPSN|verbs.QPTimeout|verbs.QPRetryCnt|verbs.QPRNRRetry|verbs.QPMaxQPRdAtomic); err != nil {
			return err
		}
	}
	for i, qp := range qps {
		copy(mr.Bytes()[(n+i)*slot:], "ping")
		if _, err := qp.PostSend([]verbs.SendWR{{ID: uint64(n + i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{mr.SGE((n+i)*slot, 4)}}}); err != nil {
			return err
		}
	}
	wcs := make([]verbs.WC, 16)
	for done := 0; done < 2*n; {
		if ctx.Err() != nil {
			return fmt.Errorf("%d of %d completions: %w", done, 2*n, ctx.Err())
		}
		k := cq.Poll(wcs)
		for _, wc := range wcs[:k] {
			if wc.Status != verbs.WCSuccess {
				return fmt.Errorf("completion %d: %v", wc.ID, wc.Status)
			}
			if wc.ID < uint64(n) && string(mr.Bytes()[int(wc.ID)*slot:][:wc.ByteLen]) != "ping" {
				return fmt.Errorf("QP %d received %q", wc.ID, mr.Bytes()[int(wc.ID)*slot:][:wc.ByteLen])
			}
		}
		done += k
		if k == 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	return nil
}

// client is runClient in a pod.
type client struct {
	*app
	stdin io.WriteCloser
}

// startClient runs the test binary as a verbs client in the pod's
// namespace, with clientEnv set to mode ("0": open and query only).
func startClient(t *testing.T, p *pod, mode string) *client {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	a := &app{cmd: exec.Command("ip", "netns", "exec", p.ns, self), lines: make(chan string, 4), log: &syncBuffer{}}
	a.cmd.Env = append(os.Environ(), clientEnv+"="+mode, "TAPROCE_SOCKET="+p.node.cfg.Socket)
	a.cmd.Stderr = a.log
	stdin, err := a.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := a.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 4096)
		var pending string
		for {
			n, err := out.Read(buf)
			pending += string(buf[:n])
			for {
				l, rest, ok := strings.Cut(pending, "\n")
				if !ok {
					break
				}
				fmt.Fprintln(a.log, l)
				a.lines <- l
				pending = rest
			}
			if err != nil {
				close(a.lines)
				return
			}
		}
	}()
	c := &client{app: a, stdin: stdin}
	t.Cleanup(func() { stdin.Close(); a.cmd.Process.Kill(); a.cmd.Wait() })
	return c
}

// finish closes the client's standard input and waits for it to exit 0.
func (c *client) finish(t *testing.T, who string) {
	t.Helper()
	c.stdin.Close()
	for range c.lines {
	}
	if err := c.cmd.Wait(); err != nil {
		t.Errorf("%s's client: %v\n%s", who, err, c.log)
	}
}

// newPods creates n pod namespaces on the node, not yet attached.
func newPods(t *testing.T, nd *node, n int) []*pod {
	t.Helper()
	pods := make([]*pod, n)
	for i := range pods {
		p := &pod{name: fmt.Sprintf("load%02d", i), node: nd}
		p.ns, p.path = testnet.Namespace(t)
		p.rt = &libcni.RuntimeConf{ContainerID: "ctr-" + p.name, NetNS: p.path, IfName: "eth0"}
		// Loopback up, as the runtime's loopback plugin leaves it: the
		// clients' out-of-band TCP to their own pod's IP goes through it.
		if err := netnsutil.Do(p.path, func(h *netlink.Handle) error {
			lo, err := h.LinkByName("lo")
			if err != nil {
				return err
			}
			return h.LinkSetUp(lo)
		}); err != nil {
			t.Fatal(err)
		}
		pods[i] = p
	}
	return pods
}

// concurrently runs fn for every pod at once, as a kubelet runs the CNI
// operations of the pods it starts or stops, and fails with every error.
func concurrently(t *testing.T, what string, pods []*pod, fn func(p *pod) error) {
	t.Helper()
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Go(func() { errs[i] = fn(p) })
	}
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			t.Errorf("%s %s: %v", what, pods[i].name, err)
		}
	}
	if failed > 0 {
		t.Fatalf("%s: %d of %d failed", what, failed, len(pods))
	}
}

// addAll runs CNI ADD for every pod (the first alone, the rest concurrently) and checks each pod's
// attachment: its IP a GID of a redirect-mode port, roce0 in the result
// and in the namespace, the filters and qdiscs of redirect mode.
func addAll(t *testing.T, ctx context.Context, nd *node, pods []*pod) {
	t.Helper()
	add := func(p *pod) error {
		var res types.Result
		if err := inNode(nd, func() (err error) { res, err = nd.cni.AddNetworkList(ctx, nd.list, p.rt); return }); err != nil {
			return err
		}
		cur, err := current.NewResultFromResult(res)
		if err != nil {
			return err
		}
		if len(cur.IPs) != 1 {
			return fmt.Errorf("IPs %v", cur.IPs)
		}
		p.ip, _ = netip.AddrFromSlice(cur.IPs[0].Address.IP.To4())
		if !slices.ContainsFunc(cur.Interfaces, func(i *current.Interface) bool { return i.Name == "roce0" && i.Sandbox == p.path }) {
			return fmt.Errorf("the result has no roce0: %v", cur.Interfaces)
		}
		att, err := nd.admin.Check(ctx, admin.CheckRequest{ContainerID: p.rt.ContainerID, IfName: "eth0"})
		if err != nil {
			return err
		}
		if !slices.Contains(att.GIDs, netip.AddrFrom16(p.ip.As16())) || att.Device == "" || att.Mode != admin.ModeRedirect {
			return fmt.Errorf("attachment %+v: want the pod's IP %v as a GID in redirect mode", att, p.ip)
		}
		p.device = att.Device
		return nil
	}
	// The node's first pod is added alone, as on a node that has just
	// joined: the reference bridge plugin creates cni0 and pins its MAC
	// with the bridge it read before attaching its veth, so ADDs racing
	// on a bridge not yet pinned can set it back to a MAC that other
	// results no longer record, and their CHECKs then fail in the bridge
	// plugin. The rest are added concurrently.
	concurrently(t, "ADD", pods[:1], add)
	concurrently(t, "ADD", pods[1:], add)
	ips, devices := map[netip.Addr]bool{}, map[string]bool{}
	for _, p := range pods {
		if ips[p.ip] || devices[p.device] {
			t.Fatalf("%s: IP %v or device %s given twice", p.name, p.ip, p.device)
		}
		ips[p.ip], devices[p.device] = true, true
		names, filters, clsact := p.state(t)
		if !slices.Contains(names, "roce0") || filters != 3 || clsact != 2 {
			t.Fatalf("pod %s after ADD: %v, %d filters, %d clsact qdiscs", p.name, names, filters, clsact)
		}
	}
	if l, err := nd.admin.List(ctx); err != nil || len(l) != len(pods) {
		t.Fatalf("%d attachments (%v), want %d", len(l), err, len(pods))
	}
}

// delAll runs CNI DEL for every pod concurrently and checks that nothing
// of taproce is left: no roce0, filter or clsact qdisc in the pods, no
// attachment, device, port or QP in the appliance, no veth in the node.
func delAll(t *testing.T, ctx context.Context, nd *node, pods []*pod) {
	t.Helper()
	concurrently(t, "DEL", pods, func(p *pod) error {
		return inNode(nd, func() error { return nd.cni.DelNetworkList(ctx, nd.list, p.rt) })
	})
	for _, p := range pods {
		names, filters, clsact := p.state(t)
		if slices.Contains(names, "roce0") || filters != 0 || clsact != 0 {
			t.Errorf("pod %s after DEL: %v, %d filters, %d clsact qdiscs", p.name, names, filters, clsact)
		}
	}
	if l, err := nd.admin.List(ctx); err != nil || len(l) != 0 {
		t.Errorf("attachments after DEL: %+v, %v", l, err)
	}
	t.Setenv("TAPROCE_SOCKET", nd.cfg.Socket)
	if devs, err := verbs.Devices(ctx); err != nil || len(devs) != 0 {
		t.Errorf("devices after DEL: %+v, %v", devs, err)
	}
	if nd.metrics != nil {
		m := nd.metrics(t)
		if metric(m, "taproce_attachments") != 0 || metric(m, "taproce_ports") != 0 || metric(m, "taproce_qps") != 0 {
			t.Errorf("metrics after DEL: attachments %v, ports %v, QPs %v",
				metric(m, "taproce_attachments"), metric(m, "taproce_ports"), metric(m, "taproce_qps"))
		}
	}
	err := netnsutil.Do(nd.path, func(h *netlink.Handle) error {
		ls, err := h.LinkList()
		for _, l := range ls {
			if l.Type() != "bridge" && l.Attrs().Name != "lo" {
				t.Errorf("node interface left after DEL: %s (%s)", l.Attrs().Name, l.Type())
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLoad: 64 pods attached by concurrent CNI ADDs, every port working
// (its device opens in the pod, its port answers QueryPort as active with
// the pod's IP as GID, and UDP/4791 from the node reaches it), then all
// deleted by concurrent DELs, leaving nothing.
func TestLoad(t *testing.T) {
	requireTools(t)
	t0 := time.Now()
	bins := binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nd := newNode(t, 1, workDir(t))
	stop := startInProcess(t, nd, bins)
	pods := newPods(t, nd, loadPods)

	step := time.Now()
	addAll(t, ctx, nd, pods)
	concurrently(t, "CHECK", pods, func(p *pod) error {
		return inNode(nd, func() error { return nd.cni.CheckNetworkList(ctx, nd.list, p.rt) })
	})
	t.Logf("%d concurrent ADDs, then CHECKs, in %v", len(pods), time.Since(step).Round(time.Millisecond))

	// Every port: a verbs client in its pod opens it and queries it.
	step = time.Now()
	clients := make([]*client, len(pods))
	for i, p := range pods {
		clients[i] = startClient(t, p, "0")
	}
	for i, p := range pods {
		l := clients[i].await(t, p.name, "PORT ")
		f := strings.Fields(l)
		if len(f) < 3 || f[1] != p.device || f[2] != strconv.Itoa(ibvPortActive) || !strings.Contains(l, p.ip.String()) {
			t.Errorf("%s: %q, want %s active (state %d) with GID %v", p.name, l, p.device, ibvPortActive, p.ip)
		}
		clients[i].finish(t, p.name)
	}
	t.Logf("%d verbs clients opened and queried their pods' ports in %v", len(pods), time.Since(step).Round(time.Millisecond))

	// RoCEv2 from the node reaches every pod's port.
	step = time.Now()
	before := nd.metrics(t)
	err := inNode(nd, func() error {
		for _, p := range pods {
			c, err := net.Dial("udp", netip.AddrPortFrom(p.ip, 4791).String())
			if err != nil {
				return err
			}
			_, err = c.Write([]byte("RoCEv2 from the node"))
			c.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		after := nd.metrics(t)
		missing = missing[:0]
		for _, p := range pods {
			label := fmt.Sprintf("device=%q", p.device)
			if metric(after, "taproce_port_rx_frames_total", label) <= metric(before, "taproce_port_rx_frames_total", label) {
				missing = append(missing, p.name)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(missing) > 0 {
		t.Fatalf("UDP/4791 from the node did not reach the ports of %v", missing)
	}
	t.Logf("UDP/4791 from the node reached all %d ports in %v", len(pods), time.Since(step).Round(time.Millisecond))

	step = time.Now()
	delAll(t, ctx, nd, pods)
	t.Logf("%d concurrent DELs checked in %v", len(pods), time.Since(step).Round(time.Millisecond))
	if err := stop(); err != nil {
		t.Error(err)
	}
	t.Logf("load test: %v in all", time.Since(t0).Round(time.Millisecond))
}

// TestMemory measures the resident set of `taproce run` (the binary, run
// in a node namespace with the DaemonSet's configuration) idle, with 64
// pods attached, and with a verbs client in each pod holding 16 RC QPs
// connected through its port, each having carried a message each way;
// it fails above the targets (30 MiB idle, 100 MiB loaded). The load
// comes in two shapes, each measured on an appliance of its own:
//
//   - qp: the 16 QPs of a client in one device context, sharing a PD, a
//     CQ and a memory region, as an application holds them: the target
//     applies;
//   - conn: 16 verbs.Conns, each with a context (a control connection),
//     PD, CQ and registered area of its own: 1024 contexts in all, which
//     must stay within the DaemonSet's memory request.
func TestMemory(t *testing.T) {
	requireTools(t)
	t0 := time.Now()
	bins := binaries(t)
	mib := func(kib int) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }
	_, c := daemonSetContainer(t)
	req, _ := images.Get(c, "resources", "requests", "memory").(string)
	reqMiB, err := strconv.Atoi(strings.TrimSuffix(req, "Mi"))
	if err != nil || !strings.HasSuffix(req, "Mi") {
		t.Fatalf("the DaemonSet's memory request %q: want a number of Mi", req)
	}
	requestKiB := reqMiB << 10
	for _, x := range []struct {
		mode  string
		bound int
	}{{"qp", loadedTargetKiB}, {"conn", requestKiB}} {
		t.Run(x.mode, func(t *testing.T) {
			idle, attached, loaded, peak := measureMemory(t, bins, x.mode)
			t.Logf("appliance RSS: %s idle, %s with %d pods attached, %s with %d pods × %d connected QPs (%s), peak %s",
				mib(idle), mib(attached), loadPods, mib(loaded), loadPods, qpsPerPod, x.mode, mib(peak))
			if idle > idleTargetKiB {
				t.Errorf("idle RSS %s is above the target %s", mib(idle), mib(idleTargetKiB))
			}
			if loaded > x.bound {
				t.Errorf("loaded RSS %s is above %s", mib(loaded), mib(x.bound))
			}
		})
	}
	t.Logf("memory: %v in all", time.Since(t0).Round(time.Millisecond))
}

// measureMemory runs the appliance, attaches the pods, loads them with
// clients of the mode (runClient) and returns the appliance's VmRSS idle,
// attached and loaded, and its VmHWM, in KiB. It then deletes the pods
// and stops the appliance, which must exit 0.
func measureMemory(t *testing.T, bins, mode string) (idle, attached, loaded, peak int) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nd := newNode(t, 1, workDir(t))
	useBridgeConflist(t, nd, bins)

	// `ip netns exec` executes the appliance in its own process.
	logs := &syncBuffer{}
	cmd := exec.Command("ip", "netns", "exec", nd.ns, filepath.Join(bins, "taproce"), "run", "--config", filepath.Join(nd.dir, "taproce.toml"))
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			return err
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
			return errors.New("the appliance did not stop within 20 s of SIGTERM")
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			var notes []string
			for _, l := range strings.Split(logs.String(), "\n") {
				if l != "" && !strings.Contains(l, `"level":"INFO"`) {
					notes = append(notes, l)
				}
			}
			t.Logf("the appliance's warnings and errors:\n%s", strings.Join(notes, "\n"))
		}
	})
	pid := cmd.Process.Pid
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := nd.admin.List(ctx); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the appliance's admin API did not answer within 20 s: %v", err)
		}
	}
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) != "taproce" {
		t.Fatalf("process %d is %q, not the appliance", pid, comm)
	}
	time.Sleep(time.Second)
	idle = rssKiB(t, pid)

	pods := newPods(t, nd, loadPods)
	step := time.Now()
	addAll(t, ctx, nd, pods)
	time.Sleep(time.Second)
	attached = rssKiB(t, pid)
	t.Logf("%d pods attached in %v", len(pods), time.Since(step).Round(time.Millisecond))

	step = time.Now()
	clients := make([]*client, len(pods))
	for i, p := range pods {
		clients[i] = startClient(t, p, fmt.Sprintf("%d/%s", qpsPerPod, mode))
	}
	for i, p := range pods {
		if l := clients[i].await(t, p.name, "CONNECTED"); l != fmt.Sprintf("CONNECTED %d", qpsPerPod) {
			t.Fatalf("%s: %q", p.name, l)
		}
	}
	time.Sleep(time.Second)
	loaded = rssKiB(t, pid)
	peak, _ = strconv.Atoi(strings.Fields(procStatus(t, pid, "VmHWM"))[0])
	// Where it goes: the process's anonymous memory, the clients' shared
	// memory the appliance has touched, the Go heap and stacks.
	_, m := httpGetIn(t, nd.path, nd.cfg.MetricsAddress, "/metrics")
	t.Logf("%d clients × %d connected QPs in %v: RssAnon %s, RssFile %s, RssShmem %s; Go heap in use %.1f MiB, stacks %.1f MiB, %v goroutines",
		len(pods), qpsPerPod, time.Since(step).Round(time.Millisecond),
		procStatus(t, pid, "RssAnon"), procStatus(t, pid, "RssFile"), procStatus(t, pid, "RssShmem"),
		metric(m, "go_memstats_heap_inuse_bytes")/(1<<20), metric(m, "go_memstats_stack_inuse_bytes")/(1<<20), metric(m, "go_goroutines"))
	for i, p := range pods {
		clients[i].finish(t, p.name)
	}
	delAll(t, ctx, nd, pods)
	if err := stop(); err != nil {
		t.Errorf("the appliance: %v", err)
	}
	return idle, attached, loaded, peak
}
