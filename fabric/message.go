package fabric

// MsgFlags qualify a Message (on input) or report on it (on output).
type MsgFlags uint32

// Message flags.
const (
	// FlagImm marks Imm as valid: on Send and Write it sends the immediate
	// data, on Recv it reports that the message carried some.
	FlagImm MsgFlags = 1 << iota
	// FlagSignal asks for a completion on the completion queue when the
	// operation finishes (verbs IBV_SEND_SIGNALED, libfabric
	// FI_COMPLETION). Failed operations always produce a completion.
	FlagSignal
	// FlagRemoteWrite, on Recv, marks the notification of an RMA write
	// with immediate data: SGEs are untouched, Len is the number of bytes
	// the peer wrote and Imm its immediate data.
	FlagRemoteWrite
	// FlagTruncated, on Recv, reports that the message was longer than the
	// receive SGEs; Len is what was stored and the rest is lost.
	FlagTruncated
	// FlagFence orders an operation after every earlier RMA read of the
	// endpoint (verbs IBV_SEND_FENCE).
	FlagFence
)

// Message is one element of a burst. The caller owns the slice of
// messages and every SGE slice; backends never retain them past the call,
// and fill the output fields in place, so a burst loop allocates nothing.
//
// On Send the SGEs are gathered into one message. On Recv the message is
// scattered over the SGEs, which must be in regions with AccessLocalWrite.
// On Write the SGEs are gathered into the remote memory Remote; on Read
// the remote memory is scattered into the SGEs.
type Message struct {
	// SGEs is the scatter/gather list, at most Caps.MaxSGEs entries.
	SGEs []SGE
	// Imm is 32-bit immediate data, valid with FlagImm.
	Imm uint32
	// Flags are input flags (FlagImm, FlagSignal, FlagFence) on Send,
	// Write and Read, and output flags on Recv.
	Flags MsgFlags
	// Context is returned in the operation's completion.
	Context uint64
	// Remote is the target of Write and Read.
	Remote RemoteIOV
	// Len is output: the number of bytes received (Recv).
	Len int
}

// SGELen returns the total length of sges.
func SGELen(sges []SGE) int {
	n := 0
	for i := range sges {
		n += sges[i].Length
	}
	return n
}

// CheckSGEs validates an SGE list for a backend: every SGE must have a
// live region of domain dom (nil skips the domain check) with the
// permissions in need, and lie within it. It returns the total length. The
// error wraps ErrInvalid, ErrClosed, ErrBounds or ErrAccess.
func CheckSGEs(sges []SGE, dom *Domain, need Access) (int, error) {
	n := 0
	for i := range sges {
		s := &sges[i]
		r := s.Region
		switch {
		case r == nil:
			return 0, ErrInvalid
		case r.closed.Load():
			return 0, ErrClosed
		case dom != nil && r.domain != dom && !(dom.HostMemory && r.domain == HostDomain):
			return 0, ErrInvalid
		case s.Offset < 0 || s.Length < 0 || s.Offset > len(r.buf)-s.Length:
			return 0, ErrBounds
		case r.access&need != need:
			return 0, ErrAccess
		}
		n += s.Length
	}
	return n, nil
}

// Gather copies the SGEs (already checked) into dst and returns the number
// of bytes copied, at most len(dst).
func Gather(dst []byte, sges []SGE) int {
	n := 0
	for i := range sges {
		s := &sges[i]
		n += copy(dst[n:], s.Region.buf[s.Offset:s.Offset+s.Length])
		if n == len(dst) {
			break
		}
	}
	return n
}

// Scatter copies src over the SGEs (already checked) and returns the number
// of bytes stored, at most SGELen(sges).
func Scatter(sges []SGE, src []byte) int {
	n := 0
	for i := range sges {
		if n == len(src) {
			break
		}
		s := &sges[i]
		n += copy(s.Region.buf[s.Offset:s.Offset+s.Length], src[n:])
	}
	return n
}
