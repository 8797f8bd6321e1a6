// Package batch coalesces small packets into one fabric message per batch,
// the technique that lets a RoCE back-plane keep its low latency and still
// beat Ethernet on small packets: many packets travel as one RDMA message
// gathered by the NIC's scatter/gather entries, so the per-message costs
// (work request, doorbell, completion, ring slot, header) are paid once per
// batch instead of once per packet. It works over every fabric backend,
// through the fabric API only.
//
// # Sender
//
// A Coalescer takes packets, byte ranges in registered memory
// (fabric.SGE: AF_XDP UMEM frames, a router's packet buffers), and emits
// one message per batch. The message's SGE list is the batch header (SGE
// 0, in a header region the coalescer allocates with Endpoint.Alloc)
// followed by the packets themselves: nothing is copied where the backend
// gathers. A batch is flushed when it holds Options.MaxPackets packets
// (at most Caps.MaxSGEs-1), when the next packet would take it past
// Options.MaxBytes (at most Caps.MaxMsgSize), when its first packet has
// waited Options.Deadline (default 5 µs; the router calls Tick or Poll in
// its loop, or runs Run), or by an explicit Flush.
//
// A packet belongs to the coalescer from Add until its batch completes:
// a batch of at most Caps.InlineSize bytes is complete when Send returns
// (the backend copied it); a larger one is sent with fabric.FlagSignal and
// completes when its completion is polled. Reclaim returns the caller's
// per-packet cookies of completed batches, in order: those buffers are the
// caller's again. When the endpoint pushes back (Send takes fewer messages
// than offered) the batch stays queued and is retried by the next Add,
// Tick or Flush; nothing is lost or sent twice. When every descriptor is
// busy, Add refuses the packet with ErrFull and the caller keeps it.
//
// For packets bound to several next hops, a Group keeps one Coalescer per
// destination endpoint (batching is per peer: doorbells are per queue
// pair) and routes packets by destination index.
//
// # Receiver
//
// A Splitter receives messages into refcounted slots of a region it
// allocates, splits each batch back into packets that are views into the
// slot (no copy), and reuses a slot once the caller has released every
// packet of it. The header is validated before any packet is delivered: a
// malformed batch is dropped and counted, and Recv returns a
// *fabric.MalformedError matching fabric.ErrMalformed; no input can make it read out of bounds or
// panic. On an endpoint that can hand out its receive memory in place
// (fabric.ViewReceiver: ntb, roce, verbs), the splitter takes views and copies
// nothing at all: a slot then stands for one held view, given back to the
// endpoint, in order, once its packets are released; lengths are
// re-checked as packets are cut, since the peer can still write that
// memory. Messages that are not batches (sent by plain Send, without the
// batch immediate) are delivered whole, as one packet with Raw set, so a
// peer may mix batched and unbatched traffic.
//
// # Wire format (version 1)
//
// A batch is one message sent with fabric.FlagImm and immediate data Imm
// (0x57420001). Its first bytes are the header, all fields little-endian:
//
//	offset size field
//	0      2    magic "WB" (0x57 0x42)
//	2      1    version, 1
//	3      1    flags, 0 (receivers reject any set bit)
//	4      2    count: packets in the batch, at least 1
//	6      2    header length in bytes, at least 12+2*count; receivers
//	            skip bytes past the length table (room for later fields)
//	8      4    sequence number of the batch, per sender, +1 per batch
//	12     2*n  packet lengths, count entries, each 1..65535
//
// The packets follow the header back to back, in order; the message is
// exactly header length plus the sum of the packet lengths. A batch of n
// packets costs 12+2n header bytes: 138 bytes for 63 packets.
//
// # Costs
//
// Add, AddBurst, Flush, Tick, Poll, Reclaim, Recv and Release allocate
// nothing. A Coalescer reads the clock once per batch (at its first
// packet); Tick takes the time from the caller.
package batch
