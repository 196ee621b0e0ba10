package appliance

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/poll"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/station"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/tap"
)

// PortConfig describes a port.
type PortConfig struct {
	// Namespace names the port's network namespace (for the derived MAC
	// and for logs); Netns is the path of that namespace, empty for the
	// appliance's own.
	Namespace string
	Netns     string
	// Name is the TAP device name (default "roce0").
	Name string
	// MAC is the port's address; zero means DeriveMAC(Namespace, Name).
	MAC roce.MAC
	// Addrs are the port's addresses: its GIDs.
	Addrs []netip.Prefix
	// MTU of the TAP device (default 1500).
	MTU int
	// Offload asks for UDP GSO super-frames on the TAP.
	Offload bool
	// Loop reads the device in its passes (tap.Device.TryReadEach): the
	// appliance's one polling loop. A blocking loop sleeps on the
	// device's descriptor, which OpenPort then keeps out of the Go
	// runtime's poller (tap.Config.Unpolled). Without one the port runs a
	// blocking loop of its own: every port reads its device one way.
	Loop *poll.Loop
	// AckDelay is how long the NIC's transport lets a positive
	// acknowledgement wait for a frame to go out with
	// (transport.Config.AckDelay); 0 sends each at once.
	AckDelay time.Duration
	// LingerQuiet is transport.Config.LingerQuiet (0: its default).
	LingerQuiet time.Duration
	// ECT is transport.Config.ECT.
	ECT bool
	// Ingress and Egress impair the frames the port receives and sends.
	Ingress, Egress impair.Spec
	// Capture, when set, records every frame the port sends and receives:
	// sent frames after egress impairment (what goes on the wire), received
	// ones as they come off the wire, before ingress impairment — where
	// tcpdump on the interface would see them.
	Capture *capture.Writer
	// Handler receives the RoCEv2 packets addressed to the port — parsed,
	// to the port's MAC and one of its addresses, with a good ICRC — on
	// the goroutine of the polling Loop, which it holds up: it must not
	// wait long, nor close the port (Close waits for the loop). frame and
	// p are valid only during the call.
	Handler func(frame []byte, p *roce.Packet)
	// Logger for the port's events (default slog.Default()).
	Logger *slog.Logger
	// OnLink, when set, is told when the port's device fails (up false:
	// a read error) and when it works again (up true), on the goroutine
	// that reads the port, as Handler is.
	OnLink func(up bool)
	// Resolver, when set, makes the port's station silent, for redirect
	// mode: MAC and Addrs are then another stack's (the pod interface's),
	// which answers ARP, ND and echo itself, and the station resolves next
	// hops through the Resolver (see station.Config.Resolver).
	Resolver station.Resolver
}

// DefaultPortName is the TAP name of a port when none is configured.
const DefaultPortName = "roce0"

// DeriveMAC returns the stable MAC of a port: a locally administered
// unicast address hashed from its namespace and device name, so a port
// keeps its MAC across restarts.
func DeriveMAC(namespace, name string) roce.MAC {
	sum := sha256.Sum256([]byte("taproce\x00" + namespace + "\x00" + name))
	var m roce.MAC
	copy(m[:], sum[:6])
	m[0] = m[0]&^0x01 | 0x02
	return m
}

// PortStats counts a port's traffic.
type PortStats struct {
	RxFrames, RxBytes, TxFrames, TxBytes uint64
	// RxErrors counts reads of the device that failed, TxErrors writes.
	RxErrors, TxErrors uint64
	Ingress, Egress    impair.Counters
	// Delivered counts the RoCEv2 packets handed to the Handler; Drops
	// every received frame dropped, by reason, whether the RoCE receive
	// path or the station dropped it.
	Delivered uint64
	Drops     [station.NumDropReasons]uint64
	// Station counts what the station did (its drops are in Drops too).
	Station station.Stats
}

