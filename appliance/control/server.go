// Package control is the appliance's side of the verbs API: it serves
// clients on a unix socket (SOCK_SEQPACKET), keeps each client's verbs
// objects (PDs, MRs, CQs, QPs, SRQs, AHs, completion channels) in the
// transport engine of the device the client opened, and moves work
// requests and completions through rings in memory shared with the
// client (package shmem, layouts in verbs/abi).
//
// A client may open only a device in its own network namespace, learned
// from SO_PEERCRED and /proc/PID/ns/net. Its objects live as long as its
// connection: when the client closes it or dies, everything it made is
// destroyed, and its queue pairs make their peers fail rather than hang.
package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/appliance/poll"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/verbs/abi"
)

// DefaultSocket is where the appliance listens unless configured.
const DefaultSocket = abi.DefaultSocket

// Device is a port as the control server serves it: an rxe-like device
// with one physical port.
type Device struct {
	// Name is the device name clients open (taproce0, …).
	Name string
	// Netns is the inode of the device's network namespace; only clients
	// in that namespace may open it.
	Netns uint64
	// Engine is the port's transport.
	Engine *transport.Engine
	// MAC is the port's address; MTU its netdev MTU.
	MAC roce.MAC
	MTU int
	// GIDs returns the port's GID table.
	GIDs func() []roce.GID
	// Resolve finds the MAC of a destination (ARP/ND or the namespace's
	// neighbours), for address vectors.
	Resolve func(ctx context.Context, a netip.Addr) (roce.MAC, error)
	// Up reports whether the port works (nil: always).
	Up func() bool
	// CM is the port's connection manager, nil for none; SetCMEvents
	// sends its events where the server says (the RDMA CM ops, cm.go).
	CM          *cm.Manager
	SetCMEvents func(func(cm.Event))
	// Route returns the port's source address towards dst, or an error
	// when the port does not reach it (rdma_resolve_addr).
	Route func(dst netip.Addr) (netip.Addr, error)
}

// DefaultSocketMode is the socket file's permission bits unless
// configured: every local user may connect, as every user may open a
// uverbs device where rdma-core is installed; a client may open only its
// own network namespace's device, and the limits bound what it may take.
const DefaultSocketMode os.FileMode = 0o666

// Config describes a control server.
type Config struct {
	// Socket is the path to listen on (default DefaultSocket); a name
	// starting with '@' is an abstract socket, which has no file.
	Socket string
	// SocketMode is the socket file's permission bits (default
	// DefaultSocketMode): connecting takes write permission.
	SocketMode os.FileMode
	// SocketGID, when positive, is the group the socket file is given;
	// 0 leaves the group it was made with, the appliance's own.
	SocketGID int
	// Limits per client, and ApplianceLimits of all clients together.
	Limits          Limits
	ApplianceLimits ApplianceLimits
	// ListAllDevices lists every device to every client, those of other
	// network namespaces marked unusable; by default a client is shown
	// only the devices it may open, for another namespace's device tells
	// its MAC and its addresses (GIDs).
	ListAllDevices bool
	// ReplyTimeout bounds how long a reply or an event waits for room in
	// the client's socket (default DefaultReplyTimeout): a client that
	// leaves them unread is disconnected, where it held the session's
	// memory and goroutines for as long as it liked.
	ReplyTimeout time.Duration
	// Loop drains every client's rings in its passes: the appliance's
	// one polling loop, which reads its ports too — spinning, or blocking
	// on the clients' doorbells as well as the ports (poll.New). Required.
	Loop *poll.Loop
	// Linger is how long a connected RC QP answers its peer after its
	// client destroyed it or died (transport.Engine.Close and Kill;
	// default 30 s).
	Linger time.Duration
	// Logger for the server's events (default slog.Default()).
	Logger *slog.Logger
	// PeerNetns returns the namespace inode of a process (default: from
	// /proc/PID/ns/net); tests replace it.
	PeerNetns func(pid int32) (uint64, error)
}

// Server serves the verbs API.
type Server struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	devices  map[string]*Device
	sessions map[*session]struct{}
	ln       *net.UnixListener
	closed   bool
	wg       sync.WaitGroup
	peak     int                        // most sessions at once since their memory was last released (ebbed)
	ebbing   bool                       // released, and to release again when the last goes
	conns    int                        // connections admitted (admit)
	byUID    map[uint32]int             // of them, each user's
	waiting  map[*net.UnixConn]struct{} // refused, waiting for their first request

	pools    *pools        // what all clients hold
	refused  atomic.Uint64 // connections refused
	refusing atomic.Int32  // refused connections being answered

	owners    sync.Map      // cm.Owner → *session: the sessions that made CM IDs
	nextOwner atomic.Uint64 // the last cm.Owner given out
	// migrateMu serialises the moves of CM IDs between sessions, the
	// one thing that holds two sessions' cmMu at once.
	migrateMu sync.Mutex
	portMu    sync.Mutex
	nextPort  uint16 // the next ephemeral port to try (ephemeralPort)
}

