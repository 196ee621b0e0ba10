// Package lab builds taproce's one-command laboratory: network namespaces
// joined by veths and bridges, a taproce port (TAP + station) in each, the
// checks that prove the stations are real hosts on the wire, and the RDMA
// exchange between them — the veth-pair setup people build by hand for
// Soft-RoCE, without kernel RDMA support.
//
// A lab's ports are attached in one of the appliance's two modes. In
// bridge mode (the default) each port is a host of its own on the
// namespace's bridge, beside the kernel, with addresses of its own. In
// redirect mode (Topology.Redirect) each port is attached to the
// namespace's uplink as the appliance attaches a Kubernetes pod's
// interface (appliance/attach): it shares the kernel's MAC and
// addresses, as an rxe device shares its netdev's, and tc filters move
// RoCEv2 between the uplink and its TAP.
package lab

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/admin"
	"github.com/taproce/taproce/appliance/attach"
	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/cpulist"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/internal/netnsutil"
)

// DefaultPrefix starts the names of the lab's namespaces.
const DefaultPrefix = "taproce-lab-"

// Topology describes a lab to build.
type Topology struct {
	// Prefix of the namespace names: PREFIX1, PREFIX2, … and PREFIXsw for
	// the switch of labs with more than two hosts.
	Prefix string
	// Hosts is the number of host namespaces (2…99).
	Hosts int
	// MTU of veths, bridges and TAPs.
	MTU int
	// Offload opens the TAPs with UDP GSO super-frames.
	Offload bool
	// Ingress and Egress impair every port's frames.
	Ingress, Egress impair.Spec
	// Capture records every frame the ports send and receive.
	Capture *capture.Writer
	// Handler receives each port's RoCE packets: host index, frame, packet.
	Handler func(host int, frame []byte, p *roce.Packet)
	// Logger for the ports.
	Logger *slog.Logger
	// Socket is the appliance's control socket, where client processes in
	// the namespaces reach their ports' devices (default DefaultSocket).
	Socket string
	// LocalSwitch lets the hosts' ports exchange frames in memory instead
	// of through the TAPs and the veth (off: the lab's traffic crosses the
	// wire as between two machines).
	LocalSwitch bool
	// ECN marks the ports' connected traffic ECN-capable
	// (appliance.Options.ECN).
	ECN bool
	// Poll is how the appliance waits for its clients' posts.
	Poll appliance.PollMode
	// Procs is how many processors the lab's process runs on while
	// clients use the appliance (config procs; 0: as Poll chooses).
	Procs int
	// CPUs is the processors the lab's process — the appliance — runs on
	// while clients use it (config cpus, a processor list; "": all of
	// them), and the client processes then run on the others: a NIC with
	// processors of its own, as under Kubernetes' static CPU manager.
	CPUs string
	// Redirect attaches the ports in redirect mode, as the appliance
	// attaches Kubernetes pods' (appliance/attach): each host's uplink
	// carries the kernel's addresses, without a bridge, and the host's
	// port shares them — the uplink's MAC, the kernel's addresses as its
	// GIDs — with tc filters moving RoCEv2 between the uplink and the
	// port's TAP. Programs that use one address both for their own
	// sockets and for RDMA, as with rxe, then work between the hosts:
	// qperf -cm1, libfabric's verbs provider. Off, the ports are in
	// bridge mode: stations of their own beside the kernels, on bridges.
	Redirect bool
}

// DefaultSocket is the control socket of a lab's appliance.
const DefaultSocket = "/run/taproce/lab.sock"

// Host is one namespace of the lab.
type Host struct {
	Index     int    // 1-based
	Namespace string // named namespace
	// Bridge holds the uplink and the TAP; "" in redirect mode, where
	// the uplink carries the kernel's addresses itself.
	Bridge string
	Uplink string // veth towards the other host or the switch
	// PortAddrs are the taproce port's addresses (its GIDs); KernelAddrs
	// the namespace kernel's own addresses on the bridge. In redirect
	// mode they are the same: the kernel's, on the uplink.
	PortAddrs, KernelAddrs []netip.Prefix
	Port                   *appliance.Port
	// NIC is the port with its transport; Device its verbs device name.
	NIC    *appliance.NIC
	Device string

	extra atomic.Pointer[func([]byte, *roce.Packet)] // a second handler, set while the lab runs
}

