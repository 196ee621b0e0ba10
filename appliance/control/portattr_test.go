package control_test

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/taproce/taproce/verbs"
)

// TestPortMTU: a port reports the device's largest path MTU, 4096, as
// max_mtu on any link and the link's as active_mtu, as rxe does
// (ibv_devinfo on rxe over a 1500-byte eth0: max_mtu 4096 (5), active_mtu
// 1024 (3)); a QP still takes no path MTU above the active one, and any
// up to it.
func TestPortMTU(t *testing.T) {
	for _, c := range []struct {
		netdev int
		active verbs.MTU
	}{
		{1500, verbs.MTU1024},
		{1200, verbs.MTU1024},
		{1000, verbs.MTU512},
		{4176, verbs.MTU4096},
		{9000, verbs.MTU4096},
	} {
		t.Run(fmt.Sprint(c.netdev), func(t *testing.T) {
			r := newRigMTU(t, true, c.netdev)
			ctx := testCtx(t)
			pa, err := r.ca.QueryPort(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if verbs.MTU(pa.MaxMTU) != verbs.MTU4096 || verbs.MTU(pa.ActiveMTU) != c.active {
				t.Fatalf("max_mtu %d, active_mtu %d; want %d and %d", pa.MaxMTU, pa.ActiveMTU, verbs.MTU4096, c.active)
			}
			for m := verbs.MTU256; m <= verbs.MTU4096; m++ {
				a := newEnd(t, r.ca, verbs.RC, 64)
				must(t, a.qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSInit, Port: 1},
					verbs.QPStateMask|verbs.QPPKeyIndex|verbs.QPPort|verbs.QPAccessFlags))
				err := a.qp.Modify(ctx, &verbs.QPAttr{State: verbs.QPSRTR, PathMTU: m, DestQPN: 1, MaxDestRdAtomic: 1, MinRNRTimer: 12,
					AH: verbs.AHAttr{DGID: r.gb, SGIDIndex: 1, HopLimit: 1, Port: 1}},
					verbs.QPStateMask|verbs.QPAV|verbs.QPPathMTU|verbs.QPDestQPN|verbs.QPRQPSN|verbs.QPMaxDestRdAtomic|verbs.QPMinRNRTimer)
				switch {
				case m <= c.active && err != nil:
					t.Errorf("path MTU %d on a port of active MTU %d: %v", m.Bytes(), c.active.Bytes(), err)
				case m > c.active && !errors.Is(err, syscall.EINVAL):
					t.Errorf("path MTU %d on a port of active MTU %d: %v, want EINVAL", m.Bytes(), c.active.Bytes(), err)
				}
			}
		})
	}
}
