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
	"github.com/taproce/taproce/appliance/cm"
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

// cmLines are the text lines of the rxe captures' CM MADs, checked against
// Wireshark's dissection and the data packets in appliance/cm's tests.
var cmLines = map[string][]string{
	"rxe-cm-rping.pcap": {
		"1 10.99.0.2:55410 > 10.99.0.3:4791 CM REQ tid=0x00000002106c28e6 lcid=0xe6286c10 sid=0x0000000001061c06(TCP:7174) qpn=0x00001f start_psn=1461740 RC mtu=1024 resp_res=1 init_depth=1 cm_timeout=20/20 retry=7 rnr_retry=7 max_cm_retries=15 gid=10.99.0.2>10.99.0.3 flow_label=0x1b190 hop_limit=64 tclass=0 ack_timeout=19 guid=0x505400fffe630002 cma=10.99.0.2:37174>10.99.0.3:7174 icrc=ok",
		"2 10.99.0.3:55410 > 10.99.0.2:4791 CM REP tid=0x00000002106c28e6 lcid=0xc2ebc219 rcid=0xe6286c10 qpn=0x00001f start_psn=15659431 resp_res=1 init_depth=1 ack_delay=15 rnr_retry=7 guid=0x505400fffe630003 icrc=ok",
		"3 10.99.0.2:55410 > 10.99.0.3:4791 CM RTU tid=0x00000002106c28e6 lcid=0xe6286c10 rcid=0xc2ebc219 icrc=ok",
		"40 10.99.0.2:55410 > 10.99.0.3:4791 CM DREQ tid=0x00000002106c28e6 lcid=0xe6286c10 rcid=0xc2ebc219 qpn=0x00001f icrc=ok",
		"41 10.99.0.3:55410 > 10.99.0.2:4791 CM DREP tid=0x00000002106c28e6 lcid=0xc2ebc219 rcid=0xe6286c10 icrc=ok",
	},
	"rxe-cm-udaddy.pcap": {
		"1 10.99.0.2:55410 > 10.99.0.3:4791 CM SIDR_REQ tid=0x00000002106c28e7 req_id=0xe7286c10 sid=0x0000000001111c06(UDP:7174) cma=10.99.0.2:39759>10.99.0.3:7174 icrc=ok",
		"2 10.99.0.3:55410 > 10.99.0.2:4791 CM SIDR_REP tid=0x00000002106c28e7 req_id=0xe7286c10 status=SUCCESS qpn=0x000020 qkey=0x01234567 sid=0x0000000001111c06(UDP:7174) icrc=ok",
	},
	"rxe-cm-write-bw.pcap": {
		"1 10.99.0.2:55410 > 10.99.0.3:4791 CM REQ tid=0x00000002106c28e4 lcid=0xe4286c10 sid=0x0000000001064853(TCP:18515) qpn=0x00001d start_psn=11365037 RC mtu=1024 resp_res=0 init_depth=0 cm_timeout=20/20 retry=7 rnr_retry=7 max_cm_retries=15 gid=10.99.0.2>10.99.0.3 flow_label=0x1a01b hop_limit=64 tclass=0 ack_timeout=19 guid=0x505400fffe630002 cma=10.99.0.2:36664>10.99.0.3:18515 icrc=ok",
		"2 10.99.0.3:55410 > 10.99.0.2:4791 CM REP tid=0x00000002106c28e4 lcid=0xc6ebc219 rcid=0xe4286c10 qpn=0x00001d start_psn=12413049 resp_res=0 init_depth=0 ack_delay=15 rnr_retry=7 guid=0x505400fffe630003 icrc=ok",
		"3 10.99.0.2:55410 > 10.99.0.3:4791 CM RTU tid=0x00000002106c28e4 lcid=0xe4286c10 rcid=0xc6ebc219 icrc=ok",
		"24 10.99.0.2:55410 > 10.99.0.3:4791 CM REQ tid=0x00000002106c28e5 lcid=0xe5286c10 sid=0x0000000001064853(TCP:18515) qpn=0x00001e start_psn=9188929 RC mtu=1024 resp_res=0 init_depth=0 cm_timeout=20/20 retry=7 rnr_retry=7 max_cm_retries=15 gid=10.99.0.2>10.99.0.3 flow_label=0x9daa7 hop_limit=64 tclass=0 ack_timeout=19 guid=0x505400fffe630002 cma=10.99.0.2:54060>10.99.0.3:18515 icrc=ok",
		"25 10.99.0.3:55410 > 10.99.0.2:4791 CM REP tid=0x00000002106c28e5 lcid=0xc4ebc219 rcid=0xe5286c10 qpn=0x00001e start_psn=1739536 resp_res=0 init_depth=0 ack_delay=15 rnr_retry=7 guid=0x505400fffe630003 icrc=ok",
		"26 10.99.0.2:55410 > 10.99.0.3:4791 CM RTU tid=0x00000002106c28e5 lcid=0xe5286c10 rcid=0xc4ebc219 icrc=ok",
		"81 10.99.0.2:55410 > 10.99.0.3:4791 CM DREQ tid=0x00000002106c28e5 lcid=0xe5286c10 rcid=0xc4ebc219 qpn=0x00001e icrc=ok",
		"82 10.99.0.3:55410 > 10.99.0.2:4791 CM DREQ tid=0x0000000219c2ebc4 lcid=0xc4ebc219 rcid=0xe5286c10 qpn=0x00001e icrc=ok",
		"83 10.99.0.3:55410 > 10.99.0.2:4791 CM DREP tid=0x00000002106c28e5 lcid=0xc4ebc219 rcid=0xe5286c10 icrc=ok",
		"84 10.99.0.3:55410 > 10.99.0.2:4791 CM DREQ tid=0x0000000219c2ebc6 lcid=0xc6ebc219 rcid=0xe4286c10 qpn=0x00001d icrc=ok",
		"85 10.99.0.2:55410 > 10.99.0.3:4791 CM DREP tid=0x0000000219c2ebc6 lcid=0xe4286c10 rcid=0xc6ebc219 icrc=ok",
	},
}

