package wire

import "encoding/binary"

// SplitIP locates a RoCEv2 packet in b, which starts with an IPv4 or IPv6
// header (for example a received Ethernet frame without its 14-byte
// header). It returns ip, the IP packet trimmed to the length its header
// gives (dropping the Ethernet padding that short frames carry), ready for
// [VerifyICRC], and udp, the UDP payload, ready for [Parse].
//
// SplitIP checks the IP version, header length and total length, that the
// protocol (IPv4) or next header (IPv6) is UDP with no IPv6 extension
// headers, that the IPv4 packet is not a fragment, and that the UDP length
// matches the IP payload length. It does not check ports or checksums. On
// failure the error is a *fabric.MalformedError (Code ReasonIPHeader or
// ReasonUDPHeader) that matches fabric.ErrMalformed. It does not
// allocate.
func SplitIP(b []byte) (ip, udp []byte, err error) {
	hl, v6, ok := ipHeaderLen(b)
	if !ok || len(b) < hl {
		return nil, nil, malformed(ReasonIPHeader)
	}
	var total int
	if v6 {
		total = ipv6Header + int(binary.BigEndian.Uint16(b[4:]))
		if b[6] != 17 {
			return nil, nil, malformed(ReasonIPHeader)
		}
	} else {
		total = int(binary.BigEndian.Uint16(b[2:]))
		if b[9] != 17 || binary.BigEndian.Uint16(b[6:])&0x3fff != 0 { // MF flag or fragment offset
			return nil, nil, malformed(ReasonIPHeader)
		}
	}
	if total < hl+udpHeader || total > len(b) {
		return nil, nil, malformed(ReasonIPHeader)
	}
	ip = b[:total]
	if int(binary.BigEndian.Uint16(ip[hl+4:])) != total-hl {
		return nil, nil, malformed(ReasonUDPHeader)
	}
	return ip, ip[hl+udpHeader:], nil
}
