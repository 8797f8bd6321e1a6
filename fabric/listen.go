package fabric

import (
	"context"
	"fmt"
	"time"
)

// Listener accepts connections from any number of peers, each as an
// independent Endpoint: libfabric's passive endpoint (fi_listen,
// fi_accept), rdma_cm's rdma_listen, a TCP listener.
//
// Handshakes run in the background as peers connect, concurrently, and
// completed connections wait in a bounded queue (Options.Backlog) until
// Accept takes them, as a kernel's TCP accept queue does. A connection
// that finds the queue full is refused: the dialer's Open fails with an
// error matching ErrRefused (a *RefusedError where the listener's answer
// says so), and the listener counts it. A peer that
// starts a handshake and never finishes it is dropped after
// Options.HandshakeTimeout and holds up nobody.
//
// Close stops listening, wakes blocked Accept calls with os.ErrClosed and
// closes the connections that were never accepted. Endpoints already
// accepted stay open: they are independent of the listener.
type Listener interface {
	// Accept waits for the next completed connection and returns it.
	Accept(ctx context.Context) (Endpoint, error)
	// Addr returns the address the listener listens on, in the
	// backend's syntax, such that Open(ctx, backend, l.Addr(), nil)
	// connects to it (a wildcard host or port is resolved where the
	// backend can).
	Addr() string
	// Stats returns a snapshot of the listener's counters.
	Stats() ListenerStats
	// Close stops the listener. It is idempotent.
	Close() error
}

// ListenerStats are a listener's counters.
type ListenerStats struct {
	// Accepted counts connections handed out by Accept.
	Accepted uint64
	// Refused counts connections refused because the backlog was full.
	Refused uint64
	// Failed counts handshakes that failed: malformed, forged or replayed
	// handshake messages, peers that vanished or timed out.
	Failed uint64
	// Pending is the number of connections in a handshake or waiting for
	// Accept.
	Pending int
}

// ListenDriver is the optional interface of a Driver whose backend can
// accept connections. Listen returns ErrNotSupported for drivers without
// it.
type ListenDriver interface {
	// Listen starts listening at addr. Accepted endpoints are configured
	// by opts, as Open configures a dialed one.
	Listen(ctx context.Context, addr string, opts Options) (Listener, error)
}

// DefaultBacklog is the listener backlog when Options.Backlog is zero.
const DefaultBacklog = 128

// DefaultHandshakeTimeout bounds a listener's handshake with one peer when
// Options.HandshakeTimeout is zero.
const DefaultHandshakeTimeout = 5 * time.Second

// BacklogSize returns the listener backlog that o selects.
func (o *Options) BacklogSize() int {
	if o == nil || o.Backlog <= 0 {
		return DefaultBacklog
	}
	return o.Backlog
}

// HandshakeLimit returns the handshake timeout that o selects.
func (o *Options) HandshakeLimit() time.Duration {
	if o == nil || o.HandshakeTimeout <= 0 {
		return DefaultHandshakeTimeout
	}
	return o.HandshakeTimeout
}

// Listen starts a listener of the named backend at addr. opts may be nil.
// Backends that cannot listen return an error matching ErrNotSupported.
// When it fails, the Listener is nil.
func Listen(ctx context.Context, backend, addr string, opts *Options) (Listener, error) {
	d, err := driver("listen", backend, addr)
	if err != nil {
		return nil, err
	}
	ld, ok := d.(ListenDriver)
	if !ok {
		return nil, &OpError{Op: "listen", Backend: backend, Addr: addr, Err: ErrNotSupported}
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	l, err := ld.Listen(ctx, addr, o)
	if err != nil {
		return nil, err // never a driver's nil pointer in a non-nil Listener
	}
	return l, nil
}

func driver(op, backend, addr string) (Driver, error) {
	driversMu.RLock()
	d, ok := drivers[backend]
	driversMu.RUnlock()
	if !ok {
		return nil, &OpError{Op: op, Backend: backend, Addr: addr,
			Err: fmt.Errorf("%w %q (registered: %v)", ErrUnknownBackend, backend, Backends())}
	}
	return d, nil
}
