package devwatch_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/internal/devwatch"
	"github.com/taproce/taproce/verbs"
)

// TestApplianceProcess is not a test: it is the appliance process that
// TestDevwatch starts and kills (appliancetest.StartProcess).
func TestApplianceProcess(t *testing.T) { appliancetest.ServeProcess(t) }

// TestDevwatch: while the appliance serves, the context runs and Explain
// leaves a tool's error alone; once it is killed, Explain leads with the
// device's error (once), even before the device has seen the end, and the
// context ends with that error as its cause.
func TestDevwatch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an appliance process")
	}
	app := appliancetest.StartProcess(t, "TestApplianceProcess", appliancetest.Options{Namespace: "devwatch"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	vc, err := verbs.Open(ctx, "taproce0")
	if err != nil {
		t.Fatal(err)
	}
	defer vc.Close()
	dctx, stop := devwatch.Context(ctx, vc)
	defer stop()
	peer := errors.New("the peer closed the connection")

	if err := devwatch.Explain(vc, peer); err != peer {
		t.Errorf("alive: Explain gives %v, want the error alone", err)
	}
	if dctx.Err() != nil {
		t.Fatalf("alive: the context ended: %v", context.Cause(dctx))
	}
	if err := app.Kill(); err != nil {
		t.Fatal(err)
	}
	// At once, whether or not the device has seen the end yet: Explain
	// asks the appliance when it has not.
	if err := devwatch.Explain(vc, peer); !errors.Is(err, verbs.ErrDeviceGone) || !errors.Is(err, peer) {
		t.Errorf("just killed: Explain gives %v, want the device's error and the peer's", err)
	}
	<-dctx.Done() // the test's deadline ends it too: then the cause below is wrong
	if cause := context.Cause(dctx); !errors.Is(cause, verbs.ErrDeviceGone) {
		t.Errorf("dead: the context's cause is %v, want the device's error", cause)
	}
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"a peer's failure", peer, vc.Err().Error() + " (the peer closed the connection)"},
		{"the device's error", vc.Err(), vc.Err().Error()},
		{"no error", nil, ""},
		{"an error wrapping the device's", errors.Join(io.EOF, vc.Err()), errors.Join(io.EOF, vc.Err()).Error()},
	} {
		got := devwatch.Explain(vc, c.err)
		if got == nil && c.want != "" || got != nil && got.Error() != c.want {
			t.Errorf("dead: %s: Explain gives %v, want %q", c.name, got, c.want)
		}
		if c.err != nil && !errors.Is(got, c.err) {
			t.Errorf("dead: %s: %v does not wrap %v", c.name, got, c.err)
		}
	}
}
