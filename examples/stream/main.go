// Command stream sends a stream of messages in bursts from one endpoint to
// another, the way a program moves bulk data with Weft: the sender hands
// the endpoint a burst of messages at a time and resends what the endpoint
// did not take (backpressure, not an error); the receiver takes bursts.
//
//	go run ./examples/stream
//
// Both ends run in this process, over an emulated NTB bridge in a
// temporary file (in real use, two processes or two hosts).
package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/weft-io/weft/fabric"
	_ "github.com/weft-io/weft/ntb" // registers "ntb"
)

const (
	size  = 1024  // bytes per message
	burst = 32    // messages per Send
	total = 2e5   // messages in the stream
	last  = 0xE0F // immediate data of the last message
)

func main() {
	log.SetFlags(0)
	dir, err := os.MkdirTemp("", "stream")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	addr := filepath.Join(dir, "bridge") // both ends name the same file

	// Each end's Open waits for the other: open the receiver in a
	// goroutine.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rxc := make(chan fabric.Endpoint)
	go func() {
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
	go func() { done <- receive(rx) }()
	start := time.Now()
	if err := send(tx); err != nil {
		log.Fatal(err)
	}
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	el := time.Since(start)
	fmt.Printf("%d messages of %d bytes in %v: %.2f Mmsg/s, %.0f MB/s\n",
		int(total), size, el.Round(time.Millisecond), total/el.Seconds()/1e6, total*size/el.Seconds()/1e6)
}

// send streams total messages, numbered in their first 8 bytes, in
// bursts of burst messages from one registered buffer.
func send(ep fabric.Endpoint) error {
	if ep.Caps().InlineSize < size {
		return fmt.Errorf("%s does not copy %d-byte messages on Send", ep.Caps().Backend, size)
	}
	buf, err := ep.Alloc(burst*size, 0)
	if err != nil {
		return err
	}
	msgs := make([]fabric.Message, burst)
	ctx := context.Background()
	for seq := 0; seq < total; {
		k := min(burst, total-seq)
		for i := range k {
			binary.LittleEndian.PutUint64(buf.Bytes()[i*size:], uint64(seq+i))
			msgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: buf, Offset: i * size, Length: size}}}
		}
		if seq+k == total {
			msgs[k-1].Flags, msgs[k-1].Imm = fabric.FlagImm, last
		}
		// SendWait takes at least one message, waiting for room if the
		// receiver is behind; send the rest of the burst again.
		for sent := 0; sent < k; {
			n, err := ep.SendWait(ctx, msgs[sent:k])
			if err != nil {
				return err
			}
			sent += n
		}
		// The buffer is ours again: Send copies messages up to
		// Caps.InlineSize (larger ones would need FlagSignal and their
		// completion before the buffer is reused).
		seq += k
	}
	return nil
}

// receive takes bursts until the last message, checking the numbering.
func receive(ep fabric.Endpoint) error {
	buf, err := ep.Alloc(burst*size, fabric.AccessLocalWrite)
	if err != nil {
		return err
	}
	msgs := make([]fabric.Message, burst)
	ctx := context.Background()
	for want := uint64(0); ; {
		for i := range msgs {
			msgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: buf, Offset: i * size, Length: size}}}
		}
		n, err := ep.RecvWait(ctx, msgs) // at least one message
		if err != nil {
			return err
		}
		for i := range n {
			if got := binary.LittleEndian.Uint64(buf.Bytes()[i*size:]); got != want || msgs[i].Len != size {
				return fmt.Errorf("message %d: got number %d, %d bytes", want, got, msgs[i].Len)
			}
			want++
			if msgs[i].Flags&fabric.FlagImm != 0 && msgs[i].Imm == last {
				return nil
			}
		}
	}
}
