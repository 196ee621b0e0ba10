// Package perf is taproce's perftest: the RDMA bandwidth and latency tests
// of linux-rdma/perftest (ib_write_bw, ib_read_bw, ib_send_bw,
// ib_atomic_bw, ib_write_lat, ib_read_lat, ib_send_lat, ib_atomic_lat) run
// through the verbs library against a taproce appliance.
//
// It speaks perftest's own out-of-band protocol on TCP (port 18515 by
// default, perftest_communication.c without rdma_cm), message for message
// and in perftest's order, so a taproce client runs against a perftest
// server and a perftest client against a taproce server:
//
//  1. version: 16 bytes, the version string NUL-padded ("6.06");
//  2. system data (when the peer's version is at least 5.32): the page
//     size ("cycle buffer") and the cache line size, 4-byte big-endian
//     ints; both sides take the larger, and sizes the buffer layout
//     cannot use (not powers of two, a cache line beyond the page, a page
//     over 1 MiB) end the exchange with ErrProtocol;
//  3. MTU: 2 bytes, the enum ibv_mtu as "%d" ("3\0" for 1024); both sides
//     take the smaller;
//  4. keys: 108 bytes per QP, "%04x:%04x:%06x:%06x:%08x:%016llx:" then
//     16 × "%02x:" for the GID and "%08x:" and a NUL: LID, outstanding
//     reads, QPN, PSN, rkey, address, GID, SRQ number. The same message
//     is sent again as a barrier (ctx_hand_shake) wherever perftest
//     synchronises: after connecting, per message size of the SEND
//     tests, at the end;
//  5. for the bandwidth tests other than SEND, the client's results
//     (xchg_bw_reports): size, iterations, peak, average and message
//     rate, 8 bytes each, big-endian;
//  6. close: a last barrier, then "done\0" from each side.
//
// In every exchange the client writes first and the server answers.
//
// The results are printed in perftest's tables, with the same columns and
// units (MB/sec with 1 MB = 2^20 bytes, or Gb/sec with --report_gbits;
// Mpps; usec), or as one JSON object per result line.
//
// Errors are sentences for the command to print after "taproce perf: ":
// they carry no prefix of their own, and name the option and the value as
// typed rather than quote strconv.
package perf
