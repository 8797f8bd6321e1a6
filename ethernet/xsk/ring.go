package xsk

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Desc is a descriptor of the RX and TX rings: a frame at byte offset
// Addr in the UMEM, Len bytes long. Its layout is struct xdp_desc, so the
// rings' descriptor arrays are viewed as []Desc without copying.
type Desc struct {
	// Addr is the offset of the packet data in the UMEM. On RX it
	// includes the headroom; frame base is Addr &^ (FrameSize-1) in
	// aligned mode.
	Addr uint64
	// Len is the length of the packet.
	Len uint32
	// Options carries XDP_PKT_CONTD for multi-buffer packets and
	// XDP_TX_METADATA; zero otherwise.
	Options uint32
}

var _ [unsafe.Sizeof(Desc{}) - unsafe.Sizeof(unix.XDPDesc{})]struct{}
var _ [unsafe.Sizeof(unix.XDPDesc{}) - unsafe.Sizeof(Desc{})]struct{}

// ring is the state of one mmapped ring. Only the shared producer,
// consumer and flags words are touched by the kernel; every access to
// them is atomic: loads with sync/atomic (load-acquire), the one store
// per burst with storeRelease (store-release, as libxdp does; on amd64
// and arm64 without the full barrier of sync/atomic's Store). The cached copies are private to the single user-space
// producer or consumer that owns the ring.
type ring struct {
	producer *atomic.Uint32
	consumer *atomic.Uint32
	flags    *atomic.Uint32
	mask     uint32
	size     uint32
	// cachedProd and cachedCons are this side's view. For a producer
	// ring, cachedProd is the next slot to reserve and cachedCons is the
	// consumer index plus size (the first slot not free). For a consumer
	// ring, cachedCons is the next slot to peek and cachedProd the last
	// producer index loaded.
	cachedProd uint32
	cachedCons uint32
	// pub is the index published (producer rings: producer index;
	// consumer rings: consumer index).
	pub  uint32
	mem  []byte
	desc unsafe.Pointer
}

func (r *ring) init(mem []byte, off *unix.XDPRingOffset, size uint32, producer bool) {
	r.mem = mem
	r.producer = (*atomic.Uint32)(unsafe.Pointer(&mem[off.Producer]))
	r.consumer = (*atomic.Uint32)(unsafe.Pointer(&mem[off.Consumer]))
	r.flags = (*atomic.Uint32)(unsafe.Pointer(&mem[off.Flags]))
	r.desc = unsafe.Pointer(&mem[off.Desc])
	r.size = size
	r.mask = size - 1
	if producer {
		r.cachedProd = r.producer.Load()
		r.pub = r.cachedProd
		r.cachedCons = r.consumer.Load() + size
	} else {
		r.cachedCons = r.consumer.Load()
		r.pub = r.cachedCons
		r.cachedProd = r.producer.Load()
	}
}

// free returns how many slots a producer can reserve, reloading the
// consumer index only when the cached view has fewer than want.
func (r *ring) free(want uint32) uint32 {
	n := r.cachedCons - r.cachedProd
	if n >= want {
		return n
	}
	r.cachedCons = r.consumer.Load() + r.size
	if n = r.cachedCons - r.cachedProd; n > r.size {
		// Indices no kernel wrote: Close retired the ring (zero pages)
		// under this goroutine. It reads as full.
		r.cachedCons = r.cachedProd
		return 0
	}
	return n
}

// avail returns how many entries a consumer can peek. It reloads the
// producer index only when the cached view is empty (as libxdp does):
// the kernel writes that cache line for every packet, and each load
// takes the line away from it.
func (r *ring) avail() uint32 {
	if n := r.cachedProd - r.cachedCons; n > 0 {
		return n
	}
	r.cachedProd = r.producer.Load()
	n := r.cachedProd - r.cachedCons
	if n > r.size {
		// Indices no kernel wrote: Close retired the ring (zero pages)
		// under this goroutine. It reads as empty, not as 2^32 entries
		// (a reap loop that runs while rings come back full would never
		// end).
		r.cachedProd = r.cachedCons
		return 0
	}
	return n
}

