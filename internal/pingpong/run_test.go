package pingpong

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/verbs"
)

// startAppliance runs an appliance with two ports (taproce0 10.77.0.1,
// taproce1 10.77.0.2) on a fake wire of the given MTU, serving verbs on a
// socket in a temporary directory that TAPROCE_SOCKET names.
func startAppliance(t testing.TB, localSwitch bool, mtu int) *appliance.Appliance {
	t.Helper()
	return startImpaired(t, localSwitch, mtu, impair.Spec{})
}

// startImpaired is startAppliance with every frame the two ports send
// impaired as spec says.
func startImpaired(t testing.TB, localSwitch bool, mtu int, spec impair.Spec) *appliance.Appliance {
	t.Helper()
	return appliancetest.New(t, appliancetest.Options{LocalSwitch: localSwitch, MTU: mtu, Namespace: "pingpong", Egress: spec}).App
}

// outcome is one side's run.
type outcome struct {
	res *Result
	out string
	err error
}

// pair runs a server on taproce0 and a client on taproce1 with the same
// options (the client's Server set), and returns both outcomes.
func pair(t *testing.T, o Options, server, client Env) (s, c outcome) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	so, co := o, o
	so.Device, co.Device = "taproce0", "taproce1"
	co.Server, co.Port = "127.0.0.1", ln.Addr().(*net.TCPAddr).Port
	server.Listener = ln
	done := make(chan outcome, 1)
	go func() {
		var out bytes.Buffer
		res, err := Run(ctx, so, server, &out)
		if err != nil {
			cancel() // the client would wait for ever
		}
		done <- outcome{res, out.String(), err}
	}()
	var out bytes.Buffer
	res, err := Run(ctx, co, client, &out)
	if err != nil {
		cancel()
	}
	c = outcome{res, out.String(), err}
	s = <-done
	return s, c
}

var (
	localRE  = regexp.MustCompile(`^  local address:  LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}[,:] GID ::ffff:10\.77\.0\.[12]$`)
	remoteRE = regexp.MustCompile(`^  remote address: LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID ::ffff:10\.77\.0\.[12]$`)
	bytesRE  = regexp.MustCompile(`^(\d+) bytes in \d+\.\d\d seconds = \d+\.\d\d Mbit/sec$`)
	itersRE  = regexp.MustCompile(`^(\d+) iters in \d+\.\d\d seconds = \d+\.\d\d usec/iter$`)
)

// checkOutput checks the four lines the tools print.
func checkOutput(t *testing.T, who string, o Options, out string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 4 || !localRE.MatchString(lines[0]) || !remoteRE.MatchString(lines[1]) ||
		!bytesRE.MatchString(lines[2]) || !itersRE.MatchString(lines[3]) {
		t.Fatalf("%s output:\n%s", who, out)
	}
	if o.Type == verbs.UD != strings.Contains(lines[0], ": GID ") {
		t.Errorf("%s: local address line %q: ibv_ud_pingpong has a colon before the GID, the others a comma", who, lines[0])
	}
	if want := fmt.Sprint(int64(o.Size) * int64(o.Iters) * 2); bytesRE.FindStringSubmatch(lines[2])[1] != want {
		t.Errorf("%s: %q, want %s bytes", who, lines[2], want)
	}
	if want := fmt.Sprint(o.Iters); itersRE.FindStringSubmatch(lines[3])[1] != want {
		t.Errorf("%s: %q, want %s iters", who, lines[3], want)
	}
}

// pattern is the message a client with -c sends: 0x7b with a zero at the
// start of every page.
func pattern(size int) []byte {
	b := bytes.Repeat([]byte{0x7b}, size)
	mark(b)
	return b
}

