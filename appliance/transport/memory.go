package transport

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/taproce/taproce/verbs/abi"
)

// PD is a protection domain: memory regions and queue pairs of one PD may
// only be used together (IBA 10.2.3).
type PD struct{ id uint32 }

// MR is a registered memory region: Buf, seen by applications at virtual
// address Addr, usable locally with LKey and remotely with RKey.
type MR struct {
	PD     *PD
	Addr   uint64
	Buf    []byte
	LKey   uint32
	RKey   uint32
	Access abi.Access

	invalid bool         // RKey invalidated by SEND with invalidate
	pins    atomic.Int32 // frames of the local switch that point into Buf
}

// Pinned reports whether frames still in flight on a local switch point
// into the region's memory: its owner must not unmap it until they are
// gone (a deregistered region gets no new ones).
func (mr *MR) Pinned() bool { return mr.pins.Load() != 0 }

// Memory holds the protection domains and memory regions of one engine.
// Its zero value is ready for use, with keys from a generator seeded from
// crypto/rand.
type Memory struct {
	mu     sync.RWMutex
	nextPD uint32
	keys   map[uint32]*MR
	rng    *rand.ChaCha8 // the keys' random bits (newRand)
}

// NewMemory returns a Memory whose keys come from a generator seeded with
// seed (see newRand): the same seed gives the same keys, for tests and
// fuzzing; 0 seeds it from crypto/rand, as the zero Memory does.
func NewMemory(seed uint64) *Memory { return &Memory{rng: newRand(seed, "memory keys")} }

// newRand returns a ChaCha8 generator seeded from seed and label, or,
// when seed is 0, from crypto/rand. ChaCha8 is a cryptographically strong
// generator: with a secret seed its numbers are as unpredictable as
// crypto/rand's, without a system call each; a fixed seed makes an
// engine's numbers repeat from run to run, which tests and fuzzing need.
func newRand(seed uint64, label string) *rand.ChaCha8 {
	var s [32]byte
	if seed == 0 {
		crand.Read(s[:]) // never fails (crypto/rand's contract since Go 1.24)
	} else {
		binary.LittleEndian.PutUint64(s[:], seed)
		copy(s[8:], label)
	}
	return rand.NewChaCha8(s)
}

// Errors of memory registration.
var (
	ErrInvalidMR = errors.New("transport: invalid memory region")
)

// NewPD allocates a protection domain.
func (m *Memory) NewPD() *PD {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextPD++
	return &PD{id: m.nextPD}
}

// Register makes buf, seen at virtual address addr, a memory region of pd.
// Its key (the L_Key and the R_Key, equal as rxe's are) is 32 random bits,
// never 0 and unique among the registered regions. rxe puts 8 random bits
// in the low byte of a key whose upper 24 bits are an index in its table
// (rxe_mr_init, rxe_get_next_key), so that a stale key of a deregistered
// region is unlikely to match a new one; a key wholly random does that
// too, and keeps a host on the network from guessing a live region's R_Key
// — a key is all that stands between a peer's QP and a region of its PD.
func (m *Memory) Register(pd *PD, addr uint64, buf []byte, access abi.Access) (*MR, error) {
	if pd == nil {
		return nil, fmt.Errorf("%w: no protection domain", ErrInvalidMR)
	}
	if addr+uint64(len(buf)) < addr {
		return nil, fmt.Errorf("%w: address range wraps", ErrInvalidMR)
	}
	// IBA 10.6.3.1: remote write or atomic access requires local write.
	if access&(abi.AccessRemoteWrite|abi.AccessRemoteAtomic) != 0 && access&abi.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("%w: remote write or atomic access without local write", ErrInvalidMR)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.keys == nil {
		m.keys = map[uint32]*MR{}
	}
	if m.rng == nil {
		m.rng = newRand(0, "")
	}
	for {
		key := uint32(m.rng.Uint64())
		if key == 0 || m.keys[key] != nil {
			continue
		}
		mr := &MR{PD: pd, Addr: addr, Buf: buf, LKey: key, RKey: key, Access: access}
		m.keys[key] = mr
		return mr, nil
	}
}

// Deregister removes a memory region; its keys stop working at once.
func (m *Memory) Deregister(mr *MR) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.keys[mr.LKey] != mr {
		return ErrInvalidMR
	}
	delete(m.keys, mr.LKey)
	return nil
}

