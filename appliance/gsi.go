package appliance

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/transport"
)

// A NIC's QP1 (the GSI, IBA 13.5) is its engine's (transport.GSIHandler,
// transport.Engine.SendMAD): the NIC gives the port's connection manager
// the MADs that arrive (SetGSI) and sends the manager's, finding the
// destination's MAC as it finds a QP's — the NIC's on the local switch,
// else the station's neighbour resolution — without making the manager
// wait for an ARP exchange: a MAD whose destination is not resolved yet
// waits in a bounded queue while a goroutine resolves it.

// MADDropReason says why a NIC dropped a MAD it was given to send.
type MADDropReason int

// Reasons a NIC drops a MAD it was given to send.
const (
	MADDropQueueFull  MADDropReason = iota // too many MADs wait for their destinations' MACs
	MADDropUnresolved                      // the destination's MAC did not resolve
	MADDropInvalid                         // the engine refused it: its size, its addresses (transport.ErrMADSize, ErrMADAddress)
	NumMADDropReasons                      // how many reasons there are
)

var madDropNames = [NumMADDropReasons]string{"queue_full", "unresolved", "invalid"}

// String names the reason as metrics label it.
func (r MADDropReason) String() string {
	if r < 0 || r >= NumMADDropReasons {
		return fmt.Sprintf("reason_%d", int(r))
	}
	return madDropNames[r]
}

// GSIStats counts what a NIC did with the MADs it was given to send; the
// engine counts those it sent and received (transport.Stats).
type GSIStats struct {
	// Queued counts the MADs that waited for their destination's MAC;
	// Dropped, by reason, those the NIC did not send.
	Queued  uint64
	Dropped [NumMADDropReasons]uint64
}

// ErrMADQueueFull is SendMAD's error when too many MADs wait for their
// destinations' MACs (maxPendingMADs).
var ErrMADQueueFull = errors.New("appliance: too many MADs wait for address resolution")

// maxPendingMADs bounds the MADs a NIC holds while it resolves their
// destinations; madResolveTimeout bounds one resolution, longer than the
// station's own (three requests a second apart) and than a redirected
// port's (redirect.DefaultResolveTimeout, 5 s).
const (
	maxPendingMADs    = 256
	madResolveTimeout = 6 * time.Second
)

// madQueue holds the MADs waiting for their destinations' MACs, by
// destination, in order.
type madQueue struct {
	mu      sync.Mutex
	pending map[netip.Addr][]pendingMAD
	n       int  // MADs in pending
	closed  bool // the NIC is closing: no more resolutions
	wg      sync.WaitGroup
	ctx     context.Context // ends when the NIC closes
	cancel  context.CancelFunc
	queued  atomic.Uint64
	dropped [NumMADDropReasons]atomic.Uint64
}

type pendingMAD struct {
	src netip.Addr
	mad [transport.MADSize]byte
}

func (q *madQueue) init() {
	q.pending = map[netip.Addr][]pendingMAD{}
	q.ctx, q.cancel = context.WithCancel(context.Background())
}

// close stops the resolutions and waits for them; their MADs are
// dropped as unresolved.
func (q *madQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cancel()
	q.wg.Wait()
}

// SetGSI sets the receiver of the MADs that arrive for the port's QP1
// (transport.Engine.SetGSI, where the handler's contract is); nil drops
// them, counted as no_handler.
func (n *NIC) SetGSI(h transport.GSIHandler) {
	if e := n.engine.Load(); e != nil {
		e.SetGSI(h)
	}
}

// GSIStats returns a snapshot of the counters of the MADs the NIC was
// given to send.
func (n *NIC) GSIStats() GSIStats {
	var s GSIStats
	s.Queued = n.mads.queued.Load()
	for r := range s.Dropped {
		s.Dropped[r] = n.mads.dropped[r].Load()
	}
	return s
}

// SendMAD sends mad, transport.MADSize bytes, from the port's QP1 to
// dst's QP1, from the port's GID src (the zero Addr: the engine's pick,
// transport.Engine.SendMAD). It does not wait for address resolution:
// when dst's MAC is known — another NIC of the local switch, this one, a
// neighbour the station holds — the MAD goes out at once; otherwise it
// waits, with at most maxPendingMADs others, while a goroutine resolves
// dst (NIC.Resolve), behind the MADs already waiting for the same
// destination, and is dropped if that fails. It fails with
// transport.ErrMADSize or ErrMADAddress for a MAD it can never send, and
// ErrMADQueueFull; every MAD it drops is counted by reason (GSIStats).
// MADs are datagrams: one that leaves is not known to arrive.
func (n *NIC) SendMAD(src, dst netip.Addr, mad []byte) error {
	e := n.engine.Load()
	if len(mad) != transport.MADSize {
		n.mads.dropped[MADDropInvalid].Add(1)
		return fmt.Errorf("appliance: %w, not %d", transport.ErrMADSize, len(mad))
	}
	dst = dst.Unmap()
	q := &n.mads
	q.mu.Lock()
	if _, waiting := q.pending[dst]; !waiting {
		q.mu.Unlock()
		if mac, ok := n.knownMAC(dst); ok {
			return n.sendMAD(e, src, dst, mac, mad)
		}
		q.mu.Lock()
	}
	if q.closed {
		q.mu.Unlock()
		q.dropped[MADDropUnresolved].Add(1)
		return fmt.Errorf("appliance: MAD to %v: %w", dst, ErrClosed)
	}
	if q.n >= maxPendingMADs {
		q.mu.Unlock()
		q.dropped[MADDropQueueFull].Add(1)
		return fmt.Errorf("appliance: MAD to %v: %w", dst, ErrMADQueueFull)
	}
	list, waiting := q.pending[dst]
	p := pendingMAD{src: src}
	copy(p.mad[:], mad)
	q.pending[dst] = append(list, p)
	q.n++
	q.queued.Add(1)
	if !waiting {
		q.wg.Add(1)
		go n.resolveMADs(e, dst)
	}
	q.mu.Unlock()
	return nil
}

// knownMAC returns the MAC of dst when it is known without asking the
// network: a NIC of the local switch (or this one), or a neighbour the
// station holds.
func (n *NIC) knownMAC(dst netip.Addr) (roce.MAC, bool) {
	if peer := n.route(dst); peer != nil {
		return peer.port.MAC(), true
	}
	return n.port.Station().Lookup(dst)
}

// sendMAD hands a MAD to the engine, counting a refusal.
func (n *NIC) sendMAD(e *transport.Engine, src, dst netip.Addr, mac roce.MAC, mad []byte) error {
	if err := e.SendMAD(src, dst, mac, mad); err != nil {
		n.mads.dropped[MADDropInvalid].Add(1)
		return fmt.Errorf("appliance: %w", err)
	}
	return nil
}

// resolveMADs resolves dst and sends the MADs that wait for it, or drops
// them when it does not resolve.
func (n *NIC) resolveMADs(e *transport.Engine, dst netip.Addr) {
	q := &n.mads
	defer q.wg.Done()
	ctx, cancel := context.WithTimeout(q.ctx, madResolveTimeout)
	mac, err := n.Resolve(ctx, dst)
	cancel()
	q.mu.Lock()
	list := q.pending[dst]
	delete(q.pending, dst)
	q.n -= len(list)
	q.mu.Unlock()
	if err != nil {
		q.dropped[MADDropUnresolved].Add(uint64(len(list)))
		n.port.log.Debug("MADs dropped: destination unresolved", "dst", dst, "mads", len(list), "err", err)
		return
	}
	for i := range list {
		_ = n.sendMAD(e, list[i].src, dst, mac, list[i].mad[:])
	}
}
