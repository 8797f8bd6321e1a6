package fabrictest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

// ListenSetup tells the listener cases how to reach a backend.
type ListenSetup struct {
	// Backend is the registered backend name.
	Backend string
	// Addr is the address given to fabric.Listen.
	Addr string
	// Options configure the listener and the endpoints dialled to it
	// (nil: defaults). The cases set Backlog themselves where they test
	// it.
	Options *fabric.Options
	// Dial returns the address client i dials (nil: the listener's
	// Addr).
	Dial func(l fabric.Listener, i int) string
	// Clients is the number of concurrent clients of the Many case (0:
	// 64). A backend with a fixed number of connections per listener
	// (NTB queues) sets its own.
	Clients int
	// Messages is the number of numbered messages each client streams
	// in the Many case (0: 10000).
	Messages int
	// HalfOpen starts a handshake with the listener at addr the way a
	// peer of this backend would, and abandons it halfway; the returned
	// function makes that peer vanish for good. Nil skips the HalfOpen
	// case.
	HalfOpen func(t testing.TB, addr string) (vanish func())
}

func (s *ListenSetup) dial(l fabric.Listener, i int) string {
	if s.Dial != nil {
		return s.Dial(l, i)
	}
	return l.Addr()
}

func (s *ListenSetup) options(backlog int) *fabric.Options {
	var o fabric.Options
	if s.Options != nil {
		o = *s.Options
	}
	if backlog > 0 {
		o.Backlog = backlog
	}
	return &o
}

// TestListener runs the listener cases against a backend:
//
//   - Many: Clients peers connect at once to one listener and each
//     streams Messages numbered messages to its accepted endpoint, which
//     checks every one;
//   - CloseWakesAccept: Close wakes a blocked Accept with os.ErrClosed,
//     is idempotent, and Accept and Open fail afterwards;
//   - HalfOpen: peers that start a handshake and vanish hold up nobody;
//   - Backlog: with nobody accepting, connections past the backlog are
//     refused with an error matching fabric.ErrRefused, and counted;
//   - Addrs: endpoints report their addresses;
//   - Failed: every failed Listen, Open and Accept returns a nil
//     interface, and an unknown address parameter fails at once with an
//     error that matches fabric.ErrInvalid and names the key.
func TestListener(t *testing.T, s ListenSetup) {
	t.Run("Many", func(t *testing.T) { listenMany(t, &s) })
	t.Run("CloseWakesAccept", func(t *testing.T) { listenClose(t, &s) })
	t.Run("HalfOpen", func(t *testing.T) { listenHalfOpen(t, &s) })
	t.Run("Backlog", func(t *testing.T) { listenBacklog(t, &s) })
	t.Run("Addrs", func(t *testing.T) { listenAddrs(t, &s) })
	t.Run("Failed", func(t *testing.T) { listenFailed(t, &s) })
}

