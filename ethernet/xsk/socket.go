package xsk

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/weft-io/weft/fabric"
	"golang.org/x/sys/unix"
)

// BindMode selects copy or zero-copy mode.
type BindMode uint8

// Bind modes.
const (
	// ModeAuto tries zero-copy and falls back to copy mode when the
	// driver has no zero-copy support (Socket.ZeroCopy tells which).
	ModeAuto BindMode = iota
	// ModeCopy forces copy mode (XDP_COPY): works on every driver,
	// including generic (skb) XDP.
	ModeCopy
	// ModeZeroCopy forces zero-copy (XDP_ZEROCOPY); binding fails with an
	// error matching fabric.ErrNotSupported where the driver lacks it.
	ModeZeroCopy
)

// String returns "auto", "copy" or "zerocopy".
func (m BindMode) String() string {
	switch m {
	case ModeCopy:
		return "copy"
	case ModeZeroCopy:
		return "zerocopy"
	}
	return "auto"
}

// BusyPoll configures busy polling of the socket (SO_BUSY_POLL,
// SO_PREFER_BUSY_POLL, SO_BUSY_POLL_BUDGET). With it, the device's NAPI
// loop runs in the application's recvfrom/sendto/poll calls instead of
// in soft interrupts; the application must keep calling (Socket.Poll,
// Socket.Kick, Socket.WakeRX do).
type BusyPoll struct {
	// Timeout is SO_BUSY_POLL: how long a blocking call busy-polls the
	// device (0 disables busy polling).
	Timeout time.Duration
	// Budget is SO_BUSY_POLL_BUDGET: packets per busy-poll round (0: the
	// kernel's default, 8; libxdp's samples use 64).
	Budget int
	// Prefer sets SO_PREFER_BUSY_POLL: soft interrupts stay off while the
	// application polls (set the device's napi_defer_hard_irqs and
	// gro_flush_timeout too).
	Prefer bool
}

// Config configures a Socket. The zero value selects every default.
type Config struct {
	// RXSize and TXSize are ring sizes, powers of two (0: 2048). A
	// negative value leaves that ring out (a TX-only or RX-only socket).
	RXSize, TXSize int
	// FillSize and CompletionSize size the socket's own fill and
	// completion rings when it shares a UMEM with a socket on another
	// queue (0: the UMEM's sizes).
	FillSize, CompletionSize int
	// Mode selects zero-copy or copy mode (default ModeAuto).
	Mode BindMode
	// NoNeedWakeup disables need_wakeup (XDP_USE_NEED_WAKEUP), making
	// Kick a syscall on every TX burst.
	NoNeedWakeup bool
	// BusyPoll configures busy polling (default off).
	BusyPoll BusyPoll
	// TXBudget is XDP_MAX_TX_SKB_BUDGET: how many copy-mode frames one
	// sendto sends (0: the kernel's default, 32). Ignored where the kernel
	// lacks the option.
	TXBudget int
}

// Socket is an AF_XDP socket bound to one queue of one interface. Its
// rings are single-producer, single-consumer: one goroutine may drive RX
// (RX, Fill) and one TX (TX, Completion) at a time; Close may be called
// from any goroutine.
type Socket struct {
	fd       int
	umem     *UMEM
	ifindex  int
	queue    int
	zc       bool
	needWake bool
	busy     bool
	rx       RXRing
	tx       TXRing
	fill     *FillRing
	comp     *CompletionRing
	ownFill  FillRing
	ownComp  CompletionRing
	maps     [][]byte
	// rd and wr are the waits for the RX ring (readable) and the TX
	// ring (writable), each with an epoll instance in the Go runtime's
	// network poller: Poll parks the goroutine there, not the thread in
	// poll(2). Closing them wakes every waiter.
	rd, wr waiter
	// closing is closed by Close, waking the waiters that are not in
	// the poller (see waiter).
	closing  chan struct{}
	closed   atomic.Bool
	once     sync.Once
	closeErr error
	// refs counts system calls and waits in progress on fd and file,
	// plus closingBit once Close has started: Close closes the
	// descriptors and retires the rings only when no call uses them, so
	// a racing call never reaches a reused descriptor number or a ring
	// being unmapped.
	refs     atomic.Int64
	txBudget int
	// Kicks counts sendto/recvfrom wake-ups issued.
	Kicks atomic.Uint64
}

