package exchange

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/wire"
)

// The two ends' addresses in the tests' Dests.
var (
	serverAddr = netip.MustParseAddr("127.0.0.1")
	clientAddr = netip.MustParseAddr("127.0.0.2")
)

// The pingpong exchange against a hostile client or server (issue 29):
// each field of the address message, and each step a peer can skip.

// TestParsePingpongFields: each of the four fields at its limit and past
// it, and each with a character its base does not have.
func TestParsePingpongFields(t *testing.T) {
	gid := strings.Repeat("0", 20) + "ffff0a010203"
	for _, c := range []struct {
		msg string
		ok  bool
	}{
		{"0000:000002:000000:" + gid, true},
		{"ffff:ffffff:ffffff:" + gid, true},
		{"10000:000002:000000:" + gid, false}, // LID past 16 bits
		{"0000:1000000:000000:" + gid, false}, // QPN past 24 bits
		{"0000:000002:1000000:" + gid, false}, // PSN past 24 bits
		{"000g:000002:000000:" + gid, false},
		{"0000:00000g:000000:" + gid, false},
		{"0000:000002:00000g:" + gid, false},
		{"0000:000002:000000:" + gid[:31] + "g", false}, // the GID is not hex
		{"0000:000002:000000:" + gid[:31], false},       // 31 digits
		{"0000:000002:000000:" + gid + "0", false},      // 33 digits
		{"0000:000002:000000", false},
		{"0000:000002:000000:" + gid + ":0", false},
	} {
		d, err := ParsePingpong([]byte(c.msg + "\x00"))
		if (err == nil) != c.ok {
			t.Errorf("%q: %v, want ok %v", c.msg, err, c.ok)
			continue
		}
		if err != nil && !errors.Is(err, fabric.ErrMalformed) {
			t.Errorf("%q: %v does not match ErrMalformed", c.msg, err)
		}
		if err == nil && d.GID.Addr() != netip.MustParseAddr("10.1.2.3") {
			t.Errorf("%q: GID %v", c.msg, d.GID.Addr())
		}
	}
}

// TestExchangeServerHostile: a server never calls connect for a client
// message it cannot parse, and fails when the client does not say
// "done".
func TestExchangeServerHostile(t *testing.T) {
	local := Dest{QPN: 0x100, PSN: 5, GID: wire.GIDFromAddr(serverAddr)}
	client := Dest{QPN: 0x200, PSN: 6, GID: wire.GIDFromAddr(clientAddr)}
	for _, c := range []struct {
		name    string
		play    func(conn net.Conn) // the client's side
		connect bool                // the server calls connect
		want    error               // what the error matches
	}{
		{"garbage", func(conn net.Conn) {
			var b [PingpongMsgSize]byte
			copy(b[:], "hello, server")
			conn.Write(b[:])
		}, false, fabric.ErrMalformed},
		{"a short message", func(conn net.Conn) {
			m := client.MarshalPingpong()
			conn.Write(m[:PingpongMsgSize-1])
			conn.Close()
		}, false, fabric.ErrMalformed},
		{"no done", func(conn net.Conn) {
			m := client.MarshalPingpong()
			conn.Write(m[:])
			var in [PingpongMsgSize]byte
			io.ReadFull(conn, in[:])
			conn.Close()
		}, true, io.EOF},
		{"not done", func(conn net.Conn) {
			m := client.MarshalPingpong()
			conn.Write(m[:])
			var in [PingpongMsgSize]byte
			io.ReadFull(conn, in[:])
			conn.Write([]byte("nope\x00"))
		}, true, fabric.ErrMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, cli := net.Pipe()
			defer srv.Close()
			defer cli.Close()
			go c.play(cli)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			called := false
			_, err := Server(ctx, srv, local, func(d Dest) error {
				called = true
				if d != client {
					t.Errorf("connect to %+v, want %+v", d, client)
				}
				return nil
			})
			if !errors.Is(err, c.want) || ctx.Err() != nil {
				t.Fatalf("ExchangeServer: %v (context %v), want %v", err, ctx.Err(), c.want)
			}
			if called != c.connect {
				t.Fatalf("connect called %v, want %v", called, c.connect)
			}
		})
	}
}

