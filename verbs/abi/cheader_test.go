package abi

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"unicode"

	"github.com/taproce/taproce/shmem"
)

// The C client libraries (verbs/libibverbs) speak this package's protocol
// through verbs/libibverbs/abi.h, which TestCHeader writes from the Go
// definitions — structures by reflection, constants by name — and holds
// equal to them: the ABI is defined once, here.

var updateCHeader = flag.Bool("update-c-header", false, "rewrite verbs/libibverbs/abi.h from the Go definitions")

const cHeaderPath = "../libibverbs/abi.h"

// cStructs are the messages' bodies, in the order the header declares them
// (a structure before the ones that contain it).
var cStructs = []any{
	Header{}, Device{}, ListDevicesReply{}, OpenRequest{}, DeviceAttr{}, PortAttr{}, OpenReply{},
	QueryPortReply{}, HandleRequest{}, ErrnoReply{}, HandleReply{}, RegMRRequest{}, MRSegment{}, RegMRSegmentsRequest{}, RegMRReply{},
	CreateCQRequest{}, CreateCQReply{}, QPCaps{}, CreateQPRequest{}, CreateQPReply{}, QPAttr{},
	ModifyQPRequest{}, QueryQPReply{}, CreateSRQRequest{}, CreateSRQReply{}, ModifySRQRequest{},
	CreateAHRequest{}, Event{},
	SockAddr{}, CMCreateIDRequest{}, CMIDReply{}, CMIDRequest{}, CMDestroyReply{}, CMAddrRequest{}, CMQueryReply{},
	CMConnParam{}, CMConnectRequest{}, CMInitQPAttrReply{}, CMEvent{}, CMMigrateReply{},
}

// slotField is where a ring slot's encoder (Put) writes one field.
type slotField struct {
	name      string
	off, size int
}

// The slots' layouts, checked against Put by TestSlotLayouts.
var (
	sendWQEFields = []slotField{{"WR_ID", 0, 8}, {"OPCODE", 8, 1}, {"NUM_SGE", 9, 1}, {"FLAGS", 12, 4}, {"IMM", 16, 4},
		{"RKEY", 20, 4}, {"REMOTE_ADDR", 24, 8}, {"COMPARE_ADD", 32, 8}, {"SWAP", 40, 8}, {"AH", 48, 4},
		{"REMOTE_QPN", 52, 4}, {"REMOTE_QKEY", 56, 4}, {"INLINE_LEN", 60, 4}, {"SGL", 64, 16 * MaxSGE}, {"INLINE", sendInlineOff, MaxInline}}
	recvWQEFields = []slotField{{"WR_ID", 0, 8}, {"NUM_SGE", 8, 4}, {"SGL", 16, 16 * MaxSGE}}
	sgeFields     = []slotField{{"ADDR", 0, 8}, {"LENGTH", 8, 4}, {"LKEY", 12, 4}}
	cqeFields     = []slotField{{"WR_ID", 0, 8}, {"STATUS", 8, 1}, {"OPCODE", 9, 1}, {"SL", 10, 1}, {"DLID_PATH_BITS", 11, 1},
		{"VENDOR_ERR", 12, 4}, {"BYTE_LEN", 16, 4}, {"IMM", 20, 4}, {"QP_NUM", 24, 4}, {"SRC_QP", 28, 4},
		{"WC_FLAGS", 32, 4}, {"PKEY_INDEX", 36, 2}, {"SLID", 38, 2}}
)

// cConst is a constant of the header.
type cConst struct {
	name  string
	value any
}

