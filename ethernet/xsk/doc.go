// Package xsk is the AF_XDP socket layer of Weft's Ethernet backend: the
// UMEM, the fill, completion, RX and TX rings, and the socket, with the
// ring API of libxdp's xsk.h (Reserve/Set/Submit on producer rings,
// Peek/Release on consumer rings) plus burst helpers (Put, Get).
//
// Every index the kernel shares with user space (producer, consumer,
// flags) is read and written with atomic operations; each ring keeps
// cached copies so that a burst touches the shared cache lines once. Ring
// layouts come from the kernel (XDP_MMAP_OFFSETS), never from constants.
//
// A ring has one user-space producer or consumer: drive the RX side
// (RXRing, FillRing) from one goroutine and the TX side (TXRing,
// CompletionRing) from one goroutine, or serialise them yourself, as
// ethernet.Queue does.
//
// Sockets bind in zero-copy mode where the driver has it and in copy mode
// otherwise (ModeAuto), with need_wakeup (Socket.NeedsTXKick,
// FillRing.NeedsWakeup) and optional busy polling (BusyPoll). Several
// sockets can share one UMEM (XDP_SHARED_UMEM): on the same queue they
// share its fill and completion rings, on other queues or devices they
// get rings of their own.
//
// Socket.Poll and Socket.PollFor block a goroutine, not an OS thread:
// it parks in the Go runtime's network poller, on an epoll instance in
// which the socket is registered only while someone waits (a lasting
// registration would cost the busy-polling paths a kernel wake-up per
// flush), after the kicks poll(2) would make; Close wakes every waiter
// at once.
//
// Steering frames to a socket needs an XDP program with an XSKMAP; see
// ethernet.Program, or put Socket.FD into a map of your own.
package xsk
