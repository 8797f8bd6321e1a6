//go:build linux

// Package wake is Weft's pollable wake-up: a file descriptor that a waker
// makes readable and that a waiting goroutine parks on in Go's netpoller.
// No OS thread blocks in a system call while a goroutine waits, so a
// thousand idle waiters cost a thousand parked goroutines, not a thousand
// threads, and the runtime keeps every processor for the goroutines that
// have work.
//
// A Parker is the waiting side. Three kinds share it:
//   - NewEventfd: an eventfd, for wakers in this process (an engine's
//     receive goroutine, Close);
//   - ListenFIFO: a named pipe, for wakers in another process on the same
//     kernel (the emulated NTB bridge, the shared-memory link), which open
//     it with a Ringer;
//   - NewEpoll: an epoll instance over other descriptors, the base of a
//     wait set (fabric.WaitSet): readable while any member is.
//
// The protocol that loses no wake-up is the waker's and the waiter's
// together, as with a futex. The waiter announces itself (a flag or a
// count in memory both sides see), re-checks its condition, then parks;
// the waker publishes its change, then rings if it sees a waiter. With
// sequentially consistent atomics on both sides, either the waiter sees
// the change or the waker sees the waiter. Wait re-checks the condition
// after every wake-up, and a wake-up that another waiter of the same
// Parker drained is not lost: each drain advances a generation that every
// waiter compares against the one it started with.
//
// Readiness may be spurious: callers poll after Wait returns.
package wake

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

type kind uint8

const (
	kindEventfd kind = iota
	kindFIFO
	kindEpoll
)

// Parker is a descriptor a goroutine parks on until it is readable.
type Parker struct {
	kind kind
	f    *os.File
	rc   syscall.RawConn
	fd   int
	path string // a FIFO's path, removed by Close
	// mu guards gen and polling; cond signals a change of either.
	mu   sync.Mutex
	cond sync.Cond
	// gen counts the wake-ups a poller took.
	gen uint64
	// polling is set while one goroutine (Wait's poller, or Drain) reads
	// the descriptor.
	polling bool
	// drained is Drain's result, written by drainFn under polling.
	drained bool
	// ready is Ready's result, written by readyFn (one caller at a time).
	ready bool
	// closed is set by Close, before the descriptor is.
	closed atomic.Bool
	// rings counts Ring calls.
	rings atomic.Uint64
	// ringFn and drainFn are RawConn.Control callbacks, and readFn the
	// poller's RawConn.Read callback, made once so that Ring, Drain and
	// Wait allocate nothing; the RawConn holds a reference on the
	// descriptor, so none touches a number Close has released.
	ringFn, drainFn, readyFn func(uintptr)
	readFn                   func(uintptr) bool
}

// NewEventfd returns a Parker on a new eventfd, rung from this process.
func NewEventfd() (*Parker, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, os.NewSyscallError("eventfd", err)
	}
	return newParker(kindEventfd, fd, "eventfd", "")
}

// ListenFIFO returns a Parker on the named pipe at path, creating it with
// mode 0600 if it does not exist. Another process rings it through a
// Ringer on the same path. A path that exists and is not a FIFO is
// refused.
func ListenFIFO(path string) (*Parker, error) {
	if err := unix.Mkfifo(path, 0o600); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, &os.PathError{Op: "mkfifo", Path: path, Err: err}
	}
	// O_RDWR keeps the pipe open for writers even with no Ringer yet, and
	// lets Ring write to it from this side.
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	if err := isFIFO(fd, path); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return newParker(kindFIFO, fd, path, path)
}

// NewEpoll returns a Parker on a new epoll instance: readable while any
// descriptor added with Watch is. The members' readiness is level
// triggered, so whoever handles a member's wake-up must consume it (read
// the member's eventfd or FIFO, drain its ring) or the set stays ready.
func NewEpoll() (*Parker, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	return newParker(kindEpoll, fd, "epoll", "")
}

