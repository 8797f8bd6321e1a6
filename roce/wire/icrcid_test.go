package wire

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// TestICRCWithIPv4ID checks the linear fix-up of an ICRC for a new IPv4
// identification against the ICRC computed afresh, over packet sizes from
// the smallest to 64 KiB.
func TestICRCWithIPv4ID(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{BTHSize + ICRCSize, 20, 80, 1024 + 16, 4096 + 32, 8192, 65000} {
		pkt := make([]byte, 28+n)
		for i := range pkt {
			pkt[i] = byte(r.IntN(256))
		}
		pkt[0] = 0x45
		binary.BigEndian.PutUint16(pkt[2:], uint16(28+n))
		binary.BigEndian.PutUint16(pkt[24:], uint16(8+n))
		for _, ids := range [][2]uint16{{0, 1}, {0, 63}, {7, 0}, {0x1234, 0xfedc}, {5, 5}} {
			binary.BigEndian.PutUint16(pkt[4:], ids[0])
			old, _ := ICRC(pkt)
			binary.BigEndian.PutUint16(pkt[4:], ids[1])
			want, _ := ICRC(pkt)
			if got := ICRCWithIPv4ID(old, ids[0], ids[1], 8+n); got != want || ICRCWithIPv4IDShift(old, ids[0], ids[1], IPv4IDShift(8+n)) != want {
				t.Errorf("udp length %d, id %#x -> %#x: %#08x, want %#08x", 8+n, ids[0], ids[1], got, want)
			}
		}
	}
}

func BenchmarkICRCWithIPv4ID(b *testing.B) {
	for b.Loop() {
		benchSinkU32 = ICRCWithIPv4ID(benchSinkU32, 0, 17, 4096+40)
	}
}

func BenchmarkICRCWithIPv4IDShift(b *testing.B) {
	shift := IPv4IDShift(4096 + 40)
	for b.Loop() {
		benchSinkU32 = ICRCWithIPv4IDShift(benchSinkU32, 0, 17, shift)
	}
}

var benchSinkU32 uint32

// TestIPv4IDs finds the identification a packet's ICRC was computed with.
func TestIPv4IDs(t *testing.T) {
	var ids IPv4IDs
	for _, n := range []int{80, 1040, 80, 4128} {
		pkt := make([]byte, 28+n)
		pkt[0] = 0x45
		binary.BigEndian.PutUint16(pkt[2:], uint16(28+n))
		binary.BigEndian.PutUint16(pkt[24:], uint16(8+n))
		c0, _ := ICRC(pkt)
		for _, id := range []uint16{0, 1, 2, 37, 63, 64, 0x1234} {
			binary.BigEndian.PutUint16(pkt[4:], id)
			want, _ := ICRC(pkt)
			got, ok := ids.Find(8+n, c0, want)
			if ok != (id < 64) || (ok && got != id) {
				t.Errorf("udp length %d, id %d: found %d, %v", 8+n, id, got, ok)
			}
			if id < 64 && c0^ids.Delta(8+n, id) != want {
				t.Errorf("udp length %d, id %d: Delta wrong", 8+n, id)
			}
		}
	}
}
