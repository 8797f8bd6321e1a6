//go:build linux

package vnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/jsimonetti/rtnetlink/v2"
	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
)

// DefaultMTU is the device MTU when Config.MTU is zero: the best of the
// MTUs measured over TAP-over-ntb between two namespaces (see the README
// and ARCHITECTURE.md for the table). Larger frames mean fewer frames,
// fewer system calls and fewer ring records per byte.
const DefaultMTU = 65000

// DefaultBurst is the number of frames a queue moves per burst when
// Config.Burst is zero.
const DefaultBurst = 16

// Config configures a Bridge. The zero value is a TAP device named by the
// kernel (tap%d), with DefaultMTU, no offloads, brought up.
type Config struct {
	// Name is the device name; the kernel picks one if it is empty. An
	// existing persistent device of that name is attached to.
	Name string
	// Kind is TAP (Ethernet frames, the default) or TUN (IP packets).
	Kind Kind
	// MTU is the device MTU, 68 to MaxMTU (65535 for TUN; 0: DefaultMTU). Every
	// endpoint's Caps.MaxMsgSize must hold a frame of that size, with the
	// headers; see MessageSize.
	MTU int
	// Offload turns on the virtio-net header (IFF_VNET_HDR) with checksum
	// and TCP segmentation offload (TUNSETOFFLOAD): the kernel hands the
	// bridge TCP super-frames of up to 64 KiB whatever the MTU, and
	// leaves checksums to the receiving side. Endpoints must then carry
	// MaxMessage bytes.
	Offload bool
	// MAC sets the TAP device's hardware address (nil: random).
	MAC net.HardwareAddr
	// Down leaves the device down; by default New brings it up.
	Down bool
	// Burst is how many frames a queue reads from the device before it
	// sends them as one burst, and receives from the fabric at once
	// (0: DefaultBurst).
	Burst int
}

// MessageSize returns the fabric message size a Bridge with c needs from
// its endpoints (Caps.MaxMsgSize at least this): the largest frame the
// device can hand over, plus the headers.
func (c *Config) MessageSize() int {
	if c.Offload {
		return MaxMessage
	}
	return HeaderLen + c.maxFrame()
}

// MaxMTU is the largest MTU of a TAP device (65535 less the Ethernet
// header, as Linux's tun driver sets it); a TUN device takes 65535.
const MaxMTU = 65535 - 14

func (c *Config) maxMTU() int {
	if c.Kind == TUN {
		return 65535
	}
	return MaxMTU
}

func (c *Config) mtu() int {
	if c.MTU == 0 {
		return DefaultMTU
	}
	return c.MTU
}

// maxFrame is the largest frame the device hands over without offloads:
// the MTU plus an Ethernet header with one VLAN tag.
func (c *Config) maxFrame() int {
	if c.Kind == TUN {
		return c.mtu()
	}
	return c.mtu() + 18
}

// EventKind is the type of a bridge Event.
type EventKind uint8

// Bridge event kinds.
const (
	// CarrierOn: every queue's fabric link is up; the device has carrier.
	CarrierOn EventKind = iota + 1
	// CarrierOff: a queue's fabric link is down; the device lost carrier.
	CarrierOff
	// Link: an endpoint event (Event.Fabric) on queue Event.Queue.
	Link
)

// String returns the kind's name.
func (k EventKind) String() string {
	switch k {
	case CarrierOn:
		return "carrier-on"
	case CarrierOff:
		return "carrier-off"
	case Link:
		return "link"
	}
	return "unknown"
}

// Event is a change of a bridge's carrier, or an event of one of its
// endpoints, with the time it happened.
type Event struct {
	Kind  EventKind
	Time  time.Time
	Queue int          // the queue, for Link
	Link  fabric.Event // the endpoint's event, for Link
}

// Stats are a bridge's counters. Tx is the direction from the device to
// the fabric, Rx from the fabric to the device.
type Stats struct {
	TxFrames, TxBytes uint64
	RxFrames, RxBytes uint64
	// TxDropped counts frames read from the device that the fabric
	// refused (link down, peer gone) or that exceeded the message size.
	TxDropped uint64
	// RxDropped counts valid frames the device refused (write errors).
	RxDropped uint64
	// Frames from the fabric dropped as bad input, by reason.
	Truncated, Oversized, BadHeader, BadVnetHdr, BadFrame uint64
	// CarrierChanges counts carrier transitions.
	CarrierChanges uint64
	// Carrier is the device's carrier now.
	Carrier bool
}

