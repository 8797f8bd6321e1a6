//go:build linux && cgo && rdma

package verbs

// Memory: regions registered for the caller (Register, Alloc) and the
// endpoint's own mappings, the receive ring and the bounce buffers.

/*
#include "weft_cm.h"

static inline struct ibv_mr *weft_reg_mr(struct ibv_pd *pd, uint64_t addr, size_t len, int access) {
	return ibv_reg_mr(pd, (void *)(uintptr_t)addr, len, access);
}
*/
import "C"

import (
	"os"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
)

// memory owns the regions registered for the caller, by memory region;
// Close deregisters those still there.
type memory struct {
	regMu sync.Mutex
	regs  map[*C.struct_ibv_mr]*mrec
}

// mrec is a registered region: its memory region and, for Go memory,
// the pin that keeps the buffer in place.
type mrec struct {
	mr  *C.struct_ibv_mr
	pin runtime.Pinner
}

// accessFlags is the ibv_access_flags of a.
func accessFlags(a fabric.Access) C.int {
	var f C.int
	if a&(fabric.AccessLocalWrite|fabric.AccessRemoteWrite|fabric.AccessRemoteAtomic) != 0 {
		f |= C.IBV_ACCESS_LOCAL_WRITE // verbs requires it with remote write and atomics
	}
	if a.Has(fabric.AccessRemoteWrite) {
		f |= C.IBV_ACCESS_REMOTE_WRITE
	}
	if a.Has(fabric.AccessRemoteRead) {
		f |= C.IBV_ACCESS_REMOTE_READ
	}
	if a.Has(fabric.AccessRemoteAtomic) {
		f |= C.IBV_ACCESS_REMOTE_ATOMIC
	}
	return f
}

// Register implements fabric.Endpoint: buf (Go or C memory) is pinned
// and registered with ibv_reg_mr. The region's address for RMA is buf's
// virtual address, as verbs has it.
func (ep *Endpoint) Register(buf []byte, access fabric.Access) (*fabric.Region, error) {
	return ep.register(buf, access, false)
}