// TestCMVectors decodes the rxe captures of the RDMA CM: every CM MAD is
// a CM line with its fields, every other frame the usual line.
func TestCMVectors(t *testing.T) {
	seen := 0
	for _, f := range testvectors.Files(t) {
		want, ok := cmLines[f.Name]
		if !ok {
			continue
		}
		seen++
		var out bytes.Buffer
		if _, err := File(&out, f.Path, Options{}); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			if strings.Contains(l, " CM ") {
				got = append(got, l)
			} else if strings.Contains(l, "qp=0x000001 ") || strings.Contains(l, "mad_error") {
				t.Errorf("%s: a MAD not decoded as CM: %s", f.Name, l)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: %d CM lines, want %d:\n%s", f.Name, len(got), len(want), strings.Join(got, "\n"))
			continue
		}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("%s:\n got %s\nwant %s", f.Name, got[i], want[i])
			}
		}
	}
	if seen != len(cmLines) {
		t.Errorf("found %d of the %d CM captures", seen, len(cmLines))
	}
}

// gsiFrame builds a UD SEND to QP1 carrying the MAD of m, changed by edit
// if it is not nil.
func gsiFrame(t *testing.T, m *cm.Message, edit ...func(mad []byte)) []byte {
	t.Helper()
	mad := make([]byte, cm.MADLen)
	if _, err := m.Encode(mad); err != nil {
		t.Fatal(err)
	}
	for _, e := range edit {
		e(mad)
	}
	p := basePacket(roce.UDSendOnly)
	p.BTH.DestQP = cm.GSIQPN
	p.DETH = roce.DETHFields{QKey: cm.GSIQKey, SrcQP: cm.GSIQPN}
	return buildFrame(t, p, mad)
}

