package xsk

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// fakeRing lays out a ring in Go memory the way the kernel does:
// producer, consumer and flags words, then the descriptors.
func fakeRing(size, descSize int) ([]byte, *unix.XDPRingOffset) {
	mem := make([]byte, 256+size*descSize)
	return mem, &unix.XDPRingOffset{Producer: 0, Consumer: 64, Flags: 128, Desc: 256}
}

func u32(mem []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }

// TestRingWrap drives a producer ring (fill) and a consumer ring (RX)
// across many wrap-arounds of their 32-bit indices, with the "kernel"
// side played by the test.
func TestRingWrap(t *testing.T) {
	const size = 8
	mem, off := fakeRing(size, 8)
	// Start near the 32-bit wrap.
	*u32(mem, 0), *u32(mem, 64) = 0xfffffff0, 0xfffffff0
	var f FillRing
	f.setup(mem, off, size)
	require.Equal(t, size, f.Free())
	kcons := uint32(0xfffffff0)
	next := uint64(0)
	for round := 0; round < 100; round++ {
		idx, n := f.Reserve(5)
		for i := 0; i < n; i++ {
			f.Set(idx+uint32(i), next)
			next++
		}
		f.Submit(n)
		// The kernel consumes what is there, in order.
		prod := *u32(mem, 0)
		for kcons != prod {
			addr := *(*uint64)(unsafe.Pointer(&mem[256+int(kcons%size)*8]))
			require.Equal(t, next-uint64(prod-kcons), addr)
			kcons++
		}
		*u32(mem, 64) = kcons
	}
	// Full ring: Reserve gives what is free and no more.
	idx, n := f.Reserve(size + 3)
	require.Equal(t, size, n)
	f.Cancel(n)
	_ = idx

	rmem, roff := fakeRing(size, 16)
	*u32(rmem, 0), *u32(rmem, 64) = 0xfffffffc, 0xfffffffc
	var rx RXRing
	rx.setup(rmem, roff, size)
	kprod := uint32(0xfffffffc)
	seq := uint64(0)
	got := uint64(0)
	for round := 0; round < 100; round++ {
		// The kernel produces up to the free space.
		for i := 0; i < 6 && kprod-*u32(rmem, 64) < size; i++ {
			d := (*Desc)(unsafe.Pointer(&rmem[256+int(kprod%size)*16]))
			d.Addr, d.Len = seq, uint32(seq)
			seq++
			kprod++
		}
		*u32(rmem, 0) = kprod
		idx, n := rx.Peek(4)
		for i := 0; i < n; i++ {
			d := rx.Desc(idx + uint32(i))
			require.Equal(t, got, d.Addr)
			got++
		}
		rx.Release(n)
	}
	require.Greater(t, got, uint64(300))
}

func TestNeedWakeup(t *testing.T) {
	mem, off := fakeRing(8, 16)
	var tx TXRing
	tx.setup(mem, off, 8)
	require.False(t, tx.NeedsWakeup())
	*u32(mem, 128) = unix.XDP_RING_NEED_WAKEUP
	require.True(t, tx.NeedsWakeup())
	n := tx.Put([]Desc{{Addr: 1, Len: 2}, {Addr: 3, Len: 4}})
	require.Equal(t, 2, n)
	require.Equal(t, 2, tx.Pending())
	require.Equal(t, uint32(2), *u32(mem, 0))
}

// TestRingRetired: a ring whose memory Close replaced with zero pages
// under a goroutine still using it (retire) reads as empty, not as four
// billion entries: a completion reap that looped while rings came back
// full appended zero addresses until the process ran out of memory (24
// GB, TestCloseRacesBursts under -race).
func TestRingRetired(t *testing.T) {
	const size = 8
	mem, off := fakeRing(size, 8)
	var c CompletionRing
	c.setup(mem, off, size)
	var f FillRing
	fmem, foff := fakeRing(size, 8)
	f.setup(fmem, foff, size)
	// Some traffic first, so that the cached indices are not zero.
	addrs := make([]uint64, size)
	for round := 0; round < 5; round++ {
		*u32(mem, 0) += 3 // the kernel completes three
		require.Equal(t, 3, c.Get(addrs))
		require.Equal(t, 3, f.Put(addrs[:3]))
		*u32(fmem, 64) += 3 // and takes three fill slots
	}
	// Retired: every shared index reads zero.
	clear(mem[:256])
	clear(fmem[:256])
	require.Zero(t, c.Get(addrs))
	_, n := c.Peek(size)
	require.Zero(t, n)
	require.Zero(t, f.Free())
	require.Zero(t, f.Put(addrs))
}
