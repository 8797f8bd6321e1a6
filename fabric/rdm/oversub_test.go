package rdm_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/fabric/rdm"
	"github.com/weft-io/weft/internal/testenv"
)

// BenchmarkOversubscribed measures 64-byte round trips with
// fabric.Options.Spin -1, so that every wait sleeps at once, as when
// Weft does not own the cores: between two multi-peer endpoints over an
// emulated ntb bridge (rdm), and for the ratio between the two ends of
// one point-to-point ntb endpoint pair (p2p). It reports the round trip
// in microseconds (us/rt) and allocations.
func BenchmarkOversubscribed(b *testing.B) {
	blocking := fabric.Options{Spin: -1}
	b.Run("PingPong", func(b *testing.B) {
		b.Run("rdm", func(b *testing.B) {
			rx, txs, peers := star(b, 1, blocking)
			rdmPingPong(b, txs[0], peers[0], rx)
			b.ReportMetric(b.Elapsed().Seconds()*1e6/float64(b.N), "us/rt")
		})
		b.Run("p2p", func(b *testing.B) {
			fabrictest.PingPong(b, func(b *testing.B) (fabric.Endpoint, fabric.Endpoint) {
				a, z := fabrictest.ListenPair(b, "ntb", filepath.Join(b.TempDir(), "p2p"), &blocking)
				b.Cleanup(func() { a.Close(); z.Close() })
				return a, z
			}, 64)
			b.ReportMetric(b.Elapsed().Seconds()*1e6/float64(b.N), "us/rt")
		})
	})
}

// rdmPingPong is fabrictest.PingPong over multi-peer endpoints: tx sends
// 64 bytes to its peer p, rx, which sends them back to whoever sent them.
func rdmPingPong(b *testing.B, tx *rdm.Endpoint, p rdm.Peer, rx *rdm.Endpoint) {
	treg, err := tx.Alloc(64)
	if err != nil {
		b.Fatal(err)
	}
	rreg, err := rx.Alloc(64)
	if err != nil {
		b.Fatal(err)
	}
	tm := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(treg)}}}
	rm := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(rreg)}}}
	from := make([]rdm.Peer, 1)
	ctx := context.Background()
	total := b.N
	done := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	go func() {
		for range total {
			if _, err := rx.RecvWait(ctx, rm, from); err != nil {
				done <- err
				return
			}
			if _, err := rx.SendWait(ctx, from[0], rm); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for range total {
		if _, err := tx.SendWait(ctx, p, tm); err != nil {
			b.Fatal(err)
		}
		if _, err := tx.RecvWait(ctx, tm, nil); err != nil {
			b.Fatal(err)
		}
	}
	if err := testenv.Recv(b, done, "the echoing receiver"); err != nil {
		b.Fatal(err)
	}
}
