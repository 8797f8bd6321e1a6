package sock

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkConcurrentWrites64: 8 or 64 goroutines write 64-byte
// messages on one connection (an HTTP/2 or gRPC server's handlers, a
// logger, an RPC client with many callers) to a reader that counts the
// bytes; the clock stops once it has them all. frames/write is the DATA
// frames (and the few control frames) the writing side sent per Write:
// 1 without combining (see corkMax).
func BenchmarkConcurrentWrites64(b *testing.B) {
	for _, g := range []int{8, 64} {
		b.Run(strconv.Itoa(g), func(b *testing.B) {
			benchConns(b, func(b *testing.B, a, c net.Conn) { benchConcurrentWrites(b, a, c, g, 64) })
		})
	}
}

func benchConcurrentWrites(b *testing.B, a, c net.Conn, g, size int) {
	total := int64(b.N) * int64(size)
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		var n int64
		for n < total {
			k, err := a.Read(buf)
			n += int64(k)
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	sc, _ := c.(*Conn)
	var frames0 uint64
	if sc != nil {
		frames0 = sc.stats.framesTx.Load()
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	var next atomic.Int64
	errs := make(chan error, g)
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := make([]byte, size)
			for next.Add(1) <= int64(b.N) {
				if _, err := c.Write(msg); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if sc != nil {
		b.ReportMetric(float64(sc.stats.framesTx.Load()-frames0)/float64(b.N), "frames/write")
	}
}
