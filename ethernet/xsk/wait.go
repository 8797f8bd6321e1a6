package xsk

// Blocking waits on a socket. A waiting goroutine parks in the Go
// runtime's network poller, as a net.Conn's reader does; no OS thread
// sleeps in a system call, so thousands of waiters cost thousands of
// goroutines, not threads.
//
// The poller does not watch the socket itself but, per direction, an
// epoll instance of the socket's own (in the poller like any pollable
// descriptor) in which the socket is registered for EPOLLIN (EPOLLOUT)
// only while a goroutine waits, as poll(2) hooked it to the socket's
// wait queue only for the call. A registration that stays, even for no
// event, makes the kernel run its wake-up at every RX flush and every
// copy-mode TX frame freed: BenchmarkQueueBurst, which never waits, ran
// 25% slower with one (the socket itself in the poller: 20%).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/weft-io/weft/fabric"
	"golang.org/x/sys/unix"
)

// aLongTimeAgo is a deadline in the past: setting it wakes the goroutine
// waiting in the poller.
var aLongTimeAgo = time.Unix(1, 0)

// errTimeout is wait's result when its own deadline (PollFor's timeout)
// passed.
var errTimeout = errors.New("xsk: wait timed out")

// waiter is one direction of the socket's waits: the RX ring readable
// (has descriptors) or the TX ring writable (has room).
//
// The runtime's poller holds one waiting goroutine per direction of a
// descriptor (an os.File's RawConn queues further callers on a lock,
// where no deadline reaches them), and a deadline belongs to the
// descriptor, not to a waiter. So one waiter at a time, the leader,
// sleeps in the poller, under the deadline of its own context (a
// cancellation sets it in the past); the others, the followers, sleep on
// gen, which the leader closes when it leaves the poller for any reason,
// and on their own context. Woken, every waiter looks at the ring again
// and one becomes the next leader. No wake-up is lost: the leader looks
// at the ring after the poller's edge-triggered readiness was reset
// (RawConn.Read calls its function first, then waits), and a follower's
// gen is closed when the leader it follows leaves.
//
// A leader's context is watched with context.AfterFunc, which costs
// allocations; the registration stays for the leaders after it that
// wait with the same context (the same Done channel), so a loop that
// waits with one context allocates once, and goes when another context
// takes its place, when the context is done, or at Close.
type waiter struct {
	mu     sync.Mutex
	leader bool
	// leadDone is the leader's ctx.Done(), nil for a context that cannot
	// be cancelled.
	leadDone <-chan struct{}
	// watchDone is the Done channel of the context that stopWatch's
	// registration watches.
	watchDone <-chan struct{}
	stopWatch func() bool
	gen       chan struct{} // closed when the leader leaves; made by its first follower
	// write selects the TX ring.
	write bool
	// file is the direction's epoll instance in the runtime's poller,
	// rc its RawConn, and xsk the socket's descriptor registered in it.
	file *os.File
	rc   syscall.RawConn
	xsk  int
	// events is what the socket is registered for while armed, ev the
	// argument of epoll_ctl.
	events uint32
	armed  bool  // the leader's
	armErr error // the leader's failed registration
	ev     unix.EpollEvent
	// ready is the RawConn callback: it registers the socket, then looks
	// at the ring's condition, after the kick it may need; disarm is the
	// RawConn.Control callback that removes the registration.
	ready  func(fd uintptr) bool
	disarm func(fd uintptr)
}

// setupPoller gives the socket its waits' epoll instances, in the
// runtime's poller.
func (s *Socket) setupPoller() error {
	s.closing = make(chan struct{})
	s.rd.ready, s.rd.events = s.rxReady, unix.EPOLLIN
	s.wr.ready, s.wr.events, s.wr.write = s.txReady, unix.EPOLLOUT, true
	for _, w := range []*waiter{&s.rd, &s.wr} {
		if err := w.setup(s.fd); err != nil {
			return err // newSocket's fail closes what was made
		}
	}
	return nil
}

