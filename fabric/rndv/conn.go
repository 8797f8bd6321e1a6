package rndv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/fabric"
)

// Errors of the package. Peer violations match fabric.ErrMalformed.
var (
	// ErrTruncated is returned by Recv for a message longer than its
	// buffer: the buffer holds the message's first bytes, the rest is
	// lost, and the connection goes on.
	ErrTruncated = errors.New("rndv: message truncated")
	// ErrStalled reports a rendezvous the peer committed to and did not
	// complete within Options.Timeout. It matches fabric.ErrPeerGone.
	ErrStalled = fmt.Errorf("rndv: rendezvous stalled: %w", fabric.ErrPeerGone)
)

// Defaults of Options.
const (
	// DefaultSlots is the number of receive slots.
	DefaultSlots = 32
	// DefaultTimeout bounds a committed rendezvous.
	DefaultTimeout = 10 * time.Second
	// maxSlot caps a receive slot, header included: a verbs peer posts
	// 64 KiB receive buffers by default.
	maxSlot = 64 << 10
)

// Options configure New. The zero value selects every default.
type Options struct {
	// Threshold is the largest message sent eagerly; longer ones go by
	// rendezvous where the endpoint has RMA. 0 selects
	// DefaultThreshold(ep.Caps()), a negative value sends every message
	// eagerly. Both ends should use the same value; a different one
	// costs speed, not correctness.
	Threshold int
	// Slots is the number of receive slots, each of the endpoint's
	// message size capped at 64 KiB (0: DefaultSlots).
	Slots int
	// Timeout bounds a rendezvous the peer has committed to: once this
	// side answers its RTS with a buffer, or the peer's writes into a
	// buffer advertised before any RTS have started, the rest must
	// arrive within Timeout or the connection closes with ErrStalled (0:
	// DefaultTimeout; negative: no bound but the caller's context).
	Timeout time.Duration
}

// DefaultThreshold is the eager limit New picks for an endpoint with caps,
// measured per backend with BenchmarkThreshold on a 2-core host: below it
// the eager copy costs less than the rendezvous' extra frame, above it
// the single copy wins. It is -1 (every message eager) where the
// endpoint has no RMA (ethernet).
//
//   - ntb: 8 KiB. At 8 KiB both ways move about 4.5 GB/s; at 4 KiB eager
//     is 1.4x faster, at 16 KiB rendezvous is 1.5x, at 64 KiB 4-6x.
//   - roce (the user-space engine): 128 KiB. Every rendezvous waits for
//     its WRITE's acknowledgement, a round trip of the engine's UDP
//     path; it loses at 64 KiB (0.8x) and wins at 256 KiB (1.7x).
//   - others (verbs): 32 KiB, not measured here (no RDMA NIC); the order
//     of UCX's own rendezvous thresholds over RC.
func DefaultThreshold(caps fabric.Caps) int {
	if !caps.RMA {
		return -1
	}
	switch caps.Backend {
	case "ntb":
		return 8 << 10
	case "roce":
		return 128 << 10
	}
	return 32 << 10
}

// Stats count a Conn's messages.
type Stats struct {
	// EagerSent and RndvSent count messages sent each way.
	EagerSent, RndvSent uint64
	// EagerRecv and RndvRecv count messages received each way.
	EagerRecv, RndvRecv uint64
	// RTS counts the rendezvous that had to ask (no advertised buffer was
	// waiting), Adverts the buffers advertised before any RTS.
	RTS, Adverts uint64
}

