package appliance

import (
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
	"github.com/taproce/taproce/appliance/impair"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/station"
	"github.com/taproce/taproce/internal/spin"
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
	// ReadSpin is how the port's reader waits for frames: it busy-polls
	// the TAP for this long before it sleeps; 0 sleeps at once, a
	// negative value never sleeps (see tap.Tap.SetSpin).
	ReadSpin time.Duration
	// Loop, when set, reads the device in its passes (tap.Tap.TryReadEach)
	// instead of a reader goroutine of the port's own: the appliance's one
	// polling loop. A blocking loop sleeps on the TAP's descriptor, which
	// OpenPort then keeps out of the Go runtime's poller (tap.Config
	// Unpolled); a device without one (a fake) keeps a reader goroutine.
	// ReadSpin then does not apply.
	Loop *spin.Loop
	// AckDelay is how long the NIC's transport lets a positive
	// acknowledgement wait for a frame to go out with
	// (transport.Config.AckDelay); 0 sends each at once.
	AckDelay time.Duration
	// Ingress and Egress impair the frames the port receives and sends.
	Ingress, Egress impair.Spec
	// Capture, when set, records every frame the port sends and receives:
	// sent frames after egress impairment (what goes on the wire), received
	// ones as they come off the wire, before ingress impairment — where
	// tcpdump on the interface would see them.
	Capture *capture.Writer
	// Handler receives the RoCEv2 packets addressed to the port, on the
	// goroutine that reads the port — its reader, or the polling Loop,
	// which it then holds up: it must not wait long, nor close the port
	// (Close waits for that goroutine). frame is valid only during the
	// call.
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
	Station            station.Stats
}

// Port is a NIC port: a TAP device in a namespace, the station behind it,
// and fault injection in both directions.
type Port struct {
	cfg PortConfig
	dev tap.Device
	st  *station.Station
	log *slog.Logger

	ingress, egress *impair.Impairer
	egressMu        sync.Mutex
	ingressMu       sync.Mutex  // serialises station input from the reader and the flusher
	rxPkt           roce.Packet // descriptor of the frame being delivered, under ingressMu
	ctl             []byte      // headroom + one frame, for station and impaired sends
	ctlBufs         [][]byte    // the one-element batch holding ctl, under egressMu

	rxFrames, rxBytes, txFrames, txBytes, txErrors, rxErrors atomic.Uint64

	txq       txQueue     // SendAsync's queue and writer state
	inlineAll bool        // SendAsync writes every batch at once (a blocking loop's port)
	down      atomic.Bool // the last read failed

	// Read by a polling loop (PortConfig.Loop) instead of readLoop.
	tr        tryReader
	onFrameFn func([]byte) // p.onFrame, made once
	unpoll    func()       // takes pollOnce out of the loop
	retryAt   time.Time    // after a failed read, when to read again

	closeOnce sync.Once
	done      chan struct{}
	wg        sync.WaitGroup
}

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
		// A blocking loop sleeps on the descriptor itself; in the
		// runtime's poller too, every frame would also wake the runtime.
		Unpolled: cfg.Loop.Blocking(),
	})
	if err != nil {
		return nil, fmt.Errorf("port %s/%s: %w", cfg.Namespace, cfg.Name, err)
	}
	dev.SetSpin(cfg.ReadSpin)
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
		p.ingress = impair.New(cfg.Ingress)
	}
	if cfg.Egress.Enabled() {
		p.egress = impair.New(cfg.Egress)
	}
	st, err := station.New(station.Config{MAC: cfg.MAC, Addrs: cfg.Addrs, Send: p.sendOne, Resolver: cfg.Resolver})
	if err != nil {
		return nil, fmt.Errorf("port %s/%s: %w", cfg.Namespace, cfg.Name, err)
	}
	p.st = st
	p.txq.items = make(chan txItem, txQueueLen)
	p.inlineAll = cfg.Loop.Blocking()
	p.wg.Add(1)
	go p.writeLoop()
	tr, ok := dev.(tryReader)
	fd, hasFd := dev.(fdDevice)
	switch {
	case ok && cfg.Loop.Blocking() && hasFd:
		// The loop sleeps on the device's descriptor.
		p.tr, p.onFrameFn = tr, p.onFrame
		p.unpoll = cfg.Loop.AddSleeper(p.pollOnce, spin.Sleeper{Fd: fd.Fd()})
	case ok && cfg.Loop != nil && !cfg.Loop.Blocking():
		p.tr, p.onFrameFn = tr, p.onFrame
		p.unpoll = cfg.Loop.Add(p.pollOnce)
	default:
		// A reader of its own, sleeping in the runtime's poller (a device
		// a blocking loop cannot sleep on: a fake in tests).
		p.wg.Add(1)
		go p.readLoop()
	}
	if holds(cfg.Ingress) || holds(cfg.Egress) {
		p.wg.Add(1)
		go p.flushLoop()
	}
	st.Announce()
	p.log.Info("port up", "mac", cfg.MAC, "addrs", cfg.Addrs, "mtu", cfg.MTU)
	return p, nil
}

