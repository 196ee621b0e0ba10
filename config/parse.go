package config

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/taproce/taproce/internal/impair"
)

// The keys each table knows, for unknown-key messages.
var (
	topKeys = []string{"socket", "socket_mode", "socket_group", "list_all_devices", "admin_socket", "metrics_address",
		"state_file", "log_level", "local_switch", "ecn", "poll", "procs", "cpus", "linger", "default_mtu", "limits",
		"appliance_limits", "port"}
	limitsKeys          = []string{"qps", "cqs", "srqs", "mrs", "pds", "ahs", "channels", "mr_bytes"}
	applianceLimitsKeys = append(slices.Clone(limitsKeys), "connections", "connections_per_uid", "descriptors")
	portKeys            = []string{"namespace", "name", "mode", "mac", "addresses", "mtu", "impair"}
	impairKeys          = []string{"ingress", "egress"}
)

// Load reads and parses the configuration file at path. Errors reading the
// file are wrapped as they are; problems with its contents are reported as
// Parse reports them.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(data, path)
}

// Parse parses data, the contents of the configuration file filename (used
// only in messages), fills in defaults and validates the result.
//
// On any problem it returns a nil Config and every problem found, joined
// with errors.Join and sorted by line: each an *Error wrapping ErrInvalid
// whose text is "filename:line: key: message". A TOML syntax error is the
// only problem reported when there is one; it keeps the toml package's line
// and column and wraps its toml.ParseError. Keys are case-sensitive, and
// unknown keys are errors.
func Parse(data []byte, filename string) (*Config, error) {
	src := string(data)
	var raw map[string]any
	if _, err := toml.Decode(src, &raw); err != nil {
		return nil, syntaxError(filename, err)
	}
	// The data is decoded into maps rather than into structs: the toml
	// package matches struct fields case-insensitively (it would take
	// "MTU = 9000" for mtu, and silently pick one of mtu and MTU when both
	// are given), stops at the first value of the wrong type, and its
	// Undecoded keys do not say which [[port]] table they are in.
	ix := indexLines(src)
	d := &decoder{line: ix.line, bad: map[string]bool{}, inherited: map[string]bool{}}
	cfg := d.config(raw)
	errs := d.errs
	for _, e := range cfg.validate(ix.line) {
		if d.isBad(e.Key) {
			continue
		}
		if d.inherited[e.Key] {
			e.Msg += " (the port has no mtu of its own: this is default_mtu"
			if l := ix.line("default_mtu"); l > 0 && e.Line != l {
				e.Msg += fmt.Sprintf(", line %d", l)
			}
			e.Msg += ")"
		}
		errs = append(errs, e)
	}
	if len(errs) == 0 {
		return cfg, nil
	}
	slices.SortStableFunc(errs, func(a, b *Error) int { return cmp.Compare(a.Line, b.Line) })
	for _, e := range errs {
		e.File = filename
	}
	return nil, joinErrors(errs)
}

// syntaxError turns an error of toml.Decode into an *Error.
func syntaxError(filename string, err error) error {
	var pe toml.ParseError
	if !errors.As(err, &pe) {
		return &Error{File: filename, Msg: err.Error(), Err: err}
	}
	msg := "TOML syntax error: " + pe.Message
	if pe.Position.Col > 0 {
		msg = fmt.Sprintf("TOML syntax error at column %d: %s", pe.Position.Col, pe.Message)
	}
	return &Error{File: filename, Line: pe.Position.Line, Msg: msg, Err: pe}
}

// decoder turns the decoded TOML into a Config, collecting problems of keys
// and types.
type decoder struct {
	line lineFunc
	errs []*Error
	// bad holds the keys that had a problem here, so that validation does
	// not report the same key again (a namespace of the wrong type is not
	// also "missing").
	bad map[string]bool
	// inherited holds the keys of port MTUs taken from default_mtu.
	inherited map[string]bool
}

func (d *decoder) fail(key, msg string, err error) {
	d.errs = append(d.errs, &Error{Line: d.line(key), Key: key, Msg: msg, Err: err})
	d.bad[key] = true
}

// isBad reports whether key or a key enclosing it had a problem.
func (d *decoder) isBad(key string) bool {
	for ; key != ""; key = parentKey(key) {
		if d.bad[key] {
			return true
		}
	}
	return false
}

