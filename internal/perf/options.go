package perf

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Defaults of perftest (perftest_parameters.h).
const (
	DefaultPort   = 18515
	DefSizeBW     = 65536
	DefSizeLat    = 2
	DefSizeAtomic = 8
	DefItersLat   = 1000 // and every bandwidth test but write_bw
	DefItersWrite = 5000 // write_bw
	DefTxBW       = 128
	DefTxLat      = 1
	DefRxSend     = 512
	DefCQMod      = 100
	DefQPTimeout  = 14
	// MaxSize is the largest message of -a (2^23, 8 MiB).
	MaxSize = 8 << 20

	minIters        = 5
	maxIters        = 100000000
	maxTx           = 15000
	maxRx           = 16384
	maxQPs          = 16384
	cqModLimitSize  = 8192 // MSG_SIZE_CQ_MOD_LIMIT
	noPeakAboveIter = 20000
	minRNRTimer     = 12 // MIN_RNR_TIMER
	defInlineWrite  = 220
	defInlineSend   = 236
)

// Config is a test as the command line gives it; zero values mean
// perftest's defaults.
type Config struct {
	Test Test
	// Server is the server's host (or host:port) for a client; empty
	// makes this side the server.
	Server string
	// Port is the TCP port of the out-of-band exchange (default 18515).
	Port int
	// Device is the device to open ("" for the first usable one).
	Device string
	// Size of the messages in bytes (default 65536 for bandwidth, 2 for
	// latency, 8 for atomics, which take no other).
	Size int
	// Iters is the number of messages per QP and size (default 5000 for
	// write_bw, 1000 otherwise).
	Iters int
	// All runs every size from 2 B to 8 MiB (-a).
	All bool
	// Duration, when positive, runs for that many seconds instead of
	// Iters messages (-D); Margin is the time at either end not measured
	// (default Duration/4).
	Duration int
	Margin   int
	// QPs is the number of QPs of a bandwidth test (default 1).
	QPs int
	// MTU is the path MTU in bytes, 256 to 4096 (default: the port's
	// active MTU).
	MTU int
	// TxDepth is the send queue depth (default 128 for bandwidth, 1 for
	// latency); RxDepth the receive queue depth of the SEND tests
	// (default 512).
	TxDepth int
	RxDepth int
	// CQMod asks for a completion every CQMod sends (default 100).
	CQMod int
	// GIDIndex is the source GID's index; negative picks one as perftest
	// does (the first IPv4 GID).
	GIDIndex int
	// Atomic is the atomic tests' operation (default FETCH_AND_ADD).
	Atomic AtomicType
	// Inline is the largest message sent inline; negative for the
	// default (220 for WRITE, 236 for SEND, capped by the device).
	Inline int
	// QPTimeout is the local ACK timeout exponent (default 14).
	QPTimeout int
	// NoPeak skips the peak bandwidth calculation (-N).
	NoPeak bool
	// CPUFreq is perftest's -F (do not fail on CPU frequency warnings);
	// accepted for compatibility: times here come from the monotonic
	// clock.
	CPUFreq bool
	// ReportGbits reports bandwidth in Gb/sec instead of MB/sec.
	ReportGbits bool
	// JSON prints one JSON object per result line instead of the tables.
	JSON bool

	// Listener, when set, is where a server accepts its client instead
	// of listening on Port.
	Listener net.Listener
	// IdleTimeout bounds how long a run waits without progress (a
	// completion, a byte of the exchange) before it fails (default 60s).
	IdleTimeout time.Duration
}

// IsServer reports whether the configuration is a server's.
func (c *Config) IsServer() bool { return c.Server == "" }

// ErrHelp is returned by ParseArgs for -h.
var ErrHelp = errors.New("help requested")

// ErrVersion is returned by ParseArgs for -V.
var ErrVersion = errors.New("version requested")

// option is a command-line option in perftest's style.
type option struct {
	short   byte
	long    string
	arg     bool
	usage   string
	handler func(c *Config, v string) error
}

func intArg(dst func(c *Config) *int, name string, lo, hi int) func(c *Config, v string) error {
	return func(c *Config, v string) error {
		n, err := parseInt(name, v, v, 1, int64(lo), int64(hi))
		if err != nil {
			return err
		}
		*dst(c) = int(n)
		return nil
	}
}

// errNotNumber is wrapped by parseInt's error for a value that is not a
// number at all.
var errNotNumber = errors.New("not a number")

