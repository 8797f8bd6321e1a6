package rndv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/spin"
	"github.com/weft-io/weft/internal/testenv"
	_ "github.com/weft-io/weft/ntb"
	_ "github.com/weft-io/weft/roce"
)

// A backend makes a connected pair of endpoints.
type backend struct {
	name string
	pair func(t testing.TB, o *fabric.Options) (a, b fabric.Endpoint)
}

var backends = []backend{
	{"ntb", func(t testing.TB, o *fabric.Options) (fabric.Endpoint, fabric.Endpoint) {
		return fabrictest.ListenPair(t, "ntb", filepath.Join(t.TempDir(), "bridge"), o)
	}},
	{"roce", func(t testing.TB, o *fabric.Options) (fabric.Endpoint, fabric.Endpoint) {
		// Two engines, as two hosts would have: the listener's on
		// 127.0.0.1, the dialler's on 127.0.0.2.
		return fabrictest.ListenPairDial(t, "roce", "127.0.0.1:0", func(l fabric.Listener) string {
			return l.Addr() + "?local=127.0.0.2"
		}, o)
	}},
}

// conns returns a Conn over each endpoint of be, closed when t ends.
func conns(t testing.TB, be backend, o *Options) (a, b *Conn) {
	t.Helper()
	return connsWith(t, be, o, nil)
}

// connsWith is conns over endpoints opened with fo.
func connsWith(t testing.TB, be backend, o *Options, fo *fabric.Options) (a, b *Conn) {
	t.Helper()
	ea, eb := be.pair(t, fo)
	var err error
	if a, err = New(ea, o); err != nil {
		t.Fatal(err)
	}
	if b, err = New(eb, o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func alloc(t testing.TB, c *Conn, n int, acc fabric.Access) *fabric.Region {
	t.Helper()
	r, err := c.Endpoint().Alloc(n, acc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(i*7 + seed*13 + i>>8)
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), fabrictest.Scale(30*time.Second))
	t.Cleanup(cancel)
	return ctx
}

// TestSizes sends messages of every size class, both ways at once, into
// receive buffers that can and cannot take a write, and checks each
// message and which protocol carried it.
func TestSizes(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			a, b := conns(t, be, &Options{Threshold: 4096})
			ctx := ctxT(t)
			const max = 300 << 10
			sizes := []int{0, 1, 100, 4096, 4097, 70 << 10, max, 5000, 3, max}
			for _, acc := range []fabric.Access{fabric.AccessLocalWrite, fabric.AccessLocalWrite | fabric.AccessRemoteWrite} {
				src := alloc(t, a, max, 0)
				dst := alloc(t, b, max, acc)
				before := b.Stats()
				errc := make(chan error, 1)
				go func() {
					for i, n := range sizes {
						fill(src.Bytes()[:n], i)
						if err := a.Send(ctx, fabric.SGE{Region: src, Length: n}); err != nil {
							errc <- fmt.Errorf("send %d: %w", i, err)
							return
						}
					}
					errc <- nil
				}()
				want := make([]byte, max)
				for i, n := range sizes {
					got, err := b.Recv(ctx, fabric.SGEOf(dst))
					if err != nil {
						t.Fatalf("%v: recv %d: %v", acc, i, err)
					}
					fill(want[:n], i)
					if got != n || !bytes.Equal(dst.Bytes()[:n], want[:n]) {
						t.Fatalf("%v: message %d: %d bytes, want %d, equal %v", acc, i, got, n, bytes.Equal(dst.Bytes()[:got], want[:got]))
					}
				}
				if err := testenv.Recv(t, errc, "the sender"); err != nil {
					t.Fatal(err)
				}
				s := b.Stats()
				rdv := s.RndvRecv - before.RndvRecv
				if acc.Has(fabric.AccessRemoteWrite) {
					if rdv != 5 {
						t.Errorf("%v: %d messages by rendezvous, want the 5 above the threshold", acc, rdv)
					}
				} else if rdv != 0 {
					t.Errorf("%v: %d messages by rendezvous into a buffer a peer cannot write", acc, rdv)
				}
			}
		})
	}
}

