package link

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/shm"
	"github.com/weft-io/weft/internal/wake"
)

// ShmLink is a Link between engines of one host, in one process or many,
// through shared memory instead of the kernel's network stack: each
// engine's address (IP and port) names an inbound ring, a file in
// ShmConfig.Dir, that every other ShmLink of the host may append
// datagrams to. It stays a RoCEv2 link: the datagrams are the ones a
// UDPLink sends, except that their ICRC may be left out (below); one that
// carries it is checked by the receiving engine over rebuilt IP and UDP
// headers (identification 0), as on a UDP socket without the raw one.
//
// Use it for co-located services and tests, where every engine of the
// fabric uses it (the address parameter link=shm): an engine on a
// ShmLink neither sends to nor hears engines on UDP. The filesystem, not
// the network namespace, joins the engines, so engines in different
// namespaces of one host reach each other by the addresses their rings
// are named after, which must therefore be unique on the host.
//
// The ring is multi-producer, single-consumer: a producer claims a slot
// by compare-and-swap on the tail and publishes it through the slot's
// sequence word (D. Vyukov's bounded queue). The consumer lends its
// caller the slots of the datagrams it can trust to stay as they are (see
// ReadBatch) and copies the others out before the engine parses them, so
// a producer writing late into shared memory cannot change a packet under
// the parser. A full ring pushes back on the sender (WriteBatch takes
// fewer). A ring whose owner
// closed it, or whose owner died, takes datagrams and drops them, as a
// network drops datagrams to a host that is down, after one lock probe
// when the ring fills. A consumer that finds a slot claimed but
// unpublished for longer than a second, by a producer that died
// mid-copy, skips it, so no peer can stall a ring for good; a producer
// that merely stalled that long loses its datagram, and one that finishes
// its copy into a slot reused meanwhile is caught (below).
//
// # The ICRC on a ring
//
// A ring is memory between two Weft engines of one host: no wire, switch
// or NIC can flip its bits, and nothing but the two engines sees what it
// carries (no capture, no rxe peer). An engine therefore sends the
// datagrams it writes into rings without their ICRC (Packet.Unsealed,
// decided per packet by the engine: see package roce), and the slot says
// so to the reader, which returns the datagram with Unsealed set: its
// engine does not check it. What the ICRC still guards on a ring is the
// one way a slot can be written by two producers, a producer stalled
// mid-copy past the consumer's skip, and that is counted instead: each
// producer counts itself into the slot's port word before it looks at
// the slot's sequence (and writes nothing if the slot was skipped), and
// out after its copy, unless the slot was skipped meanwhile. Any producer
// that may still write into a slot is therefore counted there, for good,
// before the slot's next tenant publishes it, and a reader that finds the
// count above zero in a published slot knows another writer may reach
// it. Such a datagram is dropped
// if unsealed (counted in Torn, recovered as a loss), checked as usual if
// sealed, and the ring's header then asks every producer to seal from
// then on (shmTorn). A producer seals too for a ring whose owner did not
// say, in the header, that it reads unsealed datagrams: an unsealed
// datagram reaches only a reader that knows it. Engines of version 1,
// whose producers do not count themselves, and this version do not open
// each other's rings at all (shmVersion): link=auto joins them over UDP.
//
// A consumer with nothing to read sleeps on a named pipe beside its ring
// (the ring's file name with ".bell"), parked in Go's netpoller
// (internal/wake): an idle link holds no OS thread. It announces itself
// in the ring's header, re-checks the ring, then parks; a producer
// publishes, then rings the pipe if the header says a consumer sleeps. A
// ring no pipe wakes (a peer of an earlier version, which rang a futex
// in the header; a directory where no pipe can be made) is still read: a
// parked consumer looks at its ring at least every 100 ms, and one
// without a pipe polls it in short sleeps.
type ShmLink struct {
	local netip.AddrPort
	cfg   ShmConfig
	f     *os.File // the inbound ring; holds the owner's OFD lock
	mem   []byte
	r     ring

	memMu   sync.RWMutex // the mapping: Close takes it to unmap
	readMu  sync.Mutex   // ReadBatch (one poller at a time)
	stuck   uint64       // the position the consumer last found unpublished
	stuckAt time.Time    // when it first did
	closed  atomic.Bool
	closeMu sync.Mutex
	wmu     sync.Mutex // WriteBatch, and peers
	peers   map[netip.AddrPort]*shmPeer
	drops   atomic.Uint64
	// torn counts the unsealed datagrams ReadBatch dropped from slots a
	// stalled producer may have written into.
	torn atomic.Uint64
	// lent is the positions of the slots the last ReadBatch lent its
	// caller (readMu).
	lent []uint64
	// sealHdr is WriteBatch's scratch for a datagram it seals (wmu).
	sealHdr sealHdr

	// bell is the pipe producers ring while WaitRead sleeps; nil if it
	// could not be made (WaitRead then polls in short sleeps).
	bell *wake.Parker
	// slice is how long one park lasts at most before WaitRead looks at
	// the ring again (0: until rung), for wake-ups no pipe carries.
	slice time.Duration
	// idle is a waiter left by the last WaitRead, so that waiting
	// allocates nothing.
	idle atomic.Pointer[shmWaiter]
	// parks counts WaitRead's parks on the bell.
	parks atomic.Uint64
}

