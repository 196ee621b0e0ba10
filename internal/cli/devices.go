package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/taproce/taproce/internal/pingpong"
	"github.com/taproce/taproce/verbs"
)

// deviceTimeout bounds the talk with the appliance of devices and devinfo.
const deviceTimeout = 10 * time.Second

// runDevices is `taproce devices [-a]`: ibv_devices' table of the devices
// this process may use (those of its network namespace), or with -a of all
// the appliance shows it — those of other namespaces only when it lists
// all (list_all_devices), which -a otherwise says on stderr. With none to
// list it prints the table's header alone and exits 0, as ibv_devices does
// with an empty device list (it fails, exit 1, only when it cannot get the
// list), and says on stderr why the table is empty.
func runDevices(args []string, stdout, stderr io.Writer) int {
	parsed, operands, err := pingpong.Getopt(args, []pingpong.Option{{Short: 'a', Long: "all"}, {Short: 'h', Long: "help"}})
	if err != nil || len(operands) > 0 {
		fmt.Fprintf(stderr, "taproce devices: %v\n", orOperands(err, operands))
		devicesUsage(stderr)
		return 2
	}
	all := false
	for _, p := range parsed {
		switch p.Name {
		case "a":
			all = true
		case "h":
			devicesUsage(stdout)
			return 0
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), deviceTimeout)
	defer cancel()
	list, err := verbs.ListDevices(ctx)
	if errors.Is(err, verbs.ErrNoAppliance) {
		printError(stderr, "devices", err)
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "Failed to get IB devices list: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "    %-16s\t   node GUID\n", "device")
	fmt.Fprintf(stdout, "    %-16s\t----------------\n", "------")
	listed := 0
	for _, d := range list.Devices {
		if d.Usable || all {
			fmt.Fprintf(stdout, "    %-16s\t%016x\n", d.Name, d.NodeGUID)
			listed++
		}
	}
	switch {
	case all && list.OthersHidden:
		fmt.Fprintf(stderr, "taproce devices: %s\n", othersHidden())
	case listed == 0:
		fmt.Fprintf(stderr, "taproce devices: %s\n", noDevices(list))
	}
	return 0
}

// noDevices says why a process finds no device to use in list, what the
// appliance showed it: it serves none, or none of this network namespace
// — a client may use only its own namespace's port, which a newcomer who
// runs a tool outside the lab's namespaces does not know.
func noDevices(list verbs.DeviceList) string {
	switch {
	case list.OthersHidden:
		return fmt.Sprintf("no device of this network namespace is served by the appliance at %s "+
			"(it does not show the devices of other namespaces)", verbs.Socket())
	case len(list.Devices) == 0:
		return fmt.Sprintf("the appliance at %s serves no device", verbs.Socket())
	}
	return fmt.Sprintf("no device of this network namespace is served by the appliance at %s (`taproce devices -a` lists all %d)",
		verbs.Socket(), len(list.Devices))
}

// othersHidden says that the appliance shows a process only its own
// namespace's devices, so that -a cannot list the others.
func othersHidden() string {
	return fmt.Sprintf("the appliance at %s shows a client only the devices of its own network namespace; "+
		"whether it serves others cannot be seen from here (its list_all_devices setting)", verbs.Socket())
}

func devicesUsage(w io.Writer) {
	fmt.Fprintln(w, `Usage: taproce devices [-a]    list the devices this process may use (those of its network namespace)

Options:
  -a, --all              list every device of the appliance it shows: those
                         of other namespaces only when it lists all devices
                         (list_all_devices), as a line on stderr says

With no device to list, the table is empty and the exit status 0, as
ibv_devices does; a line on stderr says why (a device serves only the
processes of its own network namespace).`)
}

func orOperands(err error, operands []string) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("unexpected arguments %q", operands)
}

// devinfoOptions are ibv_devinfo's.
var devinfoOptions = []pingpong.Option{
	{Short: 'd', Long: "ib-dev", Arg: true}, {Short: 'i', Long: "ib-port", Arg: true},
	{Short: 'l', Long: "list"}, {Short: 'v', Long: "verbose"}, {Short: 'h', Long: "help"},
}

