package verbs

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"syscall"
	"unsafe"

	"github.com/taproce/taproce/shmem"
	"github.com/taproce/taproce/verbs/abi"
)

func (c *Context) destroy(ctx context.Context, op abi.Op, h abi.Handle) error {
	var r abi.ErrnoReply
	if _, err := c.cn.call(ctx, op, &abi.HandleRequest{Handle: h}, &r); err != nil {
		return err
	}
	return errnoOf(op, r.Errno)
}

// PD is a protection domain (struct ibv_pd).
type PD struct {
	c *Context
	h abi.Handle
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD(ctx context.Context) (*PD, error) {
	var r abi.HandleReply
	if _, err := c.cn.call(ctx, abi.OpAllocPD, nil, &r); err != nil {
		return nil, err
	}
	if err := errnoOf(abi.OpAllocPD, r.Errno); err != nil {
		return nil, err
	}
	return &PD{c: c, h: r.Handle}, nil
}

// Dealloc frees the PD; it fails with EBUSY while objects use it.
func (pd *PD) Dealloc(ctx context.Context) error { return pd.c.destroy(ctx, abi.OpDeallocPD, pd.h) }

// Context returns the PD's device.
func (pd *PD) Context() *Context { return pd.c }

// MR is a memory region in shared memory (struct ibv_mr).
type MR struct {
	pd     *PD
	h      abi.Handle
	region *shmem.Region
	buf    []byte
	addr   uint64
	LKey   uint32
	RKey   uint32
}

// AllocMR allocates size bytes of shared memory and registers them with
// the given access (ibv_reg_mr on memory the library provides).
func (pd *PD) AllocMR(ctx context.Context, size int, access Access) (*MR, error) {
	if size <= 0 {
		return nil, fmt.Errorf("verbs: memory region of %d bytes: %w", size, syscall.EINVAL)
	}
	region, err := shmem.NewRegion("taproce-mr", size)
	if err != nil {
		return nil, fmt.Errorf("verbs: memory region: %w", err)
	}
	buf := region.Bytes()[:size:size]
	var r abi.RegMRReply
	req := &abi.RegMRRequest{PD: pd.h, Access: uint32(access), Addr: uint64(uintptr(unsafe.Pointer(&buf[0]))),
		Length: uint64(size), Size: uint64(region.Size())}
	if _, err := pd.c.cn.call(ctx, abi.OpRegMR, req, &r, region.Fd()); err != nil {
		region.Close()
		return nil, err
	}
	if err := errnoOf(abi.OpRegMR, r.Errno); err != nil {
		region.Close()
		return nil, err
	}
	pd.c.track(region)
	return &MR{pd: pd, h: r.Handle, region: region, buf: buf, addr: req.Addr, LKey: r.LKey, RKey: r.RKey}, nil
}

// Bytes returns the region's memory.
func (mr *MR) Bytes() []byte { return mr.buf }

// Addr returns the region's address, as SGEs and remote peers name it.
func (mr *MR) Addr() uint64 { return mr.addr }

// SGE returns the SGE of n bytes at offset off of the region.
func (mr *MR) SGE(off, n int) SGE {
	return SGE{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.LKey}
}

// Dereg deregisters the region and frees its memory.
func (mr *MR) Dereg(ctx context.Context) error {
	if err := mr.pd.c.destroy(ctx, abi.OpDeregMR, mr.h); err != nil {
		return err
	}
	return mr.pd.c.untrack(mr.region)
}

// CompChannel is a completion channel (struct ibv_comp_channel).
type CompChannel struct {
	c    *Context
	h    abi.Handle
	bell *shmem.Doorbell

	mu  sync.Mutex
	cqs []*CQ
}

// CreateCompChannel creates a completion channel.
func (c *Context) CreateCompChannel(ctx context.Context) (*CompChannel, error) {
	var r abi.HandleReply
	fds, err := c.cn.call(ctx, abi.OpCreateChannel, nil, &r)
	if err != nil {
		return nil, err
	}
	if err := errnoOf(abi.OpCreateChannel, r.Errno); err != nil {
		closeFds(fds)
		return nil, err
	}
	if len(fds) != 1 {
		closeFds(fds)
		return nil, fmt.Errorf("verbs: channel: %d descriptors", len(fds))
	}
	bell, err := shmem.DoorbellFromFd(fds[0])
	if err != nil {
		closeFds(fds)
		return nil, err
	}
	ch := &CompChannel{c: c, h: r.Handle, bell: bell}
	c.mu.Lock()
	c.chans[ch] = struct{}{}
	c.mu.Unlock()
	return ch, nil
}

// Wait waits for a CQ of the channel to have a completion event and
// returns it (ibv_get_cq_event); the CQ must be armed again with
// ReqNotify for the next one. When the appliance is gone it wakes: it
// returns a CQ that was armed and has flushed work requests to poll, and
// then the *DeviceGoneError, as ibv_get_cq_event fails with EIO on a
// device the kernel disassociated.
func (ch *CompChannel) Wait(ctx context.Context) (*CQ, error) {
	for {
		ch.mu.Lock()
		for _, cq := range ch.cqs {
			if abi.Word32(cq.state, abi.CQFired).Swap(0) != 0 {
				ch.mu.Unlock()
				return cq, nil
			}
		}
		ch.mu.Unlock()
		// Context.lose rings the bell after publishing the loss, so a
		// Wait that passes this check is woken.
		if err := ch.c.gone(); err != nil {
			return nil, err
		}
		if err := ch.bell.Wait(ctx); err != nil {
			return nil, err
		}
		_, _ = ch.bell.Drain()
	}
}

// Destroy destroys the channel; EBUSY while CQs use it.
func (ch *CompChannel) Destroy(ctx context.Context) error {
	if err := ch.c.destroy(ctx, abi.OpDestroyChannel, ch.h); err != nil {
		return err
	}
	ch.c.mu.Lock()
	delete(ch.c.chans, ch)
	ch.c.mu.Unlock()
	return ch.bell.Close()
}

// CQ is a completion queue (struct ibv_cq).
type CQ struct {
	c      *Context
	h      abi.Handle
	ch     *CompChannel
	region *shmem.Region
	ring   *shmem.Ring
	state  []byte
	depth  int
	cqe    abi.CQE

	mu        sync.Mutex
	destroyed bool
	// flushed holds the completions of the work requests a gone appliance
	// left outstanding (QP.flush); Poll returns them after the ring's.
	flushed []WC
}

// CreateCQ creates a completion queue of at least depth entries, with an
// optional completion channel.
func (c *Context) CreateCQ(ctx context.Context, depth int, ch *CompChannel) (*CQ, error) {
	if depth <= 0 {
		return nil, fmt.Errorf("verbs: CQ of %d entries: %w", depth, syscall.EINVAL)
	}
	req := &abi.CreateCQRequest{Depth: uint32(depth)}
	if ch != nil {
		req.Channel = ch.h
	}
	var r abi.CreateCQReply
	fds, err := c.cn.call(ctx, abi.OpCreateCQ, req, &r)
	if err != nil {
		return nil, err
	}
	if err := errnoOf(abi.OpCreateCQ, r.Errno); err != nil {
		closeFds(fds)
		return nil, err
	}
	region, mem, err := mapReply(fds, r.Size)
	if err != nil {
		return nil, err
	}
	ring, err := shmem.AttachRing(mem[abi.StateBytes:])
	if err != nil {
		region.Close()
		return nil, fmt.Errorf("verbs: CQ ring: %w", err)
	}
	c.track(region)
	cq := &CQ{c: c, h: r.Handle, ch: ch, region: region, ring: ring, state: mem[:abi.StateBytes], depth: int(r.Depth)}
	if ch != nil {
		ch.mu.Lock()
		ch.cqs = append(ch.cqs, cq)
		ch.mu.Unlock()
	}
	c.mu.Lock()
	c.cqs[uint32(r.Handle)] = cq
	c.mu.Unlock()
	return cq, nil
}

// mapReply maps the one region a reply carries.
func mapReply(fds []int, size uint64) (*shmem.Region, []byte, error) {
	if len(fds) != 1 || size == 0 || size > 1<<34 {
		closeFds(fds)
		return nil, nil, fmt.Errorf("verbs: reply with %d descriptors, region of %d bytes", len(fds), size)
	}
	region, err := shmem.MapRegion(fds[0], int(size))
	if err != nil {
		closeFds(fds)
		return nil, nil, fmt.Errorf("verbs: shared region: %w", err)
	}
	return region, region.Bytes(), nil
}

// Depth returns the number of entries the CQ holds.
func (cq *CQ) Depth() int { return cq.depth }

// Poll moves up to len(wcs) completions into wcs and returns how many
// (ibv_poll_cq). It never makes a system call. A destroyed CQ returns -1.
// Once the appliance is gone, the completions it wrote are followed by a
// WCWRFlushErr completion for each work request left outstanding: what
// an application already handles when a QP fails, where an error from
// Poll is one it treats as a bug of its own.
func (cq *CQ) Poll(wcs []WC) int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.destroyed {
		return -1
	}
	n := min(cq.ring.Len(), len(wcs))
	if n == 0 && len(cq.flushed) > 0 {
		// The ring is empty for good: its producer is gone.
		k := copy(wcs, cq.flushed)
		cq.flushed = cq.flushed[k:]
		return k
	}
	for i := range n {
		cq.cqe.Get(cq.ring.PeekAt(i))
		e := &cq.cqe
		wcs[i] = WC{ID: e.WRID, Status: WCStatus(e.Status), Opcode: WCOpcode(e.Opcode), VendorErr: e.VendorErr,
			ByteLen: e.ByteLen, Imm: e.Imm, QPNum: e.QPNum, SrcQP: e.SrcQP, Flags: e.Flags, PKeyIndex: e.PKeyIndex,
			SLID: e.SLID, SL: e.SL}
	}
	if n > 0 {
		cq.ring.ReleaseN(n)
	}
	return n
}