// Conn is one side of a message connection over a reliable endpoint.
// Send and Recv may run concurrently; concurrent Sends (and Recvs) are
// serialised.
type Conn struct {
	ep       fabric.Endpoint
	caps     fabric.Caps
	thresh   int
	slotSize int
	maxWrite int
	timeout  time.Duration

	sendMu sync.Mutex
	recvMu sync.Mutex
	// pollMu is held by the one caller that takes frames from the
	// endpoint and hands them to their role.
	pollMu sync.Mutex

	mu    sync.Mutex // guards the fields below
	free  []int32    // free receive slots
	q     []rec      // frames for the receiver, in order (a ring)
	qHead int
	qLen  int
	adv   advert // the receiver's buffer for message sseq
	sseq  uint32 // the next message to send
	// slast is set once the last write of message sseq may have
	// landed: the receiver may have finished it, and advertise its
	// buffer for the next at once, before Send has seen the write
	// complete. nadv holds that ADV, for message sseq+1.
	slast   bool
	nadv    advert
	rseq    uint32 // the next message to receive
	err     error  // the connection's failure
	stats   Stats
	lastRdv bool // the last message received was a rendezvous
	// stallArmed is set while a committed rendezvous is bounded by
	// stallTimer.
	stallArmed bool
	// stallDeadline is when the armed bound ends: a run of the timer
	// left over from an earlier arm (it fired as that bound was being
	// lifted) finds it in the future and does nothing.
	stallDeadline time.Time
	stallTimer    *time.Timer

	// ready wakes the sender (0) and the receiver (1).
	ready [2]chan struct{}

	rx     *fabric.Region
	rxMsgs []fabric.Message
	rxSGEs []fabric.SGE
	taken  []int32        // poll's slots, in the order of rxMsgs
	tx     *fabric.Region // sender's header, then the receiver's ADVs
	advIdx int
	// rbegun (receiver) and sbegun (sender) report that the message
	// under way has moved something the peer acts on: a frame of it was
	// taken, a writable buffer advertised, a fragment or write posted.
	// An error then fails the connection, for the message cannot be
	// resumed.
	rbegun, sbegun bool
	// txRing holds eager frames the endpoint does not copy at once
	// (larger than Caps.InlineSize), txSlots of slotSize bytes, used in
	// turn; nil where every frame is inline. inflight counts the
	// sender's signaled operations not yet completed; completions come
	// in order.
	txRing   *fabric.Region
	txSlots  int
	txNext   int
	inflight int

	// Preallocated operations.
	sendMsg  [1]fabric.Message
	sendSGEs [2]fabric.SGE
	advMsg   [1]fabric.Message
	advSGE   [1]fabric.SGE
	comps    [16]fabric.Completion

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// rec is a received frame waiting for the receiver.
type rec struct {
	slot   int32
	n      int  // the frame's length, or the bytes written
	notify bool // an RMA write's notification
	imm    uint32
}

// advert is an ADV for message seq.
type advert struct {
	ok    bool
	seq   uint32
	eager bool
	iov   fabric.RemoteIOV
}

const (
	roleSend = 0
	roleRecv = 1
	// ctxWrite tags the completions of rendezvous writes and of signaled
	// DATA frames.
	ctxWrite = 0x726e6476 // "rndv"
	advRing  = 16
	// txSlots is the number of eager frames in flight where the
	// endpoint does not copy them at once.
	txSlots = 8
)

// New makes a Conn over ep, which must be reliable; the Conn owns ep and
// closes it. Both ends of the connection must use rndv.
func New(ep fabric.Endpoint, o *Options) (*Conn, error) {
	if o == nil {
		o = &Options{}
	}
	caps := ep.Caps()
	if !caps.Reliable {
		return nil, &fabric.OpError{Op: "rndv", Backend: caps.Backend, Err: fmt.Errorf("unreliable endpoint: %w", fabric.ErrNotSupported)}
	}
	slot := min(caps.MaxMsgSize, maxSlot)
	if slot < ADVLen+HeaderLen {
		return nil, &fabric.OpError{Op: "rndv", Backend: caps.Backend, Err: fmt.Errorf("messages of %d bytes: %w", caps.MaxMsgSize, fabric.ErrNotSupported)}
	}
	c := &Conn{ep: ep, caps: caps, slotSize: slot, maxWrite: caps.MaxRMASize, timeout: o.Timeout}
	switch {
	case o.Threshold == 0:
		c.thresh = DefaultThreshold(caps)
	case o.Threshold < 0 || !caps.RMA:
		c.thresh = -1
	default:
		c.thresh = o.Threshold
	}
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
	}
	if c.maxWrite <= 0 {
		c.maxWrite = 1 << 30
	}
	slots := o.Slots
	if slots <= 0 {
		slots = DefaultSlots
	}
	var err error
	if c.rx, err = ep.Alloc(slots*slot, fabric.AccessLocalWrite); err != nil {
		return nil, err
	}
	if c.tx, err = ep.Alloc(HeaderLen+advRing*ADVLen, 0); err != nil {
		c.rx.Close()
		return nil, err
	}
	if caps.InlineSize < slot {
		c.txSlots = txSlots
		if c.txRing, err = ep.Alloc(txSlots*slot, 0); err != nil {
			c.rx.Close()
			c.tx.Close()
			return nil, err
		}
	}
	c.free = make([]int32, slots)
	c.taken = make([]int32, slots)
	for i := range c.free {
		c.free[i] = int32(slots - 1 - i)
	}
	c.q = make([]rec, slots)
	c.rxMsgs = make([]fabric.Message, slots)
	c.rxSGEs = make([]fabric.SGE, slots)
	for i := range c.ready {
		c.ready[i] = make(chan struct{}, 1)
	}
	c.stallTimer = time.AfterFunc(time.Hour, c.stalled)
	c.stallTimer.Stop()
	return c, nil
}

