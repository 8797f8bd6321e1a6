package wire

import (
	"encoding/binary"
	"net/netip"
)

// PseudoHeaders writes into h the IP and UDP headers that a RoCEv2 UDP
// payload of n bytes travels in from src (UDP source port sport) to dst
// (port UDPPort), with the fields the ICRC masks left zero, IPv4
// identification 0 and don't-fragment, as Linux sends; it returns their
// length, 28 for IPv4 (both addresses IPv4) and 48 otherwise. h must hold
// 48 bytes. An engine that cannot see the IP header a datagram came in
// rebuilds it so, to check the ICRC.
func PseudoHeaders(h []byte, src, dst netip.Addr, sport uint16, n int) int {
	if src.Is4() && dst.Is4() {
		clear(h[:28])
		h[0] = 0x45
		binary.BigEndian.PutUint16(h[2:], uint16(28+n))
		h[6] = 0x40 // don't fragment, identification 0
		h[9] = 17   // UDP
		s, d := src.As4(), dst.As4()
		copy(h[12:16], s[:])
		copy(h[16:20], d[:])
		binary.BigEndian.PutUint16(h[20:], sport)
		binary.BigEndian.PutUint16(h[22:], UDPPort)
		binary.BigEndian.PutUint16(h[24:], uint16(8+n))
		return 28
	}
	clear(h[:48])
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(8+n))
	h[6] = 17
	s, d := src.As16(), dst.As16()
	copy(h[8:24], s[:])
	copy(h[24:40], d[:])
	binary.BigEndian.PutUint16(h[40:], sport)
	binary.BigEndian.PutUint16(h[42:], UDPPort)
	binary.BigEndian.PutUint16(h[44:], uint16(8+n))
	return 48
}

// SealICRC fills in the ICRC of the RoCEv2 UDP payload data (BTH to ICRC,
// at least BTHSize+ICRCSize bytes) sent from src, UDP source port sport,
// to dst, over the headers PseudoHeaders builds. hbuf is scratch space of
// at least 48+BTHSize bytes that the caller owns (on the heap: the CRC
// code lets it escape, so a stack array would be allocated per call).
func SealICRC(hbuf, data []byte, src, dst netip.Addr, sport uint16) {
	hl := PseudoHeaders(hbuf, src, dst, sport, len(data))
	copy(hbuf[hl:], data[:BTHSize])
	crc, _ := ICRCParts(hbuf[:hl+BTHSize], data[BTHSize:len(data)-ICRCSize])
	binary.LittleEndian.PutUint32(data[len(data)-ICRCSize:], crc)
}
