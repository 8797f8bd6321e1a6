package ethernet

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/ethernet/xsk"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/cq"
	"github.com/weft-io/weft/internal/spin"
	"golang.org/x/sys/unix"
)

// EndpointConfig configures an Endpoint. The zero value of every field
// but Interface selects its default.
type EndpointConfig struct {
	// Interface is the network interface name.
	Interface string
	// Netns names the network namespace (under /run/netns) the
	// interface is in; the driver opens the endpoint there. Empty: the
	// calling thread's. Dial and Listen themselves ignore it.
	Netns string
	// Queue is the interface queue id (default 0). The XDP program
	// steers the endpoint's frames arriving on this queue to it; a NIC
	// must be configured (RSS, flow steering) to deliver them there.
	Queue int
	// PeerMAC is the peer's MAC address. Nil: the handshake is broadcast
	// and the peer's address learned from its answer.
	PeerMAC net.HardwareAddr
	// ToListener says the peer is a listener (address option
	// "listener=1", which a Listener's Addr carries): the hello is
	// flagged for the peer's listener, so a dialer of the peer's that
	// names this side at the same moment does not take it as a symmetric
	// open. Without it, two endpoints that Open each other pair up, and
	// a listener takes only hellos no dialer of its queue wants.
	ToListener bool
	// EtherType for raw-Ethernet framing (default EtherTypeWeft, 0x88B5).
	EtherType uint16
	// UDP selects UDP/IPv4 framing: PeerIP:PeerPort is the peer,
	// LocalIP:LocalPort this side (LocalIP default: the interface's first
	// IPv4 address; ports default DefaultUDPPort). PeerMAC, if nil, is
	// resolved through the kernel's neighbour table.
	UDP                 bool
	LocalIP, PeerIP     netip.Addr
	LocalPort, PeerPort uint16
	// Attach and Bind select the XDP attach mode and the AF_XDP bind
	// mode (defaults: native then generic; zero-copy where available).
	Attach AttachMode
	Bind   xsk.BindMode
	// BusyPoll configures busy polling of the socket.
	BusyPoll xsk.BusyPoll
	// Window is the number of packets in flight, a power of two (0:
	// 1024).
	Window int
	// MaxMsgSize is the largest message (0: 64 KiB). Messages are cut
	// into MTU-sized packets and reassembled.
	MaxMsgSize int
	// CQSize is the completion queue capacity (0: 4096).
	CQSize int
	// Spin is how long blocking calls busy-poll before they sleep (0:
	// fabric.DefaultSpin, negative: sleep at once).
	Spin time.Duration
	// PeerTimeout is how long the peer may stay silent, or leave data
	// unacknowledged, before it is declared gone (0: 5s).
	PeerTimeout time.Duration
}

// DefaultUDPPort is the UDP port of UDP framing when none is given
// (0x88B5).
const DefaultUDPPort = 34997

const (
	maxSGEs    = 64
	rtoMin     = 4 * time.Millisecond
	rtoMax     = 200 * time.Millisecond
	keepalive  = time.Second // at most; a quarter of PeerTimeout if shorter
	helloEvery = 10 * time.Millisecond
	ctlReserve = 16 // TX frames kept back for acks and control packets
	ackEvery   = 32 // received packets per acknowledgement
)

// Endpoint is a fabric.Endpoint over AF_XDP: a reliable, ordered message
// connection to one peer on the same Ethernet segment.
//
// Reliability: every packet carries a sequence number; the receiver
// acknowledges cumulatively once per receive burst and advertises how
// many packets it can buffer (flow control, so a slow receiver pushes
// back on the sender instead of dropping). Packets that arrive after a
// gap wait in their slot of the receive window; the gap is reported with
// a negative acknowledgement naming the missing run, which the sender
// resends alone (selective repeat). A retransmission timer (4ms doubling
// to 200ms) covers lost acknowledgements and lost tails by resending
// from the oldest unacknowledged packet. Unacknowledged packets stay in their UMEM frames and
// are retransmitted from there without a copy. A peer that stays silent
// for PeerTimeout, or acknowledges nothing for that long, is gone;
// Close sends a FIN, so a peer that closes is seen at once.
//
// Messages up to MaxMsgSize are copied at Send into UMEM frames (so
// Caps.InlineSize is MaxMsgSize: buffers are free when Send returns),
// cut into MTU-sized packets and reassembled in order at the receiver,
// then copied into the Recv SGEs. RMA is not supported.
//
// A background goroutine runs timers, acknowledgements and keepalives,
// and drains acknowledgements while the application is not calling.
type Endpoint struct {
	cfg        EndpointConfig
	m          *mux  // the shared queue
	in         inbox // received frames from the mux
	mem        []byte
	fsize      uint64
	link       LinkInfo
	hdrOff     int // offset of the Weft header in a frame
	maxPayload int
	maxMsg     int
	window     uint32
	dcap       uint32 // deliver queue capacity (frames)
	spin       time.Duration
	cq         *cq.Queue
	dom        fabric.Domain
	ctr        fabric.Counters
	evs        chan fabric.Event
	localMAC   [6]byte
	udpHdr     UDP4
	ctl        [1]txEnt

	// Set for an endpoint a listener created: the listener, when the
	// handshake must be done, and whether the listener heard the outcome.
	lis        *Listener
	hsDeadline int64
	settled    bool

	closed atomic.Bool
	once   sync.Once
	stop   chan struct{}
	done   chan struct{}

	mu          sync.Mutex
	session     uint32 // our connection id
	nonce       uint64 // our handshake nonce
	peerSession uint32
	peerNonce   uint64
	peerMAC     [6]byte
	peerKnown   bool
	up          bool
	gone        error // set when the peer is gone
	now         int64 // monotonic ns of the current call, from clock()
	lastHeard   int64
	lastSent    int64
	nextHello   int64
	hsDrops     uint64 // handshake packets refused (forged, stale, malformed)

	// TX
	txPool       []uint32
	unacked      []txEnt // indexed by psn & (window-1)
	sndUna       uint32  // oldest unacknowledged psn
	sndNxt       uint32  // next psn to assign
	sndNext      uint32  // next psn to transmit
	sndMax       uint32  // highest psn transmitted + 1
	peerLimit    uint32  // the peer takes psns below this
	rto          time.Duration
	rtt          rttEst
	rtoAt        int64
	lastProgress int64
	goBackFor    uint32
	goBackValid  bool

	// RX
	rxPool     []uint32
	fillTarget int
	dq         []rxEnt // deliver queue, indexed by position & (dcap-1)
	dqValid    []bool  // slot holds a packet (in order, or buffered ahead)
	dqHead     uint32
	dqTail     uint32
	dqMsgs     int // complete messages in dq
	rcvNxt     uint32
	advLimit   uint32 // the last limit advertised to the peer
	ackPending int
	nakFor     uint32
	nakValid   bool
	dropEvery  int // tests: discard every n-th data packet received
	dropCount  int
}

