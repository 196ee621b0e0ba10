package appliance

import (
	"net/netip"

	"github.com/taproce/taproce/appliance/cm"
)

// Every NIC runs the connection manager of its port (cm.Manager, IBA
// vol. 1 ch. 12 with the RDMA CM's conventions): QP1's MADs go to it
// (SetGSI replaces that, for tests of QP1 itself), it sends through
// SendMAD, which never waits, its timers run on a goroutine of the NIC
// that sleeps while none is armed, and its CA GUID is the port's node
// GUID, the MAC's EUI-64, as rxe's. What happens to an ID goes to the
// function SetCMEvents installs (the control server's sessions).

// CM returns the port's connection manager.
func (n *NIC) CM() *cm.Manager { return n.cm }

// SetCMEvents installs f to receive the connection manager's events; nil
// drops them. f is called without the manager's lock and may call it.
func (n *NIC) SetCMEvents(f func(cm.Event)) {
	if f == nil {
		n.cmEv.Store(nil)
		return
	}
	n.cmEv.Store(&f)
}

func (n *NIC) cmEvent(ev cm.Event) {
	if f := n.cmEv.Load(); f != nil {
		(*f)(ev)
	}
}

// receiveMAD is the engine's QP1 handler: every MAD that arrives goes to
// the manager, which drops and counts what is not the CM's.
func (n *NIC) receiveMAD(src, dst netip.Addr, _ uint32, _ uint16, mad []byte) {
	n.cm.Receive(src, dst, mad)
}

// nicWire sends the manager's MADs from the NIC's QP1. A MAD the NIC
// cannot send is counted there (GSIStats); the manager's retries cover
// it as they cover one lost on the wire.
type nicWire struct{ n *NIC }

func (w nicWire) SendMAD(r cm.Route, mad *[cm.MADLen]byte) {
	_ = w.n.SendMAD(r.Src, r.Dst, mad[:])
}

// cmLoop runs the manager's timers until the NIC closes.
func (n *NIC) cmLoop() {
	defer n.wg.Done()
	n.timerLoop(n.cm.NextDeadline, n.cm.TimerWake(), n.cm.Tick)
}

// estQueue bounds the QPs whose first request waits for the manager: one
// beyond it is not told, and its connection, if it lost its RTU, waits
// for the REP's retry as Linux's would.
const estQueue = 256

// commEstablished is the engine's Config.CommEstablished: under the
// engine's lock, it hands the QPN on without waiting, for estLoop to tell
// the manager, whose lock (and the MADs it sends) must not be taken there.
func (n *NIC) commEstablished(qpn uint32) {
	select {
	case n.est <- qpn:
	default:
	}
}

// estLoop tells the manager of each QP's first request, which establishes
// a passive connection whose RTU is lost (cm.Manager.CommEstablished).
func (n *NIC) estLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case qpn := <-n.est:
			n.cm.CommEstablished(qpn)
		}
	}
}
