// Command pingpong sends a message to a peer and waits for it to come
// back, over any Weft backend, and prints the average round trip.
//
// With no arguments it runs both ends in this process, over an emulated
// NTB bridge in a temporary file:
//
//	go run ./examples/pingpong
//
// With -addr it runs one end; start the server first:
//
//	go run ./examples/pingpong -server -backend roce -addr listen:127.0.0.1:18515
//	go run ./examples/pingpong -backend roce -addr '127.0.0.1:18515?local=127.0.0.2'
//
// Each end says what it waits for and gives up after -timeout. At the end
// the client sends a stop message and waits for the server's answer, so
// both exit cleanly. (cmd/weft-pingpong is the measuring tool: sizes,
// percentiles, the shared-memory floor.)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/weft-io/weft/fabric"
	_ "github.com/weft-io/weft/ntb"  // registers "ntb"
	_ "github.com/weft-io/weft/roce" // registers "roce"
)

const stop = 1 // the immediate data of the client's last message

func main() {
	backend := flag.String("backend", "ntb", "backend")
	addr := flag.String("addr", "", "address of the connection (empty: run both ends here, over ntb)")
	server := flag.Bool("server", false, "run the echoing end")
	size := flag.Int("size", 64, "message size in bytes")
	n := flag.Int("n", 10000, "round trips")
	timeout := flag.Duration("timeout", 30*time.Second, "how long to wait for the peer")
	flag.Parse()
	log.SetFlags(0)

	if *addr == "" { // both ends: the server in a goroutine
		dir, err := os.MkdirTemp("", "pingpong")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(dir)
		*backend, *addr = "ntb", filepath.Join(dir, "bridge") // both ends name the same file
		go func() {
			if err := run(true, "ntb", *addr, *size, *n, *timeout); err != nil {
				log.Fatal("server: ", err)
			}
		}()
	}
	if err := run(*server, *backend, *addr, *size, *n, *timeout); err != nil {
		log.Fatal(err)
	}
}

func run(server bool, backend, addr string, size, n int, timeout time.Duration) error {
	// Opening connects to the peer: it blocks until the peer is there, so
	// bound it with a context.
	log.Printf("waiting up to %v for the peer of %s %s", timeout, backend, addr)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	ep, err := fabric.Open(ctx, backend, addr, &fabric.Options{MaxMsgSize: size})
	cancel()
	if err != nil {
		return err
	}
	defer ep.Close()

	// One registered buffer, one message whose only SGE covers it.
	buf, err := ep.Alloc(max(size, 1), fabric.AccessLocalWrite)
	if err != nil {
		return err
	}
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}}
	if server {
		return echo(ep, msgs)
	}

	ctx = context.Background()
	start := time.Now()
	for range n {
		msgs[0] = fabric.Message{SGEs: []fabric.SGE{{Region: buf, Length: size}}}
		if _, err := ep.SendWait(ctx, msgs); err != nil { // spins, then sleeps
			return err
		}
		msgs[0] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}
		if _, err := ep.RecvWait(ctx, msgs); err != nil {
			return err
		}
	}
	rtt := time.Since(start) / time.Duration(n)
	fmt.Printf("%s: %d round trips of %d bytes, average %v (one way %v)\n", backend, n, size, rtt, rtt/2)

	// Tell the server we are done and wait for its answer: closing at
	// once could lose the stop message.
	msgs[0] = fabric.Message{SGEs: []fabric.SGE{{Region: buf, Length: 1}}, Flags: fabric.FlagImm, Imm: stop}
	if _, err := ep.SendWait(ctx, msgs); err != nil {
		return err
	}
	msgs[0] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}
	_, err = ep.RecvWait(ctx, msgs)
	return err
}

// echo sends every message back until the client's stop message.
func echo(ep fabric.Endpoint, msgs []fabric.Message) error {
	ctx := context.Background()
	buf := msgs[0].SGEs[0].Region
	for {
		msgs[0] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}
		if _, err := ep.RecvWait(ctx, msgs); err != nil {
			if errors.Is(err, fabric.ErrPeerGone) {
				return nil // the client went away: nothing more to echo
			}
			return err
		}
		last := msgs[0].Flags&fabric.FlagImm != 0 && msgs[0].Imm == stop
		msgs[0] = fabric.Message{SGEs: []fabric.SGE{{Region: buf, Length: msgs[0].Len}}}
		if _, err := ep.SendWait(ctx, msgs); err != nil || last {
			return err
		}
	}
}
