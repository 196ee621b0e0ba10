package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/shmem"
	"github.com/taproce/taproce/verbs/abi"
)

// serving returns a server listening on a socket in a temporary
// directory, with no devices and no polling loop (enough to list
// devices), stopped when the test ends.
func serving(t testing.TB, cfg Config) *Server {
	t.Helper()
	cfg.Socket = filepath.Join(t.TempDir(), "taproce.sock")
	cfg.Logger = slog.New(slog.DiscardHandler)
	srv := New(cfg)
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return srv
}

// heapInUse returns the Go heap and the goroutines' stacks in use after a
// collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// rssKiB returns this process's resident set (VmRSS), for the log.
func rssKiB() int {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}

// waitFor waits until ok holds, failing the test after a while; the
// server answers on its own goroutines.
func waitFor(t testing.TB, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened", what)
		}
	}
}

// TestIdleConnectionMemory: an idle connection costs the appliance a few
// KiB of heap and stack, not a 64 KiB read buffer (a thousand idle connections took
// its resident set from 15 to 81 MB), and all of it comes back when the
// connections close.
func TestIdleConnectionMemory(t *testing.T) {
	const n = 1000
	srv := serving(t, Config{})
	base, rss0, fds0 := heapInUse(), rssKiB(), openFds(t)
	conns := make([]net.Conn, 0, n)
	for range n {
		c, err := net.Dial("unixpacket", srv.Socket())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	waitFor(t, "every connection a session", func() bool { return srv.Stats().Clients == n })
	held, rss1 := heapInUse(), rssKiB()
	for _, c := range conns {
		c.Close()
	}
	waitFor(t, "every session ended", func() bool { return srv.Stats().Clients == 0 })
	after, rss2 := heapInUse(), rssKiB()
	t.Logf("%d idle connections: heap and stacks %d → %d → %d KiB (%d B each), RSS %d → %d → %d KiB, descriptors %d → %d",
		n, base>>10, held>>10, after>>10, int64(held-base)/n, rss0, rss1, rss2, fds0, openFds(t))
	if per := int64(held) - int64(base); per > n*16<<10 {
		t.Errorf("an idle connection holds %d bytes of heap and stack, more than 16 KiB", per/n)
	}
	if after > base+4<<20 {
		t.Errorf("heap after the connections closed: %d KiB, before %d KiB", after>>10, base>>10)
	}
	if st := srv.Stats(); st.Descriptors != 0 {
		t.Errorf("descriptors still counted: %+v", st)
	}
}

// TestUnreadReplies: clients that send requests and never read the
// replies are disconnected once a reply has waited the reply timeout,
// while they still hold their connections; the appliance's heap,
// goroutines and descriptors come back to what they were.
func TestUnreadReplies(t *testing.T) {
	const n = 200
	srv := serving(t, Config{ReplyTimeout: 100 * time.Millisecond})
	msg, err := abi.Encode(nil, abi.Header{Op: abi.OpListDevices, Seq: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	base, gor0, rss0, fds0 := heapInUse(), runtime.NumGoroutine(), rssKiB(), openFds(t)
	conns := make([]*net.UnixConn, n)
	ended := make(chan struct{}, n)
	for i := range conns {
		c, err := net.Dial("unixpacket", srv.Socket())
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c.(*net.UnixConn)
		go func() {
			defer func() { ended <- struct{}{} }()
			// Requests until the appliance hangs up; not one reply read.
			for shmem.SendMsg(conns[i], msg) == nil {
			}
		}()
	}
	for range n {
		select {
		case <-ended:
		case <-time.After(60 * time.Second): // a guard against a hang, not a timing
			t.Fatalf("clients that read no replies are still connected: %+v", srv.Stats())
		}
	}
	rss1 := rssKiB()
	for _, c := range conns {
		c.Close()
	}
	waitFor(t, "every session ended", func() bool { return srv.Stats().Clients == 0 })
	after := heapInUse()
	waitFor(t, "the goroutines gone", func() bool { return runtime.NumGoroutine() <= gor0+2 })
	t.Logf("%d clients leaving replies unread: heap and stacks %d → %d KiB, RSS %d → %d (hung up) → %d KiB (closed), descriptors %d → %d",
		n, base>>10, after>>10, rss0, rss1, rssKiB(), fds0, openFds(t))
	if after > base+4<<20 {
		t.Errorf("heap after the clients went: %d KiB, before %d KiB", after>>10, base>>10)
	}
	if fds := openFds(t); fds > fds0 {
		t.Errorf("descriptors: %d before, %d after", fds0, fds)
	}
}

// TestUnreadEvents: events pile up for a client that never reads them
// only as far as maxPendingEvents; past it the client is disconnected,
// where each event held a goroutine for as long as the client lived.
func TestUnreadEvents(t *testing.T) {
	s := New(Config{Socket: "/nonexistent", Logger: slog.New(slog.DiscardHandler), ReplyTimeout: time.Hour})
	d := &Device{Name: "taproce0"}
	s.AddDevice(d)
	appliance, client := unixPair(t)
	ss := &session{srv: s, conn: appliance, log: s.log}
	ss.opened.Store(d)
	s.mu.Lock()
	s.sessions[ss] = struct{}{}
	s.mu.Unlock()
	gor := runtime.NumGoroutine()
	for range 5000 {
		s.PortEvent("taproce0", false)
	}
	if n := runtime.NumGoroutine(); n > gor+maxPendingEvents+16 {
		t.Errorf("%d goroutines for a client's unread events, at most %d", n-gor, maxPendingEvents)
	}
	// The client is cut off: after the events that fitted, end of file.
	_ = client.SetReadDeadline(time.Now().Add(20 * time.Second)) // a guard against a hang
	buf := make([]byte, abi.MaxMessage)
	for {
		_, _, err := shmem.RecvMsg(client, buf, 0)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("after the events: %v, want end of file", err)
		}
	}
}

// TestEbbed: the memory of sessions goes back to the system when a flood
// of them has fallen to a quarter of its peak, and again when the last
// goes; the comings and goings of a few sessions never release it.
func TestEbbed(t *testing.T) {
	for _, c := range []struct {
		name  string
		steps []int // session counts in turn
		want  []int // the counts at which memory is released
	}{
		{"a few", []int{10, 0, 10, 0}, nil},
		{"a flood", []int{200, 0}, []int{50, 0}},
		{"at the threshold", []int{releaseAfter, 0}, []int{releaseAfter / 4, 0}},
		{"below it", []int{releaseAfter - 1, 0}, nil},
		{"a flood that returns", []int{100, 20, 100, 0}, []int{25, 25, 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := New(Config{Socket: "/nonexistent"})
			var got []int
			for _, target := range c.steps {
				for len(s.sessions) < target {
					s.sessions[&session{}] = struct{}{}
					s.peak = max(s.peak, len(s.sessions))
				}
				for len(s.sessions) > target {
					for ss := range s.sessions {
						delete(s.sessions, ss)
						break
					}
					if s.ebbed() {
						got = append(got, len(s.sessions))
					}
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("released at %v, want %v", got, c.want)
			}
		})
	}
}
