package roce

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/link"
	"github.com/weft-io/weft/roce/wire"
)

// Engine is a user-space RoCEv2 device: the software equivalent of Linux
// Soft-RoCE (rxe). It owns a Link (a UDP socket on port 4791, or AF_XDP),
// protection domains, memory regions, completion queues and queue pairs,
// and speaks the RoCEv2 wire protocol (IBTA Annex A17) with any peer:
// another Engine, Linux rxe, or an RDMA NIC.
//
// Packets are processed by whoever polls: a thread busy-waiting in
// RecvWait, SendWait or a completion Wait drives the engine itself; when
// nobody does, a background goroutine sleeps in the network poller and
// runs the retransmission timers.
type Engine struct {
	cfg   EngineConfig
	link  link.Link
	local netip.Addr
	// auto is link as an AutoLink (EngineConfig.Auto), else nil.
	auto *link.AutoLink
	// ringAll: every packet goes into a peer's shared-memory ring (the
	// link is a ShmLink); ringShm: a packet marked Shm does (the link is
	// an AutoLink with a ring). See unsealed.
	ringAll, ringShm bool
	// lender is the link as a link.Lender (a ring's slots), else nil.
	lender link.Lender

	objMu sync.RWMutex
	qps   map[uint32]*QP
	// qpList is qps's values, which runTimers walks on every turn of
	// the background poller: a map's iteration cost it a fifth of its
	// time (QP.listed is each one's index).
	qpList []*QP
	mrs    map[uint32]*MR // by rkey and by lkey (both random)
	nextQP uint32
	// QPNs are qpnBase | n&qpnMask: the engine's block, or any 24-bit
	// number for an engine on a Link of its own.
	qpnBase, qpnMask uint32
	maxWnd           int // the requesters' largest window: maxInflight, or maxInflightLossless
	block            *link.QPNBlock
	// maxMTU is the link's path MTU cap (link.MaxMTU, read once when the
	// engine starts): RTR refuses a larger path MTU. 0: none.
	maxMTU int

	pollMu  sync.Mutex // one poller at a time
	rx      []link.Packet
	rxBufs  [][]byte
	dirty   []*QP // QPs with an ACK to send after the current batch
	spinner atomic.Int32
	// unspun wakes the background poller from the nap it takes while a
	// caller spins, when the last spinner gives up and blocks (see
	// QP.wait): the blocked caller's packets are then the poller's to
	// read at once, not after the rest of the nap (up to 200 µs, which a
	// sleep cost on average in a 64 B ping-pong over link=xdp).
	unspun chan struct{}
	nap    time.Duration // spinNap when the engine started
	// gaveUp is set by a caller that gives up spinning (unspin) and
	// cleared by the last spinner that then leaves with what it waited
	// for (spun), which wakes the poller for the blocked one: set before
	// the caller's spinner count goes, so that the one that takes it to
	// zero sees it. A stale one costs one early end of a nap.
	gaveUp atomic.Bool
	// drained is when (nanotime) a poll last found the link empty. A
	// retransmission or keep-alive timer fires only once the link was
	// drained after its deadline: acknowledgements that sat unread
	// while the polling thread was descheduled are not silence. Timers
	// fired on the clock alone spent a QP's retries in the stalls of a
	// loaded host, the peer alive and its acknowledgements queued
	// (TestLossySoak failed "retry count exceeded" in 3 runs of 3 beside
	// a CPU hog; TestStalledPoller).
	drained atomic.Int64
	// ackDue is when (nanotime) the first queued acknowledgement of the
	// dirty list is due (see ackDelay).
	ackDue atomic.Int64
	rxNow  int64 // nanotime of the batch being processed (pollMu)

	evMu    sync.Mutex
	ev      [64]debugEvent
	evN     int
	icrcBuf [48 + wire.BTHSize]byte
	// lentHdr and lentMAD are the poller's copies of a lent datagram's
	// headers, and of a lent MAD (see parseLent).
	lentHdr [wire.MaxHeaderLen]byte
	lentMAD [maxPacket]byte
	ids     wire.IPv4IDs // the poller's, like icrcBuf
	stats   fabric.Counters
	closed  atomic.Bool
	stop    chan struct{}
	wg      sync.WaitGroup
	closeMu sync.Mutex
	started time.Time

	gsi      atomic.Pointer[CM] // the communication manager on QP 1 (gsi.go), if started
	gsiTx    gsiTx              // what QP 1 sends: the CM's MADs and goodbyes (gsi.go)
	goodbyes goodbyeCounters
}

