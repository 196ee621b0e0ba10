// Package cni is taproce-cni, the CNI plugin that gives pods a taproce
// RDMA port. It runs chained after the plugin that creates the pod's
// interface and assigns its addresses (bridge with host-local, Calico,
// Cilium, …) and asks the node's appliance, over its admin socket, to
// attach a port in redirect mode: a TAP device (roce0) in the pod's
// namespace whose GIDs are the pod's own addresses, with tc filters that
// move RoCEv2 between the pod interface and the TAP. Nothing else of the
// pod's networking changes.
//
// The plugin speaks CNI 1.1 and every older version the CNI library
// supports. Its network configuration adds two optional keys:
//
//	{
//	  "type": "taproce-cni",
//	  "adminSocket": "/run/taproce/admin.sock",
//	  "portName": "roce0"
//	}
//
// Errors are CNI error results: the well-known codes where one fits (7
// invalid configuration, 8 invalid namespace, 11 try again later, 50
// plugin not available) and the plugin's own from 100 up (CodeAttach,
// CodeConflict, CodeIncomplete), each with a message saying what to do.
package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/taproce/taproce/appliance/admin"
)

// Plugin-specific CNI error codes (the CNI spec reserves 100 and up for
// plugins).
const (
	// CodeAttach: the appliance could not attach the port.
	CodeAttach uint = 100
	// CodeConflict: the appliance has this attachment in another
	// namespace or with another port name.
	CodeConflict uint = 101
	// CodeIncomplete: CHECK found the port, TAP or filters missing or
	// different from the result.
	CodeIncomplete uint = 102
)

// DefaultTimeout bounds each call to the appliance.
const DefaultTimeout = 30 * time.Second

// Versions are the CNI spec versions the plugin supports: all the CNI
// library knows.
var Versions = version.All

// NetConf is taproce-cni's network configuration.
type NetConf struct {
	types.PluginConf
	// AdminSocket is the appliance's admin socket (default
	// /run/taproce/admin.sock).
	AdminSocket string `json:"adminSocket,omitempty"`
	// PortName is the TAP device's name in the pod (default roce0).
	PortName string `json:"portName,omitempty"`
}

// Plugin is taproce-cni. The zero value writes results to os.Stdout,
// logs warnings to os.Stderr and gives the appliance DefaultTimeout per
// call.
type Plugin struct {
	Stdout  io.Writer
	Logger  *slog.Logger
	Timeout time.Duration
}

// Funcs returns the commands of a Plugin with the defaults, for
// skel.PluginMainFuncs.
func Funcs() skel.CNIFuncs { return (&Plugin{}).Funcs() }

// About describes the plugin for `taproce-cni` run without a command.
func About() string {
	return "taproce-cni: attaches a taproce software RDMA (RoCEv2) port to a pod; chain it after the plugin that assigns the pod's IPs"
}

// Funcs returns the plugin's commands.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, GC: p.GC, Status: p.Status}
}

func (p *Plugin) stdout() io.Writer {
	if p.Stdout != nil {
		return p.Stdout
	}
	return os.Stdout
}

func (p *Plugin) log() *slog.Logger {
	if p.Logger != nil {
		return p.Logger
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func (p *Plugin) context() (context.Context, context.CancelFunc) {
	d := p.Timeout
	if d <= 0 {
		d = DefaultTimeout
	}
	return context.WithTimeout(context.Background(), d)
}

// parseConf decodes the network configuration and its prevResult.
func parseConf(data []byte) (*NetConf, error) {
	conf := &NetConf{}
	if err := json.Unmarshal(data, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "taproce-cni: cannot decode the network configuration", err.Error())
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "taproce-cni: cannot decode prevResult", err.Error())
	}
	if conf.AdminSocket == "" {
		conf.AdminSocket = admin.DefaultSocket
	}
	if conf.PortName == "" {
		conf.PortName = admin.DefaultPortName
	}
	return conf, nil
}

// prevResult returns the configuration's prevResult in the current
// result format, or a CNI error naming what is missing.
func prevResult(conf *NetConf, cmd string) (*current.Result, error) {
	if conf.PrevResult == nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig,
			"taproce-cni must be chained after a plugin that creates the pod interface and assigns its IPs (e.g. bridge with host-local IPAM): "+cmd+" got no prevResult",
			"put taproce-cni after that plugin in the \"plugins\" list of the conflist")
	}
	res, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "taproce-cni: cannot convert prevResult", err.Error())
	}
	return res, nil
}