// holds reports whether an impairment holds frames back for later, so
// that someone must release them when they fall due.
func holds(s impair.Spec) bool { return s.Delay > 0 || s.Reorder > 0 }

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
		Station: p.st.Stats(),
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
		if p.unpoll != nil {
			p.unpoll()
		}
		err = p.dev.Close()
		p.wg.Wait()
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
		p.egress.Apply(frame, time.Now(), p.writeCtlLocked)
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

// frameReader is a device that hands out frames in place (tap.Tap).
type frameReader interface {
	ReadEach(fn func(frame []byte)) (int, error)
}

// fdDevice is a device whose descriptor a blocking loop can sleep on
// (tap.Tap opened Unpolled).
type fdDevice interface{ Fd() int }

// tryReader is a device a polling loop can read: in place, never waiting
// (tap.Tap).
type tryReader interface {
	TryReadEach(fn func(frame []byte)) (int, error)
}

// pollOnce is the port's part of a pass of its polling loop: one read that
// never waits. It reports whether it found frames. After a failed read the
// port is down and reads again only a millisecond later, so that a device
// that fails at once every time does not hold up the loop's other work.
func (p *Port) pollOnce() bool {
	if p.down.Load() && time.Now().Before(p.retryAt) {
		return false
	}
	n, err := p.tr.TryReadEach(p.onFrameFn)
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

func (p *Port) readLoop() {
	defer p.wg.Done()
	if fr, ok := p.dev.(frameReader); ok {
		onFrame := p.onFrame
		for {
			if _, err := fr.ReadEach(onFrame); err != nil {
				if p.readFailed(err) {
					return
				}
				continue
			}
			p.linkUp()
		}
	}
	batch := p.dev.BatchSize()
	bufs := make([][]byte, batch)
	sizes := make([]int, batch)
	for i := range bufs {
		bufs[i] = make([]byte, tap.Headroom+p.cfg.MTU+roce.EthernetLen)
	}
	for {
		n, err := p.dev.Read(bufs, sizes, tap.Headroom)
		for i := 0; i < n; i++ {
			p.onFrame(bufs[i][tap.Headroom : tap.Headroom+sizes[i]])
		}
		if err != nil {
			if p.readFailed(err) {
				return
			}
			continue
		}
		p.linkUp()
	}
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
// to the station and the handler.
func (p *Port) onFrame(frame []byte) {
	p.rxFrames.Add(1)
	p.rxBytes.Add(uint64(len(frame)))
	if p.cfg.Capture != nil {
		_ = p.cfg.Capture.WriteFrame(time.Now(), frame)
	}
	p.ingressMu.Lock()
	if p.ingress != nil {
		p.ingress.Apply(frame, time.Now(), p.deliverLocked)
	} else {
		p.deliverLocked(frame)
	}
	p.ingressMu.Unlock()
}

// readFailed logs a read error and reports whether the reader must stop.
func (p *Port) readFailed(err error) bool {
	if errors.Is(err, tap.ErrClosed) {
		return true
	}
	select {
	case <-p.done:
		return true
	default:
	}
	p.linkDown(err)
	time.Sleep(time.Millisecond) // a device that fails at once every time must not spin
	return false
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

// deliverLocked passes one received frame to the station and, when it is a
// RoCEv2 packet for the port, to the handler. ingressMu is held.
func (p *Port) deliverLocked(frame []byte) {
	if p.st.Input(frame, &p.rxPkt) == station.Deliver && p.cfg.Handler != nil {
		p.cfg.Handler(frame, &p.rxPkt)
	}
}

// flushLoop releases delayed and reordered frames when they fall due.
// Ingress frames released here go through the station on this goroutine,
// serialised with the reader by ingressMu.
func (p *Port) flushLoop() {
	defer p.wg.Done()
	tick := time.NewTicker(100 * time.Microsecond)
	defer tick.Stop()
	for {
		select {
		case <-p.done:
			return
		case now := <-tick.C:
			if p.egress != nil {
				p.egressMu.Lock()
				p.egress.Flush(now, p.writeCtlLocked)
				p.egressMu.Unlock()
			}
			if p.ingress != nil {
				p.ingressMu.Lock()
				p.ingress.Flush(now, p.deliverLocked)
				p.ingressMu.Unlock()
			}
		}
	}
}
