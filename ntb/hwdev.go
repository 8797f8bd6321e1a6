//go:build linux

package ntb

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/shm"
	"github.com/weft-io/weft/internal/spin"
	hwmap "github.com/weft-io/weft/ntb/hw"
	"github.com/weft-io/weft/ntb/pci"
)

// DMAMemory is host memory a bridge can write into: the local memory of
// a hardware Device, which its inbound windows translate into. Bytes is
// the memory as this process sees it and BusAddr the bus address of its
// first byte, the memory being contiguous on the bus (a VFIO DMA mapping,
// or memory the platform reserved for the bridge).
type DMAMemory interface {
	Bytes() []byte
	BusAddr() uint64
}

// HWConfig configures a hardware Device. The zero value is the default.
type HWConfig struct {
	// Memory is the local memory inbound windows translate into. Without
	// it the device works but MWSetTrans reports fabric.ErrNotSupported.
	Memory DMAMemory
	// Link is the period of the link poll that feeds LinkEvents (0:
	// 10ms); negative: no poll (LinkIsUp still reads the hardware).
	Link time.Duration
	// PeerPort chooses the peer NT function on a switch with more than
	// two (IDT): the peer's switch port. 0 is the lowest-numbered other
	// active NT port (which is port 0 itself when that is one).
	PeerPort int
	// Spin is how long DBWait polls the doorbell register before it
	// sleeps between polls (the bridge's interrupts are not used).
	Spin time.Duration
	// OpTimeout bounds each operation the bridge performs on its own
	// (Switchtec's partition operations) before it is reported as a
	// timeout (0: 2s).
	OpTimeout time.Duration
}

// HWDevice is a hardware bridge worked through its register map (package
// ntb/hw): one driver for every family, reading the map's tables (Ops)
// for where each register is and how its fields are computed. It is
// UNTESTED ON HARDWARE. Its tests check the registers each operation
// writes against the documented layouts, over memory laid out like each
// register BAR; and they run two HWDevices, one per side, over a
// behavioural model of each chip family (package ntb/internal/chipmodel:
// Intel gen1, gen3, gen4, AMD, IDT, Switchtec, written from the
// documented behaviour, not from this driver), through the transport and
// the whole fabrictest conformance suite. It implements Device (and
// Messenger where the bridge has message registers) with these limits:
//
//   - Close must not race the other calls: it unmaps what they reach
//     through (the transport stops its own users first); the other
//     calls are safe for concurrent use;
//   - doorbells are polled (DBWait), not taken as interrupts;
//   - the peer's translation cannot be read on hardware, so PeerMW maps
//     the whole outbound window whatever the peer set;
//   - IDT (hwdev_idt.go): one HWDevice per NT function, with one peer NT
//     function (HWConfig.PeerPort); no scratchpads, four message registers
//     (Messenger); the switch's 32 doorbell bits are shared out between
//     the active NT partitions through the global doorbell masks, as
//     the set stands when each side opens (a partition that becomes
//     active between the two sides' opens changes the layout under the
//     earlier one: open both again); windows
//     are found from the BAR set-up, and MWSetTrans writes the PEER
//     function's translation (the outbound side's, as the chip has it)
//     through the global address space; the link is the NT mapping table
//     and completion enable of both functions, as Linux's ntb_hw_idt reads
//     it. Tested against a behavioural model (ntb/internal/chipmodel), not
//     a switch;
//   - Switchtec: windows are configured by partition operations on the
//     peer's control block; the scratchpads and the link state live in a
//     64 KiB region of HWConfig.Memory (its last aligned 64 KiB, which
//     Memory() leaves out) that the peer reaches through a lookup-table
//     window, as Linux's driver does; message registers implement
//     Messenger. Tested against a model of the switch
//     (ntb/internal/chipmodel), not hardware;
//   - Intel gen1: the peer's doorbell and scratchpads are worked through
//     window BAR 4, whose translation lands on the peer's register BAR,
//     as Linux does on every listed part (their SDOORBELL lockup erratum
//     makes B2B_DOORBELL unsafe): that window is no client's (MWCount 1),
//     or only its second half is (MWCount 2) where the B2B set-up shares
//     it. The B2B set-up itself (secondary BAR sizes and bases, outbound
//     translations) is left to the platform or an earlier Linux probe;
//     the device reads the split from configuration space and refuses
//     one it does not know.
type HWDevice struct {
	name     string
	m        *hwmap.Map
	o        *hwmap.Ops
	regs     Mapping
	rb       []byte
	io       RegIO // nil: loads and stores on rb
	cfg      io.ReaderAt
	wins     []pci.Resource // each client window's BAR
	wdefs    []hwmap.Window // and its table entry (Ops.Windows less a PeerRegs window)
	woff     []uint64       // and where in its BAR it starts (the second half of a shared PeerRegs window)
	pregs    *peerRegs      // the peer's registers through a window (Ops.PeerRegs)
	mapBAR   func(bar int) (Mapping, error)
	mem      DMAMemory
	valid    uint64
	side     int
	dbBase   uint32 // the partition's doorbell block (Switchtec)
	part     uint32 // this partition and the peer's (Switchtec)
	peerPart uint32
	sw       *swState // Switchtec's shared window and partition operations
	// dbLocal and dbPeer place this side's doorbell bits in the status
	// and mask registers and the peer's in the ring register.
	dbLocal, dbPeer uint
	idt             *idtState  // IDT switch state (hwdev_idt.go); nil for other families
	gmu             sync.Mutex // orders GASA address/data pairs
	msgMu           sync.Mutex // orders a message's route, send and status check
	barAln          bool       // translations aligned to the window, log2 written
	spin            time.Duration
	closer          io.Closer // VFIO device, config file

	mu      sync.Mutex
	dbMask  uint64
	peerWin []Mapping

	events chan LinkEvent
	stop   chan struct{}
	wg     sync.WaitGroup
	closed atomic.Bool
	linkMu sync.Mutex // a link read and its recording, as one
	linkUp atomic.Bool
	inc    atomic.Uint32
	wake   atomic.Uint32
}