func (d *decoder) unknown(parent, k string, known []string) {
	msg := "unknown key"
	if s := suggest(k, known); s != "" {
		msg = fmt.Sprintf("unknown key (did you mean %q?)", s)
	}
	d.fail(childKey(parent, k), msg, nil)
}

// str stores v into *dst if it is a string.
func (d *decoder) str(key string, v any, dst *string) bool {
	s, ok := v.(string)
	if !ok {
		d.fail(key, "want a string, not "+typeName(v), nil)
		return false
	}
	*dst = s
	return true
}

// boolean stores v into *dst if it is a boolean.
func (d *decoder) boolean(key string, v any, dst *bool) {
	b, ok := v.(bool)
	if !ok {
		d.fail(key, "want true or false, not "+typeName(v), nil)
		return
	}
	*dst = b
}

// integer stores v into *dst if it is an integer that fits, naming the
// range lo..hi when it does not.
func (d *decoder) integer(key string, v any, dst *int, lo, hi int) {
	n, ok := v.(int64)
	switch {
	case !ok:
		d.fail(key, "want an integer, not "+typeName(v), nil)
	case int64(int(n)) != n:
		d.fail(key, fmt.Sprintf("%d is outside %d..%d", n, lo, hi), nil)
	default:
		*dst = int(n)
	}
}

// mode stores v into *dst if it is a file mode written as a string of
// three or four octal digits, "0660" or "660" as chmod and systemd's
// SocketMode take it. A TOML integer is refused: 0660 is not one, and
// 0o660 reads back as 432 in every message.
func (d *decoder) mode(key string, v any, dst *fs.FileMode) {
	s, ok := v.(string)
	if !ok {
		d.fail(key, "want a string of octal digits such as \"0660\", not "+typeName(v), nil)
		return
	}
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil || len(s) < 3 || len(s) > 4 || len(s) == 4 && s[0] != '0' {
		d.fail(key, fmt.Sprintf("%q is not a permission mode of octal digits such as \"0660\" (at most 0777)", s), nil)
		return
	}
	*dst = fs.FileMode(n)
}

// duration stores v into *dst if it is a Go duration string.
func (d *decoder) duration(key string, v any, dst *time.Duration) {
	var s string
	if !d.str(key, v, &s) {
		return
	}
	dur, err := time.ParseDuration(s)
	if err != nil {
		d.fail(key, fmt.Sprintf("%q is not a duration such as \"30s\" or \"500ms\"", s), err)
		return
	}
	*dst = dur
}

func (d *decoder) config(raw map[string]any) *Config {
	c := Default()
	var ports []Port
	var explicitMTU []bool
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		v := raw[k]
		switch k {
		case "socket":
			d.str(k, v, &c.Socket)
		case "socket_mode":
			d.mode(k, v, &c.SocketMode)
		case "socket_group":
			d.str(k, v, &c.SocketGroup)
		case "list_all_devices":
			d.boolean(k, v, &c.ListAllDevices)
		case "admin_socket":
			d.str(k, v, &c.AdminSocket)
		case "metrics_address":
			d.str(k, v, &c.MetricsAddress)
		case "state_file":
			d.str(k, v, &c.StateFile)
		case "log_level":
			d.str(k, v, &c.LogLevel)
		case "local_switch":
			d.boolean(k, v, &c.LocalSwitch)
		case "ecn":
			d.boolean(k, v, &c.ECN)
		case "poll":
			d.str(k, v, &c.Poll)
		case "procs":
			d.integer(k, v, &c.Procs, 0, MaxProcs)
		case "cpus":
			d.str(k, v, &c.CPUs)
		case "linger":
			d.duration(k, v, &c.Linger)
		case "default_mtu":
			d.integer(k, v, &c.DefaultMTU, MinMTU, MaxMTU)
		case "limits":
			c.Limits = d.limits(k, v)
		case "appliance_limits":
			c.ApplianceLimits = d.applianceLimits(k, v)
		case "port":
			ports, explicitMTU = d.ports(k, v)
		default:
			d.unknown("", k, topKeys)
		}
	}
	// Ports without an mtu take default_mtu; an invalid default_mtu is
	// reported once, on its own line, and they keep DefaultMTU.
	inherit := c.DefaultMTU >= MinMTU && c.DefaultMTU <= MaxMTU
	for i := range ports {
		if !explicitMTU[i] && inherit {
			ports[i].MTU = c.DefaultMTU
			d.inherited[childKey(indexKey("port", i), "mtu")] = true
		}
	}
	c.Ports = ports
	return c
}

