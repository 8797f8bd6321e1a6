package ntb

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/cq"
	"github.com/weft-io/weft/internal/shm"
	"github.com/weft-io/weft/internal/spin"
)

// Endpoint is one queue of a Transport, as a fabric.Endpoint.
//
// A message is one record in the receiver's ring: a 16-byte header
// {seq, len, imm, flags} and the payload, padded to 16 bytes. The sender
// writes a burst of records, zeroes the header word after the last one,
// and only then stores the first record's seq word: one ordered store
// publishes the whole burst, and a receiver polling that word gets the
// first record in the same cache line (one line transfer per message
// when idle, which is what keeps the latency at the shared-memory floor).
// The seq word is derived from the record's position and the receiver's
// session nonce, so a stale or forged header never matches. The receiver
// consumes records up to the first empty seq and publishes its position
// once per burst into the sender's window.
//
// Doorbells are coalesced: a receiver that stops spinning sets a flag in
// the sender's window and sleeps; the sender rings only when it sees the
// flag.
type Endpoint struct {
	t     *Transport
	q     int
	rxBit uint64
	txBit uint64
	cq    *cq.Queue
	ctr   fabric.Counters
	evs   chan fabric.Event

	closed  atomic.Bool
	once    sync.Once
	relOnce sync.Once
	armedFD atomic.Int32 // the wake-up a wait set watches while armed, -1 if none
	armedW  atomic.Pointer[fabric.Waker]
	owner   bool // Close closes the transport (endpoints from fabric.Open)
	// conn marks an endpoint a listener accepted or a dialer connected:
	// its peer endpoint lives for one session of the bridge, and so does
	// it (Transport.reset replaces it with a fresh one).
	conn atomic.Bool
	addr string // LocalAddr and RemoteAddr: both sides name the bridge
	// release, if set, lets go of a bridge shared with other endpoints
	// (listeners and their dialers): Close calls it once.
	release func()

	// gen is the incarnation of the queue this endpoint serves in the
	// session: 0 from the session's start, one more each time the queue
	// is reclaimed (Transport.reclaim).
	gen uint32

	txMu       sync.Mutex
	txUp       bool
	txWait     bool // attached, but the peer has not reset its side of the queue for gen yet
	txRing     []byte
	txTail     uint64 // absolute position of the next record
	txHead     uint64 // cached consumer position
	txSalt     uint32
	txHeadW    *atomic.Uint64 // in our window: written by the peer
	rxSleep    *atomic.Uint32 // in our window: the peer's receiver sleeps
	txSleepP   *atomic.Uint32 // in the peer's window: we wait for room
	txFirstSeq uint32         // seq of the first record of the burst being written
	peerWin    []byte
	txRingOff  int // offset of txRing in the peer's window

	rxMu     sync.Mutex
	rxValid  bool // rxRing holds records of the current or last session
	rxUp     bool
	rxRing   []byte
	rxHead   uint64
	rxSalt   uint32
	rxHeadP  *atomic.Uint64 // in the peer's window: our consumer position
	rxSleepP *atomic.Uint32 // in the peer's window: we sleep
	txSleep  *atomic.Uint32 // in our window: the peer's sender waits for room

	rxSpin spin.Budget // recvWait's
	txSpin spin.Budget // SendWait's

	rxRel uint64   // consumer position published to the peer
	vq    []uint64 // ring positions of outstanding views, a queue
	vHead uint64   // oldest outstanding view in vq
	vTail uint64   // next free slot in vq
	vLost int      // outstanding views of a past session
	// epoch is ViewEpoch: resetLocked adds one before the session's
	// receive memory is cleared or reused, close before the views go
	// void.
	epoch atomic.Uint64
}

var (
	_ fabric.Endpoint     = (*Endpoint)(nil)
	_ fabric.ViewReceiver = (*Endpoint)(nil)
)

func newEndpoint(t *Transport, q int) *Endpoint {
	e := &Endpoint{t: t, q: q, rxBit: 1 << (2 * q), txBit: 1 << (2*q + 1),
		cq: cq.New(t.cfg.CQSize, t.spin), evs: make(chan fabric.Event, 64)}
	e.rxSpin.Init(t.spin)
	e.txSpin.Init(t.spin)
	return e
}

func (e *Endpoint) ctrl(off int) int { return ctrlOff + e.q*ctrlStride + off }