type rxEnt struct {
	addr  uint64 // of the payload
	len   uint32
	flags uint8
	imm   uint32
}

var _ fabric.Endpoint = (*Endpoint)(nil)

var epoch = time.Now()

func pow2(n int) bool { return n > 0 && n&(n-1) == 0 }

func clock() int64 { return int64(time.Since(epoch)) }

func (e *Endpoint) opErr(op string, err error) error {
	return &fabric.OpError{Op: op, Backend: "ethernet", Addr: e.cfg.Interface, Err: err}
}

// Dial opens an endpoint on cfg.Interface (in the calling thread's
// network namespace) and performs the handshake with the peer, a
// listener or another Dial; it blocks until the connection is up or ctx
// is done. Endpoints of one process on the same interface queue share
// one AF_XDP socket (see the package documentation).
func Dial(ctx context.Context, cfg EndpointConfig) (*Endpoint, error) {
	e, err := newEndpoint(cfg, nil)
	if err != nil {
		return nil, err
	}
	if err := e.handshake(ctx); err != nil {
		close(e.done) // no background goroutine to wait for
		e.Close()
		return nil, e.opErr("open", err)
	}
	go e.run()
	return e, nil
}

// prepare validates c, fills its defaults and returns the link and the
// frame size of the interface.
func prepare(c *EndpointConfig, listen bool) (LinkInfo, int, error) {
	oerr := func(err error) error {
		return &fabric.OpError{Op: "open", Backend: "ethernet", Addr: c.Interface, Err: err}
	}
	li, err := LinkByName(c.Interface)
	if err != nil {
		return li, 0, err
	}
	if c.EtherType == 0 {
		c.EtherType = EtherTypeWeft
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if !pow2(c.Window) || c.Window < 16 || c.Window > 1<<14 {
		return li, 0, oerr(fmt.Errorf("window %d: need a power of two in [16, 16384]: %w", c.Window, fabric.ErrInvalid))
	}
	if c.MaxMsgSize == 0 {
		c.MaxMsgSize = 64 << 10
	}
	if c.PeerTimeout == 0 {
		c.PeerTimeout = 5 * time.Second
	}
	if c.PeerMAC != nil && len(c.PeerMAC) != 6 {
		return li, 0, oerr(fmt.Errorf("peer MAC %v: %w", c.PeerMAC, fabric.ErrInvalid))
	}
	switch {
	case c.UDP && listen:
		if c.LocalPort == 0 {
			c.LocalPort = DefaultUDPPort
		}
		if err := localIPv4(c, li); err != nil {
			return li, 0, oerr(err)
		}
	case c.UDP:
		if err := resolveUDP(c, li); err != nil {
			return li, 0, oerr(err)
		}
	}
	frameSize := 2048
	if mtu := max(li.MTU, 0); mtu+EthHdrLen > frameSize-unix.XDP_PACKET_HEADROOM {
		frameSize = 4096
	}
	return li, frameSize, nil
}

// DefaultWindow is the number of packets in flight per connection when
// EndpointConfig.Window is zero.
const DefaultWindow = 256

// newEndpoint builds an endpoint on its interface's shared queue: a
// dialer (lis nil), or a connection accepted by lis on lis's queue.
func newEndpoint(c EndpointConfig, lis *Listener) (*Endpoint, error) {
	var (
		li        LinkInfo
		frameSize int
		m         *mux
		err       error
	)
	if lis == nil {
		if li, frameSize, err = prepare(&c, false); err != nil {
			return nil, err
		}
		if m, err = acquireMux(li, &c, frameSize); err != nil {
			return nil, err
		}
	} else {
		m = lis.m
		li, frameSize = m.link, int(m.fsize)
		m.ref()
	}
	e, err := buildEndpoint(c, li, m, frameSize)
	if err != nil {
		m.release()
		return nil, err
	}
	e.lis = lis
	if !m.attach(e, lis == nil && !c.ToListener) {
		m.release()
		return nil, e.opErr("open", fmt.Errorf("connection id %#x taken: %w", e.session, fabric.ErrInvalid))
	}
	return e, nil
}

func buildEndpoint(c EndpointConfig, li LinkInfo, m *mux, frameSize int) (*Endpoint, error) {
	oerr := func(err error) error {
		return &fabric.OpError{Op: "open", Backend: "ethernet", Addr: c.Interface, Err: err}
	}
	e := &Endpoint{cfg: c, link: li, m: m, window: uint32(c.Window), dcap: uint32(c.Window),
		spin: (&fabric.Options{Spin: c.Spin}).SpinBudget(), evs: make(chan fabric.Event, 64),
		stop: make(chan struct{}), done: make(chan struct{}), rto: rtoMin}
	copy(e.localMAC[:], li.MAC)
	e.hdrOff = EthHdrLen
	if c.UDP {
		e.hdrOff = UDP4HdrLen
		e.udpHdr = UDP4{SrcMAC: li.MAC, DstMAC: c.PeerMAC, SrcIP: c.LocalIP, DstIP: c.PeerIP,
			SrcPort: c.LocalPort, DstPort: c.PeerPort}
	}
	if c.PeerMAC != nil {
		copy(e.peerMAC[:], c.PeerMAC)
		e.peerKnown = true
	}
	mtu := li.MTU
	if mtu <= 0 {
		mtu = 1500
	}
	if mtu+EthHdrLen > frameSize-unix.XDP_PACKET_HEADROOM {
		mtu = frameSize - unix.XDP_PACKET_HEADROOM - EthHdrLen
	}
	e.maxPayload = mtu + EthHdrLen - e.hdrOff - hdrLen
	maxFrags := c.Window / 2
	if lim := maxFrags * e.maxPayload; c.MaxMsgSize > lim {
		return nil, oerr(fmt.Errorf("max message %d over %d (window/2 packets of %d bytes): %w", c.MaxMsgSize, lim, e.maxPayload, fabric.ErrInvalid))
	}
	e.maxMsg = c.MaxMsgSize
	e.cq = cq.New(c.CQSize, e.spin)
	e.dom.Name, e.dom.HostMemory = "ethernet "+c.Interface, true

	// Private frames: TX the window plus control packets; RX the
	// deliver queue plus as many again posted to the inbox.
	txFrames := c.Window + ctlReserve
	rxFrames := 2 * c.Window
	n := txFrames + rxFrames
	e.fsize = uint64(frameSize)
	e.mem = make([]byte, n*frameSize)
	e.in.init(e.mem, e.fsize, rxFrames)
	e.unacked = make([]txEnt, c.Window)
	e.dq = make([]rxEnt, e.dcap)
	e.dqValid = make([]bool, e.dcap)
	e.txPool = make([]uint32, 0, txFrames)
	for i := txFrames - 1; i >= 0; i-- {
		e.txPool = append(e.txPool, uint32(i))
	}
	e.rxPool = make([]uint32, 0, rxFrames)
	for i := n - 1; i >= txFrames; i-- {
		e.rxPool = append(e.rxPool, uint32(i))
	}
	e.fillTarget = rxFrames - int(e.dcap)
	e.session = m.newConnID()
	var nb [8]byte
	for e.nonce == 0 {
		rand.Read(nb[:])
		e.nonce = binary.BigEndian.Uint64(nb[:])
	}
	e.mu.Lock()
	e.now = clock()
	e.lastHeard, e.lastProgress = e.now, e.now
	e.refillLocked()
	e.mu.Unlock()
	return e, nil
}

// resolveUDP fills the defaults of UDP framing: ports, the local
// address, the peer's MAC.
func resolveUDP(c *EndpointConfig, li LinkInfo) error {
	if !c.PeerIP.Is4() {
		return fmt.Errorf("UDP framing needs an IPv4 peer address, have %v: %w", c.PeerIP, fabric.ErrInvalid)
	}
	if c.PeerPort == 0 {
		c.PeerPort = DefaultUDPPort
	}
	if c.LocalPort == 0 {
		c.LocalPort = DefaultUDPPort
	}
	if err := localIPv4(c, li); err != nil {
		return err
	}
	if c.PeerMAC == nil {
		mac, err := ResolveMAC(li.Index, c.PeerIP, 2*time.Second)
		if err != nil {
			return err
		}
		c.PeerMAC = mac
	}
	return nil
}

// localIPv4 sets c.LocalIP to the interface's first IPv4 address if it
// is not set.
func localIPv4(c *EndpointConfig, li LinkInfo) error {
	if c.LocalIP.IsValid() {
		return nil
	}
	addrs, err := Addrs(li.Index)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if a.Addr().Is4() {
			c.LocalIP = a.Addr()
			return nil
		}
	}
	return fmt.Errorf("%s has no IPv4 address; give local=: %w", li.Name, fabric.ErrInvalid)
}

