package images

import (
	"bufio"
	"debug/elf"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taproce/taproce/internal/ibvlib"
)

// Where the image and the DaemonSet put taproce's libraries
// (ibvlib.Names): imageLibDir in the image (the entrypoint's -lib
// default), entrypointLibDir the node's NodeLibDir as the DaemonSet
// mounts it (-lib-dir's default).
const (
	imageLibDir      = "/usr/lib/taproce"
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

// cBuild runs the libraries' stage of the Dockerfile as written: its
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
		if err := ibvlib.RDMACMToolchain(); err != nil {
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
				for _, dir := range []string{"verbs/libibverbs/build", "verbs/librdmacm/build"} {
					if _, err := os.Stat(filepath.Join(work, dir)); err == nil && ran == 0 {
						cBuildErr = fmt.Errorf("the work tree's %s was copied into the build: the image would ship what was built there", dir)
						return
					}
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

// imageLibs returns what the runtime stage copies from the libraries'
// stage: the path in the image of each file, and the file of that stage
// it comes from.
func imageLibs(t *testing.T) map[string]string {
	t.Helper()
	ins := parseDockerfile(t)
	_, runtimeStage := stages(ins)
	m := map[string]string{}
	for _, in := range ins {
		f := strings.Fields(in.args)
		if in.stage != runtimeStage || in.cmd != "COPY" || len(f) < 3 || f[0] != "--from="+cStage {
			continue
		}
		dst := f[len(f)-1]
		for _, src := range f[1 : len(f)-1] {
			if strings.HasSuffix(dst, "/") {
				m[dst+filepath.Base(src)] = src
			} else {
				m[dst] = src
			}
		}
	}
	return m
}

// versionScript returns the "VERSION SYMBOL" lines of a linker version
// script's global symbols and of its versions ("VERSION VERSION", the
// symbol the linker defines for each), as TestImageLibrary lists a
// library's exports.
func versionScript(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAllString(string(data), "")
	var out []string
	version, global := "", false
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasSuffix(l, "{"):
			version, global = strings.TrimSpace(strings.TrimSuffix(l, "{")), false
			out = append(out, version+" "+version)
		case l == "global:":
			global = true
		case l == "local:" || strings.HasPrefix(l, "local:") || strings.HasPrefix(l, "}"):
			global = false
		case global && strings.HasSuffix(l, ";"):
			out = append(out, version+" "+strings.TrimSuffix(l, ";"))
		}
	}
	return out
}

// imageLibrary is what TestImageLibrary expects of each library.
type imageLibrary struct {
	// needs are the libraries it is linked to.
	needs []string
	// exports lists what it exports ("VERSION SYMBOL", "(VERSION)
	// SYMBOL" for a hidden default), given the repository's top.
	exports func(t *testing.T, top string) []string
	// prefix begins the versions of its exports.
	prefix string
}

var imageLibraries = map[string]imageLibrary{
	ibvlib.Name: {needs: []string{"libc.so.6"}, prefix: "IBVERBS", exports: func(t *testing.T, top string) []string {
		data, err := os.ReadFile(filepath.Join(top, "verbs/libibverbs/symbols.txt"))
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			want = append(want, strings.Join(strings.Fields(l), " "))
		}
		return want
	}},
	// librdmacm.so.1 calls libibverbs' API: taproce's, beside it.
	ibvlib.RDMACMName: {needs: []string{"libibverbs.so.1", "libc.so.6"}, prefix: "RDMACM", exports: func(t *testing.T, top string) []string {
		return versionScript(t, filepath.Join(top, "verbs/librdmacm/librdmacm.map"))
	}},
}

// TestImageLibrary: the Dockerfile's libraries' stage, run as written,
// builds taproce's libibverbs.so.1 and librdmacm.so.1 — shared objects
// with rdma-core's sonames and every symbol of symbols.txt and
// librdmacm.map at its version, needing only libc and, for librdmacm,
// libibverbs — which the runtime stage copies into the directory the
// entrypoint's -lib names; Debian's ibv_devices loads the image's
// libibverbs.so.1 instead of rdma-core's (it connects to
// TAPROCE_SOCKET), and the loader gives Debian's rping both of the
// image's libraries.
func TestImageLibrary(t *testing.T) {
	copies := imageLibs(t)
	for _, name := range ibvlib.Names {
		if src := copies[path.Join(imageLibDir, name)]; src != "/out/"+name {
			t.Errorf("the runtime stage does not copy %s to %s (%q)", name, imageLibDir, src)
		}
	}
	if len(copies) != len(ibvlib.Names) {
		t.Errorf("the runtime stage copies %v from %s, want %v", copies, cStage, ibvlib.Names)
	}
	if len(imageLibraries) != len(ibvlib.Names) {
		t.Fatalf("expectations for %d libraries, ibvlib names %d", len(imageLibraries), len(ibvlib.Names))
	}
	out := cBuild(t)
	for _, name := range ibvlib.Names {
		t.Run(name, func(t *testing.T) { checkImageLibrary(t, filepath.Join(out, name), imageLibraries[name]) })
	}
	if t.Failed() {
		return
	}

	// Debian's rping: the loader takes both libraries from the image's
	// directory, librdmacm's libibverbs.so.1 too.
	if rping, err := exec.LookPath("rping"); err != nil {
		t.Logf("no rping to load librdmacm.so.1 (rdmacm-utils; scripts/setup installs it): %v", err)
	} else {
		cmd := exec.Command(rping)
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+out, "LD_TRACE_LOADED_OBJECTS=1")
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s with LD_TRACE_LOADED_OBJECTS: %v\n%s", rping, err, b)
		}
		for _, name := range ibvlib.Names {
			if want := name + " => " + filepath.Join(out, name) + " "; !strings.Contains(string(b), want) {
				t.Errorf("rping does not load the image's %s:\n%s", name, b)
			}
		}
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

// checkImageLibrary checks a library the libraries' stage built against
// what is expected of it.
func checkImageLibrary(t *testing.T, path string, want imageLibrary) {
	if err := ibvlib.Check(path); err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if libs, _ := f.ImportedLibraries(); !slices.Equal(libs, want.needs) {
		t.Errorf("needs %v, want %v", libs, want.needs)
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
		if s.Section == elf.SHN_UNDEF || !strings.HasPrefix(s.Version, want.prefix) {
			continue
		}
		v := s.Version
		if s.VersionIndex.IsHidden() {
			v = "(" + v + ")"
		}
		got = append(got, v+" "+s.Name)
	}
	exports := want.exports(t, "..")
	slices.Sort(got)
	slices.Sort(exports)
	if len(exports) == 0 || !slices.Equal(got, exports) {
		t.Errorf("exports %d versioned symbols, want %d; they differ:\n%v\n%v", len(got), len(exports), got, exports)
	}
}
