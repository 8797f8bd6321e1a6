package batch

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/weft-io/weft/fabric"
)

// Defaults of Options.
const (
	// DefaultDeadline is the latency bound of a batch when
	// Options.Deadline is zero.
	DefaultDeadline = 5 * time.Microsecond
	// DefaultMaxBytes caps the message size of a batch when
	// Options.MaxBytes is zero (further capped by Caps.MaxMsgSize).
	DefaultMaxBytes = 32 << 10
	// DefaultMaxPackets caps the packets of a batch when
	// Options.MaxPackets is zero (further capped by Caps.MaxSGEs-1).
	DefaultMaxPackets = 256
	// DefaultDepth is the number of batch descriptors when Options.Depth
	// is zero.
	DefaultDepth = 64
)

// ErrFull is returned by Add when every batch descriptor is busy: batches
// are queued behind backpressure, in flight, or complete but not yet
// reclaimed. The packet was not taken; call Reclaim (and Tick) and retry,
// or drop it.
var ErrFull = errors.New("batch: coalescer full (reclaim completed packets)")

// Errors of Add for packets that can never be sent; they are values so
// that Add allocates nothing even when it fails.
var (
	errNoRegion   = fmt.Errorf("batch: packet without a region: %w", fabric.ErrInvalid)
	errRegionGone = fmt.Errorf("batch: packet in a closed region: %w", fabric.ErrClosed)
	errPktBounds  = fmt.Errorf("batch: packet outside its region: %w", fabric.ErrBounds)
	errPktSize    = fmt.Errorf("batch: packet length out of range (1..MaxBytes-14, at most 65535): %w", fabric.ErrMessageSize)
	errClosed     = fmt.Errorf("batch: %w", os.ErrClosed)
)

// Options configure a Coalescer. The zero value selects every default.
type Options struct {
	// MaxPackets closes a batch when it holds this many packets
	// (0: min(Caps.MaxSGEs-1, DefaultMaxPackets)). It must be at most
	// Caps.MaxSGEs-1: SGE 0 is the header.
	MaxPackets int
	// MaxBytes closes a batch when the next packet would take its message
	// (header included) past this many bytes (0: min(Caps.MaxMsgSize,
	// DefaultMaxBytes)). It must be at most Caps.MaxMsgSize, and the
	// receiver's slots must hold it (SplitterOptions.SlotSize).
	MaxBytes int
	// Deadline closes a batch when its first packet has waited this long,
	// checked by Tick and Poll (0: DefaultDeadline; negative: no deadline,
	// only count, bytes and Flush close batches).
	Deadline time.Duration
	// Depth is the number of batch descriptors: batches that are open,
	// queued behind backpressure, in flight, or complete and not yet
	// reclaimed (0: DefaultDepth; rounded up to a power of two).
	Depth int
	// ExternalCompletions says that the program polls the endpoint's
	// completion queue itself (because it posts other signaled operations
	// on it) and passes every completion to Complete. By default the
	// coalescer polls the queue while it has signaled batches in flight,
	// and discards completions that are not its own (Stats.Foreign).
	ExternalCompletions bool
}

// desc is a batch descriptor.
type desc struct {
	sges     []fabric.SGE // header, then the packets
	cookies  []uint64
	hdr      []byte // this descriptor's header slot
	pos      uint64 // position of the batch, for matching completions
	n        int    // packets
	bytes    int    // message bytes, header included
	signaled bool   // sent with FlagSignal: complete when its completion is polled
	blocked  bool   // met backpressure (counted once)
	done     bool   // complete: the packets are the caller's again
	taken    int    // cookies already returned by Reclaim
}

// Coalescer gathers packets into batches and sends each batch as one
// message on its endpoint. Its methods are safe for concurrent use; they
// serialise on a mutex, so AddBurst costs one lock for many packets.
//
// Descriptors move through positions head <= sent <= tail: [head, sent)
// have been sent (complete or in flight), [sent, tail) are closed and
// queued, and tail is the open batch.
type Coalescer struct {
	mu       sync.Mutex
	ep       fabric.Endpoint
	maxPkts  int
	maxBytes int
	deadline int64 // ns; < 0: none
	inline   int
	external bool
	hdrReg   *fabric.Region
	descs    []desc // a power of two of them
	mask     uint64
	msgs     []fabric.Message // message of descs[i], so a run of queued batches is one Send
	comps    []fabric.Completion
	head     uint64
	sent     uint64
	tail     uint64
	due      int64 // deadline of the open batch, in nanotime
	seq      uint32
	tag      uint64 // high 32 bits of every Context we post
	inflight int
	closed   bool
	st       Stats
	// After backpressure, retries from Tick and Add are spaced out: skip
	// more calls each time the endpoint is still full (up to maxBackoff),
	// so that a spinning router does not hammer a full ring with whole
	// batches (which costs the backend a validation pass each time).
	skip, backoff int
}

