package ntb

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/shm"
)

// Transport is the NTB transport, in the spirit of Linux ntb_transport: it
// negotiates with the peer over scratchpads, or over message registers
// on a bridge without scratchpads (transport_msg.go), lays out its
// inbound memory window, and carries messages on SPSC rings in the
// receiver's window, one ring per queue and direction. Every store
// across the bridge is a write into the peer's window (PCIe posted
// writes); nothing reads across the bridge on the message path.
//
// Window 0 of each side holds, at fixed offsets:
//
//	[0, 4096)        control: per queue, the peer's consumer index of our
//	                 send ring, the peer's sleep flags and the peer's
//	                 close and reset counts of the queue (ctrlFin,
//	                 ctrlRdy: see reclaim)
//	[4096, 12288)    the peer's region table: keys, bounds and rights of
//	                 the peer's RMA regions, which we check before RMA
//	[16384, ...)     receive rings, RingSize bytes per queue
//	[heap, size)     RMA heap: memory handed out by Alloc
//
// ctrlFin and ctrlRdy were added without a protocol version change: a
// peer of an earlier version never writes them (they stay 0 from the
// session's reset, so its queues are not reused within a session, as
// before) and never reads the bytes we write there.
//
// Either side may start first; each waits for the other. When the link
// drops or the peer restarts, the transport goes down (Send fails with
// ErrPeerGone, Recv drains what had arrived) and renegotiates when the peer
// is back.
type Transport struct {
	dev   Device
	ctl   ctrlChan // scratchpads, or message registers (transport_msg.go)
	cfg   Config
	win   []byte // local inbound window 0
	lay   layout
	spin  time.Duration
	nonce uint32

	peerClosed atomic.Bool // the last session ended by the peer's Close (fabric.ErrPeerClosed)
	mu         sync.Mutex  // session changes, region table, heap
	up         atomic.Bool
	peer       peerParams
	peerWin    []byte
	peerNonce  uint32
	// epsP is the current endpoint of each queue, copied on write under
	// epMu: a session start replaces the endpoints that were closed or
	// handed out as connections (Endpoint.conn) by fresh ones, so that
	// an old endpoint never reaches the rings of a later session.
	epsP   atomic.Pointer[[]*Endpoint]
	epMu   sync.Mutex // session changes: reset, goUp, goDown, shutdown
	active int
	mrs    [mrEntries]*fabric.Region
	mrAddr [mrEntries]uint64
	heap   heap
	dom    fabric.Domain
	dma    dmaState

	closed  atomic.Bool
	stop    chan struct{}
	kick    chan struct{}
	wg      sync.WaitGroup
	lastErr atomic.Pointer[error]
}

// Config configures a Transport. The zero value is the default.
type Config struct {
	// Queues is the number of queue pairs to offer (0: 1). The transport
	// uses the smaller of the two sides' counts. Each queue takes two
	// doorbell bits.
	Queues int
	// RingSize is the size of each receive ring in bytes, a multiple of
	// 4096 (0: 1 MiB). It must hold at least two maximal messages.
	RingSize int
	// MaxMsgSize is the largest message (0: 64 KiB). Both sides must agree.
	MaxMsgSize int
	// WindowSize is the size of the inbound window (0: all of the device's
	// memory). What the rings leave is the RMA heap.
	WindowSize int
	// Spin is the busy-poll budget of blocking calls; see fabric.Options.
	Spin time.Duration
	// CQSize is each endpoint's completion queue capacity (0: 4096).
	CQSize int
	// DMAThreshold is the copy size from which RMA and sends go through
	// the device's DMA engine (DMADevice), if it has one: 0 means
	// DefaultDMAThreshold, -1 never.
	DMAThreshold int
	// DMAChannels is the number of channels of an emulated engine that
	// the transport starts (0: the device's setting, 1 by default).
	DMAChannels int
}