func (w *waiter) setup(xsk int) error {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return os.NewSyscallError("epoll_create1", err)
	}
	w.xsk, w.ev = xsk, unix.EpollEvent{Events: w.events, Fd: int32(xsk)}
	// os.NewFile puts a non-blocking descriptor in the poller.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return os.NewSyscallError("fcntl O_NONBLOCK", err)
	}
	f := os.NewFile(uintptr(fd), "xsk-wait")
	// A descriptor the poller refused has no deadlines.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return fmt.Errorf("epoll instance not in the runtime's poller: %w", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return err
	}
	w.file, w.rc = f, rc
	w.disarm = w.control
	return nil
}

// arm registers the socket for the direction's event in the epoll
// instance fd (EPOLL_CTL_ADD, which also polls the socket, with
// poll(2)'s side effects, and reports the event at once if it holds).
// It runs in the RawConn callback, where fd is held open, and reports
// whether the wait can go on.
func (w *waiter) arm(fd uintptr) bool {
	if w.armed {
		return true
	}
	if err := unix.EpollCtl(int(fd), unix.EPOLL_CTL_ADD, w.xsk, &w.ev); err != nil {
		w.armErr = os.NewSyscallError("epoll_ctl", err)
		return false
	}
	w.armed = true
	return true
}

// control is disarm: the registration removed.
func (w *waiter) control(fd uintptr) {
	unix.EpollCtl(int(fd), unix.EPOLL_CTL_DEL, w.xsk, &w.ev)
}

// rxHas reports whether the RX ring has descriptors the consumer has not
// released: the kernel's own test for POLLIN. It reads only the shared
// indices, so any goroutine may call it.
func (s *Socket) rxHas() bool { return s.rx.producer.Load() != s.rx.consumer.Load() }

// txRoom reports whether the TX ring has a free slot, from the shared
// indices.
func (s *Socket) txRoom() bool { return s.tx.producer.Load()-s.tx.consumer.Load() < s.tx.size }

// txPending reports whether the TX ring holds descriptors the kernel has
// not taken.
func (s *Socket) txPending() bool {
	return s.tx.size > 0 && s.tx.producer.Load() != s.tx.consumer.Load()
}

// rxReady reports whether the RX ring has descriptors, after doing what
// poll(2) on the socket does on entry: with need_wakeup, wake the driver
// to refill from the fill ring (recvfrom, as WakeRX) and, in copy mode,
// send what waits on the TX ring (sendto); with busy polling, run the
// device's NAPI loop once (recvfrom, which busy-polls by the socket's
// SO_BUSY_POLL where poll(2) needs the net.core.busy_poll sysctl). As
// poll(2), it ignores a kick's failure (the caller's next Recv or Kick
// reports it).
func (s *Socket) rxReady(ep uintptr) bool { return !s.rd.arm(ep) || s.rxCheck() }

func (s *Socket) rxCheck() bool {
	if s.rxHas() {
		return true
	}
	if s.needWake && s.txPending() && s.tx.needWakeup() {
		s.Kicks.Add(1)
		sendtoKick(s.fd)
	}
	if s.busy || s.fill.NeedsWakeup() {
		s.Kicks.Add(1)
		recvfromKick(s.fd)
		return s.rxHas()
	}
	return false
}

// txReady reports whether the TX ring has room, after kicking the kernel
// to take what it holds if it needs a kick (in copy mode the kick sends).
func (s *Socket) txReady(ep uintptr) bool { return !s.wr.arm(ep) || s.txCheck() }

func (s *Socket) txCheck() bool {
	if s.txRoom() {
		return true
	}
	if s.NeedsTXKick() {
		s.Kicks.Add(1)
		sendtoKick(s.fd)
		return s.txRoom()
	}
	return false
}

// unwatch drops the context registration; Close calls it once no wait
// is left, so that a long-lived context does not keep the socket.
func (w *waiter) unwatch() {
	w.mu.Lock()
	if w.stopWatch != nil {
		w.stopWatch()
	}
	w.watchDone, w.stopWatch = nil, nil
	w.mu.Unlock()
}

func (w *waiter) setDeadline(t time.Time) error { return w.file.SetReadDeadline(t) }

