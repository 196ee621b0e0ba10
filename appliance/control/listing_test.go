package control_test

import (
	"bytes"
	"testing"

	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/verbs"
)

// TestListDevices: a client is shown only the devices it may open, and
// told that others are left out; with ListAllDevices it is shown every
// device, those of other namespaces marked unusable, MACs and GIDs
// included.
func TestListDevices(t *testing.T) {
	for _, c := range []struct {
		listAll, elsewhere bool
		names              int // devices shown
		usable             bool
	}{
		{false, false, 2, true},
		{false, true, 0, false},
		{true, false, 2, true},
		{true, true, 2, false},
	} {
		r := appliancetest.New(t, appliancetest.Options{ListAllDevices: c.listAll})
		r.Elsewhere.Store(c.elsewhere)
		list, err := verbs.ListDevices(testCtx(t))
		must(t, err)
		if len(list.Devices) != c.names || list.OthersHidden == c.listAll {
			t.Errorf("list all %v, elsewhere %v: %+v", c.listAll, c.elsewhere, list)
			continue
		}
		for i, d := range list.Devices {
			mac := r.NICs[i].Port().MAC()
			if d.Usable != c.usable || d.Name != r.NICs[i].Name() || len(d.GIDs) != 2 || d.GIDs[1] != r.Addrs[i] ||
				!bytes.Equal(d.MAC, mac[:]) {
				t.Errorf("list all %v, elsewhere %v: device %d is %+v", c.listAll, c.elsewhere, i, d)
			}
		}
	}
}
