package sock

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

// rawPeer is a hostile or broken peer: a bare fabric endpoint dialled to
// a sock listener, sending frames built by hand.
type rawPeer struct {
	t   testing.TB
	ep  fabric.Endpoint
	reg *fabric.Region
}

func newRawPeer(t testing.TB, be backend, l *Listener) *rawPeer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ep, err := fabric.Open(ctx, be.name, l.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	reg, err := ep.Alloc(64<<10, fabric.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	return &rawPeer{t: t, ep: ep, reg: reg}
}

func (p *rawPeer) send(frame []byte) {
	p.t.Helper()
	n := copy(p.reg.Bytes(), frame)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.ep.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: p.reg, Length: n}}}}); err != nil {
		p.t.Fatal(err)
	}
}

// frames of the protocol, built independently of the package's encoders.
func rawFrame(typ uint8, credit uint32, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	b[0] = typ
	binary.LittleEndian.PutUint32(b[4:], credit)
	return append(b, payload...)
}

// rawWindow is a WINDOW frame: the new window and a credit grant.
func rawWindow(window, credit uint32) []byte {
	p := make([]byte, 4)
	binary.LittleEndian.PutUint32(p, window)
	return rawFrame(frameWindow, credit, p)
}

func rawHello(ver, window uint32) []byte {
	p := make([]byte, 16)
	copy(p, "WEFTSOCK")
	binary.LittleEndian.PutUint32(p[8:], ver)
	binary.LittleEndian.PutUint32(p[12:], window)
	return rawFrame(1, 0, p)
}

// TestBadPeer: a peer that sends a malformed or forged frame, overruns
// its credit or stalls has its connection closed with a typed error,
// while a well-behaved connection on the same listener carries on.
func TestBadPeer(t *testing.T) {
	hello := rawHello(version, 64<<10)
	cases := []struct {
		name   string
		frames [][]byte
		want   error
	}{
		{"short", [][]byte{{2, 0, 0}}, fabric.ErrMalformed},
		{"unknown-type", [][]byte{hello, rawFrame(42, 0, nil)}, fabric.ErrMalformed},
		{"reserved-bits", [][]byte{hello, {2, 0, 1, 0, 0, 0, 0, 0, 'x'}}, fabric.ErrMalformed},
		{"data-before-hello", [][]byte{rawFrame(2, 0, []byte("early"))}, fabric.ErrMalformed},
		{"bad-version", [][]byte{rawHello(9, 64<<10)}, fabric.ErrMalformed},
		{"tiny-window", [][]byte{rawHello(version, 16)}, fabric.ErrMalformed},
		{"empty-data", [][]byte{hello, rawFrame(2, 0, nil)}, fabric.ErrMalformed},
		{"ping-with-payload", [][]byte{hello, rawFrame(7, 0, []byte("x"))}, fabric.ErrMalformed},
		{"second-hello", [][]byte{hello, hello}, fabric.ErrMalformed},
		{"data-after-fin", [][]byte{hello, rawFrame(4, 0, nil), rawFrame(2, 0, []byte("late"))}, fabric.ErrMalformed},
		// The peer's credit is the server's window (8 KiB here). (Two
		// frames that overrun it together would race with the server's
		// Read, which grants credit back.)
		{"credit-overrun", [][]byte{hello, rawFrame(2, 0, make([]byte, 12<<10))}, ErrCreditOverrun},
		// Granting credit the server never used forges the window.
		{"forged-credit", [][]byte{hello, rawFrame(3, 1, nil)}, fabric.ErrMalformed},
		{"stall", [][]byte{hello}, ErrStalled},
		{"silent", nil, ErrStalled},
	}
	listenBackends(t, func(t *testing.T, be backend) {
		cfg := &Config{Window: 8 << 10, KeepAlive: 50 * time.Millisecond, StallTimeout: time.Second}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				l := be.listen(t, cfg)
				// A good connection first, then the bad peer.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				good, err := Dial(ctx, be.name, l.Addr().String(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer good.Close()
				goodSrv, err := l.AcceptContext(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer goodSrv.Close()

				bad := newRawPeer(t, be, l)
				srv, err := l.AcceptContext(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer srv.Close()
				for _, f := range tc.frames {
					bad.send(f)
				}
				if tc.name == "stall" || tc.name == "silent" {
					// The good connection is idle as long: keep-alives
					// keep it up.
					time.Sleep(1200 * time.Millisecond)
				}
				srv.SetReadDeadline(time.Now().Add(5 * time.Second))
				var rerr error
				for rerr == nil || (tc.name == "data-after-fin" && rerr == io.EOF) {
					// The FIN may be read before the frame behind it
					// arrives: a reader going on past EOF learns of it.
					if rerr == io.EOF {
						time.Sleep(time.Millisecond)
					}
					_, rerr = srv.Read(make([]byte, 64<<10))
				}
				var pe *ProtocolError
				if !errors.Is(rerr, tc.want) || !errors.As(rerr, &pe) {
					t.Fatalf("server Read: %v, want a *ProtocolError matching %v", rerr, tc.want)
				}
				if _, err := srv.Write([]byte("x")); !errors.Is(err, tc.want) {
					t.Fatalf("server Write after the violation: %v", err)
				}
				t.Logf("closed with: %v", rerr)

				// The good connection is unaffected.
				go good.Write([]byte("still fine"))
				buf := make([]byte, 10)
				goodSrv.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.ReadFull(goodSrv, buf); err != nil || string(buf) != "still fine" {
					t.Fatalf("good connection after the bad one: %q, %v", buf, err)
				}
			})
		}
	})
}

