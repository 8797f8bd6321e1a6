//go:build !amd64 && !arm64

package xsk

import (
	"sync/atomic"
	"unsafe"
)

// storeRelease stores v to *p with (at least) release ordering.
func storeRelease(p *uint32, v uint32) {
	(*atomic.Uint32)(unsafe.Pointer(p)).Store(v)
}