func (d *decoder) limits(key string, v any) Limits {
	l := DefaultLimits()
	if m := d.table(key, v); m != nil {
		d.limitKeys(key, m, &l, limitsKeys, nil)
	}
	return l
}

func (d *decoder) applianceLimits(key string, v any) ApplianceLimits {
	l := DefaultApplianceLimits()
	if m := d.table(key, v); m != nil {
		d.limitKeys(key, m, &l.Limits, applianceLimitsKeys, func(k, kk string, v any) bool {
			switch k {
			case "connections":
				d.integer(kk, v, &l.Connections, 1, MaxLimit)
			case "connections_per_uid":
				d.integer(kk, v, &l.ConnectionsPerUID, 1, MaxLimit)
			case "descriptors":
				d.integer(kk, v, &l.Descriptors, MinDescriptors, MaxLimit)
			default:
				return false
			}
			return true
		})
	}
	return l
}

// table returns v if it is a table, the one at key.
func (d *decoder) table(key string, v any) map[string]any {
	m, ok := v.(map[string]any)
	if !ok {
		d.fail(key, fmt.Sprintf("want a table ([%s]), not %s", key, typeName(v)), nil)
		return nil
	}
	return m
}

// limitKeys decodes the object limits of the table m at key into l, and
// its other keys with more, which reports whether it knew the key.
func (d *decoder) limitKeys(key string, m map[string]any, l *Limits, known []string, more func(k, kk string, v any) bool) {
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v, kk := m[k], childKey(key, k)
		switch k {
		case "qps":
			d.integer(kk, v, &l.QPs, 1, MaxLimit)
		case "cqs":
			d.integer(kk, v, &l.CQs, 1, MaxLimit)
		case "srqs":
			d.integer(kk, v, &l.SRQs, 1, MaxLimit)
		case "mrs":
			d.integer(kk, v, &l.MRs, 1, MaxLimit)
		case "pds":
			d.integer(kk, v, &l.PDs, 1, MaxLimit)
		case "ahs":
			d.integer(kk, v, &l.AHs, 1, MaxLimit)
		case "channels":
			d.integer(kk, v, &l.Channels, 1, MaxLimit)
		case "mr_bytes":
			d.bytes(kk, v, &l.MRBytes)
		default:
			if more == nil || !more(k, kk, v) {
				d.unknown(key, k, known)
			}
		}
	}
}

// byteUnits are the suffixes a size string may have.
var byteUnits = []struct {
	suffix string
	shift  uint
}{{"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}, {"B", 0}}

// bytes stores v into *dst if it is an integer or a string such as
// "16GiB": a whole number and one of the binary units KiB, MiB, GiB, TiB,
// or B.
func (d *decoder) bytes(key string, v any, dst *int64) {
	switch v := v.(type) {
	case int64:
		*dst = v
		return
	case string:
		n, err := ParseBytes(v)
		if err != nil {
			d.fail(key, err.Error(), err)
			return
		}
		*dst = n
		return
	}
	d.fail(key, "want an integer or a size such as \"16GiB\", not "+typeName(v), nil)
}

// ParseBytes reads a size: a whole number of bytes, optionally followed by
// one of the binary units B, KiB, MiB, GiB and TiB ("16GiB", "512 MiB").
func ParseBytes(s string) (int64, error) {
	num, shift := strings.TrimSpace(s), uint(0)
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, shift = strings.TrimSpace(rest), u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || num == "" || num[0] == '+' {
		return 0, fmt.Errorf("%q is not a size such as \"16GiB\" or \"512MiB\" (units B, KiB, MiB, GiB, TiB)", s)
	}
	if n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("%q is more than %d bytes", s, int64(math.MaxInt64))
	}
	return n << shift, nil
}

// ports decodes the [[port]] tables, and reports for each whether it has
// an mtu key.
func (d *decoder) ports(key string, v any) ([]Port, []bool) {
	var tables []map[string]any
	switch v := v.(type) {
	case []map[string]any: // [[port]] tables
		tables = v
	case []any: // port = [{...}, {...}]
		for _, e := range v {
			m, ok := e.(map[string]any)
			if !ok {
				d.fail(key, "want an array of tables ([[port]]), not an array holding "+typeName(e), nil)
				return nil, nil
			}
			tables = append(tables, m)
		}
	case map[string]any:
		d.fail(key, "want an array of tables ([[port]]), not a table ([port])", nil)
		return nil, nil
	default:
		d.fail(key, "want an array of tables ([[port]]), not "+typeName(v), nil)
		return nil, nil
	}
	ports := make([]Port, len(tables))
	mtu := make([]bool, len(tables))
	for i, m := range tables {
		ports[i] = d.port(indexKey(key, i), m)
		_, mtu[i] = m["mtu"]
	}
	return ports, mtu
}

func (d *decoder) port(key string, m map[string]any) Port {
	p := DefaultPort()
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v, kk := m[k], childKey(key, k)
		switch k {
		case "namespace":
			d.str(kk, v, &p.Namespace)
		case "name":
			d.str(kk, v, &p.Name)
		case "mode":
			d.str(kk, v, &p.Mode)
		case "mac":
			var s string
			if !d.str(kk, v, &s) || s == "" {
				continue
			}
			mac, err := net.ParseMAC(s)
			if err != nil {
				d.fail(kk, fmt.Sprintf("%q is not a MAC address such as 02:00:00:00:00:01", s), err)
				continue
			}
			p.MAC = mac
		case "addresses":
			p.Addresses = d.addresses(kk, v)
		case "mtu":
			d.integer(kk, v, &p.MTU, MinMTU, MaxMTU)
		case "impair":
			p.Impair = d.impair(kk, v)
		default:
			d.unknown(key, k, portKeys)
		}
	}
	return p
}

