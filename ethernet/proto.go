package ethernet

import (
	"encoding/binary"

	"github.com/weft-io/weft/fabric"
)

// Weft's transport header, carried after the Ethernet header (EtherType
// 0x88B5 by default) or after a UDP/IPv4 header. All fields are
// big-endian.
//
//	0  u8   magic 'W' (0x57)
//	1  u8   version (2)
//	2  u8   type: data, ack, hello, hello-ack, fin, refuse
//	3  u8   flags: first, last (fragment position), imm, nak; in a
//	        hello, listener (for the receiver's listener only)
//	4  u32  session: the sender's connection id (random, nonzero)
//	8  u32  psn: packet sequence number (data)
//	12 u32  ack: the next psn the sender expects (cumulative ack)
//	16 u32  window: how many psns past ack the sender can take
//	20 u32  imm: immediate data (first fragment of a message)
//	24 u32  dst: the receiver's connection id (0 in a hello to a
//	        listener, or to a peer whose id is not known yet)
//
// Hello, hello-ack and refuse packets carry a 16-byte body after the
// header:
//
//	0  u64  nonce: the sender's handshake nonce (random, nonzero)
//	8  u64  echo: the receiver's nonce as last seen (0: not known)
//
// A hello-ack must echo the nonce of the side it completes, and a refuse
// must echo the nonce of the hello it refuses: a forged or replayed one
// does not and is dropped.
const (
	hdrLen     = 28
	hdrMagic   = 0x57
	hdrVersion = 2
	helloLen   = 16
)

// Packet types.
const (
	ptData     = 1
	ptAck      = 2
	ptHello    = 3
	ptHelloAck = 4
	ptFin      = 5
	ptRefuse   = 6
)

// Packet flags.
const (
	pfFirst = 1 << 0
	pfLast  = 1 << 1
	pfImm   = 1 << 2
	pfNak   = 1 << 3
	// pfListener marks a hello for the receiver's listener: no dialer
	// of the receiver's takes it as a symmetric open.
	pfListener = 1 << 4
)

// header is a view of Weft's transport header. The accessors require
// IsValid.
type header []byte

// IsValid reports whether h is long enough and carries the magic, the
// version and a known type.
func (h header) IsValid() bool {
	return len(h) >= hdrLen && h[0] == hdrMagic && h[1] == hdrVersion && h[2] >= ptData && h[2] <= ptRefuse
}

func (h header) typ() uint8      { return h[2] }
func (h header) flags() uint8    { return h[3] }
func (h header) session() uint32 { return binary.BigEndian.Uint32(h[4:]) }
func (h header) psn() uint32     { return binary.BigEndian.Uint32(h[8:]) }
func (h header) ack() uint32     { return binary.BigEndian.Uint32(h[12:]) }
func (h header) wnd() uint32     { return binary.BigEndian.Uint32(h[16:]) }
func (h header) imm() uint32     { return binary.BigEndian.Uint32(h[20:]) }
func (h header) dst() uint32     { return binary.BigEndian.Uint32(h[24:]) }
func (h header) payload() []byte { return h[hdrLen:] }
func (h header) handshake() bool {
	t := h.typ()
	return t == ptHello || t == ptHelloAck || t == ptRefuse
}
func (h header) body() helloBody  { return helloBody(h[hdrLen:]) }
func (h header) setDst(id uint32) { binary.BigEndian.PutUint32(h[24:], id) }

// helloBody is a view of the body of a handshake packet. The accessors
// require IsValid.
type helloBody []byte

// IsValid reports whether b is long enough and names a nonce.
func (b helloBody) IsValid() bool { return len(b) >= helloLen && b.nonce() != 0 }

func (b helloBody) nonce() uint64 { return binary.BigEndian.Uint64(b[0:]) }
func (b helloBody) echo() uint64  { return binary.BigEndian.Uint64(b[8:]) }

