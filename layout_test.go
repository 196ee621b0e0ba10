package main

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/taproce/taproce"

// pkgInfo is what go list says of one package: what it imports itself
// (tests included) and everything it depends on when built.
type pkgInfo struct {
	imports []string // of ours, direct, from the package and its tests
	deps    []string // of ours, transitive, of the package as built
}

// listPackages runs go list over the module.
func listPackages(t *testing.T) map[string]pkgInfo {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to list the packages with")
	}
	out, err := exec.Command("go", "list", "-f",
		`{{.ImportPath}}|{{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}|{{join .Deps " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	ours := func(s string) []string {
		var r []string
		for _, p := range strings.Fields(s) {
			if p == module || strings.HasPrefix(p, module+"/") {
				r = append(r, strings.TrimPrefix(strings.TrimPrefix(p, module), "/"))
			}
		}
		return r
	}
	pkgs := map[string]pkgInfo{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 3 {
			t.Fatalf("go list line %q", line)
		}
		name := strings.TrimPrefix(strings.TrimPrefix(f[0], module), "/")
		pkgs[name] = pkgInfo{imports: ours(f[1]), deps: ours(f[2])}
	}
	return pkgs
}

func under(pkg, dir string) bool { return pkg == dir || strings.HasPrefix(pkg, dir+"/") }

// TestLayout holds the imports to the directions the design gives them
// (DESIGN.md, "Layout"): the wire format and the ABI depend on nothing
// of ours; the transport knows only them; the configuration, the verbs
// library, the CNI plugin and the device plugin know no part of the
// appliance they need not;
// only the appliance uses its polling loop.
func TestLayout(t *testing.T) {
	pkgs := listPackages(t)
	for _, rule := range []struct {
		name string
		pkg  string // the packages under this directory
		// ok reports whether a package of ours may be among what the
		// rule looks at: the direct imports (deps false) or all the
		// dependencies (deps true).
		deps bool
		ok   func(string) bool
	}{
		{"the wire format depends on nothing of ours", "appliance/roce", true, func(string) bool { return false }},
		{"the ABI depends on nothing of ours", "verbs/abi", true, func(string) bool { return false }},
		{"busy-polling clients depend on nothing of ours", "internal/spin", true, func(string) bool { return false }},
		{"the transport knows the wire format and the ABI", "appliance/transport", true, func(p string) bool {
			return p == "appliance/roce" || p == "verbs/abi"
		}},
		{"the connection manager knows the wire format only", "appliance/cm", true, func(p string) bool {
			return p == "appliance/roce"
		}},
		{"the configuration knows no part of the appliance", "config", true, func(p string) bool {
			return !under(p, "appliance")
		}},
		{"the verbs library never needs the appliance", "verbs", true, func(p string) bool {
			return !under(p, "appliance")
		}},
		{"the TAP devices know no part of the appliance", "tap", true, func(p string) bool {
			return !under(p, "appliance")
		}},
		{"the CNI plugin talks to the appliance through its admin API only", "cni", true, func(p string) bool {
			return !under(p, "appliance") || p == "appliance/admin"
		}},
		{"the device plugin talks to the appliance through its admin API only", "deviceplugin", true, func(p string) bool {
			return !under(p, "appliance") || p == "appliance/admin"
		}},
	} {
		for name, info := range pkgs {
			if !under(name, rule.pkg) {
				continue
			}
			list := info.imports
			if rule.deps {
				list = info.deps
			}
			for _, p := range list {
				if !under(p, rule.pkg) && !rule.ok(p) {
					t.Errorf("%s: %s depends on %s", rule.name, name, p)
				}
			}
		}
	}
	// Only the appliance imports its loop.
	for name, info := range pkgs {
		for _, p := range info.imports {
			if p == "appliance/poll" && !under(name, "appliance") {
				t.Errorf("%s imports the appliance's polling loop", name)
			}
		}
	}
}
