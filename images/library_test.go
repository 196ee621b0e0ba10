package images

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taproce/taproce/internal/ibvlib"
)

// Where the image and the DaemonSet put taproce's libibverbs.so.1:
// imageLib in the image (the entrypoint's -lib default), entrypointLibDir
// the node's NodeLibDir as the DaemonSet mounts it (-lib-dir's default).
const (
	imageLib         = "/usr/lib/taproce/libibverbs.so.1"
	entrypointLibDir = "/host/opt/taproce/lib"
)

var (
	cBuildOnce sync.Once
	cBuildRoot string // removed by TestMain
	cBuiltDir  string
	cBuildErr  error
	cBuildSkip string
)

// dockerignore returns the patterns of the repository's .dockerignore.
func dockerignore(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var pats []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			pats = append(pats, strings.TrimPrefix(l, "/"))
		}
	}
	return pats
}

// ignored reports whether the build context leaves out rel (a path
// relative to the repository) under the patterns: rel or a directory
// above it matches one (a "**/" pattern matching at any depth).
func ignored(pats []string, rel string) bool {
	for p := rel; p != "." && p != "/"; p = filepath.Dir(p) {
		for _, pat := range pats {
			if ok, _ := filepath.Match(pat, p); ok {
				return true
			}
			if base, ok := strings.CutPrefix(pat, "**/"); ok {
				if ok, _ := filepath.Match(base, filepath.Base(p)); ok {
					return true
				}
			}
		}
	}
	return false
}

// copyContext copies the build context's src (relative to the
// repository) to dst, as a COPY of the Dockerfile does: what
// .dockerignore leaves out is not copied.
func copyContext(pats []string, src, dst string) error {
	return filepath.WalkDir(filepath.Join("..", src), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("..", path)
		if ignored(pats, rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		out := filepath.Join(dst, strings.TrimPrefix(rel, filepath.Clean(src)))
		if d.IsDir() {
			return os.MkdirAll(out, 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(out, data, 0o644)
	})
}

// cBuild runs the library's stage of the Dockerfile as written: its
// COPYs from the build context (minus what .dockerignore leaves out)
// into a temporary WORKDIR, then its RUNs there with /out/ replaced by a
// temporary directory, which it returns. The RUN that installs packages
// is not run here (it would install them on this machine): the test is
// skipped when this machine lacks what it installs (scripts/setup
// installs it).
func cBuild(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the image's library; not in -short")
	}
	cBuildOnce.Do(func() {
		if err := ibvlib.Toolchain(); err != nil {
			cBuildSkip = err.Error()
			return
		}
		root, err := os.MkdirTemp("", "taproce-image-lib-")
		if err != nil {
			cBuildErr = err
			return
		}
		cBuildRoot = root
		out := filepath.Join(root, "out")
		ins := parseDockerfile(t)
		named, _ := stages(ins)
		pats := dockerignore(t)
		work := filepath.Join(root, "ctx")
		ran := 0
		for _, in := range ins {
			if in.stage != named[cStage] {
				continue
			}
			switch in.cmd {
			case "WORKDIR":
				work = filepath.Join(root, "ctx", in.args)
			case "COPY":
				f := strings.Fields(in.args)
				if strings.HasPrefix(f[0], "--") || len(f) != 2 {
					cBuildErr = fmt.Errorf("Dockerfile line %d: COPY %s: not a plain copy from the context", in.line, in.args)
					return
				}
				if err := copyContext(pats, f[0], filepath.Join(work, f[1])); err != nil {
					cBuildErr = fmt.Errorf("Dockerfile line %d: %w", in.line, err)
					return
				}
			case "RUN":
				if strings.Contains(in.args, "apt-get") {
					continue
				}
				if _, err := os.Stat(filepath.Join(work, "verbs/libibverbs/build")); err == nil {
					cBuildErr = errors.New("the library's build directory of the work tree was copied into the build: the image would ship it")
					return
				}
				cmd := exec.Command("sh", "-ec", strings.ReplaceAll(in.args, "/out/", out+"/"))
				cmd.Dir = work
				if b, err := cmd.CombinedOutput(); err != nil {
					cBuildErr = fmt.Errorf("Dockerfile line %d: %w\n%s", in.line, err, b)
					return
				}
				ran++
			}
		}
		if ran == 0 {
			cBuildErr = fmt.Errorf("the Dockerfile's %s stage runs nothing", cStage)
		}
		cBuiltDir = out
	})
	if cBuildSkip != "" {
		t.Skip(cBuildSkip)
	}
	if cBuildErr != nil {
		t.Fatal(cBuildErr)
	}
	return cBuiltDir
}

// TestImageLibrary: the Dockerfile's library stage, run as written,
// builds taproce's libibverbs.so.1 — a shared object with rdma-core's
// soname and every symbol of symbols.txt at its version, needing only
// libc — which the runtime stage copies where the entrypoint's -lib
// looks for it, and which Debian's ibv_devices loads instead of
// rdma-core's: it connects to TAPROCE_SOCKET.
func TestImageLibrary(t *testing.T) {
	_, runtimeStage := stages(parseDockerfile(t))
	copied := false
	for _, in := range parseDockerfile(t) {
		if in.stage == runtimeStage && in.cmd == "COPY" && in.args == "--from="+cStage+" /out/libibverbs.so.1 "+imageLib {
			copied = true
		}
	}
	if !copied {
		t.Errorf("the runtime stage does not copy the library to %s", imageLib)
	}
	out := cBuild(t)
	path := filepath.Join(out, "libibverbs.so.1")
	if err := ibvlib.Check(path); err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if libs, _ := f.ImportedLibraries(); !slices.Equal(libs, []string{"libc.so.6"}) {
		t.Errorf("needs %v, want libc.so.6 alone", libs)
	}
	for _, tag := range []elf.DynTag{elf.DT_RPATH, elf.DT_RUNPATH} {
		if v, _ := f.DynString(tag); len(v) > 0 {
			t.Errorf("%v %v: the library would look for others in the build's directories", tag, v)
		}
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range syms {
		if s.Section == elf.SHN_UNDEF || !strings.HasPrefix(s.Version, "IBVERBS") {
			continue
		}
		v := s.Version
		if s.VersionIndex.IsHidden() {
			v = "(" + v + ")"
		}
		got = append(got, v+" "+s.Name)
	}
	data, err := os.ReadFile("../verbs/libibverbs/symbols.txt")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		want = append(want, strings.Join(strings.Fields(l), " "))
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("exports %d versioned symbols, symbols.txt lists %d; they differ", len(got), len(want))
	}

	// Debian's ibv_devices on it: it asks the socket for the devices.
	tool, err := exec.LookPath("ibv_devices")
	if err != nil {
		t.Skipf("no ibv_devices to load it (ibverbs-utils; scripts/setup installs it): %v", err)
	}
	sock := filepath.Join(t.TempDir(), "taproce.sock")
	ln, err := net.Listen("unixpacket", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	cmd := exec.Command(tool)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+out, "TAPROCE_SOCKET="+sock)
	b, _ := cmd.CombinedOutput() // the stand-in socket answers nothing: an error
	select {
	case err := <-accepted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("ibv_devices never connected to TAPROCE_SOCKET: it did not load the image's library\n%s", b)
	}
}
