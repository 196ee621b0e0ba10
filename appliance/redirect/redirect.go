// Package redirect is the tc plumbing of redirect mode: inside a pod's
// network namespace it moves RoCEv2 traffic between the pod's interface
// and the TAP device of the pod's taproce port, and leaves everything else
// to the pod's kernel.
//
// Both devices get a clsact qdisc. On the pod interface's ingress, u32
// filters match UDP destination port 4791 over IPv4 (no options, not a
// fragment) and over IPv6 (UDP as the next header, no extension headers)
// and redirect the frames to the TAP's egress: the appliance reads them.
// On the TAP's ingress (the frames the appliance writes) a u32 filter
// matches everything and redirects it to the pod interface's egress: the
// frames leave as if the pod had sent them. Only u32 and mirred are used,
// which every kernel with clsact has (flower, matchall and act_bpf are
// often not built).
//
// The filters are recognisable by their preference: `tc filter show dev
// eth0 ingress` lists them as pref 4791 (IPv4) and 4792 (IPv6), and `tc
// filter show dev roce0 ingress` as pref 4791.
package redirect

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"slices"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/internal/netnsutil"
)

// Preferences (tc "pref", priorities) of the filters.
const (
	PrefIPv4 uint16 = 4791 // pod interface ingress, IPv4
	PrefIPv6 uint16 = 4792 // pod interface ingress, IPv6
	PrefTAP  uint16 = 4791 // TAP ingress, every frame
)

// RoCEv2Port is the UDP destination port the filters match.
const RoCEv2Port = 4791

// Errors callers branch on.
var (
	// ErrNoNetns: the namespace path does not exist or is no longer a
	// network namespace (unmounted).
	ErrNoNetns = errors.New("network namespace not found")
	// ErrNoLink: the pod interface or the TAP device does not exist.
	ErrNoLink = errors.New("interface not found")
	// ErrMissing: Verify found a qdisc or filter missing or different.
	ErrMissing = errors.New("redirect incomplete")
)

// Config names the devices of one redirect.
type Config struct {
	// Netns is the path of the network namespace (empty: the caller's).
	Netns string
	// Pod is the pod's interface (eth0), TAP the port's TAP device.
	Pod, TAP string
}

// String names the redirect for messages: NETNS:POD⇄TAP.
func (c Config) String() string { return fmt.Sprintf("%s:%s⇄%s", c.Netns, c.Pod, c.TAP) }

// filterSpec is one of the three filters.
type filterSpec struct {
	what     string // for messages
	pref     uint16
	protocol uint16
	keys     []netlink.TcU32Key
}

// ipv4Keys match an option-less, unfragmented IPv4 UDP datagram to port
// 4791. Offsets count from the IP header.
var ipv4Keys = []netlink.TcU32Key{
	{Mask: 0x0f000000, Val: 0x05000000, Off: 0},             // IHL 5: no options
	{Mask: 0x00003fff, Val: 0, Off: 4},                      // MF clear, fragment offset 0
	{Mask: 0x00ff0000, Val: unix.IPPROTO_UDP << 16, Off: 8}, // protocol UDP
	{Mask: 0x0000ffff, Val: RoCEv2Port, Off: 20},            // UDP destination port
}

// ipv6Keys match an IPv6 datagram whose next header is UDP, to port 4791.
var ipv6Keys = []netlink.TcU32Key{
	{Mask: 0x0000ff00, Val: unix.IPPROTO_UDP << 8, Off: 4}, // next header UDP
	{Mask: 0x0000ffff, Val: RoCEv2Port, Off: 40},           // UDP destination port
}

// allKeys match every frame.
var allKeys = []netlink.TcU32Key{{Mask: 0, Val: 0, Off: 0}}

func podFilters() []filterSpec {
	return []filterSpec{
		{"IPv4 UDP/4791", PrefIPv4, unix.ETH_P_IP, ipv4Keys},
		{"IPv6 UDP/4791", PrefIPv6, unix.ETH_P_IPV6, ipv6Keys},
	}
}

func tapFilter() filterSpec { return filterSpec{"all frames", PrefTAP, unix.ETH_P_ALL, allKeys} }

// links are the two devices of a redirect, looked up in its namespace.
type links struct{ pod, tap netlink.Link }

