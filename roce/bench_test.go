package roce

import (
	"context"
	"io"
	"net"
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
)

// BenchmarkEngine runs the message-path benchmarks between two engines
// over loopback UDP (127.0.0.1 and 127.0.0.2), path MTU 4096. Run it
// beside BenchmarkTCP, the reference, in one invocation:
//
//	go test -run XXX -bench 'Engine|TCP' -count 3 ./roce/
func BenchmarkEngine(b *testing.B) {
	benchEngine(b, "mtu=4096&keepalive=0")
}

// BenchmarkEngineNoRaw is BenchmarkEngine with raw=0: the engines
// receive on their UDP sockets (no second delivery of every packet to a
// raw socket) and rebuild the IP headers for the ICRC.
func BenchmarkEngineNoRaw(b *testing.B) { benchEngine(b, "mtu=4096&keepalive=0&raw=0") }

// BenchmarkEngineGSO is BenchmarkEngine with gso=1: runs of equal-size
// packets go out as one UDP GSO message and arrive as one GRO message.
func BenchmarkEngineGSO(b *testing.B) { benchEngine(b, "mtu=4096&keepalive=0&gso=1") }

// benchEngine runs fabrictest.Benchmark on pairs of the address
// parameters query, and reports the packets both engines sent per message
// (data and acknowledgements: on loopback each costs the sender the
// whole kernel path of its receiver too).
func benchEngine(b *testing.B, query string) {
	fabrictest.Benchmark(b, func(b *testing.B) (fabric.Endpoint, fabric.Endpoint) {
		x, y := rcPair(b, query)
		ex, ey := x.qp.e, y.qp.e
		tx0 := ex.Stats().TxPackets + ey.Stats().TxPackets
		b.Cleanup(func() {
			if b.N > 1 {
				tx := ex.Stats().TxPackets + ey.Stats().TxPackets - tx0
				b.ReportMetric(float64(tx)/float64(b.N), "pkts/msg")
			}
		})
		return x, y
	})
}

// BenchmarkTCP is the reference: a Go TCP connection over loopback, the
// same ping-pong and stream shapes as fabrictest.Benchmark.
func BenchmarkTCP(b *testing.B) {
	for _, size := range []int{64, 1024, 4096, 65536} {
		b.Run("Stream/"+sizeName(size), func(b *testing.B) {
			c, s := tcpPair(b)
			buf := make([]byte, size)
			done := make(chan struct{})
			go func() {
				io.CopyN(io.Discard, s, int64(size)*int64(b.N))
				close(done)
			}()
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c.Write(buf)
			}
			<-done
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mmsg/s")
		})
	}
	for _, size := range []int{64, 4096} {
		b.Run("PingPong/"+sizeName(size), func(b *testing.B) {
			c, s := tcpPair(b)
			go func() {
				buf := make([]byte, size)
				for {
					if _, err := io.ReadFull(s, buf); err != nil {
						return
					}
					s.Write(buf)
				}
			}()
			buf := make([]byte, size)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c.Write(buf)
				io.ReadFull(c, buf)
			}
		})
	}
}

func sizeName(n int) string {
	switch n {
	case 64:
		return "64B"
	case 1024:
		return "1KiB"
	case 4096:
		return "4KiB"
	case 65536:
		return "64KiB"
	}
	return "?"
}

func tcpPair(b *testing.B) (net.Conn, net.Conn) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		s, _ := l.Accept()
		ch <- s
	}()
	c, err := (&net.Dialer{}).DialContext(context.Background(), "tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	s := <-ch
	b.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}
