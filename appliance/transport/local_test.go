package transport

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// localOut is a sim port's output when both engines are on one local
// switch (Config.Local): batches whose whole-message frames refer to the
// sender's memory (Batch.Refs) cross into the peer's inbox with their
// references, and go back to the sender once delivered.
type localOut struct{ *simPort }

func (o localOut) SendBatch(b *Batch) {
	for i, f := range b.Frames {
		f = f[o.Headroom():]
		o.sim.sent++
		var ref []byte
		if b.Refs != nil {
			ref = b.Refs[i]
		}
		o.peer.inbox = append(o.peer.inbox, append([]byte(nil), f...))
		o.peer.refs = append(o.peer.refs, ref)
	}
	// The references stay valid: the test never deregisters the regions.
	b.Release()
}

// newLocalSim is newSim with the two engines on a local switch.
func newLocalSim(t testing.TB, mtu int) *sim {
	s := newSim(t, impair.Spec{}, mtu)
	for _, p := range []*simPort{s.a, s.b} {
		p.eng = NewEngine(Config{
			MAC: p.mac, GIDs: []roce.GID{roce.LinkLocalGID(p.mac), roce.GIDFromAddr(p.ip)},
			MTU: mtu, Out: localOut{p}, Now: s.clock.Now, Local: func(netip.Addr) bool { return true },
		})
	}
	return s
}

// TestLocalWholeMessageNotKeptAside: a whole message from the local switch
// that arrives ahead of the expected PSN — behind a SEND the responder
// answered with an RNR NAK for want of a receive — is not kept aside
// without its payload (which lies in the sender's memory, lent only while
// it is delivered) but NAKed and sent again: every message arrives whole.
func TestLocalWholeMessageNotKeptAside(t *testing.T) {
	s := newLocalSim(t, 1500)
	c := s.connect(connOpts{retry: 7, rnr: 7})
	const n, size = 4, 3000
	for i := range c.bufa[:n*size] {
		c.bufa[i] = byte(i*7 + i/size)
	}
	var wrs []SendWR
	for i := range n {
		wrs = append(wrs, SendWR{ID: uint64(i), Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: sge(c.mra, i*size, size)})
	}
	_, err := c.qa.PostSend(wrs)
	must(t, err)
	// B has no receive yet: the first SEND gets an RNR NAK, the others
	// arrive ahead of it. Then B posts its receives.
	s.run(100, func() bool { return len(s.b.inbox) == 0 && c.qb.e.Stats().RNRNAKsSent > 0 })
	for i := range n {
		_, err := c.qb.PostRecv([]RecvWR{{ID: uint64(i), SGL: sge(c.mrb, i*size, size)}})
		must(t, err)
	}
	var sent, recv []WC
	s.run(100000, func() bool {
		sent, recv = append(sent, poll(c.cqa)...), append(recv, poll(c.rcqb)...)
		return len(sent) == n && len(recv) == n
	})
	for _, wc := range append(sent, recv...) {
		if wc.Status != abi.WCSuccess {
			t.Fatalf("completion %+v (%v)", wc, wc.Status)
		}
	}
	for _, wc := range recv {
		if wc.ByteLen != size {
			t.Errorf("receive %d: %d bytes, want %d", wc.ID, wc.ByteLen, size)
		}
	}
	if !bytes.Equal(c.bufb[:n*size], c.bufa[:n*size]) {
		t.Error("the messages arrived with other bytes")
	}
}