// EngineConfig configures an Engine. The zero value is the default,
// except that Link or Addr must be set.
type EngineConfig struct {
	// Link carries the packets. If nil, the engine opens a UDPLink on Addr.
	Link link.Link
	// Addr is the local IP address to listen on (port 4791 unless given).
	Addr netip.AddrPort
	// NoRaw is UDPConfig.NoRaw for the link the engine opens on Addr.
	NoRaw bool
	// Shm opens a ShmLink on Addr instead of a UDPLink: the engine then
	// reaches the engines of this host that use one too, through shared
	// memory (the address parameter link=shm).
	Shm bool
	// XDP opens an XDPLink on Addr instead of a UDPLink: the engine's
	// packets then go through an AF_XDP socket on the interface that
	// holds Addr, bypassing the kernel's UDP path (the address parameter
	// link=xdp).
	XDP bool
	// GSO is UDPConfig.GSO for the link the engine opens on Addr.
	GSO bool
	// Auto opens, beside the UDPLink on Addr, a ShmLink ring of the same
	// address (an AutoLink), and sends to each Weft peer of this host
	// that has one too through it: the address parameter link=auto, the
	// default of a roce address. A peer that is not Weft, or not on this
	// host, or whose engine has no ring, gets UDP. Without a ring of its
	// own (another engine of the host owns the address's), the engine
	// runs on UDP alone. Ignored with Link, Shm or XDP.
	Auto bool
	// NoICRC skips the verification of received ICRCs (they are always
	// sent, except into a shared-memory ring, whose datagrams carry none:
	// see the package doc). The UDP link cannot see the IP header the
	// peer sent and rebuilds it, assuming an IPv4 identification from 0
	// to 63, as Linux sends with don't-fragment (0, and 0, 1, 2, ... for
	// the datagrams of a GSO send); a peer that sends otherwise needs
	// this, the raw socket or AF_XDP.
	NoICRC bool
}

// maxPacket is the largest RoCEv2 UDP payload: a 4096-byte MTU plus the
// longest headers (BTH, RETH, ImmDt) and the ICRC, rounded up.
const maxPacket = link.MaxPacket

// rxBufSize leaves room for the IP and UDP headers of a raw receive.
const rxBufSize = maxPacket + 128

// rxBatch is the number of datagrams read per system call.
const rxBatch = 64

// NewEngine starts an engine.
func NewEngine(cfg EngineConfig) (*Engine, error) {
	lk := cfg.Link
	var blk *link.QPNBlock
	if lk == nil && cfg.Shm {
		l, err := link.ListenShm(cfg.Addr, link.ShmConfig{})
		if err != nil {
			return nil, err
		}
		lk = l
	}
	if lk == nil && cfg.XDP {
		l, err := link.ListenXDP(cfg.Addr, link.XDPConfig{})
		if err != nil {
			return nil, err
		}
		lk = l
	}
	if lk == nil {
		if !cfg.Addr.IsValid() {
			return nil, fmt.Errorf("roce: EngineConfig needs a Link or an Addr: %w", fabric.ErrInvalid)
		}
		// The engine's QPNs are unique on the host, so that engines of
		// several processes can share the address and port.
		b, err := link.ClaimQPNBlock()
		if err != nil {
			return nil, err
		}
		l, err := link.ListenUDPConfig(cfg.Addr, link.UDPConfig{NoRaw: cfg.NoRaw, GSO: cfg.GSO, QPNBlock: b.N()})
		if err != nil {
			b.Release()
			return nil, fmt.Errorf("roce: listen %v: %w", cfg.Addr, err)
		}
		lk, blk = l, b
		if cfg.Auto {
			if a := autoLink(l); a != nil {
				lk = a
			}
		}
	}
	e := &Engine{cfg: cfg, link: lk, local: lk.LocalAddr().Addr().Unmap(), qps: map[uint32]*QP{},
		mrs: map[uint32]*MR{}, stop: make(chan struct{}), unspun: make(chan struct{}, 1), nap: spinNap, started: time.Now(), qpnMask: 0xffffff, block: blk}
	e.auto, _ = lk.(*link.AutoLink)
	_, e.ringAll = lk.(*link.ShmLink)
	e.lender, _ = lk.(link.Lender)
	e.ringShm = e.auto != nil && e.auto.Shm()
	e.gsiTx.init()
	var b [4]byte
	rand.Read(b[:])
	base := uint32(0)
	if blk != nil {
		base = blk.N() << link.QPNBlockBits
	} else if lb, ok := lk.(interface{ QPNBlock() uint32 }); ok && lb.QPNBlock() != 0 {
		// A link given to the engine that receives one block only.
		base = lb.QPNBlock() << link.QPNBlockBits
	}
	if base != 0 {
		e.qpnBase, e.qpnMask = base, link.QPNBlockSize-1
		e.nextQP = e.qpnBase | binary.LittleEndian.Uint32(b[:])&e.qpnMask
	} else {
		e.nextQP = 0x100 + binary.LittleEndian.Uint32(b[:])&0x7fff
	}
	e.maxWnd = maxInflight
	if ll, ok := lk.(interface{ Lossless() bool }); ok && ll.Lossless() {
		e.maxWnd = maxInflightLossless
	}
	e.maxMTU = link.MaxMTU(lk)
	e.ackDue.Store(math.MaxInt64)
	e.rx = make([]link.Packet, rxBatch)
	e.rxBufs = make([][]byte, rxBatch)
	for i := range e.rxBufs {
		e.rxBufs[i] = make([]byte, rxBufSize)
	}
	e.resetRx(rxBatch)
	e.wg.Add(1)
	go e.background()
	return e, nil
}

