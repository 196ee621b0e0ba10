package perf

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseTest(t *testing.T) {
	for in, want := range map[string]Test{
		"write_bw": {Write, BW}, "ib_read_bw": {Read, BW}, "send-bw": {Send, BW}, "IB_ATOMIC_BW": {Atomic, BW},
		"write_lat": {Write, Lat}, "ib_read_lat": {Read, Lat}, "send_lat": {Send, Lat}, "atomic_lat": {Atomic, Lat},
	} {
		got, err := ParseTest(in)
		if err != nil || got != want {
			t.Errorf("%s: %v %v", in, got, err)
		}
	}
	if _, err := ParseTest("write"); err == nil {
		t.Error("write: no error")
	}
	if s := (Test{Atomic, Lat}).Tool(); s != "ib_atomic_lat" {
		t.Error(s)
	}
}

func TestParseArgs(t *testing.T) {
	c, err := ParseArgs(strings.Fields("ib_write_bw -s 64K -n5 --iters=7 -a -F -x 1 -m 1024 -q 2 -t 16 -p 9999 -d taproce1 --json --report_gbits 10.99.0.20"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Test != (Test{Write, BW}) || c.Size != 64<<10 || c.Iters != 7 || !c.All || !c.CPUFreq || c.GIDIndex != 1 || c.MTU != 1024 ||
		c.QPs != 2 || c.TxDepth != 16 || c.Port != 9999 || c.Device != "taproce1" || !c.JSON || !c.ReportGbits || c.Server != "10.99.0.20" || c.IsServer() {
		t.Errorf("%+v", c)
	}
	// Options after the address, long options with a separate value.
	c, err = ParseArgs([]string{"atomic_lat", "server.example", "--atomic_type", "CMP_AND_SWAP", "-D", "3"})
	if err != nil || c.Atomic != CmpAndSwap || c.Duration != 3 || c.Server != "server.example" {
		t.Errorf("%+v %v", c, err)
	}
	c, err = ParseArgs([]string{"send_lat"})
	if err != nil || !c.IsServer() || c.GIDIndex != -1 || c.Atomic != FetchAndAdd {
		t.Errorf("%+v %v", c, err)
	}
	for _, bad := range [][]string{
		nil, {"nope"}, {"write_bw", "-n", "4"}, {"write_bw", "-m", "1000"}, {"write_bw", "-s"}, {"write_bw", "a", "b"},
		{"write_bw", "--bogus"}, {"write_bw", "-A", "FETCH_AND_ADD"}, {"atomic_bw", "-A", "ADD"}, {"write_bw", "-a7"},
		{"write_bw", "-c", "UD"}, {"write_bw", "-i", "2"}, {"write_bw", "-s", "0"}, {"write_bw", "--all=1"},
	} {
		if _, err := ParseArgs(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if _, err := ParseArgs([]string{"-h"}); !errors.Is(err, ErrHelp) {
		t.Error(err)
	}
	if _, err := ParseArgs([]string{"send_bw", "-V"}); !errors.Is(err, ErrVersion) {
		t.Error(err)
	}
	if u := Usage(); !strings.Contains(u, "--atomic_type") || !strings.Contains(u, "-D, --duration") {
		t.Error(u)
	}
}

// TestResolve: perftest's defaults and force_dependecies.
func TestResolve(t *testing.T) {
	parse := func(args string) *params {
		t.Helper()
		c, err := ParseArgs(strings.Fields(args))
		if err != nil {
			t.Fatal(err)
		}
		p, err := resolve(c)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := parse("write_bw x")
	if p.size != 65536 || p.iters != 5000 || p.tx != 128 || p.cqMod != 1 || p.Port != 18515 || p.rx != 1 || p.noPeak {
		t.Errorf("write_bw: %+v", p)
	}
	p = parse("read_bw x -s 64")
	if p.size != 64 || p.iters != 1000 || p.cqMod != 100 {
		t.Errorf("read_bw: %+v", p)
	}
	p = parse("send_bw -n 5 -s 64")
	if p.tx != 5 || p.rx != 6 || p.cqMod != 5 || !p.noPeak {
		t.Errorf("send_bw server -n 5: %+v", p)
	}
	p = parse("send_lat -a -n 5")
	if p.rx != 5 || p.size != MaxSize || len(p.sizes) != 23 || p.sizes[0] != 2 || p.sizes[22] != 8<<20 || p.tx != 1 {
		t.Errorf("send_lat -a: %+v", p)
	}
	p = parse("atomic_bw x")
	if p.size != 8 || p.iters != 1000 {
		t.Errorf("atomic_bw: %+v", p)
	}
	p = parse("write_bw x -D 8")
	if !p.duration || p.iters != 0 || !p.noPeak || p.margin != 2 {
		t.Errorf("-D: %+v", p)
	}
	p = parse("write_bw x -n 30000 -s 64")
	if !p.noPeak {
		t.Errorf("many iterations: %+v", p)
	}
	p = parse("write_lat x")
	if p.size != 2 || p.iters != 1000 || !slices.Equal(p.sizes, []int{2}) {
		t.Errorf("write_lat: %+v", p)
	}
	// Combinations resolve refuses, which ParseArgs refuses with it.
	for _, bad := range []string{"atomic_bw -s 16", "atomic_bw -a", "write_lat -q 2", "write_bw -a -D 5", "write_bw -D 2 -f 1", "read_bw -r 4"} {
		c, err := ParseArgs(strings.Fields(bad))
		if err == nil {
			t.Errorf("%s: ParseArgs: no error", bad)
		}
		if _, err := resolve(c); err == nil {
			t.Errorf("%s: resolve: no error", bad)
		}
	}
}