// udCheck checks every UD receive: the byte count with the GRH area, the
// GRH flag, one sender QPN (recorded in srcQPN) and the IPv4 header in the
// GRH area.
func udCheck(size int, from netip.Addr, srcQPN *uint32) func(n int, wc *verbs.WC, buf []byte) error {
	return func(n int, wc *verbs.WC, buf []byte) error {
		ip := buf[GRHLen-20 : GRHLen]
		src, _ := netip.AddrFromSlice(ip[12:16])
		pad := (4 - size%4) % 4
		if *srcQPN == 0 {
			*srcQPN = wc.SrcQP
		}
		switch {
		case wc.ByteLen != uint32(size+GRHLen):
			return fmt.Errorf("receive %d: %d bytes, want %d", n, wc.ByteLen, size+GRHLen)
		case wc.Flags&verbs.WCGRH == 0:
			return fmt.Errorf("receive %d without the GRH flag", n)
		case wc.SrcQP != *srcQPN:
			return fmt.Errorf("receive %d from QP %#x, before from %#x", n, wc.SrcQP, *srcQPN)
		case ip[0]>>4 != 4 || src != from || int(binary.BigEndian.Uint16(ip[2:])) != 20+8+12+8+size+pad+4:
			return fmt.Errorf("receive %d: GRH area % x", n, buf[:GRHLen])
		}
		return nil
	}
}

