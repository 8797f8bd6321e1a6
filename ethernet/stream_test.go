package ethernet_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/testenv"
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
	require.NoError(t, testenv.Recv(t, done, "the receiver"))
	el := time.Since(start)
	sa, sb := a.Stats(), b.Stats()
	t.Logf("%d messages of %d B in %v: %.3f Mmsg/s", total, size, el, float64(total)/el.Seconds()/1e6)
	t.Logf("sender: tx pkts %d retransmits %d doorbells %d wakeups %d drops %v", sa.TxPackets, sa.Retransmits, sa.Doorbells, sa.Wakeups, sa.Drops)
	t.Logf("receiver: rx pkts %d drops %v doorbells %d", sb.RxPackets, sb.Drops, sb.Doorbells)
}

// TestLossRecovery drops every 97th data packet at the receiver: every
// message still arrives, in order, by retransmission.
func TestLossRecovery(t *testing.T) {
	a, b := dialPair(t, netns.PairConfig{}, "%s", "%s")
	ethernet.SetDropEvery(b.(*ethernet.Endpoint), 97)
	const total = 3000
	src, _ := a.Alloc(5000, 0)
	dst, _ := b.Alloc(5000, fabric.AccessLocalWrite)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		rm := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(dst)}}}
		for i := 0; i < total; i++ {
			if _, err := b.RecvWait(ctx, rm); err != nil {
				done <- err
				return
			}
			size := 1 + (i*131)%4000
			if rm[0].Len != size || dst.Bytes()[0] != byte(i) || dst.Bytes()[size-1] != byte(i) {
				done <- fmt.Errorf("message %d: len %d (want %d), first byte %d", i, rm[0].Len, size, dst.Bytes()[0])
				return
			}
		}
		done <- nil
	}()
	sm := []fabric.Message{{}}
	for i := 0; i < total; i++ {
		size := 1 + (i*131)%4000
		src.Bytes()[0], src.Bytes()[size-1] = byte(i), byte(i)
		sm[0] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Length: size}}}
		for {
			n, err := a.SendWait(ctx, sm)
			require.NoError(t, err)
			if n == 1 {
				break
			}
		}
	}
	require.NoError(t, testenv.Recv(t, done, "the receiver"))
	sa, sb := a.Stats(), b.Stats()
	t.Logf("retransmits %d, receiver drops %v", sa.Retransmits, sb.Drops)
	require.NotZero(t, sa.Retransmits)
}

// TestEndpointLinkDown: the peer's link going down is an EventLinkDown
// on the endpoint, and up again an EventLinkUp.
func TestEndpointLinkDown(t *testing.T) {
	p := newPair(t, netns.PairConfig{StaticNeigh: true})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var a, b fabric.Endpoint
	ch := make(chan error, 1)
	go func() {
		ch <- p.B.Do(func() (err error) { b, err = fabric.Open(ctx, "ethernet", p.NameB, nil); return })
	}()
	require.NoError(t, p.A.Do(func() (err error) { a, err = fabric.Open(ctx, "ethernet", p.NameA, nil); return }))
	require.NoError(t, testenv.Recv(t, ch, "the Open of side B"))
	defer a.Close()
	defer b.Close()
	require.NoError(t, p.B.Down(p.NameB))
	want := func(k fabric.EventKind) {
		t.Helper()
		for {
			select {
			case ev := <-a.Events():
				if ev.Kind == k {
					return
				}
			case <-time.After(3 * time.Second):
				t.Fatalf("no %v event", k)
			}
		}
	}
	want(fabric.EventLinkDown)
	require.NoError(t, p.B.Up(p.NameB))
	want(fabric.EventLinkUp)
}
