// Package fabric is Weft's core API: endpoints that move message bursts
// between two machines over a fast fabric, registered memory, one-sided
// RMA, completions, capabilities, statistics, typed errors and the
// registry of backends.
//
// # Model
//
// An Endpoint is one side of a connection (a verbs queue pair, a libfabric
// endpoint, a DPDK port queue). It is opened by backend name and address:
//
//	ep, err := fabric.Open(ctx, "ntb", "/dev/shm/weft0", nil)
//
// Every backend's address is its own head followed by parameters as a
// URL query, HEAD?key=value&key=value (Usage tells a backend's keys); a
// malformed value or an unknown key is an error that names the key and
// matches ErrInvalid.
//
// Data lives in registered memory. Register makes caller memory a Region;
// Alloc gets a Region of backend memory (an NTB window, AF_XDP UMEM,
// pinned pages), which is what a peer can reach with RMA. A Region has a
// local key, a remote key (random, so peers cannot guess one) and access
// flags, and Close deregisters it.
//
// Send and Recv move bursts of Messages, DPDK-style: the caller owns the
// slice, each Message is a scatter/gather list of SGEs over regions plus
// optional 32-bit immediate data, and the return value n < len(msgs) is
// backpressure, not an error. Nothing on these paths allocates. Recv never
// blocks; RecvWait and SendWait busy-poll for Options.Spin and then sleep
// until the peer signals, which keeps latency at the spinning level while
// idle endpoints cost no CPU.
//
// Endpoints that can deliver messages in place also implement
// ViewReceiver: RecvViews returns Views into the backend's receive memory
// and ReleaseViews gives them back, oldest first, so a large message is
// copied once (by the sender) instead of twice.
//
// Write and Read are one-sided RMA into memory the peer registered with
// remote access and described with Region.Remote. The target's rules are
// enforced before memory is touched: a wrong key, a missing permission or
// an out-of-bounds address completes with a status matching ErrAccess and
// changes nothing. Backends without memory semantics return
// ErrNotSupported.
//
// Completions of signaled operations, and of every failed one, are polled
// from the endpoint's CompletionQueue in bursts.
//
// # Errors
//
// Errors wrap the sentinels of this package (ErrNotSupported, ErrAccess,
// ErrBounds, ErrPeerGone, ErrMessageSize, ErrInvalid, ErrMalformed ...)
// and os.ErrClosed after Close; test them with errors.Is. Operation
// errors are *OpError, which names the operation and the backend. Input
// that fails validation gives a *MalformedError (where and what; one
// preallocated value per check, so rejecting it allocates nothing), a
// dial that a listener refused a *RefusedError; read them with
// errors.As.
//
// # Backends
//
// Backends implement Endpoint and register a Driver with RegisterBackend
// from their init function. Their conformance is checked by
// fabric/fabrictest.
package fabric
