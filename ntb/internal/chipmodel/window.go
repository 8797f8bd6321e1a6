//go:build linux

package chipmodel

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Memory is a side's DMA memory: a memfd mapped in this process, with a
// bus address (ntb.DMAMemory's method set). The peer's outbound windows
// map the same memfd.
type Memory struct {
	fd  int
	b   []byte
	bus uint64
}

func newMemory(size, bus uint64) (*Memory, error) {
	fd, err := unix.MemfdCreate("chipmodel-dma", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("chipmodel: memfd: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("chipmodel: memfd: %w", err)
	}
	b, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("chipmodel: mmap: %w", err)
	}
	return &Memory{fd: fd, b: b, bus: bus}, nil
}

// Bytes returns the memory.
func (m *Memory) Bytes() []byte { return m.b }

// BusAddr returns the bus address of the memory's first byte.
func (m *Memory) BusAddr() uint64 { return m.bus }

func (m *Memory) close() error {
	if m.b == nil {
		return nil
	}
	err := errors.Join(unix.Munmap(m.b), unix.Close(m.fd))
	m.b = nil
	return err
}

// Window is a mapping of an outbound window BAR: its pages are the peer's
// memory where the peer's translation puts them, and a private sink
// beyond what the translation and limits let through.
type Window struct {
	s   *Side
	bar int
	b   []byte
	// the current route: n bytes from skip into the window map the
	// peer's memfd at off (n 0: all sink).
	skip, off, n uint64
	closed       bool
}

// MapWindow maps this side's outbound window BAR bar. The mapping follows
// the translation live until Close (or the chip's Close).
func (s *Side) MapWindow(bar int) (*Window, error) {
	_, size := s.BAR(bar)
	if bar == 0 || size == 0 {
		return nil, fmt.Errorf("%w: side %d has no window BAR %d", ErrConfig, s.idx, bar)
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if s.c.closed {
		return nil, fmt.Errorf("%w: the chip is closed", ErrConfig)
	}
	b, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("chipmodel: window mmap: %w", err)
	}
	w := &Window{s: s, bar: bar, b: b}
	w.reroute()
	s.wins = append(s.wins, w)
	return w, nil
}

// Bytes returns the window.
func (w *Window) Bytes() []byte { return w.b }

// regs reports whether the window reaches the peer's registers now, and
// records a fault when it does not (with the chip locked).
func (w *Window) regs(op string, off uint32, width uint8) bool {
	s := w.s
	switch {
	case w.closed:
		s.fault("%s of %d bytes at %#x through window BAR %d after its Close", op, width, off, w.bar)
	case s.c.spec.regWindow == nil || !s.c.spec.regWindow(s, w.bar):
		s.fault("%s of %d bytes at %#x through window BAR %d, whose translation does not reach the peer's registers", op, width, off, w.bar)
	case uint64(off)+uint64(width) > gen1RegWindow:
		s.fault("%s of %d bytes at %#x through window BAR %d, past the peer's %#x bytes of registers", op, width, off, w.bar, gen1RegWindow)
	default:
		return true
	}
	return false
}

// Load reads the peer's register at off through the window, as one
// access of width bytes (ntb.RegIO), where the window's translation
// lands on the peer's register BAR (Intel gen1's B2B window). With the
// link down the chip drops it (all ones); an access through a window
// that does not reach the registers is a fault.
func (w *Window) Load(off uint32, width uint8) uint64 {
	s := w.s
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	ones := ^uint64(0) >> (64 - 8*uint(min(max(width, 1), 8)))
	if !w.regs("load", off, width) {
		return ones
	}
	if !s.c.linkUp {
		return ones
	}
	return s.Peer().load(off, width)
}