// Malformed sums the frames dropped as bad input.
func (s *Stats) Malformed() uint64 {
	return s.Truncated + s.Oversized + s.BadHeader + s.BadVnetHdr + s.BadFrame
}

type counters struct {
	txFrames, txBytes, rxFrames, rxBytes atomic.Uint64
	txDropped, rxDropped                 atomic.Uint64
	truncated, oversized, badHeader      atomic.Uint64
	badVnetHdr, badFrame, carrierChanges atomic.Uint64
}

// Bridge joins a TAP (or TUN) device to fabric endpoints, one endpoint
// per device queue: what the kernel transmits on the device crosses the
// fabric, and what arrives from the fabric the device delivers to the
// kernel, so that unmodified IP programs run over the fabric. The
// device's carrier follows the fabric links.
//
// A Bridge reads the endpoints' Events channels itself and republishes
// them in its own Events, with the carrier changes they cause.
type Bridge struct {
	cfg     Config
	name    string
	ifindex int
	qs      []*queue

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	up      []bool        // per queue: its endpoint's link is up
	nUp     int           // how many are up
	gone    []bool        // per queue: the peer is gone for good
	changed chan struct{} // closed and replaced when up changes
	carrier atomic.Bool

	since  time.Time // when the carrier last changed (under mu)
	obs    atomic.Pointer[observer]
	evs    chan Event
	ctr    counters
	closed atomic.Bool
	once   sync.Once
}

// New creates (or attaches to) the device of cfg in the network namespace
// of the calling thread, with one queue per endpoint (IFF_MULTI_QUEUE
// when there are several), configures it through rtnetlink (MTU, address,
// up) and starts moving frames. The endpoints stay the caller's: Close
// stops the bridge and removes the device but does not close them. Any
// endpoint works; over an unreliable one frames are lost as on a NIC, and
// TCP recovers them.
//
// Errors wrap fabric.ErrNotSupported (no /dev/net/tun, no multi-queue or
// offload support), fabric.ErrMessageSize (an endpoint's messages are too
// small for the MTU) or fabric.ErrInvalid.
func New(cfg Config, eps ...fabric.Endpoint) (*Bridge, error) {
	if len(eps) == 0 {
		return nil, &fabric.OpError{Op: "new", Backend: "vnet", Err: fmt.Errorf("no endpoints: %w", fabric.ErrInvalid)}
	}
	if m, top := cfg.mtu(), cfg.maxMTU(); m < 68 || m > top {
		return nil, &fabric.OpError{Op: "new", Backend: "vnet", Err: fmt.Errorf("mtu %d: want 68 to %d: %w", m, top, fabric.ErrInvalid)}
	}
	if cfg.Burst <= 0 {
		cfg.Burst = DefaultBurst
	}
	need := cfg.MessageSize()
	for i, ep := range eps {
		if c := ep.Caps(); c.MaxMsgSize < need {
			return nil, &fabric.OpError{Op: "new", Backend: "vnet", Addr: ep.RemoteAddr(),
				Err: fmt.Errorf("endpoint %d (%s) carries %d-byte messages, mtu %d needs %d: %w",
					i, c.Backend, c.MaxMsgSize, cfg.mtu(), need, fabric.ErrMessageSize)}
		}
	}
	taps, name, err := openQueues(cfg.Name, cfg.Kind, len(eps), cfg.Offload)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Bridge{cfg: cfg, name: name, ctx: ctx, cancel: cancel,
		up: make([]bool, len(eps)), gone: make([]bool, len(eps)),
		changed: make(chan struct{}), evs: make(chan Event, 256)}
	fail := func(op string, err error) (*Bridge, error) {
		cancel()
		for _, q := range b.qs {
			q.free()
		}
		for _, t := range taps {
			t.f.Close()
		}
		return nil, &fabric.OpError{Op: op, Backend: "vnet", Addr: name, Err: err}
	}
	for i, ep := range eps {
		q, err := newQueue(b, i, taps[i], ep)
		if err != nil {
			return fail("new", err)
		}
		b.qs = append(b.qs, q)
	}
	if err := b.setupLink(); err != nil {
		return fail("link", err)
	}
	// Endpoints come open and connected; the carrier starts on, and the
	// event watchers correct it at once if a link is already down.
	b.nUp = len(eps)
	for i := range b.up {
		b.up[i] = true
	}
	b.mu.Lock()
	b.setCarrier(true)
	b.mu.Unlock()
	for _, q := range b.qs {
		b.wg.Add(3)
		go q.watch()
		go q.txLoop()
		go q.rxLoop()
	}
	return b, nil
}

