package fabric

import "sync/atomic"

// DropReason classifies dropped input.
type DropReason uint8

// Drop reasons.
const (
	DropMalformed DropReason = iota // failed header or record validation
	DropChecksum                    // bad CRC or checksum
	DropNoBuffer                    // no receive buffer or queue space
	DropTruncated                   // message longer than the receive buffers
	DropAccess                      // refused remote access (key, permission, bounds)
	DropDuplicate                   // duplicate of something already delivered
	DropSequence                    // out of sequence
	DropEvent                       // event that found the Events channel full
	DropOther                       // anything else
	NumDropReasons
)

var dropNames = [NumDropReasons]string{"malformed", "checksum", "no-buffer",
	"truncated", "access", "duplicate", "sequence", "event", "other"}

// String returns the reason's name.
func (r DropReason) String() string {
	if r < NumDropReasons {
		return dropNames[r]
	}
	return "unknown"
}

// Stats is a snapshot of an endpoint's counters. Packets are wire units
// (ring records, frames, RoCE packets); messages are what Send and Recv
// see. Backends that do not segment count one packet per message.
type Stats struct {
	TxPackets, TxBytes, TxMessages uint64
	RxPackets, RxBytes, RxMessages uint64
	// Drops counts dropped input by reason.
	Drops [NumDropReasons]uint64
	// Retransmits counts retransmitted packets.
	Retransmits uint64
	// Doorbells counts doorbells rung (NTB doorbells, AF_XDP wake-ups,
	// verbs doorbell writes).
	Doorbells uint64
	// Wakeups counts sleeps in blocking calls that ended with a wake-up.
	Wakeups uint64
}

// TotalDrops sums Drops.
func (s *Stats) TotalDrops() uint64 {
	var n uint64
	for _, d := range s.Drops {
		n += d
	}
	return n
}

// Counters is a set of atomic counters from which a backend builds Stats.
// Update counters once per burst, not per message, on hot paths.
type Counters struct {
	TxPackets, TxBytes, TxMessages atomic.Uint64
	RxPackets, RxBytes, RxMessages atomic.Uint64
	Drops                          [NumDropReasons]atomic.Uint64
	Retransmits                    atomic.Uint64
	Doorbells                      atomic.Uint64
	Wakeups                        atomic.Uint64
}

// Snapshot reads every counter.
func (c *Counters) Snapshot() Stats {
	s := Stats{
		TxPackets: c.TxPackets.Load(), TxBytes: c.TxBytes.Load(), TxMessages: c.TxMessages.Load(),
		RxPackets: c.RxPackets.Load(), RxBytes: c.RxBytes.Load(), RxMessages: c.RxMessages.Load(),
		Retransmits: c.Retransmits.Load(), Doorbells: c.Doorbells.Load(), Wakeups: c.Wakeups.Load(),
	}
	for i := range c.Drops {
		s.Drops[i] = c.Drops[i].Load()
	}
	return s
}

// Drop counts n drops for reason r.
func (c *Counters) Drop(r DropReason, n uint64) { c.Drops[r].Add(n) }
