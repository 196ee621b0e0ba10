package control

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/verbs/abi"
)

type nullOut struct{}

func (nullOut) Headroom() int   { return 0 }
func (nullOut) Send(_ [][]byte) {}

// fuzzDevice is a device whose engine sends nowhere.
func fuzzDevice() *Device {
	mac := roce.MAC{2, 0, 0, 0, 0, 1}
	gids := []roce.GID{roce.LinkLocalGID(mac), roce.GIDFromAddr(netip.MustParseAddr("10.9.0.1"))}
	return &Device{Name: "taproce0", Engine: transport.NewEngine(transport.Config{MAC: mac, GIDs: gids, MTU: 1500, Out: nullOut{}}),
		MAC: mac, MTU: 1500, GIDs: func() []roce.GID { return gids },
		Resolve: func(context.Context, netip.Addr) (roce.MAC, error) { return roce.MAC{2, 0, 0, 0, 0, 2}, nil }}
}

// socketPair returns the two ends of a SOCK_SEQPACKET pair.
func socketPair(t testing.TB) (*net.UnixConn, *net.UnixConn) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conv := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conv(fds[0]), conv(fds[1])
}

// FuzzControl: arbitrary requests, one after another on one opened
// session, each with as many descriptors attached as the input chooses
// (none to more than a message may bring: a pipe's ends and a memfd
// reg-mr can map), never panic the server, always get a reply or a
// hang-up, and leave no descriptor open once the session has ended:
// whatever a request brings is closed unless its op keeps it, and what
// the session made is torn down and given back to the appliance's limits.
func FuzzControl(f *testing.F) {
	seed := func(op abi.Op, body any) []byte {
		m, _ := abi.Encode(nil, abi.Header{Op: op, Seq: 1}, body)
		return m
	}
	f.Add(seed(abi.OpAllocPD, nil), seed(abi.OpCreateCQ, &abi.CreateCQRequest{Depth: 8}), uint8(0), uint8(0))
	f.Add(seed(abi.OpCreateCQ, &abi.CreateCQRequest{Depth: 4}),
		seed(abi.OpCreateQP, &abi.CreateQPRequest{PD: 1, SendCQ: 1, RecvCQ: 1, Type: 2, Caps: abi.QPCaps{MaxSendWR: 4, MaxRecvWR: 4}}), uint8(0), uint8(0))
	f.Add(seed(abi.OpModifyQP, &abi.ModifyQPRequest{Handle: 3, Mask: 1 | 16 | 32 | 8, Attr: abi.QPAttr{State: 1, Port: 1}}), []byte{}, uint8(0), uint8(0))
	f.Add(seed(abi.OpCreateAH, &abi.CreateAHRequest{PD: 1, SGIDIndex: 1}), seed(abi.OpDestroyCQ, &abi.HandleRequest{Handle: 2}), uint8(0), uint8(0))
	f.Add(seed(abi.OpListDevices, nil), seed(abi.OpAllocPD, nil), uint8(4), uint8(2))
	f.Add(seed(abi.OpRegMR, &abi.RegMRRequest{PD: 1, Addr: 0x1000, Length: 4096, Size: 4096, Access: 1}),
		seed(abi.OpDeregMR, &abi.HandleRequest{Handle: 4}), uint8(1), uint8(0))
	f.Add(seed(abi.OpRegMR, &abi.RegMRRequest{PD: 1, Addr: 0x1000, Length: 4096, Size: 4096, Access: 1}),
		seed(abi.OpRegMR, &abi.RegMRRequest{PD: 1, Length: 1, Size: 4096}), uint8(1), uint8(9))
	f.Add([]byte{1, 2, 3}, seed(abi.OpQueryPort, nil), uint8(4), uint8(1))
	// The RDMA CM's ops, on a server whose devices have no manager.
	f.Add(seed(abi.OpCMCreateID, &abi.CMCreateIDRequest{PortSpace: abi.CMPortSpaceTCP, QPType: 2}),
		seed(abi.OpCMListen, &abi.CMIDRequest{ID: 1}), uint8(0), uint8(0))
	f.Add(seed(abi.OpCMCreateID, &abi.CMCreateIDRequest{PortSpace: abi.CMPortSpaceUDP, QPType: 4}),
		seed(abi.OpCMResolveAddr, &abi.CMAddrRequest{ID: 1, Dst: abi.SockAddr{Family: abi.AFInet, Port: 1}}), uint8(0), uint8(0))
	f.Add(seed(abi.OpCMConnect, &abi.CMConnectRequest{ID: 1, Param: abi.CMConnParam{PrivateDataLen: 255}}),
		seed(abi.OpCMInitQPAttr, &abi.CMIDRequest{ID: 1, Arg: 3}), uint8(0), uint8(0))
	f.Add(seed(abi.OpCMCreateID, &abi.CMCreateIDRequest{PortSpace: abi.CMPortSpaceIB, QPType: 3}),
		seed(abi.OpCMDestroyID, &abi.CMIDRequest{ID: 1}), uint8(0), uint8(1))
	f.Add(seed(abi.OpCMCreateID, &abi.CMCreateIDRequest{PortSpace: abi.CMPortSpaceTCP, QPType: 2}),
		seed(abi.OpCMNotify, &abi.CMIDRequest{ID: 1, Arg: abi.EventCommEst}), uint8(0), uint8(0))
	srv := New(Config{Socket: "/nonexistent", Logger: slog.New(slog.DiscardHandler)})
	fds := attachable(f, 9, true)
	f.Fuzz(func(t *testing.T, a, b []byte, fdsA, fdsB uint8) {
		check := leakCheck(t, fds)
		client, done := fdSession(t, srv, true)
		// The usual start: a CQ and a QP (the PD is there); then the
		// fuzzer's requests.
		msgs := []struct {
			m []byte
			n uint8
		}{{seedMsg(abi.OpCreateCQ, &abi.CreateCQRequest{Depth: 8}), 0},
			{seedMsg(abi.OpCreateQP, &abi.CreateQPRequest{PD: 1, SendCQ: 2, RecvCQ: 2, Type: 2, Caps: abi.QPCaps{MaxSendWR: 4, MaxRecvWR: 4}}), 0},
			{a, fdsA}, {b, fdsB}}
		for _, m := range msgs {
			if len(m.m) == 0 { // a message, not an end of file
				continue
			}
			if _, err := exchange(t, client, m.m, fds[:int(m.n)%(len(fds)+1)]...); err != nil {
				break
			}
		}
		client.Close()
		<-done
		check()
		if held := srv.pools.held(); len(held) != 0 {
			t.Fatalf("the appliance's limits still count %v", held)
		}
	})
}

func seedMsg(op abi.Op, body any) []byte {
	m, _ := abi.Encode(nil, abi.Header{Op: op, Seq: 1}, body)
	return m
}

// TestBadMessageDisconnects: a malformed message ends the session: the
// client sees its connection closed, not a hang.
func TestBadMessageDisconnects(t *testing.T) {
	srv := New(Config{Socket: "/nonexistent"})
	for _, msg := range [][]byte{
		{1, 2, 3},
		append(seedMsg(abi.OpAllocPD, nil), 9),
		seedMsg(abi.OpEvent, &abi.Event{}),
	} {
		c1, c2 := socketPair(t)
		ss, err := srv.newSessionFor(c1, 0)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { ss.run(); close(done) }()
		if _, err := c2.Write(msg); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		if n, err := c2.Read(buf); err == nil && n > 0 {
			t.Fatalf("%x: got a reply instead of a disconnect", msg)
		}
		<-done
		c2.Close()
	}
}
