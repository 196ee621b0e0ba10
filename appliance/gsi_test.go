package appliance

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/tap"
)

// mad is one MAD a NIC's GSI handler received.
type mad struct {
	src, dst netip.Addr
	srcQPN   uint32
	bytes    []byte
}

// madSink sets a GSI handler on n that passes what it receives on a
// channel; answer, when set, is called from the handler.
func madSink(n *NIC, answer func(m mad)) chan mad {
	ch := make(chan mad, 64)
	n.SetGSI(func(src, dst netip.Addr, srcQPN uint32, _ uint16, b []byte) {
		m := mad{src, dst, srcQPN, append([]byte(nil), b...)}
		if answer != nil {
			answer(m)
		}
		ch <- m
	})
	return ch
}

// waitMAD returns the next MAD of ch, failing the test after 10 s.
func waitMAD(t *testing.T, ch chan mad, what string) mad {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no MAD", what)
		return mad{}
	}
}

func testMAD(seed byte) []byte {
	b := make([]byte, transport.MADSize)
	for i := range b {
		b[i] = seed + byte(i)
	}
	return b
}

// madNICs opens two NICs, 10.66.0.1 and .2, on the two ends of a fake
// wire, joined by sw when it is not nil.
func madNICs(t *testing.T, sw *Switch) (a, b *NIC, wa, wb *tap.Fake) {
	t.Helper()
	wa, wb = tap.NewFakePair(1500, 1024)
	var nics [2]*NIC
	for i, dev := range []*tap.Fake{wa, wb} {
		addr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 66, 0, byte(i + 1)}), 24)
		n, err := NewNIC("mad"+string(rune('0'+i)), dev, PortConfig{Namespace: "mad", Name: "mad" + string(rune('0'+i)), Addrs: []netip.Prefix{addr}}, sw)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		nics[i] = n
	}
	return nics[0], nics[1], wa, wb
}

// TestNICMADs: two NICs exchange MADs both ways — on a fake wire, where
// the first MAD waits for the station's ARP exchange, and on the local
// switch, where no frame touches the wire — each answering from within
// its handler as a connection manager answers a REQ; a NIC also reaches
// its own QP1 (loopback). The handlers see the peer's address and QP 1 as
// the source, and the MAD's bytes.
func TestNICMADs(t *testing.T) {
	for _, local := range []bool{false, true} {
		name := "fake wire"
		if local {
			name = "local switch"
		}
		t.Run(name, func(t *testing.T) {
			var sw *Switch
			if local {
				sw = NewSwitch()
			}
			a, b, _, _ := madNICs(t, sw)
			ipA, ipB := a.GIDs()[1].Addr(), b.GIDs()[1].Addr()
			gotA := madSink(a, nil)
			gotB := madSink(b, func(m mad) { // B answers each MAD with its bytes + 1
				reply := append([]byte(nil), m.bytes...)
				for i := range reply {
					reply[i]++
				}
				if err := b.SendMAD(m.dst, m.src, reply); err != nil {
					t.Error(err)
				}
			})
			var switched uint64
			for round := range 3 {
				if sw != nil {
					switched = sw.Frames()
				}
				req := testMAD(byte(round))
				if err := a.SendMAD(netip.Addr{}, ipB, req); err != nil {
					t.Fatal(err)
				}
				m := waitMAD(t, gotB, "B")
				if m.src != ipA || m.dst != ipB || m.srcQPN != transport.GSIQPN || !bytes.Equal(m.bytes, req) {
					t.Errorf("round %d: B got %v→%v QP %d %x…", round, m.src, m.dst, m.srcQPN, m.bytes[:4])
				}
				r := waitMAD(t, gotA, "A")
				if r.src != ipB || r.dst != ipA || r.bytes[0] != req[0]+1 {
					t.Errorf("round %d: A got %v→%v %x…", round, r.src, r.dst, r.bytes[:4])
				}
				if sw != nil && sw.Frames() < switched+2 {
					t.Errorf("round %d: %d frames crossed the switch, want 2", round, sw.Frames()-switched)
				}
			}
			// Loopback: A to its own QP1.
			if err := a.SendMAD(ipA, ipA, testMAD(9)); err != nil {
				t.Fatal(err)
			}
			if m := waitMAD(t, gotA, "A from itself"); m.src != ipA || m.dst != ipA || !bytes.Equal(m.bytes, testMAD(9)) {
				t.Errorf("loopback: %v→%v", m.src, m.dst)
			}
			ea, eb := a.Engine().Stats(), b.Engine().Stats()
			if ea.GSISent != 4 || eb.GSIReceived != 3 || eb.GSISent != 3 || ea.GSIReceived != 4 {
				t.Errorf("engine stats A %+v, B %+v", ea, eb)
			}
			ga := a.GSIStats()
			if ga.Dropped != [NumMADDropReasons]uint64{} || (ga.Queued == 0) == !local {
				t.Errorf("A's GSI stats %+v (local switch %v)", ga, local)
			}
			if local && a.Port().Stats().TxFrames+b.Port().Stats().TxFrames > 8 { // the stations' announcements only
				t.Errorf("frames on the wire: %d and %d", a.Port().Stats().TxFrames, b.Port().Stats().TxFrames)
			}
		})
	}
}

// TestNICMADDrops: a MAD of the wrong size is refused at once; with
// nobody on the wire to answer ARP, MADs wait, up to maxPendingMADs, the
// next is refused (queue_full), and those waiting are dropped as
// unresolved when the NIC closes — SendMAD never waits.
func TestNICMADDrops(t *testing.T) {
	dev, silent := tap.NewFakePair(1500, 16)
	defer silent.Close()
	n, err := NewNIC("drop0", dev, PortConfig{Namespace: "mad", Name: "drop0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.66.1.1/24")}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.SendMAD(netip.Addr{}, netip.MustParseAddr("10.66.1.2"), make([]byte, 100)); !errors.Is(err, transport.ErrMADSize) {
		t.Errorf("100 bytes: %v", err)
	}
	start := time.Now()
	for i := range maxPendingMADs {
		dst := netip.AddrFrom4([4]byte{10, 66, 1, byte(2 + i%8)})
		if err := n.SendMAD(netip.Addr{}, dst, testMAD(byte(i))); err != nil {
			t.Fatalf("MAD %d: %v", i, err)
		}
	}
	if err := n.SendMAD(netip.Addr{}, netip.MustParseAddr("10.66.1.2"), testMAD(0)); !errors.Is(err, ErrMADQueueFull) {
		t.Errorf("one MAD too many: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("SendMAD took %v for %d MADs", d, maxPendingMADs+1)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	s := n.GSIStats()
	want := [NumMADDropReasons]uint64{MADDropQueueFull: 1, MADDropUnresolved: maxPendingMADs, MADDropInvalid: 1}
	if s.Dropped != want || s.Queued != maxPendingMADs {
		t.Errorf("GSI stats %+v, want drops %v", s, want)
	}
	if st := n.Engine().Stats(); st.GSISent != 0 {
		t.Errorf("engine sent %d MADs", st.GSISent)
	}
}
