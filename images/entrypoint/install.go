package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/libcni"

	"github.com/taproce/taproce/internal/ibvlib"
)

// PluginType is the "type" of taproce-cni in a network configuration, and
// the name of its binary in the CNI binary directory.
const PluginType = "taproce-cni"

// Chaining modes; see Installer.Mode.
const (
	// ModePrimary adds taproce-cni to the node's primary network
	// configuration: the first file of the configuration directory in
	// name order, as container runtimes pick it.
	ModePrimary = "primary"
	// ModeFile installs a conflist of the operator's (Installer.Conflist)
	// into the configuration directory.
	ModeFile = "file"
	// ModeNone installs only the binary (for Multus and other
	// meta-plugins, whose own configuration names taproce-cni).
	ModeNone = "none"
)

// confExtensions are the extensions container runtimes (containerd,
// CRI-O, through libcni) read in the configuration directory.
var confExtensions = []string{".conf", ".conflist", ".json"}

// ErrNoPrimary: the configuration directory holds no network
// configuration to chain into yet (the cluster's network plugin has not
// installed its own).
var ErrNoPrimary = errors.New("no primary network configuration")

// Entry is taproce-cni's element of a conflist's "plugins".
type Entry struct {
	Type        string `json:"type"`
	AdminSocket string `json:"adminSocket,omitempty"`
	PortName    string `json:"portName,omitempty"`
}

// Installer puts taproce-cni and its network configuration onto the node,
// whose directories are mounted into the container, and with them
// taproce's libraries (ibvlib.Names: libibverbs.so.1 and librdmacm.so.1),
// which pods mount from the node to run unmodified ibverbs and RDMA CM
// programs.
//
// Every change is atomic (a new file in the same directory, synced, then
// renamed over the old one), so a runtime never reads half a file, and
// idempotent: what is already as it should be is not rewritten. For the
// libraries this is what keeps running programs alive: a program has the
// installed files mapped, and writing a new one into them in place would
// change the code under it; a rename leaves it the old file, which
// lives on until it exits, and gives programs started after it the new
// one.
type Installer struct {
	// BinDir is the node's CNI binary directory (/host/opt/cni/bin).
	BinDir string
	// ConfDir is the node's CNI configuration directory
	// (/host/etc/cni/net.d).
	ConfDir string
	// Plugin is the taproce-cni binary to copy into BinDir.
	Plugin string
	// Mode is ModePrimary, ModeFile or ModeNone.
	Mode string
	// Conflist is the file ModeFile installs under its own base name.
	Conflist string
	// Entry is what ModePrimary adds to the primary conflist's plugins.
	Entry Entry
	// LibSrc is the directory holding taproce's libraries, every one of
	// ibvlib.Names, to install into LibDir (the image's
	// /usr/lib/taproce); "" installs none.
	LibSrc string
	// LibDir is the node's directory for the libraries
	// (/host/opt/taproce/lib), which pods mount and name in
	// LD_LIBRARY_PATH.
	LibDir string
	// Logger reports each change; nil for slog.Default().
	Logger *slog.Logger
}

// Result says what an Install or Uninstall changed.
type Result struct {
	// Libs are the installed libraries' paths in LibDir, in the order
	// of ibvlib.Names, none when there are none to install; LibsChanged
	// those of them that were written (or, for Uninstall, removed).
	Libs, LibsChanged []string
	// Binary is the installed plugin's path; BinaryChanged whether it
	// was written (or, for Uninstall, removed).
	Binary        string
	BinaryChanged bool
	// Conf is the configuration file taproce-cni is in (for Uninstall:
	// was removed from), empty when none; ConfChanged whether it was
	// written.
	Conf        string
	ConfChanged bool
}

func (in *Installer) log() *slog.Logger {
	if in.Logger != nil {
		return in.Logger
	}
	return slog.Default()
}

