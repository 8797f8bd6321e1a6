package batch

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/spin"
)

// DefaultSlots is the number of receive slots when SplitterOptions.Slots
// is zero.
const DefaultSlots = 64

// errTruncated is returned by Recv for a message longer than a slot.
var errTruncated = fmt.Errorf("batch: message longer than a receive slot (raise SplitterOptions.SlotSize or lower the sender's MaxBytes): %w", fabric.ErrMessageSize)

// SplitterOptions configure a Splitter. The zero value selects every
// default.
type SplitterOptions struct {
	// Slots is the number of receive slots, each holding one message
	// until every packet of it is released (0: DefaultSlots).
	Slots int
	// SlotSize is the size of a slot in bytes; it must hold the largest
	// message the peer sends, a batch of its MaxBytes (0: Caps.MaxMsgSize).
	// A longer message is dropped (DropTruncated), with views too.
	SlotSize int
	// Copy makes the splitter receive into slots of its own with Recv even
	// when the endpoint can hand out its receive memory in place
	// (fabric.ViewReceiver: ntb, roce, verbs): by default it then takes
	// views and copies nothing, and each slot stands for one held view.
	Copy bool
}

// Packet is a packet delivered by a Splitter: a view into a receive slot,
// valid until the packet is released.
type Packet struct {
	// Data is the packet. It aliases the receive slot: the caller may read
	// and modify it in place, and must not use it after Release.
	Data []byte
	// Raw reports a message that was not a batch (sent without the
	// coalescer), delivered whole as one packet.
	Raw bool
	// Flags are the message's flags for a raw message: FlagImm when Imm is
	// valid, FlagRemoteWrite for the notification of an RMA write with
	// immediate (Data is then empty). Zero for packets of a batch.
	Flags fabric.MsgFlags
	// Imm is the immediate data of a raw message, valid with FlagImm.
	Imm uint32

	slot uint32 // slot index + 1; 0 for the zero Packet
	gen  uint32 // slot generation, catches releases of stale packets
}

type slot struct {
	refs  atomic.Int32  // packets not yet released
	gen   atomic.Uint32 // bumped each time the slot receives a message
	buf   []byte        // the slot's memory
	msg   []byte        // the received message
	count int           // packets in it
	next  int           // next packet to deliver
	off   int           // offset of the next packet
	raw   bool
	flags fabric.MsgFlags
	imm   uint32
}

type splitterCounters struct {
	batches, packets, bytes atomic.Uint64
	sizes                   [NumSizeBuckets]atomic.Uint64
	drops                   [NumDropReasons]atomic.Uint64
	full, raw, seqGaps      atomic.Uint64
}

// Splitter receives batches on an endpoint and splits them into packets
// without copying them. It receives into slots of a region it allocates,
// or, on an endpoint that implements fabric.ViewReceiver, takes views of
// the endpoint's receive memory (no copy at all); a slot holds one message
// until every packet of it has been released.
//
// Recv and RecvWait may be called from several goroutines but are
// serialised; Release and Stats may be called from any goroutine at any
// time (a router may hand packets to workers that release them).
type Splitter struct {
	ep       fabric.Endpoint
	reg      *fabric.Region
	slotSize int
	slots    []slot
	sges     []fabric.SGE // one per slot

	rxMu sync.Mutex // Recv state below
	// The free slots, as messages ready to post: ready[lo:] is a stack
	// whose top is ready[lo], and readyIdx[i] is the slot of ready[i].
	// Recv passes ready[lo:lo+k] to the endpoint as is, so taking k free
	// slots costs nothing; the endpoint fills them from the top.
	ready    []fabric.Message
	readyIdx []int32
	lo       int
	dropped  []int32 // slots of messages dropped by the current Recv
	pend     []int32 // FIFO of slots with undelivered packets
	ph, pt   uint64
	lastSeq  uint32
	haveSeq  bool
	perMsg   int // packets in the last message received, to size receives

	// Slots freed by Release (any goroutine) wait here until Recv moves
	// them to the stack.
	retMu sync.Mutex
	ret   []int32
	// View mode (vr != nil): slot q%len(slots) holds view number q; views
	// go back to the endpoint in order, as their slots finish.
	vr    fabric.ViewReceiver
	views []fabric.View
	vt    atomic.Uint64 // views received (written under rxMu)
	vh    atomic.Uint64 // views released to the endpoint
	done  []atomic.Bool // slot's packets all released, its view not yet
	relMu sync.Mutex
	nret  atomic.Int32
	// relWaiters counts RecvWaits asleep until a Release frees a slot;
	// the Release that frees one signals relCh.
	relWaiters atomic.Int32
	relCh      chan struct{}
	inUse      atomic.Int32 // slots holding a message
	closed     atomic.Bool
	freeOnce   sync.Once
	ctr        splitterCounters
}