// ShmConfig configures a ShmLink. The zero value is the default.
type ShmConfig struct {
	// Dir is the directory of the rings (default /dev/shm).
	Dir string
	// Slots is the number of datagrams an inbound ring holds, a power of
	// two (default 1024, 4.5 MB: a queue pair's largest window). Senders
	// use the ring's own size, read from its header.
	Slots int
}

// DefaultShmDir is where ShmLink rings live by default.
const DefaultShmDir = "/dev/shm"

// Layout of a ring file: a header page, then the slots.
const (
	shmMagic = 0x4c535257 // "WRSL"
	// shmVersion 2: datagrams may be unsealed, and producers count
	// themselves into slots. A producer of version 1 does not, so one
	// stalled past the consumer's skip could write unseen into an
	// unsealed datagram: the versions do not open each other's rings
	// (link=auto then joins them over UDP).
	shmVersion = 2

	shmOffMagic    = 0
	shmOffVersion  = 4
	shmOffSlots    = 8
	shmOffSlotSize = 12
	shmOffClosed   = 16  // 1 once the owner has closed the ring
	shmOffSeal     = 20  // shmReadsUnsealed, shmTorn (see "The ICRC on a ring")
	shmOffTail     = 64  // producers' claim counter (own cache line)
	shmOffSleeping = 128 // not 0 while the consumer sleeps (see below)
	shmOffBell     = 132 // unused (see below)
	shmOffHead     = 192 // the consumer's position (own cache line)
	shmHeader      = 4096
	// Producers ring the consumer's bell only while the word at
	// shmOffSleeping is not 0. This version counts its sleeping
	// WaitReads there (earlier ones stored 1 and 0), and its bell is a
	// named pipe beside the ring (shmBellPath); the word at shmOffBell
	// is the futex earlier versions slept on and producers rang, which
	// this version neither sleeps on nor rings.

	// A slot: the sequence word, the datagram's length, source port and
	// address, then the datagram.
	slotOffSeq  = 0
	slotOffLen  = 8
	slotOffPort = 12 // the source port; slotUnsealed; the writers (slotWriter)
	slotOffAddr = 16
	slotOffData = 32
	shmSlotSize = (slotOffData + MaxPacket + 63) &^ 63

	// The word at shmOffSeal: the owner reads unsealed datagrams
	// (shmReadsUnsealed, set when it makes the ring: rings of earlier
	// versions have 0 there), and it found a slot a stalled producer may
	// still write (shmTorn: producers seal every datagram from then on).
	shmReadsUnsealed = 1
	shmTorn          = 2
	// The port word of a slot: the source port in the low 16 bits, bit
	// 16 set for a datagram written unsealed (Packet.Unsealed), and in
	// the top byte the producers inside their copy into the slot, each
	// adding slotWriter before it and taking it off after it unless the
	// consumer skipped the slot meanwhile (see "The ICRC on a ring").
	slotUnsealed = 1 << 16
	slotWriter   = 1 << 24

	defaultShmSlots = 1024
	maxShmSlots     = 1 << 16
	// shmStuck is how long a claimed slot may stay unpublished before the
	// consumer skips it.
	shmStuck = time.Second

	// shmSlice is how long WaitRead parks on its bell at most before it
	// looks at the ring again, for datagrams no ring announced.
	shmSlice = 100 * time.Millisecond
	// shmPollStep is WaitRead's sleep between looks at the ring when it
	// has no bell.
	shmPollStep = 200 * time.Microsecond
	// shmMute is how long a producer stops ringing a peer's bell after a
	// ring found no reader (an earlier version's peer, or one without a
	// pipe): that peer reads its ring on its own.
	shmMute = 100 * time.Millisecond
)

