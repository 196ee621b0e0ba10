// Package config reads and checks the appliance's TOML configuration file:
//
//	socket = "/run/taproce/taproce.sock"
//	admin_socket = "/run/taproce/admin.sock"
//	metrics_address = "127.0.0.1:9476"
//	log_level = "info"
//
//	[limits]
//	qps = 1024
//
//	[[port]]
//	namespace = "lab-a"
//	addresses = ["10.55.0.1/24", "fd55::1/64"]
//	[port.impair]
//	egress = "loss=1%,seed=7"
//
// taproce.toml in this directory documents every key. Parse reports every
// problem of a file at once, each as "file:line: key: message"; Validate
// checks a Config built in code by the same rules, without line numbers.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/taproce/taproce/internal/cpulist"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs/abi"
)

// Defaults and limits.
const (
	// DefaultSocket is the control socket's path when the file gives none.
	DefaultSocket = abi.DefaultSocket
	// DefaultSocketMode is the control socket file's permission bits when
	// the file gives none: every local user may connect, as every user
	// may open /dev/infiniband/uverbs* where rdma-core is installed. Pods
	// run as many users and reach the socket through the directory they
	// mount, which is what decides who sees it; a client may open only
	// its own network namespace's device, and the limits bound what any
	// user can take.
	DefaultSocketMode fs.FileMode = 0o666
	// MaxGroupName bounds socket_group's name, as shadow's tools bound
	// group names.
	MaxGroupName = 32
	// DefaultAdminSocket is the admin API socket's path when the file
	// gives none.
	DefaultAdminSocket = "/run/taproce/admin.sock"
	// DefaultMetricsAddress is where /metrics and /healthz are served when
	// the file gives no address.
	DefaultMetricsAddress = "127.0.0.1:9476"
	// DefaultStateFile is where the appliance records its attachments when
	// the file gives no path.
	DefaultStateFile = "/run/taproce/attachments.json"
	// DefaultPoll is how the appliance waits for clients' posts when the
	// file does not say.
	DefaultPoll = PollAdaptive
	// MaxProcs bounds procs.
	MaxProcs = 1024
	// DefaultLinger is how long a destroyed queue pair, or a dead
	// client's, keeps answering its peer when the file does not say.
	DefaultLinger = 30 * time.Second
	// DefaultLogLevel is the log level when the file gives none.
	DefaultLogLevel = "info"
	// DefaultPortName is a port's TAP device name when its table gives none.
	DefaultPortName = "roce0"
	// DefaultMTU is default_mtu when the file gives none: the MTU of a
	// port whose table gives none.
	DefaultMTU = 1500
	// MinMTU is the smallest MTU a port accepts (the IPv4 minimum datagram
	// every host must accept).
	MinMTU = 576
	// MaxMTU is the largest MTU a port accepts.
	MaxMTU = 9216
	// MinIPv6MTU is the smallest MTU of a port with an IPv6 address
	// (RFC 8200's minimum link MTU).
	MinIPv6MTU = 1280
	// MaxSocketPath is the longest control socket path: sun_path holds
	// 108 bytes including the terminating NUL.
	MaxSocketPath = 107
	// NetnsDir is where a namespace given by name lives.
	NetnsDir = "/var/run/netns"
	// MaxLimit bounds every object count of [limits] (queue pair numbers
	// have 24 bits).
	MaxLimit = 1<<24 - 1
)

// Default per-client limits, those of the control server.
const (
	DefaultQPs      = 1024
	DefaultCQs      = 1024
	DefaultSRQs     = 256
	DefaultMRs      = 4096
	DefaultPDs      = 256
	DefaultAHs      = 4096
	DefaultChannels = 1024
	DefaultMRBytes  = 16 << 30
)

// Default appliance-wide limits, those of the control server; their
// descriptors are left to RLIMIT_NOFILE.
const (
	DefaultApplianceQPs      = 16384
	DefaultApplianceCQs      = 16384
	DefaultApplianceSRQs     = 4096
	DefaultApplianceMRs      = 65536
	DefaultAppliancePDs      = 16384
	DefaultApplianceAHs      = 65536
	DefaultApplianceChannels = 16384
	DefaultApplianceMRBytes  = 1 << 40
	DefaultConnections       = 4096
	DefaultConnectionsPerUID = 2048
	// MinDescriptors is the fewest descriptors for clients a configured
	// appliance_limits.descriptors gives: fewer serve hardly one.
	MinDescriptors = 16
)

