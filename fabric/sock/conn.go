package sock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/weft-io/weft/fabric"
)

// Config configures a connection. The zero value selects every default;
// a nil *Config is the zero value.
type Config struct {
	// Options configure the endpoint that Dial opens and the listener
	// that Listen starts (and so the endpoints it accepts).
	Options fabric.Options
	// Window is the initial receive window in bytes: the most data the
	// peer may send before this side's application reads it, and so the
	// receive memory of the connection (0: DefaultWindow). It is rounded
	// up to 4 KiB and at most 1 GiB.
	Window int
	// MaxWindow caps the receive window's growth (0: DefaultMaxWindow,
	// negative: no growth). The window doubles, up to MaxWindow, when
	// the peer reports that it ran out of credit with more to send
	// while everything it sent went straight into the slice of a
	// waiting Read and nothing is left buffered: the window, not the
	// reader, is then what limits the stream (the bandwidth-delay
	// product is more than it holds). It is rounded up to 4 KiB and at
	// least Window.
	MaxWindow int
	// MaxFrame bounds the payload of one DATA frame (0: the endpoint's
	// largest message, at most 64 KiB); larger writes are split.
	MaxFrame int
	// KeepAlive is how long the connection may be silent before this
	// side probes the peer with a PING (0: DefaultKeepAlive; negative:
	// never, which also disables stall detection).
	KeepAlive time.Duration
	// StallTimeout is how long the peer may send nothing at all, not
	// even an answer to a probe, before the connection is closed with
	// ErrStalled (0: DefaultStallTimeout).
	StallTimeout time.Duration
}

// Defaults of Config.
const (
	DefaultWindow = 256 << 10
	// DefaultMaxWindow is DefaultWindow: the window grows only when
	// asked to. Measured (1 MiB stream, 2-core host): growth to 4 MiB
	// gains nothing within the noise over roce and ntb, where the
	// endpoint's CPU per byte bounds the stream, and halves ethernet's,
	// whose endpoint retransmits with more in flight (706 packets a
	// 300 MiB run, none without growth).
	DefaultMaxWindow    = DefaultWindow
	DefaultKeepAlive    = time.Second
	DefaultStallTimeout = 15 * time.Second
	defaultMaxFrame     = 64<<10 - hdrLen // a whole frame fits a 64 KiB receive slot (verbs' default)
	// zcMin is the least Write sent from the caller's buffer (Conn.zc):
	// below it the copy into the send slots costs less than the
	// registration of a new buffer (an allocation).
	zcMin = 16 << 10
	// rxBurst is the number of frames the receive loop takes at once.
	rxBurst = 32
	// sendSlots is the number of DATA frames a Write posts in one burst
	// where the endpoint copies them at once, and the most frames in
	// flight where it does not.
	sendSlots = 8
	// ctlSlot is the least room for frames outside the data slots:
	// every control frame (HELLO, CREDIT, FIN, ...) fits.
	ctlSlot = 128
)

func (c *Config) resolve() Config {
	var r Config
	if c != nil {
		r = *c
	}
	if r.Window <= 0 {
		r.Window = DefaultWindow
	}
	r.Window = min(max((min(r.Window, maxWindow)+4095)&^4095, minWindow), maxWindow)
	switch {
	case r.MaxWindow == 0:
		r.MaxWindow = DefaultMaxWindow
	case r.MaxWindow < 0:
		r.MaxWindow = r.Window
	}
	r.MaxWindow = min(max((min(r.MaxWindow, maxWindow)+4095)&^4095, r.Window), maxWindow)
	if r.KeepAlive == 0 {
		r.KeepAlive = DefaultKeepAlive
	}
	if r.StallTimeout <= 0 {
		r.StallTimeout = DefaultStallTimeout
	}
	return r
}

// Addr is the address of one end of a connection: the backend's name and
// the address in its syntax (what fabric.Endpoint's LocalAddr and
// RemoteAddr report, or a listener's Addr).
type Addr struct {
	// Backend is the fabric backend, such as "ntb".
	Backend string
	// Address is the backend's address string.
	Address string
}

// Network implements net.Addr: the backend's name.
func (a *Addr) Network() string { return a.Backend }

// String implements net.Addr: the address in the backend's syntax.
func (a *Addr) String() string { return a.Address }

