package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/taproce/taproce/internal/ibvlib"
)

// bridgeConflist is a primary network configuration as a cluster's
// network plugin leaves it.
const bridgeConflist = `{
  "cniVersion": "1.0.0",
  "name": "k8s-pod-network",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.1.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// host lays out a temporary directory as the DaemonSet mounts the node:
// host/opt/cni/bin, host/etc/cni/net.d, host/opt/taproce/lib (not made:
// the installer makes it); and a plugin binary and the image's directory
// of libraries (libSrc) to install.
type host struct {
	root, bin, conf, plugin string
	libSrc, libDir          string
}

func newHost(t *testing.T) host {
	t.Helper()
	root := t.TempDir()
	h := host{root: root, bin: filepath.Join(root, "host/opt/cni/bin"), conf: filepath.Join(root, "host/etc/cni/net.d"),
		plugin: filepath.Join(root, "image/taproce-cni"),
		libSrc: filepath.Join(root, "image/usr/lib/taproce"), libDir: filepath.Join(root, "host/opt/taproce/lib")}
	for _, d := range []string{h.bin, h.conf, filepath.Dir(h.plugin), h.libSrc} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Something the node already has, which must stay as it is.
	write(t, filepath.Join(h.bin, "bridge"), "\x7fELF bridge", 0o755)
	write(t, h.plugin, "\x7fELF taproce-cni v1", 0o755)
	for _, name := range ibvlib.Names {
		write(t, filepath.Join(h.libSrc, name), libData(name, 1), 0o644)
	}
	return h
}

// libData is what the image's library of that name holds in version v.
func libData(name string, v int) string {
	return fmt.Sprintf("\x7fELF %s v%d", name, v)
}

// installed returns the paths of the libraries in the node's directory,
// in the order of ibvlib.Names.
func (h host) installed() []string {
	var out []string
	for _, name := range ibvlib.Names {
		out = append(out, filepath.Join(h.libDir, name))
	}
	return out
}

func (h host) installer(mode string) *Installer {
	return &Installer{BinDir: h.bin, ConfDir: h.conf, Plugin: h.plugin, Mode: mode, LibSrc: h.libSrc, LibDir: h.libDir,
		Entry: Entry{AdminSocket: "/run/taproce/admin.sock"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

func write(t *testing.T, path, data string, perm os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// plugins returns the plugins of a conflist file as libcni loads it.
func plugins(t *testing.T, path string) []map[string]any {
	t.Helper()
	list, err := libcni.ConfListFromFile(path)
	if err != nil {
		t.Fatalf("libcni cannot load %s: %v", path, err)
	}
	var out []map[string]any
	for _, p := range list.Plugins {
		var m map[string]any
		if err := json.Unmarshal(p.Bytes, &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// equalJSON reports whether two JSON texts encode the same value.
func equalJSON(t *testing.T, a, b string) bool {
	t.Helper()
	return sameJSON([]byte(a), []byte(b))
}

// noTemporaries fails when a temporary file of writeAtomic is left.
func noTemporaries(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		m, _ := filepath.Glob(filepath.Join(d, ".taproce-*"))
		if len(m) > 0 {
			t.Errorf("temporary files left: %v", m)
		}
	}
}

func stat(t *testing.T, path string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

// TestInstallChainsPrimary: the binary lands in the CNI binary directory
// and taproce-cni is appended to the first conflist; the cluster's own
// plugins and other files stay as they were; a second run changes
// nothing, not even the files' inodes.
func TestInstallChainsPrimary(t *testing.T) {
	h := newHost(t)
	primary := filepath.Join(h.conf, "10-bridge.conflist")
	write(t, primary, bridgeConflist, 0o600)
	other := filepath.Join(h.conf, "99-loopback.conf")
	write(t, other, `{"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}`, 0o644)
	in := h.installer(ModePrimary)

	res, err := in.Install()
	if err != nil {
		t.Fatal(err)
	}
	if !res.BinaryChanged || !res.ConfChanged || res.Conf != primary || res.Binary != filepath.Join(h.bin, "taproce-cni") {
		t.Fatalf("result %+v", res)
	}
	if got := read(t, res.Binary); got != "\x7fELF taproce-cni v1" {
		t.Fatalf("installed binary %q", got)
	}
	if m := stat(t, res.Binary).Mode(); m.Perm() != 0o755 || !m.IsRegular() {
		t.Fatalf("installed binary mode %v", m)
	}
	if got := read(t, filepath.Join(h.bin, "bridge")); got != "\x7fELF bridge" {
		t.Fatal("the node's other plugin changed")
	}
	ps := plugins(t, primary)
	if len(ps) != 3 || ps[0]["type"] != "bridge" || ps[1]["type"] != "portmap" || ps[2]["type"] != PluginType ||
		ps[2]["adminSocket"] != "/run/taproce/admin.sock" || len(ps[2]) != 2 {
		t.Fatalf("plugins after install: %v", ps)
	}
	// The cluster's part is unchanged, value for value.
	var before, after map[string]any
	json.Unmarshal([]byte(bridgeConflist), &before)
	json.Unmarshal([]byte(read(t, primary)), &after)
	after["plugins"] = after["plugins"].([]any)[:2]
	if b1, _ := json.Marshal(before); !equalJSON(t, string(b1), mustJSON(after)) {
		t.Fatalf("the primary's own content changed:\n%s", read(t, primary))
	}
	if m := stat(t, primary).Mode().Perm(); m != 0o600 {
		t.Errorf("the primary's permissions became %v", m)
	}
	if got := read(t, other); !strings.Contains(got, "loopback") {
		t.Fatal("the other configuration changed")
	}

	bin0, conf0 := stat(t, res.Binary), stat(t, primary)
	time.Sleep(10 * time.Millisecond)
	res, err = in.Install()
	if err != nil {
		t.Fatal(err)
	}
	if res.BinaryChanged || res.ConfChanged {
		t.Fatalf("second install changed something: %+v", res)
	}
	if bin1, conf1 := stat(t, res.Binary), stat(t, primary); !os.SameFile(bin0, bin1) || !os.SameFile(conf0, conf1) ||
		!bin1.ModTime().Equal(bin0.ModTime()) || !conf1.ModTime().Equal(conf0.ModTime()) {
		t.Fatal("second install rewrote files")
	}
	noTemporaries(t, h.bin, h.conf)
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestInstallRepairs: what others change is put right by the next
// Install: a new plugin binary, a new admin socket, the chained entry
// moved or dropped by the cluster's installer rewriting its file.
func TestInstallRepairs(t *testing.T) {
	h := newHost(t)
	primary := filepath.Join(h.conf, "10-bridge.conflist")
	write(t, primary, bridgeConflist, 0o644)
	in := h.installer(ModePrimary)
	if _, err := in.Install(); err != nil {
		t.Fatal(err)
	}

	t.Run("new binary", func(t *testing.T) {
		write(t, h.plugin, "\x7fELF taproce-cni v2", 0o755)
		res, err := in.Install()
		if err != nil || !res.BinaryChanged || res.ConfChanged {
			t.Fatalf("%+v, %v", res, err)
		}
		if got := read(t, res.Binary); got != "\x7fELF taproce-cni v2" {
			t.Fatalf("binary %q", got)
		}
	})
	t.Run("new admin socket and port name", func(t *testing.T) {
		in.Entry = Entry{AdminSocket: "/var/run/taproce/admin.sock", PortName: "rdma0"}
		res, err := in.Install()
		if err != nil || res.BinaryChanged || !res.ConfChanged {
			t.Fatalf("%+v, %v", res, err)
		}
		ps := plugins(t, primary)
		if len(ps) != 3 || ps[2]["adminSocket"] != "/var/run/taproce/admin.sock" || ps[2]["portName"] != "rdma0" {
			t.Fatalf("plugins %v", ps)
		}
	})
	t.Run("entry not last", func(t *testing.T) {
		var top map[string]any
		json.Unmarshal([]byte(read(t, primary)), &top)
		ps := top["plugins"].([]any)
		top["plugins"] = []any{ps[0], ps[2], ps[1], ps[2]} // moved, and twice
		write(t, primary, mustJSON(top), 0o644)
		if res, err := in.Install(); err != nil || !res.ConfChanged {
			t.Fatalf("%+v, %v", res, err)
		}
		got := plugins(t, primary)
		if len(got) != 3 || got[1]["type"] != "portmap" || got[2]["type"] != PluginType {
			t.Fatalf("plugins %v", got)
		}
	})
	t.Run("primary rewritten by its owner", func(t *testing.T) {
		write(t, primary, bridgeConflist, 0o644)
		if res, err := in.Install(); err != nil || !res.ConfChanged {
			t.Fatalf("%+v, %v", res, err)
		}
		if ps := plugins(t, primary); len(ps) != 3 || ps[2]["type"] != PluginType {
			t.Fatalf("plugins %v", ps)
		}
	})
	noTemporaries(t, h.bin, h.conf)
}

// TestInstallConvertsConf: a single plugin's .conf becomes a conflist of
// the same name with that plugin and taproce-cni, and the .conf goes, so
// that the runtime, which takes the first file by name, reads the
// conflist; Uninstall leaves the conflist with the plugin alone.
func TestInstallConvertsConf(t *testing.T) {
	h := newHost(t)
	conf := `{"cniVersion": "0.4.0", "name": "mynet", "type": "bridge", "bridge": "br0",
  "ipam": {"type": "host-local", "subnet": "10.1.0.0/16"}}`
	write(t, filepath.Join(h.conf, "10-mynet.conf"), conf, 0o644)
	write(t, filepath.Join(h.conf, "20-later.conflist"), bridgeConflist, 0o644)
	in := h.installer(ModePrimary)
	res, err := in.Install()
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(h.conf, "10-mynet.conflist")
	if res.Conf != want || !res.ConfChanged {
		t.Fatalf("result %+v", res)
	}
	if _, err := os.Stat(filepath.Join(h.conf, "10-mynet.conf")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the .conf is still there: %v", err)
	}
	if p, err := Primary(h.conf); err != nil || p != want {
		t.Fatalf("primary now %s, %v", p, err)
	}
	list, err := libcni.ConfListFromFile(want)
	if err != nil || list.Name != "mynet" || list.CNIVersion != "0.4.0" || len(list.Plugins) != 2 ||
		!equalJSON(t, string(list.Plugins[0].Bytes), conf) || list.Plugins[1].Network.Type != PluginType {
		t.Fatalf("converted conflist %+v, %v:\n%s", list, err, read(t, want))
	}
	if ps := plugins(t, filepath.Join(h.conf, "20-later.conflist")); len(ps) != 2 {
		t.Fatal("a configuration after the primary was changed")
	}
	if res, err := in.Install(); err != nil || res.ConfChanged {
		t.Fatalf("second install: %+v, %v", res, err)
	}

	if _, err := in.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if list, err := libcni.ConfListFromFile(want); err != nil || len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "bridge" {
		t.Fatalf("after uninstall %+v, %v", list, err)
	}
}

// TestInstallWaitsForPrimary: without a configuration to chain into, the
// binary is installed and the error says so; once the cluster's network
// plugin writes its configuration, the next Install chains.
func TestInstallWaitsForPrimary(t *testing.T) {
	h := newHost(t)
	in := h.installer(ModePrimary)
	res, err := in.Install()
	if !errors.Is(err, ErrNoPrimary) || !res.BinaryChanged {
		t.Fatalf("%+v, %v", res, err)
	}
	write(t, filepath.Join(h.conf, "10-bridge.conflist"), bridgeConflist, 0o644)
	if res, err := in.Install(); err != nil || res.BinaryChanged || !res.ConfChanged {
		t.Fatalf("%+v, %v", res, err)
	}
}

// TestInstallRefuses: what cannot be chained into is reported and left
// alone.
func TestInstallRefuses(t *testing.T) {
	for name, text := range map[string]string{
		"not JSON":          `{"name": `,
		"plugins elsewhere": `{"cniVersion": "1.1.0", "name": "files"}`,
		"only taproce-cni":  `{"cniVersion": "1.1.0", "name": "x", "plugins": [{"type": "taproce-cni"}]}`,
		"plugins not list":  `{"cniVersion": "1.1.0", "name": "x", "plugins": {"type": "bridge"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			h := newHost(t)
			path := filepath.Join(h.conf, "10-x.conflist")
			write(t, path, text, 0o644)
			if _, err := h.installer(ModePrimary).Install(); err == nil {
				t.Fatal("no error")
			}
			if got := read(t, path); got != text {
				t.Fatalf("changed to %s", got)
			}
			noTemporaries(t, h.conf)
		})
	}
}

// TestInstallModes: mode file installs the operator's conflist (valid
// ones only), mode none only the binary.
func TestInstallModes(t *testing.T) {
	h := newHost(t)
	src := filepath.Join(h.root, "image/05-taproce.conflist")
	withTaproce := strings.Replace(bridgeConflist, `{"type": "portmap"`, `{"type": "taproce-cni"}, {"type": "portmap"`, 1)
	write(t, src, withTaproce, 0o644)
	in := h.installer(ModeFile)
	in.Conflist = src
	res, err := in.Install()
	dst := filepath.Join(h.conf, "05-taproce.conflist")
	if err != nil || res.Conf != dst || !res.ConfChanged || read(t, dst) != withTaproce {
		t.Fatalf("%+v, %v", res, err)
	}
	if res, err := in.Install(); err != nil || res.ConfChanged || res.BinaryChanged {
		t.Fatalf("again: %+v, %v", res, err)
	}
	write(t, src, `{"plugins": []}`, 0o644)
	if _, err := in.Install(); err == nil || read(t, dst) != withTaproce {
		t.Fatalf("an invalid conflist was installed (%v)", err)
	}
	if _, err := in.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("mode file's conflist outlived Uninstall")
	}

	h = newHost(t)
	write(t, filepath.Join(h.conf, "10-bridge.conflist"), bridgeConflist, 0o644)
	res, err = h.installer(ModeNone).Install()
	if err != nil || !res.BinaryChanged || res.Conf != "" {
		t.Fatalf("mode none: %+v, %v", res, err)
	}
	if read(t, filepath.Join(h.conf, "10-bridge.conflist")) != bridgeConflist {
		t.Fatal("mode none changed the configuration")
	}
}

// TestUninstall: the primary gets its own plugins back, the binary goes,
// and a second Uninstall has nothing to do.
func TestUninstall(t *testing.T) {
	h := newHost(t)
	primary := filepath.Join(h.conf, "10-bridge.conflist")
	write(t, primary, bridgeConflist, 0o644)
	in := h.installer(ModePrimary)
	if _, err := in.Install(); err != nil {
		t.Fatal(err)
	}
	res, err := in.Uninstall()
	if err != nil || !res.BinaryChanged || !res.ConfChanged {
		t.Fatalf("%+v, %v", res, err)
	}
	if !equalJSON(t, read(t, primary), bridgeConflist) {
		t.Fatalf("primary after uninstall:\n%s", read(t, primary))
	}
	if _, err := os.Stat(filepath.Join(h.bin, PluginType)); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("binary left")
	}
	if _, err := os.Stat(filepath.Join(h.bin, "bridge")); err != nil {
		t.Fatal("the node's own plugin went")
	}
	if res, err := in.Uninstall(); err != nil || res.BinaryChanged || res.ConfChanged {
		t.Fatalf("second uninstall: %+v, %v", res, err)
	}
	noTemporaries(t, h.bin, h.conf)
}

// TestWriteAtomicFailure: a write that fails leaves the old file and no
// temporary.
func TestWriteAtomicFailure(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.conflist")
	write(t, path, "old", 0o644)
	// A directory where the file should be: the rename fails.
	sub := filepath.Join(dir, "sub.conflist")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "keep"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := writeIfChanged(sub, []byte("new"), 0o644); err == nil {
		t.Fatal("no error renaming over a non-empty directory")
	}
	if read(t, path) != "old" {
		t.Fatal("old file changed")
	}
	noTemporaries(t, dir)
	if changed, err := writeIfChanged(path, []byte("old"), 0o644); err != nil || changed {
		t.Fatalf("unchanged content rewritten: %v, %v", changed, err)
	}
	if changed, err := writeIfChanged(path, []byte("old"), 0o600); err != nil || !changed || stat(t, path).Mode().Perm() != 0o600 {
		t.Fatalf("new permissions not applied: %v, %v", changed, err)
	}
	if !bytes.Equal([]byte(read(t, path)), []byte("old")) {
		t.Fatal("content changed")
	}
}

// TestInstallLibrary: each of taproce's libraries lands in the node's
// library directory (made if missing) with the image's bytes, readable
// by all; a second run leaves the very files; a new library replaces
// its own file alone, by a rename, so that a program that has the old
// one mapped goes on with the old bytes (written in place, they would
// change under it); Uninstall removes them all. Every mode installs
// them.
func TestInstallLibrary(t *testing.T) {
	for _, mode := range []string{ModePrimary, ModeNone} {
		for _, updated := range ibvlib.Names {
			t.Run(mode+"/"+updated, func(t *testing.T) {
				testInstallLibrary(t, mode, updated)
			})
		}
	}
}

// testInstallLibrary installs, then has the image bring a new version of
// the library named updated.
func testInstallLibrary(t *testing.T, mode, updated string) {
	h := newHost(t)
	write(t, filepath.Join(h.conf, "10-bridge.conflist"), bridgeConflist, 0o644)
	in := h.installer(mode)
	res, err := in.Install()
	all := h.installed()
	if err != nil || !slices.Equal(res.Libs, all) || !slices.Equal(res.LibsChanged, all) {
		t.Fatalf("%+v, %v; want %v installed", res, err, all)
	}
	before := map[string]os.FileInfo{}
	for i, name := range ibvlib.Names {
		if got := read(t, all[i]); got != libData(name, 1) {
			t.Fatalf("installed %s: %q", name, got)
		}
		fi := stat(t, all[i])
		if fi.Mode().Perm() != 0o644 || !fi.Mode().IsRegular() {
			t.Fatalf("installed %s: mode %v", name, fi.Mode())
		}
		before[name] = fi
	}
	if res, err := in.Install(); err != nil || len(res.LibsChanged) > 0 {
		t.Fatalf("again: %+v, %v: rewritten", res, err)
	}
	for i, name := range ibvlib.Names {
		if !os.SameFile(before[name], stat(t, all[i])) {
			t.Fatalf("again: %s rewritten", name)
		}
	}

	// A program has the library mapped while a new one comes.
	path := filepath.Join(h.libDir, updated)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mapped, err := syscall.Mmap(int(f.Fd()), 0, int(before[updated].Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mapped)
	newer := libData(updated, 2) + ", longer"
	write(t, filepath.Join(h.libSrc, updated), newer, 0o644)
	if res, err := in.Install(); err != nil || !slices.Equal(res.LibsChanged, []string{path}) {
		t.Fatalf("new %s: %+v, %v", updated, res, err)
	}
	for i, name := range ibvlib.Names {
		switch got := read(t, all[i]); {
		case name == updated && got != newer:
			t.Fatalf("installed %s %q after its update", name, got)
		case name != updated && (got != libData(name, 1) || !os.SameFile(before[name], stat(t, all[i]))):
			t.Fatalf("%s rewritten (%q) when %s was updated", name, got, updated)
		}
	}
	if string(mapped) != libData(updated, 1) {
		t.Fatalf("the running program's mapping changed to %q: the library was written in place", mapped)
	}
	noTemporaries(t, h.libDir)

	res, err = in.Uninstall()
	if err != nil || !slices.Equal(res.Libs, all) || !slices.Equal(res.LibsChanged, all) {
		t.Fatalf("uninstall: %+v, %v", res, err)
	}
	for _, p := range all {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s left", p)
		}
	}
	if res, err := in.Uninstall(); err != nil || len(res.LibsChanged) > 0 {
		t.Fatalf("second uninstall: %+v, %v", res, err)
	}
}

// TestUninstallLibraryGone: a library already gone from the node is no
// error, and the others are removed all the same.
func TestUninstallLibraryGone(t *testing.T) {
	for i, gone := range ibvlib.Names {
		t.Run(gone, func(t *testing.T) {
			h := newHost(t)
			in := h.installer(ModeNone)
			if _, err := in.Install(); err != nil {
				t.Fatal(err)
			}
			all := h.installed()
			if err := os.Remove(all[i]); err != nil {
				t.Fatal(err)
			}
			res, err := in.Uninstall()
			want := slices.Delete(slices.Clone(all), i, i+1)
			if err != nil || !slices.Equal(res.LibsChanged, want) {
				t.Fatalf("%+v, %v; want %v removed", res, err, want)
			}
			if left, _ := os.ReadDir(h.libDir); len(left) > 0 {
				t.Fatalf("left in the library directory: %v", left)
			}
		})
	}
}

// TestInstallLibraryMissing: an image lacking any of the libraries is an
// error before anything is installed, the others included; with no
// libraries asked for (-lib=), the plugin is installed alone.
func TestInstallLibraryMissing(t *testing.T) {
	for _, missing := range ibvlib.Names {
		t.Run(missing, func(t *testing.T) {
			h := newHost(t)
			write(t, filepath.Join(h.conf, "10-bridge.conflist"), bridgeConflist, 0o644)
			if err := os.Remove(filepath.Join(h.libSrc, missing)); err != nil {
				t.Fatal(err)
			}
			in := h.installer(ModePrimary)
			res, err := in.Install()
			if err == nil || !strings.Contains(err.Error(), "reading "+missing) || !errors.Is(err, os.ErrNotExist) ||
				res.BinaryChanged || res.ConfChanged || len(res.LibsChanged) > 0 {
				t.Fatalf("%+v, %v", res, err)
			}
			if _, err := os.Stat(filepath.Join(h.bin, PluginType)); !errors.Is(err, os.ErrNotExist) {
				t.Fatal("the plugin was installed without the library")
			}
			if _, err := os.Stat(h.libDir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a library was installed without %s", missing)
			}
		})
	}
	h := newHost(t)
	write(t, filepath.Join(h.conf, "10-bridge.conflist"), bridgeConflist, 0o644)
	in := h.installer(ModePrimary)
	in.LibSrc = ""
	res, err := in.Install()
	if err != nil || res.Libs != nil || res.LibsChanged != nil || !res.BinaryChanged {
		t.Fatalf("no library: %+v, %v", res, err)
	}
	if _, err := os.Stat(h.libDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a library directory was made for no library")
	}
}
