package cm

import (
	"sync/atomic"

	"github.com/weft-io/weft/fabric"
)

// Reason says why a MAD was rejected by [ParseMAD]: it is the Code of the
// *fabric.MalformedError of the parsing functions.
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

// parseErrs holds the one error per reason.
var parseErrs = fabric.NewMalformedSet("roce/cm MAD", []string{
	ReasonSize:         "MAD not 256 bytes",
	ReasonBaseVersion:  "unsupported MAD base version",
	ReasonClass:        "management class not CM",
	ReasonClassVersion: "unsupported CM class version",
	ReasonMethod:       "unsupported CM method",
	ReasonAttribute:    "unknown CM attribute",
	ReasonField:        "CM message field out of range",
	ReasonCMAHeader:    "bad rdma_cm header",
}...)

// String returns a short description of the reason.
func (r Reason) String() string { return parseErrs.What(int(r)) }

// malformed returns the error of the parsing functions for malformed
// input: a *fabric.MalformedError with Where "roce/cm MAD" and Code r,
// which matches fabric.ErrMalformed. It is preallocated, one per Reason,
// so rejecting a datagram does not allocate.
func malformed(r Reason) error { return parseErrs[r] }

// Drops counts dropped MADs by reason. The zero value is ready; it is
// safe for concurrent use.
type Drops struct {
	n [numReasons]atomic.Uint64
}

// Add counts one drop for err if it is an error of this package's
// parsing functions (a *fabric.MalformedError of its own, not wrapped),
// and reports whether it was.
func (d *Drops) Add(err error) bool {
	r, ok := parseErrs.Code(err)
	if ok {
		d.n[r].Add(1)
	}
	return ok
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
