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

// TestSharedProgram: two Ports on different queues of one interface
// share Weft's XDP program; the program stays until the last one closes;
// a taken queue or a different filter is refused.
func TestSharedProgram(t *testing.T) {
	p := newPair(t, netns.PairConfig{Queues: 2})
	f := ethernet.Filter{EtherTypes: []uint16{ethernet.EtherTypeWeft}}
	q0 := openPort(t, p.A, p.NameA, &ethernet.Config{Queues: []int{0}, Filter: f})
	q1 := openPort(t, p.A, p.NameA, &ethernet.Config{Queues: []int{1}, Filter: f})
	require.Same(t, q0.Program(), q1.Program())
	err := p.A.Do(func() error {
		_, err := ethernet.Open(p.NameA, &ethernet.Config{Queues: []int{1}, Filter: f})
		return err
	})
	require.ErrorIs(t, err, ethernet.ErrXDPInUse)
	err = p.A.Do(func() error {
		_, err := ethernet.Open(p.NameA, &ethernet.Config{Queues: []int{0}, Filter: ethernet.Filter{All: true}})
		return err
	})
	require.ErrorIs(t, err, ethernet.ErrXDPInUse)
	progID := func() uint32 {
		var li ethernet.LinkInfo
		require.NoError(t, p.A.Do(func() (err error) { li, err = ethernet.LinkByName(p.NameA); return }))
		return li.XDPProgID
	}
	require.NotZero(t, progID())
	require.NoError(t, q0.Close())
	require.NotZero(t, progID(), "closing one Port detached the shared program")
	// Queue 1 still receives.
	a := openPort(t, p.B, p.NameB, &ethernet.Config{Queues: []int{1}})
	fr := make([]ethernet.Frame, 1)
	require.Equal(t, 1, a.Queue(0).Alloc(fr))
	ethernet.PutEthernet(a.Queue(0).Buffer(fr[0]), p.MACA, p.MACB, ethernet.EtherTypeWeft)
	fr[0].Len = 60
	_, err = a.Queue(0).Send(fr)
	require.NoError(t, err)
	require.Equal(t, 1, recvFrames(t, q1.Queue(0), 1, 2*time.Second, nil))
	require.NoError(t, q1.Close())
	require.Zero(t, progID(), "the last Close must detach")
}
