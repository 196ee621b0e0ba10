// Package metrics exports an appliance's counters in the Prometheus
// format. The Collector reads them when scraped — the ports' frame and
// byte counters, their stations' drops by reason, their impairments,
// their transports' packets, rejections by reason, retransmissions,
// timeouts, NAKs and duplicates, the MADs of their QP1 (the GSI) received,
// sent and dropped by reason, and the control server's clients and
// objects — so nothing runs between scrapes and a port that goes away
// takes its series with it.
//
// Every per-port series has two labels: device, the verbs device name
// (taproce0), and port, the port's namespace (or attachment ID) and TAP
// name (lab-a/roce0, 0123abcd/eth0/roce0).
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/appliance/station"
	"github.com/taproce/taproce/appliance/transport"
	"github.com/taproce/taproce/internal/impair"
)

// Namespace prefixes every metric name.
const Namespace = "taproce"

// Options add to what a Collector reports.
type Options struct {
	// Attachments, when set, returns the number of ports attached to
	// pods, reported as taproce_attachments.
	Attachments func() int
}

// Collector is a prometheus.Collector of one appliance.
type Collector struct {
	app  *appliance.Appliance
	opts Options
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns the collector of app.
func NewCollector(app *appliance.Appliance, opts Options) *Collector {
	return &Collector{app: app, opts: opts}
}

// portLabels label every per-port series.
var portLabels = []string{"device", "port"}

func portDesc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "port", name), help, append(append([]string(nil), portLabels...), extra...), nil)
}

func cmDesc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "cm", name), help, append(append([]string(nil), portLabels...), extra...), nil)
}

func transportDesc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "transport", name), help, append(append([]string(nil), portLabels...), extra...), nil)
}

func globalDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, nil, nil)
}

