package sock

import (
	"bytes"
	"context"
	"io"
	"sync"
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
)

// ownCheck wraps an endpoint to hold its users to the fabric's buffer
// contract: a message of more than Caps.InlineSize bytes belongs to the
// endpoint until its completion (or a later signaled one) is polled.
// Send snapshots such a message's bytes; a poll that returns completions
// checks that the messages they complete still hold them. (It hides a
// fabric.ViewReceiver: the Conn receives with Recv.)
type ownCheck struct {
	fabric.Endpoint
	t  testing.TB
	mu sync.Mutex
	// pending are the messages sent and not completed, oldest first; a
	// signaled one ends a run that its completion completes.
	pending []owned
	checked int // messages checked at their completion
	cq      ownCQ
}

type owned struct {
	sges   []fabric.SGE
	snap   []byte
	signal bool
}

type ownCQ struct {
	fabric.CompletionQueue
	o *ownCheck
}

func newOwnCheck(t testing.TB, ep fabric.Endpoint) *ownCheck {
	o := &ownCheck{Endpoint: ep, t: t}
	o.cq = ownCQ{ep.CQ(), o}
	return o
}

func (o *ownCheck) CQ() fabric.CompletionQueue { return &o.cq }

func (o *ownCheck) record(msgs []fabric.Message, n int) {
	inline := o.Caps().InlineSize
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, m := range msgs[:n] {
		size := 0
		for _, s := range m.SGEs {
			size += s.Length
		}
		if size <= inline {
			continue
		}
		snap := make([]byte, size)
		fabric.Gather(snap, m.SGEs)
		o.pending = append(o.pending, owned{sges: append([]fabric.SGE(nil), m.SGEs...), snap: snap, signal: m.Flags&fabric.FlagSignal != 0})
	}
}

func (o *ownCheck) Send(msgs []fabric.Message) (int, error) {
	n, err := o.Endpoint.Send(msgs)
	o.record(msgs, n)
	return n, err
}

func (o *ownCheck) SendWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	n, err := o.Endpoint.SendWait(ctx, msgs)
	o.record(msgs, n)
	return n, err
}

// completed checks the messages that n signaled completions complete.
func (o *ownCheck) completed(n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for ; n > 0 && len(o.pending) > 0; n-- {
		for len(o.pending) > 0 {
			m := o.pending[0]
			o.pending = o.pending[1:]
			live := make([]byte, len(m.snap))
			fabric.Gather(live, m.sges)
			o.checked++
			if !bytes.Equal(live, m.snap) {
				o.t.Errorf("a message of %d bytes changed between its Send and its completion", len(m.snap))
			}
			if m.signal {
				break
			}
		}
	}
}

func (q *ownCQ) Poll(out []fabric.Completion) int {
	n := q.CompletionQueue.Poll(out)
	q.o.completed(n)
	return n
}

func (q *ownCQ) Wait(ctx context.Context, out []fabric.Completion) (int, error) {
	n, err := q.CompletionQueue.Wait(ctx, out)
	q.o.completed(n)
	return n, err
}

// TestWriteBufferOwned: over a backend whose frames are not copied at
// Send (roce: each is signaled, its slot reused after its completion),
// no frame changes before its completion, though the caller rewrites its
// buffer as soon as each Write returns.
func TestWriteBufferOwned(t *testing.T) {
	ea, eb := rocePair(t, nil, "")
	a, err := NewConn(ea, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ob := newOwnCheck(t, eb)
	b, err := NewConn(ob, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !b.ring {
		t.Fatalf("roce: no send ring (InlineSize %d)", ob.Caps().InlineSize)
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, a)
		done <- err
	}()
	buf := make([]byte, 1<<20)
	for i := range 4 {
		copy(buf, pattern(uint64(20+i), len(buf)))
		if _, err := b.Write(buf); err != nil {
			t.Fatal(err)
		}
		clear(buf)
	}
	b.CloseWrite()
	if err := testenv.Recv(t, done, "the reader's EOF"); err != nil {
		t.Fatal(err)
	}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	if ob.checked == 0 {
		t.Fatal("no message was checked at its completion")
	}
}