// SetHandler sets (or, with nil, clears) a handler that receives the
// host's RoCE packets besides the topology's.
func (h *Host) SetHandler(fn func([]byte, *roce.Packet)) {
	if fn == nil {
		h.extra.Store(nil)
		return
	}
	h.extra.Store(&fn)
}

// PortIPv4 returns the port's IPv4 address.
func (h *Host) PortIPv4() netip.Addr { return h.PortAddrs[0].Addr() }

// PortIPv6 returns the port's IPv6 address.
func (h *Host) PortIPv6() netip.Addr { return h.PortAddrs[1].Addr() }

// Lab is a built lab. Close tears it down.
type Lab struct {
	Topology
	Hosts      []*Host
	App        *appliance.Appliance // serves verbs on Socket once Serve runs
	namespaces []string
	// attached attaches the ports in redirect mode; nil in bridge mode.
	attached *attach.Manager
	perf     []perfRow  // the perf runs of the client steps
	perfConf perfConfig // the configuration they ran in
	// lib is the libibverbs.so.1 the client steps ran Debian's programs
	// on, which a kept lab tells its user of.
	lib library
	// clientCPUs is where client processes run: the processors CPUs
	// leaves (nil: anywhere).
	clientCPUs *cpulist.Set
	// faults are what Run injects on the links, which the client steps
	// must expect.
	faults faults
}

// faults describes the faults injected on a lab's links: the verbs steps
// over UD, which never retransmits, count lost datagrams under them
// instead of waiting for ever for one.
type faults struct {
	// what names them ("impaired link", "kernel loss"); "" for none.
	what string
	// delivery is the share of the datagrams sent one way they let
	// through.
	delivery float64
	// delay is the impairment's fixed delay of each frame, at each port
	// and in each direction.
	delay time.Duration
}

// newFaults describes the faults of the port impairment spec and the
// kernels' loss rule (kernelLoss percent).
func newFaults(spec impair.Spec, kernelLoss int) faults {
	var what []string
	if spec.Enabled() {
		what = append(what, "impaired link")
	}
	if kernelLoss > 0 {
		what = append(what, "kernel loss")
	}
	return faults{what: strings.Join(what, ", "), delivery: expectedDelivery(spec, kernelLoss), delay: spec.Delay}
}

// clientCPUs returns where the client processes run when the appliance
// runs on the processors cpus lists: on the others this process may use;
// nil (anywhere) when cpus is "" or leaves none.
func clientCPUs(cpus string) (*cpulist.Set, error) {
	if cpus == "" {
		return nil, nil
	}
	set, err := cpulist.Parse(cpus)
	if err != nil {
		return nil, fmt.Errorf("lab: cpus: %w", err)
	}
	allowed, err := cpulist.Allow(set)
	if err != nil {
		return nil, fmt.Errorf("lab: cpus: %w", err)
	}
	rest := cpulist.Without(allowed, set)
	if rest.Count() == 0 {
		return nil, nil
	}
	return &rest, nil
}