func (r *ring) reserve(n uint32) (uint32, uint32) {
	if f := r.free(n); f < n {
		n = f
	}
	idx := r.cachedProd
	r.cachedProd += n
	return idx, n
}

func (r *ring) submit(n uint32) {
	r.pub += n
	storeRelease((*uint32)(unsafe.Pointer(r.producer)), r.pub)
}

// cancel gives back n reserved but unsubmitted slots.
func (r *ring) cancel(n uint32) { r.cachedProd -= n }

func (r *ring) peek(n uint32) (uint32, uint32) {
	if a := r.avail(); a < n {
		n = a
	}
	idx := r.cachedCons
	r.cachedCons += n
	return idx, n
}

func (r *ring) release(n uint32) {
	r.pub += n
	storeRelease((*uint32)(unsafe.Pointer(r.consumer)), r.pub)
}

// unpeek gives back n peeked but unreleased entries.
func (r *ring) unpeek(n uint32) { r.cachedCons -= n }

func (r *ring) needWakeup() bool { return r.flags.Load()&unix.XDP_RING_NEED_WAKEUP != 0 }

// Size returns the number of entries of the ring.
func (r *ring) Size() int { return int(r.size) }

// FillRing hands free UMEM frames to the kernel for reception. User space
// is its only producer. Use it as libxdp's xsk_ring_prod: Reserve, Set
// each reserved slot, Submit.
type FillRing struct {
	ring
	addrs []uint64
}

func (f *FillRing) setup(mem []byte, off *unix.XDPRingOffset, size uint32) {
	f.init(mem, off, size, true)
	f.addrs = unsafe.Slice((*uint64)(f.desc), size)
}

// Reserve reserves up to n slots and returns the index of the first and
// how many it got (fewer than n when the ring is nearly full).
func (f *FillRing) Reserve(n int) (idx uint32, got int) {
	i, g := f.reserve(uint32(n))
	return i, int(g)
}

// Set stores a frame address in the reserved slot idx.
func (f *FillRing) Set(idx uint32, addr uint64) { f.addrs[idx&f.mask] = addr }

// Submit publishes n reserved slots to the kernel.
func (f *FillRing) Submit(n int) { f.submit(uint32(n)) }

// Cancel returns n reserved slots that were not submitted.
func (f *FillRing) Cancel(n int) { f.cancel(uint32(n)) }

// Free returns the number of slots that could be reserved now.
func (f *FillRing) Free() int { return int(f.free(f.size)) }

// NeedsWakeup reports whether the kernel asked to be woken (with poll or
// recvfrom) to consume the fill ring; only set with need_wakeup.
func (f *FillRing) NeedsWakeup() bool { return f.needWakeup() }

// Put reserves, fills and submits up to len(addrs) slots in one step and
// returns how many it queued.
func (f *FillRing) Put(addrs []uint64) int {
	idx, n := f.reserve(uint32(len(addrs)))
	for i := uint32(0); i < n; i++ {
		f.addrs[(idx+i)&f.mask] = addrs[i]
	}
	if n > 0 {
		f.submit(n)
	}
	return int(n)
}

// CompletionRing returns the frames of sent packets to user space, which
// is its only consumer. Use it as libxdp's xsk_ring_cons: Peek, Addr for
// each peeked slot, Release.
type CompletionRing struct {
	ring
	addrs []uint64
}

func (c *CompletionRing) setup(mem []byte, off *unix.XDPRingOffset, size uint32) {
	c.init(mem, off, size, false)
	c.addrs = unsafe.Slice((*uint64)(c.desc), size)
}

// Peek returns the index of the first of up to n completed frames and how
// many there are.
func (c *CompletionRing) Peek(n int) (idx uint32, got int) {
	i, g := c.peek(uint32(n))
	return i, int(g)
}

// Addr returns the frame address in the peeked slot idx.
func (c *CompletionRing) Addr(idx uint32) uint64 { return c.addrs[idx&c.mask] }

// Release gives n peeked slots back to the kernel.
func (c *CompletionRing) Release(n int) { c.release(uint32(n)) }

