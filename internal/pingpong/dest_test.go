package pingpong

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/internal/testvectors"
)

// handshake is one out-of-band exchange of a capture: the client's
// address, the server's, and the client's closing message.
type handshake struct {
	client, server, done []byte
}

// tcpPayloads returns the TCP payloads to and from port, in capture order,
// with the direction (true: to port).
func tcpPayloads(t *testing.T, frames []capture.Frame, port uint16) (payloads [][]byte, toPort []bool) {
	t.Helper()
	for _, f := range frames {
		d := f.Data
		if len(d) < 14+20 || binary.BigEndian.Uint16(d[12:]) != 0x0800 || d[14+9] != 6 {
			continue
		}
		ihl := int(d[14]&0xf) * 4
		ipLen := int(binary.BigEndian.Uint16(d[16:]))
		if len(d) < 14+ipLen || ipLen < ihl+20 {
			t.Fatalf("short IPv4 packet of %d bytes", len(d))
		}
		tcp := d[14+ihl : 14+ipLen]
		src, dst := binary.BigEndian.Uint16(tcp), binary.BigEndian.Uint16(tcp[2:])
		off := int(tcp[12]>>4) * 4
		if off > len(tcp) || (src != port && dst != port) || len(tcp) == off {
			continue
		}
		payloads = append(payloads, append([]byte(nil), tcp[off:]...))
		toPort = append(toPort, dst == port)
	}
	return payloads, toPort
}

