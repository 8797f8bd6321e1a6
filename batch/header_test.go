package batch

import (
	"encoding/binary"
	"testing"

	"github.com/weft-io/weft/fabric"
)

// rawBatch builds a batch message field by field: count and hdrLen go
// into the header as given, lens into the length table (len(lens)
// entries, whatever count says), then data bytes of payload.
func rawBatch(count, hdrLen int, lens []int, data int) []byte {
	b := make([]byte, FixedHeaderSize+2*len(lens), FixedHeaderSize+2*len(lens)+data)
	b[0], b[1], b[2], b[3] = magic0, magic1, Version, 0
	binary.LittleEndian.PutUint16(b[4:], uint16(count))
	binary.LittleEndian.PutUint16(b[6:], uint16(hdrLen))
	binary.LittleEndian.PutUint32(b[8:], 77)
	for i, n := range lens {
		binary.LittleEndian.PutUint16(b[FixedHeaderSize+2*i:], uint16(n))
	}
	for range data {
		b = append(b, 0xa5)
	}
	return b
}

// TestHeaderRules gives ParseHeader, Split and the splitter's path one
// batch per rule, each built so that only that rule can reject it: every
// other check passes on it. Each case must fail with its own error, so
// that a rule that is dropped or weakened cannot hide behind another.
// Each case also has a repaired twin, the same batch with the broken field
// fixed, which must be accepted: the case breaks exactly one thing.
func TestHeaderRules(t *testing.T) {
	cases := []struct {
		name   string
		msg    []byte
		want   *fabric.MalformedError
		repair []byte
	}{
		// 11 bytes: too short for the fixed header.
		{"short", rawBatch(1, 14, []int{1}, 1)[:11], errShort, nil},
		{"magic", func() []byte { b := rawBatch(1, 14, []int{3}, 3); b[1] = 'X'; return b }(), errMagic, rawBatch(1, 14, []int{3}, 3)},
		{"version", func() []byte { b := rawBatch(1, 14, []int{3}, 3); b[2] = 2; return b }(), errVersion, rawBatch(1, 14, []int{3}, 3)},
		{"flags", func() []byte { b := rawBatch(1, 14, []int{3}, 3); b[3] = 1; return b }(), errFlags, rawBatch(1, 14, []int{3}, 3)},
		// Count 0 with a header length of 12 and no packets would be
		// "consistent" for every other check.
		{"count zero", rawBatch(0, 12, nil, 0), errCount, rawBatch(1, 14, []int{3}, 3)},
		// The header claims less room than its length table.
		// The packets would start inside the table; their lengths add up
		// to the rest of the message counted from that start.
		{"header shorter than its table", rawBatch(2, 13, []int{3, 3}, 3), errHdrLen, rawBatch(2, 16, []int{1, 2}, 3)},
		// A 12-byte message whose header says one packet and a 14-byte
		// header: only the header-past-the-end rule stands between it and
		// a length table read past the message (its capacity is exactly
		// 12, so that read is out of bounds and panics).
		{"header past the end", rawBatch(1, 14, []int{1}, 0)[:12:12], errHdrLen, rawBatch(1, 14, []int{1}, 1)},
		// The header length fits its table but not the message: the
		// total-length check would reject it too, but must not be the one.
		{"header past the end, table inside", rawBatch(1, 20, []int{2}, 2), errHdrLen, rawBatch(1, 14, []int{2}, 2)},
		// A zero-length packet among others whose lengths add up to the
		// rest of the message exactly: only the zero-length rule rejects it.
		{"zero length", rawBatch(3, 18, []int{2, 0, 3}, 5), errZeroLen, rawBatch(3, 18, []int{2, 1, 2}, 5)},
		{"zero length first", rawBatch(2, 16, []int{0, 4}, 4), errZeroLen, rawBatch(2, 16, []int{1, 3}, 4)},
		{"lengths too long", rawBatch(2, 16, []int{2, 3}, 4), errTotalLen, rawBatch(2, 16, []int{2, 2}, 4)},
		{"lengths too short", rawBatch(2, 16, []int{2, 1}, 4), errTotalLen, rawBatch(2, 16, []int{2, 2}, 4)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			check := func(what string, f func() error) {
				t.Helper()
				var err error
				func() {
					defer func() {
						if p := recover(); p != nil {
							t.Fatalf("%s panicked: %v", what, p)
						}
					}()
					err = f()
				}()
				if err != c.want {
					t.Fatalf("%s: %v, want %q", what, err, c.want.What)
				}
			}
			check("ParseHeader", func() error { _, err := ParseHeader(c.msg); return err })
			dst := make([][]byte, 0, 4)
			check("Split", func() error {
				out, _, err := Split(dst, c.msg)
				if len(out) != 0 {
					t.Errorf("Split returned %d packets with the error", len(out))
				}
				return err
			})
			if c.repair == nil {
				return
			}
			h, err := ParseHeader(c.repair)
			if err != nil {
				t.Fatalf("repaired batch refused: %v", err)
			}
			pkts, _, err := Split(dst, c.repair)
			total := 0
			for _, p := range pkts {
				total += len(p)
			}
			if err != nil || len(pkts) != h.Count || total != len(c.repair)-h.Len {
				t.Fatalf("repaired batch split into %d packets of %d bytes, %v", len(pkts), total, err)
			}
		})
	}
}
