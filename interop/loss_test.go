package interop

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/internal/perf"
	"github.com/taproce/taproce/verbs/abi"
)

// This file runs the perftest matrix at path MTU 1024 and ibv_rc_pingpong
// while each side loses 1 % of the frames it sends: netem in the VM
// drops rxe's (sparing its ACKs in the ping-pong runs, see netemCommand),
// the impairment of taproce's port (internal/impair, seeded) drops
// taproce's. Every run must still end
// well; retransmissions after ACK timeouts and PSN sequence error NAKs
// are the expected recovery, any other NAK, an RNR NAK or an exhausted retry
// count is a failure.

// lossRate is the share of its frames each side loses on the way out.
const lossRate = 0.01

// lossSeed seeds the port's impairment, so that taproce loses the same
// frames of the same sequence in every run; netem in the VM is not seeded.
const lossSeed = 7

// lossIters are the iterations of the runs under loss: more than
// perfIters for the small sizes, where a run costs little more than its
// start, so that losses hit them too; as few for the large ones.
func lossIters(size int) int {
	switch {
	case size >= 1<<20:
		return 5
	case size >= 64<<10:
		return 10
	case size >= 4<<10:
		return 50
	}
	return 100
}

// lossCases are perfCases under loss.
func lossCases() []perfCase {
	cs := perfCases()
	for i := range cs {
		cs[i].loss = lossRate
	}
	return cs
}

// lossPingpongs are the ibv_rc_pingpong runs under loss: messages of
// four packets (a lost last one costs an ACK timeout) and of 64.
var lossPingpongs = []ppCase{
	{typ: abi.RC, mtu: 1024, size: 4096, iters: 100},
	{typ: abi.RC, mtu: 1024, size: 65536, iters: 10},
}

// The VM's loss comes in two forms. In the first, netem as eth0's root
// qdisc loses lossRate of every frame rxe sends. The second spares rxe's
// RC Acknowledge packets (BTH opcode 0x11, ACKs and NAKs): a prio qdisc
// whose u32 filter sends them to a band of their own, and netem on the
// other band. It is for the ping-pong runs (ib_write_lat, ib_send_lat,
// ibv_rc_pingpong), which end without a closing handshake: each side
// destroys its QP as soon as its own last completion is in, so when rxe's
// acknowledgement of taproce's last message (or of the one before, which
// the peer's last message overtakes) is lost, taproce retransmits to a QP
// that no longer exists, and retries forever with the retry_cnt of 7 that
// rxe and taproce take as infinite. Between two rxe the same race leaves
// the same hang. The other way round, taproce's lost acknowledgements
// are answered again by its QPs' linger (transport.Engine.Close), so
// taproce's own loss stays whole.

// netemLoss is the netem arguments of lossRate.
func netemLoss() string {
	return "netem loss " + strconv.FormatFloat(lossRate*100, 'g', -1, 64) + "%"
}

// netemCommand is the qdisc that makes the VM lose frames; with spareACKs
// its RC Acknowledge packets are not lost.
func netemCommand(spareACKs bool) string {
	if !spareACKs {
		return "tc qdisc del dev eth0 root 2>/dev/null; tc qdisc add dev eth0 root " + netemLoss()
	}
	return "tc qdisc del dev eth0 root 2>/dev/null; " +
		"tc qdisc add dev eth0 root handle 1: prio bands 2 priomap 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 && " +
		"tc qdisc add dev eth0 parent 1:2 handle 20: " + netemLoss() + " && " +
		// IPv4 (no options), UDP to port 4791, BTH opcode at byte 28.
		"tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip protocol 17 0xff match ip dport 4791 0xffff match u8 0x11 0xff at 28 flowid 1:1"
}

// peerLoss is the VM's loss for the rest of a test (withPeerLoss).
type peerLoss struct {
	t       *testing.T
	p       *Peer
	set     bool
	spare   bool   // the qdisc in place spares ACKs
	spared  bool   // the form that spares ACKs was used
	dropped uint64 // what the qdiscs replaced had dropped
	acks    uint64 // the ACKs the filters replaced had spared
}

