// Package ibvlib finds taproce's libibverbs.so.1 (verbs/libibverbs), the
// library that runs unmodified ibverbs programs on taproce when the
// dynamic loader takes it instead of rdma-core's (LD_LIBRARY_PATH), and
// with it the directory where taproce's librdmacm.so.1
// (verbs/librdmacm), for programs that connect with the RDMA CM, goes
// beside it.
//
// The places looked in, in order, are those `taproce exec` uses, so that
// the lab runs programs on the library a user's programs get:
//
//  1. a directory the user names (a flag), then $TAPROCE_LIBDIR: when
//     either is given it is the only place looked in, since a choice
//     the user made is not second-guessed;
//  2. ../lib/taproce beside the taproce executable (an unpacked
//     release: bin/taproce, lib/taproce/libibverbs.so.1);
//  3. /usr/local/lib/taproce, then /usr/lib/taproce (`make install`,
//     packages; the image's /usr/lib/taproce).
//
// A source checkout can build the library (Build) where none is found.
package ibvlib

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Name is the library's file name: the soname programs are linked to.
const Name = "libibverbs.so.1"

// RDMACMName is the file name of taproce's librdmacm.so.1, which goes in
// the same directory as Name.
const RDMACMName = "librdmacm.so.1"

// Names are the file names of taproce's libraries, each its soname, in
// the order they are built and installed: what a directory of them
// holds (the image's /usr/lib/taproce, the node's /opt/taproce/lib).
var Names = []string{Name, RDMACMName}

// rdmacmHeader is the header of Debian's librdmacm-dev that
// librdmacm.so.1 is built against.
const rdmacmHeader = "/usr/include/rdma/rdma_cma.h"

// EnvDir names the environment variable that gives the library's
// directory.
const EnvDir = "TAPROCE_LIBDIR"

// Module is the module path of taproce's go.mod, which tells a source
// checkout.
const Module = "github.com/taproce/taproce"

// SystemDirs are the installed places, after the one beside the
// executable.
var SystemDirs = []string{"/usr/local/lib/taproce", "/usr/lib/taproce"}

// ErrNotFound: no taproce libibverbs.so.1 where Find looked.
var ErrNotFound = errors.New("no taproce libibverbs.so.1")

// ErrNoToolchain: Build lacks make, a C compiler or Debian's
// libibverbs-dev headers (scripts/setup installs them).
var ErrNoToolchain = errors.New("no C toolchain or libibverbs-dev headers to build taproce's libibverbs.so.1 (scripts/setup installs them)")

// Found is a library Find or Build found.
type Found struct {
	// Dir holds Name: what LD_LIBRARY_PATH names.
	Dir string
	// From says why Dir was looked in: "--lib", "$TAPROCE_LIBDIR",
	// "beside /usr/bin/taproce", "installed", "built in CHECKOUT".
	From string
}

// Path returns the library's path.
func (f Found) Path() string { return filepath.Join(f.Dir, Name) }

// String reads "/usr/lib/taproce/libibverbs.so.1 (installed)".
func (f Found) String() string { return fmt.Sprintf("%s (%s)", f.Path(), f.From) }

// place is a directory Find looks in and why.
type place struct{ dir, from string }

// places returns where Find looks, in order: dir alone ("--lib") or
// env alone ($TAPROCE_LIBDIR) when given, otherwise beside exe and the
// system directories.
func places(dir, env, exe string) []place {
	switch {
	case dir != "":
		return []place{{dir, "--lib"}}
	case env != "":
		return []place{{env, "$" + EnvDir}}
	}
	var ps []place
	if exe != "" {
		ps = append(ps, place{filepath.Join(filepath.Dir(exe), "..", "lib", "taproce"), "beside " + exe})
	}
	for _, d := range SystemDirs {
		ps = append(ps, place{d, "installed"})
	}
	return ps
}

// Find returns the library's directory: dir (a flag) when given, else
// $TAPROCE_LIBDIR when set, else the first of ../lib/taproce beside exe
// (the taproce executable; "" for none) and SystemDirs that holds it. A
// file of the name that is not taproce's library (rdma-core's, say) is
// an error, not a find: programs would run on another library than the
// one asked for. The error wraps ErrNotFound when no place holds one.
func Find(dir, exe string) (Found, error) {
	ps := places(dir, os.Getenv(EnvDir), exe)
	var looked []string
	for _, p := range ps {
		path := filepath.Join(p.dir, Name)
		if _, err := os.Stat(path); err != nil {
			looked = append(looked, p.dir)
			continue
		}
		if err := Check(path); err != nil {
			return Found{}, fmt.Errorf("ibvlib: %s (%s): %w", path, p.from, err)
		}
		return Found{Dir: filepath.Clean(p.dir), From: p.from}, nil
	}
	if len(ps) == 1 {
		return Found{}, fmt.Errorf("ibvlib: %w in %s (%s)", ErrNotFound, ps[0].dir, ps[0].from)
	}
	return Found{}, fmt.Errorf("ibvlib: %w in %s", ErrNotFound, strings.Join(looked, ", "))
}

