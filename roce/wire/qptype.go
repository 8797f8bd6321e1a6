package wire

// QPType is the transport service of a queue pair.
type QPType uint8

// Queue pair types.
const (
	RC QPType = iota + 1 // reliable connected
	UD                   // unreliable datagram
)

// String returns "RC" or "UD".
func (t QPType) String() string {
	switch t {
	case RC:
		return "RC"
	case UD:
		return "UD"
	}
	return "QPType(?)"
}
