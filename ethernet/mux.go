package ethernet

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/ethernet/xsk"
	"github.com/weft-io/weft/fabric"
	"golang.org/x/sys/unix"
)

// A mux is one AF_XDP queue (one socket, one UMEM, one XDP steering)
// shared by every fabric endpoint and listener of this process on the
// same interface queue and framing. It demultiplexes received frames by
// the connection id in Weft's header into the endpoints' inboxes, and
// copies the endpoints' outgoing packets into its TX frames.
//
// Endpoints keep their packets (unacknowledged data, reassembly) in
// private memory laid out like a UMEM: the shared UMEM holds only frames
// in flight through the rings, so its size does not grow with the number
// of connections, and one connection holding frames cannot starve the
// others.
type mux struct {
	key     muxKey
	link    LinkInfo
	port    *Port
	s       *xsk.Socket
	mem     []byte
	fsize   uint64
	udp     bool
	etype   uint16
	lmac    [6]byte
	lport   uint16
	refs    int // under muxesMu
	watcher *LinkWatcher
	stop    chan struct{}
	done    chan struct{}

	rxMu  sync.Mutex // one drainer at a time
	rxBuf [64]uint64
	// drained is when (clock) a drain last found the RX ring empty. An
	// endpoint declares its peer silent only once the ring was drained
	// after the peer's deadline, so frames that sat unread while this
	// process was descheduled are not taken for silence (as roce's
	// timers wait for the drained link).
	drained atomic.Int64

	txMu   sync.Mutex
	txFree []uint32
	comp   [256]uint64

	connsMu sync.RWMutex
	conns   map[uint32]*Endpoint // by local connection id
	dialers []*Endpoint          // dialers that do not know their peer's id yet
	lis     atomic.Pointer[Listener]

	// Frames dropped before they reach an endpoint.
	unknown   atomic.Uint64 // no such connection, or a non-hello to id 0
	malformed atomic.Uint64 // bad Weft header
	noBuffer  atomic.Uint64 // the connection's inbox was full
}

type muxKey struct {
	netnsDev, netnsIno uint64
	ifindex, queue     int
	udp                bool
	etype              uint16
	port               uint16
}

const (
	muxTXFrames = 4096
	muxRXFrames = 16384
	muxRing     = 16384
)

var (
	muxesMu sync.Mutex
	muxes   = map[muxKey]*mux{}
)

// acquireMux returns this process's shared queue for c on li (in the
// calling thread's network namespace), opening it if needed.
func acquireMux(li LinkInfo, c *EndpointConfig, frameSize int) (*mux, error) {
	dev, ino, err := currentNetns()
	if err != nil {
		return nil, err
	}
	key := muxKey{netnsDev: dev, netnsIno: ino, ifindex: li.Index, queue: c.Queue, udp: c.UDP, etype: c.EtherType}
	filter := Filter{EtherTypes: []uint16{c.EtherType}}
	if c.UDP {
		key.etype, key.port = 0, c.LocalPort
		filter = Filter{UDPPorts: []uint16{c.LocalPort}}
	}
	muxesMu.Lock()
	defer muxesMu.Unlock()
	if m := muxes[key]; m != nil {
		m.refs++
		return m, nil
	}
	port, err := OpenLink(li, &Config{Queues: []int{c.Queue}, Filter: filter, Attach: c.Attach, Bind: c.Bind,
		FrameSize: frameSize, Frames: muxTXFrames + muxRXFrames, RingSize: muxRing, BusyPoll: c.BusyPoll, raw: true})
	if err != nil {
		return nil, err
	}
	m := &mux{key: key, link: li, port: port, s: port.Queue(0).Socket(), fsize: uint64(frameSize),
		udp: c.UDP, etype: c.EtherType, lport: c.LocalPort, refs: 1, conns: map[uint32]*Endpoint{}}
	m.mem = m.s.UMEM().Bytes()
	copy(m.lmac[:], li.MAC)
	m.txFree = make([]uint32, 0, muxTXFrames)
	for i := muxTXFrames - 1; i >= 0; i-- {
		m.txFree = append(m.txFree, uint32(i))
	}
	fr := m.s.Fill()
	idx, n := fr.Reserve(muxRXFrames)
	for i := 0; i < n; i++ {
		fr.Set(idx+uint32(i), uint64(muxTXFrames+i)*m.fsize)
	}
	fr.Submit(n)
	w, err := WatchLink(li.Index, m.onLink)
	if err != nil {
		port.Close()
		return nil, err
	}
	m.watcher = w
	m.stop, m.done = make(chan struct{}), make(chan struct{})
	go m.run()
	muxes[key] = m
	return m, nil
}

