package transport

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// TestKill: B's QP is killed (its owner died) while A, with retry_cnt 7,
// which never runs out, streams RDMA WRITEs or READs to it, or before A
// posts anything. B's work is flushed at once; after the quiet spell, for
// the rest of the linger, every request A sends is NAKed with remote
// operational error, so A completes
// what B executed before the kill successfully, the next WQE with
// REM_OP_ERR and the rest flushed, and ends in the error state instead of
// retrying forever. Once the linger is over by the engine's clock, B's QP
// is gone as after DestroyQP and its QPN is free.
func TestKill(t *testing.T) {
	const linger = time.Second
	for _, tc := range []struct {
		name  string
		spec  string
		op    abi.WROpcode
		after int // A's completions before the kill; -1: kill before posting
	}{
		{"WRITEs", "", abi.WRRDMAWrite, 8},
		{"READs", "", abi.WRRDMARead, 8},
		{"idle", "", abi.WRRDMAWrite, -1},
		{"WRITEs over a lossy link", "loss=5%,reorder=5%,seed=3", abi.WRRDMAWrite, 8},
		{"READs over a lossy link", "loss=5%,duplicate=2%,seed=4", abi.WRRDMARead, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := impair.ParseSpec(tc.spec)
			must(t, err)
			s := newSim(t, spec, 1500)
			c := s.connect(connOpts{retry: 7, rnr: 7})
			_, err = c.qb.PostRecv([]RecvWR{{ID: 1, SGL: sge(c.mrb, 0, 64)}, {ID: 2, SGL: sge(c.mrb, 64, 64)}})
			must(t, err)
			_, err = c.qb.PostSend([]SendWR{{ID: 9, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: sge(c.mrb, 0, 64)}})
			must(t, err) // B's SEND waits for a receive A never posts (RNR)
			qpn := c.qb.Num()
			var killAt, quietTo time.Time
			kill := func() {
				must(t, s.b.eng.Kill(c.qb, linger))
				killAt, quietTo = s.clock.now.Add(linger), s.clock.now.Add(min(DefaultLingerQuiet, linger/2))
				if st := c.qb.State(); st != abi.QPSErr {
					t.Fatalf("killed QP in %v, want ERR", st)
				}
				got := append(poll(c.cqb), poll(c.rcqb)...)
				if len(got) != 3 {
					t.Fatalf("B's completions at the kill: %+v", got)
				}
				for _, wc := range got {
					if wc.Status != abi.WCWRFlushErr {
						t.Fatalf("B's work completed with %v, want flushed", wc.Status)
					}
				}
				if err := c.qb.Modify(&QPAttr{State: abi.QPSReset}, abi.QPStateMask); !errors.Is(err, ErrInvalid) {
					t.Fatalf("Modify of a killed QP: %v", err)
				}
			}
			if tc.after < 0 {
				kill()
			}
			const n = 64
			var wrs []SendWR
			for i := range n {
				wrs = append(wrs, SendWR{ID: uint64(i), Opcode: tc.op, Flags: abi.SendSignaled,
					SGL: sge(c.mra, i*16384, 16384), RemoteAddr: base + uint64(i*16384), RKey: c.mrb.RKey})
			}
			_, err = c.qa.PostSend(wrs)
			must(t, err)
			var wcs []WC
			if tc.after >= 0 {
				s.run(1_000_000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) >= tc.after })
				kill()
			}
			s.run(1_000_000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == n })
			k := 0
			for k < n && wcs[k].Status == abi.WCSuccess {
				k++
			}
			if k == n || wcs[k].Status != abi.WCRemOpErr {
				t.Fatalf("A's completions: %d successful, then %+v; want REM_OP_ERR", k, wcs[min(k, n-1)])
			}
			for i, wc := range wcs {
				if wc.ID != uint64(i) || i > k && wc.Status != abi.WCWRFlushErr {
					t.Fatalf("A's completion %d: %+v (%v)", i, wc, wc.Status)
				}
			}
			if tc.after < 0 && k != 0 || tc.after >= 0 && k < tc.after {
				t.Fatalf("%d successful before REM_OP_ERR (killed after %d)", k, tc.after)
			}
			if st := c.qa.State(); st != abi.QPSErr {
				t.Fatalf("A's QP in %v, want ERR", st)
			}
			if s.b.eng.Stats().NAKsSent == 0 {
				t.Fatal("B sent no NAK")
			}
			// A failed within the linger, answered by a QP still there,
			// and not before the quiet spell's end.
			if !s.clock.now.Before(killAt) || s.clock.now.Before(quietTo) || s.b.eng.qps[qpn] != c.qb {
				t.Fatalf("A failed at %v, the quiet spell ended at %v, the linger at %v", s.clock.now, quietTo, killAt)
			}
			s.run(1_000_000, func() bool { return s.b.eng.qps[qpn] == nil })
			if s.clock.now.Before(killAt) {
				t.Fatalf("QP removed at %v, before the linger ended at %v", s.clock.now, killAt)
			}
			if _, ok := s.b.eng.NextDeadline(); ok {
				t.Error("a timer is left after the removal")
			}
			if err := s.b.eng.DestroyQP(c.qb); !errors.Is(err, ErrInvalid) {
				t.Errorf("DestroyQP after the linger: %v", err)
			}
		})
	}
}

