package control

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/taproce/taproce/shmem"
	"github.com/taproce/taproce/verbs/abi"
)

// unixPair returns the two ends of a unixpacket connection, accepted
// and dialled as a client's is.
func unixPair(t *testing.T) (accepted, dialled *net.UnixConn) {
	t.Helper()
	addr := &net.UnixAddr{Name: filepath.Join(t.TempDir(), "pair.sock"), Net: "unixpacket"}
	ln, err := net.ListenUnix("unixpacket", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if dialled, err = net.DialUnix("unixpacket", nil, addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dialled.Close() })
	if accepted, err = ln.AcceptUnix(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { accepted.Close() })
	return accepted, dialled
}

// TestPortEventDoesNotWait: a port's link event, which a spinning
// appliance delivers on its one polling loop, reaches the clients of the
// port's device without waiting for a session busy with its client (a
// teardown holds the session's lock for as long as it takes).
func TestPortEventDoesNotWait(t *testing.T) {
	s := New(Config{Socket: filepath.Join(t.TempDir(), "s.sock")})
	d := &Device{Name: "taproce0"}
	s.AddDevice(d)
	appliance, client := unixPair(t)
	ss := &session{srv: s, conn: appliance}
	ss.opened.Store(d)
	s.mu.Lock()
	s.sessions[ss] = struct{}{}
	s.mu.Unlock()

	ss.mu.Lock() // busy
	done := make(chan struct{})
	go func() {
		s.PortEvent("taproce0", false)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("PortEvent waited for the session's lock")
	}
	ss.mu.Unlock()

	buf := make([]byte, abi.MaxMessage)
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _, err := shmem.RecvMsg(client, buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := abi.DecodeHeader(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	var ev abi.Event
	if err := abi.DecodeBody(body, &ev); err != nil {
		t.Fatal(err)
	}
	if h.Op != abi.OpEvent || ev.Type != abi.EventPortErr {
		t.Errorf("client got %+v %+v, want IBV_EVENT_PORT_ERR", h, ev)
	}
}