// handshakes reads the pingpong exchanges of a capture of the rxe tools.
func handshakes(t *testing.T, name string) []handshake {
	t.Helper()
	frames, err := capture.ReadFile(filepath.Join(testvectors.Dir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	p, to := tcpPayloads(t, frames, DefaultPort)
	if len(p) == 0 || len(p)%3 != 0 {
		t.Fatalf("%s: %d TCP payloads on port %d, want client, server, done for each run", name, len(p), DefaultPort)
	}
	var hs []handshake
	for i := 0; i < len(p); i += 3 {
		if !to[i] || to[i+1] || !to[i+2] {
			t.Fatalf("%s: payloads %d–%d go the wrong ways", name, i, i+2)
		}
		hs = append(hs, handshake{p[i], p[i+1], p[i+2]})
	}
	return hs
}

// TestHandshakeVectors: the messages of the real tools (rdma-core 44 on
// Linux rxe, captured in ../shared/vectors) parse, and this package makes
// byte-identical ones from the parsed values — in both roles of a whole
// exchange replayed over a pipe.
func TestHandshakeVectors(t *testing.T) {
	for _, name := range []string{"rxe-rc-pingpong.pcap", "rxe-uc-pingpong.pcap", "rxe-ud-pingpong.pcap"} {
		for i, h := range handshakes(t, name) {
			if len(h.client) != DestLen || len(h.server) != DestLen || string(h.done) != doneMsg {
				t.Fatalf("%s #%d: message lengths %d/%d, done %q", name, i, len(h.client), len(h.server), h.done)
			}
			cd, err := ParseDest(h.client)
			if err != nil {
				t.Fatal(err)
			}
			sd, err := ParseDest(h.server)
			if err != nil {
				t.Fatal(err)
			}
			if cd.GIDString() != "::ffff:10.99.0.2" || sd.GIDString() != "::ffff:10.99.0.3" || cd.LID != 0 || !cd.HasGID() {
				t.Errorf("%s #%d: client %v, server %v", name, i, cd, sd)
			}
			if !bytes.Equal(cd.Marshal(), h.client) || !bytes.Equal(sd.Marshal(), h.server) {
				t.Errorf("%s #%d: remade\n%q\n%q\nwant\n%q\n%q", name, i, cd.Marshal(), sd.Marshal(), h.client, h.server)
			}
			t.Logf("%s #%d: client %v; server %v", name, i, cd, sd)
			replayClient(t, h, cd, sd)
			replayServer(t, h, cd, sd)
		}
	}
}

// replayClient runs ClientExchange against the captured server: what it
// writes must be the captured client's bytes.
func replayClient(t *testing.T, h handshake, cd, sd Dest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ours, theirs := net.Pipe()
	defer ours.Close()
	errc := make(chan error, 1)
	go func() {
		defer theirs.Close()
		msg := make([]byte, DestLen)
		if _, err := io.ReadFull(theirs, msg); err != nil {
			errc <- err
			return
		}
		if !bytes.Equal(msg, h.client) {
			errc <- errors.New("client wrote " + string(msg))
			return
		}
		if _, err := theirs.Write(h.server); err != nil {
			errc <- err
			return
		}
		done := make([]byte, len(h.done))
		if _, err := io.ReadFull(theirs, done); err != nil || !bytes.Equal(done, h.done) {
			errc <- errors.New("client ended with " + string(done))
			return
		}
		errc <- nil
	}()
	remote, err := ClientExchange(ctx, ours, cd)
	if err != nil || remote != sd {
		t.Errorf("client exchange: %v, %v; want %v", remote, err, sd)
	}
	if err := <-errc; err != nil {
		t.Error(err)
	}
}

// replayServer runs ServerExchange against the captured client: it
// connects to the client's address before it answers with the captured
// server's bytes.
func replayServer(t *testing.T, h handshake, cd, sd Dest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ours, theirs := net.Pipe()
	defer ours.Close()
	errc := make(chan error, 1)
	go func() {
		defer theirs.Close()
		if _, err := theirs.Write(h.client); err != nil {
			errc <- err
			return
		}
		msg := make([]byte, DestLen)
		if _, err := io.ReadFull(theirs, msg); err != nil {
			errc <- err
			return
		}
		if !bytes.Equal(msg, h.server) {
			errc <- errors.New("server wrote " + string(msg))
			return
		}
		_, err := theirs.Write(h.done)
		errc <- err
	}()
	var connected *Dest
	remote, err := ServerExchange(ctx, ours, sd, func(r Dest) error { connected = &r; return nil })
	if err != nil || remote != cd || connected == nil || *connected != cd {
		t.Errorf("server exchange: %v, %v, connected to %v; want %v", remote, err, connected, cd)
	}
	if err := <-errc; err != nil {
		t.Error(err)
	}
}

// TestDest: the format for given values, with the GID in byte order, and
// what ParseDest refuses.
func TestDest(t *testing.T) {
	d := Dest{LID: 0x12, QPN: 0x11, PSN: 0x28b307, GID: [16]byte{0xfe, 0x80, 10: 0, 11: 0, 12: 0x12, 13: 0x34, 14: 0x56, 15: 0x78}}
	want := "0012:000011:28b307:fe800000000000000000000012345678\x00"
	if got := string(d.Marshal()); got != want {
		t.Fatalf("marshal %q, want %q", got, want)
	}
	if got := d.String(); got != "LID 0x0012, QPN 0x000011, PSN 0x28b307, GID fe80::1234:5678" {
		t.Errorf("string %q", got)
	}
	back, err := ParseDest([]byte(want))
	if err != nil || back != d {
		t.Fatalf("parse: %v, %v", back, err)
	}
	var zero Dest
	if zero.HasGID() || zero.GIDString() != "::" || string(zero.Marshal()) != "0000:000000:000000:00000000000000000000000000000000\x00" {
		t.Errorf("zero address: %q %q", zero.GIDString(), zero.Marshal())
	}
	for _, bad := range []string{
		"", "done", "0000:000011:28b307", "0000:000011:28b307:fe80",
		"0000:1000000:28b307:fe800000000000000000000012345678", // QPN beyond 24 bits
		"0000:000011:28b307:fe80000000000000000000001234567g",
		"10000:000011:28b307:fe800000000000000000000012345678",
	} {
		if _, err := ParseDest([]byte(bad)); !errors.Is(err, ErrDest) {
			t.Errorf("ParseDest(%q): %v", bad, err)
		}
	}
}

// FuzzParseDest: an address message from the peer parses or is an
// ErrDest, and what parses comes out of Marshal and ParseDest again
// unchanged.
func FuzzParseDest(f *testing.F) {
	f.Add(Dest{LID: 1, QPN: 0x11, PSN: 0x222, GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 1}}.Marshal())
	f.Add([]byte("0000:000011:000222:"))
	f.Add([]byte("0000:1000000:000222:00000000000000000000ffff0a000001\x00"))
	f.Fuzz(func(t *testing.T, msg []byte) {
		d, err := ParseDest(msg)
		if err != nil {
			if !errors.Is(err, ErrDest) {
				t.Fatalf("ParseDest(%q): %v is not an ErrDest", msg, err)
			}
			return
		}
		again, err := ParseDest(d.Marshal())
		if err != nil || again != d {
			t.Fatalf("ParseDest(%q) = %+v; marshalled and parsed again: %+v, %v", msg, d, again, err)
		}
	})
}
