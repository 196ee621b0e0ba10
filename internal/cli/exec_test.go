package cli

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/taproce/taproce/internal/ibvlib"
)

// TestExecErrors: what keeps `taproce exec` from running a program is
// said in one place, with the way out — no program (usage, exit 2), no
// library of taproce's where it looked (where, and how to get one), no
// such program, no appliance (where it looked, how to start one) — exit 1.
func TestExecErrors(t *testing.T) {
	wd, _ := os.Getwd()
	top, ok := ibvlib.Checkout(wd)
	if !ok {
		t.Fatal("not in a taproce checkout")
	}
	found, err := ibvlib.Build(context.Background(), top, nil)
	if errors.Is(err, ibvlib.ErrNoToolchain) {
		t.Skipf("taproce's libibverbs.so.1 cannot be built here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	lib := found.Dir
	t.Setenv("TAPROCE_LIBDIR", "")
	// runon.Exec points the verbs library at --socket through the
	// environment: restored after the test.
	t.Setenv("TAPROCE_SOCKET", os.Getenv("TAPROCE_SOCKET"))
	nowhere := filepath.Join(t.TempDir(), "none.sock")
	for _, c := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"exec"}, 2, []string{"taproce exec: no program to run\n", "Usage: taproce exec"}},
		{[]string{"exec", "--lib", t.TempDir(), "true"}, 1,
			[]string{"taproce exec: ibvlib: no taproce libibverbs.so.1 in ", "make -C verbs/libibverbs install", "make -C verbs/librdmacm install", "--lib DIR"}},
		{[]string{"exec", "--lib", lib, "--no-sysfs", "no-such-program-here"}, 1,
			[]string{"taproce exec: exec: \"no-such-program-here\": executable file not found"}},
		{[]string{"exec", "--lib", lib, "--socket", nowhere, "true"}, 1,
			[]string{"taproce exec: no appliance is listening at " + nowhere, applianceHint}},
	} {
		code, out, errOut := runCmd(c.args...)
		if code != c.code || out != "" {
			t.Errorf("taproce %q: exit %d, stdout %q; want %d and nothing", c.args, code, out, c.code)
		}
		for _, w := range c.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("taproce %q: stderr lacks %q:\n%s", c.args, w, errOut)
			}
		}
	}
	// A program linked to librdmacm.so.1, run on a directory with
	// taproce's libibverbs.so.1 alone: a warning says it will get
	// rdma-core's librdmacm; on the directory where both were built, none.
	if rping, err := exec.LookPath("rping"); err == nil {
		ibvOnly := t.TempDir()
		data, err := os.ReadFile(filepath.Join(lib, ibvlib.Name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ibvOnly, ibvlib.Name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		warning := "is linked to librdmacm.so.1, which " + ibvOnly + " lacks"
		if _, err := os.Stat(filepath.Join(lib, ibvlib.RDMACMName)); err != nil {
			t.Fatalf("%s was not built beside %s: %v", ibvlib.RDMACMName, ibvlib.Name, err)
		}
		for _, c := range []struct {
			dir  string
			warn bool
		}{{ibvOnly, true}, {lib, false}} {
			code, _, errOut := runCmd("exec", "--lib", c.dir, "--socket", nowhere, rping, "-v")
			if code != 1 || strings.Contains(errOut, "is linked to") != c.warn || c.warn && !strings.Contains(errOut, warning) ||
				c.warn && !strings.Contains(errOut, "make -C verbs/librdmacm install") {
				t.Errorf("taproce exec --lib %s rping: exit %d, warning %v expected:\n%s", c.dir, code, c.warn, errOut)
			}
		}
	}
	if code, _, errOut := runCmd("exec", "-h"); code != 0 || !strings.Contains(errOut, "LD_LIBRARY_PATH=/usr/local/lib/taproce TAPROCE_SOCKET=") {
		t.Errorf("taproce exec -h: exit %d, %s", code, errOut)
	}
}