// Poll waits until the socket is readable (want has unix.POLLIN: the RX
// ring has descriptors) or writable (unix.POLLOUT: the TX ring has
// room), ctx is done or the socket is closed, and returns the events
// that hold (POLLIN, POLLOUT). The goroutine waits in the Go runtime's
// network poller, not in poll(2): it holds no OS thread. Poll kicks the
// kernel where poll(2) would, when need_wakeup asks for it (the fill
// ring's refill, copy mode's transmission) and with busy polling (one
// round of the device's NAPI loop) before it parks; it returns when ctx
// is cancelled or its deadline passes, and Close wakes it at once with
// an error matching os.ErrClosed. Any goroutine may call Poll, several
// at a time. Poll allocates nothing, except that a context that can be
// cancelled costs a registration (context.AfterFunc) when Poll sleeps
// with it and the previous sleep used another: a loop that waits with
// one context allocates once. Close drops the registration. Waiting
// for both POLLIN and POLLOUT takes a second goroutine (the poller
// waits for one direction per goroutine) and allocates.
func (s *Socket) Poll(ctx context.Context, want int16) (int16, error) {
	return s.poll(ctx, want, time.Time{})
}

// PollFor is Poll for at most timeout, without a context: the building
// block of allocation-free blocking loops. It returns 0 when the timeout
// passed first (a timeout of zero looks once, with the kicks Poll does;
// a negative one waits without limit), and an error matching
// os.ErrClosed once Close has run (Close wakes it).
func (s *Socket) PollFor(want int16, timeout time.Duration) (int16, error) {
	var deadline time.Time
	if timeout >= 0 {
		deadline = time.Now().Add(timeout)
	}
	return s.poll(nil, want, deadline)
}