func (e *Endpoint) resetLocked() {
	e.epoch.Add(1) // before the caller clears the ring (ViewEpoch)
	e.txUp, e.rxUp, e.rxValid, e.txWait = false, false, false, false
	e.gen = 0
	e.txTail, e.txHead, e.rxHead, e.rxRel = 0, 0, 0, 0
	e.vLost += int(e.vTail - e.vHead)
	e.vHead, e.vTail = 0, 0
	e.txRing, e.rxRing, e.peerWin = nil, nil, nil
	e.txHeadW, e.rxSleep, e.txSleepP, e.rxHeadP, e.rxSleepP, e.txSleep = nil, nil, nil, nil, nil, nil
}

func (e *Endpoint) attachLocked(p peerParams, pw []byte, pn uint32) {
	t := e.t
	e.txRing = pw[ringsOff+e.q*p.ring : ringsOff+(e.q+1)*p.ring : ringsOff+(e.q+1)*p.ring]
	e.txRingOff = ringsOff + e.q*p.ring
	e.txSalt = pn
	e.txHeadW = shm.U64(t.win, e.ctrl(ctrlTxHead))
	e.rxSleep = shm.U32(t.win, e.ctrl(ctrlRxSleep))
	e.txSleepP = shm.U32(pw, e.ctrl(ctrlTxSleep))
	e.rxRing = t.win[ringsOff+e.q*t.lay.ring : ringsOff+(e.q+1)*t.lay.ring : ringsOff+(e.q+1)*t.lay.ring]
	e.rxSalt = t.nonce
	e.rxHeadP = shm.U64(pw, e.ctrl(ctrlTxHead))
	e.rxSleepP = shm.U32(pw, e.ctrl(ctrlRxSleep))
	e.txSleep = shm.U32(t.win, e.ctrl(ctrlTxSleep))
	e.peerWin = pw
	e.txUp, e.rxUp, e.rxValid = true, true, true
}

func (e *Endpoint) detachLocked() {
	e.txUp, e.rxUp, e.txWait = false, false, false
}

// txReadyLocked brings up the send side of an endpoint a reclaim made,
// once the peer has reset its side of the queue for this incarnation.
func (e *Endpoint) txReadyLocked() bool {
	if !e.txWait || !e.rxUp || int32(shm.U32(e.t.win, e.ctrl(ctrlRdy)).Load()-e.gen) < 0 {
		return false
	}
	e.txWait, e.txUp = false, true
	return true
}

// peerFin reports whether the peer closed its endpoint of this
// incarnation of the queue (Transport.reclaim).
func (e *Endpoint) peerFin() bool {
	e.rxMu.Lock()
	defer e.rxMu.Unlock()
	return e.rxUp && int32(shm.U32(e.t.win, e.ctrl(ctrlFin)).Load()-(e.gen+1)) >= 0
}

// txDown is what Send and RMA say while the send side is not up: nothing
// sent while it waits for the peer's reset (txWait), else why it is down.
func (e *Endpoint) txDown(op string) error {
	if e.txWait {
		return nil
	}
	return e.downErr(op)
}

func (e *Endpoint) emit(ev fabric.Event) {
	select {
	case e.evs <- ev:
	default:
		e.ctr.Drop(fabric.DropEvent, 1)
	}
}

func seqOf(pos uint64, salt uint32) uint32 {
	return (uint32(pos>>4)+salt)&0x7fffffff | 0x80000000
}

func align16(n int) int { return (n + 15) &^ 15 }

func (e *Endpoint) opErr(op string, err error) error {
	return &fabric.OpError{Op: op, Backend: "ntb", Err: err}
}

func (e *Endpoint) downErr(op string) error {
	if e.closed.Load() {
		return e.opErr(op, fabric.ErrClosed)
	}
	if e.t.peerClosed.Load() {
		return e.opErr(op, fabric.ErrPeerClosed)
	}
	return e.opErr(op, fabric.ErrPeerGone)
}

// room reports whether size bytes (plus a header word of slack) fit after
// the current tail, refreshing the cached consumer position if needed.
func (e *Endpoint) room(size int) (bool, error) {
	ring := uint64(len(e.txRing))
	if e.txTail+uint64(size)+recHdr-e.txHead <= ring {
		return true, nil
	}
	h := e.txHeadW.Load()
	if h > e.txTail || e.txTail-h > ring || h < e.txHead {
		e.ctr.Drop(fabric.DropMalformed, 1)
		err := fmt.Errorf("%w: peer consumer position %d, our tail %d", fabric.ErrMalformed, h, e.txTail)
		e.t.fault(err)
		return false, err
	}
	e.txHead = h
	return e.txTail+uint64(size)+recHdr-e.txHead <= ring, nil
}