// ring is a view of one ring's memory, checked once when mapped.
type ring struct {
	mem   []byte
	slots uint64
	tail  *atomic.Uint64
	head  *atomic.Uint64
	sleep *atomic.Uint32
	shut  *atomic.Uint32
	seal  *atomic.Uint32 // shmOffSeal
}

// port returns the port word of slot i (slotOffPort).
func (r *ring) port(i uint64) *atomic.Uint32 {
	return shm.U32(r.mem, shmHeader+int(i&(r.slots-1))*shmSlotSize+slotOffPort)
}

func (r *ring) seq(i uint64) *atomic.Uint64 {
	return shm.U64(r.mem, shmHeader+int(i&(r.slots-1))*shmSlotSize+slotOffSeq)
}

func (r *ring) slot(i uint64) []byte {
	off := shmHeader + int(i&(r.slots-1))*shmSlotSize
	return r.mem[off : off+shmSlotSize : off+shmSlotSize]
}

// view checks a mapped ring's header and returns its view; the header's
// figures come from whoever made the file, so they are checked against
// the mapping before any slot is touched.
func view(mem []byte) (ring, error) {
	if len(mem) < shmHeader {
		return ring{}, errors.New("shorter than its header")
	}
	if shm.Get32(mem, shmOffMagic) != shmMagic || shm.Get32(mem, shmOffVersion) != shmVersion {
		return ring{}, errors.New("not a ring of this version")
	}
	n := uint64(shm.Get32(mem, shmOffSlots))
	if n == 0 || n > maxShmSlots || n&(n-1) != 0 || shm.Get32(mem, shmOffSlotSize) != shmSlotSize {
		return ring{}, errors.New("bad geometry")
	}
	if uint64(len(mem)) < shmHeader+n*shmSlotSize {
		return ring{}, errors.New("shorter than its slots")
	}
	return ring{mem: mem, slots: n, tail: shm.U64(mem, shmOffTail), head: shm.U64(mem, shmOffHead),
		sleep: shm.U32(mem, shmOffSleeping), shut: shm.U32(mem, shmOffClosed), seal: shm.U32(mem, shmOffSeal)}, nil
}

// shmPeer is a ring this link sends to.
type shmPeer struct {
	f    *os.File
	mem  []byte
	r    ring
	dead bool // the ring's owner is gone: drop what is sent to it
	bell *wake.Ringer
	// mute is when the bell may be rung again after a ring that found
	// no reader (zero: it may).
	mute time.Time
}

// shmPath returns the file of the ring of address a in dir (default
// DefaultShmDir).
func shmPath(dir string, a netip.AddrPort) string {
	if dir == "" {
		dir = DefaultShmDir
	}
	return filepath.Join(dir, "weft-roce-"+a.String())
}

// shmBellPath returns the named pipe beside the ring file ring, which its
// consumer sleeps on.
func shmBellPath(ring string) string { return ring + ".bell" }

