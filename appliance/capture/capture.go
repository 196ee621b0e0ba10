// Package capture reads and writes packet captures of Ethernet frames:
// pcap and pcapng files through gopacket's pcapgo. taproce uses it for the
// test vectors, for `taproce decode`, and for recording every frame a port
// sends and receives.
package capture

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// ErrLinkType is returned for captures whose link type is not Ethernet.
var ErrLinkType = errors.New("capture: link type is not Ethernet")

// ErrFormat is returned for input that does not start as a pcap or pcapng
// file does (an empty file, text), told apart from a capture that is
// damaged further in.
var ErrFormat = errors.New("capture: not a pcap or pcapng file")

// SnapLen is the snapshot length written into new captures: whole frames up
// to the largest TAP super-frame.
const SnapLen = 262144

// Frame is one captured frame.
type Frame struct {
	Time time.Time
	// Data is the captured bytes; CaptureLen < OrigLen when the capture
	// cut the frame short.
	Data    []byte
	OrigLen int
}

// Truncated reports whether the capture holds fewer bytes than were on the
// wire.
func (f *Frame) Truncated() bool { return len(f.Data) < f.OrigLen }

type packetSource interface {
	ReadPacketData() ([]byte, gopacket.CaptureInfo, error)
}

// Reader reads Ethernet frames from a pcap or pcapng stream.
type Reader struct {
	src    packetSource
	closer io.Closer
}

// pcapng section header block type, which is also the file's first word.
const pcapngMagic = 0x0A0D0D0A

// pcapMagic reports whether a file's first word, read little-endian, is a
// pcap magic number: microsecond or nanosecond timestamps, written in
// either byte order.
func pcapMagic(w uint32) bool {
	switch w {
	case 0xa1b2c3d4, 0xd4c3b2a1, 0xa1b23c4d, 0x4d3cb2a1:
		return true
	}
	return false
}

// NewReader reads a pcap or pcapng capture from r, telling the format by
// its first four bytes.
func NewReader(r io.Reader) (*Reader, error) {
	br := bufio.NewReader(r)
	head, err := br.Peek(4)
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %d bytes", ErrFormat, len(head))
	}
	if err != nil {
		return nil, fmt.Errorf("capture: reading file header: %w", err)
	}
	magic := binary.LittleEndian.Uint32(head)
	if magic != pcapngMagic && !pcapMagic(magic) {
		return nil, fmt.Errorf("%w: it starts with %q", ErrFormat, head)
	}
	var src packetSource
	var lt layers.LinkType
	if magic == pcapngMagic {
		ng, err := pcapgo.NewNgReader(br, pcapgo.DefaultNgReaderOptions)
		if err != nil {
			return nil, fmt.Errorf("capture: pcapng: %w", err)
		}
		src, lt = ng, ng.LinkType()
	} else {
		pr, err := pcapgo.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("capture: pcap: %w", err)
		}
		src, lt = pr, pr.LinkType()
	}
	if lt != layers.LinkTypeEthernet {
		return nil, fmt.Errorf("%w (link type %d)", ErrLinkType, lt)
	}
	return &Reader{src: src}, nil
}

// Open opens the capture file at path.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	r, err := NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r.closer = f
	return r, nil
}

// Next returns the next frame, or io.EOF after the last one. The frame's
// Data is freshly allocated and stays valid.
func (r *Reader) Next() (Frame, error) {
	data, ci, err := r.src.ReadPacketData()
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return Frame{}, fmt.Errorf("capture: file ends inside a record: %w", err)
		}
		return Frame{}, err
	}
	return Frame{Time: ci.Timestamp, Data: data, OrigLen: ci.Length}, nil
}

// Close closes the file Open opened; for NewReader it does nothing.
func (r *Reader) Close() error {
	if r.closer == nil {
		return nil
	}
	return r.closer.Close()
}

// ReadFile returns every frame of the capture at path.
func ReadFile(path string) ([]Frame, error) {
	r, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var frames []Frame
	for {
		f, err := r.Next()
		if errors.Is(err, io.EOF) {
			return frames, nil
		}
		if err != nil {
			return frames, fmt.Errorf("%s: frame %d: %w", path, len(frames)+1, err)
		}
		frames = append(frames, f)
	}
}

// Writer writes frames to a pcap stream (Ethernet, nanosecond timestamps).
// It is safe for concurrent use: ports' receive and send paths share one.
type Writer struct {
	mu     sync.Mutex
	bw     *bufio.Writer
	pw     *pcapgo.Writer
	closer io.Closer
}

// NewWriter writes a pcap file header to w and returns a Writer.
func NewWriter(w io.Writer) (*Writer, error) {
	bw := bufio.NewWriterSize(w, 1<<16)
	pw := pcapgo.NewWriterNanos(bw)
	if err := pw.WriteFileHeader(SnapLen, layers.LinkTypeEthernet); err != nil {
		return nil, fmt.Errorf("capture: writing file header: %w", err)
	}
	return &Writer{bw: bw, pw: pw}, nil
}

// Create creates (or truncates) the file at path and returns a Writer to it.
func Create(path string) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w, err := NewWriter(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	w.closer = f
	return w, nil
}

// WriteFrame appends one frame captured at ts. Frames longer than SnapLen
// are cut to it, with their original length recorded.
func (w *Writer) WriteFrame(ts time.Time, frame []byte) error {
	n := len(frame)
	if n > SnapLen {
		frame = frame[:SnapLen]
	}
	ci := gopacket.CaptureInfo{Timestamp: ts, CaptureLength: len(frame), Length: n}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pw.WritePacket(ci, frame)
}

// Flush writes buffered frames to the underlying writer.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.bw.Flush()
}

// Close flushes and, for Create, closes the file.
func (w *Writer) Close() error {
	err := w.Flush()
	if w.closer != nil {
		if cerr := w.closer.Close(); err == nil {
			err = cerr
		}
	}
	return err
}
