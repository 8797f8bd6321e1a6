package sock

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"

	"github.com/weft-io/weft/internal/testenv"
)

// pattern returns n bytes of a stream position-dependent pattern.
func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestStream sends a stream each way at once in writes of random sizes,
// through a window of 4 KiB (the smallest) and the default one, and
// checks every byte.
func TestStream(t *testing.T) {
	forEach(t, func(t *testing.T, be backend) {
		for _, tc := range []struct {
			name string
			cfg  Config
		}{
			{"window4K", Config{Window: 4096, MaxWindow: -1}},
			{"grow4K", Config{Window: 4096, MaxWindow: 64 << 10}},
			{"default", Config{}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				a, b := connPair(t, be, &tc.cfg)
				size := 4 << 20
				if testing.Short() || raceEnabled {
					size = 1 << 20
				}
				var wg sync.WaitGroup
				errs := make(chan error, 4)
				for i, c := range []*Conn{a, b} {
					data := pattern(uint64(i+1), size)
					wg.Add(2)
					go func() {
						defer wg.Done()
						r := rand.New(rand.NewPCG(uint64(i), 7))
						for off := 0; off < len(data); {
							n := min(len(data)-off, 1+r.IntN(200<<10))
							if r.IntN(4) == 0 {
								n = min(n, 1+r.IntN(64))
							}
							if _, err := c.Write(data[off : off+n]); err != nil {
								errs <- err
								return
							}
							off += n
						}
						if err := c.CloseWrite(); err != nil {
							errs <- err
						}
					}()
					go func() {
						defer wg.Done()
						peer := []*Conn{b, a}[i]
						got, err := io.ReadAll(peer)
						if err != nil {
							errs <- err
							return
						}
						if !bytes.Equal(got, data) {
							errs <- errors.New("stream corrupt: " + firstDiff(got, data))
						}
					}()
				}
				testenv.Await(t, "the writers and readers of both streams", wg.Wait)
				close(errs)
				for err := range errs {
					t.Error(err)
				}
			})
		}
	})
}

// TestStreamMixed alternates writes that fill every send slot, writes
// of about a frame and small ones, to a reader that takes little at a time, and checks every
// byte: a small frame must not reuse a slot whose frame is still in
// flight (where the endpoint sends large frames from the slot itself).
func TestStreamMixed(t *testing.T) {
	// Over roce's UDP link too: through a ring (the default between two
	// engines of a host) the engine sends a frame's packets at once, and
	// a slot overwritten later goes unseen; over UDP it reads the slot
	// again as its window opens (and for retransmissions).
	udp := backend{name: "roce-udp", pair: func(t testing.TB, o *fabric.Options) (fabric.Endpoint, fabric.Endpoint) {
		return rocePair(t, o, "link=udp")
	}}
	t.Run(udp.name, func(t *testing.T) { streamMixed(t, udp) })
	forEach(t, streamMixed)
}

// streamMixed writes a stream of large, slot-sized and small Writes over
// be and checks it whole.
func streamMixed(t *testing.T, be backend) {
	// A window above the send slots: the writer seldom waits for
	// credit, and so for the frames before to complete.
	a, b := connPair(t, be, &Config{Window: 4 << 20})
	size := 8 << 20
	if testing.Short() || raceEnabled {
		size = 2 << 20
	}
	data := pattern(3, size)
	errs := make(chan error, 1)
	go func() {
		big := b.slots * b.maxData
		for off, i := 0, 0; off < len(data); i++ {
			n := min(len(data)-off, big)
			switch i % 3 {
			case 1: // a frame queued behind a full ring
				n = min(n, b.maxData-i%7)
			case 2:
				n = min(n, 1+i%100)
			}
			if _, err := b.Write(data[off : off+n]); err != nil {
				errs <- err
				return
			}
			off += n
		}
		errs <- b.CloseWrite()
	}()
	got := make([]byte, 0, size)
	buf := make([]byte, 3000)
	var err error
	testenv.Await(t, "the mixed stream", func() {
		for {
			var n int
			n, err = a.Read(buf[:1+len(got)%len(buf)])
			got = append(got, buf[:n]...)
			if err != nil {
				return
			}
		}
	})
	if err != io.EOF {
		t.Fatal(err)
	}
	if err := testenv.Recv(t, errs, "the writer"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("stream corrupt: " + firstDiff(got, data))
	}
}