// hwParts is what a hardware device is built from: the register BAR and
// the rest of the PCI function as the opener found it (or a test made).
type hwParts struct {
	regs     Mapping
	cfg      io.ReaderAt
	bars     [pci.NumBARs]pci.Resource
	revision uint8
	device   uint16 // PCI device ID (IDT: which switch, so which ports are NT ports)
	mapBAR   func(bar int) (Mapping, error)
	closer   io.Closer
	// io, when set, performs every register access in place of loads and
	// stores on regs (a chip model in tests); regs still gives the BAR's
	// size.
	io RegIO
}

// RegIO performs register accesses at byte offsets of a register BAR,
// one access of width bytes (1, 2, 4 or 8). A hardware BAR is worked by
// plain loads and stores; a behavioural model of a bridge (package
// ntb/internal/chipmodel, used by tests) implements RegIO to give the
// registers their side effects: write-one-to-clear, a doorbell that sets
// the peer's bits, a translation that moves the peer's window. Offsets
// reach RegIO only after the driver has checked them against the BAR.
type RegIO interface {
	Load(off uint32, width uint8) uint64
	Store(off uint32, width uint8, v uint64)
}

// OpenHardware opens the hardware bridge at the PCI address addr with
// the default HWConfig; see OpenHardwareConfig.
func OpenHardware(addr string) (Device, error) {
	d, err := OpenHardwareConfig(addr, HWConfig{})
	if err != nil {
		return nil, err // not a nil *HWDevice in a non-nil Device
	}
	return d, nil
}

// OpenHardwareConfig opens the hardware bridge at the PCI address addr
// ("0000:03:00.0"): the register map is selected by the function's PCI
// IDs (package ntb/hw), its register BAR and windows are mapped through
// package ntb/pci (VFIO when the function is bound to vfio-pci, else
// sysfs; a function a kernel NTB driver holds cannot be mapped). UNTESTED
// ON HARDWARE, see HWDevice. A function that is absent or has no known
// map is fabric.ErrNotSupported; one whose BARs do not match its map (the
// wrong device, or one set up otherwise) is fabric.ErrInvalid.
func OpenHardwareConfig(addr string, c HWConfig) (*HWDevice, error) {
	return openHardware(pci.Bus{Root: pci.SysfsRoot}, addr, c)
}

func openHardware(bus pci.Bus, addr string, c HWConfig) (*HWDevice, error) {
	d, err := bus.Lookup(addr)
	if err != nil {
		return nil, fmt.Errorf("ntb: hardware %s: %w", addr, err)
	}
	m, err := hwmap.Lookup(d.Vendor, d.DeviceID)
	if err != nil {
		return nil, fmt.Errorf("ntb: hardware %s: %w", d.Addr, err)
	}
	name := fmt.Sprintf("%s (%s %s %04x:%04x)", d.Addr, m.Family, m.Gen, d.Vendor, d.DeviceID)
	if err := checkBARs(name, m, d.BARs); err != nil {
		return nil, err
	}
	p := hwParts{bars: d.BARs, revision: d.Revision, device: d.DeviceID}
	var closers multiCloser
	if d.Driver == "vfio-pci" {
		v, err := pci.OpenVFIO(d)
		if err != nil {
			return nil, fmt.Errorf("ntb: hardware %s: %w", name, err)
		}
		closers = append(closers, v)
		p.mapBAR = func(bar int) (Mapping, error) { return asMapping(v.MapRegion(bar, 0, d.BARs[bar].Size())) }
	} else {
		p.mapBAR = func(bar int) (Mapping, error) {
			return asMapping(d.MapBAR(bar, pci.MapOptions{WC: true, NoVFIO: true}))
		}
	}
	if d.Driver == "vfio-pci" {
		p.regs, err = p.mapBAR(m.RegBAR)
	} else {
		p.regs, err = d.MapBAR(m.RegBAR, pci.MapOptions{NoVFIO: true})
	}
	if err != nil {
		closers.Close()
		return nil, fmt.Errorf("ntb: hardware %s: register BAR: %w", name, err)
	}
	if f, err := os.Open(filepath.Join(d.Dir, "config")); err == nil {
		p.cfg = f
		closers = append(closers, f)
	}
	p.closer = closers
	hd, err := newHWDevice(name, m, p, c)
	if err != nil {
		p.regs.Close()
		closers.Close()
		return nil, err
	}
	return hd, nil
}

type multiCloser []io.Closer

func (c multiCloser) Close() error {
	var errs []error
	for _, x := range c {
		errs = append(errs, x.Close())
	}
	return errors.Join(errs...)
}