// Install sets up the redirect: clsact qdiscs on both devices, the
// filters, and IPv6 off on the TAP (so the pod's kernel gives it no
// link-local address and route: the TAP carries no traffic of its own).
// It is idempotent: what is in place stays, what differs (a filter that
// points at an earlier TAP) is replaced.
func Install(cfg Config) error {
	err := do(cfg.Netns, func(h *netlink.Handle) error {
		l, err := lookup(h, cfg)
		if err != nil {
			return err
		}
		if err := quietIPv6(h, l.tap); err != nil {
			return fmt.Errorf("keeping IPv6 off %s: %w", cfg.TAP, err)
		}
		for _, link := range []netlink.Link{l.pod, l.tap} {
			if err := ensureClsact(h, link); err != nil {
				return err
			}
		}
		for _, f := range podFilters() {
			if err := ensureFilter(h, l.pod, f, l.tap); err != nil {
				return err
			}
		}
		return ensureFilter(h, l.tap, tapFilter(), l.pod)
	})
	if err != nil {
		return fmt.Errorf("redirect %s: install: %w", cfg, err)
	}
	return nil
}

// Remove takes the redirect down: the filters on both devices, the TAP's
// clsact qdisc, and the pod interface's when no other filter uses it. A
// namespace or device that is gone counts as removed.
func Remove(cfg Config) error {
	err := do(cfg.Netns, func(h *netlink.Handle) error {
		var errs []error
		if pod, err := h.LinkByName(cfg.Pod); err == nil {
			for _, f := range podFilters() {
				errs = append(errs, deleteFilter(h, pod, f))
			}
			errs = append(errs, deleteClsactIfUnused(h, pod))
		} else if !isLinkNotFound(err) {
			errs = append(errs, fmt.Errorf("%s: %w", cfg.Pod, err))
		}
		if tap, err := h.LinkByName(cfg.TAP); err == nil {
			errs = append(errs, deleteFilter(h, tap, tapFilter()), deleteClsactIfUnused(h, tap))
		} else if !isLinkNotFound(err) {
			errs = append(errs, fmt.Errorf("%s: %w", cfg.TAP, err))
		}
		return errors.Join(errs...)
	})
	if err != nil && !errors.Is(err, ErrNoNetns) {
		return fmt.Errorf("redirect %s: remove: %w", cfg, err)
	}
	return nil
}

// Verify checks that the redirect is in place: both devices, their clsact
// qdiscs and the three filters, pointing at each other. Its error wraps
// ErrMissing (or ErrNoNetns, ErrNoLink) and names everything missing.
func Verify(cfg Config) error {
	err := do(cfg.Netns, func(h *netlink.Handle) error {
		l, err := lookup(h, cfg)
		if err != nil {
			return err
		}
		var missing []error
		for _, link := range []netlink.Link{l.pod, l.tap} {
			ok, err := hasClsact(h, link)
			if err != nil {
				return err
			}
			if !ok {
				missing = append(missing, fmt.Errorf("no clsact qdisc on %s", link.Attrs().Name))
			}
		}
		for _, f := range podFilters() {
			missing = append(missing, checkFilter(h, l.pod, f, l.tap))
		}
		missing = append(missing, checkFilter(h, l.tap, tapFilter(), l.pod))
		if err := errors.Join(missing...); err != nil {
			return fmt.Errorf("%w: %w", ErrMissing, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redirect %s: %w", cfg, err)
	}
	return nil
}

// Link describes a network interface.
type Link struct {
	Index, MTU int
	MAC        net.HardwareAddr
}

// Inspect returns the index, MTU and MAC of interface name in the
// namespace at netns: ErrNoNetns or ErrNoLink when there is none.
func Inspect(netns, name string) (Link, error) {
	var l Link
	err := do(netns, func(h *netlink.Handle) error {
		link, err := h.LinkByName(name)
		if err != nil {
			return linkErr("interface", name, err)
		}
		a := link.Attrs()
		l = Link{Index: a.Index, MTU: a.MTU, MAC: a.HardwareAddr}
		return nil
	})
	if err != nil {
		return Link{}, fmt.Errorf("%s in %s: %w", name, netns, err)
	}
	return l, nil
}

// do runs fn in the namespace at path, with ErrNoNetns when there is no
// such namespace any more.
func do(path string, fn func(h *netlink.Handle) error) error {
	if path != "" {
		var st unix.Statfs_t
		if err := unix.Statfs(path, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("%w: %s", ErrNoNetns, path)
			}
			return fmt.Errorf("network namespace %s: %w", path, err)
		}
		if st.Type != unix.NSFS_MAGIC {
			return fmt.Errorf("%w: %s is not a namespace file (unmounted?)", ErrNoNetns, path)
		}
	}
	return netnsutil.Do(path, fn)
}

func lookup(h *netlink.Handle, cfg Config) (links, error) {
	var l links
	var err error
	if l.pod, err = h.LinkByName(cfg.Pod); err != nil {
		return l, linkErr("pod interface", cfg.Pod, err)
	}
	if l.tap, err = h.LinkByName(cfg.TAP); err != nil {
		return l, linkErr("TAP device", cfg.TAP, err)
	}
	return l, nil
}

func linkErr(what, name string, err error) error {
	if isLinkNotFound(err) {
		return fmt.Errorf("%w: %s %s", ErrNoLink, what, name)
	}
	return fmt.Errorf("%s %s: %w", what, name, err)
}

func isLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

func clsact(link netlink.Link) *netlink.GenericQdisc {
	return &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: link.Attrs().Index,
			Handle:    netlink.MakeHandle(0xffff, 0),
			Parent:    netlink.HANDLE_CLSACT,
		},
		QdiscType: "clsact",
	}
}