// Endpoint returns the endpoint under c, for Alloc and Register of the
// buffers that Send and Recv take.
func (c *Conn) Endpoint() fabric.Endpoint { return c.ep }

// Threshold returns the eager limit in use (-1: every message is eager).
func (c *Conn) Threshold() int { return c.thresh }

// Stats returns a snapshot of c's counters.
func (c *Conn) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Close closes the connection and its endpoint. Blocked calls return an
// error matching os.ErrClosed. It is idempotent.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.mu.Lock()
		if c.err == nil {
			c.err = fabric.ErrClosed
		}
		c.mu.Unlock()
		c.closeErr = c.ep.Close()
		c.stallTimer.Stop()
		c.kick()
		// The regions go after the callers have left them.
		c.sendMu.Lock()
		c.recvMu.Lock()
		c.rx.Close()
		c.tx.Close()
		if c.txRing != nil {
			c.txRing.Close()
		}
		c.recvMu.Unlock()
		c.sendMu.Unlock()
	})
	return c.closeErr
}

func (c *Conn) opErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var oe *fabric.OpError
	if errors.As(err, &oe) {
		return err
	}
	return &fabric.OpError{Op: op, Backend: c.caps.Backend, Err: err}
}

// fail records err as the connection's failure, unless one is recorded,
// closes the endpoint so every caller wakes, and returns the failure.
func (c *Conn) fail(err error) error {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	err = c.err
	c.mu.Unlock()
	c.ep.Close()
	c.kick()
	return err
}

// violation fails the connection for a peer's protocol violation.
func (c *Conn) violation(format string, args ...any) error {
	return c.fail(fmt.Errorf("rndv: peer violation: "+format+": %w", append(args, fabric.ErrMalformed)...))
}

