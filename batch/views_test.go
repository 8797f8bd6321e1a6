package batch_test

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/weft-io/weft/batch"
	"github.com/weft-io/weft/fabric"
)

// scribbler is an endpoint whose receive memory the test rewrites at
// will, as a hostile peer can rewrite an NTB ring under a view: it hands
// out views of msg and counts what the splitter releases.
type scribbler struct {
	fabric.Endpoint // nil: only the methods below are called
	msg             []byte
	sent, released  int
}

func (s *scribbler) Caps() fabric.Caps { return fabric.Caps{MaxMsgSize: 1 << 16} }
func (s *scribbler) RecvViews(v []fabric.View) (int, error) {
	if s.sent > 0 || len(v) == 0 {
		return 0, nil
	}
	s.sent++
	v[0] = fabric.View{Data: s.msg, Len: len(s.msg), Flags: fabric.FlagImm, Imm: batch.Imm}
	return 1, nil
}
func (s *scribbler) RecvViewsWait(_ context.Context, v []fabric.View) (int, error) {
	return s.RecvViews(v)
}
func (s *scribbler) ReleaseViews(n int) error { s.released += n; return nil }
func (s *scribbler) OutstandingViews() int    { return s.sent - s.released }

// TestViewRewritten has the peer grow a packet length after the splitter
// validated the batch and delivered its first packet: the splitter must
// not slice past the message, must count the drop, and must still give
// the view back once the delivered packet is released.
func TestViewRewritten(t *testing.T) {
	sc := &scribbler{msg: encode(1, []byte("aaaa"), []byte("bbbb"), []byte("cccc"))}
	s, err := batch.NewSplitter(sc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Views() {
		t.Fatal("splitter does not take views of a ViewReceiver")
	}
	pkts := make([]batch.Packet, 1)
	if n, err := s.Recv(pkts); n != 1 || err != nil || string(pkts[0].Data) != "aaaa" {
		t.Fatalf("first packet: %d, %v, %q", n, err, pkts[0].Data)
	}
	// The second packet's length now claims the whole message and more.
	binary.LittleEndian.PutUint16(sc.msg[batch.FixedHeaderSize+2:], 0xffff)
	more := make([]batch.Packet, 4)
	if n, err := s.Recv(more); n != 0 || err != nil {
		t.Fatalf("after the rewrite: %d packets, %v", n, err)
	}
	if d := s.Stats().Drops[batch.DropMalformed]; d != 1 {
		t.Fatalf("%d malformed drops, want 1", d)
	}
	if sc.released != 0 {
		t.Fatal("view released while a packet of it is held")
	}
	s.Release(pkts)
	if sc.released != 1 || s.Held() != 0 {
		t.Fatalf("released %d views, %d slots held; want 1 and 0", sc.released, s.Held())
	}
}