func cConsts() [][]cConst {
	var ops []cConst
	for o := OpListDevices; o < opMax; o++ {
		ops = append(ops, cConst{"OP_" + strings.ToUpper(strings.ReplaceAll(o.String(), "-", "_")), int(o)})
	}
	statuses := []cConst{{"WC_SUCCESS", WCSuccess}, {"WC_LOC_LEN_ERR", WCLocLenErr}, {"WC_LOC_QP_OP_ERR", WCLocQPOpErr},
		{"WC_LOC_EEC_OP_ERR", WCLocEECOpErr}, {"WC_LOC_PROT_ERR", WCLocProtErr}, {"WC_WR_FLUSH_ERR", WCWRFlushErr},
		{"WC_MW_BIND_ERR", WCMWBindErr}, {"WC_BAD_RESP_ERR", WCBadRespErr}, {"WC_LOC_ACCESS_ERR", WCLocAccessErr},
		{"WC_REM_INV_REQ_ERR", WCRemInvReqErr}, {"WC_REM_ACCESS_ERR", WCRemAccessErr}, {"WC_REM_OP_ERR", WCRemOpErr},
		{"WC_RETRY_EXC_ERR", WCRetryExcErr}, {"WC_RNR_RETRY_EXC_ERR", WCRNRRetryExcErr}, {"WC_LOC_RDD_VIOL_ERR", WCLocRDDViolErr},
		{"WC_REM_INV_RD_REQ_ERR", WCRemInvRDReqErr}, {"WC_REM_ABORT_ERR", WCRemAbortErr}, {"WC_INV_EECN_ERR", WCInvEECNErr},
		{"WC_INV_EEC_STATE_ERR", WCInvEECStateErr}, {"WC_FATAL_ERR", WCFatalErr}, {"WC_RESP_TIMEOUT_ERR", WCRespTimeoutErr},
		{"WC_GENERAL_ERR", WCGeneralErr}}
	return [][]cConst{
		{{"ABI_MAGIC", Magic}, {"ABI_VERSION", Version}, {"HEADER_LEN", HeaderLen}, {"MAX_MESSAGE", MaxMessage},
			{"MAX_DEVICES", MaxDevices}, {"MAX_MR_SEGMENTS", MaxMRSegments}, {"MAX_GIDS", MaxGIDs}, {"FLAG_REPLY", FlagReply}, {"FLAG_EVENT", FlagEvent},
			{"DEFAULT_SOCKET", DefaultSocket}, {"SOCKET_ENV", SocketEnv}},
		ops,
		{{"STATE_BYTES", StateBytes}, {"SEND_SLOT", SendSlot}, {"RECV_SLOT", RecvSlot}, {"CQE_SLOT", CQESlot},
			{"MAX_SGE", MaxSGE}, {"MAX_INLINE", MaxInline}, {"QP_SEND_RETIRED", QPSendRetired},
			{"QP_RECV_RETIRED", QPRecvRetired}, {"QP_STATE_WORD", QPStateWord}, {"CQ_ARMED", CQArmed},
			{"CQ_FIRED", CQFired}, {"CQ_OVERFLOW", CQOverflow}, {"SRQ_RETIRED", SRQRetired}},
		{{"RING_HEADER_BYTES", shmem.RingHeaderBytes}, {"RING_MAGIC", shmem.RingMagic}, {"RING_VERSION", shmem.RingVersion},
			{"RING_OFF_MAGIC", shmem.RingOffMagic}, {"RING_OFF_VERSION", shmem.RingOffVersion},
			{"RING_OFF_SLOTS", shmem.RingOffSlots}, {"RING_OFF_SLOT_SIZE", shmem.RingOffSlotSize},
			{"RING_OFF_PROD", shmem.RingOffProd}, {"RING_OFF_CONS", shmem.RingOffCons},
			{"RING_OFF_CONS_SLEEP", shmem.RingOffConsSleep}, {"RING_OFF_PROD_SLEEP", shmem.RingOffProdSleep}},
		slotConsts("SWQE_", sendWQEFields), slotConsts("RWQE_", recvWQEFields), slotConsts("SGE_", sgeFields),
		{{"SGE_SIZE", 16}}, slotConsts("CQE_", cqeFields),
		{{"EVENT_CQ_ERR", EventCQErr}, {"EVENT_QP_FATAL", EventQPFatal}, {"EVENT_QP_REQ_ERR", EventQPReqErr},
			{"EVENT_QP_ACCESS_ERR", EventQPAccessErr}, {"EVENT_COMM_EST", EventCommEst}, {"EVENT_SQ_DRAINED", EventSQDrained},
			{"EVENT_PATH_MIG", EventPathMig}, {"EVENT_PATH_MIG_ERR", EventPathMigErr}, {"EVENT_DEVICE_FATAL", EventDeviceFatal},
			{"EVENT_PORT_ACTIVE", EventPortActive}, {"EVENT_PORT_ERR", EventPortErr}, {"EVENT_LID_CHANGE", EventLIDChange},
			{"EVENT_PKEY_CHANGE", EventPKeyChange}, {"EVENT_SM_CHANGE", EventSMChange}, {"EVENT_SRQ_ERR", EventSRQErr},
			{"EVENT_SRQ_LIMIT_REACHED", EventSRQLimitReached}, {"EVENT_QP_LAST_WQE_REACHED", EventQPLastWQEReached}},
		statuses,
		{{"QPT_RC", RC}, {"QPT_UC", UC}, {"QPT_UD", UD},
			{"QPS_RESET", QPSReset}, {"QPS_INIT", QPSInit}, {"QPS_RTR", QPSRTR}, {"QPS_RTS", QPSRTS}, {"QPS_SQD", QPSSQD},
			{"QPS_SQE", QPSSQE}, {"QPS_ERR", QPSErr},
			{"ACCESS_LOCAL_WRITE", AccessLocalWrite}, {"ACCESS_REMOTE_WRITE", AccessRemoteWrite},
			{"ACCESS_REMOTE_READ", AccessRemoteRead}, {"ACCESS_REMOTE_ATOMIC", AccessRemoteAtomic},
			{"MTU_256", MTU256}, {"MTU_512", MTU512}, {"MTU_1024", MTU1024}, {"MTU_2048", MTU2048}, {"MTU_4096", MTU4096},
			{"ROCE_HEADER_ROOM", RoCEHeaderRoom},
			{"WR_RDMA_WRITE", WRRDMAWrite}, {"WR_RDMA_WRITE_WITH_IMM", WRRDMAWriteWithImm}, {"WR_SEND", WRSend},
			{"WR_SEND_WITH_IMM", WRSendWithImm}, {"WR_RDMA_READ", WRRDMARead}, {"WR_ATOMIC_CMP_AND_SWP", WRAtomicCmpAndSwp},
			{"WR_ATOMIC_FETCH_AND_ADD", WRAtomicFetchAdd}, {"WR_SEND_WITH_INV", WRSendWithInv},
			{"SEND_FENCE", SendFence}, {"SEND_SIGNALED", SendSignaled}, {"SEND_SOLICITED", SendSolicited}, {"SEND_INLINE", SendInline},
			{"WC_SEND", WCSend}, {"WC_RDMA_WRITE", WCRDMAWrite}, {"WC_RDMA_READ", WCRDMARead}, {"WC_COMP_SWAP", WCCompSwap},
			{"WC_FETCH_ADD", WCFetchAdd}, {"WC_RECV", WCRecv}, {"WC_RECV_RDMA_WITH_IMM", WCRecvRDMAImm},
			{"WC_GRH", WCGRH}, {"WC_WITH_IMM", WCWithImm}, {"WC_WITH_INV", WCWithInv}},
		maskConsts(),
		{{"CM_PS_IPOIB", CMPortSpaceIPoIB}, {"CM_PS_IB", CMPortSpaceIB}, {"CM_PS_TCP", CMPortSpaceTCP}, {"CM_PS_UDP", CMPortSpaceUDP},
			{"CM_MAX_PRIVATE_DATA", CMMaxPrivateData}, {"AF_INET", AFInet}, {"AF_INET6", AFInet6},
			{"CM_EVENT_ADDR_RESOLVED", CMEventAddrResolved}, {"CM_EVENT_ADDR_ERROR", CMEventAddrError},
			{"CM_EVENT_ROUTE_RESOLVED", CMEventRouteResolved}, {"CM_EVENT_ROUTE_ERROR", CMEventRouteError},
			{"CM_EVENT_CONNECT_REQUEST", CMEventConnectRequest}, {"CM_EVENT_CONNECT_RESPONSE", CMEventConnectResponse},
			{"CM_EVENT_CONNECT_ERROR", CMEventConnectError}, {"CM_EVENT_UNREACHABLE", CMEventUnreachable},
			{"CM_EVENT_REJECTED", CMEventRejected}, {"CM_EVENT_ESTABLISHED", CMEventEstablished},
			{"CM_EVENT_DISCONNECTED", CMEventDisconnected}, {"CM_EVENT_DEVICE_REMOVAL", CMEventDeviceRemoval},
			{"CM_EVENT_MULTICAST_JOIN", CMEventMulticastJoin}, {"CM_EVENT_MULTICAST_ERROR", CMEventMulticastError},
			{"CM_EVENT_ADDR_CHANGE", CMEventAddrChange}, {"CM_EVENT_TIMEWAIT_EXIT", CMEventTimewaitExit}},
	}
}

