package transport

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/verbs/abi"
)

// CQ is a completion queue.
type CQ struct {
	mu       sync.Mutex
	ring     []WC
	head, n  int
	overflow bool
	notify   func()
}

// NewCQ returns a completion queue of depth entries. notify, when not nil,
// is called (outside any lock of the CQ) after completions are added.
func NewCQ(depth int, notify func()) *CQ {
	return &CQ{ring: make([]WC, depth), notify: notify}
}

// Poll moves up to len(wcs) completions into wcs, oldest first, and
// returns how many.
func (cq *CQ) Poll(wcs []WC) int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	k := 0
	for k < len(wcs) && cq.n > 0 {
		wcs[k] = cq.ring[cq.head]
		cq.head = (cq.head + 1) % len(cq.ring)
		cq.n--
		k++
	}
	return k
}

// Len returns how many completions wait to be polled.
func (cq *CQ) Len() int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.n
}

// Overflowed reports whether a completion was lost to a full queue (an
// asynchronous CQ error in libibverbs terms).
func (cq *CQ) Overflowed() bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.overflow
}

func (cq *CQ) push(wc *WC) {
	cq.mu.Lock()
	if cq.n == len(cq.ring) {
		cq.overflow = true
	} else {
		cq.ring[(cq.head+cq.n)%len(cq.ring)] = *wc
		cq.n++
	}
	cq.mu.Unlock()
}

// AddressVector says where a connected QP's packets go (struct
// ibv_ah_attr with its GRH, which RoCE always has).
type AddressVector struct {
	DstIP     netip.Addr // destination GID as an address
	DstMAC    roce.MAC
	SGIDIndex uint8
	FlowLabel uint32 // the IPv6 flow label; it also picks the UDP source port
	// HopLimit is the hop limit asked for. ib_core replaces a RoCEv2
	// connected QP's with the route's (ib_resolve_eth_dmac at
	// ibv_modify_qp), and so does the engine: packets carry HopLimit
	// (64) whatever it is, and Attr reports that, as ibv_query_qp does.
	HopLimit uint8
	TClass   uint8 // the IPv4 TOS or IPv6 traffic class
}

// QPAttr holds queue pair attributes (struct ibv_qp_attr).
type QPAttr struct {
	State           abi.QPState
	CurState        abi.QPState
	Access          abi.Access
	PKeyIndex       uint16
	Port            uint8
	QKey            uint32
	AV              AddressVector
	PathMTU         abi.MTU
	DestQPN         uint32
	RQPSN           roce.PSN
	SQPSN           roce.PSN
	Timeout         uint8 // local ACK timeout: 4.096 µs × 2^Timeout, 0 = infinite
	RetryCnt        uint8 // 7 = retry forever, as rxe does
	RNRRetry        uint8 // 7 = retry forever
	MinRNRTimer     uint8 // RNR timer code the responder sends (IBA table 45)
	MaxRdAtomic     uint8
	MaxDestRdAtomic uint8
}

// ErrInvalid is returned for requests libibverbs rejects with EINVAL: a
// transition with missing or forbidden attributes, a post on a queue pair
// in the wrong state, a full queue.
var ErrInvalid = errors.New("transport: invalid argument")

type transition struct{ from, to abi.QPState }

type maskRule struct{ required, optional [3]abi.AttrMask } // indexed by RC, UC, UD

func typeIndex(t abi.QPType) int {
	switch t {
	case abi.UC:
		return 1
	case abi.UD:
		return 2
	}
	return 0
}

