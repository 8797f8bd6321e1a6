package ethernet_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/testenv"
)

// TestQueueWaitSet: a receiving queue in a fabric.WaitSet wakes it for
// each frame the peer sends only after the receiver has the last (so the
// set is asleep for most of them), and the port's Close wakes it too.
func TestQueueWaitSet(t *testing.T) {
	p := newPair(t, netns.PairConfig{})
	f := ethernet.Filter{EtherTypes: []uint16{ethernet.EtherTypeWeft}}
	a := openPort(t, p.A, p.NameA, &ethernet.Config{Filter: f})
	b := openPort(t, p.B, p.NameB, &ethernet.Config{Filter: f})
	qa, qb := a.Queue(0), b.Queue(0)
	s, err := fabric.NewWaitSet()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.Add(qb))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rx := make([]ethernet.Frame, 8)
	const total = 200
	waits := 0
	acks := make(chan struct{})
	sent := make(chan error, 1)
	go func() { // the sender: a frame, then the receiver's ack
		frames := make([]ethernet.Frame, 1)
		for i := range total {
			if qa.Alloc(frames) != 1 {
				sent <- errors.New("Alloc: no frame")
				return
			}
			buf := qa.Buffer(frames[0])
			ethernet.PutEthernet(buf, p.MACB, p.MACA, ethernet.EtherTypeWeft)
			buf[14] = byte(i)
			frames[0].Len = 60
			time.Sleep(100 * time.Microsecond) // the receiver mostly waits
			if n, err := qa.Send(frames); n != 1 || err != nil {
				sent <- err
				return
			}
			select {
			case <-acks:
			case <-ctx.Done():
				sent <- ctx.Err()
				return
			}
			qa.Flush()
		}
		sent <- nil
	}()
	for i := range total {
		for {
			n, err := qb.Recv(rx)
			require.NoError(t, err)
			if n > 0 {
				require.Equal(t, 1, n)
				require.Equal(t, byte(i), qb.Data(rx[0])[14])
				qb.Release(rx[:n])
				acks <- struct{}{}
				break
			}
			require.NoError(t, s.Wait(ctx), "frame %d", i)
			waits++
		}
	}
	require.NoError(t, testenv.Recv(t, sent, "the sender"))
	t.Logf("%d frames, %d waits", total, waits)
	done := make(chan error, 1)
	go func() {
		for {
			if err := s.Wait(ctx); err != nil {
				done <- err
				return
			}
			if s.Len() == 0 {
				done <- nil
				return
			}
		}
	}()
	require.NoError(t, b.Close())
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, os.ErrClosed) {
			t.Fatalf("Wait after the port closed: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Close did not wake the set")
	}
}
