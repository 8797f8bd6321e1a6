package ethernet

import "encoding/binary"

// Weft's transport header, carried after the Ethernet header (EtherType
// 0x88B5 by default) or after a UDP/IPv4 header. All fields are
// big-endian.
//
//	0  u8   magic 'W' (0x57)
//	1  u8   version (1)
//	2  u8   type: data, ack, hello, hello-ack, fin
//	3  u8   flags: first, last (fragment position), imm, nak
//	4  u32  session: the sender's random session id
//	8  u32  psn: packet sequence number (data)
//	12 u32  ack: the next psn the sender expects (cumulative ack)
//	16 u32  window: how many psns past ack the sender can take
//	20 u32  imm: immediate data (first fragment of a message)
const (
	hdrLen     = 24
	hdrMagic   = 0x57
	hdrVersion = 1
)

// Packet types.
const (
	ptData     = 1
	ptAck      = 2
	ptHello    = 3
	ptHelloAck = 4
	ptFin      = 5
)

// Packet flags.
const (
	pfFirst = 1 << 0
	pfLast  = 1 << 1
	pfImm   = 1 << 2
	pfNak   = 1 << 3
)

type hdr struct {
	typ, flags             uint8
	session, psn, ack, wnd uint32
	imm                    uint32
}

func putHdr(b []byte, h *hdr) {
	_ = b[hdrLen-1]
	b[0], b[1], b[2], b[3] = hdrMagic, hdrVersion, h.typ, h.flags
	binary.BigEndian.PutUint32(b[4:], h.session)
	binary.BigEndian.PutUint32(b[8:], h.psn)
	binary.BigEndian.PutUint32(b[12:], h.ack)
	binary.BigEndian.PutUint32(b[16:], h.wnd)
	binary.BigEndian.PutUint32(b[20:], h.imm)
}

func getHdr(b []byte, h *hdr) bool {
	if len(b) < hdrLen || b[0] != hdrMagic || b[1] != hdrVersion || b[2] < ptData || b[2] > ptFin {
		return false
	}
	h.typ, h.flags = b[2], b[3]
	h.session = binary.BigEndian.Uint32(b[4:])
	h.psn = binary.BigEndian.Uint32(b[8:])
	h.ack = binary.BigEndian.Uint32(b[12:])
	h.wnd = binary.BigEndian.Uint32(b[16:])
	h.imm = binary.BigEndian.Uint32(b[20:])
	return true
}

// seqLT reports a < b in 32-bit serial arithmetic.
func seqLT(a, b uint32) bool { return int32(a-b) < 0 }
