package cm

import (
	"context"
	"os"
	"strconv"

	"github.com/weft-io/weft/fabric"
)

// RejectReason is the reason code of a REJ (IBA table 112).
type RejectReason uint16

// Reject reasons.
const (
	RejNoQP                     RejectReason = 1
	RejNoEEC                    RejectReason = 2
	RejNoResources              RejectReason = 3
	RejTimeout                  RejectReason = 4
	RejUnsupported              RejectReason = 5
	RejInvalidCommID            RejectReason = 6
	RejInvalidCommInstance      RejectReason = 7
	RejInvalidServiceID         RejectReason = 8 // nobody listens on the service id
	RejInvalidTransportType     RejectReason = 9
	RejStaleConn                RejectReason = 10
	RejRDCNotExist              RejectReason = 11
	RejInvalidGID               RejectReason = 12
	RejInvalidLID               RejectReason = 13
	RejInvalidSL                RejectReason = 14
	RejInvalidTrafficClass      RejectReason = 15
	RejInvalidHopLimit          RejectReason = 16
	RejInvalidPacketRate        RejectReason = 17
	RejInvalidAltGID            RejectReason = 18
	RejInvalidAltLID            RejectReason = 19
	RejInvalidAltSL             RejectReason = 20
	RejInvalidAltTrafficClass   RejectReason = 21
	RejInvalidAltHopLimit       RejectReason = 22
	RejInvalidAltPacketRate     RejectReason = 23
	RejPortCMRedirect           RejectReason = 24
	RejPortRedirect             RejectReason = 25
	RejInvalidMTU               RejectReason = 26
	RejInsufficientRespRes      RejectReason = 27
	RejConsumerDefined          RejectReason = 28 // the listener's application rejected (rdma_reject)
	RejInvalidRNRRetry          RejectReason = 29
	RejDuplicateLocalCommID     RejectReason = 30
	RejInvalidClassVersion      RejectReason = 31
	RejInvalidFlowLabel         RejectReason = 32
	RejInvalidAltFlowLabel      RejectReason = 33
	RejVendorOptionNotSupported RejectReason = 35
)

var rejText = [...]string{
	RejNoQP:                     "no QP available",
	RejNoEEC:                    "no EEC available",
	RejNoResources:              "no resources available",
	RejTimeout:                  "timeout",
	RejUnsupported:              "unsupported request",
	RejInvalidCommID:            "invalid communication id",
	RejInvalidCommInstance:      "invalid communication instance",
	RejInvalidServiceID:         "invalid service id",
	RejInvalidTransportType:     "invalid transport service type",
	RejStaleConn:                "stale connection",
	RejRDCNotExist:              "RDC does not exist",
	RejInvalidGID:               "invalid GID",
	RejInvalidLID:               "invalid LID",
	RejInvalidSL:                "invalid SL",
	RejInvalidTrafficClass:      "invalid traffic class",
	RejInvalidHopLimit:          "invalid hop limit",
	RejInvalidPacketRate:        "invalid packet rate",
	RejInvalidAltGID:            "invalid alternate GID",
	RejInvalidAltLID:            "invalid alternate LID",
	RejInvalidAltSL:             "invalid alternate SL",
	RejInvalidAltTrafficClass:   "invalid alternate traffic class",
	RejInvalidAltHopLimit:       "invalid alternate hop limit",
	RejInvalidAltPacketRate:     "invalid alternate packet rate",
	RejPortCMRedirect:           "port and CM redirect",
	RejPortRedirect:             "port redirect",
	RejInvalidMTU:               "invalid path MTU",
	RejInsufficientRespRes:      "insufficient responder resources",
	RejConsumerDefined:          "rejected by the application",
	RejInvalidRNRRetry:          "invalid RNR retry count",
	RejDuplicateLocalCommID:     "duplicate local communication id",
	RejInvalidClassVersion:      "unsupported class version",
	RejInvalidFlowLabel:         "invalid flow label",
	RejInvalidAltFlowLabel:      "invalid alternate flow label",
	RejVendorOptionNotSupported: "vendor option not supported",
}

// String describes the reason.
func (r RejectReason) String() string {
	if int(r) < len(rejText) && rejText[r] != "" {
		return rejText[r]
	}
	return "reason " + strconv.Itoa(int(r))
}

