package xsk

import (
	"errors"
	"fmt"

	"github.com/weft-io/weft/fabric"
	"golang.org/x/sys/unix"
)

// OpError is the error type of the package: fabric.OpError, carrying the
// operation ("umem", "socket", "bind", "send", ...) and backend
// "ethernet". It unwraps to the cause: an *os.SyscallError for failed
// system calls, and one of fabric's sentinel errors where one applies.
type OpError = fabric.OpError

var errInvalid = fabric.ErrInvalid

func opErr(op string, err error) error {
	return &OpError{Op: op, Backend: "ethernet", Err: err}
}

// notSupported marks errors that mean "the kernel or driver lacks this"
// with fabric.ErrNotSupported, keeping the original error.
func notSupported(err error) error {
	var errno unix.Errno
	if errors.As(err, &errno) {
		switch errno {
		case unix.EAFNOSUPPORT, unix.EOPNOTSUPP, unix.EPROTONOSUPPORT, unix.ENOPROTOOPT:
			return fmt.Errorf("%w: %w", fabric.ErrNotSupported, err)
		}
	}
	return err
}