// Poll modes; see Config.Poll. They are the names the appliance's
// poll.ParseMode reads (a test of the daemon holds the two lists equal):
// the config names them without importing the appliance.
const (
	// PollAdaptive polls briefly after work (on 4 processors or more),
	// then sleeps: one loop sleeps on every port and client doorbell.
	PollAdaptive = "adaptive"
	// PollBlock sleeps as soon as the ports and rings are empty, in the
	// same one loop.
	PollBlock = "block"
	// PollSpin never sleeps: one loop polls every port and client.
	PollSpin = "spin"
)

// Port attachment modes; see Port.Mode.
const (
	// ModeBridge makes the TAP a bridge port next to the namespace's uplink,
	// with the port as a separate station on that L2 segment.
	ModeBridge = "bridge"
	// ModeRedirect rides a pod's own interface and IP. Pods get such ports
	// from the CNI plugin through the admin API; a static [[port]] cannot
	// be one, and Validate rejects it there.
	ModeRedirect = "redirect"
)

// Log levels.
const (
	LogDebug = "debug"
	LogInfo  = "info"
	LogWarn  = "warn"
	LogError = "error"
)

// ErrInvalid is wrapped by every error about a configuration's contents:
// TOML syntax, unknown keys, values of the wrong type, values that break a
// rule. Errors reading the file do not wrap it.
var ErrInvalid = errors.New("invalid configuration")

// Config is the appliance's configuration.
type Config struct {
	// Socket is the path of the control socket (a name starting with '@'
	// is a Linux abstract socket).
	Socket string
	// SocketMode is the control socket file's permission bits, within
	// 0600..0777: connecting needs write permission, and the owner (the
	// appliance's user) must be able to, for the health check connects.
	// An abstract socket has no file; it takes only DefaultSocketMode.
	SocketMode fs.FileMode
	// SocketGroup is the group the control socket file is given: a group
	// name, or a numeric group ID (which works where the host has no name
	// for the group pods are given); "" leaves the appliance's own. An
	// abstract socket takes none.
	SocketGroup string
	// ListAllDevices lists every device to every client, those of other
	// network namespaces marked unusable. Off, a client is shown only the
	// devices it may open: another namespace's device tells its MAC and
	// its addresses (its GIDs).
	ListAllDevices bool
	// AdminSocket is the path of the admin API's socket, the one the CNI
	// plugin calls; a file path, not an abstract socket, and not Socket.
	AdminSocket string
	// MetricsAddress is the TCP address (host:port) of the HTTP server for
	// /metrics and /healthz; empty disables it. Port 0 picks a free port.
	MetricsAddress string
	// StateFile is where the appliance records its attachments, so that a
	// later run adopts or cleans up what this one leaves; an absolute
	// path, or empty for none.
	StateFile string
	// LogLevel is one of debug, info, warn and error.
	LogLevel string
	// LocalSwitch lets traffic between the appliance's own ports cross in
	// memory instead of through their TAP devices. It has no zero
	// default: Default turns it on, a Config built in code says.
	LocalSwitch bool
	// ECN marks the RC and UC packets of the appliance's QPs ECN-capable
	// (ECT(0)), as RoCE NICs do, so that a queue that marks CE instead of
	// dropping slows their sender through CNPs (transport.Config.ECT).
	// Default turns it on, like LocalSwitch.
	ECN bool
	// Poll is how the appliance waits for clients' posts and for its
	// ports' frames: PollAdaptive, PollBlock or PollSpin.
	Poll string
	// Procs is how many processors the appliance's Go code runs on at
	// once (GOMAXPROCS), 0..MaxProcs. 0 lets the poll mode choose
	// (appliance.Procs): when it spins, half the processors the process
	// has, so that its polling loop leaves cores to the clients polling
	// their completion queues, but two where it has two or three (the
	// loop's and its helper's, poll.Mode.Procs in the appliance); all of them
	// otherwise. The GOMAXPROCS environment variable replaces that
	// choice; a positive procs replaces both.
	Procs int
	// CPUs is the processors the appliance's process runs on, as a
	// processor list ("1", "2-3,6"; cpulist.Parse), every one of them a
	// processor the process may use; "" leaves it on all of those. With
	// CPUs, the poll mode's share (Procs 0) is taken of these processors.
	// A software NIC on processors of its own answers at once instead of
	// waiting for a turn on a core that a client busy-polls.
	CPUs string
	// Limits bound what one client may hold.
	Limits Limits
	// ApplianceLimits bound what all clients together may hold, and how
	// many may be connected.
	ApplianceLimits ApplianceLimits
	// Linger is how long a connected RC queue pair keeps answering its
	// peer after its client destroyed it or died: a retransmission of what
	// it executed is acknowledged again, anything else NAKed; positive.
	Linger time.Duration
	// DefaultMTU is the MTU of a port whose table gives none, within
	// MinMTU..MaxMTU.
	DefaultMTU int
	// Ports are the ports to serve, one per [[port]] table. There may be
	// none: ports can also be added at run time.
	Ports []Port
}

