//go:build linux && cgo && rdma

package verbs

// The binding's cost without a device, for the benchmarks: cgo calls
// and a dry endpoint whose post path builds chains it never posts.

/*
#include "weft_cm.h"
*/
import "C"

import (
	"unsafe"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/cq"
)

// nop crosses into C and back, for the binding benchmark.
func (ep *Endpoint) nop() int { return int(C.weft_nop(ep.q)) }

// cgoNop crosses into C and back with no endpoint: the bare cost of a cgo
// call.
func cgoNop() int { return int(C.weft_nop(nil)) }

// newDryEndpoint returns an endpoint with the send path's C memory but no
// setup: post builds work request chains without posting them and
// nothing completes. It measures the binding's own cost per operation on
// hosts without RDMA (BenchmarkBindingPost).
func newDryEndpoint(depth, maxSGE, inline int) *Endpoint {
	ep := &Endpoint{setup: setup{depth: depth, maxSGE: maxSGE}, sender: sender{signal: max(depth/4, 1)},
		lifecycle: lifecycle{stop: make(chan struct{}), evs: make(chan fabric.Event, 1)},
		memory:    memory{regs: map[*C.struct_ibv_mr]*mrec{}}}
	ep.q = C.weft_q_new(C.int(depth), C.int(maxSGE), C.int(depth), 64)
	ep.swr = unsafe.Slice(ep.q.swr, depth)
	ep.sge = unsafe.Slice(ep.q.sge, depth*maxSGE)
	ep.sout = unsafe.Slice(ep.q.sout, 64)
	ep.slots = make([]sendSlot, depth)
	ep.comp = cq.New(0, 0)
	ep.dom = &fabric.Domain{Name: "verbs:dry"}
	ep.bounce = make([]byte, depth*inline)
	ep.bounceMR = (*C.struct_ibv_mr)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_ibv_mr{}))))
	ep.caps = fabric.Caps{MaxMsgSize: 1 << 20, MaxSGEs: maxSGE, InlineSize: inline, MaxRMASize: 1 << 30, RMA: true}
	return ep
}

// dryRegion is a region of the dry endpoint's domain (never registered).
func (ep *Endpoint) dryRegion(buf []byte) *fabric.Region {
	return fabric.NewRegion(fabric.RegionConfig{Buf: buf, Access: fabric.AccessLocalWrite, LocalKey: 1,
		Addr: uint64(uintptr(unsafe.Pointer(&buf[0]))), Domain: ep.dom})
}

// dryComplete marks everything posted as completed.
func (ep *Endpoint) dryComplete() { ep.tail = ep.head }

// freeDry releases the dry endpoint's C memory.
func (ep *Endpoint) freeDry() {
	C.free(unsafe.Pointer(ep.bounceMR))
	C.weft_q_free(ep.q)
}