// runDevinfo is `taproce devinfo [-d dev] [-i port] [-l] [-v]`: ibv_devinfo's
// report (rdma-core 44's layout) of every device this process may use, or
// of the one -d names.
func runDevinfo(args []string, stdout, stderr io.Writer) int {
	parsed, operands, err := pingpong.Getopt(args, devinfoOptions)
	if err != nil || len(operands) > 0 {
		fmt.Fprintf(stderr, "taproce devinfo: %v\n", orOperands(err, operands))
		devinfoUsage(stderr)
		return 2
	}
	var name string
	port, list, verbose := 0, false, false
	for _, p := range parsed {
		switch p.Name {
		case "d":
			name = p.Value
		case "i":
			if port, err = pingpong.ParseNumber(p.Value); err != nil || port <= 0 {
				fmt.Fprintf(stderr, "taproce devinfo: -i %s: want a port number from 1\n", p.Value)
				devinfoUsage(stderr)
				return 2
			}
		case "l":
			list = true
		case "v":
			verbose = true
		case "h":
			devinfoUsage(stdout)
			return 0
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), deviceTimeout)
	defer cancel()
	shown, err := verbs.ListDevices(ctx)
	if errors.Is(err, verbs.ErrNoAppliance) {
		printError(stderr, "devinfo", err)
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "Failed to get IB devices list: %v\n", err)
		return 1
	}
	all := shown.Devices
	var devs []verbs.DeviceInfo
	for _, d := range all {
		if d.Usable {
			devs = append(devs, d)
		}
	}
	if list {
		plural := "s"
		if len(devs) == 1 {
			plural = ""
		}
		fmt.Fprintf(stdout, "%d HCA%s found:\n", len(devs), plural)
		for _, d := range devs {
			fmt.Fprintf(stdout, "\t%s\n", d.Name)
		}
		fmt.Fprintln(stdout)
		return 0
	}
	if name != "" {
		found := false
		for _, d := range all {
			found = found || d.Name == name
		}
		if !found {
			fmt.Fprintf(stderr, "IB device '%s' wasn't found\n", name)
			return 1
		}
		devs = []verbs.DeviceInfo{{Name: name}}
	} else if len(devs) == 0 {
		fmt.Fprintln(stderr, "No IB devices found")
		fmt.Fprintf(stderr, "taproce devinfo: %s\n", noDevices(shown))
		return 1
	}
	code := 0
	for _, d := range devs {
		if err := printDevinfo(ctx, stdout, d.Name, port, verbose); err != nil {
			fmt.Fprintf(stderr, "taproce devinfo: %s: %v\n", d.Name, err)
			code = 1
		}
	}
	return code
}

func devinfoUsage(w io.Writer) {
	fmt.Fprintln(w, `Usage: taproce devinfo             print the ca attributes

Options:
  -d, --ib-dev=<dev>     use IB device <dev> (default all devices)
  -i, --ib-port=<port>   use port <port> of IB device (default all ports)
  -l, --list             print only the IB devices names
  -v, --verbose          print all the attributes of the IB device(s)`)
}

// errNoPort is returned for -i beyond the device's one port.
var errNoPort = errors.New("invalid port requested for device")

