package fabrictest

import (
	"context"
	"io"
	"testing"
	"time"
)

// OpenPair opens both ends of a connection at once, as a test needs when
// each end's open blocks until the other shows up: open(ctx, SideA) runs
// on the calling goroutine and open(ctx, SideB) on another, under a
// context that ends after d (Timeout if d is 0). If either fails, OpenPair
// closes whichever end was opened and fails the test with both errors;
// otherwise it registers the closing of both with t.Cleanup and returns
// them.
//
// E is whatever open returns: a fabric.Endpoint, or a backend's own
// endpoint type.
//
//	a, b := fabrictest.OpenPair(t, 0, func(ctx context.Context, s fabrictest.Side) (fabric.Endpoint, error) {
//		if s == fabrictest.SideA {
//			return fabric.Open(ctx, "roce", "listen:127.0.0.1:18515", nil)
//		}
//		return fabric.Open(ctx, "roce", "127.0.0.1:18515?local=127.0.0.2", nil)
//	})
func OpenPair[E io.Closer](t testing.TB, d time.Duration, open func(ctx context.Context, side Side) (E, error)) (a, b E) {
	t.Helper()
	if d == 0 {
		d = Timeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	type res struct {
		ep  E
		err error
	}
	ch := make(chan res, 1)
	go func() {
		ep, err := open(ctx, SideB)
		ch <- res{ep, err}
	}()
	a, aerr := open(ctx, SideA)
	r := <-ch
	b, berr := r.ep, r.err
	if aerr != nil || berr != nil {
		if aerr == nil {
			a.Close()
		}
		if berr == nil {
			b.Close()
		}
		t.Fatalf("OpenPair: side A: %v, side B: %v", aerr, berr)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
