package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/internal/decode"
	"github.com/taproce/taproce/internal/testvectors"
	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/matrix"
)

// TestLabCMCapture: the CM exchanges of taproce's ports, captured while
// Debian's rping and udaddy connect between two lab namespaces, decode
// (`taproce decode --json`) field by field as rxe's exchanges of the same
// programs do in shared/vectors (rxe-cm-rping.pcap, rxe-cm-udaddy.pcap,
// rxe-cm-write-bw.pcap): the same messages in the same order, and each
// the same in every field and header but those each run draws anew —
// transaction and communication IDs, QPNs, PSNs, GUIDs, MACs, addresses
// and ports, and the flow label the QPNs give — which cmRunFields lists.
// The decoder itself reads rxe's captures as Wireshark does
// (cm.TestVectorFields).
func TestLabCMCapture(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cm.pcap")
	w, err := capture.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	l, env := debianLab(t, func(tp *Topology) { tp.Capture = w })
	ctx := context.Background()
	a, b := l.Hosts[0], l.Hosts[1]
	for i, prog := range matrix.CMPrograms() {
		if prog.Name != "rping" && prog.Name != "udaddy" {
			continue
		}
		server, client := prog.Commands(b.PortIPv4().String(), 7500+i)
		srv, cli, err := l.pairCM(ctx, env, a, b, server, client, prog.Timeout, prog.ServerStays)
		if err == nil {
			err = prog.Judge(srv, cli)
		}
		if err != nil {
			t.Fatalf("%s: %v\nclient:\n%s\nserver:\n%s", prog.Name, err, cli.Out, srv.Out)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	ours := decodeCM(t, path)
	var attrs []string
	for _, m := range ours {
		attrs = append(attrs, m.attr)
	}
	// Each frame is captured twice, as one port sends it and as the other
	// receives it; decodeCM keeps one.
	want := []string{"REQ", "REP", "RTU", "DREQ", "DREP", "SIDR_REQ", "SIDR_REP"}
	if !slices.Equal(attrs, want) {
		t.Fatalf("taproce's CM MADs %v, want %v", attrs, want)
	}
	rxe := map[string]cmDecoded{}
	for _, name := range []string{"rxe-cm-rping.pcap", "rxe-cm-udaddy.pcap", "rxe-cm-write-bw.pcap"} {
		for _, m := range decodeCM(t, filepath.Join(testvectors.Dir(t), name)) {
			if _, ok := rxe[m.attr]; !ok {
				rxe[m.attr] = m
			}
		}
	}
	for _, m := range ours {
		r := rxe[m.attr]
		if diff := cmDiff(m, r); diff != "" {
			t.Errorf("%s differs from rxe's:\n%s\nours:  %s\nrxe's: %s", m.attr, diff, m.summary, r.summary)
		}
	}
}

// cmDecoded is one CM MAD as `taproce decode --json` shows it: the
// frame's fields, the MAD's, and the summary's key=value fields.
type cmDecoded struct {
	attr          string
	frame, mad    map[string]any
	summary       string
	summaryFields []string
}

// decodeCM decodes the capture at path and returns its CM MADs in order,
// each distinct frame once.
func decodeCM(t *testing.T, path string) []cmDecoded {
	t.Helper()
	var out bytes.Buffer
	if _, err := decode.File(&out, path, decode.Options{JSON: true}); err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
	var ms []cmDecoded
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var f map[string]any
		if err := json.Unmarshal([]byte(line), &f); err != nil {
			t.Fatalf("%s: %v: %s", path, err, line)
		}
		mad, ok := f["cm"].(map[string]any)
		if !ok {
			continue
		}
		delete(f, "cm")
		key := fmt.Sprint(f["src"], f["psn"], mad["summary"])
		if seen[key] {
			continue
		}
		seen[key] = true
		s, _ := mad["summary"].(string)
		delete(mad, "summary")
		ms = append(ms, cmDecoded{attr: fmt.Sprint(mad["attr"]), frame: f, mad: mad, summary: s, summaryFields: strings.Fields(s)[1:]})
	}
	return ms
}

// cmRunFields are the fields every run draws anew, left out of the
// comparison: of the frame, the MAD and the summary (by key).
var cmRunFields = map[string]bool{
	// The frame: its number and time, the hosts' MACs and addresses, the
	// PSN of each side's QP1 (how many MADs it sent before), the ICRC.
	"frame": true, "time": true, "src_mac": true, "dst_mac": true, "src": true, "dst": true, "psn": true,
	"icrc_want": true, "icrc_got": true,
	// The MAD: transaction and communication IDs, the service ID's port
	// and the CMA header's addresses, QPNs and PSNs.
	"tid": true, "local_comm_id": true, "remote_comm_id": true, "request_id": true, "service_id": true, "port": true,
	"qpn": true, "starting_psn": true, "cma_src": true, "cma_dst": true,
	// The summary's names for the same, and the flow label (a hash of the
	// QPNs). The GUID is compared as what it is made of (an EUI-64 of the
	// MAC), the path's GIDs and the CMA header's addresses by IP version.
	"lcid": true, "rcid": true, "req_id": true, "start_psn": true, "flow_label": true,
}

// sidPortSpace is a summary's service ID, whose port space is compared
// and whose port and number are not; eui64 a GUID made from a MAC.
var (
	sidPortSpace = regexp.MustCompile(`^0x[0-9a-f]+\(([A-Z]+):\d+\)$`)
	eui64        = regexp.MustCompile(`^0x[0-9a-f]{6}fffe[0-9a-f]{6}$`)
)

// ipVersions is "4>4", "6>6", … for a summary's "src>dst" addresses
// (with ports or without).
func ipVersions(v string) string {
	var vs []string
	for _, a := range strings.Split(v, ">") {
		if ap, err := netip.ParseAddrPort(a); err == nil {
			a = ap.Addr().String()
		}
		ip, err := netip.ParseAddr(a)
		switch {
		case err != nil:
			vs = append(vs, "?"+a)
		case ip.Unmap().Is4():
			vs = append(vs, "4")
		default:
			vs = append(vs, "6")
		}
	}
	return strings.Join(vs, ">")
}

// cmDiff lists the fields of ours and rxe's that differ, beyond those of
// cmRunFields; "" when none does.
func cmDiff(ours, rxe cmDecoded) string {
	var d []string
	cmp := func(what string, a, b map[string]any) {
		keys := map[string]bool{}
		for k := range a {
			keys[k] = true
		}
		for k := range b {
			keys[k] = true
		}
		for _, k := range slices.Sorted(func(yield func(string) bool) {
			for k := range keys {
				if !yield(k) {
					return
				}
			}
		}) {
			if !cmRunFields[k] && !reflect.DeepEqual(a[k], b[k]) {
				d = append(d, fmt.Sprintf("  %s %s: ours %v, rxe's %v", what, k, a[k], b[k]))
			}
		}
	}
	cmp("frame", ours.frame, rxe.frame)
	cmp("MAD", ours.mad, rxe.mad)
	cmp("summary", summaryMap(ours.summaryFields), summaryMap(rxe.summaryFields))
	return strings.Join(d, "\n")
}

// summaryMap takes a summary's fields apart: key=value, or a bare word
// (the transport, "RC") as a key of its own.
func summaryMap(fields []string) map[string]any {
	m := map[string]any{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			k, v = "word "+f, f
		}
		switch k {
		case "sid":
			if s := sidPortSpace.FindStringSubmatch(v); s != nil {
				v = s[1]
			}
		case "guid":
			if eui64.MatchString(v) {
				v = "EUI-64"
			}
		case "gid", "cma":
			v = ipVersions(v)
		}
		m[k] = v
	}
	return m
}
