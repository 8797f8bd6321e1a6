package sock

import (
	"net"
	"testing"
)

// BenchmarkThroughput1MReads4K is BenchmarkThroughput1M with a reader
// that reads 4 KiB at a time, as bufio.Reader's default buffer and so
// net/http do: a Read takes less than a frame, and the rest of a burst
// waits for the next Reads (held in its view, or copied into the ring
// where the backend lends no views).
func BenchmarkThroughput1MReads4K(b *testing.B) {
	benchConns(b, func(b *testing.B, a, c net.Conn) { benchStream1M(b, a, c, 4<<10) })
}
