package rndv

import (
	"testing"

	"github.com/weft-io/weft/fabric"
)

// FuzzHeader: no input makes the view panic, and a valid frame's fields
// are what IsValid promised: a known kind with its length, no DATA payload
// beyond the message, zero reserved bytes; encoding those fields again
// gives the same bytes.
func FuzzHeader(f *testing.F) {
	f.Add(frame(kindData, 3, 5, 1, 2, 3))
	f.Add(frame(kindRTS, 1, 1<<20))
	f.Add(adv(7, fabric.RemoteIOV{Addr: 0x1000, Len: 4096, Key: 0x1234}))
	f.Add([]byte{kindADV, flagEager})
	f.Fuzz(func(t *testing.T, p []byte) {
		h := Header(p)
		if !h.IsValid() {
			return
		}
		var again []byte
		switch h.Kind() {
		case kindData:
			if uint64(len(h.Payload())) > h.Total() {
				t.Fatalf("DATA of %d bytes in a message of %d", len(h.Payload()), h.Total())
			}
			again = frame(kindData, h.Seq(), h.Total(), h.Payload()...)
		case kindRTS:
			again = frame(kindRTS, h.Seq(), h.Total())
		case kindADV:
			again = make([]byte, ADVLen)
			Header(again).encodeADV(h.Seq(), h.Eager(), h.Addr(), h.Len(), h.Key())
		default:
			t.Fatalf("IsValid took kind %d", h.Kind())
		}
		if string(again) != string(p) {
			t.Fatalf("re-encoded % x, got % x", again, p)
		}
	})
}
