//go:build linux

package shmem

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func newTestDoorbell(t *testing.T) *Doorbell {
	t.Helper()
	d, err := NewDoorbell()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestDoorbellRingWaitDrain(t *testing.T) {
	checkNoFdLeak(t)
	d := newTestDoorbell(t)
	if rung, err := d.Drain(); err != nil || rung {
		t.Fatalf("Drain on a fresh doorbell = %v, %v", rung, err)
	}
	for range 3 {
		if err := d.Ring(); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The three rings were consumed together.
	if rung, err := d.Drain(); err != nil || rung {
		t.Fatalf("Drain after Wait = %v, %v", rung, err)
	}
	d.Ring()
	if rung, err := d.Drain(); err != nil || !rung {
		t.Fatalf("Drain after Ring = %v, %v", rung, err)
	}
	flags, err := unix.FcntlInt(uintptr(d.Fd()), unix.F_GETFL, 0)
	if err != nil || flags&unix.O_NONBLOCK == 0 {
		t.Fatalf("eventfd flags %#x, %v: want O_NONBLOCK", flags, err)
	}
}

func TestDoorbellWaitWokenByRing(t *testing.T) {
	d := newTestDoorbell(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 50 {
		done := make(chan error, 1)
		go func() { done <- d.Wait(ctx) }()
		time.Sleep(100 * time.Microsecond)
		if err := d.Ring(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func TestDoorbellWaitContext(t *testing.T) {
	d := newTestDoorbell(t)
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 30*time.Millisecond)
		}, context.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(30*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
		{"already cancelled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			err := d.Wait(ctx)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Wait = %v, want %v", err, tc.want)
			}
			if el := time.Since(start); el > 2*time.Second {
				t.Fatalf("Wait returned %v after cancellation", el)
			}
			// The doorbell still works after a cancelled Wait.
			d.Ring()
			if err := d.Wait(context.Background()); err != nil {
				t.Fatalf("Wait after cancellation: %v", err)
			}
		})
	}
}

func TestDoorbellClose(t *testing.T) {
	checkNoFdLeak(t)
	d, err := NewDoorbell()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Wait(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("Wait on a closed doorbell = %v, want os.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after Close")
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := d.Ring(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Ring after Close = %v", err)
	}
}

// TestDoorbellWaitersHoldNoThreads parks many waiters and checks that the
// process did not gain a thread for each.
func TestDoorbellWaitersHoldNoThreads(t *testing.T) {
	const waiters = 64
	threads := func() int {
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Threads:"); ok {
				n, _ := strconv.Atoi(strings.TrimSpace(v))
				return n
			}
		}
		t.Fatal("no Threads line")
		return 0
	}
	before := threads()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range waiters {
		d := newTestDoorbell(t)
		wg.Go(func() { d.Wait(ctx) })
	}
	time.Sleep(50 * time.Millisecond)
	after := threads()
	cancel()
	wg.Wait()
	if after-before >= waiters/2 {
		t.Fatalf("%d blocked waiters grew the process from %d to %d threads", waiters, before, after)
	}
}

