// Package interop checks taproce against an independent RoCEv2
// implementation: the Linux kernel's Soft-RoCE driver (rdma_rxe) with
// rdma-core's tools, running in small Debian VMs that the shared peer
// scripts boot on a private bridge. It holds the harness over those
// scripts (Peer), a taproce port with a transport engine on the same bridge
// (Endpoint), the out-of-band exchange and data exchange of rdma-core's
// ibv_rc_pingpong and ibv_ud_pingpong (Pingpong), and a check of recorded
// RoCE traffic (CheckCapture). The tests of this package use them; tools
// may too.
package interop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/internal/netnsutil"
)

// The network the peer scripts build: every VM and every taproce port of
// the suite sits on Bridge inside the network namespace Namespace, where
// the kernel has HostIP on the bridge.
const (
	Namespace = "rxe-peer"
	Bridge    = "br-rxe"
	// HostIP is the namespace kernel's own address on the bridge. The
	// out-of-band TCP exchanges of the rdma-core tools go to it: a
	// taproce station answers ARP and ICMP echo but has no TCP.
	HostIP = "10.99.0.1"
	// Subnet is the bridge's subnet; the scripts address nothing else.
	Subnet = "10.99.0.0/24"
)

// PeerDirEnv names the environment variable that overrides the directory
// of the peer scripts.
const PeerDirEnv = "TAPROCE_PEER_DIR"

// Timeouts of the scripts. The first start builds the VM image (1–2 min
// with empty caches, mostly downloading).
const (
	BuildTimeout = 10 * time.Minute
	StartTimeout = 5 * time.Minute
	StopTimeout  = 30 * time.Second
)

// ScriptDir returns the directory of the peer scripts: $TAPROCE_PEER_DIR,
// or ../shared/peer relative to the module root found by walking up from
// the working directory to go.mod.
func ScriptDir() (string, error) {
	if d := os.Getenv(PeerDirEnv); d != "" {
		return filepath.Abs(d)
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(root), "shared", "peer"), nil
}

// moduleRoot walks up from the working directory to the directory holding
// go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("interop: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("interop: no go.mod above the working directory; set " + PeerDirEnv)
		}
		dir = up
	}
}

var availability = sync.OnceValue(checkAvailable)

// Available reports why the interop suite cannot run here, or nil when it
// can: it needs root, /dev/net/tun, the peer scripts, and the VM image,
// which it builds when missing (the build script also installs qemu and
// the other host tools when they are missing). The answer is computed once
// per process.
func Available() error { return availability() }

