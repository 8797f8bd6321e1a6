package rndv

import (
	"errors"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
)

// hostile is a peer that speaks the protocol by hand over a raw endpoint.
type hostile struct {
	t   testing.TB
	ep  fabric.Endpoint
	buf *fabric.Region
	rx  *fabric.Region
}

// victim returns a Conn and the raw endpoint of its peer.
func victim(t *testing.T, be backend, o *Options) (*Conn, *hostile) {
	t.Helper()
	return victimWrapped(t, be, o, nil)
}

// victimWrapped is victim whose Conn runs over wrap(its endpoint) (nil:
// the endpoint itself).
func victimWrapped(t *testing.T, be backend, o *Options, wrap func(fabric.Endpoint) fabric.Endpoint) (*Conn, *hostile) {
	t.Helper()
	ea, eb := be.pair(t, nil)
	if wrap != nil {
		ea = wrap(ea)
	}
	c, err := New(ea, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); eb.Close() })
	h := &hostile{t: t, ep: eb}
	if h.buf, err = eb.Alloc(4096, 0); err != nil {
		t.Fatal(err)
	}
	if h.rx, err = eb.Alloc(64<<10, fabric.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	return c, h
}

// send sends frame p.
func (h *hostile) send(p []byte) {
	h.t.Helper()
	copy(h.buf.Bytes(), p)
	if _, err := h.ep.SendWait(testenv.Context(h.t), []fabric.Message{{SGEs: []fabric.SGE{{Region: h.buf, Length: len(p)}}}}); err != nil {
		h.t.Fatal(err)
	}
}

// recv waits for the victim's next frame.
func (h *hostile) recv() Header {
	h.t.Helper()
	m := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(h.rx)}}}
	if _, err := h.ep.RecvWait(testenv.Context(h.t), m); err != nil {
		h.t.Fatal(err)
	}
	f := Header(h.rx.Bytes()[:m[0].Len])
	if !f.IsValid() {
		h.t.Fatalf("the victim sent a malformed frame % x", f)
	}
	return f
}

func frame(kind uint8, seq uint32, total uint64, payload ...byte) []byte {
	p := make([]byte, HeaderLen+len(payload))
	Header(p).encode(kind, 0, seq, total)
	copy(p[HeaderLen:], payload)
	return p
}

func adv(seq uint32, iov fabric.RemoteIOV) []byte {
	p := make([]byte, ADVLen)
	Header(p).encodeADV(seq, false, iov.Addr, iov.Len, uint64(iov.Key))
	return p
}