// autoLink adds a shared-memory ring to u (EngineConfig.Auto). A ring
// that cannot be had leaves u alone (nil): the engine runs on UDP, as
// its endpoints' Caps.Path say. The reason is not kept: it is another
// engine of the host owning the address's ring (EADDRINUSE, the case
// the design expects) or a host without a usable /dev/shm, and no
// caller could act on it.
func autoLink(u *link.UDPLink) *link.AutoLink {
	ring, err := link.ListenShm(u.LocalAddr(), link.ShmConfig{})
	if err != nil {
		return nil
	}
	a, err := link.NewAutoLink(u, ring)
	if err != nil {
		ring.Close()
		return nil
	}
	return a
}

// udpLink returns the engine's UDP link, inside its automatic link if it
// runs one; nil if it has none.
func (e *Engine) udpLink() *link.UDPLink {
	switch l := e.link.(type) {
	case *link.UDPLink:
		return l
	case *link.AutoLink:
		return l.UDP()
	}
	return nil
}

// shmRing reports whether the engine takes packets from peers of this
// host through a shared-memory ring of its own in the default directory
// (EngineConfig.Auto, or EngineConfig.Shm: link=shm), which its endpoints
// tell their Weft peers (exchange.WeftShmLID). A link=shm engine reads
// nothing else: a peer with the default link that it did not tell would
// answer on UDP.
func (e *Engine) shmRing() bool {
	if e.cfg.Shm && e.cfg.Link == nil {
		return true
	}
	return e.auto != nil && e.auto.Shm()
}

// viaShm is the rule of the automatic link: whether a QP of type t that
// connects to peer sends its packets through peer's shared-memory ring
// (QP.viaShm). Its Weft peer offered the ring (exchange.WeftShmLID in the
// endpoints' exchange, cmShmMark in the CM's REQ or REP), the engine
// runs an automatic link and the ring is alive on this host. UD keeps
// UDP: a ring that stays full longer than the engine waits on it drops
// datagrams that a UDP socket's buffers would have held, and UD has no
// retransmission to recover them. A connection's CM messages go as its
// RC QP's packets do (cmConn.viaShm), before the QP too.
func (e *Engine) viaShm(t QPType, offered bool, peer netip.Addr) bool {
	return t == RC && offered && e.auto != nil && e.auto.Reaches(netip.AddrPortFrom(peer, link.Port))
}

// linkName names the engine's carrier, as Caps.Path gives it: "udp" (with
// "+gso"), "shm", "xdp", or "" for a link given in EngineConfig.Link.
func (e *Engine) linkName() string {
	switch e.link.(type) {
	case *link.UDPLink, *link.AutoLink:
		if e.cfg.GSO {
			return "udp+gso"
		}
		return "udp"
	case *link.ShmLink:
		return "shm"
	case *link.XDPLink:
		return "xdp"
	}
	return ""
}

