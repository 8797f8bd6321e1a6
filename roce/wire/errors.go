package wire

import (
	"fmt"
	"io"

	"github.com/weft-io/weft/fabric"
)

// Reason says why a packet was rejected.
type Reason uint8

// Reasons for rejecting a packet.
const (
	ReasonShort     Reason = iota + 1 // shorter than a BTH and an ICRC
	ReasonUnaligned                   // length not a multiple of 4
	ReasonOpCode                      // opcode not supported (RD, XRC, reserved, vendor)
	ReasonTVer                        // transport header version not 0
	ReasonHeaders                     // shorter than the headers its opcode requires
	ReasonPayload                     // payload on an opcode that carries none
	ReasonPad                         // pad count larger than the payload, or set without a payload
	ReasonIPHeader                    // IP header missing, truncated, fragmented, of an unknown version or not followed by UDP
	ReasonUDPHeader                   // UDP length does not match the IP payload length
	ReasonICRC                        // ICRC mismatch
	numReasons
)

var reasonText = [numReasons]string{
	ReasonShort:     "packet shorter than BTH and ICRC",
	ReasonUnaligned: "packet length not a multiple of 4",
	ReasonOpCode:    "unsupported opcode",
	ReasonTVer:      "unsupported transport header version",
	ReasonHeaders:   "packet shorter than the headers of its opcode",
	ReasonPayload:   "payload on an opcode without payload",
	ReasonPad:       "invalid pad count",
	ReasonIPHeader:  "invalid IP header",
	ReasonUDPHeader: "invalid UDP length",
	ReasonICRC:      "ICRC mismatch",
}

// String returns a short description of the reason.
func (r Reason) String() string {
	if r < numReasons && reasonText[r] != "" {
		return reasonText[r]
	}
	return "unknown reason"
}

// ParseError is the error [Parse] and [VerifyICRC] return for malformed
// input. It matches [fabric.ErrMalformed] with errors.Is. The functions of
// this package return one preallocated *ParseError per Reason, so
// rejecting a packet does not allocate; use errors.As to read the Reason,
// for example to count drops by cause.
type ParseError struct {
	Reason Reason
}

// Error implements error.
func (e *ParseError) Error() string { return "roce/wire: " + e.Reason.String() }

// Unwrap returns fabric.ErrMalformed.
func (e *ParseError) Unwrap() error { return fabric.ErrMalformed }

// parseErrs holds the one error value per reason.
var parseErrs = func() (t [numReasons]*ParseError) {
	for r := range t {
		t[r] = &ParseError{Reason: Reason(r)}
	}
	return t
}()

func malformed(r Reason) error { return parseErrs[r] }

// Errors of the builders, which report bad arguments rather than bad input.
var (
	// ErrShortBuffer is io.ErrShortBuffer: the buffer given to a builder
	// cannot hold the packet.
	ErrShortBuffer = io.ErrShortBuffer

	errBuildOpCode  = fmt.Errorf("roce/wire: unsupported opcode: %w", fabric.ErrInvalid)
	errBuildPayload = fmt.Errorf("roce/wire: payload on an opcode without payload: %w", fabric.ErrInvalid)
)
