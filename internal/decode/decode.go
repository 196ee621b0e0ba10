// Package decode is the dissector behind `taproce decode`: one line (or one
// JSON object) per captured frame, with every RoCEv2 header field and an
// ICRC check, which Wireshark does not do. A connection manager MAD (a UD
// SEND to QP1) is shown by its message's fields instead of the UD SEND's.
package decode

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/appliance/roce"
)

// Record is what decode says about one frame. Exactly one of Skipped,
// Error and Opcode is set.
type Record struct {
	File  string    `json:"file,omitempty"`
	Frame int       `json:"frame"`
	Time  time.Time `json:"time"`
	Len   int       `json:"len"`

	// Skipped names what the frame is when it is not RoCEv2.
	Skipped string `json:"skipped,omitempty"`
	// Error is why a frame sent to UDP port 4791 did not parse.
	Error string `json:"error,omitempty"`

	SrcMAC  string `json:"src_mac,omitempty"`
	DstMAC  string `json:"dst_mac,omitempty"`
	Src     string `json:"src,omitempty"`
	Dst     string `json:"dst,omitempty"`
	SrcPort uint16 `json:"sport,omitempty"`
	DstPort uint16 `json:"dport,omitempty"`

	Opcode     string `json:"opcode,omitempty"`
	OpcodeNum  *uint8 `json:"opcode_num,omitempty"`
	DestQP     uint32 `json:"dqp"`
	PSN        uint32 `json:"psn"`
	AckReq     bool   `json:"ackreq"`
	SE         bool   `json:"se,omitempty"`
	MigReq     bool   `json:"migreq,omitempty"`
	FECN       bool   `json:"fecn,omitempty"`
	BECN       bool   `json:"becn,omitempty"`
	PKey       uint16 `json:"pkey"`
	PadCount   uint8  `json:"pad"`
	PayloadLen int    `json:"payload_len"`

	DETH      *DETH      `json:"deth,omitempty"`
	FETH      *FETH      `json:"feth,omitempty"`
	RETH      *RETH      `json:"reth,omitempty"`
	AtomicETH *AtomicETH `json:"atomic_eth,omitempty"`
	Imm       *uint32    `json:"imm,omitempty"`
	IETH      *uint32    `json:"inv_rkey,omitempty"`
	AETH      *AETH      `json:"aeth,omitempty"`
	AtomicAck *uint64    `json:"atomic_orig,omitempty"`

	// CM is the connection manager message of a GSI MAD (a UD SEND to
	// QP1 with QP1's Q_Key and 256 bytes); MADError says why such a MAD
	// is not one (another management class, a malformed header).
	CM       *CM    `json:"cm,omitempty"`
	MADError string `json:"mad_error,omitempty"`

	// ICRC is "ok" or "bad"; ICRCWant is what the contents call for,
	// ICRCGot what the frame carries.
	ICRC     string `json:"icrc,omitempty"`
	ICRCWant uint32 `json:"icrc_want"`
	ICRCGot  uint32 `json:"icrc_got"`
}

// DETH holds the datagram header fields.
type DETH struct {
	QKey  uint32 `json:"qkey"`
	SrcQP uint32 `json:"src_qp"`
}

// FETH holds the flush header fields.
type FETH struct {
	Selectivity uint8 `json:"sel"`
	Placement   uint8 `json:"plt"`
}

// RETH holds the RDMA header fields.
type RETH struct {
	VA     uint64 `json:"va"`
	RKey   uint32 `json:"rkey"`
	DMALen uint32 `json:"dma_len"`
}

// AtomicETH holds the atomic request fields.
type AtomicETH struct {
	VA      uint64 `json:"va"`
	RKey    uint32 `json:"rkey"`
	SwapAdd uint64 `json:"swap_add"`
	Compare uint64 `json:"compare"`
}

// AETH holds the acknowledgement fields.
type AETH struct {
	Syndrome string `json:"syndrome"`
	Raw      uint8  `json:"syndrome_raw"`
	MSN      uint32 `json:"msn"`
}

