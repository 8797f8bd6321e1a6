package rndv_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/rndv"
	_ "github.com/weft-io/weft/ntb" // registers the "ntb" backend
)

// Move a 1 MiB message straight into the receiver's own buffer: the
// receiver's region takes remote writes, so the message goes by
// rendezvous and crosses the bridge once.
func Example() {
	dir, _ := os.MkdirTemp("", "weft")
	defer os.RemoveAll(dir)
	addr := filepath.Join(dir, "bridge")
	ctx := context.Background()

	peer := make(chan fabric.Endpoint)
	go func() {
		ep, _ := fabric.Open(ctx, "ntb", addr, nil)
		peer <- ep
	}()
	ea, err := fabric.Open(ctx, "ntb", addr, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	a, _ := rndv.New(ea, nil)
	defer a.Close()
	b, _ := rndv.New(<-peer, nil)
	defer b.Close()

	src, _ := ea.Alloc(1<<20, 0)
	copy(src.Bytes(), "hello")
	dst, _ := b.Endpoint().Alloc(1<<20, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)

	sent := make(chan error, 1)
	go func() { sent <- a.Send(ctx, fabric.SGEOf(src)) }()
	n, err := b.Recv(ctx, fabric.SGEOf(dst))
	fmt.Println(n, err, <-sent, string(dst.Bytes()[:5]))
	fmt.Println("by rendezvous:", b.Stats().RndvRecv)
	// Output:
	// 1048576 <nil> <nil> hello
	// by rendezvous: 1
}
