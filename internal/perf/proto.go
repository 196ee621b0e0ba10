package perf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/taproce/taproce/internal/oobconn"
)

// Version is the perftest version whose protocol this package speaks and
// which it announces in the version exchange.
const Version = "6.06"

// Sizes of perftest's out-of-band messages.
const (
	versionSize   = 16  // MAX_VERSION
	keyMsgSize    = 59  // KEY_MSG_SIZE: keys without a GID
	keyMsgSizeGID = 108 // KEY_MSG_SIZE_GID
	mtuMsgSize    = 2   // sizeof(char[2]), peers of version 5.31 and later
	doneMsg       = "done\x00"
)

// Versions of the peer from which perftest changed the exchange.
const (
	minPeerVersion   = 5.70 // check_version_compatibility
	sysDataVersion   = 5.32 // check_sys_data
	longItersVersion = 5.33 // xchg_bw_reports: 8-byte iteration count
)

// ErrProtocol is wrapped by errors about the peer's messages.
var ErrProtocol = errors.New("out-of-band exchange with the peer")

// Dest is what a side tells the other about one of its QPs (struct
// pingpong_dest as ctx_hand_shake sends it).
type Dest struct {
	LID      uint16
	OutReads uint16
	QPN      uint32
	PSN      uint32
	RKey     uint32
	VAddr    uint64
	GID      [16]byte
	SRQN     uint32
}

// Marshal formats the message of ethernet_write_keys: KEY_PRINT_FMT_GID
// and its NUL in 108 bytes, or KEY_PRINT_FMT in 59 without a GID.
func (d Dest) Marshal(withGID bool) []byte {
	var s string
	if withGID {
		var g strings.Builder
		for _, b := range d.GID {
			fmt.Fprintf(&g, "%02x:", b)
		}
		s = fmt.Sprintf("%04x:%04x:%06x:%06x:%08x:%016x:%s%08x:", d.LID, d.OutReads, d.QPN, d.PSN, d.RKey, d.VAddr, g.String(), d.SRQN)
	} else {
		s = fmt.Sprintf("%04x:%04x:%06x:%06x:%08x:%016x:%08x", d.LID, d.OutReads, d.QPN, d.PSN, d.RKey, d.VAddr, d.SRQN)
	}
	n := keyMsgSize
	if withGID {
		n = keyMsgSizeGID
	}
	msg := make([]byte, n)
	copy(msg[:n-1], s) // sprintf into char[n]: the NUL is the last byte
	return msg
}

// ParseDest parses a message of ethernet_read_keys (with or without GID).
func ParseDest(msg []byte, withGID bool) (Dest, error) {
	var d Dest
	if i := bytes.IndexByte(msg, 0); i >= 0 {
		msg = msg[:i]
	}
	f := strings.Split(string(msg), ":")
	want := 7
	if withGID {
		want = 23
	}
	if len(f) < want {
		return d, fmt.Errorf("%w: keys %q: %d fields, want %d", ErrProtocol, msg, len(f), want)
	}
	num := func(i, bits int) (uint64, error) {
		v, err := strconv.ParseUint(f[i], 16, bits)
		if err != nil {
			return 0, fmt.Errorf("%w: keys %q: field %d is not a hexadecimal number of %d bits", ErrProtocol, msg, i, bits)
		}
		return v, nil
	}
	var v [7]uint64
	idx := [7]int{0, 1, 2, 3, 4, 5, 6}
	bits := [7]int{16, 16, 24, 24, 32, 64, 32}
	if withGID {
		idx[6] = 22
	}
	for k := range v {
		x, err := num(idx[k], bits[k])
		if err != nil {
			return d, err
		}
		v[k] = x
	}
	d = Dest{LID: uint16(v[0]), OutReads: uint16(v[1]), QPN: uint32(v[2]), PSN: uint32(v[3]), RKey: uint32(v[4]), VAddr: v[5], SRQN: uint32(v[6])}
	if withGID {
		for i := range 16 {
			x, err := num(6+i, 8)
			if err != nil {
				return d, err
			}
			d.GID[i] = byte(x)
		}
	}
	return d, nil
}

