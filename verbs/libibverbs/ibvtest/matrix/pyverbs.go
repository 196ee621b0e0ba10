package matrix

import (
	_ "embed"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Python is Debian's python3, which python3-pyverbs is for.
const Python = "/usr/bin/python3"

// pyverbsRC is a user's program in Python on rdma-core's bindings: an RC
// QP between a server and its client, each on a device of its own,
// moving data by SEND with immediate, RDMA WRITE, RDMA READ and
// FETCH_ADD, each checked at both ends (its docstring says how).
//
//go:embed pyverbs_rc.py
var pyverbsRC []byte

// PyverbsRC writes the pyverbs program into the test's temporary
// directory and returns its path, after skipping the test when Python
// has no pyverbs. Each side takes -d DEVICE -g GID_INDEX -p TCP_PORT, the
// client the server's address after them; each prints "ok" alone when
// every check of its own held.
func PyverbsRC(t testing.TB) string {
	t.Helper()
	if out, err := exec.Command(Python, "-c", "import pyverbs.device").CombinedOutput(); err != nil {
		t.Skipf("%s has no pyverbs (python3-pyverbs; scripts/setup installs it): %v\n%s", Python, err, out)
	}
	path := filepath.Join(t.TempDir(), "pyverbs_rc.py")
	if err := os.WriteFile(path, pyverbsRC, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
