package tap

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/taproce/taproce/internal/testnet"
)

func linkIn(t *testing.T, nsName, dev string) (netlink.Link, error) {
	t.Helper()
	ns, err := netns.GetFromName(nsName)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	return h.LinkByName(dev)
}

// TestCreateInNamespace creates TAPs inside a namespace, with and without
// offloads, and checks MAC, MTU, state, and that closing removes them.
func TestCreateInNamespace(t *testing.T) {
	name, path := testnet.Namespace(t)
	mac := net.HardwareAddr{0x02, 0x11, 0x22, 0x33, 0x44, 0x55}
	for _, offload := range []bool{false, true} {
		dev, err := Create(Config{Name: "roce0", Netns: path, MAC: mac, MTU: 4200, Offload: offload})
		if err != nil {
			t.Fatal(err)
		}
		if offload && !dev.Offloaded() {
			t.Log("kernel refused USO offloads: one frame per syscall")
		}
		if !offload && dev.Offloaded() {
			t.Fatal("offloads without asking")
		}
		link, err := linkIn(t, name, "roce0")
		if err != nil {
			dev.Close()
			t.Fatal(err)
		}
		a := link.Attrs()
		if !bytes.Equal(a.HardwareAddr, mac) || a.MTU != 4200 || a.Flags&net.FlagUp == 0 {
			t.Errorf("link %s: mac %v mtu %d flags %v", a.Name, a.HardwareAddr, a.MTU, a.Flags)
		}
		if _, err := netlink.LinkByName("roce0"); err == nil {
			t.Error("the TAP also appeared in the test's own namespace")
		}
		if err := dev.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := linkIn(t, name, "roce0"); err == nil {
			t.Fatal("TAP still there after Close")
		}
	}
}

// TestReadUnblocksOnClose: a Read blocked on an idle TAP returns ErrClosed
// when the device is closed.
func TestReadUnblocksOnClose(t *testing.T) {
	_, path := testnet.Namespace(t)
	dev, err := Create(Config{Name: "idle0", Netns: path, Down: true})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		bufs := [][]byte{make([]byte, 2048)}
		_, err := dev.Read(bufs, []int{0}, Headroom)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	dev.Close()
	select {
	case err := <-done:
		if err != ErrClosed {
			t.Fatalf("Read returned %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read still blocked after Close")
	}
}

// TestMultiQueue opens a TAP with IFF_MULTI_QUEUE and moves a frame
// through it.
func TestMultiQueue(t *testing.T) {
	_, path := testnet.Namespace(t)
	dev, err := Create(Config{Name: "mq0", Netns: path, MultiQueue: true, Offload: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	frame := make([]byte, Headroom+60)
	copy(frame[Headroom:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x88, 0xB5})
	if n, err := dev.Write([][]byte{frame}, Headroom); n != 1 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
}

func TestCreateErrors(t *testing.T) {
	testnet.RequireRoot(t)
	if _, err := Create(Config{Name: ""}); err == nil {
		t.Error("empty name accepted")
	}
	if _, err := Create(Config{Name: "abcdefghijklmnopq"}); err == nil {
		t.Error("17-byte name accepted")
	}
	if _, err := Create(Config{Name: "x0", Netns: "/var/run/netns/does-not-exist"}); err == nil {
		t.Error("missing namespace accepted")
	}
}