// NewSplitter returns a Splitter that receives on ep. It allocates its
// receive region with ep.Alloc (AccessLocalWrite). opts may be nil.
func NewSplitter(ep fabric.Endpoint, opts *SplitterOptions) (*Splitter, error) {
	var o SplitterOptions
	if opts != nil {
		o = *opts
	}
	if o.Slots == 0 {
		o.Slots = DefaultSlots
	}
	if o.SlotSize == 0 {
		o.SlotSize = ep.Caps().MaxMsgSize
	}
	if o.Slots < 1 || o.SlotSize < FixedHeaderSize+3 {
		return nil, fmt.Errorf("batch: %d slots of %d bytes: %w", o.Slots, o.SlotSize, fabric.ErrInvalid)
	}
	if vr, ok := ep.(fabric.ViewReceiver); ok && !o.Copy {
		s := &Splitter{ep: ep, vr: vr, slotSize: o.SlotSize, perMsg: 1, slots: make([]slot, o.Slots), relCh: make(chan struct{}, 1),
			views: make([]fabric.View, o.Slots), done: make([]atomic.Bool, o.Slots), pend: make([]int32, o.Slots),
			dropped: make([]int32, 0, o.Slots)}
		return s, nil
	}
	reg, err := ep.Alloc(o.Slots*o.SlotSize, fabric.AccessLocalWrite)
	if err != nil {
		return nil, fmt.Errorf("batch: receive region: %w", err)
	}
	s := &Splitter{ep: ep, reg: reg, slotSize: o.SlotSize, perMsg: 1, slots: make([]slot, o.Slots), relCh: make(chan struct{}, 1),
		sges: make([]fabric.SGE, o.Slots), ready: make([]fabric.Message, o.Slots),
		readyIdx: make([]int32, o.Slots), pend: make([]int32, o.Slots), dropped: make([]int32, 0, o.Slots), ret: make([]int32, 0, o.Slots)}
	buf := reg.Bytes()
	for i := range s.slots {
		off := i * o.SlotSize
		s.slots[i].buf = buf[off : off+o.SlotSize : off+o.SlotSize]
		s.sges[i] = fabric.SGE{Region: reg, Offset: off, Length: o.SlotSize}
		s.ready[i].SGEs = s.sges[i : i+1 : i+1]
		s.readyIdx[i] = int32(i)
	}
	return s, nil
}

// Views reports whether the splitter takes views of the endpoint's
// receive memory instead of copying messages into slots of its own.
func (s *Splitter) Views() bool { return s.vr != nil }

// Slots returns the number of receive slots.
func (s *Splitter) Slots() int { return len(s.slots) }

// SlotSize returns the size of a receive slot.
func (s *Splitter) SlotSize() int { return s.slotSize }

// Endpoint returns the endpoint the splitter receives on.
func (s *Splitter) Endpoint() fabric.Endpoint { return s.ep }

// Recv stores up to len(pkts) received packets into pkts, in the order
// they were sent, and returns how many. It never blocks. Packets of a
// batch that do not fit in pkts are delivered by the next call.
//
// A malformed batch is dropped and counted (Stats.Drops) and Recv returns
// the packets it has with a *fabric.MalformedError, which matches
// fabric.ErrMalformed; a message longer than a slot gives an error
// matching fabric.ErrMessageSize. Both are reports about input, not
// failures of the splitter: keep calling Recv. Errors of the endpoint are
// returned as they are.
//
// When every slot is held by unreleased packets, Recv returns 0 (and
// counts Stats.Full): release packets.
func (s *Splitter) Recv(pkts []Packet) (int, error) {
	return s.recv(nil, pkts)
}