// Conn is a byte stream over a reliable fabric endpoint. It implements
// net.Conn and, like *net.TCPConn, CloseWrite. Its methods are safe for
// concurrent use.
type Conn struct {
	ep      fabric.Endpoint
	vr      fabric.ViewReceiver // nil: Recv into rreg
	cfg     Config
	backend string
	laddr   net.Addr
	raddr   net.Addr
	maxData int // payload bytes per DATA frame
	inline  int // Caps.InlineSize

	ctx    context.Context // ends when the connection closes or fails
	cancel context.CancelFunc
	rdl    deadline
	wdl    deadline

	wmu  sync.Mutex // serialises Write and CloseWrite
	cmu  sync.Mutex // guards cork's queue
	cork corker     // small Writes waiting for wmu (cork.go)
	smu  sync.Mutex // serialises frames on the endpoint; guards what follows
	sreg *fabric.Region
	// The send region is a small slot of small bytes at offset 0, for
	// control frames and DATA frames the endpoint copies at once (see
	// ring), and then slots data slots of hdrLen+maxData bytes.
	small int
	slots int
	// ring: DATA frames of more than the endpoint's InlineSize bytes are
	// signaled, and their slot is reused once the completion has been
	// taken: up to slots frames in flight, the oldest at slot shead-sbusy.
	// Without ring every frame is copied at once (slots per burst).
	ring  bool
	shead int
	sbusy int
	ssge  [sendSlots]fabric.SGE
	smsg  [sendSlots]fabric.Message
	scomp [sendSlots]fabric.Completion
	// Without ring, a large Write is sent from the caller's slice (zc):
	// each frame is two SGEs, its header in the frame's slot and its
	// payload in ureg, a local registration of the caller's buffer,
	// which the endpoint copies at once (one copy instead of two).
	// ureg is kept for the next Write from the same buffer (bufio,
	// io.Copy), and registered anew for another one.
	zc   bool
	ureg *fabric.Region
	zsge [2 * sendSlots]fabric.SGE
	zmsg [sendSlots]fabric.Message
	rreg *fabric.Region
	// Another buffer is registered only when two large Writes in a row
	// come from it (uagain: useen, the end of the previous one's
	// backing array, is this one's; both belong to wmu); until then it
	// is copied: buffers taken in turn (a pool, double buffering) would
	// otherwise cost a registration, an allocation, at each Write.
	useen  uintptr
	uagain bool

	mu sync.Mutex
	// Receive side.
	rbuf      []byte // ring of the window's size
	growBy    int    // window growth not yet sent (growLocked)
	rhead     int
	rlen      int
	rxAllowed int64 // credit the peer still has
	// Held views (with vr and a fabric.ViewRoom, see holdLocked): DATA
	// that no Read took stays in its fabric view, queued in stream
	// order before the ring's bytes, and Read copies it from there: one
	// copy instead of two. hlen counts their bytes, which rlen counts
	// too (held bytes are buffered bytes for credit and growth).
	hv   holdViews
	hlen int
	// starved: the peer reported (flagStarved) that it ran out of
	// credit, in a frame that a Read took whole into its slice; the
	// next Read that leaves nothing buffered grows the window
	// (growLocked).
	starved bool
	unacked int64 // bytes read, not yet granted back
	eof     bool  // FIN or CLOSE received
	helloRx bool
	// Send side.
	credit     int64 // bytes this side may still send
	peerWindow int64
	wshut      bool // CloseWrite done
	peerClosed bool // CLOSE received
	closed     bool
	err        error // terminal failure

	rdReady chan struct{}
	wrReady chan struct{}

	rxBursts atomic.Uint64 // received bursts, for liveness
	ka       *time.Timer
	kaSeen   uint64
	kaSince  time.Time
	stats    connStats

	// The receive path is driven by whoever needs it: a Read waiting for
	// data, a Write waiting for credit, the keep-alive timer. pmu makes
	// one of them the pumper; the others wait for its signals. A caller
	// that pumps receives in its own goroutine: no hand-off between a
	// receive goroutine and the reader on the latency path.
	pmu   sync.Mutex
	views []fabric.View // with vr
	// direct is the slice of a Read that pumps while nothing is
	// buffered: DATA goes straight into it (one copy, from the
	// fabric's view into the caller's slice, where the backend lends
	// views), and only what does not fit into the ring. directN counts
	// the bytes it took. Both belong to the holder of pmu.
	direct  []byte
	directN int
	// vpend and vpendB count the views of the burst being handled that
	// are done with (control frames, DATA copied out) since the last
	// one held, and their bytes; vcur is the bytes of the view being
	// handled and vheld reports that copyInLocked held it. All belong
	// to the holder of pmu (holdViews says how they join hv).
	vpend, vpendB, vcur int
	vheld               bool
	msgs                []fabric.Message // without vr
	sges                []fabric.SGE
}

type connStats struct {
	framesTx, framesRx atomic.Uint64
}

// NewConn starts a connection over ep, which must be reliable and
// connected to a peer that runs NewConn too (through Dial and Listen, or
// over any pair of endpoints). It sends this side's HELLO and returns at
// once; the first Write waits for the peer's. The Conn owns ep and closes
// it. cfg may be nil; its Options are not used.
//
// An endpoint that cannot carry a stream (not reliable, messages too
// small) is refused with an error matching fabric.ErrNotSupported and left
// to the caller; after any other error ep has been closed.
func NewConn(ep fabric.Endpoint, cfg *Config) (*Conn, error) {
	caps := ep.Caps()
	if !caps.Reliable {
		return nil, &net.OpError{Op: "dial", Net: caps.Backend,
			Err: fmt.Errorf("sock: %s endpoint is not reliable: %w", caps.Backend, fabric.ErrNotSupported)}
	}
	r := cfg.resolve()
	maxData := r.MaxFrame
	if maxData <= 0 {
		maxData = defaultMaxFrame
	}
	maxData = min(maxData, caps.MaxMsgSize-hdrLen, maxFrameLen)
	if maxData < 64 {
		return nil, &net.OpError{Op: "dial", Net: caps.Backend,
			Err: fmt.Errorf("sock: %s messages of %d bytes are too small: %w", caps.Backend, caps.MaxMsgSize, fabric.ErrNotSupported)}
	}
	c := &Conn{
		ep: ep, cfg: r, backend: caps.Backend, maxData: maxData, inline: caps.InlineSize,
		laddr:   &Addr{Backend: caps.Backend, Address: ep.LocalAddr()},
		raddr:   &Addr{Backend: caps.Backend, Address: ep.RemoteAddr()},
		rbuf:    make([]byte, r.Window),
		rdReady: make(chan struct{}, 1), wrReady: make(chan struct{}, 1),
		rxAllowed: int64(r.Window),
	}
	c.rdl.init()
	c.wdl.init()
	c.cork.init()
	c.ctx, c.cancel = context.WithCancel(context.Background())
	var err error
	slot := hdrLen + maxData
	c.slots, c.small = sendSlots, ctlSlot
	if slot > c.inline {
		// Frames as large as the endpoint takes, each signaled, in a
		// ring of slots that bounds what is in flight by the window:
		// per-message costs (posting, completion, the peer's receive)
		// fall with the frame's size, and the endpoint sends from the
		// slot without copying it.
		c.ring = true
		c.slots = min(max(r.MaxWindow/maxData, 2), sendSlots)
		c.small = max(ctlSlot, min(c.inline, slot))
	}
	c.sreg, err = ep.Alloc(c.small+c.slots*slot, 0)
	if err != nil {
		return nil, c.setupErr(err)
	}
	for i := range sendSlots {
		c.ssge[i].Region = c.sreg
		c.smsg[i].SGEs = c.ssge[i : i+1]
		c.zsge[2*i].Region = c.sreg
		c.zmsg[i].SGEs = c.zsge[2*i : 2*i+2]
	}
	c.zc = !c.ring && caps.MaxSGEs >= 2
	if vr, ok := ep.(fabric.ViewReceiver); ok {
		c.vr = vr
		c.views = make([]fabric.View, rxBurst)
		if room, ok := ep.(fabric.ViewRoom); ok {
			c.hv.init(room, hdrLen+maxData)
		}
	} else {
		c.rreg, err = ep.Alloc(rxBurst*slot, fabric.AccessLocalWrite)
		if err != nil {
			return nil, c.setupErr(err)
		}
		c.msgs = make([]fabric.Message, rxBurst)
		c.sges = make([]fabric.SGE, rxBurst)
		for i := range c.msgs {
			c.sges[i] = fabric.SGE{Region: c.rreg, Offset: i * slot, Length: slot}
			c.msgs[i].SGEs = c.sges[i : i+1]
		}
	}
	// HELLO goes out first, before any other frame can.
	c.smu.Lock()
	n := putHello(c.sreg.Bytes(), uint32(r.Window))
	err = c.postCtl(c.ctx, n)
	c.smu.Unlock()
	if err != nil {
		return nil, c.setupErr(err)
	}
	if r.KeepAlive > 0 {
		c.kaSince = time.Now()
		c.mu.Lock() // keepAlive reads c.ka under mu
		c.ka = time.AfterFunc(r.KeepAlive, c.keepAlive)
		c.mu.Unlock()
	}
	return c, nil
}