// reserve finds room for a record of n payload bytes, writing a padding
// record first if the record would cross the end of the ring. It returns
// the offset of the record, or -1 for backpressure. first tracks the
// offset of the first record of the burst, whose seq is stored last.
func (e *Endpoint) reserve(n int, first *int) (int, error) {
	size := align16(recHdr + n)
	ring := len(e.txRing)
	off := int(e.txTail % uint64(ring))
	pad := 0
	if off+size > ring {
		pad = ring - off
	}
	ok, err := e.room(pad + size)
	if !ok || err != nil {
		return -1, err
	}
	if pad > 0 {
		e.writeHdr(off, pad-recHdr, 0, recFlagPad, first)
		e.txTail += uint64(pad)
		off = 0
	}
	return off, nil
}

func (e *Endpoint) writeHdr(off, n int, imm uint32, flags uint32, first *int) {
	r := e.txRing
	shm.Put32(r, off+4, uint32(n))
	shm.Put32(r, off+8, imm)
	shm.Put32(r, off+12, flags)
	seq := seqOf(e.txTail, e.txSalt)
	if *first < 0 {
		*first = off
		e.txFirstSeq = seq
	} else {
		// Ordered by the store of the first record's seq in publish.
		shm.Put32(r, off, seq)
	}
}

// publish ends a burst: zero the header word after the last record, then
// store the first record's seq.
func (e *Endpoint) publish(first int) {
	if first < 0 {
		return
	}
	r := e.txRing
	shm.U32(r, int(e.txTail%uint64(len(r)))).Store(0)
	shm.U32(r, first).Store(e.txFirstSeq)
	if e.rxSleep.Load() != 0 {
		e.t.dev.PeerDBSet(e.rxBit)
		e.ctr.Doorbells.Add(1)
	}
}

// Send implements fabric.Endpoint. Messages are copied into the peer's
// ring, so buffers are free again when Send returns.
func (e *Endpoint) Send(msgs []fabric.Message) (int, error) {
	if e.closed.Load() {
		return 0, e.opErr("send", fabric.ErrClosed)
	}
	e.txMu.Lock()
	defer e.txMu.Unlock()
	if !e.txUp && !e.txReadyLocked() {
		return 0, e.txDown("send")
	}
	first := -1
	var bytes uint64
	n := 0
	var err error
	for n < len(msgs) {
		m := &msgs[n]
		if len(m.SGEs) > maxSGEs {
			err = e.opErr("send", fmt.Errorf("%d SGEs, max %d: %w", len(m.SGEs), maxSGEs, fabric.ErrMessageSize))
			break
		}
		size, cerr := fabric.CheckSGEs(m.SGEs, &e.t.dom, 0)
		if cerr != nil {
			err = e.opErr("send", cerr)
			break
		}
		if size > e.t.cfg.MaxMsgSize {
			err = e.opErr("send", fmt.Errorf("%d bytes, max %d: %w", size, e.t.cfg.MaxMsgSize, fabric.ErrMessageSize))
			break
		}
		if m.Flags&fabric.FlagSignal != 0 && e.cq.Free() == 0 {
			break
		}
		off, rerr := e.reserve(size, &first)
		if rerr != nil {
			err = e.opErr("send", rerr)
			break
		}
		if off < 0 {
			break
		}
		if !e.t.dma.use(size) || !e.t.dma.copy(true, m.SGEs, uint64(e.txRingOff+off+recHdr), size) {
			fabric.Gather(e.txRing[off+recHdr:off+recHdr+size], m.SGEs)
		}
		var fl uint32
		if m.Flags&fabric.FlagImm != 0 {
			fl = recFlagImm
		}
		e.writeHdr(off, size, m.Imm, fl, &first)
		e.txTail += uint64(align16(recHdr + size))
		bytes += uint64(size)
		if m.Flags&fabric.FlagSignal != 0 {
			e.cq.Push(fabric.Completion{Context: m.Context, Op: fabric.OpSend, Len: size})
		}
		n++
	}
	e.publish(first)
	if n > 0 {
		e.ctr.TxPackets.Add(uint64(n))
		e.ctr.TxMessages.Add(uint64(n))
		e.ctr.TxBytes.Add(bytes)
	}
	return n, err
}

// maxSGEs bounds an SGE list; the copy path has no hardware limit.
const maxSGEs = 64

// Recv implements fabric.Endpoint.
func (e *Endpoint) Recv(msgs []fabric.Message) (int, error) { return e.poll(msgs, nil) }

// RecvViews implements fabric.ViewReceiver: the views alias the records
// in the receive ring, which stay unconsumed (and count against the
// sender's room) until they are released.
func (e *Endpoint) RecvViews(views []fabric.View) (int, error) { return e.poll(nil, views) }

