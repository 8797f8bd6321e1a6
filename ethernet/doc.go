// Package ethernet is Weft's Ethernet backend: AF_XDP sockets on Linux
// interface queues, with an XDP program that steers selected frames to
// them and leaves the rest to the kernel stack.
//
// It serves two kinds of users.
//
// Routers and packet processors use Port and Queue: raw frame bursts on
// interface queues, in the style of DPDK's rte_eth_rx_burst and
// rte_eth_tx_burst, with caller-owned Frame slices and a frame pool per
// queue. Frames live in the UMEM, so a frame received on one queue can be
// sent on another without a copy. The ring-level API (fill, completion,
// RX and TX rings with reserve/submit/peek/release, like libxdp's xsk.h)
// is in package ethernet/xsk.
//
//	port, err := ethernet.Open("eth0", &ethernet.Config{
//		Filter: ethernet.Filter{UDPPorts: []uint16{4789}},
//	})
//	...
//	q := port.Queue(0)
//	n, err := q.Recv(frames)     // never blocks; n < len(frames) is normal
//	... process q.Data(frames[i]) ...
//	q.Release(frames[:n])        // or q.Send(frames[:n]) to forward
//
// Fabric users get a fabric.Endpoint: import the package for its side
// effect and open the "ethernet" backend with an address such as
// "eth0", "eth0?peer=02:00:00:00:00:02" or "eth0?udp=10.0.0.2" (see
// ParseAddr and the driver's Usage; the older "eth0:peer=..." form, with
// options after a colon separated by commas, is accepted too). The
// endpoint is a reliable, ordered message connection to one peer (Caps.Reliable): sequence numbers,
// cumulative and negative acknowledgements, selective retransmission
// from the UMEM, credit-based flow control, segmentation of messages
// larger than the MTU, and a handshake, FIN and keepalives so that a
// peer that goes away is reported (fabric.ErrPeerGone,
// fabric.EventPeerGone; keep-alives every second, or a quarter of
// timeout= if that is shorter).
//
// Two endpoints that Open each other pair up (a symmetric open). A
// Listener on a queue accepts any number of peers, which dial the address
// its Addr returns with their own interface name: "eth1?peer=MAC&listener=1".
// listener=1 flags the hello for the listener, so that it reaches the
// listener even when a dialer on that queue names the same peer, as when
// the ranks of a mesh dial each other's listeners at once. Frames carry a 28-byte Weft header directly
// over Ethernet (EtherType 0x88B5) or over UDP/IPv4. RMA is not
// supported (Write and Read return fabric.ErrNotSupported).
//
// # XDP program
//
// The program is generated in Go with cilium/ebpf's asm package (no
// clang at build time). It redirects frames that match a Filter (UDP
// destination port, EtherType, or all) into an XSKMAP indexed by RX
// queue, and returns XDP_PASS for everything else, including frames of
// queues without a socket. It is attached with a bpf_link, in native
// (driver) mode where the driver supports it and generic (skb) mode
// otherwise. Weft never replaces or detaches a program it did not
// attach: an interface that already has one is refused with ErrXDPInUse,
// and Close detaches exactly Weft's link (so does the process dying).
//
// # Modes
//
// Sockets bind in zero-copy mode where the driver supports it and fall
// back to copy mode otherwise (xsk.ModeAuto; Queue.ZeroCopy reports the
// outcome). veth supports native XDP but not AF_XDP zero-copy, so on veth
// sockets run in copy mode. need_wakeup is on by default, and busy
// polling (SO_PREFER_BUSY_POLL, SO_BUSY_POLL, SO_BUSY_POLL_BUDGET) is
// available through Config.BusyPoll.
//
// # Links
//
// LinkByName, LinkByIndex and Addrs read interface state with rtnetlink
// (index, MAC, MTU, queue counts, addresses, attached XDP program), and
// WatchLink follows up/down changes through the RTNLGRP_LINK multicast
// group; endpoints report them as fabric.EventLinkDown/EventLinkUp.
//
// # Namespaces
//
// Everything that names an interface (Open, Dial, Program.Attach, the
// link functions) works in the network namespace of the calling OS
// thread. Sockets made there keep working from any goroutine.
//
// # Requirements
//
// Linux 5.10 or later (bpf_link XDP attachment, shared UMEM across
// queues), and CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF (or root).
// Operations that the kernel or driver lacks fail with errors matching
// fabric.ErrNotSupported.
//
// # Errors
//
// An address that cannot be right fails at once with an error matching
// fabric.ErrInvalid: a malformed or unknown parameter (the error names
// its key), a string that is not a Linux interface name, and a name that
// no interface of the namespace has (that error also matches the
// kernel's ENODEV). A missing kernel or driver feature is
// fabric.ErrNotSupported, never fabric.ErrInvalid.
package ethernet
