package interop

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// This file runs perftest's latency programs for a duration (-D) between
// Debian's binaries on taproce's libibverbs and rxe in the VM. In duration
// mode each side stops on its own timer and destroys its QP with no
// handshake at the end, so the last message of one side can reach the
// other after its QP is gone: the end-of-run race. Each run must end, and
// both sides exit 0.

// endRuns is how many runs of each program each way TestLibEndOfRun
// makes: TAPROCE_INTEROP_END_RUNS, default 2.
func endRuns(t *testing.T) int {
	s := os.Getenv("TAPROCE_INTEROP_END_RUNS")
	if s == "" {
		return 2
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("TAPROCE_INTEROP_END_RUNS=%q: want a positive count", s)
	}
	return n
}

// endTimeout bounds one side of a run of endDuration seconds: perftest's
// warm-up margin (2 s), the duration, the connection, and room for a slow
// VM; a side still running then hangs.
const (
	endDuration = 2
	endTimeout  = 40 * time.Second
)

// TestLibEndOfRun: ib_write_lat and ib_send_lat -D 2 (2 bytes, path MTU
// 1024) on taproce's libibverbs against the same program on rxe, each role
// each way, endRuns times: every run ends and both sides exit 0. rxe's
// completer_retry_err over each run is logged: a request it sent again
// to a QP that was gone.
func TestLibEndOfRun(t *testing.T) {
	p, _ := needPeer(t)
	r := newLibRig(t, rigConfig{})
	r.reach(t, p)
	endOfRun(t, p, r)
}

// TestPerfEndOfRun is TestLibEndOfRun with `taproce perf` on our side.
func TestPerfEndOfRun(t *testing.T) {
	p, _ := needPeer(t)
	r := newPerfRig(t, rigConfig{})
	r.reach(t, p)
	endOfRun(t, p, r)
}

// endOfRun runs ib_write_lat and ib_send_lat -D each role each way.
func endOfRun(t *testing.T, p *Peer, r *perfRig) {
	n := endRuns(t)
	for _, tool := range []string{"ib_write_lat", "ib_send_lat"} {
		args := fmt.Sprintf("-m 1024 -D %d -s 2", endDuration)
		vm := fmt.Sprintf("timeout %d %s -d rxe0 -x 1 -F %s", int(endTimeout/time.Second), tool, args)
		ours := append([]string{tool, "-d", libDevice, "-x", strconv.Itoa(libGIDIndex), "-F"}, strings.Fields(args)...)
		if r.lib == "" {
			ours = append([]string{strings.TrimPrefix(tool, "ib_")}, strings.Fields(args)...)
		}
		t.Run(tool+"/vm-server", func(t *testing.T) {
			for i := range n {
				endVMServer(t, p, r, i, vm, ours)
			}
		})
		t.Run(tool+"/vm-client", func(t *testing.T) {
			for i := range n {
				endVMClient(t, p, r, i, vm, ours)
			}
		})
	}
}

// endMark separates a VM script's counters from its program's output.
const endMark = "@@@end-of-run@@@"

// endVMServer runs the program as server in the VM and ours as its client.
func endVMServer(t *testing.T, p *Peer, r *perfRig, run int, vm string, ours []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*endTimeout)
	defer cancel()
	job := p.Spawn(ctx, "end-server", fmt.Sprintf("%s; echo %s; %s 2>&1; echo rc=$?; sleep 0.2; echo %s; %s",
		CountersCommand, endMark, vm, endMark, CountersCommand))
	rctx, rcancel := context.WithTimeout(ctx, endTimeout)
	start := time.Now()
	out, err := r.clientOutput(rctx, append(ours, p.IP.String())...)
	took := time.Since(start)
	rcancel()
	code, vmOut, werr := job.Wait(ctx, endTimeout)
	judgeEnd(t, run, "client", out, err, took, code, vmOut, werr)
}

// endVMClient runs ours as server and the program as its client in the VM.
func endVMClient(t *testing.T, p *Peer, r *perfRig, run int, vm string, ours []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*endTimeout)
	defer cancel()
	sctx, scancel := context.WithTimeout(ctx, endTimeout)
	defer scancel()
	type result struct {
		out  []byte
		err  error
		took time.Duration
	}
	served := make(chan result, 1)
	go func() {
		start := time.Now()
		out, err := r.command(sctx, ours...).CombinedOutput()
		served <- result{out, err, time.Since(start)}
	}()
	vmOut, stderr, err := p.Exec(ctx, fmt.Sprintf("%s; echo %s; %s; sleep 0.2; echo %s; %s",
		CountersCommand, endMark, vmConnectRetry(vm+" "+HostIP), endMark, CountersCommand))
	code := 0
	if err != nil {
		code = ExitCode(err)
		err = fmt.Errorf("%w: %s", err, stderr)
	}
	res := <-served
	judgeEnd(t, run, "server", res.out, res.err, res.took, code, vmOut, err)
}

// judgeEnd fails the test unless both sides of a run exited 0, and logs
// rxe's retries over the run.
func judgeEnd(t *testing.T, run int, role string, out []byte, err error, took time.Duration, code int, vmOut string, vmErr error) {
	t.Helper()
	parts := strings.Split(vmOut, endMark+"\n")
	var program string
	retries := "?"
	if len(parts) == 3 {
		program = parts[1]
		d := ParseCounters(parts[2]).Sub(ParseCounters(parts[0]))
		retries = fmt.Sprint(d["completer_retry_err"])
	}
	vmOK := vmErr == nil && code == 0 && strings.Contains(program, "rc=0\n")
	t.Logf("run %d: taproce %s %v in %v; VM rc ok %v; rxe completer_retry_err +%s", run, role, err, took.Round(time.Millisecond), vmOK, retries)
	if err != nil || !vmOK {
		t.Errorf("run %d: taproce's %s: %v\n%s\nVM (exit %d, %v):\n%s", run, role, err, out, code, vmErr, vmOut)
	}
}
