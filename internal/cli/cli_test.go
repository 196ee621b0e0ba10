package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/taproce/taproce/internal/testvectors"
)

func runCmd(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestDecodeCommand(t *testing.T) {
	dir := testvectors.Dir(t)
	files, _ := filepath.Glob(filepath.Join(dir, "*.pcap"))
	code, out, errOut := runCmd(append([]string{"decode"}, files...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "icrc=ok") || strings.Contains(out, "icrc=BAD") {
		t.Fatalf("unexpected output:\n%.2000s", out)
	}
	if !strings.Contains(errOut, " 0 bad") {
		t.Fatalf("summary: %s", errOut)
	}

	// Flip one payload byte of one RoCE frame: exit status 1.
	data, err := os.ReadFile(filepath.Join(dir, "rxe-send.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	idx := bytes.Index(data, []byte{0x12, 0xB7}) // first UDP/4791 destination port
	if idx < 0 {
		t.Fatal("no RoCE frame in rxe-send.pcap")
	}
	data[idx+30] ^= 0x01 // inside the BTH or payload, covered by the ICRC
	bad := filepath.Join(t.TempDir(), "bad.pcap")
	if err := os.WriteFile(bad, data, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runCmd("decode", bad)
	if code != 1 || !strings.Contains(out, "icrc=BAD(want 0x") {
		t.Fatalf("corrupted capture: exit %d\n%.1500s", code, out)
	}
	code, out, _ = runCmd("decode", "--json", filepath.Join(dir, "rxe-read.pcap"))
	if code != 0 || !strings.HasPrefix(out, "{") {
		t.Fatalf("--json: exit %d\n%.500s", code, out)
	}
}

// TestDecodeUnreadable: a file that is not a capture gets one error line
// and exit status 2, and no summary of the frames it did not have; beside
// a capture, the summary says how many of the files it counts.
func TestDecodeUnreadable(t *testing.T) {
	text := filepath.Join(t.TempDir(), "x.txt")
	if err := os.WriteFile(text, []byte("not a capture\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCmd("decode", text)
	if want := "taproce decode: " + text + ": not a pcap or pcapng file\n"; code != 2 || out != "" || errOut != want {
		t.Errorf("decode %s: exit %d, out %q, err %q; want 2, nothing and %q", text, code, out, errOut, want)
	}
	good := filepath.Join(testvectors.Dir(t), "rxe-send.pcap")
	code, _, errOut = runCmd("decode", "-q", good, text)
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	if code != 2 || len(lines) != 2 || lines[0] != "taproce decode: "+text+": not a pcap or pcapng file" ||
		!strings.Contains(lines[1], " frames in 1 of 2 files: ") {
		t.Errorf("decode a capture and a text file: exit %d\n%s", code, errOut)
	}
}

func TestCommandLine(t *testing.T) {
	tests := []struct {
		args []string
		code int
		out  string
	}{
		{nil, 2, ""},
		{[]string{"nonsense"}, 2, ""},
		{[]string{"help"}, 0, "decode"},
		{[]string{"--version"}, 0, "taproce "},
		{[]string{"version"}, 0, "taproce "},
		{[]string{"decode"}, 2, ""},
		{[]string{"decode", "-h"}, 0, ""},
		{[]string{"decode", "/nonexistent/file.pcap"}, 2, ""},
		{[]string{"config", "../../config/taproce.toml"}, 0, "ok"},
		{[]string{"config", "/nonexistent.toml"}, 1, ""},
		{[]string{"config"}, 2, ""},
		{[]string{"lab", "-h"}, 0, ""},
		{[]string{"lab", "extra"}, 2, ""},
	}
	for _, tt := range tests {
		code, out, _ := runCmd(tt.args...)
		if code != tt.code || !strings.Contains(out, tt.out) {
			t.Errorf("taproce %v: exit %d, out %q; want %d and %q", tt.args, code, out, tt.code, tt.out)
		}
	}
}

// TestConfigCommandErrors: an invalid file exits 1 and names each problem
// with its line.
func TestConfigCommandErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.toml")
	text := "[[port]]\nnamespace = \"a\"\naddresses = [\"10.0.0.1/33\"]\nmtu = 100\nbogus = 1\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCmd("config", path)
	if code != 1 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{path + ":3:", path + ":4:", path + ":5:"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("no %q in %s", want, errOut)
		}
	}
}

// TestConfigCommandPlacement: `taproce config` shows where the appliance
// runs — procs and cpus as set, or chosen for it.
func TestConfigCommandPlacement(t *testing.T) {
	for _, c := range []struct{ text, procs, cpus string }{
		{"", "chosen by poll", "all"},
		{"procs = 2\ncpus = \"1,3-4\"\n", "2", "1,3-4"},
	} {
		path := filepath.Join(t.TempDir(), "p.toml")
		if err := os.WriteFile(path, []byte(c.text), 0o644); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := runCmd("config", path)
		if code != 0 {
			t.Fatalf("%q: exit %d: %s", c.text, code, errOut)
		}
		for _, want := range []string{"procs            " + c.procs + "\n", "cpus             " + c.cpus + "\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("%q: no %q in\n%s", c.text, want, out)
			}
		}
	}
}

// TestConfigCommandSocketAccess: `taproce config` shows who may connect
// to the control socket, and which devices it lists to them.
func TestConfigCommandSocketAccess(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"", "mode 0666, the appliance's group\n  device listing   a client's own namespace's only"},
		{"list_all_devices = true\n", "mode 0666, the appliance's group\n  device listing   all devices, other namespaces' unusable"},
		{"socket_mode = \"0660\"\nsocket_group = \"2000\"\n", "mode 0660, group 2000"},
		{"socket = \"@taproce\"\n", "abstract: any process in the appliance's network namespace"},
	} {
		path := filepath.Join(t.TempDir(), "s.toml")
		if err := os.WriteFile(path, []byte(c.text), 0o644); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := runCmd("config", path)
		if want := "  socket access    " + c.want + "\n"; code != 0 || !strings.Contains(out, want) {
			t.Errorf("%q: exit %d, no %q in\n%s%s", c.text, code, want, out, errOut)
		}
	}
}

// TestConfigCommandLimits: `taproce config` shows the limits of one
// client and of all of them, defaults included.
func TestConfigCommandLimits(t *testing.T) {
	for _, c := range []struct {
		text string
		want []string
	}{
		{"", []string{
			"  client limits    1024 QPs, 1024 CQs, 256 SRQs, 4096 MRs, 256 PDs, 4096 AHs, 1024 channels, 16 GiB of MRs\n",
			"  appliance limits 16384 QPs, 16384 CQs, 4096 SRQs, 65536 MRs, 16384 PDs, 65536 AHs, 16384 channels, 1 TiB of MRs\n",
			"  connections      4096, 2048 per user\n",
			"  descriptors      3/4 of RLIMIT_NOFILE for clients\n",
		}},
		{"[limits]\nchannels = 3\n[appliance_limits]\nqps = 7\nmr_bytes = \"2GiB\"\nconnections = 9\nconnections_per_uid = 4\ndescriptors = 500\n", []string{
			", 3 channels, 16 GiB of MRs\n",
			"  appliance limits 7 QPs, 16384 CQs, 4096 SRQs, 65536 MRs, 16384 PDs, 65536 AHs, 16384 channels, 2 GiB of MRs\n",
			"  connections      9, 4 per user\n",
			"  descriptors      500 for clients\n",
		}},
	} {
		path := filepath.Join(t.TempDir(), "l.toml")
		if err := os.WriteFile(path, []byte(c.text), 0o644); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := runCmd("config", path)
		for _, want := range c.want {
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("%q: exit %d, no %q in\n%s%s", c.text, code, want, out, errOut)
			}
		}
	}
}

// TestLabFlags: a bad --cpus or --procs is a usage error, named, before
// anything is built.
func TestLabFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"lab", "--cpus", "x"}, "--cpus"},
		{[]string{"lab", "--cpus", "3-1"}, "--cpus"},
		{[]string{"lab", "--procs", "-1"}, "--procs"},
		{[]string{"lab", "--poll", "busy"}, "busy"},
	} {
		code, _, errOut := runCmd(c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("taproce %v: exit %d, %q; want 2 naming %q", c.args, code, errOut, c.want)
		}
	}
}
