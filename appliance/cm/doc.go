// Package cm is taproce's InfiniBand Connection Manager (IBA vol. 1
// ch. 12) on each port's QP1, and the RDMA CM's conventions on top of it
// (Linux drivers/infiniband/core/cma.c): what librdmacm programs and kernel
// rxe peers speak to set up RC and UD connections by IP address and port.
//
// This part is the wire format. CM messages are Management Datagrams
// (MADs, IBA 13.4): 256 bytes carried in a UD SEND to QP1 (the general
// services interface, Q_Key 0x80010000), on RoCEv2 inside UDP port 4791
// like every other packet:
//
//	+------------+----------------------------------------------+
//	| MAD header |  attribute: REQ, REP, RTU, DREQ, … (232 B)  |
//	|    24 B    |  fixed fields, then private data            |
//	+------------+----------------------------------------------+
//
// As in package roce, messages are []byte views with Fields and Encode:
// Parse validates a MAD once (its length, base version, management class,
// class version, and method for its attribute) and fills a caller's
// Message; Message.Encode writes one. Reserved bits are ignored on parse
// and written as 0, so encoding a parsed message gives back the bytes of
// every MAD a conforming sender wrote. Values wider than their field are
// cut to it.
//
// The RDMA CM puts IP addressing on top: the service ID names a port space
// and a port (ServiceID, PortSpace), and the first 36 bytes of a REQ's or
// SIDR_REQ's private data hold the addresses (CMAHeader).
//
// Bit positions follow the IBA tables (vol. 1, 12.6), which Linux's
// include/rdma/ibta_vol1_c12.h transcribes, and were checked against the
// CM MADs of real rxe hosts (../shared/vectors/rxe-cm-*.pcap).
package cm
