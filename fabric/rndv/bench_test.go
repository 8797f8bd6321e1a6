package rndv

import (
	"context"
	"fmt"
	"testing"

	"github.com/weft-io/weft/fabric"
)

// BenchmarkThreshold streams messages of each size from one Conn to the
// other, eagerly and by rendezvous, into the receiver's own buffer (a
// region the peer may write): where the lines cross is the backend's
// threshold (DefaultThreshold). The receiver runs on its own goroutine,
// as ucx_perftest's tag_bw does in its own process.
func BenchmarkThreshold(b *testing.B) {
	for _, be := range backends {
		for _, size := range []int{1 << 10, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20} {
			for _, mode := range []struct {
				name   string
				thresh int
			}{{"eager", -1}, {"rndv", 1}} {
				b.Run(fmt.Sprintf("%s/%s/%s", be.name, sizeName(size), mode.name), func(b *testing.B) {
					benchStream(b, be, size, mode.thresh)
				})
			}
		}
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// benchStream sends b.N messages of size bytes from a to b.
func benchStream(b *testing.B, be backend, size, thresh int) {
	x, y := conns(b, be, &Options{Threshold: thresh})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := alloc(b, x, size, 0)
	dst := alloc(b, y, size, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
	ack := alloc(b, y, 1, 0)
	fin := alloc(b, x, 1, fabric.AccessLocalWrite)
	n := b.N
	errc := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			if _, err := y.Recv(ctx, fabric.SGEOf(dst)); err != nil {
				errc <- err
				return
			}
		}
		errc <- y.Send(ctx, fabric.SGEOf(ack))
	}()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < n; i++ {
		if err := x.Send(ctx, fabric.SGEOf(src)); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := x.Recv(ctx, fabric.SGEOf(fin)); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}