// Alloc implements fabric.Endpoint: page-aligned memory from mmap,
// registered. Close deregisters it; the mapping itself is released when
// the Region is no longer reachable, so keep the Region while you use its
// Bytes.
func (ep *Endpoint) Alloc(size int, access fabric.Access) (*fabric.Region, error) {
	if size <= 0 {
		return nil, opErr("alloc", fabric.ErrInvalid)
	}
	if ep.closed.Load() {
		return nil, opErr("alloc", fabric.ErrClosed)
	}
	pg := os.Getpagesize()
	buf, err := unix.Mmap(-1, 0, (size+pg-1)&^(pg-1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, opErr("mmap", err)
	}
	r, err := ep.register(buf[:size:size], access, true)
	if err != nil {
		unix.Munmap(buf)
		return nil, err
	}
	// Close deregisters the region, but its memory stays mapped while the
	// Region is reachable, so Bytes never dangles.
	runtime.AddCleanup(r, func(b []byte) { unix.Munmap(b) }, buf)
	return r, nil
}

// register pins buf (unless it is mapped memory, which stays put) and
// registers it; the region's Deregister releases both.
func (ep *Endpoint) register(buf []byte, access fabric.Access, mapped bool) (*fabric.Region, error) {
	if len(buf) == 0 {
		return nil, opErr("register", fabric.ErrInvalid)
	}
	ep.life.RLock()
	defer ep.life.RUnlock()
	if ep.closed.Load() {
		return nil, opErr("register", fabric.ErrClosed)
	}
	rec := &mrec{}
	if !mapped {
		rec.pin.Pin(&buf[0])
	}
	addr := uint64(uintptr(unsafe.Pointer(&buf[0])))
	mr, err := C.weft_reg_mr(ep.pd, C.uint64_t(addr), C.size_t(len(buf)), accessFlags(access))
	if mr == nil {
		rec.pin.Unpin()
		return nil, errnoErr("ibv_reg_mr", err, 0)
	}
	rec.mr = mr
	ep.regMu.Lock()
	ep.regs[mr] = rec
	ep.regMu.Unlock()
	var rkey fabric.Key
	if access&fabric.AccessRemote != 0 {
		rkey = fabric.Key(mr.rkey)
	}
	return fabric.NewRegion(fabric.RegionConfig{Buf: buf, Access: access, LocalKey: fabric.Key(mr.lkey),
		RemoteKey: rkey, Addr: addr, Domain: ep.dom, Deregister: func() error { return ep.deregister(mr) }}), nil
}

// deregister releases a region; after Close did it already, it is a
// no-op.
func (ep *Endpoint) deregister(mr *C.struct_ibv_mr) error {
	ep.regMu.Lock()
	rec := ep.regs[mr]
	delete(ep.regs, mr)
	ep.regMu.Unlock()
	if rec == nil {
		return nil
	}
	return rec.release()
}

// release deregisters the region and unpins its buffer.
func (rec *mrec) release() error {
	var err error
	if rc := C.ibv_dereg_mr(rec.mr); rc != 0 {
		err = errnoErr("ibv_dereg_mr", nil, rc)
	}
	rec.pin.Unpin()
	return err
}

// releaseRegions deregisters every region still registered.
func (ep *Endpoint) releaseRegions() {
	ep.regMu.Lock()
	for mr, rec := range ep.regs {
		rec.release()
		delete(ep.regs, mr)
	}
	ep.regMu.Unlock()
}

// mapRings maps and registers the receive ring (depth slots of maxMsg
// bytes, after the GRH on UD) and the bounce buffers (depth slots of
// inline bytes), once for the endpoint's life.
func (ep *Endpoint) mapRings(maxMsg, inline int) error {
	var err error
	ep.rslot = maxMsg
	if ep.ud {
		ep.rslot += udGRH
	}
	if ep.rbuf, ep.rmr, err = ep.mapRegister(ep.depth*ep.rslot, C.IBV_ACCESS_LOCAL_WRITE); err != nil {
		return err
	}
	if ep.bounce, ep.bounceMR, err = ep.mapRegister(ep.depth*inline, 0); err != nil {
		return err
	}
	ep.q.rbase = C.uint64_t(uintptr(unsafe.Pointer(&ep.rbuf[0])))
	ep.q.rslot = C.uint32_t(ep.rslot)
	ep.q.rlkey = ep.rmr.lkey
	return nil
}

// mapRegister maps size bytes (rounded up to pages) and registers them.
func (ep *Endpoint) mapRegister(size int, access C.int) ([]byte, *C.struct_ibv_mr, error) {
	pg := os.Getpagesize()
	size = (size + pg - 1) &^ (pg - 1)
	buf, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, opErr("mmap", err)
	}
	mr, err := C.weft_reg_mr(ep.pd, C.uint64_t(uintptr(unsafe.Pointer(&buf[0]))), C.size_t(size), access)
	if mr == nil {
		unix.Munmap(buf)
		return nil, nil, errnoErr("ibv_reg_mr", err, 0)
	}
	return buf, mr, nil
}

// releaseRings deregisters and unmaps the receive ring and the bounce
// buffers.
func (ep *Endpoint) releaseRings() {
	if ep.rmr != nil {
		C.ibv_dereg_mr(ep.rmr)
		ep.rmr = nil
	}
	if ep.bounceMR != nil {
		C.ibv_dereg_mr(ep.bounceMR)
		ep.bounceMR = nil
	}
	if ep.rbuf != nil {
		if ep.vTail > 0 {
			// Views may still point here: leave the range mapped, as
			// private anonymous memory, so a stale one reads zeros
			// instead of faulting.
			retire(ep.rbuf)
		} else {
			unix.Munmap(ep.rbuf)
		}
		ep.rbuf = nil
	}
	if ep.bounce != nil {
		unix.Munmap(ep.bounce)
		ep.bounce = nil
	}
}

// retire replaces a mapping in place with private anonymous memory that
// reserves nothing; it unmaps b if that fails.
func retire(b []byte) {
	_, err := unix.MmapPtr(-1, 0, unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED|unix.MAP_NORESERVE)
	if err != nil {
		unix.Munmap(b)
	}
}