func (d *decoder) addresses(key string, v any) []netip.Prefix {
	arr, ok := v.([]any)
	if !ok {
		d.fail(key, "want an array of CIDR prefixes, not "+typeName(v), nil)
		return nil
	}
	out := make([]netip.Prefix, 0, len(arr))
	for i, e := range arr {
		ek := indexKey(key, i)
		s, ok := e.(string)
		if !ok {
			d.fail(ek, "want a string, not "+typeName(e), nil)
			continue
		}
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			msg := fmt.Sprintf("%q is not a CIDR prefix such as 10.55.0.1/24 or fd55::1/64", s)
			if a, aerr := netip.ParseAddr(s); aerr == nil && a.Zone() == "" {
				msg = fmt.Sprintf("%q has no prefix length (as in %s/%d)", s, a, a.BitLen())
			} else if strings.Contains(s, "%") {
				msg = fmt.Sprintf("%q has a zone; addresses here take none", s)
			}
			d.fail(ek, msg, err)
			continue
		}
		out = append(out, pfx)
	}
	if len(out) < len(arr) {
		// Element indices no longer match; check the rest once these are fixed.
		d.bad[key] = true
	}
	return out
}

func (d *decoder) impair(key string, v any) Impair {
	var im Impair
	m, ok := v.(map[string]any)
	if !ok {
		d.fail(key, "want a table with ingress and egress, not "+typeName(v), nil)
		return im
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		kk := childKey(key, k)
		var dst *impair.Spec
		switch k {
		case "ingress":
			dst = &im.Ingress
		case "egress":
			dst = &im.Egress
		default:
			d.unknown(key, k, impairKeys)
			continue
		}
		var s string
		if !d.str(kk, m[k], &s) {
			continue
		}
		spec, err := impair.ParseSpec(s)
		if err != nil {
			d.fail(kk, err.Error(), err)
			continue
		}
		*dst = spec
	}
	return im
}

// typeName names the TOML type of a decoded value.
func typeName(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case bool:
		return "a boolean"
	case time.Time:
		return "a date-time"
	case []map[string]any:
		return "an array of tables"
	case []any:
		return "an array"
	case map[string]any:
		return "a table"
	}
	return fmt.Sprintf("a %T", v)
}

// suggest returns the known key k was probably meant to be, or "".
func suggest(k string, known []string) string {
	for _, kn := range known {
		if strings.EqualFold(k, kn) {
			return kn
		}
	}
	for _, kn := range known {
		if d := editDistance(k, kn); d == 1 || d == 2 && len(kn) >= 6 {
			return kn
		}
	}
	return ""
}

// editDistance is the optimal string alignment distance between a and b,
// in bytes: insertions, deletions, substitutions and transpositions of
// neighbours each count 1. It gives up with a large value for long strings.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 1 << 30
	}
	// d[i][j] is the distance between a[:i] and b[:j].
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
