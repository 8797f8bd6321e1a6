//go:build linux

package chipmodel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"golang.org/x/sys/unix"
)

// Family is a bridge family the model knows.
type Family int

// The modelled families.
const (
	// IntelGen1 is the Xeon back-to-back NTB of Sandy Bridge to Broadwell
	// (Linux drivers/ntb/hw/intel/ntb_hw_gen1.c).
	IntelGen1 Family = iota
	// IntelGen3 is Skylake Xeon's (ntb_hw_gen3.c).
	IntelGen3
	// IntelGen4 is Ice Lake and Sapphire Rapids Xeon's (ntb_hw_gen4.c).
	IntelGen4
	// AMD is the Zeppelin layout (drivers/ntb/hw/amd/ntb_hw_amd.c): one
	// bridge whose two sides share one register block, each seeing the
	// other's registers in a mirror 0x400 up.
	AMD
)

// Families lists every modelled family.
func Families() []Family { return []Family{IntelGen1, IntelGen3, IntelGen4, AMD} }

// String names the family (intel-gen1, intel-gen3, intel-gen4, amd).
func (f Family) String() string {
	switch f {
	case IntelGen1:
		return "intel-gen1"
	case IntelGen3:
		return "intel-gen3"
	case IntelGen4:
		return "intel-gen4"
	case AMD:
		return "amd"
	}
	return fmt.Sprintf("family(%d)", int(f))
}

// PCIID returns the PCI vendor and device ID of the function the model
// stands for (from the Linux drivers' device tables): Sandy Bridge B2B,
// Skylake, Ice Lake/Sapphire Rapids, Zeppelin.
func (f Family) PCIID() (vendor, device uint16) {
	switch f {
	case IntelGen1:
		return 0x8086, 0x3c0d
	case IntelGen3:
		return 0x8086, 0x201c
	case IntelGen4:
		return 0x8086, 0x347e
	case AMD:
		return 0x1022, 0x145b
	}
	return 0, 0
}

// Config sizes a modelled bridge. The zero value is the default.
type Config struct {
	// MemSize is each side's DMA memory (0: 8 MiB), a multiple of the
	// page size.
	MemSize uint64
	// WindowSize is each window BAR's size (0: 4 MiB), a power of two of
	// at least a page.
	WindowSize uint64
	// Gen1B2BShare sets Intel gen1 up as Linux's b2b_mw_share does: the
	// first half of window BAR 4 reaches the peer's registers and its
	// second half is a memory window (SBAR45 half-size, half-way up).
	// Without it BAR 4 reaches only the registers (SBAR45 disabled), as
	// with Linux's defaults.
	Gen1B2BShare bool
}

// ErrConfig is returned by New for sizes it cannot model.
var ErrConfig = errors.New("chipmodel: bad configuration")

// Chip is one modelled bridge: two sides joined by a link. Its methods
// and its sides' are safe for concurrent use.
type Chip struct {
	fam  Family
	spec *spec
	cfg  Config

	mu     sync.Mutex
	sides  [2]*Side
	shared [16]uint32 // AMD: the scratchpads both sides share
	linkUp bool
	closed bool
}

// Side is one side of the bridge: one PCI function with its register BAR,
// configuration space, window BARs and the host memory behind it.
type Side struct {
	c      *Chip
	idx    int
	regs   []byte // plain register storage
	cfg    []byte // configuration space
	mem    *Memory
	wins   []*Window // live outbound window mappings
	faults []string
}

// spec is what a family does: its registers and how its windows route.
type spec struct {
	regBAR  uint64 // register BAR size
	winBARs []int  // the window BARs, in window order
	regs    []reg
	reset   func(s *Side)
	// enabled reports whether a side has enabled its end of the link;
	// nil: the family has no chip-level link (AMD), routing never
	// depends on it.
	enabled func(s *Side) bool
	// linkChanged applies a link change's side effects to a side.
	linkChanged func(s *Side, up bool)
	// route gives where src's outbound window on bar lands: the bus
	// address of its first byte in the peer's memory and how many bytes
	// from the window's start the translation and limits let through.
	route func(src *Side, bar int) (bus, n uint64)
	// memStart is how far into src's window on bar the routed bytes
	// start (the first part reaching the peer's registers: Intel gen1
	// with Config.Gen1B2BShare); nil: 0.
	memStart func(src *Side, bar int) uint64
	// regWindow reports whether src's outbound window on bar lands on
	// the peer's register BAR (its first regWindowSize bytes), which the
	// window's Load and Store then work (Intel gen1's B2B window); nil:
	// no window ever does.
	regWindow func(src *Side, bar int) bool
	// linkWrite applies a register write that arrives from the link side
	// through such a window, where it differs from the local side's
	// (gen1: PDOORBELL sets bits); false: as a local write.
	linkWrite func(p *Side, off uint32, width uint8, v uint64) bool
	// mirror is the range of the register BAR that is the peer's block
	// 0x400 down (AMD); zero: none.
	mirror [2]uint32
}

