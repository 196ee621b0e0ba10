package abi

import "testing"

// TestMTU: rxe's active MTU for a netdev MTU, and the enum's byte sizes.
func TestMTU(t *testing.T) {
	for _, c := range []struct {
		netdev int
		want   MTU
	}{{1500, MTU1024}, {9000, MTU4096}, {4200, MTU4096}, {4175, MTU2048}, {1100, MTU512}, {576, MTU256}, {68, MTU256}} {
		if got := MTUForNetdev(c.netdev); got != c.want {
			t.Errorf("MTUForNetdev(%d) = %d, want %d", c.netdev, got, c.want)
		}
	}
	for n, m := range map[int]MTU{256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5} {
		got, ok := MTUFromBytes(n)
		if !ok || got != m || m.Bytes() != n || !m.Valid() {
			t.Errorf("MTU %d: enum %d (%v), Bytes %d", n, got, ok, m.Bytes())
		}
	}
	if _, ok := MTUFromBytes(1500); ok {
		t.Error("MTUFromBytes(1500) accepted")
	}
	if MTU(0).Bytes() != 0 || MTU(6).Valid() {
		t.Error("invalid MTU enums accepted")
	}
}
