package sock

import (
	"io"
	"net"
	"testing"
)

// BenchmarkThroughput1MReads4K is BenchmarkThroughput1M with a reader
// that reads 4 KiB at a time, as bufio.Reader's default buffer and so
// net/http do: a Read takes less than a frame, and the rest of a burst
// waits for the next Reads (held in its view, or copied into the ring
// where the backend lends no views).
func BenchmarkThroughput1MReads4K(b *testing.B) {
	benchConns(b, func(b *testing.B, a, c net.Conn) {
		const size = 1 << 20
		go func() {
			buf := make([]byte, 4<<10)
			var n int64
			for {
				k, err := a.Read(buf)
				n += int64(k)
				if err != nil {
					return
				}
				if n%size == 0 && k > 0 {
					a.Write(buf[:1])
				}
			}
		}()
		data := make([]byte, size)
		ack := make([]byte, 1)
		b.SetBytes(size)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Write(data); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, ack); err != nil {
				b.Fatal(err)
			}
		}
	})
}
