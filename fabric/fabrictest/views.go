package fabrictest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/weft-io/weft/fabric"
)

const viewsCount = 5000

// viewsSize spreads sizes over 8 B..4 KiB so the stream wraps the
// receiver's memory several times while B holds views.
func viewsSize(i, max int) int { return min(8+(i*997)%4000, max) }

// viewsA streams numbered messages for viewsB, once B has said that its
// endpoint takes views (the sender's own endpoint does not matter).
func viewsA(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	if !r.caps.Reliable || r.caps.MaxMsgSize < 8 {
		t.Skip("needs a reliable endpoint")
	}
	if got, _ := r.recv(); string(got) != "views-go" {
		r.send([]byte("views-skip-ok"), 0, 0) // B closes only after this
		t.Skipf("the receiver has no zero-copy receive (it said %q)", got)
	}
	sendNumbered(t, r, viewsCount, 16, 4096, func(i int) int { return viewsSize(i, r.caps.MaxMsgSize) })
	r.expect("views-ok")
}

// viewsB receives A's stream as views, holding up to 32 of them while
// it copies other messages out with Recv, and checks that a held view
// still reads what was sent when it is released: the backend must not
// reuse memory a view holds.
func viewsB(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	if !r.caps.Reliable || r.caps.MaxMsgSize < 8 {
		t.Skip("needs a reliable endpoint")
	}
	vr, ok := ep.(fabric.ViewReceiver)
	if !ok {
		r.send([]byte("views-skip"), 0, 0)
		r.expect("views-skip-ok")
		t.Skip("backend has no zero-copy receive (fabric.ViewReceiver)")
	}
	r.send([]byte("views-go"), 0, 0)
	want := make([]byte, 4096)
	check := func(how string, seq int, got []byte, imm uint32, flags fabric.MsgFlags) {
		t.Helper()
		size := viewsSize(seq, r.caps.MaxMsgSize)
		if len(got) != size {
			t.Fatalf("message %d (%s): %d bytes, want %d", seq, how, len(got), size)
		}
		w := want[:size]
		fill(w, uint64(seq))
		binary.LittleEndian.PutUint64(w, uint64(seq))
		if !bytes.Equal(got, w) {
			t.Fatalf("message %d (%s) differs at byte %d: lost, reordered or overwritten", seq, how, firstDiff(got, w))
		}
		if flags&fabric.FlagImm == 0 || imm != uint32(seq) {
			t.Fatalf("message %d (%s): immediate %#x (flags %#x)", seq, how, imm, flags)
		}
	}
	type held struct {
		v   fabric.View
		seq int
	}
	var hold []held
	views := make([]fabric.View, 8)
	buf := r.alloc(4*4096, fabric.AccessLocalWrite)
	msgs := make([]fabric.Message, 4)
	for i := range msgs {
		msgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: buf, Offset: i * 4096, Length: 4096}}}
	}
	triedBad := false
	for seq, k := 0, 0; seq < viewsCount; k++ {
		if k%3 == 2 {
			// Copy messages out while views are outstanding.
			n, err := ep.RecvWait(r.ctx, msgs)
			if err != nil {
				t.Fatalf("RecvWait at %d with %d views held: %v", seq, len(hold), err)
			}
			for i := 0; i < n; i++ {
				m := &msgs[i]
				check("Recv", seq, buf.Bytes()[i*4096:i*4096+m.Len], m.Imm, m.Flags)
				seq++
			}
			continue
		}
		n, err := vr.RecvViewsWait(r.ctx, views)
		if err != nil {
			t.Fatalf("RecvViewsWait at %d: %v", seq, err)
		}
		for i := 0; i < n; i++ {
			v := views[i]
			if v.Len != len(v.Data) {
				t.Fatalf("view of message %d: Len %d, %d bytes of Data", seq, v.Len, len(v.Data))
			}
			check("view", seq, v.Data, v.Imm, v.Flags)
			hold = append(hold, held{v, seq})
			seq++
		}
		if got := vr.OutstandingViews(); got != len(hold) {
			t.Fatalf("OutstandingViews = %d, want %d", got, len(hold))
		}
		if !triedBad && len(hold) > 0 {
			triedBad = true
			if err := vr.ReleaseViews(len(hold) + 1); !errors.Is(err, fabric.ErrInvalid) {
				t.Fatalf("releasing %d of %d views: %v, want an error matching ErrInvalid", len(hold)+1, len(hold), err)
			}
			if err := vr.ReleaseViews(-1); !errors.Is(err, fabric.ErrInvalid) {
				t.Fatalf("releasing -1 views: %v, want an error matching ErrInvalid", err)
			}
		}
		if len(hold) >= 32 {
			for _, h := range hold {
				check("held view", h.seq, h.v.Data, h.v.Imm, h.v.Flags)
			}
			if err := vr.ReleaseViews(24); err != nil {
				t.Fatalf("ReleaseViews(24) of %d: %v", len(hold), err)
			}
			hold = append(hold[:0], hold[24:]...)
		}
	}
	for _, h := range hold {
		check("held view", h.seq, h.v.Data, h.v.Imm, h.v.Flags)
	}
	if err := vr.ReleaseViews(len(hold)); err != nil {
		t.Fatalf("ReleaseViews(%d): %v", len(hold), err)
	}
	if got := vr.OutstandingViews(); got != 0 {
		t.Fatalf("OutstandingViews = %d after releasing all", got)
	}
	r.send([]byte("views-ok"), 0, 0)
}
