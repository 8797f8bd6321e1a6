package ethernet

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/weft-io/weft/fabric"
)

func handshakeSeed(typ uint8, session, dst uint32, nonce, echo uint64) []byte {
	b := make([]byte, hdrLen+helloLen)
	putHdr(b, &hdr{typ: typ, session: session, dst: dst, ack: 7, wnd: 16})
	putHello(b[hdrLen:], nonce, echo)
	return b
}

// FuzzHandshake: the handshake parser never panics, refuses with a
// handshake's *fabric.MalformedError matching fabric.ErrMalformed, and what it accepts is a
// well-formed handshake that re-encodes to the same bytes.
func FuzzHandshake(f *testing.F) {
	f.Add(handshakeSeed(ptHello, 1, 0, 2, 0))
	f.Add(handshakeSeed(ptHelloAck, 1, 3, 2, 4))
	f.Add(handshakeSeed(ptRefuse, 1, 3, 2, 4))
	f.Add(handshakeSeed(ptRefuse, 1, 0, 2, 4))
	f.Add(handshakeSeed(ptData, 1, 3, 2, 4))
	f.Add(handshakeSeed(ptHello, 0, 0, 2, 0))
	f.Add(handshakeSeed(ptHello, 1, 0, 0, 0))
	f.Add(handshakeSeed(ptHello, 1, 0, 2, 0)[:hdrLen+3])
	f.Add([]byte{hdrMagic, hdrVersion})
	badVersion := handshakeSeed(ptHello, 1, 0, 2, 0)
	badVersion[1] = hdrVersion + 1
	f.Add(badVersion)
	f.Fuzz(func(t *testing.T, b []byte) {
		var m handshakeMsg
		err := parseHandshake(b, &m)
		if err == nil && !header(b).IsValid() {
			t.Fatalf("accepted %x, whose header is not valid", b)
		}
		if err != nil {
			var he *fabric.MalformedError
			if !errors.As(err, &he) || he.Where != hsWhere || !errors.Is(err, fabric.ErrMalformed) {
				t.Fatalf("error %v is not a handshake's MalformedError matching ErrMalformed", err)
			}
			return
		}
		if len(b) < hdrLen+helloLen || m.session == 0 || m.nonce == 0 {
			t.Fatalf("accepted %x as %+v", b, m)
		}
		if m.typ != ptHello && m.typ != ptHelloAck && m.typ != ptRefuse {
			t.Fatalf("accepted type %d", m.typ)
		}
		if m.typ != ptHello && m.echo == 0 {
			t.Fatalf("accepted a %d without an echo", m.typ)
		}
		if m.typ == ptRefuse && m.dst == 0 {
			t.Fatal("accepted a refusal that names no connection")
		}
		h := header(b)
		re := make([]byte, hdrLen+helloLen)
		putHdr(re, &hdr{typ: m.typ, flags: h.flags(), session: m.session, psn: h.psn(), ack: m.ack, wnd: m.wnd, imm: h.imm(), dst: m.dst})
		putHello(re[hdrLen:], m.nonce, m.echo)
		if !bytes.Equal(re, b[:hdrLen+helloLen]) {
			t.Fatalf("re-encoded %x, parsed %x", re, b[:hdrLen+helloLen])
		}
	})
}

// FuzzHeader: the header view and getHdr agree, never panic, and
// round-trip.
func FuzzHeader(f *testing.F) {
	f.Add(handshakeSeed(ptData, 1, 3, 2, 4)[:hdrLen])
	f.Add([]byte{hdrMagic, hdrVersion, ptFin, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var h hdr
		ok := getHdr(b, &h)
		if ok != header(b).IsValid() {
			t.Fatalf("getHdr %v, IsValid %v", ok, header(b).IsValid())
		}
		if !ok {
			return
		}
		re := make([]byte, hdrLen)
		putHdr(re, &h)
		if !bytes.Equal(re, b[:hdrLen]) {
			t.Fatalf("round trip %x != %x", re, b[:hdrLen])
		}
	})
}

// FuzzDemux feeds arbitrary frames to a queue's demultiplexer with one
// connection and a listener attached: nothing panics, a frame reaches
// the connection only if it names its id, and only hellos reach the
// listener.
func FuzzDemux(f *testing.F) {
	mac := [6]byte{2, 0, 0, 0, 0, 1}
	frame := func(w []byte) []byte {
		b := make([]byte, EthHdrLen+len(w))
		PutEthernet(b, mac[:], []byte{2, 0, 0, 0, 0, 2}, EtherTypeWeft)
		copy(b[EthHdrLen:], w)
		return b
	}
	f.Add(frame(handshakeSeed(ptHello, 1, 0, 2, 0)))
	f.Add(frame(handshakeSeed(ptData, 1, 77, 2, 0)))
	f.Add(frame(handshakeSeed(ptAck, 1, 78, 2, 0)))
	f.Add(frame(handshakeSeed(ptAck, 1, 0, 2, 0)))
	f.Add(frame(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		m := &mux{conns: map[uint32]*Endpoint{}, lmac: mac, etype: EtherTypeWeft}
		e := &Endpoint{handshakeState: handshakeState{session: 77}, fsize: 2048}
		e.mem = make([]byte, 4*2048)
		e.in.init(e.mem, e.fsize, 4)
		e.in.free.push(1)
		m.conns[77] = e
		l := &Listener{hellos: make(chan *helloFrame, 1)}
		m.lis.Store(l)
		m.demuxLocked(b)
		off := m.l2(b)
		h := header(nil)
		if off >= 0 {
			h = header(b[off:])
		}
		got := e.in.ready.len() == 1
		want := off >= 0 && h.IsValid() && h.dst() == 77 && len(b) <= 2048
		if got != want {
			t.Fatalf("delivered %v, want %v", got, want)
		}
		if got {
			v, _ := e.in.ready.pop()
			if !bytes.Equal(e.mem[(v>>32)*2048:][:uint32(v)], b) {
				t.Fatal("delivered frame differs")
			}
		}
		if len(l.hellos) == 1 && (off < 0 || !h.IsValid() || h.typ() != ptHello || h.dst() != 0) {
			t.Fatalf("listener got a non-hello %x", b)
		}
	})
}

// FuzzParseAddr: no address panics the parser; every refusal matches
// fabric.ErrInvalid, and every address taken names an interface the
// kernel's rule allows.
func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{"veth0", "eth0?queue=0&peer=02:00:00:00:00:02", "eth0?udp=10.0.0.2:34997", "eth0:queue=1,window=64",
		"lo?netns=a/b", "lo\x00", "abcdefghijklmnop", "?=", "lo?busypoll=50us&budget=8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, addr string) {
		c, err := ParseAddr(addr)
		if err != nil {
			if !errors.Is(err, fabric.ErrInvalid) {
				t.Fatalf("ParseAddr(%q) = %v, not ErrInvalid", addr, err)
			}
			return
		}
		n := c.Interface
		if n == "" || len(n) > 15 || n == "." || n == ".." || strings.ContainsAny(n, "/\x00 \t\n:") {
			t.Fatalf("ParseAddr(%q) took interface %q", addr, n)
		}
	})
}
