package ntb_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/weft-io/weft/fabric"
	_ "github.com/weft-io/weft/ntb"
)

// Two endpoints on the two sides of an emulated bridge (two processes in
// real use: here two goroutines) exchange a message.
func Example() {
	dir, _ := os.MkdirTemp("", "weft-example")
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
	a, err := fabric.Open(ctx, "ntb", addr, nil)
	if err != nil {
		panic(err)
	}
	defer a.Close()
	b := <-peer
	defer b.Close()

	// Register memory, send a burst of one message.
	src, _ := a.Alloc(64, 0)
	n := copy(src.Bytes(), "hello over the bridge")
	a.Send([]fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: n}}}})

	// Receive it: RecvWait spins, then sleeps until the doorbell rings.
	dst, _ := b.Alloc(64, fabric.AccessLocalWrite)
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(dst)}}}
	if _, err := b.RecvWait(ctx, msgs); err != nil {
		panic(err)
	}
	fmt.Println(string(dst.Bytes()[:msgs[0].Len]))
	// Output: hello over the bridge
}

// One-sided RMA: the target allocates window memory with remote write
// access and hands its descriptor to the initiator, which writes into it.
func ExampleEndpoint_rma() {
	dir, _ := os.MkdirTemp("", "weft-example")
	defer os.RemoveAll(dir)
	addr := filepath.Join(dir, "bridge")
	ctx := context.Background()
	peer := make(chan fabric.Endpoint)
	go func() {
		ep, _ := fabric.Open(ctx, "ntb", addr, nil)
		peer <- ep
	}()
	a, _ := fabric.Open(ctx, "ntb", addr, nil)
	defer a.Close()
	b := <-peer
	defer b.Close()

	target, _ := b.Alloc(4096, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
	remote := target.Remote() // sent to the initiator in a real program

	src, _ := a.Alloc(16, 0)
	copy(src.Bytes(), "written remotely")
	w := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(src)}, Remote: remote.Slice(100, 16),
		Flags: fabric.FlagSignal, Context: 1}}
	a.Write(w)
	out := make([]fabric.Completion, 1)
	a.CQ().Wait(ctx, out)
	fmt.Println(out[0].Status, string(target.Bytes()[100:116]))
	// Output: ok written remotely
}

// Zero-copy receive: the receiver reads messages where they arrived in
// its ring, through fabric.ViewReceiver, and releases them when done.
func ExampleEndpoint_RecvViews() {
	dir, _ := os.MkdirTemp("", "weft-example")
	defer os.RemoveAll(dir)
	addr := filepath.Join(dir, "bridge")
	ctx := context.Background()
	peer := make(chan fabric.Endpoint)
	go func() {
		ep, _ := fabric.Open(ctx, "ntb", addr, nil)
		peer <- ep
	}()
	a, _ := fabric.Open(ctx, "ntb", addr, nil)
	defer a.Close()
	b := <-peer
	defer b.Close()

	src, _ := a.Alloc(64, 0)
	msgs := make([]fabric.Message, 3)
	for i := range msgs {
		off := i * 8
		copy(src.Bytes()[off:], fmt.Sprintf("packet %d", i))
		msgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Offset: off, Length: 8}}}
	}
	a.Send(msgs)

	vr := b.(fabric.ViewReceiver)
	views := make([]fabric.View, 8)
	for got := 0; got < len(msgs); {
		n, err := vr.RecvViewsWait(ctx, views)
		if err != nil {
			panic(err)
		}
		for _, v := range views[:n] {
			fmt.Println(string(v.Data)) // no copy: v.Data is in the ring
		}
		vr.ReleaseViews(n) // the sender may now reuse that ring space
		got += n
	}
	// Output:
	// packet 0
	// packet 1
	// packet 2
}
