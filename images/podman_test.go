package images

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestPodmanBuild builds the image with podman from a clean clone of
// HEAD, as scripts/image does it on this kind of machine (installing
// podman and making the local Go builder image the first time), and
// checks that `taproce --version` runs in it and prints the clone's
// version. It needs root and TAPROCE_IMAGE_TEST=1: the first run takes
// minutes (debootstrap, the module download), later ones a minute or two.
func TestPodmanBuild(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: podman builds and runs the image as root here")
	}
	if os.Getenv("TAPROCE_IMAGE_TEST") != "1" {
		t.Skip("set TAPROCE_IMAGE_TEST=1 to build the image with podman (scripts/image; takes minutes)")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skipf("needs git for a clean clone: %v", err)
	}
	top, err := exec.Command("git", "-C", "..", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout (%v): nothing to clone", err)
	}
	script, err := filepath.Abs("../scripts/image")
	if err != nil {
		t.Fatal(err)
	}

	src := filepath.Join(t.TempDir(), "taproce")
	if out, err := exec.Command("git", "clone", "-q", strings.TrimSpace(string(top)), src).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	desc, err := exec.Command("git", "-C", src, "describe", "--always", "--dirty").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "taproce " + strings.TrimSpace(string(desc))

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, script, src)
	cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":/usr/local/go/bin")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/image: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if got := lines[len(lines)-1]; got != want {
		t.Fatalf("taproce --version in the image printed %q, want %q\n%s", got, want, out)
	}
	for _, l := range lines {
		if regexp.MustCompile(`^image: .* (made|built) in \d+ s$`).MatchString(l) {
			t.Log(l)
		}
	}

	// podman run --rm: no container is left behind.
	ps, err := exec.Command("podman", "--runtime", "runc", "ps", "-a", "-q", "--filter", "ancestor=localhost/taproce:dev").CombinedOutput()
	if err != nil || strings.TrimSpace(string(ps)) != "" {
		t.Errorf("containers of the image left: %q (%v)", ps, err)
	}
	t.Logf("image built from a clean clone and %q printed in %v", want, time.Since(t0).Round(time.Second))
}