// podIPs returns the addresses prevResult gives the sandbox interface
// ifName; when it names no interfaces (results before CNI 0.3.0), all
// its addresses. An IPv4-mapped IPv6 address counts as the IPv4 address
// it maps. An address it cannot turn into a prefix — no IP, a mask that
// is not a prefix length, an IPv4-mapped address with a prefix shorter
// than /96 — is a CNI error (ErrInvalidNetworkConfig) naming it, rather
// than a prefix the appliance would refuse without saying why.
func podIPs(res *current.Result, ifName string) ([]netip.Prefix, error) {
	idx := -1
	for i, in := range res.Interfaces {
		if in.Name == ifName && in.Sandbox != "" {
			idx = i
		}
	}
	var out []netip.Prefix
	for _, ip := range res.IPs {
		if idx >= 0 && (ip.Interface == nil || *ip.Interface != idx) {
			continue
		}
		p, err := ipPrefix(ip.Address)
		if err != nil {
			return nil, types.NewError(types.ErrInvalidNetworkConfig,
				fmt.Sprintf("taproce-cni: prevResult address %q: %v", addrText(ip.Address), err),
				"the pod's addresses become the port's GIDs; fix the plugin that assigns them")
		}
		out = append(out, p)
	}
	return out, nil
}

// addrText writes a prevResult address as the configuration gave it
// (net.IPNet's String writes an IPv4-mapped address with an IPv6 mask as
// an IPv4 one).
func addrText(n net.IPNet) string {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return n.String()
	}
	ones, bits := n.Mask.Size()
	if bits == 32 {
		a = a.Unmap()
	}
	if bits == 0 {
		return fmt.Sprintf("%s mask %s", a, n.Mask)
	}
	return fmt.Sprintf("%s/%d", a, ones)
}

// ipPrefix turns a prevResult address into a prefix; an IPv4-mapped
// address becomes its IPv4 address with the prefix length less 96.
func ipPrefix(n net.IPNet) (netip.Prefix, error) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, errors.New("no IP address")
	}
	ones, bits := n.Mask.Size()
	if bits == 0 || bits != len(n.IP)*8 && !(bits == 32 && len(n.IP) == net.IPv6len && a.Is4In6()) {
		return netip.Prefix{}, fmt.Errorf("mask %s is not a prefix length for this address", n.Mask)
	}
	if a.Is4In6() {
		a = a.Unmap()
		if bits == 128 {
			if ones < 96 {
				return netip.Prefix{}, fmt.Errorf("an IPv4-mapped address needs a prefix of /96 or longer, not /%d", ones)
			}
			ones -= 96
		}
	}
	return netip.PrefixFrom(a, ones), nil
}

// Add attaches a port to the pod and adds its interface to the result.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	res, err := prevResult(conf, "ADD")
	if err != nil {
		return err
	}
	ips, err := podIPs(res, args.IfName)
	if err != nil {
		return err
	}
	if len(ips) == 0 {
		return types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("taproce-cni: prevResult has no IP address for %s; taproce uses the pod's IPs as its GIDs", args.IfName),
			"chain taproce-cni after the plugin that assigns the pod's addresses")
	}
	ctx, cancel := p.context()
	defer cancel()
	att, err := admin.NewClient(conf.AdminSocket).Attach(ctx, admin.AttachRequest{
		ContainerID: args.ContainerID,
		IfName:      args.IfName,
		Netns:       args.Netns,
		IPs:         ips,
		PortName:    conf.PortName,
		Network:     conf.Name,
	})
	if err != nil {
		return cniError("ADD", conf.AdminSocket, err)
	}
	res.Interfaces = append(res.Interfaces, &current.Interface{Name: att.PortName, Mac: att.MAC, Sandbox: args.Netns})
	out, err := res.GetAsVersion(conf.CNIVersion)
	if err != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, "taproce-cni: cannot express the result in CNI "+conf.CNIVersion, err.Error())
	}
	return out.PrintTo(p.stdout())
}

// Del detaches the pod's port. It succeeds when there is nothing to
// detach: no such attachment, the namespace gone, the appliance down
// (its ports went with it; a restarted appliance cleans up after itself).
func (p *Plugin) Del(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := p.context()
	defer cancel()
	err = admin.NewClient(conf.AdminSocket).Detach(ctx, admin.DetachRequest{
		ContainerID: args.ContainerID,
		IfName:      args.IfName,
		Netns:       args.Netns,
		PortName:    conf.PortName,
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, admin.ErrUnavailable):
		p.log().Warn("appliance unavailable; nothing to detach", "container", args.ContainerID, "ifname", args.IfName, "err", err)
		return nil
	case errors.Is(err, admin.ErrNetnsGone):
		return nil
	}
	return cniError("DEL", conf.AdminSocket, err)
}

