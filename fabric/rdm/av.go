package rdm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/fabric"
)

// peer is an entry of the address vector.
type peer struct {
	id   Peer
	name string
	e    *Endpoint

	tx    atomic.Pointer[conn] // the connection we send over
	ready chan struct{}        // closed once tx is set or the peer failed

	mu      sync.Mutex
	conns   []*conn
	dialing bool
	failed  error
	gone    bool // removed from the vector (failed or Removed)
}

// conn is one connection to a peer.
type conn struct {
	ep   fabric.Endpoint
	peer *peer
	// gone: the peer failed; Recv drains what the connection still holds
	// and then drops it.
	gone atomic.Bool
}

func (p *peer) isGone() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gone
}

func (p *peer) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed != nil {
		return p.failed
	}
	return fabric.ErrPeerGone
}

// attach adds a connection to the peer; the first becomes the one we send
// over. It reports false if the peer has failed meanwhile.
func (p *peer) attach(c *conn) bool {
	p.mu.Lock()
	if p.gone {
		p.mu.Unlock()
		return false
	}
	p.conns = append(p.conns, c)
	first := p.tx.Load() == nil
	if first {
		p.tx.Store(c)
	}
	p.mu.Unlock()
	// Events from before the connection was made (a backend's link
	// coming up, or bouncing while the listener waited for a peer) are
	// stale: what counts is how the connection fares from now on.
	for len(c.ep.Events()) > 0 {
		<-c.ep.Events()
	}
	p.e.addConn(c)
	if first {
		close(p.ready)
	}
	go p.watch(c)
	return true
}

// watch fails the peer when the connection reports its loss.
func (p *peer) watch(c *conn) {
	for {
		select {
		case ev := <-c.ep.Events():
			switch ev.Kind {
			case fabric.EventPeerGone, fabric.EventLinkDown, fabric.EventError:
				err := ev.Err
				if err == nil {
					err = fmt.Errorf("%s: %w", ev.Kind, fabric.ErrPeerGone)
				}
				p.fail(err)
				return
			}
		case <-p.e.stop:
			return
		}
	}
}

// fail takes the peer out of service: it is reported gone once, its
// connections close, and sends to it fail from now on.
func (p *peer) fail(err error) {
	p.mu.Lock()
	if p.gone {
		p.mu.Unlock()
		return
	}
	p.gone = true
	if p.failed == nil {
		if errors.Is(err, fabric.ErrPeerGone) || errors.Is(err, fabric.ErrClosed) {
			p.failed = fmt.Errorf("peer %q: %w", p.name, err)
		} else {
			p.failed = fmt.Errorf("peer %q: %w: %w", p.name, fabric.ErrPeerGone, err)
		}
	}
	conns := p.conns
	p.conns = nil
	readyOpen := p.tx.Load() == nil
	p.mu.Unlock()
	if readyOpen {
		close(p.ready)
	}
	e := p.e
	e.av.forget(p)
	if !e.closed.Load() {
		e.gone.Add(1)
		e.emit(Event{Kind: fabric.EventPeerGone, Peer: p.id, Name: p.name, Err: p.failed, Time: time.Now()})
		for _, c := range conns {
			c.gone.Store(true)
		}
	}
}

// addressVector maps names to peers and handles to peers.
type addressVector struct {
	mu     sync.RWMutex
	byName map[string]*peer
	byID   map[Peer]*peer
	next   Peer
}

func (av *addressVector) init() {
	av.byName = map[string]*peer{}
	av.byID = map[Peer]*peer{}
}

// get returns the live peer called name, inserting it if needed.
func (av *addressVector) get(e *Endpoint, name string) (*peer, bool) {
	av.mu.Lock()
	defer av.mu.Unlock()
	if p := av.byName[name]; p != nil {
		return p, false
	}
	av.next++
	p := &peer{id: av.next, name: name, e: e, ready: make(chan struct{})}
	av.byName[name] = p
	av.byID[p.id] = p
	return p, true
}

// forget removes p's name, so the name can be inserted afresh; its handle
// keeps answering with its failure until Remove.
func (av *addressVector) forget(p *peer) {
	av.mu.Lock()
	if av.byName[p.name] == p {
		delete(av.byName, p.name)
	}
	av.mu.Unlock()
}

func (av *addressVector) live() int {
	av.mu.RLock()
	defer av.mu.RUnlock()
	return len(av.byName)
}

func (av *addressVector) all() []*peer {
	av.mu.RLock()
	defer av.mu.RUnlock()
	out := make([]*peer, 0, len(av.byID))
	for _, p := range av.byID {
		out = append(out, p)
	}
	return out
}

