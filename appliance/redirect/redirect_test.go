package redirect_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/appliance/redirect"
	"github.com/taproce/taproce/appliance/redirect/redirecttest"
	"github.com/taproce/taproce/internal/netnsutil"
	"github.com/taproce/taproce/tap"
)

// podWithTAP builds a pod namespace (interface eth0) joined by a veth to
// a peer namespace (interface veth0), and a TAP roce0 in the pod whose
// frames go to the returned channel.
func podWithTAP(t *testing.T, subnet byte) (pod, peer redirecttest.End, dev *tap.Tap, frames chan []byte) {
	t.Helper()
	pod, peer = redirecttest.Pair(t, subnet, "eth0", "veth0")
	dev, err := tap.Create(tap.Config{Name: "roce0", Netns: pod.Path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	frames = make(chan []byte, 64)
	go func() {
		bufs, sizes := [][]byte{make([]byte, tap.Headroom+2048)}, []int{0}
		for {
			n, err := dev.Read(bufs, sizes, tap.Headroom)
			if err != nil {
				close(frames)
				return
			}
			for i := range n {
				frames <- append([]byte(nil), bufs[i][tap.Headroom:tap.Headroom+sizes[i]]...)
			}
		}
	}()
	return pod, peer, dev, frames
}

func cfgOf(pod redirecttest.End) redirect.Config {
	return redirect.Config{Netns: pod.Path, Pod: pod.Link, TAP: "roce0"}
}

// filterCount returns the number of u32 filters on dev's ingress in the
// namespace at path.
func filterCount(t *testing.T, path, dev string) int {
	t.Helper()
	var n int
	err := netnsutil.Do(path, func(h *netlink.Handle) error {
		l, err := h.LinkByName(dev)
		if err != nil {
			return err
		}
		fs, err := h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
		n = len(fs)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func qdiscs(t *testing.T, path, dev string) []string {
	t.Helper()
	var kinds []string
	err := netnsutil.Do(path, func(h *netlink.Handle) error {
		l, err := h.LinkByName(dev)
		if err != nil {
			return err
		}
		qs, err := h.QdiscList(l)
		for _, q := range qs {
			kinds = append(kinds, q.Type())
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return kinds
}

func hasKind(kinds []string, k string) bool {
	for _, x := range kinds {
		if x == k {
			return true
		}
	}
	return false
}

func TestInstallVerifyRemove(t *testing.T) {
	pod, _, _, _ := podWithTAP(t, 61)
	cfg := cfgOf(pod)
	if err := redirect.Verify(cfg); !errors.Is(err, redirect.ErrMissing) {
		t.Fatalf("Verify before Install: %v, want ErrMissing", err)
	}
	for i := range 2 {
		if err := redirect.Install(cfg); err != nil {
			t.Fatalf("Install %d: %v", i+1, err)
		}
	}
	if err := redirect.Verify(cfg); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if n := filterCount(t, pod.Path, "eth0"); n != 2 {
		t.Errorf("%d filters on eth0 ingress after two Installs, want 2", n)
	}
	if n := filterCount(t, pod.Path, "roce0"); n != 1 {
		t.Errorf("%d filters on roce0 ingress, want 1", n)
	}

	// A filter taken away is named by Verify and put back by Install.
	netnsutil.Do(pod.Path, func(h *netlink.Handle) error {
		l, _ := h.LinkByName("eth0")
		return h.FilterDel(&netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index,
			Parent: netlink.HANDLE_MIN_INGRESS, Priority: redirect.PrefIPv6, Protocol: unix.ETH_P_IPV6}})
	})
	err := redirect.Verify(cfg)
	if !errors.Is(err, redirect.ErrMissing) || !strings.Contains(err.Error(), "pref 4792 (IPv6 UDP/4791 → roce0) on eth0 ingress: missing") {
		t.Fatalf("Verify without the IPv6 filter: %v", err)
	}
	if err := redirect.Install(cfg); err != nil {
		t.Fatal(err)
	}
	if err := redirect.Verify(cfg); err != nil {
		t.Fatalf("Verify after repair: %v", err)
	}

	// A TAP created anew (another ifindex, as after an appliance
	// restart): the filters point at the old one until Install.
	var dev2 *tap.Tap
	netnsutil.Do(pod.Path, func(h *netlink.Handle) error {
		l, _ := h.LinkByName("roce0")
		return h.LinkDel(l)
	})
	dev2, err = tap.Create(tap.Config{Name: "roce0", Netns: pod.Path})
	if err != nil {
		t.Fatal(err)
	}
	defer dev2.Close()
	err = redirect.Verify(cfg)
	if !errors.Is(err, redirect.ErrMissing) || !strings.Contains(err.Error(), "redirects to ifindex") {
		t.Fatalf("Verify with a new TAP: %v", err)
	}
	if err := redirect.Install(cfg); err != nil {
		t.Fatal(err)
	}
	if err := redirect.Verify(cfg); err != nil {
		t.Fatalf("Verify after reinstall: %v", err)
	}

	for i := range 2 {
		if err := redirect.Remove(cfg); err != nil {
			t.Fatalf("Remove %d: %v", i+1, err)
		}
	}
	if n := filterCount(t, pod.Path, "eth0"); n != 0 {
		t.Errorf("%d filters left on eth0", n)
	}
	for _, dev := range []string{"eth0", "roce0"} {
		if k := qdiscs(t, pod.Path, dev); hasKind(k, "clsact") {
			t.Errorf("clsact left on %s: %v", dev, k)
		}
	}
	err = redirect.Verify(cfg)
	if !errors.Is(err, redirect.ErrMissing) || !strings.Contains(err.Error(), "no clsact qdisc on eth0") {
		t.Fatalf("Verify after Remove: %v", err)
	}
}

func TestForeignFiltersKept(t *testing.T) {
	pod, _, _, _ := podWithTAP(t, 62)
	cfg := cfgOf(pod)
	if err := redirect.Install(cfg); err != nil {
		t.Fatal(err)
	}
	// Another component's filter on the same clsact survives Remove, and
	// so does the qdisc it needs.
	err := netnsutil.Do(pod.Path, func(h *netlink.Handle) error {
		l, _ := h.LinkByName("eth0")
		return h.FilterAdd(&netlink.U32{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_MIN_EGRESS, Priority: 7, Protocol: unix.ETH_P_ALL},
			ClassId:     netlink.MakeHandle(1, 1),
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := redirect.Remove(cfg); err != nil {
		t.Fatal(err)
	}
	if k := qdiscs(t, pod.Path, "eth0"); !hasKind(k, "clsact") {
		t.Errorf("clsact removed from under another filter: %v", k)
	}
	if n := filterCount(t, pod.Path, "eth0"); n != 0 {
		t.Errorf("%d filters left on eth0 ingress", n)
	}
}

func TestErrors(t *testing.T) {
	pod, _, _, _ := podWithTAP(t, 63)
	tests := []struct {
		name    string
		cfg     redirect.Config
		op      func(redirect.Config) error
		wantErr error // nil: success
	}{
		{"install without TAP", redirect.Config{Netns: pod.Path, Pod: "eth0", TAP: "nope0"}, redirect.Install, redirect.ErrNoLink},
		{"install without pod interface", redirect.Config{Netns: pod.Path, Pod: "eth9", TAP: "roce0"}, redirect.Install, redirect.ErrNoLink},
		{"install in a missing namespace", redirect.Config{Netns: "/var/run/netns/tpt-none", Pod: "eth0", TAP: "roce0"}, redirect.Install, redirect.ErrNoNetns},
		{"install in a file that is no namespace", redirect.Config{Netns: "/proc/self/status", Pod: "eth0", TAP: "roce0"}, redirect.Install, redirect.ErrNoNetns},
		{"verify in a missing namespace", redirect.Config{Netns: "/var/run/netns/tpt-none", Pod: "eth0", TAP: "roce0"}, redirect.Verify, redirect.ErrNoNetns},
		{"remove in a missing namespace", redirect.Config{Netns: "/var/run/netns/tpt-none", Pod: "eth0", TAP: "roce0"}, redirect.Remove, nil},
		{"remove without devices", redirect.Config{Netns: pod.Path, Pod: "eth9", TAP: "nope0"}, redirect.Remove, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.op(tt.cfg)
			if tt.wantErr == nil && err != nil || tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
		})
	}
}

// TestTraffic shows the redirect at work: UDP/4791 from the peer arrives
// on the TAP (IPv4 and IPv6), frames written into the TAP leave through
// the pod's veth to the peer, and the rest of the pod's traffic (ICMP,
// TCP, UDP to other ports, ARP and ND) still reaches the pod's kernel.
func TestTraffic(t *testing.T) {
	pod, peer, dev, frames := podWithTAP(t, 64)
	if err := redirect.Install(cfgOf(pod)); err != nil {
		t.Fatal(err)
	}
	// The pod's own UDP/4791 socket must not see RoCE: it goes to the TAP.
	podRoCE := redirecttest.ListenUDP(t, pod.Path, redirect.RoCEv2Port)
	podOther := redirecttest.ListenUDP(t, pod.Path, 4790)
	peerRoCE := redirecttest.ListenUDP(t, peer.Path, redirect.RoCEv2Port)
	redirecttest.TCPEcho(t, pod.Path, 18515)

	for _, fam := range []struct {
		name      string
		pod, peer netip.Addr
	}{
		{"IPv4", pod.V4.Addr(), peer.V4.Addr()},
		{"IPv6", pod.V6.Addr(), peer.V6.Addr()},
	} {
		t.Run(fam.name+" UDP/4791 to the TAP", func(t *testing.T) {
			payload := []byte("roce over " + fam.name)
			redirecttest.SendUDP(t, peer.Path, fam.pod, redirect.RoCEv2Port, payload)
			deadline := time.After(3 * time.Second)
			for {
				select {
				case f := <-frames:
					if bytes.HasSuffix(f, payload) && bytes.Equal(f[0:6], pod.MAC) {
						return
					}
					continue // the kernel's own frames (none expected), or others
				case <-deadline:
					t.Fatal("the datagram did not arrive on the TAP")
				}
			}
		})
		t.Run(fam.name+" TAP to the peer", func(t *testing.T) {
			payload := []byte("written into the TAP, " + fam.name)
			f := redirecttest.UDPFrame(peer.MAC, pod.MAC,
				netip.AddrPortFrom(fam.pod, 0xC001), netip.AddrPortFrom(fam.peer, redirect.RoCEv2Port), payload)
			buf := append(make([]byte, tap.Headroom), f...)
			if _, err := dev.Write([][]byte{buf}, tap.Headroom); err != nil {
				t.Fatal(err)
			}
			got, from, err := redirecttest.ReadUDP(peerRoCE, 3*time.Second)
			if err != nil || !bytes.Equal(got, payload) || from.Addr().Unmap() != fam.pod || from.Port() != 0xC001 {
				t.Fatalf("peer got %q from %v, %v", got, from, err)
			}
		})
		t.Run(fam.name+" ICMP echo to the pod's kernel", func(t *testing.T) {
			if err := redirecttest.Ping(peer.Path, fam.pod, 3*time.Second); err != nil {
				t.Fatal(err)
			}
		})
		t.Run(fam.name+" TCP to the pod's kernel", func(t *testing.T) {
			got, err := redirecttest.TCPRoundTrip(peer.Path, fam.pod, 18515, "hello "+fam.name)
			if err != nil || got != "hello "+fam.name {
				t.Fatalf("echo %q, %v", got, err)
			}
		})
		t.Run(fam.name+" UDP to another port reaches the pod's kernel", func(t *testing.T) {
			redirecttest.SendUDP(t, peer.Path, fam.pod, 4790, []byte("not roce"))
			if got, _, err := redirecttest.ReadUDP(podOther, 3*time.Second); err != nil || string(got) != "not roce" {
				t.Fatalf("pod socket got %q, %v", got, err)
			}
		})
	}
	if got, _, err := redirecttest.ReadUDP(podRoCE, 100*time.Millisecond); err == nil {
		t.Errorf("the pod's kernel received UDP/4791 %q, which belongs to the TAP", got)
	}
	// Nothing but RoCE came through the TAP: the kernel's ARP, ND, echo
	// and TCP stayed with it.
	for {
		select {
		case f := <-frames:
			if et := binary.BigEndian.Uint16(f[12:14]); et == unix.ETH_P_ARP || !isUDP4791(f) {
				t.Errorf("a frame that is not UDP/4791 reached the TAP: % x", f[:min(len(f), 64)])
			}
			continue
		default:
		}
		break
	}
}

func isUDP4791(f []byte) bool {
	switch binary.BigEndian.Uint16(f[12:14]) {
	case unix.ETH_P_IP:
		return f[14+9] == unix.IPPROTO_UDP && binary.BigEndian.Uint16(f[14+20+2:]) == 4791
	case unix.ETH_P_IPV6:
		return f[14+6] == unix.IPPROTO_UDP && binary.BigEndian.Uint16(f[14+40+2:]) == 4791
	}
	return false
}