// checkBARs checks that the function has the BARs its map needs: the
// register BAR at least RegBARSize, and each window's BAR.
func checkBARs(name string, m *hwmap.Map, bars [pci.NumBARs]pci.Resource) error {
	r := bars[m.RegBAR]
	if !r.IsMem() || r.Size() < m.RegBARSize {
		return fmt.Errorf("ntb: hardware %s: register BAR %d is %#x bytes (flags %#x), the map needs %#x of memory: %w",
			name, m.RegBAR, r.Size(), r.Flags, m.RegBARSize, fabric.ErrInvalid)
	}
	for i, w := range m.Ops.Windows {
		if b := bars[w.BAR]; !b.IsMem() || b.Size() == 0 {
			return fmt.Errorf("ntb: hardware %s: window %d's BAR %d is not implemented memory (%#x bytes, flags %#x): %w",
				name, i, w.BAR, b.Size(), b.Flags, fabric.ErrInvalid)
		}
	}
	return nil
}

// newHWDevice builds the device over p (which it owns from then on, on
// success) and masks every doorbell, as a driver starts.
func newHWDevice(name string, m *hwmap.Map, p hwParts, c HWConfig) (*HWDevice, error) {
	if err := checkBARs(name, m, p.bars); err != nil {
		return nil, err
	}
	rb := p.regs.Bytes()
	if uint64(len(rb)) < m.RegBARSize || uintptr(unsafe.Pointer(unsafe.SliceData(rb)))%8 != 0 {
		return nil, fmt.Errorf("ntb: hardware %s: register mapping of %d bytes, the map needs %#x: %w", name, len(rb), m.RegBARSize, fabric.ErrInvalid)
	}
	d := &HWDevice{name: name, m: m, o: &m.Ops, regs: p.regs, rb: rb, io: p.io, cfg: p.cfg, mapBAR: p.mapBAR, mem: c.Memory,
		valid: m.DBValidMask(), spin: c.Spin, closer: p.closer,
		events: make(chan LinkEvent, 16), stop: make(chan struct{})}
	share, err := peerRegsShare(name, m, p)
	if err != nil {
		return nil, err
	}
	for i, w := range m.Ops.Windows {
		off := uint64(0)
		if pr := m.Ops.PeerRegs; pr != nil && pr.Window == i {
			if share == 0 {
				continue // reserved for the peer's registers: no client's
			}
			off = share // the second half is a window still
		}
		d.wins, d.wdefs, d.woff = append(d.wins, p.bars[w.BAR]), append(d.wdefs, w), append(d.woff, off)
	}
	d.peerWin = make([]Mapping, len(d.wins))
	if r := d.o.BarAlignRevs; r != [2]uint8{} && p.revision >= r[0] && p.revision <= r[1] {
		d.barAln = true
	}
	if err := d.findSide(); err != nil {
		return nil, err
	}
	d.dbLocal, d.dbPeer = d.o.DB.Shift[d.side].Local, d.o.DB.Shift[d.side].Peer
	if err := d.mapPeerRegs(p); err != nil {
		return nil, err
	}
	fail := func(err error) (*HWDevice, error) {
		if d.pregs != nil {
			d.pregs.m.Close()
		}
		d.idtRelease()
		return nil, err
	}
	if d.o.Global != nil {
		if err := d.idtOpen(p, c); err != nil {
			return fail(err)
		}
	}
	if err := d.maskMessages(); err != nil {
		return fail(err)
	}
	// Mask every doorbell, and enable the ones this side rings.
	d.dbMask = d.valid
	if err := d.writeMask(); err != nil {
		return fail(err)
	}
	if d.o.DB.RingMask != "" {
		r, err := d.reg(d.o.DB.RingMask, 0, regDB)
		if err != nil {
			return fail(err)
		}
		d.store(r, d.valid<<d.dbPeer)
	}
	if pt := d.o.Partition; pt != nil && pt.SharedWindow {
		if err := d.swInit(p, c); err != nil {
			for _, m := range d.peerWin {
				if m != nil {
					m.Close()
				}
			}
			return fail(err)
		}
	}
	if c.Link >= 0 {
		if c.Link == 0 {
			c.Link = 10 * time.Millisecond
		}
		d.linkUp.Store(d.readLink())
		d.wg.Add(1)
		go d.monitor(c.Link)
	}
	return d, nil
}

// findSide reads which side of the bridge this function is, and for a
// switch partition where its doorbell block is. Values read from the
// BAR are checked before they are used as indices.
func (d *HWDevice) findSide() error {
	if s := d.o.Side; s != nil {
		r, err := d.reg(s.Reg, 0, 0)
		if err != nil {
			return err
		}
		if d.load(r)&s.Bits != 0 {
			d.side = 1
		}
	}
	p := d.o.Partition
	if p == nil {
		return nil
	}
	self, err := d.reg(p.Self, 0, 0)
	if err != nil {
		return err
	}
	lo, err := d.reg(p.EPMapLo, 0, 0)
	if err != nil {
		return err
	}
	hi, err := d.reg(p.EPMapHi, 0, 0)
	if err != nil {
		return err
	}
	part := d.load(self)
	if part >= uint64(p.Count) {
		return fmt.Errorf("ntb: hardware %s: partition %d of %d: %w", d.name, part, p.Count, fabric.ErrMalformed)
	}
	eps := (d.load(lo) | d.load(hi)<<32) &^ (1 << part)
	peer := uint64(bits.TrailingZeros64(eps))
	if p.TargetLo != "" {
		// The partition's target vector, where the switch's
		// configuration sets one, names the peer; it must be one
		// partition with an NT endpoint.
		tlo, err := d.regAt(p.TargetLo, int(part), 0)
		if err != nil {
			return err
		}
		thi, err := d.regAt(p.TargetHi, int(part), 0)
		if err != nil {
			return err
		}
		if tv := d.load(tlo) | d.load(thi)<<32; tv != 0 {
			peer = uint64(bits.TrailingZeros64(tv))
			if tv&(tv-1) != 0 || eps&(1<<peer) == 0 {
				return fmt.Errorf("ntb: hardware %s: partition %d targets %#x, not one NT partition of %#x: %w", d.name, part, tv, eps, fabric.ErrNotSupported)
			}
		}
	}
	if eps == 0 || peer >= uint64(p.Count) {
		return fmt.Errorf("ntb: hardware %s: partition %d has no peer partition (endpoint map %#x): %w", d.name, part, eps, fabric.ErrNotSupported)
	}
	d.part, d.peerPart = uint32(part), uint32(peer)
	if part > peer {
		d.side = 1
	}
	d.dbBase = uint32(part) * p.DBStride
	return nil
}

