package ethernet_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/internal/netns"
)

// TestMultiQueueSharedUMEM: one socket per queue on a shared UMEM
// (XDP_SHARED_UMEM) on both sides; frames sent on queue i of the veth
// arrive on queue i of its peer, and a frame received on one queue can
// be forwarded from another without a copy.
func TestMultiQueueSharedUMEM(t *testing.T) {
	p := newPair(t, netns.PairConfig{Queues: 2})
	f := ethernet.Filter{EtherTypes: []uint16{ethernet.EtherTypeWeft}}
	a := openPort(t, p.A, p.NameA, &ethernet.Config{AllQueues: true, Filter: f})
	b := openPort(t, p.B, p.NameB, &ethernet.Config{AllQueues: true, Filter: f})
	require.Len(t, a.Queues(), 2)
	require.Len(t, b.Queues(), 2)
	require.Same(t, a.Queue(0).Socket().UMEM(), a.Queue(1).Socket().UMEM())
	for i, q := range a.Queues() {
		require.Equal(t, i, q.ID())
		fr := make([]ethernet.Frame, 10)
		require.Equal(t, 10, q.Alloc(fr))
		for j := range fr {
			buf := q.Buffer(fr[j])
			ethernet.PutEthernet(buf, p.MACB, p.MACA, ethernet.EtherTypeWeft)
			buf[14] = byte(i)
			fr[j].Len = 60
		}
		n, err := q.Send(fr)
		require.NoError(t, err)
		require.Equal(t, 10, n)
	}
	for i, q := range b.Queues() {
		got := recvFrames(t, q, 10, 2*time.Second, func(d []byte) {
			require.Equal(t, byte(i), d[14], "frame of queue %d on queue %d", d[14], i)
		})
		require.Equal(t, 10, got, "queue %d", i)
	}

	// Forward: receive on B's queue 0, send the same frame (no copy) on
	// B's queue 1 back to A, which gets it on its queue 1.
	fa := a.Queue(0)
	fr := make([]ethernet.Frame, 1)
	require.Equal(t, 1, fa.Alloc(fr))
	buf := fa.Buffer(fr[0])
	ethernet.PutEthernet(buf, p.MACB, p.MACA, ethernet.EtherTypeWeft)
	buf[14] = 0x42
	fr[0].Len = 60
	_, err := fa.Send(fr)
	require.NoError(t, err)
	rx := make([]ethernet.Frame, 4)
	var n int
	require.True(t, waitFor(2*time.Second, func() bool { n, _ = b.Queue(0).Recv(rx); return n > 0 }))
	d := b.Queue(0).Data(rx[0])
	ethernet.PutEthernet(d, p.MACA, p.MACB, ethernet.EtherTypeWeft)
	sent, err := b.Queue(1).Send(rx[:1])
	require.NoError(t, err)
	require.Equal(t, 1, sent)
	got := recvFrames(t, a.Queue(1), 1, 2*time.Second, func(d []byte) { require.Equal(t, byte(0x42), d[14]) })
	require.Equal(t, 1, got)
}

func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(time.Millisecond)
	}
	return false
}