// TestPingpong runs both sides of ibv_rc_pingpong, ibv_uc_pingpong and
// ibv_ud_pingpong through the verbs library against an appliance on a
// fake wire (and, for RC, over the local switch), with -c: every byte of
// the message comes back as the client marked it, on both sides; the
// addresses each side printed are the other's; the output has the tools'
// lines.
func TestPingpong(t *testing.T) {
	cases := []struct {
		name   string
		typ    verbs.QPType
		size   int
		iters  int
		rx     int
		mtu    int
		events bool
		local  bool
	}{
		{"rc", verbs.RC, 4096, 200, 0, 1024, false, false},
		{"rc-multi-packet-m256", verbs.RC, 10000, 50, 0, 256, false, false},
		{"rc-rx4", verbs.RC, 64, 300, 4, 1024, false, false},
		{"rc-events", verbs.RC, 4096, 100, 0, 1024, true, false},
		{"rc-inline", verbs.RC, 16, 100, 0, 1024, false, false},
		{"rc-local-switch", verbs.RC, 65536, 50, 0, 1024, false, true},
		{"uc", verbs.UC, 4096, 200, 0, 1024, false, false},
		{"uc-64k-events-m512", verbs.UC, 65536, 20, 0, 512, true, false},
		{"ud", verbs.UD, 1024, 200, 0, 0, false, false},
		{"ud-small-events", verbs.UD, 1, 100, 0, 0, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			app := startAppliance(t, c.local, 1500)
			o := DefaultOptions(c.typ)
			o.Size, o.Iters, o.Events, o.Validate = c.size, c.iters, c.events, true
			if c.rx != 0 {
				o.RxDepth = c.rx
			}
			if c.mtu != 0 {
				o.MTU = c.mtu
			}
			var senv, cenv Env
			var toServer, toClient uint32
			if c.typ == verbs.UD {
				senv.OnReceive = udCheck(c.size, netip.MustParseAddr("10.77.0.2"), &toServer)
				cenv.OnReceive = udCheck(c.size, netip.MustParseAddr("10.77.0.1"), &toClient)
			}
			s, cl := pair(t, o, senv, cenv)
			if s.err != nil || cl.err != nil {
				for _, n := range app.NICs() {
					t.Logf("%s: %+v", n.Name(), n.Engine().Stats())
				}
				t.Fatalf("server: %v\n%s\nclient: %v\n%s", s.err, s.out, cl.err, cl.out)
			}
			checkOutput(t, "server", o, s.out)
			checkOutput(t, "client", o, cl.out)
			if s.res.Remote != cl.res.Local || cl.res.Remote != s.res.Local {
				t.Errorf("addresses: server %v ⇄ %v, client %v ⇄ %v", s.res.Local, s.res.Remote, cl.res.Local, cl.res.Remote)
			}
			if c.typ == verbs.UD && (toServer != cl.res.Local.QPN || toClient != s.res.Local.QPN) {
				t.Errorf("UD source QPs: server received from %#x, client from %#x; QPs are %#x and %#x",
					toServer, toClient, cl.res.Local.QPN, s.res.Local.QPN)
			}
			want := pattern(c.size)
			for _, x := range []struct {
				who string
				o   outcome
			}{{"server", s}, {"client", cl}} {
				if len(x.o.res.InvalidPages) != 0 || !bytes.Equal(x.o.res.Message, want) {
					t.Errorf("%s: invalid pages %v; message differs from the client's at byte %d", x.who, x.o.res.InvalidPages,
						firstDiff(x.o.res.Message, want))
				}
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) == len(b) {
		return -1
	}
	return min(len(a), len(b))
}

var datagramsRE = regexp.MustCompile(`(?m)^datagrams: (\d+) sent, (\d+) received, (\d+) lost \(each waited for 100ms at most\)$`)

// TestPingpongTimeout runs the bounded UD pingpong (--timeout), polling
// and sleeping on completion events (-e), over a fake wire that drops a
// tenth of the frames each port sends: both sides end, and every round
// trip is counted once, answered or lost — a lost round trip is one
// datagram the ports dropped.
func TestPingpongTimeout(t *testing.T) {
	for _, c := range []struct {
		name   string
		events bool
	}{{"polling", false}, {"events", true}} {
		t.Run(c.name, func(t *testing.T) {
			app := startImpaired(t, false, 1500, impair.Spec{Loss: 0.1, Seed: 7})
			o := DefaultOptions(verbs.UD)
			o.Iters, o.Timeout, o.Events = 100, 100*time.Millisecond, c.events
			s, cl := pair(t, o, Env{}, Env{})
			if s.err != nil || cl.err != nil {
				t.Fatalf("server: %v\n%s\nclient: %v\n%s", s.err, s.out, cl.err, cl.out)
			}
			var dropped uint64
			for _, n := range app.NICs() {
				dropped += n.Port().Stats().Egress.Dropped
			}
			cr, sr := cl.res, s.res
			t.Logf("client %d sent, %d received, %d lost; server %d sent, %d received; %d frames dropped", cr.Sent, cr.Received, cr.Lost, sr.Sent, sr.Received, dropped)
			switch {
			case cr.Sent != o.Iters || cr.Received+cr.Lost != o.Iters:
				t.Errorf("client: %d sent, %d received, %d lost; want %d sent, each answered or lost", cr.Sent, cr.Received, cr.Lost, o.Iters)
			case sr.Received > cr.Sent || sr.Sent != sr.Received || cr.Received > sr.Sent:
				t.Errorf("server: %d received, %d sent; client %d sent, %d received", sr.Received, sr.Sent, cr.Sent, cr.Received)
			case cr.Lost == 0 || uint64(cr.Lost) > dropped:
				t.Errorf("client: %d lost; the ports dropped %d frames", cr.Lost, dropped)
			}
			for _, x := range []outcome{s, cl} {
				m := datagramsRE.FindStringSubmatch(x.out)
				if m == nil || m[1] != fmt.Sprint(x.res.Sent) || m[2] != fmt.Sprint(x.res.Received) || m[3] != fmt.Sprint(x.res.Lost) {
					t.Errorf("output without the datagrams line of %+v:\n%s", x.res, x.out)
				}
			}
		})
	}
}

// TestPingpongValidateFinds: a server with -c facing a client without it
// reports every page, as ibv_rc_pingpong's server does ("invalid data in
// page N"), since the client's buffer lacks the marks.
func TestPingpongValidateFinds(t *testing.T) {
	startAppliance(t, false, 1500)
	o := DefaultOptions(verbs.RC)
	o.Size, o.Iters = 3*4096+100, 5
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	so, co := o, o
	so.Device, so.Validate = "taproce0", true
	co.Device, co.Server, co.Port = "taproce1", "127.0.0.1", ln.Addr().(*net.TCPAddr).Port
	type result struct {
		res *Result
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		var out bytes.Buffer
		res, err := Run(ctx, so, Env{Listener: ln}, &out)
		done <- result{res, out.String(), err}
	}()
	if _, err := Run(ctx, co, Env{}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	wantPages := []int{0, 1, 2, 3}
	if fmt.Sprint(r.res.InvalidPages) != fmt.Sprint(wantPages) {
		t.Errorf("invalid pages %v, want %v", r.res.InvalidPages, wantPages)
	}
	for _, p := range wantPages {
		if !strings.Contains(r.out, fmt.Sprintf("\ninvalid data in page %d\n", p)) {
			t.Errorf("output lacks page %d:\n%s", p, r.out)
		}
	}
}

// TestPingpongRefusals: what the tools refuse on a device like this one,
// refused with their words, before anything reaches the wire.
func TestPingpongRefusals(t *testing.T) {
	startAppliance(t, false, 1500)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct {
		mod  func(o *Options)
		want string
	}{
		{func(o *Options) { o.ODP = true }, "ODP"},
		{func(o *Options) { o.Device = "mlx5_0" }, "IB device mlx5_0 not found"},
		{func(o *Options) { o.IBPort = 2 }, "port info for port 2"},
		{func(o *Options) { o.Type, o.Size = verbs.UD, 2048 }, "requested size larger than port MTU (1024)"},
		{func(o *Options) { o.GIDIndex = 9 }, "can't read sgid of index 9"},
		{func(o *Options) { o.Timeout = time.Second }, "--timeout applies to UD pingpong only"},
		{func(o *Options) { o.Server, o.Port = "127.0.0.1", 1 }, "couldn't connect to 127.0.0.1:1"},
	} {
		o := DefaultOptions(verbs.RC)
		c.mod(&o)
		var out bytes.Buffer
		_, err := Run(ctx, o, Env{}, &out)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error with %q", o, err, c.want)
		}
	}
}

// TestParseArgs: the tools' command lines, with getopt's permutations.
func TestParseArgs(t *testing.T) {
	rc := DefaultOptions(verbs.RC)
	for _, c := range []struct {
		args []string
		want func(o *Options)
		err  string
	}{
		{nil, func(o *Options) {}, ""},
		{[]string{"-g", "1", "-n", "5", "-s", "64", "10.0.0.1"}, func(o *Options) {
			o.GIDIndex, o.Iters, o.Size, o.Server = 1, 5, 64, "10.0.0.1"
		}, ""},
		{[]string{"host", "-ec", "-s64", "--iters=7", "--rx-depth", "4", "-m", "4096", "-p0x4000", "-d", "taproce1", "-i", "1", "-l", "3"}, func(o *Options) {
			o.Server, o.Events, o.Validate, o.Size, o.Iters, o.RxDepth, o.MTU, o.Port, o.Device, o.SL = "host", true, true, 64, 7, 4, 4096, 0x4000, "taproce1", 3
		}, ""},
		{[]string{"--ud"}, func(o *Options) { *o = DefaultOptions(verbs.UD) }, ""},
		{[]string{"-t", "ud", "-s", "100"}, func(o *Options) { *o = DefaultOptions(verbs.UD); o.Size = 100 }, ""},
		{[]string{"-tuc"}, func(o *Options) { *o = DefaultOptions(verbs.UC) }, ""},
		{[]string{"--iter", "3"}, func(o *Options) { o.Iters = 3 }, ""},
		{[]string{"-o"}, func(o *Options) { o.ODP = true }, ""},
		{[]string{"--ud", "--timeout", "50"}, func(o *Options) { *o = DefaultOptions(verbs.UD); o.Timeout = 50 * time.Millisecond }, ""},
		{[]string{"--timeout=0"}, nil, `timeout "0": too small (min 1)`},
		{[]string{"--", "-host"}, func(o *Options) { o.Server = "-host" }, ""},
		{[]string{"-x"}, nil, "invalid option -- 'x'"},
		{[]string{"-s"}, nil, "option requires an argument -- 's'"},
		{[]string{"--size"}, nil, "option '--size' requires an argument"},
		{[]string{"--events=1"}, nil, "doesn't allow an argument"},
		{[]string{"--bogus"}, nil, "unrecognized option '--bogus'"},
		{[]string{"--u"}, nil, "ambiguous"},
		{[]string{"-m", "1000"}, nil, `path MTU "1000"`},
		{[]string{"-s", "big"}, nil, "not a number"},
		{[]string{"-t", "rd"}, nil, "transport \"rd\""},
		{[]string{"a", "b"}, nil, "more than one server"},
		{[]string{"-h"}, nil, "help"},
	} {
		got, err := ParseArgs(c.args)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || !errors.Is(err, ErrUsage) {
				t.Errorf("%q: %v, want a usage error with %q", c.args, err, c.err)
			}
			continue
		}
		want := rc
		c.want(&want)
		if err != nil || got != want {
			t.Errorf("%q:\n got %+v, %v\nwant %+v", c.args, got, err, want)
		}
	}
}