// The metrics.
var (
	descRxFrames  = portDesc("rx_frames_total", "Frames the port read from its TAP device.")
	descRxBytes   = portDesc("rx_bytes_total", "Bytes of the frames the port read from its TAP device.")
	descTxFrames  = portDesc("tx_frames_total", "Frames the port wrote to its TAP device.")
	descTxBytes   = portDesc("tx_bytes_total", "Bytes of the frames the port wrote to its TAP device.")
	descRxErrors  = portDesc("rx_errors_total", "Reads of the TAP device that failed.")
	descTxErrors  = portDesc("tx_errors_total", "Writes to the TAP device that failed.")
	descDelivered = portDesc("delivered_total", "RoCEv2 packets the port passed to the transport (good headers, addresses and ICRC).")
	descDrops     = portDesc("drops_total", "Received frames the port dropped, by reason (its RoCE receive path or its station).", "reason")
	descImpair    = portDesc("impaired_frames_total", "Frames the port's fault injection acted on, by direction and action.", "direction", "action")
	descMTU       = portDesc("mtu_bytes", "MTU of the port's TAP device.")

	descSent         = transportDesc("packets_sent_total", "RoCEv2 packets the transport sent (requests, responses, acknowledgements).")
	descReceived     = transportDesc("packets_received_total", "RoCEv2 packets the transport received.")
	descDropped      = transportDesc("packets_dropped_total", "Received RoCEv2 packets the transport dropped (no such QP, bad state, invalid, rejected).")
	descRejected     = transportDesc("packets_rejected_total", "Received RoCEv2 packets for a QP that the transport dropped before the QP saw them, as rxe's check_addr and check_keys do, by reason: address (a connected QP's packet not from its peer's address to its own: spoofed or misrouted), pkey (P_Key outside the default partition), qkey (UD Q_Key not the QP's). Also in packets_dropped_total.", "reason")
	descRetransmits  = transportDesc("retransmits_total", "Request packets sent again.")
	descTimeouts     = transportDesc("timeouts_total", "Local ACK timeouts: requests that went unanswered for the QP's timeout.")
	descNAKs         = transportDesc("naks_total", "NAKs (PSN sequence error, invalid request, remote access or operational error), by direction.", "direction")
	descRNRNAKs      = transportDesc("rnr_naks_total", "Receiver-not-ready NAKs, by direction.", "direction")
	descDupRequests  = transportDesc("duplicate_requests_total", "Request packets the responder had already executed, answered again.")
	descDupResponses = transportDesc("duplicate_responses_total", "Acknowledgements and responses the completer had already seen.")
	descCNPs         = transportDesc("cnps_total", "Congestion notification packets (RoCEv2 Annex A17.9.3), by direction: sent for CE-marked requests, received by requesters.", "direction")
	descWindowCuts   = transportDesc("window_cuts_total", "Times a requester's congestion window was cut, for delay, loss or CNPs.")
	descGSIReceived  = transportDesc("gsi_mads_received_total", "MADs (IBA 13.4) QP1 received and handed to the port's connection manager.")
	descGSISent      = transportDesc("gsi_mads_sent_total", "MADs QP1 sent.")
	descGSIDropped   = transportDesc("gsi_mads_dropped_total", "MADs QP1 dropped, by direction and reason: received (also in packets_dropped_total) — no_handler (no connection manager), opcode (not a UD SEND), pkey (P_Key outside the default partition), qkey (not the GSI Q_Key 0x80010000), length (not 256 bytes), as rxe's checks and its MAD layer's receive buffer drop them; sent — queue_full (too many waited for address resolution), unresolved (the destination's MAC did not resolve), invalid (a MAD or address the transport refused).", "direction", "reason")

	descCMReceived   = cmDesc("mads_received_total", "CM MADs (IBA 12.6) the port's connection manager took, by attribute (REQ, REP, RTU, DREQ, …).", "attr")
	descCMSent       = cmDesc("mads_sent_total", "CM MADs the connection manager sent first or as answers, by attribute.", "attr")
	descCMRetries    = cmDesc("retries_total", "CM MADs sent again after their response timeout (REQ, REP, DREQ, SIDR_REQ), by attribute.", "attr")
	descCMDuplicates = cmDesc("duplicates_total", "CM MADs received again, answered again or ignored, by attribute.", "attr")
	descCMTimeouts   = cmDesc("timeouts_total", "CM MADs whose retries ran out, by attribute.", "attr")
	descCMDropped    = cmDesc("mads_dropped_total", "MADs the connection manager dropped, by reason: malformed, unsupported (LAP, APR, ClassPortInfo), unknown_id, state, qpn, backlog (a listener's full), limit (too many IDs).", "reason")
	descCMIDs        = cmDesc("ids", "The connection manager's IDs, listeners among them, by state (IBA 12.9).", "state")

	descPorts       = globalDesc("ports", "Ports (verbs devices) of the appliance.")
	descClients     = globalDesc("clients", "Clients connected to the control socket.")
	descPDs         = globalDesc("pds", "Protection domains of all clients.")
	descMRs         = globalDesc("mrs", "Memory regions of all clients.")
	descMRBytes     = globalDesc("mr_bytes", "Bytes of the memory regions of all clients.")
	descCQs         = globalDesc("cqs", "Completion queues of all clients.")
	descQPs         = globalDesc("qps", "Queue pairs of all clients.")
	descSRQs        = globalDesc("srqs", "Shared receive queues of all clients.")
	descAHs         = globalDesc("ahs", "Address handles of all clients.")
	descChannels    = globalDesc("channels", "Completion channels of all clients.")
	descClientFds   = globalDesc("client_descriptors", "Descriptors the appliance holds for its clients (bounded by appliance_limits.descriptors).")
	descRefused     = globalDesc("refused_connections_total", "Connections to the control socket refused at the appliance's or a user's limit.")
	descSwitch      = globalDesc("local_switch_frames_total", "Frames that crossed the local switch between the appliance's ports.")
	descAttachments = globalDesc("attachments", "Ports attached to pods through the admin API.")

	allDescs = []*prometheus.Desc{
		descRxFrames, descRxBytes, descTxFrames, descTxBytes, descRxErrors, descTxErrors, descDelivered, descDrops, descImpair, descMTU,
		descSent, descReceived, descDropped, descRejected, descRetransmits, descTimeouts, descNAKs, descRNRNAKs, descDupRequests, descDupResponses,
		descCNPs, descWindowCuts, descGSIReceived, descGSISent, descGSIDropped,
		descCMReceived, descCMSent, descCMRetries, descCMDuplicates, descCMTimeouts, descCMDropped, descCMIDs,
		descPorts, descClients, descPDs, descMRs, descMRBytes, descCQs, descQPs, descSRQs, descAHs, descChannels, descClientFds,
		descRefused, descSwitch, descAttachments,
	}
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	nics := c.app.NICs()
	for _, n := range nics {
		p := n.Port()
		dev, port := n.Name(), p.Namespace()+"/"+p.Device().Name()
		s := p.Stats()
		counter(descRxFrames, s.RxFrames, dev, port)
		counter(descRxBytes, s.RxBytes, dev, port)
		counter(descTxFrames, s.TxFrames, dev, port)
		counter(descTxBytes, s.TxBytes, dev, port)
		counter(descRxErrors, s.RxErrors, dev, port)
		counter(descTxErrors, s.TxErrors, dev, port)
		counter(descDelivered, s.Delivered, dev, port)
		for r, v := range s.Drops {
			counter(descDrops, v, dev, port, station.DropReason(r).String())
		}
		for _, d := range []struct {
			name string
			c    impair.Counters
		}{{"ingress", s.Ingress}, {"egress", s.Egress}} {
			if d.c.Frames == 0 {
				continue // no impairment in that direction
			}
			for _, a := range []struct {
				name string
				v    uint64
			}{
				{"dropped", d.c.Dropped}, {"duplicated", d.c.Duplicated}, {"reordered", d.c.Reordered},
				{"corrupted", d.c.Corrupted}, {"delayed", d.c.Delayed},
				{"queue_dropped", d.c.QueueDropped}, {"marked", d.c.Marked},
			} {
				counter(descImpair, a.v, dev, port, d.name, a.name)
			}
		}
		gauge(descMTU, float64(n.MTU()), dev, port)

		e := n.Engine()
		if e == nil {
			continue
		}
		t := e.Stats()
		counter(descSent, t.Sent, dev, port)
		counter(descReceived, t.Received, dev, port)
		counter(descDropped, t.Dropped, dev, port)
		for r, v := range t.Rejected {
			counter(descRejected, v, dev, port, transport.RejectReason(r).String())
		}
		counter(descRetransmits, t.Retransmits, dev, port)
		counter(descTimeouts, t.Timeouts, dev, port)
		counter(descNAKs, t.NAKsSent, dev, port, "sent")
		counter(descNAKs, t.NAKsReceived, dev, port, "received")
		counter(descRNRNAKs, t.RNRNAKsSent, dev, port, "sent")
		counter(descRNRNAKs, t.RNRNAKsReceived, dev, port, "received")
		counter(descDupRequests, t.DuplicateRequests, dev, port)
		counter(descDupResponses, t.DuplicateResponses, dev, port)
		counter(descCNPs, t.CNPsSent, dev, port, "sent")
		counter(descCNPs, t.CNPsReceived, dev, port, "received")
		counter(descWindowCuts, t.WindowCuts, dev, port)
		counter(descGSIReceived, t.GSIReceived, dev, port)
		counter(descGSISent, t.GSISent, dev, port)
		for r, v := range t.GSIDropped {
			counter(descGSIDropped, v, dev, port, "received", transport.GSIDropReason(r).String())
		}
		for r, v := range n.GSIStats().Dropped {
			counter(descGSIDropped, v, dev, port, "sent", appliance.MADDropReason(r).String())
		}
		cs := n.CM().Stats()
		for i := range cm.NumAttrs {
			attr := (cm.AttrREQ + cm.AttrID(i)).String()
			counter(descCMReceived, cs.Received[i], dev, port, attr)
			counter(descCMSent, cs.Sent[i], dev, port, attr)
			counter(descCMRetries, cs.Retries[i], dev, port, attr)
			counter(descCMDuplicates, cs.Duplicates[i], dev, port, attr)
			counter(descCMTimeouts, cs.Timeouts[i], dev, port, attr)
		}
		for r, v := range cs.Drops {
			counter(descCMDropped, v, dev, port, cm.DropReason(r).String())
		}
		for st, v := range cs.States {
			gauge(descCMIDs, float64(v), dev, port, cm.State(st).String())
		}
	}
	gauge(descPorts, float64(len(nics)))
	st := c.app.Control().Stats()
	gauge(descClients, float64(st.Clients))
	gauge(descPDs, float64(st.PDs))
	gauge(descMRs, float64(st.MRs))
	gauge(descMRBytes, float64(st.MRBytes))
	gauge(descCQs, float64(st.CQs))
	gauge(descQPs, float64(st.QPs))
	gauge(descSRQs, float64(st.SRQs))
	gauge(descAHs, float64(st.AHs))
	gauge(descChannels, float64(st.Channels))
	gauge(descClientFds, float64(st.Descriptors))
	counter(descRefused, st.Refused)
	if sw := c.app.Switch(); sw != nil {
		counter(descSwitch, sw.Frames())
	}
	if f := c.opts.Attachments; f != nil {
		gauge(descAttachments, float64(f()))
	}
}

// NewRegistry returns a registry holding the appliance's collector and
// the Go runtime's and the process's (memory, CPU, file descriptors).
func NewRegistry(app *appliance.Appliance, opts Options) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(app, opts), collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves reg's metrics in the Prometheus text (or OpenMetrics)
// format.
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true})
}
