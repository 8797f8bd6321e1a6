package sock

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/weft-io/weft/fabric"
)

// Frame types.
const (
	frameHello  = 1 + iota // payload: magic, version, window
	frameData              // payload: stream bytes (at least one)
	frameCredit            // credit grant only
	frameFin               // the sender will send no more data
	frameClose             // the sender closed the connection
	frameRst               // the sender found a protocol violation; payload: reason
	framePing              // liveness probe; the peer answers PONG
	framePong              // answer to PING
	frameWindow            // the sender's receive window grew; payload: the new window
	numFrameTypes
)

var frameNames = [numFrameTypes]string{"", "HELLO", "DATA", "CREDIT", "FIN", "CLOSE", "RST", "PING", "PONG", "WINDOW"}

// Frame flags.
const (
	// flagStarved, on DATA only: this frame used the last of the
	// sender's credit and its writer has more to send. The receiver
	// grows its window when it also finds its application keeping up
	// (see Conn.growLocked).
	flagStarved = 1 << 0
)

const (
	// hdrLen is the size of the frame header:
	//
	//	type[1] flags[1] reserved[2] credit[4, little endian]
	hdrLen = 8
	// helloLen is the payload of HELLO: magic[8] version[4] window[4].
	helloLen = 16
	// windowLen is the payload of WINDOW: window[4, little endian].
	windowLen   = 4
	helloMagic  = "WEFTSOCK"
	version     = 2 // 2: WINDOW and flagStarved
	maxRstLen   = 64
	maxWindow   = 1 << 30
	minWindow   = 4096
	maxFrameLen = 1 << 20
)

// Errors. They are wrapped in a *ProtocolError and then in a *net.OpError
// by the calls that report them.
var (
	// ErrCreditOverrun reports a peer that sent more data than its credit
	// allowed. It matches fabric.ErrMalformed.
	ErrCreditOverrun = fmt.Errorf("credit overrun: %w", fabric.ErrMalformed)
	// ErrStalled reports a peer that sent nothing, not even an answer to
	// a keep-alive probe, for Config.StallTimeout. It matches
	// fabric.ErrPeerGone.
	ErrStalled = fmt.Errorf("peer stalled: %w", fabric.ErrPeerGone)
	// ErrReset reports that the peer reset the connection because it
	// found a protocol violation in what this side sent.
	ErrReset = errors.New("connection reset by peer")
	// ErrPeerClosed is returned by Write after the peer closed the
	// connection: nobody reads what would be written. It is
	// fabric.ErrPeerClosed, and matches fabric.ErrPeerGone.
	ErrPeerClosed = fabric.ErrPeerClosed
	// ErrWriteClosed is returned by Write after CloseWrite.
	ErrWriteClosed = errors.New("write after CloseWrite")
)

// ProtocolError is the cause of a connection closed because the peer
// broke the protocol or stopped answering. Err matches ErrCreditOverrun,
// fabric.ErrMalformed, ErrStalled or ErrReset.
type ProtocolError struct {
	// Reason describes the violation.
	Reason string
	// Err is the class of violation.
	Err error
}

// Error implements error.
func (e *ProtocolError) Error() string { return "sock: " + e.Reason + ": " + e.Err.Error() }

// Unwrap returns Err.
func (e *ProtocolError) Unwrap() error { return e.Err }

// header is a parsed frame header.
type header struct {
	typ    uint8
	flags  uint8
	credit uint32
}

func putHeader(b []byte, typ uint8, credit uint32) {
	b[0], b[1], b[2], b[3] = typ, 0, 0, 0
	binary.LittleEndian.PutUint32(b[4:], credit)
}

// parseFrame validates a frame's header and the payload length its type
// allows, and returns the header and the payload. It never allocates on
// success.
func parseFrame(b []byte) (header, []byte, error) {
	if len(b) < hdrLen {
		return header{}, nil, errShort
	}
	h := header{typ: b[0], flags: b[1], credit: binary.LittleEndian.Uint32(b[4:])}
	if h.typ == 0 || h.typ >= numFrameTypes {
		return h, nil, errType
	}
	allowed := uint8(0)
	if h.typ == frameData {
		allowed = flagStarved
	}
	if h.flags&^allowed != 0 || b[2] != 0 || b[3] != 0 {
		return h, nil, errReserved
	}
	p := b[hdrLen:]
	switch h.typ {
	case frameHello:
		if len(p) != helloLen {
			return h, nil, errLength
		}
		if string(p[:8]) != helloMagic {
			return h, nil, errMagic
		}
	case frameData:
		if len(p) == 0 || len(p) > maxFrameLen {
			return h, nil, errLength
		}
	case frameWindow:
		if len(p) != windowLen {
			return h, nil, errLength
		}
	case frameRst:
		if len(p) > maxRstLen {
			return h, nil, errLength
		}
	default:
		if len(p) != 0 {
			return h, nil, errLength
		}
	}
	if h.credit > maxWindow {
		return h, nil, errCredit
	}
	return h, p, nil
}

// Parse errors, preallocated so that rejecting a frame does not allocate
// before the connection is torn down.
var (
	errShort    = &ProtocolError{"frame shorter than its header", fabric.ErrMalformed}
	errType     = &ProtocolError{"unknown frame type", fabric.ErrMalformed}
	errReserved = &ProtocolError{"reserved header bits set", fabric.ErrMalformed}
	errLength   = &ProtocolError{"bad payload length for the frame type", fabric.ErrMalformed}
	errMagic    = &ProtocolError{"bad HELLO magic", fabric.ErrMalformed}
	errCredit   = &ProtocolError{"credit grant above the largest window", fabric.ErrMalformed}
)

// parseHello returns the version and window of a HELLO payload (already
// length- and magic-checked by parseFrame).
func parseHello(p []byte) (ver, window uint32, err error) {
	ver = binary.LittleEndian.Uint32(p[8:])
	window = binary.LittleEndian.Uint32(p[12:])
	switch {
	case ver != version:
		return ver, window, &ProtocolError{fmt.Sprintf("protocol version %d, want %d", ver, version), fabric.ErrMalformed}
	case window < minWindow || window > maxWindow:
		return ver, window, &ProtocolError{fmt.Sprintf("window %d outside [%d, %d]", window, minWindow, maxWindow), fabric.ErrMalformed}
	}
	return ver, window, nil
}

func putHello(b []byte, window uint32) int {
	putHeader(b, frameHello, 0)
	copy(b[hdrLen:], helloMagic)
	binary.LittleEndian.PutUint32(b[hdrLen+8:], version)
	binary.LittleEndian.PutUint32(b[hdrLen+12:], window)
	return hdrLen + helloLen
}
