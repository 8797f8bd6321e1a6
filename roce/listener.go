package roce

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"sync"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/acceptq"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/exchange"
)

// Listener is the roce backend's fabric.Listener: one TCP listener for the
// pingpong exchange, whose incoming connections are set up concurrently,
// each as a queue pair of the one engine of its local address, and queued
// in an accept queue (internal/acceptq) until Accept takes them.
//
// A connection that finds the backlog full gets a refusal in place of the
// listener's address (MarshalRefusal), which a Weft dialer reports as an
// error matching fabric.ErrRefused; a handshake that sends garbage, stops
// halfway or outlasts Options.HandshakeTimeout is dropped and counted in
// Stats().Failed.
type Listener struct {
	ln      net.Listener
	q       *acceptq.Queue
	o       Options
	limit   time.Duration
	addr    string
	release func() // the listener's hold on its engine, if its host is fixed
	wg      sync.WaitGroup
	refuse  chan struct{} // bounds refusals in flight
	once    sync.Once
}

var _ fabric.Listener = (*Listener)(nil)

// maxRefusing bounds the refusals a listener writes at once; past it,
// excess connections are simply closed.
const maxRefusing = 64

// refuseTime bounds the refusal exchange with one peer.
const refuseTime = time.Second

// Listen implements fabric.ListenDriver: addr is HOST:PORT[?PARAMS] as
// for Open (a "listen:" prefix is allowed and ignored), the TCP address
// of the exchange; port 0 picks a free port, which Addr reports.
// An rdma_cm address (cm.IsAddr) listens through rdma_cm instead (ListenCM).
func (driver) Listen(ctx context.Context, addr string, fo fabric.Options) (fabric.Listener, error) {
	if cm.IsAddr(addr) {
		return ListenCM(ctx, addr, fo)
	}
	o, err := ParseAddr(addr)
	if err != nil {
		return nil, opErrAddr("listen", addr, err)
	}
	o.apply(fo)
	l, err := ListenExchange(ctx, o, fo)
	if err != nil {
		return nil, opErrAddr("listen", addr, err)
	}
	return l, nil
}

// ListenExchange starts a Listener on o.Bootstrap; fo gives its backlog
// and handshake timeout.
func ListenExchange(ctx context.Context, o Options, fo fabric.Options) (*Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", o.Bootstrap)
	if err != nil {
		return nil, err
	}
	ta := ln.Addr().(*net.TCPAddr).AddrPort()
	l := &Listener{ln: ln, o: o, limit: fo.HandshakeLimit(), refuse: make(chan struct{}, maxRefusing)}
	l.addr = dialAddr(ta, o)
	l.q = acceptq.New("roce", l.addr, fo.BacklogSize())
	if host := ta.Addr().Unmap(); !host.IsUnspecified() || o.Local.IsValid() {
		// Keep the engine up between connections.
		local := o.Local
		if !local.IsValid() {
			local = host
		}
		_, release, err := acquireEngine(netip.AddrPortFrom(local, o.Port), o.engineOpts())
		if err != nil {
			ln.Close()
			return nil, err
		}
		l.release = release
	}
	l.wg.Add(1)
	go l.loop()
	return l, nil
}

// dialAddr is the address a peer dials to reach a listener at ta: the
// exchange's host and port, with the parameters both ends must agree on.
func dialAddr(ta netip.AddrPort, o Options) string {
	s := ta.String()
	v := url.Values{}
	if o.Type == UD {
		v.Set("type", "ud")
	}
	if o.MTU != 1024 {
		v.Set("mtu", fmt.Sprint(o.MTU))
	}
	if o.QKey != 0x11111111 {
		v.Set("qkey", fmt.Sprintf("%#x", o.QKey))
	}
	if len(v) > 0 {
		s += "?" + v.Encode()
	}
	return s
}

func (l *Listener) loop() {
	defer l.wg.Done()
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			if l.q.Closed() || errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond) // EMFILE and the like: let it pass
			continue
		}
		if !l.q.Reserve() {
			l.refuseConn(conn, "backlog full")
			continue
		}
		l.wg.Add(1)
		go l.handshake(conn)
	}
}

// refuseConn answers a connection the listener cannot take with a refusal.
// It reads the client's address first, so that closing does not reset the
// connection under the refusal.
func (l *Listener) refuseConn(conn net.Conn, reason string) {
	select {
	case l.refuse <- struct{}{}:
	default:
		conn.Close() // a flood: no more goroutines for it
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer func() { <-l.refuse }()
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), min(refuseTime, l.limit))
		defer cancel()
		go func() {
			select {
			case <-l.q.Done():
				cancel()
			case <-ctx.Done():
			}
		}()
		exchange.Refuse(ctx, conn, reason)
	}()
}

// handshake runs the server side of the exchange with one peer and
// queues the endpoint. A reserved backlog slot is held throughout.
func (l *Listener) handshake(conn net.Conn) {
	defer l.wg.Done()
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), l.limit)
	defer cancel()
	go func() { // Close cancels the handshakes in progress
		select {
		case <-l.q.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	ep, err := l.exchange(ctx, conn)
	if err != nil {
		l.q.Fail()
		return
	}
	l.q.Offer(ep) // closes ep if the listener closed meanwhile
}

func (l *Listener) exchange(ctx context.Context, conn net.Conn) (*Endpoint, error) {
	defer exchange.WatchDeadline(ctx, conn)()
	peer, err := exchange.ReadClient(conn)
	if err != nil {
		return nil, err
	}
	if err := exchange.CheckPeer(peer); err != nil {
		return nil, err
	}
	ep, mine, err := newEndpoint(l.o, localOf(conn, l.o.Local), conn.LocalAddr().String(), conn.RemoteAddr().String())
	if err != nil {
		return nil, err
	}
	if err := ep.connect(l.o, mine, peer); err != nil {
		ep.Close()
		return nil, err
	}
	if err := exchange.Reply(conn, mine); err != nil {
		ep.Close()
		return nil, err
	}
	return ep, nil
}

// Accept implements fabric.Listener.
func (l *Listener) Accept(ctx context.Context) (fabric.Endpoint, error) { return l.q.Accept(ctx) }

// Addr implements fabric.Listener: the exchange's HOST:PORT, with the
// port resolved, and the parameters a dialer must share (type, mtu,
// qkey).
func (l *Listener) Addr() string { return l.addr }

// Stats implements fabric.Listener.
func (l *Listener) Stats() fabric.ListenerStats { return l.q.Stats() }

// Close implements fabric.Listener: it stops listening, cancels the
// handshakes in progress, closes the endpoints nobody accepted and waits
// for all of it. Accepted endpoints stay open.
func (l *Listener) Close() error {
	l.once.Do(func() {
		l.q.Close()
		l.ln.Close()
		l.wg.Wait()
		if l.release != nil {
			l.release()
		}
	})
	return nil
}