const (
	protoVersion = 0x57460001 // "WF", 0x0001

	spadVersion = iota - 1
	spadQueues
	spadRing
	spadMaxMsg
	spadWinPages
	spadNonce
	spadAck
	spadState
	numSpads

	hsPosted = 1 // quiesced, parameters posted
	hsReady  = 2 // rings reset, peer's nonce acknowledged
	hsClosed = 3 // closed in good order (Close): the peer reports fabric.ErrPeerClosed

	ctrlOff      = 0
	ctrlStride   = 256
	ctrlTxHead   = 0   // u64: peer's consumer position in our send ring
	ctrlRxSleep  = 64  // u32: peer's receiver sleeps on our send ring
	ctrlTxSleep  = 128 // u32: peer's sender waits for room in our receive ring
	ctrlFin      = 192 // u32: the peer closed its endpoints of this queue up to incarnation ctrlFin-1 (reclaim)
	ctrlRdy      = 196 // u32: the peer reset its side of this queue for incarnation ctrlRdy (reclaim)
	mrOff        = 4096
	mrEntries    = 256
	mrEntrySize  = 32
	ringsOff     = 16384
	maxQueues    = 8
	recHdr       = 16
	recFlagImm   = 1
	recFlagPad   = 2
	recFlagRMA   = 4
	recFlagsMask = recFlagImm | recFlagPad | recFlagRMA
)

type layout struct {
	queues, ring, heapOff, size int
}

type peerParams struct {
	queues, ring, maxMsg, win int
}

// Dial brings up a transport over dev: it sets up the inbound window and
// waits until the handshake with the peer completes or ctx is done. On
// error the device is left open.
func Dial(ctx context.Context, dev Device, cfg Config) (*Transport, error) {
	t, err := newTransport(dev, cfg)
	if err != nil {
		return nil, err
	}
	if err := t.waitUp(ctx); err != nil {
		t.shutdown(false)
		return nil, err
	}
	return t, nil
}

