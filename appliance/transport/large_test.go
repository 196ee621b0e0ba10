package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/taproce/taproce/verbs/abi"
)

// TestLargestMessage: a 2 GiB RDMA WRITE (MaxMessage, rxe's
// RXE_MAX_MSG_SIZE) arrives intact and a 2 GiB READ brings it back; one
// byte more is refused at posting. It moves 4 GiB through memory, so
// -short leaves it out.
func TestLargestMessage(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 2 GiB each way; left out with -short")
	}
	const size = MaxMessage
	rp := newRingPair(t, size)
	for i := 0; i < size; i += 8 {
		binary.LittleEndian.PutUint64(rp.bufa[i:], uint64(i)*0x9E3779B97F4A7C15)
	}
	wcs := make([]WC, 4)
	run := func(wr SendWR) {
		t.Helper()
		if _, err := rp.qa.PostSend([]SendWR{wr}); err != nil {
			t.Fatal(err)
		}
		for pump(rp.a, rp.b) {
		}
		n := rp.cqa.Poll(wcs)
		if n != 1 || wcs[0].Status != abi.WCSuccess || wcs[0].ID != wr.ID {
			t.Fatalf("%v of 2 GiB: %d completions %+v", wr.Opcode, n, wcs[:n])
		}
	}
	run(SendWR{ID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sge(rp.mra, 0, size), RemoteAddr: base, RKey: rp.mrb.RKey})
	if !bytes.Equal(rp.bufa, rp.bufb) {
		t.Fatal("WRITE of 2 GiB: data differs")
	}
	clear(rp.bufa)
	run(SendWR{ID: 2, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, SGL: sge(rp.mra, 0, size), RemoteAddr: base, RKey: rp.mrb.RKey})
	if !bytes.Equal(rp.bufa, rp.bufb) {
		t.Fatal("READ of 2 GiB: data differs")
	}
	over := SendWR{ID: 3, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
		SGL: []SGE{sge(rp.mra, 0, size)[0], sge(rp.mra, 0, 1)[0]}, RemoteAddr: base, RKey: rp.mrb.RKey}
	if _, err := rp.qa.PostSend([]SendWR{over}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("2 GiB + 1 byte: %v, want ErrInvalid", err)
	}
}