// QPNBlock returns the block of QPNs the engine owns on the host (see
// QPNBlockBits), or 0 if it runs on a Link it was given and numbers its
// QPs without regard to other processes.
func (e *Engine) QPNBlock() uint32 {
	if e.block == nil {
		return 0
	}
	return e.block.N()
}

// LocalAddr returns the engine's IP address (its RoCEv2 GID).
func (e *Engine) LocalAddr() netip.Addr { return e.local }

// GID returns the engine's GID: its IP address, IPv4-mapped for IPv4.
func (e *Engine) GID() wire.GID { return wire.GIDFromAddr(e.local) }

// Stats returns the engine's counters: every packet it sent and received,
// and the drops of packets no queue pair took.
func (e *Engine) Stats() fabric.Stats { return e.stats.Snapshot() }

// Close destroys every queue pair (flushing their work) and closes the
// link. It is idempotent.
func (e *Engine) Close() error {
	e.closeMu.Lock()
	defer e.closeMu.Unlock()
	if e.closed.Swap(true) {
		return nil
	}
	e.objMu.RLock()
	qps := make([]*QP, 0, len(e.qps))
	for _, qp := range e.qps {
		qps = append(qps, qp)
	}
	e.objMu.RUnlock()
	for _, qp := range qps {
		qp.Destroy()
	}
	close(e.stop)
	// Not under a poll: a link may lend its memory to the batch being
	// processed (XDPLink.ReadBatch), which Close unmaps.
	e.pollMu.Lock()
	err := e.link.Close()
	e.pollMu.Unlock()
	e.wg.Wait()
	e.block.Release()
	return err
}

// PD is a protection domain: memory regions and queue pairs of one PD
// work together; an rkey of another PD is refused like an unknown one.
type PD struct {
	e   *Engine
	dom fabric.Domain
}

// AllocPD allocates a protection domain.
func (e *Engine) AllocPD() *PD {
	return &PD{e: e, dom: fabric.Domain{Name: "roce pd", HostMemory: true}}
}

// Domain returns the fabric domain of the PD: regions of this domain are
// valid in the SGEs of its queue pairs.
func (pd *PD) Domain() *fabric.Domain { return &pd.dom }

// MR is a registered memory region: verbs ibv_mr. Remote peers address it
// by virtual address (the address of its first byte in this process) and
// rkey, as verbs does.
type MR struct {
	pd     *PD
	buf    []byte
	va     uint64
	access fabric.Access
	lkey   uint32
	rkey   uint32
	region *fabric.Region
	dead   atomic.Bool
}

func (e *Engine) newKey() uint32 {
	for {
		var b [4]byte
		rand.Read(b[:])
		k := binary.LittleEndian.Uint32(b[:])
		if _, dup := e.mrs[k]; k != 0 && !dup {
			return k
		}
	}
}

// RegMR registers buf with the given access flags and returns it as a
// fabric region (verbs ibv_reg_mr). Its remote address is the virtual
// address of buf[0]; its keys are random.
func (pd *PD) RegMR(buf []byte, access fabric.Access) (*fabric.Region, error) {
	e := pd.e
	if e.closed.Load() {
		return nil, os.ErrClosed
	}
	if len(buf) == 0 {
		return nil, fmt.Errorf("roce: register an empty buffer: %w", fabric.ErrInvalid)
	}
	if access&fabric.AccessRemoteWrite != 0 && access&fabric.AccessLocalWrite == 0 {
		// Verbs requires local write with remote write; so do we.
		access |= fabric.AccessLocalWrite
	}
	mr := &MR{pd: pd, buf: buf, va: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))), access: access}
	e.objMu.Lock()
	mr.lkey = e.newKey()
	e.mrs[mr.lkey] = mr
	if access&fabric.AccessRemote != 0 {
		mr.rkey = e.newKey()
		e.mrs[mr.rkey] = mr
	}
	e.objMu.Unlock()
	mr.region = fabric.NewRegion(fabric.RegionConfig{Buf: buf, Access: access, LocalKey: fabric.Key(mr.lkey),
		RemoteKey: fabric.Key(mr.rkey), Addr: mr.va, Domain: &pd.dom, Deregister: func() error {
			mr.dead.Store(true)
			e.objMu.Lock()
			delete(e.mrs, mr.lkey)
			if mr.rkey != 0 {
				delete(e.mrs, mr.rkey)
			}
			e.objMu.Unlock()
			return nil
		}})
	return mr.region, nil
}

