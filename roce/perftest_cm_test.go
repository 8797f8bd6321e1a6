package roce

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
)

// perftestDestSize is the size of perftest's key message in its rdma_cm
// modes (-R, -z): the C struct pingpong_dest as laid out on x86-64,
// sent as is in one SEND over the rdma_cm control connection. See
// INTEROP.md, section 10.
const perftestDestSize = 56

// perftestDest is that message: LID, outstanding reads, QPN, PSN and rkey
// as big-endian 32-bit words at 0..19, four bytes of padding (whatever
// the sender's stack held), the buffer's virtual address big-endian at
// 24, the GID at 32, the SRQ number and the GID index big-endian at 48
// and 52. The receiver reads neither of the last two, nor the padding.
type perftestDest struct {
	LID, OutReads, QPN, PSN, RKey uint32
	VA                            uint64
	GID                           [16]byte
	SRQN                          uint32
	GIDIndex                      int32
}

func (d perftestDest) marshal() []byte {
	b := make([]byte, perftestDestSize)
	for i, v := range []uint32{d.LID, d.OutReads, d.QPN, d.PSN, d.RKey} {
		binary.BigEndian.PutUint32(b[4*i:], v)
	}
	binary.BigEndian.PutUint64(b[24:], d.VA)
	copy(b[32:48], d.GID[:])
	binary.BigEndian.PutUint32(b[48:], d.SRQN)
	binary.BigEndian.PutUint32(b[52:], uint32(d.GIDIndex))
	return b
}

func parsePerftestDest(b []byte) (perftestDest, error) {
	var d perftestDest
	if len(b) != perftestDestSize {
		return d, fmt.Errorf("perftest key message of %d bytes, want %d", len(b), perftestDestSize)
	}
	for i, p := range []*uint32{&d.LID, &d.OutReads, &d.QPN, &d.PSN, &d.RKey} {
		*p = binary.BigEndian.Uint32(b[4*i:])
	}
	d.VA = binary.BigEndian.Uint64(b[24:])
	copy(d.GID[:], b[32:48])
	d.SRQN = binary.BigEndian.Uint32(b[48:])
	d.GIDIndex = int32(binary.BigEndian.Uint32(b[52:]))
	return d, nil
}

// perftestVersionMsg is perftest's version message: the version string
// in a 16-byte NUL-padded buffer.
func perftestVersionMsg(v string) []byte {
	b := make([]byte, 16)
	copy(b[:15], v)
	return b
}

func TestPerftestDest(t *testing.T) {
	d := perftestDest{LID: 0, OutReads: 1, QPN: 0x11, PSN: 0xabcdef, RKey: 0x1234,
		VA: 0x5570_7266_c000, GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 77, 14: 0, 15: 2}, GIDIndex: 1}
	b := d.marshal()
	want := []byte{
		0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0x11, 0, 0xab, 0xcd, 0xef, 0, 0, 0x12, 0x34, 0, 0, 0, 0,
		0, 0, 0x55, 0x70, 0x72, 0x66, 0xc0, 0,
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 2,
		0, 0, 0, 0, 0, 0, 0, 1,
	}
	if !bytes.Equal(b, want) {
		t.Fatalf("marshal:\n got % x\nwant % x", b, want)
	}
	// The padding is the sender's stack: ignored.
	b[20], b[23] = 0xde, 0xad
	got, err := parsePerftestDest(b)
	if err != nil || got != d {
		t.Fatalf("parse: %+v, %v; want %+v", got, err, d)
	}
	if _, err := parsePerftestDest(b[:55]); err == nil {
		t.Fatal("parsed a 55-byte message")
	}
	if v := perftestVersionMsg("6.06"); len(v) != 16 || string(v[:5]) != "6.06\x00" || v[15] != 0 {
		t.Fatalf("version message % x", v)
	}
}