// parseInt parses the number of option value v — decimal, 0x hexadecimal
// or 0 octal, as perftest's strtol(v, NULL, 0) reads it — times factor,
// and checks that it lies in lo..hi. The error is a sentence for the
// command line that names the option and quotes the value as given, whole;
// strconv's words stay out of it.
func parseInt(name, v, digits string, factor, lo, hi int64) (int64, error) {
	n, err := strconv.ParseInt(digits, 0, 64)
	switch {
	case errors.Is(err, strconv.ErrRange) && strings.HasPrefix(digits, "-"):
		return 0, fmt.Errorf("%s %q: too small (min %d)", name, v, lo)
	case errors.Is(err, strconv.ErrRange):
		return 0, fmt.Errorf("%s %q: too large (max %d)", name, v, hi)
	case err != nil:
		return 0, fmt.Errorf("%s %q: %w", name, v, errNotNumber)
	// Bounded before the multiplication, which would otherwise wrap: 16 Ti
	// and one M came out as 1 MiB.
	case n > hi/factor:
		return 0, fmt.Errorf("%s %q: too large (max %d)", name, v, hi)
	case n*factor < lo:
		return 0, fmt.Errorf("%s %q: too small (min %d)", name, v, lo)
	}
	return n * factor, nil
}

var options = []option{
	{'p', "port", true, "the TCP port of the exchange (default 18515)", intArg(func(c *Config) *int { return &c.Port }, "port", 1, 65535)},
	{'d', "ib-dev", true, "the device to use (default: the first of this namespace)", func(c *Config, v string) error { c.Device = v; return nil }},
	{'i', "ib-port", true, "the device port (only 1)", func(_ *Config, v string) error {
		if v != "1" {
			return fmt.Errorf("IB port %q: taproce devices have one port, 1", v)
		}
		return nil
	}},
	{'m', "mtu", true, "the path MTU: 256, 512, 1024, 2048 or 4096 (default: the port's active MTU)", func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || mtuEnum(n) == 0 {
			return fmt.Errorf("path MTU %q: choose from 256, 512, 1024, 2048 or 4096", v)
		}
		c.MTU = n
		return nil
	}},
	{'s', "size", true, "the message size in bytes, with an optional K or M suffix", func(c *Config, v string) error {
		n, err := parseSize(v)
		if err != nil {
			return err
		}
		c.Size = n
		return nil
	}},
	{'n', "iters", true, "the number of iterations (at least 5)", intArg(func(c *Config) *int { return &c.Iters }, "iterations", minIters, maxIters)},
	{'t', "tx-depth", true, "the send queue depth", intArg(func(c *Config) *int { return &c.TxDepth }, "tx depth", 1, maxTx)},
	{'r', "rx-depth", true, "the receive queue depth of the SEND tests", intArg(func(c *Config) *int { return &c.RxDepth }, "rx depth", 1, maxRx)},
	{'Q', "cq-mod", true, "a completion every this many sends", intArg(func(c *Config) *int { return &c.CQMod }, "CQ moderation", 1, 1024)},
	{'u', "qp-timeout", true, "the QP timeout exponent (4.096 µs × 2^n; default 14)", intArg(func(c *Config) *int { return &c.QPTimeout }, "QP timeout", 0, 31)},
	{'x', "gid-index", true, "the GID index (default: the first IPv4 GID)", intArg(func(c *Config) *int { return &c.GIDIndex }, "GID index", 0, 255)},
	{'q', "qp", true, "the number of QPs (bandwidth tests)", intArg(func(c *Config) *int { return &c.QPs }, "QPs", 1, maxQPs)},
	{'I', "inline_size", true, "the largest message sent inline", intArg(func(c *Config) *int { return &c.Inline }, "inline size", 0, 1<<16)},
	{'D', "duration", true, "run for this many seconds instead of a number of iterations", intArg(func(c *Config) *int { return &c.Duration }, "duration", 1, 1<<30)},
	{'f', "margin", true, "seconds at either end of a -D run not measured (default: a quarter of it)", intArg(func(c *Config) *int { return &c.Margin }, "margin", 0, 1<<30)},
	{'A', "atomic_type", true, "the atomic operation: CMP_AND_SWAP or FETCH_AND_ADD", func(c *Config, v string) error {
		a, err := ParseAtomicType(v)
		if err != nil {
			return err
		}
		c.Atomic = a
		return nil
	}},
	{'c', "connection", true, "the connection type (only RC)", func(_ *Config, v string) error {
		if v != "RC" {
			return fmt.Errorf("connection type %q: only RC is supported", v)
		}
		return nil
	}},
	{'a', "all", false, "run every size from 2 B to 8 MiB", func(c *Config, _ string) error { c.All = true; return nil }},
	{'F', "CPU-freq", false, "accepted for compatibility (times come from the monotonic clock)", func(c *Config, _ string) error { c.CPUFreq = true; return nil }},
	{'N', "noPeak", false, "do not compute the peak bandwidth", func(c *Config, _ string) error { c.NoPeak = true; return nil }},
	{0, "report_gbits", false, "report bandwidth in Gb/sec instead of MB/sec", func(c *Config, _ string) error { c.ReportGbits = true; return nil }},
	{0, "json", false, "print one JSON object per result line instead of the tables", func(c *Config, _ string) error { c.JSON = true; return nil }},
	{'V', "version", false, "print the perftest version this speaks", func(*Config, string) error { return ErrVersion }},
	{'h', "help", false, "print this help", func(*Config, string) error { return ErrHelp }},
}

