package config

import (
	"errors"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/taproce/taproce/internal/impair"
)

// doc trims the leading newline of a raw string literal, so that the line
// after the opening backquote is line 1.
func doc(s string) string { return strings.TrimPrefix(s, "\n") }

func pfx(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, p := range s {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

func mac(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

// port returns DefaultPort with a namespace and addresses.
func port(ns string, addrs ...string) Port {
	p := DefaultPort()
	p.Namespace = ns
	p.Addresses = pfx(addrs...)
	return p
}

func with(p Port, f func(*Port)) Port {
	f(&p)
	return p
}

// def returns c with the defaults of an empty file in the fields it leaves
// zero; LocalSwitch and ECN are on, as in a file that does not mention them.
func def(c Config) *Config {
	c.ApplyDefaults()
	d := Default()
	if c.MetricsAddress == "" {
		c.MetricsAddress = d.MetricsAddress
	}
	if c.StateFile == "" {
		c.StateFile = d.StateFile
	}
	c.LocalSwitch, c.ECN = true, true
	return &c
}

// mod returns Default changed by f.
func mod(f func(*Config)) *Config {
	c := Default()
	f(c)
	return c
}

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want *Config
	}{
		{"empty", "", Default()},
		{"comments only", "# nothing\n\n   # at all\n", Default()},
		{"top level", doc(`
socket = "/tmp/t.sock"
log_level = "debug"
`), def(Config{Socket: "/tmp/t.sock", LogLevel: "debug"})},
		{"abstract socket", `socket = "@taproce"`, def(Config{Socket: "@taproce", LogLevel: "info"})},
		{"port defaults", doc(`
[[port]]
namespace = "lab-a"
addresses = ["10.55.0.1/24"]
`), def(Config{Socket: DefaultSocket, LogLevel: DefaultLogLevel, Ports: []Port{port("lab-a", "10.55.0.1/24")}})},
		{"every key", doc(`
socket = "/run/t.sock"
socket_mode = "0660"
socket_group = "rdma"
list_all_devices = true
admin_socket = "/run/t-admin.sock"
metrics_address = "[::1]:9100"
state_file = "/var/lib/taproce/state.json"
log_level = "warn"
local_switch = false
ecn = false
poll = "spin"
procs = 3
linger = "2m30s"
default_mtu = 9000

[limits]
qps = 16
cqs = 32
srqs = 1
mrs = 64
pds = 2
ahs = 8
channels = 4
mr_bytes = 1048576

[appliance_limits]
qps = 160
cqs = 320
srqs = 10
mrs = 640
pds = 20
ahs = 80
channels = 40
mr_bytes = "1GiB"
connections = 100
connections_per_uid = 10
descriptors = 5000

[[port]]
namespace = "/proc/123/ns/net"
name = "rxe-peer_0"
mode = "bridge"
mac = "02:00:00:00:00:01"
addresses = ["10.55.0.1/24", "fd55::1/64"]
mtu = 9000
[port.impair]
egress = "loss=1%,seed=7"
ingress = "delay=200us"
`), &Config{Socket: "/run/t.sock", SocketMode: 0o660, SocketGroup: "rdma", ListAllDevices: true, AdminSocket: "/run/t-admin.sock", MetricsAddress: "[::1]:9100",
			StateFile: "/var/lib/taproce/state.json", LogLevel: "warn", LocalSwitch: false, Poll: "spin", Procs: 3,
			Limits: Limits{QPs: 16, CQs: 32, SRQs: 1, MRs: 64, PDs: 2, AHs: 8, Channels: 4, MRBytes: 1 << 20},
			ApplianceLimits: ApplianceLimits{Limits: Limits{QPs: 160, CQs: 320, SRQs: 10, MRs: 640, PDs: 20, AHs: 80, Channels: 40, MRBytes: 1 << 30},
				Connections: 100, ConnectionsPerUID: 10, Descriptors: 5000},
			Linger: 150 * time.Second, DefaultMTU: 9000, Ports: []Port{{
				Namespace: "/proc/123/ns/net",
				Name:      "rxe-peer_0",
				Mode:      "bridge",
				MAC:       mac("02:00:00:00:00:01"),
				Addresses: pfx("10.55.0.1/24", "fd55::1/64"),
				MTU:       9000,
				Impair: Impair{
					Egress:  impair.Spec{Loss: 0.01, Seed: 7},
					Ingress: impair.Spec{Delay: 200 * time.Microsecond},
				},
			}}}},
		{"two ports", doc(`
[[port]]
namespace = "lab-a"
addresses = ["10.55.0.1/24"]
[port.impair]
egress = "loss=5%"

[[port]]
namespace = "lab-a"
name = "roce1"
addresses = ["10.56.0.1/24"]
[port.impair]
ingress = "corrupt=1%"
`), def(Config{Socket: DefaultSocket, LogLevel: DefaultLogLevel, Ports: []Port{
			with(port("lab-a", "10.55.0.1/24"), func(p *Port) { p.Impair.Egress.Loss = 0.05 }),
			with(port("lab-a", "10.56.0.1/24"), func(p *Port) { p.Name = "roce1"; p.Impair.Ingress.Corrupt = 0.01 }),
		}})},
		{"same name in two namespaces", doc(`
[[port]]
namespace = "lab-a"
addresses = ["10.55.0.1/24"]
[[port]]
namespace = "lab-b"
addresses = ["10.55.0.1/24"]
`), def(Config{Socket: DefaultSocket, LogLevel: DefaultLogLevel, Ports: []Port{
			port("lab-a", "10.55.0.1/24"), port("lab-b", "10.55.0.1/24"),
		}})},
		{"inline tables", doc(`
port = [
  {namespace = "lab-a", addresses = ["10.55.0.1/24"], impair = {egress = "loss=0.5"}},
  {namespace = "lab-b", addresses = ["10.55.0.2/24"], mac = ""},
]
`), def(Config{Socket: DefaultSocket, LogLevel: DefaultLogLevel, Ports: []Port{
			with(port("lab-a", "10.55.0.1/24"), func(p *Port) { p.Impair.Egress.Loss = 0.5 }),
			port("lab-b", "10.55.0.2/24"),
		}})},
		{"dotted and quoted keys", doc(`
[[port]]
"namespace" = 'lab-a'
addresses = [
  "10.55.0.1/24", # first
  "10.55.0.2/32",
]
impair.egress = "duplicate=100%"
`), def(Config{Socket: DefaultSocket, LogLevel: DefaultLogLevel, Ports: []Port{
			with(port("lab-a", "10.55.0.1/24", "10.55.0.2/32"), func(p *Port) { p.Impair.Egress.Duplicate = 1 }),
		}})},
		{"mtu limits", doc(`
[[port]]
namespace = "a"
addresses = ["10.0.0.1/8"]
mtu = 576
[[port]]
namespace = "b"
addresses = ["fd00::1/64"]
mtu = 1280
[[port]]
namespace = "c"
addresses = ["fd00::1/64"]
mtu = 9216
`), def(Config{Socket: DefaultSocket, LogLevel: DefaultLogLevel, Ports: []Port{
			with(port("a", "10.0.0.1/8"), func(p *Port) { p.MTU = 576 }),
			with(port("b", "fd00::1/64"), func(p *Port) { p.MTU = 1280 }),
			with(port("c", "fd00::1/64"), func(p *Port) { p.MTU = 9216 }),
		}})},
		{"name limits", doc(`
[[port]]
namespace = "a"
name = "abcdefghijklmno"
addresses = ["10.0.0.1/8"]
[[port]]
namespace = "a"
name = "x"
addresses = ["10.0.0.1/8"]
`), def(Config{Socket: DefaultSocket, LogLevel: DefaultLogLevel, Ports: []Port{
			with(port("a", "10.0.0.1/8"), func(p *Port) { p.Name = "abcdefghijklmno" }),
			with(port("a", "10.0.0.1/8"), func(p *Port) { p.Name = "x" }),
		}})},
		{"locally administered and vendor MACs", doc(`
[[port]]
namespace = "a"
mac = "02-AB-CD-EF-00-01"
addresses = ["10.0.0.1/8"]
[[port]]
namespace = "b"
mac = "0000.5e00.5301"
addresses = ["10.0.0.2/8"]
`), def(Config{Socket: DefaultSocket, LogLevel: DefaultLogLevel, Ports: []Port{
			with(port("a", "10.0.0.1/8"), func(p *Port) { p.MAC = mac("02:ab:cd:ef:00:01") }),
			with(port("b", "10.0.0.2/8"), func(p *Port) { p.MAC = mac("00:00:5e:00:53:01") }),
		}})},
		{"disabled metrics and state", "metrics_address = \"\"\nstate_file = \"\"\n", mod(func(c *Config) { c.MetricsAddress, c.StateFile = "", "" })},
		{"poll modes", "poll = \"block\"", mod(func(c *Config) { c.Poll = PollBlock })},
		{"abstract control socket with admin socket", "socket = \"@t\"\nadmin_socket = \"/t/admin.sock\"\n", mod(func(c *Config) { c.Socket, c.AdminSocket = "@t", "/t/admin.sock" })},
		{"metrics on any address and port", `metrics_address = ":0"`, mod(func(c *Config) { c.MetricsAddress = ":0" })},
		{"metrics on a host name", `metrics_address = "localhost:9476"`, mod(func(c *Config) { c.MetricsAddress = "localhost:9476" })},
		{"some limits", "[limits]\nqps = 1\nmr_bytes = \"512 MiB\"\n", mod(func(c *Config) { c.Limits.QPs, c.Limits.MRBytes = 1, 512<<20 })},
		{"limit sizes", "limits = {mr_bytes = \"3KiB\", ahs = 16777215}", mod(func(c *Config) { c.Limits.MRBytes, c.Limits.AHs = 3<<10, MaxLimit })},
		{"limit bytes", "limits.mr_bytes = \"16B\"", mod(func(c *Config) { c.Limits.MRBytes = 16 })},
		{"limit TiB", "limits.mr_bytes = \"1TiB\"", mod(func(c *Config) { c.Limits.MRBytes = 1 << 40 })},
		{"some appliance limits", "[appliance_limits]\nconnections = 8\nqps = 2\n", mod(func(c *Config) {
			c.ApplianceLimits.Connections, c.ApplianceLimits.QPs = 8, 2
		})},
		{"appliance limits beside the client's", "[limits]\nchannels = 2\n[appliance_limits]\nchannels = 3\nconnections_per_uid = 1\n", mod(func(c *Config) {
			c.Limits.Channels, c.ApplianceLimits.Channels, c.ApplianceLimits.ConnectionsPerUID = 2, 3, 1
		})},
		{"descriptors from RLIMIT_NOFILE", "appliance_limits.descriptors = 0", Default()},
		{"fewest descriptors", "appliance_limits.descriptors = 16", mod(func(c *Config) { c.ApplianceLimits.Descriptors = 16 })},
		{"socket mode of three digits", `socket_mode = "600"`, mod(func(c *Config) { c.SocketMode = 0o600 })},
		{"socket mode for all", `socket_mode = "0777"`, mod(func(c *Config) { c.SocketMode = 0o777 })},
		{"socket group ID", "socket_mode = \"0660\"\nsocket_group = \"2000\"\n", mod(func(c *Config) { c.SocketMode, c.SocketGroup = 0o660, "2000" })},
		{"socket group name", `socket_group = "rdma-users_1.x$"`, mod(func(c *Config) { c.SocketGroup = "rdma-users_1.x$" })},
		{"abstract socket with the default mode", "socket = \"@t\"\nsocket_mode = \"0666\"\n", mod(func(c *Config) { c.Socket = "@t" })},
		{"list all devices", `list_all_devices = true`, mod(func(c *Config) { c.ListAllDevices = true })},
		{"list own devices", `list_all_devices = false`, Default()},
		{"linger", `linger = "500ms"`, mod(func(c *Config) { c.Linger = 500 * time.Millisecond })},
		{"procs", `procs = 1`, mod(func(c *Config) { c.Procs = 1 })},
		{"procs chosen by poll", `procs = 0`, mod(func(c *Config) { c.Procs = 0 })},
		{"cpus", `cpus = "1,3-4"`, mod(func(c *Config) { c.CPUs = "1,3-4" })},
		{"cpus all", `cpus = ""`, mod(func(c *Config) { c.CPUs = "" })},
		{"default_mtu for ports without mtu", doc(`
default_mtu = 9000
[[port]]
namespace = "a"
addresses = ["fd00::1/64"]
[[port]]
namespace = "b"
addresses = ["fd00::2/64"]
mtu = 1500
`), mod(func(c *Config) {
			c.DefaultMTU = 9000
			c.Ports = []Port{
				with(port("a", "fd00::1/64"), func(p *Port) { p.MTU = 9000 }),
				port("b", "fd00::2/64"),
			}
		})},
		{"default_mtu after the ports", "[[port]]\nnamespace = \"a\"\naddresses = [\"10.0.0.1/8\"]\n[limits]\nqps = 2\n", mod(func(c *Config) {
			c.Limits.QPs = 2
			c.Ports = []Port{port("a", "10.0.0.1/8")}
		})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.in), "x.toml")
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse =\n%#v\nwant\n%#v", got, tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("Validate of a parsed config: %v", err)
			}
		})
	}
}

