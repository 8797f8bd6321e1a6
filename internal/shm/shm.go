// Package shm gives typed, bounds-checked access to words in memory shared
// with another process or a device: atomic views for indices and flags,
// and plain little-endian accessors for fields that an atomic publication
// orders.
//
// Every accessor checks its offset against the slice and its alignment,
// so an offset derived from a peer's data cannot reach outside the
// mapping; callers that take offsets from a peer still validate them first
// and treat a failed check as malformed input.
package shm

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"
)

// U32 returns an atomic view of the 4-byte word at b[off:]. off must be a
// multiple of 4 from a 4-aligned base and within b; otherwise it panics
// (a programming error, never peer input: validate first).
func U32(b []byte, off int) *atomic.Uint32 {
	w := b[off : off+4 : off+4]
	p := unsafe.Pointer(unsafe.SliceData(w))
	if uintptr(p)&3 != 0 {
		panic("shm: misaligned 32-bit word")
	}
	return (*atomic.Uint32)(p)
}

// U64 returns an atomic view of the 8-byte word at b[off:], as U32.
func U64(b []byte, off int) *atomic.Uint64 {
	w := b[off : off+8 : off+8]
	p := unsafe.Pointer(unsafe.SliceData(w))
	if uintptr(p)&7 != 0 {
		panic("shm: misaligned 64-bit word")
	}
	return (*atomic.Uint64)(p)
}

// Get32 reads a little-endian uint32 without synchronisation.
func Get32(b []byte, off int) uint32 { return binary.LittleEndian.Uint32(b[off:]) }

// Put32 writes a little-endian uint32 without synchronisation.
func Put32(b []byte, off int, v uint32) { binary.LittleEndian.PutUint32(b[off:], v) }

// Get64 reads a little-endian uint64 without synchronisation.
func Get64(b []byte, off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }

// Put64 writes a little-endian uint64 without synchronisation.
func Put64(b []byte, off int, v uint64) { binary.LittleEndian.PutUint64(b[off:], v) }

// Zero clears b.
func Zero(b []byte) { clear(b) }
