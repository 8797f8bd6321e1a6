package batch

import (
	"fmt"
	"math/bits"
)

// FlushCause says why a batch was closed.
type FlushCause uint8

// Flush causes.
const (
	// FlushCount: the batch reached Options.MaxPackets packets.
	FlushCount FlushCause = iota
	// FlushBytes: the next packet would have taken it past Options.MaxBytes.
	FlushBytes
	// FlushDeadline: its first packet had waited Options.Deadline.
	FlushDeadline
	// FlushExplicit: Flush or FlushWait.
	FlushExplicit
	// NumFlushCauses is the number of causes.
	NumFlushCauses
)

var causeNames = [NumFlushCauses]string{"count", "bytes", "deadline", "explicit"}

// String returns the cause's name.
func (c FlushCause) String() string {
	if c < NumFlushCauses {
		return causeNames[c]
	}
	return "unknown"
}

// DropReason classifies lost batches.
type DropReason uint8

// Drop reasons.
const (
	// DropMalformed (Splitter): the batch header failed validation.
	DropMalformed DropReason = iota
	// DropTruncated (Splitter): the message was longer than a receive slot.
	DropTruncated
	// DropRejected (Coalescer): the endpoint refused the batch (Send
	// failed validation, such as a region of another domain).
	DropRejected
	// DropFailed (Coalescer): the batch completed with an error status.
	DropFailed
	// DropClosed (Coalescer): the batch was still unsent when Close ran.
	DropClosed
	// NumDropReasons is the number of reasons.
	NumDropReasons
)

var dropNames = [NumDropReasons]string{"malformed", "truncated", "rejected", "failed", "closed"}

// String returns the reason's name.
func (r DropReason) String() string {
	if r < NumDropReasons {
		return dropNames[r]
	}
	return "unknown"
}

// NumSizeBuckets is the number of buckets of Stats.BatchSizes.
const NumSizeBuckets = 16

// SizeBucket returns the Stats.BatchSizes bucket of a batch of n >= 1
// packets: bucket i holds batches of 2^i to 2^(i+1)-1 packets (the last
// bucket also everything larger).
func SizeBucket(n int) int {
	return min(bits.Len(uint(n))-1, NumSizeBuckets-1)
}

// BucketRange returns the smallest and largest packet count of bucket i.
func BucketRange(i int) (lo, hi int) {
	if i == NumSizeBuckets-1 {
		return 1 << i, MaxCount
	}
	return 1 << i, 1<<(i+1) - 1
}

// Stats are the counters of a Coalescer, a Splitter or a Group. Fields
// that only one side uses say so.
type Stats struct {
	// Batches is the number of batches sent (Coalescer: accepted by Send)
	// or received and split (Splitter).
	Batches uint64
	// Packets is the number of packets in those batches.
	Packets uint64
	// Bytes is the number of packet bytes in those batches (headers not
	// included).
	Bytes uint64
	// BatchSizes is a histogram of packets per batch with power-of-two
	// buckets (see SizeBucket).
	BatchSizes [NumSizeBuckets]uint64
	// Flushes counts closed batches by cause (Coalescer).
	Flushes [NumFlushCauses]uint64
	// Drops counts lost batches by reason.
	Drops [NumDropReasons]uint64
	// DroppedPackets is the number of packets in dropped batches, where
	// known (Coalescer; a malformed batch's count cannot be trusted).
	DroppedPackets uint64
	// Backpressure counts batches that the endpoint did not take at their
	// first attempt (Coalescer): they stayed queued and were retried.
	Backpressure uint64
	// Full counts Adds refused with ErrFull (Coalescer), or Recv calls
	// that found every receive slot held by unreleased packets (Splitter).
	Full uint64
	// Raw counts messages that were not batches, delivered whole
	// (Splitter).
	Raw uint64
	// SeqGaps counts batches whose sequence number did not follow the
	// previous one (Splitter): lost batches on an unreliable backend, or
	// a restarted sender.
	SeqGaps uint64
	// Foreign counts completions on the endpoint's queue that were not the
	// coalescer's and were discarded (Coalescer polling the queue itself;
	// see Options.ExternalCompletions).
	Foreign uint64
}

// Add adds o's counters to s.
func (s *Stats) Add(o *Stats) {
	s.Batches += o.Batches
	s.Packets += o.Packets
	s.Bytes += o.Bytes
	for i := range s.BatchSizes {
		s.BatchSizes[i] += o.BatchSizes[i]
	}
	for i := range s.Flushes {
		s.Flushes[i] += o.Flushes[i]
	}
	for i := range s.Drops {
		s.Drops[i] += o.Drops[i]
	}
	s.DroppedPackets += o.DroppedPackets
	s.Backpressure += o.Backpressure
	s.Full += o.Full
	s.Raw += o.Raw
	s.SeqGaps += o.SeqGaps
	s.Foreign += o.Foreign
}

// PacketsPerBatch returns the mean number of packets per batch.
func (s *Stats) PacketsPerBatch() float64 {
	if s.Batches == 0 {
		return 0
	}
	return float64(s.Packets) / float64(s.Batches)
}

// TotalDrops sums Drops.
func (s *Stats) TotalDrops() uint64 {
	var n uint64
	for _, d := range s.Drops {
		n += d
	}
	return n
}

// String formats the non-zero counters on one line, for logs.
func (s Stats) String() string {
	b := fmt.Appendf(nil, "batches=%d packets=%d bytes=%d pkts/batch=%.1f", s.Batches, s.Packets, s.Bytes, s.PacketsPerBatch())
	sep := " sizes="
	for i, n := range s.BatchSizes {
		if n != 0 {
			lo, hi := BucketRange(i)
			b = fmt.Appendf(b, "%s%d-%d:%d", sep, lo, hi, n)
			sep = ","
		}
	}
	sep = " flushes="
	for i, n := range s.Flushes {
		if n != 0 {
			b = fmt.Appendf(b, "%s%v:%d", sep, FlushCause(i), n)
			sep = ","
		}
	}
	sep = " drops="
	for i, n := range s.Drops {
		if n != 0 {
			b = fmt.Appendf(b, "%s%v:%d", sep, DropReason(i), n)
			sep = ","
		}
	}
	for _, f := range []struct {
		name string
		n    uint64
	}{{"dropped-packets", s.DroppedPackets}, {"backpressure", s.Backpressure}, {"full", s.Full},
		{"raw", s.Raw}, {"seq-gaps", s.SeqGaps}, {"foreign", s.Foreign}} {
		if f.n != 0 {
			b = fmt.Appendf(b, " %s=%d", f.name, f.n)
		}
	}
	return string(b)
}