// TestResetReported: the violator is told, and its own connection fails
// with ErrReset.
func TestResetReported(t *testing.T) {
	listenBackends(t, func(t *testing.T, be backend) {
		a, b := connPair(t, be, nil)
		// Forge a credit grant from b's side, bypassing its accounting.
		b.smu.Lock()
		putHeader(b.sreg.Bytes(), frameCredit, 1)
		b.postCtl(b.ctx, hdrLen)
		b.smu.Unlock()
		for _, c := range []*Conn{a, b} {
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
		}
		if _, err := a.Read(make([]byte, 1)); !errors.Is(err, fabric.ErrMalformed) {
			t.Fatalf("receiver of the forged grant: %v", err)
		}
		if _, err := b.Read(make([]byte, 1)); !errors.Is(err, ErrReset) {
			t.Fatalf("sender of the forged grant: %v, want ErrReset", err)
		}
	})
}

// TestBadPeerPair: the same violations against a Conn made by NewConn
// over a connected pair (the dialing side's path, where no listener
// handshake stands in front), and each bound exactly at, below and above
// its limit: a frame at the limit is taken, one byte past it closes the
// connection with a typed error.
func TestBadPeerPair(t *testing.T) {
	hello := rawHello(version, 64<<10)
	const window = 8 << 10
	cases := []struct {
		name   string
		frames [][]byte
		want   error // nil: the frames are legal and "ok" arrives after them
	}{
		{"short", [][]byte{hello, {2, 0, 0}}, fabric.ErrMalformed},
		{"unknown-type", [][]byte{hello, rawFrame(numFrameTypes, 0, nil)}, fabric.ErrMalformed},
		{"type-zero", [][]byte{hello, rawFrame(0, 0, nil)}, fabric.ErrMalformed},
		{"flags", [][]byte{hello, {2, 2, 0, 0, 0, 0, 0, 0, 'x'}}, fabric.ErrMalformed},
		{"flag-starved-data", [][]byte{hello, {2, flagStarved, 0, 0, 0, 0, 0, 0, 'x'}}, nil},
		{"flag-starved-credit", [][]byte{hello, {3, flagStarved, 0, 0, 0, 0, 0, 0}}, fabric.ErrMalformed},
		// WINDOW: the peer's window grows (never shrinks, at most to
		// maxWindow), and its credit, growth included, stays within it.
		// This side has sent nothing: its credit is the HELLO's 64 KiB.
		{"grow-exact", [][]byte{hello, rawWindow(128<<10, 64<<10)}, nil},
		{"grow-grant-beyond", [][]byte{hello, rawWindow(128<<10, 64<<10+1)}, fabric.ErrMalformed},
		{"grow-same", [][]byte{hello, rawWindow(64<<10, 0)}, fabric.ErrMalformed},
		{"grow-shrink", [][]byte{hello, rawWindow(32<<10, 0)}, fabric.ErrMalformed},
		{"grow-max", [][]byte{hello, rawWindow(maxWindow, 0)}, nil},
		{"grow-above-max", [][]byte{hello, rawWindow(maxWindow+1, 0)}, fabric.ErrMalformed},
		{"grow-short", [][]byte{hello, rawFrame(frameWindow, 0, make([]byte, windowLen-1))}, fabric.ErrMalformed},
		{"grow-before-hello", [][]byte{rawWindow(128<<10, 0)}, fabric.ErrMalformed},
		{"reserved-2", [][]byte{hello, {2, 0, 1, 0, 0, 0, 0, 0, 'x'}}, fabric.ErrMalformed},
		{"reserved-3", [][]byte{hello, {2, 0, 0, 1, 0, 0, 0, 0, 'x'}}, fabric.ErrMalformed},
		{"data-before-hello", [][]byte{rawFrame(frameData, 0, []byte("early"))}, fabric.ErrMalformed},
		{"bad-version", [][]byte{rawHello(version+1, 64<<10)}, fabric.ErrMalformed},
		{"bad-magic", [][]byte{append(rawFrame(frameHello, 0, []byte("WEFTSOCX")), make([]byte, 8)...)}, fabric.ErrMalformed},
		{"hello-short", [][]byte{hello[:len(hello)-1]}, fabric.ErrMalformed},
		{"hello-long", [][]byte{append(hello[:len(hello):len(hello)], 0)}, fabric.ErrMalformed},
		{"window-min", [][]byte{rawHello(version, minWindow)}, nil},
		{"window-below-min", [][]byte{rawHello(version, minWindow-1)}, fabric.ErrMalformed},
		{"window-max", [][]byte{rawHello(version, maxWindow)}, nil},
		{"window-above-max", [][]byte{rawHello(version, maxWindow+1)}, fabric.ErrMalformed},
		{"second-hello", [][]byte{hello, hello}, fabric.ErrMalformed},
		{"empty-data", [][]byte{hello, rawFrame(frameData, 0, nil)}, fabric.ErrMalformed},
		{"credit-with-payload", [][]byte{hello, rawFrame(frameCredit, 0, []byte("x"))}, fabric.ErrMalformed},
		{"rst-max", [][]byte{hello, rawFrame(frameRst, 0, make([]byte, maxRstLen))}, ErrReset},
		{"rst-too-long", [][]byte{hello, rawFrame(frameRst, 0, make([]byte, maxRstLen+1))}, fabric.ErrMalformed},
		// (Data after FIN is TestBadPeer's: here the FIN's EOF can end the
		// read before the late frame is parsed.)
		// The peer's credit is this side's window: exactly the window is
		// legal; one byte more is an overrun. ("ok" below then overruns
		// in the first case, so it is sent only when a byte is left.)
		{"credit-exact", [][]byte{hello, rawFrame(frameData, 0, make([]byte, window-2))}, nil},
		{"credit-overrun", [][]byte{hello, rawFrame(frameData, 0, make([]byte, window+1))}, ErrCreditOverrun},
		{"forged-credit", [][]byte{hello, rawFrame(frameCredit, 1, nil)}, fabric.ErrMalformed},
	}
	for _, be := range backends {
		if be.pair == nil {
			continue
		}
		t.Run(be.name, func(t *testing.T) {
			for _, tc := range cases {
				// The parser is the same on every backend; the whole
				// table runs over the roce pair, whose set-up is the
				// cheapest (ntb's costs half a second a pair), and the
				// receive paths of the others (views, copies) get the
				// bounds.
				if be.name != "roce" && !strings.HasPrefix(tc.name, "credit-") && !strings.HasPrefix(tc.name, "window-") {
					continue
				}
				t.Run(tc.name, func(t *testing.T) {
					a, b := be.pair(t, nil)
					c, err := NewConn(a, &Config{Window: window, KeepAlive: -1})
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					raw := rawPeerOn(t, b)
					frames := tc.frames
					if tc.want == nil {
						frames = append(frames, rawFrame(frameData, 0, []byte("ok")))
					}
					data := 0
					for _, f := range frames {
						if f[0] == frameData {
							data += len(f) - hdrLen
						}
						raw.send(f)
					}
					c.SetReadDeadline(time.Now().Add(5 * time.Second))
					if tc.want == nil {
						got := make([]byte, data)
						if _, err := io.ReadFull(c, got); err != nil || !bytes.HasSuffix(got, []byte("ok")) {
							t.Fatalf("legal frames: read %d bytes ending %q, %v; want %d ending \"ok\"", len(got), tail(got), err, data)
						}
						return
					}
					_, rerr := io.ReadAll(c)
					var pe *ProtocolError
					if !errors.Is(rerr, tc.want) || !errors.As(rerr, &pe) {
						t.Fatalf("Read: %v, want a *ProtocolError matching %v", rerr, tc.want)
					}
				})
			}
		})
	}
}