// mirrorOff returns the peer's offset for an access in the mirror.
func (s *Side) mirrorOff(off uint32) (uint32, bool) {
	m := s.c.spec.mirror
	if off >= m[0] && off < m[1] {
		return off - 0x400, true
	}
	return 0, false
}

// reg is a register with behaviour. A nil load or store is plain storage.
type reg struct {
	name  string
	off   uint32
	width uint8
	load  func(s *Side) uint64
	store func(s *Side, v uint64)
	// effects: a store may move windows or change the link.
	effects bool
}

func arrayRegs(name string, off uint32, width uint8, n int, stride uint32, mk func(i int) reg) []reg {
	var rs []reg
	for i := range n {
		r := mk(i)
		r.name, r.off, r.width = fmt.Sprintf("%s[%d]", name, i), off+uint32(i)*stride, width
		rs = append(rs, r)
	}
	return rs
}

// Bus addresses of the model: side i's DMA memory, and its BARs in the
// host's address space.
func memBus(side int) uint64 { return 0x1_0000_0000 << side }

func barStart(side, bar int) uint64 { return 0x80_0000_0000*uint64(side+1) + uint64(bar)<<28 }

// New builds a bridge of family f, both sides at reset.
func New(f Family, cfg Config) (*Chip, error) {
	if cfg.MemSize == 0 {
		cfg.MemSize = 8 << 20
	}
	if cfg.WindowSize == 0 {
		cfg.WindowSize = 4 << 20
	}
	pg := uint64(unix.Getpagesize())
	if cfg.MemSize%pg != 0 || cfg.WindowSize < pg || cfg.WindowSize&(cfg.WindowSize-1) != 0 || cfg.WindowSize > 1<<28 {
		return nil, fmt.Errorf("%w: memory %#x, windows %#x", ErrConfig, cfg.MemSize, cfg.WindowSize)
	}
	var sp *spec
	switch f {
	case IntelGen1:
		sp = gen1Spec()
	case IntelGen3:
		sp = gen3Spec()
	case IntelGen4:
		sp = gen4Spec()
	case AMD:
		sp = amdSpec()
	default:
		return nil, fmt.Errorf("%w: family %v", ErrConfig, f)
	}
	c := &Chip{fam: f, spec: sp, cfg: cfg}
	for i := range c.sides {
		m, err := newMemory(cfg.MemSize, memBus(i))
		if err != nil {
			c.Close()
			return nil, err
		}
		c.sides[i] = &Side{c: c, idx: i, regs: make([]byte, sp.regBAR), cfg: make([]byte, 4096), mem: m}
	}
	for _, s := range c.sides {
		sp.reset(s)
	}
	return c, nil
}

// Family returns the chip's family.
func (c *Chip) Family() Family { return c.fam }

// Side returns side i (0 or 1).
func (c *Chip) Side(i int) *Side { return c.sides[i] }

// LinkUp reports whether the chip's link is up (both sides enabled it).
// For AMD, which has no chip-level link in the model, it reports whether
// both sides have set their ready bit.
func (c *Chip) LinkUp() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.linkState()
}

// Close unmaps every window and frees both sides' memory.
func (c *Chip) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	for _, s := range c.sides {
		if s == nil {
			continue
		}
		for _, w := range s.wins {
			errs = append(errs, w.unmap())
		}
		s.wins = nil
		errs = append(errs, s.mem.close())
	}
	return errors.Join(errs...)
}

func (c *Chip) linkState() bool {
	if c.spec.enabled == nil {
		return amdReady(c.sides[0]) && amdReady(c.sides[1])
	}
	return c.spec.enabled(c.sides[0]) && c.spec.enabled(c.sides[1])
}

// update follows a store that may have changed the link or the windows:
// link side effects first, then every window is routed again.
func (c *Chip) update() {
	if c.spec.enabled != nil {
		if up := c.linkState(); up != c.linkUp {
			c.linkUp = up
			for _, s := range c.sides {
				c.spec.linkChanged(s, up)
			}
		}
	}
	for _, s := range c.sides {
		for _, w := range s.wins {
			w.reroute()
		}
	}
}

// Index returns which side this is (0 or 1).
func (s *Side) Index() int { return s.idx }

// Peer returns the other side.
func (s *Side) Peer() *Side { return s.c.sides[1-s.idx] }

// RegBARSize returns the size of the register BAR (BAR 0).
func (s *Side) RegBARSize() uint64 { return s.c.spec.regBAR }

// WindowBARs returns the BAR of each memory window, in window order.
func (s *Side) WindowBARs() []int { return append([]int(nil), s.c.spec.winBARs...) }

// BAR returns where BAR bar sits in this side's host address space and
// its size (0, 0 for a BAR the function does not implement).
func (s *Side) BAR(bar int) (start, size uint64) {
	if bar == 0 {
		return barStart(s.idx, 0), s.c.spec.regBAR
	}
	for _, b := range s.c.spec.winBARs {
		if b == bar {
			return barStart(s.idx, bar), s.c.cfg.WindowSize
		}
	}
	return 0, 0
}

