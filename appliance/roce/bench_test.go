package roce_test

import (
	"bytes"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/testvectors"
)

// bigPacket returns an RDMA WRITE MIDDLE packet template, the common case
// of a bulk transfer, and a 4096-byte payload.
func bigPacket() (roce.Packet, []byte) {
	p := randomPacket(rand.New(rand.NewPCG(11, 12)), roce.RCRDMAWriteMiddle, false)
	payload := make([]byte, 4096)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	return p, payload
}

// TestZeroAllocs checks that the per-packet operations allocate nothing.
func TestZeroAllocs(t *testing.T) {
	p, payload := bigPacket()
	buf := make([]byte, 8192)
	n, err := p.Build(buf, payload)
	if err != nil {
		t.Fatal(err)
	}
	frame := buf[:n]
	ack := validFrame(t, roce.RCAcknowledge, 0, false)
	v6 := validFrame(t, roce.UDSendOnlyWithImmediate, 256, true)
	var q roce.Packet
	ops := []struct {
		name string
		fn   func()
	}{
		{"Parse", func() { _ = roce.Parse(frame, &q) }},
		{"Parse ACK", func() { _ = roce.Parse(ack, &q) }},
		{"Parse IPv6", func() { _ = roce.Parse(v6, &q) }},
		{"Parse error", func() { _ = roce.Parse(frame[:30], &q) }},
		{"Build", func() { _, _ = p.Build(buf, payload) }},
		{"Encode", func() { _, _ = p.Encode(buf) }},
		{"VerifyICRC", func() { _ = roce.Parse(frame, &q); _ = q.VerifyICRC(frame) }},
		{"ComputeICRC IPv6", func() { _ = roce.Parse(v6, &q); _ = q.ComputeICRC(v6) }},
	}
	for _, op := range ops {
		if a := testing.AllocsPerRun(100, op.fn); a != 0 {
			t.Errorf("%s: %v allocations, want 0", op.name, a)
		}
	}
}