// withPeerLoss makes the VM lose lossRate of the frames it sends for the
// rest of the test, every frame until told otherwise (peerLoss.use).
// After the test, whether it passes or fails, it removes the qdisc, and
// reports an error when netem dropped nothing, or when the form that
// spares ACKs was used and its filter never matched one.
func withPeerLoss(t *testing.T, p *Peer) *peerLoss {
	t.Helper()
	l := &peerLoss{t: t, p: p}
	t.Cleanup(func() {
		dropped, acks, err := l.counts("tc qdisc del dev eth0 root")
		switch {
		case err != nil:
			t.Errorf("removing the VM's netem qdisc: %v", err)
		case dropped == 0:
			t.Error("netem in the VM dropped no frame")
		case l.spared && acks == 0:
			t.Error("the VM's filter that spares ACKs never matched one")
		default:
			t.Logf("netem in the VM dropped %d frames; its filter spared %d ACKs", dropped, acks)
		}
	})
	l.use(false)
	// A restarted VM has no qdisc: the one in place goes back (its drops
	// so far are lost with the VM).
	remove := p.OnRestart(func(ctx context.Context) error {
		if _, stderr, err := p.Exec(ctx, netemCommand(l.spare)); err != nil {
			return fmt.Errorf("%w: %s", err, stderr)
		}
		return nil
	})
	t.Cleanup(remove)
	return l
}

// use puts the form of loss in place: with spareACKs, the one that spares
// rxe's ACKs. The qdisc's counts so far are kept.
func (l *peerLoss) use(spareACKs bool) {
	l.t.Helper()
	if l.set && l.spare == spareACKs {
		return
	}
	l.spared = l.spared || spareACKs
	if l.set {
		if _, _, err := l.counts(""); err != nil {
			l.t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, stderr, err := l.p.Exec(ctx, netemCommand(spareACKs)); err != nil {
		l.t.Fatalf("%v: %s", err, stderr)
	}
	l.set, l.spare = true, spareACKs
}

// counts adds the counts of the qdisc in place to the ones before it,
// then runs then, and returns the totals.
func (l *peerLoss) counts(then string) (dropped, acks uint64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := "tc -s qdisc show dev eth0; tc -s filter show dev eth0"
	if then != "" {
		cmd += "; " + then
	}
	out, stderr, err := l.p.Exec(ctx, cmd)
	l.t.Logf("VM qdisc:\n%s", strings.TrimSpace(out))
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %s", err, stderr)
	}
	n, err := netemDropped(out)
	if err != nil {
		return 0, 0, err
	}
	l.dropped += n
	l.acks += filterMatched(out)
	return l.dropped, l.acks, nil
}

// netemDropped returns how many frames the netem qdisc has dropped from
// the output of `tc -s qdisc show`: the count of the netem qdisc's own
// statistics, whether it is the root or a prio band's.
func netemDropped(out string) (uint64, error) {
	_, netem, ok := strings.Cut(out, "qdisc netem")
	if !ok {
		return 0, fmt.Errorf("interop: no netem qdisc on the VM's eth0:\n%s", out)
	}
	_, rest, ok := strings.Cut(netem, "(dropped ")
	if !ok {
		return 0, fmt.Errorf("interop: no statistics of the VM's netem qdisc:\n%s", out)
	}
	n, err := strconv.ParseUint(rest[:strings.Index(rest+",", ",")], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("interop: netem statistics %q: %w", out, err)
	}
	return n, nil
}

// filterMatched returns how many packets the u32 filters matched, from
// the output of `tc -s filter show`: the sum of their "success" counts.
func filterMatched(out string) uint64 {
	var n uint64
	for _, line := range strings.Split(out, "\n") {
		_, rest, ok := strings.Cut(line, "(rule hit ")
		if !ok {
			continue
		}
		_, rest, ok = strings.Cut(rest, " success ")
		if !ok {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), ")"), 10, 64)
		if err == nil {
			n += v
		}
	}
	return n
}

// lossErrorCounters are the rxe counters that must not move under loss
// either: RNR NAKs, exhausted retries, send failures. Sequence errors
// (out_of_seq_request, rcvd_seq_err) and retries (completer_retry_err,
// after a NAK or an ACK timeout) are the recovery from loss.
var lossErrorCounters = []string{
	"rcvd_rnr_err", "send_rnr_err", "retry_exceeded_err", "retry_rnr_exceeded_err", "send_err", "link_downed",
}

// seqNAK is the syndrome of a PSN sequence error NAK.
const seqNAK = roce.SyndromeNAK | roce.NAKPSNSequenceError

