package fabric

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Sentinel errors. Compare with [errors.Is]; every error a backend returns
// that has one of these causes wraps it.
var (
	// ErrNotSupported is returned for an operation or option that the
	// backend, the device or the running kernel does not provide. It is the
	// single "feature missing" error of the module, as in cilium/ebpf:
	// feature probes return it and tests that need the feature skip on it.
	ErrNotSupported = errors.New("not supported")

	// ErrAccess reports an access violation: a remote key that names no
	// region, a region registered without the permission the operation
	// needs, or (for remote operations) an address outside the region. The
	// memory concerned was not touched.
	ErrAccess = errors.New("access violation")

	// ErrBounds reports an offset or length outside a region or window. A
	// remote out-of-bounds access is reported with a status whose error
	// matches both ErrBounds (where the backend can tell) and ErrAccess.
	ErrBounds = errors.New("out of bounds")

	// ErrPeerGone reports that the peer closed, crashed or became
	// unreachable (link down, retries exhausted).
	ErrPeerGone = errors.New("peer gone")

	// ErrPeerClosed reports that the peer closed its end in good order
	// and said so (a goodbye, a DREQ), as opposed to a peer that crashed
	// or fell silent. It matches ErrPeerGone.
	ErrPeerClosed = &peerClosedError{}

	// ErrMessageSize reports a message larger than Caps.MaxMsgSize or an SGE
	// list longer than Caps.MaxSGEs.
	ErrMessageSize = errors.New("message too large")

	// ErrInvalid reports a malformed argument: an SGE without a region, a
	// negative length, a region of another endpoint.
	ErrInvalid = errors.New("invalid argument")

	// ErrRetryExceeded reports a reliable transfer that was not acknowledged
	// within the configured retries (transport or RNR).
	ErrRetryExceeded = errors.New("retry count exceeded")

	// ErrFlushed is the status of work that was still queued when the
	// endpoint went into an error state or was closed.
	ErrFlushed = errors.New("operation flushed")

	// ErrUnknownBackend is returned by Open for a backend name that no
	// package registered. Import the backend package (for its side effect)
	// to register it.
	ErrUnknownBackend = errors.New("unknown backend")

	// ErrRefused reports a connection that the peer refused: nobody
	// listens at the address, the listener's backlog is full, or the
	// listener rejected it.
	ErrRefused = errors.New("connection refused")

	// ErrMalformed reports a packet, header or shared-memory record that
	// failed validation. Receivers drop and count such input; they return
	// ErrMalformed only from parsing functions.
	ErrMalformed = errors.New("malformed input")
)

// ErrClosed is os.ErrClosed, returned (wrapped) by every operation on a
// closed endpoint, region or queue, including calls that were blocked when
// Close ran.
var ErrClosed = os.ErrClosed

// OpError is the error type returned by endpoint operations. Like
// net.OpError it carries the operation and the backend, and it unwraps to
// the cause, so errors.Is(err, fabric.ErrAccess) works through it.
type OpError struct {
	// Op is the operation: "send", "recv", "write", "read", "register",
	// "open", ...
	Op string
	// Backend is the registered backend name, such as "ntb".
	Backend string
	// Addr is the address involved, if any.
	Addr string
	// Err is the cause.
	Err error
}