// Install copies the libraries into LibDir and the plugin into BinDir and
// then, as Mode says, chains the plugin into the primary configuration or
// installs Conflist. The libraries and the binary come first, so that no
// configuration names a plugin the node lacks and no pod gets a port
// before the libraries its programs load are there; all of them are read
// before any is written, so that an image lacking one installs nothing.
// With ModePrimary and no configuration yet, it returns an error wrapping
// ErrNoPrimary after installing the files; calling it again later
// finishes the job.
func (in *Installer) Install() (Result, error) {
	var res Result
	var libs []*file
	if in.LibSrc != "" {
		for _, name := range ibvlib.Names {
			libs = append(libs, &file{what: name, src: filepath.Join(in.LibSrc, name), dst: filepath.Join(in.LibDir, name), perm: 0o644})
		}
	}
	plugin := &file{what: PluginType, src: in.Plugin, dst: filepath.Join(in.BinDir, PluginType), perm: 0o755}
	for _, f := range append(libs, plugin) {
		if err := f.read(); err != nil {
			return res, err
		}
	}
	for _, f := range libs {
		res.Libs = append(res.Libs, f.dst)
		changed, err := in.put(f)
		if err != nil {
			return res, err
		}
		if changed {
			res.LibsChanged = append(res.LibsChanged, f.dst)
		}
	}
	res.Binary = plugin.dst
	var err error
	if res.BinaryChanged, err = in.put(plugin); err != nil {
		return res, err
	}
	switch in.Mode {
	case ModeNone:
		return res, nil
	case ModeFile:
		res.Conf, res.ConfChanged, err = in.installFile()
	case ModePrimary, "":
		res.Conf, res.ConfChanged, err = in.chain()
	default:
		err = fmt.Errorf("install: mode %q is not %s, %s or %s", in.Mode, ModePrimary, ModeFile, ModeNone)
	}
	if err == nil && res.ConfChanged {
		in.log().Info("CNI network configuration written", "path", res.Conf, "mode", in.Mode)
	}
	return res, err
}

// file is one file Install copies from the image onto the node.
type file struct {
	what     string // for messages: "taproce-cni", "libibverbs.so.1"
	src, dst string
	perm     os.FileMode
	data     []byte // src's, once read
}

// read reads f's source.
func (f *file) read() (err error) {
	if f.data, err = os.ReadFile(f.src); err != nil {
		return fmt.Errorf("install: reading %s: %w", f.what, err)
	}
	return nil
}

// put writes f's data to its destination unless it already holds them,
// and logs when it wrote.
func (in *Installer) put(f *file) (bool, error) {
	changed, err := writeIfChanged(f.dst, f.data, f.perm)
	if err != nil {
		return false, fmt.Errorf("install: %w", err)
	}
	if changed {
		in.log().Info(f.what+" installed", "path", f.dst, "bytes", len(f.data))
	}
	return changed, nil
}

// installFile copies Conflist, validated, into ConfDir.
func (in *Installer) installFile() (string, bool, error) {
	data, err := os.ReadFile(in.Conflist)
	if err != nil {
		return "", false, fmt.Errorf("install: reading the conflist: %w", err)
	}
	if _, err := libcni.ConfListFromBytes(data); err != nil {
		return "", false, fmt.Errorf("install: %s is not a valid conflist: %w", in.Conflist, err)
	}
	dst := filepath.Join(in.ConfDir, filepath.Base(in.Conflist))
	changed, err := writeIfChanged(dst, data, 0o644)
	if err != nil {
		return "", false, fmt.Errorf("install: %w", err)
	}
	return dst, changed, nil
}

// Primary returns the network configuration a container runtime uses:
// the first file of dir, in name order, with one of the extensions
// libcni reads. It errs with ErrNoPrimary when there is none.
func Primary(dir string) (string, error) {
	files, err := libcni.ConfFiles(dir, confExtensions)
	if err != nil {
		return "", fmt.Errorf("listing %s: %w", dir, err)
	}
	if len(files) == 0 {
		return "", fmt.Errorf("%w in %s", ErrNoPrimary, dir)
	}
	slices.Sort(files)
	return files[0], nil
}