// Port is a NIC port: a TAP device in a namespace, the station behind it,
// and fault injection in both directions.
type Port struct {
	cfg PortConfig
	dev tap.Device
	st  *station.Station
	log *slog.Logger

	ingress, egress *impair.Impairer
	// ingressEarly and egressEarly let a rate-limited direction's frames
	// go up to one flusher period before they are due (linkEarly).
	ingressEarly, egressEarly time.Duration
	egressMu                  sync.Mutex
	ingressMu                 sync.Mutex  // serialises delivery from the loop and the flusher
	rxPkt                     roce.Packet // descriptor of the frame being delivered, under ingressMu
	ctl                       []byte      // headroom + one frame, for station and impaired sends
	ctlBufs                   [][]byte    // the one-element batch holding ctl, under egressMu

	rxFrames, rxBytes, txFrames, txBytes, txErrors, rxErrors atomic.Uint64
	delivered                                                atomic.Uint64
	drops                                                    [station.NumDropReasons]atomic.Uint64

	txq       txQueue     // SendAsync's queue and writer state
	inlineAll bool        // SendAsync writes every batch at once (a blocking loop's port)
	down      atomic.Bool // the last read failed

	// Read by a polling loop (PortConfig.Loop, or the port's own).
	onFrameFn func([]byte) // p.onFrame, made once
	unpoll    func()       // takes pollOnce out of the loop
	retryAt   time.Time    // after a failed read, when to read again
	ownLoop   func() error // stops and releases the port's own loop, nil with PortConfig.Loop

	closeOnce sync.Once
	done      chan struct{}
	wg        sync.WaitGroup
}

// RxQueueFrames is the length of the queue in which the kernel holds the
// frames (or UDP GSO super-frames) bound for a port until the appliance
// reads them; beyond it the kernel drops them (the TAP's tx_dropped).
// RC's window keeps an RC stream far below it; a UC or UD sender has no
// window, and one in the same appliance sends about 1.6 times as fast as
// the port receives (perftest's UC SEND bandwidth in the lab): the
// default 1000 loses part of perftest's 1000 SENDs of 64 KiB, 4096 holds
// them, and -a's 5 SENDs of 8 MiB, with room to spare. A queue of
// super-frames of up to 64 KiB can take 256 MiB of kernel memory at
// worst, only while the appliance falls behind.
const RxQueueFrames = 4096

// OpenPort creates the port's TAP device in its namespace and starts it.
func OpenPort(cfg PortConfig) (*Port, error) {
	cfg = withDefaults(cfg)
	// The TAP device is the station's link, not the station: like the tap
	// of a virtual machine it has an address of its own. Were it the
	// station's, a bridge would keep the station's unicast frames for
	// itself (a bridge port's own address is a local one).
	devMAC := DeriveMAC(cfg.Namespace, cfg.Name+"\x00tap")
	dev, err := tap.Create(tap.Config{
		Name:    cfg.Name,
		Netns:   cfg.Netns,
		MAC:     net.HardwareAddr(devMAC[:]),
		MTU:     cfg.MTU,
		Offload: cfg.Offload,
		// The kernel's queue towards the port absorbs what senders
		// without a window (UC, UD) send faster than the appliance
		// receives, as rxe's unbounded receive queues do.
		TxQueueLen: RxQueueFrames,
		// A blocking loop (the port's own when it has none) sleeps on the
		// descriptor itself; in the runtime's poller too, every frame
		// would also wake the runtime.
		Unpolled: cfg.Loop == nil || cfg.Loop.Blocking(),
	})
	if err != nil {
		return nil, fmt.Errorf("port %s/%s: %w", cfg.Namespace, cfg.Name, err)
	}
	p, err := NewPort(dev, cfg)
	if err != nil {
		dev.Close()
		return nil, err
	}
	return p, nil
}

