package cli

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/verbs"
)

// startVerbsRig runs an appliance with two ports (taproce0 10.77.0.1,
// taproce1 10.77.0.2) on a fake wire that TAPROCE_SOCKET names. Clients
// are in the ports' namespace until *elsewhere is set.
func startVerbsRig(t *testing.T) (app *appliance.Appliance, elsewhere *atomic.Bool) {
	t.Helper()
	r := appliancetest.New(t, appliancetest.Options{Namespace: "cmd"})
	return r.App, &r.Elsewhere
}

// rigNodeGUID is the EUI-64 node GUID of a port's MAC, as rxe derives it.
func rigNodeGUID(n *appliance.NIC) uint64 {
	m := n.Port().MAC()
	return binary.BigEndian.Uint64([]byte{m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]})
}

// TestDevicesCommand: ibv_devices' table, of the devices of this
// namespace, or of all the appliance shows with -a: those of other
// namespaces only when it lists all devices, which -a otherwise says.
func TestDevicesCommand(t *testing.T) {
	for _, listAll := range []bool{false, true} {
		t.Run(fmt.Sprintf("list_all_devices=%v", listAll), func(t *testing.T) {
			r := appliancetest.New(t, appliancetest.Options{Namespace: "cmd", ListAllDevices: listAll})
			want := "    device          \t   node GUID\n" +
				"    ------          \t----------------\n" +
				fmt.Sprintf("    taproce0        \t%016x\n", rigNodeGUID(r.NICs[0])) +
				fmt.Sprintf("    taproce1        \t%016x\n", rigNodeGUID(r.NICs[1]))
			header := strings.Join(strings.SplitAfter(want, "\n")[:2], "")
			hidden := "taproce devices: the appliance at " + verbs.Socket() + " shows a client only the devices of its own network namespace; " +
				"whether it serves others cannot be seen from here (its list_all_devices setting)\n"
			note := "taproce devices: no device of this network namespace is served by the appliance at " + verbs.Socket() +
				" (it does not show the devices of other namespaces)\n"
			wantAll, noteAll := want, hidden
			if listAll {
				note = "taproce devices: no device of this network namespace is served by the appliance at " + verbs.Socket() +
					" (`taproce devices -a` lists all 2)\n"
				noteAll = ""
			}
			code, out, errOut := runCmd("devices")
			if code != 0 || out != want || errOut != "" {
				t.Fatalf("devices: exit %d\n%q\nwant\n%q\n%s", code, out, want, errOut)
			}
			if code, out, errOut = runCmd("devices", "-a"); code != 0 || out != want || errOut != noteAll {
				t.Errorf("devices -a: exit %d\n%s%s\nwant 0 and\n%s%s", code, out, errOut, want, noteAll)
			}
			// From another namespace: the empty table and exit 0, as
			// ibv_devices with no device, and on stderr why it is empty.
			r.Elsewhere.Store(true)
			if code, out, errOut = runCmd("devices"); code != 0 || out != header || errOut != note {
				t.Errorf("devices from another namespace: exit %d\n%s%s\nwant 0 and\n%s%s", code, out, errOut, header, note)
			}
			if !listAll {
				wantAll = header
			}
			if code, out, errOut = runCmd("devices", "-a"); code != 0 || out != wantAll || errOut != noteAll {
				t.Errorf("devices -a from another namespace: exit %d\n%s%s\nwant 0 and\n%s%s", code, out, errOut, wantAll, noteAll)
			}
			if code, out, errOut = runCmd("devinfo"); code != 1 || out != "" ||
				errOut != "No IB devices found\n"+strings.Replace(note, "taproce devices:", "taproce devinfo:", 1) {
				t.Errorf("devinfo from another namespace: exit %d\n%s%s", code, out, errOut)
			}
			if code, _, _ = runCmd("devices", "extra"); code != 2 {
				t.Errorf("devices extra: exit %d", code)
			}
		})
	}
}