// Limits bound the verbs objects one client (one connection to the
// control socket) may hold at a time. Each is at least 1; the counts are
// at most MaxLimit.
type Limits struct {
	QPs, CQs, SRQs, MRs, PDs, AHs int
	// Channels are completion channels.
	Channels int
	// MRBytes bounds the bytes of all the client's memory regions.
	MRBytes int64
}

// DefaultLimits returns the limits of an empty [limits] table.
func DefaultLimits() Limits {
	return Limits{QPs: DefaultQPs, CQs: DefaultCQs, SRQs: DefaultSRQs, MRs: DefaultMRs, PDs: DefaultPDs, AHs: DefaultAHs,
		Channels: DefaultChannels, MRBytes: DefaultMRBytes}
}

// ApplianceLimits bound what all clients together may hold, so that
// clients each within their Limits cannot together exhaust the appliance,
// and how many may be connected. Each count is 1..MaxLimit.
type ApplianceLimits struct {
	// Limits bound the objects of all clients together.
	Limits
	// Connections bounds the clients connected at once, and
	// ConnectionsPerUID those of one user, so that one user's flood of
	// connections leaves room for the others.
	Connections, ConnectionsPerUID int
	// Descriptors bounds the descriptors the appliance holds for clients
	// (their sockets, doorbells, completion channels and the memfds of
	// their rings and memory regions): MinDescriptors..MaxLimit, or 0 for
	// three quarters of the process's RLIMIT_NOFILE, the rest being the
	// appliance's own.
	Descriptors int
}

// DefaultApplianceLimits returns the limits of an empty
// [appliance_limits] table.
func DefaultApplianceLimits() ApplianceLimits {
	return ApplianceLimits{Limits: Limits{QPs: DefaultApplianceQPs, CQs: DefaultApplianceCQs, SRQs: DefaultApplianceSRQs,
		MRs: DefaultApplianceMRs, PDs: DefaultAppliancePDs, AHs: DefaultApplianceAHs, Channels: DefaultApplianceChannels,
		MRBytes: DefaultApplianceMRBytes}, Connections: DefaultConnections, ConnectionsPerUID: DefaultConnectionsPerUID}
}

// Port is one TAP device in one network namespace and the RoCE endpoint
// behind it.
type Port struct {
	// Namespace is a name under /var/run/netns ("lab-a") or an absolute
	// path to a namespace file ("/proc/123/ns/net").
	Namespace string
	// Name is the TAP device's name, a valid Linux interface name.
	Name string
	// Mode is how the TAP reaches the network: ModeBridge.
	Mode string
	// MAC is the port's unicast 48-bit MAC, or nil to have the appliance
	// derive one.
	MAC net.HardwareAddr
	// Addresses are the port's addresses with their prefix lengths; there
	// is at least one, and each address appears once.
	Addresses []netip.Prefix
	// MTU is the TAP device's MTU, within MinMTU..MaxMTU, and at least
	// MinIPv6MTU when the port has an IPv6 address. Parse gives a port
	// without one the file's default_mtu.
	MTU int
	// Impair injects faults into the port's frames.
	Impair Impair
}

