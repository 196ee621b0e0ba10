package cli

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestInterruptible: SIGINT and SIGTERM end the tools' context, and the
// error the end caused reads "interrupted".
func TestInterruptible(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		ctx, stop := interruptible()
		if err := orInterrupted(ctx, errors.New("accept: use of closed network connection")); err.Error() != "accept: use of closed network connection" {
			t.Errorf("before the signal: %v", err)
		}
		if err := syscall.Kill(os.Getpid(), sig); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("%v did not end the context", sig)
		}
		if err := orInterrupted(ctx, context.Canceled); !errors.Is(err, errInterrupted) || err.Error() != "interrupted" {
			t.Errorf("after %v: %v", sig, err)
		}
		if err := orInterrupted(ctx, nil); err != nil {
			t.Errorf("no error after %v: %v", sig, err)
		}
		stop()
	}
}
