package deviceplugin

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	cdi "tags.cncf.io/container-device-interface/specs-go"
)

// CDIVersion is the Container Device Interface version of the spec
// WriteCDISpec writes: the oldest that has everything it uses (mounts and
// environment), so that older runtimes read it too.
const CDIVersion = "0.5.0"

// CDIDevice is the name of the spec's one device: every container that
// names it ("taproce.io/roce=all") gets what Allocate gives.
const CDIDevice = "all"

// DefaultCDIDir is where runtimes look for generated CDI specs.
const DefaultCDIDir = "/var/run/cdi"

// CDISpec is the plugin's Container Device Interface spec: for runtimes
// that read CDI (podman run --device taproce.io/roce=all, containerd
// 1.7 and CRI-O with CDI enabled) what Allocate gives a container — the
// same mounts and environment.
func (p *Plugin) CDISpec() *cdi.Spec {
	e := p.containerEdits()
	var edits cdi.ContainerEdits
	for _, k := range []string{"TAPROCE_SOCKET", "LD_LIBRARY_PATH"} {
		edits.Env = append(edits.Env, k+"="+e.Envs[k])
	}
	for _, m := range e.Mounts {
		mode := "ro"
		if !m.ReadOnly {
			mode = "rw"
		}
		edits.Mounts = append(edits.Mounts, &cdi.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath,
			Type: "bind", Options: []string{"rbind", mode}})
	}
	return &cdi.Spec{Version: CDIVersion, Kind: p.cfg.Resource,
		Devices: []cdi.Device{{Name: CDIDevice, ContainerEdits: edits}}}
}

// CDISpecFile is the name of the spec's file in a CDI directory: the
// resource's vendor and class, as the CDI's own tools name theirs.
func (p *Plugin) CDISpecFile() string {
	return strings.ReplaceAll(p.cfg.Resource, "/", "-") + ".json"
}

// WriteCDISpec writes the plugin's CDI spec into dir, replacing the file
// at once (a runtime reading it sees the old spec or the new one), and
// returns its path.
func (p *Plugin) WriteCDISpec(dir string) (string, error) {
	b, err := json.MarshalIndent(p.CDISpec(), "", "  ")
	if err != nil {
		return "", fmt.Errorf("deviceplugin: encoding the CDI spec: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("deviceplugin: %w", err)
	}
	path := filepath.Join(dir, p.CDISpecFile())
	tmp, err := os.CreateTemp(dir, ".taproce-cdi-*")
	if err != nil {
		return "", fmt.Errorf("deviceplugin: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return "", fmt.Errorf("deviceplugin: writing the CDI spec: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return "", fmt.Errorf("deviceplugin: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("deviceplugin: writing the CDI spec: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("deviceplugin: %w", err)
	}
	return path, nil
}