// chain adds Entry to the primary configuration: appended to the plugins
// of a conflist (replacing an outdated taproce-cni element); a single
// plugin's .conf or .json becomes a conflist of the same base name with
// that plugin and taproce-cni, and the old file goes, so that the
// conflist is the one the runtime picks.
func (in *Installer) chain() (string, bool, error) {
	primary, err := Primary(in.ConfDir)
	if err != nil {
		return "", false, fmt.Errorf("install: %w", err)
	}
	data, err := os.ReadFile(primary)
	if err != nil {
		return "", false, fmt.Errorf("install: %w", err)
	}
	entry, err := json.Marshal(in.entry())
	if err != nil {
		return "", false, err
	}
	if filepath.Ext(primary) == ".conflist" {
		out, changed, err := chainList(data, entry)
		if err != nil {
			return "", false, fmt.Errorf("install: chaining into %s: %w", primary, err)
		}
		if !changed {
			return primary, false, nil
		}
		if _, err := writeIfChanged(primary, out, filePerm(primary)); err != nil {
			return "", false, fmt.Errorf("install: %w", err)
		}
		return primary, true, nil
	}
	out, err := listFromConf(data, entry)
	if err != nil {
		return "", false, fmt.Errorf("install: converting %s to a conflist: %w", primary, err)
	}
	dst := strings.TrimSuffix(primary, filepath.Ext(primary)) + ".conflist"
	if _, err := writeIfChanged(dst, out, filePerm(primary)); err != nil {
		return "", false, fmt.Errorf("install: %w", err)
	}
	if err := os.Remove(primary); err != nil {
		return "", false, fmt.Errorf("install: removing %s, now %s: %w", primary, dst, err)
	}
	in.log().Info("single-plugin configuration converted to a conflist", "from", primary, "to", dst)
	return dst, true, syncDir(in.ConfDir)
}

func (in *Installer) entry() Entry {
	e := in.Entry
	e.Type = PluginType
	return e
}

// chainList returns the conflist data with entry as the last plugin and
// no other taproce-cni element, and whether that differs from data.
func chainList(data, entry []byte) ([]byte, bool, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, false, err
	}
	raw, ok := top["plugins"]
	if !ok {
		return nil, false, errors.New(`it has no "plugins" list (plugins in separate files are not supported: use a conflist of your own and mode "file")`)
	}
	var plugins []json.RawMessage
	if err := json.Unmarshal(raw, &plugins); err != nil {
		return nil, false, fmt.Errorf("plugins: %w", err)
	}
	kept := plugins[:0:0]
	var ours []json.RawMessage
	for _, p := range plugins {
		if isOurs(p) {
			ours = append(ours, p)
		} else {
			kept = append(kept, p)
		}
	}
	if len(kept) == 0 {
		return nil, false, errors.New("it has no plugin but taproce-cni, which must follow one that assigns the pod's addresses")
	}
	if len(ours) == 1 && isLast(plugins, ours[0]) && sameJSON(ours[0], entry) {
		return data, false, nil
	}
	top["plugins"], _ = json.Marshal(append(kept, entry))
	out, err := marshalConf(top)
	return out, err == nil, err
}

// isLast reports whether p is the last element of plugins.
func isLast(plugins []json.RawMessage, p json.RawMessage) bool {
	return len(plugins) > 0 && bytes.Equal(plugins[len(plugins)-1], p)
}

// listFromConf turns a single plugin's configuration into a conflist
// with that plugin and entry, as libcni's ConfListFromConf does for the
// runtime.
func listFromConf(data, entry []byte) ([]byte, error) {
	var conf map[string]json.RawMessage
	if err := json.Unmarshal(data, &conf); err != nil {
		return nil, err
	}
	if _, ok := conf["plugins"]; ok {
		return nil, errors.New(`it has a "plugins" list: name it .conflist`)
	}
	top := map[string]json.RawMessage{}
	for _, k := range []string{"cniVersion", "name"} {
		if v, ok := conf[k]; ok {
			top[k] = v
		}
	}
	top["plugins"], _ = json.Marshal([]json.RawMessage{data, entry})
	return marshalConf(top)
}

