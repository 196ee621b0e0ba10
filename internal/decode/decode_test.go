package decode

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/testvectors"
)

func buildFrame(t *testing.T, p roce.Packet, payload []byte) []byte {
	t.Helper()
	buf := make([]byte, 9000)
	n, err := p.Build(buf, payload)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

func basePacket(op roce.Opcode) roce.Packet {
	return roce.Packet{
		SrcMAC: roce.MAC{2, 0, 0, 0, 0, 1}, DstMAC: roce.MAC{2, 0, 0, 0, 0, 2},
		Src: netip.MustParseAddr("10.55.0.1"), Dst: netip.MustParseAddr("10.55.0.2"),
		TTL: 64, DontFragment: true, SrcPort: 49593, DstPort: roce.UDPPort,
		BTH: roce.BTHFields{Opcode: op, PKey: roce.DefaultPKey, DestQP: 0x15, PSN: 100, AckReq: true},
	}
}

// TestText pins the text format of each kind of line.
func TestText(t *testing.T) {
	write := basePacket(roce.RCRDMAWriteOnlyWithImmediate)
	write.RETH = roce.RETHFields{VA: 0x56002d2f6000, RKey: 0x1234, DMALen: 2}
	write.Imm = 0x1001
	ack := basePacket(roce.RCAcknowledge)
	ack.BTH.AckReq = false
	ack.AETH = roce.AETHFields{Syndrome: 0x1F, MSN: 7}
	fadd := basePacket(roce.RCFetchAdd)
	fadd.AtomicETH = roce.AtomicETHFields{VA: 0x1000, RKey: 9, SwapAdd: 1}
	ud := basePacket(roce.UDSendOnly)
	ud.IPv6, ud.Src, ud.Dst = true, netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	ud.BTH.PKey = 0x7FFF
	ud.DETH = roce.DETHFields{QKey: 0x11111111, SrcQP: 0x11}
	nak := basePacket(roce.RCAcknowledge)
	nak.AETH = roce.AETHFields{Syndrome: 0x62, MSN: 3}

	bad := buildFrame(t, basePacket(roce.RCSendOnly), []byte("hi"))
	bad[len(bad)-1] ^= 0xFF
	var bp roce.Packet
	_ = roce.Parse(bad, &bp)
	want := bp.ComputeICRC(bad)

	tests := []struct {
		frame []byte
		want  string
	}{
		{buildFrame(t, write, []byte{1, 2}), "1 10.55.0.1:49593 > 10.55.0.2:4791 RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE qp=0x000015 psn=100 ackreq va=0x000056002d2f6000 rkey=0x00001234 dlen=2 imm=0x00001001 len=2 pad=2 icrc=ok"},
		{buildFrame(t, ack, nil), "1 10.55.0.1:49593 > 10.55.0.2:4791 RC_ACKNOWLEDGE qp=0x000015 psn=100 ACK(credits=31) msn=7 len=0 icrc=ok"},
		{buildFrame(t, nak, nil), "1 10.55.0.1:49593 > 10.55.0.2:4791 RC_ACKNOWLEDGE qp=0x000015 psn=100 ackreq NAK(REM_ACCESS_ERR) msn=3 len=0 icrc=ok"},
		{buildFrame(t, fadd, nil), "1 10.55.0.1:49593 > 10.55.0.2:4791 RC_FETCH_ADD qp=0x000015 psn=100 ackreq va=0x0000000000001000 rkey=0x00000009 add=0x0000000000000001 len=0 icrc=ok"},
		{buildFrame(t, ud, make([]byte, 64)), "1 [fd00::1]:49593 > [fd00::2]:4791 UD_SEND_ONLY qp=0x000015 psn=100 ackreq pkey=0x7fff qkey=0x11111111 srcqp=0x000011 len=64 icrc=ok"},
		{bad, "1 10.55.0.1:49593 > 10.55.0.2:4791 RC_SEND_ONLY qp=0x000015 psn=100 ackreq len=2 pad=2 icrc=BAD(want 0x" + hex32(want) + " got 0x" + hex32(bp.ICRC) + ")"},
		{bad[:40], "1 error: roce: frame truncated"},
		{[]byte{1, 2, 3}, "1 skipped: runt frame"},
		{bad[:30], "1 skipped: IP header cut short"},
		{append(make([]byte, 12), 0x08, 0x06), "1 skipped: ARP"},
	}
	for _, tt := range tests {
		r := Decode(1, time.Time{}, tt.frame)
		if got := r.Text(); got != tt.want {
			t.Errorf("\n got %s\nwant %s", got, tt.want)
		}
	}
}

func hex32(v uint32) string {
	const d = "0123456789abcdef"
	var b [8]byte
	for i := 7; i >= 0; i-- {
		b[i] = d[v&0xF]
		v >>= 4
	}
	return string(b[:])
}

// writeCapture writes frames into a pcap in a temporary directory.
func writeCapture(t *testing.T, frames ...[]byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.pcap")
	w, err := capture.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range frames {
		if err := w.WriteFrame(time.Unix(1700000000, int64(i)), f); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestFileJSON decodes a capture as JSON: one valid object per frame, with
// the bad frame counted.
func TestFileJSON(t *testing.T) {
	good := buildFrame(t, basePacket(roce.RCSendOnly), []byte("hello"))
	bad := append([]byte(nil), good...)
	bad[60] ^= 1
	path := writeCapture(t, good, bad, append(make([]byte, 12), 0x08, 0x06))
	var out bytes.Buffer
	st, err := File(&out, path, Options{JSON: true, WithFile: true})
	if err != nil {
		t.Fatal(err)
	}
	if st != (Stats{Files: 1, Frames: 3, RoCE: 2, Skipped: 1, Bad: 1}) {
		t.Fatalf("stats %+v", st)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), out.String())
	}
	var recs []map[string]any
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		recs = append(recs, m)
	}
	if recs[0]["icrc"] != "ok" || recs[0]["opcode"] != "RC_SEND_ONLY" || recs[0]["payload_len"] != 5.0 || recs[0]["file"] != path {
		t.Errorf("frame 1: %v", recs[0])
	}
	if recs[1]["icrc"] != "bad" || recs[1]["icrc_want"] == recs[1]["icrc_got"] {
		t.Errorf("frame 2: %v", recs[1])
	}
	if recs[2]["skipped"] != "ARP" {
		t.Errorf("frame 3: %v", recs[2])
	}
}

