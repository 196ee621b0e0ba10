package lab

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/internal/decode"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/internal/testnet"
)

// prefix returns a namespace prefix unique to this test run, and checks
// when the test ends that nothing with it is left.
func prefix(t *testing.T) string {
	t.Helper()
	testnet.RequireRoot(t)
	p := testnet.Name() + "-"
	t.Cleanup(func() {
		left, _ := netnsutil.List(p)
		for _, n := range left {
			_ = netnsutil.Delete(n)
		}
		if len(left) > 0 {
			t.Errorf("namespaces left behind: %v", left)
		}
	})
	return p
}

// rootLinks lists the links of the test's own namespace.
func rootLinks(t *testing.T) map[string]bool {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, l := range links {
		m[l.Attrs().Name] = true
	}
	return m
}

// TestLabChecks builds two hosts and runs every check: pings over IPv4 and
// IPv6 from the other namespace's kernel, ip neigh showing the port's MAC,
// station-to-station resolution, silence for an unowned address. It also
// watches the veth: frames from the station carry the port's MAC.
func TestLabChecks(t *testing.T) {
	p := prefix(t)
	before := rootLinks(t)
	l, err := Build(Topology{Prefix: p, Hosts: 2, Offload: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
		for name := range rootLinks(t) {
			if !before[name] {
				t.Errorf("link %s left in the root namespace", name)
			}
		}
	}()
	a, b := l.Hosts[0], l.Hosts[1]
	checkPlainBridges(t, a.Namespace, b.Namespace)
	sniff := startSniffer(t, b.Namespace, b.Uplink)
	for _, s := range l.Checks(context.Background()) {
		if !s.OK {
			t.Errorf("%s: %s", s.Name, s.Detail)
		}
	}
	frames := sniff()
	mac := a.Port.MAC()
	seen := 0
	for _, f := range frames {
		if bytes.Equal(f[6:12], mac[:]) {
			seen++
		}
	}
	if seen == 0 {
		t.Errorf("no frame from port MAC %v among %d on %s/%s", mac, len(frames), b.Namespace, b.Uplink)
	}
}

// checkPlainBridges fails the test when a namespace's bridges pass frames
// to the firewall hooks (br_netfilter), where the kernel has that module.
func checkPlainBridges(t *testing.T, namespaces ...string) {
	t.Helper()
	if _, err := os.Stat("/proc/sys/net/bridge"); err != nil {
		t.Logf("no br_netfilter here (%v): bridges are plain already", err)
		return
	}
	for _, ns := range namespaces {
		err := netnsutil.Do(netnsutil.Path(ns), func(*netlink.Handle) error {
			for _, key := range bridgeNetfilter {
				v, err := os.ReadFile("/proc/sys/" + key)
				if err != nil {
					return err
				}
				if got := strings.TrimSpace(string(v)); got != "0" {
					t.Errorf("%s: %s = %s, want 0", ns, key, got)
				}
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}
}

// startSniffer records the frames on an interface of a namespace until the
// returned function is called.
func startSniffer(t *testing.T, ns, ifname string) func() [][]byte {
	t.Helper()
	var fd int
	err := netnsutil.Do(netnsutil.Path(ns), func(h *netlink.Handle) error {
		link, err := h.LinkByName(ifname)
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ALL))
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: link.Attrs().Index})
	})
	if err != nil {
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	stop := make(chan struct{})
	done := make(chan [][]byte)
	go func() {
		var frames [][]byte
		buf := make([]byte, 65536)
		for {
			select {
			case <-stop:
				unix.Close(fd)
				done <- frames
				return
			default:
			}
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err == nil && n >= 14 {
				frames = append(frames, append([]byte(nil), buf[:n]...))
			}
		}
	}()
	return func() [][]byte { close(stop); return <-done }
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// TestLabRun runs the whole lab as `taproce lab` does, with impairment,
// after planting a leftover namespace of a killed run, on three hosts
// (the switch topology).
func TestLabRun(t *testing.T) {
	p := prefix(t)
	if err := netnsutil.Create(p + "7"); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	steps, err := Run(context.Background(), Options{
		Prefix: p, Hosts: 3, MTU: 1500, Offload: true, Frames: 2000, RDMA: 16 << 20,
		Impair: "loss=1%,duplicate=1%,reorder=5%,corrupt=0.1%,seed=7", Out: &out, Binary: "-",
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(steps) < 10 || !strings.Contains(out.String(), "RoCE frames") {
		t.Fatalf("table:\n%s", out.String())
	}
	t.Logf("\n%s", out.String())
	if left, _ := netnsutil.List(p); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// TestLabRunLink runs the lab behind the impairment's bottleneck link
// (taproce lab --impair rate=…,queue=…): the exchange's 512 frames in
// flight overflow the 128 KiB queues, whose drops are expected, and every
// step passes, the exchange's saying how many the queues dropped.
func TestLabRunLink(t *testing.T) {
	p := prefix(t)
	var out strings.Builder
	_, err := Run(context.Background(), Options{
		Prefix: p, Hosts: 2, MTU: 1500, Offload: true, Frames: 20000, RDMA: 16 << 20,
		Impair: "rate=1gbit,queue=128KiB", Out: &out, Binary: "-",
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "dropped by the link's queues") {
		t.Fatalf("no exchange lost frames to the link's queues:\n%s", out.String())
	}
	t.Logf("\n%s", out.String())
}

// TestLabSuperFrames runs the exchange over offloaded TAPs without
// impairment, so every batch goes out as UDP GSO super-frames, and checks
// that every packet arrives intact. It names a directory without
// taproce's libibverbs.so.1 (--lib): Debian's programs are then not
// run, each row says so, and the lab passes all the same.
func TestLabSuperFrames(t *testing.T) {
	p := prefix(t)
	var out strings.Builder
	steps, err := Run(context.Background(), Options{Prefix: p, Hosts: 2, Offload: true, Frames: 5000, RDMA: 64 << 20, Out: &out,
		Binary: taproceBinary(t), Socket: filepath.Join(t.TempDir(), "lab.sock"), LibDir: t.TempDir()})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	skipped := 0
	for _, s := range steps {
		if strings.Contains(s.Name, "Debian's") {
			if !s.Skipped || !s.OK || !strings.HasPrefix(s.Detail, "not run: ") {
				t.Errorf("%s: %+v", s.Name, s)
			}
			skipped++
		}
	}
	if skipped != 4 || !regexp.MustCompile(`ib_write_bw\s+65536\s+2000\s+not run`).MatchString(out.String()) {
		t.Errorf("%d skipped steps of Debian's programs, or no row saying so:\n%s", skipped, out.String())
	}
	if !strings.Contains(out.String(), "super-frames true") {
		t.Skipf("the kernel refused USO offloads:\n%s", out.String())
	}
	n := 0
	for _, s := range steps {
		if strings.HasPrefix(s.Name, "RoCE frames") {
			n++
			if !strings.HasPrefix(s.Detail, "5000 sent, 5000 received, 5000 intact") {
				t.Errorf("%s: %s", s.Name, s.Detail)
			}
		}
	}
	if n != 2 {
		t.Fatalf("%d exchange steps:\n%s", n, out.String())
	}
	if !strings.Contains(out.String(), "RDMA WRITE 64 MiB, READ it back") || !strings.Contains(out.String(), "SHA-256 identical") {
		t.Fatalf("no RDMA exchange:\n%s", out.String())
	}
}

// TestLabKernelLoss runs the exchange with the loss made by the kernel: an
// nftables rule on every veth drops 1 % of the RoCE packets.
func TestLabKernelLoss(t *testing.T) {
	p := prefix(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (nftables); scripts/setup installs it")
	}
	var out strings.Builder
	if _, err := Run(context.Background(), Options{Prefix: p, Hosts: 2, Offload: true, Frames: 2000, RDMA: 32 << 20, KernelLoss: 1, Out: &out, Binary: "-"}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "SHA-256 identical") || !strings.Contains(out.String(), "dropped by the kernels") {
		t.Fatalf("table:\n%s", out.String())
	}
	t.Logf("\n%s", out.String())
}

// TestLabRDMAImpaired runs the lab as `taproce lab --impair` does, client
// processes included, under loss, reordering, duplication and corruption
// on every port in both directions: 256 MiB moved by RDMA WRITE and read
// back by RDMA READ must have matching checksums, the UD pingpong must
// count the datagrams the impairment lost instead of stalling on the
// first, and the run must exit 0.
func TestLabRDMAImpaired(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 256 MiB over an impaired link; skipped with -short")
	}
	p := prefix(t)
	var out strings.Builder
	steps, err := Run(context.Background(), Options{Prefix: p, Hosts: 2, Offload: true, Frames: 2000, RDMA: 256 << 20,
		Impair: "loss=1%,reorder=5%,duplicate=1%,corrupt=0.1%", Out: &out,
		Binary: taproceBinary(t), Socket: filepath.Join(t.TempDir(), "lab.sock")})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "RDMA WRITE 256 MiB, READ it back") || !strings.Contains(out.String(), "SHA-256 identical") {
		t.Fatalf("table:\n%s", out.String())
	}
	var ud *Step
	for i := range steps {
		if strings.HasPrefix(steps[i].Name, "UD pingpong") {
			ud = &steps[i]
		}
	}
	if ud == nil {
		t.Fatalf("no UD pingpong step:\n%s", out.String())
	}
	m := regexp.MustCompile(`; (\d+) of (\d+) datagrams, (\d+) lost \(impaired link\)$`).FindStringSubmatch(ud.Detail)
	if !ud.OK || m == nil {
		t.Fatalf("UD pingpong: %s\n%s", ud.Detail, out.String())
	}
	got, _ := strconv.Atoi(m[1])
	sent, _ := strconv.Atoi(m[2])
	lost, _ := strconv.Atoi(m[3])
	// About 2 % of some 2000 datagrams are lost: none lost would mean the
	// impairment missed them or the count is wrong.
	if lost == 0 || got+lost != sent || sent < 1000 {
		t.Errorf("UD pingpong: %s", ud.Detail)
	}
	t.Logf("\n%s", out.String())
}

// TestLabPcap: --pcap records the frames of both directions, and every
// RoCE frame in it is well formed.
func TestLabPcap(t *testing.T) {
	p := prefix(t)
	path := t.TempDir() + "/lab.pcap"
	var out strings.Builder
	if _, err := Run(context.Background(), Options{Prefix: p, Hosts: 2, Offload: false, Frames: 200, RDMA: 4 << 20, Pcap: path, Out: &out, Binary: "-"}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	st, err := decode.File(io.Discard, path, decode.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// 200 frames each way, sent and received: 800 RoCE frames at least.
	if st.RoCE < 800 || st.Bad != 0 {
		t.Fatalf("capture: %+v", st)
	}
}

func TestBuildErrors(t *testing.T) {
	for _, tp := range []Topology{{Hosts: 1}, {Hosts: 100}, {Hosts: 2, MTU: 500}} {
		if _, err := Build(tp); err == nil {
			t.Errorf("%+v accepted", tp)
		}
	}
	if _, err := Run(context.Background(), Options{Hosts: 2, Impair: "loss=abc"}); err == nil {
		t.Error("bad impair spec accepted")
	}
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// taproceBinary builds the taproce command once per test run, for the
// lab's client processes.
func taproceBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "taproce-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "taproce")
		out, err := exec.Command("go", "build", "-o", buildPath, "github.com/taproce/taproce").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

// TestLabKeepServes: a lab left up (Keep) goes on serving verbs clients
// on its control socket, and says how to reach it in commands that work
// as printed, taproce's path included; it comes down when its context
// ends.
func TestLabKeepServes(t *testing.T) {
	p := prefix(t)
	bin := taproceBinary(t)
	sock := filepath.Join(t.TempDir(), "lab.sock")
	old := PIDFile
	PIDFile = filepath.Join(t.TempDir(), "lab.pid")
	defer func() { PIDFile = old }()
	pr, pw := io.Pipe()
	lines := make(chan string, 256)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, Options{Prefix: p, Hosts: 2, Offload: true, Frames: 100, RDMA: 1 << 20, Binary: bin, Keep: true,
			Socket: sock, Out: pw})
		pw.Close()
		done <- err
	}()
	var out strings.Builder
	for up := false; !up; {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("Run ended before keeping the lab up (%v):\n%s", <-done, out.String())
			}
			out.WriteString(line + "\n")
			up = strings.Contains(line, "stays up")
		case <-time.After(5 * time.Minute):
			t.Fatalf("the lab never came up:\n%s", out.String())
		}
	}
	var perfCmds, ibCmds []string
	sawSocket, sawDown := false, false
	for line := range lines { // the lines after "stays up" come at once
		out.WriteString(line + "\n")
		sawSocket = sawSocket || strings.Contains(line, "TAPROCE_SOCKET="+sock)
		sawDown = sawDown || strings.TrimSpace(line) == bin+" lab down"
		if cmd, ok := strings.CutPrefix(line, "  ip netns exec "); ok && strings.Contains(cmd, bin+" perf write_bw") {
			perfCmds = append(perfCmds, strings.TrimSpace(line))
		}
		if cmd, ok := strings.CutPrefix(line, "  ip netns exec "); ok && strings.Contains(cmd, "LD_LIBRARY_PATH=") && strings.Contains(cmd, " ib_write_bw ") {
			ibCmds = append(ibCmds, strings.TrimSpace(line))
		}
		if strings.Contains(line, "out-of-band exchange") {
			break
		}
	}
	if !sawSocket || !sawDown || len(perfCmds) != 2 || !strings.Contains(out.String(), "second terminal") {
		t.Errorf("no word of the control socket, of %s lab down, of a second terminal, or not two perf commands (%q):\n%s", bin, perfCmds, out.String())
	}
	for i, ns := range []string{p + "1", p + "2"} {
		cmd := exec.Command("ip", "netns", "exec", ns, bin, "devices")
		cmd.Env = append(os.Environ(), "TAPROCE_SOCKET="+sock)
		got, err := cmd.CombinedOutput()
		if want := fmt.Sprintf("taproce%d", i); err != nil || !strings.Contains(string(got), want) {
			t.Errorf("taproce devices in %s: %v\n%s\nwant %s listed", ns, err, got, want)
		}
	}
	// The perf server and client, run as printed, by a shell; then, where
	// the lab ran Debian's programs, ib_write_bw's as printed.
	runPrinted := func(cmds []string) {
		srv, err := runClient(exec.Command("sh", "-c", cmds[0]), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.waitListen(p+"1", exchangePort, serverStart); err != nil {
			_ = srv.wait(time.Millisecond)
			t.Fatalf("%s: %v\n%s", cmds[0], err, srv.output())
		}
		got, err := exec.Command("sh", "-c", cmds[1]).CombinedOutput()
		if err != nil || !strings.Contains(string(got), "BW average") {
			t.Errorf("%s: %v\n%s", cmds[1], err, got)
		}
		if err := srv.wait(time.Minute); err != nil {
			t.Errorf("%s: %v\n%s", cmds[0], err, srv.output())
		}
	}
	if len(perfCmds) == 2 {
		runPrinted(perfCmds)
	}
	ranDebian := strings.Contains(out.String(), "Debian's RDMA programs run on it")
	if ranDebian != (len(ibCmds) == 2) {
		t.Errorf("ib_write_bw commands %q:\n%s", ibCmds, out.String())
	} else if ranDebian {
		runPrinted(ibCmds)
		t.Logf("ran as printed: %q", ibCmds)
	}
	cancel()
	go func() {
		for range lines {
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return once its context ended")
	}
	if left, _ := netnsutil.List(p); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestRemovedString: `taproce lab down` says what it removed, and that
// there was no lab when there was none.
func TestRemovedString(t *testing.T) {
	for _, c := range []struct {
		r    Removed
		want string
	}{
		{Removed{Prefix: "taproce-lab-"}, "no lab to remove: no kept lab is running and no namespace starts with taproce-lab-"},
		{Removed{Prefix: "p-", PID: 42, Namespaces: []string{"p-1", "p-2"}}, "stopped the kept lab (pid 42) and removed its namespaces p-1, p-2"},
		{Removed{Prefix: "p-", PID: 42}, "stopped the kept lab (pid 42)"},
		{Removed{Prefix: "p-", Namespaces: []string{"p-1"}}, "removed namespaces p-1, left behind by a lab that did not end"},
	} {
		if got := c.r.String(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.r, got, c.want)
		}
	}
}

// TestDown: with nothing up, Down removes nothing and says so; it removes
// the namespaces a lab left behind, and stops a kept lab's process (here
// a helper process standing in for one), naming both.
func TestDown(t *testing.T) {
	p := prefix(t)
	old := PIDFile
	PIDFile = filepath.Join(t.TempDir(), "lab.pid")
	defer func() { PIDFile = old }()

	r, err := Down(p)
	if err != nil || r.PID != 0 || len(r.Namespaces) != 0 || !strings.HasPrefix(r.String(), "no lab to remove") {
		t.Fatalf("nothing up: %+v %q, %v", r, r.String(), err)
	}

	for _, n := range []string{p + "1", p + "2"} {
		if err := netnsutil.Create(n); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$") // its command line holds "lab", as a lab's does
	cmd.Env = append(os.Environ(), listenEnv+"=0 1h")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill() // by PID, the helper this test started
		<-waited
	}()
	// Down knows a lab's process by its command line, which is the
	// helper's once it has started.
	execed := waitFor(time.Minute, func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid))
		return strings.Contains(string(b), "-test.run=^$")
	})
	if !execed {
		t.Fatal("the helper process did not start")
	}
	if err := os.WriteFile(PIDFile, []byte(fmt.Sprintf("%d\n", cmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err = Down(p)
	if err != nil || r.PID != cmd.Process.Pid || fmt.Sprint(r.Namespaces) != fmt.Sprint([]string{p + "1", p + "2"}) {
		t.Fatalf("lab up: %+v, %v", r, err)
	}
	select {
	case <-waited:
		waited <- nil
	case <-time.After(time.Minute):
		t.Fatal("the kept lab's process still runs")
	}
	if left, _ := netnsutil.List(p); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
	t.Log(r)
}