// lookupRemote validates a remote access: the rkey must name a live
// region of pd with the permissions in need, and [va, va+n) must lie in
// it. It returns the bytes, or nil and the NAK to send.
func (e *Engine) lookupRemote(pd *PD, rkey uint32, va uint64, n uint32, need fabric.Access) ([]byte, bool) {
	e.objMu.RLock()
	mr := e.mrs[rkey]
	e.objMu.RUnlock()
	if mr == nil || mr.rkey != rkey || mr.pd != pd || mr.dead.Load() || !mr.access.Has(need) {
		return nil, false
	}
	if va < mr.va || va-mr.va > uint64(len(mr.buf)) || uint64(n) > uint64(len(mr.buf))-(va-mr.va) {
		return nil, false
	}
	off := va - mr.va
	return mr.buf[off : off+uint64(n) : off+uint64(n)], true
}

// spinNap is how long the background poller naps between its polls
// while a caller spins (a variable for tests, which an engine copies when
// it starts: the pollers of engines an earlier test left open never read
// it while a test sets it).
var spinNap = 200 * time.Microsecond

// unspin ends a caller's spin that ran out (the caller blocks next): the
// last one wakes the background poller from its nap (see unspun). One
// that is not the last leaves gaveUp set, for the last to wake the
// poller whichever way it leaves (see spun).
func (e *Engine) unspin() {
	e.gaveUp.Store(true)
	if e.spinner.Add(-1) == 0 {
		e.wakePoller()
	}
}

// spun ends a caller's spin that found what it waited for (the caller
// goes on). The last one wakes the background poller only if a caller
// gave up spinning meanwhile and is blocked (gaveUp): a ping-pong's
// spinner leaves the poller to its nap.
func (e *Engine) spun() {
	if e.spinner.Add(-1) == 0 && e.gaveUp.Load() && e.gaveUp.Swap(false) {
		e.wakePoller()
	}
}

// wakePoller ends the background poller's nap (see unspun).
func (e *Engine) wakePoller() {
	select {
	case e.unspun <- struct{}{}:
	default:
	}
}

// background polls the link when no thread is spinning, and runs timers.
func (e *Engine) background() {
	defer e.wg.Done()
	nap := time.NewTimer(time.Hour)
	defer nap.Stop()
	yielded := false
	timersAt := int64(0) // nanotime of the busy branch's last runTimers
	for !e.closed.Load() {
		if e.spinner.Load() > 0 {
			// A spinning caller drives the engine; keep the timers, and
			// read what the caller left when it was descheduled.
			for e.poll() > 0 {
			}
			now := time.Now()
			e.runTimers(now)
			// Queued acknowledgements are the spinner's to send; should it
			// stop polling, they wait at most about ackDelay longer.
			d := e.nap
			if due := e.ackDue.Load(); due != math.MaxInt64 {
				d = min(d, max(time.Duration(due-nanotime()), 20*time.Microsecond))
			}
			nap.Reset(d)
			select {
			case <-e.stop:
				return
			case <-nap.C:
			case <-e.unspun:
				nap.Stop() // Go 1.23 timers: no stale tick after Stop
			}
			continue
		}
		busy := false
		for {
			n := e.poll()
			if n < 0 {
				busy = true // another thread is polling: do not sleep on its packets
			}
			if n <= 0 {
				break
			}
		}
		if busy {
			runtime.Gosched()
			// The other poller takes the packets; the timers are this
			// loop's, but not on every turn: walking every QP under its
			// lock cost a tenth of the CPU of a sock stream, whose
			// reader polls while this loop turns.
			if now := nanotime(); now-timersAt >= busyTimers {
				timersAt = now
				e.runTimers(time.Now())
			}
			continue
		}
		if e.ackDue.Load() != math.MaxInt64 {
			// Acknowledgements are queued: let the application that was
			// just woken post its reply, which they ride along with,
			// then send the rest before sleeping.
			if !yielded {
				yielded = true
				runtime.Gosched()
				continue
			}
			e.flushAllAcks()
		}
		yielded = false
		now := time.Now()
		next := e.runTimers(now)
		wait := 1 * time.Millisecond
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(now), 20*time.Microsecond))
		}
		err := e.link.WaitRead(context.Background(), now.Add(wait))
		if debugRoce {
			e.evlog("wait", int(wait/time.Microsecond), int(time.Since(now)/time.Microsecond), err)
		}
		if errors.Is(err, os.ErrClosed) {
			return
		}
	}
}

