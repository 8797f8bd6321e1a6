// Package acceptq is the accept queue every backend's fabric.Listener is
// built on: one implementation of the backlog, the refusal of excess
// connections, the bound on handshakes, Accept and Close, so that all
// listeners behave alike.
//
// A backend's listener loop calls Reserve when a peer starts a handshake
// (and refuses the peer when it returns false), then either Offer with the
// finished endpoint or Fail. The slot a Reserve takes is given back when
// Accept hands the endpoint out, or by Fail: the backlog therefore bounds
// handshakes in progress and finished connections not yet accepted
// together, so a flood of half-open connections cannot grow memory
// either.
package acceptq

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/weft-io/weft/fabric"
)

// Queue is a listener's accept queue. Its methods are safe for concurrent
// use.
type Queue struct {
	backend, addr string

	slots chan struct{} // one token per reserved connection
	ready chan fabric.Endpoint
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex // orders Offer against Close's drain

	accepted, refused, failed atomic.Uint64
}

// New returns a queue with room for backlog connections (at least 1).
func New(backend, addr string, backlog int) *Queue {
	backlog = max(backlog, 1)
	return &Queue{backend: backend, addr: addr, slots: make(chan struct{}, backlog),
		ready: make(chan fabric.Endpoint, backlog), done: make(chan struct{})}
}

// Reserve takes a slot for a connection whose handshake starts. It returns
// false, and counts a refusal, when the backlog is full or the queue is
// closed; the caller then refuses the peer.
func (q *Queue) Reserve() bool {
	select {
	case <-q.done:
		return false
	default:
	}
	select {
	case q.slots <- struct{}{}:
		return true
	default:
		q.refused.Add(1)
		return false
	}
}

// Fail gives back the slot of a handshake that failed and counts it.
func (q *Queue) Fail() {
	// The slot goes back before the failure counts: whoever sees the
	// count (Stats) also sees the slot free (Pending).
	<-q.slots
	q.failed.Add(1)
}

// Malformed counts a handshake message that failed validation before any
// slot was taken.
func (q *Queue) Malformed() { q.failed.Add(1) }

// Refuse counts a refused connection that took no slot (a backend that
// refuses for its own reasons, such as no free queue).
func (q *Queue) Refuse() { q.refused.Add(1) }

// Offer queues the endpoint of a finished handshake for Accept. If the
// queue is closed it closes ep, gives back the slot and returns an error
// matching os.ErrClosed.
func (q *Queue) Offer(ep fabric.Endpoint) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	select {
	case <-q.done:
		ep.Close()
		<-q.slots
		return fabric.ErrClosed
	default:
	}
	q.ready <- ep // never blocks: a slot was reserved for it
	return nil
}

// Accept waits for a queued endpoint.
func (q *Queue) Accept(ctx context.Context) (fabric.Endpoint, error) {
	select {
	case <-q.done:
		return nil, q.err(fabric.ErrClosed)
	default:
	}
	select {
	case ep := <-q.ready:
		<-q.slots
		q.accepted.Add(1)
		return ep, nil
	case <-q.done:
		return nil, q.err(fabric.ErrClosed)
	case <-ctx.Done():
		return nil, q.err(ctx.Err())
	}
}

func (q *Queue) err(err error) error {
	return &fabric.OpError{Op: "accept", Backend: q.backend, Addr: q.addr, Err: err}
}

// Done is closed when the queue is closed: handshakes in progress should
// stop.
func (q *Queue) Done() <-chan struct{} { return q.done }

// Closed reports whether Close was called.
func (q *Queue) Closed() bool {
	select {
	case <-q.done:
		return true
	default:
		return false
	}
}

// Close wakes blocked Accept calls and closes the endpoints nobody
// accepted. It is idempotent and reports whether this call closed it.
func (q *Queue) Close() bool {
	first := false
	q.once.Do(func() {
		first = true
		q.mu.Lock()
		close(q.done)
		q.mu.Unlock()
		for {
			select {
			case ep := <-q.ready:
				ep.Close()
				<-q.slots
			default:
				return
			}
		}
	})
	return first
}

// Stats returns the queue's counters.
func (q *Queue) Stats() fabric.ListenerStats {
	return fabric.ListenerStats{Accepted: q.accepted.Load(), Refused: q.refused.Load(),
		Failed: q.failed.Load(), Pending: len(q.slots)}
}
