package cm

import "strconv"

// RejectReason is a REJ's reason code (IBA vol. 1 table 109; Linux enum
// ib_cm_rej_reason). librdmacm hands it to the application as the status
// of RDMA_CM_EVENT_REJECTED.
type RejectReason uint16

// Reject reasons.
const (
	RejNoQP                      RejectReason = 1
	RejNoEEC                     RejectReason = 2
	RejNoResources               RejectReason = 3
	RejTimeout                   RejectReason = 4
	RejUnsupported               RejectReason = 5
	RejInvalidCommID             RejectReason = 6
	RejInvalidCommInstance       RejectReason = 7
	RejInvalidServiceID          RejectReason = 8 // no one listens: what rxe answers at once
	RejInvalidTransportType      RejectReason = 9
	RejStaleConn                 RejectReason = 10
	RejRDCNotExist               RejectReason = 11
	RejInvalidGID                RejectReason = 12
	RejInvalidLID                RejectReason = 13
	RejInvalidSL                 RejectReason = 14
	RejInvalidTrafficClass       RejectReason = 15
	RejInvalidHopLimit           RejectReason = 16
	RejInvalidPacketRate         RejectReason = 17
	RejInvalidAltGID             RejectReason = 18
	RejInvalidAltLID             RejectReason = 19
	RejInvalidAltSL              RejectReason = 20
	RejInvalidAltTrafficClass    RejectReason = 21
	RejInvalidAltHopLimit        RejectReason = 22
	RejInvalidAltPacketRate      RejectReason = 23
	RejPortCMRedirect            RejectReason = 24
	RejPortRedirect              RejectReason = 25
	RejInvalidMTU                RejectReason = 26
	RejInsufficientRespResources RejectReason = 27
	RejConsumerDefined           RejectReason = 28 // rdma_reject: the application said no
	RejInvalidRNRRetry           RejectReason = 29
	RejDuplicateLocalCommID      RejectReason = 30
	RejInvalidClassVersion       RejectReason = 31
	RejInvalidFlowLabel          RejectReason = 32
	RejInvalidAltFlowLabel       RejectReason = 33
	RejVendorOptionNotSupported  RejectReason = 35
)

var rejectNames = [...]string{
	RejNoQP:                      "NO_QP",
	RejNoEEC:                     "NO_EEC",
	RejNoResources:               "NO_RESOURCES",
	RejTimeout:                   "TIMEOUT",
	RejUnsupported:               "UNSUPPORTED",
	RejInvalidCommID:             "INVALID_COMM_ID",
	RejInvalidCommInstance:       "INVALID_COMM_INSTANCE",
	RejInvalidServiceID:          "INVALID_SERVICE_ID",
	RejInvalidTransportType:      "INVALID_TRANSPORT_TYPE",
	RejStaleConn:                 "STALE_CONN",
	RejRDCNotExist:               "RDC_NOT_EXIST",
	RejInvalidGID:                "INVALID_GID",
	RejInvalidLID:                "INVALID_LID",
	RejInvalidSL:                 "INVALID_SL",
	RejInvalidTrafficClass:       "INVALID_TRAFFIC_CLASS",
	RejInvalidHopLimit:           "INVALID_HOP_LIMIT",
	RejInvalidPacketRate:         "INVALID_PACKET_RATE",
	RejInvalidAltGID:             "INVALID_ALT_GID",
	RejInvalidAltLID:             "INVALID_ALT_LID",
	RejInvalidAltSL:              "INVALID_ALT_SL",
	RejInvalidAltTrafficClass:    "INVALID_ALT_TRAFFIC_CLASS",
	RejInvalidAltHopLimit:        "INVALID_ALT_HOP_LIMIT",
	RejInvalidAltPacketRate:      "INVALID_ALT_PACKET_RATE",
	RejPortCMRedirect:            "PORT_CM_REDIRECT",
	RejPortRedirect:              "PORT_REDIRECT",
	RejInvalidMTU:                "INVALID_MTU",
	RejInsufficientRespResources: "INSUFFICIENT_RESP_RESOURCES",
	RejConsumerDefined:           "CONSUMER_DEFINED",
	RejInvalidRNRRetry:           "INVALID_RNR_RETRY",
	RejDuplicateLocalCommID:      "DUPLICATE_LOCAL_COMM_ID",
	RejInvalidClassVersion:       "INVALID_CLASS_VERSION",
	RejInvalidFlowLabel:          "INVALID_FLOW_LABEL",
	RejInvalidAltFlowLabel:       "INVALID_ALT_FLOW_LABEL",
	RejVendorOptionNotSupported:  "VENDOR_OPTION_NOT_SUPPORTED",
}

// Known reports whether r is a reason the IBA defines.
func (r RejectReason) Known() bool { return int(r) < len(rejectNames) && rejectNames[r] != "" }

// String names the reason as Linux's enum does, without its prefix
// ("INVALID_SERVICE_ID", "CONSUMER_DEFINED"), or "REASON_<n>".
func (r RejectReason) String() string {
	if r.Known() {
		return rejectNames[r]
	}
	return "REASON_" + strconv.Itoa(int(r))
}
