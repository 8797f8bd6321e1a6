package cm

import (
	"sync/atomic"

	"github.com/weft-io/weft/fabric"
)

// Reason says why a MAD was rejected by [ParseMAD].
type Reason uint8

// Reasons for dropping a MAD.
const (
	ReasonSize         Reason = iota + 1 // not exactly MADSize bytes
	ReasonBaseVersion                    // base version not 1
	ReasonClass                          // management class not CM
	ReasonClassVersion                   // CM class version not 2
	ReasonMethod                         // method not Send (or a response bit set)
	ReasonAttribute                      // attribute id not a CM message this package knows
	ReasonField                          // a field of the message is out of range
	ReasonCMAHeader                      // rdma_cm private-data header malformed
	numReasons
)

var reasonText = [numReasons]string{
	ReasonSize:         "MAD not 256 bytes",
	ReasonBaseVersion:  "unsupported MAD base version",
	ReasonClass:        "management class not CM",
	ReasonClassVersion: "unsupported CM class version",
	ReasonMethod:       "unsupported CM method",
	ReasonAttribute:    "unknown CM attribute",
	ReasonField:        "CM message field out of range",
	ReasonCMAHeader:    "malformed rdma_cm header",
}

// String returns a short description of the reason.
func (r Reason) String() string {
	if r < numReasons && reasonText[r] != "" {
		return reasonText[r]
	}
	return "unknown reason"
}

// ParseError is the error of the parsing functions. It matches
// fabric.ErrMalformed with errors.Is. One preallocated value exists per
// Reason, so rejecting a datagram does not allocate.
type ParseError struct {
	Reason Reason
}

// Error implements error.
func (e *ParseError) Error() string { return "roce/cm: " + e.Reason.String() }

// Unwrap returns fabric.ErrMalformed.
func (e *ParseError) Unwrap() error { return fabric.ErrMalformed }

var parseErrs = func() (t [numReasons]*ParseError) {
	for r := range t {
		t[r] = &ParseError{Reason: Reason(r)}
	}
	return t
}()

func malformed(r Reason) error { return parseErrs[r] }

// Drops counts dropped MADs by reason. The zero value is ready; it is
// safe for concurrent use.
type Drops struct {
	n [numReasons]atomic.Uint64
}

// Add counts one drop for err if it is a *ParseError from this package,
// and reports whether it was.
func (d *Drops) Add(err error) bool {
	pe, ok := err.(*ParseError)
	if !ok || pe.Reason >= numReasons {
		return false
	}
	d.n[pe.Reason].Add(1)
	return true
}

// Count returns the number of drops for r.
func (d *Drops) Count(r Reason) uint64 {
	if r >= numReasons {
		return 0
	}
	return d.n[r].Load()
}

// Total returns the number of drops for every reason.
func (d *Drops) Total() uint64 {
	var t uint64
	for i := range d.n {
		t += d.n[i].Load()
	}
	return t
}
