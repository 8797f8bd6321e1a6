package roce

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/acceptq"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/link"
)

// rdma_cm addresses of the "roce" backend:
//
//	rdmacm://[listen:]HOST:PORT[?mtu=1024&local=IP&timeout=19&retry=7&rnr=7&keepalive=100ms&...]
//	[listen:]HOST:PORT?cm=1[&...]
//
// HOST:PORT is the peer's (or, with listen:, the local) IP address and
// rdma_cm port in the TCP port space (7471 if omitted, as rdma_server
// and rdma_client use): Open connects like rdma_connect and, with
// listen:, accepts one connection like rdma_listen + rdma_accept; Close
// disconnects (DREQ). The parameters are those of ParseAddr; type must
// be rc. timeout= is ConnConfig.ACKTimeout: without it (or with 0) the
// connection uses what Linux's rdma_cm asks for, DefaultCMACKTimeout
// (19: 2.1 s), not the exchange's default of 12; the connecting side
// asks the peer for it in the REQ, and a listener takes the REQ's
// unless its own timeout= is larger.

// parseCMAddr parses an rdma_cm address into Options (Bootstrap holds
// HOST:PORT) and the peer's or listener's address.
func parseCMAddr(ctx context.Context, addr string) (Options, netip.AddrPort, error) {
	listen, hp, p, err := splitAddr(strings.TrimPrefix(addr, cm.Scheme), cm.DefaultPort)
	if err != nil {
		return defaultOptions(), netip.AddrPort{}, err
	}
	p.Bool("cm", true)
	_, timeoutSet := p.Lookup("timeout")
	o, err := parseOptions(listen, hp, p)
	if err != nil {
		return o, netip.AddrPort{}, err
	}
	if !timeoutSet {
		o.Timeout = 0 // ConnConfig's default, DefaultCMACKTimeout, not the exchange's
	}
	if o.Type != RC {
		return o, netip.AddrPort{}, fmt.Errorf("rdma_cm connects RC queue pairs only (UD needs SIDR): %w", fabric.ErrNotSupported)
	}
	ap, err := cm.ResolveAddr(ctx, o.Bootstrap)
	return o, ap, err
}

// localFor returns the local address that routes to dst.
func localFor(dst netip.Addr) (netip.Addr, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, link.Port)))
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}

func (o *Options) connConfig(fo fabric.Options) *ConnConfig {
	c := &ConnConfig{MTU: o.MTU, ACKTimeout: o.Timeout, Retry: o.Retry, RNRRetry: o.RNRRetry,
		KeepAlive: o.KeepAlive, QP: o.QP}
	if fo.MaxMsgSize > 0 && c.QP.MaxMsgSize == 0 {
		c.QP.MaxMsgSize = fo.MaxMsgSize
	}
	c.QP.Spin = fo.Spin
	if fo.QueueDepth > 0 {
		c.QP.SQDepth = fo.QueueDepth
	}
	c.QP.CQ = nil
	return c
}

// cmDisconnectTime bounds how long Close waits for the peer's DREP.
const cmDisconnectTime = 2 * time.Second

// cmEndpoint wraps an established connection as an Endpoint whose Close
// drains, destroys the QP, sends the DREQ and lets the engine go.
func cmEndpoint(c *Conn, pd *PD, release func()) *Endpoint {
	return &Endpoint{qp: c.QP(), pd: pd, laddr: cm.Scheme + c.LocalAddr().String(), raddr: cm.Scheme + c.RemoteAddr().String(),
		release: func() {
			ctx, cancel := context.WithTimeout(context.Background(), cmDisconnectTime)
			c.Disconnect(ctx)
			cancel()
			release()
		}}
}