// printDevinfo opens a device and writes ibv_devinfo's report of it
// (print_hca_cap).
func printDevinfo(ctx context.Context, w io.Writer, name string, port int, verbose bool) error {
	c, err := verbs.Open(ctx, name)
	if err != nil {
		return fmt.Errorf("failed to open device: %w", err)
	}
	defer c.Close()
	a := c.QueryDevice()
	if port > int(a.PhysPortCnt) {
		return errNoPort
	}
	pa, err := c.QueryPort(ctx)
	if err != nil {
		return fmt.Errorf("failed to query port 1 props: %w", err)
	}
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("hca_id:\t%s\n", name)
	p("\ttransport:\t\t\t%s (%d)\n", "InfiniBand", 0)
	if fw := a.FWVer.String(); fw != "" {
		p("\tfw_ver:\t\t\t\t%s\n", fw)
	}
	p("\tnode_guid:\t\t\t%s\n", guidString(a.NodeGUID))
	p("\tsys_image_guid:\t\t\t%s\n", guidString(a.SysImageGUID))
	p("\tvendor_id:\t\t\t0x%04x\n", a.VendorID)
	p("\tvendor_part_id:\t\t\t%d\n", a.VendorPartID)
	p("\thw_ver:\t\t\t\t0x%X\n", a.HWVer)
	p("\tphys_port_cnt:\t\t\t%d\n", a.PhysPortCnt)
	if verbose {
		printDeviceVerbose(p, &a, &pa)
	}
	for n := 1; n <= int(a.PhysPortCnt); n++ {
		if port != 0 && n != port {
			continue
		}
		p("\t\tport:\t%d\n", n)
		p("\t\t\tstate:\t\t\t%s (%d)\n", portStateString(pa.State), pa.State)
		p("\t\t\tmax_mtu:\t\t%s (%d)\n", mtuString(pa.MaxMTU), pa.MaxMTU)
		p("\t\t\tactive_mtu:\t\t%s (%d)\n", mtuString(pa.ActiveMTU), pa.ActiveMTU)
		p("\t\t\tsm_lid:\t\t\t%d\n", 0)
		p("\t\t\tport_lid:\t\t%d\n", pa.LID)
		p("\t\t\tport_lmc:\t\t0x%02x\n", 0)
		p("\t\t\tlink_layer:\t\t%s\n", linkLayerString(pa.LinkLayer))
		if verbose {
			printPortVerbose(p, &pa)
		}
		p("\n")
	}
	_, err = io.WriteString(w, b.String())
	return err
}

// printDeviceVerbose writes the device attributes of ibv_devinfo -v. The
// attributes the appliance does not report are features taproce lacks
// (EE contexts, memory windows, multicast, raw QPs, FMRs, ODP,
// timestamps, TSO, RSS, packet pacing, tag matching): zero, as a device
// without them reports them.
func printDeviceVerbose(p func(string, ...any), a *verbs.DeviceAttr, pa *verbs.PortAttr) {
	p("\tmax_mr_size:\t\t\t0x%x\n", a.MaxMRSize)
	p("\tpage_size_cap:\t\t\t0x%x\n", a.PageSizeCap)
	p("\tmax_qp:\t\t\t\t%d\n", a.MaxQP)
	p("\tmax_qp_wr:\t\t\t%d\n", a.MaxQPWR)
	p("\tdevice_cap_flags:\t\t0x%08x\n", a.DeviceCapFlag)
	printCapFlags(p, a.DeviceCapFlag)
	p("\tmax_sge:\t\t\t%d\n", a.MaxSGE)
	p("\tmax_sge_rd:\t\t\t%d\n", 0)
	p("\tmax_cq:\t\t\t\t%d\n", a.MaxCQ)
	p("\tmax_cqe:\t\t\t%d\n", a.MaxCQE)
	p("\tmax_mr:\t\t\t\t%d\n", a.MaxMR)
	p("\tmax_pd:\t\t\t\t%d\n", a.MaxPD)
	p("\tmax_qp_rd_atom:\t\t\t%d\n", a.MaxQPRdAtom)
	p("\tmax_ee_rd_atom:\t\t\t%d\n", 0)
	p("\tmax_res_rd_atom:\t\t%d\n", 0)
	p("\tmax_qp_init_rd_atom:\t\t%d\n", a.MaxQPInitRd)
	p("\tmax_ee_init_rd_atom:\t\t%d\n", 0)
	p("\tatomic_cap:\t\t\t%s (%d)\n", atomicCapString(a.AtomicCap), a.AtomicCap)
	p("\tmax_ee:\t\t\t\t%d\n", 0)
	p("\tmax_rdd:\t\t\t%d\n", 0)
	p("\tmax_mw:\t\t\t\t%d\n", 0)
	p("\tmax_raw_ipv6_qp:\t\t%d\n", 0)
	p("\tmax_raw_ethy_qp:\t\t%d\n", 0)
	p("\tmax_mcast_grp:\t\t\t%d\n", 0)
	p("\tmax_mcast_qp_attach:\t\t%d\n", 0)
	p("\tmax_total_mcast_qp_attach:\t%d\n", 0)
	p("\tmax_ah:\t\t\t\t%d\n", a.MaxAH)
	p("\tmax_fmr:\t\t\t%d\n", 0)
	p("\tmax_srq:\t\t\t%d\n", a.MaxSRQ)
	if a.MaxSRQ != 0 {
		p("\tmax_srq_wr:\t\t\t%d\n", a.MaxSRQWR)
		p("\tmax_srq_sge:\t\t\t%d\n", a.MaxSRQSGE)
	}
	p("\tmax_pkeys:\t\t\t%d\n", pa.PKeyTblLen)
	p("\tlocal_ca_ack_delay:\t\t%d\n", 0)
	p("\tgeneral_odp_caps:\n")
	for _, t := range []string{"rc", "uc", "ud", "xrc"} {
		p("\t%s_odp_caps:\n", t)
		p("\t\t\t\t\tNO SUPPORT\n")
	}
	p("\tcompletion_timestamp_mask not supported\n")
	p("\tcore clock not supported\n")
	// The extended flags' low half is device_cap_flags; taproce has none
	// of the high half.
	p("\tdevice_cap_flags_ex:\t\t0x%X\n", uint64(a.DeviceCapFlag))
	p("\ttso_caps:\n")
	p("\t\tmax_tso:\t\t\t%d\n", 0)
	p("\trss_caps:\n")
	p("\t\tmax_rwq_indirection_tables:\t\t\t%d\n", 0)
	p("\t\tmax_rwq_indirection_table_size:\t\t\t%d\n", 0)
	p("\t\trx_hash_function:\t\t\t\t0x%x\n", 0)
	p("\t\trx_hash_fields_mask:\t\t\t\t0x%X\n", 0)
	p("\tmax_wq_type_rq:\t\t\t%d\n", 0)
	p("\tpacket_pacing_caps:\n")
	p("\t\tqp_rate_limit_min:\t%dkbps\n", 0)
	p("\t\tqp_rate_limit_max:\t%dkbps\n", 0)
	p("\ttag matching not supported\n")
	p("\tnum_comp_vectors:\t\t%d\n", 1)
}