func hasClsact(h *netlink.Handle, link netlink.Link) (bool, error) {
	qs, err := h.QdiscList(link)
	if err != nil {
		return false, fmt.Errorf("listing qdiscs of %s: %w", link.Attrs().Name, err)
	}
	for _, q := range qs {
		if q.Type() == "clsact" {
			return true, nil
		}
	}
	return false, nil
}

func ensureClsact(h *netlink.Handle, link netlink.Link) error {
	ok, err := hasClsact(h, link)
	if err != nil || ok {
		return err
	}
	if err := h.QdiscAdd(clsact(link)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding clsact qdisc to %s: %w", link.Attrs().Name, err)
	}
	return nil
}

// deleteClsactIfUnused removes link's clsact qdisc when no filter is left
// on its ingress or egress: the qdisc may be another component's, which
// then has filters on it.
func deleteClsactIfUnused(h *netlink.Handle, link netlink.Link) error {
	ok, err := hasClsact(h, link)
	if err != nil || !ok {
		return err
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := h.FilterList(link, parent)
		if err != nil {
			return fmt.Errorf("listing filters of %s: %w", link.Attrs().Name, err)
		}
		if len(fs) > 0 {
			return nil
		}
	}
	if err := h.QdiscDel(clsact(link)); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("deleting clsact qdisc of %s: %w", link.Attrs().Name, err)
	}
	return nil
}

// u32 returns the filter f on link's ingress redirecting to target.
func (f filterSpec) u32(link, target netlink.Link) *netlink.U32 {
	return &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: link.Attrs().Index,
			Parent:    netlink.HANDLE_MIN_INGRESS,
			Priority:  f.pref,
			Protocol:  f.protocol,
		},
		Sel: &netlink.TcU32Sel{
			Flags: netlink.TC_U32_TERMINAL,
			Keys:  slices.Clone(f.keys),
		},
		Actions: []netlink.Action{netlink.NewMirredAction(target.Attrs().Index)},
	}
}

// ours returns the filters at f's preference and protocol on link's
// ingress.
func (f filterSpec) ours(h *netlink.Handle, link netlink.Link) ([]netlink.Filter, error) {
	all, err := h.FilterList(link, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		return nil, fmt.Errorf("listing ingress filters of %s: %w", link.Attrs().Name, err)
	}
	var out []netlink.Filter
	for _, x := range all {
		if a := x.Attrs(); a.Priority == f.pref && a.Protocol == f.protocol {
			out = append(out, x)
		}
	}
	return out, nil
}