// ListenShm opens a ShmLink at addr (port 0 means Port): it creates the
// address's inbound ring, or takes over one whose owner is gone. It fails
// with an error matching fabric.ErrInvalid if the configuration is
// invalid, and one matching syscall.EADDRINUSE, as a UDP bind would, if a
// live link holds the address. The ring file is the user's own (mode
// 0600): the engines of one fabric run as one user.
func ListenShm(addr netip.AddrPort, cfg ShmConfig) (*ShmLink, error) {
	if addr.Port() == 0 {
		addr = netip.AddrPortFrom(addr.Addr(), Port)
	}
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	if cfg.Dir == "" {
		cfg.Dir = DefaultShmDir
	}
	if cfg.Slots == 0 {
		cfg.Slots = defaultShmSlots
	}
	if cfg.Slots < 0 || cfg.Slots > maxShmSlots || cfg.Slots&(cfg.Slots-1) != 0 {
		return nil, fmt.Errorf("roce: shm link: %d slots: want a power of two up to %d: %w", cfg.Slots, maxShmSlots, fabric.ErrInvalid)
	}
	if !addr.Addr().IsValid() || addr.Addr().IsUnspecified() {
		return nil, fmt.Errorf("roce: shm link: address %v: want a unicast address that names the ring: %w", addr, fabric.ErrInvalid)
	}
	path := shmPath(cfg.Dir, addr)
	size := shmHeader + cfg.Slots*shmSlotSize
	// A new file under a temporary name, initialised and locked, then
	// given the address's name (takeShm): a sender never maps a half-made
	// ring, and a sender still mapping a dead owner's old file finds it
	// closed.
	tmp, err := os.CreateTemp(cfg.Dir, ".weft-roce-*")
	if err != nil {
		return nil, fmt.Errorf("roce: shm link: %w", err)
	}
	fail := func(err error) (*ShmLink, error) {
		os.Remove(tmp.Name())
		tmp.Close()
		return nil, err
	}
	if err := lockByte(tmp, 0, false); err != nil {
		return fail(fmt.Errorf("roce: shm link: lock: %w", err))
	}
	if err := tmp.Truncate(int64(size)); err != nil {
		return fail(fmt.Errorf("roce: shm link: %w", err))
	}
	mem, err := unix.Mmap(int(tmp.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("roce: shm link: mmap: %w", err))
	}
	shm.Put32(mem, shmOffMagic, shmMagic)
	shm.Put32(mem, shmOffVersion, shmVersion)
	shm.Put32(mem, shmOffSlots, uint32(cfg.Slots))
	shm.Put32(mem, shmOffSlotSize, shmSlotSize)
	shm.Put32(mem, shmOffSeal, shmReadsUnsealed)
	r, _ := view(mem)
	for i := uint64(0); i < r.slots; i++ {
		r.seq(i).Store(i)
	}
	bell, err := takeShm(tmp, path)
	if err != nil {
		unix.Munmap(mem)
		return fail(err)
	}
	l := &ShmLink{local: addr, cfg: cfg, f: tmp, mem: mem, r: r, peers: map[netip.AddrPort]*shmPeer{},
		bell: bell, slice: shmSlice}
	return l, nil
}

// shmTakeHook, if set, runs in ListenShm before it takes the address
// (takeover false), and when it is about to replace a dead owner's file
// (true): tests start another engine there at that moment.
var shmTakeHook func(takeover bool)

// takeShm gives the address's name, path, to the new ring file tmp
// (locked, initialised), and returns the ring's bell (nil: none could be
// made; WaitRead then polls). A name nobody holds is taken by a hard
// link, which fails if another engine took it first: of two engines that
// start together one wins and the other finds it live, where renaming
// over the name let both believe they owned the ring, one of them with a
// file nobody writes to. A dead owner's file is replaced by one successor
// only: the one whose lock of it (the owner's byte, free since its death)
// succeeds while the name is still that file; the others find it locked,
// as if live, then the successor's. It fails with an error matching syscall.EADDRINUSE while a
// live engine holds the name, or another takes it over.
func takeShm(tmp *os.File, path string) (*wake.Parker, error) {
	inUse := func() (*wake.Parker, error) {
		return nil, fmt.Errorf("roce: shm link: %s is held by a running engine: %w", path, unix.EADDRINUSE)
	}
	if shmTakeHook != nil {
		shmTakeHook(false)
	}
	for {
		err := os.Link(tmp.Name(), path)
		if err == nil {
			os.Remove(tmp.Name())
			// The bell, now that the name is ours (a pipe of its owner's
			// that died with no ring is taken over as it is). A sender
			// that finds the ring first finds no reader and reads the
			// ring on its own for a while (see shmMute).
			bell, err := wake.ListenFIFO(shmBellPath(path))
			if err != nil {
				bell = nil
			}
			return bell, nil
		}
		if !errors.Is(err, os.ErrExist) {
			// No hard links here: rename over the name, as a first
			// owner can (and two that start together may both).
			return replaceShm(tmp, path)
		}
		old, err := os.OpenFile(path, os.O_RDWR, 0)
		if errors.Is(err, os.ErrNotExist) {
			continue // its owner closed it meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("roce: shm link: %w", err)
		}
		if lockByte(old, 0, false) != nil {
			old.Close()
			return inUse()
		}
		ost, err1 := old.Stat()
		st, err2 := os.Stat(path)
		if err1 != nil || err2 != nil || !os.SameFile(st, ost) {
			old.Close() // replaced meanwhile: look again
			continue
		}
		markClosed(old)
		if shmTakeHook != nil {
			shmTakeHook(true)
		}
		bell, err := replaceShm(tmp, path)
		old.Close() // and its lock, now that the name is ours
		return bell, err
	}
}

