package control

import (
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/taproce/taproce/shmem"
	"github.com/taproce/taproce/verbs/abi"
)

// Limits bound what one client (one connection) may hold; zero means
// the default (DefaultLimits).
type Limits struct {
	QPs, CQs, SRQs, MRs, PDs, AHs int
	// Channels are completion channels, each an eventfd.
	Channels int
	// MRBytes bounds the bytes of all the client's memory regions.
	MRBytes int64
}

// DefaultLimits are one client's limits unless configured.
var DefaultLimits = Limits{QPs: 1024, CQs: 1024, SRQs: 256, MRs: 4096, PDs: 256, AHs: 4096, Channels: 1024, MRBytes: 16 << 30}

// withDefaults fills the zero fields of l from d.
func (l Limits) withDefaults(d Limits) Limits {
	for _, f := range []struct{ v, d *int }{
		{&l.QPs, &d.QPs}, {&l.CQs, &d.CQs}, {&l.SRQs, &d.SRQs}, {&l.MRs, &d.MRs},
		{&l.PDs, &d.PDs}, {&l.AHs, &d.AHs}, {&l.Channels, &d.Channels},
	} {
		if *f.v <= 0 {
			*f.v = *f.d
		}
	}
	if l.MRBytes <= 0 {
		l.MRBytes = d.MRBytes
	}
	return l
}

// ApplianceLimits bound what all clients together may hold and how many
// may be connected, so that clients each within their own Limits cannot
// together exhaust the appliance; zero means the default
// (DefaultApplianceLimits).
type ApplianceLimits struct {
	// Limits bound the objects of all clients together.
	Limits
	// Connections bounds the clients connected at once, and
	// ConnectionsPerUID those of one user (SO_PEERCRED's uid), so that
	// one user's flood of connections leaves room for the others.
	Connections, ConnectionsPerUID int
	// Descriptors bounds the descriptors the appliance holds for its
	// clients: their sockets, doorbells, completion channels, and the
	// memfds of their rings and memory regions. The default is three
	// quarters of the process's RLIMIT_NOFILE, which leaves the rest to
	// the appliance's own (ports, the admin and metrics servers).
	Descriptors int
}

// DefaultApplianceLimits are the appliance-wide limits unless configured;
// Descriptors is left to RLIMIT_NOFILE (DefaultDescriptors).
var DefaultApplianceLimits = ApplianceLimits{
	Limits:      Limits{QPs: 16384, CQs: 16384, SRQs: 4096, MRs: 65536, PDs: 16384, AHs: 65536, Channels: 16384, MRBytes: 1 << 40},
	Connections: 4096, ConnectionsPerUID: 2048,
}

// DefaultDescriptors returns the descriptors the appliance holds for
// clients unless configured: three quarters of the soft RLIMIT_NOFILE
// (at least 64).
func DefaultDescriptors() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 1 << 30 * 3 / 4
	}
	return max(int(rl.Cur)*3/4, 64)
}

func (l ApplianceLimits) withDefaults() ApplianceLimits {
	d := DefaultApplianceLimits
	l.Limits = l.Limits.withDefaults(d.Limits)
	if l.Connections <= 0 {
		l.Connections = d.Connections
	}
	if l.ConnectionsPerUID <= 0 {
		l.ConnectionsPerUID = d.ConnectionsPerUID
	}
	if l.Descriptors <= 0 {
		l.Descriptors = DefaultDescriptors()
	}
	return l
}

// Descriptors the appliance holds for one client's things.
const (
	// fdsConn is the client's socket.
	fdsConn = 1
	// fdsOpen is the doorbell the client rings the appliance with, a pipe.
	fdsOpen = 2
	// fdsObject is the memfd of a CQ's, QP's or SRQ's rings, or of a
	// memory region, or a completion channel's eventfd.
	fdsObject = 1
)

// A pool is what all clients together may hold of one thing.
type pool struct {
	max  int64
	used atomic.Int64
}

// take reserves n, or reserves nothing and reports false when that would
// exceed the pool's limit.
func (p *pool) take(n int64) bool {
	if p.used.Add(n) > p.max {
		p.used.Add(-n)
		return false
	}
	return true
}

// give returns n.
func (p *pool) give(n int64) { p.used.Add(-n) }

// pools are the appliance-wide counts of ApplianceLimits.
type pools struct {
	qps, cqs, srqs, mrs, pds, ahs, channels, mrBytes, fds pool
}

// held returns what is taken of each pool, by name, leaving out the
// empty ones.
func (ps *pools) held() map[string]int64 {
	out := map[string]int64{}
	for name, p := range map[string]*pool{"qps": &ps.qps, "cqs": &ps.cqs, "srqs": &ps.srqs, "mrs": &ps.mrs, "pds": &ps.pds,
		"ahs": &ps.ahs, "channels": &ps.channels, "mr_bytes": &ps.mrBytes, "descriptors": &ps.fds} {
		if n := p.used.Load(); n != 0 {
			out[name] = n
		}
	}
	return out
}