func newTransport(dev Device, cfg Config) (*Transport, error) {
	if cfg.Queues == 0 {
		cfg.Queues = 1
	}
	if cfg.RingSize == 0 {
		cfg.RingSize = 1 << 20
	}
	if cfg.MaxMsgSize == 0 {
		cfg.MaxMsgSize = 64 << 10
	}
	mem := dev.Memory()
	align, salign, maxSize, err := dev.MWGetAlign(0)
	if err != nil {
		return nil, err
	}
	if cfg.WindowSize == 0 {
		cfg.WindowSize = int(min(uint64(len(mem)), maxSize))
	}
	nq := min(cfg.Queues, maxQueues, bitsCount(dev.DBValidMask())/2)
	switch {
	case cfg.Queues < 1 || cfg.Queues > nq:
		return nil, fmt.Errorf("ntb: %d queues: the device's doorbells allow 1..%d: %w", cfg.Queues, nq, fabric.ErrInvalid)
	case cfg.RingSize%4096 != 0 || cfg.RingSize < 8192:
		return nil, fmt.Errorf("ntb: ring size %d is not a multiple of 4096 of at least 8192: %w", cfg.RingSize, fabric.ErrInvalid)
	case cfg.MaxMsgSize < 1 || cfg.MaxMsgSize > cfg.RingSize/2-4*recHdr:
		return nil, fmt.Errorf("ntb: max message size %d does not fit twice in a %d-byte ring: %w", cfg.MaxMsgSize, cfg.RingSize, fabric.ErrInvalid)
	}
	ctl, err := newCtrl(dev)
	if err != nil {
		return nil, err
	}
	lay := layout{queues: cfg.Queues, ring: cfg.RingSize, heapOff: ringsOff + cfg.Queues*cfg.RingSize, size: cfg.WindowSize}
	lay.size -= lay.size % int(max(align, salign, 4096))
	if lay.heapOff > lay.size || uint64(lay.size) > maxSize || lay.size > len(mem) {
		return nil, fmt.Errorf("ntb: window of %d bytes cannot hold %d rings of %d bytes (device memory %d, window max %d): %w",
			lay.size, cfg.Queues, cfg.RingSize, len(mem), maxSize, fabric.ErrInvalid)
	}
	// A hardware device opens with every doorbell masked, as a driver
	// starts: unmask the queues' bits (queue q has bits 2q and 2q+1, see
	// newEndpoint), or DBWait never wakes on them. Linux's
	// ntb_transport_create_queue clears each queue's bit from the mask
	// likewise.
	if err := dev.DBClearMask(1<<(2*cfg.Queues) - 1); err != nil {
		return nil, err
	}
	dbBits := uint64(1)<<(2*cfg.Queues) - 1
	if err := dev.MWSetTrans(0, 0, uint64(lay.size)); err != nil {
		dev.DBSetMask(dbBits)
		return nil, err
	}
	// The transport enables this side of the link, as Linux's
	// ntb_transport_probe calls ntb_link_enable: a hardware bridge opens
	// with it disabled. A device that keeps its link elsewhere says
	// fabric.ErrNotSupported. On failure the translation is taken down
	// again: on IDT it is in the peer's registers.
	if err := dev.LinkEnable(); err != nil && !errors.Is(err, fabric.ErrNotSupported) {
		dev.MWClearTrans(0)
		dev.DBSetMask(dbBits)
		return nil, err
	}
	t := &Transport{dev: dev, ctl: ctl, cfg: cfg, win: mem[:lay.size:lay.size], lay: lay, dom: fabric.Domain{Name: "ntb", HostMemory: true},
		spin: (&fabric.Options{Spin: cfg.Spin}).SpinBudget(),
		stop: make(chan struct{}), kick: make(chan struct{}, 1)}
	t.heap.init(lay.heapOff, lay.size)
	t.dma.init(dev, cfg.DMAThreshold, cfg.DMAChannels)
	eps := make([]*Endpoint, cfg.Queues)
	for q := range eps {
		eps[q] = newEndpoint(t, q)
	}
	t.setEndpoints(eps)
	t.wg.Add(1)
	go t.manage()
	return t, nil
}

func bitsCount(v uint64) int {
	n := 0
	for ; v != 0; v &= v - 1 {
		n++
	}
	return n
}

func (t *Transport) waitUp(ctx context.Context) error {
	for !t.up.Load() {
		if t.closed.Load() {
			return os.ErrClosed
		}
		select {
		case <-ctx.Done():
			err := ctx.Err()
			if e := t.lastErr.Load(); e != nil {
				err = fmt.Errorf("%w (last handshake error: %v)", err, *e)
			}
			return &fabric.OpError{Op: "open", Backend: "ntb", Err: err}
		case <-time.After(200 * time.Microsecond):
		}
	}
	return nil
}

// endpoints returns the current endpoint of each queue. The slice is
// never modified: a change stores a new one.
func (t *Transport) endpoints() []*Endpoint {
	if p := t.epsP.Load(); p != nil {
		return *p
	}
	return nil
}

func (t *Transport) setEndpoints(eps []*Endpoint) { t.epsP.Store(&eps) }

// Queues returns the number of queues negotiated with the peer.
func (t *Transport) Queues() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.active
}

// Endpoint returns queue q as a fabric endpoint. Endpoints share the
// transport's regions; closing one closes only its queue. A queue whose
// endpoint was closed gets a new endpoint when the next session starts
// (or, for the queues of a listener and its dialers, within the session
// once the peer's endpoint of the queue is closed too: see reclaim).
func (t *Transport) Endpoint(q int) (*Endpoint, error) {
	eps := t.endpoints()
	if q < 0 || q >= len(eps) {
		return nil, fmt.Errorf("ntb: queue %d of %d: %w", q, len(eps), fabric.ErrInvalid)
	}
	return eps[q], nil
}

// Up reports whether the transport is connected.
func (t *Transport) Up() bool { return t.up.Load() }

