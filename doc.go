// Package weft is the root of Weft, a Go SDK for fabric interconnects:
// RoCE (RDMA over Converged Ethernet), PCIe non-transparent bridges (NTB)
// and plain Ethernet through AF_XDP. Software routers and HPC message
// layers import it to move packets and messages between machines over a
// fast internal fabric, with one small API whatever the wire.
//
// The module is a set of packages around one core:
//
//   - fabric is the core API: an Endpoint with burst Send and Recv of
//     message batches (each message a scatter/gather list over registered
//     memory, with optional immediate data), memory registration with
//     local and remote keys and access flags, one-sided RMA (Write, Read)
//     where the backend has memory semantics, a completion queue polled in
//     bursts or waited on with a context, capabilities, statistics, typed
//     errors and a registry of backends, so a program opens an endpoint by
//     backend name and address string, like database/sql drivers.
//     Backends that can hand out their receive memory in place also
//     implement ViewReceiver (zero-copy receive, released in order).
//   - fabric/fabrictest is the conformance suite that every backend
//     passes, in one process and across two.
//   - ntb is the NTB backend: a device model that follows the Linux NTB
//     client API (memory windows with translation, doorbells,
//     scratchpads, link events), an emulated bridge over a shared-memory
//     file so two processes on one host are the two sides, and a ring
//     transport in the spirit of ntb_transport on top, with zero-copy
//     receive.
//   - roce is RoCEv2: the wire format, a user-space engine that speaks
//     RoCEv2 to Linux Soft-RoCE and RDMA NICs, and (roce/verbs, built
//     with -tags rdma) the libibverbs path for RDMA NICs.
//   - ethernet is AF_XDP: UMEM as registered memory, the four rings, the
//     XDP program that steers frames to the sockets, link discovery.
//   - batch coalesces small packets into one fabric message with SGEs,
//     the technique that lets a RoCE back-plane beat Ethernet on small
//     packets, over any backend; where the backend has zero-copy receive
//     (ntb, the RoCE engine, verbs) its splitter copies nothing.
//   - examples holds short programs over the public API, one concept
//     each: pingpong, stream, rma, batching, listener. The measuring
//     tools are cmd/weft-pingpong (latency) and the tools module: perf
//     (bandwidth, message rate, the batching sweep), router (the software
//     router) and perfcmp (AF_XDP beside C and Go references).
//
// Importing a backend package registers it:
//
//	import (
//		"github.com/weft-io/weft/fabric"
//		_ "github.com/weft-io/weft/ntb"
//	)
//
//	ep, err := fabric.Open(ctx, "ntb", "/dev/shm/weft0", nil)
//
// See README.md for the status of each backend and ARCHITECTURE.md for how
// the pieces fit.
package weft