// ReqNotify arms the CQ: its channel is signalled at the next completion
// (ibv_req_notify_cq). solicitedOnly is accepted and treated as any
// completion, which libibverbs allows.
//
// Once the appliance is gone it fails with a *DeviceGoneError: nobody is
// left to signal (Poll still returns what the CQ holds).
func (cq *CQ) ReqNotify(solicitedOnly bool) error {
	if cq.ch == nil {
		return fmt.Errorf("verbs: CQ without a completion channel: %w", syscall.EINVAL)
	}
	if err := cq.c.gone(); err != nil {
		return err
	}
	v := uint32(1)
	if solicitedOnly {
		v = 2
	}
	abi.Word32(cq.state, abi.CQArmed).Store(v)
	// A completion that arrived before arming would not signal: look.
	if cq.ring.Len() > 0 && abi.Word32(cq.state, abi.CQArmed).Swap(0) != 0 {
		abi.Word32(cq.state, abi.CQFired).Store(1)
		_ = cq.ch.bell.Ring()
	}
	return nil
}

// addFlushed queues the flushed completions of a QP (QP.flush).
func (cq *CQ) addFlushed(wcs []WC) {
	if len(wcs) == 0 {
		return
	}
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if !cq.destroyed {
		cq.flushed = append(cq.flushed, wcs...)
	}
}

