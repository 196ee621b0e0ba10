// Package testvectors finds the captures of real Linux rxe traffic that
// tests check taproce's wire format against (shared/vectors beside the
// repository, or the directory named by TAPROCE_VECTORS).
package testvectors

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/taproce/taproce/appliance/capture"
)

// EnvDir names the environment variable that overrides the vectors
// directory.
const EnvDir = "TAPROCE_VECTORS"

// Dir returns the vectors directory, or skips the test with a message when
// there is none.
func Dir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv(EnvDir); d != "" {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("%s=%s: %v", EnvDir, d, err)
		}
		return d
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	// Walk up to the module root (go.mod) and look beside it.
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			v := filepath.Join(filepath.Dir(d), "shared", "vectors")
			if _, err := os.Stat(v); err != nil {
				t.Skipf("no rxe capture vectors at %s (set %s): %v", v, EnvDir, err)
			}
			return v
		}
		if filepath.Dir(d) == d {
			t.Skipf("no module root above %s; set %s to the rxe capture vectors", wd, EnvDir)
		}
	}
}

// File is one capture and its frames.
type File struct {
	Name   string // base name, e.g. "rxe-send.pcap"
	Path   string
	Frames []capture.Frame
}

// Files reads every *.pcap and *.pcapng in the vectors directory, sorted by
// name. It fails the test when there are none or one does not read.
func Files(t testing.TB) []File {
	t.Helper()
	dir := Dir(t)
	var paths []string
	for _, pat := range []string{"*.pcap", "*.pcapng"} {
		m, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, m...)
	}
	sort.Strings(paths)
	if len(paths) == 0 {
		t.Fatalf("no captures in %s", dir)
	}
	files := make([]File, 0, len(paths))
	for _, p := range paths {
		frames, err := capture.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, File{Name: filepath.Base(p), Path: p, Frames: frames})
	}
	return files
}

// FramesIfPresent returns the data of every frame of every capture, or nil
// when there is no vectors directory. Fuzz targets seed their corpus with
// it and run without it too.
func FramesIfPresent() [][]byte {
	dir := os.Getenv(EnvDir)
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil
		}
		for d := wd; filepath.Dir(d) != d; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				dir = filepath.Join(filepath.Dir(d), "shared", "vectors")
				break
			}
		}
	}
	paths, _ := filepath.Glob(filepath.Join(dir, "*.pcap"))
	var out [][]byte
	for _, p := range paths {
		frames, err := capture.ReadFile(p)
		if err != nil {
			continue
		}
		for _, f := range frames {
			out = append(out, f.Data)
		}
	}
	return out
}
