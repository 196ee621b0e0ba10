package control

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/taproce/taproce/shmem"
	"github.com/taproce/taproce/verbs/abi"
)

// openFds counts this process's open descriptors.
func openFds(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// copies counts this process's descriptors that refer to the files of
// fds: each one the appliance received and kept is one more. Unlike the
// count of all descriptors, it is not disturbed by other tests' closing
// theirs meanwhile.
func copies(t testing.TB, fds []int) int {
	t.Helper()
	ids := map[[2]uint64]bool{}
	for _, fd := range fds {
		var st syscall.Stat_t
		if err := syscall.Fstat(fd, &st); err != nil {
			t.Fatal(err)
		}
		ids[[2]uint64{st.Dev, st.Ino}] = true
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		var st syscall.Stat_t
		if err == nil && syscall.Fstat(fd, &st) == nil && ids[[2]uint64{st.Dev, st.Ino}] {
			n++
		}
	}
	return n
}

// leakCheck returns a function that fails the test if descriptors were
// left open since leakCheck was called: copies of fds, or more descriptors
// than there were (which other tests' closing theirs may hide, but not
// make up).
func leakCheck(t testing.TB, fds []int) func() {
	t.Helper()
	kept, all := copies(t, fds), openFds(t)
	return func() {
		t.Helper()
		if n := copies(t, fds); n != kept {
			t.Errorf("%d descriptors of the attached files open before, %d after", kept, n)
		}
		if n := openFds(t); n > all {
			t.Errorf("%d descriptors open before, %d after", all, n)
		}
	}
}

// attachable returns n descriptors to attach to requests, repeating a
// sealed memfd of 4096 bytes that reg-mr can map and a pipe's two ends,
// the memfd first when memfd is set; they are closed when the test ends.
func attachable(t testing.TB, n int, memfd bool) []int {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	region, err := shmem.NewRegion("attached", 4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close(); region.Close() })
	base := []int{int(r.Fd()), int(w.Fd()), region.Fd()}
	if memfd {
		base = []int{region.Fd(), int(r.Fd()), int(w.Fd())}
	}
	fds := make([]int, n)
	for i := range fds {
		fds[i] = base[i%len(base)]
	}
	return fds
}

// exchange sends msg with fds to a session on c and returns the reply's
// header, or io.EOF when the session hung up instead. Events are skipped;
// descriptors of the reply are closed.
func exchange(t testing.TB, c *net.UnixConn, msg []byte, fds ...int) (abi.Header, error) {
	t.Helper()
	if err := shmem.SendMsg(c, msg, fds...); err != nil {
		return abi.Header{}, io.EOF // the session is gone: a broken pipe
	}
	// A guard against a hang, not a timing: every request gets a reply
	// or a hang-up.
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, abi.MaxMessage)
	for {
		n, rfds, err := shmem.RecvMsg(c, buf, 4)
		closeFds(rfds)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("the session neither answered nor hung up")
		}
		if err != nil {
			return abi.Header{}, io.EOF
		}
		h, _, err := abi.DecodeHeader(buf[:n])
		if err != nil {
			t.Fatalf("reply: %v", err)
		}
		if h.Flags&abi.FlagEvent == 0 {
			return h, nil
		}
	}
}