func withDefaults(cfg PortConfig) PortConfig {
	if cfg.Name == "" {
		cfg.Name = DefaultPortName
	}
	if cfg.MTU == 0 {
		cfg.MTU = 1500
	}
	if cfg.MAC == (roce.MAC{}) {
		cfg.MAC = DeriveMAC(cfg.Namespace, cfg.Name)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// NewPort starts a port on an existing device (a TAP, or a fake in tests).
// The port owns dev from then on.
func NewPort(dev tap.Device, cfg PortConfig) (*Port, error) {
	cfg = withDefaults(cfg)
	p := &Port{
		cfg:     cfg,
		dev:     dev,
		log:     cfg.Logger.With("port", cfg.Namespace+"/"+cfg.Name),
		ctl:     make([]byte, tap.Headroom+cfg.MTU+roce.EthernetLen),
		ctlBufs: make([][]byte, 1),
		done:    make(chan struct{}),
	}
	if cfg.Ingress.Enabled() {
		p.ingress, p.ingressEarly = impair.New(cfg.Ingress), linkEarly(cfg.Ingress)
	}
	if cfg.Egress.Enabled() {
		p.egress, p.egressEarly = impair.New(cfg.Egress), linkEarly(cfg.Egress)
	}
	st, err := station.New(station.Config{MAC: cfg.MAC, Addrs: cfg.Addrs, Send: p.sendOne, Resolver: cfg.Resolver})
	if err != nil {
		return nil, fmt.Errorf("port %s/%s: %w", cfg.Namespace, cfg.Name, err)
	}
	p.st = st
	if cfg.Loop == nil {
		if cfg.Loop, err = p.runOwnLoop(); err != nil {
			return nil, fmt.Errorf("port %s/%s: %w", cfg.Namespace, cfg.Name, err)
		}
		p.cfg.Loop = cfg.Loop
	}
	p.txq.items = make(chan txItem, txQueueLen)
	p.inlineAll = cfg.Loop.Blocking()
	p.wg.Add(1)
	go p.writeLoop()
	p.onFrameFn = p.onFrame
	// A blocking loop sleeps on the device's descriptor; a read that
	// finds nothing costs a system call.
	p.unpoll = cfg.Loop.AddSleeper(p.pollOnce, poll.Sleeper{Fd: dev.Fd(), Costly: true})
	if cfg.Ingress.Holds() || cfg.Egress.Holds() {
		p.wg.Add(1)
		go p.flushLoop()
	}
	st.Announce()
	p.log.Info("port up", "mac", cfg.MAC, "addrs", cfg.Addrs, "mtu", cfg.MTU)
	return p, nil
}

// runOwnLoop starts the blocking loop of a port that was given none.
func (p *Port) runOwnLoop() (*poll.Loop, error) {
	l, err := poll.NewBlockingLoop()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(ctx)
	}()
	p.ownLoop = func() error {
		cancel()
		<-done
		return l.Close()
	}
	return l, nil
}

// Station returns the port's station.
func (p *Port) Station() *station.Station { return p.st }

// MAC returns the port's MAC.
func (p *Port) MAC() roce.MAC { return p.cfg.MAC }

// Device returns the port's device.
func (p *Port) Device() tap.Device { return p.dev }

// Stats returns a snapshot of the port's counters.
func (p *Port) Stats() PortStats {
	s := PortStats{
		RxFrames: p.rxFrames.Load(), RxBytes: p.rxBytes.Load(),
		TxFrames: p.txFrames.Load(), TxBytes: p.txBytes.Load(), RxErrors: p.rxErrors.Load(), TxErrors: p.txErrors.Load(),
		Delivered: p.delivered.Load(), Station: p.st.Stats(),
	}
	for i := range s.Drops {
		s.Drops[i] = p.drops[i].Load() + s.Station.Drops[i]
	}
	if p.ingress != nil {
		s.Ingress = p.ingress.Counters()
	}
	if p.egress != nil {
		s.Egress = p.egress.Counters()
	}
	return s
}

// Close stops the port and removes its device.
func (p *Port) Close() error {
	var err error
	p.closeOnce.Do(func() {
		close(p.done)
		p.unpoll()
		err = p.dev.Close()
		p.wg.Wait()
		if p.ownLoop != nil {
			err = errors.Join(err, p.ownLoop())
		}
	})
	return err
}

// Send transmits frames bufs[i][offset:] (offset ≥ tap.Headroom) through
// the egress impairment and capture, batched into as few writes as the
// device allows.
func (p *Port) Send(bufs [][]byte, offset int) error {
	if p.egress != nil {
		p.egressMu.Lock()
		defer p.egressMu.Unlock()
		now := time.Now()
		for _, b := range bufs {
			p.egress.Apply(b[offset:], now, p.writeCtlLocked)
		}
		if p.egressEarly > 0 {
			p.egress.Flush(now.Add(p.egressEarly), p.writeCtlLocked)
		}
		return nil
	}
	if p.cfg.Capture != nil {
		now := time.Now()
		for _, b := range bufs {
			_ = p.cfg.Capture.WriteFrame(now, b[offset:])
		}
	}
	n, err := p.dev.Write(bufs, offset)
	p.countTx(bufs[:n], offset)
	if err != nil {
		p.txErrors.Add(1)
		return fmt.Errorf("port %s: %w", p.cfg.Name, err)
	}
	return nil
}

func (p *Port) countTx(bufs [][]byte, offset int) {
	var bytes int
	for _, b := range bufs {
		bytes += len(b) - offset
	}
	p.txFrames.Add(uint64(len(bufs)))
	p.txBytes.Add(uint64(bytes))
}

// sendOne sends one frame without headroom (the station's replies).
func (p *Port) sendOne(frame []byte) {
	p.egressMu.Lock()
	defer p.egressMu.Unlock()
	if p.egress != nil {
		now := time.Now()
		p.egress.Apply(frame, now, p.writeCtlLocked)
		if p.egressEarly > 0 {
			p.egress.Flush(now.Add(p.egressEarly), p.writeCtlLocked)
		}
		return
	}
	p.writeCtlLocked(frame)
}

// writeCtlLocked records frame in the capture, copies it behind the
// headroom of the control buffer and writes it. It is the egress
// impairment's emit function, so the capture shows what goes on the
// wire, as tcpdump on an impaired interface would. egressMu is held.
func (p *Port) writeCtlLocked(frame []byte) {
	if p.cfg.Capture != nil {
		_ = p.cfg.Capture.WriteFrame(time.Now(), frame)
	}
	if len(frame) > len(p.ctl)-tap.Headroom {
		p.txErrors.Add(1)
		return
	}
	n := copy(p.ctl[tap.Headroom:], frame)
	p.ctlBufs[0] = p.ctl[:tap.Headroom+n]
	if _, err := p.dev.Write(p.ctlBufs, tap.Headroom); err != nil {
		p.txErrors.Add(1)
		if !errors.Is(err, tap.ErrClosed) {
			p.log.Debug("write failed", "err", err)
		}
		return
	}
	p.txFrames.Add(1)
	p.txBytes.Add(uint64(n))
}

// pollOnce is the port's part of a pass of its polling loop: one read that
// never waits. It reports whether it found frames. After a failed read the
// port is down and reads again only a millisecond later, so that a device
// that fails at once every time does not hold up the loop's other work.
func (p *Port) pollOnce() bool {
	if p.down.Load() && time.Now().Before(p.retryAt) {
		return false
	}
	n, err := p.dev.TryReadEach(p.onFrameFn)
	if err != nil {
		if errors.Is(err, tap.ErrClosed) {
			return false
		}
		p.linkDown(err)
		p.retryAt = time.Now().Add(time.Millisecond)
		return false
	}
	p.linkUp()
	return n > 0
}

// linkUp notes a good read; after a failure it tells OnLink the port
// works again.
func (p *Port) linkUp() {
	if p.down.Load() && p.down.CompareAndSwap(true, false) {
		p.log.Info("port works again")
		if p.cfg.OnLink != nil {
			p.cfg.OnLink(true)
		}
	}
}

// Up reports whether the port's device works (no read error since the
// last good read).
func (p *Port) Up() bool { return !p.down.Load() }

// onFrame takes one frame off the wire: counted, captured, impaired, then
// delivered (deliverLocked).
func (p *Port) onFrame(frame []byte) {
	p.rxFrames.Add(1)
	p.rxBytes.Add(uint64(len(frame)))
	if p.cfg.Capture != nil {
		_ = p.cfg.Capture.WriteFrame(time.Now(), frame)
	}
	p.ingressMu.Lock()
	if p.ingress != nil {
		now := time.Now()
		p.ingress.Apply(frame, now, p.deliverLocked)
		if p.ingressEarly > 0 {
			p.ingress.Flush(now.Add(p.ingressEarly), p.deliverLocked)
		}
	} else {
		p.deliverLocked(frame)
	}
	p.ingressMu.Unlock()
}

// linkDown counts a failed read and, when the port was up, logs it and
// tells OnLink the port is down. A device that keeps failing is read
// again every millisecond: its failures after the first are counted
// (RxErrors) and logged at debug level only, until a read works again.
func (p *Port) linkDown(err error) {
	p.rxErrors.Add(1)
	if !p.down.CompareAndSwap(false, true) {
		p.log.Debug("read failed", "err", err)
		return
	}
	p.log.Warn("read failed: port down until a read works", "err", err)
	if p.cfg.OnLink != nil {
		p.cfg.OnLink(false)
	}
}

// deliverLocked is the port's one receive path for a frame that came off
// the wire (and through the ingress impairment), as the kernel's is for
// rxe: UDP to port 4791 goes to the RoCE receive path (recvRoCE, rxe_recv's
// checks), everything else to the station, which answers ARP, neighbour
// solicitations and echo requests and drops the rest. ingressMu is held.
func (p *Port) deliverLocked(frame []byte) {
	if roce.IsRoCE(frame) {
		p.recvRoCE(frame)
		return
	}
	p.st.Input(frame)
}

// recvRoCE checks a RoCEv2 frame as rxe_recv does — the headers
// (roce.Parse, which checks an IPv4 header's checksum: the one check of
// it), the destination MAC and address, the ICRC — and hands it to the
// Handler; what fails is dropped and counted by reason. ingressMu is held.
func (p *Port) recvRoCE(frame []byte) {
	if roce.Ethernet(frame).Dst() != p.cfg.MAC {
		p.drop(station.DropNotForUs)
		return
	}
	pk := &p.rxPkt
	if err := roce.Parse(frame, pk); err != nil {
		if errors.Is(err, roce.ErrIPChecksum) || errors.Is(err, roce.ErrIPVersion) {
			p.drop(station.DropMalformed)
		} else {
			p.drop(station.DropRoCE)
		}
		return
	}
	if !p.st.Owns(pk.Dst) {
		p.drop(station.DropNotOurIP)
		return
	}
	if pk.VerifyICRC(frame) != nil {
		p.drop(station.DropICRC)
		return
	}
	p.delivered.Add(1)
	if p.cfg.Handler != nil {
		p.cfg.Handler(frame, pk)
	}
}

func (p *Port) drop(r station.DropReason) { p.drops[r].Add(1) }

// flushPeriod is how often the flusher releases held frames that are due.
const flushPeriod = 100 * time.Microsecond

// linkEarly is how long before it is due a frame of a rate-limited
// direction may leave: one flusher period. The Go runtime's timers sleep
// a millisecond or so on an idle host, and a frame held for the 0.8 µs
// a ping takes on a 1 Gb/s link waited for the next tick that long at
// each port it crossed — a ping's round trip of 3.3 ms, a send_lat of
// 1.7 ms; released up to a period early, a frame on an idle link leaves
// at once, and a backlog still leaves at the link's rate, the error
// bounded by the period. A fixed delay keeps its exact due times.
func linkEarly(s impair.Spec) time.Duration {
	if s.Rate > 0 && s.Delay == 0 {
		return flushPeriod
	}
	return 0
}

// flushLoop releases held frames (delayed, reordered or paced by the
// impairment's link) when they fall due.
// Ingress frames released here are delivered on this goroutine,
// serialised with the loop by ingressMu.
func (p *Port) flushLoop() {
	defer p.wg.Done()
	tick := time.NewTicker(flushPeriod)
	defer tick.Stop()
	for {
		select {
		case <-p.done:
			return
		case now := <-tick.C:
			if p.egress != nil {
				p.egressMu.Lock()
				p.egress.Flush(now.Add(p.egressEarly), p.writeCtlLocked)
				p.egressMu.Unlock()
			}
			if p.ingress != nil {
				p.ingressMu.Lock()
				p.ingress.Flush(now.Add(p.ingressEarly), p.deliverLocked)
				p.ingressMu.Unlock()
			}
		}
	}
}
