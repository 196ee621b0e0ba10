package cm

import "fmt"

// CheckInvariants checks that the manager's tables agree with each other
// and with the IDs' states.
func CheckInvariants(m *Manager) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.check()
}

// Sizes returns how many entries each of the manager's tables holds, and
// how many MADs and events wait to go out.
func Sizes(m *Manager) map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return map[string]int{
		"conns": len(m.conns), "listeners": len(m.listeners), "byService": len(m.byService),
		"byLocal": len(m.byLocal), "byRemote": len(m.byRemote), "byRemoteQPN": len(m.byRemoteQPN),
		"byQPN": len(m.byQPN), "sidrIn": len(m.sidrIn), "out": len(m.out), "events": len(m.events),
	}
}

// inRemoteStates are the states in which an ID is in byRemote and
// byRemoteQPN: from the REQ's (passive) or REP's (active) arrival to
// TimeWait or Idle.
var inRemoteStates = map[State]bool{StateMRAReqSent: true, StateRepSent: true, StateMRARepRcvd: true,
	StateMRARepSent: true, StateEstablished: true, StateDreqSent: true, StateDreqRcvd: true}

// waitingStates are the states in which an ID waits for an answer to a
// message of its own.
var waitingStates = map[State]bool{StateReqSent: true, StateMRAReqRcvd: true, StateRepSent: true,
	StateMRARepRcvd: true, StateDreqSent: true, StateSIDRReqSent: true}

func (m *Manager) check() error {
	pending := map[*listener]int{}
	for id, c := range m.conns {
		switch {
		case c.id != id:
			return fmt.Errorf("conn %d filed under %d", c.id, id)
		case m.byLocal[c.localID] != c:
			return fmt.Errorf("conn %d (%v): not found by its local ID 0x%08x", id, c.state, c.localID)
		case c.state == StateListen || c.state >= NumStates:
			return fmt.Errorf("conn %d in %v", id, c.state)
		case c.inRemote != inRemoteStates[c.state]:
			return fmt.Errorf("conn %d in %v: in the remote tables %v", id, c.state, c.inRemote)
		case c.inSIDR != (c.state == StateSIDRReqRcvd):
			return fmt.Errorf("conn %d in %v: in the SIDR table %v", id, c.state, c.inSIDR)
		case c.msgLive != waitingStates[c.state]:
			return fmt.Errorf("conn %d in %v: waiting for an answer %v", id, c.state, c.msgLive)
		case c.msgLive && c.deadline.IsZero():
			return fmt.Errorf("conn %d in %v: waiting with no timer", id, c.state)
		case c.state == StateTimeWait && (c.deadline.IsZero() || c.msgLive):
			return fmt.Errorf("conn %d in TimeWait: timer %v, waiting %v", id, c.deadline, c.msgLive)
		case !c.msgLive && c.state != StateTimeWait && !c.deadline.IsZero():
			return fmt.Errorf("conn %d in %v: a timer with nothing to time", id, c.state)
		case c.listener != nil && c.state != StateMRAReqSent && c.state != StateSIDRReqRcvd:
			return fmt.Errorf("conn %d in %v: still in its listener's backlog", id, c.state)
		}
		if c.listener != nil {
			if m.listeners[c.listener.id] != c.listener {
				return fmt.Errorf("conn %d: in the backlog of listener %d, which is gone", id, c.listener.id)
			}
			pending[c.listener]++
		}
	}
	for k, c := range m.byLocal {
		if m.conns[c.id] != c || c.localID != k {
			return fmt.Errorf("byLocal 0x%08x: conn %d is not the manager's or has ID 0x%08x", k, c.id, c.localID)
		}
	}
	for k, c := range m.byRemote {
		if m.conns[c.id] != c || !c.inRemote || c.remoteID != k.id || c.remoteGUID != k.guid {
			return fmt.Errorf("byRemote %+v: conn %d (%v) does not match", k, c.id, c.state)
		}
	}
	for k, c := range m.byRemoteQPN {
		if m.conns[c.id] != c || !c.inRemote || c.remoteQPN != k.id || c.remoteGUID != k.guid {
			return fmt.Errorf("byRemoteQPN %+v: conn %d (%v) does not match", k, c.id, c.state)
		}
	}
	for q, c := range m.byQPN {
		if m.conns[c.id] != c || c.localQPN != q || (c.state != StateRepSent && c.state != StateMRARepRcvd) {
			return fmt.Errorf("byQPN 0x%06x: conn %d (%v) does not match", q, c.id, c.state)
		}
	}
	for k, c := range m.sidrIn {
		if m.conns[c.id] != c || !c.inSIDR || c.remoteID != k.id || c.route.Dst != k.src {
			return fmt.Errorf("sidrIn %+v: conn %d (%v) does not match", k, c.id, c.state)
		}
	}
	n := 0
	for sid, ls := range m.byService {
		if len(ls) == 0 {
			return fmt.Errorf("byService %v: empty", sid)
		}
		for _, l := range ls {
			if m.listeners[l.id] != l || l.sid != sid {
				return fmt.Errorf("byService %v: listener %d does not match", sid, l.id)
			}
			n++
		}
	}
	if n != len(m.listeners) {
		return fmt.Errorf("%d listeners, %d by service", len(m.listeners), n)
	}
	for id, l := range m.listeners {
		if l.pending != pending[l] || l.pending > l.backlog || l.pending < 0 {
			return fmt.Errorf("listener %d: pending %d, %d IDs in its backlog of %d", id, l.pending, pending[l], l.backlog)
		}
	}
	return nil
}
