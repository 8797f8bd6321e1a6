package wire

import (
	"strconv"
	"time"
)

// Syndrome is the first byte of an AETH. Bit 7 is reserved (0), bits 6-5
// give the [AckType] and bits 4-0 its argument: the credit count of an
// ACK, the [RNRTimer] of an RNR NAK or the [NAKCode] of a NAK.
type Syndrome uint8

// AckType is the kind of acknowledgement a [Syndrome] carries.
type AckType uint8

// Acknowledgement kinds.
const (
	AckTypeACK      AckType = 0 // positive acknowledgement
	AckTypeRNRNAK   AckType = 1 // receiver not ready: retry after a delay
	AckTypeReserved AckType = 2 // reserved
	AckTypeNAK      AckType = 3 // negative acknowledgement
)

// String returns "ACK", "RNR_NAK", "NAK" or "reserved".
func (t AckType) String() string {
	switch t {
	case AckTypeACK:
		return "ACK"
	case AckTypeRNRNAK:
		return "RNR_NAK"
	case AckTypeNAK:
		return "NAK"
	}
	return "reserved"
}

// NAKCode is the argument of a NAK syndrome.
type NAKCode uint8

// NAK codes.
const (
	NAKPSNSequenceError       NAKCode = 0 // a packet was lost: resend from the AETH's PSN
	NAKInvalidRequest         NAKCode = 1 // unsupported or malformed request
	NAKRemoteAccessError      NAKCode = 2 // R_Key, permission or bounds check failed
	NAKRemoteOperationalError NAKCode = 3 // the responder could not complete the request
	NAKInvalidRDRequest       NAKCode = 4 // invalid RD request
)

var nakNames = [...]string{
	NAKPSNSequenceError:       "PSN_SEQUENCE_ERROR",
	NAKInvalidRequest:         "INVALID_REQUEST",
	NAKRemoteAccessError:      "REMOTE_ACCESS_ERROR",
	NAKRemoteOperationalError: "REMOTE_OPERATIONAL_ERROR",
	NAKInvalidRDRequest:       "INVALID_RD_REQUEST",
}

// String returns the code's name, such as "REMOTE_ACCESS_ERROR".
func (c NAKCode) String() string {
	if int(c) < len(nakNames) {
		return nakNames[c]
	}
	return "NAKCode(" + strconv.Itoa(int(c)) + ")"
}

// CreditsInvalid is the credit count of an ACK whose responder does not
// report credits (for example because it uses a shared receive queue):
// the requester may send without limit.
const CreditsInvalid = 31

// creditTable converts an AETH credit code into a number of receive WQEs.
var creditTable = [31]uint16{
	0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192,
	256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192,
	12288, 16384, 24576, 32768,
}

// ACKSyndrome returns the syndrome of an ACK with credit code credits
// (0-30, or CreditsInvalid). Only the low five bits of credits are used.
func ACKSyndrome(credits uint8) Syndrome { return Syndrome(credits & 0x1f) }

// ACKSyndromeForCredits returns the syndrome of an ACK advertising n
// available receive WQEs, rounded down to a value the credit code can
// express. A negative n yields CreditsInvalid.
func ACKSyndromeForCredits(n int) Syndrome {
	if n < 0 {
		return ACKSyndrome(CreditsInvalid)
	}
	code := 0
	for code+1 < len(creditTable) && int(creditTable[code+1]) <= n {
		code++
	}
	return ACKSyndrome(uint8(code))
}

// RNRNAKSyndrome returns the syndrome of an RNR NAK asking the requester
// to wait t before retrying.
func RNRNAKSyndrome(t RNRTimer) Syndrome { return Syndrome(1<<5 | uint8(t)&0x1f) }

// NAKSyndrome returns the syndrome of a NAK with code c.
func NAKSyndrome(c NAKCode) Syndrome { return Syndrome(3<<5 | uint8(c)&0x1f) }

// Type returns the kind of acknowledgement.
func (s Syndrome) Type() AckType { return AckType(s>>5) & 3 }

// Value returns the five-bit argument of the syndrome.
func (s Syndrome) Value() uint8 { return uint8(s) & 0x1f }

// IsACK reports whether the syndrome is a positive acknowledgement.
func (s Syndrome) IsACK() bool { return s.Type() == AckTypeACK }

// CreditCode returns the credit code of an ACK (0-30, or CreditsInvalid).
func (s Syndrome) CreditCode() uint8 { return s.Value() }

// Credits returns the number of receive WQEs an ACK advertises, and false
// if its credit code is CreditsInvalid.
func (s Syndrome) Credits() (int, bool) {
	c := s.Value()
	if c >= CreditsInvalid {
		return 0, false
	}
	return int(creditTable[c]), true
}

// RNRTimer returns the timer of an RNR NAK.
func (s Syndrome) RNRTimer() RNRTimer { return RNRTimer(s.Value()) }

// NAKCode returns the code of a NAK.
func (s Syndrome) NAKCode() NAKCode { return NAKCode(s.Value()) }

// String describes the syndrome, such as "ACK(credits=31)",
// "RNR_NAK(0.64ms)" or "NAK(REMOTE_ACCESS_ERROR)".
func (s Syndrome) String() string {
	switch s.Type() {
	case AckTypeACK:
		return "ACK(credits=" + strconv.Itoa(int(s.Value())) + ")"
	case AckTypeRNRNAK:
		return "RNR_NAK(" + s.RNRTimer().Duration().String() + ")"
	case AckTypeNAK:
		return "NAK(" + s.NAKCode().String() + ")"
	}
	return "Syndrome(0x" + strconv.FormatUint(uint64(s), 16) + ")"
}

// RNRTimer is the five-bit code of a receiver-not-ready delay, as carried
// in an RNR NAK and set as a QP's min_rnr_timer.
type RNRTimer uint8

// rnrMicros maps an RNR timer code to its delay in microseconds.
var rnrMicros = [32]uint32{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960,
	1280, 1920, 2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720,
	40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
}

// Duration returns the delay the code stands for: code 0 is 655.36 ms,
// codes 1-31 range from 0.01 ms to 491.52 ms.
func (t RNRTimer) Duration() time.Duration {
	return time.Duration(rnrMicros[t&0x1f]) * time.Microsecond
}

// RNRTimerFor returns the smallest code whose delay is at least d (the
// largest, 655.36 ms, if none is).
func RNRTimerFor(d time.Duration) RNRTimer {
	best := RNRTimer(0)
	for c := RNRTimer(1); c < 32; c++ {
		if c.Duration() >= d {
			return c
		}
	}
	return best
}