// TestKillNAK: what a killed QP answers, request by request: a duplicate
// of a request it executed is acknowledged again as the live QP would
// (with the last PSN it executed); anything else gets a NAK of the remote
// operational error code with the request's PSN, or the expected PSN for
// a request beyond it (a NAK acknowledges every PSN before its own): a
// new request, a duplicate READ it never executed. Both carry the MSN as
// it stands. Acknowledgements and responses are dropped. Each request is
// an episode of its own here (one NAK each; TestKillNAKOnce has the
// requests of one episode).
func TestKillNAK(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	c := s.connect(connOpts{retry: 7, rnr: 7, psnA: 1000})
	for i := range c.bufa[:3000] {
		c.bufa[i] = byte(i*7 + 1)
	}
	_, err := c.qa.PostSend([]SendWR{{ID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 3000), RemoteAddr: base, RKey: c.mrb.RKey}})
	must(t, err)
	s.run(10000, func() bool { return len(poll(c.cqa)) == 1 })
	// B executed PSNs 1000…1002, one message: it expects 1003, MSN 1.
	must(t, s.b.eng.Kill(c.qb, time.Minute))
	s.clock.now = s.clock.now.Add(DefaultLingerQuiet) // past the quiet spell
	var sent []roce.Packet
	s.b.watch = func(f []byte) { sent = append(sent, parsed(t, f)) }
	for _, tc := range []struct {
		name    string
		op      roce.Opcode
		psn     roce.PSN
		nakPSN  roce.PSN
		answers bool
		ack     bool // an ACK, not a NAK
	}{
		{"expected WRITE", roce.RCRDMAWriteOnly, 1003, 1003, true, false},
		{"duplicate WRITE", roce.RCRDMAWriteFirst, 1000, 1002, true, true},
		{"duplicate READ never executed", roce.RCRDMAReadRequest, 1001, 1001, true, false},
		{"READ beyond a gap", roce.RCRDMAReadRequest, 1010, 1003, true, false},
		{"SEND beyond a gap", roce.RCSendMiddle, 1004, 1003, true, false},
		{"atomic", roce.RCFetchAdd, 1003, 1003, true, false},
		{"ACK", roce.RCAcknowledge, 1003, 0, false, false},
		{"READ response", roce.RCRDMAReadResponseOnly, 1003, 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent = sent[:0]
			c.qb.nakSent = false // a new episode
			p := c.qa.template(s.b.ip, s.b.mac, c.qb.Num(), 0, 0)
			p.BTH.Opcode, p.BTH.PSN = tc.op, tc.psn
			info := tc.op.Info()
			n := 0
			if info.Has(roce.HasPayload) {
				n = 256
			}
			if info.Has(roce.HasRETH) {
				p.RETH = roce.RETHFields{VA: base, RKey: c.mrb.RKey, DMALen: uint32(n)}
			}
			if info.Has(roce.HasAtomicETH) {
				p.AtomicETH = roce.AtomicETHFields{VA: base, RKey: c.mrb.RKey, SwapAdd: 1}
			}
			p.SetPayloadLen(n)
			buf := make([]byte, 2048)
			m, err := p.Build(buf, make([]byte, n))
			must(t, err)
			var q roce.Packet
			must(t, roce.Parse(buf[:m], &q))
			s.b.eng.Receive(buf[:m], &q)
			if !tc.answers {
				if len(sent) != 0 {
					t.Fatalf("answered with %v", sent[0].BTH.Opcode)
				}
				return
			}
			if len(sent) != 1 {
				t.Fatalf("%d answers, want one", len(sent))
			}
			a := sent[0]
			syn, what := roce.SyndromeNAK|roce.NAKRemoteOperationError, "a remote operational error NAK"
			if tc.ack {
				syn, what = roce.SyndromeACK|roce.CreditInvalid, "an ACK"
			}
			if a.BTH.Opcode != roce.RCAcknowledge || a.BTH.DestQP != c.qa.Num() || a.AETH.Syndrome != syn ||
				a.BTH.PSN != tc.nakPSN || a.AETH.MSN != 1 {
				t.Fatalf("answer %v to QP %#x, PSN %d, syndrome %#x, MSN %d; want %s to %#x, PSN %d, MSN 1",
					a.BTH.Opcode, a.BTH.DestQP, a.BTH.PSN, uint8(a.AETH.Syndrome), a.AETH.MSN, what, c.qa.Num(), tc.nakPSN)
			}
		})
	}
	if !bytes.Equal(c.bufb[:3000], c.bufa[:3000]) {
		t.Fatal("B's memory changed after the kill")
	}
}

