package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/taproce/taproce/config"
	"github.com/taproce/taproce/internal/ibvlib"
)

// The test binary plays two parts in TestSupervise, chosen by the
// environment: the entrypoint itself, and the appliance it starts (a
// stand-in that serves the admin socket of its configuration until
// SIGTERM, then exits with $FAKE_APPLIANCE_STATUS).
func TestMain(m *testing.M) {
	switch os.Getenv("ENTRYPOINT_TEST_ROLE") {
	case "entrypoint":
		if len(os.Args) > 1 && os.Args[1] == "run" {
			os.Exit(fakeAppliance(os.Args[2:]))
		}
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// fakeAppliance is `taproce run --config FILE [ARGS]` as far as the
// entrypoint can tell.
func fakeAppliance(args []string) int {
	if len(args) < 2 || args[0] != "--config" {
		fmt.Fprintf(os.Stderr, "fake appliance: arguments %q\n", args)
		return 2
	}
	cfg, err := config.Load(args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("fake appliance: extra arguments %q\n", args[2:])
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	if d := os.Getenv("FAKE_APPLIANCE_DELAY"); d != "" {
		dur, _ := time.ParseDuration(d)
		time.Sleep(dur)
	}
	ln, err := net.Listen("unix", cfg.AdminSocket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if os.Getenv("FAKE_APPLIANCE_EXIT") != "" {
		time.Sleep(300 * time.Millisecond)
		var code int
		fmt.Sscan(os.Getenv("FAKE_APPLIANCE_EXIT"), &code)
		return code
	}
	<-sigs
	return 0
}

// entrypoint starts the test binary as the entrypoint with args, the
// test binary also standing in for the appliance.
func entrypoint(t *testing.T, env []string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-taproce", os.Args[0]}, args...)...)
	cmd.Env = append(append(os.Environ(), "ENTRYPOINT_TEST_ROLE=entrypoint"), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// A process group of its own, killed whole when the test ends: a test
	// that fails before the entrypoint exits leaves no appliance behind
	// holding the output pipe, which Wait would wait on for ever.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	return cmd, &out
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, out *bytes.Buffer, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10 s; output:\n%s", what, out)
		}
	}
}

func exitCode(t *testing.T, cmd *exec.Cmd, out *bytes.Buffer) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			return 0
		}
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatalf("the entrypoint did not exit; output:\n%s", out)
	}
	return -1
}

