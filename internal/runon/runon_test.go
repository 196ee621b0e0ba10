package runon

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// lib writes a libibverbs.so.1 into dir: taproce's (holding the marker)
// or another.
func lib(t *testing.T, dir string, ours bool) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	body := "\x7fELF rdma-core"
	if ours {
		body += "\x00TAPROCE_SOCKET\x00"
	}
	if err := os.WriteFile(filepath.Join(dir, LibName), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestFindLib: the flag, then the environment, then beside the binary,
// then the default directories; a named directory without taproce's
// library is an error naming it (no looking further), and rdma-core's
// library is never taken for taproce's.
func TestFindLib(t *testing.T) {
	root := t.TempDir()
	flagDir := lib(t, filepath.Join(root, "flag"), true)
	envDir := lib(t, filepath.Join(root, "env"), true)
	beside := lib(t, filepath.Join(root, "prefix", "lib", "taproce"), true)
	exe := filepath.Join(root, "prefix", "bin", "taproce")
	if err := os.MkdirAll(filepath.Dir(exe), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	// A symbolic link to the binary elsewhere: "beside" is beside the
	// binary itself.
	link := filepath.Join(root, "bin", "taproce")
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(exe, link); err != nil {
		t.Fatal(err)
	}
	def1, def2 := filepath.Join(root, "usr-local"), lib(t, filepath.Join(root, "usr"), true)
	lib(t, def1, false) // rdma-core's, not ours
	old := DefaultLibDirs
	DefaultLibDirs = []string{def1, def2}
	t.Cleanup(func() { DefaultLibDirs = old })
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == LibDirEnv {
				return v
			}
			return ""
		}
	}
	for _, c := range []struct {
		name      string
		flag, env string
		exe       string
		want      string
		wantTried []string
	}{
		{name: "flag first", flag: flagDir, env: envDir, exe: link, want: flagDir},
		{name: "environment next", env: envDir, exe: link, want: envDir},
		{name: "beside the binary", exe: link, want: beside},
		{name: "the default directories, skipping rdma-core's library", exe: "", want: def2},
		{name: "a flag without the library", flag: filepath.Join(root, "nothing"), env: envDir, exe: link,
			wantTried: []string{filepath.Join(root, "nothing")}},
		{name: "an environment naming rdma-core's", env: def1, exe: link, wantTried: []string{def1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := FindLib(c.flag, env(c.env), c.exe)
			if c.wantTried == nil {
				if err != nil || got != c.want {
					t.Fatalf("FindLib = %q, %v; want %q", got, err, c.want)
				}
				return
			}
			var nl *NoLibError
			if !errors.As(err, &nl) || !slices.Equal(nl.Tried, c.wantTried) {
				t.Fatalf("FindLib = %q, %v; want a NoLibError having tried %q", got, err, c.wantTried)
			}
			for _, want := range append(c.wantTried, "make -C verbs/libibverbs install", "--lib DIR", LibDirEnv) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q:\n%v", want, err)
				}
			}
		})
	}
	// Nothing anywhere: every directory is named, with what was wrong.
	DefaultLibDirs = []string{def1, filepath.Join(root, "none")}
	_, err := FindLib("", env(""), filepath.Join(root, "other", "bin", "taproce"))
	for _, want := range []string{filepath.Join(root, "other", "lib", "taproce"), "not taproce's", filepath.Join(root, "none"), "no " + LibName} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}

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
