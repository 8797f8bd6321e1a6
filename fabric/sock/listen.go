package sock

import (
	"context"
	"errors"
	"net"
	"sync"

	"github.com/weft-io/weft/fabric"
)

// Dial connects to a listener of the named backend at addr (for example
// the String of a Listener's Addr) and returns the connection, a *Conn.
// ctx bounds the connection's setup only. cfg may be nil.
func Dial(ctx context.Context, backend, addr string, cfg *Config) (net.Conn, error) {
	var o *fabric.Options
	if cfg != nil {
		o = &cfg.Options
	}
	ep, err := fabric.Open(ctx, backend, addr, o)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: backend, Addr: &Addr{Backend: backend, Address: addr}, Err: err}
	}
	c, err := NewConn(ep, cfg)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Listener accepts connections over a fabric.Listener. It implements
// net.Listener; Accept returns *Conn values.
type Listener struct {
	fl     fabric.Listener
	cfg    *Config
	addr   *Addr
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once
}

// Listen starts listening with the named backend at addr (see
// fabric.Listen; cfg.Options configure the listener and the endpoints it
// accepts). The listener's Addr is what Dial needs to reach it. cfg may
// be nil.
func Listen(ctx context.Context, backend, addr string, cfg *Config) (*Listener, error) {
	var o *fabric.Options
	if cfg != nil {
		o = &cfg.Options
	}
	fl, err := fabric.Listen(ctx, backend, addr, o)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: backend, Addr: &Addr{Backend: backend, Address: addr}, Err: err}
	}
	return NewListener(fl, backend, cfg), nil
}

// NewListener returns a Listener that accepts connections from fl, a
// listener of the named backend. The Listener owns fl.
func NewListener(fl fabric.Listener, backend string, cfg *Config) *Listener {
	l := &Listener{fl: fl, cfg: cfg, addr: &Addr{Backend: backend, Address: fl.Addr()}}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l
}

// Accept implements net.Listener: it waits for the next connection. After
// Close it returns an error matching net.ErrClosed. Concurrent calls each
// get their own connection.
func (l *Listener) Accept() (net.Conn, error) {
	return l.AcceptContext(l.ctx)
}

// AcceptContext is Accept bounded by ctx as well.
func (l *Listener) AcceptContext(ctx context.Context) (net.Conn, error) {
	for {
		if l.ctx.Err() != nil {
			return nil, l.opErr(net.ErrClosed)
		}
		ep, err := l.fl.Accept(ctx)
		if err != nil {
			if l.ctx.Err() != nil || errors.Is(err, fabric.ErrClosed) {
				return nil, l.opErr(net.ErrClosed)
			}
			return nil, l.opErr(err)
		}
		c, err := NewConn(ep, l.cfg)
		if err != nil {
			// That peer is gone or unusable; others may be waiting.
			continue
		}
		return c, nil
	}
}

func (l *Listener) opErr(err error) error {
	return &net.OpError{Op: "accept", Net: l.addr.Backend, Addr: l.addr, Err: err}
}

// Close implements net.Listener: it stops listening and wakes blocked
// Accept calls. Connections already accepted stay open. A second Close
// returns net.ErrClosed.
func (l *Listener) Close() error {
	err := l.opErr(net.ErrClosed)
	l.once.Do(func() {
		l.cancel()
		err = l.fl.Close()
	})
	return err
}

// Addr implements net.Listener; it is an *Addr whose String Dial takes.
func (l *Listener) Addr() net.Addr { return l.addr }

// Stats returns the fabric listener's counters.
func (l *Listener) Stats() fabric.ListenerStats { return l.fl.Stats() }