// RecvWait is Recv that blocks until it has at least one packet, ctx is
// done or the endpoint fails. It waits with the endpoint's RecvWait (spin,
// then sleep); when every slot is held by unreleased packets it waits for
// a Release from another goroutine, polling for fabric.DefaultSpin, then
// parking until the Release that frees a slot wakes it. Closing the
// Splitter wakes that wait (os.ErrClosed); a wait inside the endpoint's
// RecvWait ends when the endpoint is closed or ctx is cancelled.
func (s *Splitter) RecvWait(ctx context.Context, pkts []Packet) (int, error) {
	if len(pkts) == 0 {
		return 0, nil
	}
	if n, err := s.recv(ctx, pkts); n > 0 || err != nil {
		return n, err
	}
	// Every slot is held: wait for a release, spinning first.
	for sp := spin.Start(fabric.DefaultSpin); sp.Next(ctx); {
		if n, err := s.recv(ctx, pkts); n > 0 || err != nil {
			return n, err
		}
	}
	for {
		s.relWaiters.Add(1)
		n, err := s.recv(ctx, pkts) // after the announce: no release is missed
		if n > 0 || err != nil {
			s.relWaiters.Add(-1)
			return n, err
		}
		select {
		case <-s.relCh:
		case <-ctx.Done():
		}
		s.relWaiters.Add(-1)
		if err := ctx.Err(); err != nil {
			return 0, err
		}
	}
}

// released wakes a RecvWait that waits for a free slot.
func (s *Splitter) released() {
	if s.relWaiters.Load() > 0 {
		select {
		case s.relCh <- struct{}{}:
		default:
		}
	}
}

func (s *Splitter) recv(ctx context.Context, pkts []Packet) (int, error) {
	if s.closed.Load() {
		return 0, errClosed
	}
	s.rxMu.Lock()
	n, err := s.recvLocked(ctx, pkts)
	s.rxMu.Unlock()
	if s.closed.Load() && s.rxMu.TryLock() {
		s.freeRegion()
		s.rxMu.Unlock()
	}
	return n, err
}

func (s *Splitter) recvLocked(ctx context.Context, pkts []Packet) (int, error) {
	if s.vr != nil {
		return s.recvViewsLocked(ctx, pkts)
	}
	n := s.drain(pkts)
	var first error
	for n < len(pkts) {
		if s.nret.Load() != 0 {
			s.collect()
		}
		// Receive about as many messages as the caller has room for
		// packets: batches hold many, so this keeps the data a call
		// touches (and the slots it holds) small.
		want := (len(pkts) - n + s.perMsg - 1) / s.perMsg
		k := min(want, len(s.ready)-s.lo)
		if k == 0 {
			s.ctr.full.Add(1)
			break
		}
		lo := s.lo
		msgs := s.ready[lo : lo+k]
		var r int
		var err error
		if ctx != nil && n == 0 && first == nil {
			r, err = s.ep.RecvWait(ctx, msgs)
		} else {
			r, err = s.ep.Recv(msgs)
		}
		r = min(max(r, 0), k)
		s.lo += r
		s.inUse.Add(int32(r))
		for i := 0; i < r; i++ {
			idx, m := s.readyIdx[lo+i], &msgs[i]
			sl := &s.slots[idx]
			var e error
			if m.Flags&fabric.FlagTruncated != 0 || (m.Flags&fabric.FlagRemoteWrite == 0 && m.Len > len(sl.buf)) {
				e = s.dropTruncated(idx)
			} else {
				var data []byte
				if m.Flags&fabric.FlagRemoteWrite == 0 {
					data = sl.buf[:m.Len:m.Len]
				}
				e = s.accept(idx, m.Flags, m.Imm, data)
			}
			if e != nil && first == nil {
				first = e
			}
		}
		for _, idx := range s.dropped {
			s.drop(idx)
		}
		s.dropped = s.dropped[:0]
		n += s.drain(pkts[n:])
		if err != nil {
			return n, err
		}
		if r < k {
			break
		}
	}
	return n, first
}

