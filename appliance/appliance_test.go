package appliance

import (
	"errors"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/taproce/taproce/appliance/control"
	"github.com/taproce/taproce/tap"
)

// TestApplianceLoopLifetime: a spinning appliance has a polling loop that
// reads its ports, a sleeping one has none; once closed, the loop has
// stopped and no port can be added, where one would never be read.
func TestApplianceLoopLifetime(t *testing.T) {
	for _, mode := range []control.PollMode{control.PollSpin, control.PollBlock} {
		t.Run(mode.String(), func(t *testing.T) {
			a := New(Options{Socket: filepath.Join(t.TempDir(), "s.sock"), Poll: mode})
			if (a.Loop() != nil) != (mode == control.PollSpin) {
				t.Fatalf("Loop() = %v in mode %s", a.Loop(), mode)
			}
			cfg := PortConfig{Namespace: "test", Addrs: []netip.Prefix{netip.MustParsePrefix("10.55.0.1/24")}}
			dev, peer := tap.NewFakePair(1500, 16)
			defer peer.Close()
			n, err := a.AddPortOn(dev, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if polled := n.Port().tr != nil; polled != (mode == control.PollSpin) {
				t.Errorf("port read by the loop: %v in mode %s", polled, mode)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if a.loopDone != nil {
				select {
				case <-a.loopDone:
				default:
					t.Error("the loop still runs after Close")
				}
			}
			dev2, peer2 := tap.NewFakePair(1500, 16)
			defer dev2.Close()
			defer peer2.Close()
			if _, err := a.AddPortOn(dev2, cfg); !errors.Is(err, ErrClosed) {
				t.Errorf("AddPortOn after Close: %v, want ErrClosed", err)
			}
		})
	}
}