func (c *Conn) setupErr(err error) error {
	c.cancel()
	for _, r := range []*fabric.Region{c.sreg, c.rreg} {
		if r != nil {
			r.Close()
		}
	}
	c.ep.Close()
	return &net.OpError{Op: "dial", Net: c.backend, Source: c.laddr, Addr: c.raddr, Err: err}
}

// errConnClosed is what deadline contexts report after Close.
var errConnClosed = net.ErrClosed

func (c *Conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: c.backend, Source: c.laddr, Addr: c.raddr, Err: err}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Read implements net.Conn. It returns what has arrived, at most len(p)
// bytes, waiting only while nothing has; io.EOF once the peer's
// CloseWrite or Close has been reached.
func (c *Conn) Read(p []byte) (int, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return 0, c.opErr("read", net.ErrClosed)
		}
		if c.err != nil {
			err := c.err
			c.mu.Unlock()
			signal(c.rdReady)
			return 0, c.opErr("read", err)
		}
		if c.rdl.expired() {
			c.mu.Unlock()
			return 0, c.opErr("read", errTimeout)
		}
		if len(p) == 0 {
			c.mu.Unlock()
			return 0, nil
		}
		if c.rlen > 0 {
			held := c.hlen > 0
			n := c.copyOutLocked(p)
			if held && !c.hv.intact() {
				// The views' memory was reset under them: what was
				// copied may be zeros or another session's bytes.
				c.dropBufferedLocked()
				c.mu.Unlock()
				c.fail(errViewsLost)
				return 0, c.opErr("read", errViewsLost)
			}
			grant := c.readLocked(n)
			grow := c.growLocked()
			more := c.rlen > 0 || c.eof
			rel := c.hv.freed
			c.hv.freed = 0
			c.mu.Unlock()
			if rel > 0 {
				c.vr.ReleaseViews(rel)
			}
			if more {
				signal(c.rdReady) // for other readers
			}
			c.grant(grant, grow)
			return n, nil
		}
		if c.eof {
			c.mu.Unlock()
			// A frame behind the FIN is a violation: take what has
			// arrived, so that a reader going on past EOF learns of it.
			c.pump(nil)
			c.mu.Lock()
			err := c.err
			c.mu.Unlock()
			signal(c.rdReady)
			if err != nil {
				return 0, c.opErr("read", err)
			}
			return 0, io.EOF
		}
		c.mu.Unlock()
		if n, ok := c.pumpInto(p); ok {
			if n > 0 {
				c.mu.Lock()
				grant := c.readLocked(n)
				grow := c.growLocked()
				more := c.rlen > 0 || c.eof
				c.mu.Unlock()
				if more {
					signal(c.rdReady)
				}
				c.grant(grant, grow)
				return n, nil
			}
			continue
		}
		select {
		case <-c.rdReady:
		case <-c.rdl.wait():
		}
	}
}

// pumpInto is pump for a Read into p that found nothing buffered: the
// DATA it receives lands in p first (see Conn.direct). It returns the
// bytes placed in p and whether it pumped.
func (c *Conn) pumpInto(p []byte) (int, bool) {
	if !c.pmu.TryLock() {
		return 0, false
	}
	c.direct, c.directN = p, 0
	c.pumpLocked(c.rdl.ctx())
	n := c.directN
	c.direct, c.directN = nil, 0
	c.pmu.Unlock()
	c.endBurst()
	return n, true
}

// readLocked accounts n bytes the application has read and returns the
// credit to grant back now in a CREDIT frame (0: none yet), which it has
// already added to rxAllowed.
func (c *Conn) readLocked(n int) uint32 {
	c.unacked += int64(n)
	if c.unacked < int64(len(c.rbuf)/4) || c.peerClosed {
		return 0
	}
	grant := uint32(c.unacked)
	c.rxAllowed += c.unacked
	c.unacked = 0
	return grant
}

