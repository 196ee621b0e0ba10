// Package ibvtest runs unmodified programs linked against libibverbs on
// taproce through its own libibverbs.so.1 (verbs/libibverbs): it builds
// the library and starts the programs against an appliance. Its tests
// are the library's.
package ibvtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// Lib is a built libibverbs.so.1 and librdmacm.so.1.
type Lib struct {
	// Dir holds libibverbs.so.1 and librdmacm.so.1: what LD_LIBRARY_PATH
	// names.
	Dir string
	// Preload, for a library built with the sanitizers, is the runtime
	// an uninstrumented program must load first.
	Preload string
}

var (
	buildMu sync.Mutex
	built   = map[bool]*Lib{}
)

// srcDir is verbs/libibverbs, where the library's sources are.
func srcDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// ErrNoToolchain is Build's error where the C toolchain or Debian's
// libibverbs-dev headers are missing (scripts/setup installs them).
var ErrNoToolchain = errors.New("ibvtest: no C toolchain or libibverbs-dev and librdmacm-dev headers (scripts/setup installs them)")

// Build builds the library (with AddressSanitizer and
// UndefinedBehaviorSanitizer when sanitize is set) and returns it.
func Build(sanitize bool) (*Lib, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if l := built[sanitize]; l != nil {
		return l, nil
	}
	for _, tool := range []string{"make", "cc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNoToolchain, err)
		}
	}
	for _, h := range []string{"/usr/include/infiniband/verbs.h", "/usr/include/rdma/rdma_cma.h"} {
		if _, err := os.Stat(h); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNoToolchain, err)
		}
	}
	args := []string{"-C", srcDir()}
	out := "build"
	if sanitize {
		args = append(args, "SANITIZE=1")
		out = "build-san"
	}
	// librdmacm.so.1 goes into libibverbs' build directory too.
	for _, dir := range []string{srcDir(), filepath.Join(filepath.Dir(srcDir()), "librdmacm")} {
		cmd := exec.Command("make", append([]string{"-C", dir}, args[2:]...)...)
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ibvtest: make: %v\n%s", err, b)
		}
	}
	l := &Lib{Dir: filepath.Join(srcDir(), out)}
	if sanitize {
		b, err := exec.Command("cc", "-print-file-name=libasan.so").Output()
		if err != nil {
			return nil, fmt.Errorf("ibvtest: libasan: %v", err)
		}
		l.Preload = string(bytes.TrimSpace(b))
	}
	built[sanitize] = l
	return l, nil
}

// Need returns the library, skipping the test when it cannot be built
// here for want of the toolchain, failing it for any other reason.
func Need(t testing.TB, sanitize bool) *Lib {
	t.Helper()
	l, err := Build(sanitize)
	if errors.Is(err, ErrNoToolchain) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Env returns the environment a program needs to run on taproce with l:
// the library path, the appliance's socket.
func (l *Lib) Env(socket string) []string {
	env := append(os.Environ(), "LD_LIBRARY_PATH="+l.Dir, "TAPROCE_SOCKET="+socket)
	if l.Preload != "" {
		env = append(env, "LD_PRELOAD="+l.Preload, "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1",
			"UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
	}
	return env
}

var (
	taproceOnce sync.Once
	taproceBin  string
	taproceErr  error
)

// Taproce returns the taproce command, built from this source tree (go
// build) into the library's build directory once per test binary.
func Taproce(t testing.TB) string {
	t.Helper()
	taproceOnce.Do(func() {
		bin := filepath.Join(srcDir(), "build", "taproce")
		cmd := exec.Command("go", "build", "-o", bin, "github.com/taproce/taproce")
		cmd.Dir = srcDir()
		if b, err := cmd.CombinedOutput(); err != nil {
			taproceErr = fmt.Errorf("ibvtest: go build taproce: %v\n%s", err, b)
			return
		}
		taproceBin = bin
	})
	if taproceErr != nil {
		t.Fatal(taproceErr)
	}
	return taproceBin
}

// Exec starts program with args on taproce as a user would, through
// `taproce exec --lib DIR --socket SOCKET -- PROGRAM ARGS…` with l and
// the appliance at socket, the test's environment with env added; it is
// skipped when program is not installed. Like Start, it is killed after
// timeout or when the test ends.
func (l *Lib) Exec(t testing.TB, socket string, env []string, timeout time.Duration, program string, args ...string) *Program {
	t.Helper()
	if _, err := exec.LookPath(program); err != nil {
		t.Skipf("%s is not installed (scripts/setup installs it): %v", program, err)
	}
	all := append(os.Environ(), env...)
	if l.Preload != "" {
		all = append(all, "LD_PRELOAD="+l.Preload, "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1",
			"UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
	}
	return Start(t, all, timeout, Taproce(t), append([]string{"exec", "--lib", l.Dir, "--socket", socket, "--", program}, args...)...)
}

// Output collects a program's output; it may be read while the program
// writes.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

// String returns the output so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// Program is a program started on taproce.
type Program struct {
	Cmd    *exec.Cmd
	Out    Output
	done   chan struct{}
	err    error
	cancel context.CancelFunc
}

// Start starts name with args in env, killed after timeout or when the
// test ends; its standard output and error go to Out.
func Start(t testing.TB, env []string, timeout time.Duration, name string, args ...string) *Program {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not installed (scripts/setup installs it): %v", name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	p := &Program{done: make(chan struct{}), cancel: cancel}
	p.Cmd = exec.CommandContext(ctx, path, args...)
	p.Cmd.Env = env
	p.Cmd.Stdout = &p.Out
	p.Cmd.Stderr = &p.Out
	if err := p.Cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() {
		p.err = p.Cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-p.done
	})
	return p
}

// Wait waits for the program and returns its error (nil for exit 0).
func (p *Program) Wait() error {
	<-p.done
	p.cancel()
	return p.err
}

// Run runs name to its end and returns its output and error.
func Run(t testing.TB, env []string, timeout time.Duration, name string, args ...string) (string, error) {
	t.Helper()
	p := Start(t, env, timeout, name, args...)
	err := p.Wait()
	return p.Out.String(), err
}

// WaitOutput waits until p has written line, a whole line of output.
func WaitOutput(t testing.TB, p *Program, line string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, l := range strings.Split(p.Out.String(), "\n") {
			if l == line {
				return
			}
		}
		select {
		case <-p.done:
			t.Fatalf("%s ended before it said %q: %v\n%s", p.Cmd.Path, line, p.err, p.Out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("%s never said %q\n%s", p.Cmd.Path, line, p.Out.String())
}

// WaitListen waits until a TCP socket of this machine's network namespace
// listens on port (a server program ready for its client), or the
// program p ends, or timeout passes; it fails the test then.
func WaitListen(t testing.TB, p *Program, port int, timeout time.Duration) {
	t.Helper()
	want := fmt.Sprintf(":%04X ", port)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			b, _ := os.ReadFile(f)
			for _, line := range bytes.Split(b, []byte("\n")) {
				fields := bytes.Fields(line)
				if len(fields) > 3 && bytes.HasSuffix(append(fields[1], ' '), []byte(want)) && string(fields[3]) == "0A" {
					return
				}
			}
		}
		select {
		case <-p.done:
			t.Fatalf("%s ended before it listened on %d: %v\n%s", p.Cmd.Path, port, p.err, p.Out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("%s never listened on %d\n%s", p.Cmd.Path, port, p.Out.String())
}