// ReleaseViews implements fabric.ViewReceiver.
func (e *Endpoint) ReleaseViews(n int) error {
	if e.closed.Load() {
		return e.opErr("release", fabric.ErrClosed)
	}
	e.rxMu.Lock()
	defer e.rxMu.Unlock()
	out := int(e.vTail - e.vHead)
	if n < 0 || n > out+e.vLost {
		return e.opErr("release", fmt.Errorf("%d views, %d outstanding: %w", n, out+e.vLost, fabric.ErrInvalid))
	}
	k := min(n, e.vLost) // the oldest views are those of a past session
	e.vLost -= k
	e.vHead += uint64(n - k)
	if n > k {
		e.releaseLocked()
	}
	return nil
}

// OutstandingViews implements fabric.ViewReceiver.
func (e *Endpoint) OutstandingViews() int {
	e.rxMu.Lock()
	defer e.rxMu.Unlock()
	return int(e.vTail-e.vHead) + e.vLost
}

// ViewRoom implements fabric.ViewRoom: views share the receive ring
// (Config.RingSize bytes) with the records still to arrive.
func (e *Endpoint) ViewRoom() (views, bytes int) { return maxViews, e.t.lay.ring }

// ViewEpoch implements fabric.ViewRoom: it changes when the session's
// receive memory is reset (Transport.reset, reclaim), before the ring is
// cleared, and when the endpoint closes (its views are void, and
// Transport.Close then zeroes their memory).
//
// It reads the epoch with a read-modify-write (adding 0), not a load: the
// reset's own add then reads from it whenever this read comes first, so
// the caller's copy before the call happens before the reset's clearing
// of the memory (Go's memory model; a plain atomic load would not order
// the copy's loads before it on weakly ordered processors such as arm64).
func (e *Endpoint) ViewEpoch() uint64 { return e.epoch.Add(0) }

var _ fabric.ViewRoom = (*Endpoint)(nil)

// maxViews bounds the outstanding views of an endpoint: the queue of
// their ring positions.
const maxViews = 4096

// record is a record parsed from the receive ring.
type record struct {
	payload []byte // aliases the ring; nil for an RMA notification
	ln      int    // payload length, or bytes written for an RMA notification
	imm     uint32
	flags   fabric.MsgFlags // FlagImm, FlagRemoteWrite
	size    uint64          // ring bytes the record takes
}

// nextLocked parses the record at rxHead, stepping over padding. It
// returns ok false when nothing more has arrived, or with err when the
// peer wrote a bad record (counted, and the session ends).
func (e *Endpoint) nextLocked(r []byte, ring uint64) (rec record, ok bool, err error) {
	for {
		off := int(e.rxHead % ring)
		seq := shm.U32(r, off).Load()
		if seq == 0 {
			return rec, false, nil
		}
		if seq != seqOf(e.rxHead, e.rxSalt) {
			return rec, false, e.malformed(fmt.Errorf("record at %d has sequence %#x, want %#x", e.rxHead, seq, seqOf(e.rxHead, e.rxSalt)))
		}
		ln := int(shm.Get32(r, off+4))
		imm := shm.Get32(r, off+8)
		fl := shm.Get32(r, off+12)
		switch {
		case fl&^recFlagsMask != 0:
			return rec, false, e.malformed(fmt.Errorf("record at %d has flags %#x", e.rxHead, fl))
		case fl&recFlagPad != 0:
			if ln != int(ring)-off-recHdr {
				return rec, false, e.malformed(fmt.Errorf("padding record at %d of %d bytes", e.rxHead, ln))
			}
			e.rxHead += uint64(ln + recHdr)
			continue
		case fl&recFlagRMA != 0:
			// Notification of an RMA write with immediate: no payload.
			return record{ln: ln, imm: imm, flags: fabric.FlagRemoteWrite | fabric.FlagImm, size: recHdr}, true, nil
		case ln > e.t.cfg.MaxMsgSize || off+recHdr+ln > int(ring):
			return rec, false, e.malformed(fmt.Errorf("record at %d of %d bytes", e.rxHead, ln))
		}
		rec = record{payload: r[off+recHdr : off+recHdr+ln : off+recHdr+ln], ln: ln, imm: imm, size: uint64(align16(recHdr + ln))}
		if fl&recFlagImm != 0 {
			rec.flags = fabric.FlagImm
		}
		return rec, true, nil
	}
}

