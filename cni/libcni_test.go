package cni_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"

	"github.com/taproce/taproce/appliance/admin"
	"github.com/taproce/taproce/appliance/attach"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/internal/testnet"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// pluginDir builds the reference bridge and host-local plugins and
// taproce-cni into a temporary directory, once per test binary.
func pluginDir(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "taproce-cni-bin-")
		if buildErr != nil {
			return
		}
		// go test puts its own go command first on the PATH.
		var gocmd string
		if gocmd, buildErr = exec.LookPath("go"); buildErr != nil {
			return
		}
		cmd := exec.Command(gocmd, "build", "-o", binDir,
			"github.com/containernetworking/plugins/plugins/main/bridge",
			"github.com/containernetworking/plugins/plugins/ipam/host-local",
			"github.com/taproce/taproce/cni/taproce-cni")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building the plugins: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// appliance is the admin API served in the test process over a real
// attach.Manager, stoppable and restartable on the same socket.
type appliance struct {
	t      *testing.T
	socket string
	mgr    *attach.Manager
	srv    *http.Server
	done   chan struct{}
}

func startAppliance(t *testing.T) *appliance {
	a := &appliance{t: t, socket: filepath.Join(t.TempDir(), "admin.sock"),
		mgr: attach.New(attach.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})}
	a.up()
	t.Cleanup(func() {
		a.down()
		if err := a.mgr.Close(); err != nil {
			t.Error(err)
		}
	})
	return a
}

func (a *appliance) up() {
	l, err := admin.Listen(a.socket)
	if err != nil {
		a.t.Fatal(err)
	}
	a.srv = &http.Server{Handler: admin.NewServer(a.mgr, admin.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))}
	a.done = make(chan struct{})
	go func() { defer close(a.done); a.srv.Serve(l) }()
}

func (a *appliance) down() {
	if a.srv != nil {
		a.srv.Close()
		<-a.done
		a.srv = nil
	}
}

func (a *appliance) list() []admin.Attachment {
	a.t.Helper()
	l, err := a.mgr.List(context.Background())
	if err != nil {
		a.t.Fatal(err)
	}
	return l
}

