package appliance

import (
	"errors"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/taproce/taproce/appliance/control"
	"github.com/taproce/taproce/internal/testnet"
	"github.com/taproce/taproce/tap"
)

// TestApplianceLoopLifetime: a spinning appliance has a spinning loop that
// reads its ports, a sleeping one a blocking loop, which reads the ports
// it can sleep on (not a fake without a descriptor); once closed, the loop
// has stopped and no port can be added, where one would never be read.
func TestApplianceLoopLifetime(t *testing.T) {
	for _, mode := range []control.PollMode{control.PollSpin, control.PollBlock} {
		t.Run(mode.String(), func(t *testing.T) {
			a := New(Options{Socket: filepath.Join(t.TempDir(), "s.sock"), Poll: mode})
			if a.Loop() == nil || a.Loop().Blocking() != (mode != control.PollSpin) {
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

// TestBlockingLoopReadsTAPs: a sleeping appliance's loop reads a real TAP
// itself, sleeping on its descriptor, which stays out of the runtime's
// poller; a spinning one reads it too, through the poller's descriptor.
func TestBlockingLoopReadsTAPs(t *testing.T) {
	_, path := testnet.Namespace(t)
	for _, mode := range []control.PollMode{control.PollBlock, control.PollAdaptive, control.PollSpin} {
		t.Run(mode.String(), func(t *testing.T) {
			a := New(Options{Socket: filepath.Join(t.TempDir(), "s.sock"), Poll: mode})
			defer a.Close()
			n, err := a.AddPort(PortConfig{Namespace: "test", Netns: path, Name: "blk0",
				Addrs: []netip.Prefix{netip.MustParsePrefix("10.55.7.1/24")}})
			if err != nil {
				t.Fatal(err)
			}
			if n.Port().tr == nil {
				t.Error("the port is not read by the loop")
			}
			dev, ok := n.Port().Device().(*tap.Tap)
			if !ok {
				t.Fatalf("device %T", n.Port().Device())
			}
			if got := dev.Unpolled(); got != (mode != control.PollSpin) {
				t.Errorf("Unpolled() = %v in mode %s", got, mode)
			}
		})
	}
}
