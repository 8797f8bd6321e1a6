package sock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/testenv"
	_ "github.com/weft-io/weft/ntb"
	_ "github.com/weft-io/weft/roce"
)

// A backend is one way of making connections for the table-driven
// tests. listen is nil for backends whose fabric listener has not
// landed; pair then connects two fabric.Open endpoints.
type backend struct {
	name string
	// listen starts a listener for a test; dial reaches it.
	listen func(t testing.TB, cfg *Config) *Listener
	// pair returns two endpoints connected to each other.
	pair func(t testing.TB, o *fabric.Options) (a, b fabric.Endpoint)
}

// backends are the backends the tests run over (ethernet, which needs
// root and namespaces, is added in ethernet_test.go).
var backends = []backend{
	{name: "ntb", listen: ntbListen, pair: ntbPair},
	{name: "ntb-copy", pair: func(t testing.TB, o *fabric.Options) (fabric.Endpoint, fabric.Endpoint) {
		a, b := ntbPair(t, o)
		return noViews{a}, noViews{b}
	}},
	{name: "roce", listen: roceListen, pair: func(t testing.TB, o *fabric.Options) (fabric.Endpoint, fabric.Endpoint) {
		return rocePair(t, o, "")
	}},
}

// roceListen listens on the user-space engine of 127.0.0.1, a port of the
// kernel's choosing; dialers reach it from the same engine.
func roceListen(t testing.TB, cfg *Config) *Listener {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := Listen(ctx, "roce", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func ntbListen(t testing.TB, cfg *Config) *Listener {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := Listen(ctx, "ntb", filepath.Join(t.TempDir(), "bridge"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func ntbPair(t testing.TB, o *fabric.Options) (fabric.Endpoint, fabric.Endpoint) {
	return fabrictest.ListenPair(t, "ntb", filepath.Join(t.TempDir(), "bridge"), o)
}

// noViews hides an endpoint's fabric.ViewReceiver, so the connection
// takes the Recv path.
type noViews struct{ fabric.Endpoint }

// rocePair connects two user-space RoCE engines on loopback, as the roce
// tests do (127.0.0.1 listens, 127.0.0.2 dials).
func rocePair(t testing.TB, o *fabric.Options, query string) (fabric.Endpoint, fabric.Endpoint) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type res struct {
		ep  fabric.Endpoint
		err error
	}
	ch := make(chan res, 1)
	go func() {
		ep, err := fabric.Open(ctx, "roce", fmt.Sprintf("listen:127.0.0.1:%d?%s", port, query), o)
		ch <- res{ep, err}
	}()
	b, err := fabric.Open(ctx, "roce", fmt.Sprintf("127.0.0.1:%d?local=127.0.0.2&%s", port, query), o)
	r := testenv.Recv(t, ch, "the roce listener's Open")
	if err != nil || r.err != nil {
		for _, ep := range []fabric.Endpoint{b, r.ep} {
			if ep != nil {
				ep.Close()
			}
		}
		t.Fatalf("roce pair: %v / %v", r.err, err)
	}
	return r.ep, b
}

// connPair returns a connected pair of Conns over be: a is the accepting
// side, b the dialling one. Both are closed when the test ends.
func connPair(t testing.TB, be backend, cfg *Config) (a, b *Conn) {
	t.Helper()
	if be.listen != nil {
		l := be.listen(t, cfg)
		defer l.Close()
		return connOn(t, be, l, cfg)
	}
	var o *fabric.Options
	if cfg != nil {
		o = &cfg.Options
	}
	ea, eb := be.pair(t, o)
	var err error
	if a, err = NewConn(ea, cfg); err != nil {
		t.Fatal(err)
	}
	if b, err = NewConn(eb, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// connOn dials l, a listener of be, and accepts the connection: a is the
// accepting side, b the dialling one. Both are closed when the test ends.
func connOn(t testing.TB, be backend, l *Listener, cfg *Config) (a, b *Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dialed := make(chan error, 1)
	go func() {
		c, err := Dial(ctx, be.name, l.Addr().String(), cfg)
		if err == nil {
			b = c.(*Conn)
		}
		dialed <- err
	}()
	c, aerr := l.AcceptContext(ctx)
	if berr := testenv.Recv(t, dialed, "the Dial"); aerr != nil || berr != nil {
		t.Fatalf("accept: %v, dial: %v", aerr, berr)
	}
	a = c.(*Conn)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func forEach(t *testing.T, f func(t *testing.T, be backend)) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) { f(t, be) })
	}
}

// TestUnreliable: NewConn refuses an endpoint that may lose or reorder
// messages (RoCE UD) with fabric.ErrNotSupported, and leaves it open.
func TestUnreliable(t *testing.T) {
	a, b := rocePair(t, nil, "type=ud")
	defer a.Close()
	defer b.Close()
	if _, err := NewConn(a, nil); !errors.Is(err, fabric.ErrNotSupported) {
		t.Fatalf("NewConn over RoCE UD: %v, want ErrNotSupported", err)
	}
}

// TestFrameFitsPeers: by default no frame, header included, is larger
// than 64 KiB, the receive slot a verbs peer posts by default, whatever
// the local endpoint could take: a peer sizes its slots from its own
// Caps, and HELLO does not carry a frame size.
func TestFrameFitsPeers(t *testing.T) {
	for _, be := range backends {
		if be.name != "ntb" && be.name != "roce" {
			continue
		}
		t.Run(be.name, func(t *testing.T) {
			a, b := connPair(t, be, nil)
			for _, c := range []*Conn{a, b} {
				if c.maxData+hdrLen > 64<<10 {
					t.Errorf("frames of %d bytes: over a 64 KiB receive slot", c.maxData+hdrLen)
				}
			}
		})
	}
}
