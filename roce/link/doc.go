// Package link carries the RoCE engine's packets: RoCEv2 UDP payloads
// between an engine (package roce) and its peers. A Link reads and writes
// bursts of Packets and can wait, without spinning, until one arrives.
//
//   - UDPLink is the interoperable carrier: a UDP socket on port 4791 (Port)
//     batched with recvmmsg and sendmmsg, an optional raw receive socket,
//     and UDP GSO and GRO between Weft engines (UDPConfig.GSO). Linux
//     Soft-RoCE and RDMA NICs read what it sends.
//   - XDPLink carries the same packets through an AF_XDP socket on the
//     interface that holds its IPv4 address, in Ethernet/IPv4/UDP frames
//     it builds itself (byte for byte what the kernel's UDP path sends),
//     with package ethernet's XDP program, UMEM and rings: no kernel UDP
//     path, and no system call per received packet.
//   - ShmLink carries packets through shared-memory rings to engines of the
//     same host, with no system call per packet.
//   - Engines of several processes share one address and port, as they
//     would share one NIC: each claims a block of QP numbers (QPNBlock),
//     and an SK_REUSEPORT eBPF program (steeringInstructions) steers every
//     packet to the process that owns its destination QP.
//   - LossyLink wraps a Link and drops, reorders, duplicates and corrupts
//     datagrams: the lossy soak and the retransmission tests use it.
//
// A link knows the wire format only as far as it must (roce/wire: the
// BTH's destination QP for steering, the ICRC of a GSO segment); the
// transport lives in package roce.
package link