const maxBackoff = 32

var epoch = time.Now()

// nanotime is the monotonic clock in ns since epoch.
func nanotime() int64 { return int64(time.Since(epoch)) }

// NewCoalescer returns a Coalescer that sends batches on ep. It allocates
// its header region with ep.Alloc. opts may be nil.
func NewCoalescer(ep fabric.Endpoint, opts *Options) (*Coalescer, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	caps := ep.Caps()
	if caps.MaxSGEs < 2 {
		return nil, fmt.Errorf("batch: the %s backend gathers %d SGEs per message, batching needs 2: %w",
			caps.Backend, caps.MaxSGEs, fabric.ErrNotSupported)
	}
	limit := min(caps.MaxSGEs-1, MaxCount)
	switch {
	case o.MaxPackets == 0:
		o.MaxPackets = min(limit, DefaultMaxPackets)
	case o.MaxPackets < 1 || o.MaxPackets > limit:
		return nil, fmt.Errorf("batch: MaxPackets %d, the %s backend allows 1..%d: %w",
			o.MaxPackets, caps.Backend, limit, fabric.ErrInvalid)
	}
	switch {
	case o.MaxBytes == 0:
		o.MaxBytes = min(caps.MaxMsgSize, DefaultMaxBytes)
	case o.MaxBytes > caps.MaxMsgSize:
		return nil, fmt.Errorf("batch: MaxBytes %d above the %s backend's message size %d: %w",
			o.MaxBytes, caps.Backend, caps.MaxMsgSize, fabric.ErrInvalid)
	}
	if o.MaxBytes < HeaderSize(1)+1 {
		return nil, fmt.Errorf("batch: MaxBytes %d cannot hold a packet: %w", o.MaxBytes, fabric.ErrInvalid)
	}
	if o.Deadline == 0 {
		o.Deadline = DefaultDeadline
	}
	if o.Depth == 0 {
		o.Depth = DefaultDepth
	}
	if o.Depth < 1 || o.Depth > 1<<16 {
		return nil, fmt.Errorf("batch: Depth %d: %w", o.Depth, fabric.ErrInvalid)
	}
	o.Depth = 1 << bits.Len(uint(o.Depth-1)) // a power of two, for masking
	stride := (HeaderSize(o.MaxPackets) + 63) &^ 63
	reg, err := ep.Alloc(o.Depth*stride, 0)
	if err != nil {
		return nil, fmt.Errorf("batch: header region: %w", err)
	}
	c := &Coalescer{ep: ep, maxPkts: o.MaxPackets, maxBytes: o.MaxBytes, deadline: int64(o.Deadline),
		inline: caps.InlineSize, external: o.ExternalCompletions, hdrReg: reg,
		descs: make([]desc, o.Depth), mask: uint64(o.Depth - 1), msgs: make([]fabric.Message, o.Depth),
		comps: make([]fabric.Completion, 64), tag: uint64(rand.Uint32()) << 32}
	if o.Deadline < 0 {
		c.deadline = -1
	}
	sges := make([]fabric.SGE, o.Depth*(o.MaxPackets+1))
	cookies := make([]uint64, o.Depth*o.MaxPackets)
	for i := range c.descs {
		d := &c.descs[i]
		d.sges = sges[i*(o.MaxPackets+1) : (i+1)*(o.MaxPackets+1) : (i+1)*(o.MaxPackets+1)]
		d.sges[0] = fabric.SGE{Region: reg, Offset: i * stride}
		d.cookies = cookies[i*o.MaxPackets : (i+1)*o.MaxPackets : (i+1)*o.MaxPackets]
		d.hdr = reg.Bytes()[i*stride : (i+1)*stride : (i+1)*stride]
	}
	return c, nil
}

// MaxPackets returns the packet limit of a batch in effect.
func (c *Coalescer) MaxPackets() int { return c.maxPkts }

// MaxBytes returns the message size limit of a batch in effect.
func (c *Coalescer) MaxBytes() int { return c.maxBytes }