// Get peeks, copies and releases up to len(addrs) completed frames and
// returns how many.
func (c *CompletionRing) Get(addrs []uint64) int {
	idx, n := c.peek(uint32(len(addrs)))
	for i := uint32(0); i < n; i++ {
		addrs[i] = c.addrs[(idx+i)&c.mask]
	}
	if n > 0 {
		c.release(n)
	}
	return int(n)
}

// Len returns the number of completions waiting.
func (c *CompletionRing) Len() int {
	c.cachedProd = c.producer.Load()
	return int(c.cachedProd - c.cachedCons)
}

// RXRing carries received packets from the kernel. User space is its
// only consumer.
type RXRing struct {
	ring
	descs []Desc
}

func (r *RXRing) setup(mem []byte, off *unix.XDPRingOffset, size uint32) {
	r.init(mem, off, size, false)
	r.descs = unsafe.Slice((*Desc)(r.desc), size)
}

// Peek returns the index of the first of up to n received descriptors
// and how many there are.
func (r *RXRing) Peek(n int) (idx uint32, got int) {
	i, g := r.peek(uint32(n))
	return i, int(g)
}

// Desc returns the descriptor in the peeked slot idx. It stays valid
// until Release.
func (r *RXRing) Desc(idx uint32) *Desc { return &r.descs[idx&r.mask] }

// Release gives n peeked slots back to the kernel.
func (r *RXRing) Release(n int) { r.release(uint32(n)) }

// Unpeek returns n peeked, unreleased slots so the next Peek sees them
// again.
func (r *RXRing) Unpeek(n int) { r.unpeek(uint32(n)) }

// Get peeks, copies and releases up to len(descs) descriptors and
// returns how many.
func (r *RXRing) Get(descs []Desc) int {
	idx, n := r.peek(uint32(len(descs)))
	for i := uint32(0); i < n; i++ {
		descs[i] = r.descs[(idx+i)&r.mask]
	}
	if n > 0 {
		r.release(n)
	}
	return int(n)
}

// Len returns the number of received descriptors waiting.
func (r *RXRing) Len() int {
	r.cachedProd = r.producer.Load()
	return int(r.cachedProd - r.cachedCons)
}

// TXRing carries packets to send to the kernel. User space is its only
// producer.
type TXRing struct {
	ring
	descs []Desc
}

func (t *TXRing) setup(mem []byte, off *unix.XDPRingOffset, size uint32) {
	t.init(mem, off, size, true)
	t.descs = unsafe.Slice((*Desc)(t.desc), size)
}

// Reserve reserves up to n slots and returns the index of the first and
// how many it got.
func (t *TXRing) Reserve(n int) (idx uint32, got int) {
	i, g := t.reserve(uint32(n))
	return i, int(g)
}

// Desc returns the descriptor of reserved slot idx, to fill in.
func (t *TXRing) Desc(idx uint32) *Desc { return &t.descs[idx&t.mask] }

// Submit publishes n reserved slots.
func (t *TXRing) Submit(n int) { t.submit(uint32(n)) }

// Cancel returns n reserved slots that were not submitted.
func (t *TXRing) Cancel(n int) { t.cancel(uint32(n)) }

// Free returns the number of slots that could be reserved now.
func (t *TXRing) Free() int { return int(t.free(t.size)) }

// NeedsWakeup reports whether the kernel must be kicked (sendto) to
// process the ring. Without need_wakeup it is always true.
func (t *TXRing) NeedsWakeup() bool { return t.needWakeup() }

// Put reserves, fills and submits up to len(descs) slots and returns how
// many it queued.
func (t *TXRing) Put(descs []Desc) int {
	idx, n := t.reserve(uint32(len(descs)))
	for i := uint32(0); i < n; i++ {
		t.descs[(idx+i)&t.mask] = descs[i]
	}
	if n > 0 {
		t.submit(n)
	}
	return int(n)
}

// Pending returns how many submitted descriptors the kernel has not yet
// consumed.
func (t *TXRing) Pending() int { return int(t.pub - t.consumer.Load()) }