// Build creates the lab's namespaces, links and ports. On error everything
// it created is removed again.
func Build(t Topology) (l *Lab, err error) {
	if t.Prefix == "" {
		t.Prefix = DefaultPrefix
	}
	if t.Hosts < 2 || t.Hosts > 99 {
		return nil, fmt.Errorf("lab: %d hosts, want 2…99", t.Hosts)
	}
	if t.MTU == 0 {
		t.MTU = 1500
	}
	if t.MTU < 1280 || t.MTU > 9000 {
		return nil, fmt.Errorf("lab: MTU %d outside 1280…9000", t.MTU)
	}
	if t.Logger == nil {
		t.Logger = slog.Default()
	}
	if t.Socket == "" {
		t.Socket = DefaultSocket
	}
	l = &Lab{Topology: t}
	if l.clientCPUs, err = clientCPUs(t.CPUs); err != nil {
		return nil, err
	}
	if l.App, err = appliance.New(appliance.Options{Socket: t.Socket, LocalSwitch: t.LocalSwitch, ECN: t.ECN, Poll: t.Poll, Logger: t.Logger}); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	defer func() {
		if err != nil {
			l.Close()
			l = nil
		}
	}()
	for i := 1; i <= t.Hosts; i++ {
		h := &Host{
			Index:     i,
			Namespace: t.Prefix + strconv.Itoa(i),
			Bridge:    "br0",
			PortAddrs: []netip.Prefix{
				netip.MustParsePrefix(fmt.Sprintf("10.55.0.%d/24", i)),
				netip.MustParsePrefix(fmt.Sprintf("fd55::%d/64", i)),
			},
			KernelAddrs: []netip.Prefix{
				netip.MustParsePrefix(fmt.Sprintf("10.55.0.%d/24", 100+i)),
				netip.MustParsePrefix(fmt.Sprintf("fd55::%d/64", 100+i)),
			},
		}
		if t.Redirect {
			h.Bridge, h.KernelAddrs = "", h.PortAddrs
		}
		if err := l.addNS(h.Namespace); err != nil {
			return l, err
		}
		l.Hosts = append(l.Hosts, h)
	}
	if err := l.wire(); err != nil {
		return l, err
	}
	if t.Redirect {
		l.attached = attach.New(attach.Options{Logger: t.Logger, Offload: t.Offload, Open: l.openAttached})
	}
	for _, h := range l.Hosts {
		if err := l.kernel(h); err != nil {
			return l, err
		}
		open := l.openPort
		if t.Redirect {
			open = l.attachPort
		}
		if err := open(h); err != nil {
			return l, err
		}
	}
	return l, nil
}

func (l *Lab) addNS(name string) error {
	if err := netnsutil.Create(name); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	l.namespaces = append(l.namespaces, name)
	return nil
}

// wire joins the hosts: two directly by a veth pair, more through a switch
// namespace with one bridge.
func (l *Lab) wire() error {
	if len(l.Hosts) == 2 {
		a, b := l.Hosts[0], l.Hosts[1]
		a.Uplink, b.Uplink = "veth-to-2", "veth-to-1"
		return l.veth(a.Namespace, a.Uplink, b.Namespace, b.Uplink)
	}
	sw := l.Prefix + "sw"
	if err := l.addNS(sw); err != nil {
		return err
	}
	err := netnsutil.Do(netnsutil.Path(sw), func(h *netlink.Handle) error {
		if err := plainBridges(); err != nil {
			return err
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0", MTU: l.MTU}}
		if err := h.LinkAdd(br); err != nil {
			return fmt.Errorf("switch bridge: %w", err)
		}
		return h.LinkSetUp(br)
	})
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	for _, host := range l.Hosts {
		host.Uplink = "uplink"
		port := "host" + strconv.Itoa(host.Index)
		if err := l.veth(host.Namespace, host.Uplink, sw, port); err != nil {
			return err
		}
		err := netnsutil.Do(netnsutil.Path(sw), func(h *netlink.Handle) error {
			link, err := h.LinkByName(port)
			if err != nil {
				return err
			}
			br, err := h.LinkByName("br0")
			if err != nil {
				return err
			}
			return h.LinkSetMaster(link, br)
		})
		if err != nil {
			return fmt.Errorf("lab: attaching %s to the switch: %w", port, err)
		}
	}
	return nil
}

// bridgeNetfilter are the per-namespace settings of br_netfilter that send
// the frames a bridge forwards through the namespace's IP and ARP
// firewall hooks.
var bridgeNetfilter = []string{
	"net/bridge/bridge-nf-call-iptables",
	"net/bridge/bridge-nf-call-ip6tables",
	"net/bridge/bridge-nf-call-arptables",
}

// plainBridges makes the bridges of the current namespace plain switches.
// Where br_netfilter is loaded (Docker and Kubernetes hosts load it), a
// new namespace starts with it on: every IPv4, IPv6 and ARP frame a bridge
// forwards also goes through that namespace's firewall hooks, which no
// switch of a real network does. The ports' RoCE frames (UDP) would pay
// for it at each bridge and the raw ping-pong's frames (not IP) would not:
// a port's TAP write, which carries a frame across both bridges, took 4.8
// µs with it and 3.9 µs without. Without br_netfilter there is nothing to
// turn off.
func plainBridges() error {
	for _, key := range bridgeNetfilter {
		err := netnsutil.WriteSysctl(key, "0")
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("bridge netfilter off: %w", err)
		}
	}
	return nil
}

