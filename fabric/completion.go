package fabric

import "context"

// Op names the operation a completion is for.
type Op uint8

// Operations.
const (
	OpSend Op = iota + 1
	OpRecv
	OpWrite
	OpRead
	OpFetchAdd
	OpCompareSwap
)

var opNames = [...]string{"", "send", "recv", "write", "read", "fetch-add", "compare-swap"}

// String returns the lower-case operation name.
func (o Op) String() string {
	if int(o) < len(opNames) && o != 0 {
		return opNames[o]
	}
	return "unknown"
}

// Completion reports a finished operation (libfabric fi_cq_data_entry,
// verbs ibv_wc).
type Completion struct {
	// Context is Message.Context of the operation.
	Context uint64
	// Op is the operation.
	Op Op
	// Status is StatusOK or the reason for failure; Status.Err gives an
	// error to test with errors.Is.
	Status Status
	// Flags carries FlagImm when Imm is valid.
	Flags MsgFlags
	// Imm is immediate data, if any.
	Imm uint32
	// Len is the number of bytes transferred.
	Len int
}

// Err is c.Status.Err().
func (c *Completion) Err() error { return c.Status.Err() }

// CompletionQueue delivers completions of an endpoint's operations. Poll
// is the busy-poll path and never blocks; Wait blocks until at least one
// completion is there, spinning first for Options.Spin and then sleeping.
// Both are safe for concurrent use.
type CompletionQueue interface {
	// Poll moves up to len(out) completions into out and returns how many.
	Poll(out []Completion) int
	// Wait is Poll that blocks until it returns at least one completion,
	// ctx is done, or the endpoint is closed (an error matching
	// os.ErrClosed).
	Wait(ctx context.Context, out []Completion) (int, error)
	// Len returns the number of completions waiting.
	Len() int
}
