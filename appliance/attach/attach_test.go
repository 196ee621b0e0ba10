package attach_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/admin"
	"github.com/taproce/taproce/appliance/attach"
	"github.com/taproce/taproce/appliance/redirect"
	"github.com/taproce/taproce/appliance/redirect/redirecttest"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/tap"
)

// links returns the names of the interfaces in the namespace at path and
// the number of tc filters on their ingress.
func links(t *testing.T, path string) (names []string, filters int) {
	t.Helper()
	err := netnsutil.Do(path, func(h *netlink.Handle) error {
		ls, err := h.LinkList()
		if err != nil {
			return err
		}
		for _, l := range ls {
			names = append(names, l.Attrs().Name)
			fs, err := h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
			if err == nil {
				filters += len(fs)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names, filters
}

func request(pod redirecttest.End) admin.AttachRequest {
	return admin.AttachRequest{ContainerID: "pod1", IfName: pod.Link, Netns: pod.Path, IPs: []netip.Prefix{pod.V4, pod.V6}, Network: "test"}
}

func TestAttachDetach(t *testing.T) {
	pod, _ := redirecttest.Pair(t, 81, "eth0", "veth0")
	m := attach.New(attach.Options{})
	defer m.Close()
	ctx := context.Background()

	att, err := m.Attach(ctx, request(pod))
	if err != nil {
		t.Fatal(err)
	}
	wantGIDs := []netip.Addr{
		linkLocal(pod.MAC),
		netip.AddrFrom16(pod.V4.Addr().As16()),
		pod.V6.Addr(),
	}
	if att.ID != "pod1/eth0" || att.MAC != pod.MAC.String() || att.PortName != "roce0" || att.Mode != admin.ModeRedirect ||
		len(att.GIDs) != 3 || att.GIDs[0] != wantGIDs[0] || att.GIDs[1] != wantGIDs[1] || att.GIDs[2] != wantGIDs[2] {
		t.Fatalf("attachment %+v, want GIDs %v", att, wantGIDs)
	}
	if _, err := m.Check(ctx, admin.CheckRequest{ContainerID: "pod1", IfName: "eth0"}); err != nil {
		t.Fatalf("check: %v", err)
	}
	again, err := m.Attach(ctx, request(pod))
	if err != nil || again.ID != att.ID || again.MAC != att.MAC {
		t.Fatalf("attach again: %+v, %v", again, err)
	}
	other := request(pod)
	other.Netns = "/var/run/netns/elsewhere"
	if _, err := m.Attach(ctx, other); !errors.Is(err, admin.ErrConflict) {
		t.Fatalf("attach in another namespace: %v, want ErrConflict", err)
	}

	// Someone removes a filter: Check says which, Attach repairs it.
	if err := netnsutil.Do(pod.Path, func(h *netlink.Handle) error {
		l, _ := h.LinkByName("eth0")
		return h.FilterDel(&netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index,
			Parent: netlink.HANDLE_MIN_INGRESS, Priority: redirect.PrefIPv4, Protocol: unix.ETH_P_IP}})
	}); err != nil {
		t.Fatal(err)
	}
	_, err = m.Check(ctx, admin.CheckRequest{ContainerID: "pod1", IfName: "eth0"})
	if !errors.Is(err, admin.ErrIncomplete) || !strings.Contains(err.Error(), "pref 4791 (IPv4 UDP/4791 → roce0) on eth0 ingress: missing") {
		t.Fatalf("check without a filter: %v", err)
	}
	if _, err := m.Attach(ctx, request(pod)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Check(ctx, admin.CheckRequest{ContainerID: "pod1", IfName: "eth0"}); err != nil {
		t.Fatalf("check after repair: %v", err)
	}
	if l, _ := m.List(ctx); len(l) != 1 {
		t.Fatalf("list: %+v", l)
	}

	for i := range 2 {
		if err := m.Detach(ctx, admin.DetachRequest{ContainerID: "pod1", IfName: "eth0", Netns: pod.Path}); err != nil {
			t.Fatalf("detach %d: %v", i+1, err)
		}
	}
	names, filters := links(t, pod.Path)
	if filters != 0 || strings.Contains(strings.Join(names, " "), "roce0") {
		t.Fatalf("after detach: interfaces %v, %d filters", names, filters)
	}
	if _, err := m.Check(ctx, admin.CheckRequest{ContainerID: "pod1", IfName: "eth0"}); !errors.Is(err, admin.ErrNotFound) {
		t.Fatalf("check after detach: %v", err)
	}
}

func TestAttachErrors(t *testing.T) {
	pod, _ := redirecttest.Pair(t, 82, "eth0", "veth0")
	m := attach.New(attach.Options{})
	defer m.Close()
	tests := []struct {
		name    string
		mod     func(r *admin.AttachRequest)
		wantErr error
		wantMsg string
	}{
		{"namespace gone", func(r *admin.AttachRequest) { r.Netns = "/var/run/netns/tpt-none" }, admin.ErrNetnsGone, "tpt-none"},
		{"no pod interface", func(r *admin.AttachRequest) { r.IfName = "eth7" }, admin.ErrNetnsGone, "eth7"},
		{"invalid", func(r *admin.AttachRequest) { r.IPs = nil }, admin.ErrInvalid, "ips"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := request(pod)
			tt.mod(&r)
			_, err := m.Attach(context.Background(), r)
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("error %v, want %v naming %q", err, tt.wantErr, tt.wantMsg)
			}
		})
	}
	if l, _ := m.List(context.Background()); len(l) != 0 {
		t.Fatalf("failed attachments listed: %+v", l)
	}
	if names, filters := links(t, pod.Path); filters != 0 || len(names) != 2 {
		t.Fatalf("failed attachments left interfaces %v and %d filters", names, filters)
	}
}

// TestDetachLeftovers: filters an earlier appliance run left (its TAP
// went with it) are removed by a detach that names the namespace.
func TestDetachLeftovers(t *testing.T) {
	pod, _ := redirecttest.Pair(t, 83, "eth0", "veth0")
	dev, err := tap.Create(tap.Config{Name: "roce0", Netns: pod.Path})
	if err != nil {
		t.Fatal(err)
	}
	if err := redirect.Install(redirect.Config{Netns: pod.Path, Pod: "eth0", TAP: "roce0"}); err != nil {
		t.Fatal(err)
	}
	dev.Close()
	m := attach.New(attach.Options{})
	if err := m.Detach(context.Background(), admin.DetachRequest{ContainerID: "old", IfName: "eth0", Netns: pod.Path}); err != nil {
		t.Fatal(err)
	}
	if _, filters := links(t, pod.Path); filters != 0 {
		t.Fatalf("%d filters left", filters)
	}
}

// TestDetachAfterNamespaceDeleted: the pod's namespace is deleted before
// the detach (its path is gone). The detach succeeds, and by closing the
// TAP it lets the kernel destroy the namespace: the veth to the peer
// disappears.
func TestDetachAfterNamespaceDeleted(t *testing.T) {
	pod, peer := redirecttest.Pair(t, 84, "eth0", "veth0")
	m := attach.New(attach.Options{})
	defer m.Close()
	if _, err := m.Attach(context.Background(), request(pod)); err != nil {
		t.Fatal(err)
	}
	if err := netnsutil.Delete(pod.NS); err != nil {
		t.Fatal(err)
	}
	_, err := m.Check(context.Background(), admin.CheckRequest{ContainerID: "pod1", IfName: "eth0"})
	if !errors.Is(err, admin.ErrIncomplete) || !strings.Contains(err.Error(), "network namespace not found") {
		t.Fatalf("check: %v", err)
	}
	if err := m.Detach(context.Background(), admin.DetachRequest{ContainerID: "pod1", IfName: "eth0", Netns: pod.Path}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		names, _ := links(t, peer.Path)
		if !strings.Contains(strings.Join(names, " "), "veth0") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pod's namespace outlived the detach: the peer still has %v", names)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// linkLocal returns the IPv6 link-local address made from mac (modified
// EUI-64, RFC 4291 appendix A).
func linkLocal(mac net.HardwareAddr) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfe, 0x80, 8: mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]})
}

