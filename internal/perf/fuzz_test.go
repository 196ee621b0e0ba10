package perf

import (
	"encoding/binary"
	"errors"
	"io"
	"math"
	"math/big"
	"math/bits"
	"net"
	"strings"
	"testing"
	"time"
)

// fuzzTests are the tests FuzzExchange runs, each as client and server.
var fuzzTests = []Test{{Write, BW}, {Read, BW}, {Send, BW}, {Atomic, BW}, {Send, Lat}, {Write, Lat}, {Read, Lat}}

// peerStream is what a perftest 6.06 peer writes in an exchange that goes
// well as far as the keys: its version, page and cache line sizes, MTU,
// then its keys as often as the exchange asks, then a bandwidth report.
func peerStream(page, cacheLine uint32, keys int) []byte {
	b := make([]byte, versionSize)
	copy(b, Version)
	b = binary.BigEndian.AppendUint32(b, page)
	b = binary.BigEndian.AppendUint32(b, cacheLine)
	b = append(b, '3', 0)
	d := Dest{QPN: 0x11, PSN: 0x222, RKey: 0x3333, VAddr: 0x7f0000001000, GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 2}}
	for range keys {
		b = append(b, d.Marshal(true)...)
	}
	for _, v := range []uint64{65536, 5, math.Float64bits(1), math.Float64bits(2), math.Float64bits(3)} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	return append(b, doneMsg...)
}

// FuzzExchange plays a peer whose messages are the fuzzer's bytes against
// the out-of-band exchange (setup, then the test's handshakes and reports),
// in either role. Whatever the peer sends, the exchange ends — with an
// error wrapping ErrProtocol or the connection's, or having agreed on
// sizes the test can use: page and cache line sizes that are powers of
// two, the cache line no larger than the page (the buffer layout divides
// one by the other), and an MTU enum from 1 to this side's 3.
func FuzzExchange(f *testing.F) {
	for i := range fuzzTests {
		f.Add(peerStream(4096, 64, 4), true, uint8(i))
		f.Add(peerStream(4096, 64, 4), false, uint8(i))
	}
	f.Add(peerStream(65536, 128, 4), true, uint8(0))
	f.Add(peerStream(4096, 8192, 4), true, uint8(0))
	f.Add(peerStream(4096, 96, 4), false, uint8(4))
	f.Add(peerStream(0x80000000, 64, 4), true, uint8(1))
	f.Fuzz(func(t *testing.T, peer []byte, client bool, which uint8) {
		test := fuzzTests[int(which)%len(fuzzTests)]
		cfg := Config{Test: test, Size: 64, Iters: 5, GIDIndex: 1, Inline: -1, Margin: -1, Atomic: FetchAndAdd}
		if test.Verb == Atomic {
			cfg.Size = 0
		}
		if client {
			cfg.Server = "peer"
		}
		p, err := resolve(cfg)
		if err != nil {
			t.Fatal(err)
		}
		a, b := net.Pipe()
		defer a.Close()
		go io.Copy(io.Discard, b) //nolint:errcheck // ends when the pipe closes
		go func() {
			b.Write(peer) //nolint:errcheck // the side may stop reading early
			b.Close()
		}()
		o := newOOB(a, client, 100*time.Millisecond)
		cycle, cacheLine, mtu, err := o.setup(4096, 64, 3)
		if err != nil {
			protocolOrConn(t, err)
			return
		}
		if cycle < 4096 || cacheLine < 64 || bits.OnesCount(uint(cycle)) != 1 || bits.OnesCount(uint(cacheLine)) != 1 || cacheLine > cycle || cycle > maxCycle {
			t.Fatalf("agreed on page size %d and cache line %d", cycle, cacheLine)
		}
		if mtu < 1 || mtu > 3 {
			t.Fatalf("agreed on MTU %d from our 3", mtu)
		}
		my := Dest{QPN: 0x44, PSN: 0x555, GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 1}}
		if _, err := exchange(o, p, []Dest{my}, &fakeDriver{test: test}, &printer{w: io.Discard}); err != nil && !errors.Is(err, errGIDTypes) {
			protocolOrConn(t, err)
		}
	})
}

