package ethernet

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/ethernet/xsk"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/cq"
	"github.com/weft-io/weft/internal/liveness"
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
	rxSpin     spin.Budget // RecvWait's
	txSpin     spin.Budget // SendWait's
	cq         *cq.Queue
	dom        fabric.Domain
	ctr        fabric.Counters
	evs        chan fabric.Event
	localMAC   [6]byte
	udpHdr     UDP4
	ctl        [1]txEnt

	closed atomic.Bool
	once   sync.Once
	stop   chan struct{}
	done   chan struct{}

	// mu guards the rest: the state of each concern, in its own file.
	mu        sync.Mutex
	now       int64 // monotonic ns of the current call, from clock()
	lastHeard int64
	lastSent  int64
	stalls    liveness.Stalls // the tick's, for lastHeard and lastProgress
	handshakeState
	sendWindow
	recvQueue

	// Tests: discard every n-th data packet received.
	dropEvery int
	dropCount int
}

var _ fabric.Endpoint = (*Endpoint)(nil)

func pow2(n int) bool { return n > 0 && n&(n-1) == 0 }

// clock is the endpoint's monotonic nanoseconds, the clock its silence
// stamps and liveness.Stalls share.
func clock() int64 { return liveness.Now() }

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
		stop: make(chan struct{}), done: make(chan struct{})}
	e.rto = rtoMin
	e.rxSpin.Init(e.spin)
	e.txSpin.Init(e.spin)
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
	e.stalls = liveness.New(tickIdle)
	e.stalls.Start(e.now)
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

func (e *Endpoint) errClosed(op string) error { return e.opErr(op, fabric.ErrClosed) }

// RecvWait implements fabric.Endpoint: Recv, busy-polling for the spin
// budget, then sleeping on the endpoint's inbox, which the queue's
// receive goroutine fills (a goroutine parked in the Go runtime, holding
// no OS thread; ctx's cancellation wakes it at once).
func (e *Endpoint) RecvWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	return e.wait(ctx, msgs, e.Recv, "recv", &e.rxSpin)
}

// SendWait implements fabric.Endpoint: Send, waiting while the window or
// the TX ring is full.
func (e *Endpoint) SendWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	return e.wait(ctx, msgs, e.Send, "send", &e.txSpin)
}

func (e *Endpoint) wait(ctx context.Context, msgs []fabric.Message, op func([]fabric.Message) (int, error), name string, b *spin.Budget) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	s := b.Start()
	for s.Next(ctx) {
		n, err := op(msgs)
		if n > 0 || err != nil {
			b.Arrived(&s)
			return n, err
		}
	}
	b.Slept(&s)
	for {
		n, err := op(msgs)
		if n > 0 || err != nil {
			return n, err
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		e.sleep(ctx.Done(), time.Millisecond)
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
