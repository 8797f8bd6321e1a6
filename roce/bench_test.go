package roce

import (
	"context"
	"io"
	"net"
	"testing"

	"golang.org/x/sys/unix"

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
			benchTCPStream(b, c, s, size)
		})
	}
	for _, size := range []int{64, 4096} {
		b.Run("PingPong/"+sizeName(size), func(b *testing.B) {
			c, s := tcpPair(b)
			benchTCPPingPong(b, c, s, size)
		})
	}
}

// benchTCPStream streams b.N writes of size bytes from c to s.
func benchTCPStream(b *testing.B, c, s net.Conn, size int) {
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
}

// benchTCPPingPong bounces size bytes between c and s b.N times.
func benchTCPPingPong(b *testing.B, c, s net.Conn, size int) {
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
}

// BenchmarkUDP is the floor of a datagram round trip on this path: two
// UDP sockets over loopback that bounce one datagram, both ends
// busy-polling non-blocking sockets as the engine does (Spin), or parked
// in Go's poller (Go). The engine's PingPong moves four datagrams per
// round trip (each end's SEND and the peer's ACK: RoCE has no
// acknowledgement inside a request, as TCP has), this two.
func BenchmarkUDP(b *testing.B) {
	for _, size := range []int{64, 4096} {
		b.Run("PingPong/"+sizeName(size)+"/Spin", func(b *testing.B) {
			c, ca := udpSocket(b)
			s, sa := udpSocket(b)
			// Connected: read and write without a sockaddr (no allocation).
			if err := unix.Connect(c, sa); err != nil {
				b.Fatal(err)
			}
			if err := unix.Connect(s, ca); err != nil {
				b.Fatal(err)
			}
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				buf := make([]byte, size)
				for {
					n, err := unix.Read(s, buf)
					if err == unix.EAGAIN {
						select {
						case <-stop:
							return
						default:
							continue
						}
					}
					if err != nil {
						return
					}
					unix.Write(s, buf[:n])
				}
			}()
			b.Cleanup(func() { close(stop); <-done })
			buf := make([]byte, size)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := unix.Write(c, buf); err != nil {
					b.Fatal(err)
				}
				for {
					_, err := unix.Read(c, buf)
					if err == nil {
						break
					}
					if err != unix.EAGAIN {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run("PingPong/"+sizeName(size)+"/Go", func(b *testing.B) {
			c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				b.Fatal(err)
			}
			s, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close(); s.Close() })
			go func() {
				buf := make([]byte, size)
				for {
					n, from, err := s.ReadFromUDPAddrPort(buf)
					if err != nil {
						return
					}
					s.WriteToUDPAddrPort(buf[:n], from)
				}
			}()
			to := s.LocalAddr().(*net.UDPAddr).AddrPort()
			buf := make([]byte, size)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := c.WriteToUDPAddrPort(buf, to); err != nil {
					b.Fatal(err)
				}
				if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// udpSocket opens a non-blocking UDP socket on 127.0.0.1, closed when b
// ends, and returns it with its address.
func udpSocket(b *testing.B) (int, unix.Sockaddr) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		b.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		b.Fatal(err)
	}
	return fd, sa
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
	return tcpPairVia(b, func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") },
		func(addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(context.Background(), "tcp", addr)
		})
}

// tcpPairVia makes a TCP connection through listen and dial (which may
// enter namespaces), closed when b ends: c dialled, s accepted.
func tcpPairVia(b *testing.B, listen func() (net.Listener, error), dial func(addr string) (net.Conn, error)) (c, s net.Conn) {
	l, err := listen()
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		s, _ := l.Accept()
		ch <- s
	}()
	c, err = dial(l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	if s = <-ch; s == nil {
		c.Close()
		b.Fatal("accept failed")
	}
	b.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}