// Device returns the underlying device.
func (t *Transport) Device() Device { return t.dev }

// Close closes every endpoint and the device. It is idempotent.
func (t *Transport) Close() error {
	return t.shutdown(true)
}

func (t *Transport) shutdown(closeDev bool) error {
	if t.closed.Swap(true) {
		return nil
	}
	// Mark the endpoints first, so calls that wake up below report
	// os.ErrClosed rather than the link going down.
	for _, ep := range t.endpoints() {
		ep.closed.Store(true)
	}
	// Tell the peer at once, without waiting for its link poll, and that
	// this is a close, not a crash.
	t.ctl.closing()
	close(t.stop)
	t.dev.WakeLocal()
	t.wg.Wait()
	t.epMu.Lock() // the manage goroutine is gone: the endpoints stay these
	eps := t.endpoints()
	t.epMu.Unlock()
	for _, ep := range eps {
		ep.close()
	}
	// The device may unmap the peer's window when it closes (a hardware
	// device does): a region closed later must not reach into it.
	t.mu.Lock()
	t.peerWin = nil
	t.mu.Unlock()
	if closeDev {
		return t.dev.Close()
	}
	t.dev.DBSetMask(t.dbBits())
	t.dev.MWClearTrans(0)
	return nil
}

// dbBits are the doorbell bits of every queue.
func (t *Transport) dbBits() uint64 {
	var b uint64
	for _, ep := range t.endpoints() {
		b |= ep.rxBit | ep.txBit
	}
	return b
}

func randUint32() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint32(b[:])
}

// manage runs the session state machine: wait for the link, negotiate,
// watch, go down, repeat.
func (t *Transport) manage() {
	defer t.wg.Done()
	for !t.closed.Load() {
		if !t.dev.LinkIsUp() {
			if !t.sleep(time.Millisecond) {
				return
			}
			continue
		}
		err := t.handshake()
		if err != nil {
			if errors.Is(err, errStopped) {
				return
			}
			t.lastErr.Store(&err)
			if errors.Is(err, errProtocol) {
				t.broadcast(fabric.Event{Kind: fabric.EventError, Time: time.Now(), Err: err})
				if !t.sleep(50 * time.Millisecond) {
					return
				}
			}
			continue
		}
		t.watch()
		t.goDown()
	}
}

var (
	errStopped  = errors.New("transport stopped")
	errLinkDown = errors.New("link down during handshake")
	errProtocol = errors.New("ntb: incompatible peer")
)

// sleep waits d; false means the transport is stopping.
func (t *Transport) sleep(d time.Duration) bool {
	select {
	case <-t.stop:
		return false
	case <-time.After(d):
		return true
	}
}

// post sends our handshake words to the peer, the state last.
func (t *Transport) post(state uint32, ack uint32) {
	var w [numSpads]uint32
	w[spadVersion] = protoVersion
	w[spadQueues] = uint32(t.lay.queues)
	w[spadRing] = uint32(t.lay.ring)
	w[spadMaxMsg] = uint32(t.cfg.MaxMsgSize)
	w[spadWinPages] = uint32(t.lay.size / 4096)
	w[spadNonce] = t.nonce
	w[spadAck] = ack
	w[spadState] = state
	t.ctl.post(&w)
}

// spad returns handshake word i as the peer last posted it.
func (t *Transport) spad(i int) uint32 { return t.ctl.get(i) }

