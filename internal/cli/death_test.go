package cli

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/appliancetest"
)

// TestApplianceProcess is not a test: it is the appliance process that
// the tests of a dying appliance start and kill (appliancetest.StartProcess).
func TestApplianceProcess(t *testing.T) { appliancetest.ServeProcess(t) }

// goneMessage is what a tool's error says when its appliance died.
const goneMessage = "is gone: the appliance closed the control connection: it died"

// cmdRun is a command running in a goroutine: its output so far, and its
// exit code once it ends.
type cmdRun struct {
	name        string
	out, errOut syncBuffer
	code        chan int
}

func startCmd(name string, args ...string) *cmdRun {
	r := &cmdRun{name: name, code: make(chan int, 1)}
	go func() { r.code <- Main(args, &r.out, &r.errOut) }()
	return r
}

// waitFor waits until the command's output holds s, or it ended; the
// deadline turns a command that hangs into a failure.
func (r *cmdRun) waitFor(t *testing.T, deadline time.Time, s string) {
	t.Helper()
	for !strings.Contains(r.out.String(), s) {
		select {
		case code := <-r.code:
			r.code <- code
			t.Fatalf("%s ended (%d) before printing %q:\n%s%s", r.name, code, s, r.out.String(), r.errOut.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not print %q:\n%s%s", r.name, s, r.out.String(), r.errOut.String())
		}
	}
}

// failsForGone checks that the command ends with status 1 and an error
// that names the appliance's death, having printed no result line (rows
// start with a space and a digit).
func (r *cmdRun) failsForGone(t *testing.T, deadline time.Time, results string) {
	t.Helper()
	select {
	case code := <-r.code:
		t.Logf("%s: exit %d: %s", r.name, code, r.errOut.String())
		if code != 1 || !strings.Contains(r.errOut.String(), goneMessage) {
			t.Errorf("%s: exit %d, stderr %q; want 1 and %q", r.name, code, r.errOut.String(), goneMessage)
		}
		if results != "" && strings.Contains(r.out.String(), results) {
			t.Errorf("%s printed a result after the appliance died:\n%s", r.name, r.out.String())
		}
	case <-time.After(time.Until(deadline)):
		t.Errorf("%s still runs after the appliance died:\n%s%s", r.name, r.out.String(), r.errOut.String())
	}
}

// TestPerfApplianceDeath kills the appliance (SIGKILL) while `taproce
// perf write_bw` runs, for a number of iterations and for a duration
// (-D 10, which used to print a normal result): server and client both
// exit 1 with an error that names the appliance's death.
func TestPerfApplianceDeath(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an appliance process")
	}
	for _, c := range []struct {
		name string
		args []string // after the test's name
	}{
		{"iterations", []string{"-n", "1000000", "-s", "4096"}},
		{"duration", []string{"-D", "10", "-s", "4096"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			app := appliancetest.StartProcess(t, "TestApplianceProcess", appliancetest.Options{Namespace: "death", Net: 79})
			deadline := time.Now().Add(60 * time.Second)
			port := fmt.Sprint(ppFreePort(t))
			srv := startCmd("server", append([]string{"perf", "write_bw", "-d", "taproce0", "-p", port}, c.args...)...)
			srv.waitFor(t, deadline, "Waiting for client to connect")
			cl := startCmd("client", append([]string{"perf", "write_bw", "-d", "taproce1", "-p", port, "-F"}, append(c.args, "127.0.0.1")...)...)
			// Both print the table's head before the test runs.
			for _, r := range []*cmdRun{srv, cl} {
				r.waitFor(t, deadline, "#bytes")
			}
			if err := app.Kill(); err != nil {
				t.Fatal(err)
			}
			for _, r := range []*cmdRun{srv, cl} {
				r.failsForGone(t, deadline, "\n 4096 ")
			}
		})
	}
}

// TestPingpongApplianceDeath kills the appliance (SIGKILL) while `taproce
// pingpong` pairs exchange, busy-polling and sleeping on the completion
// channel (-e), on RC, UD and UC and in UD's bounded exchange: both sides
// exit 1 with an error that names the appliance's death.
func TestPingpongApplianceDeath(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an appliance process")
	}
	for _, flags := range [][]string{
		{"-n", "1000000"},
		{"-n", "1000000", "-e"},
		{"--ud", "-n", "1000000", "-e"},
		{"-t", "uc", "-n", "1000000"},
		{"--ud", "-n", "1000000", "--timeout", "1000"},
	} {
		t.Run(strings.Join(flags, " "), func(t *testing.T) {
			app := appliancetest.StartProcess(t, "TestApplianceProcess", appliancetest.Options{Namespace: "death", Net: 79})
			deadline := time.Now().Add(60 * time.Second)
			port := fmt.Sprint(ppFreePort(t))
			srv := startCmd("server", append([]string{"pingpong", "-d", "taproce0", "-g", "1", "-p", port}, flags...)...)
			srv.waitFor(t, deadline, "local address")
			// The server listens once it has set up its QP: the client
			// tries again while its connection is refused.
			var cl *cmdRun
			for {
				cl = startCmd("client", append([]string{"pingpong", "-d", "taproce1", "-g", "1", "-p", port, "127.0.0.1"}, flags...)...)
				if !cl.refused(deadline) {
					break
				}
			}
			for _, r := range []*cmdRun{srv, cl} {
				r.waitFor(t, deadline, "remote address")
			}
			// The client prints the address before it connects its QP:
			// give the exchange a moment to run. The outcome must be the
			// same whenever the appliance dies.
			time.Sleep(200 * time.Millisecond)
			if err := app.Kill(); err != nil {
				t.Fatal(err)
			}
			for _, r := range []*cmdRun{srv, cl} {
				r.failsForGone(t, deadline, " iters in ")
			}
		})
	}
}

// refused reports whether a pingpong client ended because nothing
// listened yet (the deadline passed, it reports false).
func (r *cmdRun) refused(deadline time.Time) bool {
	for !strings.Contains(r.out.String(), "remote address") && time.Now().Before(deadline) {
		select {
		case code := <-r.code:
			if code == 1 && strings.Contains(r.errOut.String(), "couldn't connect") {
				time.Sleep(20 * time.Millisecond)
				return true
			}
			r.code <- code
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
	return false
}