// good is a valid port table for error tests to build on; it takes lines
// 1..3 of a document.
const good = `[[port]]
namespace = "lab-a"
addresses = ["10.55.0.1/24"]
`

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string // every problem, in order
	}{
		// Syntax.
		{"syntax", doc(`
socket = "/a"
log_level =
`), []string{`x.toml:2: TOML syntax error at column 12: expected value but found '\n' instead`}},
		{"syntax later", good + "mtu = 1500\nmtu = 1501\n", []string{"x.toml:5: TOML syntax error"}},
		{"not utf-8", "socket = \"\xff\"\n", []string{"x.toml:1: TOML syntax error"}},

		// Unknown keys.
		{"unknown top-level key", doc(`
socket = "/a"
sockets = "/b"
`), []string{`x.toml:2: sockets: unknown key (did you mean "socket"?)`}},
		{"unknown table", doc(`
[server]
listen = 1
`), []string{"x.toml:1: server: unknown key"}},
		{"unknown key in port", good + "colour = \"red\"\n", []string{"x.toml:4: port[0].colour: unknown key"}},
		{"unknown key in second port", good + "[[port]]\nnamespace = \"lab-b\"\naddresses = [\"10.0.0.1/8\"]\n\n\nnmae = \"x\"\n", []string{
			`x.toml:9: port[1].nmae: unknown key (did you mean "name"?)`,
		}},
		{"keys are case-sensitive", good + "MTU = 9000\n", []string{`x.toml:4: port[0].MTU: unknown key (did you mean "mtu"?)`}},
		{"unknown key in port.impair", good + "[port.impair]\negress = \"\"\ndelay = \"1ms\"\n", []string{
			"x.toml:6: port[0].impair.delay: unknown key",
		}},
		{"unknown dotted key in port", good + "impair.jitter = \"1ms\"\n", []string{"x.toml:4: port[0].impair.jitter: unknown key"}},
		{"unknown quoted key", good + "\"my key\" = 1\n", []string{`x.toml:4: port[0]."my key": unknown key`}},
		{"ports instead of port", doc(`
[[ports]]
namespace = "a"
`), []string{`x.toml:1: ports: unknown key (did you mean "port"?)`}},

		// Types.
		{"port is a table", doc(`
[port]
namespace = "a"
`), []string{"x.toml:1: port: want an array of tables ([[port]]), not a table ([port])"}},
		{"port is a string", `port = "a"`, []string{"x.toml:1: port: want an array of tables ([[port]]), not a string"}},
		{"port is an array of strings", `port = ["a"]`, []string{"x.toml:1: port: want an array of tables ([[port]]), not an array holding a string"}},
		{"socket type", `socket = 1`, []string{"x.toml:1: socket: want a string, not an integer"}},
		{"namespace type", "[[port]]\nnamespace = 7\naddresses = [\"10.0.0.1/8\"]\n", []string{"x.toml:2: port[0].namespace: want a string, not an integer"}},
		{"mtu type", good + "mtu = \"big\"\n", []string{"x.toml:4: port[0].mtu: want an integer, not a string"}},
		{"mtu float", good + "mtu = 1500.0\n", []string{"x.toml:4: port[0].mtu: want an integer, not a float"}},
		{"addresses type", "[[port]]\nnamespace = \"a\"\naddresses = \"10.0.0.1/8\"\n", []string{
			"x.toml:3: port[0].addresses: want an array of CIDR prefixes, not a string",
		}},
		{"address type", good + "[[port]]\nnamespace = \"b\"\naddresses = [\n  \"10.0.0.1/8\",\n  true,\n]\n", []string{
			"x.toml:8: port[1].addresses[1]: want a string, not a boolean",
		}},
		{"impair type", good + "impair = \"loss=1%\"\n", []string{"x.toml:4: port[0].impair: want a table with ingress and egress, not a string"}},
		{"impair spec type", good + "impair.egress = 1\n", []string{"x.toml:4: port[0].impair.egress: want a string, not an integer"}},
		{"mode type", good + "mode = 1979-05-27\n", []string{"x.toml:4: port[0].mode: want a string, not a date-time"}},

		// Top-level values.
		{"log level", `log_level = "verbose"`, []string{`x.toml:1: log_level: "verbose" is not one of debug, info, warn, error`}},
		{"log level case", `log_level = "INFO"`, []string{`x.toml:1: log_level: "INFO" is not one of`}},
		{"empty socket", `socket = ""`, []string{"x.toml:1: socket: must not be empty"}},
		{"long socket", `socket = "/` + strings.Repeat("s", 107) + `"`, []string{"x.toml:1: socket: \x00is 108 bytes long; unix socket paths have at most 107"}},

		// Sockets and addresses.
		{"socket mode integer", `socket_mode = 0o660`, []string{`x.toml:1: socket_mode: want a string of octal digits such as "0660", not an integer`}},
		{"socket mode not octal", `socket_mode = "0668"`, []string{`x.toml:1: socket_mode: "0668" is not a permission mode of octal digits such as "0660" (at most 0777)`}},
		{"socket mode with setuid", `socket_mode = "4755"`, []string{`x.toml:1: socket_mode: "4755" is not a permission mode`}},
		{"socket mode too long", `socket_mode = "00660"`, []string{`x.toml:1: socket_mode: "00660" is not a permission mode`}},
		{"socket mode too short", `socket_mode = "66"`, []string{`x.toml:1: socket_mode: "66" is not a permission mode`}},
		{"socket mode symbolic", `socket_mode = "u=rw"`, []string{`x.toml:1: socket_mode: "u=rw" is not a permission mode`}},
		{"socket mode without the owner", "\nsocket_mode = \"0066\"\n", []string{
			"x.toml:2: socket_mode: 0066 does not let the owner read and write; the appliance's health check connects as the owner",
		}},
		{"socket mode of an abstract socket", "socket = \"@t\"\nsocket_mode = \"0600\"\n", []string{
			`x.toml:2: socket_mode: the control socket "@t" is abstract: it has no file mode, and any process in the appliance's network namespace may connect`,
		}},
		{"socket group of an abstract socket", "socket = \"@t\"\nsocket_group = \"rdma\"\n", []string{
			`x.toml:2: socket_group: the control socket "@t" is abstract: it has no file to give a group`,
		}},
		{"socket group with a colon", `socket_group = "a:b"`, []string{`x.toml:1: socket_group: "a:b" contains ':'; group names are letters, digits, '_', '.' and '-': not a group name or ID`}},
		{"socket group with a space", `socket_group = "rdma users"`, []string{`x.toml:1: socket_group: "rdma users" contains ' '`}},
		{"socket group starting with a dash", `socket_group = "-rdma"`, []string{`x.toml:1: socket_group: "-rdma" starts with '-': not a group name or ID`}},
		{"socket group too long", `socket_group = "` + strings.Repeat("g", 33) + `"`, []string{"x.toml:1: socket_group: \"ggg\x00is 33 bytes long; group names have at most 32"}},
		{"socket group ID too large", `socket_group = "4294967295"`, []string{`x.toml:1: socket_group: "4294967295": not a group name or ID: group IDs are 0..4294967294`}},
		{"socket group dollar only", `socket_group = "$"`, []string{`x.toml:1: socket_group: "$": not a group name or ID`}},
		{"list_all_devices type", `list_all_devices = "yes"`, []string{"x.toml:1: list_all_devices: want true or false, not a string"}},
		{"socket group type", `socket_group = 2000`, []string{"x.toml:1: socket_group: want a string, not an integer"}},
		{"empty admin socket", `admin_socket = ""`, []string{"x.toml:1: admin_socket: must not be empty"}},
		{"long admin socket", `admin_socket = "/` + strings.Repeat("a", 107) + `"`, []string{"x.toml:1: admin_socket: \x00is 108 bytes long"}},
		{"abstract admin socket", `admin_socket = "@taproce-admin"`, []string{`x.toml:1: admin_socket: "@taproce-admin" is an abstract socket; the admin socket must be a file`}},
		{"admin socket is the control socket", "socket = \"/run/t.sock\"\n\nadmin_socket = \"/run/t.sock\"\n", []string{
			`x.toml:3: admin_socket: "/run/t.sock" is the control socket too; give them different paths`,
		}},
		{"admin socket type", `admin_socket = ["/a"]`, []string{"x.toml:1: admin_socket: want a string, not an array"}},
		{"metrics address without port", `metrics_address = "127.0.0.1"`, []string{`x.toml:1: metrics_address: "127.0.0.1" is not host:port, such as 127.0.0.1:9476 or [::1]:9476`}},
		{"metrics address unbracketed IPv6", `metrics_address = "::1:9476"`, []string{`x.toml:1: metrics_address: "::1:9476" is not host:port`}},
		{"metrics port name", `metrics_address = "localhost:http"`, []string{`x.toml:1: metrics_address: "localhost:http": port "http" is not a number within 0..65535`}},
		{"metrics port too big", `metrics_address = ":65536"`, []string{`x.toml:1: metrics_address: ":65536": port "65536" is not a number within 0..65535`}},
		{"metrics multicast", `metrics_address = "224.0.0.1:9476"`, []string{`x.toml:1: metrics_address: "224.0.0.1:9476": 224.0.0.1 is not an address to listen on`}},
		{"metrics address type", `metrics_address = 9476`, []string{"x.toml:1: metrics_address: want a string, not an integer"}},
		{"relative state file", `state_file = "run/state.json"`, []string{`x.toml:1: state_file: "run/state.json" is not an absolute path`}},
		{"unclean state file", `state_file = "/run//state.json"`, []string{`x.toml:1: state_file: "/run//state.json" is not a clean path (want "/run/state.json")`}},
		{"root state file", `state_file = "/"`, []string{`x.toml:1: state_file: "/" is a directory`}},

		// Switch, polling, linger, MTU.
		{"local switch type", `local_switch = "yes"`, []string{"x.toml:1: local_switch: want true or false, not a string"}},
		{"ecn type", `ecn = 1`, []string{"x.toml:1: ecn: want true or false, not an integer"}},
		{"poll mode", `poll = "busy"`, []string{`x.toml:1: poll: "busy" is not one of adaptive, block, spin`}},
		{"empty poll mode", `poll = ""`, []string{`x.toml:1: poll: "" is not one of adaptive, block, spin`}},
		{"poll type", `poll = 1`, []string{"x.toml:1: poll: want a string, not an integer"}},
		{"procs negative", `procs = -1`, []string{"x.toml:1: procs: -1 is outside 0..1024"}},
		{"procs too many", `procs = 1025`, []string{"x.toml:1: procs: 1025 is outside 0..1024"}},
		{"procs type", `procs = "all"`, []string{"x.toml:1: procs: want an integer, not a string"}},
		{"cpus not a list", `cpus = "all"`, []string{`x.toml:1: cpus: "all" is not a processor list such as "1" or "2-3,6"`}},
		{"cpus backwards", `cpus = "3-1"`, []string{`x.toml:1: cpus: "3-1" is not a processor list such as "1" or "2-3,6"`}},
		{"cpus beyond", `cpus = "0,1024"`, []string{`x.toml:1: cpus: "0,1024" is not a processor list such as "1" or "2-3,6"`}},
		{"cpus type", `cpus = 1`, []string{"x.toml:1: cpus: want a string, not an integer"}},
		{"linger not a duration", `linger = "30"`, []string{`x.toml:1: linger: "30" is not a duration such as "30s" or "500ms"`}},
		{"linger integer", `linger = 30`, []string{"x.toml:1: linger: want a string, not an integer"}},
		{"linger zero", `linger = "0s"`, []string{"x.toml:1: linger: 0s is not a positive duration"}},
		{"linger negative", `linger = "-1s"`, []string{"x.toml:1: linger: -1s is not a positive duration"}},
		{"default mtu too small", `default_mtu = 500`, []string{"x.toml:1: default_mtu: 500 is outside 576..9216"}},
		{"default mtu type", `default_mtu = "jumbo"`, []string{"x.toml:1: default_mtu: want an integer, not a string"}},
		{"invalid default mtu is reported once", "default_mtu = 100000\n" + good, []string{"x.toml:1: default_mtu: 100000 is outside 576..9216"}},
		{"default mtu below a port's IPv6 minimum", "default_mtu = 1000\n\n[[port]]\nnamespace = \"a\"\naddresses = [\"fd00::1/64\"]\n", []string{
			"x.toml:3: port[0].mtu: 1000 is below 1280, the IPv6 minimum, and the port has IPv6 address fd00::1/64 (the port has no mtu of its own: this is default_mtu, line 1)",
		}},

		// Limits.
		{"limits is not a table", `limits = 5`, []string{"x.toml:1: limits: want a table ([limits]), not an integer"}},
		{"limits array of tables", "[[limits]]\nqps = 1\n", []string{"x.toml:1: limits: want a table ([limits]), not an array of tables"}},
		{"unknown limit", "[limits]\nqp = 5\nmemory = 1\n", []string{
			`x.toml:2: limits.qp: unknown key (did you mean "qps"?)`,
			"x.toml:3: limits.memory: unknown key",
		}},
		{"zero and negative limits", "[limits]\nqps = 0\ncqs = -1\nsrqs = 16777216\nmrs = 0\npds = 0\nahs = 0\nmr_bytes = 0\n", []string{
			"x.toml:2: limits.qps: 0 is outside 1..16777215",
			"x.toml:3: limits.cqs: -1 is outside 1..16777215",
			"x.toml:4: limits.srqs: 16777216 is outside 1..16777215",
			"x.toml:5: limits.mrs: 0 is outside 1..16777215",
			"x.toml:6: limits.pds: 0 is outside 1..16777215",
			"x.toml:7: limits.ahs: 0 is outside 1..16777215",
			"x.toml:8: limits.mr_bytes: 0 is not a positive number of bytes",
		}},
		{"limit type", "[limits]\nqps = \"many\"\n", []string{"x.toml:2: limits.qps: want an integer, not a string"}},
		{"limit float", "[limits]\nqps = 1.5\n", []string{"x.toml:2: limits.qps: want an integer, not a float"}},
		{"mr_bytes unit", "[limits]\nmr_bytes = \"16GB\"\n", []string{`x.toml:2: limits.mr_bytes: "16GB" is not a size such as "16GiB" or "512MiB" (units B, KiB, MiB, GiB, TiB)`}},
		{"mr_bytes fraction", "[limits]\nmr_bytes = \"1.5GiB\"\n", []string{`x.toml:2: limits.mr_bytes: "1.5GiB" is not a size`}},
		{"mr_bytes negative size", "[limits]\nmr_bytes = \"-1KiB\"\n", []string{`x.toml:2: limits.mr_bytes: "-1KiB" is not a size`}},
		{"mr_bytes unit only", "[limits]\nmr_bytes = \"GiB\"\n", []string{`x.toml:2: limits.mr_bytes: "GiB" is not a size`}},
		{"mr_bytes overflow", "[limits]\nmr_bytes = \"9000000TiB\"\n", []string{`x.toml:2: limits.mr_bytes: "9000000TiB" is more than 9223372036854775807 bytes`}},
		{"mr_bytes negative", "[limits]\nmr_bytes = -5\n", []string{"x.toml:2: limits.mr_bytes: -5 is not a positive number of bytes"}},
		{"mr_bytes type", "[limits]\nmr_bytes = true\n", []string{`x.toml:2: limits.mr_bytes: want an integer or a size such as "16GiB", not a boolean`}},
		{"channels", "[limits]\nchannels = 0\n", []string{"x.toml:2: limits.channels: 0 is outside 1..16777215"}},
		{"appliance limits is not a table", `appliance_limits = "all"`, []string{"x.toml:1: appliance_limits: want a table ([appliance_limits]), not a string"}},
		{"unknown appliance limit", "[appliance_limits]\nconnection = 5\nconnections_per_user = 1\n", []string{
			`x.toml:2: appliance_limits.connection: unknown key (did you mean "connections"?)`,
			"x.toml:3: appliance_limits.connections_per_user: unknown key",
		}},
		{"connections limits per client", "[limits]\nconnections = 5\n", []string{`x.toml:2: limits.connections: unknown key`}},
		{"zero and negative appliance limits", doc(`
[appliance_limits]
qps = 0
cqs = -1
srqs = 16777216
mrs = 0
pds = 0
ahs = 0
channels = 0
mr_bytes = 0
connections = 0
connections_per_uid = -2
descriptors = 15
`), []string{
			"x.toml:2: appliance_limits.qps: 0 is outside 1..16777215",
			"x.toml:3: appliance_limits.cqs: -1 is outside 1..16777215",
			"x.toml:4: appliance_limits.srqs: 16777216 is outside 1..16777215",
			"x.toml:5: appliance_limits.mrs: 0 is outside 1..16777215",
			"x.toml:6: appliance_limits.pds: 0 is outside 1..16777215",
			"x.toml:7: appliance_limits.ahs: 0 is outside 1..16777215",
			"x.toml:8: appliance_limits.channels: 0 is outside 1..16777215",
			"x.toml:9: appliance_limits.mr_bytes: 0 is not a positive number of bytes",
			"x.toml:10: appliance_limits.connections: 0 is outside 1..16777215",
			"x.toml:11: appliance_limits.connections_per_uid: -2 is outside 1..16777215",
			"x.toml:12: appliance_limits.descriptors: 15 is outside 16..16777215 (or 0: three quarters of RLIMIT_NOFILE)",
		}},
		{"appliance limit type", "[appliance_limits]\nconnections = \"many\"\nmr_bytes = \"1 GB\"\n", []string{
			"x.toml:2: appliance_limits.connections: want an integer, not a string",
			`x.toml:3: appliance_limits.mr_bytes: "1 GB" is not a size`,
		}},

		// Namespace.
		{"missing namespace", "[[port]]\naddresses = [\"10.0.0.1/8\"]\n", []string{
			"x.toml:1: port[0].namespace: missing; want a name under /var/run/netns or an absolute path",
		}},
		{"empty namespace", "[[port]]\nnamespace = \"\"\naddresses = [\"10.0.0.1/8\"]\n", []string{"x.toml:2: port[0].namespace: missing"}},
		{"relative path namespace", "[[port]]\nnamespace = \"netns/a\"\naddresses = [\"10.0.0.1/8\"]\n", []string{
			`x.toml:2: port[0].namespace: "netns/a" is neither a name under /var/run/netns nor an absolute path`,
		}},
		{"unclean namespace path", "[[port]]\nnamespace = \"/proc/1//ns/net/\"\naddresses = [\"10.0.0.1/8\"]\n", []string{
			`x.toml:2: port[0].namespace: "/proc/1//ns/net/" is not a clean path (want "/proc/1/ns/net")`,
		}},
		{"dot namespace", "[[port]]\nnamespace = \"..\"\naddresses = [\"10.0.0.1/8\"]\n", []string{`x.toml:2: port[0].namespace: ".." is not a namespace name`}},

		// Interface name.
		{"empty name", good + "name = \"\"\n", []string{"x.toml:4: port[0].name: must not be empty"}},
		{"long name", good + "name = \"abcdefghijklmnop\"\n", []string{`x.toml:4: port[0].name: "abcdefghijklmnop" is 16 bytes long; Linux interface names have at most 15`}},
		{"slash in name", good + "name = \"a/b\"\n", []string{`x.toml:4: port[0].name: "a/b" contains '/'`}},
		{"colon in name", good + "name = \"eth0:1\"\n", []string{`x.toml:4: port[0].name: "eth0:1" contains ':'`}},
		{"space in name", good + "name = \"a b\"\n", []string{`x.toml:4: port[0].name: "a b" contains ' '`}},
		{"tab in name", good + "name = \"a\\tb\"\n", []string{`x.toml:4: port[0].name: "a\tb" contains '\t'`}},
		{"template name", good + "name = \"roce%d\"\n", []string{`x.toml:4: port[0].name: "roce%d" contains '%', which Linux treats as a name template`}},
		{"dot name", good + "name = \".\"\n", []string{`x.toml:4: port[0].name: "." is not a valid interface name`}},
		{"dotdot name", good + "name = \"..\"\n", []string{`x.toml:4: port[0].name: ".." is not a valid interface name`}},
		{"non-ASCII name", good + "name = \"röce\"\n", []string{`x.toml:4: port[0].name: "röce" contains byte 0xc3; interface names here are printable ASCII without spaces`}},

		// Mode.
		{"redirect mode", good + "mode = \"redirect\"\n", []string{`x.toml:4: port[0].mode: "redirect" ports are for pods, attached by the CNI plugin through the admin API; a [[port]] takes "bridge"`}},
		{"unknown mode", good + "mode = \"macvtap\"\n", []string{`x.toml:4: port[0].mode: unknown mode "macvtap"; want "bridge"`}},

		// MAC.
		{"bad MAC", good + "mac = \"02:00:00:00:00\"\n", []string{`x.toml:4: port[0].mac: "02:00:00:00:00" is not a MAC address such as 02:00:00:00:00:01`}},
		{"multicast MAC", good + "mac = \"01:00:5e:00:00:01\"\n", []string{"x.toml:4: port[0].mac: 01:00:5e:00:00:01 is a multicast address; a port needs a unicast MAC"}},
		{"broadcast MAC", good + "mac = \"ff:ff:ff:ff:ff:ff\"\n", []string{"x.toml:4: port[0].mac: ff:ff:ff:ff:ff:ff is a multicast address"}},
		{"EUI-64 MAC", good + "mac = \"02:00:00:00:00:00:00:01\"\n", []string{"x.toml:4: port[0].mac: 02:00:00:00:00:00:00:01 is not a 48-bit MAC address"}},
		{"zero MAC", good + "mac = \"00:00:00:00:00:00\"\n", []string{"x.toml:4: port[0].mac: 00:00:00:00:00:00 is all zeros"}},

		// Addresses.
		{"no addresses", "[[port]]\nnamespace = \"a\"\n", []string{"x.toml:1: port[0].addresses: at least one address is required"}},
		{"empty addresses", "[[port]]\nnamespace = \"a\"\naddresses = []\n", []string{"x.toml:3: port[0].addresses: at least one address is required"}},
		{"bad CIDR", "[[port]]\nnamespace = \"a\"\naddresses = [\"10.0.0.1/33\"]\n", []string{
			`x.toml:3: port[0].addresses[0]: "10.0.0.1/33" is not a CIDR prefix such as 10.55.0.1/24 or fd55::1/64`,
		}},
		{"not an address", "[[port]]\nnamespace = \"a\"\naddresses = [\"lab-a\"]\n", []string{`x.toml:3: port[0].addresses[0]: "lab-a" is not a CIDR prefix`}},
		{"no prefix length", "[[port]]\nnamespace = \"a\"\naddresses = [\"10.0.0.1\", \"fd00::1\"]\n", []string{
			`x.toml:3: port[0].addresses[0]: "10.0.0.1" has no prefix length (as in 10.0.0.1/32)`,
			`x.toml:3: port[0].addresses[1]: "fd00::1" has no prefix length (as in fd00::1/128)`,
		}},
		{"zone", "[[port]]\nnamespace = \"a\"\naddresses = [\"fe80::1%eth0/64\"]\n", []string{`x.toml:3: port[0].addresses[0]: "fe80::1%eth0/64" has a zone; addresses here take none`}},
		{"bad address on its own line", "[[port]]\nnamespace = \"a\"\naddresses = [\n  \"10.0.0.1/8\",\n\n  \"10.0.0.300/8\",\n]\n", []string{
			`x.toml:6: port[0].addresses[1]: "10.0.0.300/8" is not a CIDR prefix`,
		}},
		{"duplicate address", "[[port]]\nnamespace = \"a\"\naddresses = [\n  \"10.0.0.1/8\",\n  \"10.0.0.1/24\",\n]\n", []string{
			"x.toml:5: port[0].addresses[1]: 10.0.0.1/24 repeats address 10.0.0.1 of addresses[0]",
		}},
		{"duplicate IPv6 address", "[[port]]\nnamespace = \"a\"\naddresses = [\"fd00::1/64\", \"fd00:0::1/64\"]\n", []string{
			"x.toml:3: port[0].addresses[1]: fd00::1/64 repeats address fd00::1 of addresses[0]",
		}},
		{"reserved addresses", "[[port]]\nnamespace = \"a\"\naddresses = [\"0.0.0.0/0\", \"127.0.0.1/8\", \"224.0.0.1/4\", \"255.255.255.255/32\", \"::/0\", \"::ffff:10.0.0.1/120\"]\n", []string{
			"x.toml:3: port[0].addresses[0]: 0.0.0.0/0 is the unspecified address",
			"x.toml:3: port[0].addresses[1]: 127.0.0.1/8 is a loopback address",
			"x.toml:3: port[0].addresses[2]: 224.0.0.1/4 is a multicast address",
			"x.toml:3: port[0].addresses[3]: 255.255.255.255/32 is the broadcast address",
			"x.toml:3: port[0].addresses[4]: ::/0 is the unspecified address",
			"x.toml:3: port[0].addresses[5]: ::ffff:10.0.0.1/120 is an IPv4-mapped IPv6 address; write 10.0.0.1/24",
		}},

		// MTU.
		{"mtu too small", good + "mtu = 575\n", []string{"x.toml:4: port[0].mtu: 575 is outside 576..9216"}},
		{"mtu too big", good + "mtu = 9217\n", []string{"x.toml:4: port[0].mtu: 9217 is outside 576..9216"}},
		{"mtu negative", good + "mtu = -1500\n", []string{"x.toml:4: port[0].mtu: -1500 is outside 576..9216"}},
		{"mtu huge", good + "mtu = 9223372036854775807\n", []string{"x.toml:4: port[0].mtu: 9223372036854775807 is outside 576..9216"}},
		{"mtu below IPv6 minimum", "[[port]]\nnamespace = \"a\"\naddresses = [\"10.0.0.1/8\", \"fd00::1/64\"]\nmtu = 1279\n", []string{
			"x.toml:4: port[0].mtu: 1279 is below 1280, the IPv6 minimum, and the port has IPv6 address fd00::1/64",
		}},
		{"mtu below IPv6 minimum without IPv6", "[[port]]\nnamespace = \"a\"\naddresses = [\"10.0.0.1/8\"]\nmtu = 1279\n", nil},

		// Impairment.
		{"bad impair spec", good + "[port.impair]\negress = \"loss=2\"\ningress = \"loss=1%,jitter=1ms\"\n", []string{
			"x.toml:5: port[0].impair.egress: invalid impairment spec: loss: 2 is outside 0..1",
			`x.toml:6: port[0].impair.ingress: invalid impairment spec: unknown key "jitter"`,
		}},
		{"impair spec in inline table", "port = [\n  {namespace = \"a\", addresses = [\"10.0.0.1/8\"]},\n  {namespace = \"b\", addresses = [\"10.0.0.1/8\"],\n   impair = {egress = \"delay=-1s\"}},\n]\n", []string{
			"x.toml:4: port[1].impair.egress: invalid impairment spec: delay: -1s is negative",
		}},

		// Duplicate ports.
		{"duplicate port", good + "\n" + good, []string{
			`x.toml:5: port[1]: same namespace "lab-a" and name "roce0" as port[0] at line 1`,
		}},
		{"duplicate port by explicit name", good + "name = \"roce0\"\n" + good + "\n" + good + "name = \"roce1\"\n[[port]]\nnamespace = \"/var/run/netns/lab-a\"\nname = \"roce1\"\naddresses = [\"10.0.0.1/8\"]\n", []string{
			`x.toml:5: port[1]: same namespace "lab-a" and name "roce0" as port[0] at line 1`,
			`x.toml:13: port[3]: same namespace "/var/run/netns/lab-a" and name "roce1" as port[2] at line 9`,
		}},
		{"duplicate port under /run/netns", good + "[[port]]\nnamespace = \"/run/netns/lab-a\"\naddresses = [\"10.0.0.1/8\"]\n", []string{
			`x.toml:4: port[1]: same namespace "/run/netns/lab-a" and name "roce0" as port[0] at line 1`,
		}},
		{"duplicate inline ports", "port = [\n  {namespace = \"a\", addresses = [\"10.0.0.1/8\"]},\n  {namespace = \"a\", addresses = [\"10.0.0.1/8\"]},\n]\n", []string{
			`x.toml:3: port[1]: same namespace "a" and name "roce0" as port[0] at line 2`,
		}},

		// Everything at once, reported in line order.
		{"many", doc(`
log_level = "loud"
colour = 1

[[port]]
namespace = "lab-a"
name = "this-name-is-too-long"
mac = "01:02:03:04:05:06"
addresses = ["10.0.0.1/8", "10.0.0.1/16", "fd00::1/64"]
mtu = 1000
mode = "redirect"
[port.impair]
egress = "loss=200%"

[[port]]
namespace = 5
name = "roce0"
addresses = "fd00::2/64"
speed = 100
`), []string{
			`x.toml:1: log_level: "loud" is not one of debug, info, warn, error`,
			"x.toml:2: colour: unknown key",
			`x.toml:6: port[0].name: "this-name-is-too-long" is 21 bytes long`,
			"x.toml:7: port[0].mac: 01:02:03:04:05:06 is a multicast address",
			"x.toml:8: port[0].addresses[1]: 10.0.0.1/16 repeats address 10.0.0.1 of addresses[0]",
			"x.toml:9: port[0].mtu: 1000 is below 1280, the IPv6 minimum, and the port has IPv6 address fd00::1/64",
			`x.toml:10: port[0].mode: "redirect" ports are for pods`,
			"x.toml:12: port[0].impair.egress: invalid impairment spec: loss: 200% is outside 0%..100%",
			"x.toml:15: port[1].namespace: want a string, not an integer",
			"x.toml:17: port[1].addresses: want an array of CIDR prefixes, not a string",
			"x.toml:18: port[1].speed: unknown key",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tt.in), "x.toml")
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse = %+v, want errors %q", cfg, tt.want)
			}
			if cfg != nil {
				t.Errorf("Parse returned a config with its error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error does not wrap ErrInvalid: %v", err)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Fatalf("got %d problems, want %d:\n%v", len(lines), len(tt.want), err)
			}
			for i, w := range tt.want {
				for _, part := range strings.Split(w, "\x00") {
					if !strings.Contains(lines[i], part) {
						t.Errorf("problem %d is %q, want it to contain %q", i+1, lines[i], part)
					}
				}
				if !strings.HasPrefix(lines[i], "x.toml:") {
					t.Errorf("problem %d %q does not start with the file name", i+1, lines[i])
				}
			}
		})
	}
}

