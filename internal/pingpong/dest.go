// Package pingpong speaks the protocol of rdma-core's ibv_rc_pingpong,
// ibv_uc_pingpong and ibv_ud_pingpong (libibverbs/examples/{rc,uc,ud}_pingpong.c
// and pingpong.c), and implements those tools on the verbs library.
//
// Out of band, over TCP (port 18515 by default), the client writes its
// address as "%04x:%06x:%06x:%s" (LID, QPN, PSN, GID as 32 hex digits in
// byte order, pingpong.c's gid_to_wire_gid) with the terminating NUL, 52
// bytes in one write; the server reads them, connects its QP, answers the
// same way, and the client ends with "done" and its NUL. Then the client
// posts the first SEND of size bytes; each side posts its next SEND once
// both its previous SEND and a receive have completed, until iters SENDs
// and iters receives completed. Both sides send from and receive into one
// buffer, so the server echoes what it received. Receives are posted
// rx_depth at a time and topped up when one or fewer remain.
//
// RC: INIT with access flags 0; RTR with the path MTU (-m), the peer's
// QPN and PSN, max_dest_rd_atomic 1, min_rnr_timer 12 and a GRH address
// vector (source GID index -g, hop limit 1) when the peer's GID has a
// non-zero interface ID; RTS with timeout 14, retry_cnt 7, rnr_retry 7,
// max_rd_atomic 1 and the own PSN. UC: the same without the attributes of
// ACKs and RDMA READ. UD: Q_Key 0x11111111, RTR and RTS with the state and
// the PSN alone, an address handle (hop limit 64), receive buffers of
// size+40 bytes with the GRH area in front, SENDs of size bytes from
// behind that area.
package pingpong

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// DefaultPort is the TCP port of the tools' exchange.
const DefaultPort = 18515

// QKey is the Q_Key of ibv_ud_pingpong.
const QKey = 0x11111111

// GRHLen is the size of the GRH area in front of every UD receive.
const GRHLen = 40

// DestLen is the length of an address message, NUL included.
const DestLen = len("0000:000000:000000:00000000000000000000000000000000") + 1

// doneMsg ends the client's side of the exchange: "done" and its NUL.
const doneMsg = "done\x00"

// Dest is the address the tools exchange (struct pingpong_dest).
type Dest struct {
	LID uint16
	QPN uint32
	PSN uint32
	// GID in network byte order; all zero when the tool ran without -g.
	GID [16]byte
}

// Marshal returns the message for d: "%04x:%06x:%06x:%s" and a NUL, the
// GID as 32 hex digits in byte order.
func (d Dest) Marshal() []byte {
	s := fmt.Sprintf("%04x:%06x:%06x:%s", d.LID, d.QPN&0xffffff, d.PSN&0xffffff, hex.EncodeToString(d.GID[:]))
	return append([]byte(s), 0)
}

// GIDString formats the GID as inet_ntop(AF_INET6) does.
func (d Dest) GIDString() string {
	return netip.AddrFrom16(d.GID).String()
}

// String formats d as the tools print an address.
func (d Dest) String() string {
	return fmt.Sprintf("LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s", d.LID, d.QPN, d.PSN, d.GIDString())
}

// HasGID reports whether the GID's interface ID is non-zero, the tools'
// test for an address vector with a GRH.
func (d Dest) HasGID() bool {
	for _, b := range d.GID[8:] {
		if b != 0 {
			return true
		}
	}
	return false
}

// Addr returns the GID as an address, IPv4-mapped GIDs as IPv4.
func (d Dest) Addr() netip.Addr { return netip.AddrFrom16(d.GID).Unmap() }

// ErrDest is returned for a malformed address message.
var ErrDest = errors.New("pingpong: malformed address message")

// ParseDest parses an address message as the tools do (sscanf
// "%x:%x:%x:%s" and wire_gid_to_gid), but strictly: four fields, the GID
// of 32 hex digits, an optional NUL at the end.
func ParseDest(b []byte) (Dest, error) {
	s := string(b)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	f := strings.Split(s, ":")
	if len(f) != 4 || len(f[3]) != 32 {
		return Dest{}, fmt.Errorf("%w: %q", ErrDest, s)
	}
	var v [3]uint64
	for i, bits := range []int{16, 24, 24} {
		n, err := strconv.ParseUint(f[i], 16, bits)
		if err != nil {
			return Dest{}, fmt.Errorf("%w: %q: %w", ErrDest, s, err)
		}
		v[i] = n
	}
	var d Dest
	if _, err := hex.Decode(d.GID[:], []byte(f[3])); err != nil {
		return Dest{}, fmt.Errorf("%w: %q: %w", ErrDest, s, err)
	}
	d.LID, d.QPN, d.PSN = uint16(v[0]), uint32(v[1]), uint32(v[2])
	return d, nil
}
