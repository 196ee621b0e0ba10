package pingpong

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/taproce/taproce/internal/oobconn"
)

// interruptible makes ctx's end interrupt blocked reads and writes on c;
// the returned function undoes that.
func interruptible(ctx context.Context, c net.Conn) func() bool {
	return context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
}

// ctxErr prefers ctx's error to the deadline error it caused.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// ClientExchange is the client's side of the exchange
// (pp_client_exch_dest): it writes local, reads the server's address,
// writes "done" and returns the server's address. It does not close c.
func ClientExchange(ctx context.Context, c net.Conn, local Dest) (Dest, error) {
	defer interruptible(ctx, c)()
	if _, err := c.Write(local.Marshal()); err != nil {
		return Dest{}, oobconn.Wrapf(ctxErr(ctx, err), "couldn't send local address")
	}
	msg := make([]byte, DestLen)
	if _, err := io.ReadFull(c, msg); err != nil {
		return Dest{}, oobconn.Wrapf(ctxErr(ctx, err), "couldn't read remote address")
	}
	if _, err := io.WriteString(c, doneMsg); err != nil {
		return Dest{}, oobconn.Wrapf(ctxErr(ctx, err), "couldn't write done")
	}
	return ParseDest(msg)
}

// ServerExchange is the server's side of the exchange
// (pp_server_exch_dest): it reads the client's address, calls connect
// with it (the tools move their QP to RTS before they answer), writes
// local and waits for the client's "done". It returns the client's
// address. It does not close c.
func ServerExchange(ctx context.Context, c net.Conn, local Dest, connect func(remote Dest) error) (Dest, error) {
	defer interruptible(ctx, c)()
	msg := make([]byte, DestLen)
	if n, err := io.ReadFull(c, msg); err != nil {
		return Dest{}, oobconn.Wrapf(ctxErr(ctx, err), "couldn't read remote address (%d of %d bytes)", n, DestLen)
	}
	remote, err := ParseDest(msg)
	if err != nil {
		return Dest{}, err
	}
	if connect != nil {
		if err := connect(remote); err != nil {
			return remote, fmt.Errorf("couldn't connect to remote QP: %w", err)
		}
	}
	if _, err := c.Write(local.Marshal()); err != nil {
		return remote, oobconn.Wrapf(ctxErr(ctx, err), "couldn't send local address")
	}
	done := make([]byte, len(doneMsg))
	if _, err := io.ReadFull(c, done); err != nil {
		return remote, oobconn.Wrapf(ctxErr(ctx, err), "couldn't read done")
	}
	if string(done) != doneMsg {
		return remote, fmt.Errorf("%w: the client ended the exchange with %q, want %q", ErrDest, done, doneMsg)
	}
	return remote, nil
}
