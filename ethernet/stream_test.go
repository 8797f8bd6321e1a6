package ethernet_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/netns"
)

// TestStreamStats streams small messages and checks every one arrives
// in order; it logs the rate and the transport's counters.
func TestStreamStats(t *testing.T) {
	a, b := dialPair(t, netns.PairConfig{}, "%s", "%s")
	const total, burst, size = 100000, 32, 64
	src, err := a.Alloc(size*burst, 0)
	require.NoError(t, err)
	dst, err := b.Alloc(size*burst, fabric.AccessLocalWrite)
	require.NoError(t, err)
	sm := make([]fabric.Message, burst)
	rm := make([]fabric.Message, burst)
	for i := range sm {
		sm[i] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Offset: i * size, Length: size}}}
		rm[i] = fabric.Message{SGEs: []fabric.SGE{{Region: dst, Offset: i * size, Length: size}}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		next := uint32(0)
		for got := 0; got < total; {
			n, err := b.RecvWait(ctx, rm)
			if err != nil {
				done <- err
				return
			}
			for i := 0; i < n; i++ {
				d := dst.Bytes()[i*size:]
				v := uint32(d[0]) | uint32(d[1])<<8 | uint32(d[2])<<16 | uint32(d[3])<<24
				if v != next {
					t.Errorf("message %d arrived as %d", next, v)
				}
				next++
			}
			got += n
		}
		done <- nil
	}()
	seq := uint32(0)
	for sent := 0; sent < total; {
		k := min(burst, total-sent)
		for i := 0; i < k; i++ {
			d := src.Bytes()[i*size:]
			v := seq + uint32(i)
			d[0], d[1], d[2], d[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		}
		n, err := a.SendWait(ctx, sm[:k])
		require.NoError(t, err)
		// Unsent ones are resent next round with the same numbers.
		seq += uint32(n)
		sent += n
		if n < k {
			copy(src.Bytes(), src.Bytes()[n*size:k*size])
		}
	}
	require.NoError(t, <-done)
	el := time.Since(start)
	sa, sb := a.Stats(), b.Stats()
	t.Logf("%d messages of %d B in %v: %.3f Mmsg/s", total, size, el, float64(total)/el.Seconds()/1e6)
	t.Logf("sender: tx pkts %d retransmits %d doorbells %d wakeups %d drops %v", sa.TxPackets, sa.Retransmits, sa.Doorbells, sa.Wakeups, sa.Drops)
	t.Logf("receiver: rx pkts %d drops %v doorbells %d", sb.RxPackets, sb.Drops, sb.Doorbells)
}