// Check verifies that path is one of taproce's libraries (Names): an ELF
// shared object whose soname is the file's name, one of Names, that reads
// TAPROCE_SOCKET. rdma-core's libraries have the sonames but never name
// taproce's socket.
func Check(path string) error {
	name := filepath.Base(path)
	if !slices.Contains(Names, name) {
		return fmt.Errorf("%s is none of taproce's libraries (%s)", name, strings.Join(Names, ", "))
	}
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("not a shared library: %w", err)
	}
	defer f.Close()
	if f.Type != elf.ET_DYN {
		return fmt.Errorf("ELF type %v, not a shared library", f.Type)
	}
	sonames, err := f.DynString(elf.DT_SONAME)
	if err != nil || len(sonames) != 1 || sonames[0] != name {
		return fmt.Errorf("soname %q, want %s", sonames, name)
	}
	ro := f.Section(".rodata")
	if ro == nil {
		return errors.New("no .rodata section")
	}
	data, err := ro.Data()
	if err != nil {
		return fmt.Errorf("reading .rodata: %w", err)
	}
	if !bytes.Contains(data, []byte("TAPROCE_SOCKET\x00")) {
		return errors.New("it does not read TAPROCE_SOCKET: not taproce's library (rdma-core's?)")
	}
	return nil
}

// Checkout returns the taproce source checkout that holds start (a
// directory): the nearest directory at or above it with taproce's go.mod
// and the library's sources.
func Checkout(start string) (string, bool) {
	dir, err := filepath.Abs(start)
	if err != nil {
		return "", false
	}
	for {
		if isCheckout(dir) {
			return dir, true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

// isCheckout reports whether dir is the top of a taproce checkout.
func isCheckout(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, "verbs", "libibverbs", "Makefile")); err != nil {
		return false
	}
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if mod, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.TrimSpace(mod) == Module
		}
	}
	return false
}

// Build runs make in checkout's verbs/libibverbs, and in verbs/librdmacm
// where librdmacm-dev's headers are, which puts librdmacm.so.1 beside
// libibverbs.so.1 (make builds only what changed), and returns the
// library it built. Its error wraps
// ErrNoToolchain when make, cc or the libibverbs-dev headers are
// missing; make's output goes to log (nil: discarded) and, on failure,
// into the error.
func Build(ctx context.Context, checkout string, log io.Writer) (Found, error) {
	if err := Toolchain(); err != nil {
		return Found{}, err
	}
	src := filepath.Join(checkout, "verbs", "libibverbs")
	dirs := []string{src}
	if RDMACMToolchain() == nil {
		// librdmacm.so.1 goes beside it, where librdmacm-dev's headers
		// are to build it against.
		dirs = append(dirs, filepath.Join(checkout, "verbs", "librdmacm"))
	}
	for _, dir := range dirs {
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, "make", "-C", dir)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if log != nil {
			_, _ = log.Write(out.Bytes())
		}
		if err != nil {
			return Found{}, fmt.Errorf("ibvlib: make -C %s: %w\n%s", dir, err, tail(out.String(), 20))
		}
	}
	f := Found{Dir: filepath.Join(src, "build"), From: "built in " + checkout}
	if err := Check(f.Path()); err != nil {
		return Found{}, fmt.Errorf("ibvlib: %s: %w", f.Path(), err)
	}
	return f, nil
}

// Toolchain returns an error wrapping ErrNoToolchain when this machine
// lacks what building the library takes: make, cc and Debian's
// libibverbs-dev headers.
func Toolchain() error {
	for _, tool := range []string{"make", "cc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("ibvlib: %w: %w", ErrNoToolchain, err)
		}
	}
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		return fmt.Errorf("ibvlib: %w: %w", ErrNoToolchain, err)
	}
	return nil
}

// RDMACMToolchain returns an error wrapping ErrNoToolchain when this
// machine lacks what building librdmacm.so.1 takes: what Toolchain
// checks and Debian's librdmacm-dev headers.
func RDMACMToolchain() error {
	if err := Toolchain(); err != nil {
		return err
	}
	if _, err := os.Stat(rdmacmHeader); err != nil {
		return fmt.Errorf("ibvlib: %w: librdmacm-dev: %w", ErrNoToolchain, err)
	}
	return nil
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
