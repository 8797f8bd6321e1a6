package fabric_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/weft-io/weft/fabric"
	_ "github.com/weft-io/weft/ntb" // registers the "ntb" backend
)

// Open endpoints by backend name and address, move a burst, and read the
// completion of a signaled send.
func Example() {
	dir, _ := os.MkdirTemp("", "weft")
	defer os.RemoveAll(dir)
	addr := filepath.Join(dir, "bridge") // both sides name the same bridge
	ctx := context.Background()

	peer := make(chan fabric.Endpoint)
	go func() {
		ep, _ := fabric.Open(ctx, "ntb", addr, nil)
		peer <- ep
	}()
	a, err := fabric.Open(ctx, "ntb", addr, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	b := <-peer
	defer b.Close()

	// A burst of three messages from one registered buffer.
	src, _ := a.Alloc(3*8, 0)
	copy(src.Bytes(), "one.....two.....three...")
	burst := make([]fabric.Message, 3)
	for i := range burst {
		burst[i] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Offset: 8 * i, Length: 8}}}
	}
	burst[2].Flags, burst[2].Context = fabric.FlagSignal, 42
	n, err := a.Send(burst) // n < 3 would be backpressure, not an error
	fmt.Println("sent", n, err)

	done := make([]fabric.Completion, 4)
	k, _ := a.CQ().Wait(ctx, done)
	fmt.Println("completion", done[0].Context, done[0].Status, k)

	// Receive them into one region, one SGE per message.
	dst, _ := b.Alloc(3*8, fabric.AccessLocalWrite)
	in := make([]fabric.Message, 3)
	for i := range in {
		in[i] = fabric.Message{SGEs: []fabric.SGE{{Region: dst, Offset: 8 * i, Length: 8}}}
	}
	got := 0
	for got < 3 {
		m, _ := b.RecvWait(ctx, in[got:])
		got += m
	}
	fmt.Printf("%q\n", dst.Bytes())
	// Output:
	// sent 3 <nil>
	// completion 42 ok 1
	// "one.....two.....three..."
}

// Errors match the package's sentinels with errors.Is, through the
// *OpError that names the operation and backend.
func Example_errors() {
	_, err := fabric.Open(context.Background(), "no-such-backend", "x", nil)
	fmt.Println(errors.Is(err, fabric.ErrUnknownBackend))
	var oe *fabric.OpError
	fmt.Println(errors.As(err, &oe), oe.Op)

	// A completion status maps to an error without allocating.
	st := fabric.StatusRemoteBounds
	fmt.Println(errors.Is(st.Err(), fabric.ErrAccess), errors.Is(st.Err(), fabric.ErrBounds))
	// Output:
	// true
	// true open
	// true true
}

// Wait for two connections with one goroutine: poll both, and park on
// the wait set only when neither had anything.
func ExampleWaitSet() {
	dir, _ := os.MkdirTemp("", "weft")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	var senders, receivers []fabric.Endpoint
	for _, name := range []string{"b0", "b1"} {
		addr := filepath.Join(dir, name)
		peer := make(chan fabric.Endpoint)
		go func() {
			ep, _ := fabric.Open(ctx, "ntb", addr, nil)
			peer <- ep
		}()
		ep, err := fabric.Open(ctx, "ntb", addr, nil)
		if err != nil {
			fmt.Println(err)
			return
		}
		senders, receivers = append(senders, <-peer), append(receivers, ep)
	}
	set, err := fabric.NewWaitSet()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer set.Close()
	for _, ep := range receivers {
		defer ep.Close()
		set.Add(ep.(fabric.Waitable))
	}
	for i, ep := range senders {
		defer ep.Close()
		buf, _ := ep.Alloc(64, 0)
		n := copy(buf.Bytes(), fmt.Sprintf("hello from %d", i))
		ep.Send([]fabric.Message{{SGEs: []fabric.SGE{{Region: buf, Length: n}}}})
	}
	for got := 0; got < 2; {
		progress := false
		for _, ep := range receivers {
			rbuf, _ := ep.Alloc(64, fabric.AccessLocalWrite) // (a real loop allocates once)
			msg := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(rbuf)}}}
			if n, _ := ep.Recv(msg); n == 1 {
				fmt.Println(string(rbuf.Bytes()[:msg[0].Len]))
				got, progress = got+1, true
			}
			rbuf.Close()
		}
		if !progress {
			set.Wait(ctx) // may return spuriously: poll again
		}
	}
	// Output:
	// hello from 0
	// hello from 1
}