func TestErrorTypes(t *testing.T) {
	_, err := Parse([]byte("a = \n"), "x.toml")
	var pe toml.ParseError
	if !errors.As(err, &pe) || pe.Position.Line != 1 {
		t.Errorf("syntax error %v does not carry the toml.ParseError of line 1", err)
	}
	var e *Error
	if !errors.As(err, &e) || e.File != "x.toml" || e.Line != 1 || e.Key != "" {
		t.Errorf("syntax error %v: *Error = %+v", err, e)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("syntax error %v does not wrap ErrInvalid", err)
	}

	_, err = Parse([]byte(good+"[port.impair]\negress = \"loss=x\"\n"), "y.toml")
	if !errors.Is(err, impair.ErrInvalidSpec) || !errors.Is(err, ErrInvalid) {
		t.Errorf("impair error %v does not wrap both impair.ErrInvalidSpec and ErrInvalid", err)
	}
	if !errors.As(err, &e) || e.File != "y.toml" || e.Line != 5 || e.Key != "port[0].impair.egress" {
		t.Errorf("impair error: *Error = %+v", e)
	}

	_, err = Parse([]byte(good+"mac = \"x\"\n"), "z.toml")
	var addrErr *net.AddrError
	if !errors.As(err, &addrErr) {
		t.Errorf("MAC error %v does not wrap net.ParseMAC's error", err)
	}

	// Several problems: errors.Join of *Error values.
	_, err = Parse([]byte("a = 1\nb = 2\n"), "x.toml")
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok || len(joined.Unwrap()) != 2 {
		t.Fatalf("two problems: %v is not a join of two errors", err)
	}
	for _, e := range joined.Unwrap() {
		if _, ok := e.(*Error); !ok {
			t.Errorf("joined error %v is a %T, want *Error", e, e)
		}
	}

	for _, tt := range []struct {
		e    Error
		want string
	}{
		{Error{File: "f", Line: 3, Key: "k", Msg: "m"}, "f:3: k: m"},
		{Error{File: "f", Msg: "m"}, "f: m"},
		{Error{Line: 3, Msg: "m"}, "line 3: m"},
		{Error{Key: "k", Msg: "m"}, "k: m"},
	} {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("%+v.Error() = %q, want %q", tt.e, got, tt.want)
		}
	}
}

