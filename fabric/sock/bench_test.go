package sock

import (
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/spin"
	"github.com/weft-io/weft/internal/testenv"
)

// benchConns are the connections the benchmarks compare: every backend
// of the table and TCP over loopback as the reference of the same run.
func benchConns(b *testing.B, f func(b *testing.B, a, c net.Conn)) {
	benchConnsOver(b, backends, nil, f)
}

// benchConnsOver is benchConns over the backends bes, whose connections
// take cfg, and TCP.
func benchConnsOver(b *testing.B, bes []backend, cfg *Config, f func(b *testing.B, a, c net.Conn)) {
	for _, be := range bes {
		b.Run(be.name, func(b *testing.B) {
			x, y := connPair(b, be, cfg)
			f(b, x, y)
		})
	}
	b.Run("tcp", func(b *testing.B) {
		x, y := tcpPair(b)
		f(b, x, y)
	})
}

func tcpPair(t testing.TB) (a, b net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dialed := make(chan error, 1)
	go func() {
		var err error
		b, err = net.Dial("tcp", l.Addr().String())
		dialed <- err
	}()
	a, err = l.Accept()
	if derr := <-dialed; err != nil || derr != nil {
		t.Fatal(err, derr)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// echo answers every size-byte message on c until c fails.
func echo(c net.Conn, size int) {
	buf := make([]byte, size)
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			return
		}
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
}

func roundTrip(c net.Conn, buf []byte) error {
	if _, err := c.Write(buf); err != nil {
		return err
	}
	_, err := io.ReadFull(c, buf)
	return err
}

// BenchmarkRoundTrip64 is a 64-byte request and its echo.
func BenchmarkRoundTrip64(b *testing.B) {
	benchConns(b, benchRoundTrip64)
}

// benchRoundTrip64 times 64-byte round trips from c to an echo on a.
func benchRoundTrip64(b *testing.B, a, c net.Conn) {
	go echo(a, 64)
	buf := make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		if err := roundTrip(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkThroughput1M writes 1 MiB per operation to a reader that
// counts it; the last byte is acknowledged before the clock stops.
func BenchmarkThroughput1M(b *testing.B) {
	benchConns(b, benchThroughput1M)
}

// benchThroughput1M times 1 MiB writes from c to a counting reader on a.
func benchThroughput1M(b *testing.B, a, c net.Conn) { benchStream1M(b, a, c, 256<<10) }

// benchStream1M times 1 MiB writes from c to a reader on a that reads
// readSize bytes at a time and acknowledges each MiB with one byte.
func benchStream1M(b *testing.B, a, c net.Conn, readSize int) {
	const size = 1 << 20
	go func() {
		buf := make([]byte, readSize)
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
}

// TestNoAllocs: the steady state of Read and Write allocates nothing,
// on either side (testing.AllocsPerRun counts every goroutine), for
// small messages and for writes that take several frames and credit
// grants. The endpoints spin long enough never to sleep (on a loaded
// machine a short spin budget runs out, and spins do not start at all
// unless told to ignore the load); TestNoAllocsSleeping covers the sleep
// path.
func TestNoAllocs(t *testing.T) {
	t.Cleanup(spin.IgnoreOversubscription())
	testNoAllocs(t, time.Second)
}

// TestNoAllocsSleeping is TestNoAllocs with endpoints that never spin:
// every wait sleeps, bounded by the connection's deadline context, and
// a backend's sleep path allocates nothing either (ntb's doorbell wait
// keeps its context's registration: wake.CtxWatch). The count is checked
// without the race detector (testenv.Race).
func TestNoAllocsSleeping(t *testing.T) {
	testNoAllocs(t, -1)
}

func testNoAllocs(t *testing.T, spinFor time.Duration) {
	forEach(t, func(t *testing.T, be backend) {
		for _, size := range []int{64, 100 << 10} {
			t.Run(strconv.Itoa(size), func(t *testing.T) {
				a, c := connPair(t, be, &Config{Options: fabric.Options{Spin: spinFor}})
				go echo(a, size)
				buf := make([]byte, size)
				var err error
				testenv.Await(t, "50 round trips to warm up", func() {
					for i := 0; i < 50 && err == nil; i++ {
						err = roundTrip(c, buf)
					}
				})
				if err != nil {
					t.Fatal(err)
				}
				if n := testing.AllocsPerRun(100, func() { roundTrip(c, buf) }); n != 0 && !(spinFor < 0 && testenv.Race) {
					t.Errorf("%d-byte round trip: %v allocations", size, n)
				}
			})
		}
	})
}

// TestNoAllocsRotatingBuffers: Writes that take turns among a few
// buffers (a pool, double buffering) allocate nothing either, where a
// large Write goes from the caller's buffer (Conn.zc): a buffer is not
// registered anew at each turn.
func TestNoAllocsRotatingBuffers(t *testing.T) {
	t.Cleanup(spin.IgnoreOversubscription())
	forEach(t, func(t *testing.T, be backend) {
		for _, size := range []int{100 << 10, 600 << 10} { // one burst of frames, two
			t.Run(strconv.Itoa(size), func(t *testing.T) {
				a, c := connPair(t, be, &Config{Options: fabric.Options{Spin: time.Second}})
				go echo(a, size)
				var bufs [3][]byte
				for i := range bufs {
					bufs[i] = make([]byte, size)
				}
				i := 0
				var err error
				testenv.Await(t, "50 round trips to warm up", func() {
					for ; i < 50 && err == nil; i++ {
						err = roundTrip(c, bufs[i%len(bufs)])
					}
				})
				if err != nil {
					t.Fatal(err)
				}
				n := testing.AllocsPerRun(50, func() {
					roundTrip(c, bufs[i%len(bufs)])
					i++
				})
				if n != 0 {
					t.Errorf("%d-byte round trips from %d buffers in turn: %v allocations", size, len(bufs), n)
				}
			})
		}
	})
}
