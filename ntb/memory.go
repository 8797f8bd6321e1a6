package ntb

import (
	"fmt"
	"unsafe"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/shm"
)

// heap hands out ranges of the inbound window's RMA heap: a first-fit free
// list of 64-byte-aligned spans, sorted by offset and merged on release.
type heap struct {
	free []span
}

type span struct{ off, size int }

const heapAlign = 64

func (h *heap) init(lo, hi int) {
	h.free = nil
	if hi > lo {
		h.free = []span{{lo, hi - lo}}
	}
}

func (h *heap) alloc(size int) (int, bool) {
	size = (size + heapAlign - 1) &^ (heapAlign - 1)
	for i, s := range h.free {
		if s.size >= size {
			if s.size == size {
				h.free = append(h.free[:i], h.free[i+1:]...)
			} else {
				h.free[i] = span{s.off + size, s.size - size}
			}
			return s.off, true
		}
	}
	return 0, false
}

func (h *heap) release(off, size int) {
	size = (size + heapAlign - 1) &^ (heapAlign - 1)
	i := 0
	for i < len(h.free) && h.free[i].off < off {
		i++
	}
	h.free = append(h.free, span{})
	copy(h.free[i+1:], h.free[i:])
	h.free[i] = span{off, size}
	// Merge with the neighbours.
	if i+1 < len(h.free) && h.free[i].off+h.free[i].size == h.free[i+1].off {
		h.free[i].size += h.free[i+1].size
		h.free = append(h.free[:i+1], h.free[i+2:]...)
	}
	if i > 0 && h.free[i-1].off+h.free[i-1].size == h.free[i].off {
		h.free[i-1].size += h.free[i].size
		h.free = append(h.free[:i], h.free[i+1:]...)
	}
}

// freeBytes returns the free heap bytes.
func (h *heap) freeBytes() int {
	n := 0
	for _, s := range h.free {
		n += s.size
	}
	return n
}

func randKey() fabric.Key {
	return fabric.Key(uint64(randUint32())<<32 | uint64(randUint32()))
}

// Register registers caller memory. Remote permissions need memory the
// peer can reach, which only the inbound window is: a buffer outside it
// with remote access fails with ErrNotSupported (use Alloc).
func (t *Transport) Register(buf []byte, access fabric.Access) (*fabric.Region, error) {
	if t.closed.Load() {
		return nil, &fabric.OpError{Op: "register", Backend: "ntb", Err: fabric.ErrClosed}
	}
	if access&fabric.AccessRemote == 0 {
		return fabric.NewRegion(fabric.RegionConfig{Buf: buf, Access: access, LocalKey: randKey(), Domain: &t.dom}), nil
	}
	if access&fabric.AccessRemoteAtomic != 0 {
		return nil, &fabric.OpError{Op: "register", Backend: "ntb", Err: fmt.Errorf("remote atomics: %w", fabric.ErrNotSupported)}
	}
	if len(buf) == 0 {
		return nil, &fabric.OpError{Op: "register", Backend: "ntb", Err: fabric.ErrInvalid}
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(t.win)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	if p < base+uintptr(t.lay.heapOff) || p+uintptr(len(buf)) > base+uintptr(len(t.win)) {
		return nil, &fabric.OpError{Op: "register", Backend: "ntb",
			Err: fmt.Errorf("remote access to memory outside the NTB window (use Alloc): %w", fabric.ErrNotSupported)}
	}
	return t.addMR(buf, access, uint64(p-base), nil)
}

// Alloc allocates registered memory from the RMA heap of the inbound
// window, which the peer reaches through its outbound window.
func (t *Transport) Alloc(size int, access fabric.Access) (*fabric.Region, error) {
	if t.closed.Load() {
		return nil, &fabric.OpError{Op: "alloc", Backend: "ntb", Err: fabric.ErrClosed}
	}
	if size <= 0 {
		return nil, &fabric.OpError{Op: "alloc", Backend: "ntb", Err: fabric.ErrInvalid}
	}
	if access&fabric.AccessRemoteAtomic != 0 {
		return nil, &fabric.OpError{Op: "alloc", Backend: "ntb", Err: fmt.Errorf("remote atomics: %w", fabric.ErrNotSupported)}
	}
	t.mu.Lock()
	off, ok := t.heap.alloc(size)
	t.mu.Unlock()
	if !ok {
		if access&fabric.AccessRemote == 0 {
			return t.Register(make([]byte, size), access)
		}
		return nil, &fabric.OpError{Op: "alloc", Backend: "ntb",
			Err: fmt.Errorf("%d bytes: RMA heap exhausted (%d free): %w", size, t.heapFree(), fabric.ErrBounds)}
	}
	buf := t.win[off : off+size : off+size]
	clear(buf)
	release := func() {
		t.mu.Lock()
		t.heap.release(off, size)
		t.mu.Unlock()
	}
	if access&fabric.AccessRemote == 0 {
		return fabric.NewRegion(fabric.RegionConfig{Buf: buf, Access: access, LocalKey: randKey(),
			Addr: uint64(off), Domain: &t.dom, Deregister: func() error { release(); return nil }}), nil
	}
	r, err := t.addMR(buf, access, uint64(off), release)
	if err != nil {
		release()
	}
	return r, err
}

func (t *Transport) heapFree() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.heap.freeBytes()
}

