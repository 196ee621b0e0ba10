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

// TestLocalWholeRead: a READ from a responder on the local switch is one
// request for all its bytes and one READ RESPONSE ONLY that refers to the
// responder's memory and stands for all its PSNs (respondWhole); the
// requester places it across a scatter list of two entries, reads after
// it in flight together fill in order, and a WRITE behind them uses the
// PSN after the READs' last: the responder executes it.
func TestLocalWholeRead(t *testing.T) {
	s := newLocalSim(t, 1500) // path MTU 1024: a READ of 100000 bytes is 98 packets
	c := s.connect(connOpts{retry: 7, rnr: 7})
	const n, size = 3, 100000
	for i := range c.bufb[:n*size] {
		c.bufb[i] = byte(i*13 + i/size)
	}
	const dst = 512 << 10 // A's buffers, after room for the WRITE's source
	var wrs []SendWR
	for i := range n {
		// Two scatter entries, the first not a multiple of the path MTU.
		off := dst + i*size
		wrs = append(wrs, SendWR{ID: uint64(i), Opcode: abi.WRRDMARead, Flags: abi.SendSignaled,
			SGL:        []SGE{sge(c.mra, off, 30001)[0], sge(c.mra, off+30001, size-30001)[0]},
			RemoteAddr: base + uint64(i*size), RKey: c.mrb.RKey})
	}
	copy(c.bufa[:8], "written!")
	wrs = append(wrs, SendWR{ID: 9, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sge(c.mra, 0, 8),
		RemoteAddr: base + 900000, RKey: c.mrb.RKey})
	_, err := c.qa.PostSend(wrs)
	must(t, err)
	var wcs []WC
	s.run(10000, func() bool { wcs = append(wcs, poll(c.cqa)...); return len(wcs) == n+1 })
	for i, wc := range wcs {
		if wc.Status != abi.WCSuccess || wc.ID != wrs[i].ID {
			t.Fatalf("completion %d: %+v (%v), want %d successful", i, wc, wc.Status, wrs[i].ID)
		}
	}
	if !bytes.Equal(c.bufa[dst:dst+n*size], c.bufb[:n*size]) {
		t.Error("the READs placed other bytes")
	}
	if string(c.bufb[900000:900008]) != "written!" {
		t.Errorf("the WRITE after the READs did not land: %q", c.bufb[900000:900008])
	}
	// A: three READ requests and a WRITE; B: three responses and an ACK.
	sa, sb := s.a.eng.Stats(), s.b.eng.Stats()
	if sa.Sent != n+1 || sb.Sent != n+1 {
		t.Errorf("frames sent: A %d, B %d; want %d each", sa.Sent, sb.Sent, n+1)
	}
	if sa.Retransmits != 0 || sa.Dropped != 0 || sb.Dropped != 0 || sb.DuplicateRequests != 0 {
		t.Errorf("A %+v\nB %+v", sa, sb)
	}
}

// TestLocalReadFence: through the local switch a READ's data is read when
// the requester places it (respondWhole), so a WRITE to the same bytes
// posted behind it can show in it; with IBV_SEND_FENCE the WRITE waits
// for the READ's completion, and the READ returns the bytes as they were.
// Over the wire (no local switch) the READ returns them either way.
func TestLocalReadFence(t *testing.T) {
	for _, c := range []struct {
		name  string
		local bool
		fence abi.SendFlags
		want  string
	}{
		{"local, fenced", true, abi.SendFence, "original"},
		{"wire, fenced", false, abi.SendFence, "original"},
		{"wire, not fenced", false, 0, "original"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSim(t, impair.Spec{}, 1500)
			if c.local {
				s = newLocalSim(t, 1500)
			}
			cn := s.connect(connOpts{retry: 7, rnr: 7})
			const x, size = 0, 5000 // B's bytes the READ reads and the WRITE overwrites
			copy(cn.bufb[x:], "original")
			copy(cn.bufa[100000:], "replaced")
			wrs := []SendWR{
				{ID: 1, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, SGL: sge(cn.mra, 200000, size),
					RemoteAddr: base + x, RKey: cn.mrb.RKey},
				{ID: 2, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled | c.fence, SGL: sge(cn.mra, 100000, 8),
					RemoteAddr: base + x, RKey: cn.mrb.RKey},
			}
			_, err := cn.qa.PostSend(wrs)
			must(t, err)
			// B handles all A sent before A looks at its answers: the
			// order in which, through the local switch, the WRITE would
			// change the READ's data.
			for len(s.b.inbox) > 0 {
				f := s.b.inbox[0]
				s.b.inbox = s.b.inbox[1:]
				var ref []byte
				if len(s.b.refs) > 0 {
					ref, s.b.refs = s.b.refs[0], s.b.refs[1:]
				}
				var pkt roce.Packet
				if roce.Parse(f, &pkt) == nil {
					s.b.eng.ReceiveLocal(f, &pkt, ref)
				}
			}
			var wcs []WC
			s.run(10000, func() bool { wcs = append(wcs, poll(cn.cqa)...); return len(wcs) == 2 })
			for _, wc := range wcs {
				if wc.Status != abi.WCSuccess {
					t.Fatalf("completion %+v (%v)", wc, wc.Status)
				}
			}
			if got := string(cn.bufa[200000 : 200000+8]); got != c.want {
				t.Errorf("the READ returned %q, want %q", got, c.want)
			}
			if got := string(cn.bufb[x : x+8]); got != "replaced" {
				t.Errorf("the WRITE left %q", got)
			}
		})
	}
}