// Register access. Every offset is computed from the map and checked
// against the mapping before any load or store, so no value (a map's,
// or one read from the BAR) can reach outside it.

type regLoc struct {
	off   uint32
	width uint8
}

const (
	regDB   = 1 << iota // in the partition's doorbell block
	regPeer             // in the peer's mirror (Map.PeerOffset up)
)

// reg locates element idx of the register called name.
func (d *HWDevice) reg(name string, idx int, flags int) (regLoc, error) {
	var add uint64
	if flags&regDB != 0 {
		add += uint64(d.dbBase)
	}
	if flags&regPeer != 0 {
		add += uint64(d.m.PeerOffset)
	}
	return d.locate(name, idx, add, false)
}

// locate finds element idx of the register called name, add bytes up,
// and checks it against what it is reached through: the register BAR,
// or (inPeer) the part of the reserved window that reaches the peer's
// registers (Ops.PeerRegs). An offset outside it, or not aligned to the
// register's width, is fabric.ErrBounds.
func (d *HWDevice) locate(name string, idx int, add uint64, inPeer bool) (regLoc, error) {
	r, ok := d.m.Reg(name)
	if !ok {
		return regLoc{}, fmt.Errorf("ntb: hardware %s: no register %q: %w", d.name, name, fabric.ErrNotSupported)
	}
	off, err := r.At(idx)
	if err != nil {
		return regLoc{}, fmt.Errorf("ntb: hardware %s: %w", d.name, err)
	}
	size := len(d.rb)
	if inPeer {
		size = 0
		if d.pregs != nil {
			size = len(d.pregs.b)
		}
	}
	at := uint64(off) + add
	if at+uint64(r.Width) > uint64(size) || at%uint64(r.Width) != 0 {
		where := "the register BAR"
		if inPeer {
			where = "the part of the reserved window that reaches the peer's registers"
		}
		return regLoc{}, fmt.Errorf("ntb: hardware %s: register %s[%d] at %#x+%d is outside the %#x bytes of %s: %w",
			d.name, name, idx, at, r.Width, size, where, fabric.ErrBounds)
	}
	return regLoc{uint32(at), r.Width}, nil
}

// load reads a located register with one access of its width.
func (d *HWDevice) load(r regLoc) uint64 { return loadReg(d.io, d.rb, r) }

// store writes a located register with one access of its width.
func (d *HWDevice) store(r regLoc, v uint64) { storeReg(d.io, d.rb, r, v) }

// loadReg reads a register located in rb: through io where set, else by
// one load of its width.
func loadReg(io RegIO, rb []byte, r regLoc) uint64 {
	if io != nil {
		return io.Load(r.off, r.width)
	}
	p := unsafe.Pointer(&rb[r.off])
	switch r.width {
	case 1:
		return uint64(*(*uint8)(p))
	case 2:
		return uint64(*(*uint16)(p))
	case 4:
		return uint64(shm.U32(rb, int(r.off)).Load())
	default:
		return shm.U64(rb, int(r.off)).Load()
	}
}

// storeReg writes a register located in rb, as loadReg reads it.
func storeReg(io RegIO, rb []byte, r regLoc, v uint64) {
	if io != nil {
		io.Store(r.off, r.width, v&widthMax(r.width))
		return
	}
	p := unsafe.Pointer(&rb[r.off])
	switch r.width {
	case 1:
		*(*uint8)(p) = uint8(v)
	case 2:
		*(*uint16)(p) = uint16(v)
	case 4:
		shm.U32(rb, int(r.off)).Store(uint32(v))
	default:
		shm.U64(rb, int(r.off)).Store(v)
	}
}

func widthMax(w uint8) uint64 {
	if w >= 8 {
		return ^uint64(0)
	}
	return 1<<(8*w) - 1
}

func (d *HWDevice) errClosed() error {
	return fmt.Errorf("ntb: hardware %s: %w", d.name, fabric.ErrClosed)
}

// Doorbells.

// DBValidMask implements Device.
func (d *HWDevice) DBValidMask() uint64 { return d.valid }

func (d *HWDevice) checkDB(bits uint64) error {
	if bits&^d.valid != 0 {
		return fmt.Errorf("ntb: hardware %s: doorbell bits %#x outside the valid mask %#x: %w", d.name, bits, d.valid, fabric.ErrInvalid)
	}
	if d.closed.Load() {
		return d.errClosed()
	}
	return nil
}

// DBRead implements Device: the local doorbell register's client bits.
func (d *HWDevice) DBRead() uint64 {
	r, err := d.reg(d.o.DB.Status, 0, regDB)
	if err != nil || d.closed.Load() {
		return 0
	}
	return d.load(r) >> d.dbLocal & d.valid
}

