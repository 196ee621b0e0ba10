package cli

import (
	"bytes"
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"
)

// ppFreePort returns a TCP port that was free a moment ago.
func ppFreePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestPingpongCommand: `taproce pingpong` as server and client, through
// the command line, for RC and UD, with -c: the tools' output lines on
// both sides and no invalid data.
func TestPingpongCommand(t *testing.T) {
	startVerbsRig(t)
	for _, c := range []struct {
		flags []string
		sep   string
	}{
		{[]string{"-g", "1", "-n", "50", "-s", "5000", "-c"}, ","},
		{[]string{"--ud", "-n50", "-s", "512", "-ec"}, ":"},
		{[]string{"-t", "uc", "-n", "20", "-m", "512", "-c"}, ","},
	} {
		t.Run(strings.Join(c.flags, " "), func(t *testing.T) {
			port := fmt.Sprint(ppFreePort(t))
			type result struct {
				code        int
				out, errOut string
			}
			done := make(chan result, 1)
			go func() {
				var out, errb bytes.Buffer
				code := Main(append([]string{"pingpong", "-d", "taproce0", "-p", port}, c.flags...), &out, &errb)
				done <- result{code, out.String(), errb.String()}
			}()
			// The server listens once it has set up its QP: retry while
			// the connection is refused.
			var cl result
			for deadline := time.Now().Add(10 * time.Second); ; {
				cl.code, cl.out, cl.errOut = runCmd(append([]string{"pingpong", "-d", "taproce1", "-p", port, "127.0.0.1"}, c.flags...)...)
				if cl.code != 1 || !strings.Contains(cl.errOut, "couldn't connect") || time.Now().After(deadline) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			var sv result
			select {
			case sv = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("the server did not finish")
			}
			for _, x := range []struct {
				who string
				r   result
			}{{"server", sv}, {"client", cl}} {
				lines := strings.Split(strings.TrimSuffix(x.r.out, "\n"), "\n")
				re := []*regexp.Regexp{
					regexp.MustCompile(`^  local address:  LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}` + c.sep + ` GID ::ffff:10\.77\.0\.[12]$`),
					regexp.MustCompile(`^  remote address: LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID ::ffff:10\.77\.0\.[12]$`),
					regexp.MustCompile(`^\d+ bytes in \d+\.\d\d seconds = \d+\.\d\d Mbit/sec$`),
					regexp.MustCompile(`^\d+ iters in \d+\.\d\d seconds = \d+\.\d\d usec/iter$`),
				}
				ok := x.r.code == 0 && len(lines) == len(re)
				for i := range re {
					ok = ok && re[i].MatchString(lines[i])
				}
				if !ok {
					t.Errorf("%s: exit %d\n%s%s", x.who, x.r.code, x.r.out, x.r.errOut)
				}
			}
		})
	}
}

// TestPingpongCommandLine: help, usage errors and refusals.
func TestPingpongCommandLine(t *testing.T) {
	if code, out, _ := runCmd("pingpong", "-h"); code != 0 || !strings.Contains(out, "--rx-depth") {
		t.Errorf("pingpong -h: exit %d\n%s", code, out)
	}
	for _, args := range [][]string{{"-x"}, {"-m", "1000"}, {"a", "b"}, {"-t", "rd"}} {
		if code, _, errOut := runCmd(append([]string{"pingpong"}, args...)...); code != 2 || !strings.Contains(errOut, "Usage:") {
			t.Errorf("pingpong %q: exit %d\n%s", args, code, errOut)
		}
	}
	if code, _, errOut := runCmd("pingpong", "-o"); code != 1 || !strings.Contains(errOut, "ODP") {
		t.Errorf("pingpong -o: exit %d, %q", code, errOut)
	}
}