// growLocked grows the receive window when the peer has reported that
// it ran out of credit (flagStarved) and this Read has left nothing
// buffered: the application keeps up, so the window, not the reader,
// limits the stream. The window doubles, at most to Config.MaxWindow;
// the ring, empty, is replaced by one of the new size. It reports
// whether it grew; the caller then sends WINDOW (grant), whose credit
// carries the growth, already added to rxAllowed.
func (c *Conn) growLocked() bool {
	if !c.starved || c.rlen != 0 || len(c.rbuf) >= c.cfg.MaxWindow || c.eof || c.peerClosed {
		return false
	}
	c.starved = false
	w := min(2*len(c.rbuf), c.cfg.MaxWindow)
	c.rxAllowed += int64(w - len(c.rbuf))
	c.growBy += w - len(c.rbuf)
	c.rbuf, c.rhead = make([]byte, w), 0
	return true
}

// grant sends the credit a Read freed (readLocked) and, with grow, the
// window's growth (growLocked): CREDIT, or WINDOW.
func (c *Conn) grant(credit uint32, grow bool) {
	if !grow {
		if credit > 0 {
			c.sendCredit(credit)
		}
		return
	}
	c.smu.Lock()
	c.mu.Lock()
	w, by := len(c.rbuf), c.growBy
	c.growBy = 0
	c.mu.Unlock()
	if by > 0 { // (a concurrent grant may have sent it)
		b := c.sreg.Bytes()
		putHeader(b, frameWindow, credit+uint32(by))
		binary.LittleEndian.PutUint32(b[hdrLen:], uint32(w))
		c.postCtl(c.ctx, hdrLen+windowLen)
	} else if credit > 0 {
		putHeader(c.sreg.Bytes(), frameCredit, credit)
		c.postCtl(c.ctx, hdrLen)
	}
	c.smu.Unlock()
}

// copyOutLocked moves up to len(p) buffered bytes into p: from the held
// views first, then from the ring. The views it empties, and those done
// with before them, are added to hv.freed for the caller to release
// once it has let go of mu.
func (c *Conn) copyOutLocked(p []byte) int {
	n := min(len(p), c.rlen)
	k := 0
	if c.hlen > 0 {
		k = c.hv.copyOut(p[:n])
		c.hlen -= k
		c.rlen -= k
	}
	m := n - k
	first := min(m, len(c.rbuf)-c.rhead)
	copy(p[k:], c.rbuf[c.rhead:c.rhead+first])
	copy(p[k+first:n], c.rbuf[:m-first])
	c.rhead = (c.rhead + m) % len(c.rbuf)
	c.rlen -= m
	if c.rlen == c.hlen {
		c.rhead = 0
	}
	return n
}

// errTimeout is os.ErrDeadlineExceeded, which is a net.Error whose
// Timeout is true.
var errTimeout error = os.ErrDeadlineExceeded

// sendCredit sends a CREDIT frame carrying grant, which the caller has
// already accounted in rxAllowed. A failure is not the reader's: the
// peer may have closed with data still on its way to us, which Read goes
// on to deliver, and a broken endpoint fails the receive path too.
func (c *Conn) sendCredit(grant uint32) {
	c.smu.Lock()
	putHeader(c.sreg.Bytes(), frameCredit, grant)
	c.postCtl(c.ctx, hdrLen)
	c.smu.Unlock()
}

// writeLocked is Write, for the holder of wmu.
func (c *Conn) writeLocked(p []byte) (int, error) {
	if c.zc && len(p) >= zcMin {
		end := uintptr(unsafe.Pointer(unsafe.SliceData(p))) + uintptr(cap(p))
		c.uagain, c.useen = end == c.useen, end
	}
	n := 0
	for {
		c.mu.Lock()
		if n == len(p) && n > 0 {
			// Every byte went out before a close was seen: the Write
			// succeeded, as a TCP write before the peer's FIN or RST
			// does. net/http takes an error here for a failed request.
			c.mu.Unlock()
			return n, nil
		}
		var err error
		switch {
		case c.closed:
			err = net.ErrClosed
		case c.err != nil:
			err = c.err
		case c.wshut:
			err = ErrWriteClosed
		case c.peerClosed:
			err = ErrPeerClosed
		}
		if err != nil {
			c.mu.Unlock()
			return n, c.opErr("write", err)
		}
		if c.wdl.expired() {
			c.mu.Unlock()
			return n, c.opErr("write", errTimeout)
		}
		if n == len(p) {
			c.mu.Unlock()
			return n, nil
		}
		chunk := int(min(int64(len(p)-n), c.credit, int64(c.slots*c.maxData)))
		if chunk <= 0 {
			c.mu.Unlock()
			if c.pump(c.wdl.ctx()) {
				continue
			}
			select {
			case <-c.wrReady:
			case <-c.wdl.wait():
			}
			continue
		}
		starved := int64(chunk) == c.credit && n+chunk < len(p)
		c.credit -= int64(chunk)
		c.mu.Unlock()
		sent, err := c.sendData(p[n:n+chunk], starved)
		n += sent
		if sent < chunk {
			c.mu.Lock()
			c.credit += int64(chunk - sent) // not sent
			c.mu.Unlock()
		}
		if err != nil {
			if errors.Is(err, errTimeout) && !c.wdl.expired() {
				continue // the deadline moved on while we waited
			}
			if errors.Is(err, net.ErrClosed) {
				err = net.ErrClosed
			} else if !errors.Is(err, errTimeout) {
				c.fail(err)
			}
			return n, c.opErr("write", err)
		}
	}
}