// Impair holds a port's fault injection, per direction.
type Impair struct {
	// Ingress impairs the frames the port receives from its TAP.
	Ingress impair.Spec
	// Egress impairs the frames the port sends into its TAP.
	Egress impair.Spec
}

// Default returns the configuration of an empty file: every default, no
// ports.
func Default() *Config {
	return &Config{
		Socket:          DefaultSocket,
		SocketMode:      DefaultSocketMode,
		AdminSocket:     DefaultAdminSocket,
		MetricsAddress:  DefaultMetricsAddress,
		StateFile:       DefaultStateFile,
		LogLevel:        DefaultLogLevel,
		LocalSwitch:     true,
		ECN:             true,
		Poll:            DefaultPoll,
		Limits:          DefaultLimits(),
		ApplianceLimits: DefaultApplianceLimits(),
		Linger:          DefaultLinger,
		DefaultMTU:      DefaultMTU,
	}
}

// DefaultPort returns a port with the defaults of an empty [[port]] table.
// Namespace and Addresses, which have no defaults, are left empty.
func DefaultPort() Port {
	return Port{Name: DefaultPortName, Mode: ModeBridge, MTU: DefaultMTU}
}

// ApplyDefaults fills in the fields of c and its ports that have a default
// and are zero, for configurations built in code. MetricsAddress and
// StateFile, for which empty means "none", LocalSwitch and ECN stay as they
// are. A port without an MTU gets DefaultMTU.
func (c *Config) ApplyDefaults() {
	if c.Socket == "" {
		c.Socket = DefaultSocket
	}
	if c.SocketMode == 0 {
		c.SocketMode = DefaultSocketMode
	}
	if c.AdminSocket == "" {
		c.AdminSocket = DefaultAdminSocket
	}
	if c.LogLevel == "" {
		c.LogLevel = DefaultLogLevel
	}
	if c.Poll == "" {
		c.Poll = DefaultPoll
	}
	c.Limits.applyDefaults(DefaultLimits())
	all := DefaultApplianceLimits()
	c.ApplianceLimits.applyDefaults(all.Limits)
	if c.ApplianceLimits.Connections == 0 {
		c.ApplianceLimits.Connections = all.Connections
	}
	if c.ApplianceLimits.ConnectionsPerUID == 0 {
		c.ApplianceLimits.ConnectionsPerUID = all.ConnectionsPerUID
	}
	if c.Linger == 0 {
		c.Linger = DefaultLinger
	}
	if c.DefaultMTU == 0 {
		c.DefaultMTU = DefaultMTU
	}
	for i := range c.Ports {
		p := &c.Ports[i]
		if p.Name == "" {
			p.Name = DefaultPortName
		}
		if p.Mode == "" {
			p.Mode = ModeBridge
		}
		if p.MTU == 0 {
			p.MTU = c.DefaultMTU
		}
	}
}

// applyDefaults fills l's zero fields from def.
func (l *Limits) applyDefaults(def Limits) {
	for _, f := range []struct{ v, d *int }{
		{&l.QPs, &def.QPs}, {&l.CQs, &def.CQs}, {&l.SRQs, &def.SRQs}, {&l.MRs, &def.MRs},
		{&l.PDs, &def.PDs}, {&l.AHs, &def.AHs}, {&l.Channels, &def.Channels},
	} {
		if *f.v == 0 {
			*f.v = *f.d
		}
	}
	if l.MRBytes == 0 {
		l.MRBytes = def.MRBytes
	}
}

// NamespacePath returns the path of p's network namespace file: Namespace
// itself when it is absolute, else Namespace under NetnsDir.
func (p *Port) NamespacePath() string {
	if strings.HasPrefix(p.Namespace, "/") {
		return p.Namespace
	}
	return path.Join(NetnsDir, p.Namespace)
}

// Error is one problem in a configuration. Parse and Validate return one
// Error, or several joined with errors.Join.
type Error struct {
	// File is the file name given to Parse or Load; empty for Validate.
	File string
	// Line is the 1-based line of the problem in File, or 0 when unknown.
	Line int
	// Key is the key the problem is about, as a path such as
	// "port[1].addresses[0]"; empty for problems of the whole file.
	Key string
	// Msg says what is wrong.
	Msg string
	// Err is the underlying error, if any: a toml.ParseError for syntax
	// errors, an impair.ErrInvalidSpec error for impairment specs.
	Err error
}