// kick wakes both roles.
func (c *Conn) kick() {
	for _, ch := range c.ready {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// ready reports, under mu, whether role has what it waits for.
func (c *Conn) readyLocked(role int) bool {
	if role == roleSend {
		return c.adv.ok
	}
	return c.qLen > 0
}

// waitHook, if set (by tests), runs in wait at stage: hookLooked
// between the look at the role's frames and the attempt to poll,
// hookPolling with the poll taken, before the second look, hookBlocking
// before waiting for a kick.
var waitHook func(role, stage int)

// The stages of wait that waitHook sees.
const (
	hookLooked = iota
	hookPolling
	hookBlocking
)

// wait blocks until role's frame has arrived, polling the endpoint
// itself when no other caller does.
func (c *Conn) wait(ctx context.Context, role int) error {
	for {
		c.mu.Lock()
		ok, err, nfree := c.readyLocked(role), c.err, len(c.free)
		c.mu.Unlock()
		switch {
		case ok:
			return nil
		case err != nil:
			return err
		}
		if waitHook != nil {
			waitHook(role, hookLooked)
		}
		if nfree > 0 && c.pollMu.TryLock() {
			if waitHook != nil {
				waitHook(role, hookPolling)
			}
			// The poller before may have queued role's frame, and
			// kicked, between the look above and TryLock: look again
			// before blocking in the endpoint.
			c.mu.Lock()
			ok, err = c.readyLocked(role), c.err
			c.mu.Unlock()
			if ok || err != nil {
				c.pollMu.Unlock()
				// The other role may have found the poll taken
				// meanwhile, and waits for a kick to poll.
				c.kick()
				continue
			}
			verr, perr := c.poll(ctx)
			c.pollMu.Unlock()
			c.kick()
			switch {
			case verr != nil:
				return c.fail(verr)
			case perr != nil && ctx.Err() != nil:
				return ctx.Err()
			case perr != nil:
				return c.fail(perr)
			}
			continue
		}
		if waitHook != nil {
			waitHook(role, hookBlocking)
		}
		select {
		case <-c.ready[role]:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// poll takes the frames that have arrived, waiting for one, into free
// slots, and hands each to its role. It returns a peer's violation and
// the endpoint's error apart. Called with pollMu held.
func (c *Conn) poll(ctx context.Context) (verr, err error) {
	// The slots leave the free list while the endpoint may fill them:
	// the receiver releases slots into it meanwhile.
	c.mu.Lock()
	k := len(c.free)
	for i := 0; i < k; i++ {
		s := c.free[k-1-i]
		c.taken[i] = s
		c.rxSGEs[i] = fabric.SGE{Region: c.rx, Offset: int(s) * c.slotSize, Length: c.slotSize}
		c.rxMsgs[i] = fabric.Message{SGEs: c.rxSGEs[i : i+1]}
	}
	c.free = c.free[:0]
	c.mu.Unlock()
	n, err := c.ep.RecvWait(ctx, c.rxMsgs[:k])
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := k - 1; i >= n; i-- {
		c.free = append(c.free, c.taken[i])
	}
	for i := 0; i < n; i++ {
		if verr := c.dispatchLocked(c.taken[i], &c.rxMsgs[i]); verr != nil {
			return verr, err
		}
	}
	return nil, err
}

// dispatchLocked hands the frame in slot s to its role.
func (c *Conn) dispatchLocked(s int32, m *fabric.Message) error {
	if m.Flags&fabric.FlagRemoteWrite != 0 {
		c.pushLocked(rec{slot: s, n: m.Len, notify: true, imm: m.Imm})
		return nil
	}
	h := Header(c.rx.Bytes()[int(s)*c.slotSize:][:m.Len])
	if m.Flags&fabric.FlagTruncated != 0 || !h.IsValid() {
		c.free = append(c.free, s)
		return fmt.Errorf("rndv: peer violation: a malformed frame of %d bytes: %w", m.Len, fabric.ErrMalformed)
	}
	if h.Kind() != kindADV {
		c.pushLocked(rec{slot: s, n: m.Len})
		return nil
	}
	c.free = append(c.free, s)
	switch d := int32(h.Seq() - c.sseq); {
	case d < 0:
		return nil // for a message that went eagerly
	case d == 1 && c.slast:
		if c.nadv.ok {
			return fmt.Errorf("rndv: peer violation: second ADV for message %d: %w", h.Seq(), fabric.ErrMalformed)
		}
		c.nadv = advert{ok: true, seq: h.Seq(), eager: h.Eager(), iov: h.Remote()}
		return nil
	case d > 0:
		return fmt.Errorf("rndv: peer violation: ADV for message %d, %d not sent yet: %w", h.Seq(), c.sseq, fabric.ErrMalformed)
	case c.adv.ok:
		return fmt.Errorf("rndv: peer violation: second ADV for message %d: %w", h.Seq(), fabric.ErrMalformed)
	}
	c.adv = advert{ok: true, seq: h.Seq(), eager: h.Eager(), iov: h.Remote()}
	return nil
}

func (c *Conn) pushLocked(r rec) {
	c.q[(c.qHead+c.qLen)%len(c.q)] = r
	c.qLen++
}

// next waits for the receiver's next frame.
func (c *Conn) next(ctx context.Context) (rec, error) {
	if err := c.wait(ctx, roleRecv); err != nil {
		return rec{}, err
	}
	c.mu.Lock()
	r := c.q[c.qHead]
	c.qHead = (c.qHead + 1) % len(c.q)
	c.qLen--
	c.mu.Unlock()
	return r, nil
}

// release returns a slot the receiver is done with.
func (c *Conn) release(s int32) {
	c.mu.Lock()
	c.free = append(c.free, s)
	c.mu.Unlock()
	c.kick()
}

// check refuses an SGE outside its region or without the access.
func (c *Conn) check(op string, s fabric.SGE, need fabric.Access) error {
	if _, err := fabric.CheckSGEs([]fabric.SGE{s}, nil, need); err != nil {
		return c.opErr(op, err)
	}
	return nil
}

func (c *Conn) closedErr(op string) error {
	if c.closed.Load() {
		return c.opErr(op, fabric.ErrClosed)
	}
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	return c.opErr(op, err)
}