// readState returns the IDs the state file at path lists.
func readState(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Version     int                   `json:"version"`
		Attachments []admin.AttachRequest `json:"attachments"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatalf("state file: %v\n%s", err, data)
	}
	if st.Version != 1 {
		t.Fatalf("state file version %d", st.Version)
	}
	ids := []string{}
	for _, r := range st.Attachments {
		ids = append(ids, r.ID())
	}
	return ids
}

// countingPort is a Port of a test's Open: it counts its closes.
type countingPort struct {
	p      *appliance.Port
	closed *atomic.Int32
}

func (c countingPort) Port() *appliance.Port { return c.p }
func (c countingPort) Device() string        { return "dev-" + c.p.Device().Name() }
func (c countingPort) Close() error {
	c.closed.Add(1)
	return c.p.Close()
}

// TestOpenAndStateFile: ports come from Options.Open, the attachment names
// their device, and the state file follows attach and detach.
func TestOpenAndStateFile(t *testing.T) {
	pod, _ := redirecttest.Pair(t, 85, "eth0", "veth0")
	statePath := filepath.Join(t.TempDir(), "sub", "attachments.json")
	var opened []appliance.PortConfig
	var closed atomic.Int32
	m := attach.New(attach.Options{StateFile: statePath, Open: func(cfg appliance.PortConfig) (attach.Port, error) {
		opened = append(opened, cfg)
		p, err := appliance.OpenPort(cfg)
		if err != nil {
			return nil, err
		}
		return countingPort{p, &closed}, nil
	}})
	defer m.Close()
	ctx := context.Background()
	att, err := m.Attach(ctx, request(pod))
	if err != nil {
		t.Fatal(err)
	}
	if len(opened) != 1 || opened[0].Netns != pod.Path || opened[0].Name != "roce0" || opened[0].Namespace != "pod1/eth0" ||
		opened[0].MAC != roce.MAC(pod.MAC) || len(opened[0].Addrs) != 2 || opened[0].Resolver == nil {
		t.Fatalf("Open got %+v", opened)
	}
	if att.Device != "dev-roce0" {
		t.Errorf("attachment device %q, want dev-roce0", att.Device)
	}
	if got := readState(t, statePath); !slices.Equal(got, []string{"pod1/eth0"}) {
		t.Fatalf("state after attach: %v", got)
	}
	if fi, err := os.Stat(statePath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("state file mode: %v, %v", fi.Mode(), err)
	}
	if err := m.Detach(ctx, admin.DetachRequest{ContainerID: "pod1", IfName: "eth0", Netns: pod.Path}); err != nil {
		t.Fatal(err)
	}
	if closed.Load() != 1 {
		t.Errorf("port closed %d times, want 1", closed.Load())
	}
	if got := readState(t, statePath); len(got) != 0 {
		t.Fatalf("state after detach: %v", got)
	}
	// No temporary files are left next to it.
	if ents, _ := os.ReadDir(filepath.Dir(statePath)); len(ents) != 1 {
		t.Errorf("state directory holds %d files", len(ents))
	}
}

// TestStateFileUnwritable: an attachment that cannot be recorded is
// undone, leaving no TAP or filter.
func TestStateFileUnwritable(t *testing.T) {
	pod, _ := redirecttest.Pair(t, 86, "eth0", "veth0")
	dir := t.TempDir()
	blocker := filepath.Join(dir, "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	m := attach.New(attach.Options{StateFile: filepath.Join(blocker, "attachments.json")})
	defer m.Close()
	_, err := m.Attach(context.Background(), request(pod))
	if err == nil || !strings.Contains(err.Error(), "state file") || !strings.Contains(err.Error(), "undone") {
		t.Fatalf("attach with an unwritable state file: %v", err)
	}
	if l, _ := m.List(context.Background()); len(l) != 0 {
		t.Fatalf("listed: %+v", l)
	}
	if names, filters := links(t, pod.Path); filters != 0 || len(names) != 2 {
		t.Fatalf("undone attachment left interfaces %v and %d filters", names, filters)
	}
}

// TestRecover: a run that died left a state file, its filters and no TAP
// devices. The next run adopts the attachment whose pod is there (a new
// TAP, the filters pointed at it) and cleans the one whose pod is gone.
func TestRecover(t *testing.T) {
	pod, _ := redirecttest.Pair(t, 87, "eth0", "veth0")
	gone, _ := redirecttest.Pair(t, 88, "eth0", "veth0")
	statePath := filepath.Join(t.TempDir(), "attachments.json")
	ctx := context.Background()

	// The earlier run: two attachments, then a crash (nothing closed but
	// the ports and their TAP devices, which go with the process).
	old := attach.New(attach.Options{StateFile: statePath})
	gonePort := []*appliance.Port{}
	for _, p := range []redirecttest.End{pod, gone} {
		r := request(p)
		r.ContainerID = "c-" + p.NS
		if _, err := old.Attach(ctx, r); err != nil {
			t.Fatal(err)
		}
		gonePort = append(gonePort, old.Port(r.ID()))
	}
	for _, p := range gonePort {
		p.Close()
	}
	// The pod interface's two filters stay, redirecting to nothing.
	if _, filters := links(t, pod.Path); filters != 2 {
		t.Fatalf("the crashed run left %d filters on the pod, want 2", filters)
	}
	if err := netnsutil.Delete(gone.NS); err != nil {
		t.Fatal(err)
	}

	m := attach.New(attach.Options{StateFile: statePath})
	defer m.Close()
	rec, err := m.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	podID, goneID := "c-"+pod.NS+"/eth0", "c-"+gone.NS+"/eth0"
	if !slices.Equal(rec.Adopted, []string{podID}) || !slices.Equal(rec.Cleaned, []string{goneID}) || len(rec.Failed) != 0 {
		t.Fatalf("recovery %+v", rec)
	}
	if _, err := m.Check(ctx, admin.CheckRequest{ContainerID: "c-" + pod.NS, IfName: "eth0"}); err != nil {
		t.Fatalf("check of the adopted attachment: %v", err)
	}
	if got := readState(t, statePath); !slices.Equal(got, []string{podID}) {
		t.Fatalf("state after recovery: %v", got)
	}
	// Recovering again changes nothing.
	if rec, err := m.Recover(ctx); err != nil || len(rec.Adopted)+len(rec.Cleaned) != 0 {
		t.Fatalf("second recovery: %+v, %v", rec, err)
	}

	// Close takes the port and its filters down but keeps the record for
	// the next run.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if names, filters := links(t, pod.Path); filters != 0 || slices.Contains(names, "roce0") {
		t.Fatalf("after close: interfaces %v, %d filters", names, filters)
	}
	if got := readState(t, statePath); !slices.Equal(got, []string{podID}) {
		t.Fatalf("state after close: %v", got)
	}
	again := attach.New(attach.Options{StateFile: statePath})
	defer again.Close()
	if rec, err := again.Recover(ctx); err != nil || !slices.Equal(rec.Adopted, []string{podID}) {
		t.Fatalf("recovery after a clean shutdown: %+v, %v", rec, err)
	}
}

// TestRecoverBadState: a state file that is not one is an error, and a
// missing one is no attachment.
func TestRecoverBadState(t *testing.T) {
	dir := t.TempDir()
	m := attach.New(attach.Options{StateFile: filepath.Join(dir, "none.json")})
	if rec, err := m.Recover(context.Background()); err != nil || len(rec.Adopted)+len(rec.Cleaned) != 0 {
		t.Fatalf("missing state file: %+v, %v", rec, err)
	}
	for name, text := range map[string]string{"garbage": "{", "version": `{"version": 7, "attachments": []}`} {
		path := filepath.Join(dir, name+".json")
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		m := attach.New(attach.Options{StateFile: path})
		if _, err := m.Recover(context.Background()); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
