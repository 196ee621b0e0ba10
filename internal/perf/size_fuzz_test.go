package perf

import (
	"math/big"
	"strings"
	"testing"
)

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
