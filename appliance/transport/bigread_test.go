package transport

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// TestLossyLongReads: READs of many pieces (1 MiB at a path MTU of 1024,
// sixteen requests each) and long WRITEs over an impaired link, as the
// lab's RDMA step has them, all complete with the data intact.
func TestLossyLongReads(t *testing.T) {
	for _, text := range []string{"loss=1%,reorder=5%,duplicate=1%,corrupt=0.1%", "loss=3%", "reorder=20%"} {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", text, seed), func(t *testing.T) {
				spec, err := impair.ParseSpec(text)
				must(t, err)
				spec.Seed = seed
				s := newSim(t, spec, 1500)
				const msg, n = 1 << 20, 4
				c := s.connect(connOpts{size: 2 * n * msg, retry: 7, rnr: 7})
				for i := range c.bufa[:n*msg] {
					c.bufa[i] = byte(i*31 + i>>10)
				}
				var wrs []SendWR
				for i := range n {
					wrs = append(wrs, SendWR{ID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
						SGL: sge(c.mra, i*msg, msg), RemoteAddr: base + uint64(i*msg), RKey: c.mrb.RKey})
				}
				for i := range n {
					wrs = append(wrs, SendWR{ID: uint64(n + i), Opcode: abi.WRRDMARead, Flags: abi.SendSignaled,
						SGL: sge(c.mra, (n+i)*msg, msg), RemoteAddr: base + uint64(i*msg), RKey: c.mrb.RKey})
				}
				_, err = c.qa.PostSend(wrs)
				must(t, err)
				var wcs []WC
				s.run(2000000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == len(wrs) })
				for i, wc := range wcs {
					if wc.Status != abi.WCSuccess || wc.ID != uint64(i) {
						t.Fatalf("completion %d: %+v", i, wc)
					}
				}
				if !bytes.Equal(c.bufb[:n*msg], c.bufa[:n*msg]) || !bytes.Equal(c.bufa[n*msg:2*n*msg], c.bufa[:n*msg]) {
					t.Fatal("data differs")
				}
			})
		}
	}
}