// TestRequestDescriptorsClosed: whatever descriptors a request brings are
// closed once it is handled unless its op keeps one (reg-mr, its
// region's memfd), on every path: answered, refused with an errno, a
// client cut off for descriptors its op does not take or a malformed
// message, more descriptors than a message may bring. 100 list-devices
// requests with 4 descriptors each took the appliance from 16 to 416
// open descriptors; each such request now ends its session.
func TestRequestDescriptorsClosed(t *testing.T) {
	srv := New(Config{Socket: "/nonexistent", Logger: slog.New(slog.DiscardHandler)})
	regMR := func(length uint64) []byte {
		return seedMsg(abi.OpRegMR, &abi.RegMRRequest{PD: 1, Addr: 0x1000, Length: length, Size: 4096, Access: 1})
	}
	for _, c := range []struct {
		name   string
		opened bool // the session has a device and a PD
		msg    []byte
		fds    int
		memfd  bool // the first descriptor is a memfd reg-mr maps
		times  int
		hangUp bool // the session cuts the client off
	}{
		{name: "list-devices with 4", msg: seedMsg(abi.OpListDevices, nil), fds: 4, times: 100, hangUp: true},
		{name: "list-devices with 2", msg: seedMsg(abi.OpListDevices, nil), fds: 2, times: 10, hangUp: true},
		{name: "query-port before open", msg: seedMsg(abi.OpQueryPort, nil), fds: 3, times: 10, hangUp: true},
		{name: "reg-mr before open", msg: regMR(4096), fds: 1, memfd: true, times: 10},
		{name: "alloc-pd with 4", opened: true, msg: seedMsg(abi.OpAllocPD, nil), fds: 4, times: 10, hangUp: true},
		{name: "reg-mr of a pipe", opened: true, msg: regMR(4096), fds: 1, times: 10},
		{name: "reg-mr refused", opened: true, msg: regMR(0), fds: 1, memfd: true, times: 10},
		{name: "reg-mr kept", opened: true, msg: regMR(4096), fds: 1, memfd: true, times: 10},
		{name: "reg-mr with 3", opened: true, msg: regMR(4096), fds: 3, memfd: true, times: 10, hangUp: true},
		{name: "malformed with 4", msg: []byte{1, 2, 3}, fds: 4, times: 10, hangUp: true},
		{name: "event with 4", msg: seedMsg(abi.OpEvent, &abi.Event{}), fds: 4, times: 10, hangUp: true},
		{name: "more than 4", msg: seedMsg(abi.OpListDevices, nil), fds: 12, times: 10, hangUp: true},
		{name: "shmem.MaxFds", msg: seedMsg(abi.OpListDevices, nil), fds: shmem.MaxFds, times: 10, hangUp: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			fds := attachable(t, c.fds, c.memfd)
			check := leakCheck(t, fds)
			var client *net.UnixConn
			var done chan struct{}
			hangUp := func() {
				client.Close()
				<-done
				client = nil
			}
			for i := range c.times {
				if client == nil {
					client, done = fdSession(t, srv, c.opened)
				}
				h, err := exchange(t, client, c.msg, fds...)
				if c.hangUp != (err != nil) && !t.Failed() {
					t.Errorf("request %d: reply %+v, %v; want a hang-up: %v", i, h, err, c.hangUp)
				}
				if err != nil {
					hangUp()
				}
			}
			if client != nil {
				hangUp()
			}
			check()
		})
	}
}

// fdSession starts a session of srv and returns its client's end and a
// channel closed when the session has ended; an opened session has a
// device (no polling) and a PD, handle 1.
func fdSession(t testing.TB, srv *Server, opened bool) (*net.UnixConn, chan struct{}) {
	t.Helper()
	appliance, client := socketPair(t)
	ss, err := srv.newSessionFor(appliance, 0)
	if err != nil {
		t.Fatal(err)
	}
	if opened {
		dev := fuzzDevice()
		ss.dev = dev
		ss.opened.Store(dev)
	}
	done := make(chan struct{})
	go func() { ss.run(); close(done) }()
	if opened {
		if h, err := exchange(t, client, seedMsg(abi.OpAllocPD, nil)); err != nil || h.Op != abi.OpAllocPD {
			t.Fatalf("alloc-pd: %+v, %v", h, err)
		}
	}
	return client, done
}

// TestRefusedDescriptorsClosed: a connection refused at a limit has its
// first request answered or not, and whatever descriptors it brought are
// closed with it.
func TestRefusedDescriptorsClosed(t *testing.T) {
	srv := serving(t, Config{ApplianceLimits: ApplianceLimits{Connections: 1}})
	held, err := net.Dial("unixpacket", srv.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	waitFor(t, "the first connection a session", func() bool { return srv.Stats().Clients == 1 })
	fds := attachable(t, 12, true)
	check := leakCheck(t, fds)
	for _, n := range []int{0, 4, 12} {
		c, err := net.Dial("unixpacket", srv.Socket())
		if err != nil {
			t.Fatal(err)
		}
		h, err := exchange(t, c.(*net.UnixConn), seedMsg(abi.OpListDevices, nil), fds[:n]...)
		if n == 0 && (err != nil || h.Op != abi.OpListDevices) || n > 0 && err == nil {
			t.Errorf("a refused request with %d descriptors: %+v, %v", n, h, err)
		}
		c.Close()
	}
	waitFor(t, "the refused connections closed", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.waiting) == 0
	})
	check()
	if st := srv.Stats(); st.Refused != 3 {
		t.Errorf("%+v, want 3 refused", st)
	}
}
