package interop

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/internal/perf"
	"github.com/taproce/taproce/verbs/abi"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest"
)

// This file runs Debian's own perftest programs and ibv_rc_pingpong on
// taproce's libibverbs.so.1 (verbs/libibverbs) against the same programs
// on rxe in the VM, both ways: the unmodified binaries a user has, with
// nothing of taproce's Go between them and the appliance. The rig and the
// checks are TestPerftest's and TestPerftestLoss's (a perfRig with lib
// set); the sizes are fewer, since TestPerftest covers the wire at every
// size already.

// libSizes are the sizes of the perftest runs on the library.
var libSizes = []int{2, 65536}

// libDevice and libGIDIndex name the rig's port to perftest: the
// appliance's first device, and its IPv4-mapped GID.
const (
	libDevice   = "taproce0"
	libGIDIndex = 1
)

// libArgs are perftest's options for the library's side of a run.
func (c perfCase) libArgs(mtu, size int) []string {
	a := append([]string{"-d", libDevice, "-x", strconv.Itoa(libGIDIndex), "-F", "-m", strconv.Itoa(mtu), "-n", strconv.Itoa(c.iters(size))}, c.depthArgs()...)
	if c.atomic != "" {
		return append(a, "-A", c.atomic)
	}
	return append(a, "-s", strconv.Itoa(size))
}

// parseLib reads perftest's output as taproce perf's results: none from
// a read or atomic latency server, which prints none, else its one line.
func parseLib(c perfCase, size int, out string) ([]perf.Result, error) {
	l, err := parsePerftest(out)
	if err != nil {
		return nil, err
	}
	if len(l.fields) == 0 {
		return nil, nil
	}
	r := perf.Result{Test: c.tool, Size: l.size, Iters: uint64(l.iters), MTU: l.mtu}
	switch {
	case c.test().Kind == perf.Lat && len(l.fields) >= 3:
		r.Lat = &perf.LatResult{Min: l.fields[0], Max: l.fields[1], Typical: l.fields[2]}
		if l.untimed {
			r.Lat.Typical = 1 // checked by the counters only, as perftest's own figure
		}
	case len(l.fields) >= 2:
		r.BW = &perf.BWResult{Unit: "MB/sec", Peak: l.fields[0], Avg: l.fields[1]}
		if r.BW.Avg == 0 && len(l.fields) >= 3 {
			// Two bytes a message print as 0.00 MB/sec: the message
			// rate (Mpps) has the figure.
			r.BW.MsgRate = l.fields[2]
			r.BW.Avg = l.fields[2] * 1e6 * float64(l.size) / (1 << 20)
		}
		if l.untimed {
			r.BW.Avg = 1
		}
	default:
		return nil, fmt.Errorf("interop: perftest's result line has %d numbers", len(l.fields))
	}
	return []perf.Result{r}, nil
}

// libPerfCases are perfCases at libSizes.
func libPerfCases(loss float64) []perfCase {
	cs := perfCases()
	for i := range cs {
		if cs[i].atomic == "" {
			cs[i].sizes = libSizes
		}
		cs[i].loss = loss
	}
	return cs
}

// newLibRig is a perfRig on the library, built for the test.
func newLibRig(t *testing.T, cfg rigConfig) *perfRig {
	t.Helper()
	lib, err := ibvtest.Build(false)
	if err != nil {
		t.Skipf("taproce's libibverbs cannot be built here: %v", err)
	}
	r := newPerfRig(t, cfg)
	r.lib = lib.Dir
	return r
}

