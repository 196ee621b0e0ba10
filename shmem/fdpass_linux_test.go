//go:build linux

package shmem

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// socketpair returns two connected unix sockets of type typ
// (unix.SOCK_STREAM or unix.SOCK_SEQPACKET).
func socketpair(t testing.TB, typ int) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c.(*net.UnixConn)
		t.Cleanup(func() { c.Close() })
	}
	return conns[0], conns[1]
}

var sockTypes = []struct {
	name string
	typ  int
}{{"stream", unix.SOCK_STREAM}, {"seqpacket", unix.SOCK_SEQPACKET}}

func TestFdPassingRegions(t *testing.T) {
	for _, st := range sockTypes {
		t.Run(st.name, func(t *testing.T) {
			checkNoFdLeak(t)
			a, b := socketpair(t, st.typ)
			const n = 4
			var fds []int
			for i := range n {
				r, err := NewRegion(fmt.Sprint("pass", i), 100*(i+1))
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				copy(r.Bytes(), fmt.Sprintf("region %d", i))
				fds = append(fds, r.Fd())
			}
			msg := []byte("here are four regions")
			if err := SendMsg(a, msg, fds...); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 64)
			got, rfds, err := RecvMsg(b, buf, n)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf[:got], msg) {
				t.Fatalf("message %q, want %q", buf[:got], msg)
			}
			if len(rfds) != n {
				t.Fatalf("%d descriptors, want %d", len(rfds), n)
			}
			for i, fd := range rfds {
				flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
				if err != nil || flags&unix.FD_CLOEXEC == 0 {
					t.Errorf("received fd %d: flags %#x, %v: want FD_CLOEXEC", fd, flags, err)
				}
				r, err := MapRegion(fd, os.Getpagesize())
				if err != nil {
					unix.Close(fd)
					t.Fatal(err)
				}
				if want := fmt.Sprintf("region %d", i); string(r.Bytes()[:len(want)]) != want {
					t.Errorf("region %d holds %q", i, r.Bytes()[:len(want)])
				}
				r.Close()
			}
		})
	}
}

func TestRecvMsgTruncatedFds(t *testing.T) {
	for _, st := range sockTypes {
		for _, maxFds := range []int{0, 1, 2} {
			t.Run(fmt.Sprintf("%s/max%d", st.name, maxFds), func(t *testing.T) {
				checkNoFdLeak(t)
				a, b := socketpair(t, st.typ)
				var fds []int
				for range 3 {
					r, err := NewRegion("trunc", 1)
					if err != nil {
						t.Fatal(err)
					}
					defer r.Close()
					fds = append(fds, r.Fd())
				}
				if err := SendMsg(a, []byte("three"), fds...); err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 16)
				n, rfds, err := RecvMsg(b, buf, maxFds)
				if !errors.Is(err, ErrTruncated) {
					t.Fatalf("RecvMsg = %d, %v, %v; want ErrTruncated", n, rfds, err)
				}
				if rfds != nil {
					t.Fatalf("descriptors returned with an error: %v", rfds)
				}
				if string(buf[:n]) != "three" {
					t.Fatalf("data %q", buf[:n])
				}
				// The connection stays usable.
				if err := SendMsg(a, []byte("more")); err != nil {
					t.Fatal(err)
				}
				if n, _, err := RecvMsg(b, buf, maxFds); err != nil || string(buf[:n]) != "more" {
					t.Fatalf("next message %q, %v", buf[:n], err)
				}
			})
		}
	}
}

func TestRecvMsgShortAndEOF(t *testing.T) {
	t.Run("seqpacket too long", func(t *testing.T) {
		checkNoFdLeak(t)
		a, b := socketpair(t, unix.SOCK_SEQPACKET)
		d := newTestDoorbell(t)
		if err := SendMsg(a, []byte("0123456789"), d.Fd()); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		n, fds, err := RecvMsg(b, buf, 1)
		if !errors.Is(err, ErrTruncated) || fds != nil || n != 4 {
			t.Fatalf("RecvMsg = %d, %v, %v; want 4 bytes and ErrTruncated", n, fds, err)
		}
	})
	t.Run("stream short reads", func(t *testing.T) {
		checkNoFdLeak(t)
		a, b := socketpair(t, unix.SOCK_STREAM)
		d := newTestDoorbell(t)
		if err := SendMsg(a, []byte("0123456789"), d.Fd()); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		var got []byte
		var all []int
		for len(got) < 10 {
			n, fds, err := RecvMsg(b, buf, 1)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) > 0 && len(fds) > 0 {
				t.Fatal("descriptors arrived with a later piece")
			}
			got = append(got, buf[:n]...)
			all = append(all, fds...)
		}
		if string(got) != "0123456789" || len(all) != 1 {
			t.Fatalf("got %q with %d fds", got, len(all))
		}
		b2, err := DoorbellFromFd(all[0])
		if err != nil {
			t.Fatal(err)
		}
		defer b2.Close()
		b2.Ring()
		if rung, _ := d.Drain(); !rung {
			t.Fatal("passed eventfd is not the same doorbell")
		}
	})
	for _, st := range sockTypes {
		t.Run(st.name+" EOF", func(t *testing.T) {
			a, b := socketpair(t, st.typ)
			SendMsg(a, []byte("last"))
			a.Close()
			buf := make([]byte, 16)
			if n, _, err := RecvMsg(b, buf, 4); err != nil || string(buf[:n]) != "last" {
				t.Fatalf("RecvMsg = %q, %v", buf[:n], err)
			}
			if n, fds, err := RecvMsg(b, buf, 4); err != io.EOF || n != 0 || fds != nil {
				t.Fatalf("RecvMsg after close = %d, %v, %v; want io.EOF", n, fds, err)
			}
		})
	}
	t.Run("deadline", func(t *testing.T) {
		_, b := socketpair(t, unix.SOCK_SEQPACKET)
		b.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		if _, _, err := RecvMsg(b, make([]byte, 8), 1); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("RecvMsg = %v, want deadline exceeded", err)
		}
	})
	t.Run("bad arguments", func(t *testing.T) {
		a, b := socketpair(t, unix.SOCK_SEQPACKET)
		if err := SendMsg(a, nil, 0); err == nil {
			t.Error("SendMsg with an empty message succeeded")
		}
		if err := SendMsg(a, []byte("x"), make([]int, MaxFds+1)...); err == nil {
			t.Error("SendMsg with too many descriptors succeeded")
		}
		if err := SendMsg(a, []byte("x"), 1<<20); err == nil {
			t.Error("SendMsg with a bad descriptor succeeded")
		}
		if _, _, err := RecvMsg(b, nil, 1); err == nil {
			t.Error("RecvMsg with an empty buffer succeeded")
		}
		if _, _, err := RecvMsg(b, make([]byte, 1), -1); err == nil {
			t.Error("RecvMsg with negative maxFds succeeded")
		}
	})
}