func firstDiff(got, want []byte) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return "first difference at byte " + itoa(i)
		}
	}
	return "length " + itoa(len(got)) + ", want " + itoa(len(want))
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestHalfClose: after CloseWrite the peer reads what was written, then
// io.EOF, and can still answer.
func TestHalfClose(t *testing.T) {
	forEach(t, func(t *testing.T, be backend) {
		a, b := connPair(t, be, nil)
		if _, err := b.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		if err := b.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if err := b.CloseWrite(); err != nil {
			t.Fatalf("second CloseWrite: %v", err)
		}
		if _, err := b.Write([]byte("x")); !errors.Is(err, ErrWriteClosed) {
			t.Fatalf("Write after CloseWrite: %v, want ErrWriteClosed", err)
		}
		var got []byte
		var err error
		testenv.Await(t, "the request and its EOF", func() { got, err = io.ReadAll(a) })
		if err != nil || string(got) != "request" {
			t.Fatalf("ReadAll = %q, %v", got, err)
		}
		if n, err := a.Read(make([]byte, 8)); n != 0 || err != io.EOF {
			t.Fatalf("Read after EOF = %d, %v", n, err)
		}
		if _, err := a.Write([]byte("response")); err != nil {
			t.Fatal(err)
		}
		a.Close()
		testenv.Await(t, "the answer and its EOF", func() { got, err = io.ReadAll(b) })
		if err != nil || string(got) != "response" {
			t.Fatalf("answer after half-close: %q, %v", got, err)
		}
	})
}

// TestPeerClose: the peer's Close delivers what it wrote, then io.EOF;
// writing to a closed peer fails with ErrPeerClosed; a closed Conn
// reports net.ErrClosed.
func TestPeerClose(t *testing.T) {
	forEach(t, func(t *testing.T, be backend) {
		a, b := connPair(t, be, nil)
		data := pattern(3, 300<<10) // more than one window: Close waits for nothing
		go func() {
			b.Write(data)
			b.Close()
		}()
		var got []byte
		var err error
		testenv.Await(t, "the data and the EOF of the peer's Close", func() { got, err = io.ReadAll(a) })
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("ReadAll after peer Close: %d bytes, %v", len(got), err)
		}
		if _, err := a.Write([]byte("anyone?")); !errors.Is(err, ErrPeerClosed) {
			t.Fatalf("Write to a closed peer: %v, want ErrPeerClosed", err)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		for _, err := range []error{
			func() error { _, err := a.Read(make([]byte, 1)); return err }(),
			func() error { _, err := a.Write([]byte("x")); return err }(),
			a.Close(), a.SetDeadline(time.Now()), a.CloseWrite(),
		} {
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("after Close: %v, want net.ErrClosed", err)
			}
		}
	})
}

// TestWindowGrows: a window too small for the stream doubles while the
// writer runs out of credit and the reader keeps up, up to MaxWindow and
// no further, on both ends' books (the receiver's ring, the sender's
// view of the peer's window).
func TestWindowGrows(t *testing.T) {
	forEach(t, func(t *testing.T, be backend) {
		const window, maxWin = 16 << 10, 48 << 10 // 48: the last doubling is cut short
		a, b := connPair(t, be, &Config{Window: window, MaxWindow: maxWin})
		data := pattern(3, 1<<20)
		errs := make(chan error, 1)
		go func() { _, err := b.Write(data); errs <- err }()
		got := make([]byte, len(data))
		var err error
		testenv.Await(t, "1 MiB through a 16 KiB window", func() { _, err = io.ReadFull(a, got) })
		if err != nil {
			t.Fatal(err)
		}
		if err := testenv.Recv(t, errs, "the Write"); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatal("the stream arrived corrupted")
		}
		a.mu.Lock()
		ring := len(a.rbuf)
		a.mu.Unlock()
		b.mu.Lock()
		peer := b.peerWindow
		b.mu.Unlock()
		if ring != maxWin || peer != maxWin {
			t.Fatalf("after 1 MiB: receive ring %d bytes, the sender's view of its window %d; want both %d (MaxWindow)", ring, peer, maxWin)
		}
	})
}

