package runon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/taproce/taproce/verbs"
)

// Device is what the sysfs tree says of one of the appliance's devices:
// its attributes as the appliance reports them (ibv_query_device,
// ibv_query_port), and the names the library gives it.
type Device struct {
	// Name is the device's name (taproce0).
	Name string
	// Index is N of the uverbsN that taproce's libibverbs.so.1 names the
	// device's dev_name (ibv_device.dev_name): its place among the devices
	// the appliance lists as usable by this process, in the list's order.
	// UCX looks for /dev/infiniband/<dev_name>.
	Index int
	// Attr and Port are the device's and its port's attributes.
	Attr verbs.DeviceAttr
	Port verbs.PortAttr
	// Netdev is the network interface of this network namespace that the
	// port's GIDs belong to, as rxe's netdev ("" when none is found: the
	// files that name it are then left out).
	Netdev string
}

// uverbsMajor and uverbsMinorBase are the numbers of the kernel's uverbs
// character devices: /dev/infiniband/uverbsN is 231:192+N.
const (
	uverbsMajor     = 231
	uverbsMinorBase = 192
)

// Query asks the appliance (verbs.Socket) for the devices this process may
// use and each one's attributes. Their Index is counted as taproce's
// libibverbs.so.1 counts when it lists them (device.c,
// ibv_get_device_list): the usable devices, in the appliance's order.
func Query(ctx context.Context) ([]Device, error) {
	infos, err := verbs.Devices(ctx)
	if err != nil {
		return nil, err
	}
	var devs []Device
	for _, info := range infos {
		if !info.Usable || info.Name == "" {
			continue
		}
		c, err := verbs.Open(ctx, info.Name)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", info.Name, err)
		}
		port, err := c.QueryPort(ctx)
		attr := c.QueryDevice()
		c.Close()
		if err != nil {
			return nil, fmt.Errorf("query %s port 1: %w", info.Name, err)
		}
		devs = append(devs, Device{Name: info.Name, Index: len(devs), Attr: attr, Port: port,
			Netdev: netdevOf(info.MAC, port.GIDs)})
	}
	return devs, nil
}

// netdevOf finds the interface of this network namespace that a port with
// MAC mac and GIDs gids rides on: the one holding one of the GIDs'
// addresses (a port in redirect mode uses its pod's address), else the
// one with the port's MAC; "" when there is none.
func netdevOf(mac net.HardwareAddr, gids []netip.Addr) string {
	ifs, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			p, err := netip.ParsePrefix(a.String())
			if err != nil || p.Addr().IsLinkLocalUnicast() {
				continue
			}
			for _, g := range gids {
				if g.Unmap() == p.Addr().Unmap() {
					return ifc.Name
				}
			}
		}
	}
	for _, ifc := range ifs {
		if len(mac) > 0 && ifc.HardwareAddr.String() == mac.String() {
			return ifc.Name
		}
	}
	return ""
}

// SysfsEntries are the entries of /sys/class that the tree replaces.
var SysfsEntries = []string{"infiniband", "infiniband_verbs"}