func (e *Endpoint) emit(ev fabric.Event) {
	select {
	case e.evs <- ev:
	default:
		e.ctr.Drop(fabric.DropEvent, 1)
	}
}

// handshake exchanges hello packets until both sides know each other's
// connection id and nonce.
func (e *Endpoint) handshake(ctx context.Context) error {
	for {
		e.mu.Lock()
		e.now = clock()
		e.pollLocked(256)
		if e.up {
			e.mu.Unlock()
			return nil
		}
		if e.gone != nil {
			err := e.gone
			e.mu.Unlock()
			return err
		}
		if e.now >= e.nextHello {
			e.sendHelloLocked(ptHello)
			e.nextHello = e.now + int64(helloEvery)
		}
		e.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("waiting for the peer: %w", err)
		}
		e.sleep(time.Millisecond)
	}
}

// sleep waits up to d for the shared queue to hand this endpoint a
// frame.
func (e *Endpoint) sleep(d time.Duration) { e.in.sleep(d) }

// run is the background goroutine: timers, acknowledgements, keepalives,
// and for a connection a listener accepts, the end of its handshake.
func (e *Endpoint) run() {
	defer close(e.done)
	t := time.NewTimer(time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		busy := e.tick()
		if e.lis != nil && !e.settled {
			e.settle()
		}
		d := 20 * time.Millisecond
		if busy {
			d = time.Millisecond
		}
		t.Reset(d)
	}
}

// settle hands a listener's connection to the accept queue once its
// handshake is done, or gives it up when the handshake failed or ran out
// of time.
func (e *Endpoint) settle() {
	e.mu.Lock()
	up, gone, late := e.up, e.gone, e.now > e.hsDeadline
	e.mu.Unlock()
	switch {
	case up && gone == nil:
		e.settled = true
		go e.lis.established(e)
	case gone != nil || late:
		e.settled = true
		go e.lis.abandon(e)
	}
}