func checkAvailable() error {
	if os.Geteuid() != 0 {
		return errors.New("interop: needs root (network namespace, TAP devices, VMs)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("interop: needs /dev/net/tun: %w", err)
	}
	dir, err := ScriptDir()
	if err != nil {
		return err
	}
	for _, s := range []string{"build-image.sh", "start-peer.sh", "peer-exec.sh", "stop-peer.sh"} {
		if _, err := os.Stat(filepath.Join(dir, s)); err != nil {
			return fmt.Errorf("interop: peer scripts not found (set %s): %w", PeerDirEnv, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), BuildTimeout)
	defer cancel()
	if out, err := runScript(ctx, dir, "build-image.sh"); err != nil {
		return fmt.Errorf("interop: the peer VM image cannot be built: %w\n%s", err, tail(out, 20))
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return fmt.Errorf("interop: no qemu-system-x86_64: %w", err)
	}
	return nil
}

// runScript runs a peer script with its output in a temporary file rather
// than a pipe: start-peer.sh leaves a daemonised qemu behind, which must
// not hold our end of a pipe.
func runScript(ctx context.Context, dir, script string, args ...string) (string, error) {
	f, err := os.CreateTemp("", "taproce-interop-*.log")
	if err != nil {
		return "", fmt.Errorf("interop: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, script), args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	runErr := cmd.Run()
	out, _ := os.ReadFile(f.Name())
	if runErr != nil {
		if ctx.Err() != nil {
			runErr = fmt.Errorf("%w (%w)", runErr, ctx.Err())
		}
		return string(out), fmt.Errorf("%s %s: %w", script, strings.Join(args, " "), runErr)
	}
	return string(out), nil
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// LockPath is the file whose lock Lock takes.
var LockPath = filepath.Join(os.TempDir(), "taproce-interop.lock")

// Lock takes the machine-wide lock of the interop suite, so that two
// processes do not boot, reuse or stop the same VMs or open the same TAP
// devices at once. It waits until the lock is free or ctx ends, and
// returns the function that releases it.
func Lock(ctx context.Context) (unlock func(), err error) {
	f, err := os.OpenFile(LockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("interop: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() {
				unix.Flock(int(f.Fd()), unix.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("interop: locking %s: %w", LockPath, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("interop: another process holds %s: %w", LockPath, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Peer is one running rxe VM.
type Peer struct {
	Name string     // peer name, [a-z0-9-]{1,10}
	IP   netip.Addr // eth0 address, in Subnet
	dir  string

	stopOnce sync.Once
	stopErr  error

	mu       sync.Mutex
	idle     []*session // sessions for Exec
	closing  bool       // Stop has begun
	restored map[int]func(context.Context) error
	nextHook int
}

// Start boots a peer VM named name with address ip on the bridge (building
// the image first if needed) and waits until rxe0 is active and ssh
// answers. A peer of that name that is already running with that address
// is reused. The VM runs until Stop.
func Start(ctx context.Context, name, ip string) (*Peer, error) {
	addr, err := netip.ParseAddr(ip)
	if err != nil || !netip.MustParsePrefix(Subnet).Contains(addr) {
		return nil, fmt.Errorf("interop: peer address %q is not in %s", ip, Subnet)
	}
	dir, err := ScriptDir()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, "start-peer.sh")); err != nil {
		return nil, fmt.Errorf("interop: peer scripts not found (set %s): %w", PeerDirEnv, err)
	}
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	p := &Peer{Name: name, IP: addr, dir: dir}
	if out, err := runScript(ctx, dir, "start-peer.sh", name, ip); err != nil {
		// A VM this call launched ("peer NAME booting") is stopped again;
		// one that was running before is left alone.
		if strings.Contains(out, "peer "+name+" booting") || ctx.Err() != nil {
			p.Stop()
		}
		return nil, fmt.Errorf("interop: starting peer %s: %w\n%s", name, err, tail(out, 30))
	}
	return p, nil
}

// Exec runs cmd in the VM as root through bash (pipes, redirections and
// quoting work), in a session of its own, and returns its output; err
// carries the exit status (ExitCode) when the command exits non-zero. A
// command that should keep running after Exec returns must be detached
// with nohup and redirections; Background does that. The commands go over
// ssh connections that Exec keeps open for the next ones; when none can
// be used, the command gets an ssh connection of its own (ExecOnce).
func (p *Peer) Exec(ctx context.Context, cmd string) (stdout, stderr string, err error) {
	s, err := p.session()
	if err != nil {
		return p.ExecOnce(ctx, cmd)
	}
	o, e, code, err := s.run(ctx, cmd)
	switch {
	case err != nil:
		s.close()
		return o, e, fmt.Errorf("interop: %s: %q: %w", p.Name, cmd, err)
	case code != 0:
		err = fmt.Errorf("interop: %s: %q: %w", p.Name, cmd, &exitError{code})
	}
	p.release(s)
	return o, e, err
}

// ExecOnce is Exec over an ssh connection of its own (peer-exec.sh NAME
// CMD); err wraps an *exec.ExitError when the command exits non-zero.
func (p *Peer) ExecOnce(ctx context.Context, cmd string) (stdout, stderr string, err error) {
	var o, e bytes.Buffer
	c := exec.CommandContext(ctx, filepath.Join(p.dir, "peer-exec.sh"), p.Name, cmd)
	c.Stdout, c.Stderr = &o, &e
	c.WaitDelay = 5 * time.Second
	if err := c.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return o.String(), e.String(), fmt.Errorf("interop: %s: %q: %w", p.Name, cmd, err)
	}
	return o.String(), e.String(), nil
}

// ExitCode returns the exit status of a command that Exec ran, or -1 when
// err is not an exit status.
func ExitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	var se *exitError
	if errors.As(err, &se) {
		return se.code
	}
	return -1
}

// Quote quotes s for a POSIX shell.
func Quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Job is a command running in the background in a VM.
type Job struct {
	p   *Peer
	log string // output file in the VM; LOG.rc gets the exit status
}

// Background starts cmd detached in the VM (nohup, output to a file there)
// and returns at once. name names the job's files under /tmp in the VM.
func (p *Peer) Background(ctx context.Context, name, cmd string) (*Job, error) {
	j := &Job{p: p, log: "/tmp/" + name + ".log"}
	inner := cmd + "; echo $? >" + j.log + ".rc"
	remote := fmt.Sprintf("rm -f %[1]s %[1]s.rc; nohup sh -c %[2]s >%[1]s 2>&1 </dev/null & echo $! >%[1]s.pid",
		j.log, Quote(inner))
	if _, stderr, err := p.Exec(ctx, remote); err != nil {
		return nil, fmt.Errorf("%w: %s", err, stderr)
	}
	return j, nil
}

// Wait waits up to timeout for the job to end and returns its exit status
// and output. A job still running at the timeout is killed.
func (j *Job) Wait(ctx context.Context, timeout time.Duration) (code int, output string, err error) {
	ticks := int(timeout / (200 * time.Millisecond))
	script := fmt.Sprintf(`i=0; while [ ! -e %[1]s.rc ]; do i=$((i+1)); if [ $i -gt %[2]d ]; then kill $(cat %[1]s.pid) 2>/dev/null; echo TIMEOUT >%[1]s.rc; break; fi; sleep 0.2; done; cat %[1]s.rc; echo ---; cat %[1]s`,
		j.log, ticks)
	out, stderr, err := j.p.Exec(ctx, script)
	if err != nil {
		return -1, out, fmt.Errorf("%w: %s", err, stderr)
	}
	status, output, _ := strings.Cut(out, "---\n")
	status = strings.TrimSpace(status)
	if status == "TIMEOUT" {
		return -1, output, fmt.Errorf("interop: %s: job %s still running after %v, killed", j.p.Name, j.log, timeout)
	}
	code, err = strconv.Atoi(status)
	if err != nil {
		return -1, output, fmt.Errorf("interop: %s: job %s: exit status %q: %w", j.p.Name, j.log, status, err)
	}
	return code, output, nil
}

// Task is a command running in a VM in an Exec of its own, started by
// Spawn. Unlike a Job, it ends with its Exec; it costs one command where a
// Job costs two (start and Wait).
type Task struct {
	p      *Peer
	pid    string // file in the VM holding the remote shell's PID
	cancel context.CancelFunc
	done   chan struct{}

	out, stderr string
	err         error
}

// Spawn starts cmd in the VM through Exec on a goroutine and returns at
// once; name names the task's PID file under /tmp in the VM. The
// command's standard output and error are Wait's output.
func (p *Peer) Spawn(ctx context.Context, name, cmd string) *Task {
	ctx, cancel := context.WithCancel(ctx)
	t := &Task{p: p, pid: "/tmp/" + name + ".pid", cancel: cancel, done: make(chan struct{})}
	// sshd starts the remote shell in a session of its own, so its PID
	// is the process group of the command. The spaces keep a command in
	// parentheses from making "((", an arithmetic command.
	remote := fmt.Sprintf("echo $$ >%s; ( %s ) 2>&1", t.pid, cmd)
	go func() {
		defer close(t.done)
		t.out, t.stderr, t.err = p.Exec(ctx, remote)
	}()
	return t
}

// Wait waits up to timeout for the task to end and returns its exit status
// and output, as Job.Wait does. A task still running at the timeout, or
// when ctx ends, is killed: its process group in the VM, and its Exec.
func (t *Task) Wait(ctx context.Context, timeout time.Duration) (code int, output string, err error) {
	defer t.cancel()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-t.done:
	case <-timer.C:
		t.kill()
		return -1, t.out, fmt.Errorf("interop: %s: task %s still running after %v, killed", t.p.Name, t.pid, timeout)
	case <-ctx.Done():
		t.kill()
		return -1, t.out, fmt.Errorf("interop: %s: task %s: %w", t.p.Name, t.pid, ctx.Err())
	}
	if t.err != nil {
		if code := ExitCode(t.err); code >= 0 {
			return code, t.out, nil
		}
		return -1, t.out, fmt.Errorf("%w: %s", t.err, t.stderr)
	}
	return 0, t.out, nil
}

// kill ends the task's process group in the VM, then its Exec.
func (t *Task) kill() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t.p.Exec(ctx, fmt.Sprintf("kill -- -$(cat %s) 2>/dev/null", t.pid))
	t.cancel()
	<-t.done
}

// CountersCommand prints the rxe port counters of the VM's rxe0 as
// "PATH:VALUE" lines, for ParseCounters; scripts run in the VM may embed
// it to save an Exec.
const CountersCommand = "grep -H . /sys/class/infiniband/rxe0/ports/1/hw_counters/*"

// Counters returns the rxe port counters of the VM's rxe0
// (/sys/class/infiniband/rxe0/ports/1/hw_counters).
func (p *Peer) Counters(ctx context.Context) (Counters, error) {
	out, stderr, err := p.Exec(ctx, CountersCommand)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, stderr)
	}
	return ParseCounters(out), nil
}

// ParseCounters parses the output of CountersCommand; lines of another
// form are ignored.
func ParseCounters(out string) Counters {
	c := Counters{}
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err == nil {
			c[filepath.Base(k)] = n
		}
	}
	return c
}

// Counters are rxe port counters by name.
type Counters map[string]uint64

// Sub returns the counters that changed from before to c, by how much.
func (c Counters) Sub(before Counters) Counters {
	d := Counters{}
	for k, v := range c {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

// String lists the counters sorted by name.
func (c Counters) String() string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(c)) {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", k, c[k])
	}
	return b.String()
}

// SetMTU sets the MTU of the VM's eth0 and of its TAP on the bridge; rxe
// follows with its active MTU (netdev MTU less 80 bytes, rounded down to a
// path MTU).
func (p *Peer) SetMTU(ctx context.Context, mtu int) error {
	// Raise the host side first and lower it last, so that the link
	// never carries frames one end cannot take.
	host := func() error {
		return netnsutil.Do(netnsutil.Path(Namespace), func(h *netlink.Handle) error {
			link, err := h.LinkByName("tap-" + p.Name)
			if err != nil {
				return err
			}
			return h.LinkSetMTU(link, mtu)
		})
	}
	cur, _, err := p.Exec(ctx, "cat /sys/class/net/eth0/mtu")
	if err != nil {
		return err
	}
	old, _ := strconv.Atoi(strings.TrimSpace(cur))
	if mtu > old {
		if err := host(); err != nil {
			return fmt.Errorf("interop: MTU of tap-%s: %w", p.Name, err)
		}
	}
	if _, stderr, err := p.Exec(ctx, fmt.Sprintf("ip link set eth0 mtu %d", mtu)); err != nil {
		return fmt.Errorf("%w: %s", err, stderr)
	}
	if mtu < old {
		if err := host(); err != nil {
			return fmt.Errorf("interop: MTU of tap-%s: %w", p.Name, err)
		}
	}
	// The next commands connect anew, over the link as it is now.
	p.closeSessions(false)
	return nil
}

// Stop closes Exec's ssh sessions, stops the VM (stop-peer.sh kills it
// by its recorded PID) and removes its TAP; the scripts delete the
// namespace when nothing else is left in it. Stop is idempotent.
func (p *Peer) Stop() error {
	p.stopOnce.Do(func() {
		p.closeSessions(true)
		ctx, cancel := context.WithTimeout(context.Background(), StopTimeout)
		defer cancel()
		if out, err := runScript(ctx, p.dir, "stop-peer.sh", p.Name); err != nil {
			p.stopErr = fmt.Errorf("interop: stopping peer %s: %w\n%s", p.Name, err, tail(out, 10))
		}
	})
	return p.stopErr
}

// ErrPeerDown: the VM has exited or no longer answers; Check's error wraps
// it with the end of the VM's console.
var ErrPeerDown = errors.New("the VM is down")

// checkTimeout bounds Check's command: an ssh connection to a VM whose
// kernel is stuck fails after its keep-alives (30 s) at the latest.
const checkTimeout = 45 * time.Second

// runDir is the scripts' state directory ($RXE_PEER_DIR/run, lib.sh).
func runDir() string {
	d := os.Getenv("RXE_PEER_DIR")
	if d == "" {
		d = "/var/tmp/rxe-peer"
	}
	return filepath.Join(d, "run")
}

// Console returns the last n lines of the VM's serial console: a kernel
// that panicked or locked up says so there.
func (p *Peer) Console(n int) string {
	b, err := os.ReadFile(filepath.Join(runDir(), p.Name+".console.log"))
	if err != nil {
		return fmt.Sprintf("(no console: %v)", err)
	}
	return tail(string(b), n)
}

// running reports whether the VM's qemu process is alive: the PID in its
// pid file names a process whose command line is this peer's qemu.
func (p *Peer) running() bool {
	b, err := os.ReadFile(filepath.Join(runDir(), p.Name+".pid"))
	if err != nil {
		return false
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", strings.TrimSpace(string(b)), "cmdline"))
	return err == nil && bytes.Contains(cmdline, []byte("rxe-peer-"+p.Name))
}

// Check returns nil when the VM runs and answers a command over a
// connection of its own, and an error wrapping ErrPeerDown otherwise.
func (p *Peer) Check(ctx context.Context) error {
	if !p.running() {
		return fmt.Errorf("interop: %s: %w: qemu has exited; its console ends:\n%s", p.Name, ErrPeerDown, p.Console(40))
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	if _, stderr, err := p.ExecOnce(ctx, "true"); err != nil {
		return fmt.Errorf("interop: %s: %w: it does not answer (%v: %s); its console ends:\n%s",
			p.Name, ErrPeerDown, err, strings.TrimSpace(stderr), p.Console(40))
	}
	return nil
}

// Restart stops the VM and boots it again with the same name and address,
// for a suite whose VM went down: the VM comes back as it boots (MTU 1500,
// no qdisc), and sessions are opened anew.
func (p *Peer) Restart(ctx context.Context) error {
	p.closeSessions(false)
	sctx, cancel := context.WithTimeout(ctx, StopTimeout)
	out, err := runScript(sctx, p.dir, "stop-peer.sh", p.Name)
	cancel()
	if err != nil {
		return fmt.Errorf("interop: stopping peer %s: %w\n%s", p.Name, err, tail(out, 10))
	}
	sctx, cancel = context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	if out, err := runScript(sctx, p.dir, "start-peer.sh", p.Name, p.IP.String()); err != nil {
		return fmt.Errorf("interop: restarting peer %s: %w\n%s", p.Name, err, tail(out, 30))
	}
	p.mu.Lock()
	hooks := slices.Sorted(maps.Keys(p.restored))
	fs := make([]func(context.Context) error, len(hooks))
	for i, k := range hooks {
		fs[i] = p.restored[k]
	}
	p.mu.Unlock()
	for _, f := range fs {
		if err := f(sctx); err != nil {
			return fmt.Errorf("interop: restoring peer %s after its restart: %w", p.Name, err)
		}
	}
	return nil
}

// OnRestart registers f to put back, after a Restart, state a test gave
// the VM (an MTU, a qdisc); hooks run in the order they were registered.
// The returned function removes f.
func (p *Peer) OnRestart(f func(context.Context) error) (remove func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.restored == nil {
		p.restored = map[int]func(context.Context) error{}
	}
	k := p.nextHook
	p.nextHook++
	p.restored[k] = f
	return func() {
		p.mu.Lock()
		delete(p.restored, k)
		p.mu.Unlock()
	}
}
