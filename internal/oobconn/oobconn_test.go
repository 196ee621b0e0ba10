package oobconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// closedPort returns a TCP port of 127.0.0.1 that nothing listens on (it
// was free a moment ago).
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// hangGuard is a context whose end only fails a test that hangs: the
// functions under test must end well before it, by their own bounds.
func hangGuard(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestDialRefused: where nothing listens, Dial tries Tries times and gives
// up with the tools' "couldn't connect to HOST:PORT", the reason and the
// tries, before any outer deadline.
func TestDialRefused(t *testing.T) {
	ctx := hangGuard(t)
	addr := closedPort(t)
	c, err := Dial(ctx, addr)
	if c != nil {
		c.Close()
		t.Fatalf("connected to %s", addr)
	}
	if ctx.Err() != nil {
		t.Fatalf("Dial ended with the test's deadline: %v", err)
	}
	var ce *ConnectError
	if !errors.As(err, &ce) || ce.Tries != Tries || !errors.Is(err, ErrConnect) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("%v (%#v): want a ConnectError after %d tries, wrapping ErrConnect and ECONNREFUSED", err, err, Tries)
	}
	if want := "couldn't connect to " + addr + ": connection refused (tried 10 times, 100ms apart)"; err.Error() != want {
		t.Errorf("%q, want %q", err, want)
	}
}

// TestDialRetries: Dial tries again while the server refuses, up to
// Tries tries in all, and takes the connection of the first try that gets
// one; any other failure ends it at once.
func TestDialRetries(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	unreachable := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)}
	defer func(d func(context.Context, string) (net.Conn, error)) { dialTCP = d }(dialTCP)
	for _, c := range []struct {
		name      string
		fails     int   // tries that fail before one connects
		failWith  error // how they fail
		wantTries int
		wantErr   error
	}{
		{"the server listens at the 4th try", 3, refused, 4, nil},
		{"the server listens at the last try", Tries - 1, refused, Tries, nil},
		{"the server never listens", 1000, refused, Tries, syscall.ECONNREFUSED},
		{"no route to the server", 1000, unreachable, 1, syscall.EHOSTUNREACH},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := 0
			dialTCP = func(context.Context, string) (net.Conn, error) {
				n++
				if n <= c.fails {
					return nil, c.failWith
				}
				a, b := net.Pipe()
				b.Close()
				return a, nil
			}
			conn, err := dial(hangGuard(t), "server:18515", Tries, time.Millisecond, Timeout)
			if conn != nil {
				conn.Close()
			}
			if n != c.wantTries || (c.wantErr == nil) != (err == nil) || c.wantErr != nil && !errors.Is(err, c.wantErr) {
				t.Errorf("%d tries, %v; want %d tries and %v", n, err, c.wantTries, c.wantErr)
			}
		})
	}
}

// TestDialNoAnswer: a server whose accept queue is full drops SYNs, as an
// address nobody answers does; each try then waits only its bound, and a
// try that went unanswered is not repeated.
func TestDialNoAnswer(t *testing.T) {
	ctx := hangGuard(t)
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	// Fill the accept queue (a backlog of 0 holds one connection).
	for i := 0; ; i++ {
		c, err := dial(ctx, addr, 1, 0, 500*time.Millisecond)
		if err != nil {
			break
		}
		defer c.Close()
		if i == 8 {
			t.Skip("the kernel accepts connections beyond the backlog")
		}
	}
	c, err := dial(ctx, addr, 5, time.Millisecond, 200*time.Millisecond)
	if c != nil {
		c.Close()
	}
	var ce *ConnectError
	if ctx.Err() != nil || !errors.As(err, &ce) || ce.Tries != 1 {
		t.Fatalf("%v: want a ConnectError after 1 try", err)
	}
	if want := "couldn't connect to " + addr + ": no answer within 200ms"; err.Error() != want {
		t.Errorf("%q, want %q", err, want)
	}
}

// TestDialCanceled: a context that ends stops the tries, with its error.
func TestDialCanceled(t *testing.T) {
	addr := closedPort(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Dial(ctx, addr); !errors.Is(err, context.Canceled) || !errors.Is(err, ErrConnect) {
		t.Errorf("%v: want context.Canceled", err)
	}
}

// TestAccept: Accept returns the client; and waits, without end, until its
// context ends, with the context's error.
func TestAccept(t *testing.T) {
	guard := hangGuard(t)
	for _, deadliner := range []bool{true, false} {
		t.Run(fmt.Sprint("deadline ", deadliner), func(t *testing.T) {
			tl, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer tl.Close()
			var ln net.Listener = tl
			if !deadliner {
				ln = plainListener{tl}
			}
			go func() {
				if c, err := Dial(guard, ln.Addr().String()); err == nil {
					c.Close()
				}
			}()
			c, err := Accept(guard, ln)
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
			ctx, cancel := context.WithCancel(guard)
			done := make(chan error, 1)
			go func() {
				c, err := Accept(ctx, ln)
				if c != nil {
					c.Close()
				}
				done <- err
			}()
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Accept after the context ended: %v", err)
			}
		})
	}
}

// plainListener hides the listener's SetDeadline.
type plainListener struct{ net.Listener }

// TestReason: network errors in a person's words.
func TestReason(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "x.invalid", IsNotFound: true}}, "no such host"},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, "connection reset by peer"},
		{fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), "the peer closed the connection"},
		{context.Canceled, "interrupted"},
		{errors.New("something else"), "something else"},
	} {
		if got := Reason(c.err); got != c.want {
			t.Errorf("Reason(%v) = %q, want %q", c.err, got, c.want)
		}
	}
	err := Wrapf(syscall.EPIPE, "couldn't send %d bytes", 16)
	if err.Error() != "couldn't send 16 bytes: broken pipe" || !errors.Is(err, syscall.EPIPE) {
		t.Errorf("Wrapf: %v", err)
	}
}