// lentHook, if set, runs at the end of parseLent: tests change the lent
// datagram there, as a writer of the ring it lies in may.
var lentHook func(data []byte)

// busyTimers is how often at most the background poller runs the timers
// while another thread polls (nanoseconds): the floor of its other waits.
const busyTimers = int64(20 * time.Microsecond)

// runTimers fires the QPs' due timers and returns the earliest pending
// deadline (zero if none).
func (e *Engine) runTimers(now time.Time) time.Time {
	var next time.Time
	drained := epoch.Add(time.Duration(e.drained.Load()))
	e.objMu.RLock()
	for _, qp := range e.qpList {
		if d := qp.timer(now, drained); !d.IsZero() && (next.IsZero() || d.Before(next)) {
			next = d
		}
	}
	e.objMu.RUnlock()
	return next
}

// poll reads one batch of packets and processes it; it returns how many
// it read. If another thread is polling it returns -1 at once.
func (e *Engine) poll() int { return e.pollAcks(true) }

// pollAcks is poll; acks says whether a poll that finds the link empty
// sends the acknowledgements due by the clock. Recv does not: it delivers
// next, and the acknowledgement should not go before what it delivers.
func (e *Engine) pollAcks(acks bool) int {
	if !e.pollMu.TryLock() {
		return -1
	}
	defer e.pollMu.Unlock()
	// The packets are ready to read into: those a read returned are reset
	// after it (a link writes no other: Link.ReadBatch), not all rxBatch
	// of them before each read, whose 5 KB of stores cost an empty poll
	// more than the ring's read.
	rx := e.rx
	n, err := e.link.ReadBatch(rx)
	if debugRoce && (n > 0 || err != nil) {
		e.evlog("read", n, 0, err)
	}
	if n > 0 {
		defer e.resetRx(n)
	}
	if err != nil || n == 0 {
		if err == nil {
			// One monotonic clock for drained and the acknowledgements:
			// nanotime reads it alone, where time.Now reads the wall
			// clock too.
			now := nanotime()
			e.drained.Store(now)
			if acks && len(e.dirty) > 0 && now >= e.ackDue.Load() {
				e.flushAcks(now, flushDue)
			}
		}
		return 0
	}
	e.rxNow = nanotime()
	for i := 0; i < n; i++ {
		e.input(&rx[i])
	}
	if e.lender != nil {
		// Done with the batch: the ring's slots go back before its
		// acknowledgements go out (link.Lender).
		e.lender.ReturnLent()
	}
	// Acknowledgements are coalesced (see ackDelay): those of a stream,
	// the urgent and the overdue ones go now.
	if len(e.dirty) > 0 {
		e.flushAcks(e.rxNow, flushCount)
	}
	e.rxNow = 0
	return n
}

// resetRx makes the first n packets of the read batch ready to read into
// again. The caller holds pollMu.
func (e *Engine) resetRx(n int) {
	for i := range e.rx[:n] {
		e.rx[i] = link.Packet{Buf: e.rxBufs[i]}
	}
}

// Which queued acknowledgements flushAcks sends.
const (
	// Urgent ones, those of ackEvery packets, and the overdue (4 ×
	// ackDelay): a poller that never finds the link empty must not
	// starve them.
	flushCount = iota
	flushDue   // and those due by the clock
	flushAll
)

// flushAcks sends the queued acknowledgements that which selects, and
// notes when the next is due. The caller holds pollMu.
func (e *Engine) flushAcks(now int64, which int) {
	keep := e.dirty[:0]
	due := int64(0)
	for _, qp := range e.dirty {
		qp.mu.Lock()
		switch {
		case !qp.ackDirty || qp.closed.Load():
			qp.ackListed = false
		case which == flushAll || qp.ackUrgent || qp.ackPkts >= ackEvery || (which == flushDue && qp.ackDueBy(now)) ||
			now-qp.ackAt >= 4*qp.ackWait:
			qp.ackListed = false
			qp.sendAckLocked()
		default:
			keep = append(keep, qp)
			if d := qp.ackAt + qp.ackWait; due == 0 || d < due {
				due = d
			}
		}
		qp.mu.Unlock()
	}
	clear(e.dirty[len(keep):])
	e.dirty = keep
	if due == 0 {
		due = math.MaxInt64
	}
	e.ackDue.Store(due)
}

