// Package cm is taproce's InfiniBand Connection Manager (IBA vol. 1
// ch. 12) on each port's QP1, and the RDMA CM's conventions on top of it
// (Linux drivers/infiniband/core/cma.c): what librdmacm programs and kernel
// rxe peers speak to set up RC and UD connections by IP address and port.
//
// # Wire format
//
// CM messages are Management Datagrams (MADs, IBA 13.4): 256 bytes
// carried in a UD SEND to QP1 (the general services interface, Q_Key
// 0x80010000), on RoCEv2 inside UDP port 4791 like every other packet:
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
//
// # The manager
//
// A Manager is the CM of one port: the connection state machine (IBA
// 12.9), its timers and retries (12.7), SIDR (12.11), and the RDMA CM's
// conventions (Linux's cma.c: listeners by port and address, the CMA
// header, the MRA it owes a request its consumer has not answered). It
// does no I/O: MADs come in through Receive, go out through Config.Wire;
// time comes from Config.Now and Tick; what happens to an ID goes to its
// owner through Config.Events. Where the IBA leaves a choice, the manager
// does what Linux's drivers/infiniband/core/cm.c and cma.c do, since
// kernel rxe hosts are its peers: the REQ's values, the REJ reasons, the
// retransmission pace, what Destroy sends in each state.
//
// A connection, the calls and events of each side's owner and the states
// its ID passes through (Linux's names, State):
//
//	active                                  passive
//	                                        Listen
//	Connect           REQ_SENT      REQ ▶   ConnectRequest   MRA_REQ_SENT
//	                  MRA_REQ_RCVD  ◀ MRA   (a repeated REQ, not yet answered)
//	ConnectResponse   MRA_REP_SENT  ◀ REP   Accept           REP_SENT
//	Establish         ESTABLISHED   RTU ▶   Established      ESTABLISHED
//	                                        (or CommEstablished: the QP's first packet)
//	Disconnect        DREQ_SENT     DREQ ▶  Disconnected     DREQ_RCVD
//	Disconnected      TIMEWAIT      ◀ DREP  Disconnect       TIMEWAIT
//	TimeWaitExit      IDLE                  TimeWaitExit     IDLE
//
// The IDs are the owners' to destroy: one out of TimeWait stays IDLE
// until Destroy (or CloseOwner) forgets it.
package cm