func newParker(k kind, fd int, name, path string) (*Parker, error) {
	f := os.NewFile(uintptr(fd), name)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	p := &Parker{kind: k, f: f, rc: rc, fd: fd, path: path}
	p.ringFn = func(fd uintptr) { ring(int(fd), p.kind) }
	p.drainFn = func(fd uintptr) { p.drained = p.drain(int(fd)) }
	p.readFn = func(fd uintptr) bool { return p.drain(int(fd)) }
	p.readyFn = func(fd uintptr) { p.ready = epollReady(int(fd)) }
	p.cond.L = &p.mu
	return p, nil
}

func isFIFO(fd int, path string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return &os.PathError{Op: "open", Path: path, Err: fmt.Errorf("not a FIFO (mode %#o)", st.Mode)}
	}
	return nil
}

// FD returns the descriptor, for a wait set to watch. It stays valid
// until Close.
func (p *Parker) FD() int { return p.fd }

// Rings returns how many times Ring wrote a wake-up.
func (p *Parker) Rings() uint64 { return p.rings.Load() }

// Ring makes the Parker readable from this process, waking its waiters.
// Rings that find it readable already merge into one wake-up.
func (p *Parker) Ring() {
	p.rc.Control(p.ringFn)
	p.rings.Add(1)
}

var one = [8]byte{0: 1} // eventfd adds 1 (native endian; amd64 and arm64 are little)

func ring(fd int, k kind) error {
	b := one[:]
	if k == kindFIFO {
		b = b[:1]
	}
	_, err := unix.Write(fd, b)
	if err == unix.EAGAIN { // full: readable already
		err = nil
	}
	return err
}

// Wait parks until done reports true, re-checking it after every wake-up.
// It returns nil once done is true, and an error matching os.ErrClosed
// once the Parker is closed. done must not block; it is called with no
// lock held. A nil done returns after the first wake-up (pending ones
// included), as an epoll set's waiter does.
//
// Of the goroutines waiting on one Parker, one at a time (the poller)
// parks in the netpoller on the descriptor; the others park on a
// condition variable, and every wake-up the poller takes advances a
// generation and wakes them all to re-check. Several goroutines parked
// in the netpoller on one descriptor would queue on its read lock, where
// the holder, re-entering after each wake-up of its own, could keep the
// others from ever re-checking theirs.
func (p *Parker) Wait(done func() bool) error {
	for {
		p.mu.Lock()
		g := p.gen
		p.mu.Unlock()
		if done != nil && done() {
			return nil
		}
		p.mu.Lock()
		for p.gen == g && p.polling && !p.closed.Load() {
			p.cond.Wait()
		}
		if p.closed.Load() {
			p.mu.Unlock()
			return os.ErrClosed
		}
		if p.gen != g {
			p.mu.Unlock()
			if done == nil {
				return nil
			}
			continue
		}
		p.polling = true
		p.mu.Unlock()
		err := p.rc.Read(p.readFn)
		p.mu.Lock()
		p.polling = false
		p.gen++
		p.cond.Broadcast()
		p.mu.Unlock()
		if err != nil {
			if p.closed.Load() {
				return os.ErrClosed
			}
			return err
		}
		if done == nil {
			return nil
		}
	}
}

// Drain consumes pending wake-ups without waiting, and reports whether
// there were any. A wait set's member calls it when it handles its own
// wake-up. While a goroutine waits in Wait, Drain leaves the descriptor
// to it (and reports false), so that no wake-up is taken from under it.
func (p *Parker) Drain() bool {
	p.mu.Lock()
	if p.polling || p.closed.Load() {
		p.mu.Unlock()
		return false
	}
	p.polling = true
	p.mu.Unlock()
	p.drained = false
	p.rc.Control(p.drainFn)
	got := p.drained
	p.mu.Lock()
	p.polling = false
	if got {
		p.gen++
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	return got
}

// drain empties the descriptor and reports whether it held anything.
func (p *Parker) drain(fd int) bool {
	var buf [64]byte
	got := false
	switch p.kind {
	case kindEpoll:
		var evs [16]unix.EpollEvent
		n, _ := unix.EpollWait(fd, evs[:], 0)
		got = n > 0
	case kindEventfd:
		n, _ := unix.Read(fd, buf[:8])
		got = n > 0
	default:
		for {
			n, _ := unix.Read(fd, buf[:])
			if n <= 0 {
				break
			}
			got = true
			if n < len(buf) {
				break
			}
		}
	}
	return got
}

// Ready reports, without waiting and without consuming anything, whether
// an epoll Parker (NewEpoll) has a readable member now. The members are
// level triggered, so false is exact: none held anything when the kernel
// looked. It costs one system call (epoll_wait with a zero timeout),
// about a third of a receive that finds a socket empty. A closed Parker,
// another kind or an error reports true: the caller reads to find out.
// One goroutine at a time may call it (a link's reader).
func (p *Parker) Ready() bool {
	if p.kind != kindEpoll {
		return true
	}
	p.ready = true
	p.rc.Control(p.readyFn)
	return p.ready
}

// epollReady reports whether epoll instance fd has a ready member (or
// fails: true).
func epollReady(fd int) bool {
	var ev [1]unix.EpollEvent
	// Never blocks (zero timeout): the raw call spares the scheduler's
	// bookkeeping of a blocking one.
	n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(fd), uintptr(unsafe.Pointer(&ev[0])), 1, 0, 0, 0)
	return errno != 0 || n != 0
}

