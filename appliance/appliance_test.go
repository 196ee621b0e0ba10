package appliance

import (
	"errors"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/taproce/taproce/internal/testnet"
	"github.com/taproce/taproce/tap"
)

// TestApplianceLoopLifetime: a spinning appliance has a spinning loop that
// reads its ports, a sleeping one a blocking loop, which reads its ports
// too (a fake TAP like a real one); once closed, the loop has stopped and
// no port can be added, where one would never be read.
func TestApplianceLoopLifetime(t *testing.T) {
	for _, mode := range []PollMode{PollSpin, PollBlock} {
		t.Run(mode.String(), func(t *testing.T) {
			a, err := New(Options{Socket: filepath.Join(t.TempDir(), "s.sock"), Poll: mode})
			if err != nil {
				t.Fatal(err)
			}
			if a.Loop() == nil || a.Loop().Blocking() != (mode != PollSpin) {
				t.Fatalf("Loop() = %v in mode %s", a.Loop(), mode)
			}
			cfg := PortConfig{Namespace: "test", Addrs: []netip.Prefix{netip.MustParsePrefix("10.55.0.1/24")}}
			dev, peer := tap.NewFakePair(1500, 16)
			defer peer.Close()
			n, err := a.AddPortOn(dev, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if n.Port().cfg.Loop != a.Loop() || n.Port().ownLoop != nil {
				t.Errorf("port not read by the appliance's loop in mode %s", mode)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-a.loopDone:
			default:
				t.Error("the loop still runs after Close")
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
	for _, mode := range []PollMode{PollBlock, PollAdaptive, PollSpin} {
		t.Run(mode.String(), func(t *testing.T) {
			a, err := New(Options{Socket: filepath.Join(t.TempDir(), "s.sock"), Poll: mode})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			n, err := a.AddPort(PortConfig{Namespace: "test", Netns: path, Name: "blk0",
				Addrs: []netip.Prefix{netip.MustParsePrefix("10.55.7.1/24")}})
			if err != nil {
				t.Fatal(err)
			}
			if n.Port().cfg.Loop != a.Loop() {
				t.Error("the port is not read by the appliance's loop")
			}
			dev, ok := n.Port().Device().(*tap.Tap)
			if !ok {
				t.Fatalf("device %T", n.Port().Device())
			}
			if got := dev.Unpolled(); got != (mode != PollSpin) {
				t.Errorf("Unpolled() = %v in mode %s", got, mode)
			}
		})
	}
}
