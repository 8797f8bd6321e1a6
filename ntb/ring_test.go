package ntb

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
	"unsafe"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/shm"
)

// The ring's bounds at their edges, through the real layout: a message
// of exactly the maximum size goes and one byte more does not; a record
// that ends exactly at the ring's end is not padded; a record the peer
// wrote that runs one byte past the end is dropped and counted, on the
// copy path and the zero-copy one (issue 29). The sessions use ring8K's
// 8 KiB rings (handshake_test.go), whose largest message is 4032 bytes.

// sendBytes sends one message of n bytes, each byte fill.
func sendBytes(t *testing.T, ep *Endpoint, n int, fill byte) {
	t.Helper()
	r, err := ep.Alloc(max(n, 1), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range r.Bytes() {
		r.Bytes()[i] = fill
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ep.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: r, Length: n}}}}); err != nil {
		t.Fatalf("sending %d bytes: %v", n, err)
	}
}

// recvBytes receives one message (copy path) and returns its payload.
func recvBytes(t *testing.T, ep *Endpoint) ([]byte, error) {
	t.Helper()
	r, err := ep.Alloc(8192, fabric.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r)}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ep.RecvWait(ctx, msgs); err != nil {
		return nil, err
	}
	return bytes.Clone(r.Bytes()[:msgs[0].Len]), nil
}

func TestRingMaxMessage(t *testing.T) {
	a, b := pair(t, ShmConfig{}, ring8K)
	max := ring8K.MaxMsgSize
	sendBytes(t, a, max, 0x5a)
	got, err := recvBytes(t, b)
	if err != nil || len(got) != max || got[0] != 0x5a || got[max-1] != 0x5a {
		t.Fatalf("a message of exactly the maximum %d bytes arrived as %d bytes, %v", max, len(got), err)
	}
	if s := b.Stats(); s.RxBytes != uint64(max) || s.RxMessages != 1 {
		t.Fatalf("receiver counted %d bytes in %d messages, want %d in 1", s.RxBytes, s.RxMessages, max)
	}
	r, _ := a.Alloc(max+1, 0)
	defer r.Close()
	n, err := a.Send([]fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r)}}})
	if n != 0 || !errors.Is(err, fabric.ErrMessageSize) {
		t.Fatalf("a message one byte over the maximum: Send = %d, %v; want 0, ErrMessageSize", n, err)
	}
	if s := a.Stats(); s.TxMessages != 1 || s.TxBytes != uint64(max) {
		t.Fatalf("sender counted %d messages, %d bytes, want only the first", s.TxMessages, s.TxBytes)
	}
}

// advance sends and receives messages of 4032 and 2000 bytes, which
// leaves both ring positions at 6064, 2128 bytes short of the end.
func advance(t *testing.T, a, b *Endpoint) {
	t.Helper()
	for _, n := range []int{4032, 2000} {
		sendBytes(t, a, n, 1)
		if got, err := recvBytes(t, b); err != nil || len(got) != n {
			t.Fatalf("advancing the ring: %d bytes, %v", len(got), err)
		}
	}
	if a.txTail != 6064 || b.rxHead != 6064 {
		t.Fatalf("the ring positions are %d and %d, want 6064", a.txTail, b.rxHead)
	}
}