// Watch adds fd to an epoll Parker (NewEpoll), level triggered for
// readability. Watching a descriptor twice is not an error.
func (p *Parker) Watch(fd int) error {
	if p.kind != kindEpoll {
		return errors.New("wake: Watch on a Parker that is not an epoll")
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	var err error
	p.rc.Control(func(epfd uintptr) { err = unix.EpollCtl(int(epfd), unix.EPOLL_CTL_ADD, fd, &ev) })
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return os.NewSyscallError("epoll_ctl", err)
}

// Unwatch removes fd from an epoll Parker. Removing a descriptor that is
// not watched is not an error.
func (p *Parker) Unwatch(fd int) {
	if p.kind == kindEpoll {
		p.rc.Control(func(epfd uintptr) { unix.EpollCtl(int(epfd), unix.EPOLL_CTL_DEL, fd, nil) })
	}
}

// Close closes the descriptor, waking every Wait with an error matching
// os.ErrClosed, and removes a FIFO's path. It is idempotent.
func (p *Parker) Close() error {
	p.mu.Lock()
	p.closed.Store(true)
	p.cond.Broadcast()
	p.mu.Unlock()
	err := p.f.Close()
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	if p.path != "" {
		os.Remove(p.path)
	}
	return err
}

// Ringer rings a FIFO Parker of another process. It opens the FIFO when
// first needed and keeps it open; it is safe for concurrent use.
type Ringer struct {
	path string
	// mu is held for reading while a ring writes, and for writing while
	// the descriptor is replaced, so no write reaches a number that was
	// closed and reused.
	mu     sync.RWMutex
	fd     int // -1: not open
	closed bool
}

// NewRinger returns a Ringer for the FIFO at path. Nothing is opened yet.
func NewRinger(path string) *Ringer {
	return &Ringer{path: path, fd: -1}
}

// Ring wakes the FIFO's reader. It reports false when nobody has the FIFO
// open for reading (the peer does not listen on one, has gone, or runs in
// another kernel); the caller's peer then finds the change when it polls.
func (r *Ringer) Ring() bool {
	r.mu.RLock()
	fd := r.fd
	var err error
	if fd >= 0 {
		err = ring(fd, kindFIFO)
	}
	r.mu.RUnlock()
	switch {
	case fd >= 0 && err == nil:
		return true
	case fd >= 0 && err != unix.EPIPE:
		return false
	}
	return r.reopen(fd)
}

// reopen (re)opens the FIFO after a first use or a reader that went away
// (a peer that restarted opens the path again).
func (r *Ringer) reopen(old int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fd != old || r.closed { // another ring reopened it meanwhile
		return r.fd >= 0 && ring(r.fd, kindFIFO) == nil
	}
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
	fd, err := unix.Open(r.path, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false // ENOENT, ENXIO (no reader)
	}
	if isFIFO(fd, r.path) != nil {
		unix.Close(fd)
		return false
	}
	r.fd = fd
	return ring(fd, kindFIFO) == nil
}

// Close closes the FIFO if it is open; Ring then reports false. It is
// idempotent.
func (r *Ringer) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	fd := r.fd
	r.fd = -1
	if fd >= 0 {
		return unix.Close(fd)
	}
	return nil
}