// setupLink sets the MTU, address and state through rtnetlink.
func (b *Bridge) setupLink() error {
	ifi, err := net.InterfaceByName(b.name)
	if err != nil {
		return err
	}
	b.ifindex = ifi.Index
	c, err := rtnetlink.Dial(nil)
	if err != nil {
		return err
	}
	defer c.Close()
	attrs := &rtnetlink.LinkAttributes{MTU: uint32(b.cfg.mtu())}
	if b.cfg.MAC != nil && b.cfg.Kind == TAP {
		attrs.Address = b.cfg.MAC
	}
	msg := &rtnetlink.LinkMessage{Family: unix.AF_UNSPEC, Index: uint32(b.ifindex), Attributes: attrs}
	if !b.cfg.Down {
		msg.Flags, msg.Change = unix.IFF_UP, unix.IFF_UP
	}
	return c.Link.Set(msg)
}

// Name returns the device's name.
func (b *Bridge) Name() string { return b.name }

// Index returns the device's interface index.
func (b *Bridge) Index() int { return b.ifindex }

// Queues returns the number of device queues (and endpoints).
func (b *Bridge) Queues() int { return len(b.qs) }

// Endpoint returns the endpoint of queue i.
func (b *Bridge) Endpoint(i int) fabric.Endpoint { return b.qs[i].ep }

// Config returns the bridge's configuration, defaults filled in.
func (b *Bridge) Config() Config {
	c := b.cfg
	c.Name, c.MTU = b.name, c.mtu()
	return c
}

// Carrier reports whether the device has carrier: every queue's fabric
// link is up.
func (b *Bridge) Carrier() bool { return b.carrier.Load() }

// Events returns the bridge's events. The channel is buffered; events
// that find it full are dropped.
func (b *Bridge) Events() <-chan Event { return b.evs }

// Stats returns a snapshot of the bridge's counters.
func (b *Bridge) Stats() Stats {
	c := &b.ctr
	return Stats{
		TxFrames: c.txFrames.Load(), TxBytes: c.txBytes.Load(),
		RxFrames: c.rxFrames.Load(), RxBytes: c.rxBytes.Load(),
		TxDropped: c.txDropped.Load(), RxDropped: c.rxDropped.Load(),
		Truncated: c.truncated.Load(), Oversized: c.oversized.Load(), BadHeader: c.badHeader.Load(),
		BadVnetHdr: c.badVnetHdr.Load(), BadFrame: c.badFrame.Load(),
		CarrierChanges: c.carrierChanges.Load(), Carrier: b.carrier.Load(),
	}
}

// Close stops the bridge, waits for its goroutines and removes the
// device (unless it is persistent). The endpoints stay open. Close is
// idempotent.
func (b *Bridge) Close() error {
	b.once.Do(func() {
		b.closed.Store(true)
		b.cancel()
		for _, q := range b.qs {
			q.tap.f.Close() // wakes the device reader
		}
		b.wg.Wait()
		for _, q := range b.qs {
			q.free()
		}
	})
	return nil
}

func (b *Bridge) emit(ev Event) {
	if o := b.obs.Load(); o != nil {
		o.record(ev)
	}
	select {
	case b.evs <- ev:
	default:
	}
}

func (b *Bridge) setCarrier(on bool) {
	if b.carrier.Swap(on) == on {
		return
	}
	// Any queue's fd sets the device's carrier.
	setCarrier(b.qs[0].tap.fd, on)
	b.ctr.carrierChanges.Add(1)
	b.since = time.Now()
	k := CarrierOff
	if on {
		k = CarrierOn
	}
	b.emit(Event{Kind: k, Time: time.Now(), Queue: -1})
}

