package appliance

import (
	"net/netip"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/tap"
	"github.com/taproce/taproce/verbs/abi"
)

// TestNICTickLoop: an idle NIC's tick loop sleeps — no Tick in 50 ms with
// nothing timed, where it used to tick every millisecond — and a timer
// set later still fires on time: a SEND into a wire that nobody answers
// is sent again at each local ACK timeout (Timeout 8: about 1 ms) and
// completes with a retry error once its two retries are spent.
func TestNICTickLoop(t *testing.T) {
	a, b := tap.NewFakePair(1500, 64)
	defer b.Close()
	go func() { // the wire's far end swallows everything
		bufs, sizes := [][]byte{make([]byte, 2048)}, []int{0}
		for {
			if _, err := b.Read(bufs, sizes, 0); err != nil {
				return
			}
		}
	}()
	addr := netip.MustParsePrefix("10.88.0.1/24")
	n, err := NewNIC("tick0", a, PortConfig{Namespace: "tick", Name: "tick0", MTU: 1500, Addrs: []netip.Prefix{addr}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	time.Sleep(10 * time.Millisecond)
	before := n.ticks.Load()
	time.Sleep(50 * time.Millisecond)
	if got := n.ticks.Load() - before; got != 0 {
		t.Errorf("an idle NIC ticked %d times in 50 ms", got)
	}

	e := n.Engine()
	pd := e.Memory().NewPD()
	cq := transport.NewCQ(16, nil)
	qp, err := e.CreateQP(transport.QPConfig{Type: abi.RC, PD: pd, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4, MaxInline: 64})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []struct {
		attr transport.QPAttr
		mask abi.AttrMask
	}{
		{transport.QPAttr{State: abi.QPSInit, Port: 1}, abi.QPStateMask | abi.QPPKeyIndex | abi.QPPort | abi.QPAccessFlags},
		{transport.QPAttr{State: abi.QPSRTR, PathMTU: abi.MTU1024, DestQPN: 0x42, RQPSN: 1, MaxDestRdAtomic: 1, MinRNRTimer: 1,
			AV: transport.AddressVector{DstIP: netip.MustParseAddr("10.88.0.2"), DstMAC: roce.MAC{2, 0, 0, 0, 0x88, 2}, SGIDIndex: 1}},
			abi.QPStateMask | abi.QPAV | abi.QPPathMTU | abi.QPDestQPN | abi.QPRQPSN | abi.QPMaxDestRdAtomic | abi.QPMinRNRTimer},
		{transport.QPAttr{State: abi.QPSRTS, SQPSN: 1, Timeout: 8, RetryCnt: 2, RNRRetry: 2, MaxRdAtomic: 1},
			abi.QPStateMask | abi.QPSQPSN | abi.QPTimeout | abi.QPRetryCnt | abi.QPRNRRetry | abi.QPMaxQPRdAtomic},
	} {
		if err := qp.Modify(&st.attr, st.mask); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := qp.PostSend([]transport.SendWR{{ID: 7, Opcode: abi.WRSend, Flags: abi.SendSignaled | abi.SendInline, Inline: []byte("hi")}}); err != nil {
		t.Fatal(err)
	}
	wcs := make([]transport.WC, 1)
	deadline := time.Now().Add(10 * time.Second)
	for cq.Poll(wcs) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no completion after 10 s; engine %+v", e.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if wcs[0].ID != 7 || wcs[0].Status != abi.WCRetryExcErr {
		t.Errorf("completion %+v, want ID 7 with a retry error", wcs[0])
	}
	if st := e.Stats(); st.Timeouts != 3 || st.Retransmits < 2 {
		t.Errorf("engine stats %+v, want 3 timeouts and 2 retransmissions", st)
	}
}
