package images

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/taproce/taproce/config"
	"github.com/taproce/taproce/deviceplugin"
	"github.com/taproce/taproce/internal/perf"
)

// TestDecodeYAML: the subset DecodeYAML reads, and what it refuses.
func TestDecodeYAML(t *testing.T) {
	good := []struct {
		name, text string
		want       []any
	}{
		{"scalars", "a: 1\nb: -2\nc: 1.5\nd: true\ne: null\nf: text with spaces # comment\ng: \"quoted # not a comment\"\nh: 'it''s'\ni: ~\nj: 0\nk: v1.2.3\nl: 127.0.0.1:9476\n",
			[]any{map[string]any{"a": int64(1), "b": int64(-2), "c": 1.5, "d": true, "e": nil, "f": "text with spaces",
				"g": "quoted # not a comment", "h": "it's", "i": nil, "j": int64(0), "k": "v1.2.3", "l": "127.0.0.1:9476"}}},
		{"nesting", "a:\n  b:\n    c: x\n  d: w\ne: z\n",
			[]any{map[string]any{"a": map[string]any{"b": map[string]any{"c": "x"}, "d": "w"}, "e": "z"}}},
		{"sequences", "a:\n  - x\n  - y: 1\n    z: 2\n  -\n    w: 3\nb:\n- p\n- q\nc: [\"m\", 2]\nd: []\ne: {}\n",
			[]any{map[string]any{"a": []any{"x", map[string]any{"y": int64(1), "z": int64(2)}, map[string]any{"w": int64(3)}},
				"b": []any{"p", "q"}, "c": []any{"m", int64(2)}, "d": []any{}, "e": map[string]any{}}}},
		{"flags as items", "args:\n  - -config=/x\n  - --\n  - --log-format=json\n",
			[]any{map[string]any{"args": []any{"-config=/x", "--", "--log-format=json"}}}},
		{"block scalars", "a: |\n  line 1\n    indented # kept\n\n  line 3\n\nb: |-\n  no newline\nc: x\n",
			[]any{map[string]any{"a": "line 1\n  indented # kept\n\nline 3\n", "b": "no newline", "c": "x"}}},
		{"documents", "# only a comment\n---\na: 1\n---\n---\nb: 2\n",
			[]any{map[string]any{"a": int64(1)}, map[string]any{"b": int64(2)}}},
		{"prefixed keys", "app.kubernetes.io/name: x\n\"quoted key\": w\n",
			[]any{map[string]any{"app.kubernetes.io/name": "x", "quoted key": "w"}}},
	}
	for _, c := range good {
		t.Run(c.name, func(t *testing.T) {
			got, err := DecodeYAML([]byte(c.text))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				gj, _ := json.Marshal(got)
				wj, _ := json.Marshal(c.want)
				t.Fatalf("got  %s\nwant %s", gj, wj)
			}
		})
	}
	bad := map[string]string{
		"repeated key":       "a: 1\na: 2\n",
		"tab":                "a:\n\tb: 1\n",
		"anchor":             "a: &x 1\n",
		"alias":              "a: *x\n",
		"tag":                "a: !!str 1\n",
		"folded":             "a: >\n  x\n",
		"flow mapping":       "a: {b: 1}\n",
		"yes":                "a: yes\n",
		"octal":              "a: 0644\n",
		"True":               "a: True\n",
		"continued":          "a: one\n  two\n",
		"bad indentation":    "a:\n    b: 1\n  c: 2\n",
		"not a mapping line": "a: 1\njust text\n",
		"colon in value":     "a: b: c\n",
		"indented top":       "  a: 1\n",
		"unterminated":       "a: \"x\n",
		"item in mapping":    "a: 1\n- b\n",
	}
	for name, text := range bad {
		t.Run("refuses "+name, func(t *testing.T) {
			if v, err := DecodeYAML([]byte(text)); !errors.Is(err, ErrYAML) || !strings.Contains(err.Error(), "line ") {
				t.Fatalf("%q: %v, %v", text, v, err)
			}
		})
	}
}