func TestDoorbellFromFd(t *testing.T) {
	checkNoFdLeak(t)
	a := newTestDoorbell(t)
	b, err := DoorbellFromFd(dupFd(t, a.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.Ring()
	if err := b.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	b.Ring()
	if err := a.Wait(ctx); err != nil {
		t.Fatal(err)
	}

	// A blocking eventfd from the peer becomes non-blocking.
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	c, err := DoorbellFromFd(efd)
	if err != nil {
		unix.Close(efd)
		t.Fatal(err)
	}
	if fdOpen(efd) && efd != c.Fd() {
		t.Error("DoorbellFromFd left the original descriptor open")
	}
	short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if err := c.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v", err)
	}
	c.Close()

	for _, tc := range []struct {
		name string
		open func() int
	}{
		{"memfd", func() int { fd, _ := unix.MemfdCreate("x", unix.MFD_CLOEXEC); return fd }},
		{"pipe's read end", func() int {
			var p [2]int
			unix.Pipe2(p[:], unix.O_CLOEXEC)
			unix.Close(p[1])
			return p[0]
		}},
		{"socket", func() int {
			p, _ := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			unix.Close(p[1])
			return p[0]
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd := tc.open()
			if _, err := DoorbellFromFd(fd); !errors.Is(err, ErrNotEventfd) {
				t.Errorf("err = %v, want ErrNotEventfd", err)
			}
			if !fdOpen(fd) {
				t.Fatal("descriptor closed on error")
			}
			unix.Close(fd)
		})
	}
	if _, err := DoorbellFromFd(-1); err == nil {
		t.Fatal("DoorbellFromFd(-1) succeeded")
	}
}

// TestDoorbellWaitRung: WaitRung returns once per ring (rings before the
// wait count too), allocates nothing, and returns os.ErrClosed when the
// doorbell is closed under it.
func TestDoorbellWaitRung(t *testing.T) {
	d := newTestDoorbell(t)
	for range 20 {
		done := make(chan error, 1)
		go func() { done <- d.WaitRung() }()
		time.Sleep(100 * time.Microsecond)
		if err := d.Ring(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	checkWaitRungAllocs(t, d, d)
	checkCloseWakesWaitRung(t, d)
}

// checkWaitRungAllocs fails the test when ringer's Ring and d's WaitRung
// allocate.
func checkWaitRungAllocs(t *testing.T, ringer, d *Doorbell) {
	t.Helper()
	allocs := testing.AllocsPerRun(100, func() {
		if err := ringer.Ring(); err != nil {
			t.Fatal(err)
		}
		if err := d.WaitRung(); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Ring + WaitRung: %v allocations", allocs)
	}
}

// checkCloseWakesWaitRung closes d under a goroutine in WaitRung, which
// must return os.ErrClosed.
func checkCloseWakesWaitRung(t *testing.T, d *Doorbell) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- d.WaitRung() }()
	time.Sleep(20 * time.Millisecond)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("WaitRung on a closed doorbell = %v, want os.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitRung did not return after Close")
	}
}

// TestPipeDoorbell: a pipe doorbell is waited on by its maker and rung
// through the write end it hands out (and by its maker too); a Wait
// consumes every ring so far, even more than the pipe holds; waiting
// allocates nothing; Close wakes the waiter and closes both ends.
func TestPipeDoorbell(t *testing.T) {
	checkNoFdLeak(t)
	d, err := NewPipeDoorbell()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	flags, err := unix.FcntlInt(uintptr(d.Fd()), unix.F_GETFL, 0)
	if err != nil || flags&unix.O_ACCMODE != unix.O_WRONLY || flags&unix.O_NONBLOCK == 0 {
		t.Fatalf("Fd's flags %#x, %v: want the write end, non-blocking", flags, err)
	}
	peer, err := DoorbellFromFd(dupFd(t, d.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	if rung, err := d.Drain(); err != nil || rung {
		t.Fatalf("Drain on a fresh doorbell = %v, %v", rung, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, rings := range []int{1, 3, 100_000} { // a pipe holds 64 KiB
		for range rings {
			if err := peer.Ring(); err != nil {
				t.Fatalf("ring: %v", err)
			}
		}
		if err := d.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if rung, err := d.Drain(); err != nil || rung {
			t.Fatalf("Drain after Wait for %d rings = %v, %v", rings, rung, err)
		}
	}
	if err := d.Ring(); err != nil {
		t.Fatal(err)
	}
	if rung, err := d.Drain(); err != nil || !rung {
		t.Fatalf("Drain after the maker's own Ring = %v, %v", rung, err)
	}
	if _, err := peer.Drain(); err == nil {
		t.Error("the write end could be waited on")
	}
	checkWaitRungAllocs(t, peer, d)
	checkCloseWakesWaitRung(t, d)
	if err := d.Ring(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Ring after Close = %v", err)
	}
	// The peer's ring reaches no reader now: an error, not a signal.
	if err := peer.Ring(); err == nil {
		t.Error("the peer rang a closed doorbell without an error")
	}
}

// TestUnpolledPipeDoorbell: an unpolled pipe doorbell stays out of the
// runtime's poller (no deadlines); its read end, non-blocking, is found
// readable by ppoll(2) once rung through the write end it hands out, and
// Drain consumes the rings.
func TestUnpolledPipeDoorbell(t *testing.T) {
	checkNoFdLeak(t)
	d, err := NewUnpolledPipeDoorbell()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.f.SetReadDeadline(time.Now()); !errors.Is(err, os.ErrNoDeadline) {
		t.Errorf("SetReadDeadline = %v: the read end is in the runtime's poller", err)
	}
	for _, fd := range []int{d.ReadFd(), d.Fd()} {
		if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK == 0 {
			t.Errorf("descriptor %d: flags %#x, %v: want non-blocking", fd, fl, err)
		}
	}
	peer, err := DoorbellFromFd(dupFd(t, d.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	readable := func() bool {
		pfd := []unix.PollFd{{Fd: int32(d.ReadFd()), Events: unix.POLLIN}}
		if _, err := unix.Ppoll(pfd, &unix.Timespec{}, nil); err != nil {
			t.Fatal(err)
		}
		return pfd[0].Revents&unix.POLLIN != 0
	}
	if readable() {
		t.Fatal("readable before a ring")
	}
	for range 3 {
		if err := peer.Ring(); err != nil {
			t.Fatal(err)
		}
	}
	if !readable() {
		t.Fatal("not readable after a ring")
	}
	if rung, err := d.Drain(); err != nil || !rung {
		t.Fatalf("Drain = %v, %v", rung, err)
	}
	if readable() {
		t.Error("readable after Drain")
	}
}
