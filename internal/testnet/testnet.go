// Package testnet gives tests real network namespaces that are removed
// again when the test ends, pass or fail, and skips tests that cannot have
// them.
package testnet

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/taproce/taproce/internal/netnsutil"
)

// RequireRoot skips the test, with the reason, unless it runs as root on a
// machine with /dev/net/tun.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces and TAP devices; run the tests as root to include it")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("needs /dev/net/tun: %v", err)
	}
}

var seq atomic.Int64

// Name returns a namespace name unique to this process and call, starting
// with "tpt-" so that leftovers are recognisable.
func Name() string { return fmt.Sprintf("tpt-%d-%d", os.Getpid(), seq.Add(1)) }

// Namespace creates a named network namespace (as `ip netns add`) and
// registers its removal with t.Cleanup. It returns the name and the path.
func Namespace(t testing.TB) (name, path string) {
	t.Helper()
	RequireRoot(t)
	name = Name()
	if err := netnsutil.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netnsutil.Delete(name); err != nil {
			t.Error(err)
		}
	})
	return name, netnsutil.Path(name)
}