// DBClear implements Device: it writes ones to the bits (they clear on
// write).
func (d *HWDevice) DBClear(bits uint64) error {
	if err := d.checkDB(bits); err != nil {
		return err
	}
	r, err := d.reg(d.o.DB.Status, 0, regDB)
	if err != nil {
		return err
	}
	d.store(r, bits<<d.dbLocal)
	return nil
}

// writeMask writes the cached mask to the mask register.
func (d *HWDevice) writeMask() error {
	r, err := d.reg(d.o.DB.Mask, 0, regDB)
	if err != nil {
		return err
	}
	v := d.dbMask << d.dbLocal
	if d.o.DB.MaskEnables {
		// Enable this side's unmasked bits only: the other partition's
		// half of shared doorbells stays disabled.
		v = (^d.dbMask & d.valid) << d.dbLocal
	}
	d.store(r, v)
	return nil
}

func (d *HWDevice) updateMask(bits uint64, set bool) error {
	if err := d.checkDB(bits); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if set {
		d.dbMask |= bits
	} else {
		d.dbMask &^= bits
	}
	return d.writeMask()
}

// DBSetMask implements Device.
func (d *HWDevice) DBSetMask(bits uint64) error { return d.updateMask(bits, true) }

// DBClearMask implements Device.
func (d *HWDevice) DBClearMask(bits uint64) error {
	err := d.updateMask(bits, false)
	d.WakeLocal()
	return err
}

// DBReadMask implements Device: the mask this device last wrote.
func (d *HWDevice) DBReadMask() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dbMask
}

// PeerDBSet implements Device: the bits are written to the ring
// register, or, where the bridge has one register per bit, 1 to each;
// where the peer's registers are reached through a window (Intel gen1),
// to the peer's own doorbell register there.
func (d *HWDevice) PeerDBSet(set uint64) error {
	if err := d.checkDB(set); err != nil {
		return err
	}
	if pr := d.pregs; pr != nil {
		r, err := d.peerReg(d.o.PeerRegs.Ring, 0)
		if err != nil {
			return err
		}
		pr.store(r, set)
		return nil
	}
	db := d.o.DB
	if !db.RingPerBit {
		r, err := d.reg(db.Ring, 0, regDB)
		if err != nil {
			return err
		}
		d.store(r, set<<d.dbPeer)
		return nil
	}
	var rs []regLoc
	for b := set; b != 0; b &= b - 1 {
		r, err := d.reg(db.Ring, bits.TrailingZeros64(b), regDB)
		if err != nil {
			return err
		}
		rs = append(rs, r)
	}
	for _, r := range rs {
		d.store(r, 1)
	}
	return nil
}

// WakeLocal implements Device.
func (d *HWDevice) WakeLocal() { d.wake.Add(1) }

// DBWait implements Device by polling the doorbell register: the
// bridge's interrupts are not taken. It spins for HWConfig.Spin, then
// sleeps between polls in growing steps up to a millisecond.
func (d *HWDevice) DBWait(ctx context.Context, bits uint64) (uint64, error) {
	gen := d.wake.Load()
	w := spin.New(d.spin)
	for {
		if d.closed.Load() {
			return 0, d.errClosed()
		}
		if set := d.DBRead() & bits &^ d.DBReadMask(); set != 0 {
			return set, nil
		}
		if d.wake.Load() != gen {
			return 0, nil
		}
		if err := w.Wait(ctx); err != nil {
			return 0, err
		}
	}
}

// Scratchpads.

// SpadCount implements Device.
func (d *HWDevice) SpadCount() int {
	if d.sw != nil {
		if d.sw.shared == nil {
			return 0
		}
		return hwmap.SwitchtecSharedSpads
	}
	if d.o.Spad.Local == "" {
		return 0
	}
	return d.m.Scratchpads
}

// spad locates scratchpad idx of this side (peer false) or the peer's,
// and gives the accesses that reach it: the register BAR's, or the
// window's where the peer's registers are reached through one.
func (d *HWDevice) spad(idx int, peer bool) (regLoc, regTarget, error) {
	t := regTarget{d.io, d.rb}
	r, err := d.spadLoc(idx, peer)
	if err == nil && peer && d.pregs != nil {
		t = d.pregs.regTarget
		r, err = d.peerReg(d.o.PeerRegs.Spad, idx)
	}
	return r, t, err
}

func (d *HWDevice) spadLoc(idx int, peer bool) (regLoc, error) {
	if d.closed.Load() {
		return regLoc{}, d.errClosed()
	}
	n := d.SpadCount()
	if n == 0 {
		return regLoc{}, fmt.Errorf("ntb: hardware %s: no scratchpads: %w", d.name, fabric.ErrNotSupported)
	}
	if idx < 0 || idx >= n {
		return regLoc{}, fmt.Errorf("ntb: hardware %s: scratchpad %d of %d: %w", d.name, idx, n, fabric.ErrInvalid)
	}
	name, half := d.o.Spad.Local, d.side
	if peer {
		name, half = d.o.Spad.Peer, 1-d.side
	}
	if d.o.Spad.Halves {
		idx += half * n
	}
	return d.reg(name, idx, 0)
}

// SpadRead implements Device.
func (d *HWDevice) SpadRead(idx int) (uint32, error) { return d.spadLoad(idx, false) }

// SpadWrite implements Device.
func (d *HWDevice) SpadWrite(idx int, v uint32) error { return d.spadStore(idx, false, v) }

// PeerSpadRead implements Device.
func (d *HWDevice) PeerSpadRead(idx int) (uint32, error) { return d.spadLoad(idx, true) }

