//go:build linux

package shmem

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	peerEnv      = "SHMEM_TEST_PEER"
	xprocSlots   = 64
	xprocSlot    = 64
	xprocMsgs    = 100000
	xprocTimeout = 15 * time.Second
)

// xprocPayload fills slot s with message seq: the sequence number, a length,
// that many pseudo-random bytes, and their CRC.
func xprocPayload(s []byte, seq uint64) {
	n := int(seq % uint64(len(s)-16))
	binary.LittleEndian.PutUint64(s, seq)
	binary.LittleEndian.PutUint32(s[8:], uint32(n))
	for i := range n {
		s[16+i] = byte(seq>>(i%8*8)) ^ byte(i)
	}
	binary.LittleEndian.PutUint32(s[12:], crc32.ChecksumIEEE(s[16:16+n]))
}

// TestCrossProcess runs a real peer: this test binary again, as a child
// process, which receives a memfd and two eventfds over a socketpair and
// consumes xprocMsgs messages from a ring in that memfd, sleeping on the
// doorbells whenever the ring is empty, while this process produces them.
func TestCrossProcess(t *testing.T) {
	if os.Getenv(peerEnv) != "" {
		t.Skip("running as the peer")
	}
	checkNoFdLeak(t)
	ctx, cancel := context.WithTimeout(context.Background(), xprocTimeout)
	defer cancel()

	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	childEnd := os.NewFile(uintptr(sp[1]), "peer-socket")
	f := os.NewFile(uintptr(sp[0]), "socket")
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		childEnd.Close()
		t.Fatal(err)
	}
	conn := fc.(*net.UnixConn)
	defer conn.Close()

	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrossProcessPeer$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), peerEnv+"=1")
	cmd.ExtraFiles = []*os.File{childEnd} // fd 3 in the child
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	err = cmd.Start()
	childEnd.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			cmd.Process.Kill()
		}
		cmd.Wait()
		if t.Failed() {
			t.Logf("peer output:\n%s", stderr.Bytes())
		}
	}()

	reg, err := NewRegion("xproc", RingBytes(xprocSlots, xprocSlot))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	ring, err := InitRing(reg.Bytes(), xprocSlots, xprocSlot)
	if err != nil {
		t.Fatal(err)
	}
	dataBell, err := NewDoorbell()
	if err != nil {
		t.Fatal(err)
	}
	defer dataBell.Close()
	spaceBell, err := NewDoorbell()
	if err != nil {
		t.Fatal(err)
	}
	defer spaceBell.Close()

	hello := fmt.Appendf(nil, "%d %d", reg.Size(), xprocMsgs)
	if err := SendMsg(conn, hello, reg.Fd(), dataBell.Fd(), spaceBell.Fd()); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	var sum uint32
	spaceWaits, rings := 0, 0
	for seq := range uint64(xprocMsgs) {
		w, err := awaitFree(ctx, ring, spaceBell)
		spaceWaits += w
		if err != nil {
			t.Fatalf("producer at message %d: %v", seq, err)
		}
		s := ring.Reserve()
		xprocPayload(s, seq)
		sum = crc32.Update(sum, crc32.IEEETable, s[:16])
		if ring.Commit() {
			rings++
			if err := dataBell.Ring(); err != nil {
				t.Fatal(err)
			}
		}
		// Pause now and then so that the consumer falls asleep.
		if seq%5000 == 4999 {
			time.Sleep(200 * time.Microsecond)
		}
	}
	elapsed := time.Since(start)

	buf := make([]byte, 128)
	conn.SetReadDeadline(time.Now().Add(xprocTimeout))
	n, fds, err := RecvMsg(conn, buf, 0)
	if err != nil || len(fds) != 0 {
		t.Fatalf("peer report: %v %v", err, fds)
	}
	var gotSum uint32
	var got, sleeps int
	if _, err := fmt.Sscanf(string(buf[:n]), "ok %d %d %d", &got, &gotSum, &sleeps); err != nil {
		t.Fatalf("peer report %q: %v", buf[:n], err)
	}
	if got != xprocMsgs || gotSum != sum {
		t.Fatalf("peer saw %d messages with checksum %#x, want %d and %#x", got, gotSum, xprocMsgs, sum)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("peer: %v", err)
	}
	t.Logf("%d messages in %v; consumer slept %d times, producer waited for space %d times, %d data doorbells",
		xprocMsgs, elapsed.Round(time.Millisecond), sleeps, spaceWaits, rings)
	if sleeps == 0 {
		t.Error("the consumer never slept")
	}
}

// TestCrossProcessPeer is the child side of TestCrossProcess.
func TestCrossProcessPeer(t *testing.T) {
	if os.Getenv(peerEnv) == "" {
		t.Skip("only run as the peer of TestCrossProcess")
	}
	ctx, cancel := context.WithTimeout(context.Background(), xprocTimeout)
	defer cancel()
	f := os.NewFile(3, "socket")
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	conn := fc.(*net.UnixConn)
	defer conn.Close()

	buf := make([]byte, 128)
	conn.SetReadDeadline(time.Now().Add(xprocTimeout))
	n, fds, err := RecvMsg(conn, buf, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(fds) != 3 {
		closeFds(fds)
		t.Fatalf("%d descriptors", len(fds))
	}
	var size, count int
	if _, err := fmt.Sscanf(string(buf[:n]), "%d %d", &size, &count); err != nil {
		closeFds(fds)
		t.Fatal(err)
	}
	reg, err := MapRegion(fds[0], size)
	if err != nil {
		closeFds(fds)
		t.Fatal(err)
	}
	defer reg.Close()
	dataBell, err := DoorbellFromFd(fds[1])
	if err != nil {
		t.Fatal(err)
	}
	defer dataBell.Close()
	spaceBell, err := DoorbellFromFd(fds[2])
	if err != nil {
		t.Fatal(err)
	}
	defer spaceBell.Close()
	ring, err := AttachRing(reg.Bytes())
	if err != nil {
		t.Fatal(err)
	}

	var sum uint32
	sleeps := 0
	want := make([]byte, ring.SlotSize())
	for seq := range uint64(count) {
		s, err := awaitFilled(ctx, ring, dataBell)
		sleeps += s
		if err != nil {
			t.Fatalf("consumer at message %d: %v", seq, err)
		}
		slot := ring.Peek()
		xprocPayload(want, seq)
		l := min(binary.LittleEndian.Uint32(slot[8:]), uint32(len(slot)-16))
		if !bytes.Equal(slot[:16+l], want[:16+l]) {
			t.Fatalf("message %d: got %x, want %x", seq, slot, want)
		}
		sum = crc32.Update(sum, crc32.IEEETable, slot[:16])
		if ring.Release() {
			if err := spaceBell.Ring(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := SendMsg(conn, fmt.Appendf(nil, "ok %d %d %d", count, sum, sleeps)); err != nil {
		t.Fatal(err)
	}
}