// TestLibPerftest: every perftest program on taproce's libibverbs against
// the same program on rxe in the VM, both ways, at path MTU 1024 and
// 4096, with TestPerftest's checks of both outputs and of the counters.
func TestLibPerftest(t *testing.T) {
	p, _ := needPeer(t)
	r := newLibRig(t, rigConfig{})
	r.reach(t, p)
	rec := &perfRecorder{}
	for _, mtu := range []int{1024, 4096} {
		t.Run(fmt.Sprintf("m%d", mtu), func(t *testing.T) {
			if mtu == 4096 {
				withPeerMTU(t, p, jumboMTU)
			}
			for _, c := range libPerfCases(0) {
				t.Run(c.name()+"/vm-server", func(t *testing.T) { perfVMServer(t, p, r, c, mtu, rec) })
				t.Run(c.name()+"/vm-client", func(t *testing.T) { perfVMClient(t, p, r, c, mtu, rec) })
			}
		})
	}
}

// TestLibPingpong: Debian's ibv_rc_pingpong on taproce's libibverbs
// against ibv_rc_pingpong on rxe in the VM, both ways, at path MTU 1024
// and 4096, both sides checking every byte (-c), with TestToolPingpong's
// checks of the output and the counters.
func TestLibPingpong(t *testing.T) {
	p, _ := needPeer(t)
	r := newLibRig(t, rigConfig{})
	r.reach(t, p)
	side := toolSide{sock: r.sock, lib: r.lib, local: perfAddr.Addr(),
		check: func(iters int) counterCheck { return &libCheck{r: r, s0: r.snap(), iters: iters} }}
	for _, c := range []ppCase{
		{typ: abi.RC, mtu: 1024, size: 4096, iters: 20},
		{typ: abi.RC, mtu: 1024, size: 65536, iters: 5},
		{typ: abi.RC, mtu: 4096, size: 65536, iters: 5},
	} {
		t.Run(fmt.Sprintf("m%d/%s", c.mtu, c.name()), func(t *testing.T) {
			if c.mtu == 4096 {
				withPeerMTU(t, p, jumboMTU)
			}
			t.Run("vm-server", func(t *testing.T) { toolVMServer(t, p, side, c) })
			t.Run("vm-client", func(t *testing.T) { toolVMClient(t, p, side, c) })
		})
	}
}

// libCheck checks a pingpong run on the library as checkCounters checks
// a perftest run.
type libCheck struct {
	r     *perfRig
	s0    rigSnap
	iters int
}

func (c *libCheck) finish(t *testing.T, before, after Counters) {
	t.Helper()
	checkCounters(t, c.iters, c.s0, c.r.settled(), before, after)
}

// TestLibPerftestLoss: the same at path MTU 1024 while each side loses
// 1 % of the frames it sends, with TestPerftestLoss's checks of the
// recovery.
func TestLibPerftestLoss(t *testing.T) {
	p, _ := needPeer(t)
	r := newLibRig(t, rigConfig{egress: impair.Spec{Loss: lossRate, Seed: lossSeed}})
	r.reach(t, p)
	loss := withPeerLoss(t, p)
	rec := &perfRecorder{}
	for _, c := range libPerfCases(lossRate) {
		pp := c.test().Kind == perf.Lat && (c.test().Verb == perf.Write || c.test().Verb == perf.Send)
		loss.use(pp)
		t.Run(c.name()+"/vm-server", func(t *testing.T) { perfVMServer(t, p, r, c, 1024, rec) })
		t.Run(c.name()+"/vm-client", func(t *testing.T) { perfVMClient(t, p, r, c, 1024, rec) })
	}
	loss.use(true) // ibv_rc_pingpong
	side := toolSide{sock: r.sock, lib: r.lib, local: perfAddr.Addr(), check: func(int) counterCheck {
		return &lossCheck{r: r, s0: r.snap()}
	}}
	for _, c := range lossPingpongs {
		t.Run(c.tool()+"/"+c.name()+"/vm-server", func(t *testing.T) { toolVMServer(t, p, side, c) })
		t.Run(c.tool()+"/"+c.name()+"/vm-client", func(t *testing.T) { toolVMClient(t, p, side, c) })
	}
	if n := r.nic.Port().Stats().Egress.Dropped; n == 0 {
		t.Error("the port's impairment dropped no frame")
	}
}