// NewSocket creates a socket on the given interface index and queue,
// using u for packet memory. The first socket of a UMEM uses the socket
// the UMEM is registered on; later ones share it with XDP_SHARED_UMEM.
// In ModeAuto a failed zero-copy bind is retried in copy mode on a fresh
// socket.
func NewSocket(u *UMEM, ifindex, queue int, cfg *Config) (*Socket, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.RXSize == 0 {
		c.RXSize = 2048
	}
	if c.TXSize == 0 {
		c.TXSize = 2048
	}
	for _, n := range []int{c.RXSize, c.TXSize} {
		if n > 0 && !pow2(n) {
			return nil, opErr("socket", fmt.Errorf("ring size %d: need a power of two: %w", n, errInvalid))
		}
	}
	if c.RXSize < 0 && c.TXSize < 0 {
		return nil, opErr("socket", fmt.Errorf("no RX and no TX ring: %w", errInvalid))
	}
	u.mu.Lock()
	shared := u.bound
	u.mu.Unlock()
	if shared {
		// Sockets sharing a UMEM take their mode and need_wakeup from
		// the UMEM's first socket; the kernel refuses flags on them.
		return newSocket(u, ifindex, queue, &c)
	}
	switch c.Mode {
	case ModeAuto:
		c.Mode = ModeZeroCopy
		s, err := newSocket(u, ifindex, queue, &c)
		if err == nil || !errors.Is(err, fabric.ErrNotSupported) {
			return s, err
		}
		c.Mode = ModeCopy
		return newSocket(u, ifindex, queue, &c)
	case ModeCopy, ModeZeroCopy:
		return newSocket(u, ifindex, queue, &c)
	}
	return nil, opErr("socket", fmt.Errorf("bind mode %d: %w", c.Mode, errInvalid))
}