// PeerSpadWrite implements Device.
func (d *HWDevice) PeerSpadWrite(idx int, v uint32) error { return d.spadStore(idx, true, v) }

// spadLoad reads scratchpad idx of this side (peer false) or the peer's:
// on Switchtec in the shared window, elsewhere in the registers.
func (d *HWDevice) spadLoad(idx int, peer bool) (uint32, error) {
	if d.sw != nil {
		a, err := d.swSpad(idx, peer)
		if err != nil {
			return 0, err
		}
		return a.Load(), nil
	}
	r, t, err := d.spad(idx, peer)
	if err != nil {
		return 0, err
	}
	return uint32(t.load(r)), nil
}

// spadStore writes scratchpad idx of this side (peer false) or the
// peer's, where spadLoad reads it.
func (d *HWDevice) spadStore(idx int, peer bool, v uint32) error {
	if d.sw != nil {
		a, err := d.swSpad(idx, peer)
		if err != nil {
			return err
		}
		a.Store(v)
		return nil
	}
	r, t, err := d.spad(idx, peer)
	if err != nil {
		return err
	}
	t.store(r, uint64(v))
	return nil
}

// Memory windows.

// Memory implements Device: HWConfig.Memory's bytes (nil without it).
func (d *HWDevice) Memory() []byte {
	if d.mem == nil {
		return nil
	}
	if d.sw != nil && d.sw.shared != nil {
		return d.mem.Bytes()[:d.sw.sharedOff:d.sw.sharedOff] // the shared window follows
	}
	return d.mem.Bytes()
}

// MWCount implements Device: the map's windows, less the one the peer's
// registers are reached through (Ops.PeerRegs; Linux's mw_count); IDT:
// the peer's windows.
func (d *HWDevice) MWCount() int {
	if d.idt != nil {
		return len(d.idt.in)
	}
	return len(d.wins)
}

// PeerMWCount implements Device, as MWCount; IDT: this function's
// windows.
func (d *HWDevice) PeerMWCount() int {
	if d.idt != nil {
		return len(d.idt.out)
	}
	return len(d.wins)
}

func (d *HWDevice) window(widx int) (hwmap.Window, pci.Resource, error) {
	if widx < 0 || widx >= len(d.wins) {
		return hwmap.Window{}, pci.Resource{}, fmt.Errorf("ntb: hardware %s: memory window %d of %d: %w", d.name, widx, len(d.wins), fabric.ErrInvalid)
	}
	if d.closed.Load() {
		return hwmap.Window{}, pci.Resource{}, d.errClosed()
	}
	return d.wdefs[widx], d.wins[widx], nil
}

// align gives window widx's alignments and largest size: the size is
// what of its BAR the window has (all of it, or the half past the peer's
// registers), the address alignment still the BAR's size (Linux's
// intel_ntb_mw_get_align).
func (d *HWDevice) align(widx int, w hwmap.Window, bar pci.Resource) (addrAlign, sizeAlign, sizeMax uint64) {
	addrAlign, sizeAlign, sizeMax = w.AddrAlign, max(w.SizeAlign, 1), bar.Size()-d.woff[widx]
	if addrAlign == 0 || d.barAln {
		addrAlign = bar.Size()
	}
	return
}

// MWGetAlign implements Device with the map's rules: the translated
// address aligned to the window's size (Intel gen1, gen3, Ice Lake) or to
// a page (AMD, later Intel, Switchtec), any size up to the window's
// (Switchtec's MWSetTrans also wants the address aligned to the size's
// power of two).
func (d *HWDevice) MWGetAlign(widx int) (addrAlign, sizeAlign, sizeMax uint64, err error) {
	if d.idt != nil {
		return d.idtGetAlign(widx)
	}
	w, bar, err := d.window(widx)
	if err != nil {
		return 0, 0, 0, err
	}
	if d.sw != nil {
		return 4096, 4096, d.sw.winSize[widx], nil
	}
	addrAlign, sizeAlign, sizeMax = d.align(widx, w, bar)
	return addrAlign, sizeAlign, sizeMax, nil
}

// winRegs are a window's located translation registers.
type winRegs struct {
	xlat, limit, base, mlimit, mbase, log2 regLoc
	hasBase, hasMirror, hasLog2            bool
}

func (d *HWDevice) windowRegs(widx int, w hwmap.Window) (winRegs, error) {
	if w.Xlat == "" {
		return winRegs{}, fmt.Errorf("ntb: hardware %s: window %d: %s bridges translate on the outbound side, not this one's: %w",
			d.name, widx, d.m.Family, fabric.ErrNotSupported)
	}
	at := 0
	if w.AtPeer {
		at = regPeer
	}
	var r winRegs
	var err error
	loc := func(name string, flags int) regLoc {
		if err != nil {
			return regLoc{}
		}
		var l regLoc
		l, err = d.reg(name, 0, flags)
		return l
	}
	r.xlat, r.limit = loc(w.Xlat, at), loc(w.Limit, at)
	if r.hasBase = w.Base != ""; r.hasBase {
		r.base = loc(w.Base, 0)
	}
	if r.hasMirror = w.MirrorLimit != ""; r.hasMirror {
		r.mlimit, r.mbase = loc(w.MirrorLimit, 0), loc(w.MirrorBase, 0)
	}
	if r.hasLog2 = w.Log2Reg != "" && d.barAln; r.hasLog2 {
		r.log2 = loc(w.Log2Reg, 0)
	}
	return r, err
}

