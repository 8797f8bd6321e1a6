package roce

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
)

// cmFabricPair opens two endpoints over rdma_cm through fabric.Open: a
// listener on 127.0.0.1 and a dialer on 127.0.0.2.
func cmFabricPair(t testing.TB, query string) (a, b fabric.Endpoint) {
	t.Helper()
	port := freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type res struct {
		ep  fabric.Endpoint
		err error
	}
	ch := make(chan res, 1)
	go func() {
		ep, err := fabric.Open(ctx, "roce", fmt.Sprintf("rdmacm://listen:127.0.0.1:%d?%s", port, query), nil)
		ch <- res{ep, err}
	}()
	var z fabric.Endpoint
	var err error
	for {
		// Refused until the listener is up.
		z, err = fabric.Open(ctx, "roce", fmt.Sprintf("127.0.0.1:%d?cm=1&local=127.0.0.2&%s", port, query), nil)
		if err == nil || !errors.Is(err, fabric.ErrRefused) || ctx.Err() != nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	r := <-ch
	if err != nil || r.err != nil {
		if z != nil {
			z.Close()
		}
		if r.ep != nil {
			r.ep.Close()
		}
		t.Fatalf("open: %v / %v", r.err, err)
	}
	t.Cleanup(func() { z.Close(); r.ep.Close() })
	return r.ep, z
}

// TestConformanceCM runs the conformance suite over connections that
// rdma_cm set up, through fabric.Open.
func TestConformanceCM(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		return cmFabricPair(t, "")
	})
}

// TestCMPeerGone: Close sends a DREQ, and the peer sees EventPeerGone.
func TestCMPeerGone(t *testing.T) {
	a, b := cmFabricPair(t, "keepalive=0")
	if a.RemoteAddr() != b.LocalAddr() || b.RemoteAddr() != a.LocalAddr() {
		t.Errorf("addresses %s %s / %s %s", a.LocalAddr(), a.RemoteAddr(), b.LocalAddr(), b.RemoteAddr())
	}
	b.Close()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-a.Events():
			if ev.Kind == fabric.EventPeerGone {
				return
			}
		case <-timeout:
			t.Fatal("no EventPeerGone after the peer's Close")
		}
	}
}

// TestListenCM accepts several dialers through one fabric.Listener.
func TestListenCM(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	port := freePort(t)
	l, err := ListenCM(ctx, fmt.Sprintf("rdmacm://127.0.0.1:%d", port), fabric.Options{Backlog: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const n = 6
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			for {
				// A full backlog refuses: try again, as a client would.
				ep, err := fabric.Open(ctx, "roce", l.Addr()+"?local=127.0.0.2", nil)
				if err == nil {
					ep.Close()
				}
				if !errors.Is(err, fabric.ErrRefused) {
					errs <- err
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	for i := 0; i < n; i++ {
		ep, err := l.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ep.Close()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if s := l.Stats(); s.Accepted != n {
		t.Errorf("stats %+v", s)
	}
}
