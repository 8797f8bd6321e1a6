package roce

import "github.com/weft-io/weft/fabric"

// opErr is the error of a failed operation of this backend: one place
// builds the fabric.OpError, so every error names the backend the same
// way and matches the sentinel err wraps.
func opErr(op string, err error) error {
	return &fabric.OpError{Op: op, Backend: "roce", Err: err}
}

// opErrAddr is opErr for an operation on an address (open, listen).
func opErrAddr(op, addr string, err error) error {
	return &fabric.OpError{Op: op, Backend: "roce", Addr: addr, Err: err}
}