// TestRingExactEnd: a record that ends exactly at the end of the ring
// sits there, not behind a padding record at the start; the zero-copy
// view of it is the ring's memory, and its bytes are counted.
func TestRingExactEnd(t *testing.T) {
	a, b := pair(t, ShmConfig{}, ring8K)
	advance(t, a, b)
	const n = 8192 - 6064 - recHdr
	sendBytes(t, a, n, 0x33)
	views := make([]fabric.View, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := b.RecvViewsWait(ctx, views)
	if err != nil || got != 1 || len(views[0].Data) != n {
		t.Fatalf("RecvViewsWait = %d, %v (%d bytes), want one view of %d bytes", got, err, len(views[0].Data), n)
	}
	if p, want := unsafe.SliceData(views[0].Data), &b.rxRing[6064+recHdr]; p != want {
		t.Fatalf("the record that fits the ring's end exactly was placed at offset %d, want 6064",
			uintptr(unsafe.Pointer(p))-uintptr(unsafe.Pointer(&b.rxRing[0]))-recHdr)
	}
	if s := b.Stats(); s.RxBytes != 4032+2000+n || s.RxMessages != 3 {
		t.Fatalf("receiver counted %d bytes in %d messages, want %d in 3", s.RxBytes, s.RxMessages, 4032+2000+n)
	}
	if err := b.ReleaseViews(1); err != nil {
		t.Fatal(err)
	}
	// The next record starts the ring over without padding.
	sendBytes(t, a, 100, 0x44)
	if got, err := recvBytes(t, b); err != nil || len(got) != 100 || got[0] != 0x44 {
		t.Fatalf("after the wrap: %d bytes, %v", len(got), err)
	}
}

// TestRingPastEnd: the peer forges a record at 6064 whose length it
// chose: up to the ring's end it is a message; one byte past it, or
// past it by any length within the maximum message size, it is dropped,
// counted and ends the session, on both receive paths.
func TestRingPastEnd(t *testing.T) {
	const fits = 8192 - 6064 - recHdr
	for _, c := range []struct {
		name  string
		ln    int
		views bool
		ok    bool
	}{
		{"ToTheEnd", fits, false, true},
		{"ToTheEndViews", fits, true, true},
		{"OnePast", fits + 1, false, false},
		{"OnePastViews", fits + 1, true, false},
		{"MaxMsgPast", 4032, false, false},
		{"MaxMsgPastViews", 4032, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A sends, B receives: A's send ring is in B's window.
			a, b := pair(t, ShmConfig{}, ring8K)
			advance(t, a, b)
			a.txMu.Lock()
			shm.U32(a.txRing, 0).Store(0) // where the next record would start: nothing yet
			forgeRecord(a, c.ln, 0)
			a.txMu.Unlock()
			var n int
			var err error
			if c.views {
				n, err = recvViewsN(b)
			} else {
				var got []byte
				got, err = recvBytes(t, b)
				n = len(got)
			}
			if c.ok {
				if err != nil || n != c.ln {
					t.Fatalf("a record of %d bytes ending at the ring's end: %d bytes, %v", c.ln, n, err)
				}
				return
			}
			if !errors.Is(err, fabric.ErrMalformed) {
				t.Fatalf("a record of %d bytes at 6064 of an 8192-byte ring: %d bytes, %v; want ErrMalformed", c.ln, n, err)
			}
			if d := b.Stats().Drops[fabric.DropMalformed]; d != 1 {
				t.Fatalf("%d malformed records counted, want 1", d)
			}
			waitEvent(t, b, fabric.EventError)
		})
	}
}

// recvViewsN waits for views and returns the length of the first.
func recvViewsN(ep *Endpoint) (int, error) {
	views := make([]fabric.View, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := ep.RecvViewsWait(ctx, views)
	if n == 0 {
		return 0, err
	}
	ep.ReleaseViews(n)
	return len(views[0].Data), err
}

// TestSGELimit: a message of exactly Caps().MaxSGEs pieces is sent and
// written; one more is refused with ErrMessageSize before anything moves.
func TestSGELimit(t *testing.T) {
	a, b := pair(t, ShmConfig{}, Config{})
	max := a.Caps().MaxSGEs
	src, _ := a.Alloc(max+1, 0)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i)
	}
	dst, _ := b.Alloc(4096, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
	sges := func(n int) []fabric.SGE {
		s := make([]fabric.SGE, n)
		for i := range s {
			s[i] = fabric.SGE{Region: src, Offset: i, Length: 1}
		}
		return s
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if n, err := a.SendWait(ctx, []fabric.Message{{SGEs: sges(max)}}); n != 1 || err != nil {
		t.Fatalf("Send of %d SGEs = %d, %v", max, n, err)
	}
	got, err := recvBytes(t, b)
	if err != nil || len(got) != max || got[max-1] != byte(max-1) {
		t.Fatalf("the message of %d SGEs arrived as %d bytes, %v", max, len(got), err)
	}
	if n, err := a.Send([]fabric.Message{{SGEs: sges(max + 1)}}); n != 0 || !errors.Is(err, fabric.ErrMessageSize) {
		t.Fatalf("Send of %d SGEs = %d, %v; want ErrMessageSize", max+1, n, err)
	}
	w := []fabric.Message{{SGEs: sges(max), Remote: dst.Remote(), Flags: fabric.FlagSignal}}
	if n, err := a.Write(w); n != 1 || err != nil {
		t.Fatalf("Write of %d SGEs = %d, %v", max, n, err)
	}
	out := make([]fabric.Completion, 1)
	if k, err := a.CQ().Wait(ctx, out); k != 1 || err != nil || out[0].Status != fabric.StatusOK {
		t.Fatalf("the write of %d SGEs completed %d, %v, %+v", max, k, err, out[0])
	}
	if dst.Bytes()[max-1] != byte(max-1) {
		t.Fatalf("the write of %d SGEs did not land", max)
	}
	w[0].SGEs = sges(max + 1)
	if n, err := a.Write(w); n != 0 || !errors.Is(err, fabric.ErrMessageSize) {
		t.Fatalf("Write of %d SGEs = %d, %v; want ErrMessageSize", max+1, n, err)
	}
}
