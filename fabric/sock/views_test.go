package sock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/ntb"
)

// viewSpy wraps an endpoint's fabric.ViewReceiver and records the views
// it hands out and releases; room, if set, replaces the endpoint's
// fabric.ViewRoom.
type viewSpy struct {
	fabric.Endpoint
	vr   fabric.ViewReceiver
	room *[2]int
	bump atomic.Uint64 // added to the endpoint's ViewEpoch

	// got, if set, runs after each receive that handed out views,
	// before the connection sees them.
	got func(views []fabric.View)

	mu       sync.Mutex
	received int      // views handed out
	released int      // views released
	mem      [][]byte // the payloads handed out
}

func newViewSpy(t testing.TB, ep fabric.Endpoint) *viewSpy {
	vr, ok := ep.(fabric.ViewReceiver)
	if !ok {
		t.Fatalf("%s endpoint lends no views", ep.Caps().Backend)
	}
	return &viewSpy{Endpoint: ep, vr: vr}
}

func (s *viewSpy) note(views []fabric.View, n int) {
	s.mu.Lock()
	s.received += n
	for _, v := range views[:n] {
		s.mem = append(s.mem, v.Data)
	}
	s.mu.Unlock()
	if s.got != nil && n > 0 {
		s.got(views[:n])
	}
}

func (s *viewSpy) RecvViews(views []fabric.View) (int, error) {
	n, err := s.vr.RecvViews(views)
	s.note(views, n)
	return n, err
}

func (s *viewSpy) RecvViewsWait(ctx context.Context, views []fabric.View) (int, error) {
	n, err := s.vr.RecvViewsWait(ctx, views)
	s.note(views, n)
	return n, err
}

func (s *viewSpy) ReleaseViews(n int) error {
	err := s.vr.ReleaseViews(n)
	if err == nil {
		s.mu.Lock()
		s.released += n
		s.mu.Unlock()
	}
	return err
}

func (s *viewSpy) OutstandingViews() int { return s.vr.OutstandingViews() }

// ViewEpoch is the endpoint's, plus bump: a test moves it as a backend
// does when the views' memory is reset under them.
func (s *viewSpy) ViewEpoch() uint64 {
	return s.Endpoint.(fabric.ViewRoom).ViewEpoch() + s.bump.Load()
}

func (s *viewSpy) ViewRoom() (int, int) {
	if s.room != nil {
		return s.room[0], s.room[1]
	}
	return s.Endpoint.(fabric.ViewRoom).ViewRoom()
}

// counts returns the views received and released so far.
func (s *viewSpy) counts() (received, released int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.received, s.released
}

// aliased reports whether b lies in the payload of a view handed out.
func (s *viewSpy) aliased(b []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	for _, m := range s.mem {
		q := uintptr(unsafe.Pointer(unsafe.SliceData(m)))
		if len(m) > 0 && p >= q && p+uintptr(len(b)) <= q+uintptr(len(m)) {
			return true
		}
	}
	return false
}

// viewBackends are the backends that lend views.
func viewBackends(t *testing.T, f func(t *testing.T, be backend)) {
	for _, be := range backends {
		if be.name == "ntb" || be.name == "roce" {
			t.Run(be.name, func(t *testing.T) { f(t, be) })
		}
	}
}

