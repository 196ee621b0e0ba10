package control_test

import (
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/appliancetest"
	"github.com/taproce/taproce/shmem"
	"github.com/taproce/taproce/verbs/abi"
)

// TestEventSocket: a client that opens a device with abi.OpenEventSocket
// gets a second descriptor, the socket its events come on — here the
// device's withdrawal, IBV_EVENT_DEVICE_FATAL — and which ends (EOF) when
// the appliance is gone.
func TestEventSocket(t *testing.T) {
	r := appliancetest.New(t, appliancetest.Options{Namespace: "ev"})
	c, err := net.Dial("unixpacket", r.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	msg, err := abi.Encode(nil, abi.Header{Op: abi.OpOpen, Seq: 1}, &abi.OpenRequest{Name: abi.MakeName("taproce0"), Flags: abi.OpenEventSocket})
	if err != nil {
		t.Fatal(err)
	}
	if err := shmem.SendMsg(uc, msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, abi.MaxMessage)
	n, fds, err := shmem.RecvMsg(uc, buf, 4)
	if err != nil {
		t.Fatal(err)
	}
	_, body, err := abi.DecodeHeader(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	var rep abi.OpenReply
	if err := abi.DecodeBody(body, &rep); err != nil || rep.Errno != 0 || len(fds) != 2 {
		t.Fatalf("open: %v, errno %d, %d descriptors", err, rep.Errno, len(fds))
	}
	defer syscall.Close(fds[0])
	f := os.NewFile(uintptr(fds[1]), "events")
	ec, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	ev := ec.(*net.UnixConn)
	r.App.RemovePort("taproce0")
	_ = ev.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, _, err = shmem.RecvMsg(ev, buf, 1)
	if err != nil {
		t.Fatalf("no event: %v", err)
	}
	h, body, err := abi.DecodeHeader(buf[:n])
	var e abi.Event
	if err != nil || h.Flags&abi.FlagEvent == 0 || abi.DecodeBody(body, &e) != nil || e.Type != abi.EventDeviceFatal {
		t.Fatalf("event %+v %+v: %v", h, e, err)
	}
	r.App.Close()
	if n, _, err := shmem.RecvMsg(ev, buf, 1); n != 0 && err == nil {
		t.Fatalf("a %d-byte message after the appliance closed, want end of file", n)
	}
}
