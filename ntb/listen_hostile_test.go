package ntb

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

// Connect requests and their answers are input from the peer: a listener
// counts and drops what is not a connect request and keeps listening on
// that queue and the others; a dialer takes only an answer to its own
// request. These tests put a peer that writes connect messages by hand on
// the far side (issue 29).

// rawBridge opens the far side of the bridge at path as openBridge does
// for a listener or a dialer, with tc, and waits until it is up.
func rawBridge(t *testing.T, ctx context.Context, path string, tc Config) *Transport {
	t.Helper()
	tr, err := openBridge(ctx, path, ShmConfig{}, tc, true)
	if err != nil {
		t.Fatalf("opening the far side of %s: %v", path, err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// sendRaw sends b as one message on ep.
func sendRaw(t *testing.T, ctx context.Context, ep *Endpoint, b []byte) {
	t.Helper()
	r, err := ep.Register(append([]byte(nil), b...), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := ep.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r)}}}); err != nil {
		t.Fatalf("sending %q: %v", b, err)
	}
}

// recvRaw waits for one message on ep.
func recvRaw(t *testing.T, ctx context.Context, ep *Endpoint, what string) []byte {
	t.Helper()
	r, err := ep.Register(make([]byte, 64), fabric.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r)}}}
	if _, err := ep.RecvWait(ctx, msgs); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
	return append([]byte(nil), r.Bytes()[:msgs[0].Len]...)
}