func maskConsts() []cConst {
	return []cConst{{"QP_STATE", QPStateMask}, {"QP_CUR_STATE", QPCurState}, {"QP_ACCESS_FLAGS", QPAccessFlags},
		{"QP_PKEY_INDEX", QPPKeyIndex}, {"QP_PORT", QPPort}, {"QP_QKEY", QPQKey}, {"QP_AV", QPAV}, {"QP_PATH_MTU", QPPathMTU},
		{"QP_TIMEOUT", QPTimeout}, {"QP_RETRY_CNT", QPRetryCnt}, {"QP_RNR_RETRY", QPRNRRetry}, {"QP_RQ_PSN", QPRQPSN},
		{"QP_MAX_QP_RD_ATOMIC", QPMaxQPRdAtomic}, {"QP_ALT_PATH", QPAltPath}, {"QP_MIN_RNR_TIMER", QPMinRNRTimer},
		{"QP_SQ_PSN", QPSQPSN}, {"QP_MAX_DEST_RD_ATOMIC", QPMaxDestRdAtomic}, {"QP_PATH_MIG_STATE", QPPathMigState},
		{"QP_CAP", QPCap}, {"QP_DEST_QPN", QPDestQPN}}
}

func slotConsts(prefix string, fields []slotField) []cConst {
	var out []cConst
	for _, f := range fields {
		out = append(out, cConst{prefix + f.name, f.off})
	}
	return out
}