// TestExchangeClientHostile: a client never calls connect for a server
// message it cannot parse.
func TestExchangeClientHostile(t *testing.T) {
	local := Dest{QPN: 0x100, PSN: 5, GID: wire.GIDFromAddr(serverAddr)}
	for _, reply := range []string{"garbage", "short"} {
		srv, cli := net.Pipe()
		go func() {
			var in [PingpongMsgSize]byte
			io.ReadFull(srv, in[:])
			var b [PingpongMsgSize]byte
			copy(b[:], "0000:000002:000000:zz")
			if reply == "short" {
				srv.Write(b[:10])
				srv.Close()
				return
			}
			srv.Write(b[:])
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := Client(ctx, cli, local, func(Dest) error {
			t.Errorf("%s: connect called", reply)
			return nil
		})
		cancel()
		if err == nil {
			t.Errorf("%s: ExchangeClient took the server's reply", reply)
		}
		cli.Close()
		srv.Close()
	}
}

// TestPerftestPreambleHostile: the perftest preamble against a peer that
// proposes each MTU code, from one below the smallest to one above the
// largest, and versions at and below the oldest taken.
func TestPerftestPreambleHostile(t *testing.T) {
	for _, c := range []struct {
		version string
		mtuCode byte
		want    int // the agreed MTU; 0: the preamble fails
	}{
		{"5.70", '0', 1024},
		{"5.70", '1', 256},
		{"5.70", '2', 512},
		{"5.70", '3', 1024},
		{"5.70", '4', 1024},
		{"5.70", '5', 1024},
		{"5.70", '6', 1024},
		{"6.10", '2', 512},
		{"5.69", '3', 0},
		{"perftest", '3', 0},
	} {
		srv, cli := net.Pipe()
		go func() {
			defer srv.Close()
			var v [16]byte
			if _, err := io.ReadFull(srv, v[:]); err != nil {
				return
			}
			copy(v[:], c.version+"\x00\x00\x00\x00")
			srv.Write(v[:])
			for _, n := range []int{4, 4} {
				b := make([]byte, n)
				if _, err := io.ReadFull(srv, b); err != nil {
					return
				}
				srv.Write(b)
			}
			var m [2]byte
			if _, err := io.ReadFull(srv, m[:]); err != nil {
				return
			}
			srv.Write([]byte{c.mtuCode, 0})
		}()
		pc := NewPerftestConn(cli, true)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := pc.Preamble(ctx, 1024)
		cancel()
		cli.Close()
		switch {
		case c.want == 0 && err == nil:
			t.Errorf("peer version %q taken", c.version)
		case c.want != 0 && (err != nil || pc.MTU != c.want):
			t.Errorf("version %q, MTU code %c: %v, MTU %d; want %d", c.version, c.mtuCode, err, pc.MTU, c.want)
		}
	}
}

func TestRefusalMessage(t *testing.T) {
	m := MarshalRefusal("backlog full")
	_, err := ParsePingpong(m[:])
	var re *fabric.RefusedError
	if !errors.As(err, &re) || re.Reason != "backlog full" || !errors.Is(err, fabric.ErrRefused) {
		t.Fatalf("ParsePingpong(refusal) = %v", err)
	}
	if errors.Is(err, fabric.ErrMalformed) {
		t.Fatal("a refusal reads as malformed")
	}
}

// FuzzParsePingpong: whatever a peer sends, the parser returns an
// address that survives a round trip, a refusal, or ErrMalformed, and
// never panics.
func FuzzParsePingpong(f *testing.F) {
	good := Dest{LID: 1, QPN: 0x123456, PSN: 0xabcdef, GID: wire.GIDFromAddr(netip.MustParseAddr("10.1.2.3"))}.MarshalPingpong()
	ref := MarshalRefusal("backlog full")
	f.Add(good[:])
	f.Add(ref[:])
	f.Add([]byte("0000:000000:000000:"))
	f.Add([]byte("zzzz:qqqqqq:pppppp:00000000000000000000000000000000\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParsePingpong(b)
		if err != nil {
			if !errors.Is(err, fabric.ErrMalformed) && !errors.Is(err, fabric.ErrRefused) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		m := d.MarshalPingpong()
		d2, err := ParsePingpong(m[:])
		if err != nil || d2 != d {
			t.Fatalf("round trip %+v -> %q -> %+v, %v", d, m, d2, err)
		}
		_ = CheckPeer(d)
	})
}