// waitFailed waits until the listener has counted n failed handshakes.
func waitFailed(t *testing.T, l fabric.Listener, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.Stats().Failed < n {
		if time.Now().After(deadline) {
			t.Fatalf("the listener counted %d malformed connect requests in 10 s, want %d", l.Stats().Failed, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestListenerHostileDialer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := driver{}.Listen(ctx, path, fabric.Options{Backlog: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	raw := rawBridge(t, ctx, path, Config{})
	good := connMsg(connReq, 7)
	wrongMagic := good
	wrongMagic[3] = 'X'
	unknownKind := good
	unknownKind[7] = 'X'
	answer := connMsg(connAcc, 7)
	bad := [][]byte{wrongMagic[:], unknownKind[:], answer[:], good[:15], append(good[:], 0)}
	// Queue 0 gets every malformed request, one at a time: each is
	// counted, none is answered.
	for i, b := range bad {
		sendRaw(t, ctx, raw.endpoints()[0], b)
		waitFailed(t, l, uint64(i+1))
	}
	if s := l.Stats(); s.Accepted != 0 || s.Pending != 0 || s.Refused != 0 {
		t.Fatalf("after malformed requests only: %+v", s)
	}
	// Another queue is served meanwhile.
	accept := func(q int, nonce uint64, want byte) {
		t.Helper()
		req := connMsg(connReq, nonce)
		sendRaw(t, ctx, raw.endpoints()[q], req[:])
		a := recvRaw(t, ctx, raw.endpoints()[q], "the answer to a connect request")
		kind, got, err := parseConnMsg(a)
		if err != nil || kind != want || got != nonce {
			t.Fatalf("queue %d: answer %q (%v), want %q for nonce %d", q, a, err, want, nonce)
		}
	}
	accept(1, 101, connAcc)
	ep1, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ep1.Close()
	// Queue 0 still listens after the garbage.
	accept(0, 100, connAcc)
	// Its endpoint waits for Accept: the backlog of 1 is full, and a
	// request on queue 3 is refused, the refusal naming its nonce.
	accept(3, 103, connRef)
	ep0, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ep0.Close()
	if s := l.Stats(); s.Refused != 1 || s.Failed != uint64(len(bad)) || s.Accepted != 2 {
		t.Fatalf("stats %+v, want 1 refused, %d failed, 2 accepted", s, len(bad))
	}
}

// dialAsync dials a listener at path from this process on queue q (-1:
// any free one) and returns where the result arrives.
func dialAsync(ctx context.Context, path string, q int) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- (<-dialAsyncStats(ctx, path, q)).err }()
	return ch
}

// dialResult is how a dial ended, with the malformed messages its
// endpoint counted.
type dialResult struct {
	err       error
	malformed uint64
}

// dialAsyncStats is dialAsync, with the dialled endpoint's count of
// malformed messages.
func dialAsyncStats(ctx context.Context, path string, q int) <-chan dialResult {
	ch := make(chan dialResult, 1)
	go func() {
		ep, err := dialListener(ctx, path, path, ShmConfig{}, Config{}, q)
		var n uint64
		if err == nil {
			n = ep.Stats().Drops[fabric.DropMalformed]
			ep.Close()
		}
		ch <- dialResult{err, n}
	}()
	return ch
}

func TestDialerHostileListener(t *testing.T) {
	for _, c := range []struct {
		name    string
		answers func(nonce uint64) [][]byte
		want    error  // nil: the dial succeeds
		skipped uint64 // messages the dialer counted as malformed and skipped
	}{
		{"Accept", func(n uint64) [][]byte { return msgs(connMsg(connAcc, n)) }, nil, 0},
		{"StaleThenAccept", func(n uint64) [][]byte {
			return msgs(connMsg(connRef, n-1), connMsg(connAcc, n+1), connMsg(connAcc, n))
		}, nil, 0},
		{"Refuse", func(n uint64) [][]byte { return msgs(connMsg(connRef, n)) }, fabric.ErrRefused, 0},
		{"RequestForAnswer", func(n uint64) [][]byte { return msgs(connMsg(connReq, n)) }, fabric.ErrMalformed, 0},
		// What is not a connect message (an earlier connection's data
		// left on the queue) is counted and skipped, as the listener
		// does: the answer after it is taken.
		{"WrongMagicThenAccept", func(n uint64) [][]byte {
			m := connMsg(connAcc, n)
			m[0] = 'X'
			return msgs(m, connMsg(connAcc, n))
		}, nil, 1},
		{"ShortThenAccept", func(n uint64) [][]byte {
			m := connMsg(connAcc, n)
			return [][]byte{m[:15], []byte("8 bytes!"), m[:]}
		}, nil, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bridge")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			done := dialAsyncStats(ctx, path, 2)
			raw := rawBridge(t, ctx, path, Config{})
			req := recvRaw(t, ctx, raw.endpoints()[2], "the dialer's connect request on queue 2")
			kind, nonce, err := parseConnMsg(req)
			if err != nil || kind != connReq {
				t.Fatalf("connect request %q: %v", req, err)
			}
			for _, a := range c.answers(nonce) {
				sendRaw(t, ctx, raw.endpoints()[2], a)
			}
			select {
			case r := <-done:
				err := r.err
				if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
					t.Fatalf("dial = %v, want %v", err, c.want)
				}
				if err == nil && r.malformed != c.skipped {
					t.Fatalf("the dialled endpoint counted %d malformed messages, want %d", r.malformed, c.skipped)
				}
				var re *fabric.RefusedError
				if c.want == fabric.ErrRefused && (!errors.As(err, &re) || *re != (fabric.RefusedError{Addr: "queue 2", Reason: "backlog full"})) {
					t.Fatalf("dial = %v, want a *fabric.RefusedError from queue 2, backlog full", err)
				}
			case <-ctx.Done():
				t.Fatal("the dial did not end within 20 s")
			}
		})
	}
}

func msgs(ms ...[connMsgLen]byte) [][]byte {
	out := make([][]byte, len(ms))
	for i := range ms {
		out[i] = ms[i][:]
	}
	return out
}

// TestDialQueueBeyondListener: a dialer that asks for a queue the
// listener's side of the bridge does not have is refused, at once.
func TestDialQueueBeyondListener(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := dialAsync(ctx, path, 5)
	raw, err := openBridge(ctx, path, ShmConfig{}, Config{Queues: 2}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	select {
	case err := <-done:
		if !errors.Is(err, fabric.ErrRefused) {
			t.Fatalf("dialing queue 5 of a 2-queue bridge: %v, want ErrRefused", err)
		}
	case <-ctx.Done():
		t.Fatal("the dial did not end within 20 s")
	}
}

// TestDialFreeQueueBeyondListener: dialers that take any free queue take
// only the queues the session has: on a 2-queue listener the third is
// refused while the first two wait for their answers.
func TestDialFreeQueueBeyondListener(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waiting, stop := context.WithCancel(ctx)
	first := dialAsync(waiting, path, -1)
	raw := rawBridge(t, ctx, path, Config{Queues: 2})
	recvRaw(t, ctx, raw.endpoints()[0], "the first dialer's request on queue 0")
	second := dialAsync(waiting, path, -1)
	recvRaw(t, ctx, raw.endpoints()[1], "the second dialer's request on queue 1")
	select {
	case err := <-dialAsync(ctx, path, -1):
		if !errors.Is(err, fabric.ErrRefused) {
			t.Fatalf("a third dialer on a 2-queue bridge: %v, want ErrRefused", err)
		}
	case <-ctx.Done():
		t.Fatal("the third dial did not end within 20 s")
	}
	stop()
	for _, ch := range []<-chan error{first, second} {
		if err := <-ch; !errors.Is(err, context.Canceled) {
			t.Errorf("an unanswered dial, cancelled: %v", err)
		}
	}
}