// tick runs the timers once and reports whether work is outstanding.
func (e *Endpoint) tick() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return false
	}
	e.now = clock()
	// The peer's frames are all read when the inbox emptied within the
	// budget and the shared ring was drained since: only then does a
	// quiet peer count as silent (see mux.drained).
	read := e.pollLocked(256) < 256
	if e.gone != nil {
		return false
	}
	if !e.up {
		if e.now >= e.nextHello {
			e.sendHelloLocked(ptHello)
			e.nextHello = e.now + int64(helloEvery)
		}
		return true
	}
	if e.sndUna != e.sndNxt {
		if e.now-e.lastProgress > int64(e.cfg.PeerTimeout) && read && e.m.drained.Load() > e.lastProgress+int64(e.cfg.PeerTimeout) {
			e.failLocked(fmt.Errorf("no acknowledgement for %v: %w", e.cfg.PeerTimeout, fabric.ErrRetryExceeded))
			return false
		}
		if e.rtoAt != 0 && e.now >= e.rtoAt {
			// Go back to the oldest unacknowledged packet; resend it even
			// into a closed window, as a probe for a lost window update.
			e.sndNext = e.sndUna
			e.goBackValid = false
			e.rtt.retransmitted()
			e.rto = min(2*e.rto, rtoMax)
			e.rtoAt = e.now + int64(e.rto)
			e.pumpLocked(true)
		}
	}
	e.pumpLocked(false)
	if e.ackPending > 0 {
		e.sendCtlLocked(ptAck, 0)
	}
	if e.now-e.lastSent > int64(min(keepalive, e.cfg.PeerTimeout/4)) {
		e.sendCtlLocked(ptAck, 0)
	}
	if e.now-e.lastHeard > int64(e.cfg.PeerTimeout) && read && e.m.drained.Load() > e.lastHeard+int64(e.cfg.PeerTimeout) {
		e.failLocked(fmt.Errorf("peer silent for %v: %w", e.cfg.PeerTimeout, fabric.ErrPeerGone))
		return false
	}
	return e.sndUna != e.sndNxt || e.ackPending > 0
}

// failLocked marks the peer gone.
func (e *Endpoint) failLocked(err error) {
	if e.gone != nil {
		return
	}
	if !errors.Is(err, fabric.ErrPeerGone) && !errors.Is(err, fabric.ErrRefused) {
		err = fmt.Errorf("%w: %w", fabric.ErrPeerGone, err)
	}
	e.gone = err
	e.emit(fabric.Event{Kind: fabric.EventPeerGone, Time: time.Now(), Err: err})
}

func (e *Endpoint) frame(i uint32) []byte {
	a := uint64(i) * e.fsize
	return e.mem[a : a+e.fsize : a+e.fsize]
}

// credits returns how many more packets the deliver queue takes.
func (e *Endpoint) credits() uint32 { return e.dcap - (e.dqTail - e.dqHead) }

// writeL2 writes the link (and IP/UDP) headers for a Weft packet of n
// bytes (header included) and returns the frame length.
func (e *Endpoint) writeL2(b []byte, n int) int {
	if e.cfg.UDP {
		PutUDP4(b, &e.udpHdr, n)
		return UDP4HdrLen + n
	}
	copy(b[0:6], e.peerMAC[:])
	if !e.peerKnown {
		copy(b[0:6], broadcast[:])
	}
	copy(b[6:12], e.localMAC[:])
	binary.BigEndian.PutUint16(b[12:], e.cfg.EtherType)
	return EthHdrLen + n
}

