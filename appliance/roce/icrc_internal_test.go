package roce

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// refICRC is the ICRC computed the plain way: copy, mask, CRC.
func refICRC(frame []byte, ipv6 bool, end int) uint32 {
	l3 := append([]byte(nil), frame[EthernetLen:end]...)
	bth := IPv4Len + UDPLen
	if ipv6 {
		bth = IPv6Len + UDPLen
		l3[0] |= 0x0F
		l3[1], l3[2], l3[3], l3[7] = 0xFF, 0xFF, 0xFF, 0xFF
	} else {
		l3[1], l3[8], l3[10], l3[11] = 0xFF, 0xFF, 0xFF, 0xFF
	}
	l3[bth-2], l3[bth-1], l3[bth+4] = 0xFF, 0xFF, 0xFF
	return crc32.ChecksumIEEE(append([]byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, l3...))
}

// TestICRC checks the slicing-by-8 prefix path against the plain
// computation over random frames of both IP versions, and that it leaves
// the frame untouched.
func TestICRC(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, v6 := range []bool{false, true} {
		for n := 0; n < 600; n += 3 {
			hl := EthernetLen + IPv4Len + UDPLen + BTHLen
			if v6 {
				hl = EthernetLen + IPv6Len + UDPLen + BTHLen
			}
			f := make([]byte, hl+n+4)
			for i := range f {
				f[i] = byte(r.Uint32())
			}
			orig := append([]byte(nil), f...)
			if got, want := icrc(f, v6, len(f)-4), refICRC(f, v6, len(f)-4); got != want {
				t.Fatalf("v6=%v n=%d: icrc %#x, want %#x", v6, n, got, want)
			}
			if string(f) != string(orig) {
				t.Fatalf("v6=%v n=%d: frame changed", v6, n)
			}
		}
	}
}

// BenchmarkICRCPaths compares checking the ICRC of a received frame with a
// bare crc32.Update over the same bytes, for a 4096-byte payload.
func BenchmarkICRCPaths(b *testing.B) {
	buf := make([]byte, EthernetLen+IPv4Len+UDPLen+BTHLen+4096+ICRCLen)
	buf[14] = 0x45
	end := len(buf) - ICRCLen
	b.Run("icrc", func(b *testing.B) {
		for b.Loop() {
			_ = icrc(buf, false, end)
		}
	})
	b.Run("bare", func(b *testing.B) {
		for b.Loop() {
			_ = crc32.Update(crcMaskedLRH, crc32.IEEETable, buf[EthernetLen:end])
		}
	})
}
