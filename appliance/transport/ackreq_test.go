package transport

import (
	"slices"
	"testing"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// TestAckReqStream: a message asks for an acknowledgement (BTH AckReq) at
// its last packet only when no other SEND or WRITE is posted behind it,
// and any packet does after ackEvery packets without one (ackBytes of
// the path MTU's 1024-byte packets); the responder then acknowledges a
// stream once per ackEvery packets and
// at its end, and every message still completes, in order. A READ or an
// atomic behind a message makes it ask, as does the last message of each
// post.
func TestAckReqStream(t *testing.T) {
	write := func(id uint64) SendWR {
		return SendWR{ID: id, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: []SGE{{Addr: 0x10000, Length: 64}},
			RemoteAddr: 0x10000 + 0x80000}
	}
	read := func(id uint64) SendWR {
		return SendWR{ID: id, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, SGL: []SGE{{Addr: 0x10000 + 0x1000, Length: 64}},
			RemoteAddr: 0x10000 + 0x90000}
	}
	fadd := func(id uint64) SendWR {
		return SendWR{ID: id, Opcode: abi.WRAtomicFetchAdd, Flags: abi.SendSignaled, SGL: []SGE{{Addr: 0x10000 + 0x2000, Length: 8}},
			RemoteAddr: 0x10000 + 0xa0000, CompareAdd: 1}
	}
	writes := func(first uint64, n int) []SendWR {
		var wrs []SendWR
		for i := range n {
			wrs = append(wrs, write(first+uint64(i)))
		}
		return wrs
	}
	const every = ackBytes / 1024 // ackEvery at connOpts' path MTU
	for _, c := range []struct {
		name string
		// posts are posted one after the other, each as one PostSend.
		posts [][]SendWR
		// asks lists, for each request packet A sends in order, whether
		// it carries AckReq.
		asks []bool
		acks int // plain ACKs B sends
	}{
		{"one write", [][]SendWR{{write(1)}}, []bool{true}, 1},
		{"eight writes in one post", [][]SendWR{writes(1, 8)}, []bool{false, false, false, false, false, false, false, true}, 1},
		{"two posts of two", [][]SendWR{writes(1, 2), writes(3, 2)}, []bool{false, true, false, true}, 2},
		{"a stream longer than ackEvery", [][]SendWR{writes(1, every+3)},
			append(append(make([]bool, every-1), true), false, false, true), 2},
		{"a write before a read", [][]SendWR{{write(1), read(2)}}, []bool{true, true}, 1},
		{"a write before an atomic", [][]SendWR{{write(1), fadd(2)}}, []bool{true, true}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSim(t, impair.Spec{}, 1500)
			cn := s.connect(connOpts{open: true})
			var fromA, fromB []sentFrame
			record(t, s.a, &fromA)
			record(t, s.b, &fromB)
			total := 0
			for _, wrs := range c.posts {
				for i := range wrs {
					wrs[i].SGL[0].LKey = cn.mra.LKey
					wrs[i].RKey = cn.mrb.RKey
				}
				_, err := cn.qa.PostSend(wrs)
				must(t, err)
				total += len(wrs)
			}
			var got []WC
			s.run(100000, func() bool { got = append(got, poll(cn.cqa)...); return len(got) == total })
			for i, wc := range got {
				if wc.Status != abi.WCSuccess || wc.ID != uint64(i+1) {
					t.Fatalf("completion %d: %+v", i, wc)
				}
			}
			var asks []bool
			for _, f := range fromA {
				asks = append(asks, f.ackReq)
			}
			if !slices.Equal(asks, c.asks) {
				t.Fatalf("AckReq of A's request packets %v, want %v", asks, c.asks)
			}
			acks := 0
			for _, f := range fromB {
				if f.op == roce.RCAcknowledge {
					acks++
				}
			}
			if acks != c.acks {
				t.Errorf("B sent %d ACKs, want %d", acks, c.acks)
			}
			if st := s.a.eng.Stats(); st.Timeouts != 0 || st.Retransmits != 0 {
				t.Errorf("A's stats %+v: a message waited for the retry timer", st)
			}
		})
	}
}