// replaceShm renames tmp over path, making the bell first: a dead
// owner's pipe is taken over as it is.
func replaceShm(tmp *os.File, path string) (*wake.Parker, error) {
	bell, err := wake.ListenFIFO(shmBellPath(path))
	if err != nil {
		bell = nil
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		if bell != nil {
			bell.Close()
		}
		return nil, fmt.Errorf("roce: shm link: %w", err)
	}
	return bell, nil
}

// markClosed sets the closed flag of a ring file whose owner is gone, so
// that senders still mapping it stop queueing into it.
func markClosed(f *os.File) {
	st, err := f.Stat()
	if err != nil || st.Size() < shmHeader {
		return
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, shmHeader, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return
	}
	shm.U32(mem, shmOffClosed).Store(1)
	unix.Munmap(mem)
}

// LocalAddr implements Link.
func (l *ShmLink) LocalAddr() netip.AddrPort { return l.local }

// Lossless reports true: a full ring pushes back (WriteBatch takes fewer
// datagrams) where a network queue would drop, so the engine may keep a
// window larger than the queues of a network path (see roce's
// maxInflight).
func (l *ShmLink) Lossless() bool { return true }

// Drops returns how many datagrams the link took and dropped because
// their destination had no ring, a malformed one or one whose owner is
// gone.
func (l *ShmLink) Drops() uint64 { return l.drops.Load() }

// Torn returns how many unsealed datagrams (Packet.Unsealed) ReadBatch
// dropped because a stalled producer may have written into their slots
// (see "The ICRC on a ring" in ShmLink's doc).
func (l *ShmLink) Torn() uint64 { return l.torn.Load() }

// ReadBatch implements Link. A datagram longer than its slot (written by
// a faulty peer) is returned with N -1.
//
// A datagram written unsealed (Packet.Unsealed) by a producer that no
// other may have followed into its slot is not copied: its packet's Buf
// is pointed at the slot, which stays the reader's, lent, until the next
// ReadBatch, ReturnLent or Close, as XDPLink lends its frames (the
// engine returns a batch's slots before it acknowledges it, and processes
// each batch under its poll lock, which Close takes). Its producer counts
// itself in the slot and nothing else writes there before the release
// (see "The ICRC on a ring"). Every other datagram, sealed (a producer of
// an earlier version, a ring that seals) or torn, is copied into the
// caller's Buf, so that a producer writing late cannot change it under
// the ICRC's check. A writer that keeps to none of this (a faulty or
// hostile process, or an earlier version's producer that stalled past a
// skip, which does not count itself in) can still change a lent datagram
// while it is read: its reader reads each header field once, from a copy
// (wire.ParseShared), as the engine does.
func (l *ShmLink) ReadBatch(pkts []Packet) (int, error) {
	l.readMu.Lock()
	defer l.readMu.Unlock()
	l.memMu.RLock()
	defer l.memMu.RUnlock()
	if l.closed.Load() {
		return 0, os.ErrClosed
	}
	r := &l.r
	l.returnLentLocked() // the slots the last call lent are the producers' again
	got := 0
	head := r.head.Load()
	for got < len(pkts) {
		seq := r.seq(head)
		s := seq.Load()
		if s != head+1 {
			if s == head && r.tail.Load() > head && l.skipStuck(head) {
				// Claimed, never published: the producer died mid-copy.
				if seq.CompareAndSwap(head, head+r.slots) {
					head++
				}
				continue
			}
			break
		}
		slot := r.slot(head)
		p := &pkts[got]
		n := int(shm.Get32(slot, slotOffLen))
		// Published: a producer that may still write into the slot (one
		// stalled past a skip) counts in the word by now, and for good.
		w := r.port(head).Load()
		port := uint16(w)
		p.Off = 0
		p.Addr = netip.AddrPortFrom(netip.AddrFrom16([16]byte(slot[slotOffAddr:slotOffAddr+16])).Unmap(), port)
		p.SrcPort = port
		p.Unsealed = w&slotUnsealed != 0
		torn := w >= slotWriter
		if torn {
			// A stalled producer may write into it: a sealed datagram's
			// ICRC tells, an unsealed one is lost, as a datagram the ICRC
			// refused. Every producer seals from now.
			r.seal.Or(shmTorn)
			if p.Unsealed {
				l.torn.Add(1)
				p.Unsealed = false // pkts[got] is read into again, perhaps by UDP
				seq.Store(head + r.slots)
				head++
				continue
			}
		}
		switch {
		case n > MaxPacket:
			p.N = -1
			seq.Store(head + r.slots)
		case p.Unsealed:
			p.Buf, p.N = slot[slotOffData:slotOffData+n:slotOffData+n], n
			l.lent = append(l.lent, head)
		case n > len(p.Buf):
			p.N = -1
			seq.Store(head + r.slots)
		default:
			p.N = copy(p.Buf, slot[slotOffData:slotOffData+n])
			seq.Store(head + r.slots)
		}
		head++
		got++
	}
	r.head.Store(head)
	return got, nil
}

