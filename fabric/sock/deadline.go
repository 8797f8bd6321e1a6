package sock

import (
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// deadline is one direction's deadline. Its current epoch is a
// context.Context whose Done channel is closed when the deadline passes
// or the connection closes: blocked calls select on it, and the
// backend's blocking calls take it as their context (a pointer into the
// Conn, so passing it allocates nothing). A deadline moved while a call
// blocks takes effect at once: a later deadline re-arms the timer of the
// same epoch, an earlier or past one fires it. Once an epoch has fired it
// stays fired (as a context must); setting a new deadline starts a new
// epoch.
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cur    *epoch
	closed bool
}

// epoch states.
const (
	epochLive int32 = iota
	epochExpired
	epochClosed
)

// epoch is one arming of a deadline; it implements context.Context.
type epoch struct {
	ch    chan struct{}
	state atomic.Int32
	// afs are the functions context.AfterFunc registered (see AfterFunc).
	afMu sync.Mutex
	afs  []*afterFunc
}

// afterFunc is one registration of AfterFunc.
type afterFunc struct {
	f    func()
	e    *epoch
	stop func() bool
}

func newEpoch() *epoch { return &epoch{ch: make(chan struct{})} }

// fire closes the epoch with a final state. The caller holds the
// deadline's mu.
func (e *epoch) fire(state int32) {
	if e.state.Load() == epochLive {
		e.afMu.Lock()
		e.state.Store(state)
		close(e.ch)
		afs := e.afs
		e.afs = nil
		e.afMu.Unlock()
		for _, a := range afs {
			go a.f()
		}
	}
}

// AfterFunc is what context.AfterFunc calls for a context that has it:
// without it, context.AfterFunc starts a goroutine to watch Done for
// every call, and a blocking call that sleeps (ntb's doorbell wait) makes
// one per sleep. f runs in a goroutine of its own once the epoch fires;
// the returned stop reports whether it stopped f from running.
func (e *epoch) AfterFunc(f func()) func() bool {
	a := &afterFunc{f: f, e: e}
	a.stop = a.cancel
	e.afMu.Lock()
	if e.state.Load() != epochLive {
		e.afMu.Unlock()
		go f()
		return func() bool { return false }
	}
	e.afs = append(e.afs, a)
	e.afMu.Unlock()
	return a.stop
}

// cancel removes the registration; it reports whether it was still there.
func (a *afterFunc) cancel() bool {
	e := a.e
	e.afMu.Lock()
	defer e.afMu.Unlock()
	for i, b := range e.afs {
		if b == a {
			last := len(e.afs) - 1
			e.afs[i] = e.afs[last]
			e.afs[last] = nil
			e.afs = e.afs[:last]
			return true
		}
	}
	return false
}

// Deadline implements context.Context; the deadline shows in Done.
func (e *epoch) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done implements context.Context.
func (e *epoch) Done() <-chan struct{} { return e.ch }

// Err implements context.Context: os.ErrDeadlineExceeded or
// net.ErrClosed once Done is closed.
func (e *epoch) Err() error {
	switch e.state.Load() {
	case epochExpired:
		return os.ErrDeadlineExceeded
	case epochClosed:
		return net.ErrClosed
	}
	return nil
}

// Value implements context.Context.
func (e *epoch) Value(any) any { return nil }

func (d *deadline) init() { d.cur = newEpoch() }

// set moves the deadline; the zero time clears it.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	if d.timer != nil {
		// A callback already running finds d.timer changed and does
		// nothing.
		d.timer.Stop()
		d.timer = nil
	}
	if d.cur.state.Load() != epochLive {
		d.cur = newEpoch()
	}
	if t.IsZero() {
		return
	}
	dur := time.Until(t)
	if dur <= 0 {
		d.cur.fire(epochExpired)
		return
	}
	e := d.cur
	var tm *time.Timer
	tm = time.AfterFunc(dur, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.timer == tm && d.cur == e {
			e.fire(epochExpired)
		}
	})
	d.timer = tm
}

// close fires the deadline for good.
func (d *deadline) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	d.closed = true
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	if d.cur.state.Load() != epochLive {
		d.cur = newEpoch()
	}
	d.cur.fire(epochClosed)
}

// ctx returns the current epoch, to wait on.
func (d *deadline) ctx() *epoch {
	d.mu.Lock()
	e := d.cur
	d.mu.Unlock()
	return e
}

// wait returns the channel to select on.
func (d *deadline) wait() <-chan struct{} { return d.ctx().ch }

// expired reports whether the deadline has passed (and not been moved
// since).
func (d *deadline) expired() bool { return d.ctx().state.Load() == epochExpired }