// flushAllAcks sends every queued acknowledgement, for a poller about to
// sleep.
func (e *Engine) flushAllAcks() {
	if !e.pollMu.TryLock() {
		return
	}
	if len(e.dirty) > 0 {
		e.flushAcks(nanotime(), flushAll)
	}
	e.pollMu.Unlock()
}

// epoch is the origin of nanotime.
var epoch = time.Now()

// nanotime returns monotonic nanoseconds since epoch.
func nanotime() int64 { return int64(time.Since(epoch)) }

// drop counts a dropped packet.
func (e *Engine) drop(r fabric.DropReason) {
	e.stats.Drops[r].Add(1)
}

// input validates one datagram and hands it to its queue pair.
func (e *Engine) input(p *link.Packet) {
	if p.N < 0 {
		e.drop(fabric.DropMalformed)
		return
	}
	data := p.Buf[p.Off : p.Off+p.N]
	e.stats.RxPackets.Add(1)
	e.stats.RxBytes.Add(uint64(p.N))
	var pkt wire.Packet
	var err error
	if p.Unsealed {
		pkt, err = e.parseLent(data)
	} else {
		pkt, err = wire.Parse(data)
	}
	if err != nil {
		e.drop(fabric.DropMalformed)
		return
	}
	// A ring's datagram that came without its ICRC (link.Packet.Unsealed)
	// has nothing to check: memory between engines of this host.
	if !e.cfg.NoICRC && !p.Unsealed && !e.verifyICRC(p, data) {
		e.drop(fabric.DropChecksum)
		return
	}
	op := pkt.OpCode()
	if op == wire.OpCNP {
		return // congestion notification: no rate control yet
	}
	if pkt.BTH.DestQP() == gsiQPN {
		e.gsiInput(&pkt, p.Addr.Addr().Unmap())
		return
	}
	e.objMu.RLock()
	qp := e.qps[pkt.BTH.DestQP()]
	e.objMu.RUnlock()
	if qp == nil {
		e.drop(fabric.DropOther)
		return
	}
	qp.input(&pkt, p.Addr.Addr().Unmap())
}

// parseLent parses a datagram that a ring lent (link.Packet.Unsealed:
// see link.ShmLink.ReadBatch): memory that other processes map, which a
// faulty or hostile one may write while the engine reads it. Its headers
// are read once, from the poller's copy (wire.ParseShared), so that no
// change can make the engine use a header the parse did not find (a
// panic); a datagram for QP 1, a MAD that the CM reads field by field, is
// copied whole. Other payloads stay in the ring: the engine only copies
// them, and their bounds are the parse's.
func (e *Engine) parseLent(data []byte) (wire.Packet, error) {
	pkt, err := wire.ParseShared(data, &e.lentHdr)
	if err == nil && pkt.BTH.DestQP() == gsiQPN {
		pkt.Payload = e.lentMAD[:copy(e.lentMAD[:], pkt.Payload)]
	}
	if lentHook != nil {
		lentHook(data)
	}
	return pkt, err
}

// verifyICRC checks the ICRC of a received datagram over the headers it
// came with, or, if the link does not show them, over rebuilt ones.
func (e *Engine) verifyICRC(p *link.Packet, data []byte) bool {
	want := binary.LittleEndian.Uint32(data[len(data)-wire.ICRCSize:])
	if p.Off >= 28 {
		crc, err := wire.ICRCParts(p.Buf[:p.Off+wire.BTHSize], data[wire.BTHSize:len(data)-wire.ICRCSize])
		return err == nil && crc == want
	}
	// A heap buffer of the engine's (the CRC code lets its arguments
	// escape): the poller owns it.
	hbuf := e.icrcBuf[:]
	src := p.Addr.Addr().Unmap()
	hl := wire.PseudoHeaders(hbuf, src, e.local, p.SrcPort, len(data))
	copy(hbuf[hl:], data[:wire.BTHSize])
	crc, err := wire.ICRCParts(hbuf[:hl+wire.BTHSize], data[wire.BTHSize:len(data)-wire.ICRCSize])
	if err != nil || crc == want {
		return err == nil
	}
	// The datagrams of a UDP GSO send carry the identifications 0, 1,
	// 2, ... (see UDPConfig.GSO), which a receiver that sees no IP
	// header must find.
	if !src.Is4() {
		return false
	}
	_, ok := e.ids.Find(8+len(data), crc, want)
	return ok
}

