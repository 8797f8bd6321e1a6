package wire

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
)

// TestSealICRC: SealICRC, over the headers PseudoHeaders rebuilds, puts
// the ICRC that PutICRC computes over the whole IPv4 (identification 0,
// don't fragment, as Linux sends) or IPv6 packet the payload travels in.
func TestSealICRC(t *testing.T) {
	payload := make([]byte, BTHSize+16+ICRCSize)
	for i := range payload {
		payload[i] = byte(3*i + 1)
	}
	const sport = 49152
	for _, c := range []struct{ src, dst string }{
		{"10.0.0.1", "10.0.0.2"},
		{"fd00::1", "fd00::2"},
	} {
		src, dst := netip.MustParseAddr(c.src), netip.MustParseAddr(c.dst)
		var pkt []byte
		if src.Is4() {
			ip := make([]byte, 20)
			ip[0] = 0x45
			binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
			ip[6] = 0x40 // don't fragment, identification 0
			ip[8], ip[9] = 64, 17
			s, d := src.As4(), dst.As4()
			copy(ip[12:], s[:])
			copy(ip[16:], d[:])
			pkt = ip
		} else {
			ip := make([]byte, 40)
			ip[0] = 0x60
			binary.BigEndian.PutUint16(ip[4:], uint16(8+len(payload)))
			ip[6], ip[7] = 17, 64
			s, d := src.As16(), dst.As16()
			copy(ip[8:], s[:])
			copy(ip[24:], d[:])
			pkt = ip
		}
		udp := make([]byte, 8)
		binary.BigEndian.PutUint16(udp[0:], sport)
		binary.BigEndian.PutUint16(udp[2:], UDPPort)
		binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
		pkt = append(append(pkt, udp...), payload...)
		if err := PutICRC(pkt); err != nil {
			t.Fatalf("%s: PutICRC: %v", c.src, err)
		}
		want := pkt[len(pkt)-ICRCSize:]
		data := bytes.Clone(payload)
		hbuf := make([]byte, 48+BTHSize)
		SealICRC(hbuf, data, src, dst, sport)
		if got := data[len(data)-ICRCSize:]; !bytes.Equal(got, want) {
			t.Errorf("%s to %s: SealICRC put %x, the packet's ICRC is %x", c.src, c.dst, got, want)
		}
	}
}
