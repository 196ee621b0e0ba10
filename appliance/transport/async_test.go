package transport

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/verbs/abi"
)

// asyncPort is an AsyncOutput whose writer goroutine delivers each batch
// to the peer's inbox after a random pause and then releases it, so the
// engine runs out of batches and waits for them, as it does on a busy TAP.
type asyncPort struct {
	mac     roce.MAC
	ip      netip.Addr
	batches chan *Batch
	peer    *asyncPort
	inbox   chan []byte
}

func (p *asyncPort) Headroom() int { return 10 }

// Send implements Output (unused when SendBatch is there).
func (p *asyncPort) Send(frames [][]byte) {
	for _, f := range frames {
		p.peer.inbox <- append([]byte(nil), f[10:]...)
	}
}

// SendBatch implements AsyncOutput.
func (p *asyncPort) SendBatch(b *Batch) { p.batches <- b }

func (p *asyncPort) writer(seed uint64, stop chan struct{}) {
	r := rand.New(rand.NewPCG(seed, 1))
	for {
		select {
		case b := <-p.batches:
			if r.IntN(4) == 0 {
				time.Sleep(time.Duration(r.IntN(200)) * time.Microsecond)
			}
			p.Send(b.Frames)
			b.Release()
		case <-stop:
			return
		}
	}
}