// TestKillNAKOnce: a killed QP NAKs once per episode, as a live QP NAKs a
// gap once. A's whole window, in flight when B's QP is killed — 128 WRITE
// packets, or 16 READ requests — draws one NAK, and A completes its first
// WQE with REM_OP_ERR and flushes the rest. When that NAK is lost, A's
// retransmission after its timeout begins a second episode, and draws one
// more.
func TestKillNAKOnce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		op       abi.WROpcode
		size     int // bytes of each of the 64 work requests
		inflight int // request packets in flight at the kill
		lost     int // NAKs the network loses
	}{
		{"WRITEs", abi.WRRDMAWrite, 16384, inflightBytes / 1024, 0},
		{"READs", abi.WRRDMARead, 4096, 16, 0},
		{"WRITEs, the NAK lost", abi.WRRDMAWrite, 16384, inflightBytes / 1024, 1},
		{"READs, the NAK lost", abi.WRRDMARead, 4096, 16, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, impair.Spec{}, 1500)
			c := s.connect(connOpts{retry: 7, rnr: 7, open: true})
			const n = 64
			var wrs []SendWR
			for i := range n {
				wrs = append(wrs, SendWR{ID: uint64(i), Opcode: tc.op, Flags: abi.SendSignaled,
					SGL: sge(c.mra, i*tc.size, tc.size), RemoteAddr: base + uint64(i*tc.size), RKey: c.mrb.RKey})
			}
			_, err := c.qa.PostSend(wrs)
			must(t, err)
			if got := len(s.b.inbox); got != tc.inflight {
				t.Fatalf("%d packets in flight, want %d", got, tc.inflight)
			}
			must(t, s.b.eng.Kill(c.qb, time.Minute))
			naks, lost := 0, 0
			s.b.watch = func(f []byte) {
				if p := parsed(t, f); p.BTH.Opcode == roce.RCAcknowledge && p.AETH.Syndrome.Kind() == roce.SyndromeNAK {
					naks++
				}
			}
			s.b.drop = func(f []byte) bool {
				if p := parsed(t, f); p.AETH.Syndrome.Kind() == roce.SyndromeNAK && lost < tc.lost {
					lost++
					return true
				}
				return false
			}
			var wcs []WC
			s.run(1_000_000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == n })
			// The rest of the window arrives.
			s.run(1_000_000, func() bool { return len(s.a.inbox)+len(s.b.inbox) == 0 })
			if wcs[0].Status != abi.WCRemOpErr {
				t.Fatalf("A's first completion: %v, want REM_OP_ERR", wcs[0].Status)
			}
			for _, wc := range wcs[1:] {
				if wc.Status != abi.WCWRFlushErr {
					t.Fatalf("A's completion %d: %v, want flushed", wc.ID, wc.Status)
				}
			}
			if want := 1 + tc.lost; naks != want || s.b.eng.Stats().NAKsSent != uint64(want) {
				t.Fatalf("B sent %d NAKs (counted %d), want %d", naks, s.b.eng.Stats().NAKsSent, want)
			}
			if tc.lost > 0 && s.a.eng.Stats().Timeouts == 0 {
				t.Fatal("A did not time out: the NAK was not lost")
			}
		})
	}
}
