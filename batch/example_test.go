package batch_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/weft-io/weft/batch"
	"github.com/weft-io/weft/fabric"
	_ "github.com/weft-io/weft/ntb"
)

// A sender coalesces three packets into one message; the receiver splits
// it back into packets that are views into its receive slot.
func Example() {
	dir, _ := os.MkdirTemp("", "weft-batch-example")
	defer os.RemoveAll(dir)
	addr := filepath.Join(dir, "bridge")
	ctx := context.Background()
	peer := make(chan fabric.Endpoint)
	go func() {
		ep, err := fabric.Open(ctx, "ntb", addr, nil)
		if err != nil {
			panic(err)
		}
		peer <- ep
	}()
	tx, err := fabric.Open(ctx, "ntb", addr, nil)
	if err != nil {
		panic(err)
	}
	defer tx.Close()
	rx := <-peer
	defer rx.Close()

	// Sender: packets live in registered memory (a router's buffers, AF_XDP
	// UMEM frames); the cookie names the buffer.
	c, _ := batch.NewCoalescer(tx, nil) // defaults: up to Caps.MaxSGEs-1 packets, 5 µs deadline
	defer c.Close()
	bufs, _ := tx.Alloc(3*64, 0)
	for i, s := range []string{"first", "second", "third"} {
		n := copy(bufs.Bytes()[i*64:], s)
		c.Add(fabric.SGE{Region: bufs, Offset: i * 64, Length: n}, uint64(i))
	}
	c.Flush() // or let Tick/Poll in the router's loop flush at the deadline

	// The buffers come back once their batch has completed.
	free := make([]uint64, 8)
	fmt.Println("reclaimed buffers:", free[:c.Reclaim(free)])

	// Receiver: one message, three packets, no copy.
	s, _ := batch.NewSplitter(rx, nil)
	defer s.Close()
	pkts := make([]batch.Packet, 16)
	n, err := s.RecvWait(ctx, pkts)
	if err != nil {
		panic(err)
	}
	for _, p := range pkts[:n] {
		fmt.Println(string(p.Data))
	}
	s.Release(pkts[:n]) // the slot is reused once every packet is released
	st := s.Stats()
	fmt.Printf("%d batch, %d packets\n", st.Batches, st.Packets)
	// Output:
	// reclaimed buffers: [0 1 2]
	// first
	// second
	// third
	// 1 batch, 3 packets
}