// Store writes the peer's register at off through the window, with the
// side effects a write from the link side has (gen1: PDOORBELL sets the
// bits written). With the link down the chip drops it.
func (w *Window) Store(off uint32, width uint8, v uint64) {
	s := w.s
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if !w.regs("store", off, width) || !s.c.linkUp {
		return
	}
	if width < 8 {
		v &= 1<<(8*uint(width)) - 1
	}
	p := s.Peer()
	if lw := s.c.spec.linkWrite; lw != nil && validAccess(off, width, uint64(len(p.regs))) && lw(p, off, width, v) {
		return
	}
	p.store(off, width, v)
}

// Close unmaps the window.
func (w *Window) Close() error {
	s := w.s
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	for i, x := range s.wins {
		if x == w {
			s.wins = append(s.wins[:i], s.wins[i+1:]...)
			break
		}
	}
	return w.unmap()
}

func (w *Window) unmap() error {
	if w.closed {
		return nil
	}
	w.closed = true
	return unix.Munmap(w.b)
}

// Route reports where this side's outbound window on bar lands now: the
// offset in the peer's memory of the window's first routed byte and how
// many bytes from there reach it (0: none; the rest is sink). The routed
// bytes start at the window's start, or past the peer's registers where
// the window reaches them first (MemStart).
func (s *Side) Route(bar int) (memOff, n uint64) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.route(bar)
}

// MemStart reports how far into this side's outbound window on bar the
// routed bytes start (Intel gen1 with Config.Gen1B2BShare: BAR 4's
// second half).
func (s *Side) MemStart(bar int) uint64 {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.memStart(bar)
}

func (s *Side) memStart(bar int) uint64 {
	if f := s.c.spec.memStart; f != nil {
		return f(s, bar)
	}
	return 0
}

// route turns the family's bus-address route into memfd terms: only whole
// pages inside the peer's memory are mapped.
func (s *Side) route(bar int) (memOff, n uint64) {
	_, size := s.BAR(bar)
	if s.c.spec.enabled != nil && !s.c.linkUp {
		return 0, 0 // no link: the chip drops the writes
	}
	bus, n := s.c.spec.route(s, bar)
	n = min(n, size-min(size, s.memStart(bar)))
	peer := s.Peer().mem
	pg := uint64(unix.Getpagesize())
	if n == 0 || bus < peer.bus || bus-peer.bus >= uint64(len(peer.b)) || (bus-peer.bus)%pg != 0 {
		return 0, 0
	}
	off := bus - peer.bus
	n = min(n, uint64(len(peer.b))-off)
	return off, n - n%pg
}

// reroute remaps the window if its route changed (with the chip locked).
func (w *Window) reroute() {
	if w.closed {
		return
	}
	off, n := w.s.route(w.bar)
	skip := w.s.memStart(w.bar)
	if n == 0 {
		skip, off = 0, 0
	}
	if skip == w.skip && off == w.off && n == w.n {
		return
	}
	base := unsafe.Pointer(unsafe.SliceData(w.b))
	rw := unix.PROT_READ | unix.PROT_WRITE
	if n > 0 {
		if _, err := unix.MmapPtr(w.s.Peer().mem.fd, int64(off), unsafe.Add(base, skip), uintptr(n), rw, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
			w.s.fault("remapping window BAR %d onto the peer's memory: %v", w.bar, err)
			n = 0
		}
	}
	// Pages that were the peer's and are not now become a fresh sink
	// (the rest of the window already is).
	sink := func(from, to uint64) {
		if from >= to {
			return
		}
		if _, err := unix.MmapPtr(-1, 0, unsafe.Add(base, from), uintptr(to-from), rw,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED); err != nil {
			w.s.fault("remapping window BAR %d's sink: %v", w.bar, err)
		}
	}
	if oldEnd := w.skip + w.n; n == 0 {
		sink(w.skip, oldEnd)
	} else {
		sink(w.skip, min(oldEnd, skip))
		sink(max(w.skip, skip+n), oldEnd)
	}
	w.skip, w.off, w.n = skip, off, n
}