// CM holds a connection manager MAD's key fields (IBA vol. 1 ch. 12).
// Which are set depends on the attribute: comm IDs for connection
// messages, the request ID for SIDR; the service ID, with its RDMA CM port
// space and port, for REQ and SIDR; the QPN (REQ, REP: the sender's;
// DREQ: the receiver's; SIDR_REP: the service's) and starting PSN; the
// CMA header's addresses; a REJ's reason, a SIDR_REP's status.
type CM struct {
	Attr    string `json:"attr"`
	Method  string `json:"method"`
	TID     uint64 `json:"tid"`
	Summary string `json:"summary"` // the text line's fields

	LocalCommID  *uint32 `json:"local_comm_id,omitempty"`
	RemoteCommID *uint32 `json:"remote_comm_id,omitempty"`
	RequestID    *uint32 `json:"request_id,omitempty"`
	ServiceID    *uint64 `json:"service_id,omitempty"`
	PortSpace    string  `json:"port_space,omitempty"`
	Port         *uint16 `json:"port,omitempty"`
	QPN          *uint32 `json:"qpn,omitempty"`
	StartingPSN  *uint32 `json:"starting_psn,omitempty"`
	QKey         *uint32 `json:"qkey,omitempty"`
	CMASrc       string  `json:"cma_src,omitempty"`
	CMADst       string  `json:"cma_dst,omitempty"`
	Reason       string  `json:"reason,omitempty"`
	ReasonNum    *uint16 `json:"reason_num,omitempty"`
	SIDRStatus   string  `json:"sidr_status,omitempty"`
}

// decodeCM fills r.CM or r.MADError from the MAD of a GSI packet.
func (r *Record) decodeCM(mad []byte) {
	var m cm.Message
	if err := cm.Parse(mad, &m); err != nil {
		r.MADError = err.Error()
		return
	}
	c := &CM{Attr: m.Header.AttrID.String(), Method: m.Header.Method.String(), TID: m.Header.TID, Summary: m.String()}
	ids := func(l, rc uint32) { c.LocalCommID, c.RemoteCommID = &l, &rc }
	sid := func(s cm.ServiceID, priv []byte) {
		v := uint64(s)
		c.ServiceID = &v
		ps, ok := s.PortSpace()
		if !ok {
			return
		}
		port := s.Port()
		c.PortSpace, c.Port = ps.String(), &port
		if h, err := cm.ParseCMAHeader(priv); err == nil {
			c.CMASrc, c.CMADst = h.Src.String(), h.Destination(s).String()
		}
	}
	qpn := func(q uint32) { c.QPN = &q }
	psn := func(p roce.PSN) { v := uint32(p); c.StartingPSN = &v }
	switch m.Header.AttrID {
	case cm.AttrREQ:
		f := &m.REQ
		c.LocalCommID = &f.LocalCommID
		sid(f.ServiceID, f.PrivateData[:])
		qpn(f.LocalQPN)
		psn(f.StartingPSN)
	case cm.AttrREP:
		ids(m.REP.LocalCommID, m.REP.RemoteCommID)
		qpn(m.REP.LocalQPN)
		psn(m.REP.StartingPSN)
	case cm.AttrRTU:
		ids(m.RTU.LocalCommID, m.RTU.RemoteCommID)
	case cm.AttrDREQ:
		ids(m.DREQ.LocalCommID, m.DREQ.RemoteCommID)
		qpn(m.DREQ.RemoteQPN)
	case cm.AttrDREP:
		ids(m.DREP.LocalCommID, m.DREP.RemoteCommID)
	case cm.AttrMRA:
		ids(m.MRA.LocalCommID, m.MRA.RemoteCommID)
	case cm.AttrREJ:
		ids(m.REJ.LocalCommID, m.REJ.RemoteCommID)
		n := uint16(m.REJ.Reason)
		c.Reason, c.ReasonNum = m.REJ.Reason.String(), &n
	case cm.AttrSIDRReq:
		c.RequestID = &m.SIDRReq.RequestID
		sid(m.SIDRReq.ServiceID, m.SIDRReq.PrivateData[:])
	case cm.AttrSIDRRep:
		c.RequestID = &m.SIDRRep.RequestID
		sid(m.SIDRRep.ServiceID, nil)
		qpn(m.SIDRRep.QPN)
		c.QKey = &m.SIDRRep.QKey
		c.SIDRStatus = m.SIDRRep.Status.String()
	}
	r.CM = c
}

