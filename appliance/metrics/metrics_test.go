package metrics_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/control"
	"github.com/taproce/taproce/appliance/metrics"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/internal/impair"
	"github.com/taproce/taproce/tap"
)

// scrape returns the text of reg's /metrics.
func scrape(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// TestCollector: two ports on a fake wire, one impaired; the scrape has
// each port's series under its labels, and the counters follow traffic.
func TestCollector(t *testing.T) {
	self, err := control.NetnsInode("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	app, err := appliance.New(appliance.Options{Socket: filepath.Join(t.TempDir(), "s"), LocalSwitch: true, Logger: log,
		PeerNetns: func(int32) (uint64, error) { return self, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	a, b := tap.NewFakePair(1500, 64)
	egress, err := impair.ParseSpec("duplicate=100%")
	if err != nil {
		t.Fatal(err)
	}
	for i, dev := range []tap.Device{a, b} {
		cfg := appliance.PortConfig{Namespace: "ns" + string(rune('a'+i)), Name: dev.Name(),
			Addrs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 66, 0, byte(i + 1)}), 24)}, Logger: log}
		if i == 1 {
			cfg.Egress = egress
		}
		if _, err := app.AddPortOn(dev, cfg); err != nil {
			t.Fatal(err)
		}
	}
	attached := 3
	h := metrics.Handler(metrics.NewRegistry(app, metrics.Options{Attachments: func() int { return attached }}))
	text := scrape(t, h)
	devA := `device="taproce0",port="nsa/` + a.Name() + `"`
	devB := `device="taproce1",port="nsb/` + b.Name() + `"`
	for _, want := range []string{
		"taproce_port_rx_frames_total{" + devA + "} ",
		"taproce_port_tx_bytes_total{" + devB + "} ",
		"taproce_port_rx_errors_total{" + devA + "} 0",
		`taproce_port_drops_total{` + devA + `,reason="icrc"} 0`,
		`taproce_port_drops_total{` + devA + `,reason="not_for_us"} `,
		"taproce_port_mtu_bytes{" + devA + "} 1500",
		`taproce_port_impaired_frames_total{action="duplicated",device="taproce1",direction="egress",port="nsb/` + b.Name() + `"} `,
		`taproce_port_impaired_frames_total{action="dropped",device="taproce1",direction="egress",port="nsb/` + b.Name() + `"} 0`,
		"taproce_transport_retransmits_total{" + devB + "} 0",
		"taproce_transport_window_cuts_total{" + devB + "} 0",
		`taproce_transport_cnps_total{device="taproce1",direction="sent",port="nsb/` + b.Name() + `"} 0`,
		`taproce_transport_naks_total{device="taproce0",direction="sent",port="nsa/` + a.Name() + `"} 0`,
		`taproce_transport_rnr_naks_total{device="taproce0",direction="received",port="nsa/` + a.Name() + `"} 0`,
		"taproce_transport_duplicate_requests_total{" + devA + "} 0",
		"taproce_transport_duplicate_responses_total{" + devA + "} 0",
		"taproce_transport_timeouts_total{" + devA + "} 0",
		`taproce_transport_packets_rejected_total{` + devA + `,reason="address"} 0`,
		`taproce_transport_packets_rejected_total{` + devA + `,reason="pkey"} 0`,
		`taproce_transport_packets_rejected_total{` + devA + `,reason="qkey"} 0`,
		"taproce_transport_gsi_mads_received_total{" + devA + "} 0",
		"taproce_transport_gsi_mads_sent_total{" + devA + "} 0",
		`taproce_transport_gsi_mads_dropped_total{device="taproce0",direction="received",port="nsa/` + a.Name() + `",reason="no_handler"} 0`,
		`taproce_transport_gsi_mads_dropped_total{device="taproce0",direction="received",port="nsa/` + a.Name() + `",reason="length"} 0`,
		`taproce_transport_gsi_mads_dropped_total{device="taproce0",direction="sent",port="nsa/` + a.Name() + `",reason="queue_full"} 0`,
		`taproce_transport_gsi_mads_dropped_total{device="taproce0",direction="sent",port="nsa/` + a.Name() + `",reason="unresolved"} 0`,
		"taproce_ports 2",
		"taproce_clients 0",
		"taproce_qps 0",
		"taproce_channels 0",
		"taproce_client_descriptors 0",
		"taproce_refused_connections_total 0",
		"taproce_attachments 3",
		"taproce_local_switch_frames_total 0",
		"go_goroutines ",
		"process_resident_memory_bytes ",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in the scrape", want)
		}
	}
	if strings.Contains(text, `taproce_port_impaired_frames_total{action="dropped",device="taproce0"`) || strings.Contains(text, `direction="ingress"`) {
		t.Error("impairment series for a direction without impairment")
	}

	// The ports announce themselves (ARP, ND): frames go both ways, and
	// the receiving station drops what is not for it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := app.NICs()[0].Port().Stats()
		if st.TxFrames > 0 && st.RxFrames > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no traffic: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	text = scrape(t, h)
	if strings.Contains(text, "taproce_port_tx_frames_total{"+devA+"} 0\n") || strings.Contains(text, "taproce_port_rx_frames_total{"+devA+"} 0\n") {
		t.Errorf("counters did not move:\n%s", grep(text, devA))
	}

	// A MAD of zeros from taproce0 to taproce1 crosses the local switch,
	// reaches taproce1's QP1 and is dropped by its connection manager as
	// malformed; one of the wrong size is refused.
	nics := app.NICs()
	if err := nics[0].SendMAD(netip.Addr{}, netip.AddrFrom4([4]byte{10, 66, 0, 2}), make([]byte, transport.MADSize)); err != nil {
		t.Fatal(err)
	}
	_ = nics[0].SendMAD(netip.Addr{}, netip.AddrFrom4([4]byte{10, 66, 0, 2}), make([]byte, 3))
	for _, want := range []string{
		"taproce_transport_gsi_mads_sent_total{" + devA + "} 1",
		`taproce_transport_gsi_mads_received_total{device="taproce1",port="nsb/` + b.Name() + `"} 1`,
		`taproce_cm_mads_dropped_total{device="taproce1",port="nsb/` + b.Name() + `",reason="malformed"} 1`,
		`taproce_cm_ids{device="taproce1",port="nsb/` + b.Name() + `",state="IDLE"} 0`,
		`taproce_transport_gsi_mads_dropped_total{device="taproce0",direction="sent",port="nsa/` + a.Name() + `",reason="invalid"} 1`,
	} {
		for deadline := time.Now().Add(5 * time.Second); !strings.Contains(text, want); text = scrape(t, h) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the scrape:\n%s", want, grep(text, "gsi"))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// A port that goes takes its series with it.
	if err := app.RemovePort("taproce1"); err != nil {
		t.Fatal(err)
	}
	text = scrape(t, h)
	if strings.Contains(text, devB) || !strings.Contains(text, "taproce_ports 1") {
		t.Errorf("after removing taproce1:\n%s", grep(text, "taproce_"))
	}
}

// grep returns the lines of text containing s.
func grep(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