// conflist is bridge with host-local IPAM, then taproce-cni.
func conflist(t *testing.T, ver, socket, dataDir string) *libcni.NetworkConfigList {
	t.Helper()
	text := fmt.Sprintf(`{
  "cniVersion": %q,
  "name": "taproce-test",
  "plugins": [
    {"type": "bridge", "bridge": "tprbr0", "isGateway": true,
     "ipam": {"type": "host-local", "dataDir": %q,
              "ranges": [[{"subnet": "10.77.0.0/24"}], [{"subnet": "fd00:77::/64"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "taproce-cni", "adminSocket": %q}
  ]
}`, ver, dataDir, socket)
	list, err := libcni.ConfListFromBytes([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// inNode runs fn in the node namespace: libcni execs the plugins from
// the calling thread, so they run there too.
func inNode(t *testing.T, node string, fn func() error) error {
	t.Helper()
	return netnsutil.Do(node, func(*netlink.Handle) error { return fn() })
}

// podState returns the interfaces of the pod namespace, the number of tc
// filters on their ingress and of their clsact qdiscs, and eth0's MAC.
func podState(t *testing.T, path string) (names []string, filters, clsact int, mac string) {
	t.Helper()
	err := netnsutil.Do(path, func(h *netlink.Handle) error {
		ls, err := h.LinkList()
		if err != nil {
			return err
		}
		for _, l := range ls {
			names = append(names, l.Attrs().Name)
			if l.Attrs().Name == "eth0" {
				mac = l.Attrs().HardwareAddr.String()
			}
			if fs, err := h.FilterList(l, netlink.HANDLE_MIN_INGRESS); err == nil {
				filters += len(fs)
			}
			if qs, err := h.QdiscList(l); err == nil {
				for _, q := range qs {
					if q.Type() == "clsact" {
						clsact++
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names, filters, clsact, mac
}

// nodeLinks returns the node namespace's interfaces.
func nodeLinks(t *testing.T, node string) []string {
	t.Helper()
	var names []string
	err := netnsutil.Do(node, func(h *netlink.Handle) error {
		ls, err := h.LinkList()
		for _, l := range ls {
			names = append(names, l.Attrs().Name)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func atLeast(ver, min string) bool {
	ok, err := version.GreaterThanOrEqualTo(ver, min)
	return err == nil && ok
}

func cniCode(err error) uint {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// TestLibcni drives the chain bridge + host-local → taproce-cni through
// libcni, as a container runtime does, for every CNI version: ADD, CHECK,
// DEL, DEL again, DEL after the pod's namespace is gone, GC, STATUS with
// the appliance up and down.
func TestLibcni(t *testing.T) {
	testnet.RequireRoot(t)
	dir := pluginDir(t)
	_, node := testnet.Namespace(t)
	app := startAppliance(t)
	dataDir, cacheDir := t.TempDir(), t.TempDir()
	cc := libcni.NewCNIConfigWithCacheDir([]string{dir}, cacheDir, nil)

	info, err := cc.GetVersionInfo(context.Background(), "taproce-cni")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(info.SupportedVersions(), version.All.SupportedVersions()) {
		t.Fatalf("taproce-cni supports %v, want %v", info.SupportedVersions(), version.All.SupportedVersions())
	}

	for _, ver := range version.All.SupportedVersions() {
		t.Run(ver, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			list := conflist(t, ver, app.socket, dataDir)
			id := "ctr-" + strings.ReplaceAll(ver, ".", "")
			podNS, pod := testnet.Namespace(t)
			rt := &libcni.RuntimeConf{ContainerID: id, NetNS: pod, IfName: "eth0"}

			// ADD
			var res types.Result
			if err := inNode(t, node, func() (err error) { res, err = cc.AddNetworkList(ctx, list, rt); return }); err != nil {
				t.Fatalf("ADD: %v", err)
			}
			names, filters, clsact, mac := podState(t, pod)
			if !slices.Contains(names, "roce0") || filters != 3 || clsact != 2 {
				t.Fatalf("after ADD the pod has %v, %d filters and %d clsact qdiscs", names, filters, clsact)
			}
			atts := app.list()
			if len(atts) != 1 || atts[0].ID != id+"/eth0" || atts[0].MAC != mac || atts[0].Network != "taproce-test" {
				t.Fatalf("attachments %+v, want one for %s with MAC %s", atts, id, mac)
			}
			cur, err := current.NewResultFromResult(res)
			if err != nil {
				t.Fatal(err)
			}
			if atLeast(ver, "0.3.0") {
				i := slices.IndexFunc(cur.Interfaces, func(in *current.Interface) bool { return in.Name == "roce0" })
				if i < 0 || cur.Interfaces[i].Mac != mac || cur.Interfaces[i].Sandbox != pod {
					t.Fatalf("result interfaces %v lack roce0 with MAC %s in %s", cur.Interfaces, mac, pod)
				}
			}
			var podIPs []netip.Addr
			for _, ip := range cur.IPs {
				a, _ := netip.AddrFromSlice(ip.Address.IP)
				podIPs = append(podIPs, a.Unmap())
				if !slices.Contains(atts[0].GIDs, netip.AddrFrom16(a.As16())) {
					t.Errorf("pod address %v is not among the port's GIDs %v", a, atts[0].GIDs)
				}
			}
			if len(podIPs) != 2 {
				t.Errorf("result IPs %v, want an IPv4 and an IPv6 address", cur.IPs)
			}

			// RoCEv2 from the node reaches the pod's port.
			port := app.mgr.Port(id + "/eth0")
			before := port.Stats().RxFrames
			if err := inNode(t, node, func() error {
				c, err := net.Dial("udp", netip.AddrPortFrom(podIPs[0], 4791).String())
				if err != nil {
					return err
				}
				defer c.Close()
				_, err = c.Write([]byte("RoCEv2 from the node"))
				return err
			}); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(3 * time.Second)
			for port.Stats().RxFrames == before && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if port.Stats().RxFrames == before {
				t.Error("UDP/4791 to the pod did not reach its port")
			}

			// CHECK
			err = inNode(t, node, func() error { return cc.CheckNetworkList(ctx, list, rt) })
			switch {
			case atLeast(ver, "0.4.0") && err != nil:
				t.Fatalf("CHECK: %v", err)
			case !atLeast(ver, "0.4.0") && !errors.Is(err, libcni.ErrorCheckNotSupp):
				t.Fatalf("CHECK on %s: %v, want ErrorCheckNotSupp", ver, err)
			}

			// DEL, twice
			for i := range 2 {
				if err := inNode(t, node, func() error { return cc.DelNetworkList(ctx, list, rt) }); err != nil {
					t.Fatalf("DEL %d: %v", i+1, err)
				}
				names, filters, clsact, _ := podState(t, pod)
				if slices.Contains(names, "roce0") || filters != 0 || clsact != 0 || len(app.list()) != 0 {
					t.Fatalf("after DEL %d: pod has %v, %d filters, %d clsact qdiscs; attachments %+v", i+1, names, filters, clsact, app.list())
				}
			}

			// DEL after the namespace is gone
			if err := inNode(t, node, func() (err error) { _, err = cc.AddNetworkList(ctx, list, rt); return }); err != nil {
				t.Fatalf("ADD again: %v", err)
			}
			hostVeths := len(nodeLinks(t, node))
			if err := netnsutil.Delete(podNS); err != nil {
				t.Fatal(err)
			}
			if err := inNode(t, node, func() error { return cc.DelNetworkList(ctx, list, rt) }); err != nil {
				t.Fatalf("DEL after the namespace was deleted: %v", err)
			}
			if l := app.list(); len(l) != 0 {
				t.Fatalf("attachments after DEL: %+v", l)
			}
			// With the TAP closed, the kernel destroys the namespace and
			// with it the pod's veth: the node loses its end.
			for deadline := time.Now().Add(5 * time.Second); len(nodeLinks(t, node)) >= hostVeths; {
				if time.Now().After(deadline) {
					t.Fatalf("the pod's namespace outlived DEL: node has %v", nodeLinks(t, node))
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}

	t.Run("GC", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		list := conflist(t, "1.1.0", app.socket, dataDir)
		var rts []*libcni.RuntimeConf
		for _, id := range []string{"gc-keep", "gc-drop"} {
			_, pod := testnet.Namespace(t)
			rt := &libcni.RuntimeConf{ContainerID: id, NetNS: pod, IfName: "eth0"}
			if err := inNode(t, node, func() (err error) { _, err = cc.AddNetworkList(ctx, list, rt); return }); err != nil {
				t.Fatal(err)
			}
			rts = append(rts, rt)
		}
		// An attachment the runtime has no record of (its cache lost):
		// only the plugin's GC, through the appliance, can find it.
		_, orphanPod := testnet.Namespace(t)
		if err := netnsutil.Do(orphanPod, func(h *netlink.Handle) error {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0"}
			if err := h.LinkAdd(v); err != nil {
				return err
			}
			return h.LinkSetUp(v)
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.NewClient(app.socket).Attach(ctx, admin.AttachRequest{ContainerID: "orphan", IfName: "eth0",
			Netns: orphanPod, IPs: []netip.Prefix{netip.MustParsePrefix("10.77.0.250/24")}, Network: "taproce-test"}); err != nil {
			t.Fatal(err)
		}
		err := inNode(t, node, func() error {
			return cc.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: "gc-keep", IfName: "eth0"}}})
		})
		if err != nil {
			t.Fatalf("GC: %v", err)
		}
		atts := app.list()
		if len(atts) != 1 || atts[0].ID != "gc-keep/eth0" {
			t.Fatalf("after GC: %+v, want only gc-keep/eth0", atts)
		}
		if names, filters, _, _ := podState(t, orphanPod); slices.Contains(names, "roce0") || filters != 0 {
			t.Fatalf("the orphan's pod still has %v and %d filters", names, filters)
		}
		if err := inNode(t, node, func() error { return cc.DelNetworkList(ctx, list, rts[0]) }); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("STATUS", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		list := conflist(t, "1.1.0", app.socket, dataDir)
		if err := cc.GetStatusNetworkList(ctx, list); err != nil {
			t.Fatalf("STATUS with the appliance up: %v", err)
		}
		app.down()
		err := cc.GetStatusNetworkList(ctx, list)
		if cniCode(err) != types.ErrPluginNotAvailable || !strings.Contains(err.Error(), app.socket) {
			t.Fatalf("STATUS with the appliance down: %v, want code 50 naming the socket", err)
		}
		// DEL still succeeds with the appliance down.
		_, pod := testnet.Namespace(t)
		rt := &libcni.RuntimeConf{ContainerID: "down", NetNS: pod, IfName: "eth0"}
		if err := inNode(t, node, func() error { return cc.DelNetworkList(ctx, list, rt) }); err != nil {
			t.Fatalf("DEL with the appliance down: %v", err)
		}
		// ADD fails with "try again later".
		err = inNode(t, node, func() (err error) { _, err = cc.AddNetworkList(ctx, list, rt); return })
		if cniCode(err) != types.ErrTryAgainLater {
			t.Fatalf("ADD with the appliance down: %v, want code 11", err)
		}
		app.up()
		if err := cc.GetStatusNetworkList(ctx, list); err != nil {
			t.Fatalf("STATUS after the appliance came back: %v", err)
		}
		// The failed ADD left the bridge's veth; libcni's DEL clears it.
		if err := inNode(t, node, func() error { return cc.DelNetworkList(ctx, list, rt) }); err != nil {
			t.Fatal(err)
		}
	})

	// Nothing left behind: no attachment, and only the bridge and
	// loopback in the node.
	if l := app.list(); len(l) != 0 {
		t.Errorf("attachments left: %+v", l)
	}
	if names := nodeLinks(t, node); len(names) > 2 {
		t.Errorf("node interfaces left: %v", names)
	}
}