// sealICRC fills in the ICRC of a datagram about to be sent from the
// engine to dst with UDP source port sport, unless it goes into a ring
// (shm is the packet's link.Packet.Shm, see unsealed): it returns whether
// it left the ICRC out, the packet's link.Packet.Unsealed. hbuf is
// scratch space of at least 48+wire.BTHSize bytes that the caller owns.
func (e *Engine) sealICRC(hbuf []byte, data []byte, dst netip.Addr, sport uint16, shm bool) bool {
	if e.unsealed(shm) {
		return true
	}
	wire.SealICRC(hbuf, data, e.local, dst, sport)
	return false
}

// unsealed is the rule of the ICRC on a ring: whether a packet the engine
// sends, marked Shm or not (link.Packet.Shm), goes out without its ICRC
// (link.Packet.Unsealed). Only one the link writes into the
// shared-memory ring of a peer engine of this host does: every packet of
// a ShmLink, and one marked Shm on an AutoLink that has a ring (which
// writes it nowhere else: a ring that is gone drops it). Everything
// else, UDP and AF_XDP, and any link the engine does not know (one
// wrapping a ring, as LossyLink, which may corrupt what it carries),
// carries the ICRC. The ring fills it in itself where the reader would
// check it (see link.ShmLink, "The ICRC on a ring").
func (e *Engine) unsealed(shm bool) bool {
	return e.ringAll || shm && e.ringShm
}

// sealICRCFrom fills in the ICRC of a datagram as if src had sent it to
// the engine (for tests that inject packets).
func (e *Engine) sealICRCFrom(data []byte, src netip.Addr, sport uint16) {
	var hbuf [48 + wire.BTHSize]byte
	wire.SealICRC(hbuf[:], data, src, e.local, sport)
}

// send writes packets to the link, retrying briefly on backpressure.
// Packets it cannot place are dropped (and recovered by retransmission).
// A write that fails drops only the packet it failed at: the others,
// often other QPs' to other peers, still go (one QP whose source port
// cannot be bound, or one unreachable peer, took every packet after it
// in the batch with it).
func (e *Engine) send(pkts []link.Packet) {
	var bytes uint64
	for i := range pkts {
		bytes += uint64(pkts[i].N)
	}
	for tries := 0; len(pkts) > 0; tries++ {
		n, err := e.link.WriteBatch(pkts)
		e.stats.TxPackets.Add(uint64(n))
		pkts = pkts[n:]
		if err != nil && len(pkts) > 0 {
			e.stats.Drops[fabric.DropNoBuffer].Add(1)
			bytes -= uint64(pkts[0].N)
			pkts = pkts[1:]
			continue
		}
		if n == 0 && tries > 100 {
			e.stats.Drops[fabric.DropNoBuffer].Add(uint64(len(pkts)))
			return
		}
		if n == 0 {
			// The receiver frees space only when it runs (a ShmLink's
			// ring, in this process perhaps, on as few as one core).
			runtime.Gosched()
		}
	}
	e.stats.TxBytes.Add(bytes)
}

// evlog records an event in the engine's debug ring (WEFT_ROCE_DEBUG).
func (e *Engine) evlog(what string, a, b int, err error) {
	e.evMu.Lock()
	e.ev[e.evN%len(e.ev)] = debugEvent{t: time.Now(), what: what, a: a, b: b, err: err}
	e.evN++
	e.evMu.Unlock()
}

type debugEvent struct {
	t    time.Time
	what string
	a, b int
	err  error
}

// debugEvents returns the recent debug events, oldest first.
func (e *Engine) debugEvents() []string {
	e.evMu.Lock()
	defer e.evMu.Unlock()
	var out []string
	for i := 0; i < len(e.ev); i++ {
		ev := e.ev[(e.evN+i)%len(e.ev)]
		if ev.what != "" {
			out = append(out, fmt.Sprintf("%s %s %d %d %v", ev.t.Format("15:04:05.000000"), ev.what, ev.a, ev.b, ev.err))
		}
	}
	return out
}