// maxSize is the largest message perftest takes (UINT_MAX / 2).
const maxSize = 1<<31 - 1

// parseSize parses a size with perftest's K and M suffixes.
func parseSize(v string) (int, error) {
	const name = "message size"
	digits, f := v, int64(1)
	switch {
	case strings.HasSuffix(v, "K"):
		digits, f = strings.TrimSuffix(v, "K"), 1024
	case strings.HasSuffix(v, "M"):
		digits, f = strings.TrimSuffix(v, "M"), 1<<20
	}
	n, err := parseInt(name, v, digits, f, 1, maxSize)
	if errors.Is(err, errNotNumber) {
		return 0, fmt.Errorf("%s %q: not a number of bytes (K and M suffixes allowed)", name, v)
	}
	return int(n), err
}

// ParseArgs parses a command line: the test's name, then options in
// perftest's style (-s 64, -s64, --size=64, --size 64) and, for a client,
// the server's address, anywhere among them.
func ParseArgs(args []string) (Config, error) {
	c := Config{GIDIndex: -1, Inline: -1, Margin: -1, Atomic: FetchAndAdd}
	if len(args) == 0 {
		return c, errors.New("no test given")
	}
	if args[0] == "-h" || args[0] == "--help" {
		return c, ErrHelp
	}
	t, err := ParseTest(args[0])
	if err != nil {
		return c, err
	}
	c.Test = t
	var pos []string
	atomicSet := false
	for i := 1; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		var o *option
		var val string
		hasVal := false
		if strings.HasPrefix(a, "--") {
			name, v, ok := strings.Cut(a[2:], "=")
			for j := range options {
				if options[j].long == name {
					o = &options[j]
				}
			}
			if o == nil {
				return c, fmt.Errorf("unknown option --%s", name)
			}
			val, hasVal = v, ok
		} else {
			for j := range options {
				if options[j].short == a[1] {
					o = &options[j]
				}
			}
			if o == nil {
				return c, fmt.Errorf("unknown option -%c", a[1])
			}
			if len(a) > 2 {
				if !o.arg {
					return c, fmt.Errorf("option -%c takes no value", a[1])
				}
				val, hasVal = a[2:], true
			}
		}
		if o.arg && !hasVal {
			if i+1 >= len(args) {
				return c, fmt.Errorf("option %s needs a value", a)
			}
			i++
			val = args[i]
		} else if !o.arg && hasVal {
			return c, fmt.Errorf("option %s takes no value", a)
		}
		if o.short == 'A' {
			atomicSet = true
		}
		if err := o.handler(&c, val); err != nil {
			return c, err
		}
	}
	switch len(pos) {
	case 0:
	case 1:
		c.Server = pos[0]
	default:
		return c, fmt.Errorf("more than one server address: %q", pos)
	}
	if atomicSet && c.Test.Verb != Atomic {
		return c, errors.New("-A applies to the atomic tests only")
	}
	// The options' combinations are part of the command line: checked
	// here, they are usage errors (exit 2), not a failed run.
	if _, err := resolve(c); err != nil {
		return c, err
	}
	return c, nil
}

// Usage describes the options.
func Usage() string {
	var b strings.Builder
	b.WriteString("Usage: taproce perf TEST [options] [server-address]\n\n")
	b.WriteString("TEST is write_bw, read_bw, send_bw, atomic_bw, write_lat, read_lat, send_lat or atomic_lat\n")
	b.WriteString("(ib_write_bw etc. work too). Without an address it is the server, with one the client.\n")
	b.WriteString("The appliance is found through TAPROCE_SOCKET (default /run/taproce/taproce.sock).\n\nOptions:\n")
	for _, o := range options {
		s := "  "
		if o.short != 0 {
			s += "-" + string(o.short) + ", "
		} else {
			s += "    "
		}
		s += "--" + o.long
		if o.arg {
			s += " VALUE"
		}
		fmt.Fprintf(&b, "%-28s %s\n", s, o.usage)
	}
	return b.String()
}

