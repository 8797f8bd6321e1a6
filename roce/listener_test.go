package roce

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/roce/exchange"
	"github.com/weft-io/weft/roce/wire"
)

// testHosts returns two loopback addresses of a /24 of 127/8 picked at
// random, so that the engines of this test do not share their address
// with those of other tests running on the host.
func testHosts() (listen, dial string) {
	a, b := 1+rand.IntN(250), 1+rand.IntN(250)
	return fmt.Sprintf("127.%d.%d.1", a, b), fmt.Sprintf("127.%d.%d.2", a, b)
}

// halfOpen starts a pingpong exchange with a listener and stops after
// part of its address.
func halfOpen(t testing.TB, addr string) func() {
	hostport, _, _ := strings.Cut(addr, "?")
	conn, err := net.Dial("tcp", hostport)
	if err != nil {
		t.Fatalf("half-open dial: %v", err)
	}
	msg := exchange.Dest{QPN: 0x1234, GID: wire.GIDFromAddr(conn.LocalAddr().(*net.TCPAddr).AddrPort().Addr())}.MarshalPingpong()
	if _, err := conn.Write(msg[:20]); err != nil {
		t.Fatalf("half-open write: %v", err)
	}
	return func() { conn.Close() }
}

func TestListener(t *testing.T) {
	host, peer := testHosts()
	fabrictest.TestListener(t, fabrictest.ListenSetup{
		Backend: "roce",
		// 128 endpoints in one process on two shared cores: a QP's
		// retry budget (timeout=14: 67 ms doubling over 7 retries, 8.5 s)
		// outlasts the process's stalls under -race on a loaded host,
		// and waiting callers sleep at once rather than all busy-poll the
		// two engines.
		Addr:     host + ":0?timeout=14",
		Options:  &fabric.Options{Spin: -1},
		Dial:     func(l fabric.Listener, i int) string { return l.Addr() + "?timeout=14&local=" + peer },
		HalfOpen: halfOpen,
	})
}

func TestListenerUDPReceive(t *testing.T) {
	host, peer := testHosts()
	fabrictest.TestListener(t, fabrictest.ListenSetup{
		Backend:  "roce",
		Addr:     host + ":0?raw=0",
		Dial:     func(l fabric.Listener, i int) string { return l.Addr() + "?raw=0&local=" + peer },
		Messages: 2000,
		HalfOpen: halfOpen,
	})
}

func TestConformanceListen(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		return fabrictest.ListenPair(t, "roce", "127.0.0.1:0", nil)
	})
}

func TestConformanceListenUD(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		return fabrictest.ListenPair(t, "roce", "127.0.0.1:0?type=ud", nil)
	})
}

// TestListenerBadHandshakes sends truncated, garbled and forged client
// addresses: each is refused, counted as failed, and a good dial after
// them (and one in the middle of them) works.
func TestListenerBadHandshakes(t *testing.T) {
	host, peer := testHosts()
	l := fabrictest.Listen(t, "roce", host+":0", &fabric.Options{HandshakeTimeout: 2 * time.Second})
	good := exchange.Dest{QPN: 0x4242, PSN: 7, GID: wire.GIDFromAddr(netip.MustParseAddr(peer))}.MarshalPingpong()
	forgedQP := exchange.Dest{QPN: 1, GID: wire.GIDFromAddr(netip.MustParseAddr(peer))}.MarshalPingpong()
	forgedGID := exchange.Dest{QPN: 0x4242}.MarshalPingpong()
	multicast := exchange.Dest{QPN: 0x4242, GID: wire.GIDFromAddr(netip.MustParseAddr("224.0.0.1"))}.MarshalPingpong()
	garbled := good
	garbled[7] = 'z'
	cases := []struct {
		name string
		msg  []byte
		done string
	}{
		{"truncated", good[:30], ""},
		{"garbled", garbled[:], ""},
		{"forged-qpn", forgedQP[:], ""},
		{"forged-gid", forgedGID[:], ""},
		{"multicast-gid", multicast[:], ""},
		{"not-done", good[:], "nope"},
		{"refusal-as-address", func() []byte { m := exchange.MarshalRefusal("x"); return m[:] }(), ""},
	}
	for i, c := range cases {
		conn, err := net.Dial("tcp", l.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		conn.Write(c.msg)
		if c.done != "" {
			var reply [exchange.PingpongMsgSize]byte
			if _, err := conn.Read(reply[:]); err != nil {
				t.Fatalf("%s: no reply: %v", c.name, err)
			}
			conn.Write([]byte(c.done))
		} else if len(c.msg) < exchange.PingpongMsgSize {
			conn.(*net.TCPConn).CloseWrite()
		}
		// The listener drops the connection without answering.
		var b [exchange.PingpongMsgSize]byte
		if n, err := conn.Read(b[:]); c.done == "" && (n != 0 || err == nil) {
			t.Errorf("%s: listener answered %q, %v", c.name, b[:n], err)
		}
		conn.Close()
		deadline := time.Now().Add(5 * time.Second)
		for l.Stats().Failed < uint64(i+1) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if st := l.Stats(); st.Failed != uint64(i+1) {
			t.Fatalf("%s: Stats %+v, want %d failed", c.name, st, i+1)
		}
		if i == 3 {
			pairOver(t, l, peer)
		}
	}
	pairOver(t, l, peer)
	if st := l.Stats(); st.Accepted != 2 || st.Pending != 0 || st.Refused != 0 {
		t.Fatalf("Stats %+v", st)
	}
}

// pairOver dials l, accepts, and moves a message.
func pairOver(t *testing.T, l fabric.Listener, peer string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		ep  fabric.Endpoint
		err error
	}
	ch := make(chan res, 1)
	go func() {
		ep, err := fabric.Open(ctx, "roce", l.Addr()+"?local="+peer, nil)
		ch <- res{ep, err}
	}()
	a, err := l.Accept(ctx)
	r := testenv.Recv(t, ch, "the dial")
	if err != nil || r.err != nil {
		t.Fatalf("accept %v, dial %v", err, r.err)
	}
	defer a.Close()
	defer r.ep.Close()
	ra, _ := a.Alloc(64, fabric.AccessLocalWrite)
	rb, _ := r.ep.Alloc(64, fabric.AccessLocalWrite)
	copy(rb.Bytes(), "hello")
	if _, err := r.ep.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: rb, Length: 5}}}}); err != nil {
		t.Fatal(err)
	}
	m := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(ra)}}}
	if _, err := a.RecvWait(ctx, m); err != nil || string(ra.Bytes()[:m[0].Len]) != "hello" {
		t.Fatalf("RecvWait: %v %q", err, ra.Bytes()[:m[0].Len])
	}
}

// TestDialClosedListener: with nobody listening, a dial without a
// deadline fails with ErrRefused after the dial retry, not never.
func TestDialClosedListener(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	start := time.Now()
	_, err = fabric.Open(testenv.Context(t), "roce", addr+"?dialretry=200ms", nil)
	if !errors.Is(err, fabric.ErrRefused) {
		t.Fatalf("dial of a closed port: %v, want ErrRefused", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("dial of a closed port took %v", d)
	}
}