// marshalConf encodes a conflist, indented, and checks libcni reads it.
func marshalConf(top map[string]json.RawMessage) ([]byte, error) {
	out, err := json.MarshalIndent(top, "", "  ")
	if err != nil {
		return nil, err
	}
	out = append(out, '\n')
	if _, err := libcni.ConfListFromBytes(out); err != nil {
		return nil, fmt.Errorf("the result would not be a valid conflist: %w", err)
	}
	return out, nil
}

// isOurs reports whether a plugins element is taproce-cni's.
func isOurs(p json.RawMessage) bool {
	var e struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(p, &e) == nil && e.Type == PluginType
}

// sameJSON reports whether a and b encode the same value.
func sameJSON(a, b []byte) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	ca, _ := json.Marshal(va)
	cb, _ := json.Marshal(vb)
	return bytes.Equal(ca, cb)
}

// Uninstall undoes Install: it takes taproce-cni out of every conflist of
// ConfDir (a conflist ModeFile installed is removed whole) and removes
// the binary and the libraries (programs running on them keep the files
// they have mapped). A conflist Install made from a single plugin's .conf
// stays a conflist, with that plugin alone.
func (in *Installer) Uninstall() (Result, error) {
	var res Result
	var errs []error
	if in.Mode == ModeFile && in.Conflist != "" {
		dst := filepath.Join(in.ConfDir, filepath.Base(in.Conflist))
		if err := os.Remove(dst); err == nil {
			res.Conf, res.ConfChanged = dst, true
		} else if !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	files, err := libcni.ConfFiles(in.ConfDir, []string{".conflist"})
	if err != nil {
		errs = append(errs, err)
	}
	for _, f := range files {
		changed, err := unchainFile(f)
		if err != nil {
			errs = append(errs, err)
		} else if changed {
			res.Conf, res.ConfChanged = f, true
			in.log().Info("taproce-cni removed from a network configuration", "path", f)
		}
	}
	res.Binary = filepath.Join(in.BinDir, PluginType)
	if err := os.Remove(res.Binary); err == nil {
		res.BinaryChanged = true
		in.log().Info("CNI plugin removed", "path", res.Binary)
	} else if !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	if in.LibDir != "" {
		for _, name := range ibvlib.Names {
			lib := filepath.Join(in.LibDir, name)
			res.Libs = append(res.Libs, lib)
			if err := os.Remove(lib); err == nil {
				res.LibsChanged = append(res.LibsChanged, lib)
				in.log().Info(name+" removed", "path", lib)
			} else if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("uninstall: %w", err)
	}
	return res, nil
}

// unchainFile removes taproce-cni's elements from the conflist at path.
func unchainFile(path string) (bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(data, &top) != nil {
		return false, nil // not ours to judge
	}
	var plugins []json.RawMessage
	if json.Unmarshal(top["plugins"], &plugins) != nil {
		return false, nil
	}
	kept := slices.DeleteFunc(slices.Clone(plugins), isOurs)
	if len(kept) == len(plugins) || len(kept) == 0 {
		return false, nil
	}
	top["plugins"], _ = json.Marshal(kept)
	out, err := marshalConf(top)
	if err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	if _, err := writeIfChanged(path, out, filePerm(path)); err != nil {
		return false, err
	}
	return true, nil
}

// filePerm returns the permission bits of path, 0644 when it cannot say.
func filePerm(path string) fs.FileMode {
	if fi, err := os.Stat(path); err == nil {
		return fi.Mode().Perm()
	}
	return 0o644
}

// writeIfChanged makes path hold data with permissions perm, atomically,
// unless it already does; it reports whether it wrote.
func writeIfChanged(path string, data []byte, perm fs.FileMode) (bool, error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm() == perm && fi.Mode().IsRegular() {
			return false, nil
		}
	}
	return true, writeAtomic(path, data, perm)
}

// writeAtomic replaces path with a file holding data: written to a
// hidden temporary file in the same directory (whose name no runtime
// reads), synced, renamed over path, and the directory synced.
func writeAtomic(path string, data []byte, perm fs.FileMode) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	f, err := os.CreateTemp(dir, ".taproce-*.tmp")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return syncDir(dir)
}

// syncDir makes a rename or removal in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}
