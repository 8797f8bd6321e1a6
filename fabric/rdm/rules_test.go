package rdm_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/rdm"
	"github.com/weft-io/weft/internal/testenv"
)

// openRoce opens an endpoint over the user-space RoCE engine on loopback,
// as a rank of roceMesh does.
func openRoce(t *testing.T, cfg *rdm.Config) *rdm.Endpoint {
	t.Helper()
	e := roceMesh(t, "", 0, 1)
	if cfg != nil {
		e.Close()
		var err error
		if e, err = rdm.Open(context.Background(), "roce", "127.0.0.1:0?keepalive=50ms", cfg); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// connectTo inserts b into a's address vector and connects to it.
func connectTo(t *testing.T, a, b *rdm.Endpoint) rdm.Peer {
	t.Helper()
	p, err := a.Insert(b.Addrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Connect(testenv.Context(t), p); err != nil {
		t.Fatalf("connecting to %s: %v", b.Addrs()[0], err)
	}
	return p
}

// TestInsertRules: a peer name is 1 to 1024 bytes; Insert of a backend
// that does not exist, Remove of a handle not in the vector and calls
// after Close fail with the documented errors.
func TestInsertRules(t *testing.T) {
	e := openRoce(t, nil)
	if _, err := e.Insert(strings.Repeat("x", 1024)); err != nil {
		t.Errorf("a name of 1024 bytes: %v", err)
	}
	for _, name := range []string{"", strings.Repeat("x", 1025)} {
		if _, err := e.Insert(name); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("Insert of a %d-byte name: %v, want ErrInvalid", len(name), err)
		}
	}
	p1, err := e.Insert("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	if p2, err := e.Insert("127.0.0.1:1"); err != nil || p2 != p1 {
		t.Errorf("Insert twice: %v, %v; want the same handle %v", p2, err, p1)
	}
	if err := e.Remove(p1); err != nil {
		t.Fatal(err)
	}
	if err := e.Remove(p1); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("Remove of a removed peer: %v, want ErrInvalid", err)
	}
	if _, err := e.Send(rdm.Peer(9999), nil); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("Send to a peer not in the vector: %v, want ErrInvalid", err)
	}
	e.Close()
	if _, err := e.Insert("127.0.0.1:2"); !errors.Is(err, fabric.ErrClosed) {
		t.Errorf("Insert after Close: %v, want ErrClosed", err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestBadHello: a peer that connects and sends a malformed hello, or none
// within the handshake timeout, is dropped and counted; the endpoint goes
// on serving good peers.
func TestBadHello(t *testing.T) {
	cfg := &rdm.Config{}
	cfg.Options.HandshakeTimeout = 300 * time.Millisecond
	srv := openRoce(t, cfg)
	addr := srv.Addrs()[0] + "?keepalive=50ms"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, hello := range [][]byte{
		[]byte("WEFTRDX\x01\x00\x00"),                                // magic
		[]byte("WEFTRDM\x02\x00\x00"),                                // version
		[]byte("WEFTRDM\x01\x05\x00abc"),                             // name shorter than its length
		[]byte("WEFTRDM\x01\x01\x04" + "abc"),                        // length above 1024
		append([]byte("WEFTRDM\x01\xd0\x07"), make([]byte, 2000)...), // longer than the largest hello
		nil, // nothing: the handshake times out
	} {
		ep, err := fabric.Open(ctx, "roce", addr, nil)
		if err != nil {
			t.Fatal(err)
		}
		if hello != nil {
			reg, err := ep.Register(append([]byte(nil), hello...), 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ep.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}}); err != nil {
				t.Fatal(err)
			}
		}
		want := uint64(i + 1)
		if !testenv.Eventually(10*time.Second, func() bool { return srv.Stats().BadHellos >= want }) {
			t.Fatalf("hello %d (%q): BadHellos %d after 10s, want %d", i, hello, srv.Stats().BadHellos, want)
		}
		ep.Close()
	}
	if st := srv.Stats(); st.Peers != 0 || st.Accepted != 0 {
		t.Fatalf("bad hellos made peers: %+v", st)
	}
	// A good peer still gets through.
	cli := openRoce(t, nil)
	p, err := cli.Insert(srv.Addrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.Connect(ctx, p); err != nil {
		t.Fatalf("a good peer after the bad hellos: %v", err)
	}
	if !testenv.Eventually(10*time.Second, func() bool { return srv.Stats().Accepted == 1 }) {
		t.Fatalf("Accepted %d after 10s, want 1", srv.Stats().Accepted)
	}
}

// TestPeerGoneCounted: a peer that closes is reported once, as an event
// whose error matches fabric.ErrPeerGone, and counted; sends to it fail
// with that error.
func TestPeerGoneCounted(t *testing.T) {
	a, b := openRoce(t, nil), openRoce(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := connectTo(t, a, b)
	b.Close()
	select {
	case ev := <-a.Events():
		if ev.Kind != fabric.EventPeerGone || ev.Peer != p || !errors.Is(ev.Err, fabric.ErrPeerGone) {
			t.Fatalf("event %+v, want EventPeerGone for %v matching ErrPeerGone", ev, p)
		}
	case <-ctx.Done():
		t.Fatal("timed out after 20s waiting for the peer-gone event of a closed peer")
	}
	if st := a.Stats(); st.PeersGone != 1 {
		t.Fatalf("PeersGone = %d, want 1", st.PeersGone)
	}
	reg, _ := a.Alloc(8)
	if _, err := a.Send(p, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}}); !errors.Is(err, fabric.ErrPeerGone) {
		t.Fatalf("Send to a gone peer: %v, want ErrPeerGone", err)
	}
}

// TestOneDial: an eager Insert, a Connect and sends while that dial is
// under way make one connection, not one each.
func TestOneDial(t *testing.T) {
	a := openRoce(t, &rdm.Config{Eager: true})
	b := openRoce(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := a.Insert(b.Addrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	reg, _ := a.Alloc(8)
	a.Send(p, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}})
	if err := a.Connect(ctx, p); err != nil {
		t.Fatal(err)
	}
	if _, err := a.SendWait(ctx, p, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}}); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.Dialed != 1 || st.Conns != 1 {
		t.Fatalf("Dialed %d, Conns %d: want one connection", st.Dialed, st.Conns)
	}
}