// Error implements error.
func (e *OpError) Error() string {
	s := e.Backend
	if s != "" {
		s += " "
	}
	s += e.Op
	if e.Addr != "" {
		// An address with bytes that do not print (a NUL, a control
		// character, broken UTF-8) is shown quoted, so the message says
		// what was given.
		if !utf8.ValidString(e.Addr) || strings.ContainsFunc(e.Addr, func(r rune) bool { return !unicode.IsPrint(r) }) {
			s += " " + strconv.Quote(e.Addr)
		} else {
			s += " " + e.Addr
		}
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the cause.
func (e *OpError) Unwrap() error { return e.Err }

// RefusedError is the error of a dial that a listener refused (a full
// backlog, a closing listener), as that listener's answer said. It
// matches ErrRefused with errors.Is and is comparable.
type RefusedError struct {
	// Addr is the listener's address (a MAC address, a queue), or ""
	// where the answer does not tell.
	Addr string
	// Reason is the reason the listener gave, such as "backlog full", or
	// "" if it gave none.
	Reason string
}

// Error returns "connection refused", then " by " + Addr and ": " +
// Reason where they are set.
func (e *RefusedError) Error() string {
	s := "connection refused"
	if e.Addr != "" {
		s += " by " + e.Addr
	}
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

// Unwrap returns ErrRefused.
func (e *RefusedError) Unwrap() error { return ErrRefused }

// peerClosedError is ErrPeerClosed: a sentinel of its own that also
// matches ErrPeerGone.
type peerClosedError struct{}

func (*peerClosedError) Error() string        { return "peer closed" }
func (*peerClosedError) Is(target error) bool { return target == ErrPeerGone }

// Status is the outcome of a completed operation. The zero value is
// success. Status.Err maps it to an error that matches the sentinel errors
// of this package with errors.Is.
type Status uint8

// Completion statuses. Their order is part of no wire format.
const (
	StatusOK               Status = iota // success
	StatusRemoteAccess                   // remote key, permission or bounds check failed at the target
	StatusRemoteBounds                   // remote address outside the region (backends that can tell)
	StatusLocalAccess                    // a local SGE lacks the permission the operation needs
	StatusLocalLength                    // the message did not fit the receive buffers
	StatusPeerGone                       // the peer went away before the operation completed
	StatusRetryExceeded                  // transport retries exhausted
	StatusRNRRetryExceeded               // receiver-not-ready retries exhausted
	StatusFlushed                        // flushed by an error state or Close
	StatusRemoteInvalid                  // the target rejected the request as invalid
	StatusRemoteOp                       // the target failed to execute the request
	StatusPeerClosed                     // the peer closed its end in good order (a goodbye, a DREQ)
	numStatus
)

var statusNames = [numStatus]string{
	"ok", "remote access error", "remote bounds error", "local access error",
	"local length error", "peer gone", "retry count exceeded",
	"RNR retry count exceeded", "flushed", "remote invalid request",
	"remote operation error", "peer closed",
}

// String returns a short description.
func (s Status) String() string {
	if s < numStatus {
		return statusNames[s]
	}
	return "unknown status"
}

// statusError is the error form of a non-success Status. The table below
// holds one per status, so Err never allocates.
type statusError struct {
	s     Status
	cause []error
}

func (e *statusError) Error() string { return e.s.String() }

func (e *statusError) Is(target error) bool {
	for _, c := range e.cause {
		if c == target {
			return true
		}
	}
	return false
}

var statusErrs = [numStatus]*statusError{
	StatusRemoteAccess:     {StatusRemoteAccess, []error{ErrAccess}},
	StatusRemoteBounds:     {StatusRemoteBounds, []error{ErrAccess, ErrBounds}},
	StatusLocalAccess:      {StatusLocalAccess, []error{ErrAccess}},
	StatusLocalLength:      {StatusLocalLength, []error{ErrMessageSize}},
	StatusPeerGone:         {StatusPeerGone, []error{ErrPeerGone}},
	StatusRetryExceeded:    {StatusRetryExceeded, []error{ErrRetryExceeded, ErrPeerGone}},
	StatusRNRRetryExceeded: {StatusRNRRetryExceeded, []error{ErrRetryExceeded}},
	StatusFlushed:          {StatusFlushed, []error{ErrFlushed}},
	StatusRemoteInvalid:    {StatusRemoteInvalid, []error{ErrInvalid}},
	StatusRemoteOp:         {StatusRemoteOp, nil},
	StatusPeerClosed:       {StatusPeerClosed, []error{ErrPeerClosed, ErrPeerGone}},
}

// Err returns nil for StatusOK and otherwise an error describing the
// status. The error matches, with errors.Is, the sentinel errors that
// describe the cause: StatusRemoteAccess matches ErrAccess, StatusRemoteBounds
// matches ErrAccess and ErrBounds, StatusPeerGone, StatusPeerClosed and
// StatusRetryExceeded match ErrPeerGone, StatusPeerClosed also
// ErrPeerClosed, and so on. It never allocates.
func (s Status) Err() error {
	if s == StatusOK {
		return nil
	}
	if s < numStatus {
		return statusErrs[s]
	}
	return errors.New(s.String())
}
