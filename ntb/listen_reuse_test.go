package ntb

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

// connectPair dials the listener l and accepts the endpoint, then checks
// that a message goes each way.
func connectPair(t *testing.T, ctx context.Context, l fabric.Listener, round int) (d, a *Endpoint) {
	t.Helper()
	de, err := fabric.Open(ctx, "ntb", l.Addr(), nil)
	if err != nil {
		t.Fatalf("dial %d: %v", round, err)
	}
	ae, err := l.Accept(ctx)
	if err != nil {
		de.Close()
		t.Fatalf("accept %d: %v", round, err)
	}
	d, a = de.(*Endpoint), ae.(*Endpoint)
	if d.q != a.q {
		t.Fatalf("round %d: dialled queue %d, accepted queue %d", round, d.q, a.q)
	}
	ping := fmt.Sprintf("ping %d", round)
	sendRaw(t, ctx, d, []byte(ping))
	if got := recvRaw(t, ctx, a, "the dialer's message"); string(got) != ping {
		t.Fatalf("round %d: the accepted endpoint got %q, want %q", round, got, ping)
	}
	pong := fmt.Sprintf("pong %d", round)
	sendRaw(t, ctx, a, []byte(pong))
	if got := recvRaw(t, ctx, d, "the listener's message"); string(got) != pong {
		t.Fatalf("round %d: the dialer got %q, want %q", round, got, pong)
	}
	return d, a
}

// TestListenerQueueReuseNewSession: with nothing else open, closing a
// dialled endpoint closes the dialers' side of the bridge, and the next
// dial opens it again in a new session: the listener must listen on the
// queue again (it used to serve each queue once: the second dial waited
// for an answer on queue 0 until its context ended).
func TestListenerQueueReuseNewSession(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := driver{}.Listen(ctx, path, fabric.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range 20 {
		d, a := connectPair(t, ctx, l, i)
		d.Close()
		a.Close()
	}
	if s := l.Stats(); s.Accepted != 20 || s.Failed != 0 {
		t.Fatalf("listener stats %+v, want 20 accepted, none failed", s)
	}
}

// TestListenerConnEndsWithSession: an accepted endpoint left open when
// the dialers' side closes the bridge lives no longer than its session:
// the next dialer gets its queue, served by a fresh endpoint, and the old
// endpoint reports the peer's close instead of reaching the new session's
// rings.
func TestListenerConnEndsWithSession(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := driver{}.Listen(ctx, path, fabric.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d, old := connectPair(t, ctx, l, 0)
	defer old.Close()
	d.Close() // the dialers' side of the bridge closes: the session ends
	d2, a2 := connectPair(t, ctx, l, 1)
	defer d2.Close()
	defer a2.Close()
	if a2 == old || a2.q != old.q {
		t.Fatalf("the new connection is on queue %d (same endpoint: %v), want a fresh endpoint on queue %d", a2.q, a2 == old, old.q)
	}
	r, err := old.Register([]byte("stale"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := old.Send([]fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r)}}}); !errors.Is(err, fabric.ErrPeerClosed) && !errors.Is(err, fabric.ErrPeerGone) {
		t.Fatalf("sending on the endpoint of the ended session: %v, want ErrPeerClosed or ErrPeerGone", err)
	}
	if n, err := old.Recv([]fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r)}}}); n != 0 || err == nil {
		t.Fatalf("receiving on the endpoint of the ended session: %d, %v, want an error", n, err)
	}
}
