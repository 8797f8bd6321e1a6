package acceptq

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
)

// closer is an endpoint that only counts Close calls: the queue calls
// nothing else.
type closer struct {
	fabric.Endpoint
	closed atomic.Int32
}

func (c *closer) Close() error { c.closed.Add(1); return nil }

func TestBacklog(t *testing.T) {
	q := New("test", "x", 2)
	if !q.Reserve() || !q.Reserve() {
		t.Fatal("Reserve refused within the backlog")
	}
	if q.Reserve() {
		t.Fatal("Reserve past the backlog succeeded")
	}
	if st := q.Stats(); st.Refused != 1 || st.Pending != 2 {
		t.Fatalf("Stats = %+v, want 1 refused, 2 pending", st)
	}
	a := &closer{}
	if err := q.Offer(a); err != nil {
		t.Fatal(err)
	}
	q.Fail() // the second handshake fails: its slot comes back
	if !q.Reserve() {
		t.Fatal("a failed handshake did not give its slot back")
	}
	ep, err := q.Accept(testenv.Context(t))
	if err != nil || ep != a {
		t.Fatalf("Accept = %v, %v", ep, err)
	}
	if st := q.Stats(); st.Accepted != 1 || st.Failed != 1 || st.Pending != 1 {
		t.Fatalf("Stats = %+v", st)
	}
}

func TestCloseWakesAcceptAndClosesQueued(t *testing.T) {
	ctx := testenv.Context(t)
	q := New("test", "x", 4)
	q.Reserve()
	queued := &closer{}
	q.Offer(queued)
	q.Reserve() // a handshake still running when Close comes
	// Drain the queued one first so Accept blocks.
	if _, err := q.Accept(ctx); err != nil {
		t.Fatal(err)
	}
	q.Reserve()
	q.Offer(queued)
	done := make(chan error, 1)
	go func() {
		_, err := q.Accept(ctx)
		for err == nil { // the queued endpoint may be taken first
			_, err = q.Accept(ctx)
		}
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	if !q.Close() || q.Close() {
		t.Fatal("Close is not idempotent")
	}
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("Accept after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake Accept")
	}
	late := &closer{}
	if err := q.Offer(late); !errors.Is(err, os.ErrClosed) || late.closed.Load() != 1 {
		t.Fatalf("Offer after Close = %v, closed %d times", err, late.closed.Load())
	}
	if q.Reserve() {
		t.Fatal("Reserve after Close succeeded")
	}
}

func TestAcceptContext(t *testing.T) {
	q := New("test", "x", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := q.Accept(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Accept = %v", err)
	}
}

// TestCounts: a malformed connect request and a refused one are counted
// apart from the handshakes, and take no backlog slot.
func TestCounts(t *testing.T) {
	q := New("test", "x", 1)
	q.Malformed()
	q.Malformed()
	q.Refuse()
	if st := q.Stats(); st.Failed != 2 || st.Refused != 1 || st.Pending != 0 {
		t.Fatalf("Stats = %+v, want 2 failed, 1 refused, 0 pending", st)
	}
	if !q.Reserve() {
		t.Fatal("Malformed or Refuse took a backlog slot")
	}
}