// recvLocked copies arrived records into msgs. It parses records itself
// rather than through nextLocked: this is the latency path, and with the
// shared parser a 64 B message took 0.48 µs one way instead of 0.42
// (cmd/weft-pingpong, eight interleaved runs of each build).
func (e *Endpoint) recvLocked(msgs []fabric.Message) (int, error) {
	if !e.rxValid {
		return 0, e.downErr("recv")
	}
	r := e.rxRing
	ring := uint64(len(r))
	maxMsg := e.t.cfg.MaxMsgSize
	start := e.rxHead
	var bytes uint64
	n := 0
	var err error
	for n < len(msgs) {
		off := int(e.rxHead % ring)
		seq := shm.U32(r, off).Load()
		if seq == 0 {
			break
		}
		if seq != seqOf(e.rxHead, e.rxSalt) {
			err = e.malformed(fmt.Errorf("record at %d has sequence %#x, want %#x", e.rxHead, seq, seqOf(e.rxHead, e.rxSalt)))
			break
		}
		ln := int(shm.Get32(r, off+4))
		imm := shm.Get32(r, off+8)
		fl := shm.Get32(r, off+12)
		if fl&^recFlagsMask != 0 {
			err = e.malformed(fmt.Errorf("record at %d has flags %#x", e.rxHead, fl))
			break
		}
		if fl&recFlagPad != 0 {
			if ln != int(ring)-off-recHdr {
				err = e.malformed(fmt.Errorf("padding record at %d of %d bytes", e.rxHead, ln))
				break
			}
			e.rxHead += uint64(ln + recHdr)
			continue
		}
		m := &msgs[n]
		if fl&recFlagRMA != 0 {
			// Notification of an RMA write with immediate: no payload.
			m.Len, m.Imm, m.Flags = ln, imm, fabric.FlagRemoteWrite|fabric.FlagImm
			e.rxHead += recHdr
			n++
			continue
		}
		if ln > maxMsg || off+recHdr+ln > int(ring) {
			err = e.malformed(fmt.Errorf("record at %d of %d bytes", e.rxHead, ln))
			break
		}
		cap, cerr := fabric.CheckSGEs(m.SGEs, &e.t.dom, fabric.AccessLocalWrite)
		if cerr != nil {
			err = e.opErr("recv", cerr)
			break
		}
		m.Flags = 0
		if fl&recFlagImm != 0 {
			m.Flags, m.Imm = fabric.FlagImm, imm
		}
		payload := r[off+recHdr : off+recHdr+ln]
		m.Len = fabric.Scatter(m.SGEs, payload)
		if ln > cap {
			m.Flags |= fabric.FlagTruncated
			e.ctr.Drop(fabric.DropTruncated, 1)
		}
		bytes += uint64(ln)
		e.rxHead += uint64(align16(recHdr + ln))
		n++
	}
	if e.rxHead != start {
		e.releaseLocked()
	}
	if n > 0 {
		e.ctr.RxPackets.Add(uint64(n))
		e.ctr.RxMessages.Add(uint64(n))
		e.ctr.RxBytes.Add(bytes)
	} else if err == nil && !e.rxUp {
		err = e.downErr("recv")
	}
	return n, err
}

// recvViewsLocked hands out arrived records as views, leaving them in the
// ring until they are released.
func (e *Endpoint) recvViewsLocked(views []fabric.View) (int, error) {
	if !e.rxValid {
		return 0, e.downErr("recv")
	}
	if e.vq == nil {
		e.vq = make([]uint64, maxViews)
	}
	want := min(len(views), maxViews-int(e.vTail-e.vHead))
	if want == 0 && len(views) > 0 {
		return 0, e.opErr("recv", fmt.Errorf("%d views outstanding, release some first: %w", maxViews, fabric.ErrInvalid))
	}
	r := e.rxRing
	ring := uint64(len(r))
	start := e.rxHead
	var bytes uint64
	n := 0
	var err error
	for n < want {
		rec, ok, perr := e.nextLocked(r, ring)
		if !ok {
			err = perr
			break
		}
		views[n] = fabric.View{Data: rec.payload, Imm: rec.imm, Flags: rec.flags, Len: rec.ln}
		e.vq[e.vTail%maxViews] = e.rxHead
		e.vTail++
		if rec.payload != nil {
			bytes += uint64(rec.ln)
		}
		e.rxHead += rec.size
		n++
	}
	return e.endRecv(start, n, bytes, err)
}

