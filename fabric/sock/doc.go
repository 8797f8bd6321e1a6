// Package sock carries byte streams over the fabric: a net.Conn over any
// reliable fabric.Endpoint (Caps().Reliable), and a net.Listener over a
// fabric.Listener, so that net/http, gRPC, database drivers and anything
// else that speaks net.Conn run over NTB, RoCE or AF_XDP without TCP/IP —
// the role rsocket and SMC-R play for RDMA.
//
//	l, err := sock.Listen(ctx, "ntb", "/dev/shm/weft0", nil)
//	...
//	c, err := sock.Dial(ctx, "ntb", l.Addr().String(), nil)
//
// # Protocol
//
// Each fabric message is one frame: an 8-byte header (type, flags, a
// reserved half-word that must be zero, and a credit grant) and, for DATA
// frames, the payload. Each side opens with a HELLO frame that names the
// protocol version and its receive window; the window is the sender's
// initial credit. Every later frame may grant further credit as the
// application consumes what it received: a sender never has more than
// the peer's window in flight, so a connection's receive memory is
// bounded by its window. The window may grow, doubling up to
// Config.MaxWindow, while the stream needs more (the bandwidth-delay
// product is larger than it): a DATA frame that spends the sender's last
// credit with more to send says so (a flag), and a receiver whose
// application has read everything grows its window and tells the sender
// with a WINDOW frame, whose credit carries the growth. A window never
// shrinks. FIN ends a direction (CloseWrite), CLOSE ends the
// connection, RST reports a protocol violation, and PING/PONG prove
// liveness while the connection is idle.
//
// Received data is copied once, from the endpoint's receive memory into
// the reader's slice, where the backend lends its memory (a
// fabric.ViewReceiver that reports its room, fabric.ViewRoom: ntb, roce):
// a Read waiting for data takes it straight from the view, and data that
// arrives while no Read waits stays in its view until one does, pinning
// at most about half the endpoint's receive memory so that the peer's
// control frames always get through. Beyond that, and over other
// endpoints, it is copied into the connection's buffer first.
//
// Concurrent Writes are never interleaved. Small ones (up to 2 KiB) that
// find another Write in progress queue behind it and go out together, as
// one DATA frame, once it is done, as TCP's autocorking does; a Write
// that finds none in progress goes out at once (no timer, no Nagle
// delay). A queued Write's deadline holds while it waits: one that
// passes before its bytes were taken returns a timeout with nothing
// written.
//
// A peer that sends a malformed or forged frame, more data than its
// credit, or nothing at all (not even an answer to a PING) for
// Config.StallTimeout gets its connection closed; the local calls then
// fail with a *ProtocolError that matches ErrCreditOverrun,
// fabric.ErrMalformed or ErrStalled with errors.Is. Other connections
// are not affected.
package sock
