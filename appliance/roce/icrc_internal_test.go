package roce

import (
	"hash/crc32"
	"testing"
)

// TestICRCInPlace checks that both ICRC paths agree and that the in-place
// one leaves the frame as it found it.
func TestICRCInPlace(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		for n := 0; n < 300; n += 7 {
			hl := EthernetLen + IPv4Len + UDPLen + BTHLen
			if v6 {
				hl = EthernetLen + IPv6Len + UDPLen + BTHLen
			}
			f := make([]byte, hl+n+4)
			for i := range f {
				f[i] = byte(i*31 + n)
			}
			orig := append([]byte(nil), f...)
			a := icrc(f, v6, len(f)-4)
			b := icrcInPlace(f, v6, len(f)-4)
			if a != b {
				t.Fatalf("v6=%v n=%d: icrc %#x, in place %#x", v6, n, a, b)
			}
			if string(f) != string(orig) {
				t.Fatalf("v6=%v n=%d: frame changed", v6, n)
			}
		}
	}
}

// BenchmarkICRCPaths compares the read-only ICRC (masked headers copied and
// run through slicing-by-8), the in-place one Encode uses, and a bare
// crc32.Update over the same bytes, for a 4096-byte payload.
func BenchmarkICRCPaths(b *testing.B) {
	buf := make([]byte, EthernetLen+IPv4Len+UDPLen+BTHLen+4096+ICRCLen)
	buf[14] = 0x45
	end := len(buf) - ICRCLen
	b.Run("copy", func(b *testing.B) {
		for b.Loop() {
			_ = icrc(buf, false, end)
		}
	})
	b.Run("inplace", func(b *testing.B) {
		for b.Loop() {
			_ = icrcInPlace(buf, false, end)
		}
	})
	b.Run("bare", func(b *testing.B) {
		for b.Loop() {
			_ = crc32.Update(crcMaskedLRH, crc32.IEEETable, buf[EthernetLen:end])
		}
	})
}
