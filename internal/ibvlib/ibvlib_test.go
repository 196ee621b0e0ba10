package ibvlib

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

var (
	builtOnce sync.Once
	built     Found
	builtErr  error
)

// checkout returns this repository's top directory.
func checkout(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	top, ok := Checkout(filepath.Dir(file))
	if !ok {
		t.Fatalf("no checkout above %s", file)
	}
	return top
}

// library builds the library in this checkout once, skipping the test
// without the toolchain.
func library(t *testing.T) Found {
	t.Helper()
	top := checkout(t)
	builtOnce.Do(func() { built, builtErr = Build(context.Background(), top, nil) })
	if errors.Is(builtErr, ErrNoToolchain) {
		t.Skip(builtErr)
	}
	if builtErr != nil {
		t.Fatal(builtErr)
	}
	return built
}

// install copies the library into dir.
func install(t *testing.T, lib Found, dir string) {
	t.Helper()
	data, err := os.ReadFile(lib.Path())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, Name), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestFindOrder: a flag's directory, then $TAPROCE_LIBDIR, each alone;
// otherwise ../lib/taproce beside the executable before the system
// directories, in their order.
func TestFindOrder(t *testing.T) {
	lib := library(t)
	root := t.TempDir()
	exe := filepath.Join(root, "release", "bin", "taproce")
	beside := filepath.Join(root, "release", "lib", "taproce")
	local, system := filepath.Join(root, "usr-local"), filepath.Join(root, "usr")
	flagDir, envDir := filepath.Join(root, "flag"), filepath.Join(root, "env")
	old := SystemDirs
	SystemDirs = []string{local, system}
	defer func() { SystemDirs = old }()

	find := func(dir, env string) (Found, error) {
		t.Setenv(EnvDir, env)
		return Find(dir, exe)
	}
	// Nothing anywhere: every place is named.
	_, err := find("", "")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), beside) || !strings.Contains(err.Error(), system) {
		t.Fatalf("nothing installed: %v", err)
	}
	for _, c := range []struct {
		install    string
		dir, env   string
		want, from string
	}{
		{system, "", "", system, "installed"},
		{local, "", "", local, "installed"},
		{beside, "", "", beside, "beside " + exe},
		{envDir, "", envDir, envDir, "$TAPROCE_LIBDIR"},
		{flagDir, flagDir, envDir, flagDir, "--lib"},
	} {
		install(t, lib, c.install)
		f, err := find(c.dir, c.env)
		if err != nil || f.Dir != c.want || f.From != c.from || f.Path() != filepath.Join(c.want, Name) {
			t.Errorf("installed up to %s: %+v, %v; want %s (%s)", c.install, f, err, c.want, c.from)
		}
	}
	// A named directory without the library is not passed over for
	// another that has one.
	for _, c := range []struct{ dir, env, from string }{{filepath.Join(root, "empty"), "", "--lib"}, {"", filepath.Join(root, "empty"), "$TAPROCE_LIBDIR"}} {
		if f, err := find(c.dir, c.env); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), c.from) {
			t.Errorf("an empty %s: %+v, %v", c.from, f, err)
		}
	}
}

// TestFindRefusesOthers: rdma-core's libibverbs.so.1, or any file of the
// name that is not taproce's, is refused, not taken.
func TestFindRefusesOthers(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, Name), []byte("not ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Find(dir, ""); err == nil || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "not a shared library") {
		t.Errorf("a text file: %v", err)
	}
	for _, sys := range []string{"/usr/lib/x86_64-linux-gnu/libibverbs.so.1", "/usr/lib/aarch64-linux-gnu/libibverbs.so.1"} {
		if _, err := os.Stat(sys); err != nil {
			continue
		}
		if _, err := Find(filepath.Dir(sys), ""); err == nil || !strings.Contains(err.Error(), "not taproce's library") {
			t.Errorf("rdma-core's %s: %v", sys, err)
		}
	}
}

// TestCheckout: a directory inside the repository leads to its top; one
// outside does not, nor does a go.mod of another module.
func TestCheckout(t *testing.T) {
	top := checkout(t)
	if got, ok := Checkout(filepath.Join(top, "verbs", "libibverbs", "ibvtest")); !ok || got != top {
		t.Errorf("from ibvtest: %q %v, want %s", got, ok, top)
	}
	other := t.TempDir()
	if err := os.MkdirAll(filepath.Join(other, "verbs", "libibverbs"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(other, "verbs", "libibverbs", "Makefile"), nil, 0o644)
	os.WriteFile(filepath.Join(other, "go.mod"), []byte("module example.com/other\n"), 0o644)
	if got, ok := Checkout(filepath.Join(other, "verbs")); ok {
		t.Errorf("another module taken for a checkout: %s", got)
	}
}

// TestBuild: make in the checkout gives taproce's library, which Check
// accepts.
func TestBuild(t *testing.T) {
	lib := library(t)
	if !strings.HasPrefix(lib.From, "built in ") || filepath.Base(lib.Dir) != "build" {
		t.Errorf("built: %+v", lib)
	}
	if err := Check(lib.Path()); err != nil {
		t.Error(err)
	}
	if RDMACMToolchain() != nil {
		return
	}
	if err := Check(filepath.Join(lib.Dir, RDMACMName)); err != nil {
		t.Errorf("librdmacm.so.1 beside it: %v", err)
	}
}

// TestCheckNames: Check takes each of taproce's libraries under its own
// name only — one under the other's name has the wrong soname, and a
// name that is none of Names is refused before the file is read — and
// refuses rdma-core's of each name.
func TestCheckNames(t *testing.T) {
	lib := library(t)
	if err := RDMACMToolchain(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	for _, c := range []struct{ from, as, want string }{
		{Name, Name, ""},
		{RDMACMName, RDMACMName, ""},
		{Name, RDMACMName, `soname ["libibverbs.so.1"], want librdmacm.so.1`},
		{RDMACMName, Name, `soname ["librdmacm.so.1"], want libibverbs.so.1`},
		{Name, "libibverbs.so", "none of taproce's libraries"},
	} {
		data, err := os.ReadFile(filepath.Join(lib.Dir, c.from))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, c.as)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		err = Check(path)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s as %s: %v, want %q", c.from, c.as, err, c.want)
		}
	}
	for _, name := range Names {
		sys := filepath.Join("/usr/lib/x86_64-linux-gnu", name)
		if _, err := os.Stat(sys); err != nil {
			continue
		}
		if err := Check(sys); err == nil || !strings.Contains(err.Error(), "not taproce's library") {
			t.Errorf("rdma-core's %s: %v", sys, err)
		}
	}
}