// setUp records queue i's link state and derives the carrier.
func (b *Bridge) setUp(i int, up, gone bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if gone {
		b.gone[i] = true
	}
	up = up && !b.gone[i]
	if b.up[i] != up {
		b.up[i] = up
		if up {
			b.nUp++
		} else {
			b.nUp--
		}
		close(b.changed)
		b.changed = make(chan struct{})
	}
	if !b.closed.Load() {
		b.setCarrier(b.nUp == len(b.qs))
	}
}

// waitUp waits until queue i's link is up, the bridge closes, or d passes
// (a fallback in case an event was lost).
func (b *Bridge) waitUp(i int, d time.Duration) {
	b.mu.Lock()
	up, ch := b.up[i], b.changed
	b.mu.Unlock()
	if up {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-b.ctx.Done():
	case <-t.C:
	}
}

// queue is one device queue joined to one endpoint.
type queue struct {
	b   *Bridge
	i   int
	tap tapQueue
	rc  syscall.RawConn
	ep  fabric.Endpoint

	// device → fabric
	slot    int // bytes per tx slot
	txBuf   []byte
	txReg   *fabric.Region
	txSGE   []fabric.SGE
	txMsgs  []fabric.Message
	txBusy  []bool // slot awaits its send completion
	txNext  int
	signal  bool // sends outlive Send: track completions
	comps   []fabric.Completion
	nRead   int
	rdErr   error
	readFn  func(fd uintptr) bool
	rdStart int // first slot of the current burst

	// fabric → device
	vr      fabric.ViewReceiver
	views   []fabric.View
	rxBuf   []byte
	rxReg   *fabric.Region
	rxSGE   []fabric.SGE
	rxMsgs  []fabric.Message
	iov     [2]unix.Iovec
	niov    int
	wErr    error
	writeFn func(fd uintptr) bool
	vh      [VnetHdrLen]byte
}

func newQueue(b *Bridge, i int, t tapQueue, ep fabric.Endpoint) (*queue, error) {
	q := &queue{b: b, i: i, tap: t, ep: ep}
	rc, err := t.f.SyscallConn()
	if err != nil {
		return nil, err
	}
	q.rc = rc
	burst := b.cfg.Burst
	q.slot = (b.cfg.MessageSize() + 63) &^ 63
	if b.cfg.Offload {
		// Read room past MaxFrame, so that an oversized frame is seen
		// as one rather than cut short.
		q.slot = (MaxMessage + 256 + 63) &^ 63
	}
	caps := ep.Caps()
	nslots := burst
	if caps.InlineSize < q.slot {
		// Sends hold their buffer until completion: twice the slots,
		// every send signaled.
		q.signal, nslots = true, 4*burst
		q.comps = make([]fabric.Completion, nslots)
	}
	q.txBuf = make([]byte, nslots*q.slot)
	if q.txReg, err = ep.Register(q.txBuf, fabric.AccessLocalWrite); err != nil {
		return nil, err
	}
	q.txSGE = make([]fabric.SGE, nslots)
	q.txMsgs = make([]fabric.Message, burst)
	q.txBusy = make([]bool, nslots)
	for s := range q.txSGE {
		q.txSGE[s] = fabric.SGE{Region: q.txReg, Offset: s * q.slot}
	}
	q.readFn, q.writeFn = q.readBurst, q.writev

	if vr, ok := ep.(fabric.ViewReceiver); ok {
		q.vr = vr
		q.views = make([]fabric.View, burst)
	} else {
		rslot := (caps.MaxMsgSize + 63) &^ 63
		q.rxBuf = make([]byte, burst*rslot)
		if q.rxReg, err = ep.Register(q.rxBuf, fabric.AccessLocalWrite); err != nil {
			q.free()
			return nil, err
		}
		q.rxSGE = make([]fabric.SGE, burst)
		q.rxMsgs = make([]fabric.Message, burst)
		for s := range q.rxSGE {
			q.rxSGE[s] = fabric.SGE{Region: q.rxReg, Offset: s * rslot, Length: rslot}
			q.rxMsgs[s].SGEs = q.rxSGE[s : s+1]
		}
	}
	return q, nil
}

func (q *queue) free() {
	if q.txReg != nil {
		q.txReg.Close()
	}
	if q.rxReg != nil {
		q.rxReg.Close()
	}
}