// Bad reports whether the record is a RoCE frame that failed to parse or
// failed its ICRC check.
func (r *Record) Bad() bool { return r.Error != "" || r.ICRC == "bad" }

// Decode dissects one frame. n is its 1-based number in the capture.
func Decode(n int, ts time.Time, data []byte) Record {
	r := Record{Frame: n, Time: ts, Len: len(data)}
	var p roce.Packet
	err := roce.Parse(data, &p)
	switch {
	case errors.Is(err, roce.ErrNotRoCE), errors.Is(err, roce.ErrTruncated) && !reachesPort(data):
		r.Skipped = describe(data)
		return r
	case err != nil:
		r.Error = err.Error()
		return r
	}
	r.SrcMAC, r.DstMAC = p.SrcMAC.String(), p.DstMAC.String()
	r.Src, r.Dst = p.Src.String(), p.Dst.String()
	r.SrcPort, r.DstPort = p.SrcPort, p.DstPort
	b := &p.BTH
	op := uint8(b.Opcode)
	r.Opcode, r.OpcodeNum = b.Opcode.String(), &op
	r.DestQP, r.PSN, r.AckReq = b.DestQP, uint32(b.PSN), b.AckReq
	r.SE, r.MigReq, r.FECN, r.BECN = b.SolicitedEvent, b.MigReq, b.FECN, b.BECN
	r.PKey, r.PadCount, r.PayloadLen = b.PKey, b.PadCount, p.PayloadLen
	info := p.Info()
	if info.Has(roce.HasDETH) {
		r.DETH = &DETH{QKey: p.DETH.QKey, SrcQP: p.DETH.SrcQP}
	}
	if info.Has(roce.HasFETH) {
		r.FETH = &FETH{Selectivity: p.FETH.Selectivity, Placement: p.FETH.Placement}
	}
	if info.Has(roce.HasRETH) {
		r.RETH = &RETH{VA: p.RETH.VA, RKey: p.RETH.RKey, DMALen: p.RETH.DMALen}
	}
	if info.Has(roce.HasAtomicETH) {
		a := p.AtomicETH
		r.AtomicETH = &AtomicETH{VA: a.VA, RKey: a.RKey, SwapAdd: a.SwapAdd, Compare: a.Compare}
	}
	if info.Has(roce.HasImmDt) {
		r.Imm = &p.Imm
	}
	if info.Has(roce.HasIETH) {
		r.IETH = &p.IETH
	}
	if info.Has(roce.HasAETH) {
		r.AETH = &AETH{Syndrome: p.AETH.Syndrome.String(), Raw: uint8(p.AETH.Syndrome), MSN: p.AETH.MSN}
	}
	if info.Has(roce.HasAtomicAckETH) {
		r.AtomicAck = &p.AtomicAck
	}
	if cm.IsGSI(&p) {
		r.decodeCM(p.Payload(data))
	}
	r.ICRCWant, r.ICRCGot = p.ComputeICRC(data), p.ICRC
	r.ICRC = "ok"
	if r.ICRCWant != r.ICRCGot {
		r.ICRC = "bad"
	}
	return r
}

// reachesPort reports whether data is long enough to show an IP frame's UDP
// destination port: a frame cut before it cannot be told to be RoCE.
func reachesPort(d []byte) bool {
	if len(d) < roce.EthernetLen+roce.IPv4Len {
		return false
	}
	switch roce.Ethernet(d).EtherType() {
	case roce.EtherTypeIPv4:
		return len(d) >= roce.EthernetLen+roce.IPv4(d[roce.EthernetLen:]).IHL()+4
	case roce.EtherTypeIPv6:
		return len(d) >= roce.EthernetLen+roce.IPv6Len+4
	}
	return false
}