// manifests returns the decoded manifests, failing the test on error.
func manifests(t *testing.T) []Manifest {
	t.Helper()
	ms, err := Manifests()
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

func find(t *testing.T, kind, name string) map[string]any {
	t.Helper()
	m, err := Find(kind, name)
	if err != nil {
		t.Fatal(err)
	}
	return m.Object
}

// applianceConfig returns the ConfigMap's configuration, parsed.
func applianceConfig(t *testing.T) *config.Config {
	t.Helper()
	text, err := ConfigTOML()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(text), "ConfigMap "+ConfigMapName)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestManifestKinds: every YAML file decodes; the kinds are the ones the
// README lists, and none is RBAC: the appliance does not talk to the API
// server.
func TestManifestKinds(t *testing.T) {
	var got []string
	for _, m := range manifests(t) {
		got = append(got, m.Kind+"/"+m.Name)
		if v, _ := m.Object["apiVersion"].(string); v == "" {
			t.Errorf("%v has no apiVersion", m)
		}
		switch m.Kind {
		case "ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding":
			t.Errorf("%v: the appliance does not use the API server and needs no RBAC", m)
		}
		if spec := podSpec(m); spec != nil && spec["automountServiceAccountToken"] != false {
			t.Errorf("%v mounts a service account token it does not use", m)
		}
	}
	slices.Sort(got)
	want := []string{"ConfigMap/taproce-config", "DaemonSet/taproce", "Namespace/taproce-system", "NetworkAttachmentDefinition/taproce-rdma",
		"Pod/taproce-ib-write-bw-client", "Pod/taproce-ib-write-bw-server", "Pod/taproce-perf-client", "Pod/taproce-perf-server",
		"Service/taproce-ib-write-bw", "Service/taproce-perf"}
	if !slices.Equal(got, want) {
		t.Fatalf("manifests %v, want %v", got, want)
	}
}

// podSpec returns the pod spec of a Pod or of a workload's template.
func podSpec(m Manifest) map[string]any {
	var v any
	switch m.Kind {
	case "Pod":
		v = Get(m.Object, "spec")
	case "DaemonSet", "Deployment", "StatefulSet", "Job":
		v = Get(m.Object, "spec", "template", "spec")
	}
	s, _ := v.(map[string]any)
	return s
}

// TestConfigMap: the ConfigMap's configuration is one the appliance
// accepts (as `taproce config` checks it), serves pods only through the
// socket, and keeps the admin API and state out of the directory pods
// mount.
func TestConfigMap(t *testing.T) {
	cfg := applianceConfig(t)
	if len(cfg.Ports) != 0 {
		t.Errorf("the DaemonSet's appliance has static ports: %+v", cfg.Ports)
	}
	if path.Dir(cfg.Socket) == path.Dir(cfg.AdminSocket) || path.Dir(cfg.Socket) == path.Dir(cfg.StateFile) {
		t.Errorf("the admin socket %s or state file %s is in the directory pods mount (%s)", cfg.AdminSocket, cfg.StateFile, path.Dir(cfg.Socket))
	}
	if host, _, err := net.SplitHostPort(cfg.MetricsAddress); err != nil || host != "127.0.0.1" {
		t.Errorf("metrics_address %q: want the node's loopback, which the probes use", cfg.MetricsAddress)
	}
}

// container returns the DaemonSet's appliance container.
func applianceContainer(t *testing.T) (spec, c map[string]any) {
	t.Helper()
	ds := find(t, "DaemonSet", "taproce")
	spec, _ = Get(ds, "spec", "template", "spec").(map[string]any)
	c = Named(spec["containers"], "appliance")
	if c == nil {
		t.Fatal("the DaemonSet has no container named appliance")
	}
	return spec, c
}

// hostMount returns the host path behind the container's mount at
// mountPath, "" when there is none.
func hostMount(spec, c map[string]any, mountPath string) (string, map[string]any) {
	for _, vm := range c["volumeMounts"].([]any) {
		m := vm.(map[string]any)
		if m["mountPath"] != mountPath {
			continue
		}
		v := Named(spec["volumes"], m["name"].(string))
		p, _ := Get(v, "hostPath", "path").(string)
		return p, m
	}
	return "", nil
}

// TestDaemonSet: the DaemonSet matches the configuration and the
// entrypoint: host network and PIDs; the least capabilities; the probes
// on the configuration's metrics address; the socket directories, CNI
// directories, namespaces and /dev/net/tun mounted where the appliance
// and the entrypoint look for them.
func TestDaemonSet(t *testing.T) {
	cfg := applianceConfig(t)
	spec, c := applianceContainer(t)
	if spec["hostNetwork"] != true || spec["hostPID"] != true {
		t.Errorf("hostNetwork %v, hostPID %v: want both", spec["hostNetwork"], spec["hostPID"])
	}
	sc, _ := c["securityContext"].(map[string]any)
	if add := Strings(Get(sc, "capabilities", "add")); !slices.Equal(add, []string{"NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"}) {
		t.Errorf("capabilities added: %v", add)
	}
	if drop := Strings(Get(sc, "capabilities", "drop")); !slices.Equal(drop, []string{"ALL"}) {
		t.Errorf("capabilities dropped: %v", drop)
	}
	if sc["privileged"] != false || sc["readOnlyRootFilesystem"] != true {
		t.Errorf("security context %v", sc)
	}
	// Kubernetes refuses allowPrivilegeEscalation: false with SYS_ADMIN.
	if v, ok := sc["allowPrivilegeEscalation"]; ok && v == false {
		t.Error("allowPrivilegeEscalation: false is invalid with CAP_SYS_ADMIN")
	}
	if Get(c, "resources", "requests", "cpu") == nil || Get(c, "resources", "requests", "memory") == nil {
		t.Error("no resource requests")
	}

	host, port, _ := net.SplitHostPort(cfg.MetricsAddress)
	for _, probe := range []string{"startupProbe", "livenessProbe", "readinessProbe"} {
		g, _ := Get(c, probe, "httpGet").(map[string]any)
		if g == nil || g["host"] != host || g["path"] != "/healthz" || jsonString(g["port"]) != port {
			t.Errorf("%s %v: want GET http://%s/healthz", probe, g, cfg.MetricsAddress)
		}
	}

	for dir, host := range map[string]string{
		path.Dir(cfg.Socket):      path.Dir(cfg.Socket),
		path.Dir(cfg.AdminSocket): path.Dir(cfg.AdminSocket),
		path.Dir(cfg.StateFile):   path.Dir(cfg.StateFile),
		"/host/opt/cni/bin":       "/opt/cni/bin",
		"/host/etc/cni/net.d":     "/etc/cni/net.d",
		entrypointLibDir:          NodeLibDir,
		"/var/run/netns":          "/var/run/netns",
		"/dev/net/tun":            "/dev/net/tun",
	} {
		if got, _ := hostMount(spec, c, dir); got != host {
			t.Errorf("%s is mounted from the host's %q, want %s", dir, got, host)
		}
	}
	if _, m := hostMount(spec, c, "/var/run/netns"); m == nil || m["mountPropagation"] != "HostToContainer" {
		t.Errorf("/var/run/netns without HostToContainer propagation: %v", m)
	}
	// The configuration is the ConfigMap's, where the entrypoint reads it.
	var cfgArg string
	for _, a := range Strings(c["args"]) {
		if v, ok := strings.CutPrefix(a, "-config="); ok {
			cfgArg = v
		}
	}
	mounted := false
	for _, vm := range c["volumeMounts"].([]any) {
		m := vm.(map[string]any)
		v := Named(spec["volumes"], m["name"].(string))
		if Get(v, "configMap", "name") == ConfigMapName && path.Join(m["mountPath"].(string), ConfigKey) == cfgArg {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("-config=%s is not the ConfigMap's %s", cfgArg, ConfigKey)
	}
}

// TestDevicePluginContainer: the DaemonSet runs taproce's device plugin
// beside the appliance, without privileges, with the kubelet's
// device-plugin directory and a CDI directory from the node, the
// appliance's admin socket, and flags naming the ConfigMap's control
// socket directory, admin socket and the directory the entrypoint
// installs the libraries into — what its Allocate mounts into pods.
func TestDevicePluginContainer(t *testing.T) {
	cfg := applianceConfig(t)
	ds := find(t, "DaemonSet", "taproce")
	spec, _ := Get(ds, "spec", "template", "spec").(map[string]any)
	c := Named(spec["containers"], "device-plugin")
	if c == nil {
		t.Fatal("the DaemonSet has no container named device-plugin")
	}
	if cmd := Strings(c["command"]); !slices.Equal(cmd, []string{"/usr/local/bin/taproce", "device-plugin"}) {
		t.Errorf("command %v", cmd)
	}
	flags := map[string]string{}
	for _, a := range Strings(c["args"]) {
		if k, v, ok := strings.Cut(strings.TrimLeft(a, "-"), "="); ok {
			flags[k] = v
		}
	}
	for k, want := range map[string]string{"admin-socket": cfg.AdminSocket, "socket-dir": path.Dir(cfg.Socket), "lib-dir": NodeLibDir} {
		if flags[k] != want {
			t.Errorf("--%s=%q, want %q", k, flags[k], want)
		}
	}
	for dir, host := range map[string]string{
		"/var/lib/kubelet/device-plugins": "/var/lib/kubelet/device-plugins",
		"/var/run/cdi":                    "/var/run/cdi",
		path.Dir(cfg.AdminSocket):         path.Dir(cfg.AdminSocket),
	} {
		if got, _ := hostMount(spec, c, dir); got != host {
			t.Errorf("%s is mounted from the host's %q, want %s", dir, got, host)
		}
	}
	sc, _ := c["securityContext"].(map[string]any)
	if Get(sc, "capabilities", "add") != nil || !slices.Equal(Strings(Get(sc, "capabilities", "drop")), []string{"ALL"}) ||
		sc["allowPrivilegeEscalation"] != false || sc["readOnlyRootFilesystem"] != true {
		t.Errorf("security context %v: the plugin needs no privilege", sc)
	}
	if Get(c, "resources", "requests", "cpu") == nil || Get(c, "resources", "requests", "memory") == nil {
		t.Error("no resource requests")
	}
}

// jsonString renders a scalar as its text (a port given as number or
// name).
func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return strings.Trim(string(b), `"`)
}

// chained checks a conflist's text: libcni loads it, taproce-cni comes
// after the plugin that assigns the addresses, and it names the admin
// socket of the ConfigMap.
func chained(t *testing.T, what, text string, cfg *config.Config) *libcni.NetworkConfigList {
	t.Helper()
	list, err := libcni.ConfListFromBytes([]byte(text))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	last := list.Plugins[len(list.Plugins)-1]
	var entry struct {
		AdminSocket string `json:"adminSocket"`
	}
	json.Unmarshal(last.Bytes, &entry)
	if len(list.Plugins) < 2 || last.Network.Type != "taproce-cni" || entry.AdminSocket != cfg.AdminSocket {
		t.Errorf("%s: the last plugin is %s with adminSocket %q; want taproce-cni, after another, with %s", what, last.Network.Type, entry.AdminSocket, cfg.AdminSocket)
	}
	if list.Plugins[0].Network.IPAM.Type == "" {
		t.Errorf("%s: the first plugin assigns no addresses", what)
	}
	return list
}

// runtimeCNIVersions are the CNI versions whose results the runtimes of
// today's nodes can read: containerd 1.6 and 1.7 (and CRI-O, Multus)
// vendor libcni 1.1.2, which knows no 1.1.0 — with "cniVersion": "1.1.0"
// Debian's containerd 1.6 fails every pod's network with `plugin
// type="bridge" failed (add): unsupported CNI result version "1.1.0"`
// (TestCRI in internal/clustersim runs it).
var runtimeCNIVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0"}

// TestCNIExamples: the plain conflist and the NetworkAttachmentDefinition
// chain taproce-cni after a plugin with IPAM, to the ConfigMap's admin
// socket, at a CNI version the runtimes read.
func TestCNIExamples(t *testing.T) {
	cfg := applianceConfig(t)
	files, _ := Files.ReadDir(".")
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f.Name(), ".conflist") {
			data, _ := Files.ReadFile(f.Name())
			list := chained(t, f.Name(), string(data), cfg)
			if !slices.Contains(runtimeCNIVersions, list.CNIVersion) {
				t.Errorf("%s: cniVersion %q, which containerd 1.6 and 1.7 cannot read; want one of %v", f.Name(), list.CNIVersion, runtimeCNIVersions)
			}
			n++
		}
	}
	if n == 0 {
		t.Error("no conflist example")
	}
	nad := find(t, "NetworkAttachmentDefinition", "taproce-rdma")
	text, _ := Get(nad, "spec", "config").(string)
	list := chained(t, "NetworkAttachmentDefinition", text, cfg)
	if list.Name != "taproce-rdma" {
		t.Errorf("the NetworkAttachmentDefinition's network is named %s, not after the object", list.Name)
	}
	if !slices.Contains(runtimeCNIVersions, list.CNIVersion) {
		t.Errorf("the NetworkAttachmentDefinition: cniVersion %q; want one of %v", list.CNIVersion, runtimeCNIVersions)
	}
}

