// Package exchange speaks the out-of-band exchanges that connect RoCE
// queue pairs before any packet flows, byte for byte as rdma-core's and
// perftest's programs do, so that Weft's engine (package roce), the verbs
// backend (roce/verbs) and those programs connect to one another.
//
//   - The pingpong exchange of ibv_rc_pingpong and ibv_ud_pingpong over TCP
//     (port 18515, DefaultBootstrapPort): each side sends its Dest (LID,
//     QPN, PSN, GID) and the client ends with "done". Client and Server run
//     it; Dial opens its connection. A Weft endpoint marks its Dest with
//     WeftLID, and a refusing server answers with a refusal that a Weft
//     client reads as a *fabric.RefusedError.
//   - perftest's exchange (PerftestConn): the preamble, the keys of each
//     side (PerftestKeys) and 8-byte synchronisations, as ib_send_bw and
//     its siblings speak it.
//
// Every message from the peer is parsed before it is used, and a
// malformed one is an error matching fabric.ErrMalformed.
package exchange
