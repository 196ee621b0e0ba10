package transport

import (
	"errors"
	"fmt"
)

// SRQ is a shared receive queue (IBA 10.2.9; ibv_srq): receive WQEs that
// every QP created with it takes from, in order.
type SRQ struct {
	e        *Engine
	pd       *PD
	rq       []recvWQE
	head, tl uint64
	limit    uint64 // armed limit, 0 when not armed
	users    int    // QPs attached
	onLimit  func()
	onRetire func(uint64)
	refill   func(add func(RecvWR) bool)
	add      func(RecvWR) bool
}

// SRQConfig describes a shared receive queue (struct ibv_srq_init_attr).
type SRQConfig struct {
	PD    *PD
	MaxWR int
	// OnLimit is called (under the engine's lock) when the armed limit is
	// reached: IBV_EVENT_SRQ_LIMIT_REACHED. The limit disarms itself.
	OnLimit func()
	// OnRetire, like QPConfig.OnRetire, is told the count of retired WQEs.
	OnRetire func(recv uint64)
	// Refill, like QPConfig.Refill, adds receive WQEs the client posted.
	Refill func(add func(RecvWR) bool)
}

// ErrBusy is returned for destroying an object still in use (EBUSY).
var ErrBusy = errors.New("transport: resource busy")

// CreateSRQ creates a shared receive queue.
func (e *Engine) CreateSRQ(c SRQConfig) (*SRQ, error) {
	if c.PD == nil || c.MaxWR <= 0 {
		return nil, fmt.Errorf("%w: an SRQ needs a PD and a depth", ErrInvalid)
	}
	s := &SRQ{e: e, pd: c.PD, rq: make([]recvWQE, c.MaxWR), onLimit: c.OnLimit, onRetire: c.OnRetire, refill: c.Refill}
	s.add = s.addLocked
	return s, nil
}

// DestroySRQ destroys s; it fails with ErrBusy while QPs use it.
func (e *Engine) DestroySRQ(s *SRQ) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.users > 0 {
		return fmt.Errorf("%w: %d queue pairs use the SRQ", ErrBusy, s.users)
	}
	s.rq = nil
	return nil
}

// PostRecv queues receive work requests (ibv_post_srq_recv).
func (s *SRQ) PostRecv(wrs []RecvWR) (int, error) {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	for i := range wrs {
		if s.rq == nil || s.tl-s.head == uint64(len(s.rq)) {
			return i, ErrQueueFull
		}
		if len(wrs[i].SGL) > maxSGE {
			return i, fmt.Errorf("%w: %d SGEs, at most %d", ErrInvalid, len(wrs[i].SGL), maxSGE)
		}
		w := &s.rq[s.tl%uint64(len(s.rq))]
		w.id = wrs[i].ID
		w.n = copy(w.sge[:], wrs[i].SGL)
		s.tl++
	}
	return len(wrs), nil
}

// Arm sets the SRQ limit (ibv_modify_srq with IBV_SRQ_LIMIT): when fewer
// than limit WQEs remain, OnLimit is called once. Zero disarms.
func (s *SRQ) Arm(limit int) error {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	if limit < 0 || limit > len(s.rq) {
		return fmt.Errorf("%w: SRQ limit %d of %d", ErrInvalid, limit, len(s.rq))
	}
	s.limit = uint64(limit)
	return nil
}

// Len returns the receive WQEs waiting.
func (s *SRQ) Len() int {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return int(s.tl - s.head)
}

func (s *SRQ) next() *recvWQE {
	if s.head == s.tl && s.refill != nil {
		s.refill(s.add)
	}
	if s.head == s.tl {
		return nil
	}
	return &s.rq[s.head%uint64(len(s.rq))]
}

func (s *SRQ) consume() {
	s.head++
	if s.onRetire != nil {
		s.onRetire(s.head)
	}
	if s.limit != 0 && s.tl-s.head < s.limit {
		s.limit = 0
		if s.onLimit != nil {
			s.onLimit()
		}
	}
}

// addLocked queues one receive WQE with the engine's lock held.
func (s *SRQ) addLocked(wr RecvWR) bool {
	if s.rq == nil || s.tl-s.head == uint64(len(s.rq)) || len(wr.SGL) > maxSGE {
		return false
	}
	w := &s.rq[s.tl%uint64(len(s.rq))]
	w.id = wr.ID
	w.n = copy(w.sge[:], wr.SGL)
	s.tl++
	return true
}
