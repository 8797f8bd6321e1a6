package fabric

import "context"

// A View is a received message left where the backend received it: Data
// aliases the backend's receive memory (an NTB ring in the peer-written
// window, a queue pair's receive ring or slot) instead of being copied
// into caller SGEs. It stays valid until the view is released, and no
// longer than its endpoint: after Close, backends whose receive memory is
// a mapping leave the range mapped but zeroed, so a stale view reads
// zeros rather than crashing the process.
//
// The memory a view aliases is memory the peer can write: a hostile or
// broken peer may change Data while the caller reads it. Backends check
// every header and length before they hand out a view, so Data never
// reaches past the receive memory, but a caller that must parse the
// payload defensively against such a peer should copy it first.
type View struct {
	// Data is the payload. Empty for the notification of an RMA write
	// with immediate (FlagRemoteWrite).
	Data []byte
	// Imm is the immediate data, valid with FlagImm.
	Imm uint32
	// Flags are FlagImm and FlagRemoteWrite, as on Recv.
	Flags MsgFlags
	// Len is the message length: len(Data), or for FlagRemoteWrite the
	// number of bytes the peer wrote.
	Len int
}

// ViewReceiver is implemented by endpoints that can deliver messages
// without a copy, the receive side of DPDK mbufs, AF_XDP RX descriptors
// or libfabric's FI_MULTI_RECV buffers. Check for it with a type
// assertion:
//
//	if vr, ok := ep.(fabric.ViewReceiver); ok { ... }
//
// Views are released in the order they were received, oldest first; an
// unreleased view holds its receive memory, and with it the peer's
// sender, which sees backpressure once the memory is full. Recv may be
// mixed with RecvViews: the messages it copies out are freed together with
// the views received before them.
//
// When the link goes down (EventLinkDown) the views of that session are
// void: their memory is reset for the next session, and ReleaseViews
// accepts and ignores them.
type ViewReceiver interface {
	// RecvViews fills views with up to len(views) arrived messages. It
	// never blocks; n < len(views) is normal.
	RecvViews(views []View) (int, error)
	// RecvViewsWait is RecvViews that blocks until at least one message
	// has arrived, ctx is done or the endpoint fails. It busy-polls for
	// Options.Spin first, as RecvWait does.
	RecvViewsWait(ctx context.Context, views []View) (int, error)
	// ReleaseViews releases the n oldest outstanding views. Releasing
	// more views than are outstanding fails with ErrInvalid and releases
	// nothing.
	ReleaseViews(n int) error
	// OutstandingViews returns the number of views received and not yet
	// released.
	OutstandingViews() int
}

// ViewRoom is implemented by ViewReceivers that report the receive
// memory their outstanding views share with what is still to arrive: a
// caller that holds views for a while (fabric/sock keeps stream data in
// its views until the application reads it) bounds what it holds by it,
// so that the peer always finds room for the messages that must get
// through (acknowledgements, window updates, probes).
type ViewRoom interface {
	// ViewRoom returns the most views that may be outstanding at once
	// and the size in bytes of the receive memory they hold (each view
	// holding its payload and a record header of a few bytes).
	ViewRoom() (views, bytes int)
	// ViewEpoch returns a number that changes before the memory of any
	// outstanding view may be reset or reused: when the link went down
	// and a new session clears the receive memory, or the endpoint
	// closes (ntb: its transport's Close zeroes the memory), never on a
	// backend whose views stay intact until released. A caller that
	// holds views reads it before it receives them and checks it again
	// after it copies from one: a changed epoch means the copy may hold
	// zeros or another session's bytes and must be thrown away. An
	// implementation reads its counter with a read-modify-write, not a
	// plain atomic load, so that the copy made before the call is
	// ordered before the writes of a reset that comes after it.
	ViewEpoch() uint64
}
