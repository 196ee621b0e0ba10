package perf

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/verbs"
)

// TestApplianceProcess is not a test: it is the appliance process that
// TestRunApplianceDeath starts and kills (appliancetest.StartProcess).
func TestApplianceProcess(t *testing.T) { appliancetest.ServeProcess(t) }

// lockedBuffer is a bytes.Buffer that Run writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRunApplianceDeath kills the appliance (SIGKILL) while each test
// runs, for a number of iterations and for a duration: both sides fail
// with an error wrapping verbs.ErrDeviceGone — the side waiting for
// completions, the one watching its memory for the peer's writes
// (write_lat), the server that only waits for its client on the
// out-of-band connection — and return no result of the size.
func TestRunApplianceDeath(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an appliance process per test")
	}
	for _, test := range Tests {
		for _, mode := range [][]string{{"-n", "1000000"}, {"-D", "10"}} {
			t.Run(test.String()+strings.Join(mode, ""), func(t *testing.T) {
				app := appliancetest.StartProcess(t, "TestApplianceProcess", appliancetest.Options{Namespace: "death"})
				ln, err := net.Listen("tcp4", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				scfg, err := ParseArgs(append([]string{test.String(), "-d", "taproce0"}, mode...))
				if err != nil {
					t.Fatal(err)
				}
				scfg.Listener = ln
				ccfg, err := ParseArgs(append([]string{test.String(), "-d", "taproce1"}, append(mode, ln.Addr().String())...))
				if err != nil {
					t.Fatal(err)
				}
				// The deadline only turns a side that never learns into a
				// failure.
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				type side struct {
					name string
					out  lockedBuffer
					res  []Result
					err  error
					done chan struct{}
				}
				sides := []*side{{name: "server", done: make(chan struct{})}, {name: "client", done: make(chan struct{})}}
				for i, cfg := range []Config{scfg, ccfg} {
					s := sides[i]
					go func() {
						defer close(s.done)
						s.res, s.err = Run(ctx, cfg, &s.out)
					}()
				}
				// The client prints the table's head just before it runs
				// its loop; a passive server never prints it.
				for !strings.Contains(sides[1].out.String(), "#bytes") {
					select {
					case <-sides[1].done:
						t.Fatalf("the client ended before it ran: %v\n%s", sides[1].err, sides[1].out.String())
					case <-ctx.Done():
						t.Fatalf("the client did not start:\n%s", sides[1].out.String())
					case <-time.After(10 * time.Millisecond):
					}
				}
				if err := app.Kill(); err != nil {
					t.Fatal(err)
				}
				for _, s := range sides {
					<-s.done
					if !errors.Is(s.err, verbs.ErrDeviceGone) || ctx.Err() != nil {
						t.Errorf("%s: %v; want the device's error\n%s", s.name, s.err, s.out.String())
					}
					if len(s.res) > 0 {
						t.Errorf("%s: results %+v after the appliance died", s.name, s.res)
					}
				}
			})
		}
	}
}
