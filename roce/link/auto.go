package link

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/internal/wake"
)

// AutoLink is the link of an engine that picks its carrier per peer: a
// UDPLink, which every RoCE peer can take, and beside it a ShmLink ring
// on the same address, which the engine's Weft peers on this host write
// to instead of sending UDP datagrams. The engine marks each packet it
// writes: Packet.Shm sends it through the destination's ring, otherwise
// it goes out on UDP. It reads both, and one WaitRead parks on both (an
// epoll set in Go's netpoller, holding the UDP socket and the ring's
// bell), so an idle engine still holds no OS thread.
//
// Which peers get shared memory is the engine's decision, made when a
// queue pair connects (package roce: the peer said, in the connection's
// exchange, that its engine owns the ring of its address, and the ring is
// there and alive). A packet marked Shm to an address without a live
// ring is dropped and counted, as a ShmLink drops it.
//
// A ring name is an address and port, one per host: an engine that finds
// its address's ring owned by another process (an engine of another
// network namespace with the same address, or of another process sharing
// the port) runs without one, UDP only (NewAutoLink with a nil ShmLink).
type AutoLink struct {
	udp *UDPLink
	shm *ShmLink // nil: no ring, UDP only

	set  *wake.Parker // epoll: the UDP socket, the ring's bell, kick
	kick *wake.Parker // eventfd: a deadline, a cancelled context, Close
	// udpSet is an epoll of the UDP socket alone, whose Ready tells
	// ReadBatch that the socket is empty without a receive (nil: read).
	udpSet *wake.Parker

	waitMu sync.Mutex // WaitRead (one waiter: the engine's loop)
	timer  *time.Timer
	ctxFn  func()

	skip      int         // ReadBatch: reads that found datagrams in the ring and left UDP unread
	udpHot    bool        // ReadBatch: the last read of UDP found datagrams: read again without asking
	udpDue    atomic.Bool // a WaitRead returned: read UDP next, whatever woke it
	counts    struct{ shmTx, shmRx, parks, bellWakes, udpSkips atomic.Uint64 }
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// autoUDPSkip is how many reads in a row that found datagrams in the ring
// may leave the UDP socket unread: reading it costs a system call, which
// the ring's datagrams should not pay on every poll, but UDP peers must
// not starve behind a busy ring. A read that finds the ring empty always
// looks at UDP: 0 from ReadBatch means neither holds anything, which the
// engine's timers rely on (a socket left unread while it held
// acknowledgements would look drained, and its QPs late). It looks
// without a receive where it can: the socket's readiness in an epoll set
// of its own (level triggered, so exact) costs a third of a receive that
// finds it empty, an engine's usual poll.
const autoUDPSkip = 4

// NewAutoLink returns a link over udp and shm, which must have the same
// local address; shm may be nil (UDP only). The AutoLink owns both: its
// Close closes them.
func NewAutoLink(udp *UDPLink, shm *ShmLink) (*AutoLink, error) {
	a := &AutoLink{udp: udp, shm: shm}
	if shm == nil || shm.bell == nil {
		// Without a bell the ring cannot wake a parked wait: keep the
		// ring (its datagrams are read on every poll) but wait as UDP
		// does, at most shmSlice at a time (WaitRead).
		return a, nil
	}
	var err error
	if a.set, err = wake.NewEpoll(); err != nil {
		return nil, err
	}
	if a.kick, err = wake.NewEventfd(); err != nil {
		a.set.Close()
		return nil, err
	}
	if a.udpSet, err = wake.NewEpoll(); err != nil {
		a.set.Close()
		a.kick.Close()
		return nil, err
	}
	rc := udp.rc
	if udp.raw != nil {
		rc = udp.rawRC
	}
	var werr error
	if err := rc.Control(func(fd uintptr) {
		if werr = a.set.Watch(int(fd)); werr == nil {
			werr = a.udpSet.Watch(int(fd))
		}
	}); err != nil {
		werr = err
	}
	if werr == nil {
		werr = a.set.Watch(shm.bell.FD())
	}
	if werr == nil {
		werr = a.set.Watch(a.kick.FD())
	}
	if werr != nil {
		a.set.Close()
		a.kick.Close()
		a.udpSet.Close()
		return nil, werr
	}
	a.timer = time.AfterFunc(time.Hour, a.kick.Ring)
	a.timer.Stop()
	a.ctxFn = a.kick.Ring
	return a, nil
}

// Shm reports whether the link has a ring of its own, which peers of
// this host can write to.
func (a *AutoLink) Shm() bool { return a.shm != nil }

// Reaches reports whether a has a live ring on this host: a Weft engine
// that uses shared memory owns it (see ShmLink).
func (a *AutoLink) Reaches(addr netip.AddrPort) bool {
	if a.shm == nil {
		return false
	}
	return a.shm.reaches(addr)
}

// UDP returns the link's UDP carrier.
func (a *AutoLink) UDP() *UDPLink { return a.udp }

// LocalAddr implements Link.
func (a *AutoLink) LocalAddr() netip.AddrPort { return a.udp.LocalAddr() }

// QPNBlock returns the block of QPNs whose packets the UDP link receives.
func (a *AutoLink) QPNBlock() uint32 { return a.udp.QPNBlock() }

// ShmDrops returns how many datagrams the ring side dropped (see
// ShmLink.Drops); 0 without a ring.
func (a *AutoLink) ShmDrops() uint64 {
	if a.shm == nil {
		return 0
	}
	return a.shm.Drops()
}

// AutoCounts are an AutoLink's counters.
type AutoCounts struct {
	// ShmTx and ShmRx count the datagrams written to peers' rings and
	// read from the link's own.
	ShmTx, ShmRx uint64
	// Parks counts the WaitReads that parked, and BellWakes those of them
	// that a producer's ring of the bell ended (not a deadline, nor UDP).
	Parks, BellWakes uint64
	// UDPSkips counts the reads of UDP that its socket's readiness
	// answered (empty) without a receive.
	UDPSkips uint64
	// ShmTorn counts the unsealed datagrams the ring dropped from slots a
	// stalled producer may have written into (ShmLink.Torn).
	ShmTorn uint64
}

// Counts returns the link's counters.
func (a *AutoLink) Counts() AutoCounts {
	c := AutoCounts{ShmTx: a.counts.shmTx.Load(), ShmRx: a.counts.shmRx.Load(), Parks: a.counts.parks.Load(),
		BellWakes: a.counts.bellWakes.Load(), UDPSkips: a.counts.udpSkips.Load()}
	if a.shm != nil {
		c.ShmTorn = a.shm.Torn()
	}
	return c
}

// ReadBatch implements Link: datagrams from the ring, and from UDP when
// the ring is empty; UDP first every autoUDPSkip+1 calls that found the
// ring busy, and at the first call after a wait.
func (a *AutoLink) ReadBatch(pkts []Packet) (int, error) {
	if a.shm == nil {
		return a.udp.ReadBatch(pkts)
	}
	if a.skip >= autoUDPSkip || a.udpDue.Load() {
		// UDP's turn, before the ring can fill the burst.
		a.skip = 0
		m, err := a.readUDP(pkts)
		if err != nil || m == len(pkts) {
			return m, err
		}
		n, err := a.readShm(pkts[m:])
		return m + n, err
	}
	n, err := a.readShm(pkts)
	if n > 0 || err != nil {
		a.skip++
		return n, err
	}
	return a.readUDP(pkts)
}

// ReturnLent implements Lender: the ring's lent slots go back.
func (a *AutoLink) ReturnLent() {
	if a.shm != nil {
		a.shm.ReturnLent()
	}
}

// readShm reads the ring.
func (a *AutoLink) readShm(pkts []Packet) (int, error) {
	n, err := a.shm.ReadBatch(pkts)
	a.counts.shmRx.Add(uint64(n))
	return n, err
}

// readUDP reads the UDP socket: not at all if its readiness says it is
// empty, unless the last read found datagrams (a stream's next read
// would only pay for the question).
func (a *AutoLink) readUDP(pkts []Packet) (int, error) {
	a.udpDue.Store(false)
	if !a.udpHot && a.udpSet != nil && !a.udpSet.Ready() {
		a.counts.udpSkips.Add(1)
		return 0, nil
	}
	n, err := a.udp.ReadBatch(pkts)
	a.udpHot = n > 0
	return n, err
}

// WriteBatch implements Link: each run of packets goes through the
// carrier its Shm field names. It returns at the first carrier that takes
// fewer than its run, with that carrier's error.
func (a *AutoLink) WriteBatch(pkts []Packet) (int, error) {
	i := 0
	for i < len(pkts) {
		viaShm := pkts[i].Shm && a.shm != nil
		j := i + 1
		for j < len(pkts) && (pkts[j].Shm && a.shm != nil) == viaShm {
			j++
		}
		var n int
		var err error
		if viaShm {
			n, err = a.shm.WriteBatch(pkts[i:j])
			a.counts.shmTx.Add(uint64(n))
		} else {
			n, err = a.udp.WriteBatch(pkts[i:j])
		}
		i += n
		if err != nil || i < j {
			return i, err
		}
	}
	return i, nil
}

// WaitRead implements Link: it parks until the UDP socket is readable or
// a producer rings the ring's bell, the deadline passes (zero: none), ctx
// is done or the link closes.
func (a *AutoLink) WaitRead(ctx context.Context, deadline time.Time) error {
	defer a.udpDue.Store(true)
	if a.set == nil {
		if a.shm != nil {
			// A ring without a bell: look at it every shmSlice at least.
			if d := time.Now().Add(shmSlice); deadline.IsZero() || d.Before(deadline) {
				deadline = d
			}
			if ready, err := a.shm.readableOpen(); ready || err != nil {
				return err
			}
		}
		return a.udp.WaitRead(ctx, deadline)
	}
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	a.waitMu.Lock()
	defer a.waitMu.Unlock()
	s := a.shm
	// The ring's mapping: Close unmaps it under the write lock, after it
	// has woken this wait.
	s.memMu.RLock()
	defer s.memMu.RUnlock()
	if a.closed.Load() || s.closed.Load() {
		return os.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	now := time.Now()
	// A datagram no producer announced (one that saw no sleeper) is
	// found within shmSlice, as ShmLink's own wait does.
	until := now.Add(shmSlice)
	if !deadline.IsZero() {
		if !now.Before(deadline) {
			return nil
		}
		if deadline.Before(until) {
			until = deadline
		}
	}
	// Announce, re-check, park: a producer that published before the
	// announce is seen here, one after it sees the announce and rings.
	r := &s.r
	r.sleep.Add(1)
	defer r.sleep.Add(^uint32(0))
	if s.readable() {
		return nil
	}
	a.timer.Reset(until.Sub(now))
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, a.ctxFn)
		defer stop()
	}
	a.counts.parks.Add(1)
	err := a.set.Wait(nil)
	a.timer.Stop()
	// The epoll set is level triggered: consume the wake-ups taken (a
	// datagram on UDP stays for ReadBatch).
	if kicked, rung := a.kick.Drain(), s.bell.Drain(); rung && !kicked {
		a.counts.bellWakes.Add(1)
	}
	if errors.Is(err, os.ErrClosed) || a.closed.Load() {
		return os.ErrClosed
	}
	if err != nil {
		return err
	}
	return ctx.Err()
}

// Close implements Link: it wakes a blocked WaitRead, then closes both
// carriers. It is idempotent.
func (a *AutoLink) Close() error {
	a.closeOnce.Do(func() {
		a.closed.Store(true)
		if a.kick != nil {
			a.kick.Ring()
		}
		a.closeErr = a.udp.Close()
		if a.shm != nil {
			if err := a.shm.Close(); a.closeErr == nil {
				a.closeErr = err
			}
		}
		// The wait has returned (it held the ring's mapping, which the
		// ring's Close waited for); its descriptors can go.
		a.waitMu.Lock()
		if a.set != nil {
			a.timer.Stop()
			a.set.Close()
			a.kick.Close()
			a.udpSet.Close()
		}
		a.waitMu.Unlock()
	})
	return a.closeErr
}
