package wire

import (
	"encoding/binary"
	"hash/crc32"
)

// The invariant CRC is CRC-32 (the IEEE polynomial, as in Ethernet and
// hash/crc32) over
//
//	8 bytes of 0xFF          (the masked LRH of InfiniBand)
//	IP header                with the variant fields set to ones
//	UDP header               with the checksum set to ones
//	BTH                      with byte 4 (FECN, BECN, reserved) set to ones
//	the rest of the packet   up to the ICRC
//
// The variant IP fields are, for IPv4, TOS (DSCP and ECN), TTL and the
// header checksum; for IPv6, the traffic class, the flow label and the hop
// limit. The CRC value is carried in the last four bytes of the packet in
// little-endian byte order (the byte order in which the CRC register is
// shifted out), as Linux rxe and scapy write it.

const (
	ipv4MinHeader = 20
	ipv4MaxHeader = 60
	ipv6Header    = 40
	udpHeader     = 8

	// maxMasked is the longest span of masked headers: an IPv4 header
	// with the largest options, a UDP header and a BTH.
	maxMasked = ipv4MaxHeader + udpHeader + BTHSize
)

// icrcSeed is the CRC (in hash/crc32's convention) of the eight 0xFF bytes
// that stand for the masked LRH.
var icrcSeed = crc32.ChecksumIEEE([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})

// slicing8 holds the tables of the slicing-by-8 CRC-32 algorithm for the
// reflected IEEE polynomial. The masked headers are hashed with it from a
// buffer on the stack: hash/crc32 would move such a buffer to the heap,
// because it calls its implementation through a function variable.
var slicing8 = func() *[8][256]uint32 {
	t := new([8][256]uint32)
	t[0] = *crc32.IEEETable
	for i := range 256 {
		c := t[0][i]
		for k := 1; k < 8; k++ {
			c = t[0][c&0xff] ^ c>>8
			t[k][i] = c
		}
	}
	return t
}()

// update8 advances the CRC register crc (not inverted) over p.
func update8(crc uint32, p []byte) uint32 {
	t := slicing8
	for len(p) >= 8 {
		crc ^= binary.LittleEndian.Uint32(p)
		crc = t[7][crc&0xff] ^ t[6][crc>>8&0xff] ^ t[5][crc>>16&0xff] ^ t[4][crc>>24] ^
			t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]]
		p = p[8:]
	}
	for _, v := range p {
		crc = t[0][byte(crc)^v] ^ crc>>8
	}
	return crc
}

// ipHeaderLen returns the length of the IP header that starts pkt, and
// whether it is IPv6.
func ipHeaderLen(pkt []byte) (n int, v6 bool, ok bool) {
	if len(pkt) == 0 {
		return 0, false, false
	}
	switch pkt[0] >> 4 {
	case 4:
		n = int(pkt[0]&0x0f) * 4
		return n, false, n >= ipv4MinHeader
	case 6:
		return ipv6Header, true, true
	}
	return 0, false, false
}

// ICRCParts computes the invariant CRC of a RoCEv2 packet held in two
// pieces, so that a sender can hash headers and payload that live in
// different buffers. hdr starts with the IPv4 or IPv6 header (the version
// is read from its first byte) and must extend at least through the BTH;
// the UDP header must directly follow the IP header. rest continues the
// packet up to, but not including, the ICRC. Either may be longer than its
// minimum: the split point does not matter.
//
// The result is the value to store, little-endian, in the packet's last
// four bytes. ICRCParts does not allocate; the only error is a
// *fabric.MalformedError with Code ReasonIPHeader.
func ICRCParts(hdr, rest []byte) (uint32, error) {
	ipLen, v6, ok := ipHeaderLen(hdr)
	n := ipLen + udpHeader + BTHSize
	if !ok || len(hdr) < n {
		return 0, malformed(ReasonIPHeader)
	}
	var buf [maxMasked]byte
	m := buf[:n]
	copy(m, hdr)
	if v6 {
		m[0] |= 0x0f                        // traffic class, high nibble
		m[1], m[2], m[3] = 0xff, 0xff, 0xff // traffic class low nibble, flow label
		m[7] = 0xff                         // hop limit
	} else {
		m[1] = 0xff               // TOS
		m[8] = 0xff               // TTL
		m[10], m[11] = 0xff, 0xff // header checksum
	}
	m[ipLen+6], m[ipLen+7] = 0xff, 0xff // UDP checksum
	m[ipLen+udpHeader+bthResv8a] = 0xff // BTH FECN, BECN, reserved
	crc := update8(^icrcSeed, m)
	crc = updateAny(crc, hdr[n:])
	return ^updateAny(crc, rest), nil
}

