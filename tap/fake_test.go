package tap

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFakePair(t *testing.T) {
	a, b := NewFakePair(1500, 8)
	defer a.Close()
	frames := [][]byte{
		append(make([]byte, Headroom), "one"...),
		append(make([]byte, Headroom), "two"...),
	}
	if n, err := a.Write(frames, Headroom); n != 2 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	bufs := [][]byte{make([]byte, 64), make([]byte, 64), make([]byte, 64)}
	sizes := make([]int, 3)
	n, err := b.Read(bufs, sizes, Headroom)
	if err != nil || n != 2 {
		t.Fatalf("Read = %d, %v", n, err)
	}
	for i, want := range []string{"one", "two"} {
		if got := bufs[i][Headroom : Headroom+sizes[i]]; !bytes.Equal(got, []byte(want)) {
			t.Errorf("frame %d = %q", i, got)
		}
	}
	b.Close()
	if _, err := b.Read(bufs, sizes, Headroom); err != ErrClosed {
		t.Fatalf("Read after Close: %v", err)
	}
	// Writing towards a closed peer loses the frames, like a dead link.
	if n, err := a.Write(frames[:1], Headroom); n != 1 || err != nil {
		t.Fatalf("Write to closed peer = %d, %v", n, err)
	}
}

// TestFakeClosedIsClosed: after Close every Write and Read fails, never
// racing with a ready peer.
func TestFakeClosedIsClosed(t *testing.T) {
	a, b := NewFakePair(1500, 2000)
	defer b.Close()
	frame := [][]byte{make([]byte, Headroom+10)}
	if _, err := a.Write(frame, Headroom); err != nil {
		t.Fatal(err)
	}
	a.Close()
	for i := 0; i < 1000; i++ {
		if n, err := a.Write(frame, Headroom); n != 0 || err != ErrClosed {
			t.Fatalf("write %d after Close: %d, %v", i, n, err)
		}
	}
	bufs, sizes := [][]byte{make([]byte, 64)}, []int{0}
	if _, err := a.Read(bufs, sizes, 0); err != ErrClosed {
		t.Fatalf("Read after Close: %v", err)
	}
}

// TestFakeTryReadEach: the queued frames in order, none without waiting
// when the queue is empty, ErrClosed after Close.
func TestFakeTryReadEach(t *testing.T) {
	a, b := NewFakePair(1500, 8)
	defer a.Close()
	var got []string
	collect := func(f []byte) { got = append(got, string(f)) }
	if n, err := b.TryReadEach(collect); n != 0 || err != nil || len(got) != 0 {
		t.Fatalf("empty: TryReadEach = %d, %v, frames %q", n, err, got)
	}
	frames := [][]byte{append(make([]byte, Headroom), "one"...), append(make([]byte, Headroom), "two"...)}
	if _, err := a.Write(frames, Headroom); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := b.TryReadEach(collect); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 2 || got[0] != "one" || got[1] != "two" {
		t.Errorf("frames %q, want one, two", got)
	}
	b.Close()
	if _, err := b.TryReadEach(collect); err != ErrClosed {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

// TestFakeFd: the descriptor polls readable exactly while frames wait —
// what a blocking loop sleeps on — and once the device is closed.
func TestFakeFd(t *testing.T) {
	a, b := NewFakePair(1500, 4)
	defer a.Close()
	readable := func() bool {
		fds := []unix.PollFd{{Fd: int32(b.Fd()), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		if err != nil {
			t.Fatal(err)
		}
		return n == 1 && fds[0].Revents&unix.POLLIN != 0
	}
	if readable() {
		t.Fatal("readable with nothing queued")
	}
	frame := [][]byte{append(make([]byte, Headroom), "x"...)}
	for range 2 {
		if _, err := a.Write(frame, Headroom); err != nil {
			t.Fatal(err)
		}
	}
	if !readable() {
		t.Fatal("not readable with two frames queued")
	}
	if n, err := b.TryReadEach(func([]byte) {}); n != 2 || err != nil {
		t.Fatalf("TryReadEach = %d, %v", n, err)
	}
	if readable() {
		t.Fatal("readable after every frame was read")
	}
	b.Close()
	if !readable() {
		t.Fatal("not readable once closed: a sleeping loop would not learn of it")
	}
}

// TestFakeDropsWhenFull: a write never waits for the reader; what finds
// the queue full is dropped and counted, as a TAP's kernel drops it.
func TestFakeDropsWhenFull(t *testing.T) {
	a, b := NewFakePair(1500, 3)
	defer a.Close()
	defer b.Close()
	frames := make([][]byte, 5)
	for i := range frames {
		frames[i] = append(make([]byte, Headroom), byte(i))
	}
	if n, err := a.Write(frames, Headroom); n != 5 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if d := b.Dropped(); d != 2 {
		t.Errorf("Dropped = %d, want 2", d)
	}
	var got []byte
	if _, err := b.TryReadEach(func(f []byte) { got = append(got, f[0]) }); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, []byte{0, 1, 2}) {
		t.Errorf("read %v, want the first three", got)
	}
}