// Error formats e as "file:line: key: message", leaving out what is unknown.
func (e *Error) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0:
		fmt.Fprintf(&b, "%s:%d: ", e.File, e.Line)
	case e.File != "":
		fmt.Fprintf(&b, "%s: ", e.File)
	case e.Line > 0:
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns ErrInvalid and the underlying error, if any.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrInvalid}
	}
	return []error{ErrInvalid, e.Err}
}

// Validate checks c by the rules Parse applies, and returns every problem
// found joined with errors.Join, each an *Error wrapping ErrInvalid, or nil.
// Fields with defaults are not defaulted here: call ApplyDefaults first, or
// start from Default and DefaultPort.
func (c *Config) Validate() error {
	return joinErrors(c.validate(nil))
}

// lineFunc returns the line of a key path, or 0 when unknown.
type lineFunc func(key string) int

// validate checks c and returns its problems, with their lines when line is
// not nil.
func (c *Config) validate(line lineFunc) []*Error {
	v := validator{line: line}
	socketOK := v.socket("socket", c.Socket)
	v.socketAccess(c)
	if v.socket("admin_socket", c.AdminSocket) {
		switch {
		case strings.HasPrefix(c.AdminSocket, "@"):
			v.add("admin_socket", fmt.Sprintf("%q is an abstract socket; the admin socket must be a file, readable by root only", c.AdminSocket), nil)
		case socketOK && c.AdminSocket == c.Socket:
			v.add("admin_socket", fmt.Sprintf("%q is the control socket too; give them different paths", c.AdminSocket), nil)
		}
	}
	v.address("metrics_address", c.MetricsAddress)
	if c.StateFile != "" {
		switch {
		case strings.IndexByte(c.StateFile, 0) >= 0:
			v.add("state_file", fmt.Sprintf("%q contains a NUL byte", c.StateFile), nil)
		case !strings.HasPrefix(c.StateFile, "/"):
			v.add("state_file", fmt.Sprintf("%q is not an absolute path", c.StateFile), nil)
		case path.Clean(c.StateFile) != c.StateFile:
			v.add("state_file", fmt.Sprintf("%q is not a clean path (want %q)", c.StateFile, path.Clean(c.StateFile)), nil)
		case c.StateFile == "/":
			v.add("state_file", "\"/\" is a directory", nil)
		}
	}
	switch c.LogLevel {
	case LogDebug, LogInfo, LogWarn, LogError:
	default:
		v.add("log_level", fmt.Sprintf("%q is not one of debug, info, warn, error", c.LogLevel), nil)
	}
	switch c.Poll {
	case PollAdaptive, PollBlock, PollSpin:
	default:
		v.add("poll", fmt.Sprintf("%q is not one of %s, %s, %s", c.Poll, PollAdaptive, PollBlock, PollSpin), nil)
	}
	v.limits("limits", &c.Limits)
	a := &c.ApplianceLimits
	v.limits("appliance_limits", &a.Limits)
	v.count("appliance_limits.connections", a.Connections)
	v.count("appliance_limits.connections_per_uid", a.ConnectionsPerUID)
	if d := a.Descriptors; d != 0 && (d < MinDescriptors || d > MaxLimit) {
		v.add("appliance_limits.descriptors", fmt.Sprintf("%d is outside %d..%d (or 0: three quarters of RLIMIT_NOFILE)", d, MinDescriptors, MaxLimit), nil)
	}
	if c.Procs < 0 || c.Procs > MaxProcs {
		v.add("procs", fmt.Sprintf("%d is outside 0..%d", c.Procs, MaxProcs), nil)
	}
	if c.CPUs != "" {
		if _, err := cpulist.Parse(c.CPUs); err != nil {
			v.add("cpus", fmt.Sprintf("%q is not a processor list such as \"1\" or \"2-3,6\"", c.CPUs), err)
		}
	}
	if c.Linger <= 0 {
		v.add("linger", fmt.Sprintf("%v is not a positive duration", c.Linger), nil)
	}
	if c.DefaultMTU < MinMTU || c.DefaultMTU > MaxMTU {
		v.add("default_mtu", fmt.Sprintf("%d is outside %d..%d", c.DefaultMTU, MinMTU, MaxMTU), nil)
	}

	type portID struct{ ns, name string }
	first := map[portID]int{}
	for i := range c.Ports {
		p := &c.Ports[i]
		key := indexKey("port", i)
		nsOK := v.namespace(key+".namespace", p.Namespace)
		nameOK := v.ifname(key+".name", p.Name)
		v.port(key, p)
		if !nsOK || !nameOK {
			continue
		}
		id := portID{sameNamespace(p.NamespacePath()), p.Name}
		j, dup := first[id]
		if !dup {
			first[id] = i
			continue
		}
		other := indexKey("port", j)
		if l := v.lineOf(other); l > 0 {
			other = fmt.Sprintf("%s at line %d", other, l)
		}
		v.add(key, fmt.Sprintf("same namespace %q and name %q as %s", p.Namespace, p.Name, other), nil)
	}
	return v.errs
}

