package lab

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/internal/testnet"
	"github.com/taproce/taproce/tap"
	"github.com/taproce/taproce/verbs/abi"
)

// BenchmarkTAPPath measures the frame path through two real TAPs —
// namespace A's port → bridge → veth → bridge → namespace B's port — with
// 4096-byte-payload RoCE packets, one per write and as UDP GSO
// super-frames of 15 packets, next to a raw writer/reader pair of TAPs on
// the same bridges in the same run. Metrics: packets/s and MB/s of each,
// and port/raw, the ratio of the port's packet rate to the raw pair's.
func BenchmarkTAPPath(b *testing.B) {
	testnet.RequireRoot(b)
	for _, mode := range []struct {
		name    string
		offload bool
	}{{"one-per-write", false}, {"super-frames", true}} {
		b.Run(mode.name, func(b *testing.B) { benchPath(b, mode.offload) })
	}
}

const benchBatch = 15

func benchPath(b *testing.B, offload bool) {
	var portRx atomic.Uint64
	credit := make(chan struct{}, 64)
	grant := func(n uint64) {
		if n%benchBatch == 0 {
			select {
			case credit <- struct{}{}:
			default:
			}
		}
	}
	l, err := Build(Topology{
		Prefix: testnet.Name() + "-", Hosts: 2, MTU: 4200, Offload: offload,
		Handler: func(_ int, frame []byte, p *roce.Packet) {
			if p.BTH.Opcode == roce.UDSendOnly {
				grant(portRx.Add(1))
			}
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	A, B := l.Hosts[0], l.Hosts[1]
	if offload && !A.Port.Device().(*tap.Tap).Offloaded() {
		b.Skip("the kernel refuses USO offloads on TAPs")
	}

	// The raw pair: one more TAP on each bridge, no station, no port.
	rawA, rawB := rawTap(b, A, offload), rawTap(b, B, offload)
	defer rawA.Close()
	defer rawB.Close()
	rawMAC := roce.MAC{0x02, 0x52, 0x41, 0x57, 0, 0xB}
	// Let the bridges learn where rawMAC lives.
	hello := make([]byte, tap.Headroom+60)
	eth := roce.Ethernet(hello[tap.Headroom:])
	eth.SetDst(roce.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	eth.SetSrc(rawMAC)
	eth.SetEtherType(0x88B5) // local experimental
	if _, err := rawB.Write([][]byte{hello}, tap.Headroom); err != nil {
		b.Fatal(err)
	}
	var rawRx atomic.Uint64
	go func() {
		// The raw reader takes frames in place, as the port does, and only
		// parses them.
		var p roce.Packet
		count := func(frame []byte) {
			if roce.Parse(frame, &p) == nil {
				grant(rawRx.Add(1))
			}
		}
		for {
			if _, err := rawB.ReadEach(count); err != nil {
				return
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)

	mac, err := A.Port.Station().Resolve(b.Context(), B.PortIPv4())
	if err != nil {
		b.Fatal(err)
	}
	portFrames := buildBatch(b, A.Port.MAC(), mac, A.PortIPv4(), B.PortIPv4())
	rawFrames := buildBatch(b, roce.MAC{0x02, 0x52, 0x41, 0x57, 0, 0xA}, rawMAC, A.PortIPv4(), B.PortIPv4())
	frameLen := len(portFrames[0]) - tap.Headroom

	// run sends n packets (rounded up to whole batches) with at most
	// window of them in flight — the receiver hands back a credit per
	// batch — so that the rate measured is the one the path sustains
	// without overflowing the TAP queues; a credit that does not come
	// within 20 ms counts the batch as lost. It returns the packets
	// delivered and the time from the first send to the last arrival.
	const window = 16 * benchBatch
	run := func(n int, rx *atomic.Uint64, send func() error) (uint64, time.Duration) {
		start := rx.Load()
		total := uint64((n + benchBatch - 1) / benchBatch * benchBatch)
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		t0 := time.Now()
		for sent := uint64(0); sent < total; sent += benchBatch {
			for sent-(rx.Load()-start) >= window {
				timer.Reset(20 * time.Millisecond)
				select {
				case <-credit:
					continue
				case <-timer.C:
				}
				break
			}
			if err := send(); err != nil {
				b.Fatal(err)
			}
		}
		last, lastAt := rx.Load(), time.Now()
		for last-start < total && time.Since(lastAt) < 100*time.Millisecond {
			time.Sleep(time.Millisecond)
			if n := rx.Load(); n != last {
				last, lastAt = n, time.Now()
			}
		}
		return last - start, lastAt.Sub(t0)
	}
	// Alternate raw and port rounds so that both see the same machine.
	const rounds = 4
	var rawGot, portGot uint64
	var rawTime, portTime time.Duration
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		got, el := run(b.N/rounds, &rawRx, func() error { _, err := rawA.Write(rawFrames, tap.Headroom); return err })
		rawGot, rawTime = rawGot+got, rawTime+el
		got, el = run(b.N/rounds, &portRx, func() error { return A.Port.Send(portFrames, tap.Headroom) })
		portGot, portTime = portGot+got, portTime+el
	}
	total := uint64(rounds * ((b.N/rounds + benchBatch - 1) / benchBatch * benchBatch))
	rawPPS, portPPS := float64(rawGot)/rawTime.Seconds(), float64(portGot)/portTime.Seconds()
	rawLost, portLost := total-rawGot, total-portGot
	b.StopTimer()
	b.ReportMetric(rawPPS, "raw-pkt/s")
	b.ReportMetric(rawPPS*float64(frameLen)/1e6, "raw-MB/s")
	b.ReportMetric(portPPS, "port-pkt/s")
	b.ReportMetric(portPPS*float64(frameLen)/1e6, "port-MB/s")
	b.ReportMetric(portPPS/rawPPS, "port/raw")
	b.ReportMetric(float64(rawLost+portLost), "lost")
}

// rawTap adds a TAP named raw0 to a host's bridge.
func rawTap(b *testing.B, h *Host, offload bool) *tap.Tap {
	b.Helper()
	dev, err := tap.Create(tap.Config{Name: "raw0", Netns: netnsutil.Path(h.Namespace), MTU: 4200, Offload: offload,
		MAC: net.HardwareAddr{0x02, 0x52, 0x41, 0x57, byte(h.Index), 0xEE}})
	if err != nil {
		b.Fatal(err)
	}
	if err := netnsutil.AttachToBridge(netnsutil.Path(h.Namespace), "raw0", h.Bridge); err != nil {
		dev.Close()
		b.Fatal(err)
	}
	return dev
}

// buildBatch builds benchBatch UD SEND packets of 4096 payload bytes with
// consecutive IP IDs, each behind tap.Headroom.
func buildBatch(b *testing.B, src, dst roce.MAC, srcIP, dstIP netip.Addr) [][]byte {
	b.Helper()
	p := roce.Packet{
		DstMAC: dst, SrcMAC: src, Src: srcIP, Dst: dstIP, TTL: 64, DontFragment: true,
		SrcPort: roce.DatagramSourcePort(0x99), DstPort: roce.UDPPort,
		BTH:  roce.BTHFields{Opcode: roce.UDSendOnly, PKey: roce.DefaultPKey, DestQP: 0x99},
		DETH: roce.DETHFields{QKey: 0x1234, SrcQP: 0x99},
	}
	payload := make([]byte, 4096)
	frames := make([][]byte, benchBatch)
	for i := range frames {
		buf := make([]byte, tap.Headroom+4096+128)
		p.ID = uint16(i)
		p.BTH.PSN = roce.PSN(i)
		n, err := p.Build(buf[tap.Headroom:], payload)
		if err != nil {
			b.Fatal(err)
		}
		frames[i] = buf[:tap.Headroom+n]
	}
	return frames
}

// BenchmarkLabWrite64K compares RDMA WRITE of 64 KiB messages between two
// lab namespaces' ports (TAP → bridge → veth → bridge → TAP, super-frames)
// with TCP between the same namespaces' kernels over the same veth,
// measured in the same run, at MTU 9000 (path MTU 4096) and at MTU 1500
// (path MTU 1024). Metrics: MB/s of each and rdma/tcp, the ratio.
func BenchmarkLabWrite64K(b *testing.B) {
	for _, mtu := range []int{9000, 1500} {
		b.Run(fmt.Sprintf("mtu%d", mtu), func(b *testing.B) { labWrite64K(b, mtu) })
	}
}

func labWrite64K(b *testing.B, mtu int) {
	testnet.RequireRoot(b)
	l, err := Build(Topology{Prefix: testnet.Name() + "-", Hosts: 2, MTU: mtu, Offload: true})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	A, B := l.Hosts[0], l.Hosts[1]
	const size = 64 << 10
	const region = 64 * size
	rp, err := connectRC(b.Context(), A.NIC.Engine(), B.NIC.Engine(), A, B, region)
	if err != nil {
		b.Fatal(err)
	}
	wrs := make([]transport.SendWR, b.N)
	for i := range wrs {
		off := uint64(i%64) * size
		wrs[i] = transport.SendWR{ID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
			SGL: []transport.SGE{{Addr: rdmaBase + off, Length: size, LKey: rp.mra.LKey}}, RemoteAddr: rdmaBase + off, RKey: rp.mrb.RKey}
	}
	b.SetBytes(size)
	b.ResetTimer()
	start := time.Now()
	if err := rp.post(b.Context(), wrs); err != nil {
		b.Fatal(err)
	}
	rdma := float64(b.N*size) / time.Since(start).Seconds()
	b.StopTimer()
	tcp, err := TCPThroughput(A, B, max(b.N*size, 64<<20))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(rdma/1e6, "rdma-MB/s")
	b.ReportMetric(tcp/1e6, "tcp-MB/s")
	b.ReportMetric(rdma/tcp, "rdma/tcp")
}

// BenchmarkLabSendPingPong is a 2-byte SEND ping-pong between two lab
// namespaces' transport engines (no client processes: each side a
// goroutine woken by its CQs), over the TAP path, next to a raw frame
// ping-pong between two bare TAPs on the same bridges, both sleeping
// between frames. Metrics: the median half round trip of each (µs) and
// engine/raw, their ratio: what the appliance's own path costs, without
// the client processes of BenchmarkLabSpeed.
func BenchmarkLabSendPingPong(b *testing.B) {
	testnet.RequireRoot(b)
	l, err := Build(Topology{Prefix: testnet.Name() + "-", Hosts: 2, MTU: 9000, Offload: true, Poll: appliance.PollBlock,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	A, B := l.Hosts[0], l.Hosts[1]
	raw, err := RawPingPong(A, B, max(b.N, 1000), 0)
	if err != nil {
		b.Fatal(err)
	}
	rp, err := connectRC(b.Context(), A.NIC.Engine(), B.NIC.Engine(), A, B, 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	recv := func(qp *transport.QP, mr *transport.MR) error {
		_, err := qp.PostRecv([]transport.RecvWR{{ID: 1, SGL: []transport.SGE{{Addr: rdmaBase, Length: 64, LKey: mr.LKey}}}})
		return err
	}
	send := []transport.SendWR{{ID: 2, Opcode: abi.WRSend, Flags: abi.SendSignaled | abi.SendInline, Inline: []byte("pp")}}
	for range 4 {
		if err := errors.Join(recv(rp.qa, rp.mra), recv(rp.qb, rp.mrb)); err != nil {
			b.Fatal(err)
		}
	}
	// B echoes every message, woken by its CQs.
	stop := make(chan struct{})
	echoed := make(chan error, 1)
	go func() {
		wcs := make([]transport.WC, 8)
		for {
			k := rp.rcqb.Poll(wcs)
			for _, wc := range wcs[:k] {
				if wc.Status != abi.WCSuccess {
					echoed <- fmt.Errorf("B: %+v", wc)
					return
				}
				if err := recv(rp.qb, rp.mrb); err != nil {
					echoed <- err
					return
				}
				if _, err := rp.qb.PostSend(send); err != nil {
					echoed <- err
					return
				}
			}
			rp.cqb.Poll(wcs)
			if k == 0 {
				select {
				case <-stop:
					echoed <- nil
					return
				case <-rp.wakeB:
				}
			}
		}
	}()
	wcs := make([]transport.WC, 8)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if _, err := rp.qa.PostSend(send); err != nil {
			b.Fatal(err)
		}
		for got := false; !got; {
			k := rp.rcqa.Poll(wcs)
			for _, wc := range wcs[:k] {
				if wc.Status != abi.WCSuccess {
					b.Fatalf("A: %+v", wc)
				}
				got = true
				if err := recv(rp.qa, rp.mra); err != nil {
					b.Fatal(err)
				}
			}
			rp.cqa.Poll(wcs)
			if !got {
				select {
				case <-rp.wakeA:
				case <-time.After(5 * time.Second):
					b.Fatal("no answer in 5 s")
				}
			}
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	close(stop)
	if err := <-echoed; err != nil {
		b.Fatal(err)
	}
	slices.Sort(lat)
	half := lat[len(lat)/2] / 2
	b.ReportMetric(float64(half.Nanoseconds())/1e3, "engine-µs")
	b.ReportMetric(float64(raw.Nanoseconds())/1e3, "raw-µs")
	b.ReportMetric(float64(half)/float64(raw), "engine/raw")
}
