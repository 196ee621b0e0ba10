package appliance

import (
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/tap"
	"github.com/taproce/taproce/verbs/abi"
)

// TestLocalSwitchHeldAck: on the local switch, a SEND posted off the
// appliance's blocking loop (here by the test's goroutine) while the loop
// sleeps wakes it — the receiving NIC's queue is a source of the loop
// without a descriptor, whose deliveries Wake it — and its acknowledgement
// goes out at once (none towards the local switch waits for company). It
// once waited for whatever woke the loop next — with nothing else to do,
// the sender's local ACK timeout (here about 2 s), whose retransmission
// drew the acknowledgement again; an rdma_cm connection whose receiver
// answered with an RNR NAK took that long for each message after it.
func TestLocalSwitchHeldAck(t *testing.T) {
	app, err := New(Options{Socket: filepath.Join(t.TempDir(), "s"), Poll: PollBlock, LocalSwitch: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if !app.Loop().Blocking() || PollBlock.AckDelay() == 0 {
		t.Fatal("want a blocking loop and acknowledgements that wait")
	}
	da, db := tap.NewFakePair(1500, 64)
	var nics [2]*NIC
	var ips [2]netip.Addr
	for i, dev := range []tap.Device{da, db} {
		ips[i] = netip.AddrFrom4([4]byte{10, 67, 0, byte(i + 1)})
		if nics[i], err = app.AddPortOn(dev, PortConfig{Namespace: "ack", Name: dev.Name(), MTU: 1500,
			Addrs: []netip.Prefix{netip.PrefixFrom(ips[i], 24)}}); err != nil {
			t.Fatal(err)
		}
	}
	type end struct {
		qp     *transport.QP
		cq     *transport.CQ
		mr     *transport.MR
		engine *transport.Engine
	}
	var ends [2]end
	for i, n := range nics {
		e := n.Engine()
		pd := e.Memory().NewPD()
		mr, err := e.Memory().Register(pd, 0x10000, make([]byte, 4096), abi.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		cq := transport.NewCQ(64, nil)
		qp, err := e.CreateQP(transport.QPConfig{Type: abi.RC, PD: pd, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16, MaxInline: 64})
		if err != nil {
			t.Fatal(err)
		}
		ends[i] = end{qp: qp, cq: cq, mr: mr, engine: e}
	}
	for i, me := range ends {
		peer := nics[1-i]
		for _, st := range []struct {
			attr transport.QPAttr
			mask abi.AttrMask
		}{
			{transport.QPAttr{State: abi.QPSInit, Port: 1}, abi.QPStateMask | abi.QPPKeyIndex | abi.QPPort | abi.QPAccessFlags},
			{transport.QPAttr{State: abi.QPSRTR, PathMTU: abi.MTU1024, DestQPN: ends[1-i].qp.Num(), RQPSN: 100, MaxDestRdAtomic: 1,
				AV: transport.AddressVector{DstIP: ips[1-i], DstMAC: peer.Port().MAC(), SGIDIndex: 1}},
				abi.QPStateMask | abi.QPAV | abi.QPPathMTU | abi.QPDestQPN | abi.QPRQPSN | abi.QPMaxDestRdAtomic | abi.QPMinRNRTimer},
			// A local ACK timeout of 2^19 × 4.096 µs ≈ 2.1 s, the RDMA CM's.
			{transport.QPAttr{State: abi.QPSRTS, SQPSN: 100, Timeout: 19, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
				abi.QPStateMask | abi.QPSQPSN | abi.QPTimeout | abi.QPRetryCnt | abi.QPRNRRetry | abi.QPMaxQPRdAtomic},
		} {
			if err := me.qp.Modify(&st.attr, st.mask); err != nil {
				t.Fatal(err)
			}
		}
	}
	a, b := ends[0], ends[1]
	wcs := make([]transport.WC, 4)
	for i := range 5 {
		// Long enough for the blocking loop to have gone to sleep.
		time.Sleep(20 * time.Millisecond)
		if _, err := b.qp.PostRecv([]transport.RecvWR{{ID: uint64(i), SGL: []transport.SGE{{Addr: 0x10000, Length: 64, LKey: b.mr.LKey}}}}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := a.qp.PostSend([]transport.SendWR{{ID: uint64(i), Opcode: abi.WRSend, Flags: abi.SendSignaled | abi.SendInline, Inline: []byte("hi")}}); err != nil {
			t.Fatal(err)
		}
		for a.cq.Poll(wcs) == 0 {
			if d := time.Since(start); d > 500*time.Millisecond {
				t.Fatalf("SEND %d: no acknowledgement after %v; sender %+v, receiver %+v", i, d, a.engine.Stats(), b.engine.Stats())
			}
			time.Sleep(100 * time.Microsecond)
		}
		if wcs[0].Status != abi.WCSuccess {
			t.Fatalf("SEND %d: %+v", i, wcs[0])
		}
		for b.cq.Poll(wcs) != 0 {
		}
	}
	if st := a.engine.Stats(); st.Timeouts != 0 {
		t.Errorf("the sender timed out %d times", st.Timeouts)
	}
}