// watch follows the endpoint's events.
func (q *queue) watch() {
	defer q.b.wg.Done()
	evs := q.ep.Events()
	for {
		select {
		case <-q.b.ctx.Done():
			return
		case ev, ok := <-evs:
			if !ok {
				q.b.setUp(q.i, false, true)
				return
			}
			switch ev.Kind {
			case fabric.EventLinkUp:
				q.b.setUp(q.i, true, false)
			case fabric.EventLinkDown:
				q.b.setUp(q.i, false, false)
			case fabric.EventPeerGone:
				q.b.setUp(q.i, false, true)
			}
			q.b.emit(Event{Kind: Link, Time: ev.Time, Queue: q.i, Link: ev})
		}
	}
}

// readBurst is the RawConn.Read callback: it reads frames into free slots
// until the burst is full or the device has no more, and reports whether
// it is done (false: wait for the fd to become readable).
func (q *queue) readBurst(fd uintptr) bool {
	burst := len(q.txMsgs)
	hdr := HeaderLen
	for q.nRead < burst {
		s := (q.rdStart + q.nRead) % len(q.txBusy)
		if q.txBusy[s] {
			break
		}
		off := s * q.slot
		n, err := unix.Read(int(fd), q.txBuf[off+hdr:off+q.slot])
		if err != nil {
			if err == unix.EAGAIN || err == unix.EINTR {
				break
			}
			q.rdErr = err
			return true
		}
		q.txSGE[s].Length = hdr + n
		q.nRead++
	}
	return q.nRead > 0
}

// reap frees the slots whose sends completed; with block it waits for at
// least one.
func (q *queue) reap(block bool) error {
	var n int
	var err error
	if block {
		n, err = q.ep.CQ().Wait(q.b.ctx, q.comps)
	} else {
		n = q.ep.CQ().Poll(q.comps)
	}
	for _, c := range q.comps[:n] {
		if c.Op == fabric.OpSend && c.Context < uint64(len(q.txBusy)) {
			q.txBusy[c.Context] = false
			if c.Status != fabric.StatusOK {
				q.b.ctr.txDropped.Add(1)
			}
		}
	}
	return err
}

// txLoop moves frames from the device to the fabric.
func (q *queue) txLoop() {
	defer q.b.wg.Done()
	b := q.b
	flags := uint8(0)
	if b.cfg.Offload {
		flags |= FlagVnetHdr
	}
	if b.cfg.Kind == TUN {
		flags |= FlagTUN
	}
	maxFrame := b.cfg.maxFrame()
	if b.cfg.Offload {
		maxFrame = MaxFrame + VnetHdrLen
	}
	nslots := len(q.txBusy)
	for {
		if q.signal {
			if q.reap(false); q.txBusy[q.txNext] {
				if err := q.reap(true); err != nil {
					return
				}
				continue
			}
		}
		q.nRead, q.rdStart = 0, q.txNext
		if err := q.rc.Read(q.readFn); err != nil || q.rdErr != nil {
			return // closed
		}
		// Build the burst; drop frames too big for a message.
		k := 0
		var bytes uint64
		for j := 0; j < q.nRead; j++ {
			s := (q.rdStart + j) % nslots
			sge := &q.txSGE[s]
			n := sge.Length - HeaderLen
			if n > maxFrame {
				b.ctr.txDropped.Add(1)
				continue
			}
			off := s * q.slot
			Header(q.txBuf[off:off+HeaderLen]).Encode(flags, n)
			m := &q.txMsgs[k]
			m.SGEs, m.Context, m.Flags = q.txSGE[s:s+1], uint64(s), 0
			if q.signal {
				m.Flags = fabric.FlagSignal
				q.txBusy[s] = true
			}
			bytes += uint64(n)
			k++
		}
		q.txNext = (q.rdStart + q.nRead) % nslots
		sent := 0
		for sent < k {
			n, err := q.ep.SendWait(b.ctx, q.txMsgs[sent:k])
			sent += n
			if err != nil {
				if b.ctx.Err() != nil {
					return
				}
				// Link down or peer gone: the frames are lost, as on a
				// NIC whose cable is pulled.
				if q.signal {
					for _, m := range q.txMsgs[sent:k] {
						q.txBusy[m.Context] = false
					}
				}
				if sent < k && !errors.Is(err, fabric.ErrPeerGone) && !errors.Is(err, fabric.ErrMessageSize) {
					b.waitUp(q.i, 10*time.Millisecond)
				}
				b.ctr.txDropped.Add(uint64(k - sent))
				break
			}
		}
		b.ctr.txFrames.Add(uint64(sent))
		if sent == k {
			b.ctr.txBytes.Add(bytes)
		}
	}
}

