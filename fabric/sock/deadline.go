package sock

import (
	"os"
	"sync"
	"time"
)

// deadline is one direction's deadline. Its channel is closed when the
// deadline passes or the connection closes, so a blocked call selects on
// it, and a deadline moved while a call blocks takes effect at once: a
// later deadline re-arms the timer of the same channel, an earlier or
// past one fires it. It also serves as the context.Context of the
// backend's blocking calls (Done is the channel), which costs nothing to
// pass since it lives in the Conn.
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	ch     chan struct{} // closed when expired or closed
	fired  bool          // ch is closed by the deadline
	closed bool          // ch is closed by Close
}

func (d *deadline) init() { d.ch = make(chan struct{}) }

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
	if d.fired {
		d.ch = make(chan struct{})
		d.fired = false
	}
	if t.IsZero() {
		return
	}
	dur := time.Until(t)
	if dur <= 0 {
		d.fired = true
		close(d.ch)
		return
	}
	ch := d.ch
	var tm *time.Timer
	tm = time.AfterFunc(dur, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.timer != tm || d.closed || d.fired || d.ch != ch {
			return // stopped or superseded
		}
		d.fired = true
		close(ch)
	})
	d.timer = tm
}

// close fires the channel for good.
func (d *deadline) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	d.closed = true
	if !d.fired {
		close(d.ch)
	}
}

// wait returns the channel to select on.
func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	ch := d.ch
	d.mu.Unlock()
	return ch
}

// state reports whether the deadline has passed or the connection closed.
func (d *deadline) state() (expired, closed bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fired, d.closed
}

// The context.Context methods, for the backend's blocking calls.

// Deadline implements context.Context; the deadline is in Done.
func (d *deadline) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done implements context.Context.
func (d *deadline) Done() <-chan struct{} { return d.wait() }

// Err implements context.Context.
func (d *deadline) Err() error {
	switch fired, closed := d.state(); {
	case closed:
		return errConnClosed
	case fired:
		return os.ErrDeadlineExceeded
	}
	return nil
}

// Value implements context.Context.
func (d *deadline) Value(any) any { return nil }