// ReturnLent implements Lender: the slots the last ReadBatch lent are the
// producers' again, before the next ReadBatch.
func (l *ShmLink) ReturnLent() {
	l.readMu.Lock()
	defer l.readMu.Unlock()
	l.memMu.RLock()
	defer l.memMu.RUnlock()
	if l.closed.Load() {
		return
	}
	l.returnLentLocked()
}

// returnLentLocked gives the lent slots back. The caller holds readMu
// and memMu (read), on an open link.
func (l *ShmLink) returnLentLocked() {
	for _, pos := range l.lent {
		l.r.seq(pos).Store(pos + l.r.slots)
	}
	l.lent = l.lent[:0]
}

// skipStuck reports whether the slot at pos has been claimed and
// unpublished for longer than shmStuck.
func (l *ShmLink) skipStuck(pos uint64) bool {
	now := time.Now()
	if l.stuck != pos+1 {
		l.stuck, l.stuckAt = pos+1, now
		return false
	}
	return now.Sub(l.stuckAt) > shmStuck
}

// WriteBatch implements Link. A full ring takes fewer (backpressure); a
// destination without a live ring takes the datagrams and drops them.
func (l *ShmLink) WriteBatch(pkts []Packet) (int, error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.closed.Load() {
		return 0, os.ErrClosed
	}
	src := l.local.Addr().As16()
	var wake *shmPeer
	for i := range pkts {
		p := &pkts[i]
		peer := l.peer(p.Addr)
		if peer == nil || peer.dead || p.N < 0 || p.N > MaxPacket || p.N > len(p.Buf) {
			l.drops.Add(1)
			continue
		}
		r := &peer.r
		if r.shut.Load() != 0 {
			peer.dead = true
			l.drops.Add(1)
			continue
		}
		pos, ok := claim(r)
		if !ok {
			if !ownerAlive(peer.f) {
				peer.dead = true
				l.drops.Add(1)
				continue
			}
			l.ring(wake)
			return i, nil
		}
		slot := r.slot(pos)
		// Count in, then look: a consumer that skips the slot after this
		// writer looked finds it counted (see "The ICRC on a ring"); one
		// that skipped it before leaves it nothing to write.
		pw := r.port(pos)
		pw.Add(slotWriter)
		if r.seq(pos).Load() != pos {
			pw.Add(^uint32(slotWriter - 1))
			continue // the datagram is lost, as on a network
		}
		sport := p.SrcPort
		if sport == 0 {
			sport = l.local.Port()
		}
		var mark uint32
		if p.Unsealed {
			if r.seal.Load() == shmReadsUnsealed {
				mark = slotUnsealed
			} else {
				// A ring of an earlier version, or one a stalled producer
				// may write into: the datagram carries its ICRC.
				seal(p, l.local, &l.sealHdr)
			}
		}
		copy(slot[slotOffData:], p.Buf[:p.N])
		shm.Put32(slot, slotOffLen, uint32(p.N))
		copy(slot[slotOffAddr:slotOffAddr+16], src[:])
		// The port and the mark, keeping the writers' count; this writer
		// leaves it unless the consumer skipped the slot meanwhile, whose
		// next tenant it may have written over.
		left := uint32(slotWriter)
		if r.seq(pos).Load() != pos {
			left = 0
		}
		for {
			o := pw.Load()
			if pw.CompareAndSwap(o, (o&^(slotWriter-1))-left|mark|uint32(sport)) {
				break
			}
		}
		// A consumer that gave up on this slot has moved its sequence on:
		// then the datagram is lost, as on a network.
		r.seq(pos).CompareAndSwap(pos, pos+1)
		if wake != peer {
			l.ring(wake)
			wake = peer
		}
	}
	l.ring(wake)
	return len(pkts), nil
}

