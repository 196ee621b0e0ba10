//go:build linux

package shmem

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// wakePeerEnv makes the test binary the echo side of BenchmarkDoorbellWake.
const wakePeerEnv = "SHMEM_WAKE_PEER"

// wakePeerBlocking makes the peer block its thread in read(2).
const wakePeerBlocking = "SHMEM_WAKE_PEER_BLOCKING"

// BenchmarkDoorbellWake measures what one wakeup between two processes
// costs, the hop a client's post and the appliance's completion each take
// when the other side sleeps: a ping-pong of rings with a child process
// (this test binary again), both sides sleeping between rings. The
// sub-benchmarks wait two ways — doorbell: Doorbell.Wait, in the Go
// runtime's poller, as clients and the appliance wait; blocking: the
// thread itself in read(2) on a bare eventfd, the least a wakeup costs —
// and place the processes on one CPU, on two CPUs, or wherever the
// scheduler puts them. Metrics: half-rtt-µs, the median half round trip, and its 90th
// percentile. On a virtual machine whose idle vCPUs halt, a wakeup on the
// other CPU costs an interrupt to a halted vCPU and shows many times the
// same-CPU figure.
func BenchmarkDoorbellWake(b *testing.B) {
	if os.Getenv(wakePeerEnv) != "" {
		b.Skip("running as the peer")
	}
	places := []struct {
		name        string
		self, child int // CPU of each side; -1 leaves it to the scheduler
	}{
		{"same-cpu", 0, 0},
		{"other-cpu", 0, 1},
		{"free", -1, -1},
	}
	for _, blocking := range []bool{false, true} {
		style := "doorbell"
		if blocking {
			style = "blocking"
		}
		for _, c := range places {
			b.Run(style+"/"+c.name, func(b *testing.B) {
				if max(c.self, c.child) >= runtime.NumCPU() {
					b.Skipf("needs %d CPUs", max(c.self, c.child)+1)
				}
				benchWake(b, blocking, c.self, c.child)
			})
		}
	}
}

// A waker is one side's pair of descriptors: it rings one and waits on
// the other.
type waker interface {
	ring() error
	wait() error
	fds() (ring, wait int)
	close()
}

// bellWaker waits in Doorbell.Wait.
type bellWaker struct {
	ctx     context.Context
	out, in *Doorbell
}

func (w *bellWaker) ring() error           { return w.out.Ring() }
func (w *bellWaker) wait() error           { return w.in.Wait(w.ctx) }
func (w *bellWaker) fds() (ring, wait int) { return w.out.Fd(), w.in.Fd() }
func (w *bellWaker) close()                { w.out.Close(); w.in.Close() }

// blockWaker blocks its thread in read(2) on bare eventfds, which the
// runtime's poller never sees: the least a wakeup between two processes
// costs.
type blockWaker struct{ out, in int }

func (w *blockWaker) ring() error {
	_, err := unix.Write(w.out, eventfdOne)
	return err
}

func (w *blockWaker) wait() error {
	var buf [8]byte
	for {
		_, err := unix.Read(w.in, buf[:])
		if err != unix.EINTR {
			return err
		}
	}
}

func (w *blockWaker) fds() (ring, wait int) { return w.out, w.in }
func (w *blockWaker) close()                { unix.Close(w.out); unix.Close(w.in) }

func newWaker(ctx context.Context, blocking bool) (waker, error) {
	if blocking {
		out, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
		if err != nil {
			return nil, err
		}
		in, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
		if err != nil {
			unix.Close(out)
			return nil, err
		}
		return &blockWaker{out: out, in: in}, nil
	}
	out, err := NewDoorbell()
	if err != nil {
		return nil, err
	}
	in, err := NewDoorbell()
	if err != nil {
		out.Close()
		return nil, err
	}
	return &bellWaker{ctx: ctx, out: out, in: in}, nil
}