// TestWriteBufferReuse: once Write returns, the caller's buffer is its
// own again, whatever path the Write took (a large Write goes from the
// caller's buffer on backends that copy at once, Conn.zc): rewriting it
// at once, and writing from several slices of one buffer and then from
// another buffer, changes nothing the reader gets.
func TestWriteBufferReuse(t *testing.T) {
	forEach(t, func(t *testing.T, be backend) {
		a, b := connPair(t, be, nil)
		const size = 1 << 20
		buf := make([]byte, 2*size)
		other := make([]byte, size)
		var want []byte
		done := make(chan error, 1)
		go func() {
			for i := range 4 {
				src := buf[i%2*size/2:][:size] // two slices of buf, at offsets
				if i == 3 {
					src = other
				}
				copy(src, pattern(uint64(10+i), size))
				want = append(want, src...)
				if _, err := b.Write(src); err != nil {
					done <- err
					return
				}
				clear(src) // the buffer is the caller's again
			}
			done <- nil
		}()
		got := make([]byte, 4*size)
		var err error
		testenv.Await(t, "4 MiB from reused buffers", func() { _, err = io.ReadFull(a, got) })
		if err != nil {
			t.Fatal(err)
		}
		if err := testenv.Recv(t, done, "the Writes"); err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			if !bytes.Equal(got[i*size:][:size], want[i*size:][:size]) {
				t.Fatalf("Write %d arrived changed", i)
			}
		}
	})
}

// TestBoundedMemory: a peer that does not read holds the writer to the
// receive window.
func TestBoundedMemory(t *testing.T) {
	forEach(t, func(t *testing.T, be backend) {
		const window = 64 << 10
		a, b := connPair(t, be, &Config{Window: window})
		b.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
		var n int
		var err error
		testenv.Await(t, "a Write past the window to end at its 300ms deadline", func() { n, err = b.Write(make([]byte, 1<<20)) })
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Write to a peer that does not read: %d, %v; want a timeout", n, err)
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("%v is not a net.Error with Timeout", err)
		}
		if n != window {
			t.Fatalf("wrote %d bytes before blocking, want the window of %d", n, window)
		}
		a.mu.Lock()
		buffered := a.rlen
		a.mu.Unlock()
		if buffered > window {
			t.Fatalf("receiver buffers %d bytes, window %d", buffered, window)
		}
		// Reading frees credit and the rest flows.
		b.SetWriteDeadline(time.Time{})
		go b.Write(make([]byte, 100<<10))
		testenv.Await(t, "the window and the 100 KiB written once it was read", func() { _, err = io.ReadFull(a, make([]byte, window+100<<10)) })
		if err != nil {
			t.Fatal(err)
		}
	})
}