// capFlags are enum ibv_device_cap_flags in the order ibv_devinfo prints
// them.
var capFlags = []struct {
	bit  uint32
	name string
}{
	{1 << 0, "RESIZE_MAX_WR"}, {1 << 1, "BAD_PKEY_CNTR"}, {1 << 2, "BAD_QKEY_CNTR"}, {1 << 3, "RAW_MULTI"},
	{1 << 4, "AUTO_PATH_MIG"}, {1 << 5, "CHANGE_PHY_PORT"}, {1 << 6, "UD_AV_PORT_ENFORCE"},
	{1 << 7, "CURR_QP_STATE_MOD"}, {1 << 8, "SHUTDOWN_PORT"}, {1 << 9, "INIT_TYPE"},
	{1 << 10, "PORT_ACTIVE_EVENT"}, {1 << 11, "SYS_IMAGE_GUID"}, {1 << 12, "RC_RNR_NAK_GEN"},
	{1 << 13, "SRQ_RESIZE"}, {1 << 14, "N_NOTIFY_CQ"}, {1 << 17, "MEM_WINDOW"}, {1 << 18, "UD_IP_CSUM"},
	{1 << 20, "XRC"}, {1 << 21, "MEM_MGT_EXTENSIONS"}, {1 << 23, "MEM_WINDOW_TYPE_2A"},
	{1 << 24, "MEM_WINDOW_TYPE_2B"}, {1 << 25, "RC_IP_CSUM"}, {1 << 26, "RAW_IP_CSUM"},
	{1 << 29, "MANAGED_FLOW_STEERING"},
}

func printCapFlags(p func(string, ...any), flags uint32) {
	known := uint32(0)
	for _, f := range capFlags {
		known |= f.bit
		if flags&f.bit != 0 {
			p("\t\t\t\t\t%s\n", f.name)
		}
	}
	if flags&^known != 0 {
		p("\t\t\t\t\tUnknown flags: 0x%X\n", flags&^known)
	}
}