func benchWake(b *testing.B, blocking bool, selfCPU, childCPU int) {
	w, err := newWaker(context.Background(), blocking)
	if err != nil {
		b.Fatal(err)
	}
	defer w.close()

	if selfCPU >= 0 {
		restore, err := pinProcess(selfCPU)
		if err != nil {
			b.Skipf("cannot pin to CPU %d: %v", selfCPU, err)
		}
		defer restore()
	}
	var stderr bytes.Buffer
	cmd := exec.Command(os.Args[0], "-test.run=^TestDoorbellWakePeer$", "-test.count=1")
	cmd.Env = append(os.Environ(), wakePeerEnv+"=1")
	if blocking {
		cmd.Env = append(cmd.Env, wakePeerBlocking+"=1")
	}
	ringFd, waitFd := w.fds()
	cmd.ExtraFiles = []*os.File{fdFile(ringFd, "ping"), fdFile(waitFd, "pong")} // fds 3 and 4
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := startOn(cmd, childCPU); err != nil {
		b.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill() // the peer has no end of its own
		cmd.Wait()         //nolint:errcheck // killed
	}()
	// A peer that hangs or dies ends the run: a watchdog that sees no
	// round finish for ten seconds kills it and wakes this side's wait (a
	// thread in read(2) has no deadline).
	var expired atomic.Bool
	var rounds atomic.Int64
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		last := int64(-1)
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if n := rounds.Load(); n != last {
				last = n
				continue
			}
			expired.Store(true)
			cmd.Process.Kill()
			unix.Write(waitFd, eventfdOne) //nolint:errcheck // best effort
			return
		}
	}()

	round := func(i int) time.Duration {
		t0 := time.Now()
		if err := w.ring(); err != nil {
			b.Fatal(err)
		}
		if err := w.wait(); err != nil || expired.Load() {
			b.Fatalf("round %d: no answer (%v); peer: %s", i, err, stderr.String())
		}
		rounds.Add(1)
		return time.Since(t0)
	}
	for i := range 200 { // the first rounds start the peer's threads
		round(i)
	}
	rtts := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := range rtts {
		rtts[i] = round(i)
	}
	b.StopTimer()
	slices.Sort(rtts)
	b.ReportMetric(float64(rtts[len(rtts)/2].Nanoseconds())/2e3, "half-rtt-µs")
	b.ReportMetric(float64(rtts[len(rtts)*9/10].Nanoseconds())/2e3, "p90-µs")
}

// TestDoorbellWakePeer is the child side of BenchmarkDoorbellWake: it
// answers every ring of fd 3 with a ring of fd 4, waiting as its parent
// does, until it is killed.
func TestDoorbellWakePeer(t *testing.T) {
	if os.Getenv(wakePeerEnv) == "" {
		t.Skip("only run as the peer of BenchmarkDoorbellWake")
	}
	var w waker
	if os.Getenv(wakePeerBlocking) != "" {
		w = &blockWaker{out: 4, in: 3}
	} else {
		ping, err := DoorbellFromFd(3)
		if err != nil {
			t.Fatal(err)
		}
		pong, err := DoorbellFromFd(4)
		if err != nil {
			t.Fatal(err)
		}
		w = &bellWaker{ctx: context.Background(), out: pong, in: ping}
	}
	defer w.close()
	for {
		if err := w.wait(); err != nil {
			t.Fatal(err)
		}
		if err := w.ring(); err != nil {
			t.Fatal(err)
		}
	}
}

// fdFile wraps a duplicate of fd for handing to a child, so that the
// doorbell keeps its own descriptor.
func fdFile(fd int, name string) *os.File {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		panic(fmt.Sprintf("dup %s: %v", name, err))
	}
	return os.NewFile(uintptr(dup), name)
}

// pinProcess puts every thread of this process on cpu (threads started
// later inherit it from their creator) and returns what restores the
// previous placement.
func pinProcess(cpu int) (restore func(), err error) {
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return nil, err
	}
	var set unix.CPUSet
	set.Set(cpu)
	if err := setAllThreads(&set); err != nil {
		setAllThreads(&old) //nolint:errcheck // best effort back to where it was
		return nil, err
	}
	return func() { setAllThreads(&old) }, nil //nolint:errcheck // best effort
}

func setAllThreads(set *unix.CPUSet) error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, set); err != nil && err != unix.ESRCH {
			return fmt.Errorf("thread %d: %w", tid, err)
		}
	}
	return nil
}

// startOn starts cmd with all its threads on cpu (-1: wherever this
// process may run): the child inherits the affinity of the thread that
// forks it, so a locked thread pinned for the purpose starts it and then
// exits with its goroutine.
func startOn(cmd *exec.Cmd, cpu int) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if cpu >= 0 {
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				done <- fmt.Errorf("pin the forking thread to CPU %d: %w", cpu, err)
				return
			}
		}
		done <- cmd.Start()
	}()
	err := <-done
	for _, f := range cmd.ExtraFiles {
		f.Close()
	}
	return err
}