var broadcast = [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// sendNakLocked sends a negative acknowledgement: the packets from
// rcvNxt on, gap of them, are missing.
func (e *Endpoint) sendNakLocked(gap uint32) bool {
	return e.sendCtlImmLocked(ptAck, pfNak, gap)
}

// sendCtlLocked sends a control packet (ack, hello, hello-ack, fin) with
// the current acknowledgement state.
func (e *Endpoint) sendCtlLocked(typ, flags uint8) bool {
	return e.sendCtlImmLocked(typ, flags, 0)
}

func (e *Endpoint) sendCtlImmLocked(typ, flags uint8, imm uint32) bool {
	return e.sendCtlBodyLocked(typ, flags, imm, 0)
}

// sendHelloLocked sends a hello or hello-ack: our connection id and
// nonce, and the peer's nonce as we know it.
func (e *Endpoint) sendHelloLocked(typ uint8) bool {
	var flags uint8
	if typ == ptHello && e.cfg.ToListener {
		flags = pfListener
	}
	return e.sendCtlBodyLocked(typ, flags, 0, helloLen)
}

func (e *Endpoint) sendCtlBodyLocked(typ, flags uint8, imm uint32, body int) bool {
	if len(e.txPool) == 0 {
		return false
	}
	f := e.txPool[len(e.txPool)-1]
	b := e.frame(f)
	cr := e.credits()
	putHdr(b[e.hdrOff:], &hdr{typ: typ, flags: flags, session: e.session, ack: e.rcvNxt, wnd: cr, imm: imm, dst: e.peerSession})
	if body > 0 {
		putHello(b[e.hdrOff+hdrLen:], e.nonce, e.peerNonce)
	}
	e.ctl[0] = txEnt{frame: f, len: uint32(e.writeL2(b, hdrLen+body))}
	if e.m.transmit(e.mem, e.fsize, e.ctl[:]) == 0 {
		return false
	}
	e.advLimit = e.rcvNxt + cr
	e.ackPending = 0
	e.lastSent = e.now
	return true
}

// refillLocked posts frames of the RX pool to the inbox.
func (e *Endpoint) refillLocked() {
	want := e.fillTarget - e.in.free.len()
	for ; want > 0 && len(e.rxPool) > 0; want-- {
		top := len(e.rxPool) - 1
		if !e.in.free.push(uint64(e.rxPool[top])) {
			return
		}
		e.rxPool = e.rxPool[:top]
	}
}

// pollLocked processes up to budget received frames: acknowledgements
// update the sender, data in sequence goes to the deliver queue.
func (e *Endpoint) pollLocked(budget int) int {
	e.m.poll()
	var pkts, bytes uint64
	n := 0
	for ; n < budget; n++ {
		v, ok := e.in.ready.pop()
		if !ok {
			break
		}
		f, l := uint32(v>>32), uint32(v)
		if !e.handleLocked(uint64(f)*e.fsize, l) {
			e.rxPool = append(e.rxPool, f)
		}
		pkts++
		bytes += uint64(l)
	}
	if n == 0 {
		return 0
	}
	e.refillLocked()
	e.ctr.RxPackets.Add(pkts)
	e.ctr.RxBytes.Add(bytes)
	// Acknowledge every ackEvery packets; smaller remainders ride on
	// our next data packet or go out with the next tick (1ms), well
	// within the sender's retransmission timer.
	if e.ackPending >= ackEvery && e.up {
		e.sendCtlLocked(ptAck, 0)
	}
	return n
}

// handleLocked processes one received frame and reports whether the
// frame was kept (in the deliver queue).
func (e *Endpoint) handleLocked(addr uint64, n uint32) bool {
	b := e.mem[addr : addr+uint64(n)]
	off := e.parseL2(b)
	if off < 0 {
		e.ctr.Drop(fabric.DropOther, 1)
		return false
	}
	var h hdr
	if !getHdr(b[off:], &h) {
		e.ctr.Drop(fabric.DropMalformed, 1)
		return false
	}
	if h.typ == ptHello || h.typ == ptHelloAck || h.typ == ptRefuse {
		e.helloLocked(b, off)
		return false
	}
	if e.peerSession == 0 || h.session != e.peerSession {
		e.ctr.Drop(fabric.DropOther, 1)
		return false
	}
	e.lastHeard = e.now
	e.ackLocked(h.ack, h.wnd, h.flags&pfNak != 0, h.imm)
	switch h.typ {
	case ptData:
		if e.dropEvery > 0 {
			if e.dropCount++; e.dropCount%e.dropEvery == 0 {
				return false
			}
		}
		return e.dataLocked(&h, addr, off, n)
	case ptFin:
		// A FIN with our session means the peer had the connection up.
		e.up = true
		e.failLocked(errors.New("peer closed"))
	}
	return false
}

// helloLocked processes a handshake packet. Hellos and hello-acks
// teach us the peer's connection id and nonce; a hello-ack that echoes
// our nonce completes our side; a refusal that echoes our nonce ends the
// dial with fabric.ErrRefused. Anything forged, stale or malformed is
// dropped and counted (DropMalformed).
func (e *Endpoint) helloLocked(b []byte, off int) {
	var m handshakeMsg
	if err := parseHandshake(b[off:], &m); err != nil {
		e.refuseHelloLocked()
		return
	}
	if m.echo != 0 && m.echo != e.nonce {
		e.refuseHelloLocked() // forged, or from an earlier dial
		return
	}
	if m.typ == ptRefuse {
		if e.up || m.dst != e.session {
			e.refuseHelloLocked()
			return
		}
		e.failLocked(&RefusedError{Addr: net.HardwareAddr(b[6:12:12]).String()})
		return
	}
	if e.peerSession == 0 {
		e.peerSession, e.peerNonce = m.session, m.nonce
		if !e.peerKnown {
			copy(e.peerMAC[:], b[6:12])
			e.peerKnown = true
		}
		e.m.bound(e)
	} else if m.session != e.peerSession || m.nonce != e.peerNonce {
		// Another incarnation of the peer, or a forgery: not ours.
		e.refuseHelloLocked()
		return
	}
	e.lastHeard = e.now
	e.ackLocked(m.ack, m.wnd, false, 0)
	if m.typ == ptHelloAck {
		if !e.up {
			e.lastProgress = e.now
		}
		e.up = true
	} else {
		e.sendHelloLocked(ptHelloAck)
	}
}

func (e *Endpoint) refuseHelloLocked() {
	e.hsDrops++
	e.ctr.Drop(fabric.DropMalformed, 1)
}

// dataLocked files a data packet in its deliver-queue slot: in order, it
// extends the in-order run (and the run of packets buffered after it);
// ahead of a gap, it waits in its slot and the gap is reported with a
// negative acknowledgement so the sender resends just the missing
// packets (selective repeat). It reports whether the frame was kept.
func (e *Endpoint) dataLocked(h *hdr, addr uint64, off int, n uint32) bool {
	d := h.psn - e.rcvNxt
	if int32(d) < 0 {
		e.ctr.Drop(fabric.DropDuplicate, 1)
		e.ackPending++
		return false
	}
	used := e.dqTail - e.dqHead
	if d >= e.dcap-used {
		e.ctr.Drop(fabric.DropNoBuffer, 1)
		e.ackPending++
		return false
	}
	mask := e.dcap - 1
	slot := (e.dqTail + d) & mask
	if e.dqValid[slot] {
		e.ctr.Drop(fabric.DropDuplicate, 1)
		return false
	}
	plen := int(n) - off - hdrLen
	e.dq[slot] = rxEnt{addr: addr + uint64(off+hdrLen), len: uint32(plen), flags: h.flags, imm: h.imm}
	e.dqValid[slot] = true
	if d != 0 {
		if !e.nakValid || e.nakFor != e.rcvNxt {
			// The gap runs from rcvNxt to the first buffered packet.
			gap := uint32(1)
			for gap < d && !e.dqValid[(e.dqTail+gap)&mask] {
				gap++
			}
			e.nakValid, e.nakFor = true, e.rcvNxt
			e.sendNakLocked(gap)
		}
		return true
	}
	for e.dqTail-e.dqHead < e.dcap && e.dqValid[e.dqTail&mask] {
		if e.dq[e.dqTail&mask].flags&pfLast != 0 {
			e.dqMsgs++
		}
		e.dqTail++
		e.rcvNxt++
		e.ackPending++
	}
	e.nakValid = false
	return true
}

// parseL2 checks the link (and IP/UDP) headers of a received frame and
// returns the offset of the Weft header, or -1.
func (e *Endpoint) parseL2(b []byte) int {
	if len(b) < EthHdrLen+hdrLen {
		return -1
	}
	if e.peerKnown && [6]byte(b[6:12]) != e.peerMAC {
		return -1
	}
	if dst := [6]byte(b[0:6]); dst != e.localMAC && dst != broadcast {
		return -1
	}
	et := binary.BigEndian.Uint16(b[12:])
	if !e.cfg.UDP {
		if et != e.cfg.EtherType {
			return -1
		}
		return EthHdrLen
	}
	if et != EtherTypeIPv4 || len(b) < UDP4HdrLen+hdrLen {
		return -1
	}
	ip := b[EthHdrLen:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[0]>>4 != 4 || ihl < IPv4HdrLen || ip[9] != 17 || binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
		return -1
	}
	src := e.cfg.PeerIP.As4()
	if [4]byte(ip[12:16]) != src {
		return -1
	}
	off := EthHdrLen + ihl
	if len(b) < off+UDPHdrLen+hdrLen {
		return -1
	}
	u := b[off:]
	if binary.BigEndian.Uint16(u[2:]) != e.cfg.LocalPort || binary.BigEndian.Uint16(u[0:]) != e.cfg.PeerPort {
		return -1
	}
	return off + UDPHdrLen
}

// ackLocked applies a cumulative acknowledgement and window; a negative
// acknowledgement also resends the gap packets it names.
func (e *Endpoint) ackLocked(ack, wnd uint32, nak bool, gap uint32) {
	if seqLT(e.sndUna, ack) && !seqLT(e.sndNxt, ack) {
		for p := e.sndUna; p != ack; p++ {
			e.txPool = append(e.txPool, e.unacked[p&(e.window-1)].frame)
		}
		e.sndUna = ack
		if seqLT(e.sndNext, ack) {
			e.sndNext = ack
		}
		e.lastProgress = e.now
		e.rtt.acked(ack, e.now)
		e.rto = e.rtt.rto()
		e.rtoAt = 0
		if e.sndUna != e.sndNxt {
			e.rtoAt = e.now + int64(e.rto)
		}
	}
	if lim := ack + wnd; !seqLT(lim, e.peerLimit) || seqLT(e.sndNxt, e.peerLimit) {
		e.peerLimit = lim
	}
	if nak && ack == e.sndUna && seqLT(ack, e.sndNext) && (!e.goBackValid || e.goBackFor != ack) {
		e.goBackValid, e.goBackFor = true, ack
		e.resendLocked(ack, min(max(gap, 1), e.sndNext-ack))
	}
}

// transmitLocked hands packets psn..psn+n-1 to the shared queue and
// returns how many it took.
func (e *Endpoint) transmitLocked(psn, n uint32) uint32 {
	var sent uint32
	for sent < n {
		i := (psn + sent) & (e.window - 1)
		k := min(n-sent, e.window-i)
		got := uint32(e.m.transmit(e.mem, e.fsize, e.unacked[i:i+k]))
		sent += got
		if got < k {
			break
		}
	}
	return sent
}

// resendLocked retransmits n packets from psn, as the TX ring allows.
func (e *Endpoint) resendLocked(psn, n uint32) {
	e.rtt.retransmitted()
	if got := e.transmitLocked(psn, n); got > 0 {
		e.ctr.Retransmits.Add(uint64(got))
		e.ctr.TxPackets.Add(uint64(got))
		e.lastSent = e.now
	}
}

// pumpLocked transmits packets from sndNext within the peer's window
// (one past it with probe) as the TX ring allows.
func (e *Endpoint) pumpLocked(probe bool) {
	if e.sndNext == e.sndNxt {
		return
	}
	lim := e.peerLimit
	if probe && !seqLT(e.sndNext, lim) {
		lim = e.sndNext + 1
	}
	if !seqLT(e.sndNext, lim) {
		return
	}
	k := min(e.sndNxt-e.sndNext, lim-e.sndNext)
	got := e.transmitLocked(e.sndNext, k)
	if got == 0 {
		return
	}
	var retx uint64
	if seqLT(e.sndNext, e.sndMax) {
		retx = uint64(min(got, e.sndMax-e.sndNext))
	}
	e.sndNext += got
	if seqLT(e.sndMax, e.sndNext) {
		e.sndMax = e.sndNext
		e.rtt.sent(e.sndMax-1, e.now)
	}
	if e.rtoAt == 0 {
		e.rtoAt = e.now + int64(e.rto)
	}
	e.lastSent = e.now
	if retx > 0 {
		e.ctr.Retransmits.Add(retx)
	}
	e.ctr.TxPackets.Add(uint64(got))
}

func (e *Endpoint) errClosed(op string) error { return e.opErr(op, fabric.ErrClosed) }

// Send implements fabric.Endpoint. Each message is copied into UMEM
// frames (one per MTU-sized fragment) before Send returns; it is then
// the transport's to deliver. n < len(msgs) is backpressure: the window
// of unacknowledged packets or the frame pool is full.
func (e *Endpoint) Send(msgs []fabric.Message) (int, error) {
	if e.closed.Load() {
		return 0, e.errClosed("send")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return 0, e.errClosed("send")
	}
	if e.gone != nil {
		return 0, e.opErr("send", e.gone)
	}
	e.now = clock()
	n := 0
	var bytes uint64
	var err error
	polled := false
	for n < len(msgs) {
		m := &msgs[n]
		if len(m.SGEs) > maxSGEs {
			err = e.opErr("send", fabric.ErrMessageSize)
			break
		}
		size, cerr := fabric.CheckSGEs(m.SGEs, &e.dom, 0)
		if cerr != nil {
			err = e.opErr("send", cerr)
			break
		}
		if size > e.maxMsg {
			err = e.opErr("send", fabric.ErrMessageSize)
			break
		}
		frags := 1
		if size > e.maxPayload {
			frags = (size + e.maxPayload - 1) / e.maxPayload
		}
		if int(e.sndNxt-e.sndUna)+frags > int(e.window) || len(e.txPool) < frags+ctlReserve {
			if polled {
				break
			}
			// Take in acknowledgements and completions, then retry once.
			polled = true
			e.pollLocked(256)
			continue
		}
		if m.Flags&fabric.FlagSignal != 0 && e.cq.Free() == 0 {
			break
		}
		if e.sndUna == e.sndNxt {
			// Nothing was outstanding: the acknowledgement clock starts
			// now, not when the connection last made progress.
			e.lastProgress = e.now
		}
		off := 0
		for i := 0; i < frags; i++ {
			f := e.txPool[len(e.txPool)-1]
			e.txPool = e.txPool[:len(e.txPool)-1]
			b := e.frame(f)
			plen := min(e.maxPayload, size-off)
			h := hdr{typ: ptData, session: e.session, psn: e.sndNxt, ack: e.rcvNxt, wnd: e.credits(), dst: e.peerSession}
			if i == 0 {
				h.flags |= pfFirst
				if m.Flags&fabric.FlagImm != 0 {
					h.flags |= pfImm
					h.imm = m.Imm
				}
			}
			if i == frags-1 {
				h.flags |= pfLast
			}
			putHdr(b[e.hdrOff:], &h)
			gatherAt(b[e.hdrOff+hdrLen:e.hdrOff+hdrLen+plen], m.SGEs, off)
			fl := e.writeL2(b, hdrLen+plen)
			e.unacked[e.sndNxt&(e.window-1)] = txEnt{frame: f, len: uint32(fl)}
			e.sndNxt++
			off += plen
		}
		if m.Flags&fabric.FlagSignal != 0 {
			e.cq.Push(fabric.Completion{Context: m.Context, Op: fabric.OpSend, Len: size})
		}
		bytes += uint64(size)
		n++
	}
	e.pumpLocked(false)
	if n > 0 {
		if e.sndNext == e.sndNxt {
			// What we just sent carried the current acknowledgement.
			e.ackPending = 0
			e.advLimit = e.rcvNxt + e.credits()
		}
		e.ctr.TxMessages.Add(uint64(n))
		e.ctr.TxBytes.Add(bytes)
	}
	return n, err
}

// gatherAt copies len(dst) bytes from offset off of the SGE list.
func gatherAt(dst []byte, sges []fabric.SGE, off int) {
	for i := range sges {
		if len(dst) == 0 {
			return
		}
		s := &sges[i]
		if off >= s.Length {
			off -= s.Length
			continue
		}
		src := s.Region.Bytes()[s.Offset+off : s.Offset+s.Length]
		c := copy(dst, src)
		dst = dst[c:]
		off = 0
	}
}

// scatterAt copies src to offset off of the SGE list and returns how
// many bytes fit.
func scatterAt(sges []fabric.SGE, off int, src []byte) int {
	n := 0
	for i := range sges {
		if len(src) == 0 {
			break
		}
		s := &sges[i]
		if off >= s.Length {
			off -= s.Length
			continue
		}
		c := copy(s.Region.Bytes()[s.Offset+off:s.Offset+s.Length], src)
		src = src[c:]
		n += c
		off = 0
	}
	return n
}

// Recv implements fabric.Endpoint: it delivers complete messages in
// order, reassembling fragments into the message's SGEs.
func (e *Endpoint) Recv(msgs []fabric.Message) (int, error) {
	if e.closed.Load() {
		return 0, e.errClosed("recv")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return 0, e.errClosed("recv")
	}
	e.now = clock()
	if e.dqMsgs < len(msgs) {
		e.pollLocked(256)
	}
	n := 0
	var bytes uint64
	var err error
	for n < len(msgs) && e.dqMsgs > 0 {
		m := &msgs[n]
		capacity, cerr := fabric.CheckSGEs(m.SGEs, &e.dom, fabric.AccessLocalWrite)
		if cerr != nil {
			err = e.opErr("recv", cerr)
			break
		}
		first := &e.dq[e.dqHead&(e.dcap-1)]
		m.Flags, m.Imm = 0, 0
		if first.flags&pfImm != 0 {
			m.Flags, m.Imm = fabric.FlagImm, first.imm
		}
		total := 0
		for {
			ent := &e.dq[e.dqHead&(e.dcap-1)]
			e.dqValid[e.dqHead&(e.dcap-1)] = false
			if total < capacity {
				scatterAt(m.SGEs, total, e.mem[ent.addr:ent.addr+uint64(ent.len)])
			}
			total += int(ent.len)
			e.rxPool = append(e.rxPool, uint32(ent.addr/e.fsize))
			e.dqHead++
			if ent.flags&pfLast != 0 {
				break
			}
		}
		m.Len = min(total, capacity)
		if total > capacity {
			m.Flags |= fabric.FlagTruncated
			e.ctr.Drop(fabric.DropTruncated, 1)
		}
		e.dqMsgs--
		bytes += uint64(total)
		n++
	}
	if n > 0 {
		e.refillLocked()
		e.ctr.RxMessages.Add(uint64(n))
		// Window update when the advertised window ran low.
		if e.up && e.advLimit-e.rcvNxt < e.dcap/2 && e.credits() >= e.dcap/2 {
			e.sendCtlLocked(ptAck, 0)
		}
	} else if err == nil && e.gone != nil && e.dqMsgs == 0 {
		err = e.opErr("recv", e.gone)
	}
	_ = bytes
	return n, err
}

// RecvWait implements fabric.Endpoint: Recv, busy-polling for the spin
// budget, then sleeping in poll(2) on the socket.
func (e *Endpoint) RecvWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	return e.wait(ctx, msgs, e.Recv, "recv")
}

