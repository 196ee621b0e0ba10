package perf

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance"
)

// acceptWatch is a listener that says when its Accept is first called.
type acceptWatch struct {
	*net.TCPListener
	called chan struct{}
}

func (l *acceptWatch) Accept() (net.Conn, error) {
	select {
	case <-l.called:
	default:
		close(l.called)
	}
	return l.TCPListener.Accept()
}

// TestServerInterrupted: a server waits for its client without end, as
// perftest's does, until its context ends (SIGINT or SIGTERM in the
// command); then it returns the context's error. (The minute allowed only
// turns a hang into a failure.)
func TestServerInterrupted(t *testing.T) {
	newRig(t, true, 1500, appliance.PollAdaptive)
	for _, test := range []string{"write_bw", "send_lat"} {
		ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := ParseArgs([]string{test, "-d", "taproce0"})
		if err != nil {
			t.Fatal(err)
		}
		w := &acceptWatch{TCPListener: ln, called: make(chan struct{})}
		cfg.Listener = w
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := Run(ctx, cfg, io.Discard)
			done <- err
		}()
		select {
		case <-w.called:
		case err := <-done:
			t.Fatalf("%s server ended before it waited for a client: %v", test, err)
		}
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%s server: %v, want context.Canceled", test, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s server still waits a minute after its context ended", test)
		}
	}
}
