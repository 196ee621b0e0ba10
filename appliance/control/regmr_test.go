package control

import (
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/taproce/taproce/verbs/abi"
)

// memfdOf makes a sealed memfd of n pages, each page filled with its
// index plus first.
func memfdOf(t *testing.T, n int, first byte) int {
	t.Helper()
	ps := os.Getpagesize()
	fd, err := unix.MemfdCreate("seg", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, n*ps)
	for i := range b {
		b[i] = first + byte(i/ps)
	}
	if _, err := unix.Pwrite(fd, b, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		t.Fatal(err)
	}
	return fd
}

// TestRegMRSegments: a region on pieces of several memfds registers when
// the pieces hold it and no more, with the bytes of each piece where the
// region's addresses say, the descriptors taken; anything else is EINVAL
// with the descriptors left to the session to close, and a request whose descriptors do not match its pieces cuts
// the client off.
func TestRegMRSegments(t *testing.T) {
	ps := uint64(os.Getpagesize())
	c1, c2 := socketPair(t)
	defer c2.Close()
	srv := New(Config{Socket: "/nonexistent"})
	ss, err := srv.newSessionFor(c1, 0)
	if err != nil {
		t.Fatal(err)
	}
	dev := fuzzDevice()
	ss.dev = dev
	ss.opened.Store(dev)
	defer ss.teardown()
	if _, _, err := ss.handle(abi.OpAllocPD, nil, nil); err != nil {
		t.Fatal(err)
	}
	req := func(addr, length, lead uint64, segs ...abi.MRSegment) *abi.RegMRSegmentsRequest {
		r := &abi.RegMRSegmentsRequest{PD: 1, Access: 1, Addr: addr, Length: length, Lead: lead, NumSegments: uint32(len(segs))}
		copy(r.Segments[:], segs)
		return r
	}
	body := func(r *abi.RegMRSegmentsRequest) []byte {
		m, err := abi.Encode(nil, abi.Header{Op: abi.OpRegMRSegments}, r)
		if err != nil {
			t.Fatal(err)
		}
		_, b, _ := abi.DecodeHeader(m)
		return b
	}
	for _, tc := range []struct {
		name string
		r    *abi.RegMRSegmentsRequest
		ok   bool
	}{
		// 2 pages of A from its page 1, 1 page of B: the region is the
		// last 100 bytes of A's page 1 to 10 bytes into B's page.
		{"held", req(0x10000+ps-100, ps+110, ps-100, abi.MRSegment{Offset: ps, Length: 2 * ps, Size: 3 * ps}, abi.MRSegment{Length: ps, Size: ps}), true},
		{"beyond the pieces", req(0x10000, 3*ps+1, 0, abi.MRSegment{Offset: ps, Length: 2 * ps, Size: 3 * ps}, abi.MRSegment{Length: ps, Size: ps}), false},
		{"a piece more", req(0x10000, ps, 0, abi.MRSegment{Offset: ps, Length: 2 * ps, Size: 3 * ps}, abi.MRSegment{Length: ps, Size: ps}), false},
		{"lead past the first", req(0x10000, 10, 2*ps, abi.MRSegment{Offset: ps, Length: 2 * ps, Size: 3 * ps}, abi.MRSegment{Length: ps, Size: ps}), false},
		{"piece beyond its memfd", req(0x10000, 3*ps, 0, abi.MRSegment{Offset: 2 * ps, Length: 2 * ps, Size: 3 * ps}, abi.MRSegment{Length: ps, Size: ps}), false},
		{"empty", req(0x10000, 0, 0, abi.MRSegment{Offset: ps, Length: 2 * ps, Size: 3 * ps}, abi.MRSegment{Length: ps, Size: ps}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := memfdOf(t, 3, 10), memfdOf(t, 1, 20)
			in := received{a, b}
			rep, fds, err := ss.handle(abi.OpRegMRSegments, body(tc.r), in)
			in.close() // as run does: what the op did not take
			if tc.ok && (in[0] != -1 || in[1] != -1) {
				t.Errorf("a registration that succeeded left descriptors %v to close", in)
			}
			if err != nil || len(fds) != 0 {
				t.Fatalf("handle: %v, %d descriptors", err, len(fds))
			}
			r := rep.(*abi.RegMRReply)
			if !tc.ok {
				if r.Errno != abi.Errno(syscall.EINVAL) {
					t.Fatalf("errno %d, want EINVAL", r.Errno)
				}
				for _, fd := range []int{a, b} {
					if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
						t.Errorf("fd %d left open", fd)
						unix.Close(fd)
					}
				}
				return
			}
			if r.Errno != 0 {
				t.Fatalf("errno %d", r.Errno)
			}
			ss.mu.Lock()
			mr := ss.mrs[r.Handle]
			ss.mu.Unlock()
			buf := mr.region.Bytes()[tc.r.Lead : tc.r.Lead+tc.r.Length]
			if buf[0] != 11 || buf[99] != 11 || buf[100] != 12 || buf[100+ps] != 20 || buf[len(buf)-1] != 20 {
				t.Fatalf("bytes %d %d %d %d %d", buf[0], buf[99], buf[100], buf[100+ps], buf[len(buf)-1])
			}
		})
	}
	a := memfdOf(t, 1, 0)
	r := req(0x10000, 10, 0, abi.MRSegment{Length: ps, Size: ps}, abi.MRSegment{Length: ps, Size: ps})
	if _, _, err := ss.handle(abi.OpRegMRSegments, body(r), []int{a}); err == nil {
		t.Fatal("two pieces with one descriptor: the client was not cut off")
	}
	unix.Close(a)
}
