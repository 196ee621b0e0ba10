package perf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/internal/testvectors"
)

// oobMsg is one write of perftest's out-of-band exchange in a capture.
type oobMsg struct {
	fromClient bool
	data       []byte
}

// oobSessions returns the out-of-band TCP connections (port 18515) of a
// capture of the shared vectors, each as the payloads of its segments in
// capture order (perftest writes each message with one write, which the
// captures show as one segment).
func oobSessions(t *testing.T, name string) [][]oobMsg {
	t.Helper()
	frames, err := capture.ReadFile(filepath.Join(testvectors.Dir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	var order []uint16
	byPort := map[uint16][]oobMsg{}
	for _, f := range frames {
		d := f.Data
		if len(d) < 14+20 || binary.BigEndian.Uint16(d[12:]) != 0x0800 || d[23] != 6 {
			continue
		}
		ihl := int(d[14]&15) * 4
		tot := int(binary.BigEndian.Uint16(d[16:]))
		tcp := d[14+ihl : 14+tot]
		sp, dp := binary.BigEndian.Uint16(tcp), binary.BigEndian.Uint16(tcp[2:])
		payload := tcp[int(tcp[12]>>4)*4:]
		if len(payload) == 0 || sp != DefaultPort && dp != DefaultPort {
			continue
		}
		client := dp == DefaultPort
		cport := sp
		if !client {
			cport = dp
		}
		if _, ok := byPort[cport]; !ok {
			order = append(order, cport)
		}
		byPort[cport] = append(byPort[cport], oobMsg{fromClient: client, data: bytes.Clone(payload)})
	}
	var out [][]oobMsg
	for _, p := range order {
		out = append(out, byPort[p])
	}
	return out
}

// TestDestGolden: every key message rxe's perftest sent in the captures
// parses, and formats back to the same 108 bytes.
func TestDestGolden(t *testing.T) {
	n := 0
	for _, name := range []string{"rxe-write-bw.pcap", "rxe-read.pcap", "rxe-send.pcap", "rxe-atomic.pcap", "rxe-send-lat.pcap", "rxe-write-lat.pcap"} {
		for _, s := range oobSessions(t, name) {
			for _, m := range s {
				if len(m.data) != keyMsgSizeGID {
					continue
				}
				d, err := ParseDest(m.data, true)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if got := d.Marshal(true); !bytes.Equal(got, m.data) {
					t.Errorf("%s: %q formats back as %q", name, m.data, got)
				}
				if d.LID != 0 || d.GID[10] != 0xff || d.GID[11] != 0xff || d.GID[12] != 10 || d.GID[13] != 99 {
					t.Errorf("%s: %q parses as %+v", name, m.data, d)
				}
				n++
			}
		}
	}
	if n < 50 {
		t.Fatalf("only %d key messages in the captures", n)
	}
	// One parsed by hand.
	d, err := ParseDest([]byte("0000:0080:000018:db9806:000009f9:000055ff281fd000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:63:00:02:00000000:\x00"), true)
	want := Dest{OutReads: 0x80, QPN: 0x18, PSN: 0xdb9806, RKey: 0x9f9, VAddr: 0x55ff281fd000,
		GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 99, 15: 2}}
	if err != nil || d != want {
		t.Fatalf("got %+v, %v; want %+v", d, err, want)
	}
	// Without a GID: KEY_PRINT_FMT in 59 bytes.
	m := want.Marshal(false)
	if string(m) != "0000:0080:000018:db9806:000009f9:000055ff281fd000:00000000\x00" {
		t.Fatalf("%q", m)
	}
	if d, err := ParseDest(m, false); err != nil || d.QPN != 0x18 || d.VAddr != want.VAddr {
		t.Fatalf("%+v %v", d, err)
	}
	for _, bad := range []string{"", "0000:0001", "zz00:0080:000018:db9806:000009f9:000055ff281fd000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:63:00:02:00000000:"} {
		if _, err := ParseDest([]byte(bad), true); !errors.Is(err, ErrProtocol) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// fakeDriver stands in for the RDMA side in the replays.
type fakeDriver struct {
	rem      []Dest
	report   *BWResult // what a bandwidth client's run returns
	runs     []int
	prepared []int
	test     Test
}

func (f *fakeDriver) connect(rem []Dest) error { f.rem = append([]Dest(nil), rem...); return nil }
func (f *fakeDriver) prepare(size int) error   { f.prepared = append(f.prepared, size); return nil }
func (f *fakeDriver) run(size int) (*Result, error) {
	f.runs = append(f.runs, size)
	r := &Result{Test: f.test.String(), Size: size, Iters: 5}
	if f.test.Kind == BW {
		r.BW = &BWResult{Unit: "MB/sec", Avg: 1}
		if f.report != nil {
			r.BW = f.report
		}
	} else {
		r.Lat = &LatResult{Min: 1, Max: 2, Typical: 1, Avg: 1}
	}
	return r, nil
}

// replayCase is a capture of perftest runs (-n 5) of one test.
type replayCase struct {
	file   string
	test   Test
	atomic []AtomicType // per session, for atomic tests
	sizes  []int        // per session
}

// TestExchangeGolden replays the out-of-band side of rxe's perftest runs
// in the captures against this package's exchange, in both roles: the
// peer's messages are played back in capture order, and every message
// this side writes must be the captured one byte for byte (given the
// captured side's keys), except the server's reports of write_bw, read_bw
// and atomic_bw, which perftest sends uninitialised.
func TestExchangeGolden(t *testing.T) {
	cases := []replayCase{
		{"rxe-write-bw.pcap", Test{Write, BW}, nil, []int{64, 2500}},
		{"rxe-read.pcap", Test{Read, BW}, nil, []int{64, 2500}},
		{"rxe-send.pcap", Test{Send, BW}, nil, []int{64, 2500}},
		{"rxe-atomic.pcap", Test{Atomic, BW}, []AtomicType{CmpAndSwap, FetchAndAdd}, []int{8, 8}},
		{"rxe-send-lat.pcap", Test{Send, Lat}, nil, []int{2, 2500}},
		{"rxe-write-lat.pcap", Test{Write, Lat}, nil, []int{2}},
	}
	for _, c := range cases {
		sessions := oobSessions(t, c.file)
		if len(sessions) != len(c.sizes) {
			t.Fatalf("%s: %d sessions, want %d", c.file, len(sessions), len(c.sizes))
		}
		for i, s := range sessions {
			for _, client := range []bool{true, false} {
				role := map[bool]string{true: "client", false: "server"}[client]
				t.Run(fmt.Sprintf("%s/%d/%s", c.file, c.sizes[i], role), func(t *testing.T) {
					cfg := Config{Test: c.test, Size: c.sizes[i], Iters: 5, GIDIndex: 1, Inline: -1, Margin: -1, Atomic: FetchAndAdd}
					if c.atomic != nil {
						cfg.Atomic = c.atomic[i]
						cfg.Size = 0
					}
					if client {
						cfg.Server = "peer"
					}
					replaySession(t, cfg, s)
				})
			}
		}
	}
}

func replaySession(t *testing.T, cfg Config, msgs []oobMsg) {
	p, err := resolve(cfg)
	if err != nil {
		t.Fatal(err)
	}
	client := !cfg.IsServer()
	var my, peer *Dest
	var report []byte // the client's captured report (5 × 8 bytes)
	for _, m := range msgs {
		if len(m.data) == keyMsgSizeGID {
			d, err := ParseDest(m.data, true)
			if err != nil {
				t.Fatal(err)
			}
			if m.fromClient == client && my == nil {
				my = &d
			} else if m.fromClient != client && peer == nil {
				peer = &d
			}
		}
		if len(m.data) == 8 && m.fromClient {
			report = append(report, m.data...)
		}
	}
	if my == nil || peer == nil {
		t.Fatal("no keys in the capture")
	}
	drv := &fakeDriver{test: cfg.Test}
	if len(report) == 40 {
		f := func(i int) float64 { return math.Float64frombits(binary.BigEndian.Uint64(report[8*i:])) }
		drv.report = &BWResult{Unit: "MB/sec", Peak: f(2), Avg: f(3), MsgRate: f(4)}
	}

	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type outcome struct {
		mismatches []string
		err        error
	}
	done := make(chan outcome, 1)
	go func() {
		var o outcome
		defer func() { done <- o }()
		var c net.Conn
		if client {
			c, o.err = ln.Accept()
		} else {
			c, o.err = net.Dial("tcp4", ln.Addr().String())
		}
		if o.err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		for i, m := range msgs {
			if m.fromClient != client {
				if _, o.err = c.Write(m.data); o.err != nil {
					return
				}
				continue
			}
			got := make([]byte, len(m.data))
			if _, o.err = io.ReadFull(c, got); o.err != nil {
				o.err = fmt.Errorf("message %d (%q): %w", i, m.data, o.err)
				return
			}
			// The server's reports of write_bw etc. are perftest's
			// uninitialised memory.
			anyContent := !client && len(m.data) == 8 && cfg.Test.Kind == BW && cfg.Test.Verb != Send
			if !anyContent && !bytes.Equal(got, m.data) {
				o.mismatches = append(o.mismatches, fmt.Sprintf("message %d: wrote %q, perftest %q", i, got, m.data))
			}
		}
		// Then this side closes the connection.
		if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
			o.err = fmt.Errorf("after the last message: %d bytes, %v; want the connection closed", n, err)
		}
	}()
	var conn net.Conn
	if client {
		conn, err = net.Dial("tcp4", ln.Addr().String())
	} else {
		conn, err = ln.Accept()
	}
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	o := newOOB(conn, client, 10*time.Second)
	_, _, mtu, err := o.setup(4096, 64, 3)
	if err != nil {
		t.Fatal(err)
	}
	if mtu != 3 || o.remVersion != "6.06" {
		t.Errorf("MTU %d, peer version %q", mtu, o.remVersion)
	}
	var out bytes.Buffer
	results, err := exchange(o, p, []Dest{*my}, drv, &printer{w: &out})
	if err != nil {
		t.Fatalf("exchange: %v\n%s", err, out.String())
	}
	oc := <-done
	if oc.err != nil {
		t.Error(oc.err)
	}
	for _, m := range oc.mismatches {
		t.Error(m)
	}
	if len(drv.rem) != 1 || drv.rem[0] != *peer {
		t.Errorf("connected to %+v, want %+v", drv.rem, *peer)
	}
	// What ran where.
	t2 := cfg.Test
	wantRuns := 1
	switch {
	case t2.Kind == BW && t2.Verb != Send && !client:
		wantRuns = 0 // the server of write_bw etc. only waits
		if len(results) != 1 || !results[0].Remote || results[0].Size != cfg.Size && t2.Verb != Atomic || results[0].Iters != 5 {
			t.Errorf("server results %+v", results)
		}
		if drv.report == nil || *results[0].BW != *drv.report {
			t.Errorf("server printed %+v, the client reported %+v", results[0].BW, drv.report)
		}
	case t2.Verb == Send && (t2.Kind == Lat || !client):
		if len(drv.prepared) != 1 {
			t.Errorf("receives posted for %v", drv.prepared)
		}
	}
	if len(drv.runs) != wantRuns {
		t.Errorf("ran %v, want %d runs", drv.runs, wantRuns)
	}
	if !bytes.Contains(out.Bytes(), []byte(" remote address: LID 0000 QPN "+cHex(uint64(peer.QPN), 6))) {
		t.Errorf("output lacks the peer's address:\n%s", out.String())
	}
}

// TestVersionTooOld: a peer older than 5.70 is refused, as
// check_version_compatibility refuses it.
func TestVersionTooOld(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		buf := make([]byte, versionSize)
		io.ReadFull(b, buf)
		old := make([]byte, versionSize)
		copy(old, "5.60")
		b.Write(old)
	}()
	o := newOOB(a, true, time.Second)
	if err := o.exchangeVersions(); !errors.Is(err, ErrProtocol) {
		t.Fatalf("%v", err)
	}
	for s, v := range map[string]float64{"6.06": 6.06, "5.70": 5.7, "26.04.17": 26.04, "": 0, "x": 0} {
		if got := versionNumber(s); got != v {
			t.Errorf("versionNumber(%q) = %v, want %v", s, got, v)
		}
	}
}

// TestMTUExchange: both sides take the smaller MTU; an invalid one from
// the peer is ignored.
func TestMTUExchange(t *testing.T) {
	for _, c := range []struct {
		mine int
		peer string
		want int
	}{{5, "3\x00", 3}, {3, "5\x00", 3}, {4, "9\x00", 4}, {4, "x\x00", 4}, {2, "2\x00", 2}} {
		a, b := net.Pipe()
		go func() {
			buf := make([]byte, mtuMsgSize)
			io.ReadFull(b, buf)
			b.Write([]byte(c.peer))
		}()
		o := newOOB(a, true, time.Second)
		got, err := o.mtu(c.mine)
		a.Close()
		b.Close()
		if err != nil || got != c.want {
			t.Errorf("mine %d, peer %q: %d, %v; want %d", c.mine, c.peer, got, err, c.want)
		}
	}
}