// checkLoss checks a run under loss from the rig's counters before (s0)
// and after (s1) it and rxe's: no rxe error counter of lossErrorCounters
// moved, no NAK other than a PSN sequence error and no RNR NAK went
// either way on the port's wire, and neither side accepted more packets
// than the other sent. It returns what was lost and how it was
// recovered.
func checkLoss(t *testing.T, s0, s1 rigSnap, before, after Counters) *Recovery {
	t.Helper()
	d := after.Sub(before)
	a, b := s0.stats, s1.stats
	w := s1.wire.sub(s0.wire)
	received := b.Received - a.Received
	rec := &Recovery{
		TaproceLost:        s1.port.Egress.Dropped - s0.port.Egress.Dropped,
		SeqNAKsSent:        w.sent[seqNAK],
		SeqNAKsReceived:    w.received[seqNAK],
		TaproceTimeouts:    b.Timeouts - a.Timeouts,
		RxeRetries:         d["completer_retry_err"],
		TaproceRetransmits: b.Retransmits - a.Retransmits,
	}
	if d["sent_pkts"] > received {
		rec.RxeLost = d["sent_pkts"] - received
	}
	t.Logf("rxe counters: %v", d)
	logOurs(t, s0, s1)
	t.Logf("lost: %d frames taproce sent (its port's impairment), %d RoCE packets rxe sent (netem); NAKs on the port's wire: taproce's %v, rxe's %v",
		rec.TaproceLost, rec.RxeLost, &w.sent, &w.received)
	for _, k := range lossErrorCounters {
		if d[k] != 0 {
			t.Errorf("rxe counter %s rose by %d", k, d[k])
		}
	}
	for _, x := range []struct {
		who    string
		counts *synCounts
	}{{"taproce", &w.sent}, {"rxe", &w.received}} {
		for syn, n := range x.counts {
			if s := roce.Syndrome(syn); n != 0 && s != seqNAK {
				t.Errorf("%s sent %d %v", x.who, n, s)
			}
		}
	}
	if n := b.RNRNAKsSent - a.RNRNAKsSent + b.RNRNAKsReceived - a.RNRNAKsReceived; n != 0 {
		t.Errorf("taproce sent or received %d RNR NAKs", n)
	}
	if sent := b.Sent - a.Sent; d["rcvd_pkts"] > sent {
		t.Errorf("taproce sent %d packets, rxe accepted %d", sent, d["rcvd_pkts"])
	}
	if d["sent_pkts"] < received {
		t.Errorf("rxe sent %d packets, taproce received %d", d["sent_pkts"], received)
	}
	if n := vmDropped(s0, s1); n > 0 {
		t.Logf("the VM's TAP dropped %d frames during this run", n)
	}
	return rec
}

// lossCheck is checkLoss as a counterCheck, for the pingpongs; rec is its
// account once finish ran.
type lossCheck struct {
	r   *perfRig
	s0  rigSnap
	rec *Recovery
}

func (c *lossCheck) finish(t *testing.T, before, after Counters) {
	t.Helper()
	c.rec = checkLoss(t, c.s0, c.r.snap(), before, after)
}

// TestPerftestLoss: the perftest matrix of TestPerftest at path MTU 1024
// (every test both ways at 2 B, 4 KiB, 64 KiB and 1 MiB, lossIters
// iterations; both atomics) and ibv_rc_pingpong with -c on both sides,
// both ways, while rxe and taproce each lose 1 % of the frames they send
// (rxe's ACKs spared in the ping-pong runs: peerLoss). Each run must end with exit status 0 and the right result lines on both
// sides, and the counters must show only the recovery from loss
// (checkLoss). Recorded in the results file with their loss and recovery.
func TestPerftestLoss(t *testing.T) {
	p, _ := needPeer(t)
	r := newPerfRig(t, rigConfig{egress: impair.Spec{Loss: lossRate, Seed: lossSeed}})
	recordPerf(t)
	r.reach(t, p)
	loss := withPeerLoss(t, p)
	for _, c := range lossCases() {
		pp := c.test().Kind == perf.Lat && (c.test().Verb == perf.Write || c.test().Verb == perf.Send)
		loss.use(pp)
		t.Run(c.name()+"/vm-server", func(t *testing.T) { perfVMServer(t, p, r, c, 1024, perfRec) })
		t.Run(c.name()+"/vm-client", func(t *testing.T) { perfVMClient(t, p, r, c, 1024, perfRec) })
	}
	loss.use(true) // ibv_rc_pingpong
	var last *lossCheck
	side := toolSide{bin: r.bin, sock: r.sock, local: perfAddr.Addr(), check: func(int) counterCheck {
		last = &lossCheck{r: r, s0: r.snap()}
		return last
	}}
	for _, c := range lossPingpongs {
		for _, x := range []struct {
			role, vm string // taproce's role, the VM's
			run      func(*testing.T, *Peer, toolSide, ppCase)
		}{{"client", "vm-server", toolVMServer}, {"server", "vm-client", toolVMClient}} {
			t.Run(c.tool()+"/"+c.name()+"/"+x.vm, func(t *testing.T) {
				last = nil
				rec := PerfResult{Tool: c.tool(), Args: "-c", Taproce: x.role, MTU: c.mtu, Size: c.size, Iters: c.iters, Loss: lossRate}
				defer func() {
					rec.Pass = !t.Failed()
					if last != nil {
						rec.Recovery = last.rec
					}
					perfRec.add(rec)
				}()
				x.run(t, p, side, c)
			})
		}
	}
	// The loss happened on taproce's side (withPeerLoss checks the VM's).
	if n := r.nic.Port().Stats().Egress.Dropped; n == 0 {
		t.Error("the port's impairment dropped no frame")
	} else {
		t.Logf("the port's impairment dropped %d frames", n)
	}
}

