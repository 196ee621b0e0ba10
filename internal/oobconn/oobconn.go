// Package oobconn is how the two sides of taproce's tools (perf, pingpong)
// meet over TCP before RDMA: a client's bounded connect, a server's wait
// for its client that a signal can end, and the wording of their errors.
//
// perftest's and ibv_rc_pingpong's clients try each address of the server
// once and give up with "Couldn't connect to HOST:PORT". A client here
// also gives up, but tries again for a moment while the server refuses —
// a server started a moment later still gets its client, as perftest's
// retry_rdma_connect allows its RDMA CM clients (10 tries, 100 ms apart) —
// and bounds each try, so that an address that never answers ends in
// seconds, not after the kernel's two minutes of SYN retries. A server
// waits for its client without end, as both tools' servers do.
package oobconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"
)

// The bounds of a client's connect: Tries tries, Interval apart, while the
// server refuses (nothing listens yet); each try waits at most Timeout for
// an answer. perftest retries its RDMA CM connect 10 times, 100 ms apart.
const (
	Tries    = 10
	Interval = 100 * time.Millisecond
	Timeout  = 10 * time.Second
)

// ErrConnect is wrapped by Dial's errors.
var ErrConnect = errors.New("couldn't connect")

// ConnectError is Dial's failure: the tools' "couldn't connect to
// HOST:PORT", with the reason and, when it tried more than once, how
// often. It wraps ErrConnect and the last try's error.
type ConnectError struct {
	Addr  string
	Tries int
	Err   error
	// wait is how long a try waited for an answer, interval the time
	// between tries.
	wait, interval time.Duration
}

func (e *ConnectError) Error() string {
	reason := Reason(e.Err)
	if ne := net.Error(nil); errors.As(e.Err, &ne) && ne.Timeout() {
		reason = fmt.Sprintf("no answer within %v", e.wait)
	}
	s := fmt.Sprintf("couldn't connect to %s: %s", e.Addr, reason)
	if e.Tries > 1 {
		s += fmt.Sprintf(" (tried %d times, %v apart)", e.Tries, e.interval)
	}
	return s
}

func (e *ConnectError) Unwrap() []error { return []error{ErrConnect, e.Err} }

// Dial connects to addr (host:port): every address the host resolves to,
// once a try, up to Tries tries while the server refuses. It ends when ctx
// does, with ctx's error.
func Dial(ctx context.Context, addr string) (net.Conn, error) {
	return dial(ctx, addr, Tries, Interval, Timeout)
}

// dialTCP makes one try; tests replace it.
var dialTCP = func(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

func dial(ctx context.Context, addr string, tries int, interval, timeout time.Duration) (net.Conn, error) {
	for try := 1; ; try++ {
		tctx, cancel := context.WithTimeout(ctx, timeout)
		c, err := dialTCP(tctx, addr)
		cancel()
		switch {
		case err == nil:
			return c, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("%w to %s: %w", ErrConnect, addr, ctx.Err())
		case !errors.Is(err, syscall.ECONNREFUSED) || try == tries:
			return nil, &ConnectError{Addr: addr, Tries: try, Err: err, wait: timeout, interval: interval}
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w to %s: %w", ErrConnect, addr, ctx.Err())
		case <-t.C:
		}
	}
}

// Accept waits for one client on ln, without end, until ctx ends; then it
// returns ctx's error. ln stays open unless it cannot take a deadline, in
// which case ctx's end closes it.
func Accept(ctx context.Context, ln net.Listener) (net.Conn, error) {
	stop := context.AfterFunc(ctx, func() {
		if d, ok := ln.(interface{ SetDeadline(time.Time) error }); ok {
			_ = d.SetDeadline(time.Unix(1, 0))
			return
		}
		_ = ln.Close()
	})
	c, err := ln.Accept()
	if !stop() {
		// ctx ended: a connection that came at that moment is dropped.
		if c != nil {
			c.Close()
		}
		return nil, ctx.Err()
	}
	return c, err
}

// Reason words a network error for a person, without Go's operation and
// addresses around it: "connection refused", "no such host", "no answer
// within 10s", "the peer closed the connection".
func Reason(err error) string {
	var dns *net.DNSError
	var errno syscall.Errno
	var ne net.Error
	switch {
	case err == nil:
		return "no error"
	case errors.Is(err, context.Canceled):
		return "interrupted"
	case errors.As(err, &dns):
		return dns.Err
	case errors.As(err, &errno):
		return errno.Error()
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the peer closed the connection"
	case errors.As(err, &ne) && ne.Timeout():
		return "no answer in time"
	}
	return err.Error()
}

// Wrapf returns an error about the connection that reads as the formatted
// text, a colon and Reason(err), and wraps err.
func Wrapf(err error, format string, args ...any) error {
	return Wrap(err, fmt.Sprintf(format, args...)+": "+Reason(err))
}

// Wrap returns an error that reads as msg alone and wraps err: for a
// message that says all of err in its own words.
func Wrap(err error, msg string) error { return &reasonError{msg: msg, err: err} }

type reasonError struct {
	msg string
	err error
}

func (e *reasonError) Error() string { return e.msg }
func (e *reasonError) Unwrap() error { return e.err }
