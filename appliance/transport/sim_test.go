package transport

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// The simulation: two engines joined by an in-memory link that can lose,
// duplicate, reorder and corrupt frames (the port's own impairment, seeded)
// and a fake clock that jumps to the next timer when the link is idle.

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

type simPort struct {
	eng   *Engine
	mac   roce.MAC
	ip    netip.Addr
	inbox [][]byte
	refs  [][]byte // with a local switch (localOut), the inbox frames' Batch.Refs
	peer  *simPort
	im    *impair.Impairer
	sim   *sim
	watch func(frame []byte)      // when set, sees every frame the port sends
	sends int                     // Send calls: the engine's flushes
	drop  func(frame []byte) bool // when set, loses the frames it returns true for
}

// Headroom implements Output.
func (p *simPort) Headroom() int { return 10 }

// Send implements Output: frames cross the impaired link into the peer's
// inbox.
func (p *simPort) Send(frames [][]byte) {
	p.sends++
	for _, f := range frames {
		f = f[10:]
		p.sim.sent++
		if p.watch != nil {
			p.watch(f)
		}
		if p.drop != nil && p.drop(f) {
			continue
		}
		p.im.Apply(f, p.sim.clock.now, func(g []byte) {
			p.peer.inbox = append(p.peer.inbox, append([]byte(nil), g...))
		})
	}
}

type sim struct {
	t     testing.TB
	clock fakeClock
	a, b  *simPort
	sent  int
	seed  uint64
}

func newSim(t testing.TB, spec impair.Spec, mtu int) *sim {
	s := &sim{t: t, clock: fakeClock{now: time.Unix(1000, 0)}, seed: spec.Seed}
	mk := func(last byte, seed uint64) *simPort {
		p := &simPort{sim: s, mac: roce.MAC{2, 0, 0, 0, 0, last}, ip: netip.AddrFrom4([4]byte{10, 55, 0, last})}
		sp := spec
		sp.Seed = seed
		p.im = impair.New(sp)
		p.eng = NewEngine(Config{
			MAC: p.mac, GIDs: []roce.GID{roce.LinkLocalGID(p.mac), roce.GIDFromAddr(p.ip)},
			MTU: mtu, Out: p, Now: s.clock.Now, Seed: seed, // QPNs and keys repeat with the seed
		})
		return p
	}
	s.a, s.b = mk(1, spec.Seed*2+1), mk(2, spec.Seed*2+2)
	s.a.peer, s.b.peer = s.b, s.a
	return s
}

