package batch_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"
	"unsafe"

	"github.com/weft-io/weft/batch"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/ntb"
)

// encode builds a batch message the way a Coalescer lays it out.
func encode(seq uint32, pkts ...[]byte) []byte {
	b := []byte{'W', 'B', batch.Version, 0}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(pkts)))
	b = binary.LittleEndian.AppendUint16(b, uint16(batch.HeaderSize(len(pkts))))
	b = binary.LittleEndian.AppendUint32(b, seq)
	for _, p := range pkts {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(p)))
	}
	for _, p := range pkts {
		b = append(b, p...)
	}
	return b
}

func fuzzSeeds(f *testing.F) {
	f.Add(encode(1, []byte("a")))
	f.Add(encode(7, []byte("hello"), []byte("batch"), make([]byte, 300)))
	f.Add(encode(0, make([]byte, 1500), make([]byte, 64)))
	f.Add([]byte("WB\x01\x00\xff\xff\x0c\x00\x00\x00\x00\x00"))
	f.Add([]byte("WB\x01\x00\x02\x00\xff\xff\x00\x00\x00\x00\x01\x00\x01\x00ab"))
	f.Add([]byte{})
}

// checkSplit is the invariant of a successful split: the packets tile
// the message after the header exactly, in order, each within msg.
func checkSplit(t *testing.T, msg []byte, h batch.Header, pkts [][]byte) {
	if len(pkts) != h.Count || h.Count < 1 || h.Len < batch.HeaderSize(h.Count) {
		t.Fatalf("header %+v, %d packets", h, len(pkts))
	}
	off := h.Len
	base := uintptr(unsafe.Pointer(unsafe.SliceData(msg)))
	for i, p := range pkts {
		if len(p) == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(p))) != base+uintptr(off) || cap(p) != len(p) {
			t.Fatalf("packet %d (%d bytes) is not at offset %d of the message", i, len(p), off)
		}
		off += len(p)
	}
	if off != len(msg) {
		t.Fatalf("packets end at %d of %d", off, len(msg))
	}
}

// FuzzSplit feeds arbitrary bytes to the header parser: it must never
// panic or read out of bounds, must fail only with a batch's
// *fabric.MalformedError matching fabric.ErrMalformed, and a batch it accepts must be exactly
// tiled by its packets.
func FuzzSplit(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, msg []byte) {
		pkts, h, err := batch.Split(nil, msg)
		if err != nil {
			var he *fabric.MalformedError
			if !errors.As(err, &he) || he.Where != "batch" || !errors.Is(err, fabric.ErrMalformed) || len(pkts) != 0 {
				t.Fatalf("error %v (%T), %d packets", err, err, len(pkts))
			}
			return
		}
		checkSplit(t, msg, h, pkts)
		h2, err := batch.ParseHeader(msg)
		if err != nil || h2 != h {
			t.Fatalf("ParseHeader disagrees: %+v %v", h2, err)
		}
	})
}

// FuzzSplitter sends arbitrary bytes as a batch message over a real NTB
// pair and receives them through a Splitter: whatever the peer sent, the
// splitter delivers exactly the packets Split finds, or drops the message
// with a counted *fabric.MalformedError; it never panics and always gets its slot
// back.
func FuzzSplitter(f *testing.F) {
	fuzzSeeds(f)
	a, b := pair(f, ntb.Config{MaxMsgSize: 4096})
	s, err := batch.NewSplitter(b, &batch.SplitterOptions{Slots: 4})
	if err != nil {
		f.Fatal(err)
	}
	src, _ := a.Alloc(4096, 0)
	pkts := make([]batch.Packet, 8)
	f.Fuzz(func(t *testing.T, msg []byte) {
		if len(msg) > 4096 {
			msg = msg[:4096]
		}
		copy(src.Bytes(), msg)
		if _, err := a.Send([]fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: len(msg)}},
			Flags: fabric.FlagImm, Imm: batch.Imm}}); err != nil {
			t.Fatal(err)
		}
		want, _, werr := batch.Split(nil, msg)
		drops := s.Stats().Drops[batch.DropMalformed]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		got := 0
		for {
			n, err := s.RecvWait(ctx, pkts)
			for _, p := range pkts[:n] {
				if got >= len(want) || string(p.Data) != string(want[got]) || p.Raw {
					t.Fatalf("packet %d: %q, want %d packets", got, p.Data, len(want))
				}
				got++
			}
			s.Release(pkts[:n])
			if werr != nil {
				if n != 0 || !errors.Is(err, fabric.ErrMalformed) || s.Stats().Drops[batch.DropMalformed] != drops+1 {
					t.Fatalf("malformed batch (%v): %d packets, %v", werr, n, err)
				}
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if got == len(want) {
				break
			}
		}
		if s.Held() != 0 {
			t.Fatalf("%d slots held", s.Held())
		}
	})
}