// run is the queue's receive goroutine: it sleeps on the socket in the
// Go runtime's network poller (PollFor: no OS thread waits, nothing is
// allocated) and demultiplexes what arrives, so that endpoints and the
// listener can sleep on their own inboxes. Callers that busy-poll drain
// the socket themselves in between. The 5ms timeout bounds how long
// release waits for it to notice stop.
func (m *mux) run() {
	defer close(m.done)
	for {
		select {
		case <-m.stop:
			return
		default:
		}
		if _, err := m.s.PollFor(unix.POLLIN, 5*time.Millisecond); err != nil {
			return
		}
		m.rxMu.Lock()
		m.pollLocked()
		m.rxMu.Unlock()
	}
}

// release drops one reference and closes the queue with the last.
func (m *mux) release() error {
	// The lock is held through the teardown, as acquireMux holds it
	// through the opening: a new user of the queue must not find the
	// old socket or XDP program still there (a dial racing the close of
	// the queue's last endpoint failed with ErrXDPInUse). Nothing the
	// teardown waits for takes the lock.
	muxesMu.Lock()
	defer muxesMu.Unlock()
	m.refs--
	if m.refs > 0 {
		return nil
	}
	delete(muxes, m.key)
	m.watcher.Close()
	close(m.stop)
	<-m.done
	m.rxMu.Lock()
	m.txMu.Lock()
	err := m.port.Close()
	m.txMu.Unlock()
	m.rxMu.Unlock()
	return err
}

func (m *mux) onLink(ev LinkEvent) {
	k := fabric.EventLinkUp
	if !ev.Running || ev.Deleted {
		k = fabric.EventLinkDown
	}
	m.connsMu.RLock()
	for _, e := range m.conns {
		e.emit(fabric.Event{Kind: k, Time: ev.Time})
	}
	m.connsMu.RUnlock()
}

// newConnID picks a random connection id unused on this queue.
func (m *mux) newConnID() uint32 {
	var b [4]byte
	for {
		rand.Read(b[:])
		id := binary.BigEndian.Uint32(b[:])
		if id == 0 {
			continue
		}
		m.connsMu.RLock()
		_, taken := m.conns[id]
		m.connsMu.RUnlock()
		if !taken {
			return id
		}
	}
}

// attach makes e reachable by its connection id (and, for a dialer
// that does not know its peer's id, by hellos addressed to id 0).
func (m *mux) attach(e *Endpoint, dialer bool) bool {
	m.connsMu.Lock()
	defer m.connsMu.Unlock()
	if _, taken := m.conns[e.session]; taken {
		return false
	}
	m.conns[e.session] = e
	if dialer {
		m.dialers = append(m.dialers, e)
	}
	return true
}

// detach removes e.
func (m *mux) detach(e *Endpoint) {
	m.connsMu.Lock()
	if m.conns[e.session] == e {
		delete(m.conns, e.session)
	}
	m.dropDialerLocked(e)
	m.connsMu.Unlock()
}

func (m *mux) dropDialerLocked(e *Endpoint) {
	for i, d := range m.dialers {
		if d == e {
			m.dialers = append(m.dialers[:i], m.dialers[i+1:]...)
			return
		}
	}
}

// bound tells the mux that a dialer learned its peer's id.
func (m *mux) bound(e *Endpoint) {
	m.connsMu.Lock()
	m.dropDialerLocked(e)
	m.connsMu.Unlock()
}