// bwReport is struct bw_report_data as xchg_bw_reports exchanges it.
type bwReport struct {
	Size    uint64
	Iters   uint64
	Peak    float64
	Avg     float64
	MsgRate float64
}

// oob is the out-of-band TCP connection. The client writes first in every
// exchange and the server answers (ctx_xchg_data_ethernet,
// ctx_hand_shake).
type oob struct {
	c       net.Conn
	client  bool
	timeout time.Duration
	// remVersion is the peer's version string, once exchanged.
	remVersion string
	// patient lifts the read timeout while a side waits for the peer's
	// whole run (a bandwidth server, a read or atomic latency server).
	patient bool
}

func newOOB(c net.Conn, client bool, timeout time.Duration) *oob {
	return &oob{c: c, client: client, timeout: timeout}
}

func (o *oob) write(b []byte) error {
	if err := o.c.SetWriteDeadline(time.Now().Add(o.timeout)); err != nil {
		return oobconn.Wrapf(err, "out-of-band exchange")
	}
	if _, err := o.c.Write(b); err != nil {
		return oobconn.Wrapf(err, "out-of-band exchange: couldn't send %d bytes", len(b))
	}
	return nil
}

func (o *oob) read(n int) ([]byte, error) {
	var deadline time.Time // none while waiting for the peer's run
	if !o.patient {
		deadline = time.Now().Add(o.timeout)
	}
	if err := o.c.SetReadDeadline(deadline); err != nil {
		return nil, oobconn.Wrapf(err, "out-of-band exchange")
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(o.c, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w: the peer closed the connection while %d bytes were expected: %w", ErrProtocol, n, err)
		}
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			return nil, oobconn.Wrap(err, fmt.Sprintf("out-of-band exchange: no message from the peer for %v", o.timeout))
		}
		return nil, oobconn.Wrapf(err, "out-of-band exchange: couldn't receive %d bytes", n)
	}
	return b, nil
}

// xchg is ctx_xchg_data: my message out, the peer's of the same size in.
func (o *oob) xchg(my []byte) ([]byte, error) {
	if o.client {
		if err := o.write(my); err != nil {
			return nil, err
		}
		return o.read(len(my))
	}
	rem, err := o.read(len(my))
	if err != nil {
		return nil, err
	}
	return rem, o.write(my)
}

// versionNumber is atof of a version string.
func versionNumber(s string) float64 {
	end := 0
	dot := false
	for end < len(s) && (s[end] >= '0' && s[end] <= '9' || s[end] == '.' && !dot) {
		if s[end] == '.' {
			dot = true
		}
		end++
	}
	v, _ := strconv.ParseFloat(s[:end], 64)
	return v
}

// exchangeVersions is exchange_versions and check_version_compatibility.
func (o *oob) exchangeVersions() error {
	my := make([]byte, versionSize)
	copy(my, Version)
	rem, err := o.xchg(my)
	if err != nil {
		return err
	}
	if i := bytes.IndexByte(rem, 0); i >= 0 {
		rem = rem[:i]
	}
	o.remVersion = string(rem)
	if versionNumber(o.remVersion) < minPeerVersion {
		return fmt.Errorf("%w: the peer's perftest version %q is older than 5.70, which this implementation needs", ErrProtocol, o.remVersion)
	}
	return nil
}

// maxCycle is the largest page size (cycle buffer) sysData accepts from
// a peer: 64 KiB pages are the largest perftest runs with in practice.
const maxCycle = 1 << 20

// sysData is check_sys_data: both sides take the larger page size (the
// cycle buffer) and cache line size. Sizes perftest would choke on — not
// powers of two, a cache line larger than the page (the buffer layout
// counts cache-line steps per page, and perftest divides by that count),
// a page over maxCycle — are the peer's protocol error.
func (o *oob) sysData(cycle, cacheLine int) (int, int, error) {
	if versionNumber(o.remVersion) < sysDataVersion {
		return cycle, cacheLine, nil
	}
	var out [2]int
	for i, v := range []int{cycle, cacheLine} {
		my := binary.BigEndian.AppendUint32(nil, uint32(v))
		rem, err := o.xchg(my)
		if err != nil {
			return 0, 0, err
		}
		out[i] = max(v, int(int32(binary.BigEndian.Uint32(rem))))
	}
	if c, l := out[0], out[1]; bits.OnesCount(uint(c)) != 1 || bits.OnesCount(uint(l)) != 1 || l > c || c > maxCycle {
		return 0, 0, fmt.Errorf("%w: page size %d and cache line size %d agreed with the peer: want powers of two, the cache line no larger than the page, the page at most %d", ErrProtocol, c, l, maxCycle)
	}
	return out[0], out[1], nil
}

