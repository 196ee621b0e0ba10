package cm_test

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/testvectors"
)

// Operations of FuzzManager's programs: each is a byte, then its
// arguments.
const (
	opMADToB   = iota // 256 bytes (fewer at the end): a MAD from A to B
	opMADToA          // a MAD from B to A
	opPatchToB        // 1 byte n, then n (offset, value) pairs: a MAD B sent A, altered, to B again
	opTime            // 1 byte: seconds to move the clock, then deliver and tick
	opOwnerB          // 2 bytes: which of B's IDs, what its owner does
	opOwnerA          // the same at A
	opDeliver         // hand on what is in flight
	opCommEst         // 3 bytes: CommEstablished at B for that QPN
	opClose           // 1 byte: which owner closes
	numOps
)

// fuzzWorld is two managers with live state: B listens (TCP with a
// small backlog, UDP), A listens, A and B hold an established
// connection, B holds an unanswered request and A a reply not yet
// established.
type fuzzWorld struct {
	w    *network
	a, b *node
	ids  map[*node][]cm.ID
}

func newFuzzWorld(t testing.TB) *fuzzWorld {
	w := newNetwork(t, 99)
	f := &fuzzWorld{w: w, ids: map[*node][]cm.ID{}}
	f.a = w.add(addrA, guidA, cm.Config{MaxConns: 64})
	f.b = w.add(addrB, guidB, cm.Config{MaxConns: 64})
	for _, n := range []*node{f.a, f.b} {
		n.on = func(n *node, e cm.Event) { f.ids[n] = append(f.ids[n], e.ID) }
	}
	must := func(id cm.ID, err error) cm.ID {
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	f.ids[f.b] = append(f.ids[f.b],
		must(f.b.m.Listen(ownB, cm.ListenParams{Port: 7174, PortSpace: cm.PortSpaceTCP, Backlog: 4})),
		must(f.b.m.Listen(ownB, cm.ListenParams{Port: 7174, PortSpace: cm.PortSpaceUDP})))
	f.ids[f.a] = append(f.ids[f.a], must(f.a.m.Listen(ownA, cm.ListenParams{Addr: addrA, Port: 9000, PortSpace: cm.PortSpaceTCP})))
	// An established connection.
	id := must(f.a.m.Connect(ownA, connectParams(addrA, addrB, 7174, 0x11)))
	f.ids[f.a] = append(f.ids[f.a], id)
	w.deliver()
	if err := f.b.m.Accept(f.b.events[0].ID, acceptParams(0x21)); err != nil {
		t.Fatal(err)
	}
	w.deliver()
	if err := f.a.m.Establish(id, nil); err != nil {
		t.Fatal(err)
	}
	w.deliver()
	// A request B's owner has not answered, a reply A's has not.
	f.ids[f.a] = append(f.ids[f.a], must(f.a.m.Connect(ownA, connectParams(addrA, addrB, 7174, 0x12))))
	w.deliver()
	f.ids[f.b] = append(f.ids[f.b], must(f.b.m.Connect(ownB, connectParams(addrB, addrA, 9000, 0x13))))
	w.deliver()
	if err := f.a.m.Accept(f.a.events[len(f.a.events)-1].ID, acceptParams(0x23)); err != nil {
		t.Fatal(err)
	}
	w.deliver()
	w.check()
	return f
}

// owner runs an owner's action on one of n's IDs.
func (f *fuzzWorld) owner(n *node, which, what byte) {
	ids := f.ids[n]
	if len(ids) == 0 {
		return
	}
	id := ids[int(which)%len(ids)]
	owner, peer := ownA, addrB
	if n == f.b {
		owner, peer = ownB, addrA
	}
	switch what % 9 {
	case 0:
		_ = n.m.Accept(id, acceptParams(0x300+uint32(what)))
	case 1:
		_ = n.m.Reject(id, []byte{what})
	case 2:
		_ = n.m.Establish(id, nil)
	case 3:
		_ = n.m.Disconnect(id, nil)
	case 4:
		_ = n.m.Destroy(id)
	case 5:
		port := uint16(7174)
		if n == f.b {
			port = 9000
		}
		if id, err := n.m.Connect(owner, connectParams(n.addr, peer, port, 0x400+uint32(what))); err == nil {
			f.ids[n] = append(f.ids[n], id)
		}
	case 6:
		if id, err := n.m.Resolve(owner, cm.ResolveParams{Local: netip.AddrPortFrom(n.addr, 0),
			Remote: netip.AddrPortFrom(peer, 7174), PortSpace: cm.PortSpaceUDP}); err == nil {
			f.ids[n] = append(f.ids[n], id)
		}
	case 7:
		_, _ = n.m.Info(id)
	case 8:
		_ = n.m.Drop(id)
	}
}

// run executes a program, checking the invariants after each step, then
// closes both owners: nothing may be left.
func (f *fuzzWorld) run(t testing.TB, prog []byte) {
	w := f.w
	next := func(n int) []byte {
		n = min(n, len(prog))
		b := prog[:n]
		prog = prog[n:]
		return b
	}
	arg := func() byte {
		if b := next(1); len(b) == 1 {
			return b[0]
		}
		return 0
	}
	for steps := 0; len(prog) > 0 && steps < 200; steps++ {
		switch arg() % numOps {
		case opMADToB:
			f.b.m.Receive(addrA, addrB, next(cm.MADLen))
		case opMADToA:
			f.a.m.Receive(addrB, addrA, next(cm.MADLen))
		case opPatchToB:
			// A MAD B sent, altered, back to B: its own IDs are there.
			var mad [cm.MADLen]byte
			if len(w.sent) > 0 {
				mad = w.sent[int(arg())%len(w.sent)].mad
			}
			for range int(arg() % 8) {
				off, v := arg(), arg()
				mad[cm.MADHeaderLen+int(off)%cm.DataLen] = v
			}
			f.b.m.Receive(addrA, addrB, mad[:])
		case opTime:
			w.run(time.Duration(arg())*time.Second, nil)
		case opOwnerB:
			f.owner(f.b, arg(), arg())
		case opOwnerA:
			f.owner(f.a, arg(), arg())
		case opDeliver:
			w.deliver()
		case opCommEst:
			b := append(next(3), 0, 0, 0)
			f.b.m.CommEstablished(uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]))
		case opClose:
			if arg()%2 == 0 {
				f.a.m.CloseOwner(ownA)
			} else {
				f.b.m.CloseOwner(ownB)
			}
		}
		w.check()
	}
	w.deliver()
	f.a.m.CloseOwner(ownA)
	f.b.m.CloseOwner(ownB)
	w.run(time.Hour, nil)
	w.empty()
}