// spyPair connects a Conn over a plain endpoint (a, the writer) to one
// over a viewSpy (b, the reader), without keep-alive: only the test pumps
// b.
func spyPair(t *testing.T, be backend, room *[2]int) (a, b *Conn, spy *viewSpy) {
	ea, eb := be.pair(t, nil)
	spy = newViewSpy(t, eb)
	spy.room = room
	cfg := &Config{KeepAlive: -1}
	var err error
	if a, err = NewConn(ea, cfg); err != nil {
		t.Fatal(err)
	}
	if b, err = NewConn(spy, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b, spy
}

// pumpUntil pumps c, as a Write waiting for credit would, until it has
// buffered want bytes (want < 0: until it has received FIN); check runs
// under c.mu after each burst, and a problem it returns fails the test.
func pumpUntil(t *testing.T, c *Conn, want int, check func() string) {
	t.Helper()
	ctx := testenv.Context(t)
	for {
		c.mu.Lock()
		n := c.rlen
		if want < 0 && c.eof {
			n = want
		}
		problem := ""
		if check != nil {
			problem = check()
		}
		if c.err != nil {
			problem = fmt.Sprintf("the connection failed with %d of %d bytes buffered: %v", n, want, c.err)
		}
		c.mu.Unlock()
		if problem != "" {
			t.Fatal(problem)
		}
		if n == want {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%d of %d bytes buffered: %v", n, want, ctx.Err())
		}
		c.pump(ctx)
	}
}

func seqBytes(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(1 + (i*7+seed)%251)
	}
	return b
}

// TestHeldViewsOneCopy: DATA that arrives while no Read is pumping stays
// in its fabric view, unreleased, and the ring is untouched; so do the
// views behind it (here FIN's), which can only be released after it. The
// Read copies from the views and releases each once read whole.
func TestHeldViewsOneCopy(t *testing.T) {
	viewBackends(t, func(t *testing.T, be backend) {
		a, b, spy := spyPair(t, be, nil)
		var sent []byte
		rel0 := -1 // views released before the first DATA
		for i, n := range []int{1000, 20000, 100} {
			p := seqBytes(n, i)
			if _, err := a.Write(p); err != nil {
				t.Fatal(err)
			}
			sent = append(sent, p...)
			pumpUntil(t, b, len(sent), func() string {
				if b.rlen < b.hlen {
					return fmt.Sprintf("%d bytes held, %d buffered: held bytes are buffered bytes", b.hlen, b.rlen)
				}
				return ""
			})
			if rel0 < 0 {
				_, rel0 = spy.counts()
			}
		}
		if err := a.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		pumpUntil(t, b, -1, nil)
		b.mu.Lock()
		if b.hlen != len(sent) || b.hv.n != 3 {
			t.Errorf("%d bytes in %d held views, want %d in 3", b.hlen, b.hv.n, len(sent))
		}
		for i := range b.hv.n {
			if v := b.hv.q[(b.hv.head+i)%len(b.hv.q)]; !spy.aliased(v.b) {
				t.Errorf("held view %d is not the endpoint's memory", i)
			}
		}
		if !bytes.Equal(b.rbuf, make([]byte, len(b.rbuf))) {
			t.Error("the ring was written")
		}
		b.mu.Unlock()
		recv, rel := spy.counts()
		if out := spy.OutstandingViews(); out != recv-rel || rel != rel0 || out < 4 {
			t.Fatalf("%d views outstanding of %d received, %d released (%d before the first DATA): want the 3 DATA views held and FIN's behind them", out, recv, rel, rel0)
		}

		got := make([]byte, len(sent))
		if n, err := b.Read(got[:500]); n != 500 || err != nil {
			t.Fatalf("Read: %d, %v", n, err)
		}
		if _, rel2 := spy.counts(); rel2 != rel {
			t.Errorf("%d views released by a Read that read the first one in part", rel2-rel)
		}
		if _, err := io.ReadFull(b, got[500:]); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, sent) {
			t.Fatal("read other bytes than were written")
		}
		if n, err := b.Read(got); n != 0 || err != io.EOF {
			t.Fatalf("Read after the data: %d, %v; want EOF", n, err)
		}
		recv, rel = spy.counts()
		if out := spy.OutstandingViews(); out != 0 || rel != recv {
			t.Errorf("after reading everything: %d views outstanding, %d of %d released", out, rel, recv)
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.hlen != 0 || b.hv.n != 0 || b.hv.pinV != 0 || b.hv.pinB != 0 {
			t.Errorf("held state left: %d bytes, %d views, %d pinned (%d bytes)", b.hlen, b.hv.n, b.hv.pinV, b.hv.pinB)
		}
	})
}

