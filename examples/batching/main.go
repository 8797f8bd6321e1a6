// Command batching forwards many small packets as few fabric messages, the
// way a software router uses the batch package: a Coalescer gathers
// packets that stay where they are (in registered buffers) into one
// message per batch, and a Splitter on the other end hands them back one
// by one, as views into its receive memory.
//
//	go run ./examples/batching
//
// Both ends run in this process, over an emulated NTB bridge in a
// temporary file (in real use, two processes or two hosts).
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/weft-io/weft/batch"
	"github.com/weft-io/weft/fabric"
	_ "github.com/weft-io/weft/ntb" // registers "ntb"
)

const (
	packets = 100000 // packets to forward
	bufSize = 256    // bytes per packet buffer
	nbufs   = 1024   // packet buffers in the sender's pool
	end     = 0xE0F  // immediate data of the message that ends the run
)

func main() {
	log.SetFlags(0)
	dir, err := os.MkdirTemp("", "batching")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	addr := filepath.Join(dir, "bridge") // both ends name the same file

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rxc := make(chan fabric.Endpoint)
	go func() { // each end's Open waits for the other
		ep, err := fabric.Open(ctx, "ntb", addr, nil)
		if err != nil {
			log.Fatal(err)
		}
		rxc <- ep
	}()
	tx, err := fabric.Open(ctx, "ntb", addr, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Close()
	rx := <-rxc
	defer rx.Close()

	done := make(chan error)
	go func() { done <- receive(ctx, rx) }()
	if err := send(ctx, tx); err != nil {
		log.Fatal(err)
	}
	if err := <-done; err != nil {
		log.Fatal(err)
	}
}

// send forwards packets of 64 to 255 bytes from a pool of buffers. A
// buffer belongs to the coalescer from Add until Reclaim hands its cookie
// (here, its index) back.
func send(ctx context.Context, ep fabric.Endpoint) error {
	pool, err := ep.Alloc(nbufs*bufSize, 0)
	if err != nil {
		return err
	}
	free := make([]uint64, 0, nbufs)
	for i := range nbufs {
		free = append(free, uint64(i))
	}
	c, err := batch.NewCoalescer(ep, nil) // defaults: count, bytes and a 5 µs deadline
	if err != nil {
		return err
	}
	defer c.Close()
	for i := 0; i < packets; {
		// Poll sends batches whose deadline passed and polls
		// completions; Reclaim returns the buffers of completed ones.
		if _, err := c.Poll(); err != nil {
			return err
		}
		free = free[:len(free)+c.Reclaim(free[len(free):cap(free)])]
		if len(free) == 0 {
			continue // every buffer is in a batch in flight
		}
		b := free[len(free)-1]
		n := 64 + i%192
		pkt := fabric.SGE{Region: pool, Offset: int(b) * bufSize, Length: n}
		pool.Bytes()[pkt.Offset] = byte(i) // the packet's first byte numbers it
		switch err := c.Add(pkt, b); {
		case errors.Is(err, batch.ErrFull):
			continue // every descriptor is busy: poll and try again
		case err != nil:
			return err
		}
		free = free[:len(free)-1]
		i++
	}
	if err := c.FlushWait(ctx); err != nil {
		return err
	}
	// A message sent without the coalescer arrives as a raw packet, after
	// the batches before it.
	_, err = ep.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: pool, Length: 1}}, Flags: fabric.FlagImm, Imm: end}})
	return err
}

// receive splits batches into packets until the end message and checks
// every packet.
func receive(ctx context.Context, ep fabric.Endpoint) error {
	s, err := batch.NewSplitter(ep, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	pkts := make([]batch.Packet, 256)
	for seen := 0; ; {
		n, err := s.RecvWait(ctx, pkts)
		if err != nil {
			return err
		}
		for _, p := range pkts[:n] {
			if p.Raw && p.Flags&fabric.FlagImm != 0 && p.Imm == end {
				st := s.Stats()
				fmt.Printf("%d packets in %d messages (%.1f packets per message), zero-copy %v\n",
					seen, st.Batches, float64(st.Packets)/float64(max(st.Batches, 1)), s.Views())
				return nil
			}
			if want := 64 + seen%192; len(p.Data) != want || p.Data[0] != byte(seen) {
				return fmt.Errorf("packet %d: %d bytes, or not its content", seen, len(p.Data))
			}
			seen++
		}
		s.Release(pkts[:n]) // a slot is reused once all its packets are released
	}
}
