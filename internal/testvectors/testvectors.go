// Package testvectors holds the captures of real Linux rxe traffic that
// tests check taproce's wire format against: testdata/ here, a copy of
// shared/vectors (regenerated there by shared/peer/make-vectors.sh), so
// the tests run on a clone of the repository alone. TAPROCE_VECTORS names
// another directory to use instead.
package testvectors

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/taproce/taproce/appliance/capture"
)

// EnvDir names the environment variable that overrides the vectors
// directory.
const EnvDir = "TAPROCE_VECTORS"

// dir finds the vectors: EnvDir, else this package's testdata, found from
// the working directory (a test runs in its package's directory) up to
// the module root.
func dir() (string, error) {
	if d := os.Getenv(EnvDir); d != "" {
		if _, err := os.Stat(d); err != nil {
			return "", fmt.Errorf("%s=%s: %w", EnvDir, d, err)
		}
		return d, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			v := filepath.Join(d, "internal", "testvectors", "testdata")
			if _, err := os.Stat(v); err != nil {
				return "", fmt.Errorf("no rxe capture vectors at %s: %w", v, err)
			}
			return v, nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("no module root above " + wd)
		}
	}
}

// Dir returns the vectors directory; it fails the test when there is none.
func Dir(t testing.TB) string {
	t.Helper()
	d, err := dir()
	if err != nil {
		t.Fatal(err)
	}
	return d
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

// Frames returns the data of every frame of every capture, or nil when
// the vectors cannot be found: fuzz targets seed their corpus with them.
func Frames() [][]byte {
	dir, err := dir()
	if err != nil {
		return nil
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
