package rndv

import (
	"encoding/binary"

	"github.com/weft-io/weft/fabric"
)

// The kinds of frame. Every frame starts with a Header; DATA carries
// payload after it.
const (
	// kindData carries a message, or a fragment of one, inline: Total is
	// the message's length, the payload follows the header.
	kindData uint8 = iota + 1
	// kindRTS (request to send) announces a message of Total bytes that
	// the sender wants to move by rendezvous. The receiver answers with
	// ADV.
	kindRTS
	// kindADV advertises the receive buffer of message Seq: Addr, Len and
	// Key name remote memory the sender may write (FlagEager clear), or
	// the receiver asks for the message inline (FlagEager set; Len is the
	// buffer's size).
	kindADV
	numKinds
)

var kindNames = [numKinds]string{"", "DATA", "RTS", "ADV"}

// Header flags.
const (
	// flagEager, on ADV: no remote buffer; send the message as DATA.
	flagEager uint8 = 1 << iota
)

// Frame sizes.
const (
	// HeaderLen is the length of DATA and RTS headers.
	HeaderLen = 16
	// ADVLen is the length of an ADV frame.
	ADVLen = 40
)

// Byte offsets of the header fields.
const (
	offKind  = 0
	offFlags = 1
	offSeq   = 4
	offTotal = 8  // DATA, RTS: the message's length
	offAddr  = 16 // ADV only
	offLen   = 24
	offKey   = 32
)

// Header is a typed view of a frame:
//
//	byte 0      kind (DATA 1, RTS 2, ADV 3)
//	byte 1      flags (ADV: 1 = eager)
//	bytes 2-3   zero
//	bytes 4-7   Seq: the message's number, counted from 0 by the sender
//	bytes 8-15  Total: the message's length (DATA, RTS; zero in ADV)
//	bytes 16-39 ADV only: Addr, Len, Key of the advertised buffer
//
// Multi-byte fields are big-endian. The accessors require IsValid.
type Header []byte

// IsValid reports whether h is a well-formed frame: a known kind, zero
// reserved bytes, the kind's length, and (DATA) no more payload than the
// message holds, (ADV) only known flags.
func (h Header) IsValid() bool {
	if len(h) < HeaderLen || h[2] != 0 || h[3] != 0 {
		return false
	}
	switch h.Kind() {
	case kindData:
		return h[offFlags] == 0 && uint64(len(h)-HeaderLen) <= h.Total()
	case kindRTS:
		return len(h) == HeaderLen && h[offFlags] == 0
	case kindADV:
		return len(h) == ADVLen && h[offFlags]&^flagEager == 0 && h.Total() == 0
	}
	return false
}

// Kind returns the frame's kind.
func (h Header) Kind() uint8 { return h[offKind] }

// Eager reports the ADV flag asking for the message inline.
func (h Header) Eager() bool { return h[offFlags]&flagEager != 0 }

// Seq returns the message number.
func (h Header) Seq() uint32 { return binary.BigEndian.Uint32(h[offSeq:]) }

// Total returns the message length of DATA and RTS.
func (h Header) Total() uint64 { return binary.BigEndian.Uint64(h[offTotal:]) }

// Payload returns the bytes after a DATA header.
func (h Header) Payload() []byte { return h[HeaderLen:] }

// Addr, Len and Key return the ADV's remote buffer.
func (h Header) Addr() uint64 { return binary.BigEndian.Uint64(h[offAddr:]) }

// Len returns the advertised buffer's length.
func (h Header) Len() uint64 { return binary.BigEndian.Uint64(h[offLen:]) }

// Key returns the advertised buffer's remote key.
func (h Header) Key() uint64 { return binary.BigEndian.Uint64(h[offKey:]) }

// Remote returns the ADV's buffer as an RMA target.
func (h Header) Remote() fabric.RemoteIOV {
	return fabric.RemoteIOV{Addr: h.Addr(), Len: h.Len(), Key: fabric.Key(h.Key())}
}

// encode writes a header of kind into h (HeaderLen or ADVLen bytes) and
// returns the frame's header length.
func (h Header) encode(kind, flags uint8, seq uint32, total uint64) int {
	h[offKind], h[offFlags], h[2], h[3] = kind, flags, 0, 0
	binary.BigEndian.PutUint32(h[offSeq:], seq)
	binary.BigEndian.PutUint64(h[offTotal:], total)
	return HeaderLen
}

// encodeADV writes an ADV for message seq into h.
func (h Header) encodeADV(seq uint32, eager bool, addr, n, key uint64) int {
	var f uint8
	if eager {
		f = flagEager
	}
	h.encode(kindADV, f, seq, 0)
	binary.BigEndian.PutUint64(h[offAddr:], addr)
	binary.BigEndian.PutUint64(h[offLen:], n)
	binary.BigEndian.PutUint64(h[offKey:], key)
	return ADVLen
}

// The immediate data of a rendezvous write: the message number's low 24
// bits, and flags.
const (
	immSeqMask   = 1<<24 - 1
	immLast      = 1 << 30 // the message's last write
	immTruncated = 1 << 31 // the message was longer than the buffer
	immReserved  = 0x3f << 24
)