// RejectError is a REJ received from the peer, as an error. It matches
// (errors.Is):
//
//   - context.DeadlineExceeded and os.ErrDeadlineExceeded for RejTimeout
//     (the peer gave up waiting for us);
//   - fabric.ErrRefused for every other reason: nobody listens
//     (RejInvalidServiceID), the application rejected
//     (RejConsumerDefined, with its PrivateData), no QP or resources, a
//     stale or duplicate connection, or parameters the peer refused;
//   - in addition fabric.ErrNotSupported for RejUnsupported,
//     RejInvalidTransportType, RejInvalidClassVersion and
//     RejVendorOptionNotSupported, and fabric.ErrInvalid for the reasons
//     that name an invalid path or QP parameter.
type RejectError struct {
	// Reason is the peer's reject reason.
	Reason RejectReason
	// Rejected is the message the peer rejected.
	Rejected MsgKind
	// ARI is the additional reject information (a copy).
	ARI []byte
	// PrivateData is the REJ's private data (a copy). With rdma_cm it is
	// what the rejecting application passed to rdma_reject, padded with
	// zeros to REJPrivateDataSize.
	PrivateData []byte
}

// NewRejectError returns the error that the REJ r reports. It copies what
// it keeps of r.
func NewRejectError(r REJ) *RejectError {
	return &RejectError{
		Reason:      r.Reason(),
		Rejected:    r.MessageRejected(),
		ARI:         append([]byte(nil), r.ARI()...),
		PrivateData: append([]byte(nil), r.PrivateData()...),
	}
}

// Error implements error.
func (e *RejectError) Error() string {
	return "roce/cm: connection rejected: " + e.Reason.String() + " (" + strconv.Itoa(int(e.Reason)) + ")"
}

// Timeout reports whether the peer rejected because it timed out.
func (e *RejectError) Timeout() bool { return e.Reason == RejTimeout }

// Is reports whether the rejection matches target (see RejectError).
func (e *RejectError) Is(target error) bool {
	switch target {
	case context.DeadlineExceeded, os.ErrDeadlineExceeded:
		return e.Reason == RejTimeout
	case fabric.ErrRefused:
		return e.Reason != RejTimeout
	case fabric.ErrNotSupported:
		switch e.Reason {
		case RejUnsupported, RejInvalidTransportType, RejInvalidClassVersion, RejVendorOptionNotSupported:
			return true
		}
	case fabric.ErrInvalid:
		switch {
		case e.Reason >= RejInvalidGID && e.Reason <= RejInvalidAltPacketRate,
			e.Reason == RejInvalidMTU, e.Reason == RejInvalidRNRRetry,
			e.Reason == RejInvalidFlowLabel, e.Reason == RejInvalidAltFlowLabel,
			e.Reason == RejInsufficientRespRes:
			return true
		}
	}
	return false
}

// ErrTimeout reports a CM exchange that got no answer within the CM
// response timeout and its retries (a peer that vanished or never
// existed). It matches context.DeadlineExceeded and os.ErrDeadlineExceeded.
var ErrTimeout error = timeoutError{}

type timeoutError struct{}

func (timeoutError) Error() string { return "roce/cm: no response from the peer's connection manager" }
func (timeoutError) Timeout() bool { return true }
func (timeoutError) Is(target error) bool {
	return target == context.DeadlineExceeded || target == os.ErrDeadlineExceeded
}

// SIDRError is a SIDR_REP with a status other than SIDRSuccess, as an
// error. SIDRUnsupported and SIDRReject match fabric.ErrRefused (nobody
// listens, or the application rejected); SIDRNoQP matches
// fabric.ErrRefused; SIDRUnsupportedVersion matches fabric.ErrNotSupported.
type SIDRError struct {
	Status SIDRStatus
	// PrivateData is the SIDR_REP's private data (a copy).
	PrivateData []byte
}

var sidrText = [...]string{
	SIDRSuccess:            "success",
	SIDRUnsupported:        "service id not supported",
	SIDRReject:             "rejected by the application",
	SIDRNoQP:               "no QP available",
	SIDRRedirect:           "redirected",
	SIDRUnsupportedVersion: "unsupported class version",
}

// String describes the status.
func (s SIDRStatus) String() string {
	if int(s) < len(sidrText) {
		return sidrText[s]
	}
	return "status " + strconv.Itoa(int(s))
}

// Error implements error.
func (e *SIDRError) Error() string {
	return "roce/cm: service id resolution failed: " + e.Status.String()
}

// Is reports whether the failure matches target.
func (e *SIDRError) Is(target error) bool {
	switch target {
	case fabric.ErrRefused:
		return e.Status != SIDRUnsupportedVersion
	case fabric.ErrNotSupported:
		return e.Status == SIDRUnsupportedVersion
	}
	return false
}