// FuzzManager feeds a manager with live connections and listeners
// arbitrary MADs — raw, and its peer's own altered — between owners'
// actions and the passing of time: it never panics, its tables always
// agree with each other and with its IDs' states, and once the owners
// are gone nothing is left.
func FuzzManager(f *testing.F) {
	// Seeds: the MADs of a run with every message in it, each sent to
	// both sides; rxe's captured MADs; some owners' actions and time.
	rec := newFuzzWorld(f)
	rec.owner(rec.b, 3, 3)      // disconnect from B
	rec.owner(rec.a, 5, 6)      // a SIDR resolution from A
	rec.w.run(time.Minute, nil) // TimeWait, the SIDR_REQ unanswered
	for i, p := range rec.w.sent {
		f.Add(append([]byte{opMADToB}, p.mad[:]...))
		f.Add(append([]byte{opMADToA}, p.mad[:]...))
		f.Add([]byte{opPatchToB, byte(i), 2, 4, 0x55, 8, 0})
	}
	for _, fr := range testvectors.Frames() {
		var p roce.Packet
		if roce.Parse(fr, &p) == nil && cm.IsGSI(&p) {
			f.Add(append([]byte{opMADToB}, p.Payload(fr)...))
		}
	}
	f.Add([]byte{opOwnerB, 2, 0, opDeliver, opOwnerA, 4, 2, opTime, 30, opClose, 1})
	f.Add([]byte{opOwnerA, 3, 3, opTime, 5, opOwnerB, 2, 3, opTime, 200, opTime, 200})
	f.Add([]byte{opCommEst, 0, 0, 0x21, opOwnerB, 0, 4, opOwnerA, 1, 5, opTime, 100})
	f.Add(binary.BigEndian.AppendUint32([]byte{opPatchToB, 0, 1}, 0))
	f.Fuzz(func(t *testing.T, prog []byte) {
		newFuzzWorld(t).run(t, prog)
	})
}