func tail(b []byte) []byte {
	if len(b) > 4 {
		return b[len(b)-4:]
	}
	return b
}

// rawPeerOn is a rawPeer on an endpoint already connected; the test's
// cleanup closes it (a peer left open keeps its backend's timers running
// into later tests, whose allocation counts it spoils).
func rawPeerOn(t testing.TB, ep fabric.Endpoint) *rawPeer {
	t.Helper()
	t.Cleanup(func() { ep.Close() })
	reg, err := ep.Alloc(64<<10, fabric.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	return &rawPeer{t: t, ep: ep, reg: reg}
}

// TestWindowGrowsOnlyIntoReads: a DATA frame that spends the peer's last
// credit (flagStarved) grows the window only when it went whole into a
// Read's slice; one that spills into the ring (the reader takes less
// than the window at a time) leaves the window as it is.
func TestWindowGrowsOnlyIntoReads(t *testing.T) {
	const window = 8 << 10
	for _, tc := range []struct {
		name string
		read int // the Reads' slice
		want int // the window after the frame was read
	}{
		{"whole", window, 2 * window},
		{"spilled", window / 2, window},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := rocePair(t, nil, "")
			c, err := NewConn(a, &Config{Window: window, MaxWindow: 64 << 10, KeepAlive: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			raw := rawPeerOn(t, b)
			raw.send(rawHello(version, 64<<10))
			f := rawFrame(frameData, 0, make([]byte, window))
			f[1] = flagStarved
			raw.send(f)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, tc.read)
			for got := 0; got < window; {
				n, err := c.Read(buf)
				if err != nil {
					t.Fatal(err)
				}
				got += n
			}
			c.mu.Lock()
			w := len(c.rbuf)
			c.mu.Unlock()
			if w != tc.want {
				t.Fatalf("window after a starved frame read in slices of %d: %d, want %d", tc.read, w, tc.want)
			}
		})
	}
}
