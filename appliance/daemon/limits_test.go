package daemon

import (
	"errors"
	"testing"

	"github.com/taproce/taproce/appliance/control"
	"github.com/taproce/taproce/config"
)

// TestDefaultLimits: the configuration's default limits are the control
// server's, which holds the two vocabularies together.
func TestDefaultLimits(t *testing.T) {
	if got := limits(config.DefaultLimits()); got != control.DefaultLimits {
		t.Errorf("per client: config %+v, control %+v", got, control.DefaultLimits)
	}
	got, err := applianceLimits(config.DefaultApplianceLimits(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	want := control.DefaultApplianceLimits
	want.Descriptors = got.Descriptors
	if got != want {
		t.Errorf("appliance-wide: config %+v, control %+v", got, want)
	}
}

// TestApplianceDescriptors: the descriptors for clients leave the
// appliance its own under RLIMIT_NOFILE, three quarters of it by default;
// a configured number without that room is refused.
func TestApplianceDescriptors(t *testing.T) {
	for _, c := range []struct {
		configured int
		nofile     uint64
		want       int
		err        error
	}{
		{0, 20000, 15000, nil},
		{0, 1024, 768, nil},
		{0, 1 << 62, 1 << 30, nil},
		{5000, 20000, 5000, nil},
		{19744, 20000, 19744, nil},
		{19745, 20000, 0, ErrDescriptors},
		{16, 100, 0, ErrDescriptors},
	} {
		l := config.DefaultApplianceLimits()
		l.Descriptors = c.configured
		got, err := applianceLimits(l, c.nofile)
		if !errors.Is(err, c.err) || err == nil && got.Descriptors != c.want {
			t.Errorf("descriptors %d under %d: %d, %v; want %d, %v", c.configured, c.nofile, got.Descriptors, err, c.want, c.err)
		}
	}
}