// Check asks the appliance to verify the port, TAP and filters, and
// compares the attachment with the result the runtime recorded.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	res, err := prevResult(conf, "CHECK")
	if err != nil {
		return err
	}
	ctx, cancel := p.context()
	defer cancel()
	att, err := admin.NewClient(conf.AdminSocket).Check(ctx, admin.CheckRequest{ContainerID: args.ContainerID, IfName: args.IfName})
	if err != nil {
		return cniError("CHECK", conf.AdminSocket, err)
	}
	var problems []string
	if att.Netns != args.Netns {
		problems = append(problems, fmt.Sprintf("the port is in %s, the pod in %s", att.Netns, args.Netns))
	}
	i := slices.IndexFunc(res.Interfaces, func(in *current.Interface) bool { return in.Name == att.PortName && in.Sandbox != "" })
	switch {
	case i < 0:
		problems = append(problems, fmt.Sprintf("the result has no interface %s", att.PortName))
	case !strings.EqualFold(res.Interfaces[i].Mac, att.MAC):
		problems = append(problems, fmt.Sprintf("the result gives %s MAC %s, the port has %s", att.PortName, res.Interfaces[i].Mac, att.MAC))
	}
	ips, err := podIPs(res, args.IfName)
	if err != nil {
		return err
	}
	for _, ip := range ips {
		if !slices.Contains(att.GIDs, netip.AddrFrom16(ip.Addr().As16())) && !slices.Contains(att.GIDs, ip.Addr()) {
			problems = append(problems, fmt.Sprintf("the pod's address %v is not a GID of the port", ip.Addr()))
		}
	}
	if len(problems) > 0 {
		return types.NewError(CodeIncomplete, "taproce-cni CHECK: "+strings.Join(problems, "; "),
			"delete and re-add the pod's network (or restart the pod)")
	}
	return nil
}

// Status reports whether the appliance is there to serve ADDs.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := p.context()
	defer cancel()
	if err := admin.NewClient(conf.AdminSocket).Health(ctx); err != nil {
		return types.NewError(types.ErrPluginNotAvailable,
			"taproce appliance not reachable at "+conf.AdminSocket+": is the taproce DaemonSet running on this node?", err.Error())
	}
	return nil
}

// GC detaches the ports of this network whose attachments the runtime
// no longer lists. With the appliance down there is nothing to collect.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	req := admin.GCRequest{Network: conf.Name, Valid: []string{}}
	for _, a := range conf.ValidAttachments {
		req.Valid = append(req.Valid, admin.AttachmentID(a.ContainerID, a.IfName))
	}
	ctx, cancel := p.context()
	defer cancel()
	res, err := admin.NewClient(conf.AdminSocket).GC(ctx, req)
	if errors.Is(err, admin.ErrUnavailable) {
		p.log().Warn("appliance unavailable; nothing to collect", "err", err)
		return nil
	}
	if err != nil {
		return cniError("GC", conf.AdminSocket, err)
	}
	if len(res.Removed) > 0 {
		p.log().Info("detached stale attachments", "network", conf.Name, "removed", res.Removed)
	}
	return nil
}

// cniError turns an admin API error into a CNI error with a code and a
// message an operator can act on.
func cniError(cmd, socket string, err error) error {
	msg := func(s string) string { return "taproce-cni " + cmd + ": " + s }
	switch {
	case errors.Is(err, admin.ErrUnavailable):
		return types.NewError(types.ErrTryAgainLater,
			msg("taproce appliance not reachable at "+socket+": is the taproce DaemonSet running on this node?"), err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return types.NewError(types.ErrTryAgainLater, msg("the taproce appliance did not answer in time"), err.Error())
	case errors.Is(err, admin.ErrInvalid):
		return types.NewError(types.ErrInvalidNetworkConfig, msg("the appliance rejected the request; check portName and the pod's addresses"), err.Error())
	case errors.Is(err, admin.ErrNetnsGone):
		return types.NewError(types.ErrInvalidNetNS, msg("the pod's network namespace or interface does not exist"), err.Error())
	case errors.Is(err, admin.ErrConflict):
		return types.NewError(CodeConflict, msg("the container's interface is attached already, in another namespace or with another port name; delete it first"), err.Error())
	case errors.Is(err, admin.ErrNotFound):
		return types.NewError(types.ErrUnknownContainer, msg("the taproce appliance has no port for this container (was the appliance restarted?)"), err.Error())
	case errors.Is(err, admin.ErrIncomplete):
		return types.NewError(CodeIncomplete, msg("the pod's taproce port is incomplete"), err.Error())
	}
	return types.NewError(CodeAttach, msg("the taproce appliance failed; see its log"), err.Error())
}