// veth creates a veth pair with one end in each namespace, both up.
func (l *Lab) veth(nsA, nameA, nsB, nameB string) error {
	fdA, err := unix.Open(netnsutil.Path(nsA), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	defer unix.Close(fdA)
	fdB, err := unix.Open(netnsutil.Path(nsB), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	defer unix.Close(fdB)
	v := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: nameA, MTU: l.MTU, Namespace: netlink.NsFd(fdA)},
		PeerName:      nameB,
		PeerNamespace: netlink.NsFd(fdB),
	}
	if err := netlink.LinkAdd(v); err != nil {
		return fmt.Errorf("lab: veth %s/%s – %s/%s: %w", nsA, nameA, nsB, nameB, err)
	}
	for _, e := range []struct{ ns, name string }{{nsA, nameA}, {nsB, nameB}} {
		err := netnsutil.Do(netnsutil.Path(e.ns), func(h *netlink.Handle) error {
			link, err := h.LinkByName(e.name)
			if err != nil {
				return err
			}
			if err := h.LinkSetMTU(link, l.MTU); err != nil {
				return err
			}
			return h.LinkSetUp(link)
		})
		if err != nil {
			return fmt.Errorf("lab: bringing up %s/%s: %w", e.ns, e.name, err)
		}
	}
	return nil
}

// kernel gives a host's kernel its link and addresses, and loopback: in
// bridge mode a bridge with the uplink as its port and the kernel's
// addresses on it, in redirect mode the addresses on the uplink itself.
func (l *Lab) kernel(host *Host) error {
	err := netnsutil.Do(netnsutil.Path(host.Namespace), func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(lo); err != nil {
			return err
		}
		link, err := h.LinkByName(host.Uplink)
		if err != nil {
			return err
		}
		if host.Bridge != "" {
			if err := plainBridges(); err != nil {
				return err
			}
			br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: host.Bridge, MTU: l.MTU}}
			if err := h.LinkAdd(br); err != nil {
				return fmt.Errorf("bridge: %w", err)
			}
			if err := h.LinkSetMaster(link, br); err != nil {
				return err
			}
			// Bridge ports carry no addresses of their own.
			_ = netnsutil.WriteSysctl("net/ipv6/conf/"+host.Uplink+"/disable_ipv6", "1")
			link = br
		}
		for _, p := range host.KernelAddrs {
			addr := &netlink.Addr{IPNet: prefixToIPNet(p), Flags: unix.IFA_F_NODAD}
			if err := h.AddrAdd(link, addr); err != nil {
				return fmt.Errorf("address %v: %w", p, err)
			}
		}
		return h.LinkSetUp(link)
	})
	if err != nil {
		return fmt.Errorf("lab: host %s: %w", host.Namespace, err)
	}
	return nil
}

// portConfig fills in what the lab gives each port: its name, impairment,
// capture, logger, and the handler that passes its RoCE packets to the
// topology's and the host's.
func (l *Lab) portConfig(host *Host, cfg *appliance.PortConfig) {
	idx := host.Index
	cfg.Namespace = host.Namespace
	cfg.Ingress, cfg.Egress, cfg.Capture, cfg.Logger = l.Ingress, l.Egress, l.Capture, l.Logger
	cfg.Handler = func(frame []byte, p *roce.Packet) {
		if l.Handler != nil {
			l.Handler(idx, frame, p)
		}
		if fn := host.extra.Load(); fn != nil {
			(*fn)(frame, p)
		}
	}
}