// sameNamespace maps /run/netns, which /var/run usually links to, onto
// NetnsDir, so that both spellings of one namespace compare equal.
func sameNamespace(p string) string {
	if rest, ok := strings.CutPrefix(p, "/run/netns/"); ok {
		return path.Join(NetnsDir, rest)
	}
	return p
}

// validator collects problems.
type validator struct {
	line lineFunc
	errs []*Error
}

func (v *validator) lineOf(key string) int {
	if v.line == nil {
		return 0
	}
	return v.line(key)
}

func (v *validator) add(key, msg string, err error) {
	v.errs = append(v.errs, &Error{Line: v.lineOf(key), Key: key, Msg: msg, Err: err})
}

// socket checks the path of a unix socket and reports whether it is valid.
func (v *validator) socket(key, s string) bool {
	switch {
	case s == "":
		v.add(key, "must not be empty", nil)
	case strings.IndexByte(s, 0) >= 0:
		v.add(key, fmt.Sprintf("%q contains a NUL byte", s), nil)
	case len(s) > MaxSocketPath:
		v.add(key, fmt.Sprintf("%q is %d bytes long; unix socket paths have at most %d", s, len(s), MaxSocketPath), nil)
	default:
		return true
	}
	return false
}

// limits checks the limits of the table at key.
func (v *validator) limits(key string, l *Limits) {
	for _, x := range []struct {
		key string
		n   int
	}{
		{"qps", l.QPs}, {"cqs", l.CQs}, {"srqs", l.SRQs}, {"mrs", l.MRs}, {"pds", l.PDs}, {"ahs", l.AHs}, {"channels", l.Channels},
	} {
		v.count(key+"."+x.key, x.n)
	}
	if l.MRBytes < 1 {
		v.add(key+".mr_bytes", fmt.Sprintf("%d is not a positive number of bytes", l.MRBytes), nil)
	}
}

// count checks a limit's count, 1..MaxLimit.
func (v *validator) count(key string, n int) {
	if n < 1 || n > MaxLimit {
		v.add(key, fmt.Sprintf("%d is outside 1..%d", n, MaxLimit), nil)
	}
}

// socketAccess checks the control socket's mode and group.
func (v *validator) socketAccess(c *Config) {
	abstract := strings.HasPrefix(c.Socket, "@")
	switch {
	case c.SocketMode&^fs.ModePerm != 0:
		v.add("socket_mode", fmt.Sprintf("%#o has bits beyond the permission bits 0777", uint32(c.SocketMode)), nil)
	case c.SocketMode&0o600 != 0o600:
		v.add("socket_mode", fmt.Sprintf("%04o does not let the owner read and write; the appliance's health check connects as the owner", uint32(c.SocketMode)), nil)
	case abstract && c.SocketMode != DefaultSocketMode:
		v.add("socket_mode", fmt.Sprintf("the control socket %q is abstract: it has no file mode, and any process in the appliance's network namespace may connect", c.Socket), nil)
	}
	if c.SocketGroup == "" {
		return
	}
	if abstract {
		v.add("socket_group", fmt.Sprintf("the control socket %q is abstract: it has no file to give a group", c.Socket), nil)
		return
	}
	if _, err := ParseGroup(c.SocketGroup); err != nil {
		v.add("socket_group", err.Error(), err)
	}
}