// handshake negotiates a session (see the package documentation).
func (t *Transport) handshake() error {
	d := t.dev
	t.nonce = randUint32() | 1
	// Anything the peer posted so far is from an earlier session.
	t.ctl.reset()
	// Step 1: post our parameters; wait for the peer's (it has quiesced).
	var pn uint32
	for {
		if t.closed.Load() {
			return errStopped
		}
		if !d.LinkIsUp() {
			return errLinkDown
		}
		t.post(hsPosted, 0)
		if err := t.ctl.poll(); err != nil {
			return err
		}
		if st := t.spad(spadState); (st == hsPosted || st == hsReady) && t.spad(spadNonce) != 0 {
			pn = t.spad(spadNonce)
			break
		}
		if !t.sleep(200 * time.Microsecond) {
			return errStopped
		}
	}
negotiate:
	p := peerParams{queues: int(t.spad(spadQueues)), ring: int(t.spad(spadRing)),
		maxMsg: int(t.spad(spadMaxMsg)), win: int(t.spad(spadWinPages)) * 4096}
	if v := t.spad(spadVersion); v != protoVersion {
		return fmt.Errorf("%w: protocol version %#x, want %#x", errProtocol, v, protoVersion)
	}
	if p.maxMsg != t.cfg.MaxMsgSize {
		return fmt.Errorf("%w: max message size %d, ours %d", errProtocol, p.maxMsg, t.cfg.MaxMsgSize)
	}
	if p.queues < 1 || p.queues > maxQueues || p.ring < 8192 || p.ring%4096 != 0 ||
		p.maxMsg > p.ring/2-4*recHdr || ringsOff+p.queues*p.ring > p.win {
		return fmt.Errorf("%w: bad parameters %+v", errProtocol, p)
	}
	// Step 2: the peer is not sending; reset our side of every ring.
	t.reset()
	// Step 3: acknowledge its nonce; wait for it to acknowledge ours.
	for {
		if t.closed.Load() {
			return errStopped
		}
		if !d.LinkIsUp() {
			return errLinkDown
		}
		t.post(hsReady, pn)
		if err := t.ctl.poll(); err != nil {
			return err
		}
		n := t.spad(spadNonce)
		if n != pn && n != 0 {
			pn = n // the peer restarted its handshake: negotiate again
			goto negotiate
		}
		if t.spad(spadState) == hsReady && t.spad(spadAck) == t.nonce && n == pn {
			break
		}
		if !t.sleep(200 * time.Microsecond) {
			return errStopped
		}
	}
	pw, err := d.PeerMW(0)
	if err != nil {
		return err
	}
	if len(pw) < p.win {
		return fmt.Errorf("%w: peer window is %d bytes, it announced %d", errProtocol, len(pw), p.win)
	}
	t.goUp(p, pw[:p.win:p.win], pn)
	return nil
}

// reset clears our receive rings and control page and every endpoint's
// ring positions. The peer has quiesced, so nothing writes them. An
// endpoint that was closed, or handed out as a connection of a listener
// or dialer (which lives for one session: its peer is gone with the
// session), is left detached for good and its queue gets a fresh
// endpoint, so that the queue serves again and the old endpoint object
// never touches the rings of this session.
func (t *Transport) reset() {
	t.epMu.Lock()
	defer t.epMu.Unlock()
	eps := t.lockAll()
	defer unlockAll(eps)
	var next []*Endpoint
	for q, ep := range eps {
		ep.resetLocked() // first: its ViewEpoch changes before the rings are cleared
		if ep.closed.Load() || ep.conn.Load() {
			if next == nil {
				next = append([]*Endpoint(nil), eps...)
			}
			next[q] = newEndpoint(t, q)
		}
	}
	clear(t.win[:t.lay.heapOff])
	if next != nil {
		t.setEndpoints(next)
	}
}