// cmsg builds one control message as the kernel lays it out.
func cmsg(level, typ int32, data []byte) []byte {
	b := make([]byte, unix.CmsgSpace(len(data)))
	if unix.SizeofCmsghdr == 16 {
		binary.NativeEndian.PutUint64(b, uint64(unix.CmsgLen(len(data))))
		binary.NativeEndian.PutUint32(b[8:], uint32(level))
		binary.NativeEndian.PutUint32(b[12:], uint32(typ))
	} else {
		binary.NativeEndian.PutUint32(b, uint32(unix.CmsgLen(len(data))))
		binary.NativeEndian.PutUint32(b[4:], uint32(level))
		binary.NativeEndian.PutUint32(b[8:], uint32(typ))
	}
	copy(b[unix.CmsgLen(0):], data)
	return b
}

func TestParseRights(t *testing.T) {
	fdBytes := func(fds ...int32) []byte {
		var b []byte
		for _, fd := range fds {
			b = binary.NativeEndian.AppendUint32(b, uint32(fd))
		}
		return b
	}
	rights := func(fds ...int32) []byte { return cmsg(unix.SOL_SOCKET, unix.SCM_RIGHTS, fdBytes(fds...)) }
	creds := cmsg(unix.SOL_SOCKET, unix.SCM_CREDENTIALS, make([]byte, unix.SizeofUcred))
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for _, tc := range []struct {
		name    string
		oob     []byte
		want    []int
		wantErr bool
	}{
		{"empty", nil, nil, false},
		{"one", rights(5), []int{5}, false},
		{"three", rights(5, 6, 7), []int{5, 6, 7}, false},
		{"kernel layout of UnixRights", unix.UnixRights(9, 10), []int{9, 10}, false},
		{"credentials skipped", cat(creds, rights(3)), []int{3}, false},
		{"two rights messages", cat(rights(3), rights(4, 5)), []int{3, 4, 5}, false},
		{"empty rights", rights(), nil, false},
		{"negative fd", rights(3, -1), []int{3}, true},
		{"length beyond buffer", rights(3)[:unix.CmsgLen(4)-1], nil, true},
		{"length below header", func() []byte {
			b := rights(3)
			b[0] = 4
			return b
		}(), nil, true},
		{"odd payload", func() []byte {
			b := rights(3, 4)
			binary.NativeEndian.PutUint32(b, uint32(unix.CmsgLen(6)))
			return b
		}(), nil, true},
		{"stray bytes", cat(rights(3), []byte{1, 2, 3}), []int{3}, true},
		{"good then bad", cat(rights(3), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0}), []int{3}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fds, err := parseRights(tc.oob)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if fmt.Sprint(fds) != fmt.Sprint(tc.want) && !(len(fds) == 0 && len(tc.want) == 0) {
				t.Fatalf("fds = %v, want %v", fds, tc.want)
			}
		})
	}
}

// FuzzParseRights checks that control-message parsing never panics and
// returns only plausible descriptors.
func FuzzParseRights(f *testing.F) {
	f.Add(unix.UnixRights(3, 4, 5))
	f.Add(append(unix.UnixRights(7), unix.UnixRights(8)...))
	f.Add(cmsg(unix.SOL_SOCKET, unix.SCM_CREDENTIALS, make([]byte, unix.SizeofUcred)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, oob []byte) {
		fds, _ := parseRights(oob)
		if len(fds) > len(oob)/4 {
			t.Fatalf("%d descriptors from %d bytes", len(fds), len(oob))
		}
		for _, fd := range fds {
			if fd < 0 {
				t.Fatalf("negative descriptor %d", fd)
			}
		}
	})
}