// TestPerfExample: the example pods run `taproce perf` command lines the
// command accepts, the client against the server through the headless
// Service; they ask for one slot of the device plugin, whose answer
// mounts the socket directory read-only and names the configuration's
// socket, mount nothing of the node's themselves, and need no privileges.
func TestPerfExample(t *testing.T) {
	svc := find(t, "Service", "taproce-perf")
	if Get(svc, "spec", "clusterIP") != "None" {
		t.Error("the Service is not headless: its name would not resolve to the server's GID")
	}
	var servers, clients int
	for _, m := range manifests(t) {
		if m.Kind != "Pod" || m.File != "perf-example.yaml" {
			continue
		}
		spec := podSpec(m)
		c := Get(spec, "containers", 0).(map[string]any)
		cmd := append(Strings(c["command"]), Strings(c["args"])...)
		if len(cmd) < 3 || path.Base(cmd[0]) != "taproce" || cmd[1] != "perf" {
			t.Fatalf("%v runs %v", m, cmd)
		}
		pc, err := perf.ParseArgs(cmd[2:])
		if err != nil {
			t.Fatalf("%v: taproce perf %v: %v", m, cmd[2:], err)
		}
		if pc.IsServer() {
			servers++
			if !selects(Get(svc, "spec", "selector"), Get(m.Object, "metadata", "labels")) {
				t.Errorf("the Service does not select the server %v", m)
			}
		} else {
			clients++
			if want := "taproce-perf." + m.Namespace + ".svc.cluster.local"; pc.Server != want {
				t.Errorf("the client connects to %s, want %s", pc.Server, want)
			}
		}
		checkRocePod(t, m, spec, c)
		sc, _ := c["securityContext"].(map[string]any)
		if sc["runAsNonRoot"] != true || sc["allowPrivilegeEscalation"] != false || !slices.Equal(Strings(Get(sc, "capabilities", "drop")), []string{"ALL"}) {
			t.Errorf("%v: security context %v: an application needs no privileges", m, sc)
		}
	}
	if servers != 1 || clients != 1 {
		t.Errorf("%d servers and %d clients", servers, clients)
	}
}