// openCM opens an endpoint at an rdma_cm address (see cm.IsAddr).
func openCM(ctx context.Context, addr string, fo fabric.Options) (fabric.Endpoint, error) {
	o, ap, err := parseCMAddr(ctx, addr)
	if err != nil {
		return nil, opErrAddr("open", addr, err)
	}
	local := o.Local
	if !local.IsValid() {
		if o.Listen {
			local = ap.Addr()
		} else if local, err = localFor(ap.Addr()); err != nil {
			return nil, opErrAddr("open", addr, err)
		}
	}
	eng, release, err := acquireEngine(netip.AddrPortFrom(local, o.Port), o.engineOpts())
	if err != nil {
		return nil, opErrAddr("open", addr, err)
	}
	pd := eng.AllocPD()
	cfg := o.connConfig(fo)
	var c *Conn
	if o.Listen {
		var l *CMListener
		l, err = eng.CM().Listen(ap.Port(), 1, cfg)
		if err == nil {
			var r *ConnRequest
			r, err = l.Next(ctx)
			if err == nil {
				c, err = r.Accept(ctx, pd, nil)
			}
			l.Close()
		}
	} else {
		c, err = eng.CM().Dial(ctx, pd, ap, cfg)
	}
	if err != nil {
		release()
		return nil, opErrAddr("open", addr, err)
	}
	return cmEndpoint(c, pd, release), nil
}

// ListenCM starts a fabric.Listener at an rdma_cm address ("listen:" is
// implied): every connection request for the port is accepted in the
// background and queued (internal/acceptq) until Accept; requests beyond
// the backlog are rejected, which the dialer sees as fabric.ErrRefused.
func ListenCM(ctx context.Context, addr string, fo fabric.Options) (fabric.Listener, error) {
	if !strings.Contains(addr, "listen:") {
		if r, ok := strings.CutPrefix(addr, cm.Scheme); ok {
			addr = cm.Scheme + "listen:" + r
		} else {
			addr = "listen:" + addr
		}
	}
	o, ap, err := parseCMAddr(ctx, addr)
	if err != nil {
		return nil, opErrAddr("listen", addr, err)
	}
	local := o.Local
	if !local.IsValid() {
		local = ap.Addr()
	}
	key := netip.AddrPortFrom(local, o.Port)
	eng, release, err := acquireEngine(key, o.engineOpts())
	if err != nil {
		return nil, opErrAddr("listen", addr, err)
	}
	cfg := o.connConfig(fo)
	l, err := eng.CM().Listen(ap.Port(), fo.BacklogSize(), cfg)
	if err != nil {
		release()
		return nil, opErrAddr("listen", addr, err)
	}
	cl := &cmListener{l: l, eng: eng, key: key, cfg: o.engineOpts(), release: release, addr: cm.Scheme + netip.AddrPortFrom(eng.LocalAddr(), ap.Port()).String(),
		limit: fo.HandshakeLimit()}
	cl.q = acceptq.New("roce", cl.addr, fo.BacklogSize())
	cl.wg.Add(1)
	go cl.loop()
	return cl, nil
}

type cmListener struct {
	l       *CMListener
	eng     *Engine
	key     netip.AddrPort // of the shared engine
	cfg     engineOpts
	release func()
	addr    string
	limit   time.Duration
	q       *acceptq.Queue
	wg      sync.WaitGroup
	once    sync.Once
}

func (cl *cmListener) loop() {
	defer cl.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-cl.q.Done()
		cancel()
	}()
	for {
		r, err := cl.l.Next(ctx)
		if err != nil {
			return
		}
		if !cl.q.Reserve() {
			r.Reject(nil)
			continue
		}
		cl.wg.Add(1)
		go func() {
			defer cl.wg.Done()
			hctx, hcancel := context.WithTimeout(ctx, cl.limit)
			defer hcancel()
			pd := cl.eng.AllocPD()
			c, err := r.Accept(hctx, pd, nil)
			if err != nil {
				cl.q.Fail()
				return
			}
			// Each endpoint holds the engine, so it outlives the listener.
			_, rel, err := acquireEngine(cl.key, cl.cfg)
			if err != nil {
				c.Disconnect(hctx)
				c.QP().Destroy()
				cl.q.Fail()
				return
			}
			cl.q.Offer(cmEndpoint(c, pd, rel))
		}()
	}
}

// Accept implements fabric.Listener.
func (cl *cmListener) Accept(ctx context.Context) (fabric.Endpoint, error) { return cl.q.Accept(ctx) }

// Addr implements fabric.Listener.
func (cl *cmListener) Addr() string { return cl.addr }

// Stats implements fabric.Listener.
func (cl *cmListener) Stats() fabric.ListenerStats { return cl.q.Stats() }

// Close implements fabric.Listener.
func (cl *cmListener) Close() error {
	cl.once.Do(func() {
		cl.q.Close()
		cl.l.Close()
		cl.wg.Wait()
		cl.release()
	})
	return nil
}
