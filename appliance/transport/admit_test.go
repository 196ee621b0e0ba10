package transport

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// stranger is an address no port of the simulation has.
var stranger = netip.MustParseAddr("10.55.0.250")

// inject builds p with payload into a frame with a valid ICRC, checks
// that it parses and passes the ICRC check as the port's receive path
// would, and hands it to port's engine.
func inject(t *testing.T, port *simPort, p roce.Packet, payload []byte) {
	t.Helper()
	buf := make([]byte, 9000)
	n, err := p.Build(buf, payload)
	must(t, err)
	var q roce.Packet
	must(t, roce.Parse(buf[:n], &q))
	must(t, q.VerifyICRC(buf[:n]))
	port.eng.Receive(buf[:n], &q)
}

// TestSpoofedRequests: packets with a valid ICRC aimed at a live RC QP
// from an address that is not its peer's, or to an address that is not
// its own, or with a P_Key outside the default partition — a WRITE, a
// READ and an atomic at the PSN it expects, a packet far ahead of it, an
// acknowledgement for its own requester — are dropped and counted by
// reason, as rxe's check_addr and check_keys drop them: nothing is
// written, nothing answered, and the QP and its peer carry on as if they
// had never been sent. The same packet from the peer is executed, so the
// packets are good ones but for what is checked.
func TestSpoofedRequests(t *testing.T) {
	const target = base + 0x10000 // where the spoofed WRITE aims
	type spoof struct {
		p       roce.Packet
		payload []byte
		toA     bool // the packet goes to A, whose WRITE is outstanding
	}
	for _, tc := range []struct {
		name   string
		reason RejectReason
		make   func(s *sim, c *conn) spoof
	}{
		{"WRITE from a stranger", RejectAddress, func(s *sim, c *conn) spoof {
			p := towardsB(s, c, roce.RCRDMAWriteOnly, c.qb.ePSN)
			p.Src = stranger
			p.RETH = roce.RETHFields{VA: target, RKey: c.mrb.RKey, DMALen: 256}
			return spoof{p: p, payload: bytes.Repeat([]byte{0xEE}, 256)}
		}},
		{"READ from a stranger", RejectAddress, func(s *sim, c *conn) spoof {
			p := towardsB(s, c, roce.RCRDMAReadRequest, c.qb.ePSN)
			p.Src = stranger
			p.RETH = roce.RETHFields{VA: base, RKey: c.mrb.RKey, DMALen: 4096}
			return spoof{p: p}
		}},
		{"FETCH_ADD from a stranger", RejectAddress, func(s *sim, c *conn) spoof {
			p := towardsB(s, c, roce.RCFetchAdd, c.qb.ePSN)
			p.Src = stranger
			p.AtomicETH = roce.AtomicETHFields{VA: base + 0x8000, RKey: c.mrb.RKey, SwapAdd: 1000}
			return spoof{p: p}
		}},
		{"CMP_SWAP from a stranger", RejectAddress, func(s *sim, c *conn) spoof {
			p := towardsB(s, c, roce.RCCompareSwap, c.qb.ePSN)
			p.Src = stranger
			p.AtomicETH = roce.AtomicETHFields{VA: base + 0x8000, RKey: c.mrb.RKey, Compare: 5, SwapAdd: 1000}
			return spoof{p: p}
		}},
		{"PSN far ahead from a stranger", RejectAddress, func(s *sim, c *conn) spoof {
			p := towardsB(s, c, roce.RCSendOnly, c.qb.ePSN.Add(1000))
			p.Src = stranger
			return spoof{p: p, payload: make([]byte, 64)}
		}},
		{"PSN just ahead from a stranger", RejectAddress, func(s *sim, c *conn) spoof {
			p := towardsB(s, c, roce.RCRDMAWriteOnly, c.qb.ePSN.Add(1))
			p.Src = stranger
			p.RETH = roce.RETHFields{VA: target, RKey: c.mrb.RKey, DMALen: 256}
			return spoof{p: p, payload: bytes.Repeat([]byte{0xEE}, 256)}
		}},
		{"WRITE from the peer to another address", RejectAddress, func(s *sim, c *conn) spoof {
			p := towardsB(s, c, roce.RCRDMAWriteOnly, c.qb.ePSN)
			p.Dst = netip.MustParseAddr("10.55.0.99")
			p.RETH = roce.RETHFields{VA: target, RKey: c.mrb.RKey, DMALen: 256}
			return spoof{p: p, payload: bytes.Repeat([]byte{0xEE}, 256)}
		}},
		{"NAK to the requester from a stranger", RejectAddress, func(s *sim, c *conn) spoof {
			p := c.qb.template(s.a.ip, s.a.mac, c.qa.Num(), 0, 0)
			p.Src = stranger
			p.BTH.Opcode, p.BTH.PSN = roce.RCAcknowledge, c.qa.acked.Next()
			p.AETH = roce.AETHFields{Syndrome: roce.SyndromeNAK | roce.NAKRemoteAccessError}
			return spoof{p: p, toA: true}
		}},
		{"WRITE from the peer in another partition", RejectPKey, func(s *sim, c *conn) spoof {
			p := towardsB(s, c, roce.RCRDMAWriteOnly, c.qb.ePSN)
			p.BTH.PKey = 0x9234
			p.RETH = roce.RETHFields{VA: target, RKey: c.mrb.RKey, DMALen: 256}
			return spoof{p: p, payload: bytes.Repeat([]byte{0xEE}, 256)}
		}},
		{"WRITE from the peer with P_Key 0", RejectPKey, func(s *sim, c *conn) spoof {
			p := towardsB(s, c, roce.RCRDMAWriteOnly, c.qb.ePSN)
			p.BTH.PKey = 0x8000
			p.RETH = roce.RETHFields{VA: target, RKey: c.mrb.RKey, DMALen: 256}
			return spoof{p: p, payload: bytes.Repeat([]byte{0xEE}, 256)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, impair.Spec{}, 1500)
			c := s.connect(connOpts{retry: 7, rnr: 7, psnA: 0xFFFFF0})
			warmUp(t, s, c)
			beforeA, beforeB := s.a.eng.Stats(), s.b.eng.Stats()
			ePSN, bufb := c.qb.ePSN, append([]byte(nil), c.bufb...)
			sp := tc.make(s, c)
			victim := s.b
			if sp.toA {
				victim = s.a
				_, err := c.qa.PostSend([]SendWR{{ID: 7, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 512), RemoteAddr: base + 0x20000, RKey: c.mrb.RKey}})
				must(t, err)
			}
			answered := 0
			victim.watch = func([]byte) { answered++ }
			inject(t, victim, sp.p, sp.payload)
			victim.watch = nil
			st := victim.eng.Stats()
			before := beforeB
			if sp.toA {
				before = beforeA
			}
			if got := st.Rejected[tc.reason] - before.Rejected[tc.reason]; got != 1 {
				t.Errorf("%s rejections: %d, want 1 (%+v)", tc.reason, got, st.Rejected)
			}
			if st.Dropped-before.Dropped != 1 {
				t.Errorf("drops: %d, want 1", st.Dropped-before.Dropped)
			}
			if answered != 0 {
				t.Errorf("the spoofed packet was answered")
			}
			if !bytes.Equal(c.bufb, bufb) {
				t.Errorf("B's memory changed")
			}
			if c.qb.ePSN != ePSN {
				t.Errorf("B expects PSN %d, not %d as before", c.qb.ePSN, ePSN)
			}
			if sp.toA {
				var wcs []WC
				s.run(10000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 1 })
				if wcs[0].Status != abi.WCSuccess {
					t.Fatalf("A's outstanding WRITE completed with %v", wcs[0].Status)
				}
			}
			// The pair carries on: WRITE over what the stranger aimed at,
			// READ it back, add to the counter.
			checkPair(t, s, c, 2)
			if n := s.b.eng.Stats().NAKsSent; n != 0 {
				t.Errorf("B sent %d NAKs", n)
			}
			if n := s.a.eng.Stats().NAKsReceived; n != 0 {
				t.Errorf("A received %d NAKs", n)
			}
		})
	}
	// The control: a spoofed WRITE's packet, from the peer's own address,
	// is executed.
	t.Run("the same WRITE from the peer", func(t *testing.T) {
		s := newSim(t, impair.Spec{}, 1500)
		c := s.connect(connOpts{retry: 7, rnr: 7})
		warmUp(t, s, c)
		p := towardsB(s, c, roce.RCRDMAWriteOnly, c.qb.ePSN)
		p.RETH = roce.RETHFields{VA: target, RKey: c.mrb.RKey, DMALen: 256}
		p.BTH.PKey = 0x7FFF // a limited member of the default partition
		inject(t, s.b, p, bytes.Repeat([]byte{0xEE}, 256))
		if !bytes.Equal(c.bufb[target-base:target-base+256], bytes.Repeat([]byte{0xEE}, 256)) {
			t.Fatal("the peer's WRITE was not executed")
		}
		if r := s.b.eng.Stats().Rejected; r != [NumRejectReasons]uint64{} {
			t.Fatalf("rejections %v", r)
		}
	})
}