// TestHeldViewsBound: with room for few views, the connection holds no
// more than its bound after any burst, spills the rest into the ring,
// and the stream keeps its order across held views and ring.
func TestHeldViewsBound(t *testing.T) {
	viewBackends(t, func(t *testing.T, be backend) {
		room := [2]int{2*rxBurst + 8, 1 << 30} // maxV = 4
		a, b, _ := spyPair(t, be, &room)
		var sent []byte
		spilled := false
		for i := range 12 {
			p := seqBytes(100+i, i)
			if _, err := a.Write(p); err != nil {
				t.Fatal(err)
			}
			sent = append(sent, p...)
			pumpUntil(t, b, len(sent), func() string {
				spilled = spilled || b.rlen > b.hlen
				if b.hv.pinV > b.hv.maxV || b.hv.n > b.hv.maxV {
					return fmt.Sprintf("%d views pinned, %d held after a burst: bound %d", b.hv.pinV, b.hv.n, b.hv.maxV)
				}
				return ""
			})
		}
		if !spilled {
			t.Error("nothing went to the ring")
		}
		got := make([]byte, len(sent))
		if _, err := io.ReadFull(b, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, sent) {
			t.Fatal("the stream lost its order across held views and the ring")
		}
	})
}

// TestHeldViewsBothWrite: both sides Write a whole window, more than the
// endpoint's receive memory, and neither Reads until both Writes have
// returned. The keep-alive pumps, holding what it may: the held views
// must not fill the receive memory, or the peer's frames, DATA within its
// credit as much as CREDIT or PING, could never land.
func TestHeldViewsBothWrite(t *testing.T) {
	viewBackends(t, func(t *testing.T, be backend) {
		// ntb's ring is 1 MiB, roce's receive buffer 8 MiB.
		w := 2 << 20
		if be.name == "roce" {
			w = 16 << 20
		}
		cfg := &Config{Window: w, KeepAlive: 5e6}
		a, b := connPair(t, be, cfg)
		pa, pb := seqBytes(w, 1), seqBytes(w, 2)
		errs := make(chan error, 2)
		go func() { _, err := a.Write(pa); errs <- err }()
		go func() { _, err := b.Write(pb); errs <- err }()
		for range 2 {
			if err := testenv.Recv(t, errs, "a Write of a window with nobody reading"); err != nil {
				t.Fatal(err)
			}
		}
		for _, r := range []struct {
			c    *Conn
			want []byte
		}{{a, pb}, {b, pa}} {
			got := make([]byte, w)
			if _, err := io.ReadFull(r.c, got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, r.want) {
				t.Fatal("read other bytes than were written")
			}
		}
	})
}

// TestHeldViewsLost: when the endpoint resets the memory of held views
// (its ViewEpoch changes: ntb's link went down and a new session began),
// a Read that copied from them returns nothing of it, and an error
// matching fabric.ErrPeerGone: what it copied may be zeros or another
// connection's bytes.
func TestHeldViewsLost(t *testing.T) {
	viewBackends(t, func(t *testing.T, be backend) {
		a, b, spy := spyPair(t, be, nil)
		p := writeHeld(t, a, b)
		spy.bump.Add(1)
		got := make([]byte, len(p))
		n, err := b.Read(got)
		if n != 0 || !errors.Is(err, fabric.ErrPeerGone) {
			t.Fatalf("Read from views whose memory was reset: %d, %v; want 0 and ErrPeerGone", n, err)
		}
		if n, err := b.Read(got); n != 0 || !errors.Is(err, fabric.ErrPeerGone) {
			t.Fatalf("the next Read: %d, %v; want 0 and ErrPeerGone", n, err)
		}
	})
}

