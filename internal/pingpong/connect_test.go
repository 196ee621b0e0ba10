package pingpong

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/taproce/taproce/verbs"
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

// TestServerInterrupted: a server waits for its client without end, as the
// tools' servers do, until its context ends (SIGINT or SIGTERM in the
// command); then it returns the context's error. (The minute allowed only
// turns a hang into a failure.)
func TestServerInterrupted(t *testing.T) {
	startAppliance(t, true, 1500)
	for _, typ := range []verbs.QPType{verbs.RC, verbs.UD} {
		ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		w := &acceptWatch{TCPListener: ln, called: make(chan struct{})}
		o := DefaultOptions(typ)
		o.Device = "taproce0"
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := Run(ctx, o, Env{Listener: w}, io.Discard)
			done <- err
		}()
		select {
		case <-w.called:
		case err := <-done:
			t.Fatalf("%v server ended before it waited for a client: %v", typ, err)
		}
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%v server: %v, want context.Canceled", typ, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%v server still waits a minute after its context ended", typ)
		}
		ln.Close()
	}
}