// towardsB returns a packet of A's QP to B's with opcode op and PSN psn.
func towardsB(s *sim, c *conn, op roce.Opcode, psn roce.PSN) roce.Packet {
	p := c.qa.template(s.b.ip, s.b.mac, c.qb.Num(), 0, 0)
	p.BTH.Opcode, p.BTH.PSN, p.BTH.AckReq = op, psn, true
	return p
}

// warmUp moves the pair's PSNs on with a WRITE, a READ and a FETCH_ADD.
func warmUp(t *testing.T, s *sim, c *conn) {
	t.Helper()
	checkPair(t, s, c, 1)
}

// checkPair WRITEs 4 KiB to B at base+0x10000, READs them back, adds one
// to the counter at base+0x8000 (which round rounds have added to
// before), and checks the data and that all three succeeded.
func checkPair(t *testing.T, s *sim, c *conn, round int) {
	t.Helper()
	const n = 4096
	for i := range n {
		c.bufa[i] = byte(i*7 + round)
	}
	_, err := c.qa.PostSend([]SendWR{
		{ID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, n), RemoteAddr: base + 0x10000, RKey: c.mrb.RKey},
		{ID: 2, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, SGL: sge(c.mra, 0x10000, n), RemoteAddr: base + 0x10000, RKey: c.mrb.RKey},
		{ID: 3, Opcode: abi.WRAtomicFetchAdd, Flags: abi.SendSignaled, SGL: sge(c.mra, 0x8000, 8), RemoteAddr: base + 0x8000, RKey: c.mrb.RKey, CompareAdd: 1},
	})
	must(t, err)
	var wcs []WC
	s.run(100000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == 3 })
	for _, wc := range wcs {
		if wc.Status != abi.WCSuccess {
			t.Fatalf("round %d: work request %d: %v", round, wc.ID, wc.Status)
		}
	}
	if !bytes.Equal(c.bufb[0x10000:0x10000+n], c.bufa[:n]) || !bytes.Equal(c.bufa[0x10000:0x10000+n], c.bufa[:n]) {
		t.Fatalf("round %d: the data differs", round)
	}
	if got := getUint64(c.bufa[0x8000:]); got != uint64(round-1) {
		t.Fatalf("round %d: FETCH_ADD fetched %d, want %d", round, got, round-1)
	}
	if st := c.qb.State(); st != abi.QPSRTS {
		t.Fatalf("round %d: B in %v", round, st)
	}
}

