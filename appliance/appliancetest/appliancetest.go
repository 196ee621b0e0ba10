// Package appliancetest runs an appliance for tests: ports on a pair of
// fake TAPs joined as a wire (tap.NewFakePair, the same receive path as a
// TAP), serving verbs on a socket in the test's temporary directory that
// TAPROCE_SOCKET names, so that the verbs library, the tools and client
// processes the test starts find it. Everything stops when the test ends.
package appliancetest

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/control"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/tap"
	"github.com/taproce/taproce/verbs/abi"
)

// Options describe a test appliance; the zero value is two ports at MTU
// 1500, the adaptive poll mode, no local switch.
type Options struct {
	// Poll is the appliance's poll mode.
	Poll appliance.PollMode
	// LocalSwitch lets the ports' traffic cross in memory.
	LocalSwitch bool
	// MTU of the fake wire (default 1500).
	MTU int
	// Depth is how many frames each fake end queues before it drops
	// (default 1024).
	Depth int
	// Namespace names the ports' namespace in logs and metrics (default
	// "test").
	Namespace string
	// Net is the third octet of the ports' addresses: taproce0 is
	// 10.Net.0.1/24 on the first fake end, taproce1 10.Net.0.2/24 on the
	// second (default 77).
	Net byte
	// Ingress impairs what the first port (taproce0) receives.
	Ingress impair.Spec
	// Egress impairs what each port sends.
	Egress impair.Spec
	// Linger is control.Config.Linger (0: the default).
	Linger time.Duration
	// LingerQuiet is appliance.Options.LingerQuiet (0: the default).
	LingerQuiet time.Duration
	// ListAllDevices lists the devices to clients of other namespaces
	// too (Elsewhere).
	ListAllDevices bool
	// Limits and ApplianceLimits are the control server's (zero: the
	// defaults).
	Limits          control.Limits
	ApplianceLimits control.ApplianceLimits
	// Logger (default: discard).
	Logger *slog.Logger
}

// Rig is a serving appliance and its wire.
type Rig struct {
	App *appliance.Appliance
	// Socket is the control socket, also in TAPROCE_SOCKET.
	Socket string
	// NICs are taproce0 and taproce1.
	NICs [2]*appliance.NIC
	// Addrs are their IPv4 addresses.
	Addrs [2]netip.Addr
	// Elsewhere, when set, puts every client in another network namespace
	// than the ports': the devices are then not theirs to open.
	Elsewhere atomic.Bool
}

// New starts a test appliance; it fails the test when it cannot.
func New(t testing.TB, o Options) *Rig {
	t.Helper()
	o = o.withDefaults()
	return newAt(t, o, filepath.Join(t.TempDir(), "taproce.sock"))
}

// withDefaults fills in the defaults of the zero fields.
func (o Options) withDefaults() Options {
	if o.MTU == 0 {
		o.MTU = 1500
	}
	if o.Depth == 0 {
		o.Depth = 1024
	}
	if o.Namespace == "" {
		o.Namespace = "test"
	}
	if o.Net == 0 {
		o.Net = 77
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// newAt is New serving on socket.
func newAt(t testing.TB, o Options, socket string) *Rig {
	t.Helper()
	r := &Rig{Socket: socket}
	t.Setenv(abi.SocketEnv, r.Socket)
	self, err := control.NetnsInode("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	app, err := appliance.New(appliance.Options{Socket: r.Socket, LocalSwitch: o.LocalSwitch, Poll: o.Poll, Logger: o.Logger,
		Linger: o.Linger, LingerQuiet: o.LingerQuiet, Limits: o.Limits, ApplianceLimits: o.ApplianceLimits, ListAllDevices: o.ListAllDevices, PeerNetns: func(int32) (uint64, error) {
			if r.Elsewhere.Load() {
				return self + 1, nil
			}
			return self, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	r.App = app
	a, b := tap.NewFakePair(o.MTU, o.Depth)
	for i, dev := range []tap.Device{a, b} {
		r.Addrs[i] = netip.AddrFrom4([4]byte{10, o.Net, 0, byte(i + 1)})
		cfg := appliance.PortConfig{Namespace: o.Namespace, Name: dev.Name(), MTU: o.MTU,
			Addrs: []netip.Prefix{netip.PrefixFrom(r.Addrs[i], 24)}}
		if i == 0 {
			cfg.Ingress = o.Ingress
		}
		cfg.Egress = o.Egress
		if r.NICs[i], err = app.AddPortOn(dev, cfg); err != nil {
			app.Close()
			t.Fatal(fmt.Errorf("appliancetest: %w", err))
		}
	}
	if err := app.Control().Listen(); err != nil {
		app.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		app.Close()
	})
	return r
}
