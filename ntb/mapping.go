//go:build linux

package ntb

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/liveness"
	"github.com/weft-io/weft/internal/shm"
)

// Mapping is memory shared with the other side of a bridge that need not
// run in the same kernel: a PCI BAR such as QEMU's ivshmem seen from two
// virtual machines (ntb/pci), or the file behind it on the host. Close
// releases it; after Close the bytes must not fault (replace the mapping
// rather than unmap it), since stale window slices may still be read.
type Mapping interface {
	Bytes() []byte
	Close() error
}

// MappingConfig configures a bridge over a Mapping. The zero value is the
// default.
type MappingConfig struct {
	// Geometry is used when the mapping holds no bridge yet (all zero
	// bytes); otherwise the geometry found there is adopted. MemSize 0
	// means as much as fits.
	Geometry ShmConfig
	// Side is the side to take: 0, 1, or -1 for whichever is free. Two
	// machines that share a BAR and name their sides never race.
	Side int
	// Poll is the step of a doorbell sleep (0: 200µs): a futex cannot
	// cross kernels, so sleepers re-check the doorbell this often.
	Poll time.Duration
	// Link is the heartbeat and link-poll period (0: 10ms).
	Link time.Duration
	// Dead is how long a silent heartbeat means the peer is gone (0: 1s;
	// emulated machines stall for long stretches).
	Dead time.Duration
	// Attach bounds the wait for a side that another owner seems to hold
	// or for a header being formatted (0: Dead plus 1s).
	Attach time.Duration
}

// OpenMapping attaches to the emulated bridge laid out in m (the same
// register block as OpenShm's file: header, one block per side, each
// side's memory), formatting it first if it is all zeros. Presence is a
// heartbeat, not a file lock, and doorbell sleeps poll, so the two sides
// may be in different kernels: two virtual machines sharing an ivshmem
// BAR, or a guest and its host. The device owns m and closes it.
//
// A side is free when its owner word is zero (its last owner closed) or
// its heartbeat has been silent for Dead (its owner died); a side whose
// owner is alive gives ErrBusy.
//
// A peer caught formatting the header is waited for up to Attach; after
// that the error matches ErrBusy.
func OpenMapping(name string, m Mapping, c MappingConfig) (*ShmDevice, error) {
	return openMapping(context.Background(), name, m, c)
}

// openMapping is OpenMapping for a caller with a context (an ntb address's
// Open): a peer caught formatting the header is then waited for until ctx
// ends, not Attach. The formatter has just shown it is alive, and a
// stalled machine (an emulated guest, a host writing back a disk-backed
// file) can hold it between its first and last store for seconds.
func openMapping(ctx context.Context, name string, m Mapping, c MappingConfig) (*ShmDevice, error) {
	if c.Poll <= 0 {
		c.Poll = 200 * time.Microsecond
	}
	if c.Link <= 0 {
		c.Link = 10 * time.Millisecond
	}
	if c.Dead <= 0 {
		c.Dead = time.Second
	}
	if c.Attach <= 0 {
		c.Attach = c.Dead + time.Second
	}
	if c.Side < -1 || c.Side > 1 {
		return nil, fmt.Errorf("ntb: %s: side %d is not 0, 1 or -1: %w", name, c.Side, fabric.ErrInvalid)
	}
	mem := m.Bytes()
	if len(mem) < shmHeaderSize+2*mwAlign || uintptr(unsafe.Pointer(unsafe.SliceData(mem)))%8 != 0 {
		return nil, fmt.Errorf("ntb: %s: %d bytes cannot hold a bridge: %w", name, len(mem), fabric.ErrInvalid)
	}
	g, err := geometry(c.Geometry, uint64(len(mem)))
	if err != nil {
		return nil, fmt.Errorf("ntb: %s: %w", name, err)
	}
	d := &ShmDevice{path: name, fd: -1, mem: mem, mapping: m, events: make(chan LinkEvent, 16), stop: make(chan struct{}), nudge: make(chan struct{}, 1),
		polled: true, pollEvery: c.Poll, linkEvery: c.Link, deadAfter: c.Dead, token: randUint32() | 1}
	deadline := time.Now().Add(c.Attach)
	// Format a blank mapping; wait for a peer that is formatting it.
	magic := shm.U64(mem, hdrMagic)
	if magic.CompareAndSwap(0, shmFormatting) {
		formatHeader(mem, g)
	}
	if err := awaitFormat(ctx, magic, deadline); err != nil {
		return nil, fmt.Errorf("ntb: %s: %w", name, err)
	}
	if err := d.readHeader(false); err != nil {
		return nil, err
	}
	if err := d.claim(c.Side, deadline); err != nil {
		return nil, err
	}
	d.takeSide()
	shm.U32(d.my, sideHeartbeat).Add(1)
	d.peerHBAt = liveness.Now()
	d.stalls = liveness.New(d.linkEvery)
	d.stalls.Start(d.peerHBAt)
	d.wg.Add(1)
	go d.monitor()
	return d, nil
}

// awaitFormat waits while a peer formats the header: until ctx ends, or
// until deadline when ctx has no deadline of its own. Nothing rings when
// the formatter finishes (the sides may be in different kernels), so it
// polls every millisecond on a runtime timer. The error matches ErrBusy,
// and ctx's cause too when ctx itself ended.
func awaitFormat(ctx context.Context, magic *atomic.Uint64, deadline time.Time) error {
	wait := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		wait, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	var tick *time.Ticker
	for magic.Load() == shmFormatting {
		if tick == nil {
			tick = time.NewTicker(time.Millisecond)
			defer tick.Stop()
		}
		select {
		case <-wait.Done():
			const why = "a peer began formatting the bridge and has not finished (one that died leaves it so until the memory is zeroed)"
			if ctx.Err() != nil {
				return fmt.Errorf("%s: %w (%w)", why, ErrBusy, context.Cause(ctx))
			}
			return fmt.Errorf("%s: %w", why, ErrBusy)
		case <-tick.C:
		}
	}
	return nil
}