// mtu is the exchange of check_mtu: the enum ibv_mtu as "%d" in 2 bytes;
// both sides take the smaller when the peer's is valid.
func (o *oob) mtu(cur int) (int, error) {
	my := make([]byte, mtuMsgSize)
	copy(my, strconv.Itoa(cur))
	rem, err := o.xchg(my)
	if err != nil {
		return 0, err
	}
	if i := bytes.IndexByte(rem, 0); i >= 0 {
		rem = rem[:i]
	}
	r, err := strconv.Atoi(string(rem))
	if err == nil && r >= 1 && r <= 5 && cur > r {
		return r, nil
	}
	return cur, nil
}

// setup is what every test exchanges first: versions, system data and
// MTU. It returns the cycle buffer, cache line size and MTU agreed.
func (o *oob) setup(cycle, cacheLine, mtu int) (int, int, int, error) {
	if err := o.exchangeVersions(); err != nil {
		return 0, 0, 0, err
	}
	cycle, cacheLine, err := o.sysData(cycle, cacheLine)
	if err != nil {
		return 0, 0, 0, err
	}
	mtu, err = o.mtu(mtu)
	return cycle, cacheLine, mtu, err
}

// handshake is ctx_hand_shake: my keys out, the peer's in.
func (o *oob) handshake(my Dest) (Dest, error) {
	rem, err := o.xchg(my.Marshal(true))
	if err != nil {
		return Dest{}, err
	}
	return ParseDest(rem, true)
}

// awaitPeer is a handshake that waits, without a timeout, for the peer to
// finish its run and reach it.
func (o *oob) awaitPeer(my Dest) (Dest, error) {
	o.patient = true
	defer func() { o.patient = false }()
	return o.handshake(my)
}

// xchgBWReports is xchg_bw_reports (without report_per_port): size,
// iterations (8 bytes from a peer of version 5.33 on, 4 before), peak,
// average and message rate, each exchanged on its own, big-endian.
func (o *oob) xchgBWReports(my bwReport) (bwReport, error) {
	var rem bwReport
	long := versionNumber(o.remVersion) >= longItersVersion
	u64 := func(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
	b, err := o.xchg(u64(my.Size))
	if err != nil {
		return rem, err
	}
	rem.Size = binary.BigEndian.Uint64(b)
	if long {
		b, err = o.xchg(u64(my.Iters))
		if err == nil {
			rem.Iters = binary.BigEndian.Uint64(b)
		}
	} else {
		b, err = o.xchg(binary.BigEndian.AppendUint32(nil, uint32(my.Iters)))
		if err == nil {
			rem.Iters = uint64(binary.BigEndian.Uint32(b))
		}
	}
	if err != nil {
		return rem, err
	}
	for _, f := range []struct {
		my  float64
		rem *float64
	}{{my.Peak, &rem.Peak}, {my.Avg, &rem.Avg}, {my.MsgRate, &rem.MsgRate}} {
		b, err := o.xchg(u64(math.Float64bits(f.my)))
		if err != nil {
			return rem, err
		}
		*f.rem = math.Float64frombits(binary.BigEndian.Uint64(b))
	}
	return rem, nil
}

// closeConn is ctx_close_connection: a last handshake, then "done" (which
// perftest never reads: a short wait for the peer's is all this does with
// it) and the connection closed. With wait, the handshake waits for the
// peer's run without a timeout.
func (o *oob) closeConn(my Dest, wait bool) error {
	o.patient = wait
	_, err := o.handshake(my)
	o.patient = false
	if err != nil {
		return err
	}
	if err := o.write([]byte(doneMsg)); err != nil {
		return err
	}
	_ = o.c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	_, _ = io.ReadFull(o.c, make([]byte, len(doneMsg)))
	return o.c.Close()
}
