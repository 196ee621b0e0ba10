package appliance

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/poll"
	"github.com/taproce/taproce/tap"
)

// TestSendAsyncOrder: batches sent with SendAsync, small ones written
// inline and large ones queued, leave in the order they were given, and
// every done function runs exactly once after its frames are written.
func TestSendAsyncOrder(t *testing.T) {
	p, w := newTestPort(t, PortConfig{})
	const batches = 200
	var dones [batches]atomic.Int32
	seq := uint32(0)
	for i := range batches {
		// Alternate small batches (inline when the queue is idle) with
		// batches larger than txInlineBytes (always queued).
		n := 1
		if i%3 == 0 {
			n = txInlineBytes/1400 + 2
		}
		p.SendAsync(numberedBatch(t, n, &seq), tap.Headroom, func() { dones[i].Add(1) })
	}
	expectNumbered(t, w, seq)
	deadline := time.Now().Add(5 * time.Second)
	for i := range dones {
		for dones[i].Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if n := dones[i].Load(); n != 1 {
			t.Fatalf("batch %d: done ran %d times", i, n)
		}
	}
	if p.txq.busy.Load() != 0 {
		t.Fatalf("queue still busy: %d", p.txq.busy.Load())
	}
}

// TestSendAsyncClosed: a closed port drops what it is given and still
// calls done, so an engine waiting for its batches never hangs.
func TestSendAsyncClosed(t *testing.T) {
	p, _ := newTestPort(t, PortConfig{})
	p.Close()
	big := make([][]byte, txInlineBytes/1000+1)
	for i := range big {
		big[i] = make([]byte, tap.Headroom+1000)
	}
	for _, bufs := range [][][]byte{big[:1], big} {
		called := make(chan struct{})
		p.SendAsync(bufs, tap.Headroom, func() { close(called) })
		select {
		case <-called:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d frames: done not called on a closed port", len(bufs))
		}
	}
}

// TestSendAsyncZeroAllocs: handing a batch to the writer and getting it
// back allocates nothing.
func TestSendAsyncZeroAllocs(t *testing.T) {
	dev := newSink()
	p, err := NewPort(dev, PortConfig{Namespace: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	frame := roceTo(t, peerMAC, 1)
	bufs := make([][]byte, txInlineBytes/len(frame)+1)
	for i := range bufs {
		bufs[i] = append(make([]byte, tap.Headroom), frame...)
	}
	back := make(chan struct{}, 1)
	done := func() { back <- struct{}{} }
	for _, c := range []struct {
		name string
		bufs [][]byte
	}{{"inline", bufs[:1]}, {"queued", bufs}} {
		a := testing.AllocsPerRun(200, func() {
			p.SendAsync(c.bufs, tap.Headroom, done)
			<-back
		})
		if a != 0 {
			t.Errorf("%s: %v allocations", c.name, a)
		}
	}
}

// TestSendAsyncBlockingLoopInline: a port of a blocking loop writes every
// batch, however large, before SendAsync returns — on the loop's thread,
// where the frames are in cache — and its frames arrive in order.
func TestSendAsyncBlockingLoopInline(t *testing.T) {
	l, err := poll.NewBlockingLoop()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, w := newTestPort(t, PortConfig{Loop: l})
	seq := uint32(0)
	for i := range 20 {
		bufs := numberedBatch(t, txInlineBytes/1400+2, &seq)
		done := false
		p.SendAsync(bufs, tap.Headroom, func() { done = true })
		if !done {
			t.Fatalf("batch %d of %d frames not written when SendAsync returned", i, len(bufs))
		}
	}
	expectNumbered(t, w, seq)
}

// numberedBatch returns n RoCE frames of 1400 bytes behind headroom, each
// ending in its number, counted on from *seq.
func numberedBatch(t *testing.T, n int, seq *uint32) [][]byte {
	t.Helper()
	bufs := make([][]byte, n)
	for j := range bufs {
		f := roceTo(t, peerMAC, 7)
		f = append(f, make([]byte, 1400-len(f))...)
		binary.BigEndian.PutUint32(f[len(f)-4:], *seq)
		*seq++
		bufs[j] = append(make([]byte, tap.Headroom), f...)
	}
	return bufs
}

// expectNumbered checks that the wire carries frames 0 to n-1 of
// numberedBatch, in order.
func expectNumbered(t *testing.T, w wire, n uint32) {
	t.Helper()
	for want := range n {
		f := w.next(5 * time.Second)
		if f == nil {
			t.Fatalf("frame %d of %d never came", want, n)
		}
		if got := binary.BigEndian.Uint32(f[len(f)-4:]); got != want {
			t.Fatalf("frame %d came as number %d", want, got)
		}
	}
}