func newSocket(u *UMEM, ifindex, queue int, c *Config) (*Socket, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed || u.refs == 0 {
		return nil, opErr("socket", fmt.Errorf("umem: %w", fabric.ErrClosed))
	}
	own := !u.bound
	needWake := !c.NoNeedWakeup
	if !own {
		needWake = u.needWake
	}
	s := &Socket{umem: u, ifindex: ifindex, queue: queue, fd: -1, needWake: needWake}
	var err error
	if own {
		s.fd = u.fd
		s.fill, s.comp = &u.fill, &u.comp
	} else {
		if s.fd, err = unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0); err != nil {
			return nil, opErr("socket", notSupported(os.NewSyscallError("socket", err)))
		}
	}
	fail := func(op string, err error) (*Socket, error) {
		s.unmap()
		if !own {
			unix.Close(s.fd)
		} else {
			// The UMEM's socket cannot be bound twice after a failed bind
			// with some kernels' state; give the UMEM a fresh one.
			if rerr := u.renewLocked(); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
		for _, w := range []*waiter{&s.rd, &s.wr} {
			if w.file != nil {
				w.file.Close()
			}
		}
		return nil, opErr(op, err)
	}
	sameQueue := !own && u.ifindex == ifindex && u.queue == queue
	if !own && !sameQueue {
		fs, cs := c.FillSize, c.CompletionSize
		if fs == 0 {
			fs = u.cfg.FillSize
		}
		if cs == 0 {
			cs = u.cfg.CompletionSize
		}
		var offs unix.XDPMmapOffsets
		fm, cm, err := mapUMEMRings(s.fd, fs, cs, &offs)
		if err != nil {
			return fail("socket", err)
		}
		s.maps = append(s.maps, fm, cm)
		s.ownFill.setup(fm, &offs.Fr, uint32(fs))
		s.ownComp.setup(cm, &offs.Cr, uint32(cs))
		s.fill, s.comp = &s.ownFill, &s.ownComp
	} else if sameQueue {
		s.fill, s.comp = &u.fill, &u.comp
	}
	if c.RXSize > 0 {
		if err := sockopt("XDP_RX_RING", s.fd, unix.SOL_XDP, unix.XDP_RX_RING, c.RXSize); err != nil {
			return fail("socket", err)
		}
	}
	if c.TXSize > 0 {
		if err := sockopt("XDP_TX_RING", s.fd, unix.SOL_XDP, unix.XDP_TX_RING, c.TXSize); err != nil {
			return fail("socket", err)
		}
	}
	var offs unix.XDPMmapOffsets
	if err := getOffsets(s.fd, &offs); err != nil {
		return fail("socket", err)
	}
	if c.RXSize > 0 {
		m, err := mmap(s.fd, unix.XDP_PGOFF_RX_RING, int(offs.Rx.Desc)+c.RXSize*int(unsafe.Sizeof(Desc{})), "rx ring")
		if err != nil {
			return fail("socket", err)
		}
		s.maps = append(s.maps, m)
		s.rx.setup(m, &offs.Rx, uint32(c.RXSize))
	}
	if c.TXSize > 0 {
		m, err := mmap(s.fd, unix.XDP_PGOFF_TX_RING, int(offs.Tx.Desc)+c.TXSize*int(unsafe.Sizeof(Desc{})), "tx ring")
		if err != nil {
			return fail("socket", err)
		}
		s.maps = append(s.maps, m)
		s.tx.setup(m, &offs.Tx, uint32(c.TXSize))
	}
	if c.TXBudget > 0 {
		// Best effort: older kernels lack XDP_MAX_TX_SKB_BUDGET.
		if err := unix.SetsockoptInt(s.fd, unix.SOL_XDP, unix.XDP_MAX_TX_SKB_BUDGET, c.TXBudget); err == nil {
			s.txBudget = c.TXBudget
		}
	}
	if err := s.setBusyPoll(&c.BusyPoll); err != nil {
		return fail("socket", err)
	}

	var flags uint16
	switch c.Mode {
	case ModeCopy:
		flags |= unix.XDP_COPY
	case ModeZeroCopy:
		flags |= unix.XDP_ZEROCOPY
	}
	if s.needWake {
		flags |= unix.XDP_USE_NEED_WAKEUP
	}
	sa := &unix.SockaddrXDP{Flags: flags, Ifindex: uint32(ifindex), QueueID: uint32(queue)}
	if !own {
		sa.Flags = unix.XDP_SHARED_UMEM
		sa.SharedUmemFD = uint32(u.fd)
	}
	if err := bindRetry(s.fd, sa); err != nil {
		err = os.NewSyscallError("bind", err)
		if c.Mode == ModeZeroCopy && isZCRefusal(err) {
			err = fmt.Errorf("%w: zero-copy refused by the driver of ifindex %d: %w", fabric.ErrNotSupported, ifindex, err)
		} else {
			err = notSupported(err)
		}
		return fail("bind", err)
	}
	var opts struct{ flags uint32 }
	if err := getsockoptPtr(s.fd, unix.SOL_XDP, unix.XDP_OPTIONS, unsafe.Pointer(&opts), unsafe.Sizeof(opts)); err == nil {
		s.zc = opts.flags&unix.XDP_OPTIONS_ZEROCOPY != 0
	} else {
		s.zc = c.Mode == ModeZeroCopy
	}
	if err := s.setupPoller(); err != nil {
		return fail("socket", err)
	}
	if own {
		u.bound, u.ifindex, u.queue, u.needWake, u.zc = true, ifindex, queue, s.needWake, s.zc
	}
	u.refs++
	return s, nil
}

const closingBit = 1 << 40

// acquire takes a reference for a system call; false once Close began.
func (s *Socket) acquire() bool {
	if s.refs.Add(1)&closingBit != 0 {
		s.refs.Add(-1)
		return false
	}
	return true
}

func (s *Socket) release() { s.refs.Add(-1) }

// isZCRefusal reports whether a zero-copy bind failed because the
// driver cannot do it (rather than, say, a busy queue).
func isZCRefusal(err error) bool {
	var e unix.Errno
	if !errors.As(err, &e) {
		return false
	}
	return e == unix.EOPNOTSUPP || e == unix.EINVAL || e == unix.ENOTSUP
}

// renewLocked gives the UMEM a fresh registered socket after a failed
// bind of its own one, so that a retry (copy mode after zero-copy) starts
// clean.
func (u *UMEM) renewLocked() error {
	for _, m := range [][]byte{u.fillMem, u.compMem} {
		if m != nil {
			unix.Munmap(m)
		}
	}
	u.fillMem, u.compMem = nil, nil
	unix.Close(u.fd)
	u.fd = -1
	return u.setup()
}