// TestAsyncOutput: over an asynchronous output that gives batches back
// late, WRITE, READ and SEND move data intact, and every batch comes back
// (as many as the free list keeps).
func TestAsyncOutput(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	mk := func(last byte) (*asyncPort, *Engine) {
		p := &asyncPort{mac: roce.MAC{2, 0, 0, 0, 0, last}, ip: netip.AddrFrom4([4]byte{10, 55, 0, last}),
			batches: make(chan *Batch, asyncBatches), inbox: make(chan []byte, 1<<16)}
		e := NewEngine(Config{MAC: p.mac, GIDs: []roce.GID{roce.LinkLocalGID(p.mac), roce.GIDFromAddr(p.ip)}, MTU: 4200, Out: p})
		go p.writer(uint64(last), stop)
		return p, e
	}
	pa, ea := mk(1)
	pb, eb := mk(2)
	pa.peer, pb.peer = pb, pa
	const size = 4 << 20
	type side struct {
		buf    []byte
		mr     *MR
		cq, rq *CQ
		qp     *QP
	}
	setup := func(e *Engine) *side {
		s := &side{buf: make([]byte, size), cq: NewCQ(4096, nil), rq: NewCQ(4096, nil)}
		pd := e.Memory().NewPD()
		var err error
		s.mr, err = e.Memory().Register(pd, 0x10000, s.buf, abi.AccessLocalWrite|abi.AccessRemoteWrite|abi.AccessRemoteRead)
		must(t, err)
		s.qp, err = e.CreateQP(QPConfig{Type: abi.RC, PD: pd, SendCQ: s.cq, RecvCQ: s.rq, MaxSendWR: 256, MaxRecvWR: 256})
		must(t, err)
		return s
	}
	a, b := setup(ea), setup(eb)
	up := func(s *side, peer *asyncPort, dqpn uint32) {
		must(t, s.qp.Modify(&QPAttr{State: abi.QPSInit, Port: 1, Access: abi.AccessRemoteWrite | abi.AccessRemoteRead}, abi.QPStateMask|abi.QPPKeyIndex|abi.QPPort|abi.QPAccessFlags))
		must(t, s.qp.Modify(&QPAttr{State: abi.QPSRTR, AV: AddressVector{DstIP: peer.ip, DstMAC: peer.mac, SGIDIndex: 1},
			PathMTU: abi.MTU4096, DestQPN: dqpn, RQPSN: 100, MaxDestRdAtomic: 16, MinRNRTimer: 1},
			abi.QPStateMask|abi.QPAV|abi.QPPathMTU|abi.QPDestQPN|abi.QPRQPSN|abi.QPMaxDestRdAtomic|abi.QPMinRNRTimer))
		must(t, s.qp.Modify(&QPAttr{State: abi.QPSRTS, SQPSN: 100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
			abi.QPStateMask|abi.QPSQPSN|abi.QPTimeout|abi.QPRetryCnt|abi.QPRNRRetry|abi.QPMaxQPRdAtomic))
	}
	up(a, pb, b.qp.Num())
	up(b, pa, a.qp.Num())
	for i := range a.buf {
		a.buf[i] = byte(i*7 + i>>12)
	}
	// A's first half goes to B by 64 KiB WRITEs, then A reads it back
	// into its second half.
	const msg, half = 64 << 10, size / 2
	var wrs []SendWR
	for off := 0; off < half; off += msg {
		wrs = append(wrs, SendWR{ID: uint64(off), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
			SGL: []SGE{{Addr: 0x10000 + uint64(off), Length: msg, LKey: a.mr.LKey}}, RemoteAddr: 0x10000 + uint64(off), RKey: b.mr.RKey})
	}
	reads := len(wrs)
	for off := 0; off < half; off += msg {
		wrs = append(wrs, SendWR{ID: uint64(off), Opcode: abi.WRRDMARead, Flags: abi.SendSignaled,
			SGL: []SGE{{Addr: 0x10000 + half + uint64(off), Length: msg, LKey: a.mr.LKey}}, RemoteAddr: 0x10000 + uint64(off), RKey: b.mr.RKey})
	}
	var pkt roce.Packet
	wcs := make([]WC, 64)
	posted, done := 0, 0
	deadline := time.Now().Add(30 * time.Second)
	for done < len(wrs) {
		if time.Now().After(deadline) {
			t.Fatalf("stuck after %d of %d completions", done, len(wrs))
		}
		// Keep at most 32 outstanding; READs only after the WRITEs are done.
		for posted < len(wrs) && posted-done < 32 && (posted < reads || done >= reads) {
			k, err := a.qp.PostSend(wrs[posted : posted+1])
			must(t, err)
			posted += k
		}
		select {
		case f := <-pa.inbox:
			must(t, roce.Parse(f, &pkt))
			ea.Receive(f, &pkt)
		case f := <-pb.inbox:
			must(t, roce.Parse(f, &pkt))
			eb.Receive(f, &pkt)
		case <-time.After(10 * time.Millisecond):
			ea.Tick()
			eb.Tick()
		}
		n := a.cq.Poll(wcs)
		for _, wc := range wcs[:n] {
			if wc.Status != abi.WCSuccess {
				t.Fatalf("completion %+v", wc)
			}
		}
		done += n
	}
	if !bytes.Equal(b.buf[:half], a.buf[:half]) {
		t.Fatal("WRITE data differs")
	}
	if !bytes.Equal(a.buf[half:], a.buf[:half]) {
		t.Fatal("READ data differs")
	}
	for _, e := range []*Engine{ea, eb} {
		e.mu.Lock()
		e.flush()
		// Every batch comes back, but those beyond what the free list
		// keeps (made while all were out, NewEngine).
		want := min(e.made, cap(e.free))
		if e.cur != nil { // kept, empty, by the engine
			want--
		}
		e.mu.Unlock()
		for len(e.free) < want && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if len(e.free) != want {
			t.Fatalf("%d of %d batches came back", len(e.free), want)
		}
	}
}

// holdOut is an AsyncOutput that keeps every batch until release.
type holdOut struct{ held []*Batch }

func (o *holdOut) Headroom() int      { return 10 }
func (o *holdOut) Send([][]byte)      {}
func (o *holdOut) SendBatch(b *Batch) { o.held = append(o.held, b) }
func (o *holdOut) release() {
	for _, b := range o.held {
		b.Release()
	}
	o.held = o.held[:0]
}

// TestBatchesKept: the batches an engine makes while all of its batches
// are out are kept once given back — up to as many bytes as asyncBatches
// take at MTU 9000 — so that an output that gives them back late (a
// spinning port's writer behind the window of 512 packets at MTU 1500)
// costs no allocation once they exist.
func TestBatchesKept(t *testing.T) {
	for _, c := range []struct {
		mtu, out, kept int
	}{{1500, 24, 24}, {1500, 60, 48}, {9000, 24, asyncBatches}} {
		o := &holdOut{}
		e := NewEngine(Config{MTU: c.mtu, Out: o})
		cycle := func() {
			e.mu.Lock()
			for range c.out {
				e.frame()
				e.emit(60, false)
				e.flush()
			}
			e.mu.Unlock()
			o.release()
		}
		cycle()
		if got := len(e.free); got != c.kept {
			t.Errorf("MTU %d, %d batches out: %d kept, want %d", c.mtu, c.out, got, c.kept)
		}
		if c.out <= c.kept {
			if n := testing.AllocsPerRun(10, cycle); n != 0 {
				t.Errorf("MTU %d: %d batches out and back: %v allocations", c.mtu, c.out, n)
			}
		}
	}
}
