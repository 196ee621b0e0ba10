package runon

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/taproce/taproce/verbs"
	"github.com/taproce/taproce/verbs/abi"
)

// testDevices are two devices as the appliance reports them: GIDs
// link-local and IPv4 in a table of 16, port attributes as rxe's.
func testDevices() []Device {
	var fw abi.Name
	copy(fw[:], "1.2.3")
	dev := func(name string, index int, guid uint64, ip string, netdev string) Device {
		return Device{Name: name, Index: index, Netdev: netdev,
			Attr: verbs.DeviceAttr{FWVer: fw, NodeGUID: guid, SysImageGUID: guid},
			Port: verbs.PortAttr{State: 4, MaxMTU: 5, ActiveMTU: 3, LinkLayer: 2, PhysState: 5, ActiveWidth: 1,
				ActiveSpeed: 1, GIDTblLen: 16, PortCapFlags: 0x04010000, PKeyTblLen: 1,
				GIDs: []netip.Addr{netip.MustParseAddr("fe80::c26a:15ff:feeb:5927"), netip.MustParseAddr(ip)}}}
	}
	return []Device{dev("taproce0", 0, 0xc06a15fffeeb5927, "10.77.0.1", "eth0"), dev("taproce1", 1, 0x3cd69ffffe50b788, "10.77.0.2", "")}
}