func (s *Socket) setBusyPoll(b *BusyPoll) error {
	if b.Timeout <= 0 {
		return nil
	}
	if b.Prefer {
		if err := sockopt("SO_PREFER_BUSY_POLL", s.fd, unix.SOL_SOCKET, unix.SO_PREFER_BUSY_POLL, 1); err != nil {
			return notSupported(err)
		}
	}
	us := int(b.Timeout / time.Microsecond)
	if us == 0 {
		us = 1
	}
	if err := sockopt("SO_BUSY_POLL", s.fd, unix.SOL_SOCKET, unix.SO_BUSY_POLL, us); err != nil {
		return notSupported(err)
	}
	if b.Budget > 0 {
		if err := sockopt("SO_BUSY_POLL_BUDGET", s.fd, unix.SOL_SOCKET, unix.SO_BUSY_POLL_BUDGET, b.Budget); err != nil {
			return notSupported(err)
		}
	}
	s.busy = true
	return nil
}

func (s *Socket) unmap() {
	for _, m := range s.maps {
		unix.Munmap(m)
	}
	s.maps = nil
}

// retireMaps makes the rings safe to touch after Close (they read as
// empty) and frees them later.
func (s *Socket) retireMaps() {
	retire(s, s.maps)
	s.maps = nil
}

// FD returns the socket's file descriptor, to insert in an XSKMAP or to
// watch with epoll (Poll's own waits register it, in epoll instances of
// their own, only while they wait). It is closed by Close.
func (s *Socket) FD() int { return s.fd }

// UMEM returns the socket's UMEM.
func (s *Socket) UMEM() *UMEM { return s.umem }

// Ifindex returns the interface index the socket is bound to.
func (s *Socket) Ifindex() int { return s.ifindex }

// Queue returns the queue id the socket is bound to.
func (s *Socket) Queue() int { return s.queue }

// ZeroCopy reports whether the socket runs in zero-copy mode, as the
// kernel reports it (XDP_OPTIONS).
func (s *Socket) ZeroCopy() bool { return s.zc }

// RX returns the RX ring (size 0 if the socket has none).
func (s *Socket) RX() *RXRing { return &s.rx }

// TX returns the TX ring (size 0 if the socket has none).
func (s *Socket) TX() *TXRing { return &s.tx }

// Fill returns the fill ring the socket receives into: its own when it
// shares a UMEM with a socket on another queue, the UMEM's otherwise.
func (s *Socket) Fill() *FillRing { return s.fill }

// Completion returns the completion ring of the socket's transmissions.
func (s *Socket) Completion() *CompletionRing { return s.comp }

// NeedsTXKick reports whether the kernel needs a Kick to send what was
// submitted on the TX ring: always without need_wakeup.
func (s *Socket) NeedsTXKick() bool { return !s.needWake || s.tx.needWakeup() }

// Kick makes the kernel process the TX ring (sendto with MSG_DONTWAIT).
// Transient conditions (EAGAIN, EBUSY, ENOBUFS) are not errors: the
// caller kicks again later. Kick is allocation-free.
func (s *Socket) Kick() error {
	if !s.acquire() {
		return opErr("kick", fabric.ErrClosed)
	}
	defer s.release()
	s.Kicks.Add(1)
	if e := sendtoKick(s.fd); !transient(e) {
		return opErr("kick", os.NewSyscallError("sendto", e))
	}
	return nil
}

// Drain kicks the kernel until it has taken every submitted TX
// descriptor, at most rounds times (0: 64). In copy mode each sendto
// sends at most the TX budget (32 frames by default), so a burst larger
// than that needs several; in zero-copy mode one wake-up suffices and
// Drain kicks only when need_wakeup asks. It stops early, without error,
// on a transient condition such as ENOBUFS (the device queue is full).
func (s *Socket) Drain(rounds int) error {
	if s.zc {
		_, err := s.KickIfNeeded()
		return err
	}
	if !s.acquire() {
		return opErr("kick", fabric.ErrClosed)
	}
	defer s.release()
	if rounds <= 0 {
		rounds = 64
	}
	for i := 0; i < rounds && s.tx.Pending() > 0; i++ {
		s.Kicks.Add(1)
		e := sendtoKick(s.fd)
		if e == unix.EAGAIN || e == unix.EINTR {
			continue
		}
		if e != 0 && !transient(e) {
			return opErr("kick", os.NewSyscallError("sendto", e))
		}
		if e != 0 {
			return nil
		}
	}
	return nil
}

// KickIfNeeded kicks when NeedsTXKick says so, and reports whether it did.
func (s *Socket) KickIfNeeded() (bool, error) {
	if !s.NeedsTXKick() {
		return false, nil
	}
	return true, s.Kick()
}