// Listen starts a listener for a test and closes it when the test ends.
func Listen(t testing.TB, backend, addr string, opts *fabric.Options) fabric.Listener {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	l, err := fabric.Listen(ctx, backend, addr, opts)
	if err != nil {
		t.Fatalf("Listen(%s, %q): %v", backend, addr, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// ListenPair returns a connected pair made the way applications make
// one: b is dialled to a listener at addr and a is the endpoint the
// listener accepted. The listener is closed before ListenPair returns.
func ListenPair(t testing.TB, backend, addr string, opts *fabric.Options) (a, b fabric.Endpoint) {
	t.Helper()
	return ListenPairDial(t, backend, addr, nil, opts)
}

// ListenPairDial is ListenPair where b dials dial(l) instead of
// l.Addr(): for a dialer that sits elsewhere (another network namespace,
// its own interface), as ListenSetup.Dial. A nil dial dials l.Addr().
func ListenPairDial(t testing.TB, backend, addr string, dial func(l fabric.Listener) string, opts *fabric.Options) (a, b fabric.Endpoint) {
	t.Helper()
	l := Listen(t, backend, addr, opts)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	to := l.Addr()
	if dial != nil {
		to = dial(l)
	}
	dialed := make(chan error, 1)
	go func() {
		var err error
		b, err = fabric.Open(ctx, backend, to, opts)
		dialed <- err
	}()
	a, aerr := l.Accept(ctx)
	if berr := <-dialed; aerr != nil || berr != nil {
		for _, ep := range []fabric.Endpoint{a, b} {
			if ep != nil {
				ep.Close()
			}
		}
		t.Fatalf("ListenPair: accept: %v, dial: %v", aerr, berr)
	}
	return a, b
}

// numberedSize is the size of message i of a listener stream.
func numberedSize(i int) int { return 16 + (i*53)%240 }

// checkNumbered checks message seq of a numbered stream (see
// sendNumbered): its size, number, content and immediate data.
func checkNumbered(got []byte, m *fabric.Message, seq, size int) error {
	if len(got) != size {
		return fmt.Errorf("message %d: %d bytes, want %d", seq, len(got), size)
	}
	if s := binary.LittleEndian.Uint64(got); s != uint64(seq) {
		return fmt.Errorf("message %d arrived as number %d: out of order, lost or duplicated", seq, s)
	}
	w := pattern(size, uint64(seq))
	binary.LittleEndian.PutUint64(w, uint64(seq))
	if !bytes.Equal(got, w) {
		return fmt.Errorf("message %d corrupt at byte %d", seq, firstDiff(got, w))
	}
	if m.Flags&fabric.FlagImm == 0 || m.Imm != uint32(seq) {
		return fmt.Errorf("message %d: immediate %#x (flags %#x), want %#x", seq, m.Imm, m.Flags, seq)
	}
	return nil
}

// recvNumbered receives and checks count numbered messages.
func recvNumbered(r *role, count int, size func(int) int) error {
	const burst = 16
	msgs := make([]fabric.Message, burst)
	sges := make([]fabric.SGE, burst)
	regs := make([]*fabric.Region, burst)
	for i := range regs {
		regs[i] = r.alloc(512, fabric.AccessLocalWrite)
	}
	for seq := 0; seq < count; {
		for j := range msgs {
			sges[j] = fabric.SGEOf(regs[j])
			msgs[j] = fabric.Message{SGEs: sges[j : j+1]}
		}
		n, err := r.ep.RecvWait(r.ctx, msgs)
		if err != nil {
			return fmt.Errorf("RecvWait after %d messages: %w", seq, err)
		}
		for j := 0; j < n; j++ {
			if err := checkNumbered(regs[j].Bytes()[:msgs[j].Len], &msgs[j], seq, size(seq)); err != nil {
				return err
			}
			seq++
		}
	}
	return nil
}

func listenMany(t *testing.T, s *ListenSetup) {
	clients, count := s.Clients, s.Messages
	if clients == 0 {
		clients = 64
	}
	if count == 0 {
		count = 10000
	}
	l := Listen(t, s.Backend, s.Addr, s.options(max(clients, fabric.DefaultBacklog)))
	// The subtests are parallel: they run after this function returns.
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)

	// The server side: accept every client and check its stream in a
	// subtest of its own. A client's first message names it. Both sides
	// run as parallel subtests of one group, so that listenMany (and its
	// deferred cancel) waits for them: parallel subtests only start when
	// their parent's function has returned.
	t.Run("run", func(t *testing.T) { listenManyRun(t, l, ctx, s, clients, count) })
}

func listenManyRun(t *testing.T, l fabric.Listener, ctx context.Context, s *ListenSetup, clients, count int) {
	t.Run("server", func(t *testing.T) {
		t.Parallel()
		var wg sync.WaitGroup
		var mu sync.Mutex
		seen := make([]bool, clients)
		for k := range clients {
			ep, err := l.Accept(ctx)
			if err != nil {
				t.Fatalf("Accept %d: %v", k, err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer ep.Close()
				t.Run(fmt.Sprintf("s%d", k), func(t *testing.T) {
					r := newRole(t, ep)
					got, _ := r.recv()
					id := -1
					if len(got) == 8 {
						id = int(binary.LittleEndian.Uint64(got))
					}
					mu.Lock()
					dup := id < 0 || id >= clients || seen[id]
					if !dup {
						seen[id] = true
					}
					mu.Unlock()
					if dup {
						t.Fatalf("peer %s: bad or repeated client id %q", ep.RemoteAddr(), got)
					}
					if err := recvNumbered(r, count, numberedSize); err != nil {
						t.Fatalf("client %d: %v", id, err)
					}
					// Close delivers what was sent before it.
					r.send([]byte("many-ok"), 0, 0)
				})
			}()
		}
		wg.Wait()
		if st := l.Stats(); st.Accepted < uint64(clients) {
			t.Errorf("Stats().Accepted = %d after %d accepts", st.Accepted, clients)
		}
	})
	t.Run("clients", func(t *testing.T) {
		t.Parallel()
		var cwg sync.WaitGroup
		errs := make(chan error, clients)
		for i := range clients {
			cwg.Add(1)
			go func() {
				defer cwg.Done()
				ep, err := fabric.Open(ctx, s.Backend, s.dial(l, i), s.Options)
				if err != nil {
					errs <- fmt.Errorf("client %d: Open: %w", i, err)
					return
				}
				defer ep.Close()
				// newRole and sendNumbered report through a *testing.T:
				// give each client a subtest so a failure names it.
				ok := t.Run(fmt.Sprintf("c%d", i), func(t *testing.T) {
					r := newRole(t, ep)
					var id [8]byte
					binary.LittleEndian.PutUint64(id[:], uint64(i))
					r.send(id[:], 0, 0)
					sendNumbered(t, r, count, 16, 256, numberedSize)
					r.expect("many-ok")
				})
				if !ok {
					errs <- fmt.Errorf("client %d failed", i)
				}
			}()
		}
		cwg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

func listenClose(t *testing.T, s *ListenSetup) {
	l := Listen(t, s.Backend, s.Addr, s.options(0))
	addr := s.dial(l, 0)
	res := make(chan error, 1)
	go func() {
		ep, err := l.Accept(context.Background())
		if ep != nil {
			ep.Close()
		}
		res <- err
	}()
	time.Sleep(20 * time.Millisecond) // let Accept block
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-res:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("blocked Accept returned %v after Close, want os.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake a blocked Accept")
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := l.Accept(context.Background()); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want os.ErrClosed", err)
	}
	// Nobody listens any more: a dial fails rather than hangs.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if ep, err := fabric.Open(ctx, s.Backend, addr, s.Options); err == nil {
		ep.Close()
		t.Fatal("Open succeeded against a closed listener")
	}
}

// withParam adds the parameter key=1 to addr.
func withParam(addr, key string) string {
	if strings.Contains(addr, "?") {
		return addr + "&" + key + "=1"
	}
	return addr + "?" + key + "=1"
}

func listenFailed(t *testing.T, s *ListenSetup) {
	const key = "weftnosuchkey"
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	// want checks a failure: an error, a nil interface (v holds the
	// interface the call returned, so a typed nil inside it is not nil)
	// and, for an unknown key, fabric.ErrInvalid naming the key.
	want := func(what string, v any, err error, invalid bool) {
		t.Helper()
		if err == nil {
			t.Errorf("%s succeeded", what)
			return
		}
		if v != nil {
			t.Errorf("%s failed (%v) and returned a non-nil %T", what, err, v)
		}
		if invalid && (!errors.Is(err, fabric.ErrInvalid) || !strings.Contains(err.Error(), key)) {
			t.Errorf("%s: %v; want an error matching fabric.ErrInvalid that names %q", what, err, key)
		}
	}
	bad, err := fabric.Listen(ctx, s.Backend, withParam(s.Addr, key), s.options(0))
	if err == nil {
		defer bad.Close()
	}
	want("Listen with an unknown parameter", bad, err, true)

	l := Listen(t, s.Backend, s.Addr, s.options(0))
	addr := s.dial(l, 0)
	ep, err := fabric.Open(ctx, s.Backend, withParam(addr, key), s.Options)
	if err == nil {
		defer ep.Close()
	}
	want("Open with an unknown parameter", ep, err, true)

	// A dial whose context is done fails, or connects before it looks:
	// either way it must not return a typed nil.
	done, stop := context.WithCancel(ctx)
	stop()
	if ep, err := fabric.Open(done, s.Backend, addr, s.Options); err == nil {
		ep.Close()
	} else {
		want("Open with a cancelled context", ep, err, false)
	}
	// Accept with a cancelled context: nothing, or the connection just
	// made above, which the listener hands out or Close closes.
	if ep, err := l.Accept(done); err == nil {
		ep.Close()
	} else {
		want("Accept with a cancelled context", ep, err, false)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Accept with a cancelled context: %v; want context.Canceled", err)
		}
	}
	l.Close()
	ep, err = l.Accept(ctx)
	want("Accept after Close", ep, err, false)
}

func listenHalfOpen(t *testing.T, s *ListenSetup) {
	if s.HalfOpen == nil {
		t.Skipf("%s: no half-open handshake for this backend", s.Backend)
	}
	o := s.options(0)
	o.HandshakeTimeout = 300 * time.Millisecond
	l := Listen(t, s.Backend, s.Addr, o)
	const stalled, good = 4, 4
	var vanish []func()
	for range stalled {
		vanish = append(vanish, s.HalfOpen(t, l.Addr()))
	}
	defer func() {
		for _, v := range vanish {
			v()
		}
	}()
	// Good peers connect while the stalled ones hold their handshakes:
	// they must be accepted well before the stalled ones time out.
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range good {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(fmt.Sprintf("dial%d", i), func(t *testing.T) {
				ep, err := fabric.Open(ctx, s.Backend, s.dial(l, i), s.Options)
				if err != nil {
					t.Fatalf("Open beside stalled handshakes: %v", err)
				}
				defer ep.Close()
				r := newRole(t, ep)
				r.send([]byte("half-open-ok"), 0, 0)
				r.expect("half-open-ok")
			})
		}()
	}
	for range good {
		ep, err := l.Accept(ctx)
		if err != nil {
			t.Fatalf("Accept with %d stalled handshakes: %v", stalled, err)
		}
		defer ep.Close()
		r := newRole(t, ep)
		r.expect("half-open-ok")
		r.send([]byte("half-open-ok"), 0, 0)
	}
	wg.Wait()
	t.Logf("%d peers accepted in %v beside %d stalled handshakes", good, time.Since(start), stalled)
	for _, v := range vanish {
		v()
	}
	vanish = nil
	// The stalled handshakes time out and are counted as failed.
	deadline := time.Now().Add(10 * time.Second)
	for l.Stats().Failed < stalled && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st := l.Stats(); st.Failed < stalled || st.Pending != 0 {
		t.Fatalf("after %d abandoned handshakes: %+v (want Failed >= %d, Pending 0)", stalled, st, stalled)
	}
}

func listenBacklog(t *testing.T, s *ListenSetup) {
	const backlog = 2
	l := Listen(t, s.Backend, s.Addr, s.options(backlog))
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	var eps []fabric.Endpoint
	defer func() {
		for _, ep := range eps {
			ep.Close()
		}
	}()
	// Nobody accepts: the first backlog connections complete and wait in
	// the queue; the next ones are refused.
	for i := range backlog {
		ep, err := fabric.Open(ctx, s.Backend, s.dial(l, i), s.Options)
		if err != nil {
			t.Fatalf("dial %d of a backlog of %d: %v", i, backlog, err)
		}
		eps = append(eps, ep)
	}
	ep, err := fabric.Open(ctx, s.Backend, s.dial(l, backlog), s.Options)
	if err == nil {
		eps = append(eps, ep)
		t.Fatalf("dial past a full backlog of %d succeeded", backlog)
	}
	if !errors.Is(err, fabric.ErrRefused) {
		t.Fatalf("dial past a full backlog: %v, want fabric.ErrRefused", err)
	}
	if st := l.Stats(); st.Refused < 1 || st.Pending != backlog {
		t.Fatalf("Stats() = %+v after one refusal with %d queued", st, backlog)
	}
	// The queued ones are intact and work once accepted. Accept need not
	// return them in the order they were dialled: a dial returns when its
	// handshake is done, and the listener may queue the endpoints of two
	// finished handshakes either way round (seen under load on roce). So
	// each dialler sends its number, and each accepted endpoint must get
	// exactly one of them.
	accepted := make([]*role, backlog)
	for i := range backlog {
		a, err := l.Accept(ctx)
		if err != nil {
			t.Fatalf("Accept %d: %v", i, err)
		}
		defer a.Close()
		accepted[i] = newRole(t, a)
	}
	for i := range backlog {
		newRole(t, eps[i]).send([]byte(fmt.Sprintf("queued %d", i)), 0, 0)
	}
	seen := map[string]bool{}
	for i, ra := range accepted {
		got, _ := ra.recv()
		if !strings.HasPrefix(string(got), "queued ") || seen[string(got)] {
			t.Fatalf("accepted endpoint %d got %q (already seen: %v)", i, got, seen)
		}
		seen[string(got)] = true
	}
}

func listenAddrs(t *testing.T, s *ListenSetup) {
	a, b := ListenPairDial(t, s.Backend, s.Addr, func(l fabric.Listener) string { return s.dial(l, 0) }, s.Options)
	defer a.Close()
	defer b.Close()
	for _, ep := range []fabric.Endpoint{a, b} {
		if ep.LocalAddr() == "" || ep.RemoteAddr() == "" {
			t.Errorf("endpoint addresses %q, %q: want both", ep.LocalAddr(), ep.RemoteAddr())
		}
	}
	ra, rb := newRole(t, a), newRole(t, b)
	rb.send([]byte("addrs"), 0, 0)
	ra.expect("addrs")
	t.Logf("accepted: local %q remote %q; dialled: local %q remote %q",
		a.LocalAddr(), a.RemoteAddr(), b.LocalAddr(), b.RemoteAddr())
}