func TestExampleFile(t *testing.T) {
	cfg, err := Load("taproce.toml")
	if err != nil {
		t.Fatalf("Load(taproce.toml): %v", err)
	}
	want := Default()
	want.Ports = []Port{
		{
			Namespace: "lab-a",
			Name:      "roce0",
			Mode:      "bridge",
			MAC:       mac("02:00:00:00:00:01"),
			Addresses: pfx("10.55.0.1/24", "fd55::1/64"),
			MTU:       1500,
			Impair:    Impair{Egress: impair.Spec{Loss: 0.01, Seed: 7}},
		},
		port("lab-b", "10.55.0.2/24"),
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("taproce.toml =\n%#v\nwant\n%#v", cfg, want)
	}

	// The example mentions every key the parser knows.
	data, err := os.ReadFile("taproce.toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, keys := range [][]string{topKeys, limitsKeys, applianceLimitsKeys, portKeys, impairKeys} {
		for _, k := range keys {
			if !strings.Contains(string(data), "\n"+k+" = ") && !strings.Contains(string(data), "[port."+k+"]") &&
				!strings.Contains(string(data), "[["+k+"]]") && !strings.Contains(string(data), "\n["+k+"]") {
				t.Errorf("taproce.toml does not show key %q", k)
			}
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	_, err := Load(filepath.Join(dir, "missing.toml"))
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrInvalid) {
		t.Errorf("Load of a missing file: %v, want fs.ErrNotExist and not ErrInvalid", err)
	}

	path := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(path, []byte(good+"mtu = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	if want := path + ":4: port[0].mtu: 1 is outside 576..9216"; err == nil || err.Error() != want {
		t.Errorf("Load(bad.toml) = %v, want %q", err, want)
	}

	path = filepath.Join(dir, "good.toml")
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil || len(cfg.Ports) != 1 {
		t.Errorf("Load(good.toml) = %+v, %v", cfg, err)
	}
}

func TestValidate(t *testing.T) {
	valid := func() *Config {
		c := Default()
		c.Ports = []Port{port("lab-a", "10.55.0.1/24"), port("lab-b", "10.55.0.2/24", "fd55::2/64")}
		return c
	}
	tests := []struct {
		name   string
		change func(*Config)
		want   []string
	}{
		{"valid", func(*Config) {}, nil},
		{"no ports", func(c *Config) { c.Ports = nil }, nil},
		{"zero config", func(c *Config) { *c = Config{} }, []string{
			"socket: must not be empty",
			"socket_mode: 0000 does not let the owner read and write",
			"admin_socket: must not be empty",
			`log_level: "" is not one of debug, info, warn, error`,
			`poll: "" is not one of adaptive, block, spin`,
			"limits.qps: 0 is outside 1..16777215",
			"limits.cqs: 0 is outside 1..16777215",
			"limits.srqs: 0 is outside 1..16777215",
			"limits.mrs: 0 is outside 1..16777215",
			"limits.pds: 0 is outside 1..16777215",
			"limits.ahs: 0 is outside 1..16777215",
			"limits.channels: 0 is outside 1..16777215",
			"limits.mr_bytes: 0 is not a positive number of bytes",
			"appliance_limits.qps: 0 is outside 1..16777215",
			"appliance_limits.cqs: 0 is outside 1..16777215",
			"appliance_limits.srqs: 0 is outside 1..16777215",
			"appliance_limits.mrs: 0 is outside 1..16777215",
			"appliance_limits.pds: 0 is outside 1..16777215",
			"appliance_limits.ahs: 0 is outside 1..16777215",
			"appliance_limits.channels: 0 is outside 1..16777215",
			"appliance_limits.mr_bytes: 0 is not a positive number of bytes",
			"appliance_limits.connections: 0 is outside 1..16777215",
			"appliance_limits.connections_per_uid: 0 is outside 1..16777215",
			"linger: 0s is not a positive duration",
			"default_mtu: 0 is outside 576..9216",
		}},
		{"zero config with defaults", func(c *Config) { *c = Config{}; c.ApplyDefaults() }, nil},
		{"admin socket is the control socket", func(c *Config) { c.AdminSocket = c.Socket }, []string{
			`admin_socket: "/run/taproce/taproce.sock" is the control socket too`,
		}},
		{"state file with NUL", func(c *Config) { c.StateFile = "/a\x00" }, []string{`state_file: "/a\x00" contains a NUL byte`}},
		{"admin socket with NUL", func(c *Config) { c.AdminSocket = "/a\x00" }, []string{`admin_socket: "/a\x00" contains a NUL byte`}},
		{"unknown poll mode", func(c *Config) { c.Poll = "Spin" }, []string{`poll: "Spin" is not one of adaptive, block, spin`}},
		{"zero port", func(c *Config) { c.Ports = []Port{{}} }, []string{
			"port[0].namespace: missing",
			"port[0].name: must not be empty",
			`port[0].mode: unknown mode ""`,
			"port[0].addresses: at least one address is required",
			"port[0].mtu: 0 is outside 576..9216",
		}},
		{"zero port with defaults", func(c *Config) {
			c.Ports = []Port{{Namespace: "a", Addresses: pfx("10.0.0.1/8")}}
			c.ApplyDefaults()
		}, nil},
		{"socket with NUL", func(c *Config) { c.Socket = "/a\x00b" }, []string{`socket: "/a\x00b" contains a NUL byte`}},
		{"socket mode with the sticky bit", func(c *Config) { c.SocketMode = 0o1666 }, []string{"socket_mode: 01666 has bits beyond the permission bits 0777"}},
		{"socket mode of a directory", func(c *Config) { c.SocketMode = fs.ModeDir | 0o666 }, []string{"socket_mode: 020000000666 has bits beyond"}},
		{"socket mode zero", func(c *Config) { c.SocketMode = 0 }, []string{"socket_mode: 0000 does not let the owner read and write"}},
		{"socket group", func(c *Config) { c.SocketGroup = "0" }, nil},
		{"socket group empty name", func(c *Config) { c.SocketGroup = "$" }, []string{`socket_group: "$": not a group name or ID`}},
		{"namespace with NUL", func(c *Config) { c.Ports[0].Namespace = "a\x00" }, []string{`port[0].namespace: "a\x00" contains a NUL byte`}},
		{"long namespace", func(c *Config) { c.Ports[0].Namespace = strings.Repeat("n", 256) }, []string{"port[0].namespace: name is 256 bytes long"}},
		{"short MAC", func(c *Config) { c.Ports[1].MAC = net.HardwareAddr{2, 0, 0} }, []string{"port[1].mac: 02:00:00 is not a 48-bit MAC address"}},
		{"invalid prefix", func(c *Config) { c.Ports[0].Addresses = []netip.Prefix{{}} }, []string{"port[0].addresses[0]: not a valid prefix"}},
		{"IPv6 MTU", func(c *Config) { c.Ports[1].MTU = 1200 }, []string{"port[1].mtu: 1200 is below 1280, the IPv6 minimum, and the port has IPv6 address fd55::2/64"}},
		{"impair spec", func(c *Config) {
			c.Ports[0].Impair.Ingress.Loss = 2
			c.Ports[0].Impair.Egress.Delay = -1
		}, []string{
			"port[0].impair.ingress: invalid impairment spec: loss: 2 is outside 0..1",
			"port[0].impair.egress: invalid impairment spec: delay: -1ns is negative",
		}},
		{"duplicate ports", func(c *Config) { c.Ports = append(c.Ports, port("/var/run/netns/lab-a", "10.0.0.9/8")) }, []string{
			`port[2]: same namespace "/var/run/netns/lab-a" and name "roce0" as port[0]`,
		}},
		{"no duplicate check on invalid ports", func(c *Config) {
			c.Ports = append(c.Ports, port("lab-a/x", "10.0.0.9/8"), port("lab-a/x", "10.0.0.9/8"))
		}, []string{
			`port[2].namespace: "lab-a/x" is neither`,
			`port[3].namespace: "lab-a/x" is neither`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.change(c)
			err := c.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate = %v, want ErrInvalid errors %q", err, tt.want)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Fatalf("got %d problems, want %d:\n%v", len(lines), len(tt.want), err)
			}
			for i, w := range tt.want {
				if !strings.HasPrefix(lines[i], w) {
					t.Errorf("problem %d is %q, want it to start with %q", i+1, lines[i], w)
				}
			}
		})
	}
}

func TestApplyDefaults(t *testing.T) {
	c := &Config{Ports: []Port{{Namespace: "a"}, {Namespace: "b", Name: "x", Mode: "redirect", MTU: 9000}}}
	c.ApplyDefaults()
	want := &Config{Socket: DefaultSocket, SocketMode: DefaultSocketMode, AdminSocket: DefaultAdminSocket, LogLevel: DefaultLogLevel, Poll: DefaultPoll,
		Limits: DefaultLimits(), ApplianceLimits: DefaultApplianceLimits(), Linger: DefaultLinger, DefaultMTU: DefaultMTU, Ports: []Port{
			{Namespace: "a", Name: DefaultPortName, Mode: ModeBridge, MTU: DefaultMTU},
			{Namespace: "b", Name: "x", Mode: "redirect", MTU: 9000},
		}}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("ApplyDefaults gave %+v, want %+v", c, want)
	}

	// Ports take the configuration's default MTU; set values stay.
	c = &Config{DefaultMTU: 9000, Limits: Limits{QPs: 7}, Linger: time.Second, Ports: []Port{{Namespace: "a"}}}
	c.ApplyDefaults()
	if c.Ports[0].MTU != 9000 || c.Limits.QPs != 7 || c.Limits.CQs != DefaultCQs || c.Linger != time.Second {
		t.Errorf("ApplyDefaults gave %+v", c)
	}

	// What an empty file gives, ApplyDefaults gives too, but for the
	// settings whose zero value means something.
	c = &Config{}
	c.ApplyDefaults()
	c.MetricsAddress, c.StateFile, c.LocalSwitch, c.ECN = DefaultMetricsAddress, DefaultStateFile, true, true
	if !reflect.DeepEqual(c, Default()) {
		t.Errorf("ApplyDefaults of a zero Config gave %+v, want %+v", c, Default())
	}
}

