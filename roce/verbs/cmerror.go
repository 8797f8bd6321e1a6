package verbs

import (
	"fmt"
	"syscall"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/cm"
)

// CMError is an rdma_cm event that reports a failure: its name (such as
// RDMA_CM_EVENT_ADDR_ERROR) and status, a negative errno or a transport
// value. It matches (errors.Is) the errno and the fabric sentinel that
// describes it: ETIMEDOUT matches context.DeadlineExceeded (as the
// engine's cm.ErrTimeout), ENODEV and EADDRNOTAVAIL (no RDMA device for
// the address) ErrNoDevice and fabric.ErrNotSupported, ECONNREFUSED
// fabric.ErrRefused, unreachable networks and hosts fabric.ErrPeerGone.
// A REJ from the peer is a *cm.RejectError instead, as from the engine.
type CMError struct {
	Event  string
	Status int
}

// Error implements error.
func (e *CMError) Error() string {
	if e.Status < 0 {
		return fmt.Sprintf("verbs: %s: %v", e.Event, syscall.Errno(-e.Status))
	}
	return fmt.Sprintf("verbs: %s (status %d)", e.Event, e.Status)
}

// Unwrap returns the errno and the sentinel that match e.
func (e *CMError) Unwrap() []error {
	if e.Status >= 0 {
		return nil
	}
	errno := syscall.Errno(-e.Status)
	if s := errnoSentinel(errno); s != nil {
		return []error{errno, s}
	}
	return []error{errno}
}

// errnoSentinel maps an errno of librdmacm to a fabric sentinel.
func errnoSentinel(errno syscall.Errno) error {
	switch errno {
	case syscall.ETIMEDOUT:
		return cm.ErrTimeout
	case syscall.ENODEV, syscall.EADDRNOTAVAIL, syscall.ENOENT, syscall.ENOSYS:
		return ErrNoDevice
	case syscall.ECONNREFUSED:
		return fabric.ErrRefused
	case syscall.ENETUNREACH, syscall.EHOSTUNREACH, syscall.ENETDOWN, syscall.EHOSTDOWN, syscall.ECONNRESET:
		return fabric.ErrPeerGone
	case syscall.EADDRINUSE:
		return fabric.ErrInvalid
	}
	return nil
}
