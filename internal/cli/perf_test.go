package cli

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/taproce/taproce/appliance/appliancetest"
)

func TestPerfUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"perf", "-h"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "Usage: taproce perf TEST") {
		t.Errorf("-h: %d %q %q", code, out.String(), errb.String())
	}
	out.Reset()
	if code := Main([]string{"perf", "write_bw", "-V"}, &out, &errb); code != 0 || out.String() != "Version: 6.06\n" {
		t.Errorf("-V: %d %q", code, out.String())
	}
	errb.Reset()
	if code := Main([]string{"perf", "write"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown test "write"`) {
		t.Errorf("bad test: %d %q", code, errb.String())
	}
	errb.Reset()
	if code := Main([]string{"perf", "atomic_bw", "-s", "16"}, &out, &errb); code != 2 || !strings.HasPrefix(errb.String(), "taproce perf: message size cannot be changed") {
		t.Errorf("atomic size: %d %q", code, errb.String())
	}
	out.Reset()
	Main([]string{"-h"}, &out, &errb)
	if !strings.Contains(out.String(), "  perf ") {
		t.Errorf("perf missing from the commands:\n%s", out.String())
	}
}

// TestPerfCommand runs `taproce perf send_lat` and `taproce perf
// write_bw` server and client against an in-process appliance with two
// ports on a fake wire.
func TestPerfCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an appliance")
	}
	appliancetest.New(t, appliancetest.Options{Namespace: "cmd", Net: 78})

	for _, c := range []struct {
		test, size, header string
	}{
		{"send_lat", "2", " #bytes #iterations    t_min[usec]"},
		{"ib_write_bw", "4096", " #bytes     #iterations    BW peak[MB/sec]"},
	} {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
		var wg sync.WaitGroup
		var sout, serr, cout, cerr bytes.Buffer
		var scode, ccode int
		wg.Add(2)
		go func() {
			defer wg.Done()
			scode = Main([]string{"perf", c.test, "-d", "taproce0", "-p", port, "-n", "20", "-s", c.size}, &sout, &serr)
		}()
		go func() {
			defer wg.Done()
			ccode = Main([]string{"perf", c.test, "-d", "taproce1", "-p", port, "-n", "20", "-s", c.size, "-F", "127.0.0.1"}, &cout, &cerr)
		}()
		wg.Wait()
		if scode != 0 || ccode != 0 {
			t.Fatalf("%s: server %d %s%s\nclient %d %s%s", c.test, scode, sout.String(), serr.String(), ccode, cout.String(), cerr.String())
		}
		for _, out := range []string{sout.String(), cout.String()} {
			if !strings.Contains(out, c.header) || !strings.Contains(out, "\n "+c.size+" ") {
				t.Errorf("%s output:\n%s", c.test, out)
			}
		}
	}
}

// TestSingleProc: perf and pingpong run on one P unless GOMAXPROCS says
// otherwise.
func TestSingleProc(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct {
		env  string // empty: not set
		want int
	}{
		{want: 1},
		{env: "3", want: 3},
	} {
		runtime.GOMAXPROCS(3) // as the runtime would have set it from the environment
		if tc.env != "" {
			t.Setenv("GOMAXPROCS", tc.env)
		} else {
			t.Setenv("GOMAXPROCS", "")
			os.Unsetenv("GOMAXPROCS")
		}
		singleProc()
		if got := runtime.GOMAXPROCS(0); got != tc.want {
			t.Errorf("GOMAXPROCS=%q: %d Ps, want %d", tc.env, got, tc.want)
		}
	}
}
