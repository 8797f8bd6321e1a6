// Package ntb is Weft's backend for PCIe non-transparent bridges (NTB):
// two hosts, or two processes, that reach each other's memory through
// windows of a bridge. Importing it registers the fabric backend "ntb".
//
// # Model
//
// Device is an NTB after Linux include/linux/ntb.h, for a two-port bridge:
// inbound memory windows translated into local memory, outbound windows
// that land in the peer's memory, a doorbell register, scratchpads and
// link events. ShmDevice emulates one in a shared-memory file: the two
// sides of the bridge are whoever opens the same file (two processes or
// two goroutines), and a process that dies takes its side of the link
// down at once. OpenMapping lays the same registers out in any memory two
// machines share, such as a PCI BAR (OpenIvshmem: QEMU's ivshmem between
// virtual machines, mapped through package ntb/pci), with a heartbeat for
// presence and polled doorbells. A device may offer a DMA engine
// (DMADevice); the emulated ones do. Hardware bridges plug in behind
// Device: package ntb/hw has their register maps and HWDevice is one
// driver over them all (OpenHardware), both UNTESTED ON HARDWARE: no
// bridge was at hand. Their tests check the registers the driver writes
// against the documented layouts, and run two HWDevices over a
// behavioural model of each family's chip (Intel, AMD, IDT, Switchtec)
// through the transport and the conformance suite (see HWDevice).
//
// Transport runs over a Device, in the spirit of Linux ntb_transport: a
// handshake over the scratchpads, or, on a bridge that has none but has
// message registers (Messenger, as IDT's switches, where Linux's
// ntb_transport does not run), over those, chosen at attach; then one
// SPSC ring per queue and direction in the receiver's window, with
// coalesced doorbells. Every
// store crosses the bridge as a write into the peer's window; nothing
// reads across it on the message path. Endpoint is one queue of a
// Transport as a fabric.Endpoint: Send and Recv of message bursts,
// zero-copy receive (fabric.ViewReceiver), RMA Write, write with
// immediate and Read against the regions the peer published, and peer
// loss reported as fabric.ErrPeerGone.
//
// # Addresses
//
// Through the registry an endpoint is opened by the file that emulates
// the bridge; both sides name the same file:
//
//	ep, err := fabric.Open(ctx, "ntb", "/dev/shm/weft0", nil)
//
// A query sets the device geometry (mem, mws, spads, dbbits; used when the
// file is created) and the transport (ring, maxmsg, window, dma), sizes
// with K, M or G suffixes: "/dev/shm/weft0?ring=1M&maxmsg=64K". An
// endpoint opened on its own carries one queue; a listener carries
// several, "/dev/shm/weft0?queues=4" to fabric.Listen, and with
// listener=1 (and optionally queue=N) fabric.Open dials it on a free
// queue of the bridge; see ParseAddr and Listen. A malformed or unknown
// parameter fails at once with an error that names its key and matches
// fabric.ErrInvalid.
// DialShm does the same as fabric.Open without the registry.
//
// A bridge in a PCI BAR shared with another machine is named by the PCI
// function, "pci:0000:00:05.0?side=0" (each machine names its side; bar,
// wc, off, size, poll, link and dead are optional), and one in a mapped
// file by "mem:PATH?..." (the host's view of an ivshmem device). A process
// may open any number of bridges; each is its own transport.
//
// # Errors
//
// Errors match the fabric sentinels with errors.Is. A value the peer
// writes that does not validate is dropped, counted in
// Stats.Drops[fabric.DropMalformed], reported as an event and ends the
// session, which the transport then renegotiates; no input from the peer
// can make this package read or write outside the windows or panic.
// ErrBusy reports that both sides of an emulated bridge are taken.
package ntb