// ErrGroup is wrapped by the errors of ParseGroup.
var ErrGroup = errors.New("not a group name or ID")

// ParseGroup reads a group: a numeric group ID, returned as it is, or a
// name — up to MaxGroupName bytes of letters, digits, '_', '.' and '-',
// not starting with '-', optionally ending in '$' as shadow's tools allow
// — for which it returns -1: looking names up is the caller's business.
func ParseGroup(s string) (int64, error) {
	if s != "" && strings.Trim(s, "0123456789") == "" {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n == 1<<32-1 { // (gid_t)-1 means "unchanged" to chown
			return 0, fmt.Errorf("%q: %w: group IDs are 0..4294967294", s, ErrGroup)
		}
		return int64(n), nil
	}
	name := strings.TrimSuffix(s, "$")
	switch {
	case name == "":
		return 0, fmt.Errorf("%q: %w", s, ErrGroup)
	case len(s) > MaxGroupName:
		return 0, fmt.Errorf("%q is %d bytes long; group names have at most %d: %w", s, len(s), MaxGroupName, ErrGroup)
	case name[0] == '-':
		return 0, fmt.Errorf("%q starts with '-': %w", s, ErrGroup)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return 0, fmt.Errorf("%q contains %q; group names are letters, digits, '_', '.' and '-': %w", s, rune(c), ErrGroup)
		}
	}
	return -1, nil
}