func TestParseBytes(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"4096", 4096, true}, {"16GiB", 16 << 30, true}, {" 2 MiB ", 2 << 20, true},
		{"1KiB", 1024, true}, {"5B", 5, true}, {"8388607TiB", 8388607 << 40, true},
		{"", 0, false}, {"MiB", 0, false}, {"+1", 0, false}, {"-1", 0, false}, {"1 KB", 0, false},
		{"1e3", 0, false}, {"0x10", 0, false}, {"8388608TiB", 0, false}, {"1gib", 0, false},
	} {
		got, err := ParseBytes(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestNamespacePath(t *testing.T) {
	for _, tt := range []struct{ ns, want string }{
		{"lab-a", "/var/run/netns/lab-a"},
		{"/proc/1/ns/net", "/proc/1/ns/net"},
		{"/run/netns/x", "/run/netns/x"},
	} {
		p := Port{Namespace: tt.ns}
		if got := p.NamespacePath(); got != tt.want {
			t.Errorf("NamespacePath(%q) = %q, want %q", tt.ns, got, tt.want)
		}
	}
}

func TestLineIndex(t *testing.T) {
	src := doc(`
# comment [[not]] = 1
socket = "/a" # trailing
"quoted.key" = 'x'
multi = """
line "" two
"""
lit = '''
a
'''
arr = [
  1,
  [2, 3],
  { a = 1 },
]
date = 1979-05-27 07:32:00Z

[[port]]
namespace = "a\"b\u0041"
addresses = ["1", "2",
  "3"]
[port.impair]
egress = ""

[[port]]
impair.ingress = "x"

[[port]]
[port.impair]
ingress = "y"
[table . "sub"]
key = { x = 1, y = [
  true,
] }
`)
	ix := indexLines(src)
	for key, want := range map[string]int{
		"socket":                 2,
		`"quoted.key"`:           3,
		"multi":                  4,
		"lit":                    7,
		"arr":                    10,
		"arr[0]":                 11,
		"arr[1]":                 12,
		"arr[1][1]":              12,
		"arr[2]":                 13,
		"arr[2].a":               13,
		"date":                   15,
		"port":                   17,
		"port[0]":                17,
		"port[0].namespace":      18,
		"port[0].addresses":      19,
		"port[0].addresses[1]":   19,
		"port[0].addresses[2]":   20,
		"port[0].impair":         21,
		"port[0].impair.egress":  22,
		"port[1]":                24,
		"port[1].impair":         25,
		"port[1].impair.ingress": 25,
		"port[2]":                27,
		"port[2].impair":         28,
		"port[2].impair.ingress": 29,
		"table":                  30,
		`table.sub`:              30,
		"table.sub.key":          31,
		"table.sub.key.y[0]":     32,
		// Fallback to the closest enclosing key.
		"port[2].mtu":          27,
		"port[0].addresses[9]": 19,
		"nothing":              0,
	} {
		if got := ix.line(key); got != want {
			t.Errorf("line(%q) = %d, want %d", key, got, want)
		}
	}
	if _, ok := ix[`port[0].namespace`]; !ok {
		t.Error("quoted value with escapes broke the scan")
	}
}

func FuzzParse(f *testing.F) {
	data, err := os.ReadFile("taproce.toml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte(good))
	f.Add([]byte("port = [{namespace = \"a\", addresses = [\"10.0.0.1/8\"], impair = {egress = \"loss=1%\"}}]\n"))
	f.Add([]byte("[[port]]\nnamespace = 1\nmtu = \"x\"\n[port.impair]\nx = 1\n"))
	f.Add([]byte("a = \"\"\"\nx\\\n\"\"\"\nb = '''\n'''\nc = [\n[1,\n2]]\n"))
	f.Add([]byte("[a.\"b.c\"]\n'd' . e = {f = [1, {g = 2}]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		indexLines(string(data)) // must not panic on anything
		cfg, err := Parse(data, "f.toml")
		if err != nil {
			if cfg != nil {
				t.Fatal("Parse returned a config with its error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			if !strings.HasPrefix(err.Error(), "f.toml:") {
				t.Fatalf("error does not start with the file name: %v", err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that Validate rejects: %v", err)
		}
	})
}