// TestStreamAdvertises: in a stream of large messages, the receiver
// advertises its buffer before the sender asks, so only the first message
// costs an RTS.
func TestStreamAdvertises(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			a, b := conns(t, be, &Options{Threshold: 1024})
			ctx := ctxT(t)
			const n, count = 64 << 10, 50
			src := alloc(t, a, n, 0)
			dst := alloc(t, b, n, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
			errc := make(chan error, 1)
			go func() {
				for i := range count {
					fill(src.Bytes(), i)
					if err := a.Send(ctx, fabric.SGEOf(src)); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			want := make([]byte, n)
			for i := range count {
				if got, err := b.Recv(ctx, fabric.SGEOf(dst)); err != nil || got != n {
					t.Fatalf("recv %d: %d, %v", i, got, err)
				}
				fill(want, i)
				if !bytes.Equal(dst.Bytes(), want) {
					t.Fatalf("message %d differs", i)
				}
			}
			if err := testenv.Recv(t, errc, "the sender"); err != nil {
				t.Fatal(err)
			}
			sa, sb := a.Stats(), b.Stats()
			if sa.RndvSent != count || sa.RTS+sb.Adverts < count {
				t.Errorf("sender %+v, receiver %+v", sa, sb)
			}
			if sb.Adverts != count-1 {
				t.Errorf("%d buffers advertised before an RTS, want %d (all but the first): %+v", sb.Adverts, count-1, sb)
			}
		})
	}
}

// TestTruncated: a message longer than the receive buffer fills it,
// returns ErrTruncated, and the connection goes on.
func TestTruncated(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			a, b := conns(t, be, &Options{Threshold: 1024})
			ctx := ctxT(t)
			src := alloc(t, a, 32<<10, 0)
			fill(src.Bytes(), 1)
			for _, acc := range []fabric.Access{fabric.AccessLocalWrite, fabric.AccessLocalWrite | fabric.AccessRemoteWrite} {
				dst := alloc(t, b, 8<<10, acc)
				for _, n := range []int{500, 32 << 10, 10} {
					errc := make(chan error, 1)
					go func() { errc <- a.Send(ctx, fabric.SGE{Region: src, Length: n}) }()
					got, err := b.Recv(ctx, fabric.SGEOf(dst))
					want, werr := min(n, dst.Len()), error(nil)
					if n > dst.Len() {
						werr = ErrTruncated
					}
					if got != want || !errors.Is(err, werr) && err != werr {
						t.Fatalf("%v: %d into %d: %d, %v; want %d, %v", acc, n, dst.Len(), got, err, want, werr)
					}
					if !bytes.Equal(dst.Bytes()[:got], src.Bytes()[:got]) {
						t.Fatalf("%v: %d bytes differ", acc, n)
					}
					if err := testenv.Recv(t, errc, "Send"); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
}

// TestAllocs: neither protocol allocates per message, on either side
// (testing.AllocsPerRun counts every goroutine). The endpoints spin long
// enough never to sleep, as in sock's TestNoAllocs: a backend's sleep
// path may allocate.
func TestAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	t.Cleanup(spin.IgnoreOversubscription())
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			for _, n := range []int{64, 16 << 10} {
				a, b := connsWith(t, be, &Options{Threshold: 1024}, &fabric.Options{Spin: time.Second})
				ctx := ctxT(t)
				src := alloc(t, a, n, 0)
				dst := alloc(t, b, n, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
				pong := alloc(t, a, 1, fabric.AccessLocalWrite)
				one := alloc(t, b, 1, 0)
				echoed := make(chan error, 1)
				go func() { echoed <- echo(ctx, b, dst, one) }()
				round := func() {
					if err := a.Send(ctx, fabric.SGEOf(src)); err != nil {
						t.Fatal(err)
					}
					if _, err := a.Recv(ctx, fabric.SGEOf(pong)); err != nil {
						t.Fatal(err)
					}
				}
				testenv.Await(t, "50 round trips to warm up", func() {
					for range 50 {
						round()
					}
				})
				if got := testing.AllocsPerRun(200, round); got != 0 {
					t.Errorf("%d B: %.1f allocations per round trip", n, got)
				}
				a.Close()
				if err := testenv.Recv(t, echoed, "the echo"); err == nil {
					t.Error("the echo ended without an error")
				}
			}
		})
	}
}

// echo answers every message c receives into dst with the message in one,
// until an error, which it returns.
func echo(ctx context.Context, c *Conn, dst, one *fabric.Region) error {
	for {
		if _, err := c.Recv(ctx, fabric.SGEOf(dst)); err != nil {
			return err
		}
		if err := c.Send(ctx, fabric.SGEOf(one)); err != nil {
			return err
		}
	}
}