// New returns a server for cfg; Serve starts it.
func New(cfg Config) *Server {
	if cfg.Socket == "" {
		cfg.Socket = DefaultSocket
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.PeerNetns == nil {
		cfg.PeerNetns = ProcNetns
	}
	if cfg.Linger == 0 {
		cfg.Linger = 30 * time.Second
	}
	if cfg.SocketMode == 0 {
		cfg.SocketMode = DefaultSocketMode
	}
	if cfg.ReplyTimeout <= 0 {
		cfg.ReplyTimeout = DefaultReplyTimeout
	}
	cfg.Limits = cfg.Limits.withDefaults(DefaultLimits)
	cfg.ApplianceLimits = cfg.ApplianceLimits.withDefaults()
	return &Server{cfg: cfg, log: cfg.Logger.With("component", "control"), devices: map[string]*Device{}, sessions: map[*session]struct{}{},
		pools: newPools(cfg.ApplianceLimits), byUID: map[uint32]int{}, waiting: map[*net.UnixConn]struct{}{}}
}

// DefaultReplyTimeout is Config.ReplyTimeout unless configured.
const DefaultReplyTimeout = 10 * time.Second

// ProcNetns returns the inode of process pid's network namespace.
func ProcNetns(pid int32) (uint64, error) {
	return NetnsInode(fmt.Sprintf("/proc/%d/ns/net", pid))
}

// NetnsInode returns the inode of the namespace at path (a /proc/PID/ns/net
// link or a bind mount under /run/netns).
func NetnsInode(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("control: namespace %s: %w", path, err)
	}
	return st.Ino, nil
}

// AddDevice makes d available to clients.
func (s *Server) AddDevice(d *Device) {
	if d.CM != nil && d.SetCMEvents != nil {
		d.SetCMEvents(func(ev cm.Event) { s.cmEvent(d, ev) })
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.devices[d.Name] = d
}

// ephemeralPort returns a port for an ID that listens without one, from
// Linux's default ip_local_port_range (32768–60999), in turn; the
// manager refuses one a listener holds (EADDRINUSE), as the kernel
// would have skipped it.
func (s *Server) ephemeralPort() uint16 {
	s.portMu.Lock()
	defer s.portMu.Unlock()
	if s.nextPort < 32768 || s.nextPort > 60999 {
		s.nextPort = 32768 + uint16(time.Now().UnixNano()%28232)
	}
	p := s.nextPort
	s.nextPort++
	return p
}

// RemoveDevice withdraws a device: its clients get IBV_EVENT_DEVICE_FATAL
// and their QPs go to the error state.
func (s *Server) RemoveDevice(name string) {
	s.mu.Lock()
	d := s.devices[name]
	delete(s.devices, name)
	var users []*session
	for ss := range s.sessions {
		if ss.device() == d {
			users = append(users, ss)
		}
	}
	s.mu.Unlock()
	for _, ss := range users {
		ss.deviceGone()
	}
}

// PortEvent tells the clients of a device that its port failed (up
// false: IBV_EVENT_PORT_ERR) or works again (IBV_EVENT_PORT_ACTIVE).
func (s *Server) PortEvent(name string, up bool) {
	s.mu.Lock()
	d := s.devices[name]
	var users []*session
	for ss := range s.sessions {
		if d != nil && ss.device() == d {
			users = append(users, ss)
		}
	}
	s.mu.Unlock()
	typ := uint32(abi.EventPortActive)
	if !up {
		typ = abi.EventPortErr
	}
	for _, ss := range users {
		ss.event(typ, 0)
	}
}

// Devices returns the devices, sorted by name.
func (s *Server) Devices() []*Device {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Device, 0, len(s.devices))
	for _, d := range s.devices {
		out = append(out, d)
	}
	sortDevices(out)
	return out
}

// sessionByEventSocket returns the session whose event socket's client
// end has inode ino (session.evIno), nil when none has.
func (s *Server) sessionByEventSocket(ino uint64) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ss := range s.sessions {
		if ss.evIno.Load() == ino {
			return ss
		}
	}
	return nil
}

func sortDevices(ds []*Device) {
	for i := 1; i < len(ds); i++ {
		for j := i; j > 0 && ds[j].Name < ds[j-1].Name; j-- {
			ds[j], ds[j-1] = ds[j-1], ds[j]
		}
	}
}

// Stats counts the server's clients and their objects.
type Stats struct {
	Clients, PDs, MRs, CQs, QPs, SRQs, AHs, Channels int
	MRBytes                                          int64
	// Descriptors are those the appliance holds for its clients, as
	// ApplianceLimits.Descriptors counts them.
	Descriptors int64
	// Refused counts the connections refused at a limit so far.
	Refused uint64
}