// limit computes a limit register's value by the window's rule from the
// window's base address.
func limitOf(rule hwmap.LimitRule, base, size, full uint64) uint64 {
	switch rule {
	case hwmap.LimitSize:
		return size
	case hwmap.LimitZeroWhenFull:
		if size == full {
			return 0
		}
	}
	return base + size
}

// MWSetTrans implements Device: the peer's writes through its window
// widx land in Memory()[addr:addr+size]. It writes the translation
// (HWConfig.Memory's bus address plus addr) and the limit the map's rule
// gives, reads each back, and undoes them if the bridge did not take
// them (Switchtec: a partition operation on the peer's control block).
// A translation that is misaligned or outside the memory or the
// window is refused before any register is written.
func (d *HWDevice) MWSetTrans(widx int, addr, size uint64) error {
	if d.sw != nil {
		return d.swSetTrans(widx, addr, size)
	}
	if d.idt != nil {
		return d.idtSetTrans(widx, addr, size)
	}
	w, bar, err := d.window(widx)
	if err != nil {
		return err
	}
	r, err := d.windowRegs(widx, w)
	if err != nil {
		return err
	}
	bus, err := d.memBus(widx, addr, size)
	if err != nil {
		return err
	}
	aa, sa, smax := d.align(widx, w, bar)
	if err := hwmap.CheckTranslation(bus, size, aa, sa, smax); err != nil {
		return fmt.Errorf("ntb: hardware %s: window %d: %w", d.name, widx, err)
	}
	return d.setTrans(widx, w, bar, r, bus, size)
}

