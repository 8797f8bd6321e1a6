package roce

import "github.com/weft-io/weft/fabric"

var (
	_ fabric.Waitable = (*QP)(nil)
	_ fabric.Waitable = (*Endpoint)(nil)
)

// ArmWait implements fabric.Waitable for the receive side: the engine's
// receive path wakes w when it commits a message, as it wakes a RecvWait.
// It reports ready when a message is waiting or the QP is in the error
// state (Recv then says why). A QP belongs to one wait set at a time.
func (qp *QP) ArmWait(w *fabric.Waker) (bool, error) {
	if qp.closed.Load() {
		return false, opErr("wait", fabric.ErrClosed)
	}
	qp.armed.Store(w)
	qp.recvWaiters.Add(1)
	return qp.recvReady(), nil
}

// DisarmWait implements fabric.Waitable.
func (qp *QP) DisarmWait(w *fabric.Waker) {
	qp.recvWaiters.Add(-1)
	qp.armed.CompareAndSwap(w, nil)
}

// wakeSet wakes the wait set armed on the QP, if any.
func (qp *QP) wakeSet() {
	if w := qp.armed.Load(); w != nil {
		w.Wake()
	}
}

// ArmWait implements fabric.Waitable (see QP.ArmWait).
func (ep *Endpoint) ArmWait(w *fabric.Waker) (bool, error) { return ep.qp.ArmWait(w) }

// DisarmWait implements fabric.Waitable.
func (ep *Endpoint) DisarmWait(w *fabric.Waker) { ep.qp.DisarmWait(w) }