// SendWait implements fabric.Endpoint: Send, waiting while the window or
// the TX ring is full.
func (e *Endpoint) SendWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	return e.wait(ctx, msgs, e.Send, "send")
}

func (e *Endpoint) wait(ctx context.Context, msgs []fabric.Message, op func([]fabric.Message) (int, error), name string) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	for s := spin.Start(e.spin); s.Next(ctx); {
		n, err := op(msgs)
		if n > 0 || err != nil {
			return n, err
		}
	}
	for {
		n, err := op(msgs)
		if n > 0 || err != nil {
			return n, err
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		e.sleep(time.Millisecond)
		e.ctr.Wakeups.Add(1)
	}
}

// Write implements fabric.Endpoint: RMA is not supported over AF_XDP.
func (e *Endpoint) Write(msgs []fabric.Message) (int, error) {
	if e.closed.Load() {
		return 0, e.errClosed("write")
	}
	return 0, e.opErr("write", fabric.ErrNotSupported)
}

// Read implements fabric.Endpoint: RMA is not supported over AF_XDP.
func (e *Endpoint) Read(msgs []fabric.Message) (int, error) {
	if e.closed.Load() {
		return 0, e.errClosed("read")
	}
	return 0, e.opErr("read", fabric.ErrNotSupported)
}