// rxLoop moves frames from the fabric to the device.
func (q *queue) rxLoop() {
	defer q.b.wg.Done()
	b := q.b
	for {
		var n int
		var err error
		if q.vr != nil {
			n, err = q.vr.RecvViewsWait(b.ctx, q.views)
		} else {
			n, err = q.ep.RecvWait(b.ctx, q.rxMsgs)
		}
		if err != nil {
			if b.ctx.Err() != nil || errors.Is(err, os.ErrClosed) {
				return
			}
			// Link down: wait for it to come back.
			b.waitUp(q.i, 50*time.Millisecond)
			continue
		}
		var frames, bytes uint64
		for j := 0; j < n; j++ {
			var msg []byte
			if q.vr != nil {
				msg = q.views[j].Data
			} else {
				m := &q.rxMsgs[j]
				if m.Flags&fabric.FlagTruncated != 0 {
					b.ctr.truncated.Add(1)
					continue
				}
				off := q.rxSGE[j].Offset
				msg = q.rxBuf[off : off+m.Len]
			}
			if q.deliver(msg) {
				frames++
				bytes += uint64(len(msg) - HeaderLen)
			}
		}
		if q.vr != nil && n > 0 {
			q.vr.ReleaseViews(n)
		}
		b.ctr.rxFrames.Add(frames)
		b.ctr.rxBytes.Add(bytes)
	}
}

// deliver validates one message and writes its frame to the device.
// The virtio-net header is copied before it is checked and the copy is
// what the kernel gets, so a peer that rewrites its memory after the
// check cannot slip a bad header in.
func (q *queue) deliver(msg []byte) bool {
	b := q.b
	flags, vh, frame, err := Parse(msg, b.cfg.Kind, MaxFrame)
	if err != nil {
		q.count(err)
		return false
	}
	_ = flags
	var hdr []byte
	if b.cfg.Offload {
		if vh != nil {
			copy(q.vh[:], vh)
			if !VnetHdr(q.vh[:]).IsValid(len(frame)) {
				q.count(ErrBadVnetHdr)
				return false
			}
		} else {
			q.vh = [VnetHdrLen]byte{} // no offload asked
		}
		hdr = q.vh[:]
	} else {
		if vh != nil && vh.NeedsOffload() {
			// The peer asks for checksum or segmentation offload that
			// this device does not have.
			q.count(ErrBadVnetHdr)
			return false
		}
		if len(frame) > b.cfg.maxFrame() {
			q.count(ErrOversized)
			return false
		}
	}
	if err := q.writeFrame(hdr, frame); err != nil {
		b.ctr.rxDropped.Add(1)
		return false
	}
	return true
}

func (q *queue) count(err error) {
	c := &q.b.ctr
	switch {
	case errors.Is(err, ErrTruncated):
		c.truncated.Add(1)
	case errors.Is(err, ErrOversized):
		c.oversized.Add(1)
	case errors.Is(err, ErrBadHeader):
		c.badHeader.Add(1)
	case errors.Is(err, ErrBadVnetHdr):
		c.badVnetHdr.Add(1)
	default:
		c.badFrame.Add(1)
	}
}

// writeFrame writes hdr (may be empty) and frame to the device as one
// packet: writev on iovecs kept in the queue, through the file's RawConn
// so that Close cannot recycle the descriptor under it. Nothing
// allocates.
func (q *queue) writeFrame(hdr, frame []byte) error {
	iov := q.iov[:0]
	if len(hdr) > 0 {
		q.iov[0].Base = &hdr[0]
		q.iov[0].SetLen(len(hdr))
		iov = q.iov[:1]
	}
	i := len(iov)
	q.iov[i].Base = &frame[0]
	q.iov[i].SetLen(len(frame))
	q.niov, q.wErr = i+1, nil
	if err := q.rc.Write(q.writeFn); err != nil {
		return err
	}
	return q.wErr
}

// writev is the RawConn.Write callback of writeFrame.
func (q *queue) writev(fd uintptr) bool {
	for {
		_, _, e := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&q.iov[0])), uintptr(q.niov))
		switch e {
		case 0:
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		q.wErr = e
		return true
	}
}
