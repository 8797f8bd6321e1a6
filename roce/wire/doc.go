// Package wire implements the RoCEv2 wire format (InfiniBand transport
// headers carried in UDP, IBTA Annex A17) as typed views over byte slices,
// in the style of gVisor's pkg/tcpip/header.
//
// A header type such as [BTH] is a []byte. Its accessors index the slice
// without bounds checks of their own: callers check the length first, with
// [BTH.IsValid] or the header's size constant, or obtain the view from
// [Parse], which validates the whole packet. The views neither copy nor
// allocate, and the setters write through to the underlying buffer.
//
// A RoCEv2 packet is a UDP datagram to port [UDPPort] whose payload is
//
//	BTH | extended headers (by opcode) | payload | pad (0-3) | ICRC (4)
//
// The extended transport headers that follow the BTH, and their order, are
// a function of the opcode alone (see [OpCode.ExtHeaders]); [Parse] uses
// that table to split a UDP payload into a [Packet] of sub-slices, and
// [Build] writes the headers of a packet into a caller's buffer.
//
// The invariant CRC ([ICRC], [VerifyICRC], [PutICRC]) covers the IP and UDP
// headers as well, with the fields that routers may change masked to ones,
// so it is computed over the IP packet rather than the UDP payload.
// [SplitIP] finds both in a received frame:
//
//	ip, udp, err := wire.SplitIP(frame[14:]) // after the Ethernet header
//	if err == nil {
//		err = wire.VerifyICRC(ip)
//	}
//	if err == nil {
//		pkt, err = wire.Parse(udp)
//	}
//
// Malformed input yields a preallocated *fabric.MalformedError, which
// matches fabric.ErrMalformed and whose Code is a [Reason]; none of these
// functions allocates, on success or failure.
//
// Also here: 24-bit [PSN] arithmetic, AETH [Syndrome] decoding, the [GID]
// type (IPv4-mapped or IPv6 addresses) and the Linux choice of UDP source port
// ([UDPSrcPort]).
//
// The package supports the RC, UC and UD transports and CNPs. RD and XRC
// opcodes (which need the RDETH and XRCETH headers) and the newer FLUSH
// and ATOMIC_WRITE opcodes are rejected as unsupported.
//
// Facts about the format were taken from public implementations of it:
// the Linux soft-RoCE driver (drivers/infiniband/sw/rxe: rxe_hdr.h,
// rxe_opcode.c, rxe_icrc.c), rdmavt (the AETH credit table), the Linux
// RDMA core (rdma_flow_label_to_udp_sport, rdma_calc_flow_label) and
// scapy's RoCE layer and tests. The code here is original.
package wire