// TestBadBuffer: a receiver that advertises memory it does not own (a
// wrong key) or past its region gets the write refused by its own
// endpoint: no byte of its memory changes, and Send fails with an error
// matching fabric.ErrAccess, closing the connection.
func TestBadBuffer(t *testing.T) {
	for _, be := range backends {
		for _, tc := range []struct {
			name string
			iov  func(r *fabric.Region) fabric.RemoteIOV
		}{
			{"key", func(r *fabric.Region) fabric.RemoteIOV {
				iov := r.Remote()
				iov.Key ^= 0x5a5a
				return iov
			}},
			{"bounds", func(r *fabric.Region) fabric.RemoteIOV {
				return r.Remote().Slice(uint64(r.Len())-100, 8192)
			}},
		} {
			t.Run(be.name+"/"+tc.name, func(t *testing.T) {
				c, h := victim(t, be, &Options{Threshold: 1024})
				target, err := h.ep.Alloc(16<<10, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
				if err != nil {
					t.Fatal(err)
				}
				src := alloc(t, c, 8192, 0)
				fill(src.Bytes(), 3)
				errc := make(chan error, 1)
				go func() { errc <- c.Send(testenv.Context(t), fabric.SGEOf(src)) }()
				if f := h.recv(); f.Kind() != kindRTS || f.Seq() != 0 || f.Total() != 8192 {
					t.Fatalf("the victim sent %s %d of %d bytes, want RTS 0 of 8192", kindNames[f.Kind()], f.Seq(), f.Total())
				}
				h.send(adv(0, tc.iov(target)))
				err = testenv.Recv(t, errc, "the victim's Send")
				if !errors.Is(err, fabric.ErrAccess) {
					t.Fatalf("Send = %v, want ErrAccess", err)
				}
				for i, b := range target.Bytes() {
					if b != 0 {
						t.Fatalf("byte %d of the hostile peer's memory changed", i)
					}
				}
				if err := c.Send(testenv.Context(t), fabric.SGE{Region: src, Length: 10}); err == nil {
					t.Fatal("the connection went on after the refused write")
				}
			})
		}
	}
}

// TestStalled: a sender that starts a rendezvous (RTS), gets the buffer
// and never writes is stalled out after Options.Timeout: Recv fails with
// ErrStalled and the connection closes. A second connection is unaffected.
func TestStalled(t *testing.T) {
	be := backends[0]
	c, h := victim(t, be, &Options{Threshold: 1024, Timeout: 200 * time.Millisecond})
	dst := alloc(t, c, 8192, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
	other, peer := conns(t, be, nil)
	h.send(frame(kindRTS, 0, 8192))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Recv(testenv.Context(t), fabric.SGEOf(dst))
		errc <- err
	}()
	if f := h.recv(); f.Kind() != kindADV || f.Seq() != 0 || f.Len() != 8192 {
		t.Fatalf("the victim answered %s %d for %d bytes, want ADV 0 for 8192", kindNames[f.Kind()], f.Seq(), f.Len())
	}
	if err := testenv.Recv(t, errc, "the victim's Recv"); !errors.Is(err, ErrStalled) || !errors.Is(err, fabric.ErrPeerGone) {
		t.Fatalf("Recv = %v, want ErrStalled", err)
	}
	src := alloc(t, other, 8, 0)
	in := alloc(t, peer, 8, fabric.AccessLocalWrite)
	go func() { errc <- other.Send(testenv.Context(t), fabric.SGEOf(src)) }()
	if n, err := peer.Recv(testenv.Context(t), fabric.SGEOf(in)); n != 8 || err != nil {
		t.Fatalf("the other connection: %d, %v", n, err)
	}
	if err := testenv.Recv(t, errc, "the other Send"); err != nil {
		t.Fatal(err)
	}
}

// TestViolations: frames a peer must not send close the connection with
// an error matching fabric.ErrMalformed, on the side that receives them,
// whichever role finds them.
func TestViolations(t *testing.T) {
	bad := []struct {
		name string
		// send sends the violation; recv makes the victim receive
		// (else it sends a large message, and finds it waiting for the
		// buffer).
		send func(h *hostile)
		recv bool
	}{
		{"short", func(h *hostile) { h.send([]byte{kindData, 0, 0}) }, true},
		{"kind", func(h *hostile) { h.send(frame(9, 0, 0)) }, true},
		{"data-over-total", func(h *hostile) { h.send(frame(kindData, 0, 2, 1, 2, 3)) }, true},
		{"data-seq", func(h *hostile) { h.send(frame(kindData, 7, 1, 1)) }, true},
		{"data-total-changes", func(h *hostile) {
			h.send(frame(kindData, 0, 10, 1))
			h.send(frame(kindData, 0, 11, 1))
		}, true},
		{"data-beyond-total", func(h *hostile) {
			h.send(frame(kindData, 0, 10, 1, 2, 3, 4, 5, 6))
			h.send(frame(kindData, 0, 10, 1, 2, 3, 4, 5, 6))
		}, true},
		{"rts-seq", func(h *hostile) { h.send(frame(kindRTS, 3, 100)) }, true},
		{"adv-unsent", func(h *hostile) { h.send(adv(5, fabric.RemoteIOV{Len: 10})) }, false},
		{"write-seq", func(h *hostile) {
			// The victim advertises its buffer for message 0; the
			// write that lands in it names message 5.
			h.send(frame(kindRTS, 0, 4096))
			a := h.recv()
			h.write(a.Remote(), 5|immLast)
		}, true},
		{"imm-send", func(h *hostile) { h.sendImm(0 | immLast) }, true},
	}
	for _, be := range backends {
		for _, tc := range bad {
			t.Run(be.name+"/"+tc.name, func(t *testing.T) {
				c, h := victim(t, be, &Options{Threshold: 1024})
				errc := make(chan error, 1)
				if tc.recv {
					dst := alloc(t, c, 4096, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
					go func() {
						_, err := c.Recv(testenv.Context(t), fabric.SGEOf(dst))
						errc <- err
					}()
				} else {
					src := alloc(t, c, 4096, 0)
					go func() { errc <- c.Send(testenv.Context(t), fabric.SGEOf(src)) }()
				}
				tc.send(h)
				if err := testenv.Recv(t, errc, "the victim"); !errors.Is(err, fabric.ErrMalformed) {
					t.Fatalf("victim: %v, want ErrMalformed", err)
				}
			})
		}
	}
}

// write writes 16 bytes into iov with immediate data imm.
func (h *hostile) write(iov fabric.RemoteIOV, imm uint32) {
	h.t.Helper()
	m := []fabric.Message{{SGEs: []fabric.SGE{{Region: h.buf, Length: 16}}, Remote: iov.Slice(0, 16), Flags: fabric.FlagImm, Imm: imm}}
	if n, err := h.ep.Write(m); n != 1 || err != nil {
		h.t.Fatalf("Write = %d, %v", n, err)
	}
}

// sendImm sends a message of no bytes with immediate data: no frame.
func (h *hostile) sendImm(imm uint32) {
	h.t.Helper()
	m := []fabric.Message{{SGEs: []fabric.SGE{{Region: h.buf, Length: 0}}, Flags: fabric.FlagImm, Imm: imm}}
	if _, err := h.ep.SendWait(testenv.Context(h.t), m); err != nil {
		h.t.Fatal(err)
	}
}