// address checks a TCP listening address, host:port with a numeric port;
// empty is valid (nothing listens).
func (v *validator) address(key, a string) {
	if a == "" {
		return
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		v.add(key, fmt.Sprintf("%q is not host:port, such as 127.0.0.1:9476 or [::1]:9476", a), err)
		return
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || port != strconv.FormatUint(n, 10) {
		v.add(key, fmt.Sprintf("%q: port %q is not a number within 0..65535", a, port), nil)
		return
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Zone() == "" && (ip.IsMulticast() || ip == netip.AddrFrom4([4]byte{255, 255, 255, 255})) {
		v.add(key, fmt.Sprintf("%q: %s is not an address to listen on", a, host), nil)
	}
}

// namespace checks a port's namespace and reports whether it is valid.
func (v *validator) namespace(key, ns string) bool {
	msg := ""
	switch {
	case ns == "":
		msg = "missing; want a name under " + NetnsDir + " or an absolute path"
	case strings.IndexByte(ns, 0) >= 0:
		msg = fmt.Sprintf("%q contains a NUL byte", ns)
	case strings.HasPrefix(ns, "/"):
		if clean := path.Clean(ns); clean != ns {
			msg = fmt.Sprintf("%q is not a clean path (want %q)", ns, clean)
		}
	case strings.Contains(ns, "/"):
		msg = fmt.Sprintf("%q is neither a name under %s nor an absolute path", ns, NetnsDir)
	case ns == "." || ns == "..":
		msg = fmt.Sprintf("%q is not a namespace name", ns)
	case len(ns) > 255:
		msg = fmt.Sprintf("name is %d bytes long; file names have at most 255", len(ns))
	}
	if msg != "" {
		v.add(key, msg, nil)
		return false
	}
	return true
}

// ifname checks a Linux interface name as the kernel's dev_valid_name does,
// and also refuses '%', which the kernel expands as a name template, and
// bytes that are not printable ASCII. It reports whether name is valid.
func (v *validator) ifname(key, name string) bool {
	msg := ""
	switch {
	case name == "":
		msg = "must not be empty"
	case len(name) > 15:
		msg = fmt.Sprintf("%q is %d bytes long; Linux interface names have at most 15", name, len(name))
	case name == "." || name == "..":
		msg = fmt.Sprintf("%q is not a valid interface name", name)
	default:
		for i := 0; i < len(name) && msg == ""; i++ {
			switch c := name[i]; {
			case c == '/' || c == ':':
				msg = fmt.Sprintf("%q contains %q, which Linux does not allow in interface names", name, c)
			case c == '%':
				msg = fmt.Sprintf("%q contains '%%', which Linux treats as a name template", name)
			case c <= ' ' || c >= 0x7f:
				what := fmt.Sprintf("%q", rune(c))
				if c >= utf8.RuneSelf {
					what = fmt.Sprintf("byte %#02x", c)
				}
				msg = fmt.Sprintf("%q contains %s; interface names here are printable ASCII without spaces", name, what)
			}
		}
	}
	if msg != "" {
		v.add(key, msg, nil)
		return false
	}
	return true
}

// port checks everything of p but its namespace and name.
func (v *validator) port(key string, p *Port) {
	switch p.Mode {
	case ModeBridge:
	case ModeRedirect:
		v.add(key+".mode", fmt.Sprintf("%q ports are for pods, attached by the CNI plugin through the admin API; a [[port]] takes %q", p.Mode, ModeBridge), nil)
	default:
		v.add(key+".mode", fmt.Sprintf("unknown mode %q; want %q", p.Mode, ModeBridge), nil)
	}

	if p.MAC != nil {
		switch {
		case len(p.MAC) != 6:
			v.add(key+".mac", fmt.Sprintf("%s is not a 48-bit MAC address", p.MAC), nil)
		case p.MAC[0]&1 != 0:
			v.add(key+".mac", fmt.Sprintf("%s is a multicast address; a port needs a unicast MAC", p.MAC), nil)
		case bytes.Equal(p.MAC, make([]byte, 6)):
			v.add(key+".mac", fmt.Sprintf("%s is all zeros", p.MAC), nil)
		}
	}

	var v6 netip.Prefix
	if len(p.Addresses) == 0 {
		v.add(key+".addresses", "at least one address is required", nil)
	}
	seen := make(map[netip.Addr]int, len(p.Addresses))
	for i, pfx := range p.Addresses {
		akey := indexKey(key+".addresses", i)
		a := pfx.Addr()
		msg := ""
		switch {
		case !pfx.IsValid():
			msg = "not a valid prefix"
		case a.Is4In6():
			msg = fmt.Sprintf("%s is an IPv4-mapped IPv6 address; write %s", pfx, netip.PrefixFrom(a.Unmap(), max(pfx.Bits()-96, 0)))
		case a.IsUnspecified():
			msg = fmt.Sprintf("%s is the unspecified address", pfx)
		case a.IsLoopback():
			msg = fmt.Sprintf("%s is a loopback address", pfx)
		case a.IsMulticast():
			msg = fmt.Sprintf("%s is a multicast address", pfx)
		case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
			msg = fmt.Sprintf("%s is the broadcast address", pfx)
		}
		if msg != "" {
			v.add(akey, msg, nil)
			continue
		}
		if j, dup := seen[a]; dup {
			v.add(akey, fmt.Sprintf("%s repeats address %s of addresses[%d]", pfx, a, j), nil)
			continue
		}
		seen[a] = i
		if a.Is6() && !v6.IsValid() {
			v6 = pfx
		}
	}

	switch {
	case p.MTU < MinMTU || p.MTU > MaxMTU:
		v.add(key+".mtu", fmt.Sprintf("%d is outside %d..%d", p.MTU, MinMTU, MaxMTU), nil)
	case p.MTU < MinIPv6MTU && v6.IsValid():
		v.add(key+".mtu", fmt.Sprintf("%d is below %d, the IPv6 minimum, and the port has IPv6 address %s", p.MTU, MinIPv6MTU, v6), nil)
	}

	for _, d := range []struct {
		name string
		spec impair.Spec
	}{{"ingress", p.Impair.Ingress}, {"egress", p.Impair.Egress}} {
		if err := d.spec.Validate(); err != nil {
			v.add(key+".impair."+d.name, err.Error(), err)
		}
	}
}

// indexKey returns the key path of element i of the array at key.
func indexKey(key string, i int) string {
	return key + "[" + strconv.Itoa(i) + "]"
}

// joinErrors joins errs, or returns nil for none.
func joinErrors(errs []*Error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	all := make([]error, len(errs))
	for i, e := range errs {
		all[i] = e
	}
	return errors.Join(all...)
}