// WakeRX wakes the driver to refill from the fill ring and, with busy
// polling, runs its NAPI loop once (recvfrom with MSG_DONTWAIT).
func (s *Socket) WakeRX() error {
	if !s.acquire() {
		return opErr("wake", fabric.ErrClosed)
	}
	defer s.release()
	s.Kicks.Add(1)
	if e := recvfromKick(s.fd); !transient(e) {
		return opErr("wake", os.NewSyscallError("recvfrom", e))
	}
	return nil
}

// TXBudget returns the copy-mode frames per kick set with
// Config.TXBudget, 0 if the kernel's default (32) applies.
func (s *Socket) TXBudget() int { return s.txBudget }

// BusyPolling reports whether busy polling is configured.
func (s *Socket) BusyPolling() bool { return s.busy }

// Statistics are the kernel's counters of a socket (XDP_STATISTICS).
type Statistics struct {
	// RXDropped counts packets dropped for other reasons.
	RXDropped uint64
	// RXInvalidDescs and TXInvalidDescs count invalid descriptors.
	RXInvalidDescs, TXInvalidDescs uint64
	// RXRingFull counts packets dropped because the RX ring was full.
	RXRingFull uint64
	// RXFillRingEmpty counts failures to take a frame from the fill ring.
	RXFillRingEmpty uint64
	// TXRingEmpty counts TX-ring-empty events.
	TXRingEmpty uint64
}

// Statistics returns the kernel's counters of the socket.
func (s *Socket) Statistics() (Statistics, error) {
	if !s.acquire() {
		return Statistics{}, opErr("statistics", fabric.ErrClosed)
	}
	defer s.release()
	var st unix.XDPStatistics
	if err := getsockoptPtr(s.fd, unix.SOL_XDP, unix.XDP_STATISTICS, unsafe.Pointer(&st), unsafe.Sizeof(st)); err != nil {
		return Statistics{}, opErr("statistics", os.NewSyscallError("getsockopt XDP_STATISTICS", err))
	}
	return Statistics{RXDropped: st.Rx_dropped, RXInvalidDescs: st.Rx_invalid_descs,
		TXInvalidDescs: st.Tx_invalid_descs, RXRingFull: st.Rx_ring_full,
		RXFillRingEmpty: st.Rx_fill_ring_empty_descs, TXRingEmpty: st.Tx_ring_empty_descs}, nil
}

// Close unbinds and closes the socket and releases its rings; the UMEM's
// own socket stays open until the UMEM is closed too. Close is
// idempotent, wakes every blocked Poll and PollFor at once (they return
// an error matching os.ErrClosed), and is safe while another goroutine
// is using the rings: their memory is replaced with empty pages (a ring
// then reads as empty) and unmapped once the Socket is unreachable.
func (s *Socket) Close() error {
	s.once.Do(func() {
		s.closed.Store(true)
		var errs []error
		// Wake the waiters: the followers on closing, the leaders in the
		// poller by closing the epoll instances (which returns once they
		// have left them). They hold references, which they drop on
		// their way out.
		close(s.closing)
		for _, w := range []*waiter{&s.rd, &s.wr} {
			if err := w.file.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		s.refs.Add(closingBit)
		for s.refs.Load() != closingBit {
			time.Sleep(20 * time.Microsecond)
		}
		s.rd.unwatch()
		s.wr.unwatch()
		s.retireMaps()
		u := s.umem
		u.mu.Lock()
		if s.fd != u.fd {
			if err := unix.Close(s.fd); err != nil {
				errs = append(errs, os.NewSyscallError("close", err))
			}
		}
		last := u.unrefLocked()
		u.mu.Unlock()
		if last {
			errs = append(errs, u.release())
		}
		if err := errors.Join(errs...); err != nil {
			s.closeErr = opErr("close", err)
		}
	})
	return s.closeErr
}

// bindRetry binds, retrying EBUSY for up to a second: the kernel
// releases a closed socket's hold on a queue in a deferred work item, so
// a queue closed a moment ago can still be busy.
func bindRetry(fd int, sa *unix.SockaddrXDP) error {
	deadline := time.Now().Add(time.Second)
	for d := time.Millisecond; ; d = min(2*d, 50*time.Millisecond) {
		err := unix.Bind(fd, sa)
		if err != unix.EBUSY || time.Now().After(deadline) {
			return err
		}
		time.Sleep(d)
	}
}
