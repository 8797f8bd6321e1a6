package fabric

import (
	"context"
	"time"
)

// Endpoint is one side of a connection over a fabric: a queue pair in
// verbs terms, a connected endpoint in libfabric terms, a port queue in
// DPDK terms. Backends implement it; Open returns one.
//
// Data moves in bursts. Send, Recv, Write and Read take a caller-owned
// slice of messages and return how many they processed: n < len(msgs)
// with a nil error is backpressure (queue full, nothing more arrived) and
// is normal; the caller retries the rest later. An error with n > 0 means
// messages before n were processed and msgs[n] failed validation.
//
// Every method is safe for concurrent use. Each direction is serialised
// inside the endpoint, so concurrent senders interleave whole bursts;
// for the best rate give each goroutine its own endpoint or queue.
//
// After Close every method returns an error matching os.ErrClosed, and
// calls blocked in RecvWait, SendWait or a completion Wait return it too.
type Endpoint interface {
	// Send posts messages to the peer. Their buffers belong to the
	// endpoint until the message completes: at return for messages of at
	// most Caps.InlineSize bytes, otherwise when its completion (or a
	// later signaled one) is polled.
	Send(msgs []Message) (int, error)
	// Recv stores up to len(msgs) arrived messages into the messages'
	// SGEs, setting Len, Imm and Flags. It never blocks.
	Recv(msgs []Message) (int, error)
	// SendWait is Send that blocks until it has posted at least one
	// message, ctx is done or the endpoint fails.
	SendWait(ctx context.Context, msgs []Message) (int, error)
	// RecvWait is Recv that blocks until at least one message has arrived.
	// It busy-polls for Options.Spin before it sleeps.
	RecvWait(ctx context.Context, msgs []Message) (int, error)

	// Write posts RMA writes: each message's SGEs are written to its
	// Remote memory, and with FlagImm the peer gets a Recv notification
	// carrying Imm (write with immediate). Backends without RMA return
	// ErrNotSupported. Access violations at the target are reported as a
	// completion whose status matches ErrAccess.
	Write(msgs []Message) (int, error)
	// Read posts RMA reads of each message's Remote memory into its SGEs.
	Read(msgs []Message) (int, error)

	// Register registers caller memory with the given permissions.
	// Backends whose peer can only reach special memory (an NTB window,
	// AF_XDP UMEM) refuse remote permissions here with ErrNotSupported;
	// use Alloc.
	Register(buf []byte, access Access) (*Region, error)
	// Alloc allocates registered memory from the backend (window memory,
	// UMEM, pinned pages) with the given permissions. Any access mode a
	// backend supports is available through Alloc.
	Alloc(size int, access Access) (*Region, error)

	// CQ returns the endpoint's completion queue.
	CQ() CompletionQueue
	// Caps returns the endpoint's capabilities, fixed once it is open.
	Caps() Caps
	// Stats returns a snapshot of the endpoint's counters.
	Stats() Stats
	// Events returns a channel of link and peer events. It is buffered;
	// events that find it full are dropped (and counted in Stats).
	Events() <-chan Event
	// LocalAddr returns this side's address in the backend's syntax.
	LocalAddr() string
	// RemoteAddr returns the peer's address in the backend's syntax: the
	// address that was dialled, or for an accepted endpoint the peer as
	// the backend sees it, in a form Open can dial where the peer listens
	// there.
	RemoteAddr() string
	// Close releases the endpoint. It is idempotent.
	Close() error
}

// Caps are an endpoint's capabilities.
type Caps struct {
	// Backend is the registered name of the backend.
	Backend string
	// MaxMsgSize is the largest message Send accepts, in bytes.
	MaxMsgSize int
	// MaxSGEs is the longest SGE list an operation accepts.
	MaxSGEs int
	// MTU is the largest unit on the wire or in the ring; messages above
	// it are segmented.
	MTU int
	// InlineSize is the size up to which Send copies the payload before
	// it returns, so the buffers are free again at once.
	InlineSize int
	// RMA reports one-sided Write and Read.
	RMA bool
	// Atomics reports remote atomic operations.
	Atomics bool
	// Reliable reports that messages are delivered exactly once, in order,
	// or the endpoint fails.
	Reliable bool
	// MaxRMASize is the largest single RMA transfer.
	MaxRMASize int
	// Foreign reports that the peer is known not to be a Weft endpoint:
	// a program of rdma-core or perftest, or an application on a NIC's
	// verbs, met through an exchange that Weft's peers mark (roce's and
	// verbs' pingpong exchange, on RoCE: see exchange.WeftLID in roce/exchange). A foreign
	// peer says no goodbye when it closes, and speaks only its own
	// protocol, so only that protocol, or the keep-alive, tells when it
	// is done. False when the peer is Weft, and wherever the connection
	// itself carries the close (rdma_cm's DREQ, ntb, ethernet).
	Foreign bool
	// Path names the carrier the backend chose for this connection, where
	// it has several: roce's "udp" (or "udp+gso"), "shm" or "xdp" (see
	// roce's link=auto). Empty where a backend has one.
	Path string
}

// Options configure Open. The zero value selects every default.
type Options struct {
	// MaxMsgSize asks for at least this message size (0: the backend's
	// default).
	MaxMsgSize int
	// QueueDepth is the number of messages each direction can hold in
	// flight (0: the backend's default).
	QueueDepth int
	// CQSize is the capacity of the completion queue (0: 4096).
	CQSize int
	// Spin is how long blocking calls busy-poll before they sleep: 0 means
	// DefaultSpin, a negative value means sleep at once. Spinning is what
	// keeps latency low; sleeping costs a wake-up (tens of µs). It is the
	// most a wait spins: a wait whose spins keep ending in sleeps spins
	// less, and none spins while the host is oversubscribed.
	Spin time.Duration
	// Backlog bounds, for Listen, the connections that are in a handshake
	// or wait for Accept (0: DefaultBacklog); more are refused. Open
	// ignores it.
	Backlog int
	// HandshakeTimeout bounds, for Listen, how long one connecting peer
	// may take to complete its handshake (0: DefaultHandshakeTimeout).
	// Open's handshake is bounded by its context instead.
	HandshakeTimeout time.Duration
}

// DefaultSpin is the busy-poll budget of blocking calls when Options.Spin
// is zero.
const DefaultSpin = 100 * time.Microsecond

// SpinBudget returns the busy-poll budget that o selects.
func (o *Options) SpinBudget() time.Duration {
	switch {
	case o == nil || o.Spin == 0:
		return DefaultSpin
	case o.Spin < 0:
		return 0
	}
	return o.Spin
}

// EventKind is the type of an Event.
type EventKind uint8

// Event kinds.
const (
	// EventLinkUp: the link (and the transport handshake) came up.
	EventLinkUp EventKind = iota + 1
	// EventLinkDown: the link went down; the peer may come back.
	EventLinkDown
	// EventPeerGone: the peer closed or died; the endpoint is unusable.
	EventPeerGone
	// EventError: the endpoint entered an error state (see Err).
	EventError
)

var eventNames = [...]string{"", "link-up", "link-down", "peer-gone", "error"}

// String returns the kind's name.
func (k EventKind) String() string {
	if int(k) < len(eventNames) && k != 0 {
		return eventNames[k]
	}
	return "unknown"
}

// Event is a link or peer event.
type Event struct {
	Kind EventKind
	Time time.Time
	Err  error
}
