package runon

import (
	"slices"
	"testing"
)

// TestEnv: the library's directory comes first on LD_LIBRARY_PATH, the
// socket replaces any other, the rest of the environment is kept.
func TestEnv(t *testing.T) {
	got := Env([]string{"PATH=/bin", "LD_LIBRARY_PATH=/opt/lib", "TAPROCE_SOCKET=/old", "HOME=/root"}, "/lib/taproce", "/run/t.sock")
	want := []string{"PATH=/bin", "HOME=/root", "LD_LIBRARY_PATH=/lib/taproce:/opt/lib", "TAPROCE_SOCKET=/run/t.sock"}
	if !slices.Equal(got, want) {
		t.Fatalf("Env = %q, want %q", got, want)
	}
	got = Env([]string{"LD_LIBRARY_PATH="}, "/l", "/s")
	if want := []string{"LD_LIBRARY_PATH=/l", "TAPROCE_SOCKET=/s"}; !slices.Equal(got, want) {
		t.Fatalf("Env = %q, want %q", got, want)
	}
}
