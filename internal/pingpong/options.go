package pingpong

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/taproce/taproce/verbs"
)

// Options are a pingpong's settings, named after the tools' flags.
type Options struct {
	// Type is verbs.RC (ibv_rc_pingpong), verbs.UC (ibv_uc_pingpong) or
	// verbs.UD (ibv_ud_pingpong).
	Type verbs.QPType
	// Server is the host to connect to; "" runs the server.
	Server string
	// Port is the TCP port of the exchange, -p.
	Port int
	// Device is the device name, -d; "" takes the first one this process
	// may use.
	Device string
	// IBPort is the device's port, -i (1, the only one).
	IBPort int
	// Size is the message size, -s.
	Size int
	// MTU is the path MTU of RC and UC in bytes, -m.
	MTU int
	// RxDepth is the number of receives posted at a time, -r.
	RxDepth int
	// Iters is the number of exchanges, -n.
	Iters int
	// SL is the service level, -l. RoCE carries none in its packets and
	// the verbs library's address vectors have none: it is accepted and
	// has no effect.
	SL int
	// Events makes the loop sleep on completion events, -e.
	Events bool
	// GIDIndex is the source GID index, -g; negative picks 1 (the IPv4
	// GID) when the port has it, else 0: a RoCE address vector needs a
	// GID, so the tools' default of none could not connect.
	GIDIndex int
	// Validate marks (client) and checks (server) the buffer, -c.
	Validate bool
	// ODP asks for on-demand paging, -o, which taproce refuses as a
	// device without ODP does.
	ODP bool
	// Timeout, --timeout (UD only, taproce's own), bounds the wait for
	// each datagram and counts the ones that do not come as lost
	// (Datagrams), for links that lose them; 0 waits for ever, as
	// ibv_ud_pingpong does, where one lost datagram stalls both sides.
	Timeout time.Duration
}

// DefaultOptions returns the tools' defaults for a transport: size 4096
// for RC and UC and 1024 for UD (ibv_ud_pingpong's usage text says 2048,
// but its code and so its wire use 1024), path MTU 1024, rx depth 500,
// 1000 iterations, port 18515.
func DefaultOptions(t verbs.QPType) Options {
	o := Options{Type: t, Port: DefaultPort, IBPort: 1, Size: 4096, MTU: 1024, RxDepth: 500, Iters: 1000, GIDIndex: -1}
	if t == verbs.UD {
		o.Size = 1024
	}
	return o
}

// options is the command line of `taproce pingpong`: the union of the
// tools' options (less the ones of features taproce lacks), -t to pick
// the transport and --ud/--uc as its shorthands.
var options = []Option{
	{'p', "port", true}, {'d', "ib-dev", true}, {'i', "ib-port", true}, {'s', "size", true},
	{'m', "mtu", true}, {'r', "rx-depth", true}, {'n', "iters", true}, {'l', "sl", true},
	{'e', "events", false}, {'g', "gid-idx", true}, {'o', "odp", false}, {'O', "iodp", false},
	{'c', "chk", false}, {'t', "transport", true}, {0, "ud", false}, {0, "uc", false}, {0, "rc", false},
	{0, "timeout", true}, {'h', "help", false},
}

// ErrHelp is returned by ParseArgs for -h.
var ErrHelp error = usageError("help requested")

// ParseArgs parses a `taproce pingpong` command line: options, then an
// optional server name.
func ParseArgs(args []string) (Options, error) {
	parsed, operands, err := Getopt(args, options)
	if err != nil {
		return Options{}, err
	}
	typ := verbs.RC
	for _, p := range parsed {
		switch p.Name {
		case "t":
			switch strings.ToLower(p.Value) {
			case "rc":
				typ = verbs.RC
			case "uc":
				typ = verbs.UC
			case "ud":
				typ = verbs.UD
			default:
				return Options{}, usagef("transport %q: want rc, uc or ud", p.Value)
			}
		case "ud":
			typ = verbs.UD
		case "uc":
			typ = verbs.UC
		case "rc":
			typ = verbs.RC
		case "h":
			return Options{}, ErrHelp
		}
	}
	o := DefaultOptions(typ)
	for _, p := range parsed {
		switch p.Name {
		case "p":
			o.Port, err = parseOption("port", p.Value, 0, 65535)
		case "d":
			o.Device = p.Value
		case "i":
			o.IBPort, err = parseOption("IB port", p.Value, 1, 255)
		case "s":
			o.Size, err = parseOption("message size", p.Value, 0, 1<<31-1-GRHLen)
		case "m":
			if _, ok := verbs.MTUFromBytes(atoi(p.Value)); !ok {
				err = usagef("path MTU %q: choose from 256, 512, 1024, 2048 or 4096", p.Value)
			}
			o.MTU = atoi(p.Value)
		case "r":
			o.RxDepth, err = parseOption("rx depth", p.Value, 1, 1<<20)
		case "n":
			o.Iters, err = parseOption("iterations", p.Value, 0, 1<<31-1)
		case "l":
			o.SL, err = parseOption("service level", p.Value, 0, 15)
		case "e":
			o.Events = true
		case "g":
			o.GIDIndex, err = parseOption("GID index", p.Value, -1, 255)
		case "c":
			o.Validate = true
		case "o", "O":
			o.ODP = true
		case "timeout":
			var ms int
			ms, err = parseOption("timeout", p.Value, 1, 3600_000)
			o.Timeout = time.Duration(ms) * time.Millisecond
		}
		if err != nil {
			return Options{}, err
		}
	}
	switch len(operands) {
	case 0:
	case 1:
		o.Server = operands[0]
	default:
		return Options{}, usagef("more than one server name: %q", operands)
	}
	return o, nil
}

// atoi is the number s is, as strtol(s, NULL, 0) reads it, or -1 when it
// is none.
func atoi(s string) int {
	n, err := ParseNumber(s)
	if err != nil {
		return -1
	}
	return n
}

// Usage writes the command's help, in the tools' words.
func Usage(w io.Writer, argv0 string) {
	fmt.Fprintf(w, `Usage:
  %[1]s            start a server and wait for connection
  %[1]s <host>     connect to server at <host>

Options:
  -t, --transport=<rc|uc|ud> transport: ibv_rc_pingpong, ibv_uc_pingpong or
                         ibv_ud_pingpong (default rc); --ud and --uc for short
  -p, --port=<port>      listen on/connect to port <port> (default 18515)
  -d, --ib-dev=<dev>     use IB device <dev> (default first device found)
  -i, --ib-port=<port>   use port <port> of IB device (default 1)
  -s, --size=<size>      size of message to exchange (default 4096, UD 1024)
  -m, --mtu=<size>       path MTU (default 1024; RC and UC)
  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)
  -n, --iters=<iters>    number of exchanges (default 1000)
  -l, --sl=<sl>          service level value (accepted, no effect on RoCE here)
  -e, --events           sleep on CQ events (default poll)
  -g, --gid-idx=<gid index> local port gid index (default 1, the IPv4 GID, else 0)
  -o, --odp              use on demand paging (taproce has none: refused)
  -c, --chk              validate received buffer
      --timeout=<msec>   UD: wait at most <msec> ms for each datagram, count the
                         ones that do not come as lost and go on (both sides;
                         default: wait for ever, as ibv_ud_pingpong)
`, argv0)
}
