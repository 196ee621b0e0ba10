package images

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/taproce/taproce/internal/ibvlib"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	line  int
	cmd   string // upper case: FROM, RUN, …
	args  string
	stage int // index of the FROM it belongs to
}

// parseDockerfile reads the repository's Dockerfile.
func parseDockerfile(t *testing.T) []instruction {
	t.Helper()
	f, err := os.Open("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []instruction
	var cur strings.Builder
	start, stage := 0, -1
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		trimmed := strings.TrimSpace(l)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur.Len() > 0 && strings.HasPrefix(trimmed, "#") {
			continue // a comment inside a continued instruction
		}
		if cur.Len() == 0 {
			start = n
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cur.WriteString(s)
			continue
		}
		cur.WriteString(l)
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		cmd, args, _ := strings.Cut(text, " ")
		cmd = strings.ToUpper(cmd)
		if cmd == "FROM" {
			stage++
		}
		out = append(out, instruction{line: start, cmd: cmd, args: strings.TrimSpace(args), stage: stage})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// argDefaults returns the defaults of the Dockerfile's ARGs (global and
// per stage; a later one wins).
func argDefaults(ins []instruction) map[string]string {
	m := map[string]string{}
	for _, in := range ins {
		if in.cmd == "ARG" {
			if k, v, ok := strings.Cut(in.args, "="); ok {
				m[k] = strings.Trim(v, `"`)
			}
		}
	}
	return m
}

// Stages of the Dockerfile, by name: the Go build, the library's build
// (cbuild); the runtime stage is the last, unnamed.
const (
	goStage = "build"
	cStage  = "cbuild"
)

// stages returns the index of each named stage, and the runtime stage's
// (the last).
func stages(ins []instruction) (named map[string]int, runtime int) {
	named = map[string]int{}
	for _, in := range ins {
		if in.cmd != "FROM" {
			continue
		}
		f := strings.Fields(in.args)
		if len(f) == 3 && strings.EqualFold(f[1], "AS") {
			named[f[2]] = in.stage
		}
		runtime = in.stage
	}
	return named, runtime
}

// baseImage returns a FROM's image with a build argument's default put
// in.
func baseImage(in instruction, args map[string]string) string {
	image := strings.Fields(in.args)[0]
	if v, ok := strings.CutPrefix(image, "${"); ok {
		image = args[strings.TrimSuffix(v, "}")]
	}
	return image
}

// TestDockerfileReview checks by hand what hadolint would, and what this
// image needs: pinned base images (no latest), a Go build stage that
// downloads modules before copying the sources, a Debian bookworm stage
// for the library that installs packages only when its base lacks them
// (without recommends, leaving no package lists), no ADD, exec-form
// ENTRYPOINT, an explicit USER in the runtime stage, and a Go builder of
// the version go.mod asks for.
func TestDockerfileReview(t *testing.T) {
	ins := parseDockerfile(t)
	args := argDefaults(ins)
	named, runtimeStage := stages(ins)
	var froms []instruction
	order := map[string]int{}
	for i, in := range ins {
		switch in.cmd {
		case "FROM":
			froms = append(froms, in)
		case "ADD":
			t.Errorf("line %d: ADD; use COPY", in.line)
		case "MAINTAINER":
			t.Errorf("line %d: MAINTAINER is deprecated", in.line)
		case "RUN":
			if strings.Contains(in.args, "apt-get") || strings.Contains(in.args, "apk ") {
				switch {
				case in.stage != named[cStage]:
					t.Errorf("line %d: installs packages; only the library's stage may", in.line)
				case !strings.HasPrefix(in.args, "if ! {"):
					t.Errorf("line %d: installs packages even when the base image has them", in.line)
				case !strings.Contains(in.args, "--no-install-recommends") || !strings.Contains(in.args, "rm -rf /var/lib/apt/lists/*"):
					t.Errorf("line %d: apt-get install without --no-install-recommends or leaving the lists", in.line)
				}
			}
			if strings.Contains(in.args, "go mod download") {
				order["download"] = i
			}
		case "COPY":
			if strings.HasPrefix(in.args, "go.mod go.sum") {
				order["copy mod"] = i
			}
			if strings.HasPrefix(in.args, ". .") {
				order["copy all"] = i
			}
		case "ENTRYPOINT", "CMD":
			if !strings.HasPrefix(in.args, "[") {
				t.Errorf("line %d: %s in shell form; the runtime image has no shell", in.line, in.cmd)
			}
		}
	}
	if !(order["copy mod"] < order["download"] && order["download"] < order["copy all"]) {
		t.Errorf("the module download is not cached apart from the sources: %v", order)
	}
	if len(froms) != 3 {
		t.Fatalf("%d stages, want the Go build, the library's build and a runtime image", len(froms))
	}
	if _, ok := named[goStage]; !ok {
		t.Fatalf("no stage named %s", goStage)
	}
	if _, ok := named[cStage]; !ok {
		t.Fatalf("no stage named %s", cStage)
	}
	for _, in := range froms[:2] {
		builder := strings.Fields(in.args)
		image := baseImage(in, args)
		if !strings.Contains(image, ":") || strings.HasSuffix(image, ":latest") || len(builder) != 3 || builder[1] != "AS" {
			t.Errorf("builder %q (%q): want a tagged image AS a named stage", in.args, image)
		}
	}
	// The library is built against bookworm's glibc: the pods' images
	// (the perftest image is bookworm) must have that glibc or a later one.
	if image := baseImage(froms[named[cStage]], args); !strings.HasSuffix(image, ":bookworm") {
		t.Errorf("the library's builder %s is not Debian bookworm", image)
	}
	image := baseImage(froms[named[goStage]], args)
	data, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(data)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	goMinor := string(m[1])
	if !regexp.MustCompile(`golang:` + regexp.QuoteMeta(goMinor) + `\b`).MatchString(image) {
		t.Errorf("builder %s is not Go %s, which go.mod asks for", image, goMinor)
	}
	runtime := froms[runtimeStage].args
	if runtime != "scratch" && !strings.HasPrefix(runtime, "gcr.io/distroless/static") {
		t.Errorf("runtime image %s: want scratch or distroless static", runtime)
	}
	hasUser := false
	for _, in := range ins {
		if in.stage == runtimeStage && in.cmd == "USER" {
			hasUser = true
		}
	}
	if !hasUser {
		t.Error("the runtime stage does not say which user it runs as")
	}
}

// TestImageBuilderPackages: the local builder scripts/image makes with
// debootstrap has every package the Dockerfile's libraries' stage
// installs when its base lacks one (librdmacm-dev for librdmacm.so.1
// among them), and that stage installs them when the headers of either
// library are missing: a builder made by scripts/image builds both
// libraries without Debian's archive.
func TestImageBuilderPackages(t *testing.T) {
	ins := parseDockerfile(t)
	named, _ := stages(ins)
	var pkgs []string
	var cond string
	for _, in := range ins {
		if in.stage != named[cStage] || in.cmd != "RUN" || !strings.Contains(in.args, "apt-get install") {
			continue
		}
		cond, _, _ = strings.Cut(in.args, "then")
		_, rest, _ := strings.Cut(in.args, "--no-install-recommends")
		list, _, _ := strings.Cut(rest, "&&")
		pkgs = strings.Fields(list)
	}
	if !slices.Contains(pkgs, "libibverbs-dev") || !slices.Contains(pkgs, "librdmacm-dev") {
		t.Fatalf("the libraries' stage installs %v: not libibverbs-dev and librdmacm-dev", pkgs)
	}
	for _, h := range []string{"/usr/include/infiniband/verbs.h", "/usr/include/rdma/rdma_cma.h"} {
		if !strings.Contains(cond, "test -e "+h) {
			t.Errorf("the libraries' stage does not install its packages when %s is missing: %s", h, cond)
		}
	}
	data, err := os.ReadFile("../scripts/image")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`debootstrap [^\n]*--include=(\S+)`).FindSubmatch(data)
	if m == nil {
		t.Fatal("scripts/image runs no debootstrap --include=")
	}
	include := strings.Split(string(m[1]), ",")
	for _, p := range pkgs {
		if !slices.Contains(include, p) {
			t.Errorf("scripts/image's builder lacks %s (it includes %v), which the Dockerfile's %s stage needs", p, include, cStage)
		}
	}
}

// binaries are the programs the image holds.
var binaries = []string{"taproce", "taproce-cni", "taproce-entrypoint"}

var (
	buildOnce sync.Once
	builtDir  string
	buildErr  error
)

// dockerBuild runs the go build commands of the Dockerfile's build stage
// exactly as written, with the ENV of that stage, VERSION=test-1.2.3 and
// /out replaced by a temporary directory, in the repository (which the
// Dockerfile copies to its WORKDIR). It returns the directory.
func dockerBuild(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the image's binaries; not in -short")
	}
	buildOnce.Do(func() {
		builtDir, buildErr = os.MkdirTemp("", "taproce-image-")
		if buildErr != nil {
			return
		}
		ins := parseDockerfile(t)
		named, _ := stages(ins)
		env := append(os.Environ(), "VERSION=test-1.2.3")
		ran := 0
		for _, in := range ins {
			if in.stage != named[goStage] {
				continue
			}
			if in.cmd == "ENV" {
				env = append(env, strings.Fields(in.args)...)
			}
			if in.cmd != "RUN" || !strings.Contains(in.args, "go build") {
				continue
			}
			script := strings.ReplaceAll(in.args, "/out/", builtDir+"/")
			cmd := exec.Command("sh", "-ec", script)
			cmd.Dir = ".."
			cmd.Env = env
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("Dockerfile line %d: %w\n%s", in.line, err, out)
				return
			}
			ran++
		}
		if ran == 0 {
			buildErr = errors.New("the Dockerfile has no RUN with go build")
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, dir := range []string{builtDir, cBuildRoot} {
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

// TestImageBinaries: the Dockerfile's commands build the three programs
// the image copies, as static executables (no program interpreter, no
// shared libraries: they run on an empty base image), with the version
// stamped in.
func TestImageBinaries(t *testing.T) {
	dir := dockerBuild(t)
	// The runtime stage copies exactly these.
	var copied []string
	ins := parseDockerfile(t)
	_, runtimeStage := stages(ins)
	for _, in := range ins {
		if in.stage == runtimeStage && in.cmd == "COPY" && strings.HasPrefix(in.args, "--from="+goStage+" ") {
			f := strings.Fields(in.args)
			for _, src := range f[1 : len(f)-1] {
				copied = append(copied, filepath.Base(src))
			}
		}
	}
	slices.Sort(copied)
	if !slices.Equal(copied, binaries) {
		t.Errorf("the runtime stage copies %v, want %v", copied, binaries)
	}
	for _, name := range binaries {
		path := filepath.Join(dir, name)
		f, err := elf.Open(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s has a program interpreter: it is dynamically linked", name)
			}
			if p.Type == elf.PT_DYNAMIC {
				t.Errorf("%s has a dynamic section", name)
			}
		}
		if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
			t.Errorf("%s needs shared libraries %v", name, libs)
		}
		if f.Section(".symtab") != nil {
			t.Errorf("%s keeps its symbol table: -s was not applied", name)
		}
		f.Close()
	}

	out, err := exec.Command(filepath.Join(dir, "taproce"), "--version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "taproce test-1.2.3" {
		t.Errorf("taproce --version: %q, %v", out, err)
	}
	out, err = exec.Command(filepath.Join(dir, "taproce-entrypoint"), "-version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "taproce-entrypoint test-1.2.3" {
		t.Errorf("taproce-entrypoint -version: %q, %v", out, err)
	}
	cmd := exec.Command(filepath.Join(dir, "taproce-cni"))
	cmd.Env = []string{"CNI_COMMAND=VERSION"}
	cmd.Stdin = strings.NewReader(`{"cniVersion": "1.1.0"}`)
	out, err = cmd.Output()
	var ver struct {
		Supported []string `json:"supportedVersions"`
	}
	if err != nil || json.Unmarshal(out, &ver) != nil || !slices.Contains(ver.Supported, "1.1.0") {
		t.Errorf("taproce-cni VERSION: %q, %v", out, err)
	}
}

// entrypointDefaults returns the defaults of the entrypoint's flags, as
// its -h prints them.
func entrypointDefaults(t *testing.T, bin string) map[string]string {
	t.Helper()
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	m := map[string]string{}
	re := regexp.MustCompile(`(?m)^  -([a-z-]+)(?: \S+)?\n\s+\t.*\(default "([^"]*)"\)$`)
	for _, f := range re.FindAllStringSubmatch(string(out), -1) {
		m[f[1]] = f[2]
	}
	if len(m) == 0 {
		t.Fatalf("no defaults in the entrypoint's help:\n%s", out)
	}
	return m
}

// TestDaemonSetArgs: the entrypoint, built as the image has it, accepts
// the DaemonSet's arguments; it installs the libraries from the
// directory where the image has each of them into the directory the
// DaemonSet mounts from the node's NodeLibDir, which the DaemonSet does
// not override.
func TestDaemonSetArgs(t *testing.T) {
	dir := dockerBuild(t)
	_, c := applianceContainer(t)
	if c["command"] != nil {
		t.Fatalf("the DaemonSet overrides the image's entrypoint: %v", c["command"])
	}
	args := Strings(c["args"])
	defaults := entrypointDefaults(t, filepath.Join(dir, "taproce-entrypoint"))
	if defaults["lib"] != imageLibDir || defaults["lib-dir"] != entrypointLibDir {
		t.Errorf("the entrypoint installs from %q into %q; the image has the libraries in %s, the DaemonSet mounts %s at %s",
			defaults["lib"], defaults["lib-dir"], imageLibDir, NodeLibDir, entrypointLibDir)
	}
	copies := imageLibs(t)
	for _, name := range ibvlib.Names {
		if _, ok := copies[path.Join(defaults["lib"], name)]; !ok {
			t.Errorf("the entrypoint installs %s from %s, where the image has none (%v)", name, defaults["lib"], copies)
		}
	}
	for _, a := range args {
		if strings.HasPrefix(a, "-lib") || strings.HasPrefix(a, "--lib") {
			t.Errorf("the DaemonSet overrides %s", a)
		}
	}
	// -version first: the flags are parsed, then it prints and exits.
	out, err := exec.Command(filepath.Join(dir, "taproce-entrypoint"), append([]string{"-version"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("taproce-entrypoint %v: %v\n%s", args, err, out)
	}
	// What follows -- goes to `taproce run`; its flags must exist too.
	if i := slices.Index(args, "--"); i >= 0 {
		runArgs := append(append([]string{"run"}, args[i+1:]...), "-h")
		out, err := exec.Command(filepath.Join(dir, "taproce"), runArgs...).CombinedOutput()
		if err != nil {
			t.Fatalf("taproce run %v: %v\n%s", args[i+1:], err, out)
		}
	}
}