// claim takes the next slot of r for a producer.
// A ring is shared with other processes, so the loop is bounded: words
// that never settle (a faulty peer) read as a full ring.
func claim(r *ring) (uint64, bool) {
	for range 1024 {
		pos := r.tail.Load()
		s := r.seq(pos).Load()
		switch {
		case s == pos:
			if r.tail.CompareAndSwap(pos, pos+1) {
				return pos, true
			}
		case s < pos:
			return 0, false // full: the consumer has not freed this slot yet
		}
		// Another producer took pos: try the next.
	}
	return 0, false
}

// ring wakes p's consumer if it sleeps. The caller has published what
// it wrote (sequentially consistent stores, as the consumer's announce
// is): either the consumer's re-check sees it or this sees the consumer.
// A ring that finds no reader mutes p's bell for a while: the consumer
// reads its ring on its own (see ShmLink).
func (l *ShmLink) ring(p *shmPeer) {
	if p == nil || p.r.sleep.Load() == 0 {
		return
	}
	if !p.mute.IsZero() {
		if now := time.Now(); now.Before(p.mute) {
			return
		}
		p.mute = time.Time{}
	}
	if !p.bell.Ring() {
		p.mute = time.Now().Add(shmMute)
	}
}

// reaches reports whether a has a ring here that is open and whose owner
// is alive: a datagram written to it would be read.
func (l *ShmLink) reaches(a netip.AddrPort) bool {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.closed.Load() {
		return false
	}
	p := l.peer(a)
	return p != nil && !p.dead && p.r.shut.Load() == 0 && ownerAlive(p.f)
}

// ownerAlive reports whether a process holds the owner's lock of a ring.
func ownerAlive(f *os.File) bool {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 1}
	if unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk) != nil {
		return true // cannot tell: keep pushing back
	}
	return lk.Type != unix.F_UNLCK
}

// peer returns the ring of a, mapping it on first use; nil if there is
// none, or it is malformed (counted as drops by the caller). A ring that
// closed is looked up again, so a restarted peer is found.
func (l *ShmLink) peer(a netip.AddrPort) *shmPeer {
	a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
	p := l.peers[a]
	if p != nil && !p.dead {
		return p
	}
	if p != nil {
		// Dead: keep it while its file is still the address's (an owner
		// that died without removing it); let it go once the file is gone
		// or replaced. Its owner's Close removed the name, and the mapping
		// alone would keep the ring's memory.
		st, err := os.Stat(shmPath(l.cfg.Dir, a))
		if pst, perr := p.f.Stat(); err == nil && perr == nil && os.SameFile(st, pst) {
			return p
		}
		unix.Munmap(p.mem)
		p.f.Close()
		p.bell.Close()
		delete(l.peers, a)
	}
	path := shmPath(l.cfg.Dir, a)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil
	}
	st, err := f.Stat()
	if err != nil || st.Size() < shmHeader || st.Size() > shmHeader+maxShmSlots*shmSlotSize {
		f.Close()
		return nil
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil
	}
	r, err := view(mem)
	if err != nil {
		unix.Munmap(mem)
		f.Close()
		return nil
	}
	p = &shmPeer{f: f, mem: mem, r: r, bell: wake.NewRinger(shmBellPath(path))}
	l.peers[a] = p
	return p
}

