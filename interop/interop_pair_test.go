package interop

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/internal/perf"
)

// pairTestName is the test that needs the second VM.
const pairTestName = "TestRxePair"

// pairCases are the runs between the two VMs: each is also a run of
// TestPerftest's matrix at path MTU 1024, with the same size and
// iterations, so that PairTable sets them side by side.
var pairCases = []perfCase{
	{tool: "ib_write_bw", sizes: []int{65536}},
	{tool: "ib_read_bw", sizes: []int{65536}},
	{tool: "ib_send_bw", sizes: []int{65536}},
	{tool: "ib_send_lat", sizes: []int{2}},
	{tool: "ib_write_lat", sizes: []int{2}},
}

// pairMTU is the path MTU of the runs between the VMs.
const pairMTU = 1024

// pairBegin separates the runs in the VMs' output.
const pairBegin = "@@@pair-begin@@@"

// TestRxePair: the reference figures of this machine. perftest runs
// between the two rxe VMs (client in the first, server in the second) at
// path MTU 1024: ib_write_bw, ib_read_bw and ib_send_bw at 64 KiB,
// ib_send_lat and ib_write_lat at 2 B, with TestPerftest's iterations. Both
// sides must exit with 0, the client's result line must show the size,
// iterations and MTU. The second VM is stopped after the test. Recorded
// with Between "rxe-rxe"; PairTable shows them next to the same runs of
// taproce against rxe.
func TestRxePair(t *testing.T) {
	client, _ := needPeer(t)
	server := needPeer2(t)
	t.Cleanup(func() {
		// Nothing else needs it: its CPU is the other tests'.
		if err := server.Stop(); err != nil {
			t.Error(err)
		}
	})
	recordPerf(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var serverScript, clientScript []string
	for _, c := range pairCases {
		args := c.vmArgs(pairMTU, c.sizes[0])
		serverScript = append(serverScript, fmt.Sprintf("echo %s; timeout 120 %s %s 2>&1; echo rc=$?", pairBegin, c.tool, args))
		clientScript = append(clientScript, "echo "+pairBegin+"; "+
			vmConnectRetry(fmt.Sprintf("timeout 120 %s %s %s", c.tool, args, server.IP)))
	}
	job := server.Spawn(ctx, "pair-server", strings.Join(serverScript, "; "))
	clientOut, stderr, cerr := client.Exec(ctx, strings.Join(clientScript, "; "))
	if cerr != nil {
		t.Errorf("client VM: %v: %s", cerr, stderr)
	}
	code, serverOut, werr := job.Wait(ctx, time.Minute)
	if werr != nil || code != 0 {
		t.Errorf("server VM job: exit %d, %v", code, werr)
	}
	clients := strings.Split(clientOut, pairBegin+"\n")[1:]
	servers := strings.Split(serverOut, pairBegin+"\n")[1:]
	for i, c := range pairCases {
		size := c.sizes[0]
		t.Run(fmt.Sprintf("%s/%d", c.tool, size), func(t *testing.T) {
			rec := PerfResult{Tool: c.tool, Between: BetweenRxe, MTU: pairMTU, Size: size, Iters: c.iters(size)}
			defer func() {
				rec.Pass = !t.Failed()
				perfRec.add(rec)
			}()
			if i >= len(clients) || i >= len(servers) {
				t.Fatalf("no output of run %d: %d client and %d server runs", i, len(clients), len(servers))
			}
			cl, sv := clients[i], servers[i]
			t.Logf("client %s %s:\n%s", client.Name, c.vmArgs(pairMTU, size), strings.TrimSpace(cl))
			t.Logf("server %s:\n%s", server.Name, strings.TrimSpace(sv))
			if !strings.Contains(cl, "rc=0\n") || !strings.Contains(sv, "rc=0\n") {
				t.Fatalf("%s failed", c.tool)
			}
			theirs, err := parsePerftest(cl)
			if err != nil {
				t.Fatalf("client output: %v", err)
			}
			if theirs.size != size || theirs.iters != c.iters(size) || theirs.mtu != pairMTU {
				t.Errorf("client reports %d bytes, %d iterations at MTU %d; want %d, %d at %d",
					theirs.size, theirs.iters, theirs.mtu, size, c.iters(size), pairMTU)
			}
			if c.test().Kind == perf.BW {
				rec.Unit = "MB/sec"
				if len(theirs.fields) > 1 {
					rec.Theirs = theirs.fields[1]
				}
			} else {
				rec.Unit = "usec"
				if len(theirs.fields) > 2 {
					rec.Theirs = theirs.fields[2]
				}
			}
			switch {
			case theirs.untimed:
				// perftest's clock measurement failed under emulation: its
				// figure means nothing, as in TestPerftest; the run's exit
				// status and result line are checked all the same.
				rec.Theirs, rec.Untimed = 0, true
				t.Logf("perftest could not time the run (%s), so its figure is not recorded", untimedMark)
			case !(rec.Theirs > 0):
				t.Errorf("client result line %v: no figure", theirs.fields)
			}
			// The server's figure, where it prints one.
			if s, err := parsePerftest(sv); err == nil {
				switch {
				case rec.Unit == "MB/sec" && len(s.fields) > 1:
					rec.Ours = s.fields[1]
				case rec.Unit == "usec" && len(s.fields) > 2:
					rec.Ours = s.fields[2]
				}
			}
		})
	}
	// cmtime's 100 connections between the two kernels' CMs, the figures
	// TestLibRDMACM logs beside taproce's.
	t.Run("cmtime", func(t *testing.T) {
		job := server.Spawn(ctx, "pair-cmtime", fmt.Sprintf("timeout 120 cmtime -b %s -p 7399", server.IP))
		// The server listens while the client sleeps; it serves until
		// killed.
		out, stderr, err := client.Exec(ctx, fmt.Sprintf("sleep 1; timeout 120 cmtime -s %s -p 7399 -c 100 2>&1", server.IP))
		_, _, _ = job.Wait(ctx, time.Second)
		if err != nil || !strings.Contains(out, "connect      :") {
			t.Fatalf("cmtime between the VMs: %v %s\n%s", err, stderr, out)
		}
		rxeCMTime = cmtimeLines(out)
		t.Logf("cmtime -c 100 between the two rxe VMs:\n%s", rxeCMTime)
	})
}