// reclaim gives a fresh endpoint, within the session, to each queue
// whose endpoint is closed on both sides: incarnation g of queue q ends
// when our endpoint of it is closed and the peer's is too (the peer's
// ctrlFin word in our window reached g+1; Endpoint.close writes ours into
// the peer's). Nothing of the peer's endpoint g then writes our receive
// ring q or our consumer word of q, so we clear them and publish ctrlRdy
// g+1 into the peer's window. The new endpoint receives at once (the
// peer writes its ring only once it sees our ctrlRdy) and sends once the
// peer's ctrlRdy reached g+1, that is once the peer cleared its side
// (Endpoint.txReadyLocked). The old endpoint object is detached for good
// before the ring is cleared, so old and new never share the ring.
// Listeners and dialers call it before they look for a queue.
func (t *Transport) reclaim() {
	t.epMu.Lock()
	defer t.epMu.Unlock()
	if !t.up.Load() || t.closed.Load() {
		return
	}
	t.mu.Lock()
	p, pw, pn, active := t.peer, t.peerWin, t.peerNonce, t.active
	t.mu.Unlock()
	eps := t.endpoints()
	var next []*Endpoint
	for q, ep := range eps[:min(active, len(eps))] {
		if !ep.closed.Load() || int32(shm.U32(t.win, ep.ctrl(ctrlFin)).Load()-(ep.gen+1)) < 0 {
			continue
		}
		gen := ep.gen
		ep.txMu.Lock()
		ep.rxMu.Lock()
		ep.resetLocked()
		ep.rxMu.Unlock()
		ep.txMu.Unlock()
		clear(t.win[ringsOff+q*t.lay.ring : ringsOff+(q+1)*t.lay.ring])
		shm.U64(t.win, ep.ctrl(ctrlTxHead)).Store(0)
		n := newEndpoint(t, q)
		n.gen = gen + 1
		n.attachLocked(p, pw, pn) // nobody else knows n yet
		n.txUp, n.txWait = false, true
		if next == nil {
			next = append([]*Endpoint(nil), eps...)
		}
		next[q] = n
		shm.U32(pw, n.ctrl(ctrlRdy)).Store(n.gen)
		t.dev.PeerDBSet(n.txBit) // the peer's sender may wait for it
	}
	if next != nil {
		t.setEndpoints(next)
	}
}

// lockAll locks every current endpoint and returns them; the caller holds
// epMu.
func (t *Transport) lockAll() []*Endpoint {
	eps := t.endpoints()
	for _, ep := range eps {
		ep.txMu.Lock()
		ep.rxMu.Lock()
	}
	return eps
}

func unlockAll(eps []*Endpoint) {
	for _, ep := range eps {
		ep.rxMu.Unlock()
		ep.txMu.Unlock()
	}
}

func (t *Transport) goUp(p peerParams, pw []byte, pn uint32) {
	t.mu.Lock()
	t.peer, t.peerWin, t.peerNonce = p, pw, pn
	t.active = min(p.queues, t.lay.queues)
	// Publish our region table into the peer's window.
	for i, r := range t.mrs {
		if r != nil {
			t.publishMR(i, r)
		}
	}
	t.mu.Unlock()
	t.epMu.Lock()
	eps := t.lockAll()
	for q, ep := range eps {
		if q < t.active {
			ep.attachLocked(p, pw, pn)
		}
	}
	t.up.Store(true)
	unlockAll(eps)
	t.epMu.Unlock()
	t.broadcast(fabric.Event{Kind: fabric.EventLinkUp, Time: time.Now()})
}

func (t *Transport) goDown() {
	if !t.up.Load() {
		return
	}
	t.ctl.poll() // what the peer sent before it went: its Close says so
	closed := t.spad(spadState) == hsClosed
	t.peerClosed.Store(closed)
	why := fabric.ErrPeerGone
	if closed {
		why = fabric.ErrPeerClosed
	}
	t.epMu.Lock()
	eps := t.lockAll()
	t.up.Store(false)
	for _, ep := range eps {
		ep.detachLocked()
	}
	unlockAll(eps)
	t.epMu.Unlock()
	t.dev.WakeLocal()
	ev := fabric.Event{Kind: fabric.EventLinkDown, Time: time.Now(), Err: why}
	t.broadcast(ev)
}

