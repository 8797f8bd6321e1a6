package sock

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
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

// BenchmarkHTTPBodies measures net/http requests per second with request
// bodies of 0 B to 512 KiB (0, 1 KiB, 16 KiB, 128 KiB, 512 KiB in turn),
// echoed back after the handler has read them, from 8 concurrent clients
// over at most 6 kept-alive connections (an ntb bridge has 8 queues, one
// of them the listener's), over ntb, over the roce engine (its default
// link) and over TCP loopback. Besides req/s it reports cpu-ns/op, the
// process's CPU time per request.
func BenchmarkHTTPBodies(b *testing.B) {
	for _, name := range []string{"ntb", "roce", "tcp"} {
		b.Run(name, func(b *testing.B) {
			var ln net.Listener
			var dial func(ctx context.Context, _, _ string) (net.Conn, error)
			if name != "tcp" {
				listen := ntbListen
				if name == "roce" {
					listen = roceListen
				}
				l := listen(b, nil)
				ln = l
				dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
					return Dial(ctx, name, l.Addr().String(), nil)
				}
			} else {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				ln = l
				var d net.Dialer
				dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
					return d.DialContext(ctx, "tcp", l.Addr().String())
				}
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				p, err := io.ReadAll(r.Body)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				w.Write(p)
			})}
			// The carriers the backend chose (fabric.Caps.Path: roce's
			// default link takes a ring or UDP per connection) go in the
			// log, beside the figures they explain.
			var paths sync.Map
			srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
				if sc, ok := c.(*Conn); ok && sc.Endpoint().Caps().Path != "" {
					paths.Store(sc.Endpoint().Caps().Path, true)
				}
				return ctx
			}
			defer paths.Range(func(p, _ any) bool {
				b.Logf("path %q", p)
				return true
			})
			go srv.Serve(ln)
			defer srv.Close()
			tr := &http.Transport{DialContext: dial, MaxConnsPerHost: 6, MaxIdleConnsPerHost: 6}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			sizes := []int{0, 1 << 10, 16 << 10, 128 << 10, 512 << 10}
			body := make([]byte, 512<<10)
			var seq atomic.Int64
			var failed atomic.Value
			b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			cpu := cpuTime(b)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					n := sizes[seq.Add(1)%int64(len(sizes))]
					resp, err := client.Post("http://weft/", "application/octet-stream", bytes.NewReader(body[:n]))
					if err != nil {
						failed.Store(err)
						return
					}
					got, _ := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if got != int64(n) {
						failed.Store(io.ErrShortWrite)
						return
					}
				}
			})
			b.StopTimer()
			if err, _ := failed.Load().(error); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			// The CPU time of the process (both ends) per request: the
			// work of a transport, which other processes' load on a
			// shared host changes far less than the rate.
			b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