// modifyRules is the IBA transition table (IBA 11.2.4.2; the kernel's
// qp_state_table) for the transitions taproce supports.
var modifyRules = map[transition]maskRule{
	{abi.QPSReset, abi.QPSInit}: {
		required: [3]abi.AttrMask{abi.QPPKeyIndex | abi.QPPort | abi.QPAccessFlags, abi.QPPKeyIndex | abi.QPPort | abi.QPAccessFlags, abi.QPPKeyIndex | abi.QPPort | abi.QPQKey},
	},
	{abi.QPSInit, abi.QPSInit}: {
		optional: [3]abi.AttrMask{abi.QPPKeyIndex | abi.QPPort | abi.QPAccessFlags, abi.QPPKeyIndex | abi.QPPort | abi.QPAccessFlags, abi.QPPKeyIndex | abi.QPPort | abi.QPQKey},
	},
	{abi.QPSInit, abi.QPSRTR}: {
		required: [3]abi.AttrMask{
			abi.QPAV | abi.QPPathMTU | abi.QPDestQPN | abi.QPRQPSN | abi.QPMaxDestRdAtomic | abi.QPMinRNRTimer,
			abi.QPAV | abi.QPPathMTU | abi.QPDestQPN | abi.QPRQPSN,
			0,
		},
		optional: [3]abi.AttrMask{abi.QPAltPath | abi.QPAccessFlags | abi.QPPKeyIndex, abi.QPAltPath | abi.QPAccessFlags | abi.QPPKeyIndex, abi.QPPKeyIndex | abi.QPQKey},
	},
	{abi.QPSRTR, abi.QPSRTS}: {
		required: [3]abi.AttrMask{abi.QPSQPSN | abi.QPTimeout | abi.QPRetryCnt | abi.QPRNRRetry | abi.QPMaxQPRdAtomic, abi.QPSQPSN, abi.QPSQPSN},
		optional: [3]abi.AttrMask{
			abi.QPCurState | abi.QPAltPath | abi.QPAccessFlags | abi.QPMinRNRTimer | abi.QPPathMigState,
			abi.QPCurState | abi.QPAltPath | abi.QPAccessFlags | abi.QPPathMigState,
			abi.QPCurState | abi.QPQKey,
		},
	},
	{abi.QPSRTS, abi.QPSRTS}: {
		optional: [3]abi.AttrMask{
			abi.QPCurState | abi.QPAccessFlags | abi.QPAltPath | abi.QPPathMigState | abi.QPMinRNRTimer,
			abi.QPCurState | abi.QPAccessFlags | abi.QPAltPath | abi.QPPathMigState,
			abi.QPCurState | abi.QPQKey,
		},
	},
}

// checkModify applies the transition rules: the attribute mask must hold
// every required attribute and nothing but required and optional ones.
// Any state may go to RESET or ERR with the state alone.
func checkModify(t abi.QPType, cur abi.QPState, attr *QPAttr, mask abi.AttrMask) (abi.QPState, error) {
	to := cur
	if mask&abi.QPStateMask != 0 {
		to = attr.State
	}
	if mask&abi.QPCurState != 0 && attr.CurState != cur {
		return cur, fmt.Errorf("%w: current state is %v, not %v", ErrInvalid, cur, attr.CurState)
	}
	if to == abi.QPSReset || to == abi.QPSErr {
		if mask&^(abi.QPStateMask|abi.QPCurState) != 0 {
			return cur, fmt.Errorf("%w: %v→%v takes the state alone", ErrInvalid, cur, to)
		}
		return to, nil
	}
	rule, ok := modifyRules[transition{cur, to}]
	if !ok {
		return cur, fmt.Errorf("%w: no transition %v→%v", ErrInvalid, cur, to)
	}
	i := typeIndex(t)
	rest := mask &^ abi.QPStateMask
	if missing := rule.required[i] &^ rest; missing != 0 {
		return cur, fmt.Errorf("%w: %v→%v of a %v QP lacks attributes %#x", ErrInvalid, cur, to, t, uint32(missing))
	}
	if extra := rest &^ (rule.required[i] | rule.optional[i]); extra != 0 {
		return cur, fmt.Errorf("%w: %v→%v of a %v QP does not take attributes %#x", ErrInvalid, cur, to, t, uint32(extra))
	}
	return to, nil
}

// timeoutDuration converts an IBA timeout exponent: 4.096 µs × 2^t; 0 is
// infinite (IBA 9.7.6.1.3).
func timeoutDuration(t uint8) time.Duration {
	if t == 0 {
		return 0
	}
	if t > 31 {
		t = 31
	}
	return time.Duration(4096<<t) * time.Nanosecond
}

// rnrDelays is IBA table 45: the RNR NAK timer field in microseconds.
var rnrDelays = [32]time.Duration{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
}

// RNRDelay returns the delay an RNR NAK with timer code c asks for.
func RNRDelay(c uint8) time.Duration { return rnrDelays[c&31] * time.Microsecond }
