package wire

import (
	"fmt"
	"io"

	"github.com/weft-io/weft/fabric"
)

// Reason says why a packet was rejected: it is the Code of the
// *fabric.MalformedError of the parsing functions.
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

// parseErrs holds the one error per reason.
var parseErrs = fabric.NewMalformedSet("roce/wire packet", []string{
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
}...)

// String returns a short description of the reason.
func (r Reason) String() string { return parseErrs.What(int(r)) }

// malformed returns the error of [Parse], [VerifyICRC] and the other
// parsing functions for malformed input: a *fabric.MalformedError with
// Where "roce/wire packet" and Code r, which matches fabric.ErrMalformed.
// It is preallocated, one per Reason, so rejecting a packet does not
// allocate; use errors.As to read the Reason (Code), for example to count
// drops by cause.
func malformed(r Reason) error { return parseErrs[r] }

// Errors of the builders, which report bad arguments rather than bad input.
var (
	// ErrShortBuffer is io.ErrShortBuffer: the buffer given to a builder
	// cannot hold the packet.
	ErrShortBuffer = io.ErrShortBuffer

	errBuildOpCode  = fmt.Errorf("roce/wire: unsupported opcode: %w", fabric.ErrInvalid)
	errBuildPayload = fmt.Errorf("roce/wire: payload on an opcode without payload: %w", fabric.ErrInvalid)
)
