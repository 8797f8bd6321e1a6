package sock

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
)

// BenchmarkHTTP measures net/http requests per second (a 64-byte
// request body echoed back) with 1 and 16 concurrent clients sharing at
// most 4 kept-alive connections, over ntb and over TCP loopback.
func BenchmarkHTTP(b *testing.B) {
	type setup struct {
		name   string
		listen func(b *testing.B) (net.Listener, func(ctx context.Context, _, _ string) (net.Conn, error))
	}
	setups := []setup{
		{"ntb", func(b *testing.B) (net.Listener, func(ctx context.Context, _, _ string) (net.Conn, error)) {
			l := ntbListen(b, nil)
			return l, func(ctx context.Context, _, _ string) (net.Conn, error) {
				return Dial(ctx, "ntb", l.Addr().String(), nil)
			}
		}},
		{"tcp", func(b *testing.B) (net.Listener, func(ctx context.Context, _, _ string) (net.Conn, error)) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			var d net.Dialer
			return l, func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialContext(ctx, "tcp", l.Addr().String())
			}
		}},
	}
	for _, s := range setups {
		for _, clients := range []int{1, 16} {
			b.Run(s.name+"/clients="+strconv.Itoa(clients), func(b *testing.B) {
				ln, dial := s.listen(b)
				srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					io.Copy(w, r.Body)
				})}
				go srv.Serve(ln)
				defer srv.Close()
				tr := &http.Transport{DialContext: dial, MaxConnsPerHost: 4, MaxIdleConnsPerHost: 4}
				defer tr.CloseIdleConnections()
				client := &http.Client{Transport: tr}
				body := make([]byte, 64)
				var failed atomic.Value
				call := func() bool {
					resp, err := client.Post("http://weft/", "application/octet-stream", bytes.NewReader(body))
					if err != nil {
						failed.Store(err)
						return false
					}
					n, _ := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if n != int64(len(body)) {
						failed.Store(io.ErrShortWrite)
						return false
					}
					return true
				}
				b.ResetTimer()
				if clients == 1 {
					for b.Loop() {
						if !call() {
							break
						}
					}
				} else {
					// RunParallel runs parallelism x GOMAXPROCS goroutines.
					b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0)))
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() && call() {
						}
					})
				}
				b.StopTimer()
				if err, _ := failed.Load().(error); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			})
		}
	}
}