func (s *Socket) poll(ctx context.Context, want int16, deadline time.Time) (int16, error) {
	if !s.acquire() {
		return 0, opErr("poll", fabric.ErrClosed)
	}
	defer s.release()
	in, out := want&unix.POLLIN != 0, want&unix.POLLOUT != 0
	switch {
	case !in && !out:
		return 0, opErr("poll", fmt.Errorf("events %#x: want POLLIN or POLLOUT: %w", want, errInvalid))
	case in && s.rx.size == 0:
		return 0, opErr("poll", fmt.Errorf("POLLIN on a socket without RX ring: %w", errInvalid))
	case out && s.tx.size == 0:
		return 0, opErr("poll", fmt.Errorf("POLLOUT on a socket without TX ring: %w", errInvalid))
	}
	var err error
	switch {
	case in && out:
		err = s.waitBoth(ctx, deadline)
	case in:
		err = s.wait(ctx, &s.rd, deadline)
	default:
		err = s.wait(ctx, &s.wr, deadline)
	}
	if err == errTimeout {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var r int16
	if in && s.rxHas() {
		r |= unix.POLLIN
	}
	if out && s.txRoom() {
		r |= unix.POLLOUT
	}
	return r, nil
}

// wait blocks until w's ring condition holds (nil), ctx (which may be
// nil) is done (its error), the deadline (zero: none) passes (errTimeout)
// or the socket closes. The caller holds a reference.
func (s *Socket) wait(ctx context.Context, w *waiter, deadline time.Time) error {
	for {
		if w.write && s.txRoom() || !w.write && s.rxHas() {
			return nil
		}
		if s.closed.Load() {
			return opErr("poll", fabric.ErrClosed)
		}
		if ctx != nil {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			// One last look, with the kicks, as poll(2) looks once more
			// when its timeout expires.
			if w.write && s.txCheck() || !w.write && s.rxCheck() {
				return nil
			}
			return errTimeout
		}
		w.mu.Lock()
		if w.leader {
			if w.gen == nil {
				w.gen = make(chan struct{})
			}
			gen := w.gen
			w.mu.Unlock()
			if err := s.follow(ctx, gen, deadline); err != nil {
				return err
			}
			continue
		}
		err := s.lead(ctx, w, deadline) // unlocks w.mu
		w.mu.Lock()
		w.leader, w.leadDone = false, nil
		if w.gen != nil {
			close(w.gen)
			w.gen = nil
		}
		w.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// lead makes the caller, which holds w.mu and found no leader, w's
// leader, unlocks w.mu and waits in the poller. It returns nil when the
// ring's condition may hold or the wait ended early (the caller looks
// again).
func (s *Socket) lead(ctx context.Context, w *waiter, deadline time.Time) error {
	d := deadline
	var done <-chan struct{}
	if ctx != nil {
		if cd, ok := ctx.Deadline(); ok && (d.IsZero() || cd.Before(d)) {
			d = cd
		}
		done = ctx.Done()
	}
	w.leader, w.leadDone = true, done
	// The deadline is set under w.mu, so that a cancellation, which
	// sets it in the past under w.mu, comes before it (and then ctx.Err
	// below sees it) or after it.
	err := w.setDeadline(d)
	if err == nil && done != nil && w.watchDone != done {
		if w.stopWatch != nil {
			w.stopWatch()
		}
		w.watchDone, w.stopWatch = done, context.AfterFunc(ctx, func() {
			w.mu.Lock()
			if w.leader && w.leadDone == done {
				w.setDeadline(aLongTimeAgo)
			}
			w.mu.Unlock()
		})
	}
	w.mu.Unlock()
	if err != nil {
		return s.pollErr(err)
	}
	if done != nil {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	// Both directions wait for their epoll instance to be readable.
	w.armErr = nil
	err = w.rc.Read(w.ready)
	if w.armed {
		w.rc.Control(w.disarm) // fails only once Close has begun
		w.armed = false
	}
	switch {
	case err == nil && w.armErr != nil:
		return opErr("poll", w.armErr)
	case err == nil:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded) && !s.closed.Load():
		if ctx != nil {
			if err := ctx.Err(); err != nil {
				return err
			}
			if cd, ok := ctx.Deadline(); ok && !time.Now().Before(cd) {
				return context.DeadlineExceeded // before ctx's own timer noticed
			}
		}
		return nil // the own deadline (the caller checks it) or one meant for an earlier leader
	}
	return s.pollErr(err)
}

// follow sleeps until the leader that made gen leaves the poller (nil),
// ctx is done, the deadline passes (nil: the caller checks it) or the
// socket closes.
func (s *Socket) follow(ctx context.Context, gen chan struct{}, deadline time.Time) error {
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := timers.Get().(*time.Timer)
		t.Reset(time.Until(deadline))
		defer func() {
			t.Stop()
			timers.Put(t)
		}()
		expired = t.C
	}
	select {
	case <-gen:
	case <-expired:
	case <-done:
		return ctx.Err()
	case <-s.closing:
		return opErr("poll", fabric.ErrClosed)
	}
	return nil
}

var timers = sync.Pool{New: func() any { t := time.NewTimer(time.Hour); t.Stop(); return t }}

// pollErr is the error of a wait the poller ended: os.ErrClosed once
// Close has run, else an event error on the socket.
func (s *Socket) pollErr(err error) error {
	if s.closed.Load() {
		return opErr("poll", fabric.ErrClosed)
	}
	return opErr("poll", fmt.Errorf("socket error: %w: %w", fabric.ErrPeerGone, err))
}

// waitBoth waits for the RX ring to have descriptors or the TX ring to
// have room. The runtime's poller waits for one direction per goroutine,
// so a second goroutine waits for room; this path allocates.
func (s *Socket) waitBoth(ctx context.Context, deadline time.Time) error {
	if s.rxHas() || s.txRoom() {
		return nil
	}
	parent := ctx
	if parent == nil {
		parent = context.Background()
	}
	both, cancel := context.WithCancel(parent)
	werr := make(chan error, 1)
	go func() {
		err := s.wait(both, &s.wr, deadline)
		cancel()
		werr <- err
	}()
	err := s.wait(both, &s.rd, deadline)
	cancel()
	err2 := <-werr
	if err == nil || err2 == nil {
		return nil
	}
	if err := parent.Err(); err != nil {
		return err
	}
	if errors.Is(err, context.Canceled) {
		return err2 // ended by the other side's failure
	}
	return err
}