// sendData sends p as DATA frames of up to maxData bytes in one burst
// (p holds at most slots of them), piggybacking on the first the credit
// the reader has freed. With ring it first takes the completions that
// have arrived, waiting for one only while every slot is in flight, and
// sends as many frames as there are free slots. It returns the bytes of
// the frames posted: all of p unless slots ran short or it fails. With
// starved (p is the last of the credit and the writer has more) the
// frame that ends p carries flagStarved.
func (c *Conn) sendData(p []byte, starved bool) (int, error) {
	c.smu.Lock()
	defer c.smu.Unlock()
	slot := hdrLen + c.maxData
	f := (len(p) + c.maxData - 1) / c.maxData
	first := c.small // offset of the first frame
	signal := false
	switch {
	case f == 1 && hdrLen+len(p) <= min(c.small, c.inline):
		// One frame the endpoint copies at once: the small slot, no
		// completion, no wait for a slot.
		first = 0
	case c.ring:
		if err := c.reapLocked(c.wdl.ctx(), c.sbusy == c.slots); err != nil {
			return 0, err
		}
		f = min(f, c.slots-c.sbusy)
		first, signal = -1, true
	}
	var ureg *fabric.Region
	uoff := 0
	if c.zc && first != 0 && len(p) >= zcMin {
		ureg, uoff = c.userRegion(p)
	}
	b := c.sreg.Bytes()
	c.mu.Lock()
	grant := c.unacked
	if c.peerClosed {
		grant = 0
	}
	c.rxAllowed += grant
	c.unacked -= grant
	c.mu.Unlock()
	off := 0
	for i := range f {
		k := min(len(p)-off, c.maxData)
		o := first + i*slot
		if first < 0 {
			o = c.small + (c.shead+i)%c.slots*slot
		}
		putHeader(b[o:], frameData, 0)
		if i == 0 {
			binary.LittleEndian.PutUint32(b[o+4:], uint32(grant))
		}
		if ureg != nil {
			z := c.zsge[2*i : 2*i+2]
			z[0].Offset, z[0].Length = o, hdrLen
			z[1] = fabric.SGE{Region: ureg, Offset: uoff + off, Length: k}
		} else {
			copy(b[o+hdrLen:], p[off:off+k])
			c.ssge[i].Offset, c.ssge[i].Length = o, hdrLen+k
		}
		off += k
		if starved && off == len(p) {
			b[o+1] = flagStarved
		}
	}
	msgs := c.smsg[:f]
	if ureg != nil {
		msgs = c.zmsg[:f]
	}
	posted, err := c.postLocked(c.wdl.ctx(), msgs, signal)
	if signal {
		c.shead = (c.shead + posted) % c.slots
	}
	if posted == 0 && grant > 0 {
		c.mu.Lock()
		c.rxAllowed -= grant
		c.unacked += grant
		c.mu.Unlock()
	}
	return min(posted*c.maxData, off), err
}

// postLocked posts the frames of msgs (smsg or zmsg), whose SGEs the
// caller set, waiting for room with ctx. Signaled frames are counted in
// sbusy until reapLocked takes their completions. It returns how many
// frames were posted. The caller holds smu.
func (c *Conn) postLocked(ctx context.Context, msgs []fabric.Message, signal bool) (int, error) {
	fl := fabric.MsgFlags(0)
	if signal {
		fl = fabric.FlagSignal
	}
	for i := range msgs {
		msgs[i].Flags = fl
	}
	f := len(msgs)
	posted := 0
	var err error
	for posted < f && err == nil {
		var k int
		k, err = c.ep.SendWait(ctx, msgs[posted:])
		posted += k
	}
	c.stats.framesTx.Add(uint64(posted))
	if signal {
		c.sbusy += posted
	}
	return posted, err
}

// userRegion returns a registration covering p (the caller's buffer, for
// Conn.zc) and p's offset in it: ureg if it covers p, else, if the
// previous large Write came from p's backing array too (uagain), a new
// registration of it from p on, kept in ureg. It returns nil if not, or
// if the endpoint refuses: the caller copies. The caller holds smu and
// wmu.
func (c *Conn) userRegion(p []byte) (*fabric.Region, int) {
	base := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	if r := c.ureg; r != nil {
		rb := r.Bytes()
		start := uintptr(unsafe.Pointer(unsafe.SliceData(rb)))
		if base >= start && base+uintptr(len(p)) <= start+uintptr(len(rb)) {
			return r, int(base - start)
		}
	}
	if !c.uagain {
		return nil, 0
	}
	if c.ureg != nil {
		c.ureg.Close()
		c.ureg = nil
	}
	r, err := c.ep.Register(p[:cap(p)], 0)
	if err != nil {
		// An endpoint that refuses a registration (locked memory at its
		// limit) refuses the next too: copy from now on, rather than
		// paying a failed Register, and its error, at every Write.
		c.zc = false
		return nil, 0
	}
	c.ureg = r
	return r, 0
}

// reapLocked takes the completions of signaled frames that have arrived,
// freeing their slots (they complete in order); with block it waits, with
// ctx, for one at least. A failed frame fails the send path. The caller
// holds smu.
func (c *Conn) reapLocked(ctx context.Context, block bool) error {
	if c.sbusy == 0 {
		return nil
	}
	out := c.scomp[:c.sbusy]
	n := c.ep.CQ().Poll(out)
	if n == 0 && block {
		var err error
		if n, err = c.ep.CQ().Wait(ctx, out); err != nil {
			return err
		}
	}
	c.sbusy -= n
	for i := range n {
		if err := out[i].Err(); err != nil {
			return err
		}
	}
	return nil
}

// postCtl posts a frame of n bytes already in the small slot. One the
// endpoint does not copy at once (n above its InlineSize) is signaled,
// and postCtl waits, with the connection's context (a frame posted cannot
// be recalled when a deadline passes), until it and every frame before it
// have completed. The caller holds smu.
func (c *Conn) postCtl(ctx context.Context, n int) error {
	c.ssge[0].Offset, c.ssge[0].Length = 0, n
	signal := n > c.inline
	if _, err := c.postLocked(ctx, c.smsg[:1], signal); err != nil || !signal {
		return err
	}
	for c.sbusy > 0 {
		if err := c.reapLocked(c.ctx, true); err != nil {
			return err
		}
	}
	return nil
}