// protocolOrConn fails the test unless err is about the peer's messages
// or the connection.
func protocolOrConn(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, ErrProtocol) || errors.Is(err, io.ErrClosedPipe) || errors.Is(err, io.EOF) {
		return
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return
	}
	t.Fatalf("exchange: %v (%T)", err, err)
}

// TestSysData: the page and cache line sizes both sides take, and the
// peer's sizes that are refused. A cache line larger than the page once
// passed, and a bandwidth test then divided by zero laying out its
// buffer (rdma.advance: the cache-line steps per page).
func TestSysData(t *testing.T) {
	for _, c := range []struct {
		page, line         uint32
		wantPage, wantLine int
	}{
		{4096, 64, 4096, 64},
		{65536, 128, 65536, 128},
		{1024, 32, 4096, 64}, // the larger of both sides'
		{4096, 8192, 0, 0},   // cache line beyond the page
		{4096, 96, 0, 0},     // not a power of two
		{1 << 21, 64, 0, 0},  // page beyond maxCycle
		{0xFFFFFFFF, 64, 4096, 64},
	} {
		a, b := net.Pipe()
		go func() {
			defer b.Close()
			buf := make([]byte, 4)
			for _, v := range []uint32{c.page, c.line} {
				if _, err := io.ReadFull(b, buf); err != nil {
					return
				}
				b.Write(binary.BigEndian.AppendUint32(nil, v)) //nolint:errcheck // the test reads what arrives
			}
		}()
		o := newOOB(a, true, time.Second)
		o.remVersion = Version
		page, line, err := o.sysData(4096, 64)
		a.Close()
		if c.wantPage == 0 {
			if !errors.Is(err, ErrProtocol) {
				t.Errorf("peer page %d, line %d: %d, %d, %v; want a protocol error", c.page, c.line, page, line, err)
			}
			continue
		}
		if err != nil || page != c.wantPage || line != c.wantLine {
			t.Errorf("peer page %d, line %d: %d, %d, %v; want %d, %d", c.page, c.line, page, line, err, c.wantPage, c.wantLine)
		}
	}
}

// FuzzParseDest: perftest keys from the peer parse or are an
// ErrProtocol, and what parses comes out of Marshal and ParseDest again
// unchanged, with and without the GID.
func FuzzParseDest(f *testing.F) {
	d := Dest{LID: 1, OutReads: 16, QPN: 0x11, PSN: 0x222, RKey: 0x3333, VAddr: 0x7f0000001000, GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 2}, SRQN: 7}
	f.Add(d.Marshal(true), true)
	f.Add(d.Marshal(false), false)
	f.Add([]byte("0000:0000:1000000:000222:00003333:00007f0000001000:00000000"), false)
	f.Fuzz(func(t *testing.T, msg []byte, withGID bool) {
		d, err := ParseDest(msg, withGID)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("ParseDest(%q): %v is not an ErrProtocol", msg, err)
			}
			return
		}
		again, err := ParseDest(d.Marshal(withGID), withGID)
		if err != nil || again != d {
			t.Fatalf("ParseDest(%q) = %+v; marshalled and parsed again: %+v, %v", msg, d, again, err)
		}
	})
}

// FuzzParseSize: a size that parses is the number with its suffix's
// factor, worked out without overflow, and between 1 and 2^31-1. Sizes
// of 16 Ti and one M (2^44+1 M) once wrapped around to 1 MiB.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"64", "4K", "8M", "0x10", "17592186044417M", "18014398509481985K", "2147483647", "2147483648", "-1", "1_000", "0K"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		if err != nil {
			return
		}
		v, factor := s, int64(1)
		switch {
		case strings.HasSuffix(v, "K"):
			v, factor = strings.TrimSuffix(v, "K"), 1024
		case strings.HasSuffix(v, "M"):
			v, factor = strings.TrimSuffix(v, "M"), 1<<20
		}
		want, ok := new(big.Int).SetString(v, 0)
		if !ok {
			t.Fatalf("parseSize(%q) = %d, but %q is no number", s, n, v)
		}
		want.Mul(want, big.NewInt(factor))
		if !want.IsInt64() || want.Int64() != int64(n) || n < 1 || n > 1<<31-1 {
			t.Fatalf("parseSize(%q) = %d, want %v (between 1 and 2^31-1)", s, n, want)
		}
	})
}
