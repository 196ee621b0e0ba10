// Package devwatch lets the tools (perf, pingpong) fail at once, and say
// why, when their device's appliance dies: whatever they wait for — a
// peer on the out-of-band connection, completions, a peer's writes in
// memory — nothing comes any more.
package devwatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/taproce/taproce/verbs"
)

// Context returns a context that also ends when the device's appliance
// is gone, with the device's error (wrapping verbs.ErrDeviceGone) as its
// cause; stop releases it.
func Context(ctx context.Context, vc *verbs.Context) (_ context.Context, stop func()) {
	dctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-vc.Done():
			if err := vc.Err(); errors.Is(err, verbs.ErrDeviceGone) {
				cancel(err)
			}
		case <-dctx.Done():
		}
	}()
	return dctx, func() { cancel(nil) }
}

// Check bounds Explain's question to the appliance, which a working one
// answers at once.
const Check = 5 * time.Second

// Explain returns err, led by the device's error when the device's
// appliance is gone and err does not say so already. A tool whose peer failed first may learn of the
// death as the end of the out-of-band connection before its own device
// reports it, so Explain asks the appliance (a port query) before it
// lets err stand alone.
func Explain(vc *verbs.Context, err error) error {
	if err == nil || errors.Is(err, verbs.ErrDeviceGone) {
		return err
	}
	lost := vc.Err()
	if lost == nil {
		ctx, cancel := context.WithTimeout(context.Background(), Check)
		_, lost = vc.QueryPort(ctx)
		cancel()
	}
	if errors.Is(lost, verbs.ErrDeviceGone) {
		return fmt.Errorf("%w (%w)", lost, err)
	}
	return err
}
