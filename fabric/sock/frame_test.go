package sock

import (
	"bytes"
	"errors"
	"testing"

	"github.com/weft-io/weft/fabric"
)

func TestParseFrame(t *testing.T) {
	b := make([]byte, hdrLen+helloLen)
	n := putHello(b, 1<<20)
	h, p, err := parseFrame(b[:n])
	if err != nil || h.typ != frameHello {
		t.Fatalf("HELLO: %+v %v", h, err)
	}
	if v, w, err := parseHello(p); v != version || w != 1<<20 || err != nil {
		t.Fatalf("parseHello = %d %d %v", v, w, err)
	}
	d := rawFrame(frameData, 77, []byte("payload"))
	if h, p, err := parseFrame(d); err != nil || h.credit != 77 || string(p) != "payload" {
		t.Fatalf("DATA: %+v %q %v", h, p, err)
	}
	for _, bad := range [][]byte{
		nil, d[:7], rawFrame(0, 0, nil), rawFrame(numFrameTypes, 0, nil),
		rawFrame(frameCredit, maxWindow+1, nil), rawFrame(frameFin, 0, []byte{0}),
		rawFrame(frameData, 0, nil), rawFrame(frameRst, 0, make([]byte, maxRstLen+1)),
		rawFrame(frameHello, 0, make([]byte, helloLen)), append(b[:n:n], 0),
		rawFrame(frameWindow, 0, make([]byte, windowLen+1)), rawFrame(frameWindow, 0, nil),
		{frameCredit, flagStarved, 0, 0, 0, 0, 0, 0}, {frameData, 2, 0, 0, 0, 0, 0, 0, 'x'},
	} {
		if _, _, err := parseFrame(bad); !errors.Is(err, fabric.ErrMalformed) {
			t.Errorf("parseFrame(%x) = %v, want ErrMalformed", bad, err)
		}
	}
	for _, good := range [][]byte{
		{frameData, flagStarved, 0, 0, 0, 0, 0, 0, 'x'}, rawFrame(frameWindow, 4096, make([]byte, windowLen)),
	} {
		if _, _, err := parseFrame(good); err != nil {
			t.Errorf("parseFrame(%x) = %v", good, err)
		}
	}
	if allocs := testing.AllocsPerRun(100, func() { parseFrame(d) }); allocs != 0 {
		t.Errorf("parseFrame allocates %v times", allocs)
	}
}

// FuzzFrame: the parser accepts exactly the frames that re-encode to
// themselves, never panics, and rejects with ErrMalformed.
func FuzzFrame(f *testing.F) {
	b := make([]byte, hdrLen+helloLen)
	f.Add(b[:putHello(b, 4096)])
	f.Add(rawFrame(frameData, 1, []byte("x")))
	f.Add(rawFrame(frameCredit, 4096, nil))
	f.Add(rawFrame(frameRst, 0, []byte("reason")))
	f.Add([]byte{frameData, flagStarved, 0, 0, 0, 0, 0, 0, 'x'})
	f.Add(rawFrame(frameWindow, 4096, []byte{0, 0, 2, 0}))
	f.Add([]byte{9, 9, 9})
	f.Fuzz(func(t *testing.T, in []byte) {
		h, p, err := parseFrame(in)
		if err != nil {
			if !errors.Is(err, fabric.ErrMalformed) {
				t.Fatalf("error %v does not match ErrMalformed", err)
			}
			return
		}
		out := make([]byte, hdrLen, hdrLen+len(p))
		putHeader(out, h.typ, h.credit)
		out[1] = h.flags
		out = append(out, p...)
		if !bytes.Equal(out, in) {
			t.Fatalf("accepted %x, which re-encodes as %x", in, out)
		}
		if h.typ == frameHello {
			if _, w, err := parseHello(p); err == nil && (w < minWindow || w > maxWindow) {
				t.Fatalf("accepted window %d", w)
			}
		}
	})
}
