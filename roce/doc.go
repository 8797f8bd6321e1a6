// Package roce is Weft's user-space RoCEv2 engine: RDMA over Converged
// Ethernet in pure Go, over UDP, that interoperates with Linux Soft-RoCE
// (rxe) and RDMA NICs. Importing it registers the fabric backend "roce".
//
// # Model
//
// Engine is a software RDMA device, the user-space equivalent of rxe. It
// owns a link.Link (a UDP socket on port 4791 batched with recvmmsg and
// sendmmsg, shared memory between engines of one host (link=shm), an
// AF_XDP socket on the interface of the engine's address that bypasses
// the kernel's UDP path with the same bytes on the wire (link=xdp), or
// any other carrier of datagrams: see roce/link), protection domains (PD),
// memory regions (MR), completion queues (CQ) and reliable-connected or
// unreliable-datagram queue pairs (QP) with the verbs state machine, and
// speaks the RoCEv2 wire protocol (roce/wire): SEND, WRITE, READ and
// atomics, segmentation to the path MTU, go-back-N with RNR and duplicate
// handling, and the ICRC. Packets are processed by whoever polls; when
// nobody does, a background goroutine runs the retransmission timers.
//
// Endpoint is one queue pair as a fabric.Endpoint, connected to its peer
// by Connect: Send and Recv of message bursts, zero-copy receive
// (fabric.ViewReceiver), RMA Write and Read, and a peer that stops
// answering reported as fabric.ErrPeerGone.
//
// # Addresses
//
// Through the registry an endpoint is opened by the TCP address of the
// out-of-band exchange, in the format of rdma-core's ibv_rc_pingpong:
//
//	srv, err := fabric.Open(ctx, "roce", "listen:10.0.0.1:18515", nil) // one side
//	cli, err := fabric.Open(ctx, "roce", "10.0.0.1:18515", nil)        // the other
//
// "listen:" accepts one connection; otherwise the endpoint dials, retrying
// until the peer listens or ctx is done, so give Open a context with a
// deadline. A query sets the queue pair and the engine
// ("?mtu=4096&type=ud&local=10.0.0.2"); see ParseAddr. Package
// roce/exchange is the exchange itself, shared with the verbs backend
// (roce/verbs), which runs the same API and addresses over libibverbs.
// Weft's endpoints mark the exchange with their LID (exchange.WeftLID,
// meaningless on RoCE), so an endpoint knows a peer that is an rdma-core
// program: fabric.Caps.Foreign. rdma_cm addresses (roce/cm: cm.IsAddr)
// connect through the engine's own rdma_cm instead.
//
// # The link an address gets
//
// With no link= parameter an address runs the automatic link (link=auto,
// link.AutoLink): the engine opens its UDP socket, which every RoCE peer
// can take, and beside it a shared-memory ring named after its address.
// Its endpoints offer the ring when they connect: in the pingpong
// exchange (exchange.WeftShmLID, a LID that means nothing to rdma-core's
// programs) and, over rdma_cm, in the channel adapter GUID of the REQ and
// REP (a mark librdmacm and Linux's CM read nothing into; the private
// data stays the application's). A queue pair whose
// peer offered one, and whose ring this engine finds alive on this host,
// sends through it: Weft peers of one host talk without the kernel's
// network stack (BenchmarkEngineAuto beside BenchmarkEngine), with no
// flag on either side. Everything else gets the interoperable UDP wire:
// Linux rxe, NICs, rdma-core, librdmacm and perftest programs, link=udp
// peers, and peers on other hosts. The choice is per queue pair and each side's
// own: fabric.Caps.Path says "shm" or "udp". An engine whose ring name
// another engine of the host holds (the same address in another network
// namespace, or another process on a shared port) runs on UDP alone.
//
// A ring carries the engines' datagrams without their ICRC: it is memory
// between two Weft engines of this host, which no wire, NIC or capture
// sits on, so the sender does not compute it and the receiver does not
// check it (link.Packet.Unsealed; link.ShmLink, "The ICRC on a ring",
// for the one case a ring still needs it, which it then gets). The rule
// is per packet and exact at both ends: a sender leaves the ICRC out only
// of a packet its link writes into a ring (every packet of link=shm, a
// queue pair's packets on the automatic link when its fabric.Caps.Path is
// "shm"), and the ring tells the receiver which datagrams came so.
// Everything on UDP or AF_XDP, to any peer, carries a valid ICRC, byte
// for byte the RoCEv2 wire, and a received one is checked as ever
// (EngineConfig.NoICRC aside).
//
// One parameter forces a side: link=udp (UDP only, as before link=auto:
// no ring, no offer), link=shm (rings only, offered as link=auto's are, so
// that peers on the default link answer through them), link=xdp (AF_XDP), and gso=1,
// which asks for UDP with GSO. Across hosts the automatic link is UDP: it
// does not yet pick GSO or AF_XDP, which need the peer's agreement and
// privileges (see link.UDPConfig.GSO and link.XDPLink).
//
// # Errors
//
// Errors match the fabric sentinels with errors.Is. Every remote access is
// checked (key, protection domain, permission, bounds) before memory is
// touched; a violation is refused with a remote-access NAK and changes
// nothing.
//
// # Test tools
//
// exchange.PerftestConn (perftest's TCP exchange) and link.LossyLink (a
// Link that drops, reorders, duplicates and corrupts datagrams) exist for
// testing: the interop tests against perftest and the lossy soak use
// them. They are exported so that tests of programs built on Weft can use
// them too, and are not needed to move data.
package roce