// Register implements fabric.Endpoint. Any memory can be a local
// source or target, since messages are copied through the UMEM; remote
// access is refused with fabric.ErrNotSupported.
func (e *Endpoint) Register(buf []byte, access fabric.Access) (*fabric.Region, error) {
	if e.closed.Load() {
		return nil, e.errClosed("register")
	}
	if access&fabric.AccessRemote != 0 {
		return nil, e.opErr("register", fmt.Errorf("remote access %v: %w", access, fabric.ErrNotSupported))
	}
	return fabric.NewRegion(fabric.RegionConfig{Buf: buf, Access: access, LocalKey: 1, Domain: &e.dom}), nil
}

// Alloc implements fabric.Endpoint: it allocates memory for local use
// (remote access is refused, as for Register).
func (e *Endpoint) Alloc(size int, access fabric.Access) (*fabric.Region, error) {
	if e.closed.Load() {
		return nil, e.errClosed("alloc")
	}
	if size <= 0 {
		return nil, e.opErr("alloc", fmt.Errorf("size %d: %w", size, fabric.ErrInvalid))
	}
	return e.Register(make([]byte, size), access)
}

// CQ implements fabric.Endpoint.
func (e *Endpoint) CQ() fabric.CompletionQueue { return e.cq }

// Caps implements fabric.Endpoint.
func (e *Endpoint) Caps() fabric.Caps {
	return fabric.Caps{Backend: "ethernet", MaxMsgSize: e.maxMsg, MaxSGEs: maxSGEs,
		MTU: e.maxPayload, InlineSize: e.maxMsg, RMA: false, Reliable: true}
}

