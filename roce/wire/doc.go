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
//
// Facts about the format were taken from public descriptions of it: the
// Linux soft-RoCE driver (drivers/infiniband/sw/rxe), rdmavt, the Linux
// RDMA core headers, Wireshark's InfiniBand dissector and scapy's RoCE
// layer. The code here is original.
package wire
