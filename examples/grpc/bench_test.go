package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/sock"
	_ "github.com/weft-io/weft/roce" // registers the "roce" backend
)

// BenchmarkGRPC measures gRPC over Weft beside gRPC over TCP loopback,
// the reference of the same run. For each transport one client
// connection makes
//
//   - unary-64, unary-4K: sequential unary Echo calls of 64 B and 4 KiB
//     (one call per operation, calls/s reported);
//   - unary-64x8: 64 B calls from 8 concurrent callers;
//   - stream-1M: 1 MiB messages on one client stream that the server
//     drains (one message per operation, bytes/s by b.SetBytes; the
//     server's count is awaited before the clock stops).
//
// Each also reports cpu-ns/op, the CPU time of the process (client and
// server) per operation, which tells the work of a transport apart from
// the wait for a core on a host that other processes load.
//
// The transports are ntb (an emulated bridge in a temporary file, the
// default busy-poll budget), ntb-sleep (the same with Options.Spin
// negative: receives sleep at once), roce (the user-space engine on
// 127.0.0.1 over its default link, which takes a shared-memory ring or
// UDP per connection: -v logs which), tcp, and mem: gRPC's in-memory
// test transport (grpc/test/bufconn, a buffered pipe per direction), as
// close to a free transport as gRPC gets, and so the bound of what any
// transport can gain over TCP. Run it with
//
//	go test -run '^$' -bench GRPC -count 3 .
func BenchmarkGRPC(b *testing.B) {
	for _, t := range []struct {
		name, backend string
		spin          time.Duration // Options.Spin; -spin overrides 0
	}{
		{"ntb", "ntb", 0},
		{"ntb-sleep", "ntb", -1},
		{"roce", "roce", 0},
		{"tcp", "tcp", 0},
		{"mem", "mem", 0},
	} {
		b.Run(t.name, func(b *testing.B) {
			spin := t.spin
			if spin == 0 {
				spin = *benchSpin
			}
			// listen and dial read config, dial's dialer whenever it
			// connects: it stays until the connection is closed.
			config = &sock.Config{Options: fabric.Options{Spin: spin}}
			b.Cleanup(func() { config = nil })
			cc := benchConn(b, t.backend)
			for _, size := range []int{64, 4 << 10} {
				name := "unary-64"
				if size > 64 {
					name = "unary-4K"
				}
				b.Run(name, func(b *testing.B) { benchUnary(b, cc, size) })
			}
			b.Run("unary-64x8", func(b *testing.B) { benchUnaryParallel(b, cc, 64, 8) })
			b.Run("stream-1M", func(b *testing.B) { benchStream(b, cc, 1<<20) })
		})
	}
}

// benchSpin is the busy-poll budget of the Weft connections of the
// transports that do not set their own, as main's -spin.
var benchSpin = flag.Duration("spin", 0, "BenchmarkGRPC: how long blocking receives busy-poll before they sleep (0: the backend's default, negative: sleep at once)")

// benchConn starts a server of the example's service and of sinkDesc on
// backend and returns a client connection to it, connected; both are
// stopped when b ends.
func benchConn(b *testing.B, backend string) *grpc.ClientConn {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	addr := "127.0.0.1:0"
	if backend == "ntb" {
		addr = filepath.Join(b.TempDir(), "bridge")
	}
	opts := benchDialOpts()
	var l net.Listener
	if backend == "mem" {
		m := bufconn.Listen(1 << 20)
		l = m
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return m.DialContext(ctx)
		}))
	} else {
		var err error
		if l, err = listen(ctx, backend, addr); err != nil {
			b.Fatal(err)
		}
	}
	s := newServer(benchServerOpts()...)
	s.RegisterService(&sinkDesc, sinkServer{})
	go s.Serve(pathLogger{l, b})
	b.Cleanup(s.Stop)
	cc, err := dial(backend, l.Addr().String(), opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	// The first call connects: setting up is not measured.
	if _, err := callEcho(ctx, cc, nil); err != nil {
		b.Fatal(err)
	}
	return cc
}

// benchUnary times unary Echo calls of size bytes on cc.
func benchUnary(b *testing.B, cc *grpc.ClientConn, size int) {
	ctx := context.Background()
	in := wrapperspb.Bytes(make([]byte, size))
	out := new(wrapperspb.BytesValue)
	b.ReportAllocs()
	cpu := cpuTime(b)
	for b.Loop() {
		if err := cc.Invoke(ctx, "/weft.example.Echo/Echo", in, out); err != nil {
			b.Fatal(err)
		}
		if len(out.Value) != size {
			b.Fatalf("%d bytes back, want %d", len(out.Value), size)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	reportCPU(b, cpu)
}

// benchUnaryParallel times unary Echo calls of size bytes on cc from
// clients concurrent callers.
func benchUnaryParallel(b *testing.B, cc *grpc.ClientConn, size, clients int) {
	ctx := context.Background()
	in := wrapperspb.Bytes(make([]byte, size))
	var failed atomic.Value
	b.ReportAllocs()
	// RunParallel runs parallelism x GOMAXPROCS goroutines.
	b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0)))
	cpu := cpuTime(b)
	b.RunParallel(func(pb *testing.PB) {
		out := new(wrapperspb.BytesValue)
		for pb.Next() {
			if err := cc.Invoke(ctx, "/weft.example.Echo/Echo", in, out); err != nil {
				failed.Store(err)
				return
			}
			if len(out.Value) != size {
				failed.Store(fmt.Errorf("%d bytes back, want %d", len(out.Value), size))
				return
			}
		}
	})
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	reportCPU(b, cpu)
}