// params are a test's settings after perftest's defaults and dependencies
// (init_perftest_params, force_dependecies).
type params struct {
	Config
	all      bool
	duration bool
	size     int // the size buffers are made for (MaxSize with -a)
	sizes    []int
	iters    int
	tx, rx   int
	cqMod    int
	noPeak   bool
	margin   int
	// pathMTU is the path MTU in bytes agreed with the peer.
	pathMTU int
}

// resolve applies perftest's defaults and checks the combination.
func resolve(c Config) (*params, error) {
	p := &params{Config: c}
	t := c.Test
	if c.Port == 0 {
		p.Port = DefaultPort
	}
	if c.IdleTimeout == 0 {
		p.IdleTimeout = time.Minute
	}
	if c.QPTimeout == 0 {
		p.QPTimeout = DefQPTimeout
	}
	if c.QPs == 0 {
		p.QPs = 1
	}
	if p.QPs > 1 && t.Kind != BW {
		return nil, errors.New("multiple QPs only available on bandwidth tests")
	}
	p.size = c.Size
	reqSize := c.Size != 0
	if !reqSize {
		p.size = DefSizeBW
		if t.Kind == Lat {
			p.size = DefSizeLat
		}
		if t.Verb == Atomic {
			p.size = DefSizeAtomic
		}
	}
	p.iters = c.Iters
	if p.iters == 0 {
		p.iters = DefItersLat
		if t == (Test{Write, BW}) {
			p.iters = DefItersWrite
		}
	}
	p.tx = c.TxDepth
	if p.tx == 0 {
		p.tx = DefTxBW
		if t.Kind == Lat {
			p.tx = DefTxLat
		}
	}
	p.rx = c.RxDepth
	if p.rx == 0 {
		p.rx = 1
		if t.Verb == Send {
			p.rx = DefRxSend
		}
	} else if t.Verb != Send && p.rx > 1 {
		return nil, errors.New("on RDMA verbs rx depth can be only 1")
	}
	p.cqMod = c.CQMod
	reqCQMod := c.CQMod != 0
	if !reqCQMod {
		p.cqMod = DefCQMod
	}
	p.duration = c.Duration > 0
	p.all = c.All
	p.noPeak = c.NoPeak
	if c.Atomic != CmpAndSwap && c.Atomic != FetchAndAdd {
		return nil, fmt.Errorf("atomic type %d", c.Atomic)
	}
	if c.MTU != 0 && mtuEnum(c.MTU) == 0 {
		return nil, fmt.Errorf("path MTU %d: choose from 256, 512, 1024, 2048 or 4096", c.MTU)
	}

	// force_dependecies.
	if !p.duration {
		p.tx = min(p.tx, p.iters)
		if t.Verb == Send {
			p.rx = min(p.rx, p.iters)
		}
	}
	if p.size > cqModLimitSize && !p.all && !reqCQMod {
		p.cqMod = 1
	}
	p.cqMod = min(p.cqMod, p.tx)
	if p.all {
		if p.duration {
			return nil, errors.New("duration mode doesn't support running on all sizes")
		}
		p.size = MaxSize
	}
	if t.Verb == Atomic && p.size != DefSizeAtomic {
		return nil, errors.New("message size cannot be changed for atomic tests")
	}
	if p.duration {
		p.iters = 0
		p.noPeak = true
		p.margin = c.Margin
		if p.margin < 0 {
			p.margin = c.Duration / 4
		}
		if c.Duration <= 2*p.margin {
			return nil, errors.New("the duration must be more than twice the margin")
		}
	}
	if t == (Test{Send, BW}) && c.IsServer() {
		p.noPeak = true
	}
	if t.Verb == Send && p.rx%2 == 1 && !p.all {
		p.rx++ // perftest's "WA for a bug when rx_depth is odd in SEND"
	}
	if !p.duration && p.iters > noPeakAboveIter && t.Kind == BW {
		p.noPeak = true
	}
	if p.all {
		for i := 1; i < 24; i++ {
			p.sizes = append(p.sizes, 1<<i)
		}
	} else {
		p.sizes = []int{p.size}
	}
	return p, nil
}