func putHello(b []byte, nonce, echo uint64) {
	binary.BigEndian.PutUint64(b[0:], nonce)
	binary.BigEndian.PutUint64(b[8:], echo)
}

// hdr is the decoded header the endpoint writes.
type hdr struct {
	typ, flags             uint8
	session, psn, ack, wnd uint32
	imm, dst               uint32
}

func putHdr(b []byte, h *hdr) {
	_ = b[hdrLen-1]
	b[0], b[1], b[2], b[3] = hdrMagic, hdrVersion, h.typ, h.flags
	binary.BigEndian.PutUint32(b[4:], h.session)
	binary.BigEndian.PutUint32(b[8:], h.psn)
	binary.BigEndian.PutUint32(b[12:], h.ack)
	binary.BigEndian.PutUint32(b[16:], h.wnd)
	binary.BigEndian.PutUint32(b[20:], h.imm)
	binary.BigEndian.PutUint32(b[24:], h.dst)
}

func getHdr(b []byte, h *hdr) bool {
	v := header(b)
	if !v.IsValid() {
		return false
	}
	h.typ, h.flags = v.typ(), v.flags()
	h.session, h.psn, h.ack, h.wnd = v.session(), v.psn(), v.ack(), v.wnd()
	h.imm, h.dst = v.imm(), v.dst()
	return true
}

// hsWhere is the Where of the errors of parseHandshake.
const hsWhere = "ethernet handshake"

// Why a handshake packet was refused: truncated, forged (a wrong nonce
// echo or connection id), replayed, or not a handshake at all.
// Preallocated so that refusing a flood of bad handshakes allocates
// nothing.
var (
	errHsTruncated = &fabric.MalformedError{Where: hsWhere, What: "truncated"}
	errHsHeader    = &fabric.MalformedError{Where: hsWhere, What: "bad header (magic, version or type)"}
	errHsType      = &fabric.MalformedError{Where: hsWhere, What: "not a handshake packet"}
	errHsSession   = &fabric.MalformedError{Where: hsWhere, What: "connection id 0"}
	errHsNonce     = &fabric.MalformedError{Where: hsWhere, What: "nonce 0"}
	errHsEcho      = &fabric.MalformedError{Where: hsWhere, What: "nonce echo does not match: forged or stale"}
	errHsDst       = &fabric.MalformedError{Where: hsWhere, What: "hello to a listener names a connection"}
	errHsReplay    = &fabric.MalformedError{Where: hsWhere, What: "replayed hello of a finished connection"}
)

// handshakeMsg is a parsed handshake packet.
type handshakeMsg struct {
	typ     uint8
	session uint32 // the sender's connection id
	dst     uint32 // ours, or 0
	nonce   uint64 // the sender's nonce
	echo    uint64 // our nonce as the sender saw it, or 0
	ack     uint32
	wnd     uint32
}

// parseHandshake parses a handshake packet (the Weft header and body,
// after the link headers). It does not allocate.
func parseHandshake(b []byte, m *handshakeMsg) error {
	if len(b) < hdrLen {
		return errHsTruncated
	}
	h := header(b)
	if !h.IsValid() {
		return errHsHeader
	}
	if !h.handshake() {
		return errHsType
	}
	if len(b) < hdrLen+helloLen {
		return errHsTruncated
	}
	body := h.body()
	if h.session() == 0 {
		return errHsSession
	}
	if !body.IsValid() {
		return errHsNonce
	}
	*m = handshakeMsg{typ: h.typ(), session: h.session(), dst: h.dst(), nonce: body.nonce(),
		echo: body.echo(), ack: h.ack(), wnd: h.wnd()}
	if m.typ == ptHelloAck && m.echo == 0 {
		return errHsEcho
	}
	if m.typ == ptRefuse && (m.dst == 0 || m.echo == 0) {
		return errHsEcho
	}
	return nil
}

// seqLT reports a < b in 32-bit serial arithmetic.
func seqLT(a, b uint32) bool { return int32(a-b) < 0 }