// trySendCtl sends a frame without payload if the endpoint takes it at
// once; the receive loop and the keep-alive timer never block on a peer
// that does not drain its queue.
func (c *Conn) trySendCtl(typ uint8) {
	if !c.smu.TryLock() {
		return // a frame is going out anyway
	}
	defer c.smu.Unlock()
	putHeader(c.sreg.Bytes(), typ, 0)
	c.ssge[0].Offset, c.ssge[0].Length = 0, hdrLen
	c.smsg[0].Flags = 0
	if k, _ := c.ep.Send(c.smsg[:1]); k == 1 {
		c.stats.framesTx.Add(1)
	}
}

// CloseWrite shuts down the writing side: the peer reads io.EOF once it
// has read everything written before. Reading goes on.
func (c *Conn) CloseWrite() error {
	c.wmu.Lock()
	defer func() {
		c.combineLocked(nil) // the queued Writes fail with ErrWriteClosed
		c.wunlock()
	}()
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	case c.wshut:
		c.mu.Unlock()
		return nil
	case c.err != nil:
		err := c.err
		c.mu.Unlock()
		return c.opErr("close", err)
	}
	c.wshut = true
	c.mu.Unlock()
	c.smu.Lock()
	putHeader(c.sreg.Bytes(), frameFin, 0)
	err := c.postCtl(c.ctx, hdrLen)
	c.smu.Unlock()
	if err != nil {
		c.fail(err)
		return c.opErr("close", err)
	}
	return nil
}

// Close implements net.Conn: it tells the peer (which reads io.EOF after
// the data sent before), wakes blocked calls with net.ErrClosed and
// closes the endpoint. A second Close returns net.ErrClosed.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.closed = true
	tell := c.err == nil && !c.peerClosed
	c.mu.Unlock()
	c.rdl.close()
	c.wdl.close() // a Write blocked in SendWait returns, freeing smu
	signal(c.rdReady)
	signal(c.wrReady)
	if c.ka != nil {
		c.ka.Stop()
	}
	if tell {
		c.smu.Lock()
		putHeader(c.sreg.Bytes(), frameClose, 0)
		ctx, cancel := context.WithTimeout(c.ctx, time.Second)
		c.postCtl(ctx, hdrLen)
		cancel()
		c.smu.Unlock()
	}
	c.shutdown()
	return nil
}

// shutdown ends the receive loop and releases the endpoint.
func (c *Conn) shutdown() {
	c.cancel()
	c.ep.Close()
	c.pmu.Lock() // the pumper, woken by Close, has left
	defer c.pmu.Unlock()
	c.mu.Lock()
	c.rlen -= c.hlen // the views went with the endpoint: nothing to release
	c.hlen = 0
	c.hv.reset()
	c.mu.Unlock()
	c.smu.Lock()
	c.sreg.Close()
	if c.ureg != nil {
		c.ureg.Close()
		c.ureg = nil
	}
	c.smu.Unlock()
	if c.rreg != nil {
		c.rreg.Close()
	}
}

// fail records a terminal error (the first one wins), resets the peer if
// the error is its protocol violation, and closes the endpoint.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil || c.closed {
		c.mu.Unlock()
		return
	}
	c.err = err
	c.mu.Unlock()
	signal(c.rdReady)
	signal(c.wrReady)
	if c.ka != nil {
		c.ka.Stop()
	}
	var pe *ProtocolError
	if errors.As(err, &pe) && pe.Err != ErrReset && pe.Err != ErrStalled {
		c.trySendCtl(frameRst)
	}
	c.cancel()
	c.ep.Close()
}

// keepAlive runs on the keep-alive timer: it probes a silent peer and
// fails the connection when the peer has been silent too long.
func (c *Conn) keepAlive() {
	c.mu.Lock()
	if c.ctx.Err() != nil || c.peerClosed || c.closed || c.err != nil {
		c.mu.Unlock()
		return
	}
	now := time.Now()
	if seen := c.rxBursts.Load(); seen != c.kaSeen {
		c.kaSeen, c.kaSince = seen, now
	}
	idle := now.Sub(c.kaSince)
	ka := c.ka
	c.mu.Unlock()
	if idle >= c.cfg.StallTimeout {
		c.fail(&ProtocolError{Reason: fmt.Sprintf("nothing received for %v", idle.Round(time.Millisecond)), Err: ErrStalled})
		return
	}
	// Nobody may be reading: take what arrived (answering PINGs,
	// buffering data within its credit).
	c.pump(nil)
	if idle >= c.cfg.KeepAlive {
		c.trySendCtl(framePing)
	}
	ka.Reset(min(c.cfg.KeepAlive, c.cfg.StallTimeout-idle))
}

