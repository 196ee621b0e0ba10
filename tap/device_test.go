package tap

import (
	"bytes"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/internal/netnsutil"
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
// offloads, and checks MAC, MTU, queue length, state, and that closing removes them.
func TestCreateInNamespace(t *testing.T) {
	name, path := testnet.Namespace(t)
	mac := net.HardwareAddr{0x02, 0x11, 0x22, 0x33, 0x44, 0x55}
	for _, offload := range []bool{false, true} {
		dev, err := Create(Config{Name: "roce0", Netns: path, MAC: mac, MTU: 4200, TxQueueLen: 4096, Offload: offload})
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
		if !bytes.Equal(a.HardwareAddr, mac) || a.MTU != 4200 || a.TxQLen != 4096 || a.Flags&net.FlagUp == 0 {
			t.Errorf("link %s: mac %v mtu %d qlen %d flags %v", a.Name, a.HardwareAddr, a.MTU, a.TxQLen, a.Flags)
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

// readModes are the ways a read can wait: sleeping in the poller at once,
// busy-polling briefly first, busy-polling forever.
var readModes = []struct {
	name string
	spin time.Duration
}{{"block", 0}, {"adaptive", 50 * time.Microsecond}, {"spin", -1}}

// TestReadUnblocksOnClose: a Read waiting on an idle TAP returns ErrClosed
// when the device is closed, however it waits.
func TestReadUnblocksOnClose(t *testing.T) {
	_, path := testnet.Namespace(t)
	for _, m := range readModes {
		for _, offload := range []bool{false, true} {
			dev, err := Create(Config{Name: "idle0", Netns: path, Down: true, Offload: offload})
			if err != nil {
				t.Fatal(err)
			}
			dev.SetSpin(m.spin)
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
					t.Fatalf("%s, offload %v: Read returned %v, want ErrClosed", m.name, offload, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%s, offload %v: Read still waiting after Close", m.name, offload)
			}
		}
	}
}

// TestReadModes: with each way of waiting, a read returns the frame the
// namespace's kernel sends out of the TAP (the ARP request for a
// neighbour on the TAP's subnet), whether it was there before the read
// or came while the read waited.
func TestReadModes(t *testing.T) {
	_, path := testnet.Namespace(t)
	for _, m := range readModes {
		for _, offload := range []bool{false, true} {
			dev, err := Create(Config{Name: "rd0", Netns: path, Offload: offload})
			if err != nil {
				t.Fatal(err)
			}
			dev.SetSpin(m.spin)
			if err := addIPv4(path, "rd0", net.IPv4(10, 77, 0, 1)); err != nil {
				dev.Close()
				t.Fatal(err)
			}
			got := make(chan []byte, 1)
			go func() {
				buf := make([]byte, Headroom+maxSuper)
				for {
					n, err := dev.Read([][]byte{buf}, []int{0}, Headroom)
					if err != nil {
						close(got)
						return
					}
					if f := buf[Headroom:]; n == 1 && f[12] == 0x08 && f[13] == 0x06 { // IPv6 neighbour discovery may come first
						got <- f[:42]
						return
					}
				}
			}()
			time.Sleep(20 * time.Millisecond) // the read waits (spins or sleeps) first
			if err := sendUDP(path, "10.77.0.2:9"); err != nil {
				dev.Close()
				t.Fatal(err)
			}
			select {
			case f, ok := <-got:
				if !ok || !bytes.Equal(f[38:42], []byte{10, 77, 0, 2}) {
					t.Errorf("%s, offload %v: read %x, want the ARP request for 10.77.0.2", m.name, offload, f)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("%s, offload %v: no frame read", m.name, offload)
			}
			dev.Close()
		}
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

// TestTryReadEach: a read that never waits returns nothing at once from
// an empty device whatever SetSpin says, hands over a frame once one is
// there, and reports ErrClosed after Close.
func TestTryReadEach(t *testing.T) {
	_, path := testnet.Namespace(t)
	for _, offload := range []bool{false, true} {
		dev, err := Create(Config{Name: "try0", Netns: path, Offload: offload})
		if err != nil {
			t.Fatal(err)
		}
		dev.SetSpin(0) // a ReadEach would sleep
		if err := addIPv4(path, "try0", net.IPv4(10, 78, 0, 1)); err != nil {
			dev.Close()
			t.Fatal(err)
		}
		var arp []byte
		keepARP := arpKeeper(&arp)
		// Drain what the kernel sent when the link came up (IPv6
		// neighbour discovery): then the device is empty.
		done := make(chan error, 1)
		go func() {
			for {
				n, err := dev.TryReadEach(keepARP)
				if err != nil || n == 0 {
					done <- err
					return
				}
			}
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("offload %v: TryReadEach on an empty device: %v", offload, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("offload %v: TryReadEach waited", offload)
		}
		if err := sendUDP(path, "10.78.0.2:9"); err != nil {
			dev.Close()
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for arp == nil && time.Now().Before(deadline) {
			if _, err := dev.TryReadEach(keepARP); err != nil {
				t.Fatalf("offload %v: %v", offload, err)
			}
			time.Sleep(100 * time.Microsecond)
		}
		if arp == nil || !bytes.Equal(arp[38:42], []byte{10, 78, 0, 2}) {
			t.Errorf("offload %v: read %x, want the ARP request for 10.78.0.2", offload, arp)
		}
		dev.Close()
		if _, err := dev.TryReadEach(keepARP); !errors.Is(err, ErrClosed) {
			t.Errorf("offload %v: after Close: %v, want ErrClosed", offload, err)
		}
	}
}

// arpKeeper returns a frame handler that keeps a copy of the ARP frame it
// is given in *arp.
func arpKeeper(arp *[]byte) func(f []byte) {
	return func(f []byte) {
		if len(f) >= 42 && f[12] == 0x08 && f[13] == 0x06 {
			*arp = append([]byte(nil), f[:42]...)
		}
	}
}

// addIPv4 gives device name in the namespace at path the address ip/24.
func addIPv4(path, name string, ip net.IP) error {
	return netnsutil.Do(path, func(h *netlink.Handle) error {
		l, err := h.LinkByName(name)
		if err != nil {
			return err
		}
		return h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(24, 32)}})
	})
}

// sendUDP sends one datagram to addr from the namespace at path: the
// kernel first asks for addr's MAC with an ARP request.
func sendUDP(path, addr string) error {
	return netnsutil.Do(path, func(*netlink.Handle) error {
		c, err := net.Dial("udp4", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("x"))
		return err
	})
}

// TestUnpolled: a device opened Unpolled stays out of the runtime's
// poller (no deadlines) with a non-blocking descriptor that ppoll(2)
// finds readable once a frame waits, which TryReadEach then hands over.
func TestUnpolled(t *testing.T) {
	_, path := testnet.Namespace(t)
	for _, offload := range []bool{false, true} {
		dev, err := Create(Config{Name: "unp0", Netns: path, Offload: offload, Unpolled: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := dev.file.SetReadDeadline(time.Now()); !errors.Is(err, os.ErrNoDeadline) {
			t.Errorf("offload %v: SetReadDeadline = %v: the descriptor is in the runtime's poller", offload, err)
		}
		if fl, err := unix.FcntlInt(uintptr(dev.Fd()), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK == 0 {
			t.Errorf("offload %v: flags %#x, %v: want non-blocking", offload, fl, err)
		}
		if err := addIPv4(path, "unp0", net.IPv4(10, 78, 1, 1)); err != nil {
			dev.Close()
			t.Fatal(err)
		}
		var arp []byte
		keepARP := arpKeeper(&arp)
		if err := sendUDP(path, "10.78.1.2:9"); err != nil {
			dev.Close()
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for arp == nil && time.Now().Before(deadline) {
			pfd := []unix.PollFd{{Fd: int32(dev.Fd()), Events: unix.POLLIN}}
			if _, err := unix.Ppoll(pfd, &unix.Timespec{Sec: 5}, nil); err != nil && err != unix.EINTR {
				t.Fatal(err)
			}
			if pfd[0].Revents&unix.POLLIN == 0 {
				continue
			}
			if _, err := dev.TryReadEach(keepARP); err != nil {
				t.Fatalf("offload %v: %v", offload, err)
			}
		}
		if arp == nil || !bytes.Equal(arp[38:42], []byte{10, 78, 1, 2}) {
			t.Errorf("offload %v: read %x, want the ARP request for 10.78.1.2", offload, arp)
		}
		dev.Close()
	}
}
