package matrix

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// perftestArgs are the command line options of o.
func perftestArgs(o Options) []string {
	var args []string
	if o.Conn != "RC" {
		args = append(args, "-c", o.Conn)
	}
	if o.AtomicOp != "" {
		args = append(args, "-A", o.AtomicOp)
	}
	args = append(args, strings.Fields(string(o.Mode))...)
	if o.Size != 0 {
		args = append(args, "-s", fmt.Sprint(o.Size))
	}
	return args
}

// TestRefusalAsPerftest checks Refusal against Debian's perftest itself:
// every tool with every combination of the matrix's connection types,
// atomic operations and modes, and besides an atomic operation for
// every other tool, a size for the atomic ones, and -a with -D for all,
// run with a device nobody has on rdma-core's own library. perftest
// refuses what it refuses with its message and exit status 1 before it
// looks for the device; what it accepts ends at the device it cannot
// find (lookedForDevice).
func TestRefusalAsPerftest(t *testing.T) {
	for _, tool := range Tools {
		if _, err := exec.LookPath(tool.Name()); err != nil {
			t.Skipf("%s is not installed (Debian's perftest; scripts/setup installs it): %v", tool.Name(), err)
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LD_LIBRARY_PATH=") && !strings.HasPrefix(kv, "LD_PRELOAD=") {
			env = append(env, kv)
		}
	}
	type probe struct {
		tool Tool
		o    Options
	}
	var probes []probe
	for _, tool := range Tools {
		ops := []string{""}
		if tool.Verb == Atomic {
			ops = AtomicOps
		}
		for _, conn := range Connections {
			for _, op := range ops {
				for _, mode := range Modes {
					probes = append(probes, probe{tool, Options{Conn: conn, AtomicOp: op, Mode: mode}})
				}
			}
		}
		probes = append(probes, probe{tool, Options{Conn: "RC", Mode: "-a -D 1"}})
		if tool.Verb == Atomic {
			probes = append(probes, probe{tool, Options{Conn: "RC", Size: 8}}, probe{tool, Options{Conn: "RC", Size: 16}})
		} else {
			probes = append(probes, probe{tool, Options{Conn: "RC", AtomicOp: AtomicOps[1]}})
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	refused := 0
	for _, p := range probes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			why := Refusal(p.tool, p.o)
			args := append(perftestArgs(p.o), "-d", "taproce-nodev")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, p.tool.Name(), args...)
			cmd.Env = env
			b, err := cmd.CombinedOutput()
			out, line := string(b), p.tool.Name()+" "+strings.Join(args, " ")
			mu.Lock()
			defer mu.Unlock()
			if len(why) == 0 {
				if !lookedForDevice(out) {
					t.Errorf("%s: perftest refuses what Refusal accepts: %v\n%s", line, err, out)
				}
				return
			}
			refused++
			said := false
			for _, w := range why {
				said = said || strings.Contains(out, w)
			}
			if ee, _ := err.(*exec.ExitError); ee == nil || ee.ExitCode() != 1 || !said || lookedForDevice(out) {
				t.Errorf("%s: %v, want exit status 1 saying one of %q:\n%s", line, err, why, out)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d option sets, %d refused by perftest as Refusal says", len(probes), refused)
}

// lookedForDevice reports whether perftest got as far as looking for its
// device: ctx_find_dev's messages when there are none (here, without
// kernel RDMA) or none of the name.
func lookedForDevice(out string) bool {
	return strings.Contains(out, "Did not detect devices") || strings.Contains(out, "IB device taproce-nodev not found")
}

// TestPerftestMatrix: every perftest tool runs, with every mode and
// connection type perftest allows it; nothing Refusal refuses is in the
// matrix.
func TestPerftestMatrix(t *testing.T) {
	p := Port{GIDs: []int{0, 1}, IPv4GID: 1, ActiveMTU: 1024}
	runs := Perftest(p)
	seen := map[string]bool{}
	for _, r := range runs {
		seen[r.Tool] = true
		if !strings.HasPrefix(r.Name(), r.Tool+" -x 1 -F") || !r.Pair || r.check == nil {
			t.Errorf("%s: %+v", r.Name(), r)
		}
	}
	for _, tool := range Tools {
		if !seen[tool.Name()] {
			t.Errorf("%s never runs", tool.Name())
		}
	}
	want := map[string]int{ // runs per tool: connections × operations × modes, less refusals
		"ib_write_bw": 2 * 5, "ib_read_bw": 5, "ib_send_bw": 3 * 5, "ib_atomic_bw": 2 * 4,
		"ib_write_lat": 2 * 3, "ib_read_lat": 3, "ib_send_lat": 3 * 3, "ib_atomic_lat": 2 * 2,
	}
	count := map[string]int{}
	for _, r := range runs {
		count[r.Tool]++
	}
	for tool, n := range want {
		if count[tool] != n {
			t.Errorf("%s: %d runs, want %d", tool, count[tool], n)
		}
	}
	for _, r := range runs {
		t.Log(r.Name())
	}
}

// TestPingpongMatrix: each pingpong tool at every GID and size, and with
// each of its flags; UD's largest message the active MTU.
func TestPingpongMatrix(t *testing.T) {
	p := Port{GIDs: []int{0, 1, 2}, IPv4GID: 1, ActiveMTU: 1024}
	runs := Pingpong(p)
	count := map[string]int{}
	for _, r := range runs {
		count[r.Tool]++
		if r.Tool == "ibv_ud_pingpong" && strings.Contains(r.Name(), "-s 4096") {
			t.Errorf("%s: larger than the MTU", r.Name())
		}
		if !strings.Contains(r.Name(), " -c") {
			t.Errorf("%s: does not check what it receives", r.Name())
		}
	}
	if want := map[string]int{"ibv_rc_pingpong": 9 + 2, "ibv_uc_pingpong": 9 + 1, "ibv_ud_pingpong": 6 + 1, "ibv_srq_pingpong": 9 + 1}; fmt.Sprint(count) != fmt.Sprint(want) {
		t.Errorf("runs per tool %v, want %v", count, want)
	}
}
