// Package cm implements the wire formats of InfiniBand Communication
// Management (IBA vol. 1, chapters 13.4 and 12) and of the RDMA CM layer
// that Linux's rdma_cm and librdmacm put on top of it, as typed views over
// byte slices in the style of roce/wire and gVisor's tcpip/header.
//
// Connection management travels in 256-byte management datagrams (MADs)
// sent as UD SENDs to queue pair 1 (the GSI) with Q_Key [GSIQKey]:
//
//	MAD header (24 bytes) | CM message (232 bytes)
//
// [ParseMAD] validates a datagram's header (base version 1, class
// [ClassCM], class version 2, method Send, a known attribute) and returns
// a [MAD]; its [MAD.Data] is the message, read through the view of the
// attribute: [REQ], [MRA], [REJ], [REP], [RTU], [DREQ], [DREP],
// [SIDRReq] and [SIDRRep]. Every view has an IsValid method, and its
// accessors index the slice without further checks. Setters write
// through; none of these functions allocates.
//
// The rdma_cm layer adds service ids in IP port spaces ([ServiceID],
// [PortSpaceTCP], [PortSpaceUDP]) and a 36-byte header at the start of the
// REQ's and SIDR_REQ's private data carrying IP version, source port and
// the two IP addresses ([CMAHeader]). Reject reasons become [*RejectError]
// values that match fabric.ErrRefused, context.DeadlineExceeded and other
// sentinels with errors.Is.
//
// Facts about the formats were learned from public sources — the Linux
// RDMA core (include/rdma/ibta_vol1_c12.h, ib_mad.h, ib_cm.h,
// drivers/infiniband/core/cm.c and cma.c), rdma-core's librdmacm and
// Wireshark's InfiniBand dissector — and checked against captures of
// librdmacm programs between Linux Soft-RoCE peers (testdata). The code
// here is original.
package cm