// lose signals the channel of an armed CQ that has flushed completions,
// as the appliance would have for completions of its own, once the
// appliance is gone (Context.lose).
func (cq *CQ) lose() {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.destroyed || cq.ch == nil || len(cq.flushed) == 0 && cq.ring.Len() == 0 {
		return
	}
	if abi.Word32(cq.state, abi.CQArmed).Swap(0) != 0 {
		abi.Word32(cq.state, abi.CQFired).Store(1)
	}
}

// Destroy destroys the CQ; EBUSY while QPs use it. Poll on a destroyed CQ
// returns -1.
func (cq *CQ) Destroy(ctx context.Context) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.destroyed {
		return fmt.Errorf("verbs: CQ destroyed already: %w", syscall.EINVAL)
	}
	if err := cq.c.destroy(ctx, abi.OpDestroyCQ, cq.h); err != nil {
		return err
	}
	cq.destroyed = true
	if cq.ch != nil {
		cq.ch.mu.Lock()
		for i, x := range cq.ch.cqs {
			if x == cq {
				cq.ch.cqs = append(cq.ch.cqs[:i], cq.ch.cqs[i+1:]...)
				break
			}
		}
		cq.ch.mu.Unlock()
	}
	cq.c.mu.Lock()
	delete(cq.c.cqs, uint32(cq.h))
	cq.c.mu.Unlock()
	return cq.c.untrack(cq.region)
}

// AH is an address handle (struct ibv_ah).
type AH struct {
	pd *PD
	h  abi.Handle
}

// CreateAH creates an address handle; the appliance resolves the
// destination's MAC, so an unreachable one fails with EHOSTUNREACH.
func (pd *PD) CreateAH(ctx context.Context, a AHAttr) (*AH, error) {
	var r abi.HandleReply
	req := &abi.CreateAHRequest{PD: pd.h, SGIDIndex: a.SGIDIndex, HopLimit: a.HopLimit, TClass: a.TClass,
		Port: a.Port, FlowLabel: a.FlowLabel, DGID: gid(a.DGID)}
	if _, err := pd.c.cn.call(ctx, abi.OpCreateAH, req, &r); err != nil {
		return nil, err
	}
	if err := errnoOf(abi.OpCreateAH, r.Errno); err != nil {
		return nil, err
	}
	return &AH{pd: pd, h: r.Handle}, nil
}

// Destroy destroys the address handle.
func (ah *AH) Destroy(ctx context.Context) error { return ah.pd.c.destroy(ctx, abi.OpDestroyAH, ah.h) }

func gid(a netip.Addr) [16]byte {
	if !a.IsValid() {
		return [16]byte{}
	}
	return a.As16()
}