// synCounts counts acknowledgements by AETH syndrome.
type synCounts [256]uint64

// String lists the counts that are not 0.
func (c *synCounts) String() string {
	var parts []string
	for s, n := range c {
		if n != 0 {
			parts = append(parts, fmt.Sprintf("%v×%d", roce.Syndrome(s), n))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// wireCounts are the NAKs and RNR NAKs a port sent and received, by
// syndrome (ACKs are not counted).
type wireCounts struct {
	sent, received synCounts
}

func (c wireCounts) sub(o wireCounts) wireCounts {
	for i := range c.sent {
		c.sent[i] -= o.sent[i]
		c.received[i] -= o.received[i]
	}
	return c
}

// wireTally counts the NAKs and RNR NAKs on a port's wire. It is the
// io.Writer under the port's capture (capture.NewWriter): it reads the
// pcap stream as it comes and keeps no frames.
type wireTally struct {
	local netip.Addr
	flush func() error // the capture's Flush, so that counts sees every frame

	mu     sync.Mutex
	buf    []byte
	header bool // the pcap file header has been read
	c      wireCounts
	pkt    roce.Packet
}

func newWireTally(local netip.Addr) *wireTally { return &wireTally{local: local} }

// pcap sizes: the file header and a record's header, whose third word is
// the captured length.
const (
	pcapFileHeaderLen   = 24
	pcapRecordHeaderLen = 16
)

// Write takes the next bytes of the pcap stream.
func (w *wireTally) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	rest := w.buf
	if !w.header {
		if len(rest) < pcapFileHeaderLen {
			return len(b), nil
		}
		rest, w.header = rest[pcapFileHeaderLen:], true
	}
	for len(rest) >= pcapRecordHeaderLen {
		n := int(binary.LittleEndian.Uint32(rest[8:12]))
		if len(rest) < pcapRecordHeaderLen+n {
			break
		}
		w.frame(rest[pcapRecordHeaderLen : pcapRecordHeaderLen+n])
		rest = rest[pcapRecordHeaderLen+n:]
	}
	w.buf = append(w.buf[:0], rest...)
	return len(b), nil
}

// frame counts one frame's NAK or RNR NAK.
func (w *wireTally) frame(f []byte) {
	if roce.Parse(f, &w.pkt) != nil || !w.pkt.Info().Has(roce.HasAETH) {
		return
	}
	syn := w.pkt.AETH.Syndrome
	if syn.Kind() == roce.SyndromeACK {
		return
	}
	if w.pkt.Src == w.local {
		w.c.sent[syn]++
	} else {
		w.c.received[syn]++
	}
}

// counts returns the counts so far (zero for a nil tally).
func (w *wireTally) counts() wireCounts {
	if w == nil {
		return wireCounts{}
	}
	if w.flush != nil {
		_ = w.flush()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c
}

// TestWireTally feeds the tally a port's capture of ACKs, NAKs and an RNR
// NAK both ways, written in pieces of every size, and checks its counts.
func TestWireTally(t *testing.T) {
	local, remote := netip.MustParseAddr("10.99.0.14"), netip.MustParseAddr("10.99.0.20")
	frames := []struct {
		src, dst netip.Addr
		op       roce.Opcode
		syn      roce.Syndrome
	}{
		{local, remote, roce.RCAcknowledge, roce.SyndromeACK | 31},
		{local, remote, roce.RCAcknowledge, seqNAK},
		{remote, local, roce.RCAcknowledge, seqNAK},
		{remote, local, roce.RCAcknowledge, roce.SyndromeNAK | roce.NAKRemoteAccessError},
		{remote, local, roce.RCAtomicAcknowledge, roce.SyndromeACK},
		{local, remote, roce.RCAcknowledge, roce.SyndromeRNRNAK | 14},
		{local, remote, roce.RCSendOnly, 0},
	}
	var buf bytes.Buffer
	cw, err := capture.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range frames {
		p := roce.Packet{Src: f.src, Dst: f.dst, TTL: 64, SrcPort: 0xC000, DstPort: roce.UDPPort}
		p.BTH.Opcode, p.BTH.DestQP = f.op, 0x11
		p.AETH.Syndrome = f.syn
		b := make([]byte, p.FrameLen())
		n, err := p.Encode(b)
		if err != nil {
			t.Fatal(err)
		}
		if err := cw.WriteFrame(time.Unix(0, 0), b[:n]); err != nil {
			t.Fatal(err)
		}
	}
	if err := cw.Flush(); err != nil {
		t.Fatal(err)
	}
	stream := buf.Bytes()
	for _, piece := range []int{1, 7, 16, 100, len(stream)} {
		t.Run(fmt.Sprint(piece), func(t *testing.T) {
			w := newWireTally(local)
			for s := stream; len(s) > 0; {
				n := min(piece, len(s))
				if _, err := w.Write(s[:n]); err != nil {
					t.Fatal(err)
				}
				s = s[n:]
			}
			var want wireCounts
			want.sent[seqNAK], want.sent[roce.SyndromeRNRNAK|14] = 1, 1
			want.received[seqNAK], want.received[roce.SyndromeNAK|roce.NAKRemoteAccessError] = 1, 1
			if got := w.counts(); got != want {
				t.Errorf("sent %v received %v, want %v and %v", &got.sent, &got.received, &want.sent, &want.received)
			}
		})
	}
}

// prioQdisc and u32Filter are what `tc -s qdisc show` and `tc -s filter
// show` print for the loss that spares ACKs (netemCommand(true)).
const (
	prioQdisc = `qdisc prio 1: root refcnt 2 bands 2 priomap 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1
 Sent 2410 bytes 23 pkt (dropped 12, overlimits 0 requeues 0) 
 backlog 0b 0p requeues 0
qdisc netem 20: parent 1:2 limit 1000 loss 1%
 Sent 1410 bytes 13 pkt (dropped 10, overlimits 0 requeues 0) 
 backlog 0b 0p requeues 0
`
	u32Filter = `filter parent 1: protocol ip pref 1 u32 chain 0 
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 *flowid 1:1 not_in_hw (rule hit 24 success 7)
  match 00110000/00ff0000 at 8 (success 19 ) 
  match 000012b7/0000ffff at 20 (success 9 ) 
  match 11000000/ff000000 at 28 (success 7 ) 
`
)

// TestFilterMatched: the packets the u32 filter that spares ACKs matched,
// from its statistics; none without a filter.
func TestFilterMatched(t *testing.T) {
	if n := filterMatched(prioQdisc + u32Filter); n != 7 {
		t.Errorf("filterMatched = %d, want 7", n)
	}
	if n := filterMatched(prioQdisc); n != 0 {
		t.Errorf("filterMatched without a filter = %d", n)
	}
}

// TestNetemDropped parses netem's statistics, at the root or in a band.
func TestNetemDropped(t *testing.T) {
	for _, c := range []struct {
		out  string
		want uint64
		ok   bool
	}{
		{"qdisc netem 8001: root refcnt 2 limit 1000 loss 1%\n Sent 81247917 bytes 81385 pkt (dropped 844, overlimits 0 requeues 0) \n backlog 0b 0p requeues 0\n", 844, true},
		{"qdisc netem 8001: root refcnt 2 limit 1000 loss 1%\n Sent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0) \n", 0, true},
		{"qdisc pfifo_fast 0: root refcnt 2 bands 3\n Sent 1 bytes 1 pkt (dropped 0, overlimits 0 requeues 0) \n", 0, false},
		{prioQdisc, 10, true},
	} {
		n, err := netemDropped(c.out)
		if n != c.want || (err == nil) != c.ok {
			t.Errorf("%q: %d, %v; want %d, ok %v", c.out, n, err, c.want, c.ok)
		}
	}
}