// describe names a frame that is not RoCEv2, e.g. "TCP 10.0.0.1:40000 >
// 10.0.0.2:18515" or "ARP".
func describe(d []byte) string {
	if len(d) < roce.EthernetLen {
		return "runt frame"
	}
	et := roce.Ethernet(d).EtherType()
	if et == roce.EtherTypeIPv4 && len(d) < roce.EthernetLen+roce.IPv4Len || et == roce.EtherTypeIPv6 && len(d) < roce.EthernetLen+roce.IPv6Len {
		return "IP header cut short"
	}
	var proto uint8
	var src, dst string
	var l4 []byte
	switch {
	case et == roce.EtherTypeARP:
		return "ARP"
	case et == roce.EtherTypeIPv4 && len(d) >= roce.EthernetLen+roce.IPv4Len:
		ip := roce.IPv4(d[roce.EthernetLen:])
		proto, src, dst = ip.Protocol(), ip.Src().String(), ip.Dst().String()
		if ihl := ip.IHL(); ihl >= roce.IPv4Len && len(d) >= roce.EthernetLen+ihl {
			l4 = d[roce.EthernetLen+ihl:]
		}
	case et == roce.EtherTypeIPv6 && len(d) >= roce.EthernetLen+roce.IPv6Len:
		ip := roce.IPv6(d[roce.EthernetLen:])
		proto, src, dst = ip.NextHeader(), ip.Src().String(), ip.Dst().String()
		l4 = d[roce.EthernetLen+roce.IPv6Len:]
	default:
		return fmt.Sprintf("ethertype 0x%04x", et)
	}
	name := map[uint8]string{1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6"}[proto]
	if name == "" {
		name = "IP proto " + strconv.Itoa(int(proto))
	}
	if (proto == 6 || proto == 17) && len(l4) >= 4 {
		return fmt.Sprintf("%s %s > %s", name, hostPort(src, binary.BigEndian.Uint16(l4[0:2])), hostPort(dst, binary.BigEndian.Uint16(l4[2:4])))
	}
	return fmt.Sprintf("%s %s > %s", name, src, dst)
}

// hostPort joins an address and port, bracketing IPv6 addresses.
func hostPort(addr string, port uint16) string {
	return net.JoinHostPort(addr, strconv.Itoa(int(port)))
}

// Text formats r as one line.
func (r *Record) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d", r.Frame)
	switch {
	case r.Skipped != "":
		fmt.Fprintf(&b, " skipped: %s", r.Skipped)
		return b.String()
	case r.Error != "":
		fmt.Fprintf(&b, " error: %s", r.Error)
		return b.String()
	}
	if r.CM != nil {
		fmt.Fprintf(&b, " %s > %s CM %s", hostPort(r.Src, r.SrcPort), hostPort(r.Dst, r.DstPort), r.CM.Summary)
		r.writeICRC(&b)
		return b.String()
	}
	fmt.Fprintf(&b, " %s > %s %s qp=0x%06x psn=%d", hostPort(r.Src, r.SrcPort), hostPort(r.Dst, r.DstPort), r.Opcode, r.DestQP, r.PSN)
	flag := func(on bool, s string) {
		if on {
			b.WriteString(" " + s)
		}
	}
	flag(r.AckReq, "ackreq")
	flag(r.SE, "se")
	flag(r.MigReq, "migreq")
	flag(r.FECN, "fecn")
	flag(r.BECN, "becn")
	if r.PKey != roce.DefaultPKey {
		fmt.Fprintf(&b, " pkey=0x%04x", r.PKey)
	}
	if d := r.DETH; d != nil {
		fmt.Fprintf(&b, " qkey=0x%08x srcqp=0x%06x", d.QKey, d.SrcQP)
	}
	if f := r.FETH; f != nil {
		fmt.Fprintf(&b, " sel=%d plt=%d", f.Selectivity, f.Placement)
	}
	if e := r.RETH; e != nil {
		fmt.Fprintf(&b, " va=0x%016x rkey=0x%08x dlen=%d", e.VA, e.RKey, e.DMALen)
	}
	if a := r.AtomicETH; a != nil {
		if r.OpcodeNum != nil && roce.Opcode(*r.OpcodeNum) == roce.RCFetchAdd {
			fmt.Fprintf(&b, " va=0x%016x rkey=0x%08x add=0x%016x", a.VA, a.RKey, a.SwapAdd)
		} else {
			fmt.Fprintf(&b, " va=0x%016x rkey=0x%08x swap=0x%016x cmp=0x%016x", a.VA, a.RKey, a.SwapAdd, a.Compare)
		}
	}
	if r.Imm != nil {
		fmt.Fprintf(&b, " imm=0x%08x", *r.Imm)
	}
	if r.IETH != nil {
		fmt.Fprintf(&b, " inv_rkey=0x%08x", *r.IETH)
	}
	if a := r.AETH; a != nil {
		fmt.Fprintf(&b, " %s msn=%d", a.Syndrome, a.MSN)
	}
	if r.AtomicAck != nil {
		fmt.Fprintf(&b, " orig=0x%016x", *r.AtomicAck)
	}
	fmt.Fprintf(&b, " len=%d", r.PayloadLen)
	if r.PadCount != 0 {
		fmt.Fprintf(&b, " pad=%d", r.PadCount)
	}
	if r.MADError != "" {
		fmt.Fprintf(&b, " mad_error=%q", r.MADError)
	}
	r.writeICRC(&b)
	return b.String()
}