// openPort opens a host's port in bridge mode: a device of the lab's
// appliance whose TAP joins the host's bridge.
func (l *Lab) openPort(host *Host) error {
	cfg := appliance.PortConfig{
		Netns:   netnsutil.Path(host.Namespace),
		Name:    appliance.DefaultPortName,
		Addrs:   host.PortAddrs,
		MTU:     l.MTU,
		Offload: l.Offload,
	}
	l.portConfig(host, &cfg)
	nic, err := l.App.AddPort(cfg)
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	port := nic.Port()
	host.Port, host.NIC, host.Device = port, nic, nic.Name()
	if err := netnsutil.AttachToBridge(netnsutil.Path(host.Namespace), appliance.DefaultPortName, host.Bridge); err != nil {
		return fmt.Errorf("lab: attaching the TAP of %s: %w", host.Namespace, err)
	}
	// The TAP joined the bridge after the station announced itself on an
	// unattached device: announce again now that the link is complete.
	port.Station().Announce()
	return nil
}

// attachPort attaches a host's port in redirect mode to its uplink, as
// the appliance daemon attaches a pod's interface: the namespace's name
// is the attachment's container ID, the kernel's addresses its IPs.
func (l *Lab) attachPort(host *Host) error {
	_, err := l.attached.Attach(context.Background(), admin.AttachRequest{
		ContainerID: host.Namespace,
		IfName:      host.Uplink,
		Netns:       netnsutil.Path(host.Namespace),
		IPs:         host.PortAddrs,
		PortName:    appliance.DefaultPortName,
	})
	if err != nil {
		return fmt.Errorf("lab: attaching the port of %s to %s: %w", host.Namespace, host.Uplink, err)
	}
	return nil
}

// openAttached is the attach manager's Options.Open: the port of the host
// whose namespace cfg names becomes a device of the lab's appliance, with
// what the lab gives every port.
func (l *Lab) openAttached(cfg appliance.PortConfig) (attach.Port, error) {
	var host *Host
	for _, h := range l.Hosts {
		if netnsutil.Path(h.Namespace) == cfg.Netns {
			host = h
		}
	}
	if host == nil {
		return nil, fmt.Errorf("lab: no host in namespace %s", cfg.Netns)
	}
	l.portConfig(host, &cfg)
	p, err := attach.OpenDevice(l.App, cfg)
	if err != nil {
		return nil, err
	}
	host.Port, host.NIC, host.Device = p.Port(), p.NIC(), p.Device()
	return p, nil
}

// Close stops the ports, takes the redirect-mode attachments down (their
// tc filters and qdiscs) and deletes the namespaces (with every link in
// them). It is safe on a partly built lab.
func (l *Lab) Close() error {
	var errs []error
	if l.attached != nil {
		if err := l.attached.Close(); err != nil {
			errs = append(errs, fmt.Errorf("lab: %w", err))
		}
		l.attached = nil
	}
	if l.App != nil {
		if err := l.App.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, h := range l.Hosts {
		h.Port, h.NIC = nil, nil
	}
	for i := len(l.namespaces) - 1; i >= 0; i-- {
		if err := netnsutil.Delete(l.namespaces[i]); err != nil {
			errs = append(errs, err)
		}
	}
	l.namespaces = nil
	return errors.Join(errs...)
}

// Neighbor returns the MAC that the kernel of namespace ns has for ip, as
// `ip neigh` shows it, and whether it has a usable entry.
func Neighbor(ns string, ip netip.Addr) (net.HardwareAddr, bool, error) {
	var mac net.HardwareAddr
	var found bool
	err := netnsutil.Do(netnsutil.Path(ns), func(h *netlink.Handle) error {
		family := netlink.FAMILY_V4
		if ip.Is6() {
			family = netlink.FAMILY_V6
		}
		neighs, err := h.NeighList(0, family)
		if err != nil {
			return err
		}
		for _, n := range neighs {
			a, ok := netip.AddrFromSlice(n.IP)
			if ok && a.Unmap() == ip && n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE|netlink.NUD_PERMANENT) != 0 {
				mac, found = n.HardwareAddr, true
			}
		}
		return nil
	})
	return mac, found, err
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), bits)}
}

// waitFor polls cond every 10 ms until it holds or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}