func (d *HWDevice) setTrans(widx int, w hwmap.Window, bar pci.Resource, r winRegs, bus, size uint64) error {
	base, full := bar.Start+d.woff[widx], bar.Size()-d.woff[widx]
	if r.hasBase {
		base = d.load(r.base) &^ 0xf
	}
	limit := limitOf(w.Rule, base, size, full)
	var mlimit uint64
	if r.hasMirror {
		mlimit = limitOf(w.Rule, d.load(r.mbase)&^0xf, size, full)
	}
	if limit > widthMax(r.limit.width) || (r.hasMirror && mlimit > widthMax(r.mlimit.width)) {
		return fmt.Errorf("ntb: hardware %s: window %d: limit %#x does not fit its register: %w", d.name, widx, limit, fabric.ErrBounds)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	undo := func(what string, want, got uint64) error {
		d.store(r.xlat, 0)
		d.store(r.limit, limitOf(w.Rule, base, 0, full))
		return fmt.Errorf("ntb: hardware %s: window %d: the bridge did not take %s %#x (read back %#x): %w",
			d.name, widx, what, want, got, fabric.ErrInvalid)
	}
	d.store(r.xlat, bus)
	if got := d.load(r.xlat); got != bus {
		return undo("the translation", bus, got)
	}
	d.store(r.limit, limit)
	if got := d.load(r.limit); got != limit {
		return undo("the limit", limit, got)
	}
	if r.hasMirror {
		d.store(r.mlimit, mlimit)
	}
	if r.hasLog2 && size > 0 {
		d.store(r.log2, uint64(bits.Len64(size)-1))
	}
	return nil
}

// memBus checks that Memory()[addr:addr+size] is memory the device has
// and returns the bus address of addr (window widx names the error).
func (d *HWDevice) memBus(widx int, addr, size uint64) (uint64, error) {
	if d.mem == nil {
		return 0, fmt.Errorf("ntb: hardware %s: window %d: no DMA memory to translate into (HWConfig.Memory): %w", d.name, widx, fabric.ErrNotSupported)
	}
	if n := uint64(len(d.mem.Bytes())); addr > n || size > n-addr {
		return 0, fmt.Errorf("ntb: hardware %s: window %d: %#x+%#x outside %#x bytes of memory: %w", d.name, widx, addr, size, n, fabric.ErrBounds)
	}
	return d.mem.BusAddr() + addr, nil
}

// MWClearTrans implements Device: the translation of window widx is
// zeroed and its limit closes it (a size of 0).
func (d *HWDevice) MWClearTrans(widx int) error {
	if d.sw != nil {
		return d.swClearTrans(widx)
	}
	if d.idt != nil {
		return d.idtClearTrans(widx)
	}
	w, bar, err := d.window(widx)
	if err != nil {
		return err
	}
	r, err := d.windowRegs(widx, w)
	if err != nil {
		return err
	}
	return d.setTrans(widx, w, bar, r, 0, 0)
}

// PeerMW implements Device: it maps the outbound window's BAR
// (write-combining where offered; Switchtec's window 0 is the part of its
// BAR after the lookup-table windows). The hardware does not show the peer's
// translation, so the mapping is the whole window: a client learns from
// the peer (the transport does, through the scratchpads) how much of it
// is backed.
func (d *HWDevice) PeerMW(widx int) ([]byte, error) {
	if d.sw != nil {
		return d.swPeerMW(widx)
	}
	if d.idt != nil {
		return d.idtPeerMW(widx)
	}
	w, _, err := d.window(widx)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.peerWin[widx] == nil {
		m, err := d.mapBAR(w.BAR)
		if err != nil {
			return nil, fmt.Errorf("ntb: hardware %s: window %d (BAR %d): %w", d.name, widx, w.BAR, err)
		}
		d.peerWin[widx] = m
	}
	b := d.peerWin[widx].Bytes()
	if off := d.woff[widx]; off > 0 {
		if uint64(len(b)) <= off {
			return nil, fmt.Errorf("ntb: hardware %s: window %d's BAR maps %d bytes, the window starts at %#x: %w", d.name, widx, len(b), off, fabric.ErrInvalid)
		}
		b = b[off:len(b):len(b)]
	}
	return b, nil
}

// Link.

// readLink reads the link state from the hardware.
func (d *HWDevice) readLink() bool {
	if d.sw != nil {
		return d.swLinkUp()
	}
	if d.idt != nil {
		return d.idtLinkUp()
	}
	l := d.o.Link
	var v uint64
	switch {
	case l.Status != "":
		at := 0
		if l.AtPeer {
			at = regPeer
		}
		r, err := d.reg(l.Status, 0, at)
		if err != nil {
			return false
		}
		v = d.load(r)
	case l.ConfigOff != 0 && d.cfg != nil:
		var b [8]byte
		if l.ConfigWidth < 1 || l.ConfigWidth > 8 {
			return false
		}
		if n, err := d.cfg.ReadAt(b[:l.ConfigWidth], l.ConfigOff); n != l.ConfigWidth || (err != nil && err != io.EOF) {
			return false
		}
		v = binary.LittleEndian.Uint64(b[:])
	default:
		return false
	}
	return l.UpBits != 0 && v&l.UpBits == l.UpBits
}

// LinkIsUp implements Device: it reads the link state from the bridge
// (Intel: the PCIe link status; AMD: the peer's ready bit; Switchtec:
// this side enabled it and the peer's shared window shows the magic and
// its link enabled; IDT: both NT functions' bus mastering, completion
// enable and mapping-table entry, and the peer port's PCIe link).
func (d *HWDevice) LinkIsUp() bool { return !d.closed.Load() && d.pollLink() }

// pollLink reads the link state and records a change, as the link poll
// does: so PeerIncarnation has counted a link-up by the time LinkIsUp
// reports it, and a client that saw the link come up and attached is not
// torn down when the poll notices the same link-up later.
func (d *HWDevice) pollLink() bool {
	d.linkMu.Lock()
	defer d.linkMu.Unlock()
	up := d.readLink()
	if up == d.linkUp.Load() {
		return up
	}
	if up {
		d.inc.Add(1)
	}
	d.linkUp.Store(up)
	select {
	case d.events <- LinkEvent{Up: up, PeerIncarnation: d.inc.Load()}:
	default:
	}
	d.WakeLocal()
	return up
}

func (d *HWDevice) linkUpdate(us []hwmap.Update) error {
	if d.closed.Load() {
		return d.errClosed()
	}
	if len(us) == 0 {
		return fmt.Errorf("ntb: hardware %s: %s bridges keep the link in switch-global state: %w", d.name, d.m.Family, fabric.ErrNotSupported)
	}
	rs := make([]regLoc, len(us))
	for i, u := range us {
		at := 0
		if u.AtPeer {
			at = regPeer
		}
		r, err := d.reg(u.Reg, 0, at)
		if err != nil {
			return err
		}
		rs[i] = r
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, u := range us {
		d.store(rs[i], (d.load(rs[i])&^u.Clear|u.Set)&widthMax(rs[i].width))
	}
	return nil
}

// LinkEnable implements Device with the map's writes (Intel: NTBCNTL's
// snoop bits on and its disable and lock bits off, and on gen4 the link
// control and training bits; AMD: the register-access enables and this
// side's ready bit; Switchtec: the link state in this side's shared
// window).
func (d *HWDevice) LinkEnable() error {
	if d.sw != nil {
		return d.swLinkSet(true)
	}
	if d.idt != nil {
		return d.idtLink(true)
	}
	return d.linkUpdate(d.o.Link.Enable)
}

// LinkDisable implements Device with the reverse writes.
func (d *HWDevice) LinkDisable() error {
	if d.sw != nil {
		return d.swLinkSet(false)
	}
	if d.idt != nil {
		return d.idtLink(false)
	}
	return d.linkUpdate(d.o.Link.Disable)
}

// LinkEvents implements Device: changes the link poll saw (and those
// LinkIsUp read first).
func (d *HWDevice) LinkEvents() <-chan LinkEvent { return d.events }

// PeerIncarnation implements Device: the hardware cannot tell one peer
// instance from the next, so it counts the times the link came up.
func (d *HWDevice) PeerIncarnation() uint32 { return d.inc.Load() }

func (d *HWDevice) monitor(every time.Duration) {
	defer d.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
		d.pollLink()
	}
}

// Close implements Device: it disables this side of the link (where the
// map can), masks every doorbell, unmaps the windows and the registers.
func (d *HWDevice) Close() error {
	if d.closed.Load() {
		return nil
	}
	var errs []error
	if err := d.LinkDisable(); err != nil && !errors.Is(err, fabric.ErrNotSupported) {
		errs = append(errs, err)
	}
	if d.sw != nil {
		errs = append(errs, d.swClose())
	}
	d.mu.Lock()
	d.dbMask = d.valid
	errs = append(errs, d.writeMask())
	d.mu.Unlock()
	if d.closed.Swap(true) {
		return nil
	}
	close(d.stop)
	d.wg.Wait()
	d.WakeLocal()
	d.mu.Lock()
	for i, m := range d.peerWin {
		if m != nil {
			errs = append(errs, m.Close())
			d.peerWin[i] = nil
		}
	}
	d.mu.Unlock()
	if d.pregs != nil {
		errs = append(errs, d.pregs.m.Close())
	}
	errs = append(errs, d.idtRelease())
	errs = append(errs, d.regs.Close())
	if d.closer != nil {
		errs = append(errs, d.closer.Close())
	}
	return errors.Join(errs...)
}