// TestDeadlineMoved: a deadline set while Read or Write blocks wakes it
// when it passes; one moved later while the call blocks lets it finish.
func TestDeadlineMoved(t *testing.T) {
	forEach(t, func(t *testing.T, be backend) {
		for _, op := range []string{"read", "write"} {
			t.Run(op, func(t *testing.T) {
				a, b := connPair(t, be, &Config{Window: 4096})
				// call blocks: a Read with nothing sent, or a Write with
				// the peer's window used up.
				call, set := func() error { _, err := a.Read(make([]byte, 1)); return err }, a.SetReadDeadline
				unblock := func() { b.Write([]byte("x")) }
				if op == "write" {
					if _, err := b.Write(make([]byte, 4096)); err != nil {
						t.Fatal(err)
					}
					call, set = func() error { _, err := b.Write([]byte("x")); return err }, b.SetWriteDeadline
					unblock = func() { io.ReadFull(a, make([]byte, 4096)) }
				}
				// An earlier deadline set while blocked fires.
				set(time.Now().Add(time.Hour))
				res := make(chan error, 1)
				start := time.Now()
				go func() { res <- call() }()
				time.Sleep(50 * time.Millisecond)
				set(time.Now().Add(100 * time.Millisecond))
				select {
				case err := <-res:
					var ne net.Error
					if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
						t.Fatalf("%v, want a timeout", err)
					}
					if d := time.Since(start); d < 140*time.Millisecond {
						t.Fatalf("timed out after %v, before its deadline", d)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("blocked past a deadline set while it waited")
				}
				// A deadline moved later while blocked does not fire.
				set(time.Now().Add(100 * time.Millisecond))
				go func() { res <- call() }()
				time.Sleep(20 * time.Millisecond)
				set(time.Now().Add(time.Hour))
				time.Sleep(200 * time.Millisecond)
				unblock()
				select {
				case err := <-res:
					if err != nil {
						t.Fatalf("after the deadline moved later: %v", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("did not complete once unblocked")
				}
			})
		}
	})
}

// gatedData is an endpoint that, once armed, holds the caller of the
// first DATA frame it has sent until gate closes: a test lets the peer
// close after the frame went out and before the Write looks again.
type gatedData struct {
	fabric.Endpoint
	armed   atomic.Bool
	holding chan struct{} // a sent DATA frame's caller waits at the gate
	gate    chan struct{}
}

func (g *gatedData) hold(msgs []fabric.Message, n int) {
	if n == 0 || !g.armed.Load() || len(msgs[0].SGEs) == 0 {
		return
	}
	if b := msgs[0].SGEs[0].Bytes(); len(b) > 0 && b[0] == frameData {
		g.armed.Store(false)
		close(g.holding)
		<-g.gate
	}
}

func (g *gatedData) Send(msgs []fabric.Message) (int, error) {
	n, err := g.Endpoint.Send(msgs)
	g.hold(msgs, n)
	return n, err
}

func (g *gatedData) SendWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	n, err := g.Endpoint.SendWait(ctx, msgs)
	g.hold(msgs, n)
	return n, err
}

// TestWriteDoneBeforePeerClose: a Write whose every byte went out
// returns them all and no error, though the peer's close arrived before
// the Write looked again, as a TCP write does. (net/http closes a
// connection, and fails its request, on a Write error.)
func TestWriteDoneBeforePeerClose(t *testing.T) {
	ea, eb := ntbPair(t, nil)
	g := &gatedData{Endpoint: eb, holding: make(chan struct{}), gate: make(chan struct{})}
	a, err := NewConn(ea, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewConn(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	g.armed.Store(true)
	type res struct {
		n   int
		err error
	}
	wrote := make(chan res, 1)
	go func() {
		n, err := b.Write([]byte("request"))
		wrote <- res{n, err}
	}()
	testenv.Recv(t, g.holding, "the Write's DATA frame sent")
	a.Close()
	// b's reader takes the peer's close (CLOSE, or RST for the unread
	// request) while the Write is held after its frame went out.
	if _, err := io.ReadAll(b); err == nil {
		// EOF: the close arrived.
	} else if !errors.Is(err, fabric.ErrPeerGone) && !errors.Is(err, ErrReset) {
		t.Fatalf("reading the closed peer: %v", err)
	}
	close(g.gate)
	if r := testenv.Recv(t, wrote, "the Write"); r.n != len("request") || r.err != nil {
		t.Fatalf("Write = %d, %v; want %d, nil", r.n, r.err, len("request"))
	}
}

// TestConfigBounds: windows are rounded up to 4 KiB within [4 KiB,
// 1 GiB]; one asked for beyond 1 GiB, however large, is 1 GiB (rounding
// must not overflow it to the smallest), and MaxWindow is at least
// Window.
func TestConfigBounds(t *testing.T) {
	for _, tc := range []struct {
		window, maxWin         int
		wantWindow, wantMaxWin int
	}{
		{0, 0, DefaultWindow, DefaultMaxWindow},
		{1, -1, minWindow, minWindow},
		{5000, 9000, 8192, 12288},
		{64 << 10, 16 << 10, 64 << 10, 64 << 10},
		{maxWindow + 1, 0, maxWindow, maxWindow},
		{64 << 10, math.MaxInt, 64 << 10, maxWindow},
		{math.MaxInt, 0, maxWindow, maxWindow},
		{math.MaxInt - 100, math.MaxInt - 4000, maxWindow, maxWindow},
	} {
		r := (&Config{Window: tc.window, MaxWindow: tc.maxWin}).resolve()
		if r.Window != tc.wantWindow || r.MaxWindow != tc.wantMaxWin {
			t.Errorf("Window %d, MaxWindow %d: resolved to %d, %d; want %d, %d",
				tc.window, tc.maxWin, r.Window, r.MaxWindow, tc.wantWindow, tc.wantMaxWin)
		}
	}
}