// lookup returns the region with key, or nil.
func (m *Memory) lookup(key uint32) *MR {
	m.mu.RLock()
	mr := m.keys[key]
	m.mu.RUnlock()
	return mr
}

// slice returns the n bytes at va of mr, or false when they are not all
// inside it.
func (mr *MR) slice(va uint64, n uint32) ([]byte, bool) {
	if va < mr.Addr {
		return nil, false
	}
	off := va - mr.Addr
	if off > uint64(len(mr.Buf)) || uint64(n) > uint64(len(mr.Buf))-off {
		return nil, false
	}
	return mr.Buf[off : off+uint64(n)], true
}

// remote checks a remote access of n bytes at va with rkey for a QP of pd
// (IBA 10.6.3.2, 9.7.4.1.6: key valid, PD matches, range inside, access
// allowed) and returns the bytes. A zero-length access checks nothing.
func (m *Memory) remote(pd *PD, rkey uint32, va uint64, n uint32, need abi.Access) ([]byte, bool) {
	b, _, ok := m.remoteMR(pd, rkey, va, n, need)
	return b, ok
}

// remoteMR is remote, with the region the bytes are in (nil for a
// zero-length access).
func (m *Memory) remoteMR(pd *PD, rkey uint32, va uint64, n uint32, need abi.Access) ([]byte, *MR, bool) {
	if n == 0 {
		return nil, nil, true
	}
	mr := m.lookup(rkey)
	if mr == nil || mr.PD != pd || mr.RKey != rkey || mr.invalid || mr.Access&need != need {
		return nil, nil, false
	}
	b, ok := mr.slice(va, n)
	return b, mr, ok
}

// local checks an SGE for a QP of pd, with local write when the transport
// writes into it, and returns its bytes.
func (m *Memory) local(pd *PD, sge SGE, write bool) ([]byte, *MR, bool) {
	if sge.Length == 0 {
		return nil, nil, true
	}
	mr := m.lookup(sge.LKey)
	if mr == nil || mr.PD != pd || write && mr.Access&abi.AccessLocalWrite == 0 {
		return nil, nil, false
	}
	b, ok := mr.slice(sge.Addr, sge.Length)
	return b, mr, ok
}

// invalidate marks the region with rkey as no longer remotely usable, for
// SEND with invalidate. It reports whether there was such a region of pd.
func (m *Memory) invalidate(pd *PD, rkey uint32) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	mr := m.keys[rkey]
	if mr == nil || mr.PD != pd {
		return false
	}
	mr.invalid = true
	return true
}

// sgl is a scatter/gather list resolved to byte slices, for copying a
// message in or out piece by piece.
type sgl struct {
	segs  [][]byte
	mrs   []*MR // the region of each segment
	total uint32
}

// resolve resolves SGEs; ok is false for an SGE that fails the checks.
func (m *Memory) resolve(pd *PD, sges []SGE, write bool, dst *sgl) bool {
	dst.segs, dst.mrs = dst.segs[:0], dst.mrs[:0]
	dst.total = 0
	for _, s := range sges {
		b, mr, ok := m.local(pd, s, write)
		if !ok {
			return false
		}
		if len(b) > 0 {
			dst.segs = append(dst.segs, b)
			dst.mrs = append(dst.mrs, mr)
			dst.total += uint32(len(b))
		}
	}
	return true
}

// copyOut copies len(dst) bytes starting at offset off of the list into dst.
func (s *sgl) copyOut(dst []byte, off uint32) {
	for _, seg := range s.segs {
		if off >= uint32(len(seg)) {
			off -= uint32(len(seg))
			continue
		}
		n := copy(dst, seg[off:])
		dst = dst[n:]
		off = 0
		if len(dst) == 0 {
			return
		}
	}
}

// copyIn copies src into the list at offset off. The caller checked that
// it fits.
func (s *sgl) copyIn(src []byte, off uint32) {
	for _, seg := range s.segs {
		if off >= uint32(len(seg)) {
			off -= uint32(len(seg))
			continue
		}
		n := copy(seg[off:], src)
		src = src[n:]
		off = 0
		if len(src) == 0 {
			return
		}
	}
}