// TestCMText pins the CM lines of messages the captures lack (REJ, MRA),
// a MAD that is not a CM one, and the JSON record of a REQ.
func TestCMText(t *testing.T) {
	// As Linux rejects a REQ: its TID, its comm ID as the remote one, 0
	// as the local one (cm_issue_rej when no one listens; cm_format_rej
	// for rdma_reject before an MRA); after an MRA the local ID is the
	// rejecting side's own.
	rej := cm.Message{Header: cm.NewHeader(cm.AttrREJ, 0x2106c28e6)}
	rej.REJ = cm.REJFields{RemoteCommID: 0xe6286c10, MessageRejected: cm.MessageREQ, Reason: cm.RejInvalidServiceID}
	consumer := rej
	consumer.REJ.LocalCommID, consumer.REJ.Reason = 0xc2ebc219, cm.RejConsumerDefined
	mra := cm.Message{Header: cm.NewHeader(cm.AttrMRA, 7)}
	mra.MRA = cm.MRAFields{LocalCommID: 1, RemoteCommID: 2, MessageMRAed: cm.MessageREQ, ServiceTimeout: 24}
	req := cm.Message{Header: cm.NewHeader(cm.AttrREQ, 9)}
	req.REQ = cm.REQFields{LocalCommID: 0x11, ServiceID: cm.RDMAServiceID(cm.PortSpaceTCP, 7471), LocalQPN: 0x123, StartingPSN: 99,
		PathMTU: 5, PKey: 0xffff, TransportServiceType: cm.TransportUC}
	h := cm.CMAHeader{Src: netip.MustParseAddrPort("[fd00::1]:40000"), Dst: netip.MustParseAddr("fd00::2")}
	if err := h.Encode(req.REQ.PrivateData[:]); err != nil {
		t.Fatal(err)
	}
	v1 := gsiFrame(t, &mra, func(mad []byte) { mad[2] = 1 }) // the class version

	for _, c := range []struct {
		frame []byte
		want  string
	}{
		{gsiFrame(t, &rej), "1 10.55.0.1:49593 > 10.55.0.2:4791 CM REJ tid=0x00000002106c28e6 lcid=0x00000000 rcid=0xe6286c10 rejected=REQ reason=INVALID_SERVICE_ID(8) icrc=ok"},
		{gsiFrame(t, &consumer), "1 10.55.0.1:49593 > 10.55.0.2:4791 CM REJ tid=0x00000002106c28e6 lcid=0xc2ebc219 rcid=0xe6286c10 rejected=REQ reason=CONSUMER_DEFINED(28) icrc=ok"},
		{gsiFrame(t, &mra), "1 10.55.0.1:49593 > 10.55.0.2:4791 CM MRA tid=0x0000000000000007 lcid=0x00000001 rcid=0x00000002 mraed=REQ service_timeout=24 icrc=ok"},
		{gsiFrame(t, &req), "1 10.55.0.1:49593 > 10.55.0.2:4791 CM REQ tid=0x0000000000000009 lcid=0x00000011 sid=0x0000000001061d2f(TCP:7471) qpn=0x000123 start_psn=99 UC mtu=4096 resp_res=0 init_depth=0 cm_timeout=0/0 retry=0 rnr_retry=0 max_cm_retries=0 gid=::>:: flow_label=0x00000 hop_limit=0 tclass=0 ack_timeout=0 guid=0x0000000000000000 cma=[fd00::1]:40000>[fd00::2]:7471 icrc=ok"},
	} {
		r := Decode(1, time.Time{}, c.frame)
		if got := r.Text(); got != c.want {
			t.Errorf("\n got %s\nwant %s", got, c.want)
		}
	}

	// A MAD of the wrong class version: the UD SEND line, saying why.
	r := Decode(1, time.Time{}, v1)
	want := "1 10.55.0.1:49593 > 10.55.0.2:4791 UD_SEND_ONLY qp=0x000001 psn=100 ackreq qkey=0x80010000 srcqp=0x000001 len=256 mad_error=\"cm: unsupported CM class version 1\" icrc=ok"
	if got := r.Text(); got != want || r.Bad() {
		t.Errorf("\n got %s\nwant %s (bad %v)", got, want, r.Bad())
	}

	var out bytes.Buffer
	if _, err := File(&out, writeCapture(t, gsiFrame(t, &req), gsiFrame(t, &rej)), Options{JSON: true}); err != nil {
		t.Fatal(err)
	}
	var recs []Record
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var rec Record
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
	}
	c := recs[0].CM
	if c == nil || c.Attr != "REQ" || c.Method != "Send" || *c.LocalCommID != 0x11 || *c.ServiceID != 0x0000000001061d2f ||
		c.PortSpace != "TCP" || *c.Port != 7471 || *c.QPN != 0x123 || *c.StartingPSN != 99 ||
		c.CMASrc != "[fd00::1]:40000" || c.CMADst != "[fd00::2]:7471" || recs[0].Opcode != "UD_SEND_ONLY" {
		t.Errorf("REQ record %+v", c)
	}
	if c := recs[1].CM; c == nil || c.Reason != "INVALID_SERVICE_ID" || *c.ReasonNum != 8 || *c.RemoteCommID != 0xe6286c10 {
		t.Errorf("REJ record %+v", c)
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
