package rndv

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
)

// TestDuplex: both sides send and receive at once, each role in its own
// goroutine, small and large messages mixed, so that each side's ADV for
// the next message (sent at once after a rendezvous) meets the other
// side's Send still waiting for its write's completion, and each side's
// frames meet the other's poll from either role.
func TestDuplex(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			a, b := conns(t, be, &Options{Threshold: 1024})
			ctx := ctxT(t)
			sizes := []int{8192, 8192, 100, 8192, 0, 70000, 8192, 5, 8192, 8192}
			const rounds = 300
			run := func(c *Conn, seed int) chan error {
				errc := make(chan error, 2)
				src := alloc(t, c, 70000, 0)
				dst := alloc(t, c, 70000, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
				go func() {
					for i := range rounds {
						n := sizes[(i+seed)%len(sizes)]
						fill(src.Bytes()[:n], i+seed)
						if err := c.Send(ctx, fabric.SGE{Region: src, Length: n}); err != nil {
							errc <- fmt.Errorf("send %d: %w", i, err)
							return
						}
					}
					errc <- nil
				}()
				go func() {
					want := make([]byte, 70000)
					for i := range rounds {
						n := sizes[(i+1-seed)%len(sizes)]
						got, err := c.Recv(ctx, fabric.SGEOf(dst))
						if err != nil {
							errc <- fmt.Errorf("recv %d: %w", i, err)
							return
						}
						fill(want[:n], i+1-seed)
						if got != n || !bytes.Equal(dst.Bytes()[:n], want[:n]) {
							errc <- fmt.Errorf("recv %d: %d bytes, want %d", i, got, n)
							return
						}
					}
					errc <- nil
				}()
				return errc
			}
			ea, eb := run(a, 0), run(b, 1)
			for range 2 {
				if err := testenv.Recv(t, ea, "a"); err != nil {
					t.Fatal("a: ", err)
				}
				if err := testenv.Recv(t, eb, "b"); err != nil {
					t.Fatal("b: ", err)
				}
			}
		})
	}
}
