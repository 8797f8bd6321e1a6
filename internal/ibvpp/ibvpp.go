// Package ibvpp plays the protocol of rdma-core's ibv_rc_pingpong and
// ibv_ud_pingpong over a Weft endpoint, for the interop tests against
// those programs: strictly alternating messages of Size bytes of 0x7b,
// the client first, each side sending only after its previous send
// completed and a message arrived.
package ibvpp

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/weft-io/weft/fabric"
)

// Config describes one run. Backend and Addr go to fabric.Open.
type Config struct {
	Backend string
	Addr    string
	Size    int  // bytes per message
	Iters   int  // messages each way
	Client  bool // send first
	// Idle, if positive, is a pause after connecting; the endpoint must
	// have received something in it (the peer's keep-alive
	// acknowledgements).
	Idle time.Duration
}

// Run opens the endpoint and plays the exchange.
func Run(ctx context.Context, c Config) error {
	ep, err := fabric.Open(ctx, c.Backend, c.Addr, nil)
	if err != nil {
		return err
	}
	defer ep.Close()
	if c.Idle > 0 {
		time.Sleep(c.Idle)
		if st := ep.Stats(); st.RxPackets == 0 {
			return fmt.Errorf("no keep-alive acknowledgement from the peer while idle")
		}
	}
	sbuf, err := ep.Alloc(c.Size, 0)
	if err != nil {
		return err
	}
	rbuf, err := ep.Alloc(c.Size+64, fabric.AccessLocalWrite)
	if err != nil {
		return err
	}
	for i := range sbuf.Bytes() {
		sbuf.Bytes()[i] = 0x7b
	}
	out := make([]fabric.Completion, 1)
	send := func(i int) error {
		msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(sbuf)}, Flags: fabric.FlagSignal, Context: uint64(i)}}
		if _, err := ep.SendWait(ctx, msgs); err != nil {
			return err
		}
		if _, err := ep.CQ().Wait(ctx, out); err != nil {
			return err
		}
		if err := out[0].Err(); err != nil {
			return fmt.Errorf("send %d completed with %v", i, err)
		}
		return nil
	}
	recv := func(i int) error {
		msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(rbuf)}}}
		if _, err := ep.RecvWait(ctx, msgs); err != nil {
			return fmt.Errorf("receive %d: %w", i, err)
		}
		got := rbuf.Bytes()[:msgs[0].Len]
		if len(got) != c.Size || bytes.IndexFunc(got, func(r rune) bool { return r != 0x7b }) >= 0 {
			return fmt.Errorf("message %d: %d bytes, want %d bytes of 0x7b", i, len(got), c.Size)
		}
		return nil
	}
	first, second := send, recv
	if !c.Client {
		first, second = recv, send
	}
	for i := 0; i < c.Iters; i++ {
		if err := first(i); err != nil {
			return err
		}
		if err := second(i); err != nil {
			return err
		}
	}
	return nil
}