// endRecv ends a receive burst: it publishes the consumer position if the
// burst consumed anything and counts what arrived.
func (e *Endpoint) endRecv(start uint64, n int, bytes uint64, err error) (int, error) {
	if e.rxHead != start {
		e.releaseLocked()
	}
	if n > 0 {
		e.ctr.RxPackets.Add(uint64(n))
		e.ctr.RxMessages.Add(uint64(n))
		e.ctr.RxBytes.Add(bytes)
	} else if err == nil && !e.rxUp {
		err = e.downErr("recv")
	}
	return n, err
}

// releaseLocked publishes our consumer position: the oldest outstanding
// view, or everything delivered if none is.
func (e *Endpoint) releaseLocked() {
	rel := e.rxHead
	if e.vTail != e.vHead {
		rel = e.vq[e.vHead%maxViews]
	}
	if rel == e.rxRel || !e.rxUp {
		return
	}
	e.rxRel = rel
	e.rxHeadP.Store(rel)
	if e.txSleep.Load() != 0 {
		e.t.dev.PeerDBSet(e.txBit)
		e.ctr.Doorbells.Add(1)
	}
}

// malformed counts a bad record from the peer and ends the session: a
// ring with one bad record cannot be trusted past it.
func (e *Endpoint) malformed(err error) error {
	e.ctr.Drop(fabric.DropMalformed, 1)
	err = fmt.Errorf("%w: %v", fabric.ErrMalformed, err)
	e.rxValid = false
	e.t.fault(err)
	return e.opErr("recv", err)
}

// RecvWait implements fabric.Endpoint: it spins on the ring for the spin
// budget, then sets its sleep flag in the sender's window and sleeps on
// the doorbell.
func (e *Endpoint) RecvWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	return e.recvWait(ctx, msgs, nil)
}

// RecvViewsWait implements fabric.ViewReceiver, waiting as RecvWait does.
func (e *Endpoint) RecvViewsWait(ctx context.Context, views []fabric.View) (int, error) {
	if len(views) == 0 {
		return 0, nil
	}
	return e.recvWait(ctx, nil, views)
}

// poll is Recv (msgs) or, with views non-nil, RecvViews.
func (e *Endpoint) poll(msgs []fabric.Message, views []fabric.View) (int, error) {
	if e.closed.Load() {
		return 0, e.opErr("recv", fabric.ErrClosed)
	}
	e.rxMu.Lock()
	var n int
	var err error
	if views == nil {
		n, err = e.recvLocked(msgs)
	} else {
		n, err = e.recvViewsLocked(views)
	}
	e.rxMu.Unlock()
	return n, err
}

// recvWait polls until a message arrives or the endpoint fails.
func (e *Endpoint) recvWait(ctx context.Context, msgs []fabric.Message, views []fabric.View) (int, error) {
	if n, err := e.poll(msgs, views); n > 0 || err != nil {
		return n, err
	}
	// Busy-poll: Recv itself is the cheapest check (one lock, one load
	// of the next record's sequence word).
	s := e.rxSpin.Start()
	for s.Next(ctx) {
		if n, err := e.poll(msgs, views); n > 0 || err != nil {
			e.rxSpin.Arrived(&s)
			return n, err
		}
	}
	e.rxSpin.Slept(&s)
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		e.setSleep(&e.rxSleepP, &e.rxMu, 1)
		n, err := e.poll(msgs, views)
		if n > 0 || err != nil {
			e.setSleep(&e.rxSleepP, &e.rxMu, 0)
			return n, err
		}
		e.t.dev.DBWait(ctx, e.rxBit)
		e.t.dev.DBClear(e.rxBit)
		e.ctr.Wakeups.Add(1)
	}
}

// dbArmer is a Device whose doorbell wake-up a fabric.WaitSet can watch:
// the emulated bridge's FIFO.
type dbArmer interface {
	armDB() int
	disarmDB()
}

// hwPoll is a wait set's polling period for an endpoint on a bridge whose
// doorbell can only be polled.
const hwPoll = 200 * time.Microsecond

var _ fabric.Waitable = (*Endpoint)(nil)

// ArmWait implements fabric.Waitable: it sets the receive side's sleep
// flag in the sender's window, as RecvWait does before it sleeps, so that
// the sender rings the doorbell, and has the set watch the bridge's
// wake-up. It reports ready when a record is waiting or the endpoint is
// down (Recv then says why).
func (e *Endpoint) ArmWait(w *fabric.Waker) (bool, error) {
	if e.closed.Load() {
		return false, e.opErr("wait", fabric.ErrClosed)
	}
	fd := -1
	if a, ok := e.t.dev.(dbArmer); ok {
		fd = a.armDB()
	}
	e.armedFD.Store(int32(fd))
	e.armedW.Store(w)
	if e.closed.Load() { // Close ran before it could see w
		w.Wake()
	}
	if fd < 0 {
		w.PollEvery(hwPoll)
	} else if err := w.WatchFD(fd); err != nil {
		return true, nil // the caller polls; the next wait tries again
	}
	e.setSleep(&e.rxSleepP, &e.rxMu, 1)
	return e.rxPending(), nil
}

