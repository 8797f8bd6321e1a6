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
}

func newEpoch() *epoch { return &epoch{ch: make(chan struct{})} }

// fire closes the epoch with a final state. The caller holds the
// deadline's mu.
func (e *epoch) fire(state int32) {
	if e.state.Load() == epochLive {
		e.state.Store(state)
		close(e.ch)
	}
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