// poll drains the RX ring into the endpoints' inboxes, unless another
// goroutine is already at it. It returns the number of frames drained.
func (m *mux) poll() int {
	if !m.rxMu.TryLock() {
		return 0
	}
	defer m.rxMu.Unlock()
	return m.pollLocked()
}

func (m *mux) pollLocked() int {
	rx := m.s.RX()
	total := 0
	for total < 1024 {
		idx, n := rx.Peek(len(m.rxBuf))
		if n == 0 {
			m.drained.Store(clock())
			break
		}
		m.connsMu.RLock()
		for i := 0; i < n; i++ {
			d := rx.Desc(idx + uint32(i))
			m.rxBuf[i] = d.Addr
			if d.Addr+uint64(d.Len) <= uint64(len(m.mem)) {
				m.demuxLocked(m.mem[d.Addr : d.Addr+uint64(d.Len)])
			}
		}
		m.connsMu.RUnlock()
		rx.Release(n)
		fr := m.s.Fill()
		fidx, got := fr.Reserve(n)
		for i := 0; i < got; i++ {
			a := m.rxBuf[i]
			fr.Set(fidx+uint32(i), a-a%m.fsize)
		}
		fr.Submit(got)
		total += n
	}
	if total == 0 && (m.s.Fill().NeedsWakeup() || m.s.BusyPolling()) {
		m.s.WakeRX()
	}
	return total
}

// l2 checks the link (and IP/UDP) headers of a received frame against
// this queue and returns the offset of the Weft header, or -1.
func (m *mux) l2(b []byte) int { return linkHeader(b, m.lmac, m.udp, m.etype, m.lport) }

// demuxLocked hands one received frame to its connection, to a dialer
// waiting for its peer's hello, or to the listener. It runs under rxMu
// and connsMu (read).
func (m *mux) demuxLocked(b []byte) {
	off := m.l2(b)
	if off < 0 {
		m.unknown.Add(1)
		return
	}
	h := header(b[off:])
	if !h.IsValid() {
		m.malformed.Add(1)
		return
	}
	if id := h.dst(); id != 0 {
		e := m.conns[id]
		if e == nil {
			m.unknown.Add(1)
			return
		}
		if !e.in.deliver(b) {
			m.noBuffer.Add(1)
		}
		return
	}
	if h.typ() != ptHello {
		m.unknown.Add(1)
		return
	}
	// A hello to id 0: a dialer that names this peer (symmetric open)
	// takes it first, then the listener; a hello flagged for the
	// listener goes to the listener only.
	for _, e := range m.dialers {
		if h.flags()&pfListener != 0 {
			break
		}
		if e.wantsHello(b, off) {
			if !e.in.deliver(b) {
				m.noBuffer.Add(1)
			}
			return
		}
	}
	if l := m.lis.Load(); l != nil {
		l.onHello(b, off)
		return
	}
	m.unknown.Add(1)
}

// txEnt names a packet in an endpoint's private memory.
type txEnt struct {
	frame uint32
	len   uint32
}

// transmit copies packets out of an endpoint's memory into TX frames and
// submits them; it returns how many went (fewer when the TX ring or the
// frames run out: backpressure).
func (m *mux) transmit(mem []byte, fsize uint64, pkts []txEnt) int {
	m.txMu.Lock()
	m.reapLocked()
	tx := m.s.TX()
	idx, got := tx.Reserve(min(len(pkts), len(m.txFree)))
	top := len(m.txFree)
	for i := 0; i < got; i++ {
		f := m.txFree[top-1-i]
		a := uint64(f) * m.fsize
		p := pkts[i]
		src := uint64(p.frame) * fsize
		copy(m.mem[a:a+uint64(p.len)], mem[src:src+uint64(p.len)])
		d := tx.Desc(idx + uint32(i))
		d.Addr, d.Len, d.Options = a, p.len, 0
	}
	m.txFree = m.txFree[:top-got]
	tx.Submit(got)
	pending := tx.Pending()
	kick := m.s.NeedsTXKick()
	m.txMu.Unlock()
	// Kick outside the lock: in copy mode sendto transmits (through
	// veth, all the way into the peer's socket) before it returns, and
	// the other connections must not queue behind it.
	if kick && pending > 0 {
		budget := max(m.s.TXBudget(), 1)
		for k := 0; k < min((pending+budget-1)/budget, 8); k++ {
			if m.s.Kick() != nil {
				break
			}
		}
	}
	return got
}