// clmulMin is the length from which hash/crc32 is faster than update8: on
// amd64 it uses carry-less multiplication from 64 bytes on (below that,
// slicing-by-8 as update8 does), but a call costs some 20 ns.
const clmulMin = 64

// updateAny advances the CRC register crc (not inverted) over p, with
// hash/crc32 for long inputs and update8 for short ones.
func updateAny(crc uint32, p []byte) uint32 {
	if len(p) < clmulMin {
		return update8(crc, p)
	}
	return ^crc32.Update(^crc, crc32.IEEETable, p)
}

// ICRC computes the invariant CRC of a RoCEv2 packet. pkt holds the IP
// packet: it starts with the IPv4 or IPv6 header, the UDP header directly
// follows, and it ends with the four bytes of the ICRC, whose content is
// ignored. ICRC checks only that the headers it masks are present.
//
// The result is the value carried, little-endian, in the last four bytes
// of the packet. ICRC does not allocate.
func ICRC(pkt []byte) (uint32, error) {
	if len(pkt) < ICRCSize {
		return 0, malformed(ReasonIPHeader)
	}
	return ICRCParts(pkt[:len(pkt)-ICRCSize], nil)
}

// PutICRC computes the invariant CRC of pkt (laid out as for [ICRC]) and
// stores it in the last four bytes. Call it after every other field of the
// packet, IP and UDP headers included, is final; the fields that ICRC
// masks (IP checksum, TTL, UDP checksum, ...) may still change afterwards.
func PutICRC(pkt []byte) error {
	crc, err := ICRC(pkt)
	if err != nil {
		return err
	}
	binary.LittleEndian.PutUint32(pkt[len(pkt)-ICRCSize:], crc)
	return nil
}

// VerifyICRC checks the invariant CRC of pkt (laid out as for [ICRC]). It
// returns nil if the packet's last four bytes hold the right value, and
// otherwise a *fabric.MalformedError (Code ReasonICRC, or ReasonIPHeader
// if pkt has no IP, UDP and BTH headers) that matches
// fabric.ErrMalformed. It does not allocate.
func VerifyICRC(pkt []byte) error {
	crc, err := ICRC(pkt)
	if err != nil {
		return err
	}
	if binary.LittleEndian.Uint32(pkt[len(pkt)-ICRCSize:]) != crc {
		return malformed(ReasonICRC)
	}
	return nil
}

// ICRCWithIPv4ID returns the invariant CRC that an IPv4 packet whose ICRC
// is icrc carries once its identification field changes from oldID to
// newID, everything else unchanged. udpLen is the packet's UDP length
// (header, BTH, payload and ICRC); the IP header has no options. The CRC
// is linear: the change is the CRC (from a zero register) of the XOR of
// the two identifications, shifted over the bytes hashed after them. It
// costs some 100 ns, whatever the packet's size: a UDP GSO sender (whose
// segments the kernel numbers 0, 1, 2, ...) fixes up each segment's ICRC
// with it, and a receiver of a GRO datagram checks the other numbering.
func ICRCWithIPv4ID(icrc uint32, oldID, newID uint16, udpLen int) uint32 {
	return ICRCWithIPv4IDShift(icrc, oldID, newID, IPv4IDShift(udpLen))
}

// IPv4IDShift is the part of ICRCWithIPv4ID that depends on the UDP
// length only (about 1 µs), for packets of one length: the segments of a
// GSO send or a GRO datagram all have the length of the first but the
// last.
func IPv4IDShift(udpLen int) uint32 {
	// The identification is bytes 4-5 of the IP header; after it come 14
	// bytes of IP header and the UDP datagram up to its ICRC.
	return x8nModP(uint64(ipv4MinHeader - 6 + udpLen - ICRCSize))
}

