package roce

import (
	"encoding/binary"
	"fmt"
)

// MAC is a 48-bit Ethernet address.
type MAC [6]byte

// String formats m as aa:bb:cc:dd:ee:ff.
func (m MAC) String() string {
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5])
}

// EtherTypes carried by RoCEv2 frames (and by the station's ARP).
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeARP  = 0x0806
	EtherTypeIPv6 = 0x86DD
)

// EthernetLen is the length of an untagged Ethernet II header.
const EthernetLen = 14

// Ethernet is a view of an Ethernet II header (IEEE 802.3, untagged).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                    Destination MAC (6 bytes)                  |
//	+                               +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                               |                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+                               +
//	|                      Source MAC (6 bytes)                     |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|           EtherType           |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type Ethernet []byte

// EthernetFields holds the fields of an Ethernet header.
type EthernetFields struct {
	Dst, Src  MAC
	EtherType uint16
}

// Dst returns the destination MAC.
func (e Ethernet) Dst() (m MAC) { copy(m[:], e[0:6]); return }

// Src returns the source MAC.
func (e Ethernet) Src() (m MAC) { copy(m[:], e[6:12]); return }

// EtherType returns the EtherType.
func (e Ethernet) EtherType() uint16 { return binary.BigEndian.Uint16(e[12:14]) }

// SetDst sets the destination MAC.
func (e Ethernet) SetDst(m MAC) { copy(e[0:6], m[:]) }

// SetSrc sets the source MAC.
func (e Ethernet) SetSrc(m MAC) { copy(e[6:12], m[:]) }

// SetEtherType sets the EtherType.
func (e Ethernet) SetEtherType(t uint16) { binary.BigEndian.PutUint16(e[12:14], t) }

// Encode writes all fields of f.
func (e Ethernet) Encode(f *EthernetFields) {
	e.SetDst(f.Dst)
	e.SetSrc(f.Src)
	e.SetEtherType(f.EtherType)
}