// printPortVerbose writes the port attributes and the GID table of
// ibv_devinfo -v. A RoCE port has one virtual lane and no subnet manager.
func printPortVerbose(p func(string, ...any), pa *verbs.PortAttr) {
	p("\t\t\tmax_msg_sz:\t\t0x%x\n", pa.MaxMsgSz)
	p("\t\t\tport_cap_flags:\t\t0x%08x\n", pa.PortCapFlags)
	p("\t\t\tport_cap_flags2:\t0x%04x\n", 0)
	p("\t\t\tmax_vl_num:\t\t%s (%d)\n", "1", 1)
	p("\t\t\tbad_pkey_cntr:\t\t0x%x\n", 0)
	p("\t\t\tqkey_viol_cntr:\t\t0x%x\n", 0)
	p("\t\t\tsm_sl:\t\t\t%d\n", 0)
	p("\t\t\tpkey_tbl_len:\t\t%d\n", pa.PKeyTblLen)
	p("\t\t\tgid_tbl_len:\t\t%d\n", pa.GIDTblLen)
	p("\t\t\tsubnet_timeout:\t\t%d\n", 0)
	p("\t\t\tinit_type_reply:\t%d\n", 0)
	p("\t\t\tactive_width:\t\t%sX (%d)\n", widthString(pa.ActiveWidth), pa.ActiveWidth)
	p("\t\t\tactive_speed:\t\t%s (%d)\n", speedString(pa.ActiveSpeed), pa.ActiveSpeed)
	p("\t\t\tphys_state:\t\t%s (%d)\n", physStateString(pa.PhysState), pa.PhysState)
	for i, g := range pa.GIDs {
		raw := g.As16()
		if g.IsValid() && !nullGID(raw) {
			// Every GID of taproce is a RoCE v2 one, printed with inet_ntop.
			p("\t\t\tGID[%3d]:\t\t%s, RoCE v2\n", i, netip.AddrFrom16(raw))
		}
	}
}

// nullGID is devinfo's null_gid: an interface ID of zero.
func nullGID(g [16]byte) bool {
	for _, b := range g[8:] {
		if b != 0 {
			return false
		}
	}
	return true
}

// guidString formats a GUID as devinfo's guid_str does.
func guidString(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48&0xffff, g>>32&0xffff, g>>16&0xffff, g&0xffff)
}

func portStateString(s uint8) string {
	switch s {
	case 1:
		return "PORT_DOWN"
	case 2:
		return "PORT_INIT"
	case 3:
		return "PORT_ARMED"
	case 4:
		return "PORT_ACTIVE"
	}
	return "invalid state"
}

func physStateString(s uint8) string {
	names := map[uint8]string{1: "SLEEP", 2: "POLLING", 3: "DISABLED", 4: "PORT_CONFIGURATION TRAINNING",
		5: "LINK_UP", 6: "LINK_ERROR_RECOVERY", 7: "PHY TEST"}
	if n, ok := names[s]; ok {
		return n
	}
	return "invalid physical state"
}

func atomicCapString(c uint32) string {
	switch c {
	case 0:
		return "ATOMIC_NONE"
	case 1:
		return "ATOMIC_HCA"
	case 2:
		return "ATOMIC_GLOB"
	}
	return "invalid atomic capability"
}

func mtuString(m uint8) string {
	if n := verbs.MTU(m).Bytes(); n != 0 {
		return fmt.Sprint(n)
	}
	return "invalid MTU"
}

func widthString(w uint8) string {
	names := map[uint8]string{1: "1", 2: "4", 4: "8", 8: "12", 16: "2"}
	if n, ok := names[w]; ok {
		return n
	}
	return "invalid width"
}

func speedString(s uint8) string {
	names := map[uint8]string{1: "2.5 Gbps", 2: "5.0 Gbps", 4: "10.0 Gbps", 8: "10.0 Gbps", 16: "14.0 Gbps",
		32: "25.0 Gbps", 64: "50.0 Gbps", 128: "100.0 Gbps"}
	if n, ok := names[s]; ok {
		return n
	}
	return "invalid speed"
}

func linkLayerString(l uint8) string {
	switch l {
	case 0:
		return "Unspecified"
	case 1:
		return "InfiniBand"
	case 2:
		return "Ethernet"
	}
	return "Unknown"
}
