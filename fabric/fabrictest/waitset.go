package fabrictest

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

// TestWaitSet checks fabric.WaitSet over the receiving ends of pairs that
// mp makes, whose second endpoint must implement fabric.Waitable:
//   - Many: four pairs, one sender goroutine each, and one receiver that
//     polls every member and waits on the set when none had anything;
//     every message arrives once, in order per pair. Each sender sends
//     its next message only when the receiver has the last, so the
//     receiver keeps running out of work and the wake-ups are what
//     carries the test;
//   - Closed: a member closed while the set waits wakes it, and the set
//     drops it and keeps waiting for the others;
//   - Cancel: a cancelled context wakes Wait with its error;
//   - Close: Close wakes Wait with os.ErrClosed; Wait and Add after it
//     fail with it, and a second Close is a no-op.
func TestWaitSet(t *testing.T, mp MakePair) {
	t.Run("Many", func(t *testing.T) { waitSetMany(t, mp) })
	t.Run("Closed", func(t *testing.T) { waitSetClosed(t, mp) })
	t.Run("Cancel", func(t *testing.T) { waitSetCancel(t, mp) })
	t.Run("Close", func(t *testing.T) { waitSetClose(t, mp) })
}

// setTimeout bounds the wait-set cases: a lost wake-up fails them in
// this time, not the package's timeout.
var setTimeout = Scale(20 * time.Second)

func newSet(t *testing.T, members ...fabric.Endpoint) *fabric.WaitSet {
	t.Helper()
	s, err := fabric.NewWaitSet()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	for _, m := range members {
		w, ok := m.(fabric.Waitable)
		if !ok {
			t.Fatalf("%T is not a fabric.Waitable", m)
		}
		if err := s.Add(w); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func waitSetMany(t *testing.T, mp MakePair) {
	const pairs, count = 4, 200
	var rx []fabric.Endpoint
	var roles []*role
	acks := make([]chan struct{}, pairs)
	for i := range pairs {
		a, b := mp(t)
		rx = append(rx, b)
		roles = append(roles, newRole(t, b))
		ra := newRole(t, a)
		ack := make(chan struct{}, 1)
		acks[i] = ack
		go func() {
			var p [8]byte
			for k := range count {
				binary.LittleEndian.PutUint64(p[:], uint64(k))
				ra.send(p[:], 0, 0)
				select {
				case <-ack:
				case <-ra.ctx.Done():
					return
				}
			}
		}()
	}
	s := newSet(t, rx...)
	ctx, cancel := context.WithTimeout(context.Background(), setTimeout)
	defer cancel()
	next := make([]int, pairs)
	got, waits := 0, 0
	for got < pairs*count {
		progress := false
		for i, r := range roles {
			r.rmsg[0] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(r.rbuf)}}
			n, err := r.ep.Recv(r.rmsg)
			if err != nil {
				t.Fatalf("pair %d: Recv: %v", i, err)
			}
			if n == 0 {
				continue
			}
			progress = true
			if v := binary.LittleEndian.Uint64(r.rbuf.Bytes()); r.rmsg[0].Len != 8 || v != uint64(next[i]) {
				t.Fatalf("pair %d: message %d of %d bytes, want %d of 8", i, v, r.rmsg[0].Len, next[i])
			}
			next[i]++
			got++
			acks[i] <- struct{}{}
		}
		if !progress {
			if err := s.Wait(ctx); err != nil {
				t.Fatalf("Wait after %d of %d messages: %v", got, pairs*count, err)
			}
			waits++
		}
	}
	t.Logf("%d messages, %d waits", got, waits)
}

func waitSetClosed(t *testing.T, mp MakePair) {
	_, b1 := mp(t)
	a2, b2 := mp(t)
	s := newSet(t, b1, b2)
	ctx, cancel := context.WithTimeout(context.Background(), setTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Wait(ctx) }()
	b1.Close()
	if err := <-done; err != nil {
		t.Fatalf("Wait with a member closed: %v", err)
	}
	// A wait that finds b1 closed drops it and returns at once, for the
	// caller to notice (that wait, or the next); the set still hears
	// from b2.
	for s.Len() != 1 {
		if err := s.Wait(ctx); err != nil {
			t.Fatalf("Wait with a closed member, %d members: %v", s.Len(), err)
		}
	}
	ra := newRole(t, a2)
	go ra.send([]byte("after"), 0, 0)
	r := newRole(t, b2)
	for {
		r.rmsg[0] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(r.rbuf)}}
		if n, err := b2.Recv(r.rmsg); err != nil || n == 1 {
			if err != nil {
				t.Fatal(err)
			}
			break
		}
		if err := s.Wait(ctx); err != nil {
			t.Fatalf("Wait: %v", err)
		}
	}
}

func waitSetCancel(t *testing.T, mp MakePair) {
	_, b := mp(t)
	s := newSet(t, b)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		for {
			// A spurious wake-up returns nil: wait again.
			if err := s.Wait(ctx); err != nil {
				done <- err
				return
			}
		}
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel: %v, want context.Canceled", err)
	}
}

func waitSetClose(t *testing.T, mp MakePair) {
	_, b := mp(t)
	s := newSet(t, b)
	done := make(chan error, 1)
	go func() {
		for {
			if err := s.Wait(context.Background()); err != nil {
				done <- err
				return
			}
		}
	}()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Wait after Close: %v, want os.ErrClosed", err)
	}
	if err := s.Wait(context.Background()); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Wait on a closed set: %v", err)
	}
	if err := s.Add(b.(fabric.Waitable)); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Add on a closed set: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