func readTree(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestWriteSysfs: the files rxe's devices have in /sys/class/infiniband
// and /sys/class/infiniband_verbs (Linux 6.1), with the kernel's formats:
// what the test's expectations hold was read from an rxe device's tree.
func TestWriteSysfs(t *testing.T) {
	class := t.TempDir()
	if err := WriteSysfs(class, testDevices()); err != nil {
		t.Fatal(err)
	}
	ib := filepath.Join(class, "infiniband")
	for path, want := range map[string]string{
		"infiniband/taproce0/node_type":                 "1: CA\n",
		"infiniband/taproce0/node_guid":                 "c06a:15ff:feeb:5927\n",
		"infiniband/taproce0/sys_image_guid":            "c06a:15ff:feeb:5927\n",
		"infiniband/taproce0/fw_ver":                    "1.2.3\n",
		"infiniband/taproce0/uevent":                    "NAME=taproce0\n",
		"infiniband/taproce0/parent":                    "eth0\n",
		"infiniband/taproce0/ports/1/state":             "4: ACTIVE\n",
		"infiniband/taproce0/ports/1/phys_state":        "5: LinkUp\n",
		"infiniband/taproce0/ports/1/link_layer":        "Ethernet\n",
		"infiniband/taproce0/ports/1/rate":              "2.5 Gb/sec (1X SDR)\n",
		"infiniband/taproce0/ports/1/cap_mask":          "0x04010000\n",
		"infiniband/taproce0/ports/1/lid":               "0x0\n",
		"infiniband/taproce0/ports/1/sm_lid":            "0x0\n",
		"infiniband/taproce0/ports/1/pkeys/0":           "0xffff\n",
		"infiniband/taproce0/ports/1/gids/0":            "fe80:0000:0000:0000:c26a:15ff:feeb:5927\n",
		"infiniband/taproce0/ports/1/gids/1":            "0000:0000:0000:0000:0000:ffff:0a4d:0001\n",
		"infiniband/taproce0/ports/1/gids/15":           "0000:0000:0000:0000:0000:0000:0000:0000\n",
		"infiniband/taproce0/ports/1/gid_attrs/types/0": "RoCE v2\n",
		"infiniband/taproce0/ports/1/gid_attrs/types/1": "RoCE v2\n",
		"infiniband/taproce0/ports/1/gid_attrs/ndevs/1": "eth0\n",
		"infiniband/taproce1/ports/1/gids/1":            "0000:0000:0000:0000:0000:ffff:0a4d:0002\n",
		"infiniband/taproce1/ports/1/gid_attrs/types/1": "RoCE v2\n",
		"infiniband_verbs/abi_version":                  "6\n",
		"infiniband_verbs/uverbs0/ibdev":                "taproce0\n",
		"infiniband_verbs/uverbs0/dev":                  "231:192\n",
		"infiniband_verbs/uverbs1/ibdev":                "taproce1\n",
		"infiniband_verbs/uverbs1/dev":                  "231:193\n",
		"infiniband_verbs/uverbs1/abi_version":          "2\n",
		"infiniband_verbs/uverbs1/uevent":               "MAJOR=231\nMINOR=193\nDEVNAME=infiniband/uverbs1\nDEVMODE=0666\n",
		"infiniband/taproce1/node_desc":                 "taproce\n",
	} {
		if got := readTree(t, filepath.Join(class, path)); got != want {
			t.Errorf("%s = %q, want %q", path, got, want)
		}
	}
	// What rxe's tree fails to read is absent: the types of empty GID
	// entries, the netdev of a device without one.
	for _, path := range []string{"taproce0/ports/1/gid_attrs/types/2", "taproce1/ports/1/gid_attrs/ndevs/0", "taproce1/parent"} {
		if _, err := os.Stat(filepath.Join(ib, path)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want it absent", path, err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(ib, "taproce0", "ports", "1", "gids")); len(ents) != 16 {
		t.Errorf("%d GID entries, want the table's 16", len(ents))
	}
	if st, err := os.Stat(filepath.Join(ib, "taproce0", "node_guid")); err != nil || st.Mode().Perm() != 0o444 {
		t.Errorf("node_guid: %v, %v; want mode 0444", st.Mode(), err)
	}
}

// TestRate: the kernel's rate_show for each speed and width.
func TestRate(t *testing.T) {
	for _, c := range []struct {
		speed, width uint8
		want         string
	}{
		{1, 1, "2.5 Gb/sec (1X SDR)"}, {1, 2, "10 Gb/sec (4X SDR)"}, {2, 2, "20 Gb/sec (4X DDR)"},
		{4, 2, "40 Gb/sec (4X QDR)"}, {16, 2, "56 Gb/sec (4X FDR)"}, {32, 2, "100 Gb/sec (4X EDR)"},
		{32, 16, "50 Gb/sec (2X EDR)"}, {128, 8, "1200 Gb/sec (12X NDR)"}, {0, 1, "2.5 Gb/sec (1X SDR)"},
	} {
		if got := rate(c.speed, c.width); got != c.want {
			t.Errorf("rate(%d, %d) = %q, want %q", c.speed, c.width, got, c.want)
		}
	}
}

// TestWriteDev: the uverbs nodes as udev makes them, and empty files
// where mknod is refused, named so that the caller can stand others in.
func TestWriteDev(t *testing.T) {
	if os.Geteuid() == 0 {
		dir := filepath.Join(t.TempDir(), "infiniband")
		if missing, err := WriteDev(dir, testDevices(), mknod); err != nil || missing != nil {
			t.Fatalf("WriteDev: %v %v", missing, err)
		}
		for i, name := range []string{"uverbs0", "uverbs1"} {
			st, err := os.Stat(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			sys := st.Sys().(*syscall.Stat_t)
			if st.Mode()&os.ModeCharDevice == 0 || st.Mode().Perm() != 0o666 || sys.Rdev != uint64(231<<8|(192+i)) {
				t.Errorf("%s: mode %v, device %#x; want a character device 231:%d, 0666", name, st.Mode(), sys.Rdev, 192+i)
			}
		}
	}
	dir := filepath.Join(t.TempDir(), "infiniband")
	refuse := func(string, uint32, int, int) error { return syscall.EPERM }
	missing, err := WriteDev(dir, testDevices(), refuse)
	if !errors.Is(err, ErrNoMknod) || len(missing) != 2 || !strings.HasSuffix(missing[1], "/uverbs1") {
		t.Fatalf("WriteDev without mknod: %v, %v", missing, err)
	}
	for _, m := range missing {
		if _, err := os.Stat(m); err != nil {
			t.Errorf("%s not made for a stand-in: %v", m, err)
		}
	}
}
