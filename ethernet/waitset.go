package ethernet

import "github.com/weft-io/weft/fabric"

var _ fabric.Waitable = (*Queue)(nil)

// ArmWait implements fabric.Waitable: the set watches the queue's AF_XDP
// socket, which the kernel makes readable while the RX ring holds
// descriptors. It reports ready when the ring has some already, and
// kicks the kernel first when the fill ring asks for a wake-up, as Recv
// does. A queue belongs to one wait set at a time.
func (q *Queue) ArmWait(w *fabric.Waker) (bool, error) {
	if q.closed.Load() {
		return false, q.errClosed("wait")
	}
	q.armed.Store(w)
	if q.closed.Load() {
		w.Wake()
	}
	if err := w.WatchFD(q.s.FD()); err != nil {
		return true, nil // the caller polls; the next wait tries again
	}
	if q.s.Fill().NeedsWakeup() || q.s.BusyPolling() {
		q.s.WakeRX()
	}
	return q.s.RX().Len() > 0, nil
}

// DisarmWait implements fabric.Waitable.
func (q *Queue) DisarmWait(w *fabric.Waker) { q.armed.CompareAndSwap(w, nil) }