// DisarmWait implements fabric.Waitable.
func (e *Endpoint) DisarmWait(w *fabric.Waker) {
	e.armedW.CompareAndSwap(w, nil)
	e.setSleep(&e.rxSleepP, &e.rxMu, 0)
	if e.armedFD.Swap(-1) >= 0 {
		e.t.dev.(dbArmer).disarmDB()
	}
	e.t.dev.DBClear(e.rxBit)
}

// rxPending reports whether Recv has something to say: a record at the
// ring's head, or the receive side down.
func (e *Endpoint) rxPending() bool {
	e.rxMu.Lock()
	defer e.rxMu.Unlock()
	if !e.rxValid || e.closed.Load() {
		return true
	}
	return shm.U32(e.rxRing, int(e.rxHead%uint64(len(e.rxRing)))).Load() != 0
}

func (e *Endpoint) setSleep(p **atomic.Uint32, mu *sync.Mutex, v uint32) {
	mu.Lock()
	if *p != nil && e.t.up.Load() {
		(*p).Store(v)
	}
	mu.Unlock()
}

// SendWait implements fabric.Endpoint.
func (e *Endpoint) SendWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	if n, err := e.Send(msgs); n > 0 || err != nil {
		return n, err
	}
	s := e.txSpin.Start()
	for s.Next(ctx) {
		if n, err := e.Send(msgs); n > 0 || err != nil {
			e.txSpin.Arrived(&s)
			return n, err
		}
	}
	e.txSpin.Slept(&s)
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		e.setSleep(&e.txSleepP, &e.txMu, 1)
		n, err := e.Send(msgs)
		if n > 0 || err != nil {
			e.setSleep(&e.txSleepP, &e.txMu, 0)
			return n, err
		}
		e.t.dev.DBWait(ctx, e.txBit)
		e.t.dev.DBClear(e.txBit)
		e.ctr.Wakeups.Add(1)
	}
}

// Write implements fabric.Endpoint: the SGEs are copied straight into the
// peer's window after the target is checked against the region table the
// peer published. With FlagImm a notification record follows on the ring.
func (e *Endpoint) Write(msgs []fabric.Message) (int, error) {
	return e.rma(msgs, true)
}

// Read implements fabric.Endpoint: the peer's window memory is copied
// into the SGEs.
func (e *Endpoint) Read(msgs []fabric.Message) (int, error) {
	return e.rma(msgs, false)
}

func (e *Endpoint) rma(msgs []fabric.Message, write bool) (int, error) {
	op, fop, need, local := "read", fabric.OpRead, fabric.AccessRemoteRead, fabric.AccessLocalWrite
	if write {
		op, fop, need, local = "write", fabric.OpWrite, fabric.AccessRemoteWrite, 0
	}
	if e.closed.Load() {
		return 0, e.opErr(op, fabric.ErrClosed)
	}
	e.txMu.Lock()
	defer e.txMu.Unlock()
	if !e.txUp && !e.txReadyLocked() {
		return 0, e.txDown(op)
	}
	pw := e.peerWin
	first := -1
	var bytes uint64
	n := 0
	var err error
	for n < len(msgs) {
		m := &msgs[n]
		if len(m.SGEs) > maxSGEs {
			err = e.opErr(op, fmt.Errorf("%d SGEs, max %d: %w", len(m.SGEs), maxSGEs, fabric.ErrMessageSize))
			break
		}
		size, cerr := fabric.CheckSGEs(m.SGEs, &e.t.dom, local)
		if cerr != nil {
			err = e.opErr(op, cerr)
			break
		}
		if m.Remote.Len != 0 && uint64(size) > m.Remote.Len {
			err = e.opErr(op, fmt.Errorf("%d bytes into a remote buffer of %d: %w", size, m.Remote.Len, fabric.ErrInvalid))
			break
		}
		if e.cq.Free() == 0 {
			break // no room to report an error
		}
		addr, st := e.t.checkRemote(pw, m.Remote, size, need)
		imm := write && m.Flags&fabric.FlagImm != 0
		rec := -1
		if st == fabric.StatusOK && imm {
			off, rerr := e.reserve(0, &first)
			if rerr != nil {
				err = e.opErr(op, rerr)
				break
			}
			if off < 0 {
				break
			}
			rec = off
		}
		if st == fabric.StatusOK {
			if e.t.dma.use(size) && e.t.dma.copy(write, m.SGEs, uint64(addr), size) {
				// copied by the device's engine
			} else if write {
				fabric.Gather(pw[addr:addr+size], m.SGEs)
			} else {
				fabric.Scatter(m.SGEs, pw[addr:addr+size])
			}
			bytes += uint64(size)
		} else {
			e.ctr.Drop(fabric.DropAccess, 1)
		}
		if rec >= 0 {
			e.writeHdr(rec, size, m.Imm, recFlagRMA, &first)
			e.txTail += recHdr
		}
		if st != fabric.StatusOK || m.Flags&fabric.FlagSignal != 0 {
			e.cq.Push(fabric.Completion{Context: m.Context, Op: fop, Status: st, Len: size})
		}
		n++
	}
	e.publish(first)
	if write {
		e.ctr.TxBytes.Add(bytes)
	} else {
		e.ctr.RxBytes.Add(bytes)
	}
	return n, err
}

