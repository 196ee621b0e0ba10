package cli

import (
	"context"
	"errors"
	"os/signal"
	"syscall"
)

// errInterrupted is the error of a tool stopped by SIGINT or SIGTERM:
// whatever it was doing then (waiting for a client, connecting,
// measuring), the user asked it to stop.
var errInterrupted = errors.New("interrupted")

// interruptible returns a context that SIGINT and SIGTERM end, so that a
// tool waiting without end (a server waiting for its client, as perftest
// and the pingpong tools wait) stops at Ctrl-C or a kill; stop undoes it.
func interruptible() (ctx context.Context, stop context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// orInterrupted is err, or errInterrupted when ctx ended: the error a
// signal causes (a closed listener, a canceled context) says less than
// that.
func orInterrupted(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return errInterrupted
	}
	return err
}
