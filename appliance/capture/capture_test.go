package capture

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

func TestWriteRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.pcap")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	frames := [][]byte{bytes.Repeat([]byte{1}, 60), bytes.Repeat([]byte{2}, 4200), {3, 4, 5}}
	base := time.Unix(1700000000, 123456789)
	for i, f := range frames {
		if err := w.WriteFrame(base.Add(time.Duration(i)*time.Microsecond), f); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(frames) {
		t.Fatalf("%d frames, want %d", len(got), len(frames))
	}
	for i := range frames {
		if !bytes.Equal(got[i].Data, frames[i]) || got[i].Truncated() {
			t.Errorf("frame %d differs", i)
		}
		if want := base.Add(time.Duration(i) * time.Microsecond); !got[i].Time.Equal(want) {
			t.Errorf("frame %d time %v, want %v (nanosecond precision)", i, got[i].Time, want)
		}
	}
}

func TestSnapLen(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFrame(time.Now(), make([]byte, SnapLen+100)); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	r, err := NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	f, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Data) != SnapLen || f.OrigLen != SnapLen+100 || !f.Truncated() {
		t.Fatalf("captured %d of %d", len(f.Data), f.OrigLen)
	}
}

func TestReadPcapng(t *testing.T) {
	var buf bytes.Buffer
	ng, err := pcapgo.NewNgWriter(&buf, layers.LinkTypeEthernet)
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("an ethernet frame, more or less")
	if err := ng.WritePacket(gopacket.CaptureInfo{Timestamp: time.Unix(5, 0), CaptureLength: len(data), Length: len(data)}, data); err != nil {
		t.Fatal(err)
	}
	if err := ng.Flush(); err != nil {
		t.Fatal(err)
	}
	r, err := NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	f, err := r.Next()
	if err != nil || !bytes.Equal(f.Data, data) {
		t.Fatalf("pcapng frame %q, %v", f.Data, err)
	}
	if _, err := r.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after last frame: %v, want EOF", err)
	}
}

func TestReadErrors(t *testing.T) {
	// A capture of another link type.
	var raw bytes.Buffer
	pw := pcapgo.NewWriter(&raw)
	if err := pw.WriteFileHeader(65535, layers.LinkTypeRaw); err != nil {
		t.Fatal(err)
	}
	if _, err := NewReader(&raw); !errors.Is(err, ErrLinkType) {
		t.Errorf("raw IP capture: %v, want ErrLinkType", err)
	}
	// Not a capture; empty; cut inside a record.
	for _, in := range []string{"hello, world, not pcap", "", "\xd4\xc3"} {
		if _, err := NewReader(strings.NewReader(in)); !errors.Is(err, ErrFormat) {
			t.Errorf("%q: %v, want ErrFormat", in, err)
		}
	}
	var buf bytes.Buffer
	w, _ := NewWriter(&buf)
	_ = w.WriteFrame(time.Now(), make([]byte, 100))
	_ = w.Flush()
	r, err := NewReader(bytes.NewReader(buf.Bytes()[:buf.Len()-10]))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(); err == nil || errors.Is(err, io.EOF) {
		t.Errorf("record cut short: %v, want an error other than EOF", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// FuzzReader: arbitrary bytes as a capture never panic the reader.
func FuzzReader(f *testing.F) {
	var buf bytes.Buffer
	w, _ := NewWriter(&buf)
	_ = w.WriteFrame(time.Unix(1, 0), []byte{1, 2, 3, 4})
	_ = w.Flush()
	f.Add(buf.Bytes())
	f.Add([]byte{0x0A, 0x0D, 0x0D, 0x0A, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := NewReader(bytes.NewReader(data))
		if err != nil {
			return
		}
		for i := 0; i < 1000; i++ {
			if _, err := r.Next(); err != nil {
				return
			}
		}
	})
}
