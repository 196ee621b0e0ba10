package runon

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/taproce/taproce/internal/ibvlib"
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

// TestMissingLibs: a program linked to librdmacm.so.1 lacks it in a
// directory holding libibverbs.so.1 alone, not in one holding both; a
// program linked to neither, or not ELF, lacks nothing.
func TestMissingLibs(t *testing.T) {
	var cm string
	for _, p := range []string{"rping", "ib_write_bw", "rdma_server"} {
		if path, err := exec.LookPath(p); err == nil {
			cm = path
			break
		}
	}
	if cm == "" {
		t.Skip("no program linked to librdmacm.so.1 (rdmacm-utils, perftest; scripts/setup installs them)")
	}
	ibvOnly, both := t.TempDir(), t.TempDir()
	for dir, names := range map[string][]string{ibvOnly: {ibvlib.Name}, both: ibvlib.Names} {
		for _, name := range names {
			if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		program, dir string
		want         []string
	}{
		{cm, ibvOnly, []string{ibvlib.RDMACMName}},
		{cm, t.TempDir(), ibvlib.Names},
		{cm, both, nil},
		{sh, ibvOnly, nil},
		{script, ibvOnly, nil},
	} {
		if got := MissingLibs(c.program, c.dir); !slices.Equal(got, c.want) {
			t.Errorf("MissingLibs(%s, %s) = %v, want %v", c.program, c.dir, got, c.want)
		}
	}
}