// transmitFrame sends one frame built by the caller.
func (m *mux) transmitFrame(b []byte) bool {
	return m.transmit(b, 0, []txEnt{{frame: 0, len: uint32(len(b))}}) == 1
}

func (m *mux) reapLocked() {
	cr := m.s.Completion()
	for {
		n := cr.Get(m.comp[:])
		for i := 0; i < n; i++ {
			if f := m.comp[i] / m.fsize; f < muxTXFrames {
				m.txFree = append(m.txFree, uint32(f))
			}
		}
		if n < len(m.comp) {
			return
		}
	}
}

// drops returns the frames dropped before they reached an endpoint.
func (m *mux) drops() (unknown, malformed, noBuffer uint64) {
	return m.unknown.Load(), m.malformed.Load(), m.noBuffer.Load()
}

// inbox carries received frames from the mux to one endpoint: the
// endpoint posts free frames of its private memory (like an AF_XDP fill
// ring) and the mux copies frames into them and posts them back (like an
// RX ring). Both are single-producer single-consumer rings: the mux
// produces under its rxMu, the endpoint consumes under its mu.
type inbox struct {
	mem   []byte
	fsize uint64
	free  spsc // frame indexes the endpoint gives
	ready spsc // frame index << 32 | length
	wake  chan struct{}
}

var timers = sync.Pool{New: func() any { t := time.NewTimer(time.Hour); t.Stop(); return t }}

// sleep waits up to d for a frame to be delivered, or until done (nil:
// never) is closed.
func (in *inbox) sleep(done <-chan struct{}, d time.Duration) {
	select {
	case <-in.wake:
		return
	case <-done:
		return
	default:
	}
	t := timers.Get().(*time.Timer)
	t.Reset(d)
	select {
	case <-in.wake:
	case <-t.C:
	case <-done:
	}
	t.Stop()
	timers.Put(t)
}

func (in *inbox) init(mem []byte, fsize uint64, frames int) {
	in.mem, in.fsize = mem, fsize
	in.free.init(frames)
	in.ready.init(frames)
	in.wake = make(chan struct{}, 1)
}

// deliver copies frame b into a free frame; false means none was free.
func (in *inbox) deliver(b []byte) bool {
	if uint64(len(b)) > in.fsize {
		return false
	}
	f, ok := in.free.pop()
	if !ok {
		return false
	}
	a := f * in.fsize
	copy(in.mem[a:a+uint64(len(b))], b)
	in.ready.push(f<<32 | uint64(len(b)))
	select {
	case in.wake <- struct{}{}:
	default:
	}
	return true
}

// spsc is a single-producer single-consumer ring of uint64.
type spsc struct {
	buf        []uint64
	mask       uint32
	head, tail atomic.Uint32
}

func (r *spsc) init(n int) {
	size := 1
	for size < n {
		size <<= 1
	}
	r.buf = make([]uint64, size)
	r.mask = uint32(size - 1)
}

func (r *spsc) push(v uint64) bool {
	t := r.tail.Load()
	if t-r.head.Load() > r.mask {
		return false
	}
	r.buf[t&r.mask] = v
	r.tail.Store(t + 1)
	return true
}

func (r *spsc) pop() (uint64, bool) {
	h := r.head.Load()
	if h == r.tail.Load() {
		return 0, false
	}
	v := r.buf[h&r.mask]
	r.head.Store(h + 1)
	return v, true
}

func (r *spsc) len() int { return int(r.tail.Load() - r.head.Load()) }

// ref takes one more reference.
func (m *mux) ref() {
	muxesMu.Lock()
	m.refs++
	muxesMu.Unlock()
}