// TestFileErrors: a missing file, a directory, a file that is not a
// capture, an empty one, one cut inside its header or inside a record are
// errors that say what is wrong with the file in a few words, counted as
// read (Stats.Files) only when they were captures.
func TestFileErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	data, err := os.ReadFile(writeCapture(t, buildFrame(t, basePacket(roce.RCSendOnly), make([]byte, 100)),
		buildFrame(t, basePacket(roce.RCSendOnly), make([]byte, 100))))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, problem string
		files, frames int
	}{
		{filepath.Join(dir, "missing.pcap"), "no such file or directory", 0, 0},
		{dir, "is a directory", 0, 0},
		{write("junk.txt", []byte("this is not a capture at all")), "not a pcap or pcapng file", 0, 0},
		{write("empty.pcap", nil), "not a pcap or pcapng file", 0, 0},
		{write("head.pcap", data[:10]), "the file ends inside its header", 0, 0},
		{write("cut.pcap", data[:len(data)-20]), "the file ends inside frame 2", 1, 1},
	} {
		st, err := File(&bytes.Buffer{}, c.path, Options{})
		if want := c.path + ": " + c.problem; err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", c.path, err, want)
		}
		if fe := (*FileError)(nil); !errors.As(err, &fe) || fe.Problem != c.problem {
			t.Errorf("%s: %#v, want a *FileError", c.path, err)
		}
		if st.Files != c.files || st.Frames != c.frames {
			t.Errorf("%s: %+v, want %d files and %d frames", c.path, st, c.files, c.frames)
		}
	}
}

// TestVectors decodes every rxe capture: no bad frame, and every frame on
// UDP port 4791 decoded as RoCE.
func TestVectors(t *testing.T) {
	for _, f := range testvectors.Files(t) {
		var out bytes.Buffer
		st, err := File(&out, f.Path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if st.Bad != 0 || st.Frames != len(f.Frames) {
			t.Errorf("%s: %+v", f.Name, st)
		}
		if strings.Contains(out.String(), ":4791 skipped") || strings.Contains(out.String(), "icrc=BAD") {
			t.Errorf("%s: RoCE frame skipped or bad:\n%s", f.Name, out.String())
		}
	}
}

// FuzzDecode: any frame decodes and formats without panicking, and a frame
// is exactly one of skipped, error or RoCE.
func FuzzDecode(f *testing.F) {
	for _, fr := range testvectors.Frames() {
		f.Add(fr)
	}
	f.Add([]byte{})
	f.Add(append(make([]byte, 12), 0x08, 0x00, 0x45))
	f.Fuzz(func(t *testing.T, frame []byte) {
		r := Decode(1, time.Time{}, frame)
		kinds := 0
		for _, set := range []bool{r.Skipped != "", r.Error != "", r.Opcode != ""} {
			if set {
				kinds++
			}
		}
		if kinds != 1 {
			t.Fatalf("record is %d kinds at once: %+v", kinds, r)
		}
		if r.Text() == "" {
			t.Fatal("empty line")
		}
	})
}