// geometry applies the defaults of ShmConfig and fits the memory into a
// mapping of size bytes.
func geometry(c ShmConfig, size uint64) (ShmConfig, error) {
	fit := int((size-shmHeaderSize)/2) &^ (mwAlign - 1)
	if c.MemSize == 0 || c.MemSize > fit {
		if c.MemSize > fit {
			return c, fmt.Errorf("memory of %d bytes per side does not fit in %d bytes: %w", c.MemSize, size, fabric.ErrInvalid)
		}
		c.MemSize = fit
	}
	err := c.check()
	return c, err
}

// claim takes side (or a free one for -1) by compare-and-swap on its
// owner word. An owned side is taken over only once its heartbeat has
// stayed still for deadAfter.
func (d *ShmDevice) claim(side int, deadline time.Time) error {
	sides := []int{0, 1}
	if side >= 0 {
		sides = []int{side}
	}
	block := func(s int) []byte {
		return d.mem[sideBlockOff+s*sideBlockSize : sideBlockOff+(s+1)*sideBlockSize]
	}
	// A free side first.
	for _, s := range sides {
		if shm.U32(block(s), sideOwner).CompareAndSwap(0, d.token) {
			d.side = s
			return nil
		}
	}
	// Then one whose owner stopped beating.
	type seen struct {
		owner, hb uint32
		at        int64 // liveness.Now
	}
	last := make([]seen, len(sides))
	stalls := liveness.New(d.linkEvery)
	now := liveness.Now()
	stalls.Start(now)
	for i, s := range sides {
		last[i] = seen{shm.U32(block(s), sideOwner).Load(), shm.U32(block(s), sideHeartbeat).Load(), now}
	}
	for {
		// Time this loop did not run is not the owner's silence: a
		// paused host would otherwise take over a live side.
		now = liveness.Now()
		st := stalls.Check(now)
		for i, s := range sides {
			b := block(s)
			liveness.Forward(&last[i].at, st, now)
			owner, hb := shm.U32(b, sideOwner).Load(), shm.U32(b, sideHeartbeat).Load()
			if owner == 0 && shm.U32(b, sideOwner).CompareAndSwap(0, d.token) {
				d.side = s
				return nil
			}
			if owner != last[i].owner || hb != last[i].hb {
				last[i] = seen{owner, hb, now}
				continue
			}
			if now-last[i].at >= int64(d.deadAfter) && shm.U32(b, sideOwner).CompareAndSwap(owner, d.token) {
				d.side = s
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ntb: %s: %w", d.path, ErrBusy)
		}
		time.Sleep(d.linkEvery)
	}
}

// peerAlive reports, on a mapping device, whether the peer owns its side,
// has enabled its link and its heartbeat moved within deadAfter. Only
// the monitor calls it.
func (d *ShmDevice) peerAlive() bool {
	if shm.U32(d.per, sideOwner).Load() == 0 || shm.U32(d.per, sideState).Load() != stateEnabled {
		return false
	}
	now := liveness.Now()
	if hb := shm.U32(d.per, sideHeartbeat).Load(); hb != d.peerHB {
		d.peerHB, d.peerHBAt = hb, now
		return true
	}
	return now-d.peerHBAt < int64(d.deadAfter)
}

// FileMapping is a Mapping of a window of a file, such as the host's view
// of an ivshmem device (the memory-backend-file QEMU shares with its
// guests) or a plain file that stands in for a BAR in tests.
type FileMapping struct {
	b []byte
}

// MapFile maps size bytes of the file at path from off, creating and
// growing the file as needed (size 0: the rest of the file).
func MapFile(path string, off, size int64) (*FileMapping, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if off < 0 || size < 0 || off%int64(os.Getpagesize()) != 0 {
		return nil, fmt.Errorf("ntb: map %s at %d+%d: %w", path, off, size, fabric.ErrInvalid)
	}
	if size == 0 {
		size = st.Size() - off
		if size <= 0 {
			return nil, fmt.Errorf("ntb: map %s: nothing past offset %d: %w", path, off, fabric.ErrInvalid)
		}
	}
	if st.Size() < off+size {
		if err := f.Truncate(off + size); err != nil {
			return nil, err
		}
	}
	b, err := unix.Mmap(int(f.Fd()), off, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	return &FileMapping{b: b}, nil
}

// Bytes implements Mapping.
func (m *FileMapping) Bytes() []byte { return m.b }

// Close implements Mapping: it replaces the shared mapping in place with
// anonymous memory, so stale slices read zeros instead of faulting.
func (m *FileMapping) Close() error {
	if m.b == nil {
		return nil
	}
	_, err := unix.MmapPtr(-1, 0, unsafePointer(m.b), uintptr(len(m.b)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED|unix.MAP_NORESERVE)
	if err != nil {
		err = unix.Munmap(m.b)
	}
	m.b = nil
	return err
}

// asMapping returns m as a Mapping, or a nil Mapping where err is set:
// never a nil pointer inside a non-nil interface.
func asMapping[M Mapping](m M, err error) (Mapping, error) {
	if err != nil {
		return nil, err
	}
	return m, nil
}