// ibverbsPod is a pod of ibverbs-example.yaml: its spec, its container
// and the program's command line.
type ibverbsPod struct {
	m       Manifest
	spec, c map[string]any
	cmd     []string
}

// ibverbsPods returns the server and the client of ibverbs-example.yaml.
func ibverbsPods(t *testing.T) (server, client ibverbsPod) {
	t.Helper()
	for _, m := range manifests(t) {
		if m.Kind != "Pod" || m.File != "ibverbs-example.yaml" {
			continue
		}
		spec := podSpec(m)
		c, _ := Get(spec, "containers", 0).(map[string]any)
		p := ibverbsPod{m: m, spec: spec, c: c, cmd: append(Strings(c["command"]), Strings(c["args"])...)}
		switch Get(m.Object, "metadata", "labels", "app.kubernetes.io/component") {
		case "server":
			server = p
		case "client":
			client = p
		}
	}
	if server.c == nil || client.c == nil {
		t.Fatal("ibverbs-example.yaml lacks a server or a client pod")
	}
	return server, client
}

// TestIbverbsExample: the pods run Debian's ib_write_bw itself on the
// GID of the pod's address, the client with the server's arguments and
// the headless Service's name; they ask for one slot of the device
// plugin, whose answer (with the DaemonSet's flags) mounts read-only the
// node's directory where the DaemonSet installs taproce's libibverbs.so.1
// and puts it in LD_LIBRARY_PATH, and mounts the appliance's socket as the
// perf pods get it; they mount nothing of the node's themselves and need
// no privileges.
func TestIbverbsExample(t *testing.T) {
	svc := find(t, "Service", "taproce-ib-write-bw")
	if Get(svc, "spec", "clusterIP") != "None" {
		t.Error("the Service is not headless: its name would not resolve to the server's GID")
	}
	server, client := ibverbsPods(t)
	if !selects(Get(svc, "spec", "selector"), Get(server.m.Object, "metadata", "labels")) ||
		selects(Get(svc, "spec", "selector"), Get(client.m.Object, "metadata", "labels")) {
		t.Error("the Service does not select the server alone")
	}
	if len(server.cmd) < 3 || server.cmd[0] != "/usr/bin/ib_write_bw" || !slices.Contains(server.cmd, "-x") ||
		server.cmd[slices.Index(server.cmd, "-x")+1] != "1" {
		t.Errorf("the server runs %v: want Debian's /usr/bin/ib_write_bw on GID index 1 (the pod's address)", server.cmd)
	}
	want := append(slices.Clone(server.cmd), "taproce-ib-write-bw."+client.m.Namespace+".svc.cluster.local")
	if !slices.Equal(client.cmd, want) {
		t.Errorf("the client runs %v, want %v", client.cmd, want)
	}
	ds, dsc := applianceContainer(t)
	if got, _ := hostMount(ds, dsc, entrypointLibDir); got != NodeLibDir {
		t.Fatalf("the DaemonSet installs the library into the host's %q, not %s", got, NodeLibDir)
	}
	for _, p := range []ibverbsPod{server, client} {
		if len(Get(p.spec, "containers").([]any)) != 1 {
			t.Errorf("%v: not one container", p.m)
		}
		checkRocePod(t, p.m, p.spec, p.c)
		sc, _ := p.c["securityContext"].(map[string]any)
		if sc["runAsNonRoot"] != true || sc["allowPrivilegeEscalation"] != false || !slices.Equal(Strings(Get(sc, "capabilities", "drop")), []string{"ALL"}) {
			t.Errorf("%v: security context %v: an application needs no privileges", p.m, sc)
		}
	}
}

