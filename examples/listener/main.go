// Command listener serves several clients from one listener: the server
// calls fabric.Listen and accepts endpoints in a loop, one goroutine per
// client; each client opens an endpoint to the listener's address,
// exchanges a message and closes.
//
//	go run ./examples/listener
//
// It runs over an emulated NTB bridge in a temporary file, where the
// listener accepts one endpoint per queue of the bridge (up to 8). The
// server and the clients run in this process; in real use they are two
// processes, the clients all in one (they share their side of the bridge).
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/weft-io/weft/fabric"
	_ "github.com/weft-io/weft/ntb" // registers "ntb"
)

const clients = 4

func main() {
	log.SetFlags(0)
	dir, err := os.MkdirTemp("", "listener")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := fabric.Listen(ctx, "ntb", filepath.Join(dir, "bridge"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	go serve(ctx, l)

	// The clients dial the listener's address: for ntb the bridge's file
	// with listener=1, which picks a free queue.
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := client(ctx, l.Addr(), i); err != nil {
				log.Fatalf("client %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	st := l.Stats()
	fmt.Printf("listener at %s accepted %d connections\n", l.Addr(), st.Accepted)
}

// serve accepts endpoints until the listener is closed and answers each
// in its own goroutine. An accepted endpoint is independent of the
// listener: closing the listener leaves it open.
func serve(ctx context.Context, l fabric.Listener) {
	for {
		ep, err := l.Accept(ctx)
		if errors.Is(err, os.ErrClosed) || errors.Is(err, context.Canceled) {
			return
		}
		if err != nil {
			log.Printf("accept: %v", err)
			return
		}
		go answer(ctx, ep)
	}
}

// answer receives one message and replies to it.
func answer(ctx context.Context, ep fabric.Endpoint) {
	defer ep.Close()
	buf, err := ep.Alloc(256, fabric.AccessLocalWrite)
	if err != nil {
		log.Print(err)
		return
	}
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}}
	if _, err := ep.RecvWait(ctx, msgs); err != nil {
		log.Print(err)
		return
	}
	n := len(buf.Bytes()[:msgs[0].Len])
	n += copy(buf.Bytes()[n:], ", welcome")
	msgs[0] = fabric.Message{SGEs: []fabric.SGE{{Region: buf, Length: n}}}
	if _, err := ep.SendWait(ctx, msgs); err != nil {
		log.Print(err)
		return
	}
	// Wait for the client to close, so that the reply is not lost.
	msgs[0] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}
	if _, err := ep.RecvWait(ctx, msgs); !errors.Is(err, fabric.ErrPeerGone) {
		log.Printf("after the reply: %v", err)
	}
}

// client connects, says hello and prints the answer.
func client(ctx context.Context, addr string, i int) error {
	ep, err := fabric.Open(ctx, "ntb", addr, nil)
	if err != nil {
		return err
	}
	defer ep.Close()
	buf, err := ep.Alloc(256, fabric.AccessLocalWrite)
	if err != nil {
		return err
	}
	n := copy(buf.Bytes(), fmt.Sprintf("client %d", i))
	msgs := []fabric.Message{{SGEs: []fabric.SGE{{Region: buf, Length: n}}}}
	if _, err := ep.SendWait(ctx, msgs); err != nil {
		return err
	}
	msgs[0] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}
	if _, err := ep.RecvWait(ctx, msgs); err != nil {
		return err
	}
	fmt.Printf("client %d on %s: %s\n", i, ep.LocalAddr(), buf.Bytes()[:msgs[0].Len])
	return nil
}
