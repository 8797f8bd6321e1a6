package sock

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-io/weft/internal/testenv"
)

var httpRequests = flag.Int("http.requests", 0, "requests of TestHTTP per backend (0: 1000, 250 under -race, 200 with -short, a tenth of that over roce; the issue's acceptance run is 10000)")

// corpus is the source of request and response bodies: body (seed, n)
// is corpus[seed%len : +n], so every byte can be checked cheaply.
var corpus = pattern(12, 4<<20)

func body(seed uint64, n int) []byte {
	off := int(seed % uint64(len(corpus)-n+1))
	return corpus[off : off+n]
}

// bodySize draws a size between 0 and 1 MiB, log-uniformly, with both
// ends included now and then.
func bodySize(r *rand.Rand) int {
	switch r.IntN(20) {
	case 0:
		return 0
	case 1:
		return 1 << 20
	}
	return int(r.Float64() * float64(int(1)<<r.IntN(21)))
}

// pairListener is a net.Listener that hands out the accepting sides of
// connections made beforehand, for backends without a fabric listener
// yet; dial hands out the other sides in order.
type pairListener struct {
	conns  chan net.Conn
	peers  chan net.Conn
	addr   net.Addr
	closed chan struct{}
	once   sync.Once
}

func newPairListener(t testing.TB, be backend, n int) *pairListener {
	l := &pairListener{conns: make(chan net.Conn, n), peers: make(chan net.Conn, n), closed: make(chan struct{})}
	for range n {
		a, b := connPair(t, be, nil)
		l.conns <- a
		l.peers <- b
		l.addr = a.LocalAddr()
	}
	return l
}

func (l *pairListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pairListener) Close() error   { l.once.Do(func() { close(l.closed) }); return nil }
func (l *pairListener) Addr() net.Addr { return l.addr }

func (l *pairListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	select {
	case c := <-l.peers:
		return c, nil
	default:
		return nil, errors.New("pairListener: out of connections")
	}
}

// TestHTTP runs a net/http server and client over each backend: many
// requests with bodies of 0 B to 1 MiB both ways, every byte checked by
// the server (request) and the client (response), over a few kept-alive
// connections used concurrently.
func TestHTTP(t *testing.T) {
	forEach(t, func(t *testing.T, be backend) {
		requests := *httpRequests
		if requests == 0 {
			requests = 1000
			if raceEnabled {
				requests = 250
			}
			if testing.Short() {
				requests = 200
			}
		}
		if be.name == "roce" && *httpRequests == 0 {
			requests /= 10 // the user-space engine moves tens of MB/s here
		}
		// The client keeps conns connections, but net/http drops one
		// whose request write it has not seen finish within 50 ms of the
		// response (a loaded machine under -race gets there) and dials
		// again: spares are needed. An ntb bridge carries 8 connections
		// in its lifetime (one per queue), so the server listens on
		// several bridges and the client dials them in turn.
		const conns, spares = 4, 12
		var lns []net.Listener
		var dial func(ctx context.Context, network, addr string) (net.Conn, error)
		if be.listen != nil {
			var ls []*Listener
			for range (conns + spares + 7) / 8 {
				l := be.listen(t, nil)
				ls, lns = append(ls, l), append(lns, l)
			}
			var dials atomic.Int64
			dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
				l := ls[int(dials.Add(1)-1)%len(ls)]
				return Dial(ctx, be.name, l.Addr().String(), nil)
			}
		} else {
			pl := newPairListener(t, be, conns+spares)
			lns, dial = []net.Listener{pl}, pl.dial
		}
		var served atomic.Int64
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seed, _ := strconv.ParseUint(r.URL.Query().Get("seed"), 10, 64)
			n, _ := strconv.Atoi(r.URL.Query().Get("n"))
			got, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if !bytes.Equal(got, body(seed, n)) {
				http.Error(w, "request body corrupt: "+firstDiff(got, body(seed, n)), http.StatusBadRequest)
				return
			}
			served.Add(1)
			w.Header().Set("Content-Length", strconv.Itoa(n))
			w.Write(body(seed+1, n))
		})}
		for _, ln := range lns {
			go srv.Serve(ln)
		}
		defer srv.Close()
		var dialed atomic.Int64
		countDials := dial
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			dialed.Add(1)
			return countDials(ctx, network, addr)
		}
		tr := &http.Transport{DialContext: dial, MaxConnsPerHost: conns, MaxIdleConnsPerHost: conns, DisableCompression: true}
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: tr, Timeout: time.Minute}

		start := time.Now()
		var next atomic.Int64
		var bytesMoved atomic.Int64
		errs := make(chan error, 2*conns)
		var wg sync.WaitGroup
		for w := range 2 * conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(w), 99))
				for {
					i := next.Add(1) - 1
					if i >= int64(requests) {
						return
					}
					n := bodySize(r)
					seed := r.Uint64()
					url := fmt.Sprintf("http://weft/echo?seed=%d&n=%d", seed, n)
					resp, err := client.Post(url, "application/octet-stream", bytes.NewReader(body(seed, n)))
					if err != nil {
						errs <- fmt.Errorf("request %d (%d bytes): %w", i, n, err)
						return
					}
					got, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					switch {
					case err != nil:
						errs <- fmt.Errorf("request %d: reading the response: %w", i, err)
						return
					case resp.StatusCode != http.StatusOK:
						errs <- fmt.Errorf("request %d: %s: %s", i, resp.Status, got)
						return
					case !bytes.Equal(got, body(seed+1, n)):
						errs <- fmt.Errorf("request %d: response body corrupt: %s", i, firstDiff(got, body(seed+1, n)))
						return
					}
					bytesMoved.Add(2 * int64(n))
				}
			}()
		}
		testenv.Await(t, "the clients' requests", wg.Wait)
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if got := served.Load(); got != int64(requests) && !t.Failed() {
			t.Errorf("server checked %d requests, want %d", got, requests)
		}
		d := time.Since(start)
		t.Logf("%d requests, %d MB checked both ways, in %v (%.0f req/s) over %d connections", requests, bytesMoved.Load()>>20, d.Round(time.Millisecond), float64(requests)/d.Seconds(), dialed.Load())
	})
}
