package batch_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/weft-io/weft/batch"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/ntb"
)

// pair opens both sides of a fresh emulated NTB bridge, one per goroutine,
// as ntb's own tests do.
func pair(t testing.TB, tc ntb.Config) (a, b *ntb.Endpoint) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bridge")
	return fabrictest.OpenPair(t, 20*time.Second, func(ctx context.Context, _ fabrictest.Side) (*ntb.Endpoint, error) {
		return ntb.DialShm(ctx, path, ntb.ShmConfig{}, tc)
	})
}

func newCoalescer(t testing.TB, ep fabric.Endpoint, o *batch.Options) *batch.Coalescer {
	t.Helper()
	c, err := batch.NewCoalescer(ep, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// copyMode makes newSplitter force the copying receive path (see
// bothModes).
var copyMode bool

// bothModes runs f twice: with splitters that take the ntb endpoint's
// zero-copy views (the default) and with splitters that copy into slots
// of their own (SplitterOptions.Copy).
func bothModes(t *testing.T, f func(t *testing.T)) {
	for _, c := range []bool{false, true} {
		name := "views"
		if c {
			name = "copy"
		}
		t.Run(name, func(t *testing.T) {
			copyMode = c
			defer func() { copyMode = false }()
			f(t)
		})
	}
}

func newSplitter(t testing.TB, ep fabric.Endpoint, o *batch.SplitterOptions) *batch.Splitter {
	t.Helper()
	var opts batch.SplitterOptions
	if o != nil {
		opts = *o
	}
	opts.Copy = opts.Copy || copyMode
	s, err := batch.NewSplitter(ep, &opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ep.(fabric.ViewReceiver); ok && s.Views() == opts.Copy {
		t.Fatalf("splitter Views() = %v with Copy %v on an endpoint with views", s.Views(), opts.Copy)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func alloc(t testing.TB, ep fabric.Endpoint, n int) *fabric.Region {
	t.Helper()
	r, err := ep.Alloc(n, fabric.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// recvN receives exactly n packets (copies of their data), releasing each
// at once.
func recvN(t testing.TB, s *batch.Splitter, n int) [][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out [][]byte
	pkts := make([]batch.Packet, 64)
	for len(out) < n {
		k, err := s.RecvWait(ctx, pkts[:min(len(pkts), n-len(out))])
		for _, p := range pkts[:k] {
			out = append(out, append([]byte(nil), p.Data...))
		}
		s.Release(pkts[:k])
		if err != nil {
			t.Fatalf("RecvWait after %d of %d packets: %v", len(out), n, err)
		}
	}
	return out
}

// expectNothing checks that no packet arrives within d.
func expectNothing(t testing.TB, s *batch.Splitter, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	pkts := make([]batch.Packet, 4)
	n, err := s.RecvWait(ctx, pkts)
	s.Release(pkts[:n])
	if n > 0 {
		t.Fatalf("got %d unexpected packets (%q...)", n, pkts[0].Data)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("RecvWait: %v, want deadline exceeded", err)
	}
}

// lowInline wraps a real endpoint and reports a small InlineSize, so that
// batches above it take the signaled path (completion before reclaim),
// as on an RDMA NIC that gathers from the packet buffers.
type lowInline struct {
	fabric.Endpoint
	inline int
}

func (l lowInline) Caps() fabric.Caps {
	c := l.Endpoint.Caps()
	c.InlineSize = l.inline
	return c
}
