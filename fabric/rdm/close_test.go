package rdm_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/fabric/rdm"
)

// closeBound is how soon the rdm documentation says peers learn of a
// close.
const closeBound = 100 * time.Millisecond

// TestCloseTellsPeers: an endpoint that closes says goodbye on every
// connection, so its peers report it gone promptly, with a reason that
// says the peer closed (not that retries or keep-alives ran out), on
// every backend.
func TestCloseTellsPeers(t *testing.T) {
	for _, m := range meshes {
		t.Run(m.backend, func(t *testing.T) {
			dir := t.TempDir()
			if m.setup != nil {
				m.setup(t, dir, 2)
			}
			es := make([]*rdm.Endpoint, 2)
			for i := range es {
				es[i] = m.open(t, dir, i, 2)
				defer es[i].Close()
				publish(t, dir, i, es[i])
			}
			name := names(t, dir, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// One message each way: both sides hold the connection.
			for i, e := range es {
				p, err := e.Insert(name[1-i])
				if err != nil {
					t.Fatal(err)
				}
				reg, _ := e.Alloc(8)
				if _, err := e.SendWait(ctx, p, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}}); err != nil {
					t.Fatal(err)
				}
			}
			for _, e := range es {
				reg, _ := e.Alloc(64)
				msgs := make([]fabric.Message, 2)
				for got := 0; got < 1; {
					for k := range msgs {
						msgs[k] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}
					}
					n, err := e.RecvWait(ctx, msgs, nil)
					if err != nil {
						t.Fatal(err)
					}
					got += n
				}
			}
			es[1].Close()
			closed := time.Now()
			select {
			case ev := <-es[0].Events():
				after := ev.Time.Sub(closed)
				t.Logf("peer gone %v after Close returned: %v", after, ev.Err)
				// The reason proves the goodbye: a peer found silent or
				// out of retries never reports ErrPeerClosed. The bound
				// is the documented 100 ms, scaled for the race
				// detector, with room for a loaded host.
				if ev.Kind != fabric.EventPeerGone || !errors.Is(ev.Err, fabric.ErrPeerClosed) {
					t.Errorf("event %v: %v; want EventPeerGone matching fabric.ErrPeerClosed", ev.Kind, ev.Err)
				}
				if bound := fabrictest.Scale(5 * closeBound); after > bound {
					t.Errorf("peer gone %v after Close, want within %v", after, bound)
				}
			case <-ctx.Done():
				t.Fatal("the peer's close was never reported")
			}
		})
	}
}