// pumpLocked receives one burst of frames and handles them; with ctx
// non-nil it waits for one, until ctx is done. The caller holds pmu and
// signals the other waiters when it lets go. An error of ctx (a deadline,
// Close) is returned as is; any other failure of the endpoint or of the
// peer fails the connection.
func (c *Conn) pumpLocked(ctx context.Context) error {
	c.mu.Lock()
	stop := c.peerClosed || c.err != nil || c.closed
	if c.hv.n == 0 {
		// Nothing held: the views to come are checked against the
		// epoch read before they are received (holdViews.intact).
		c.hv.rebase()
	}
	c.mu.Unlock()
	if stop {
		return nil // nothing more will come, or nobody wants it
	}
	var n int
	var err error
	switch {
	case c.vr != nil && ctx != nil:
		n, err = c.vr.RecvViewsWait(ctx, c.views)
	case c.vr != nil:
		n, err = c.vr.RecvViews(c.views)
	case ctx != nil:
		n, err = c.ep.RecvWait(ctx, c.msgs)
	default:
		n, err = c.ep.Recv(c.msgs)
	}
	if err != nil {
		if ctx != nil && ctx.Err() != nil {
			return ctx.Err()
		}
		if !c.isClosed() {
			c.fail(err)
		}
		return err
	}
	if n == 0 {
		return nil
	}
	h := 0 // views handled
	for i := 0; i < n && err == nil; i++ {
		var stop bool
		h++
		if c.vr != nil {
			c.vcur, c.vheld = len(c.views[i].Data)+viewRec, false
			stop, err = c.handle(c.views[i].Data, c.views[i].Flags)
			if !c.vheld {
				c.vpend++
				c.vpendB += c.vcur
			}
		} else if m := &c.msgs[i]; m.Flags&fabric.FlagTruncated != 0 {
			err = c.violation(errLength)
		} else {
			stop, err = c.handle(c.sges[i].Bytes()[:m.Len], m.Flags)
		}
		if stop {
			break
		}
	}
	if c.vr != nil {
		for _, v := range c.views[h:n] { // behind a CLOSE or a violation
			c.vpend++
			c.vpendB += len(v.Data) + viewRec
		}
		if !c.hv.intact() {
			// The endpoint reset the views' memory (closed, or a new
			// session) while the burst was copied from them: what went
			// into the Read's slice or the ring may be zeros or
			// another session's bytes.
			c.directN = 0
			c.mu.Lock()
			c.dropBufferedLocked()
			c.mu.Unlock()
			c.fail(errViewsLost)
			err = errViewsLost
		}
		c.endViews()
	}
	c.rxBursts.Add(1)
	return err
}

// endViews ends a burst of views (the caller holds pmu): its views that
// are done with join the held ones' accounting (holdViews), and the
// views that nothing holds any longer are released. The held views are
// copied into the ring and released (spillLocked) when they pin more of
// the endpoint's receive memory than the bound, and once the peer has
// closed: nothing then pumps, and the peer's endpoint, closing, may take
// the session, and with it the views' memory, along.
func (c *Conn) endViews() {
	h := &c.hv
	if h.live.Load() == 0 {
		// Nothing is held (only the pumper holds, and we are it): the
		// burst's views go back at once, without mu, as before views
		// were held.
		if c.vpend > 0 {
			c.vr.ReleaseViews(c.vpend)
		}
		c.vpend, c.vpendB = 0, 0
		return
	}
	c.mu.Lock()
	h.done += c.vpend
	h.doneB += c.vpendB
	h.pinV += c.vpend
	h.pinB += c.vpendB
	c.vpend, c.vpendB = 0, 0
	var rel int
	switch {
	case c.err != nil || c.closed:
		// The endpoint is closed, the views void: drop them unread
		// (Read reports the failure first).
		c.rlen -= c.hlen
		c.hlen = 0
		h.reset()
	case h.n == 0:
		rel = h.done
		h.reset()
	case h.pinV > h.maxV || h.pinB > h.maxB || c.peerClosed:
		rel = c.spillLocked()
		if !h.intact() {
			// The views' memory was reset under them: the ring now
			// holds what may be zeros or another session's bytes.
			c.dropBufferedLocked()
			c.mu.Unlock()
			c.fail(errViewsLost)
			return
		}
	}
	c.mu.Unlock()
	if rel > 0 {
		c.vr.ReleaseViews(rel)
	}
}

// errViewsLost fails a connection whose held views' memory the endpoint
// reset (fabric.ViewRoom.ViewEpoch changed: the link went down and a new
// session began) before the application read them.
var errViewsLost = fmt.Errorf("sock: the link went down under received data not yet read: %w", fabric.ErrPeerGone)

// dropBufferedLocked forgets every buffered byte, held or in the ring,
// and the held views' accounting, when the connection is about to fail
// (its endpoint, closed by fail, takes the views along). The caller holds
// mu.
func (c *Conn) dropBufferedLocked() {
	c.rlen, c.hlen, c.rhead = 0, 0, 0
	c.hv.reset()
	c.hv.freed = 0
}

// pump makes the caller the pumper if nobody is, receiving one burst
// (waiting with ctx), and reports whether it did. The caller then
// re-checks its condition; if it did not pump it waits for a signal.
func (c *Conn) pump(ctx context.Context) bool {
	if !c.pmu.TryLock() {
		return false
	}
	c.pumpLocked(ctx)
	c.pmu.Unlock()
	c.endBurst()
	return true
}

func (c *Conn) endBurst() {
	signal(c.rdReady)
	signal(c.wrReady)
}