// snakeWords are the Go names whose capitals are not word starts.
var snakeWords = strings.NewReplacer("GIDs", "Gids", "PKey", "Pkey", "LKey", "Lkey", "RKey", "Rkey", "QKey", "Qkey",
	"TClass", "Tclass", "QPWR", "QpWr", "SRQWR", "SrqWr", "SRQSGE", "SrqSge")

// snake turns CamelCase into snake_case, keeping runs of capitals
// together: "QPNum" → "qp_num", "NodeGUID" → "node_guid".
func snake(s string) string {
	r := []rune(snakeWords.Replace(s))
	var b strings.Builder
	for i, c := range r {
		if unicode.IsUpper(c) && i > 0 && (unicode.IsLower(r[i-1]) || unicode.IsDigit(r[i-1]) ||
			i+1 < len(r) && unicode.IsLower(r[i+1]) && unicode.IsUpper(r[i-1])) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}

// cType returns the C declaration of a field of type t named name.
func cType(t reflect.Type, name string) string {
	switch t.Kind() {
	case reflect.Uint8:
		return "uint8_t " + name
	case reflect.Uint16:
		return "uint16_t " + name
	case reflect.Uint32:
		return "uint32_t " + name
	case reflect.Uint64:
		return "uint64_t " + name
	case reflect.Int32:
		return "int32_t " + name
	case reflect.Array:
		return cType(t.Elem(), fmt.Sprintf("%s[%d]", name, t.Len()))
	case reflect.Struct:
		return "struct taproce_" + snake(t.Name()) + " " + name
	}
	panic(fmt.Sprintf("no C type for %v", t))
}

func cHeader() string {
	var b bytes.Buffer
	b.WriteString(`/* Code generated by TestCHeader in verbs/abi from the Go definitions; DO NOT EDIT.
 * go test ./verbs/abi -run TestCHeader -update-c-header rewrites it. */
#ifndef TAPROCE_ABI_H
#define TAPROCE_ABI_H

#include <stddef.h>
#include <stdint.h>

`)
	for _, group := range cConsts() {
		for _, c := range group {
			switch v := c.value.(type) {
			case string:
				fmt.Fprintf(&b, "#define TAPROCE_%s %q\n", c.name, v)
			case uint16, uint32, int:
				if c.name == "ABI_MAGIC" || c.name == "RING_MAGIC" {
					fmt.Fprintf(&b, "#define TAPROCE_%s %#x\n", c.name, v)
					break
				}
				fmt.Fprintf(&b, "#define TAPROCE_%s %d\n", c.name, reflect.ValueOf(v).Convert(reflect.TypeFor[int64]()).Int())
			default:
				fmt.Fprintf(&b, "#define TAPROCE_%s %d\n", c.name, reflect.ValueOf(v).Convert(reflect.TypeFor[int64]()).Int())
			}
		}
		b.WriteByte('\n')
	}
	for _, s := range cStructs {
		t := reflect.TypeOf(s)
		name := "taproce_" + snake(t.Name())
		fmt.Fprintf(&b, "struct %s {\n", name)
		off, pad := 0, 0
		var asserts []string
		for i := range t.NumField() {
			f := t.Field(i)
			size := binary.Size(reflect.New(f.Type).Elem().Interface())
			field := snake(f.Name)
			if field == "errno" {
				field = "errnum" // errno is a macro in C
			}
			if f.Name == "_" {
				field = fmt.Sprintf("_pad%d", pad)
				pad++
			} else {
				asserts = append(asserts, fmt.Sprintf("_Static_assert(offsetof(struct %s, %s) == %d, \"%s.%s\");", name, field, off, t.Name(), f.Name))
			}
			fmt.Fprintf(&b, "\t%s;\n", cType(f.Type, field))
			off += size
		}
		fmt.Fprintf(&b, "} __attribute__((packed));\n")
		fmt.Fprintf(&b, "_Static_assert(sizeof(struct %s) == %d, \"%s\");\n", name, binary.Size(s), t.Name())
		for _, a := range asserts {
			b.WriteString(a + "\n")
		}
		b.WriteByte('\n')
	}
	b.WriteString("#endif /* TAPROCE_ABI_H */\n")
	return b.String()
}

// TestCHeader: verbs/libibverbs/abi.h is what the Go definitions make of
// it (-update-c-header rewrites it).
func TestCHeader(t *testing.T) {
	want := cHeader()
	if *updateCHeader {
		if err := os.WriteFile(cHeaderPath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(cHeaderPath)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s differs from the Go definitions: go test ./verbs/abi -run TestCHeader -update-c-header", cHeaderPath)
	}
}

// TestSlotLayouts: each ring slot's Put writes each field where the C
// header says.
func TestSlotLayouts(t *testing.T) {
	check := func(what string, slot []byte, fields []slotField, want map[string]uint64) {
		t.Helper()
		for _, f := range fields {
			v, ok := want[f.name]
			if !ok {
				continue
			}
			var got uint64
			switch f.size {
			case 1:
				got = uint64(slot[f.off])
			case 2:
				got = uint64(binary.LittleEndian.Uint16(slot[f.off:]))
			case 4:
				got = uint64(binary.LittleEndian.Uint32(slot[f.off:]))
			case 8:
				got = binary.LittleEndian.Uint64(slot[f.off:])
			}
			if got != v {
				t.Errorf("%s.%s at %d: %#x, want %#x", what, f.name, f.off, got, v)
			}
		}
	}
	slot := make([]byte, SendSlot)
	w := SendWQE{WRID: 0x1111, Opcode: 0x22, NumSGE: 2, Flags: 0x3333, Imm: 0x4444, RKey: 0x5555, RemoteAddr: 0x6666,
		CompareAdd: 0x7777, Swap: 0x8888, AH: 0x9999, RemoteQPN: 0xaaaa, RemoteQKey: 0xbbbb, Inline: []byte{1, 2, 3},
		SGL: [MaxSGE]SGE{{Addr: 0xc0, Length: 0xc1, LKey: 0xc2}, {Addr: 0xd0, Length: 0xd1, LKey: 0xd2}}}
	w.Put(slot)
	check("send WQE", slot, sendWQEFields, map[string]uint64{"WR_ID": 0x1111, "OPCODE": 0x22, "NUM_SGE": 2, "FLAGS": 0x3333,
		"IMM": 0x4444, "RKEY": 0x5555, "REMOTE_ADDR": 0x6666, "COMPARE_ADD": 0x7777, "SWAP": 0x8888, "AH": 0x9999,
		"REMOTE_QPN": 0xaaaa, "REMOTE_QKEY": 0xbbbb, "INLINE_LEN": 3})
	check("SGE 1", slot[64+16:], sgeFields, map[string]uint64{"ADDR": 0xd0, "LENGTH": 0xd1, "LKEY": 0xd2})
	if !bytes.Equal(slot[sendInlineOff:sendInlineOff+3], []byte{1, 2, 3}) {
		t.Error("inline data not at SWQE_INLINE")
	}
	slot = make([]byte, RecvSlot)
	r := RecvWQE{WRID: 0x1212, NumSGE: 1, SGL: [MaxSGE]SGE{{Addr: 0xe0, Length: 0xe1, LKey: 0xe2}}}
	r.Put(slot)
	check("receive WQE", slot, recvWQEFields, map[string]uint64{"WR_ID": 0x1212, "NUM_SGE": 1})
	check("receive SGE", slot[16:], sgeFields, map[string]uint64{"ADDR": 0xe0, "LENGTH": 0xe1, "LKEY": 0xe2})
	slot = make([]byte, CQESlot)
	c := CQE{WRID: 0x1313, Status: 1, Opcode: 2, SL: 3, DLIDPathBits: 4, VendorErr: 5, ByteLen: 6, Imm: 7, QPNum: 8, SrcQP: 9,
		Flags: 10, PKeyIndex: 11, SLID: 12}
	c.Put(slot)
	check("CQE", slot, cqeFields, map[string]uint64{"WR_ID": 0x1313, "STATUS": 1, "OPCODE": 2, "SL": 3, "DLID_PATH_BITS": 4,
		"VENDOR_ERR": 5, "BYTE_LEN": 6, "IMM": 7, "QP_NUM": 8, "SRC_QP": 9, "WC_FLAGS": 10, "PKEY_INDEX": 11, "SLID": 12})
}