// WaitRead implements Link: it parks on the link's bell, a named pipe in
// Go's netpoller (no OS thread blocks), until a sender rings it, and
// without a bell polls the ring in short sleeps.
func (l *ShmLink) WaitRead(ctx context.Context, deadline time.Time) error {
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, l.wakeSelf)
		defer stop()
	}
	l.memMu.RLock()
	defer l.memMu.RUnlock()
	if l.closed.Load() {
		return os.ErrClosed // and the mapping may be gone
	}
	r := &l.r
	for {
		if l.closed.Load() {
			return os.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		now := time.Now()
		var until time.Time // the end of this park (zero: none)
		if l.slice > 0 {
			until = now.Add(l.slice)
		}
		if !deadline.IsZero() {
			if !now.Before(deadline) {
				return nil
			}
			if until.IsZero() || deadline.Before(until) {
				until = deadline
			}
		}
		if l.bell == nil {
			if l.readable() {
				return nil
			}
			step := shmPollStep
			if !until.IsZero() {
				step = min(step, until.Sub(now))
			}
			time.Sleep(step)
			continue
		}
		// Announce, re-check, park: a sender that published before the
		// announce is seen here, one after it sees the announce and rings.
		r.sleep.Add(1)
		if l.readable() {
			r.sleep.Add(^uint32(0))
			return nil
		}
		err := l.park(ctx, now, until)
		r.sleep.Add(^uint32(0))
		if l.readable() {
			return nil
		}
		if err != nil && !l.closed.Load() {
			time.Sleep(shmPollStep) // a bell that fails: do not spin on it
		}
	}
}

// park waits on the bell until it rings and the ring is readable, the
// link closes, ctx ends or until passes (zero: no limit).
func (l *ShmLink) park(ctx context.Context, now, until time.Time) error {
	w := l.idle.Swap(nil)
	if w == nil {
		w = &shmWaiter{l: l}
		w.done = w.check
		w.timer = time.AfterFunc(time.Hour, l.bell.Ring)
		w.timer.Stop()
	}
	w.ctx, w.until = ctx, until
	if !until.IsZero() {
		w.timer.Reset(until.Sub(now))
	}
	l.parks.Add(1)
	err := l.bell.Wait(w.done)
	if !until.IsZero() {
		// A timer that fired meanwhile rings the bell once more: the
		// next wait wakes, re-checks and parks again.
		w.timer.Stop()
	}
	w.ctx = nil
	l.idle.Store(w)
	return err
}

// shmWaiter is park's state: the condition it hands the bell, made once,
// and the timer that ends a park at its limit.
type shmWaiter struct {
	l     *ShmLink
	ctx   context.Context
	until time.Time
	timer *time.Timer
	done  func() bool // check
}

func (w *shmWaiter) check() bool {
	return w.l.readable() || w.l.closed.Load() || w.ctx.Err() != nil ||
		(!w.until.IsZero() && !time.Now().Before(w.until))
}

// readable reports whether the next slot is published (or stuck, which
// ReadBatch must see to skip).
func (l *ShmLink) readable() bool {
	return l.r.tail.Load() > l.r.head.Load()
}

// readableOpen is readable for a caller that holds no lock: it reports
// os.ErrClosed once Close has begun (the mapping may be gone).
func (l *ShmLink) readableOpen() (bool, error) {
	l.memMu.RLock()
	defer l.memMu.RUnlock()
	if l.closed.Load() {
		return false, os.ErrClosed
	}
	return l.readable(), nil
}

// wakeSelf rings the link's own bell, to end a WaitRead (a cancelled
// context). A bell that Close has closed ignores it.
func (l *ShmLink) wakeSelf() {
	if l.bell != nil {
		l.bell.Ring()
	}
}

// Close implements Link: it marks the ring closed (senders drop what they
// send to it), removes its file and its bell and wakes a blocked
// WaitRead. It is idempotent.
func (l *ShmLink) Close() error {
	l.closeMu.Lock()
	defer l.closeMu.Unlock()
	if l.closed.Swap(true) {
		return nil
	}
	l.memMu.RLock()
	l.r.shut.Store(1)
	l.memMu.RUnlock()
	// Closing the bell ends a parked WaitRead and removes the pipe; it
	// goes before the ring's name, so a successor that finds no ring
	// makes a pipe of its own, not one this removes.
	if l.bell != nil {
		l.bell.Close()
	}
	// Remove the name only if it is still ours (a successor may hold it).
	path := shmPath(l.cfg.Dir, l.local)
	if st, err := os.Stat(path); err == nil {
		if own, err := l.f.Stat(); err == nil && os.SameFile(st, own) {
			os.Remove(path)
		}
	}
	l.readMu.Lock()
	l.wmu.Lock()
	l.memMu.Lock()
	for _, p := range l.peers {
		unix.Munmap(p.mem)
		p.f.Close()
		p.bell.Close()
	}
	l.peers = nil
	unix.Munmap(l.mem)
	l.mem = nil
	l.memMu.Unlock()
	l.wmu.Unlock()
	l.readMu.Unlock()
	return l.f.Close()
}