// recvViewsLocked is recvLocked in view mode: each message stays where
// the endpoint received it and takes the next slot in order.
func (s *Splitter) recvViewsLocked(ctx context.Context, pkts []Packet) (int, error) {
	n := s.drain(pkts)
	var first error
	nslots := uint64(len(s.slots))
	for n < len(pkts) {
		want := (len(pkts) - n + s.perMsg - 1) / s.perMsg
		base := s.vt.Load()
		k := min(want, len(s.slots)-int(base-s.vh.Load()))
		if k <= 0 {
			s.ctr.full.Add(1)
			break
		}
		views := s.views[:k]
		var r int
		var err error
		if ctx != nil && n == 0 && first == nil {
			r, err = s.vr.RecvViewsWait(ctx, views)
		} else {
			r, err = s.vr.RecvViews(views)
		}
		r = min(max(r, 0), k)
		s.vt.Store(base + uint64(r))
		s.inUse.Add(int32(r))
		for i := 0; i < r; i++ {
			v := &views[i]
			idx := int32((base + uint64(i)) % nslots)
			var e error
			if v.Flags&fabric.FlagRemoteWrite == 0 && len(v.Data) > s.slotSize {
				e = s.dropTruncated(idx)
			} else {
				e = s.accept(idx, v.Flags, v.Imm, v.Data)
			}
			if e != nil && first == nil {
				first = e
			}
		}
		for _, idx := range s.dropped {
			s.finish(idx)
		}
		s.dropped = s.dropped[:0]
		n += s.drain(pkts[n:])
		if err != nil {
			return n, err
		}
		if r < k {
			break
		}
	}
	return n, first
}

// dropTruncated counts a message longer than a slot and queues its slot
// to be freed.
func (s *Splitter) dropTruncated(idx int32) error {
	s.ctr.drops[DropTruncated].Add(1)
	s.dropped = append(s.dropped, idx)
	return errTruncated
}

// finish marks the view in slot idx done and gives the endpoint back every
// done view at the head of the line. Any goroutine may call it.
func (s *Splitter) finish(idx int32) {
	s.inUse.Add(-1)
	s.done[idx].Store(true)
	s.relMu.Lock()
	nslots := uint64(len(s.slots))
	h, t := s.vh.Load(), s.vt.Load()
	q := h
	for q < t && s.done[q%nslots].Load() {
		s.done[q%nslots].Store(false)
		q++
	}
	if q != h {
		// Only fails once the endpoint is closed, when it no longer
		// matters.
		s.vr.ReleaseViews(int(q - h))
		s.vh.Store(q)
	}
	s.relMu.Unlock()
}

// collect moves released slots onto the stack of free slots.
func (s *Splitter) collect() {
	s.retMu.Lock()
	for _, idx := range s.ret {
		s.lo--
		s.ready[s.lo] = fabric.Message{SGEs: s.sges[idx : idx+1 : idx+1]}
		s.readyIdx[s.lo] = idx
	}
	s.ret = s.ret[:0]
	s.nret.Store(0)
	s.retMu.Unlock()
}

// accept takes a received message in slot idx: data is its payload (nil
// for the notification of an RMA write). A batch is validated and queued
// for delivery, a raw message is queued whole, a malformed batch is
// dropped and its slot freed.
func (s *Splitter) accept(idx int32, flags fabric.MsgFlags, imm uint32, data []byte) error {
	sl := &s.slots[idx]
	switch {
	case flags&fabric.FlagRemoteWrite != 0:
		sl.msg, sl.count, sl.raw, sl.flags, sl.imm = nil, 1, true, flags, imm
		s.ctr.raw.Add(1)
	case flags&fabric.FlagImm != 0 && imm == Imm:
		h, err := ParseHeader(data)
		if err != nil {
			s.ctr.drops[DropMalformed].Add(1)
			s.dropped = append(s.dropped, idx)
			return err
		}
		if s.haveSeq && h.Seq != s.lastSeq+1 {
			s.ctr.seqGaps.Add(1)
		}
		s.lastSeq, s.haveSeq = h.Seq, true
		sl.msg, sl.count, sl.off, sl.raw, sl.flags, sl.imm = data, h.Count, h.Len, false, 0, 0
		s.ctr.batches.Add(1)
		s.ctr.packets.Add(uint64(h.Count))
		s.ctr.bytes.Add(uint64(len(data) - h.Len))
		s.ctr.sizes[SizeBucket(h.Count)].Add(1)
	default:
		sl.msg, sl.count, sl.raw, sl.flags, sl.imm = data, 1, true, flags, imm
		s.ctr.raw.Add(1)
	}
	s.perMsg = sl.count
	sl.next = 0
	sl.refs.Store(int32(sl.count))
	sl.gen.Add(1)
	s.pend[s.pt%uint64(len(s.pend))] = idx
	s.pt++
	return nil
}