// Memory returns this side's DMA memory: what the peer's writes through
// its outbound windows land in.
func (s *Side) Memory() *Memory { return s.mem }

// Faults returns the accesses the model found wrong (a width the chip's
// register does not have, an access straddling a register, one past the
// BAR), in order.
func (s *Side) Faults() []string {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return append([]string(nil), s.faults...)
}

func (s *Side) fault(format string, args ...any) {
	if len(s.faults) < 64 {
		s.faults = append(s.faults, fmt.Sprintf("side %d: ", s.idx)+fmt.Sprintf(format, args...))
	}
}

// find returns the register with behaviour that an access overlaps, and
// whether it is exactly that register.
func (s *Side) find(off uint32, width uint8) (*reg, bool) {
	for i := range s.c.spec.regs {
		r := &s.c.spec.regs[i]
		if off < r.off+uint32(r.width) && r.off < off+uint32(width) {
			return r, r.off == off && r.width == width
		}
	}
	return nil, false
}

func validAccess(off uint32, width uint8, size uint64) bool {
	switch width {
	case 1, 2, 4, 8:
	default:
		return false
	}
	return uint64(off)+uint64(width) <= size && off%uint32(width) == 0
}

// Load implements ntb.RegIO: one read of width bytes at off in the
// register BAR, with the register's side effects.
func (s *Side) Load(off uint32, width uint8) uint64 {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.load(off, width)
}

func (s *Side) load(off uint32, width uint8) uint64 {
	if !validAccess(off, width, uint64(len(s.regs))) {
		s.fault("load of %d bytes at %#x", width, off)
		return ^uint64(0) >> (64 - 8*uint(min(max(width, 1), 8)))
	}
	if po, ok := s.mirrorOff(off); ok {
		return s.Peer().load(po, width)
	}
	r, exact := s.find(off, width)
	switch {
	case r == nil:
	case !exact:
		s.fault("load of %d bytes at %#x: %s is %d bytes at %#x", width, off, r.name, r.width, r.off)
	case r.load != nil:
		return r.load(s)
	}
	return s.get(off, width)
}

// Store implements ntb.RegIO: one write of width bytes at off in the
// register BAR, with the register's side effects.
func (s *Side) Store(off uint32, width uint8, v uint64) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	s.store(off, width, v)
}

func (s *Side) store(off uint32, width uint8, v uint64) {
	if !validAccess(off, width, uint64(len(s.regs))) {
		s.fault("store of %d bytes at %#x", width, off)
		return
	}
	if po, ok := s.mirrorOff(off); ok {
		s.Peer().store(po, width, v)
		return
	}
	if width < 8 {
		v &= 1<<(8*uint(width)) - 1
	}
	r, exact := s.find(off, width)
	switch {
	case r == nil:
		s.put(off, width, v)
		return
	case !exact:
		s.fault("store of %d bytes at %#x: %s is %d bytes at %#x", width, off, r.name, r.width, r.off)
		s.put(off, width, v)
	case r.store != nil:
		r.store(s, v)
	default:
		s.put(off, width, v)
	}
	if r.effects && !s.c.closed {
		s.c.update()
	}
}

// get and put are plain register storage, little-endian.
func (s *Side) get(off uint32, width uint8) uint64 {
	var b [8]byte
	copy(b[:width], s.regs[off:])
	return binary.LittleEndian.Uint64(b[:])
}

func (s *Side) put(off uint32, width uint8, v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	copy(s.regs[off:off+uint32(width)], b[:width])
}

// w1c clears the bits written as one.
func w1c(off uint32, width uint8) func(s *Side, v uint64) {
	return func(s *Side, v uint64) { s.put(off, width, s.get(off, width)&^v) }
}

// readZero is a write-only register's load.
func readZero(*Side) uint64 { return 0 }

// Config returns this side's configuration space, as a reader (the link
// status of the Intel parts lives there).
func (s *Side) Config() io.ReaderAt { return cfgReader{s} }

type cfgReader struct{ s *Side }

func (r cfgReader) ReadAt(p []byte, off int64) (int, error) {
	r.s.c.mu.Lock()
	defer r.s.c.mu.Unlock()
	if off < 0 || off >= int64(len(r.s.cfg)) {
		return 0, io.EOF
	}
	n := copy(p, r.s.cfg[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (s *Side) putCfg(off int, width int, v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	copy(s.cfg[off:off+width], b[:width])
}

// Pending returns the doorbell bits that would raise an interrupt: the
// status bits the mask does not hold back (the link bit included, where
// the family signals link changes on a doorbell bit).
func (s *Side) Pending() uint64 {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	switch s.c.fam {
	case IntelGen1:
		return s.get(0x60, 2) &^ s.get(0x62, 2)
	case IntelGen3, IntelGen4:
		return s.get(0x40, 8) &^ s.get(0x48, 8)
	case AMD:
		return s.get(0x460, 2) &^ s.get(0x45c, 2)
	}
	return 0
}