// watch returns when the session ends: link down, the peer's handshake
// registers changed (it restarted), a malformed ring, or Close.
func (t *Transport) watch() {
	d := t.dev
	inc := d.PeerIncarnation()
	p := pollPeriod{fast: watchFast, slow: watchSlow}
	tick := time.NewTimer(p.next(true))
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-t.kick:
			return
		case <-tick.C:
		}
		if err := t.ctl.poll(); err != nil {
			t.broadcast(fabric.Event{Kind: fabric.EventError, Time: time.Now(), Err: err})
			return
		}
		if t.ctl.idle() {
			tick.Reset(p.next(false))
		} else {
			tick.Reset(200 * time.Microsecond) // our last words are still going out
		}
		if !d.LinkIsUp() || d.PeerIncarnation() != inc ||
			t.spad(spadNonce) != t.peerNonce || t.spad(spadState) != hsReady {
			return
		}
	}
}

// ctrlChan is what the handshake and the session watch speak over: eight
// 32-bit words each way (version, queues, ring, max message, window
// pages, nonce, ack, state, indexed by the spad* constants). Over
// scratchpads (spadCtrl) the peer writes ours and we write its; over
// message registers (msgCtrl, transport_msg.go) the words travel as
// messages into a shadow copy. newCtrl picks one at attach. Only the
// manage goroutine and shutdown call it.
type ctrlChan interface {
	// reset forgets what the peer posted so far: a handshake starts.
	reset()
	// post sends our words to the peer, the state last.
	post(w *[numSpads]uint32)
	// get returns word i as the peer last posted it.
	get(i int) uint32
	// poll takes in what the peer sent and sends what is still pending;
	// input that does not decode is an error wrapping errProtocol and
	// fabric.ErrMalformed.
	poll() error
	// idle reports whether everything posted has gone out.
	idle() bool
	// closing tells the peer that this side is closing (state hsClosed,
	// nonce 0), best effort and in bounded time.
	closing()
}

// newCtrl picks the control channel at attach: scratchpads when the
// device has enough of them (the wire behaviour every existing peer
// speaks), otherwise message registers when it has them.
func newCtrl(dev Device) (ctrlChan, error) {
	if dev.SpadCount() >= numSpads {
		return spadCtrl{dev}, nil
	}
	if m, ok := dev.(Messenger); ok && m.MsgCount() >= msgMinRegs {
		return newMsgCtrl(dev, m), nil
	}
	n := 0
	if m, ok := dev.(Messenger); ok {
		n = m.MsgCount()
	}
	return nil, fmt.Errorf("ntb: the device has %d scratchpads and %d message registers; the handshake needs %d scratchpads or %d message registers: %w",
		dev.SpadCount(), n, numSpads, msgMinRegs, fabric.ErrNotSupported)
}

// spadCtrl is the handshake over scratchpads: we write the peer's, the
// peer writes ours.
type spadCtrl struct{ dev Device }

func (c spadCtrl) reset() {
	for _, i := range []int{spadState, spadNonce, spadAck} {
		c.dev.SpadWrite(i, 0)
	}
}

func (c spadCtrl) post(w *[numSpads]uint32) {
	for i, v := range w {
		if i != spadState {
			c.dev.PeerSpadWrite(i, v)
		}
	}
	c.dev.PeerSpadWrite(spadState, w[spadState])
}

func (c spadCtrl) get(i int) uint32 {
	v, _ := c.dev.SpadRead(i)
	return v
}

func (c spadCtrl) poll() error { return nil }
func (c spadCtrl) idle() bool  { return true }

// closing writes the state first, so that a peer that sees the nonce
// change also finds why.
func (c spadCtrl) closing() {
	c.dev.PeerSpadWrite(spadState, hsClosed)
	c.dev.PeerSpadWrite(spadNonce, 0)
}

// fault ends the session after malformed input from the peer.
func (t *Transport) fault(err error) {
	t.broadcast(fabric.Event{Kind: fabric.EventError, Time: time.Now(), Err: err})
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

func (t *Transport) broadcast(ev fabric.Event) {
	for _, ep := range t.endpoints() {
		ep.emit(ev)
	}
}