// handle processes one received frame. stop reports the end of the
// peer's frames (CLOSE, RST); err a violation, for which the connection
// is failed.
func (c *Conn) handle(b []byte, fl fabric.MsgFlags) (stop bool, err error) {
	c.stats.framesRx.Add(1)
	if fl&(fabric.FlagRemoteWrite|fabric.FlagImm) != 0 {
		return false, c.violation(&ProtocolError{"unexpected RMA notification or immediate data", fabric.ErrMalformed})
	}
	h, p, err := parseFrame(b)
	if err != nil {
		return false, c.violation(err)
	}
	c.mu.Lock()
	if !c.helloRx {
		if h.typ != frameHello {
			c.mu.Unlock()
			return false, c.violation(&ProtocolError{frameNames[h.typ] + " before HELLO", fabric.ErrMalformed})
		}
		_, w, herr := parseHello(p)
		if herr != nil {
			c.mu.Unlock()
			return false, c.violation(herr)
		}
		c.helloRx = true
		c.peerWindow, c.credit = int64(w), int64(w)
		c.mu.Unlock()
		return false, nil
	}
	if h.typ == frameWindow {
		// The window grows, never shrinks, and its growth comes as
		// credit in this frame, checked below.
		w := int64(binary.LittleEndian.Uint32(p))
		if w <= c.peerWindow || w > maxWindow {
			c.mu.Unlock()
			return false, c.violation(&ProtocolError{fmt.Sprintf("window of %d after %d", w, c.peerWindow), fabric.ErrMalformed})
		}
		c.peerWindow = w
	}
	if h.credit > 0 {
		if c.credit+int64(h.credit) > c.peerWindow {
			c.mu.Unlock()
			return false, c.violation(&ProtocolError{fmt.Sprintf("credit grant of %d beyond the window of %d", h.credit, c.peerWindow), fabric.ErrMalformed})
		}
		c.credit += int64(h.credit)
	}
	var verr error
	switch h.typ {
	case frameHello:
		verr = &ProtocolError{"second HELLO", fabric.ErrMalformed}
	case frameData:
		switch {
		case c.eof:
			verr = &ProtocolError{"DATA after FIN", fabric.ErrMalformed}
		case int64(len(p)) > c.rxAllowed:
			verr = &ProtocolError{fmt.Sprintf("%d bytes of DATA with %d bytes of credit", len(p), c.rxAllowed), ErrCreditOverrun}
		default:
			idle := c.rlen == 0
			c.copyInLocked(p)
			c.rxAllowed -= int64(len(p))
			if h.flags&flagStarved != 0 && idle && c.rlen == 0 {
				// The peer ran out of credit while everything it sent
				// went straight into the reading application's slice:
				// the reader waits on the window. (Data buffered means
				// the reader is behind, or reads less than the window
				// at a time: a larger window would only add a copy.)
				c.starved = true
			}
		}
	case frameFin:
		if c.eof {
			verr = &ProtocolError{"second FIN", fabric.ErrMalformed}
		}
		c.eof = true
	case frameClose:
		c.eof, c.peerClosed = true, true
		stop = true
	case frameRst:
		verr = &ProtocolError{"peer reset the connection", ErrReset}
	case framePing:
		c.mu.Unlock()
		c.trySendCtl(framePong)
		return false, nil
	}
	c.mu.Unlock()
	if verr != nil {
		return false, c.violation(verr)
	}
	return stop, nil
}

func (c *Conn) violation(err error) error {
	c.fail(err)
	return err
}

// copyInLocked appends p to the stream: into the slice of the Read
// that pumps (Conn.direct) while nothing is buffered before it; the rest
// stays in its view (holdLocked) while the ring is empty and the bound
// allows, or goes to the receive ring, where credit guarantees room.
func (c *Conn) copyInLocked(p []byte) {
	if c.rlen == 0 && c.directN < len(c.direct) {
		k := copy(c.direct[c.directN:], p)
		c.directN += k
		p = p[k:]
		if len(p) == 0 {
			return
		}
	}
	if c.rlen == c.hlen && c.holdLocked(p) {
		return
	}
	tail := (c.rhead + c.rlen - c.hlen) % len(c.rbuf)
	k := copy(c.rbuf[tail:], p)
	copy(c.rbuf, p[k:])
	c.rlen += len(p)
}

// holdLocked keeps p, the rest of the DATA payload of the view being
// handled, in that view, if the bound allows: it reports whether it did.
// The caller holds pmu (the pumper) and mu, and has checked that the
// ring is empty, so that the held views stay before the ring's bytes.
func (c *Conn) holdLocked(p []byte) bool {
	h := &c.hv
	if h.n == len(h.q) || h.pinV+c.vpend+1 > h.maxV || h.pinB+c.vpendB+c.vcur > h.maxB {
		return false
	}
	h.q[(h.head+h.n)%len(h.q)] = heldView{b: p, pre: h.done + c.vpend, preB: h.doneB + c.vpendB, recB: c.vcur}
	h.n++
	h.live.Store(int32(h.n))
	h.pinV += c.vpend + 1
	h.pinB += c.vpendB + c.vcur
	h.done, h.doneB, c.vpend, c.vpendB = 0, 0, 0, 0
	c.vheld = true
	c.hlen += len(p)
	c.rlen += len(p)
	return true
}

// spillLocked copies the held views' bytes into the ring, before the
// bytes already there (the ring, which holds the window, has room for
// all of rlen), and returns the number of views to release: all that
// the connection has counted. The caller holds pmu and mu.
func (c *Conn) spillLocked() int {
	h := &c.hv
	o := (c.rhead - c.hlen + len(c.rbuf)) % len(c.rbuf)
	c.rhead = o
	for ; h.n > 0; h.n-- {
		b := h.q[h.head].b
		h.q[h.head] = heldView{}
		h.head = (h.head + 1) % len(h.q)
		k := copy(c.rbuf[o:], b)
		copy(c.rbuf, b[k:])
		o = (o + len(b)) % len(c.rbuf)
	}
	c.hlen = 0
	rel := h.pinV
	h.reset()
	return rel
}

// LocalAddr implements net.Conn; it is an *Addr.
func (c *Conn) LocalAddr() net.Addr { return c.laddr }

// RemoteAddr implements net.Conn; it is an *Addr.
func (c *Conn) RemoteAddr() net.Addr { return c.raddr }

// SetDeadline implements net.Conn: it sets both deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetReadDeadline implements net.Conn. Reads blocked when it is called
// observe the new deadline; the zero time clears it.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdl.set(t)
	return nil
}

// SetWriteDeadline implements net.Conn, as SetReadDeadline does for
// writes. A write that times out may have sent part of its data; it
// returns the count.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opErr("set", net.ErrClosed)
	}
	c.wdl.set(t)
	return nil
}

func (c *Conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Endpoint returns the endpoint the connection runs over.
func (c *Conn) Endpoint() fabric.Endpoint { return c.ep }