// checkRocePod checks that the pod's container c asks for one slot of the
// device plugin's resource (deviceplugin.DefaultResource) and mounts no
// hostPath volume and sets no environment of the plugin's itself, and that
// the plugin, configured as the DaemonSet's device-plugin container flags
// it (TestDevicePluginContainer), answers with read-only mounts of the
// appliance's socket directory and NodeLibDir at the node's paths,
// TAPROCE_SOCKET the configuration's socket and LD_LIBRARY_PATH NodeLibDir.
func checkRocePod(t *testing.T, m Manifest, spec, c map[string]any) {
	t.Helper()
	cfg := applianceConfig(t)
	limits, _ := Get(c, "resources", "limits").(map[string]any)
	if q := limits[deviceplugin.DefaultResource]; fmt.Sprint(q) != "1" {
		t.Errorf("%v: limit %s %v, want 1", m, deviceplugin.DefaultResource, q)
	}
	// Kubernetes defaults an extended resource's request to its limit and
	// refuses a request that differs from it.
	requests, _ := Get(c, "resources", "requests").(map[string]any)
	if q, ok := requests[deviceplugin.DefaultResource]; ok && fmt.Sprint(q) != "1" {
		t.Errorf("%v: request %s %v, want 1 or none", m, deviceplugin.DefaultResource, q)
	}
	vols, _ := spec["volumes"].([]any)
	for _, v := range vols {
		if Get(v, "hostPath") != nil {
			t.Errorf("%v: volume %v: the device plugin mounts the node's directories", m, v)
		}
	}
	if spec["volumes"] != nil || c["volumeMounts"] != nil {
		t.Errorf("%v: volumes %v, mounts %v: the device plugin's answer is all the pod needs", m, spec["volumes"], c["volumeMounts"])
	}
	for _, name := range []string{"TAPROCE_SOCKET", "LD_LIBRARY_PATH"} {
		if env := Named(c["env"], name); env != nil {
			t.Errorf("%v sets %s %v: the device plugin sets it", m, name, env["value"])
		}
	}
	p, err := deviceplugin.New(deviceplugin.Config{SocketDir: path.Dir(cfg.Socket), Socket: path.Base(cfg.Socket), LibDir: NodeLibDir})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := p.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"roce-0"}}}})
	if err != nil || len(resp.ContainerResponses) != 1 {
		t.Fatalf("Allocate: %v %v", resp, err)
	}
	a := resp.ContainerResponses[0]
	if a.Envs["TAPROCE_SOCKET"] != cfg.Socket || a.Envs["LD_LIBRARY_PATH"] != NodeLibDir {
		t.Errorf("Allocate's environment %v: want TAPROCE_SOCKET=%s, LD_LIBRARY_PATH=%s", a.Envs, cfg.Socket, NodeLibDir)
	}
	mounts := map[string]bool{}
	for _, mnt := range a.Mounts {
		if mnt.HostPath == mnt.ContainerPath && mnt.ReadOnly {
			mounts[mnt.HostPath] = true
		}
	}
	if !mounts[path.Dir(cfg.Socket)] || !mounts[NodeLibDir] {
		t.Errorf("Allocate's mounts %v: want %s and %s read-only at the node's paths", a.Mounts, path.Dir(cfg.Socket), NodeLibDir)
	}
}

// selects reports whether every label of the selector is among labels.
func selects(selector, labels any) bool {
	s, _ := selector.(map[string]any)
	l, _ := labels.(map[string]any)
	for k, v := range s {
		if l[k] != v {
			return false
		}
	}
	return len(s) > 0
}

// TestReplaceDirs: the shipped configuration moved elsewhere keeps its
// other keys.
func TestReplaceDirs(t *testing.T) {
	text, err := ConfigTOML()
	if err != nil {
		t.Fatal(err)
	}
	moved := ReplaceDirs(text, map[string]string{"/run/taproce/": "/tmp/a/", "/run/taproce-admin/": "/tmp/b/"})
	cfg, err := config.Parse([]byte(moved), "moved")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Socket != "/tmp/a/taproce.sock" || cfg.AdminSocket != "/tmp/b/admin.sock" || cfg.StateFile != "/tmp/b/attachments.json" {
		t.Fatalf("moved: %s %s %s", cfg.Socket, cfg.AdminSocket, cfg.StateFile)
	}
	if orig := applianceConfig(t); cfg.MetricsAddress != orig.MetricsAddress || cfg.Limits != orig.Limits || cfg.Poll != orig.Poll {
		t.Fatal("other keys changed")
	}
}
