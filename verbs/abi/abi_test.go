package abi

import (
	"errors"
	"syscall"
	"testing"
)

// TestRoundTrip: every request and reply structure survives encoding, and
// the header checks catch each kind of damage.
func TestRoundTrip(t *testing.T) {
	bodies := []any{
		&ListDevicesReply{Count: 1}, &OpenRequest{Name: MakeName("taproce0")}, &OpenReply{},
		&QueryPortReply{}, &HandleRequest{Handle: 7}, &ErrnoReply{Errno: 22}, &HandleReply{Handle: 3},
		&RegMRRequest{PD: 1, Access: 7, Addr: 0x7f0000, Length: 4096, Size: 8192}, &RegMRReply{LKey: 1, RKey: 2},
		&CreateCQRequest{Depth: 64}, &CreateCQReply{Depth: 64}, &CreateQPRequest{Type: 2, Caps: QPCaps{MaxSendWR: 8}},
		&CreateQPReply{QPN: 17}, &ModifyQPRequest{Mask: 1, Attr: QPAttr{State: 1, DGID: [16]byte{1}}},
		&QueryQPReply{}, &CreateSRQRequest{MaxWR: 4}, &CreateSRQReply{}, &ModifySRQRequest{Limit: 2},
		&CreateAHRequest{DGID: [16]byte{0xfe, 0x80}}, &Event{Type: EventQPFatal, Handle: 9},
	}
	for i, b := range bodies {
		msg, err := Encode(nil, Header{Op: OpCreateQP, Seq: uint32(i)}, b)
		if err != nil {
			t.Fatalf("%T: %v", b, err)
		}
		if len(msg) > MaxMessage {
			t.Fatalf("%T: %d bytes, more than MaxMessage", b, len(msg))
		}
		h, body, err := DecodeHeader(msg)
		if err != nil || h.Seq != uint32(i) || h.Op != OpCreateQP {
			t.Fatalf("%T: header %+v, %v", b, h, err)
		}
		if err := DecodeBody(body, b); err != nil {
			t.Fatalf("%T: %v", b, err)
		}
		if err := DecodeBody(body[:len(body)-1], b); !errors.Is(err, ErrLength) {
			t.Fatalf("%T short body: %v", b, err)
		}
	}
	good, _ := Encode(nil, Header{Op: OpAllocPD}, nil)
	for _, c := range []struct {
		name string
		edit func([]byte) []byte
		want error
	}{
		{"short", func(b []byte) []byte { return b[:10] }, ErrShort},
		{"magic", func(b []byte) []byte { b[0] ^= 1; return b }, ErrMagic},
		{"version", func(b []byte) []byte { b[2] = 9; return b }, ErrVersion},
		{"op zero", func(b []byte) []byte { b[4], b[5] = 0, 0; return b }, ErrOp},
		{"op beyond", func(b []byte) []byte { b[4] = byte(opMax); return b }, ErrOp},
		{"length", func(b []byte) []byte { return append(b, 0) }, ErrLength},
	} {
		msg := c.edit(append([]byte(nil), good...))
		if _, _, err := DecodeHeader(msg); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if ErrnoOf(syscall.ENOMEM) != Errno(syscall.ENOMEM) || ErrnoOf(errors.New("x")) != Errno(syscall.EINVAL) || Errno(0).Err() != nil {
		t.Fatal("errno mapping")
	}
}

// TestSlots: WQEs and CQEs round-trip through their slots, and garbage
// counts in a slot are clamped.
func TestSlots(t *testing.T) {
	slot := make([]byte, SendSlot)
	w := SendWQE{WRID: 9, Opcode: 4, NumSGE: 2, Flags: 3, Imm: 5, RKey: 6, RemoteAddr: 7, CompareAdd: 8, Swap: 10,
		AH: 11, RemoteQPN: 12, RemoteQKey: 13, Inline: []byte("inline")}
	w.SGL[0], w.SGL[1] = SGE{1, 2, 3}, SGE{4, 5, 6}
	w.Put(slot)
	var g SendWQE
	g.Get(slot)
	if g.WRID != 9 || g.SGL[1] != w.SGL[1] || string(g.Inline) != "inline" || g.RemoteQKey != 13 || g.Swap != 10 {
		t.Fatalf("send WQE %+v", g)
	}
	slot[9], slot[60], slot[61] = 200, 0xff, 0xff
	g.Get(slot)
	if g.NumSGE != MaxSGE || len(g.Inline) != MaxInline {
		t.Fatalf("clamping: %d SGEs, %d inline", g.NumSGE, len(g.Inline))
	}
	r := RecvWQE{WRID: 1, NumSGE: 1}
	r.SGL[0] = SGE{1, 2, 3}
	rs := make([]byte, RecvSlot)
	r.Put(rs)
	var rg RecvWQE
	rg.Get(rs)
	if rg != r {
		t.Fatalf("recv WQE %+v", rg)
	}
	c := CQE{WRID: 1, Status: 5, Opcode: 128, ByteLen: 3, Imm: 4, QPNum: 5, SrcQP: 6, Flags: 2, PKeyIndex: 1, SLID: 2}
	cs := make([]byte, CQESlot)
	c.Put(cs)
	var cg CQE
	cg.Get(cs)
	if cg != c {
		t.Fatalf("CQE %+v", cg)
	}
}

// FuzzDecode: arbitrary bytes never panic the decoders.
func FuzzDecode(f *testing.F) {
	m, _ := Encode(nil, Header{Op: OpModifyQP}, &ModifyQPRequest{Handle: 1})
	f.Add(m)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, body, err := DecodeHeader(b)
		if err != nil {
			return
		}
		for _, v := range []any{&ModifyQPRequest{}, &RegMRRequest{}, &CreateQPRequest{}, &OpenRequest{}, &Event{}} {
			_ = DecodeBody(body, v)
		}
		_ = h.Op.String()
	})
}