// ICRCWithIPv4IDShift is ICRCWithIPv4ID with the shift of IPv4IDShift.
func ICRCWithIPv4IDShift(icrc uint32, oldID, newID uint16, shift uint32) uint32 {
	d := oldID ^ newID
	if d == 0 {
		return icrc
	}
	reg := t0Update2(d)
	return icrc ^ multModP(shift, reg)
}

// t0Update2 is update8(0, the two bytes of d, big-endian), without the
// slice.
func t0Update2(d uint16) uint32 {
	t := &slicing8[0]
	crc := t[byte(d>>8)]
	return t[byte(crc)^byte(d)] ^ crc>>8
}

// crcPoly is the reflected IEEE polynomial.
const crcPoly = 0xedb88320

// multModP multiplies a and b modulo the CRC polynomial, in the reflected
// representation of zlib's crc32_combine (x^0 is the top bit).
func multModP(a, b uint32) uint32 {
	m := uint32(1) << 31
	var p uint32
	for {
		if a&m != 0 {
			p ^= b
			if a&(m-1) == 0 {
				break
			}
		}
		m >>= 1
		if b&1 != 0 {
			b = b>>1 ^ crcPoly
		} else {
			b >>= 1
		}
	}
	return p
}

// x2n[k] is x^(2^k) modulo the CRC polynomial.
var x2n = func() (t [64]uint32) {
	p := uint32(1) << 30 // x^1
	for k := range t {
		t[k] = p
		p = multModP(p, p)
	}
	return t
}()

// x8nModP returns x^(8n) modulo the CRC polynomial: shifting a CRC
// register over n zero bytes multiplies it by that.
func x8nModP(n uint64) uint32 {
	p := uint32(1) << 31 // x^0
	for k := 3; n != 0; k++ {
		if n&1 != 0 {
			p = multModP(x2n[k&63], p)
		}
		n >>= 1
	}
	return p
}

// IPv4IDs finds the IPv4 identification, among 0 to 63, that a packet's
// ICRC was computed with, where the receiver cannot see it (a UDP socket
// shows no IP header): the datagrams of a UDP GSO send carry 0, 1, 2, ...
// in the order of the send. It keeps the tables of the last two UDP
// lengths it was asked about (the datagrams of one send share one, and a
// shorter last one or an acknowledgement may follow). Accepting 64
// identifications rather than one lets a corrupted packet pass with
// probability 2^-26 instead of 2^-32.
type IPv4IDs struct {
	t    [2]idTable
	next int // the slot to replace
}

type idTable struct {
	udpLen int
	m      [64]uint32 // m[i]: the ICRC change from identification 0 to i
	last   int        // the identification last found
}

// Find returns the identification i in [0, 64) for which a packet of UDP
// length udpLen, whose ICRC computed with identification 0 is icrc0,
// carries want.
func (ids *IPv4IDs) Find(udpLen int, icrc0, want uint32) (uint16, bool) {
	d := icrc0 ^ want
	t := &ids.t[0]
	if d == 0 {
		if t.udpLen == udpLen {
			t.last = 0
		}
		return 0, true
	}
	if t.udpLen != udpLen {
		t = &ids.t[1]
	}
	if t.udpLen != udpLen {
		t = &ids.t[ids.next]
		ids.next ^= 1
		t.udpLen = udpLen
		shift := IPv4IDShift(udpLen)
		for b := 0; b < 6; b++ {
			m := multModP(shift, t0Update2(1<<b))
			for i := 0; i < 1<<b; i++ {
				t.m[1<<b|i] = t.m[i] ^ m
			}
		}
	}
	// The datagrams of a GRO message come in order: try the one after
	// the last found first.
	if h := (t.last + 1) & 63; t.m[h] == d {
		t.last = h
		return uint16(h), true
	}
	for i, m := range t.m[1:] {
		if m == d {
			t.last = i + 1
			return uint16(i + 1), true
		}
	}
	return 0, false
}

// Delta returns the change of the ICRC of a packet of UDP length udpLen
// from identification 0 to id (id < 64), from the same tables.
func (ids *IPv4IDs) Delta(udpLen int, id uint16) uint32 {
	if id == 0 {
		return 0
	}
	ids.Find(udpLen, 0, 1) // fills the table (1 is no change of the CRC)
	t := &ids.t[0]
	if t.udpLen != udpLen {
		t = &ids.t[1]
	}
	return t.m[id&63]
}