// WriteSysfs writes under class (standing for /sys/class) what the kernel
// shows there for rxe devices with the attributes of devs: the entries
// SysfsEntries name, files of the layout, names and formats of
// drivers/infiniband/core/sysfs.c and uverbs_main.c (Linux 6.1). What rxe
// has and taproce does not report (hw_counters, power/) is left out; so
// are the GID attribute files of an empty GID table entry, whose read
// fails (EINVAL) in the kernel's tree and whose absence fails it here.
//
// The devices are directories here, where rxe's are symbolic links to
// /sys/devices/virtual/infiniband/<dev>: no program resolves them to find
// more than the kernel shows under the link (UCX strips the path to look
// for a PCI device, and finds none in either case).
func WriteSysfs(class string, devs []Device) error {
	ib := filepath.Join(class, "infiniband")
	uv := filepath.Join(class, "infiniband_verbs")
	files := map[string]string{
		filepath.Join(uv, "abi_version"): "6", // IB_USER_VERBS_ABI_VERSION
	}
	dirs := []string{ib, uv}
	for _, d := range devs {
		dev := filepath.Join(ib, d.Name)
		port := filepath.Join(dev, "ports", "1")
		dirs = append(dirs, filepath.Join(port, "gids"), filepath.Join(port, "pkeys"),
			filepath.Join(port, "gid_attrs", "types"), filepath.Join(port, "gid_attrs", "ndevs"))
		a, p := &d.Attr, &d.Port
		set := func(dir, name, value string) { files[filepath.Join(dir, name)] = value }
		set(dev, "node_type", "1: CA")
		set(dev, "node_guid", guid(a.NodeGUID))
		set(dev, "sys_image_guid", guid(a.SysImageGUID))
		set(dev, "fw_ver", a.FWVer.String())
		set(dev, "node_desc", "taproce")
		set(dev, "uevent", "NAME="+d.Name)
		if d.Netdev != "" {
			set(dev, "parent", d.Netdev)
		}
		set(port, "state", portState(p.State))
		set(port, "phys_state", physState(p.PhysState))
		set(port, "link_layer", linkLayer(p.LinkLayer))
		set(port, "lid", fmt.Sprintf("0x%x", p.LID))
		set(port, "lid_mask_count", "0")
		set(port, "sm_lid", "0x0")
		set(port, "sm_sl", "0")
		set(port, "cap_mask", fmt.Sprintf("0x%08x", p.PortCapFlags))
		set(port, "rate", rate(p.ActiveSpeed, p.ActiveWidth))
		for i := 0; i < max(int(p.PKeyTblLen), 1); i++ {
			pkey := "0x0000"
			if i == 0 {
				pkey = "0xffff" // the default P_Key, a RoCE port's only one
			}
			set(filepath.Join(port, "pkeys"), fmt.Sprint(i), pkey)
		}
		for i := 0; i < max(int(p.GIDTblLen), len(p.GIDs)); i++ {
			var raw [16]byte
			if i < len(p.GIDs) {
				raw = p.GIDs[i].As16()
			}
			set(filepath.Join(port, "gids"), fmt.Sprint(i), gidString(raw))
			if i >= len(p.GIDs) || raw == [16]byte{} {
				continue
			}
			// Every GID of a taproce port is RoCE v2, the link-local one
			// too (ibv_query_gid_type says so as well).
			set(filepath.Join(port, "gid_attrs", "types"), fmt.Sprint(i), "RoCE v2")
			if d.Netdev != "" {
				set(filepath.Join(port, "gid_attrs", "ndevs"), fmt.Sprint(i), d.Netdev)
			}
		}
		u := filepath.Join(uv, fmt.Sprintf("uverbs%d", d.Index))
		dirs = append(dirs, u)
		set(u, "ibdev", d.Name)
		set(u, "abi_version", "2") // rxe's driver ABI, RXE_UVERBS_ABI_VERSION
		set(u, "dev", fmt.Sprintf("%d:%d", uverbsMajor, uverbsMinorBase+d.Index))
		set(u, "uevent", fmt.Sprintf("MAJOR=%d\nMINOR=%d\nDEVNAME=infiniband/uverbs%d\nDEVMODE=0666",
			uverbsMajor, uverbsMinorBase+d.Index, d.Index))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for path, v := range files {
		// Each attribute ends in a newline, as sysfs_emit's formats do;
		// the kernel's writable ones are 0644, the rest 0444.
		mode := os.FileMode(0o444)
		if n := filepath.Base(path); n == "node_desc" || n == "uevent" {
			mode = 0o644
		}
		if err := os.WriteFile(path, []byte(v+"\n"), mode); err != nil {
			return err
		}
	}
	return nil
}

// ErrNoMknod is WriteDev's error where character devices cannot be made
// (a user namespace): the caller stands others in for them.
var ErrNoMknod = errors.New("runon: cannot make character devices here")

// WriteDev makes dir (standing for /dev/infiniband) with the uverbs
// character devices of devs, as udev makes them for rxe: uverbsN, 231:192+N,
// mode 0666. UCX takes a device as usable only when its node is a character
// device it may read and write; taproce's library never opens it. Where
// mknod is not permitted it returns ErrNoMknod with the paths it could not
// make, created as empty files.
func WriteDev(dir string, devs []Device, mknod func(path string, mode uint32, major, minor int) error) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var missing []string
	for _, d := range devs {
		path := filepath.Join(dir, fmt.Sprintf("uverbs%d", d.Index))
		err := mknod(path, 0o666, uverbsMajor, uverbsMinorBase+d.Index)
		if err == nil {
			// mknod's mode is cut by the umask.
			if err := os.Chmod(path, 0o666); err != nil {
				return nil, err
			}
			continue
		}
		if !errors.Is(err, os.ErrPermission) {
			return nil, fmt.Errorf("mknod %s: %w", path, err)
		}
		if err := os.WriteFile(path, nil, 0o666); err != nil {
			return nil, err
		}
		missing = append(missing, path)
	}
	if len(missing) > 0 {
		return missing, ErrNoMknod
	}
	return nil, nil
}

// guid formats a GUID as the kernel's sysfs does.
func guid(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48&0xffff, g>>32&0xffff, g>>16&0xffff, g&0xffff)
}

// gidString formats a GID as the kernel's %pI6: eight groups of four hex
// digits.
func gidString(g [16]byte) string {
	var b strings.Builder
	for i := 0; i < 16; i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		fmt.Fprintf(&b, "%02x%02x", g[i], g[i+1])
	}
	return b.String()
}

func portState(s uint8) string {
	names := []string{"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"}
	if int(s) < len(names) {
		return fmt.Sprintf("%d: %s", s, names[s])
	}
	return fmt.Sprintf("%d: UNKNOWN", s)
}

func physState(s uint8) string {
	names := map[uint8]string{1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining",
		5: "LinkUp", 6: "LinkErrorRecovery", 7: "Phy Test"}
	if n, ok := names[s]; ok {
		return fmt.Sprintf("%d: %s", s, n)
	}
	return fmt.Sprintf("%d: <unknown>", s)
}

func linkLayer(l uint8) string {
	switch l {
	case 1:
		return "InfiniBand"
	case 2:
		return "Ethernet"
	}
	return "Unknown"
}

// rate is the kernel's rate_show: the port's speed times its width, in
// Gb/s.
func rate(speed, width uint8) string {
	speeds := map[uint8]struct {
		name  string
		deciG int
	}{2: {"DDR", 50}, 4: {"QDR", 100}, 8: {"FDR10", 100}, 16: {"FDR", 140}, 32: {"EDR", 250},
		64: {"HDR", 500}, 128: {"NDR", 1000}}
	s, ok := speeds[speed]
	if !ok {
		s.name, s.deciG = "SDR", 25 // the kernel's default for any other speed
	}
	widths := map[uint8]int{1: 1, 2: 4, 4: 8, 8: 12, 16: 2}
	w, ok := widths[width]
	if !ok {
		return ""
	}
	r := s.deciG * w
	half := ""
	if r%10 != 0 {
		half = ".5"
	}
	return fmt.Sprintf("%d%s Gb/sec (%dX %s)", r/10, half, w, s.name)
}