// TestHeldViewsTransportClosed: an ntb transport closed under a
// connection (over one of its queues, as NewConn allows) takes its
// endpoints along and replaces the window's memory, where views are
// held, with zeros: a Read of the held bytes must fail, not return the
// zeros as the stream's bytes.
func TestHeldViewsTransportClosed(t *testing.T) {
	ta, tb := ntbTransportPair(t)
	ea, err := ta.Endpoint(0)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := tb.Endpoint(0)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &Config{KeepAlive: -1}
	a, err := NewConn(ea, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err := NewConn(eb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	p := writeHeld(t, a, b)
	if err := tb.Close(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(p))
	n, err := b.Read(got)
	if n > 0 && !bytes.Equal(got[:n], p[:n]) {
		t.Fatalf("Read after the transport closed returned %d bytes that were not written (%v)", n, err)
	}
	if n != 0 || !errors.Is(err, fabric.ErrPeerGone) {
		t.Fatalf("Read of held views after the transport closed: %d, %v; want 0 and ErrPeerGone", n, err)
	}
}

// ntbTransportPair brings up the two transports of an emulated ntb
// bridge, whose endpoints (Transport.Endpoint) carry a Conn each.
func ntbTransportPair(t *testing.T) (a, b *ntb.Transport) {
	path := filepath.Join(t.TempDir(), "bridge")
	return fabrictest.OpenPair(t, 0, func(ctx context.Context, _ fabrictest.Side) (*ntb.Transport, error) {
		dev, err := ntb.OpenShm(path, ntb.ShmConfig{})
		if err != nil {
			return nil, err
		}
		tr, err := ntb.Dial(ctx, dev, ntb.Config{})
		if err != nil {
			dev.Close()
		}
		return tr, err
	})
}

// TestViewsResetInBurst: the endpoint resets the memory of a burst's
// views (its ViewEpoch moves first, as ntb's does when its transport
// closes or a new session begins) after the connection received them
// and before it copied their DATA: the Read that pumps, into whose
// slice the DATA goes straight, must fail with ErrPeerGone, not return
// the zeros as the stream's bytes.
func TestViewsResetInBurst(t *testing.T) {
	viewBackends(t, func(t *testing.T, be backend) {
		a, b, spy := spyPair(t, be, nil)
		p := seqBytes(3000, 1)
		spy.got = func(views []fabric.View) {
			for _, v := range views {
				if len(v.Data) > len(p) {
					spy.bump.Add(1)
					clear(v.Data[hdrLen:]) // the header was read: the payload is not
				}
			}
		}
		if _, err := a.Write(p); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(p))
		n, err := b.Read(got)
		if n > 0 && !bytes.Equal(got[:n], p[:n]) {
			t.Fatalf("Read returned %d bytes that were not written (%v)", n, err)
		}
		if n != 0 || !errors.Is(err, fabric.ErrPeerGone) {
			t.Fatalf("Read of a burst whose memory was reset: %d, %v; want 0 and ErrPeerGone", n, err)
		}
	})
}

// TestHeldViewsEpochBeforeHold: the endpoint's ViewEpoch moved while
// nothing was held (ntb: a raw queue's link went down and up again
// before the connection was made, or between bursts). The views received
// after it are intact: a Read of them, held, must succeed.
func TestHeldViewsEpochBeforeHold(t *testing.T) {
	viewBackends(t, func(t *testing.T, be backend) {
		a, b, spy := spyPair(t, be, nil)
		spy.bump.Add(1)
		p := writeHeld(t, a, b)
		got := make([]byte, len(p))
		if _, err := io.ReadFull(b, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, p) {
			t.Fatal("read other bytes than were written")
		}
	})
}

// writeHeld writes 3000 bytes from a, pumps b until it has them, and
// checks that b holds them all in views; it returns them.
func writeHeld(t *testing.T, a, b *Conn) []byte {
	t.Helper()
	p := seqBytes(3000, 1)
	if _, err := a.Write(p); err != nil {
		t.Fatal(err)
	}
	pumpUntil(t, b, len(p), nil)
	b.mu.Lock()
	held := b.hlen
	b.mu.Unlock()
	if held != len(p) {
		t.Fatalf("%d of %d bytes held", held, len(p))
	}
	return p
}