// Insert adds the peer called name to the address vector and returns its
// handle; inserting a name that is already there returns the same handle.
// With Config.Eager it starts connecting.
func (e *Endpoint) Insert(name string) (Peer, error) {
	if e.closed.Load() {
		return PeerNone, e.opErr("insert", fabric.ErrClosed)
	}
	if name == "" || len(name) > maxName {
		return PeerNone, e.opErr("insert", fmt.Errorf("peer name %q: empty or longer than %d bytes: %w", name, maxName, fabric.ErrInvalid))
	}
	if e.cfg.Resolve == nil {
		if _, err := fabric.Usage(e.backend); err != nil {
			return PeerNone, e.opErr("insert", err)
		}
	}
	p, _ := e.av.get(e, name)
	if e.cfg.Eager {
		e.connect(p)
	}
	return p.id, nil
}

// Remove takes p out of the address vector and closes its connections.
// Its handle is invalid afterwards.
func (e *Endpoint) Remove(p Peer) error {
	e.av.mu.Lock()
	pe := e.av.byID[p]
	delete(e.av.byID, p)
	e.av.mu.Unlock()
	if pe == nil {
		return e.opErr("remove", fmt.Errorf("peer %d: %w", p, fabric.ErrInvalid))
	}
	pe.mu.Lock()
	wasGone := pe.gone
	pe.mu.Unlock()
	if !wasGone {
		pe.fail(fmt.Errorf("removed: %w", fabric.ErrClosed))
	}
	return nil
}

// Lookup returns the name of peer p.
func (e *Endpoint) Lookup(p Peer) (string, bool) {
	e.av.mu.RLock()
	defer e.av.mu.RUnlock()
	if pe := e.av.byID[p]; pe != nil {
		return pe.name, true
	}
	return "", false
}

func (e *Endpoint) peer(p Peer, op string) (*peer, error) {
	e.av.mu.RLock()
	pe := e.av.byID[p]
	e.av.mu.RUnlock()
	switch {
	case e.closed.Load():
		return nil, e.opErr(op, fabric.ErrClosed)
	case pe == nil:
		return nil, e.opErr(op, fmt.Errorf("peer %d is not in the address vector: %w", p, fabric.ErrInvalid))
	}
	return pe, nil
}

// connect starts dialling p unless a connection exists or is being made.
func (e *Endpoint) connect(p *peer) {
	p.mu.Lock()
	if p.dialing || p.gone || p.tx.Load() != nil {
		p.mu.Unlock()
		return
	}
	p.dialing = true
	p.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if err := e.dial(p); err != nil {
			p.fail(err)
		}
	}()
}

// dial opens a connection to p and introduces us on it.
func (e *Endpoint) dial(p *peer) error {
	addr := p.name
	if e.cfg.Resolve != nil {
		a, err := e.cfg.Resolve(p.name)
		if err != nil {
			return err
		}
		addr = a
	}
	ctx, cancel := context.WithTimeout(e.base, e.cfg.DialTimeout)
	defer cancel()
	ep, err := fabric.Open(ctx, e.backend, addr, &e.cfg.Options)
	if err != nil {
		return err
	}
	if err := sendHello(ctx, ep, e.name); err != nil {
		ep.Close()
		return err
	}
	e.dialed.Add(1)
	if !p.attach(&conn{ep: ep, peer: p}) {
		ep.Close()
	}
	return nil
}

// acceptLoop accepts connections and reads their hellos, each in a
// goroutine of its own bounded by the handshake timeout, so a peer that
// connects and says nothing holds up nobody.
func (e *Endpoint) acceptLoop(l fabric.Listener) {
	defer e.wg.Done()
	for {
		ep, err := l.Accept(context.Background())
		if err != nil {
			return // closed
		}
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			ctx, cancel := context.WithTimeout(e.base, e.cfg.Options.HandshakeLimit())
			defer cancel()
			name, err := recvHello(ctx, ep)
			if err != nil || e.closed.Load() {
				e.badHelo.Add(1)
				ep.Close()
				return
			}
			if name == "" {
				// An endpoint nobody can dial: it gets a handle of its
				// own, named after its connection.
				name = "anonymous:" + ep.RemoteAddr() + fmt.Sprintf("#%p", ep)
			}
			p, _ := e.av.get(e, name)
			e.accepted.Add(1)
			if !p.attach(&conn{ep: ep, peer: p}) {
				ep.Close()
			}
		}()
	}
}
