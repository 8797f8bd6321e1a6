package wire

import "strconv"

// PSN is a 24-bit packet sequence number. Arithmetic wraps modulo 2^24, and
// comparisons follow the transport's rule that the valid window is half
// the sequence space (2^23): a PSN less than 2^23 ahead of another is
// after it, otherwise before.
//
// The same arithmetic applies to the 24-bit message sequence numbers of
// the AETH.
type PSN uint32

// PSNMask masks a uint32 to the 24 bits of a PSN.
const PSNMask = 1<<24 - 1

// psnWindow is half of the PSN space.
const psnWindow = 1 << 23

// Valid reports whether p fits in 24 bits.
func (p PSN) Valid() bool { return p <= PSNMask }

// Add returns p advanced by n (which may be negative), modulo 2^24.
func (p PSN) Add(n int) PSN { return (p + PSN(n)) & PSNMask }

// Next returns p + 1 modulo 2^24.
func (p PSN) Next() PSN { return (p + 1) & PSNMask }

// Sub returns the signed distance p - q, in [-2^23, 2^23). It is positive
// when p is after q.
func (p PSN) Sub(q PSN) int32 {
	d := uint32(p-q) & PSNMask
	return int32(d<<8) >> 8 // sign-extend 24 bits
}

// Less reports whether p is before q.
func (p PSN) Less(q PSN) bool { return p.Sub(q) < 0 }

// Compare returns -1 if p is before q, 0 if they are equal (modulo 2^24)
// and +1 if p is after q.
func (p PSN) Compare(q PSN) int {
	d := p.Sub(q)
	switch {
	case d < 0:
		return -1
	case d > 0:
		return 1
	}
	return 0
}

// InWindow reports whether p lies in the n PSNs that start at first:
// first, first+1, ..., first+n-1 (modulo 2^24). n is at most 2^23.
func (p PSN) InWindow(first PSN, n int) bool {
	d := uint32(p-first) & PSNMask
	return n > 0 && d < uint32(min(n, psnWindow))
}

// String returns the PSN in decimal.
func (p PSN) String() string { return strconv.FormatUint(uint64(p), 10) }