// step delivers one queued frame, or releases held ones, or advances the
// clock to the next timer; it returns false when nothing is left to do.
func (s *sim) step() bool {
	for _, p := range []*simPort{s.a, s.b} {
		if len(p.inbox) > 0 {
			f := p.inbox[0]
			p.inbox = p.inbox[1:]
			var pkt roce.Packet
			if len(p.refs) > 0 {
				// The local switch: frames in memory, as the NIC's
				// local loop hands them over, without an ICRC check.
				ref := p.refs[0]
				p.refs = p.refs[1:]
				if roce.Parse(f, &pkt) == nil {
					p.eng.ReceiveLocal(f, &pkt, ref)
				}
				return true
			}
			if roce.Parse(f, &pkt) == nil && pkt.VerifyICRC(f) == nil {
				p.eng.Receive(f, &pkt)
			}
			return true
		}
	}
	var next time.Time
	for _, p := range []*simPort{s.a, s.b} {
		if t, ok := p.eng.NextDeadline(); ok && (next.IsZero() || t.Before(next)) {
			next = t
		}
		if t, ok := p.peer.im.NextDue(); ok && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	if next.IsZero() {
		return false
	}
	if next.After(s.clock.now) {
		s.clock.now = next
	}
	for _, p := range []*simPort{s.a, s.b} {
		p.im.Flush(s.clock.now, func(g []byte) { p.peer.inbox = append(p.peer.inbox, append([]byte(nil), g...)) })
		p.eng.Tick()
	}
	return true
}

// run steps until done holds; it fails the test on a deadlock or when
// more than limit steps pass.
func (s *sim) run(limit int, done func() bool) {
	s.t.Helper()
	for i := 0; i < limit; i++ {
		if done() {
			return
		}
		if !s.step() {
			if done() {
				return
			}
			s.t.Fatalf("seed %d: deadlock: nothing in flight, no timer, not done\n%s", s.seed, s.dump())
		}
	}
	s.t.Fatalf("seed %d: not done after %d steps\n%s", s.seed, limit, s.dump())
}

// dump describes both engines' queue pairs, for failures.
func (s *sim) dump() string {
	var b bytes.Buffer
	for name, p := range map[string]*simPort{"A": s.a, "B": s.b} {
		fmt.Fprintf(&b, "%s: %+v\n", name, p.eng.Stats())
		for _, qp := range p.eng.qps {
			fmt.Fprintf(&b, "  qp %#x %v sq head %d next %d tail %d reqOff %d psn %d sentTo %d acked %d ePSN %d msn %d rdAtomic %d inMsg %v retryAt %v rnrAt %v\n",
				qp.num, qp.state, qp.sqHead, qp.sqNext, qp.sqTl, qp.reqOff, qp.psn, qp.sentTo, qp.acked, qp.ePSN, qp.msn, qp.rdAtomicOut, qp.inMsg, qp.retryAt.Sub(s.clock.now), qp.rnrAt)
			if qp.sqHead < qp.sqTl {
				w := &qp.sq[qp.sqHead%uint64(len(qp.sq))]
				fmt.Fprintf(&b, "    head wqe %v len %d psn %d..%d filled %v resp %d\n", w.wr.Opcode, w.length, w.firstPSN, w.lastPSN, w.filled, w.resp)
			}
		}
	}
	return b.String()
}

// conn is a connected RC queue pair on each side, with memory.
type conn struct {
	qa, qb     *QP
	cqa, cqb   *CQ
	rcqa, rcqb *CQ
	mra, mrb   *MR
	pda, pdb   *PD
	bufa, bufb []byte
	otherRKey  uint32
}

type connOpts struct {
	pmtu                abi.MTU
	retry, rnr, timeout uint8
	psnA, psnB          roce.PSN
	size                int
	access              abi.Access
	rd                  uint8 // max_rd_atomic and max_dest_rd_atomic (16)
	// av, when set, gives the address vector towards peer (default: its
	// IPv4 address from GID index 1).
	av func(peer *simPort) AddressVector
	// open starts both QPs with the whole fixed window, not in slow
	// start, for tests of what a full window does.
	open bool
}

func (s *sim) connect(o connOpts) *conn {
	s.t.Helper()
	if o.pmtu == 0 {
		o.pmtu = abi.MTU1024
	}
	if o.timeout == 0 {
		o.timeout = 14 // 67 ms
	}
	if o.size == 0 {
		o.size = 1 << 20
	}
	if o.rd == 0 {
		o.rd = 16
	}
	if o.access == 0 {
		o.access = abi.AccessLocalWrite | abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic
	}
	c := &conn{}
	side := func(p *simPort, buf *[]byte, pd **PD, mr **MR, cq, rcq **CQ) *QP {
		*pd = p.eng.Memory().NewPD()
		*buf = make([]byte, o.size)
		var err error
		if *mr, err = p.eng.Memory().Register(*pd, 0x10000, *buf, abi.AccessLocalWrite|abi.AccessRemoteWrite|abi.AccessRemoteRead|abi.AccessRemoteAtomic); err != nil {
			s.t.Fatal(err)
		}
		*cq, *rcq = NewCQ(4096, nil), NewCQ(4096, nil)
		qp, err := p.eng.CreateQP(QPConfig{Type: abi.RC, PD: *pd, SendCQ: *cq, RecvCQ: *rcq, MaxSendWR: 1024, MaxRecvWR: 1024, MaxInline: 64})
		if err != nil {
			s.t.Fatal(err)
		}
		return qp
	}
	c.qa = side(s.a, &c.bufa, &c.pda, &c.mra, &c.cqa, &c.rcqa)
	c.qb = side(s.b, &c.bufb, &c.pdb, &c.mrb, &c.cqb, &c.rcqb)
	if o.av == nil {
		o.av = func(peer *simPort) AddressVector {
			return AddressVector{DstIP: peer.ip, DstMAC: peer.mac, SGIDIndex: 1}
		}
	}
	up := func(qp *QP, peer *simPort, dqpn uint32, rq, sq roce.PSN) {
		must(s.t, qp.Modify(&QPAttr{State: abi.QPSInit, Port: 1, Access: o.access}, abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPAccessFlags))
		must(s.t, qp.Modify(&QPAttr{State: abi.QPSRTR, AV: o.av(peer),
			PathMTU: o.pmtu, DestQPN: dqpn, RQPSN: rq, MaxDestRdAtomic: o.rd, MinRNRTimer: 1},
			abi.QPStateMask|abi.QPAV|abi.QPPathMTU|abi.QPDestQPN|abi.QPRQPSN|abi.QPMaxDestRdAtomic|abi.QPMinRNRTimer))
		must(s.t, qp.Modify(&QPAttr{State: abi.QPSRTS, SQPSN: sq, Timeout: o.timeout, RetryCnt: o.retry, RNRRetry: o.rnr, MaxRdAtomic: o.rd},
			abi.QPStateMask|abi.QPSQPSN|abi.QPTimeout|abi.QPRetryCnt|abi.QPRNRRetry|abi.QPMaxQPRdAtomic))
	}
	up(c.qa, s.b, c.qb.Num(), o.psnB, o.psnA)
	up(c.qb, s.a, c.qa.Num(), o.psnA, o.psnB)
	if o.open {
		for _, qp := range []*QP{c.qa, c.qb} {
			qp.cc.cwnd, qp.cc.slow = qp.cc.max, false
		}
	}
	return c
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func poll(cq *CQ) []WC {
	var out []WC
	wcs := make([]WC, 64)
	for {
		n := cq.Poll(wcs)
		if n == 0 {
			return out
		}
		out = append(out, wcs[:n]...)
	}
}

// TestBasicOps: SEND, WRITE with immediate, READ, both atomics over a
// clean link, data and completions checked.
func TestBasicOps(t *testing.T) {
	s := newSim(t, impair.Spec{}, 1500)
	c := s.connect(connOpts{})
	for i := range c.bufa[:65536] {
		c.bufa[i] = byte(i * 7)
		c.bufb[0x8000+i] = byte(i * 13)
	}
	_, err := c.qb.PostRecv([]RecvWR{{ID: 100, SGL: []SGE{{Addr: 0x10000 + 0x40000, Length: 8192, LKey: c.mrb.LKey}}},
		{ID: 101, SGL: []SGE{{Addr: 0x10000 + 0x50000, Length: 16, LKey: c.mrb.LKey}}}})
	must(t, err)
	putUint64(c.bufb[0x60000:], 40)
	putUint64(c.bufb[0x60008:], 7)
	wrs := []SendWR{
		{ID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []SGE{{Addr: 0x10000, Length: 5000, LKey: c.mra.LKey}}},
		{ID: 2, Opcode: abi.WRRDMAWriteWithImm, Flags: abi.SendSignaled, Imm: 0xabcdef, SGL: []SGE{{Addr: 0x10000 + 100, Length: 3000, LKey: c.mra.LKey}}, RemoteAddr: 0x10000 + 0x70000, RKey: c.mrb.RKey},
		{ID: 3, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, SGL: []SGE{{Addr: 0x10000 + 0x20000, Length: 10000, LKey: c.mra.LKey}}, RemoteAddr: 0x10000 + 0x8000, RKey: c.mrb.RKey},
		{ID: 4, Opcode: abi.WRAtomicFetchAdd, Flags: abi.SendSignaled, SGL: []SGE{{Addr: 0x10000 + 0x30000, Length: 8, LKey: c.mra.LKey}}, RemoteAddr: 0x10000 + 0x60000, RKey: c.mrb.RKey, CompareAdd: 2},
		{ID: 5, Opcode: abi.WRAtomicCmpAndSwp, Flags: abi.SendSignaled, SGL: []SGE{{Addr: 0x10000 + 0x30008, Length: 8, LKey: c.mra.LKey}}, RemoteAddr: 0x10000 + 0x60008, RKey: c.mrb.RKey, CompareAdd: 7, Swap: 99},
	}
	_, err = c.qa.PostSend(wrs)
	must(t, err)
	var got []WC
	s.run(100000, func() bool { got = append(got, poll(c.cqa)...); return len(got) == 5 })
	for i, wc := range got {
		if wc.Status != abi.WCSuccess || wc.ID != uint64(i+1) {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	if !bytes.Equal(c.bufb[0x40000:0x40000+5000], c.bufa[:5000]) {
		t.Error("SEND data differs")
	}
	if !bytes.Equal(c.bufb[0x70000:0x70000+3000], c.bufa[100:3100]) {
		t.Error("WRITE data differs")
	}
	if !bytes.Equal(c.bufa[0x20000:0x20000+10000], c.bufb[0x8000:0x8000+10000]) {
		t.Error("READ data differs")
	}
	if getUint64(c.bufa[0x30000:]) != 40 || getUint64(c.bufb[0x60000:]) != 42 {
		t.Errorf("FETCH_ADD: orig %d, now %d", getUint64(c.bufa[0x30000:]), getUint64(c.bufb[0x60000:]))
	}
	if getUint64(c.bufa[0x30008:]) != 7 || getUint64(c.bufb[0x60008:]) != 99 {
		t.Errorf("CMP_SWAP: orig %d, now %d", getUint64(c.bufa[0x30008:]), getUint64(c.bufb[0x60008:]))
	}
	recv := poll(c.rcqb)
	if len(recv) != 2 || recv[0].ID != 100 || recv[0].ByteLen != 5000 || recv[0].Opcode != abi.WCRecv ||
		recv[1].ID != 101 || recv[1].Opcode != abi.WCRecvRDMAImm || recv[1].Imm != 0xabcdef || recv[1].ByteLen != 3000 {
		t.Fatalf("receive completions %+v", recv)
	}
}

// workload runs n random operations from A to B and checks everything:
// completions in order and successful, each SEND delivered once and in
// order with its data, WRITE and READ data byte-identical, atomics executed
// exactly once.
func workload(t *testing.T, s *sim, c *conn, n int, r *rand.Rand) {
	t.Helper()
	const slot = 32 << 10
	const base = 0x10000
	// A's source data and B's READ source: patterns.
	for i := range c.bufa[:n*slot] {
		c.bufa[i] = byte(r.Uint32())
	}
	rd := 2 * n * slot // B's READ source area
	for i := 0; i < n*slot; i++ {
		c.bufb[rd+i] = byte(r.Uint32())
	}
	counter := 3 * n * slot // B's atomic counter
	putUint64(c.bufb[counter:], 1000)
	type msg struct {
		op   abi.WROpcode
		size int
	}
	var msgs []msg
	var sends []int
	var wrs []SendWR
	var recvs []RecvWR
	expect := uint64(1000)
	var origs []uint64
	for i := 0; i < n; i++ {
		ops := []abi.WROpcode{abi.WRSend, abi.WRSendWithImm, abi.WRRDMAWrite, abi.WRRDMAWriteWithImm, abi.WRRDMARead, abi.WRAtomicFetchAdd, abi.WRAtomicCmpAndSwp}
		op := ops[r.IntN(len(ops))]
		size := r.IntN(20000)
		if r.IntN(8) == 0 {
			size = r.IntN(3) // tiny and empty messages
		}
		if op.IsAtomic() {
			size = 8
		}
		src := SGE{Addr: base + uint64(i*slot), Length: uint32(size), LKey: c.mra.LKey}
		wr := SendWR{ID: uint64(i), Opcode: op, Flags: abi.SendSignaled, SGL: []SGE{src}, Imm: uint32(i)}
		switch op {
		case abi.WRSend, abi.WRSendWithImm:
			sends = append(sends, i)
			recvs = append(recvs, RecvWR{ID: uint64(i), SGL: []SGE{{Addr: base + uint64(n*slot+i*slot), Length: slot, LKey: c.mrb.LKey}}})
		case abi.WRRDMAWrite, abi.WRRDMAWriteWithImm:
			wr.RemoteAddr, wr.RKey = base+uint64(n*slot+i*slot), c.mrb.RKey
			if op == abi.WRRDMAWriteWithImm {
				sends = append(sends, i)
				recvs = append(recvs, RecvWR{ID: uint64(i)})
			}
		case abi.WRRDMARead:
			wr.SGL[0].Addr = base + uint64(4*n*slot+i*slot)
			wr.RemoteAddr, wr.RKey = base+uint64(rd+i*slot), c.mrb.RKey
		case abi.WRAtomicFetchAdd:
			wr.SGL[0].Addr = base + uint64(4*n*slot+i*slot)
			wr.RemoteAddr, wr.RKey, wr.CompareAdd = base+uint64(counter), c.mrb.RKey, uint64(i+1)
			origs = append(origs, expect)
			expect += uint64(i + 1)
		case abi.WRAtomicCmpAndSwp:
			wr.SGL[0].Addr = base + uint64(4*n*slot+i*slot)
			wr.RemoteAddr, wr.RKey, wr.CompareAdd, wr.Swap = base+uint64(counter), c.mrb.RKey, expect, expect*3
			origs = append(origs, expect)
			expect *= 3
		}
		wrs = append(wrs, wr)
		msgs = append(msgs, msg{op, size})
	}
	_, err := c.qb.PostRecv(recvs)
	must(t, err)
	var done []WC
	for i := 0; i < len(wrs); i += 16 {
		_, err := c.qa.PostSend(wrs[i:min(i+16, len(wrs))])
		must(t, err)
	}
	s.run(5_000_000, func() bool { done = append(done, poll(c.cqa)...); return len(done) == n })
	for i, wc := range done {
		if wc.ID != uint64(i) || wc.Status != abi.WCSuccess {
			t.Fatalf("seed %d: send completion %d: %+v (%v)", s.seed, i, wc, wc.Status)
		}
	}
	var recv []WC
	s.run(100000, func() bool { recv = append(recv, poll(c.rcqb)...); return len(recv) == len(sends) })
	k := 0
	for i, m := range msgs {
		off := i * slot
		switch m.op {
		case abi.WRSend, abi.WRSendWithImm, abi.WRRDMAWriteWithImm:
			wc := recv[k]
			k++
			if wc.ID != uint64(i) || wc.Status != abi.WCSuccess || int(wc.ByteLen) != m.size {
				t.Fatalf("seed %d: receive completion for message %d: %+v", s.seed, i, wc)
			}
			if m.op != abi.WRSend && (wc.Flags&abi.WCWithImm == 0 || wc.Imm != uint32(i)) {
				t.Fatalf("seed %d: message %d: immediate %+v", s.seed, i, wc)
			}
			if !bytes.Equal(c.bufb[n*slot+off:n*slot+off+m.size], c.bufa[off:off+m.size]) {
				t.Fatalf("seed %d: message %d (%v, %d bytes): data differs", s.seed, i, m.op, m.size)
			}
		case abi.WRRDMAWrite:
			if !bytes.Equal(c.bufb[n*slot+off:n*slot+off+m.size], c.bufa[off:off+m.size]) {
				t.Fatalf("seed %d: WRITE %d (%d bytes): data differs", s.seed, i, m.size)
			}
		case abi.WRRDMARead:
			if !bytes.Equal(c.bufa[4*n*slot+off:4*n*slot+off+m.size], c.bufb[rd+off:rd+off+m.size]) {
				t.Fatalf("seed %d: READ %d (%d bytes): data differs", s.seed, i, m.size)
			}
		}
	}
	j := 0
	for i, m := range msgs {
		if m.op.IsAtomic() {
			if got := getUint64(c.bufa[4*n*slot+i*slot:]); got != origs[j] {
				t.Fatalf("seed %d: atomic %d returned %d, want %d", s.seed, i, got, origs[j])
			}
			j++
		}
	}
	if got := getUint64(c.bufb[counter:]); got != expect {
		t.Fatalf("seed %d: counter %d, want %d (an atomic ran twice or not at all)", s.seed, got, expect)
	}
}

// TestLossyMatrix runs the workload over links with loss, duplication,
// reordering, corruption and delay, for several seeds each
// (TAPROCE_SIM_SEEDS=N for more). A failure names its seed.
func TestLossyMatrix(t *testing.T) {
	specs := []string{
		"",
		"loss=1%",
		"loss=5%",
		"duplicate=5%",
		"reorder=10%",
		"corrupt=1%",
		"loss=2%,duplicate=2%,reorder=5%,corrupt=0.5%",
		"loss=1%,delay=100us,reorder=5%",
	}
	seeds := uint64(3)
	if v, err := strconv.Atoi(os.Getenv("TAPROCE_SIM_SEEDS")); err == nil && v > 0 {
		seeds = uint64(v) // more seeds for a deeper run
	}
	for _, text := range specs {
		for seed := uint64(1); seed <= seeds; seed++ {
			spec, err := impair.ParseSpec(text)
			must(t, err)
			spec.Seed = seed
			t.Run(fmt.Sprintf("%s/seed=%d", text, seed), func(t *testing.T) {
				s := newSim(t, spec, 1500)
				// Even seeds use the smallest path MTU, so that the longer
				// READs are asked for in several pieces.
				pmtu := []abi.MTU{abi.MTU1024, abi.MTU256}[seed%2]
				c := s.connect(connOpts{size: 8 << 20, retry: 7, rnr: 7, pmtu: pmtu})
				workload(t, s, c, 40, rand.New(rand.NewPCG(seed, 99)))
			})
		}
	}
}

// TestPSNWrap runs the workload across the 2^24 wrap of both PSN spaces.
func TestPSNWrap(t *testing.T) {
	spec, _ := impair.ParseSpec("loss=2%,seed=5")
	s := newSim(t, spec, 1500)
	c := s.connect(connOpts{size: 8 << 20, retry: 7, rnr: 7, psnA: roce.PSNMask - 20, psnB: roce.PSNMask - 3})
	workload(t, s, c, 40, rand.New(rand.NewPCG(5, 5)))
	if c.qa.Attr().State != abi.QPSRTS {
		t.Fatal("QP left RTS")
	}
}