// drain delivers queued packets into pkts.
func (s *Splitter) drain(pkts []Packet) int {
	n := 0
	for s.ph != s.pt && n < len(pkts) {
		idx := s.pend[s.ph%uint64(len(s.pend))]
		sl := &s.slots[idx]
		ref, gen := uint32(idx)+1, sl.gen.Load()
		if sl.raw {
			pkts[n] = Packet{Data: sl.msg, Raw: true, Flags: sl.flags, Imm: sl.imm, slot: ref, gen: gen}
			n++
			sl.next = 1
		} else {
			msg, off := sl.msg, sl.off
			for sl.next < sl.count && n < len(pkts) {
				l := packetLen(msg, sl.next)
				if l > len(msg)-off {
					// The lengths changed after ParseHeader checked them:
					// a view of memory the peer can still write. Drop the
					// rest of the batch.
					s.ctr.drops[DropMalformed].Add(1)
					left := int32(sl.count - sl.next)
					sl.next = sl.count
					s.release(idx32(ref), gen, left)
					break
				}
				pkts[n] = Packet{Data: msg[off : off+l : off+l], slot: ref, gen: gen}
				off += l
				sl.next++
				n++
			}
			sl.off = off
		}
		if sl.next == sl.count {
			s.ph++
		}
	}
	return n
}

func idx32(ref uint32) uint32 { return ref - 1 }

// drop returns the slot of a dropped message to the free stack; the
// caller holds rxMu.
func (s *Splitter) drop(idx int32) {
	s.inUse.Add(-1)
	s.lo--
	s.ready[s.lo] = fabric.Message{SGEs: s.sges[idx : idx+1 : idx+1]}
	s.readyIdx[s.lo] = idx
}

// giveBack queues a slot whose packets are all released.
func (s *Splitter) giveBack(idx int32) {
	s.inUse.Add(-1)
	s.retMu.Lock()
	s.ret = append(s.ret, idx)
	s.nret.Store(int32(len(s.ret)))
	s.retMu.Unlock()
}

// Release gives packets back. A slot is received into again once every
// packet of its message has been released. Zero Packets are ignored.
// Release panics if a packet is released twice, as that is a bug that
// would otherwise let a slot be overwritten while a packet still reads it.
func (s *Splitter) Release(pkts []Packet) {
	for i := 0; i < len(pkts); {
		p := &pkts[i]
		if p.slot == 0 {
			i++
			continue
		}
		j := i + 1
		for j < len(pkts) && pkts[j].slot == p.slot && pkts[j].gen == p.gen {
			j++
		}
		s.release(p.slot-1, p.gen, int32(j-i))
		i = j
	}
}

func (s *Splitter) release(idx, gen uint32, k int32) {
	if int(idx) >= len(s.slots) {
		panic("batch: Release of a packet of another Splitter")
	}
	sl := &s.slots[idx]
	if sl.gen.Load() != gen {
		panic("batch: Release of a packet that was already released")
	}
	v := sl.refs.Add(-k)
	if v < 0 {
		panic("batch: Release of a packet that was already released")
	}
	if v == 0 {
		if s.vr != nil {
			s.finish(int32(idx))
		} else {
			s.giveBack(int32(idx))
		}
		s.released()
	}
}

// Held returns the number of slots holding packets that are not yet
// delivered or not yet released.
func (s *Splitter) Held() int { return int(s.inUse.Load()) }

// Stats returns a snapshot of the counters.
func (s *Splitter) Stats() Stats {
	c := &s.ctr
	st := Stats{Batches: c.batches.Load(), Packets: c.packets.Load(), Bytes: c.bytes.Load(),
		Full: c.full.Load(), Raw: c.raw.Load(), SeqGaps: c.seqGaps.Load()}
	for i := range st.BatchSizes {
		st.BatchSizes[i] = c.sizes[i].Load()
	}
	for i := range st.Drops {
		st.Drops[i] = c.drops[i].Load()
	}
	return st
}

// Close frees the receive region; packets not yet released must not be
// used afterwards. A Recv in progress finishes first (it frees the region
// on its way out). Close does not close the endpoint. It is idempotent;
// afterwards Recv and RecvWait return os.ErrClosed.
func (s *Splitter) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.released()
	if s.rxMu.TryLock() {
		s.freeRegion()
		s.rxMu.Unlock()
	}
	return nil
}

func (s *Splitter) freeRegion() {
	s.freeOnce.Do(func() {
		if s.reg != nil {
			s.reg.Close()
		}
	})
}