// Register implements fabric.Endpoint (see Transport.Register).
func (e *Endpoint) Register(buf []byte, access fabric.Access) (*fabric.Region, error) {
	if e.closed.Load() {
		return nil, e.opErr("register", fabric.ErrClosed)
	}
	return e.t.Register(buf, access)
}

// Alloc implements fabric.Endpoint (see Transport.Alloc).
func (e *Endpoint) Alloc(size int, access fabric.Access) (*fabric.Region, error) {
	if e.closed.Load() {
		return nil, e.opErr("alloc", fabric.ErrClosed)
	}
	return e.t.Alloc(size, access)
}

// CQ implements fabric.Endpoint.
func (e *Endpoint) CQ() fabric.CompletionQueue { return e.cq }

// Caps implements fabric.Endpoint.
func (e *Endpoint) Caps() fabric.Caps {
	return fabric.Caps{Backend: "ntb", MaxMsgSize: e.t.cfg.MaxMsgSize, MaxSGEs: maxSGEs,
		MTU: e.t.cfg.MaxMsgSize, InlineSize: e.t.cfg.MaxMsgSize, RMA: true, Reliable: true,
		MaxRMASize: e.t.lay.size}
}

// Stats implements fabric.Endpoint.
func (e *Endpoint) Stats() fabric.Stats {
	s := e.ctr.Snapshot()
	s.Drops[fabric.DropNoBuffer] += e.cq.Overruns.Load()
	return s
}

// Events implements fabric.Endpoint.
func (e *Endpoint) Events() <-chan fabric.Event { return e.evs }

// LocalAddr implements fabric.Endpoint: the bridge's address, which both
// sides share.
func (e *Endpoint) LocalAddr() string { return e.addr }

// RemoteAddr implements fabric.Endpoint: the bridge's address, which both
// sides share.
func (e *Endpoint) RemoteAddr() string { return e.addr }

// Close implements fabric.Endpoint. It closes the queue; the transport
// stays up for its other queues (Transport.Close ends it), except for an
// endpoint from fabric.Open, which owns its transport and closes it. The
// peer's side learns that this end of the queue is closed (ctrlFin), so
// that a listener's queue serves again once both ends are closed; the
// peer's endpoint itself is not told (a protocol above, such as
// fabric/sock's, says when a connection ends).
func (e *Endpoint) Close() error {
	if e.owner {
		return e.t.Close()
	}
	e.close()
	if e.release != nil {
		e.relOnce.Do(e.release)
	}
	return nil
}

func (e *Endpoint) close() {
	e.once.Do(func() {
		e.closed.Store(true)
		// The views are void from now on, and the memory they alias
		// may be zeroed (Transport.Close closes the device, which
		// replaces the window's mapping) or reused (reclaim): the
		// epoch changes first (ViewEpoch).
		e.epoch.Add(1)
		// Tell the peer that this incarnation of the queue is closed
		// (Transport.reclaim) and stop writing the peer's window: under
		// both locks, rxUp means attached in the session that is up.
		e.txMu.Lock()
		e.rxMu.Lock()
		if e.rxUp && !e.t.closed.Load() {
			shm.U32(e.peerWin, e.ctrl(ctrlFin)).Store(e.gen + 1)
		}
		e.detachLocked()
		e.rxMu.Unlock()
		e.txMu.Unlock()
		// A wait set watching the bridge's wake-up loses it when the
		// device closes the descriptor: wake the set directly.
		if w := e.armedW.Load(); w != nil {
			w.Wake()
		}
		e.cq.Close()
		e.t.dev.WakeLocal()
	})
}