// Endpoint returns the endpoint the coalescer sends on.
func (c *Coalescer) Endpoint() fabric.Endpoint { return c.ep }

// open returns the open descriptor, or nil if every descriptor is busy.
func (c *Coalescer) open() *desc {
	if c.tail-c.head == uint64(len(c.descs)) {
		return nil
	}
	return &c.descs[c.tail&c.mask]
}

// Add appends a packet to the open batch; cookie comes back from Reclaim
// when the packet's buffer is free again. The packet's memory belongs to
// the coalescer until then. Add sends the batch when it is full (by
// count or bytes); it does not look at the clock except to start a batch,
// so deadlines are kept by Tick or Poll.
//
// Add returns an error only if it did not take the packet: ErrFull when
// every descriptor is busy, os.ErrClosed after Close, or an error
// matching fabric.ErrInvalid, ErrClosed, ErrBounds or ErrMessageSize for
// a packet that can never be sent. Send errors are reported by Tick,
// Poll and Flush.
func (c *Coalescer) Add(p fabric.SGE, cookie uint64) error {
	c.mu.Lock()
	err := c.addLocked(p, cookie)
	c.mu.Unlock()
	return err
}

// AddBurst adds packets[i] with cookies[i] in order, under one lock, and
// returns how many it took; it stops at the first packet it cannot take
// and returns Add's error for it. cookies must be at least as long as
// packets.
func (c *Coalescer) AddBurst(packets []fabric.SGE, cookies []uint64) (int, error) {
	cookies = cookies[:len(packets)]
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range packets {
		if err := c.addLocked(packets[i], cookies[i]); err != nil {
			return i, err
		}
	}
	return len(packets), nil
}

func (c *Coalescer) addLocked(p fabric.SGE, cookie uint64) error {
	if c.closed {
		return errClosed
	}
	r := p.Region
	switch {
	case r == nil:
		return errNoRegion
	case r.Closed():
		return errRegionGone
	case p.Length < 1 || p.Length > MaxPacketLen || p.Length > c.maxBytes-HeaderSize(1):
		return errPktSize
	case p.Offset < 0 || p.Offset > r.Len()-p.Length:
		return errPktBounds
	}
	d := c.open()
	if d != nil && d.n > 0 && d.bytes+2+p.Length > c.maxBytes {
		c.closeLocked(FlushBytes)
		d = c.open()
	}
	if d == nil {
		c.pollLocked()
		c.retryLocked()
		if d = c.open(); d == nil {
			c.st.Full++
			return ErrFull
		}
	}
	i := d.n
	if i == 0 {
		d.bytes = FixedHeaderSize
		if c.deadline >= 0 {
			c.due = nanotime() + c.deadline
		}
	}
	d.sges[1+i] = p
	d.cookies[i] = cookie
	d.hdr[FixedHeaderSize+2*i] = byte(p.Length)
	d.hdr[FixedHeaderSize+2*i+1] = byte(p.Length >> 8)
	d.n++
	d.bytes += 2 + p.Length
	switch {
	case d.n == c.maxPkts:
		c.closeLocked(FlushCount)
	case d.bytes+3 > c.maxBytes: // not even a 1-byte packet fits
		c.closeLocked(FlushBytes)
	}
	return nil
}

// closeLocked closes the open batch (which has packets), queues it and
// tries to send the queue.
func (c *Coalescer) closeLocked(cause FlushCause) error {
	c.sealLocked()
	c.st.Flushes[cause]++
	return c.retryLocked()
}

// sealLocked finishes the open batch's header and message and queues it.
func (c *Coalescer) sealLocked() {
	i := c.tail & c.mask
	d := &c.descs[i]
	putHeader(d.hdr, d.n, c.seq)
	c.seq++
	d.sges[0].Length = HeaderSize(d.n)
	d.pos = c.tail
	d.signaled = d.bytes > c.inline
	d.done, d.taken, d.blocked = false, 0, false
	m := &c.msgs[i]
	m.SGEs = d.sges[:1+d.n]
	m.Imm = Imm
	m.Flags = fabric.FlagImm
	if d.signaled {
		m.Flags |= fabric.FlagSignal
	}
	m.Context = c.tag | uint64(uint32(c.tail))
	c.tail++
}

