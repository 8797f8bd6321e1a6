// Package rndv moves messages of any size between two endpoints of a
// reliable fabric connection, with UCX's split between an eager and a
// rendezvous protocol:
//
//   - A message of at most Options.Threshold bytes goes eagerly: it is
//     copied into DATA frames (fragments of at most the endpoint's message
//     size), and the receiver copies it out into its buffer.
//   - A longer message goes by rendezvous where the endpoint has RMA
//     (fabric.Caps.RMA): the receiver advertises its buffer (ADV: an
//     address, a length and a remote key) and the sender writes the
//     message straight into it with RMA writes carrying immediate data.
//     The data crosses the fabric once, between the two applications'
//     registered buffers, with no copy through a ring: on ntb the one
//     copy is across the window, on roce the engine segments the WRITE,
//     on verbs the NIC moves it.
//
// A receive whose buffer can take a rendezvous (a region with
// fabric.AccessRemoteWrite, larger than the threshold) advertises it at
// once when the previous message was a rendezvous, so a stream of large
// messages costs no round trip beyond the data; otherwise the sender asks
// first (RTS) and waits for the answer. A receiver whose buffer cannot
// take a write answers RTS with an eager ADV, and the message comes as
// DATA. Messages are matched in order: the n-th Send is the n-th Recv.
//
// Both ends must use rndv over the same endpoint kind. Frames are
// validated before use: a malformed frame, a write the receiver did not
// ask for, or a message number out of order closes the connection with
// an error matching fabric.ErrMalformed. A rendezvous the peer committed
// to (it sent RTS and got the buffer, or it started writing into a buffer
// advertised before it asked) that does not complete within
// Options.Timeout closes it with ErrStalled. A write the peer's endpoint
// refuses (a wrong key, out of the region) fails Send with an error
// matching fabric.ErrAccess, and no memory is touched.
//
// A Send or Recv that its context ends before its message has started
// leaves the connection as it was; one that ends in the middle of its
// message fails the connection (see Send and Recv).
//
// Frames wait for the receiver in Options.Slots receive slots, which
// also carry the ADV a rendezvous Send waits for. A Send waiting for the
// peer's ADV behind more frames than there are slots (messages to this
// side that no Recv takes) waits until a Recv takes them: a side that
// sends large messages while the peer sends it many should receive
// concurrently.
//
// A buffer advertised to the peer is writable by it through the region's
// remote key for as long as the region is registered, as with any RDMA
// key: give rendezvous receives a region of their own.
package rndv