// Stats implements fabric.Endpoint.
func (e *Endpoint) Stats() fabric.Stats {
	s := e.ctr.Snapshot()
	s.Drops[fabric.DropNoBuffer] += e.cq.Overruns.Load()
	s.Doorbells = e.m.s.Kicks.Load()
	return s
}

// Events implements fabric.Endpoint: link up/down from rtnetlink, and
// peer-gone.
func (e *Endpoint) Events() <-chan fabric.Event { return e.evs }

// LocalAddr implements fabric.Endpoint: the interface, and with UDP
// framing the local IP and port.
func (e *Endpoint) LocalAddr() string {
	if e.cfg.UDP {
		return fmt.Sprintf("%s?local=%s", e.cfg.Interface, netip.AddrPortFrom(e.cfg.LocalIP, e.cfg.LocalPort))
	}
	return e.cfg.Interface
}

// RemoteAddr implements fabric.Endpoint: an address that reaches the peer
// from this host (the interface and the peer's MAC, or its IP and port
// with UDP framing).
func (e *Endpoint) RemoteAddr() string {
	if e.cfg.UDP {
		return fmt.Sprintf("%s?udp=%s", e.cfg.Interface, netip.AddrPortFrom(e.cfg.PeerIP, e.cfg.PeerPort))
	}
	e.mu.Lock()
	mac := net.HardwareAddr(e.peerMAC[:])
	e.mu.Unlock()
	return fmt.Sprintf("%s?peer=%s", e.cfg.Interface, mac)
}

// Link returns the interface's information as of Dial.
func (e *Endpoint) Link() LinkInfo { return e.link }

// Port returns the port of the endpoint's shared queue (its XDP program
// and socket). Every endpoint of the process on the same interface
// queue and framing has the same one.
func (e *Endpoint) Port() *Port { return e.m.port }

// ConnID returns the endpoint's connection id, which the peer puts in
// every packet it sends to this endpoint.
func (e *Endpoint) ConnID() uint32 { return e.session }

// linger waits up to d for the peer to acknowledge every packet sent.
func (e *Endpoint) linger(d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		e.mu.Lock()
		done := !e.up || e.gone != nil || e.sndUna == e.sndNxt
		if !done {
			e.now = clock()
			e.pollLocked(256)
			e.pumpLocked(false)
			done = e.sndUna == e.sndNxt
		}
		e.mu.Unlock()
		if done || time.Now().After(deadline) {
			return
		}
		e.sleep(time.Millisecond)
	}
}

// Close implements fabric.Endpoint: it waits up to 2s for the peer to
// acknowledge what was sent, tells the peer (FIN), stops the background
// goroutine and leaves the shared queue (the last endpoint or listener
// on it detaches the XDP program and frees the socket and UMEM). It is
// idempotent.
func (e *Endpoint) Close() error {
	var err error
	e.once.Do(func() {
		e.linger(2 * time.Second)
		e.closed.Store(true)
		close(e.stop)
		<-e.done
		e.cq.Close()
		e.mu.Lock()
		if e.up && e.gone == nil {
			e.now = clock()
			e.sendCtlLocked(ptFin, 0)
			e.sendCtlLocked(ptFin, 0)
		}
		e.mu.Unlock()
		e.m.detach(e)
		if e.lis != nil {
			e.lis.forget(e)
		}
		err = e.m.release()
	})
	return err
}

// wantsHello reports whether a hello to connection id 0 (frame b, Weft
// header at off) is for this dialer, which does not know its peer's id
// yet: two endpoints dialling each other (a symmetric open) meet this
// way. A dialer that names its peer takes only that peer's hellos; one
// that does not (a broadcast dial) takes any, unless a listener on the
// queue takes them. It runs under the mux's locks and reads only what
// does not change after Dial.
func (e *Endpoint) wantsHello(b []byte, off int) bool {
	c := &e.cfg
	if c.PeerMAC == nil {
		return e.m.lis.Load() == nil
	}
	if [6]byte(b[6:12]) != [6]byte(c.PeerMAC) {
		return false
	}
	if c.UDP {
		u := b[off-UDPHdrLen:]
		if [4]byte(b[EthHdrLen+12:EthHdrLen+16]) != c.PeerIP.As4() || binary.BigEndian.Uint16(u) != c.PeerPort {
			return false
		}
	}
	return true
}