// TestNoAppliance: every verbs client of the command line, finding no
// appliance, says where it looked and how to get one, in the same words.
func TestNoAppliance(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	t.Setenv("TAPROCE_SOCKET", sock)
	for _, args := range [][]string{
		{"devices"}, {"devices", "-a"}, {"devinfo"}, {"devinfo", "-d", "taproce0"},
		{"pingpong"}, {"pingpong", "-d", "taproce0", "127.0.0.1"},
		{"perf", "write_bw"}, {"perf", "send_lat", "-d", "taproce0", "127.0.0.1"},
	} {
		code, out, errOut := runCmd(args...)
		want := "taproce " + args[0] + ": no appliance is listening at " + sock + "\n" +
			"Start one with `taproce run --config FILE`, or a lab with `taproce lab --keep`\n" +
			"(which prints the TAPROCE_SOCKET to use), or set TAPROCE_SOCKET to the socket\n" +
			"of a running appliance.\n"
		if code != 1 || out != "" || errOut != want {
			t.Errorf("taproce %q: exit %d, out %q, err\n%s\nwant 1 and\n%s", args, code, out, errOut, want)
		}
	}
}

// TestDevicesNone: an appliance that serves no device gives the empty
// table, exit 0, and a line on stderr saying so — or, when it shows a
// client only its own namespace's devices, that there is none of those.
func TestDevicesNone(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "taproce.sock")
	t.Setenv("TAPROCE_SOCKET", sock)
	for _, listAll := range []bool{false, true} {
		app, err := appliance.New(appliance.Options{Socket: sock, ListAllDevices: listAll, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := app.Control().Listen(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- app.Serve(ctx) }()
		header := "    device          \t   node GUID\n    ------          \t----------------\n"
		for _, c := range []struct {
			args []string
			note string
		}{
			{[]string{"devices"}, "no device of this network namespace is served by the appliance at " + sock +
				" (it does not show the devices of other namespaces)"},
			{[]string{"devices", "-a"}, "the appliance at " + sock + " shows a client only the devices of its own network namespace; " +
				"whether it serves others cannot be seen from here (its list_all_devices setting)"},
		} {
			if listAll {
				c.note = "the appliance at " + sock + " serves no device"
			}
			code, out, errOut := runCmd(c.args...)
			if note := "taproce devices: " + c.note + "\n"; code != 0 || out != header || errOut != note {
				t.Errorf("list_all_devices=%v %q: exit %d\n%s%s\nwant 0 and\n%s%s", listAll, c.args, code, out, errOut, header, note)
			}
		}
		cancel()
		<-done
		app.Close()
	}
}

// TestDevinfoCommand: ibv_devinfo's report, line for line, and with -v
// the extra attributes and the GID table.
func TestDevinfoCommand(t *testing.T) {
	app, _ := startVerbsRig(t)
	nic := app.NICs()[0]
	g := rigNodeGUID(nic)
	guid := fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff)
	want := "hca_id:\ttaproce0\n" +
		"\ttransport:\t\t\tInfiniBand (0)\n" +
		"\tfw_ver:\t\t\t\t1.0\n" +
		"\tnode_guid:\t\t\t" + guid + "\n" +
		"\tsys_image_guid:\t\t\t" + guid + "\n" +
		"\tvendor_id:\t\t\t0xffffff\n" +
		"\tvendor_part_id:\t\t\t0\n" +
		"\thw_ver:\t\t\t\t0x0\n" +
		"\tphys_port_cnt:\t\t\t1\n" +
		"\t\tport:\t1\n" +
		"\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n" +
		// rxe's on a 1500-byte link: the device's largest path MTU, then
		// the link's.
		"\t\t\tmax_mtu:\t\t4096 (5)\n" +
		"\t\t\tactive_mtu:\t\t1024 (3)\n" +
		"\t\t\tsm_lid:\t\t\t0\n" +
		"\t\t\tport_lid:\t\t0\n" +
		"\t\t\tport_lmc:\t\t0x00\n" +
		"\t\t\tlink_layer:\t\tEthernet\n" +
		"\n"
	code, out, errOut := runCmd("devinfo", "-d", "taproce0")
	if code != 0 || out != want {
		t.Fatalf("devinfo -d taproce0: exit %d\n%s\nwant\n%s\n%s", code, out, want, errOut)
	}
	if code, out, _ = runCmd("devinfo", "-i1"); code != 0 || !strings.HasPrefix(out, want) || strings.Count(out, "hca_id:") != 2 ||
		!strings.Contains(out, "hca_id:\ttaproce1\n") {
		t.Errorf("devinfo of both devices: exit %d\n%s", code, out)
	}
	if code, out, _ = runCmd("devinfo", "-l"); code != 0 || out != "2 HCAs found:\n\ttaproce0\n\ttaproce1\n\n" {
		t.Errorf("devinfo -l: exit %d\n%q", code, out)
	}
	if code, _, errOut = runCmd("devinfo", "-d", "mlx5_0"); code != 1 || errOut != "IB device 'mlx5_0' wasn't found\n" {
		t.Errorf("devinfo -d mlx5_0: exit %d, %q", code, errOut)
	}
	if code, _, errOut = runCmd("devinfo", "-d", "taproce0", "-i", "2"); code != 1 || !strings.Contains(errOut, "invalid port requested") {
		t.Errorf("devinfo -i 2: exit %d, %q", code, errOut)
	}

	code, out, errOut = runCmd("devinfo", "-v", "--ib-dev=taproce0")
	if code != 0 {
		t.Fatalf("devinfo -v: exit %d: %s", code, errOut)
	}
	lines := strings.Split(out, "\n")
	var gids []string
	for i, gid := range nic.GIDs() {
		gids = append(gids, fmt.Sprintf("\t\t\tGID[%3d]:\t\t%s, RoCE v2", i, netip.AddrFrom16(gid)))
	}
	if len(gids) != 2 || !strings.Contains(gids[0], "GID[  0]:\t\tfe80::") || !strings.HasSuffix(gids[1], "::ffff:10.77.0.1, RoCE v2") {
		t.Fatalf("the port's GIDs: %q", gids)
	}
	// In order, among the lines: the device's, the extra ones, the port's,
	// its extra ones, the GIDs.
	order := []string{
		"hca_id:\ttaproce0", "\tphys_port_cnt:\t\t\t1",
		"\tmax_mr_size:\t\t\t0x10000000000", "\tpage_size_cap:\t\t\t0xfffff000", "\tmax_qp:\t\t\t\t1024",
		"\tdevice_cap_flags:\t\t0x00002010", "\t\t\t\t\tAUTO_PATH_MIG", "\t\t\t\t\tSRQ_RESIZE",
		"\tmax_qp_rd_atom:\t\t\t16", "\tatomic_cap:\t\t\tATOMIC_HCA (1)", "\tmax_srq_wr:\t\t\t16384",
		"\tmax_pkeys:\t\t\t1", "\trc_odp_caps:", "\t\t\t\t\tNO SUPPORT", "\tcompletion_timestamp_mask not supported",
		"\tdevice_cap_flags_ex:\t\t0x2010", "\ttag matching not supported", "\tnum_comp_vectors:\t\t1",
		"\t\tport:\t1", "\t\t\tlink_layer:\t\tEthernet", "\t\t\tmax_msg_sz:\t\t0x80000000",
		"\t\t\tpkey_tbl_len:\t\t1", "\t\t\tgid_tbl_len:\t\t16", "\t\t\tactive_width:\t\t1X (1)",
		"\t\t\tactive_speed:\t\t2.5 Gbps (1)", "\t\t\tphys_state:\t\tLINK_UP (5)",
		gids[0], gids[1], "",
	}
	at := 0
	for _, l := range lines {
		if at < len(order) && l == order[at] {
			at++
		}
	}
	if at != len(order) {
		t.Errorf("devinfo -v lacks %q in its place:\n%s", order[at], out)
	}
	if n := strings.Count(out, "GID["); n != 2 {
		t.Errorf("devinfo -v: %d GID lines, want 2", n)
	}
}