// writeICRC ends a line with the ICRC check.
func (r *Record) writeICRC(b *strings.Builder) {
	if r.ICRC == "ok" {
		b.WriteString(" icrc=ok")
	} else {
		fmt.Fprintf(b, " icrc=BAD(want 0x%08x got 0x%08x)", r.ICRCWant, r.ICRCGot)
	}
}

// Stats counts what a capture held.
type Stats struct {
	// Files counts the files read as captures: a file that is not one
	// adds no frames, and a summary of none would mislead.
	Files                      int
	Frames, RoCE, Skipped, Bad int
}

// Add adds o to s.
func (s *Stats) Add(o Stats) {
	s.Files += o.Files
	s.Frames += o.Frames
	s.RoCE += o.RoCE
	s.Skipped += o.Skipped
	s.Bad += o.Bad
}

// Options control the output.
type Options struct {
	JSON     bool // one JSON object per line instead of text
	WithFile bool // name the file on every record (text: a header line)
}

// FileError is File's error about a file it could not read, worded for
// the command line ("x.txt: not a pcap or pcapng file"); it wraps the
// reader's error.
type FileError struct {
	Path string
	// Problem says what is wrong, without the path.
	Problem string
	Err     error
}

func (e *FileError) Error() string { return e.Path + ": " + e.Problem }
func (e *FileError) Unwrap() error { return e.Err }

// openError words the error of opening a capture.
func openError(path string, err error) error {
	var pe *fs.PathError
	problem := "unreadable"
	switch {
	case errors.Is(err, capture.ErrFormat):
		problem = "not a pcap or pcapng file"
	case errors.Is(err, capture.ErrLinkType):
		problem = "a capture of another link layer than Ethernet"
	case errors.Is(err, io.ErrUnexpectedEOF):
		problem = "the file ends inside its header"
	case errors.As(err, &pe):
		problem = pe.Err.Error() // "no such file or directory", "permission denied"
	}
	return &FileError{Path: path, Problem: problem, Err: err}
}

// File decodes the capture at path onto w. The error, a *FileError for the
// file's own faults, is for files that cannot be read (the frames before
// the fault are decoded); bad frames are counted in Stats.
func File(w io.Writer, path string, opt Options) (Stats, error) {
	var st Stats
	r, err := capture.Open(path)
	if err != nil {
		return st, openError(path, err)
	}
	defer r.Close()
	st.Files = 1
	if opt.WithFile && !opt.JSON {
		if _, err := fmt.Fprintf(w, "# %s\n", path); err != nil {
			return st, err
		}
	}
	enc := json.NewEncoder(w)
	for {
		f, err := r.Next()
		if errors.Is(err, io.EOF) {
			return st, nil
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return st, &FileError{Path: path, Problem: fmt.Sprintf("the file ends inside frame %d", st.Frames+1), Err: err}
		}
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				return st, &FileError{Path: path, Problem: pe.Err.Error(), Err: err}
			}
			return st, &FileError{Path: path, Problem: fmt.Sprintf("frame %d unreadable", st.Frames+1), Err: err}
		}
		st.Frames++
		rec := Decode(st.Frames, f.Time, f.Data)
		switch {
		case rec.Skipped != "":
			st.Skipped++
		default:
			st.RoCE++
			if rec.Bad() {
				st.Bad++
			}
		}
		if opt.JSON {
			if opt.WithFile {
				rec.File = path
			}
			err = enc.Encode(&rec)
		} else {
			_, err = io.WriteString(w, rec.Text()+"\n")
		}
		if err != nil {
			return st, err
		}
	}
}