// addMR enters a region with remote access in the table and publishes it
// to the peer. Its remote key carries the table index in its low byte and
// 56 random bits above it.
func (t *Transport) addMR(buf []byte, access fabric.Access, addr uint64, release func()) (*fabric.Region, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	idx := -1
	for i := range t.mrs {
		if t.mrs[i] == nil {
			idx = i
			break
		}
	}
	if idx < 0 {
		return nil, &fabric.OpError{Op: "register", Backend: "ntb",
			Err: fmt.Errorf("all %d remote keys in use: %w", mrEntries, fabric.ErrBounds)}
	}
	rkey := randKey()&^0xff | fabric.Key(idx)
	var r *fabric.Region
	r = fabric.NewRegion(fabric.RegionConfig{Buf: buf, Access: access, LocalKey: randKey(), RemoteKey: rkey,
		Addr: addr, Domain: &t.dom, Deregister: func() error {
			t.mu.Lock()
			if t.mrs[idx] == r {
				t.mrs[idx] = nil
				t.unpublishMR(idx)
			}
			t.mu.Unlock()
			if release != nil {
				release()
			}
			return nil
		}})
	t.mrs[idx] = r
	if t.peerWin != nil {
		t.publishMR(idx, r)
	}
	return r, nil
}

// publishMR writes entry idx of our region table into the peer's window,
// under a sequence word (odd while it changes) so the peer never reads a
// torn entry. Callers hold t.mu.
func (t *Transport) publishMR(idx int, r *fabric.Region) {
	pw := t.peerWin
	if pw == nil {
		return
	}
	e := mrOff + idx*mrEntrySize
	seq := shm.U32(pw, e)
	s := seq.Load()
	seq.Store(s | 1)
	shm.U32(pw, e+4).Store(uint32(r.Access()))
	shm.U64(pw, e+8).Store(uint64(r.RemoteKey()))
	shm.U64(pw, e+16).Store(r.Addr())
	shm.U64(pw, e+24).Store(uint64(r.Len()))
	seq.Store((s | 1) + 1)
}

func (t *Transport) unpublishMR(idx int) {
	pw := t.peerWin
	if pw == nil {
		return
	}
	e := mrOff + idx*mrEntrySize
	seq := shm.U32(pw, e)
	s := seq.Load()
	seq.Store(s | 1)
	shm.U32(pw, e+4).Store(0)
	shm.U64(pw, e+8).Store(0)
	seq.Store((s | 1) + 1)
}

// checkRemote validates an RMA target against the region table the peer
// published in our window, and the peer window's bounds. It returns the
// offset in the peer window, or a failure status. Nothing here trusts the
// peer: a torn, forged or out-of-window entry fails.
func (t *Transport) checkRemote(pw []byte, r fabric.RemoteIOV, n int, need fabric.Access) (int, fabric.Status) {
	idx := int(r.Key & 0xff)
	e := mrOff + idx*mrEntrySize
	seq := shm.U32(t.win, e)
	s1 := seq.Load()
	if s1 == 0 || s1&1 != 0 {
		return 0, fabric.StatusRemoteAccess
	}
	acc := fabric.Access(shm.U32(t.win, e+4).Load())
	key := shm.U64(t.win, e+8).Load()
	base := shm.U64(t.win, e+16).Load()
	size := shm.U64(t.win, e+24).Load()
	if seq.Load() != s1 || key != uint64(r.Key) || r.Key == 0 || !acc.Has(need) {
		return 0, fabric.StatusRemoteAccess
	}
	if r.Addr < base || r.Addr-base > size || uint64(n) > size-(r.Addr-base) {
		return 0, fabric.StatusRemoteBounds
	}
	if base > uint64(len(pw)) || size > uint64(len(pw))-base {
		// The peer published a region outside its own window.
		return 0, fabric.StatusRemoteAccess
	}
	return int(r.Addr), fabric.StatusOK
}