// matches reports whether the filters found are exactly f redirecting to
// target, and says what differs when not.
func (f filterSpec) matches(found []netlink.Filter, target netlink.Link) error {
	if len(found) == 0 {
		return errors.New("missing")
	}
	if len(found) > 1 {
		return fmt.Errorf("%d filters where one belongs", len(found))
	}
	u, ok := found[0].(*netlink.U32)
	if !ok {
		return fmt.Errorf("a %s filter instead of u32", found[0].Type())
	}
	if u.Sel == nil || u.Sel.Flags&netlink.TC_U32_TERMINAL == 0 || !slices.Equal(u.Sel.Keys, f.keys) {
		return errors.New("matches other traffic")
	}
	if len(u.Actions) != 1 {
		return fmt.Errorf("%d actions instead of one redirect", len(u.Actions))
	}
	m, ok := u.Actions[0].(*netlink.MirredAction)
	switch {
	case !ok:
		return fmt.Errorf("a %s action instead of mirred", u.Actions[0].Type())
	case m.MirredAction != netlink.TCA_EGRESS_REDIR || m.Attrs().Action != netlink.TC_ACT_STOLEN:
		return errors.New("mirred does not redirect to egress")
	case m.Ifindex != target.Attrs().Index:
		return fmt.Errorf("redirects to ifindex %d instead of %s (%d)", m.Ifindex, target.Attrs().Name, target.Attrs().Index)
	}
	return nil
}

// checkFilter returns nil when f is in place on link, redirecting to
// target, else what is wrong.
func checkFilter(h *netlink.Handle, link netlink.Link, f filterSpec, target netlink.Link) error {
	found, err := f.ours(h, link)
	if err != nil {
		return err
	}
	if err := f.matches(found, target); err != nil {
		return fmt.Errorf("tc filter pref %d (%s → %s) on %s ingress: %w", f.pref, f.what, target.Attrs().Name, link.Attrs().Name, err)
	}
	return nil
}

// ensureFilter installs f on link's ingress, replacing whatever holds its
// preference and protocol when it is not exactly f.
func ensureFilter(h *netlink.Handle, link netlink.Link, f filterSpec, target netlink.Link) error {
	found, err := f.ours(h, link)
	if err != nil {
		return err
	}
	if f.matches(found, target) == nil {
		return nil
	}
	if len(found) > 0 {
		if err := deleteFilter(h, link, f); err != nil {
			return err
		}
	}
	if err := h.FilterAdd(f.u32(link, target)); err != nil {
		return fmt.Errorf("adding tc filter pref %d (%s) on %s ingress: %w", f.pref, f.what, link.Attrs().Name, err)
	}
	return nil
}

// deleteFilter removes every filter at f's preference and protocol from
// link's ingress; none there is not an error.
func deleteFilter(h *netlink.Handle, link netlink.Link, f filterSpec) error {
	err := h.FilterDel(&netlink.U32{FilterAttrs: netlink.FilterAttrs{
		LinkIndex: link.Attrs().Index,
		Parent:    netlink.HANDLE_MIN_INGRESS,
		Priority:  f.pref,
		Protocol:  f.protocol,
	}})
	if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("deleting tc filter pref %d on %s ingress: %w", f.pref, link.Attrs().Name, err)
	}
	return nil
}

// quietIPv6 keeps the pod's kernel from using the TAP for IPv6: the
// disable_ipv6 sysctl where it can be written, and in any case (for
// /proc/sys is read-only in a container) the address generation mode
// "none" over netlink and no link-local address, so the kernel gives the
// TAP no address, route or neighbour discovery. A container's kernel may
// still send the odd multicast listener report; the station drops it.
func quietIPv6(h *netlink.Handle, tap netlink.Link) error {
	err := netnsutil.WriteSysctl("net/ipv6/conf/"+tap.Attrs().Name+"/disable_ipv6", "1")
	if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.EROFS) && !errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("disable_ipv6: %w", err)
	}
	if err := h.LinkSetIP6AddrGenMode(tap, nl.IN6_ADDR_GEN_MODE_NONE); err != nil {
		return fmt.Errorf("address generation mode: %w", err)
	}
	addrs, err := h.AddrList(tap, netlink.FAMILY_V6)
	if err != nil {
		return fmt.Errorf("addresses: %w", err)
	}
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() {
			if err := h.AddrDel(tap, &a); err != nil {
				return fmt.Errorf("removing %v: %w", a.IP, err)
			}
		}
	}
	return nil
}
