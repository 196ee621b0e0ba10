//go:build ignore

// gen_rxe_frames writes rxe-frames.pcap: a few frames of Linux Soft-RoCE
// (rdma_rxe, kernel 6.1) traffic, copied unchanged from the captures in
// shared/vectors beside the repository, for the transport's wire-format
// tests (rxe_frames_test.go), which need nothing outside the repository.
//
// Run it from appliance/transport:
//
//	go run ./testdata/gen_rxe_frames.go [-vectors DIR]
//
// DIR defaults to $TAPROCE_VECTORS, else ../../../shared/vectors.
// The frames, in this order (frame numbers count from 1 in each capture,
// as `taproce decode` lists them):
//
//	rxe-send-lat.pcap       #23  RC SEND ONLY, 2 bytes, AckReq (ib_send_lat -s 2)
//	rxe-send-lat.pcap       #24  RC ACKNOWLEDGE of it
//	rxe-write-lat.pcap      #25  RC RDMA WRITE ONLY, 2 bytes (ib_write_lat -s 2)
//	rxe-read.pcap           #20  RC RDMA READ REQUEST, 64 bytes (ib_read_bw -s 64)
//	rxe-read.pcap           #25  RC RDMA READ RESPONSE ONLY answering it
//	rxe-atomic.pcap         #20  RC CMP_SWAP (ib_atomic_bw -A CMP_AND_SWAP)
//	rxe-atomic.pcap         #25  RC ATOMIC ACKNOWLEDGE answering it
//	rxe-write-bw-ipv6.pcap  #20  RC RDMA WRITE ONLY, 64 bytes, over IPv6 (ib_write_bw -x 0)
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/taproce/taproce/appliance/capture"
	"github.com/taproce/taproce/appliance/roce"
)

var frames = []struct {
	file   string
	number int // from 1
	op     roce.Opcode
}{
	{"rxe-send-lat.pcap", 23, roce.RCSendOnly},
	{"rxe-send-lat.pcap", 24, roce.RCAcknowledge},
	{"rxe-write-lat.pcap", 25, roce.RCRDMAWriteOnly},
	{"rxe-read.pcap", 20, roce.RCRDMAReadRequest},
	{"rxe-read.pcap", 25, roce.RCRDMAReadResponseOnly},
	{"rxe-atomic.pcap", 20, roce.RCCompareSwap},
	{"rxe-atomic.pcap", 25, roce.RCAtomicAcknowledge},
	{"rxe-write-bw-ipv6.pcap", 20, roce.RCRDMAWriteOnly},
}

func main() {
	def := os.Getenv("TAPROCE_VECTORS")
	if def == "" {
		def = filepath.Join("..", "..", "..", "shared", "vectors")
	}
	dir := flag.String("vectors", def, "directory of the rxe captures")
	out := flag.String("o", filepath.Join("testdata", "rxe-frames.pcap"), "file to write")
	flag.Parse()
	w, err := capture.Create(*out)
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range frames {
		all, err := capture.ReadFile(filepath.Join(*dir, f.file))
		if err != nil {
			log.Fatal(err)
		}
		if f.number < 1 || f.number > len(all) {
			log.Fatalf("%s has %d frames, no #%d", f.file, len(all), f.number)
		}
		fr := all[f.number-1]
		var p roce.Packet
		if err := roce.Parse(fr.Data, &p); err != nil {
			log.Fatalf("%s #%d: %v", f.file, f.number, err)
		}
		if err := p.VerifyICRC(fr.Data); err != nil {
			log.Fatalf("%s #%d: %v", f.file, f.number, err)
		}
		if p.BTH.Opcode != f.op {
			log.Fatalf("%s #%d is %v, want %v", f.file, f.number, p.BTH.Opcode, f.op)
		}
		if fr.Truncated() {
			log.Fatalf("%s #%d is truncated", f.file, f.number)
		}
		if err := w.WriteFrame(fr.Time, fr.Data); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s #%d: %v, %d bytes\n", f.file, f.number, p.BTH.Opcode, len(fr.Data))
	}
	if err := w.Close(); err != nil {
		log.Fatal(err)
	}
}
