// Package images holds what runs taproce on Kubernetes: the image's
// entrypoint (images/entrypoint), the DaemonSet with the appliance's
// ConfigMap (taproce.yaml), a plain chained CNI configuration
// (10-taproce-bridge.conflist), a Multus NetworkAttachmentDefinition, a
// perftest example (perf-example.yaml) and Debian's ib_write_bw between
// pods on taproce's libibverbs.so.1 and librdmacm.so.1
// (ibverbs-example.yaml). README.md explains them.
//
// The package gives tests and tools those files as data: Files, the
// decoded Manifests, and the appliance configuration of the ConfigMap
// (ConfigTOML), so that what is tested is what is shipped.
package images

import (
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"strings"
)

// Files are the manifests and CNI configuration examples of this
// directory.
//
//go:embed *.yaml *.conflist
var Files embed.FS

// NodeLibDir is the node's directory where the DaemonSet's entrypoint
// installs taproce's libibverbs.so.1 and librdmacm.so.1 and from which
// pods mount them (a hostPath): a directory of its own, so that a pod's LD_LIBRARY_PATH
// names nothing else of the node's.
const NodeLibDir = "/opt/taproce/lib"

// ConfigMapName is the ConfigMap holding the appliance's configuration,
// ConfigKey its key.
const (
	ConfigMapName = "taproce-config"
	ConfigKey     = "taproce.toml"
)

// Manifest is one document of a YAML file of Files.
type Manifest struct {
	// File is the file's name, Index the document's position in it.
	File  string
	Index int
	// Kind, Name and Namespace are the object's kind and metadata.
	Kind, Name, Namespace string
	// Object is the decoded document.
	Object map[string]any
}

// String names the manifest for messages: FILE#INDEX KIND/NAME.
func (m Manifest) String() string {
	return fmt.Sprintf("%s#%d %s/%s", m.File, m.Index, m.Kind, m.Name)
}

// YAMLFiles returns the names of the YAML files of Files, sorted.
func YAMLFiles() []string {
	names, _ := fs.Glob(Files, "*.yaml")
	slices.Sort(names)
	return names
}

// Manifests decodes every document of every YAML file of Files with
// DecodeYAML. Each must be a mapping with a kind and a metadata.name.
func Manifests() ([]Manifest, error) {
	var out []Manifest
	for _, name := range YAMLFiles() {
		data, err := Files.ReadFile(name)
		if err != nil {
			return nil, err
		}
		docs, err := DecodeYAML(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		for i, d := range docs {
			obj, ok := d.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%s: document %d is not a mapping", name, i)
			}
			m := Manifest{File: name, Index: i, Object: obj}
			m.Kind, _ = obj["kind"].(string)
			m.Name, _ = Get(obj, "metadata", "name").(string)
			m.Namespace, _ = Get(obj, "metadata", "namespace").(string)
			if m.Kind == "" || m.Name == "" {
				return nil, fmt.Errorf("%s: document %d has no kind or metadata.name", name, i)
			}
			out = append(out, m)
		}
	}
	return out, nil
}

// Find returns the manifest of the given kind and name.
func Find(kind, name string) (Manifest, error) {
	ms, err := Manifests()
	if err != nil {
		return Manifest{}, err
	}
	for _, m := range ms {
		if m.Kind == kind && m.Name == name {
			return m, nil
		}
	}
	return Manifest{}, fmt.Errorf("images: no %s named %s", kind, name)
}

// ConfigTOML returns the appliance configuration the DaemonSet runs
// with: the ConfigMap's taproce.toml.
func ConfigTOML() (string, error) {
	m, err := Find("ConfigMap", ConfigMapName)
	if err != nil {
		return "", err
	}
	s, ok := Get(m.Object, "data", ConfigKey).(string)
	if !ok {
		return "", fmt.Errorf("images: %v has no data.%s", m, ConfigKey)
	}
	return s, nil
}

// Get follows path (map keys as strings, sequence indexes as ints)
// from v and returns what it finds, nil when a step is missing.
func Get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			s, ok := v.([]any)
			if !ok || k < 0 || k >= len(s) {
				return nil
			}
			v = s[k]
		default:
			return nil
		}
	}
	return v
}

// Named returns the element of a sequence of mappings whose "name" is
// name (a container, a volume, a volume mount), nil when there is none.
func Named(seq any, name string) map[string]any {
	s, _ := seq.([]any)
	for _, e := range s {
		if m, ok := e.(map[string]any); ok && m["name"] == name {
			return m
		}
	}
	return nil
}

// Strings returns a sequence of strings as a []string; other elements
// are left out.
func Strings(seq any) []string {
	s, _ := seq.([]any)
	var out []string
	for _, e := range s {
		if str, ok := e.(string); ok {
			out = append(out, str)
		}
	}
	return out
}

// ReplaceDirs returns a configuration text with each directory prefix
// old of dirs replaced by its new value, for running the shipped
// configuration with its sockets somewhere else (tests, a lab).
func ReplaceDirs(text string, dirs map[string]string) string {
	keys := make([]string, 0, len(dirs))
	for k := range dirs {
		keys = append(keys, k)
	}
	// Longer prefixes first: /run/taproce-admin/ before /run/taproce/.
	slices.SortFunc(keys, func(a, b string) int { return len(b) - len(a) })
	args := make([]string, 0, 2*len(keys))
	for _, k := range keys {
		args = append(args, k, dirs[k])
	}
	return strings.NewReplacer(args...).Replace(text)
}