// Stats returns the current counts.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	sessions := make([]*session, 0, len(s.sessions))
	for ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	st := Stats{Clients: len(sessions), Descriptors: s.pools.fds.used.Load(), Refused: s.refused.Load()}
	for _, ss := range sessions {
		ss.mu.Lock()
		st.PDs += len(ss.pds)
		st.MRs += len(ss.mrs)
		st.CQs += len(ss.cqs)
		st.QPs += len(ss.qps)
		st.SRQs += len(ss.srqs)
		st.AHs += len(ss.ahs)
		st.Channels += len(ss.chans)
		st.MRBytes += ss.mrBytes
		ss.mu.Unlock()
	}
	return st
}

// Listen opens the socket: its directory is created, a stale socket file
// replaced, and the file given the configured group and mode (an
// abstract socket has no file: any process of the appliance's network
// namespace may connect to it).
func (s *Server) Listen() error {
	path := s.cfg.Socket
	abstract := strings.HasPrefix(path, "@")
	if !abstract {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("control: %w", err)
		}
	}
	if c, err := net.Dial("unixpacket", path); err == nil {
		c.Close()
		return fmt.Errorf("control: %s: another appliance is serving it", path)
	}
	if !abstract {
		_ = os.Remove(path)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("control: listen: %w", err)
	}
	if !abstract {
		if err := s.setAccess(path); err != nil {
			ln.Close() // and the file with it
			return fmt.Errorf("control: %s: %w", path, err)
		}
	}
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	return nil
}

// setAccess gives the socket file its group, then its mode: a group
// member cannot connect before the mode lets it.
func (s *Server) setAccess(path string) error {
	if s.cfg.SocketGID > 0 {
		if err := os.Lchown(path, -1, s.cfg.SocketGID); err != nil {
			return fmt.Errorf("socket group: %w", err)
		}
	}
	if err := os.Chmod(path, s.cfg.SocketMode); err != nil {
		return fmt.Errorf("socket mode: %w", err)
	}
	return nil
}

// Serve accepts clients until ctx ends or Close is called; it calls Listen
// first when that has not been done.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	ln := s.ln
	s.mu.Unlock()
	if ln == nil {
		if err := s.Listen(); err != nil {
			return err
		}
		ln = s.ln
	}
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return nil
			}
			s.log.Warn("accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		pid, uid, err := peerCred(c)
		if err != nil {
			s.log.Warn("client refused", "err", err)
			c.Close()
			continue
		}
		if err := s.admit(uid); err != nil {
			s.refuse(c, err)
			continue
		}
		ss, err := s.newSession(c, pid, uid)
		if err != nil {
			s.log.Warn("client refused", "err", err)
			s.leave(uid)
			c.Close()
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			s.leave(uid)
			c.Close()
			continue
		}
		s.sessions[ss] = struct{}{}
		s.peak = max(s.peak, len(s.sessions))
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			ss.run()
			s.mu.Lock()
			delete(s.sessions, ss)
			release := s.ebbed()
			s.mu.Unlock()
			s.leave(uid)
			if release {
				debug.FreeOSMemory()
			}
		}()
	}
}

// releaseAfter is the most sessions whose end leaves the memory they
// freed to the Go runtime; see ebbed.
const releaseAfter = 64

// ebbed reports whether the sessions have fallen to a quarter of their
// peak, one of at least releaseAfter, or then to none: then their memory
// goes back to the system (debug.FreeOSMemory). The runtime keeps what a
// flood of connections freed for reuse and gave little of it back (200
// clients that left their replies unread left 26 MB resident for minutes
// after they went). s.mu is held.
func (s *Server) ebbed() bool {
	n := len(s.sessions)
	switch {
	case s.peak >= releaseAfter && n <= s.peak/4:
		s.peak, s.ebbing = n, true
		return true
	case s.ebbing && n == 0:
		s.ebbing = false
		return true
	}
	return false
}

// Close stops accepting, disconnects every client (destroying its
// objects) and removes the socket.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	ln := s.ln
	for ss := range s.sessions {
		ss.conn.Close()
	}
	for c := range s.waiting {
		c.Close()
	}
	s.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	s.wg.Wait()
	return nil
}

// Socket returns the path the server listens on.
func (s *Server) Socket() string { return s.cfg.Socket }

func (s *Server) device(name string) *Device {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.devices[name]
}

// peerCred returns the PID and user of the process at the other end of
// c, as they were when it connected.
func peerCred(c *net.UnixConn) (int32, uint32, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var cred *syscall.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		cred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, 0, err
	}
	if serr != nil {
		return 0, 0, fmt.Errorf("SO_PEERCRED: %w", serr)
	}
	return cred.Pid, cred.Uid, nil
}