// TestSupervise: the entrypoint runs the appliance with the
// configuration and extra arguments, installs the plugin once the admin
// socket accepts (with the socket of the configuration in the chained
// entry), passes SIGTERM on, exits with the appliance's status and, with
// -uninstall-on-exit, takes the plugin out again.
func TestSupervise(t *testing.T) {
	h := newHost(t)
	primary := filepath.Join(h.conf, "10-bridge.conflist")
	write(t, primary, bridgeConflist, 0o644)
	sock := filepath.Join(h.root, "run/admin.sock")
	os.MkdirAll(filepath.Dir(sock), 0o755)
	cfgPath := filepath.Join(h.root, "taproce.toml")
	write(t, cfgPath, fmt.Sprintf("admin_socket = %q\nsocket = %q\n", sock, filepath.Join(h.root, "run/taproce.sock")), 0o644)
	args := []string{"-plugin", h.plugin, "-cni-bin-dir", h.bin, "-cni-conf-dir", h.conf, "-lib", h.libSrc, "-lib-dir", h.libDir,
		"-config", cfgPath, "-resync", "100ms"}
	// onNode reports whether every library on the node is the image's,
	// and whether any is there at all.
	onNode := func(t *testing.T) (all, any bool) {
		t.Helper()
		all = true
		for _, name := range ibvlib.Names {
			data, err := os.ReadFile(filepath.Join(h.libDir, name))
			all = all && err == nil && string(data) == read(t, filepath.Join(h.libSrc, name))
			any = any || err == nil
		}
		return all, any
	}

	t.Run("SIGTERM", func(t *testing.T) {
		cmd, out := entrypoint(t, []string{"FAKE_APPLIANCE_DELAY=300ms"}, append(args, "-uninstall-on-exit", "--", "--log-level", "debug")...)
		// Nothing is chained before the appliance serves.
		time.Sleep(150 * time.Millisecond)
		if strings.Contains(read(t, primary), PluginType) {
			t.Fatal("chained before the appliance was ready")
		}
		waitFor(t, "chained entry", out, func() bool { return strings.Contains(read(t, primary), sock) })
		if _, err := os.Stat(filepath.Join(h.bin, PluginType)); err != nil {
			t.Fatal(err)
		}
		if all, _ := onNode(t); !all {
			t.Fatal("the libraries on the node are not the image's")
		}
		// The cluster's plugin rewrites its file: the entry comes back.
		write(t, primary, bridgeConflist, 0o644)
		waitFor(t, "entry restored", out, func() bool { return strings.Contains(read(t, primary), sock) })
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := exitCode(t, cmd, out); code != 0 {
			t.Fatalf("exit status %d; output:\n%s", code, out)
		}
		if !strings.Contains(out.String(), `extra arguments ["--log-level" "debug"]`) {
			t.Fatalf("the appliance did not get the extra arguments:\n%s", out)
		}
		if strings.Contains(read(t, primary), PluginType) {
			t.Fatal("-uninstall-on-exit left the entry")
		}
		if _, err := os.Stat(filepath.Join(h.bin, PluginType)); err == nil {
			t.Fatal("-uninstall-on-exit left the binary")
		}
		if _, any := onNode(t); any {
			t.Fatal("-uninstall-on-exit left a library")
		}
	})

	t.Run("appliance fails", func(t *testing.T) {
		cmd, out := entrypoint(t, []string{"FAKE_APPLIANCE_EXIT=3"}, args...)
		if code := exitCode(t, cmd, out); code != 3 {
			t.Fatalf("exit status %d, want the appliance's 3; output:\n%s", code, out)
		}
		// Without -uninstall-on-exit the plugin stays for the next run.
		if !strings.Contains(read(t, primary), sock) {
			t.Fatal("entry removed")
		}
	})

	t.Run("bad configuration", func(t *testing.T) {
		bad := filepath.Join(h.root, "bad.toml")
		write(t, bad, "admin_sockt = \"/x\"\n", 0o644)
		cmd, out := entrypoint(t, nil, append(args, "-config", bad)...)
		if code := exitCode(t, cmd, out); code != 1 || !strings.Contains(out.String(), "admin_sockt") {
			t.Fatalf("exit status %d; output:\n%s", code, out)
		}
	})

	t.Run("uninstall", func(t *testing.T) {
		if _, any := onNode(t); !any {
			t.Fatal("no library on the node to uninstall")
		}
		cmd, out := entrypoint(t, nil, append(args, "-uninstall")...)
		if code := exitCode(t, cmd, out); code != 0 || strings.Contains(read(t, primary), PluginType) {
			t.Fatalf("exit status %d; output:\n%s", code, out)
		}
		if _, any := onNode(t); any {
			t.Fatal("-uninstall left a library")
		}
	})

	t.Run("install only", func(t *testing.T) {
		cmd, out := entrypoint(t, nil, append(args, "-install-only")...)
		if code := exitCode(t, cmd, out); code != 0 || !strings.Contains(read(t, primary), sock) {
			t.Fatalf("exit status %d; output:\n%s", code, out)
		}
		if all, _ := onNode(t); !all {
			t.Fatalf("-install-only: the libraries on the node are not the image's; output:\n%s", out)
		}
	})
}

// TestLibFlag: -lib names the directory of the libraries, by default the
// image's; a path to one of them (the form -lib had when it installed
// libibverbs.so.1 alone) stands for its directory; -lib= installs none.
func TestLibFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, DefaultLibSrc},
		{[]string{"-lib", "/img/lib"}, "/img/lib"},
		{[]string{"-lib=/img/lib/"}, "/img/lib/"},
		{[]string{"-lib", "/img/lib/libibverbs.so.1"}, "/img/lib"},
		{[]string{"-lib", "/img/lib/librdmacm.so.1"}, "/img/lib"},
		{[]string{"-lib="}, ""},
	} {
		var stderr bytes.Buffer
		o, err := parseFlags(c.args, io.Discard, &stderr)
		if err != nil || o.install.LibSrc != c.want {
			t.Errorf("%q: %+v, %v; want -lib %q\n%s", c.args, o, err, c.want, &stderr)
		}
	}
	h := newHost(t)
	cfgPath := filepath.Join(h.root, "taproce.toml")
	write(t, cfgPath, fmt.Sprintf("admin_socket = %q\nsocket = %q\n", filepath.Join(h.root, "admin.sock"), filepath.Join(h.root, "taproce.sock")), 0o644)
	cmd, out := entrypoint(t, nil, "-install-only", "-mode=none", "-config", cfgPath,
		"-plugin", h.plugin, "-cni-bin-dir", h.bin, "-lib", filepath.Join(h.libSrc, ibvlib.Name), "-lib-dir", h.libDir)
	if code := exitCode(t, cmd, out); code != 0 {
		t.Fatalf("exit status %d; output:\n%s", code, out)
	}
	for _, name := range ibvlib.Names {
		if got, want := read(t, filepath.Join(h.libDir, name)), read(t, filepath.Join(h.libSrc, name)); got != want {
			t.Errorf("-lib FILE: %s on the node %q, want %q", name, got, want)
		}
	}
}