// benchStream times size-byte messages on one Sink stream: b.N messages,
// then the server's count of the bytes it received.
func benchStream(b *testing.B, cc *grpc.ClientConn, size int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := cc.NewStream(ctx, &sinkDesc.Streams[0], "/weft.bench.Sink/Sink")
	if err != nil {
		b.Fatal(err)
	}
	msg := wrapperspb.Bytes(make([]byte, size))
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpuTime(b)
	for range b.N {
		if err := st.SendMsg(msg); err != nil {
			b.Fatal(err)
		}
	}
	if err := st.CloseSend(); err != nil {
		b.Fatal(err)
	}
	var got wrapperspb.UInt64Value
	if err := st.RecvMsg(&got); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	reportCPU(b, cpu)
	if want := uint64(b.N) * uint64(size); got.Value != want {
		b.Fatalf("server received %d bytes, want %d", got.Value, want)
	}
}

// cpuTime is the CPU time (user and system) the process has used: both
// ends of the connection, and on a busy host a measure of the work per
// operation that other processes' load does not change.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time per operation since start (a cpuTime).
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
}

// sinkServer drains a client stream of BytesValue messages and answers
// with the number of bytes it received.
type sinkServer struct{}

// sinkDesc is the benchmark's service:
//
//	service Sink {
//	  rpc Sink(stream google.protobuf.BytesValue) returns (google.protobuf.UInt64Value);
//	}
var sinkDesc = grpc.ServiceDesc{
	ServiceName: "weft.bench.Sink",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Sink",
		ClientStreams: true,
		Handler: func(_ any, stream grpc.ServerStream) error {
			var n uint64
			var m wrapperspb.BytesValue
			for {
				if err := stream.RecvMsg(&m); err != nil {
					if errors.Is(err, io.EOF) {
						return stream.SendMsg(wrapperspb.UInt64(n))
					}
					return err
				}
				n += uint64(len(m.Value))
			}
		},
	}},
}

// Options of gRPC's transport for BenchmarkGRPC's server and client, the
// same on every transport, to try a setting against the defaults
// (measured on 2026-12-06: neither changed the CPU time per MiB streamed
// over ntb or TCP, which gRPC's own copies dominate).
var (
	benchWindow = flag.Int("window", 0, "BenchmarkGRPC: gRPC's initial stream and connection windows in bytes (0: gRPC's default, a window grown by its BDP estimate)")
	benchBuffer = flag.Int("buffer", 0, "BenchmarkGRPC: gRPC's read and write buffer sizes in bytes (0: gRPC's default, 32 KiB; negative: no buffers)")
)

// benchServerOpts are the server options that -window and -buffer select.
func benchServerOpts() []grpc.ServerOption {
	var o []grpc.ServerOption
	if *benchWindow > 0 {
		o = append(o, grpc.InitialWindowSize(int32(*benchWindow)), grpc.InitialConnWindowSize(int32(*benchWindow)))
	}
	if *benchBuffer != 0 {
		o = append(o, grpc.WriteBufferSize(max(*benchBuffer, 0)), grpc.ReadBufferSize(max(*benchBuffer, 0)))
	}
	return o
}

// benchDialOpts are the client options that -window and -buffer select.
func benchDialOpts() []grpc.DialOption {
	var o []grpc.DialOption
	if *benchWindow > 0 {
		o = append(o, grpc.WithInitialWindowSize(int32(*benchWindow)), grpc.WithInitialConnWindowSize(int32(*benchWindow)))
	}
	if *benchBuffer != 0 {
		o = append(o, grpc.WithWriteBufferSize(max(*benchBuffer, 0)), grpc.WithReadBufferSize(max(*benchBuffer, 0)))
	}
	return o
}

// pathLogger logs the carrier that the backend chose for each connection
// it accepts (fabric.Caps.Path: roce's default link takes a ring or UDP
// per connection), beside the figures it explains.
type pathLogger struct {
	net.Listener
	b *testing.B
}

func (l pathLogger) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if sc, ok := c.(*sock.Conn); ok && sc.Endpoint().Caps().Path != "" {
		l.b.Logf("path %q", sc.Endpoint().Caps().Path)
	}
	return c, err
}
