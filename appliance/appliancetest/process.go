package appliancetest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/verbs/abi"
)

// processEnv carries a Process's options to the child test binary, as
// JSON of processOptions; its presence makes ServeProcess serve.
const processEnv = "TAPROCE_TEST_APPLIANCE_PROCESS"

// processOptions are the Options a Process passes on: those that are
// data (impairments and loggers stay the child's defaults).
type processOptions struct {
	Poll        string
	LocalSwitch bool
	MTU, Depth  int
	Namespace   string
	Net         byte
	Linger      time.Duration
	Socket      string
}

// Process is a test appliance serving in a child process, so that a test
// can kill it as an appliance dies: with SIGKILL, its sockets and shared
// memory closed by the kernel and nothing said to its clients.
type Process struct {
	// Socket is the control socket, also in TAPROCE_SOCKET.
	Socket string
	cmd    *exec.Cmd
	once   sync.Once
	err    error
}

// StartProcess starts a test appliance like New in a child process: the
// test binary itself, running only its test named helper, which must call
// ServeProcess. It waits until the appliance serves and points
// TAPROCE_SOCKET at it. The child is killed when the test ends; one
// that outlives a crashed parent ends at its own test timeout.
func StartProcess(t *testing.T, helper string, o Options) *Process {
	t.Helper()
	o = o.withDefaults()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	po := processOptions{Poll: o.Poll.String(), LocalSwitch: o.LocalSwitch, MTU: o.MTU, Depth: o.Depth,
		Namespace: o.Namespace, Net: o.Net, Linger: o.Linger, Socket: filepath.Join(t.TempDir(), "taproce.sock")}
	js, err := json.Marshal(po)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^"+helper+"$", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), processEnv+"="+string(js))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Process{Socket: po.Socket, cmd: cmd}
	t.Cleanup(func() { _ = p.Kill() })
	// The child says "serving" once its socket listens; anything else
	// (a failure, a helper that does not serve) ends its output first.
	sc := bufio.NewScanner(out)
	var said []string
	for sc.Scan() {
		if sc.Text() == "serving" {
			t.Setenv(abi.SocketEnv, p.Socket)
			return p
		}
		said = append(said, sc.Text())
	}
	t.Fatalf("appliance process (test %s) ended without serving:\n%s", helper, strings.Join(said, "\n"))
	return nil
}

// Pid returns the child's process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Kill kills the appliance with SIGKILL and waits until it has died; the
// kernel has then closed its end of every client's control socket.
// Killing it again does nothing.
func (p *Process) Kill() error {
	p.once.Do(func() {
		if err := p.cmd.Process.Kill(); err != nil {
			p.err = fmt.Errorf("appliancetest: kill the appliance process: %w", err)
		}
		_ = p.cmd.Wait()
	})
	return p.err
}

// ServeProcess is the body of the helper test that StartProcess runs: in
// the child it serves the appliance until the process is killed; run as
// a test of its own it skips.
func ServeProcess(t *testing.T) {
	js := os.Getenv(processEnv)
	if js == "" {
		t.Skip("the appliance process of StartProcess")
	}
	var po processOptions
	if err := json.Unmarshal([]byte(js), &po); err != nil {
		t.Fatal(err)
	}
	mode, err := appliance.ParsePollMode(po.Poll)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Poll: mode, LocalSwitch: po.LocalSwitch, MTU: po.MTU, Depth: po.Depth, Namespace: po.Namespace,
		Net: po.Net, Linger: po.Linger}
	newAt(t, o.withDefaults(), po.Socket)
	fmt.Println("serving")
	select {}
}