// sendLocked sends queued batches until the endpoint pushes back.
func (c *Coalescer) sendLocked() error {
	for c.sent < c.tail {
		i := c.sent & c.mask
		k := min(c.tail-c.sent, uint64(len(c.descs))-i)
		n, err := c.ep.Send(c.msgs[i : i+k])
		c.acceptedLocked(n)
		if err != nil {
			if !rejects(err) {
				return err // endpoint down or closed: keep the queue
			}
			// msgs[i+n] can never be sent: hand its packets back.
			d := &c.descs[c.sent&c.mask]
			d.done = true
			c.st.Drops[DropRejected]++
			c.st.DroppedPackets += uint64(d.n)
			c.sent++
			return err
		}
		if uint64(n) < k {
			if d := &c.descs[c.sent&c.mask]; !d.blocked {
				d.blocked = true
				c.st.Backpressure++
			}
			c.backoff = min(2*c.backoff+1, maxBackoff)
			c.skip = c.backoff
			return nil
		}
	}
	c.backoff, c.skip = 0, 0
	return nil
}

// retryLocked retries queued batches, unless backing off.
func (c *Coalescer) retryLocked() error {
	if c.sent == c.tail {
		return nil
	}
	if c.skip > 0 {
		c.skip--
		return nil
	}
	return c.sendLocked()
}

// rejects reports whether a Send error is about the message rather than
// the endpoint.
func rejects(err error) bool {
	return errors.Is(err, fabric.ErrInvalid) || errors.Is(err, fabric.ErrBounds) ||
		errors.Is(err, fabric.ErrAccess) || errors.Is(err, fabric.ErrMessageSize) ||
		errors.Is(err, fabric.ErrNotSupported)
}

// acceptedLocked accounts for n batches taken by Send.
func (c *Coalescer) acceptedLocked(n int) {
	for j := 0; j < n; j++ {
		d := &c.descs[c.sent&c.mask]
		if d.signaled {
			c.inflight++
		} else {
			d.done = true
		}
		c.st.Batches++
		c.st.Packets += uint64(d.n)
		c.st.Bytes += uint64(d.bytes - HeaderSize(d.n))
		c.st.BatchSizes[SizeBucket(d.n)]++
		c.sent++
	}
}

// pollLocked polls the endpoint's completion queue while signaled batches
// are in flight (unless completions are external).
func (c *Coalescer) pollLocked() {
	for c.inflight > 0 && !c.external {
		n := c.ep.CQ().Poll(c.comps)
		if n == 0 {
			return
		}
		c.completeLocked(c.comps[:n], true)
	}
}

// completeLocked marks the batches of cs complete and returns how many
// of cs were the coalescer's.
func (c *Coalescer) completeLocked(cs []fabric.Completion, countForeign bool) int {
	mine := 0
	for j := range cs {
		cp := &cs[j]
		if cp.Context&^0xffffffff != c.tag || cp.Op != fabric.OpSend {
			if countForeign {
				c.st.Foreign++
			}
			continue
		}
		// Rebuild the full position from its low 32 bits: it lies in
		// [head, sent).
		pos := c.sent - uint64(uint32(c.sent)-uint32(cp.Context))
		if pos < c.head || pos >= c.sent {
			if countForeign {
				c.st.Foreign++
			}
			continue
		}
		d := &c.descs[pos&c.mask]
		if d.pos != pos || !d.signaled || d.done {
			if countForeign {
				c.st.Foreign++
			}
			continue
		}
		d.done = true
		c.inflight--
		if cp.Status != fabric.StatusOK {
			c.st.Drops[DropFailed]++
			c.st.DroppedPackets += uint64(d.n)
		}
		mine++
	}
	c.freeHeadersLocked()
	return mine
}

// Complete hands completions polled from the endpoint's queue to the
// coalescer, with Options.ExternalCompletions. It returns how many were
// the coalescer's (it ignores the others), and may be given every
// completion of the queue.
func (c *Coalescer) Complete(cs []fabric.Completion) int {
	c.mu.Lock()
	n := c.completeLocked(cs, false)
	c.mu.Unlock()
	return n
}

// Reclaim stores into out the cookies of packets whose batches have
// completed, oldest first, and returns how many. Those buffers are the
// caller's again. Packets of batches that failed (Stats.Drops) come back
// too: their buffers are free, their data was not delivered. Reclaim
// works after Close, so the caller gets every buffer back.
func (c *Coalescer) Reclaim(out []uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pollLocked()
	n := 0
	for c.head < c.sent && n < len(out) {
		d := &c.descs[c.head&c.mask]
		if !d.done {
			break
		}
		k := copy(out[n:], d.cookies[d.taken:d.n])
		n += k
		d.taken += k
		if d.taken < d.n {
			break
		}
		d.n, d.taken, d.done = 0, 0, false
		c.head++
	}
	return n
}

