package sock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/internal/testenv"
)

// listenBackends are the backends with a fabric listener.
func listenBackends(t *testing.T, f func(t *testing.T, be backend)) {
	for _, be := range backends {
		if be.listen != nil {
			t.Run(be.name, func(t *testing.T) { f(t, be) })
		}
	}
}

func dial(t testing.TB, be backend, l *Listener) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, be.name, l.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestListenerClose: Close wakes a blocked Accept with net.ErrClosed,
// later Accepts fail the same way, a second Close reports net.ErrClosed,
// and connections accepted before stay up.
func TestListenerClose(t *testing.T) {
	listenBackends(t, func(t *testing.T, be backend) {
		l := be.listen(t, nil)
		c := dial(t, be, l)
		var s net.Conn
		var err error
		testenv.Await(t, "the Accept of a dialled connection", func() { s, err = l.Accept() })
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		res := make(chan error, 1)
		go func() {
			c, err := l.Accept()
			if c != nil {
				c.Close()
			}
			res <- err
		}()
		time.Sleep(30 * time.Millisecond)
		if err := l.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		select {
		case err := <-res:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("blocked Accept after Close: %v, want net.ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not wake a blocked Accept")
		}
		if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
		}
		if err := l.Close(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("second Close: %v, want net.ErrClosed", err)
		}
		// The accepted connection outlives its listener.
		go c.Write([]byte("still here"))
		buf := make([]byte, 10)
		testenv.Await(t, "the write to a conn whose listener closed", func() { _, err = io.ReadFull(s, buf) })
		if err != nil || string(buf) != "still here" {
			t.Fatalf("accepted conn after listener Close: %q, %v", buf, err)
		}
	})
}

// TestListenerConcurrentAccept: several goroutines Accept at once while
// as many clients dial; each client is accepted exactly once and talks
// to its own server side.
func TestListenerConcurrentAccept(t *testing.T) {
	listenBackends(t, func(t *testing.T, be backend) {
		const n = 6 // an ntb bridge has 8 queues
		l := be.listen(t, nil)
		var wg sync.WaitGroup
		seen := make(chan string, n)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := l.Accept()
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				buf := make([]byte, 16)
				k, err := c.Read(buf)
				if err != nil {
					t.Error(err)
					return
				}
				seen <- string(buf[:k])
				c.Write(buf[:k])
			}()
		}
		var cwg sync.WaitGroup
		for i := range n {
			cwg.Add(1)
			go func() {
				defer cwg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				c, err := Dial(ctx, be.name, l.Addr().String(), nil)
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				msg := fmt.Sprintf("client-%d", i)
				c.Write([]byte(msg))
				buf := make([]byte, 16)
				k, err := io.ReadAtLeast(c, buf, len(msg))
				if err != nil || string(buf[:k]) != msg {
					t.Errorf("client %d got %q, %v", i, buf[:k], err)
				}
			}()
		}
		testenv.Await(t, "the clients' echoes", cwg.Wait)
		testenv.Await(t, "the servers' Accepts and echoes", wg.Wait)
		close(seen)
		got := map[string]bool{}
		for s := range seen {
			if got[s] {
				t.Errorf("%s accepted twice", s)
			}
			got[s] = true
		}
		if len(got) != n {
			t.Errorf("accepted %d distinct clients, want %d", len(got), n)
		}
	})
}

// TestAddrs: addresses name the backend and the fabric address.
func TestAddrs(t *testing.T) {
	listenBackends(t, func(t *testing.T, be backend) {
		l := be.listen(t, nil)
		if l.Addr().Network() != be.name || l.Addr().String() == "" {
			t.Fatalf("listener Addr %q %q", l.Addr().Network(), l.Addr())
		}
		c := dial(t, be, l)
		var s net.Conn
		var err error
		testenv.Await(t, "the Accept of a dialled connection", func() { s, err = l.Accept() })
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for _, a := range []net.Addr{c.LocalAddr(), c.RemoteAddr(), s.LocalAddr(), s.RemoteAddr()} {
			if a.Network() != be.name || a.String() == "" {
				t.Errorf("conn address %q %q", a.Network(), a)
			}
		}
		path, _, _ := strings.Cut(l.Addr().String(), "?")
		if !strings.HasPrefix(c.RemoteAddr().String(), path) {
			t.Errorf("dialled conn's RemoteAddr %q does not name the bridge %q", c.RemoteAddr(), path)
		}
	})
}