func newPools(l ApplianceLimits) *pools {
	p := &pools{}
	for _, x := range []struct {
		p *pool
		n int64
	}{
		{&p.qps, int64(l.QPs)}, {&p.cqs, int64(l.CQs)}, {&p.srqs, int64(l.SRQs)}, {&p.mrs, int64(l.MRs)},
		{&p.pds, int64(l.PDs)}, {&p.ahs, int64(l.AHs)}, {&p.channels, int64(l.Channels)},
		{&p.mrBytes, l.MRBytes}, {&p.fds, int64(l.Descriptors)},
	} {
		x.p.max = x.n
	}
	return p
}

// takeObject reserves one object of p and the descriptor it holds, or
// returns ENOMEM, libibverbs' answer for a device out of resources, naming
// what ran out: the kernel's verbs hold no descriptor for a QP, CQ, SRQ
// or memory region, so running out of the appliance's is running out of
// the device's resources.
func (ps *pools) takeObject(p *pool, what string) error {
	if !p.take(1) {
		return errno(syscall.ENOMEM, "the appliance's %s limit %d (all clients together)", what, p.max)
	}
	if !ps.fds.take(fdsObject) {
		p.give(1)
		return errno(syscall.ENOMEM, "the appliance's descriptor limit %d (all clients together)", ps.fds.max)
	}
	return nil
}

// giveObject returns one object of p and its descriptor.
func (ps *pools) giveObject(p *pool) {
	p.give(1)
	ps.fds.give(fdsObject)
}

// takeFds reserves n descriptors for a file the client gets (a device's
// doorbell, a completion channel), or returns ENFILE, what opening a file
// returns when the system's file table is full: the appliance's
// descriptors are shared by every client as the system's are.
func (ps *pools) takeFds(n int64) error {
	if !ps.fds.take(n) {
		return errno(syscall.ENFILE, "the appliance's descriptor limit %d (all clients together)", ps.fds.max)
	}
	return nil
}

// Connections over a limit are refused: the first request is answered
// with the errno, then the connection is closed.
const (
	// maxRefusing bounds the refused connections waiting for their first
	// request at once; beyond it they are closed at once, unanswered.
	maxRefusing = 16
	// refuseWait bounds how long a refused connection may take to send
	// its first request.
	refuseWait = time.Second
)

// admit counts a new connection of user uid against the limits, or
// returns why it is refused: EAGAIN when the appliance or the user has
// as many connections as allowed — the answer of connect(2) on a unix
// socket whose queue is full, telling the client to try again later —
// or ENFILE when the appliance's descriptors for clients are spent.
func (s *Server) admit(uid uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	lim := s.cfg.ApplianceLimits
	switch {
	case s.conns >= lim.Connections:
		return errno(syscall.EAGAIN, "the appliance has %d connections, its limit", s.conns)
	case s.byUID[uid] >= lim.ConnectionsPerUID:
		return errno(syscall.EAGAIN, "user %d has %d connections, the limit per user", uid, s.byUID[uid])
	}
	if err := s.pools.takeFds(fdsConn); err != nil {
		return err
	}
	s.conns++
	s.byUID[uid]++
	return nil
}

// leave uncounts a connection admit counted.
func (s *Server) leave(uid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conns--
	if s.byUID[uid]--; s.byUID[uid] <= 0 {
		delete(s.byUID, uid)
	}
	s.pools.fds.give(fdsConn)
}

// refuse answers the first request on c with the errno of why, then
// closes c; with maxRefusing connections already waiting, it closes c at
// once. Refusals are logged once in a while, not each: a flood would
// flood the log.
func (s *Server) refuse(c *net.UnixConn, why error) {
	n := s.refused.Add(1)
	if n == 1 || n%1000 == 0 {
		s.log.Warn("connections refused", "count", n, "last", why)
	}
	if s.refusing.Add(1) > maxRefusing {
		s.refusing.Add(-1)
		c.Close()
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.refusing.Add(-1)
		c.Close()
		return
	}
	s.waiting[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer s.refusing.Add(-1)
		defer func() {
			s.mu.Lock()
			delete(s.waiting, c)
			s.mu.Unlock()
			c.Close()
		}()
		_ = c.SetDeadline(time.Now().Add(refuseWait))
		buf := make([]byte, requestBuf)
		n, fds, err := shmem.RecvMsg(c, buf, 0)
		closeFds(fds)
		if err != nil {
			return
		}
		h, _, err := abi.DecodeHeader(buf[:n])
		if err != nil || h.Flags != 0 {
			return
		}
		if msg, err := abi.Encode(nil, abi.Header{Op: h.Op, Flags: abi.FlagReply, Seq: h.Seq}, errnoReply(h.Op, abi.ErrnoOf(why))); err == nil {
			_ = shmem.SendMsg(c, msg)
		}
	}()
}

// errnoReply is the reply of op carrying only an errno: the clients open
// with list-devices or open, whose replies are larger; any other op is
// answered as a session answers it before open.
func errnoReply(op abi.Op, e abi.Errno) any {
	switch op {
	case abi.OpListDevices:
		return &abi.ListDevicesReply{Errno: e}
	case abi.OpOpen:
		return &abi.OpenReply{Errno: e}
	}
	return &abi.ErrnoReply{Errno: e}
}