func BenchmarkParse(b *testing.B) {
	p, payload := bigPacket()
	buf := make([]byte, 8192)
	n, _ := p.Build(buf, payload)
	ackp := randomPacket(rand.New(rand.NewPCG(1, 1)), roce.RCAcknowledge, false)
	ack := make([]byte, 128)
	m, _ := ackp.Build(ack, nil)
	for _, c := range []struct {
		name  string
		frame []byte
	}{{"write-4096", buf[:n]}, {"ack", ack[:m]}} {
		b.Run(c.name, func(b *testing.B) {
			var q roce.Packet
			b.ReportAllocs()
			for b.Loop() {
				if err := roce.Parse(c.frame, &q); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"+verify", func(b *testing.B) {
			var q roce.Packet
			b.SetBytes(int64(len(c.frame)))
			b.ReportAllocs()
			for b.Loop() {
				if err := roce.Parse(c.frame, &q); err != nil {
					b.Fatal(err)
				}
				if err := q.VerifyICRC(c.frame); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

var sink uint32

// BenchmarkBuildICRC measures building a 4096-byte-payload packet with its
// ICRC, and crc32.ChecksumIEEE over the same bytes (everything the ICRC
// covers) in the same run. "build" copies the payload in; "encode" finds it
// in place, as the transport leaves it after copying from registered
// memory. The x-crc32 metric is the throughput of the build relative to the
// bare CRC, timed back to back inside one benchmark.
func BenchmarkBuildICRC(b *testing.B) {
	p, payload := bigPacket()
	buf := make([]byte, 8192)
	n, err := p.Build(buf, payload)
	if err != nil {
		b.Fatal(err)
	}
	covered := buf[roce.EthernetLen : n-roce.ICRCLen]
	bare := func(iters int) time.Duration {
		start := time.Now()
		for range iters {
			sink = crc32.ChecksumIEEE(covered)
		}
		return time.Since(start)
	}
	b.Run("crc32", func(b *testing.B) {
		b.SetBytes(int64(len(covered)))
		for b.Loop() {
			sink = crc32.ChecksumIEEE(covered)
		}
	})
	run := func(name string, fn func()) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(covered)))
			b.ReportAllocs()
			start := time.Now()
			for range b.N {
				fn()
			}
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(bare(b.N))/float64(elapsed), "x-crc32")
		})
	}
	run("build", func() { _, _ = p.Build(buf, payload) })
	run("encode", func() { _, _ = p.Encode(buf) })
}

// FuzzParse feeds arbitrary frames to Parse. Parse must not panic or read
// out of bounds; IsRoCE must agree with it (true for what it accepts,
// false for what it calls ErrNotRoCE); a frame it accepts must lie within the input, survive
// VerifyICRC unchanged, and rebuild from its fields into a frame that
// parses to the same fields with a valid ICRC.
func FuzzParse(f *testing.F) {
	for _, fr := range testvectors.Frames() {
		f.Add(fr)
	}
	r := rand.New(rand.NewPCG(9, 9))
	for o := 0; o < 256; o++ {
		op := roce.Opcode(o)
		if !op.Valid() {
			continue
		}
		p := randomPacket(r, op, o%2 == 1)
		var payload []byte
		if op.Info().Has(roce.HasPayload) {
			payload = make([]byte, o%13)
		}
		buf := make([]byte, 512)
		n, _ := p.Build(buf, payload)
		f.Add(buf[:n])
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		orig := bytes.Clone(frame)
		var p roce.Packet
		err := roce.Parse(frame, &p)
		if errors.Is(err, roce.ErrNotRoCE) == roce.IsRoCE(frame) && (err == nil || errors.Is(err, roce.ErrNotRoCE)) {
			t.Fatalf("IsRoCE = %v where Parse says %v", roce.IsRoCE(frame), err)
		}
		if err != nil {
			return
		}
		if p.FrameLen() > len(frame) || p.HeaderLen()+p.PayloadLen > len(frame) {
			t.Fatalf("parsed frame of %d bytes beyond input of %d", p.FrameLen(), len(frame))
		}
		_ = p.VerifyICRC(frame)
		if !bytes.Equal(frame, orig) {
			t.Fatal("VerifyICRC changed the frame")
		}
		q := p
		buf := make([]byte, p.FrameLen()+4)
		n, err := q.Build(buf, p.Payload(frame))
		if err != nil {
			t.Fatalf("rebuilding %+v: %v", p, err)
		}
		var r roce.Packet
		if err := roce.Parse(buf[:n], &r); err != nil {
			t.Fatalf("rebuilt frame does not parse: %v", err)
		}
		if r != q {
			t.Fatalf("rebuilt frame parses differently\n got %+v\nwant %+v", r, q)
		}
		if err := r.VerifyICRC(buf[:n]); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzBuildParse builds packets from fuzzed fields and payloads and
// expects Parse to return exactly those fields.
func FuzzBuildParse(f *testing.F) {
	f.Add(uint8(roce.RCSendOnly), false, uint64(1), []byte("hello"))
	f.Add(uint8(roce.RCRDMAWriteOnlyWithImmediate), true, uint64(2), make([]byte, 1024))
	f.Add(uint8(roce.RCAcknowledge), false, uint64(3), []byte(nil))
	f.Add(uint8(roce.UDSendOnly), true, uint64(4), make([]byte, 3))
	f.Add(uint8(0x15), false, uint64(5), []byte(nil))
	f.Fuzz(func(t *testing.T, o uint8, ipv6 bool, seed uint64, payload []byte) {
		op := roce.Opcode(o)
		p := randomPacket(rand.New(rand.NewPCG(seed, 0)), op, ipv6)
		buf := make([]byte, len(payload)+256)
		n, err := p.Build(buf, payload)
		switch {
		case !op.Valid():
			if !errors.Is(err, roce.ErrOpcode) {
				t.Fatalf("opcode %#x: Build = %v, want ErrOpcode", o, err)
			}
			return
		case len(payload) > 0 && !op.Info().Has(roce.HasPayload):
			if !errors.Is(err, roce.ErrUnexpectedPayload) {
				t.Fatalf("%v with payload: Build = %v", op, err)
			}
			return
		case err != nil:
			if errors.Is(err, roce.ErrLength) && len(payload) > 65000 {
				return
			}
			t.Fatalf("%v: Build: %v", op, err)
		}
		var got roce.Packet
		if err := roce.Parse(buf[:n], &got); err != nil {
			t.Fatalf("%v: Parse: %v", op, err)
		}
		if got != p {
			t.Fatalf("%v: round trip\n got %+v\nwant %+v", op, got, p)
		}
		if !bytes.Equal(got.Payload(buf[:n]), payload) {
			t.Fatalf("%v: payload differs", op)
		}
		if err := got.VerifyICRC(buf[:n]); err != nil {
			t.Fatal(err)
		}
	})
}