// Tick closes the open batch if its first packet has waited the deadline
// by now, retries batches queued behind backpressure (spacing the retries
// out while the endpoint stays full), and polls completions. The router calls it (or Poll) in its loop, often enough to
// keep the deadline. It returns the number of batches still queued
// (backpressure) and the error of the last Send, if any.
func (c *Coalescer) Tick(now time.Time) (int, error) {
	return c.tick(int64(now.Sub(epoch)))
}

// Poll is Tick(time.Now()).
func (c *Coalescer) Poll() (int, error) { return c.tick(nanotime()) }

func (c *Coalescer) tick(now int64) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, errClosed
	}
	c.pollLocked()
	var err error
	if d := c.open(); d != nil && d.n > 0 && c.deadline >= 0 && now >= c.due {
		err = c.closeLocked(FlushDeadline)
	} else {
		err = c.retryLocked()
	}
	return int(c.tail - c.sent), err
}

// Due returns when the open batch's deadline expires, and false if there
// is no open batch with a deadline. A program that sleeps between packets
// can use it to wake in time.
func (c *Coalescer) Due() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d := c.open(); d == nil || d.n == 0 || c.deadline < 0 || c.closed {
		return time.Time{}, false
	}
	return epoch.Add(time.Duration(c.due)), true
}

// Flush closes the open batch, if it has packets, and sends every queued
// batch the endpoint takes. It returns the number of batches still queued
// (backpressure) and the Send error, if any.
func (c *Coalescer) Flush() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, errClosed
	}
	c.pollLocked()
	var err error
	if d := c.open(); d != nil && d.n > 0 {
		c.sealLocked()
		c.st.Flushes[FlushExplicit]++
	}
	if c.sent < c.tail {
		err = c.sendLocked() // explicit: no backoff
	}
	return int(c.tail - c.sent), err
}

// FlushWait is Flush that waits (with the endpoint's SendWait) until the
// endpoint has taken every batch, ctx is done or sending fails. It holds
// the coalescer's lock while it waits.
func (c *Coalescer) FlushWait(ctx context.Context) error {
	if _, err := c.Flush(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.sent < c.tail && !c.closed {
		i := c.sent & c.mask
		k := min(c.tail-c.sent, uint64(len(c.descs))-i)
		n, err := c.ep.SendWait(ctx, c.msgs[i:i+k])
		c.acceptedLocked(n)
		if err != nil {
			if rejects(err) {
				d := &c.descs[c.sent&c.mask]
				d.done = true
				c.st.Drops[DropRejected]++
				c.st.DroppedPackets += uint64(d.n)
				c.sent++
			}
			return err
		}
	}
	if c.closed {
		return errClosed
	}
	return nil
}

// Pending returns the number of closed batches queued behind
// backpressure.
func (c *Coalescer) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.tail - c.sent)
}

// InFlight returns the number of signaled batches sent and not yet
// complete.
func (c *Coalescer) InFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inflight
}

// Open returns the number of packets in the open batch.
func (c *Coalescer) Open() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d := c.open(); d != nil {
		return d.n
	}
	return 0
}

// Stats returns a snapshot of the counters.
func (c *Coalescer) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st
}

// Close stops the coalescer. It does not send: batches not yet taken by
// the endpoint (the open one and those queued) are dropped (DropClosed)
// and their packets come back from Reclaim at once; call FlushWait first
// to deliver them. Packets of signaled batches in flight come back when
// their completions are polled (by Reclaim). The header region is freed
// when nothing is in flight. Close does not close the endpoint. It is
// idempotent; afterwards Add, Tick, Poll and Flush return os.ErrClosed.
func (c *Coalescer) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if d := c.open(); d != nil && d.n > 0 {
		c.sealLocked()
	}
	for ; c.sent < c.tail; c.sent++ {
		d := &c.descs[c.sent&c.mask]
		d.done = true
		c.st.Drops[DropClosed]++
		c.st.DroppedPackets += uint64(d.n)
	}
	c.freeHeadersLocked()
	return nil
}

// freeHeadersLocked frees the header region once the coalescer is closed
// and no batch that names it is in flight.
func (c *Coalescer) freeHeadersLocked() {
	if c.closed && c.inflight == 0 && c.hdrReg != nil {
		c.hdrReg.Close()
		c.hdrReg = nil
	}
}