// TestNameBound: an endpoint's own name is at most 1024 bytes.
func TestNameBound(t *testing.T) {
	for n, ok := range map[int]bool{1024: true, 1025: false} {
		e, err := rdm.Open(context.Background(), "roce", "127.0.0.1:0", &rdm.Config{Name: strings.Repeat("n", n)})
		if (err == nil) != ok || (err != nil && !errors.Is(err, fabric.ErrInvalid)) {
			t.Errorf("a name of %d bytes: %v; want accepted %v", n, err, ok)
		}
		if e != nil {
			e.Close()
		}
	}
}

// TestEventsDropped: an event that finds the Events channel full is
// dropped and counted, never blocking the endpoint.
func TestEventsDropped(t *testing.T) {
	a := openRoce(t, &rdm.Config{Events: 1})
	for range 2 {
		b := openRoce(t, nil)
		connectTo(t, a, b)
		b.Close()
	}
	if !testenv.Eventually(20*time.Second, func() bool { return a.Stats().PeersGone == 2 }) {
		t.Fatalf("PeersGone %d after 20s, want 2", a.Stats().PeersGone)
	}
	if st := a.Stats(); st.EventsDropped != 1 || len(a.Events()) != 1 {
		t.Fatalf("EventsDropped %d with %d queued: want the second of two events dropped", st.EventsDropped, len(a.Events()))
	}
}

// TestCallRules: Recv and RecvWait refuse a peer slice shorter than the
// messages, Register refuses remote access, Alloc a size below 1,
// Endpoint an unknown peer; after Close, Recv and RecvWait fail with
// ErrClosed.
func TestCallRules(t *testing.T) {
	e := openRoce(t, nil)
	ctx := testenv.Context(t)
	reg, _ := e.Alloc(8)
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}, {SGEs: []fabric.SGE{fabric.SGEOf(reg)}}}
	if _, err := e.Recv(msgs, make([]rdm.Peer, 1)); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("Recv with 1 peer slot for 2 messages: %v, want ErrInvalid", err)
	}
	if _, err := e.RecvWait(ctx, msgs, make([]rdm.Peer, 1)); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("RecvWait with 1 peer slot for 2 messages: %v, want ErrInvalid", err)
	}
	if _, err := e.Recv(msgs, make([]rdm.Peer, 2)); err != nil {
		t.Errorf("Recv with a slot per message: %v", err)
	}
	if _, err := e.Register(make([]byte, 8), fabric.AccessRemoteWrite); !errors.Is(err, fabric.ErrNotSupported) {
		t.Errorf("Register for remote writes: %v, want ErrNotSupported", err)
	}
	if _, err := e.Register(make([]byte, 8), fabric.AccessLocalWrite); err != nil {
		t.Errorf("Register for receives: %v", err)
	}
	for _, n := range []int{0, -1} {
		if _, err := e.Alloc(n); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("Alloc(%d): %v, want ErrInvalid", n, err)
		}
	}
	if r, err := e.Alloc(1); err != nil || r.Len() != 1 {
		t.Errorf("Alloc(1): %v", err)
	}
	if ep := e.Endpoint(rdm.Peer(12345)); ep != nil {
		t.Errorf("Endpoint of a peer not in the vector = %v, want nil", ep)
	}
	e.Close()
	if _, err := e.Recv(msgs, nil); !errors.Is(err, fabric.ErrClosed) {
		t.Errorf("Recv after Close: %v, want ErrClosed", err)
	}
	if _, err := e.RecvWait(ctx, msgs, nil); !errors.Is(err, fabric.ErrClosed) {
		t.Errorf("RecvWait after Close: %v, want ErrClosed", err)
	}
}

// TestRecvWaitQuiet: RecvWait on connected but quiet peers waits, and
// ends with the context's error at its deadline, not with nothing.
func TestRecvWaitQuiet(t *testing.T) {
	a, b := openRoce(t, nil), openRoce(t, nil)
	connectTo(t, a, b)
	reg, _ := a.Alloc(8)
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}}
	testenv.Await(t, "RecvWait to end at its 50ms deadline", func() {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if n, err := a.RecvWait(ctx, msgs, nil); n != 0 || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("RecvWait with nothing sent: %d, %v; want the deadline's error", n, err)
		}
	})
}

// TestSendWaitUnreachable: SendWait to a peer nobody answers fails with
// an error matching ErrPeerGone once the dial gives up.
func TestSendWaitUnreachable(t *testing.T) {
	e := openRoce(t, &rdm.Config{DialTimeout: 200 * time.Millisecond})
	p, err := e.Insert("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	reg, _ := e.Alloc(8)
	testenv.Await(t, "SendWait to an unreachable peer to fail", func() {
		if _, err := e.SendWait(testenv.Context(t), p, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}}); !errors.Is(err, fabric.ErrPeerGone) {
			t.Errorf("SendWait to 127.0.0.1:1: %v, want ErrPeerGone", err)
		}
	})
}
