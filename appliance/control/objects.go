package control

import (
	"context"
	"fmt"
	"log/slog"
	"math/bits"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/taproce/taproce/appliance/poll"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/shmem"
	"github.com/taproce/taproce/verbs/abi"
)

// Device limits as reported by query_device; rxe's where taproce has the
// same, smaller where the rings bound them.
const (
	maxQPWR    = 16384
	maxCQE     = 1 << 16
	maxSRQWR   = 16384
	maxRdAtom  = 16
	deviceName = "taproce"
)

type pdObj struct{ pd *transport.PD }

type mrObj struct {
	pd     *pdObj
	mr     *transport.MR
	region *shmem.Region
	length int64
}

// release unmaps a region already deregistered from e: once the engine
// has finished what it was doing, and the local switch's frames that
// point into it have been delivered. A region still pinned after a while
// is left mapped (and logged) rather than risk the appliance.
func (m *mrObj) release(e *transport.Engine) {
	if e != nil {
		e.Barrier()
		for i := 0; m.mr.Pinned(); i++ {
			if i == 5000 {
				slog.Warn("control: memory region still in flight after 5 s; left mapped")
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	m.region.Close()
}

type chanObj struct {
	bell *shmem.Doorbell
	refs int
}

func (c *chanObj) close() { c.bell.Close() }

type ahObj struct {
	pd *pdObj
	ah transport.AH
}

// nextPow2 returns the power of two at or above n (at least 1).
func nextPow2(n uint32) uint32 {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len32(n-1)
}

// listDevices lists the devices the client may open, or with
// ListAllDevices every device.
func (ss *session) listDevices() *abi.ListDevicesReply {
	r := &abi.ListDevicesReply{}
	all := ss.srv.cfg.ListAllDevices
	if !all {
		r.OthersHidden = 1
	}
	for _, d := range ss.srv.Devices() {
		if int(r.Count) == len(r.Devices) {
			break
		}
		if !all && d.Netns != ss.netns {
			continue
		}
		out := &r.Devices[r.Count]
		out.Name = abi.MakeName(d.Name)
		out.NodeGUID = d.MAC.EUI64()
		out.MAC = d.MAC
		if d.Netns == ss.netns {
			out.Usable = 1
		}
		out.PortUp = 1
		out.MTU = uint32(d.MTU)
		gids := d.GIDs()
		out.NumGIDs = uint32(min(len(gids), abi.MaxGIDs))
		for i := range out.NumGIDs {
			out.GIDs[i] = gids[i]
		}
		r.Count++
	}
	return r
}

// portAttr is what ibv_query_port reports of d's port. max_mtu is the
// device's largest path MTU, 4096, whatever the link, and active_mtu the
// largest the link carries (1024 on a 1500-byte link): rxe reports them so
// (RXE_PORT_MAX_MTU, rxe_set_mtu), and tools that pick a path MTU read
// active_mtu.
func portAttr(d *Device) abi.PortAttr {
	state, phys := uint8(4), uint8(5) // IBV_PORT_ACTIVE, LinkUp
	if d.Up != nil && !d.Up() {
		state, phys = 1, 3 // IBV_PORT_DOWN, Disabled
	}
	p := abi.PortAttr{State: state, MaxMTU: uint8(abi.MTU4096), ActiveMTU: uint8(abi.MTUForNetdev(d.MTU)), LinkLayer: 2, PhysState: phys,
		ActiveWidth: 1, ActiveSpeed: 1, GIDTblLen: abi.MaxGIDs, PortCapFlags: 0x00010000 | 0x04000000,
		MaxMsgSz: transport.MaxMessage, PKeyTblLen: 1}
	gids := d.GIDs()
	p.NumGIDs = uint32(min(len(gids), abi.MaxGIDs))
	for i := range p.NumGIDs {
		p.GIDs[i] = gids[i]
		p.GIDTypes[i] = 1
	}
	return p
}

func deviceAttr(d *Device) abi.DeviceAttr {
	g := d.MAC.EUI64()
	return abi.DeviceAttr{
		FWVer: abi.MakeName("1.0"), NodeGUID: g, SysImageGUID: g, MaxMRSize: 1 << 40, PageSizeCap: 0xfffff000,
		VendorID: 0xFFFFFF, MaxQP: 1024, MaxQPWR: maxQPWR, DeviceCapFlag: 1<<4 | 1<<13, MaxSGE: abi.MaxSGE,
		MaxCQ: 1024, MaxCQE: maxCQE, MaxMR: 4096, MaxPD: 256, MaxQPRdAtom: maxRdAtom, MaxQPInitRd: maxRdAtom,
		MaxSRQ: 256, MaxSRQWR: maxSRQWR, MaxSRQSGE: abi.MaxSGE, MaxAH: 4096, MaxInline: abi.MaxInline,
		AtomicCap: 1, PhysPortCnt: 1,
	}
}

// open binds the session to a device of its namespace.
func (ss *session) open(name string) (*abi.OpenReply, int, error) {
	d := ss.srv.device(name)
	if d == nil {
		return nil, 0, errno(syscall.ENODEV, "no device %q", name)
	}
	if d.Netns != ss.netns {
		return nil, 0, errno(syscall.EACCES, "device %q is in another network namespace", name)
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.dev != nil {
		return nil, 0, errno(syscall.EBUSY, "this connection has a device open")
	}
	pools := ss.srv.pools
	if err := pools.takeFds(fdsOpen); err != nil {
		return nil, 0, err
	}
	// A pipe: a client posts and then polls for the answer, and a pipe's
	// wakeup lets it go on polling where an eventfd's would preempt it
	// (shmem.NewPipeDoorbell). A blocking loop sleeps on the read end
	// itself, which then stays out of the runtime's poller: there a ring
	// would wake the runtime as well.
	loop := ss.srv.cfg.Loop
	newKick := shmem.NewPipeDoorbell
	if loop.Blocking() {
		newKick = shmem.NewUnpolledPipeDoorbell
	}
	kick, err := newKick()
	if err != nil {
		pools.fds.give(fdsOpen)
		return nil, 0, err
	}
	ss.dev, ss.kick = d, kick
	ss.opened.Store(d)
	pollRings := ss.pollOnce
	if loop.Blocking() {
		ss.unpoll = loop.AddSleeper(pollRings, poll.Sleeper{Fd: kick.ReadFd(), Arm: ss.tryPrepareSleep,
			Disarm: func(rung bool) {
				if rung {
					_, _ = kick.Drain() // consumes the rings
				}
				ss.cancelSleep()
			}})
	} else {
		ss.unpoll = loop.Add(pollRings)
	}
	ss.log.Info("client opened device", "device", name)
	attr := deviceAttr(d)
	if !loop.Blocking() {
		attr.Polls = 1
	}
	return &abi.OpenReply{Device: attr, Port: portAttr(d)}, kick.Fd(), nil
}

func (ss *session) allocPD() (abi.Handle, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.pds) >= ss.srv.cfg.Limits.PDs {
		return 0, errno(syscall.ENOMEM, "PD limit %d", ss.srv.cfg.Limits.PDs)
	}
	if p := &ss.srv.pools.pds; !p.take(1) {
		return 0, errno(syscall.ENOMEM, "the appliance's PD limit %d (all clients together)", p.max)
	}
	h := ss.newHandle()
	ss.pds[h] = &pdObj{pd: ss.dev.Engine.Memory().NewPD()}
	return h, nil
}

// regMR registers the memfd fds[0]; it takes the descriptor once it is
// mapped (the region closes it), and leaves it to the caller otherwise.
func (ss *session) regMR(r *abi.RegMRRequest, fds received) (*abi.RegMRReply, error) {
	if r.Length == 0 || r.Size > 1<<40 || r.Offset > r.Size || r.Length > r.Size-r.Offset {
		return nil, errno(syscall.EINVAL, "region of %d bytes at %d in %d", r.Length, r.Offset, r.Size)
	}
	return ss.register(r.PD, r.Access, r.Addr, r.Length, fds, func() (*shmem.Region, []byte, error) {
		region, err := shmem.MapRegion(fds[0], int(r.Size))
		if err != nil {
			return nil, nil, err
		}
		return region, region.Bytes()[r.Offset : r.Offset+r.Length : r.Offset+r.Length], nil
	})
}

// regMRSegments registers a region whose pages lie on several memfds
// (abi.RegMRSegmentsRequest), mapped end to end; it takes the descriptors
// once they are mapped.
func (ss *session) regMRSegments(r *abi.RegMRSegmentsRequest, fds received) (*abi.RegMRReply, error) {
	segs := make([]shmem.Segment, r.NumSegments)
	var total uint64
	for i := range segs {
		sg := r.Segments[i]
		if sg.Size > 1<<40 || sg.Length > 1<<40 || sg.Offset > 1<<40 {
			return nil, errno(syscall.EINVAL, "segment %d: %d bytes at %d of %d", i, sg.Length, sg.Offset, sg.Size)
		}
		segs[i] = shmem.Segment{Fd: fds[i], Offset: int(sg.Offset), Length: int(sg.Length), Size: int(sg.Size)}
		total += sg.Length
	}
	// The segments hold the region and no whole segment more.
	first, last := r.Segments[0].Length, r.Segments[r.NumSegments-1].Length
	if r.Length == 0 || r.Length > 1<<40 || r.Addr > ^uint64(0)-r.Length || r.Lead >= first ||
		r.Lead+r.Length > total || total-last >= r.Lead+r.Length {
		return nil, errno(syscall.EINVAL, "region of %d bytes at %#x, %d bytes into %d bytes of segments", r.Length, r.Addr, r.Lead, total)
	}
	return ss.register(r.PD, r.Access, r.Addr, r.Length, fds, func() (*shmem.Region, []byte, error) {
		region, err := shmem.MapSegments(segs)
		if err != nil {
			return nil, nil, err
		}
		return region, region.Bytes()[r.Lead : r.Lead+r.Length : r.Lead+r.Length], nil
	})
}

// register checks a registration against the PD and the limits, maps its
// memory with mapMem — which, when it succeeds, takes every one of fds —
// and registers it.
func (ss *session) register(pdh abi.Handle, access uint32, addr, length uint64, fds received,
	mapMem func() (*shmem.Region, []byte, error)) (*abi.RegMRReply, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	pd := ss.pds[pdh]
	lim := ss.srv.cfg.Limits
	switch {
	case pd == nil:
		return nil, errno(syscall.EINVAL, "no PD %d", pdh)
	case len(ss.mrs) >= lim.MRs:
		return nil, errno(syscall.ENOMEM, "MR limit %d", lim.MRs)
	case ss.mrBytes+int64(length) > lim.MRBytes:
		return nil, errno(syscall.ENOMEM, "MR bytes limit %d", lim.MRBytes)
	case access&^0xF != 0 || access&(2|8) != 0 && access&1 == 0:
		// IBA 10.6.3.1: remote write or atomic needs local write.
		return nil, errno(syscall.EINVAL, "access flags %#x", access)
	}
	pools := ss.srv.pools
	if err := pools.takeObject(&pools.mrs, "MR"); err != nil {
		return nil, err
	}
	if !pools.mrBytes.take(int64(length)) {
		pools.giveObject(&pools.mrs)
		return nil, errno(syscall.ENOMEM, "the appliance's MR bytes limit %d (all clients together)", pools.mrBytes.max)
	}
	giveBack := func() {
		pools.giveObject(&pools.mrs)
		pools.mrBytes.give(int64(length))
	}
	region, buf, err := mapMem()
	if err != nil {
		giveBack()
		return nil, errno(syscall.EINVAL, "%v", err)
	}
	for i := range fds {
		fds.take(i)
	}
	mr, err := ss.dev.Engine.Memory().Register(pd.pd, addr, buf, abi.Access(access))
	if err != nil {
		region.Close()
		giveBack()
		return nil, err
	}
	h := ss.newHandle()
	ss.mrs[h] = &mrObj{pd: pd, mr: mr, region: region, length: int64(length)}
	ss.mrBytes += int64(length)
	return &abi.RegMRReply{Handle: h, LKey: mr.LKey, RKey: mr.RKey}, nil
}

// createChannel makes a completion channel. A client at its own channel
// limit gets EMFILE, as from a process whose descriptor table is full,
// for a channel is a descriptor in the kernel's verbs; the appliance
// out of channels or descriptors for all clients gives ENFILE, as a
// system out of files does.
func (ss *session) createChannel() (abi.Handle, int, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if lim := ss.srv.cfg.Limits.Channels; len(ss.chans) >= lim {
		return 0, 0, errno(syscall.EMFILE, "completion channel limit %d", lim)
	}
	pools := ss.srv.pools
	if !pools.channels.take(1) {
		return 0, 0, errno(syscall.ENFILE, "the appliance's completion channel limit %d (all clients together)", pools.channels.max)
	}
	if err := pools.takeFds(fdsObject); err != nil {
		pools.channels.give(1)
		return 0, 0, err
	}
	bell, err := shmem.NewDoorbell()
	if err != nil {
		pools.giveObject(&pools.channels)
		return 0, 0, err
	}
	h := ss.newHandle()
	ss.chans[h] = &chanObj{bell: bell}
	return h, bell.Fd(), nil
}

// cqObj is a CQ: the transport's queue, drained into the shared ring.
type cqObj struct {
	tcq    *transport.CQ
	region *shmem.Region
	ring   *shmem.Ring
	state  []byte
	ch     *chanObj
	refs   int

	mu      sync.Mutex // one producer of the ring at a time
	wcs     [32]transport.WC
	lost    atomic.Bool
	onError func()
}

func (c *cqObj) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.region.Close()
	c.ring = nil
	if c.ch != nil {
		c.ch.refs--
	}
}

// pump moves completions from the transport's CQ to the shared ring and
// signals the completion channel when the client armed it.
func (c *cqObj) pump() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ring == nil {
		return
	}
	moved := 0
	for {
		free := c.ring.Free()
		if free == 0 {
			break
		}
		n := c.tcq.Poll(c.wcs[:min(free, len(c.wcs))])
		for i := range n {
			putWC(c.ring.ReserveAt(i), &c.wcs[i])
		}
		if n > 0 {
			c.ring.CommitN(n)
			moved += n
		}
		if n < len(c.wcs) {
			break
		}
	}
	// The client's CQ is the ring, of the depth ibv_create_cq reported:
	// a completion more while it is full overruns it (IBV_EVENT_CQ_ERR),
	// though the transport's queue keeps it for now.
	overrun := c.ring.Free() == 0 && c.tcq.Len() > 0
	if (overrun || c.tcq.Overflowed()) && !c.lost.Swap(true) {
		abi.Word32(c.state, abi.CQOverflow).Store(1)
		if c.onError != nil {
			c.onError()
		}
	}
	if moved > 0 && c.ch != nil && abi.Word32(c.state, abi.CQArmed).Swap(0) != 0 {
		abi.Word32(c.state, abi.CQFired).Store(1)
		_ = c.ch.bell.Ring()
	}
}

// push adds a completion made by the appliance itself (a work request
// the transport refused).
func (c *cqObj) push(wc *transport.WC) {
	c.mu.Lock()
	if c.ring != nil {
		if slot := c.ring.Reserve(); slot != nil {
			putWC(slot, wc)
			c.ring.Commit()
		}
	}
	c.mu.Unlock()
	c.pump()
}

func putWC(slot []byte, wc *transport.WC) {
	e := abi.CQE{WRID: wc.ID, Status: uint8(wc.Status), Opcode: uint8(wc.Opcode), SL: wc.SL, VendorErr: wc.VendorErr,
		ByteLen: wc.ByteLen, Imm: wc.Imm, QPNum: wc.QPNum, SrcQP: wc.SrcQP, Flags: wc.Flags, PKeyIndex: wc.PKeyIndex, SLID: wc.SLID}
	e.Put(slot)
}

func (ss *session) createCQ(r *abi.CreateCQRequest) (*abi.CreateCQReply, int, error) {
	if r.Depth == 0 || r.Depth > maxCQE {
		return nil, 0, errno(syscall.EINVAL, "CQ of %d entries, at most %d", r.Depth, maxCQE)
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.cqs) >= ss.srv.cfg.Limits.CQs {
		return nil, 0, errno(syscall.ENOMEM, "CQ limit %d", ss.srv.cfg.Limits.CQs)
	}
	var ch *chanObj
	if r.Channel != 0 {
		if ch = ss.chans[r.Channel]; ch == nil {
			return nil, 0, errno(syscall.EINVAL, "no channel %d", r.Channel)
		}
	}
	pools := ss.srv.pools
	if err := pools.takeObject(&pools.cqs, "CQ"); err != nil {
		return nil, 0, err
	}
	depth := nextPow2(r.Depth)
	size := abi.StateBytes + shmem.RingBytes(int(depth), abi.CQESlot)
	region, err := shmem.NewRegion("taproce-cq", size)
	if err != nil {
		pools.giveObject(&pools.cqs)
		return nil, 0, err
	}
	ring, err := shmem.InitRing(region.Bytes()[abi.StateBytes:], int(depth), abi.CQESlot)
	if err != nil {
		region.Close()
		pools.giveObject(&pools.cqs)
		return nil, 0, err
	}
	h := ss.newHandle()
	c := &cqObj{region: region, ring: ring, state: region.Bytes()[:abi.StateBytes], ch: ch}
	c.onError = func() { ss.event(abi.EventCQErr, h) }
	c.tcq = transport.NewCQ(int(depth), c.pump)
	if ch != nil {
		ch.refs++
	}
	ss.cqs[h] = c
	return &abi.CreateCQReply{Handle: h, Depth: depth, Size: uint64(region.Size())}, region.Fd(), nil
}

// qpObj is a QP with its shared send and receive rings.
type qpObj struct {
	qp       *transport.QP
	pd       *pdObj
	scq, rcq *cqObj
	srq      *srqObj
	region   *shmem.Region
	sq, rq   *shmem.Ring
	state    []byte
	typ      abi.QPType
	caps     abi.QPCaps
	rejected atomic.Uint64 // send WQEs the appliance completed itself
	rb       refillBuf
	attr     abi.QPAttr // as last modified, for query
	av       transport.AddressVector

	smu  sync.Mutex // guards the region against the engine's callbacks
	dead bool
	rmu  sync.Mutex // one consumer of the receive ring: the poller or Refill
	// wake rings the session's poller (when the QP enters ERROR: the
	// receives posted since must be flushed).
	wake func()
}

// refill adds the receive WQEs waiting in the shared ring straight to the
// transport (an engine callback when a packet finds the queue empty). If
// the poller is busy with the ring, it is about to post them anyway.
func (q *qpObj) refill(add func(transport.RecvWR) bool) {
	if !q.rmu.TryLock() {
		return
	}
	defer q.rmu.Unlock()
	refillRing(q.rq, &q.rb, add)
}

// refillBuf is the conversion space of a refill.
type refillBuf struct {
	w    abi.RecvWQE
	sges [abi.MaxSGE]transport.SGE
}

func refillRing(r *shmem.Ring, b *refillBuf, add func(transport.RecvWR) bool) {
	n := r.Len()
	k := 0
	for ; k < n; k++ {
		b.w.Get(r.PeekAt(k))
		if !add(recvWR(&b.w, b.sges[:])) {
			break
		}
	}
	if k > 0 {
		r.ReleaseN(k)
	}
}

func (q *qpObj) close() {
	q.smu.Lock()
	defer q.smu.Unlock()
	q.dead = true
	q.region.Close()
}

// stateChanged publishes the QP's state (an engine callback). A QP
// entering ERROR wakes the poller, which then flushes the receives posted
// since and has the client ring for later ones (prepareSleep).
func (q *qpObj) stateChanged(st abi.QPState) {
	q.smu.Lock()
	defer q.smu.Unlock()
	if !q.dead {
		abi.Word32(q.state, abi.QPStateWord).Store(uint32(st))
		if st == abi.QPSErr && q.wake != nil {
			q.wake()
		}
	}
}

// inError reports whether the QP's published state is ERROR.
func (q *qpObj) inError() bool {
	q.smu.Lock()
	defer q.smu.Unlock()
	return !q.dead && abi.Word32(q.state, abi.QPStateWord).Load() == uint32(abi.QPSErr)
}

// retired publishes the retire counts (an engine callback).
func (q *qpObj) retired(send, recv uint64) {
	q.smu.Lock()
	defer q.smu.Unlock()
	if !q.dead {
		abi.Word64(q.state, abi.QPSendRetired).Store(send + q.rejected.Load())
		abi.Word64(q.state, abi.QPRecvRetired).Store(recv)
	}
}

// kill ends a QP whose client is gone: it answers its peers with NAKs for
// a while (transport.Engine.Kill) so they fail rather than hang.
func (q *qpObj) kill(d *Device, linger time.Duration) {
	if d != nil {
		killQP(d.Engine, q.qp, linger)
	}
	q.scq.refs--
	q.rcq.refs--
	if q.srq != nil {
		q.srq.refs--
	}
	q.close()
}

func (ss *session) createQP(r *abi.CreateQPRequest) (*abi.CreateQPReply, int, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	c := r.Caps
	typ := abi.QPType(r.Type)
	pd, scq, rcq := ss.pds[r.PD], ss.cqs[r.SendCQ], ss.cqs[r.RecvCQ]
	var srq *srqObj
	if r.SRQ != 0 {
		if srq = ss.srqs[r.SRQ]; srq == nil {
			return nil, 0, errno(syscall.EINVAL, "no SRQ %d", r.SRQ)
		}
	}
	switch {
	case len(ss.qps) >= ss.srv.cfg.Limits.QPs:
		return nil, 0, errno(syscall.ENOMEM, "QP limit %d", ss.srv.cfg.Limits.QPs)
	case pd == nil || scq == nil || rcq == nil:
		return nil, 0, errno(syscall.EINVAL, "QP needs a PD and CQs")
	case typ != abi.RC && typ != abi.UC && typ != abi.UD:
		return nil, 0, errno(syscall.EINVAL, "QP type %d", r.Type)
	// Either queue may be empty, as rxe allows: qperf's one-way tests
	// create a QP that only sends and one that only receives.
	case c.MaxSendWR > maxQPWR || c.MaxRecvWR > maxQPWR:
		return nil, 0, errno(syscall.EINVAL, "queue sizes %d/%d, at most %d", c.MaxSendWR, c.MaxRecvWR, maxQPWR)
	case c.MaxSendSGE > abi.MaxSGE || c.MaxRecvSGE > abi.MaxSGE || c.MaxInline > abi.MaxInline:
		return nil, 0, errno(syscall.EINVAL, "%d/%d SGEs (at most %d), %d inline (at most %d)",
			c.MaxSendSGE, c.MaxRecvSGE, abi.MaxSGE, c.MaxInline, abi.MaxInline)
	}
	pools := ss.srv.pools
	if err := pools.takeObject(&pools.qps, "QP"); err != nil {
		return nil, 0, err
	}
	ok := false
	defer func() {
		if !ok {
			pools.giveObject(&pools.qps)
		}
	}()
	if srq != nil {
		c.MaxRecvWR, c.MaxRecvSGE = 0, 0
	}
	c.MaxSendSGE, c.MaxRecvSGE, c.MaxInline = abi.MaxSGE, abi.MaxSGE, abi.MaxInline
	// The send ring holds twice the queue: the poller releases a slot only
	// after handing its request to the transport, whose completion the
	// client may see (and post again after) first.
	sqSlots, rqSlots := nextPow2(max(2*c.MaxSendWR, 1)), nextPow2(max(c.MaxRecvWR, 1))
	sqOff := abi.StateBytes
	rqOff := abi.RingOffset(sqOff + shmem.RingBytes(int(sqSlots), abi.SendSlot))
	size := rqOff + shmem.RingBytes(int(rqSlots), abi.RecvSlot)
	region, err := shmem.NewRegion("taproce-qp", size)
	if err != nil {
		return nil, 0, err
	}
	mem := region.Bytes()
	sq, err1 := shmem.InitRing(mem[sqOff:rqOff], int(sqSlots), abi.SendSlot)
	rq, err2 := shmem.InitRing(mem[rqOff:], int(rqSlots), abi.RecvSlot)
	if err1 != nil || err2 != nil {
		region.Close()
		return nil, 0, fmt.Errorf("rings: %v %v", err1, err2)
	}
	q := &qpObj{pd: pd, scq: scq, rcq: rcq, srq: srq, region: region, sq: sq, rq: rq, state: mem[:abi.StateBytes], typ: typ, caps: c}
	if kick := ss.kick; kick != nil {
		q.wake = func() { _ = kick.Ring() }
	}
	cfg := transport.QPConfig{Type: typ, PD: pd.pd, SendCQ: scq.tcq, RecvCQ: rcq.tcq,
		MaxSendWR: int(c.MaxSendWR), MaxRecvWR: int(c.MaxRecvWR), MaxInline: abi.MaxInline, SigAll: r.SigAll != 0,
		OnRetire: q.retired, OnState: q.stateChanged, Refill: q.refill}
	if srq != nil {
		cfg.SRQ = srq.srq
	}
	qp, err := ss.dev.Engine.CreateQP(cfg)
	if err != nil {
		region.Close()
		return nil, 0, err
	}
	q.qp = qp
	h := ss.newHandle()
	ss.qps[h] = q
	scq.refs++
	rcq.refs++
	if srq != nil {
		srq.refs++
	}
	ss.rebuildRings()
	ok = true
	return &abi.CreateQPReply{Handle: h, QPN: qp.Num(), Caps: c, Size: uint64(region.Size()),
		SQOff: uint64(sqOff), RQOff: uint64(rqOff)}, region.Fd(), nil
}

// hopLimit is what ib_core puts in a RoCE v2 address vector whatever the
// application asked: the route's hop limit, 64 on Linux.
const hopLimit = 64

func (ss *session) modifyQP(r *abi.ModifyQPRequest) error {
	ss.mu.Lock()
	q := ss.qps[r.Handle]
	dev := ss.dev
	ss.mu.Unlock()
	if q == nil {
		return errno(syscall.EINVAL, "no QP %d", r.Handle)
	}
	a := &r.Attr
	mask := abi.AttrMask(r.Mask)
	attr := transport.QPAttr{
		State: abi.QPState(a.State), CurState: abi.QPState(a.CurState), Access: abi.Access(a.Access),
		PKeyIndex: a.PKeyIndex, Port: a.Port, QKey: a.QKey, PathMTU: abi.MTU(a.PathMTU), DestQPN: a.DestQPN,
		RQPSN: roce.PSN(a.RQPSN), SQPSN: roce.PSN(a.SQPSN), Timeout: a.Timeout, RetryCnt: a.RetryCnt, RNRRetry: a.RNRRetry,
		MinRNRTimer: a.MinRNRTimer, MaxRdAtomic: a.MaxRdAtomic, MaxDestRdAtomic: a.MaxDestRdAtomic,
	}
	if mask&abi.QPAV != 0 {
		av, err := ss.resolveAV(dev, a.DGID, a.SGIDIndex, a.FlowLabel, a.TClass)
		if err != nil {
			return err
		}
		attr.AV = av
	}
	if err := q.qp.Modify(&attr, mask); err != nil {
		return err
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	merge(&q.attr, a, r.Mask)
	if mask&abi.QPAV != 0 {
		q.av = attr.AV
	}
	return nil
}

// resolveAV turns a GID into an address vector with the next hop's MAC.
func (ss *session) resolveAV(dev *Device, dgid [16]byte, sgid uint8, flow uint32, tclass uint8) (transport.AddressVector, error) {
	gids := dev.GIDs()
	if int(sgid) >= len(gids) {
		return transport.AddressVector{}, errno(syscall.EINVAL, "source GID index %d of %d", sgid, len(gids))
	}
	dst := netip.AddrFrom16(dgid).Unmap()
	if !dst.IsValid() || dst.IsUnspecified() || dst.Is4() != gids[sgid].IsIPv4() {
		return transport.AddressVector{}, errno(syscall.EINVAL, "destination GID %v from source GID %v", dst, gids[sgid])
	}
	ctx, cancel := context.WithTimeout(ss.ctx, 5*time.Second)
	defer cancel()
	mac, err := dev.Resolve(ctx, dst)
	if err != nil {
		return transport.AddressVector{}, errno(syscall.EHOSTUNREACH, "%v: %v", dst, err)
	}
	return transport.AddressVector{DstIP: dst, DstMAC: mac, SGIDIndex: sgid, FlowLabel: flow, HopLimit: hopLimit, TClass: tclass}, nil
}

// merge records the modified attributes for query.
func merge(dst, src *abi.QPAttr, mask uint32) {
	m := abi.AttrMask(mask)
	set := func(bit abi.AttrMask, f func()) {
		if m&bit != 0 {
			f()
		}
	}
	set(abi.QPStateMask, func() { dst.State = src.State })
	set(abi.QPAccessFlags, func() { dst.Access = src.Access })
	set(abi.QPPKeyIndex, func() { dst.PKeyIndex = src.PKeyIndex })
	set(abi.QPPort, func() { dst.Port = src.Port })
	set(abi.QPQKey, func() { dst.QKey = src.QKey })
	set(abi.QPAV, func() {
		dst.DGID, dst.SGIDIndex, dst.FlowLabel, dst.TClass, dst.HopLimit = src.DGID, src.SGIDIndex, src.FlowLabel, src.TClass, hopLimit
	})
	set(abi.QPPathMTU, func() { dst.PathMTU = src.PathMTU })
	set(abi.QPTimeout, func() { dst.Timeout = src.Timeout })
	set(abi.QPRetryCnt, func() { dst.RetryCnt = src.RetryCnt })
	set(abi.QPRNRRetry, func() { dst.RNRRetry = src.RNRRetry })
	set(abi.QPRQPSN, func() { dst.RQPSN = src.RQPSN })
	set(abi.QPMaxQPRdAtomic, func() { dst.MaxRdAtomic = src.MaxRdAtomic })
	set(abi.QPMinRNRTimer, func() { dst.MinRNRTimer = src.MinRNRTimer })
	set(abi.QPSQPSN, func() { dst.SQPSN = src.SQPSN })
	set(abi.QPMaxDestRdAtomic, func() { dst.MaxDestRdAtomic = src.MaxDestRdAtomic })
	set(abi.QPDestQPN, func() { dst.DestQPN = src.DestQPN })
}

func (ss *session) queryQP(h abi.Handle) (*abi.QueryQPReply, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	q := ss.qps[h]
	if q == nil {
		return nil, errno(syscall.EINVAL, "no QP %d", h)
	}
	a := q.attr
	a.State = uint8(q.qp.State())
	a.CurState = a.State
	a.DMAC = q.av.DstMAC
	return &abi.QueryQPReply{Attr: a, Caps: q.caps}, nil
}

// srqObj is an SRQ with its shared receive ring.
type srqObj struct {
	srq    *transport.SRQ
	pd     *pdObj
	region *shmem.Region
	rq     *shmem.Ring
	state  []byte
	refs   int

	smu  sync.Mutex
	dead bool
	rmu  sync.Mutex // one consumer of the ring: the poller or Refill
	rb   refillBuf
}

func (s *srqObj) refill(add func(transport.RecvWR) bool) {
	if !s.rmu.TryLock() {
		return
	}
	defer s.rmu.Unlock()
	refillRing(s.rq, &s.rb, add)
}

func (s *srqObj) close() {
	s.smu.Lock()
	defer s.smu.Unlock()
	s.dead = true
	s.region.Close()
}

func (s *srqObj) retired(n uint64) {
	s.smu.Lock()
	defer s.smu.Unlock()
	if !s.dead {
		abi.Word64(s.state, abi.SRQRetired).Store(n)
	}
}

func (ss *session) createSRQ(r *abi.CreateSRQRequest) (*abi.CreateSRQReply, int, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	pd := ss.pds[r.PD]
	switch {
	case len(ss.srqs) >= ss.srv.cfg.Limits.SRQs:
		return nil, 0, errno(syscall.ENOMEM, "SRQ limit %d", ss.srv.cfg.Limits.SRQs)
	case pd == nil:
		return nil, 0, errno(syscall.EINVAL, "no PD %d", r.PD)
	case r.MaxWR == 0 || r.MaxWR > maxSRQWR || r.MaxSGE > abi.MaxSGE || r.Limit > r.MaxWR:
		return nil, 0, errno(syscall.EINVAL, "SRQ of %d WRs, %d SGEs, limit %d", r.MaxWR, r.MaxSGE, r.Limit)
	}
	pools := ss.srv.pools
	if err := pools.takeObject(&pools.srqs, "SRQ"); err != nil {
		return nil, 0, err
	}
	slots := nextPow2(r.MaxWR)
	rqOff := abi.StateBytes
	region, err := shmem.NewRegion("taproce-srq", rqOff+shmem.RingBytes(int(slots), abi.RecvSlot))
	if err != nil {
		pools.giveObject(&pools.srqs)
		return nil, 0, err
	}
	ring, err := shmem.InitRing(region.Bytes()[rqOff:], int(slots), abi.RecvSlot)
	if err != nil {
		region.Close()
		pools.giveObject(&pools.srqs)
		return nil, 0, err
	}
	h := ss.newHandle()
	s := &srqObj{pd: pd, region: region, rq: ring, state: region.Bytes()[:abi.StateBytes]}
	srq, err := ss.dev.Engine.CreateSRQ(transport.SRQConfig{PD: pd.pd, MaxWR: int(r.MaxWR),
		OnLimit:  func() { ss.event(abi.EventSRQLimitReached, h) },
		OnRetire: s.retired, Refill: s.refill})
	if err != nil {
		region.Close()
		pools.giveObject(&pools.srqs)
		return nil, 0, err
	}
	if r.Limit > 0 {
		_ = srq.Arm(int(r.Limit))
	}
	s.srq = srq
	ss.srqs[h] = s
	ss.rebuildRings()
	return &abi.CreateSRQReply{Handle: h, MaxWR: r.MaxWR, Size: uint64(region.Size()), RQOff: uint64(rqOff)}, region.Fd(), nil
}

func (ss *session) modifySRQ(r *abi.ModifySRQRequest) error {
	ss.mu.Lock()
	s := ss.srqs[r.Handle]
	ss.mu.Unlock()
	if s == nil {
		return errno(syscall.EINVAL, "no SRQ %d", r.Handle)
	}
	return s.srq.Arm(int(r.Limit))
}

func (ss *session) createAH(r *abi.CreateAHRequest) (abi.Handle, error) {
	ss.mu.Lock()
	pd, dev := ss.pds[r.PD], ss.dev
	n := len(ss.ahs)
	ss.mu.Unlock()
	if pd == nil {
		return 0, errno(syscall.EINVAL, "no PD %d", r.PD)
	}
	if n >= ss.srv.cfg.Limits.AHs {
		return 0, errno(syscall.ENOMEM, "AH limit %d", ss.srv.cfg.Limits.AHs)
	}
	av, err := ss.resolveAV(dev, r.DGID, r.SGIDIndex, r.FlowLabel, r.TClass)
	if err != nil {
		return 0, err
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if p := &ss.srv.pools.ahs; !p.take(1) {
		return 0, errno(syscall.ENOMEM, "the appliance's AH limit %d (all clients together)", p.max)
	}
	h := ss.newHandle()
	ss.ahs[h] = &ahObj{pd: pd, ah: transport.AH{DstIP: av.DstIP.As16(), DstMAC: av.DstMAC, SGIDIndex: av.SGIDIndex,
		HopLimit: av.HopLimit, TClass: av.TClass, FlowLabel: av.FlowLabel}}
	return h, nil
}

// destroy handles the destroy and dealloc operations, refusing with EBUSY
// what is still in use, as libibverbs does.
func (ss *session) destroy(op abi.Op, h abi.Handle) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	dev := ss.dev
	pools := ss.srv.pools
	missing := errno(syscall.EINVAL, "%v: no object %d", op, h)
	switch op {
	case abi.OpDeallocPD:
		pd := ss.pds[h]
		if pd == nil {
			return missing
		}
		for _, m := range ss.mrs {
			if m.pd == pd {
				return errno(syscall.EBUSY, "the PD has memory regions")
			}
		}
		for _, q := range ss.qps {
			if q.pd == pd {
				return errno(syscall.EBUSY, "the PD has queue pairs")
			}
		}
		for _, s := range ss.srqs {
			if s.pd == pd {
				return errno(syscall.EBUSY, "the PD has SRQs")
			}
		}
		for _, a := range ss.ahs {
			if a.pd == pd {
				return errno(syscall.EBUSY, "the PD has address handles")
			}
		}
		delete(ss.pds, h)
		pools.pds.give(1)
	case abi.OpDeregMR:
		m := ss.mrs[h]
		if m == nil {
			return missing
		}
		if err := dev.Engine.Memory().Deregister(m.mr); err != nil {
			return err
		}
		m.release(dev.Engine)
		ss.mrBytes -= m.length
		delete(ss.mrs, h)
		pools.giveObject(&pools.mrs)
		pools.mrBytes.give(m.length)
	case abi.OpDestroyChannel:
		c := ss.chans[h]
		if c == nil {
			return missing
		}
		if c.refs > 0 {
			return errno(syscall.EBUSY, "CQs use the channel")
		}
		c.close()
		delete(ss.chans, h)
		pools.giveObject(&pools.channels)
	case abi.OpDestroyCQ:
		c := ss.cqs[h]
		if c == nil {
			return missing
		}
		if c.refs > 0 {
			return errno(syscall.EBUSY, "queue pairs use the CQ")
		}
		c.close()
		delete(ss.cqs, h)
		pools.giveObject(&pools.cqs)
	case abi.OpDestroyQP:
		q := ss.qps[h]
		if q == nil {
			return missing
		}
		// A connected RC QP lingers, answering its peer's retransmissions
		// of what it executed (transport.Engine.Close).
		if err := dev.Engine.Close(q.qp, ss.srv.cfg.Linger); err != nil {
			return err
		}
		q.scq.refs--
		q.rcq.refs--
		if q.srq != nil {
			q.srq.refs--
		}
		q.close()
		delete(ss.qps, h)
		pools.giveObject(&pools.qps)
		ss.rebuildRings()
	case abi.OpDestroySRQ:
		s := ss.srqs[h]
		if s == nil {
			return missing
		}
		if s.refs > 0 {
			return errno(syscall.EBUSY, "queue pairs use the SRQ")
		}
		if err := dev.Engine.DestroySRQ(s.srq); err != nil {
			return err
		}
		s.close()
		delete(ss.srqs, h)
		pools.giveObject(&pools.srqs)
		ss.rebuildRings()
	case abi.OpDestroyAH:
		if ss.ahs[h] == nil {
			return missing
		}
		delete(ss.ahs, h)
		pools.ahs.give(1)
	}
	return nil
}

// killQP ends a QP whose client is gone (transport.Engine.Kill).
func killQP(e *transport.Engine, qp *transport.QP, linger time.Duration) {
	_ = e.Kill(qp, linger)
}
