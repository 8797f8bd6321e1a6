package batch

import (
	"encoding/binary"

	"github.com/weft-io/weft/fabric"
)

// Wire-format constants (see the package documentation).
const (
	// Imm is the immediate data that marks a message as a batch.
	Imm uint32 = 0x57420001
	// Version is the header version this package writes and accepts.
	Version = 1
	// FixedHeaderSize is the size of the header without the length table.
	FixedHeaderSize = 12
	// MaxPacketLen is the largest packet a batch can carry.
	MaxPacketLen = 65535
	// MaxCount is the largest packet count the header can describe.
	MaxCount = (65535 - FixedHeaderSize) / 2

	magic0, magic1 = 'W', 'B'
)

// HeaderSize returns the size of the header of a batch of n packets.
func HeaderSize(n int) int { return FixedHeaderSize + 2*n }

// Header is a parsed batch header.
type Header struct {
	// Version is the format version (1).
	Version uint8
	// Flags are the header flags (0 in version 1).
	Flags uint8
	// Count is the number of packets.
	Count int
	// Len is the header length in bytes, the offset of the first packet.
	Len int
	// Seq is the sender's batch sequence number.
	Seq uint32
}

// errWhere is the Where of the errors of a malformed batch.
const errWhere = "batch"

// The errors of a malformed batch are values, so a flood of bad batches
// allocates nothing.
var (
	errShort    = &fabric.MalformedError{Where: errWhere, What: "shorter than the fixed header"}
	errMagic    = &fabric.MalformedError{Where: errWhere, What: "bad magic"}
	errVersion  = &fabric.MalformedError{Where: errWhere, What: "unknown version"}
	errFlags    = &fabric.MalformedError{Where: errWhere, What: "reserved flags set"}
	errCount    = &fabric.MalformedError{Where: errWhere, What: "packet count is zero"}
	errHdrLen   = &fabric.MalformedError{Where: errWhere, What: "header length does not fit its length table or the message"}
	errZeroLen  = &fabric.MalformedError{Where: errWhere, What: "zero-length packet"}
	errTotalLen = &fabric.MalformedError{Where: errWhere, What: "packet lengths do not add up to the message length"}
	errNotBatch = &fabric.MalformedError{Where: errWhere, What: "message does not carry the batch immediate"}
)

// putHeader writes the fixed part of a header for count packets; the
// length table is written as packets are added.
func putHeader(b []byte, count int, seq uint32) {
	b[0], b[1], b[2], b[3] = magic0, magic1, Version, 0
	binary.LittleEndian.PutUint16(b[4:], uint16(count))
	binary.LittleEndian.PutUint16(b[6:], uint16(HeaderSize(count)))
	binary.LittleEndian.PutUint32(b[8:], seq)
}

// ParseHeader validates msg, a whole batch message (header and packets),
// and returns its header. It checks every field and that the packet
// lengths add up to exactly the rest of the message, so a caller may then
// walk the packets without further checks. The error is a
// *fabric.MalformedError (Where "batch").
func ParseHeader(msg []byte) (Header, error) {
	if len(msg) < FixedHeaderSize {
		return Header{}, errShort
	}
	if msg[0] != magic0 || msg[1] != magic1 {
		return Header{}, errMagic
	}
	if msg[2] != Version {
		return Header{}, errVersion
	}
	if msg[3] != 0 {
		return Header{}, errFlags
	}
	h := Header{Version: msg[2], Flags: msg[3],
		Count: int(binary.LittleEndian.Uint16(msg[4:])),
		Len:   int(binary.LittleEndian.Uint16(msg[6:])),
		Seq:   binary.LittleEndian.Uint32(msg[8:])}
	if h.Count == 0 {
		return Header{}, errCount
	}
	if h.Len < HeaderSize(h.Count) || h.Len > len(msg) {
		return Header{}, errHdrLen
	}
	total := 0
	lens := msg[FixedHeaderSize : FixedHeaderSize+2*h.Count]
	for i := 0; i < len(lens); i += 2 {
		n := int(binary.LittleEndian.Uint16(lens[i:]))
		if n == 0 {
			return Header{}, errZeroLen
		}
		total += n
	}
	if total != len(msg)-h.Len {
		return Header{}, errTotalLen
	}
	return h, nil
}

// packetLen returns the length of packet i of a validated batch.
func packetLen(msg []byte, i int) int {
	return int(binary.LittleEndian.Uint16(msg[FixedHeaderSize+2*i:]))
}

// Split validates msg, a whole batch message, and appends a view of each
// of its packets to dst. The views alias msg. On error dst is returned
// unchanged with a *fabric.MalformedError. It allocates only if dst must
// grow.
//
// Split is for programs that receive batches their own way; a Splitter
// does the same over an endpoint, with receive buffer management.
func Split(dst [][]byte, msg []byte) ([][]byte, Header, error) {
	h, err := ParseHeader(msg)
	if err != nil {
		return dst, h, err
	}
	off := h.Len
	for i := 0; i < h.Count; i++ {
		n := packetLen(msg, i)
		dst = append(dst, msg[off:off+n:off+n])
		off += n
	}
	return dst, h, nil
}
