// Package units parses the sizes that address strings carry, such as
// "64K" or "16M".
package units

import (
	"errors"
	"strconv"
	"strings"
)

// ErrSize reports a malformed or out-of-range size.
var ErrSize = errors.New("not a size")

// ParseSize parses a non-negative byte count with an optional K, M or G
// suffix (powers of 1024, either case), at most limit bytes.
func ParseSize(s string, limit int) (int, error) {
	mult := 1
	switch {
	case strings.HasSuffix(s, "K"), strings.HasSuffix(s, "k"):
		mult = 1 << 10
	case strings.HasSuffix(s, "M"), strings.HasSuffix(s, "m"):
		mult = 1 << 20
	case strings.HasSuffix(s, "G"), strings.HasSuffix(s, "g"):
		mult = 1 << 30
	}
	if mult != 1 {
		s = s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > limit/mult {
		return 0, ErrSize
	}
	return n * mult, nil
}