// TestDatagramKeys: a UD QP takes only packets with its own Q_Key and a
// P_Key of the default partition, from anyone, and never the GSI's Q_Key,
// which is QP1's alone (TestGSIDrops has QP1's checks). Wrong keys are
// dropped and counted, and leave the receive WQE for the next good
// datagram.
func TestDatagramKeys(t *testing.T) {
	const qkey = 0x11111111
	for _, tc := range []struct {
		name   string
		qkey   uint32
		pkey   uint16
		reason RejectReason // -1: delivered
	}{
		{"right keys", qkey, roce.DefaultPKey, -1},
		{"right keys from a limited member", qkey, 0x7FFF, -1},
		{"wrong Q_Key", 0x22222222, roce.DefaultPKey, RejectQKey},
		{"GSI Q_Key to another QP", roce.GSIQKey, roce.DefaultPKey, RejectQKey},
		{"wrong P_Key", qkey, 0x8001, RejectPKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, impair.Spec{}, 1500)
			pd := s.b.eng.Memory().NewPD()
			mr, err := s.b.eng.Memory().Register(pd, base, make([]byte, 8192), abi.AccessLocalWrite)
			must(t, err)
			rcq := NewCQ(64, nil)
			qp, err := s.b.eng.CreateQP(QPConfig{Type: abi.UD, PD: pd, SendCQ: NewCQ(64, nil), RecvCQ: rcq, MaxSendWR: 16, MaxRecvWR: 16})
			must(t, err)
			must(t, qp.Modify(&QPAttr{State: abi.QPSInit, Port: 1, QKey: qkey}, abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPQKey))
			must(t, qp.Modify(&QPAttr{State: abi.QPSRTR}, abi.QPStateMask))
			must(t, qp.Modify(&QPAttr{State: abi.QPSRTS, SQPSN: 7}, abi.QPStateMask|abi.QPSQPSN))
			_, err = qp.PostRecv([]RecvWR{{ID: 1, SGL: []SGE{{Addr: base, Length: 1000, LKey: mr.LKey}}}})
			must(t, err)
			p := roce.Packet{
				DstMAC: s.b.mac, SrcMAC: s.a.mac, Src: stranger, Dst: s.b.ip, TTL: 64,
				SrcPort: 0xC000, DstPort: roce.UDPPort,
				BTH:  roce.BTHFields{Opcode: roce.UDSendOnly, PKey: tc.pkey, DestQP: qp.Num(), PSN: 9},
				DETH: roce.DETHFields{QKey: tc.qkey, SrcQP: 0x1234},
			}
			inject(t, s.b, p, []byte("datagram"))
			wcs := poll(rcq)
			st := s.b.eng.Stats()
			if tc.reason < 0 {
				if len(wcs) != 1 || wcs[0].Status != abi.WCSuccess || wcs[0].ByteLen != 40+8 {
					t.Fatalf("completions %+v, want the datagram", wcs)
				}
				if st.Rejected != [NumRejectReasons]uint64{} {
					t.Fatalf("rejections %v", st.Rejected)
				}
				return
			}
			if len(wcs) != 0 {
				t.Fatalf("completions %+v, want none", wcs)
			}
			if st.Rejected[tc.reason] != 1 || st.Dropped != 1 {
				t.Fatalf("rejections %v, drops %d; want one for %s", st.Rejected, st.Dropped, tc.reason)
			}
		})
	}
}
