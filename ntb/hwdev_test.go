//go:build linux

package ntb

// The hardware Device over memory laid out like each bridge's register
// BAR: an anonymous mapping of the BAR's size, filled with 0xee so that
// every write shows. Each operation must write exactly the registers and
// values given here, which are written out from the public layouts (the
// Linux drivers' headers: offsets as literals, not taken from package
// ntb/hw), and bad arguments must be refused with a typed error before
// any byte of the BAR or of the memory changes. None of this is proof on
// hardware: it proves the driver does what the documented layouts say.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/shm"
	hwmap "github.com/weft-io/weft/ntb/hw"
	"github.com/weft-io/weft/ntb/pci"
)

// anonMap is anonymous memory standing in for a BAR.
type anonMap struct{ b []byte }

func newAnon(t testing.TB, size uint64) *anonMap {
	t.Helper()
	b, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return &anonMap{b}
}

func (a *anonMap) Bytes() []byte { return a.b }
func (a *anonMap) Close() error  { return nil } // unmapped by the test's cleanup

type fakeDMA struct {
	b   []byte
	bus uint64
}

func (m *fakeDMA) Bytes() []byte   { return m.b }
func (m *fakeDMA) BusAddr() uint64 { return m.bus }

const (
	fakeMemBus  = 0x1_0000_0000 // the memory's bus address
	fakeMemSize = 2 << 20
	fakeWinSize = 1 << 20 // every window BAR
)

// fakeBARStart is where BAR i sits on the fake bus.
func fakeBARStart(i int) uint64 { return 0x40_0000_0000 + uint64(i)<<28 }

// hwFake is one bridge function over fake memory.
type hwFake struct {
	t    *testing.T
	m    *hwmap.Map
	bar  []byte // the register BAR
	cfg  []byte // configuration space
	mem  *fakeDMA
	rev  uint8
	link time.Duration
	dev  *HWDevice
	wins map[int]*anonMap // window BARs as mapped (one mapping per BAR)
}

func newHWFake(t *testing.T, vendor, device uint16) *hwFake {
	t.Helper()
	m, err := hwmap.Lookup(vendor, device)
	if err != nil {
		t.Fatal(err)
	}
	f := &hwFake{t: t, m: m, bar: newAnon(t, m.RegBARSize).b, cfg: make([]byte, 4096), link: -1,
		mem: &fakeDMA{b: make([]byte, fakeMemSize), bus: fakeMemBus}}
	for i := range f.bar {
		f.bar[i] = 0xee
	}
	return f
}

// put presets a register.
func (f *hwFake) put(off uint32, width int, v uint64) { putLE(f.bar[off:off+uint32(width)], v) }

func putLE(b []byte, v uint64) {
	var w [8]byte
	binary.LittleEndian.PutUint64(w[:], v)
	copy(b, w[:])
}

func getLE(b []byte) uint64 {
	var w [8]byte
	copy(w[:], b)
	return binary.LittleEndian.Uint64(w[:])
}

func (f *hwFake) parts() hwParts {
	var bars [pci.NumBARs]pci.Resource
	bars[f.m.RegBAR] = pci.Resource{Start: 0xd000_0000, End: 0xd000_0000 + f.m.RegBARSize - 1, Flags: pci.ResourceMem}
	for _, w := range f.m.Ops.Windows {
		s := fakeBARStart(w.BAR)
		bars[w.BAR] = pci.Resource{Start: s, End: s + fakeWinSize - 1, Flags: pci.ResourceMem | pci.ResourcePrefetch | pci.ResourceMem64}
	}
	return hwParts{regs: &anonMap{f.bar}, cfg: bytes.NewReader(f.cfg), bars: bars, revision: f.rev,
		mapBAR: func(bar int) (Mapping, error) { return f.win(bar), nil }}
}

// win is window BAR bar's mapping.
func (f *hwFake) win(bar int) *anonMap {
	if f.wins == nil {
		f.wins = map[int]*anonMap{}
	}
	if f.wins[bar] == nil {
		f.wins[bar] = newAnon(f.t, fakeWinSize)
	}
	return f.wins[bar]
}

func (f *hwFake) open() error {
	d, err := newHWDevice("fake", f.m, f.parts(), HWConfig{Memory: f.mem, Link: f.link})
	if err != nil {
		return err
	}
	f.dev = d
	f.t.Cleanup(func() { d.Close() })
	return nil
}

// reg is an expected register value: width bytes at off.
type reg struct {
	off   uint32
	width int
	val   uint64
}

// expect runs op and checks that it wrote exactly want: each register
// holds its value (which must differ from what was there, so the write
// shows), and no other byte of the BAR changed.
func (f *hwFake) expect(what string, op func() error, want ...reg) {
	f.t.Helper()
	before := bytes.Clone(f.bar)
	for _, w := range want {
		if getLE(before[w.off:w.off+uint32(w.width)]) == w.val {
			f.t.Fatalf("%s: test setup: %#x already holds %#x, the write would not show", what, w.off, w.val)
		}
	}
	if err := op(); err != nil {
		f.t.Errorf("%s: %v", what, err)
		return
	}
	named := map[uint32]bool{}
	for _, w := range want {
		if got := getLE(f.bar[w.off : w.off+uint32(w.width)]); got != w.val {
			f.t.Errorf("%s: register %#x holds %#x, want %#x", what, w.off, got, w.val)
		}
		for i := range uint32(w.width) {
			named[w.off+i] = true
		}
	}
	for i := range f.bar {
		if f.bar[i] != before[i] && !named[uint32(i)] {
			f.t.Errorf("%s: wrote byte %#x (%#02x to %#02x), which the layout does not name", what, i, before[i], f.bar[i])
		}
	}
}

// refuse runs op and checks that it fails with target and changed no
// byte of the BAR or of the memory.
func (f *hwFake) refuse(what string, op func() error, target error) {
	f.t.Helper()
	bar, mem := bytes.Clone(f.bar), bytes.Clone(f.mem.b)
	err := op()
	if !errors.Is(err, target) {
		f.t.Errorf("%s: %v, want %v", what, err, target)
	}
	if !bytes.Equal(bar, f.bar) || !bytes.Equal(mem, f.mem.b) {
		f.t.Errorf("%s: failed but changed memory", what)
	}
}

func (f *hwFake) readSpad(what string, read func() (uint32, error), want uint32) {
	f.t.Helper()
	if v, err := read(); err != nil || v != want {
		f.t.Errorf("%s = %#x, %v; want %#x", what, v, err, want)
	}
}

func (f *hwFake) mustOpen(want ...reg) {
	f.t.Helper()
	f.expect("open (masks every doorbell)", f.open, want...)
	if f.dev == nil {
		f.t.FailNow()
	}
}

// commonRefusals: arguments outside the device are typed errors that
// touch nothing.
func (f *hwFake) commonRefusals() {
	f.t.Helper()
	d := f.dev
	valid := d.DBValidMask()
	f.refuse("PeerDBSet outside the valid mask", func() error { return d.PeerDBSet(valid + 1) }, fabric.ErrInvalid)
	f.refuse("DBClear outside the valid mask", func() error { return d.DBClear(^valid) }, fabric.ErrInvalid)
	f.refuse("DBSetMask outside the valid mask", func() error { return d.DBSetMask(^valid) }, fabric.ErrInvalid)
	n := d.SpadCount()
	for _, i := range []int{-1, n, 1 << 20} {
		f.refuse(fmt.Sprintf("SpadWrite(%d)", i), func() error { return d.SpadWrite(i, 1) }, errSpadRange(n))
		f.refuse(fmt.Sprintf("PeerSpadWrite(%d)", i), func() error { return d.PeerSpadWrite(i, 1) }, errSpadRange(n))
		f.refuse(fmt.Sprintf("SpadRead(%d)", i), func() error { _, err := d.SpadRead(i); return err }, errSpadRange(n))
	}
	for _, w := range []int{-1, d.MWCount()} {
		f.refuse(fmt.Sprintf("MWSetTrans(%d)", w), func() error { return d.MWSetTrans(w, 0, 4096) }, fabric.ErrInvalid)
		f.refuse(fmt.Sprintf("MWClearTrans(%d)", w), func() error { return d.MWClearTrans(w) }, fabric.ErrInvalid)
		f.refuse(fmt.Sprintf("PeerMW(%d)", w), func() error { _, err := d.PeerMW(w); return err }, fabric.ErrInvalid)
		if _, _, _, err := d.MWGetAlign(w); !errors.Is(err, fabric.ErrInvalid) {
			f.t.Errorf("MWGetAlign(%d): %v", w, err)
		}
	}
}

func errSpadRange(n int) error {
	if n == 0 {
		return fabric.ErrNotSupported
	}
	return fabric.ErrInvalid
}

// windowRefusals: translations that are misaligned, too large or outside
// the memory are refused before a register is written.
func (f *hwFake) windowRefusals(widx int, addrAlign uint64) {
	f.t.Helper()
	d := f.dev
	aa, sa, smax, err := d.MWGetAlign(widx)
	if err != nil || aa != addrAlign || sa != 1 || smax != fakeWinSize {
		f.t.Errorf("MWGetAlign(%d) = %#x, %#x, %#x, %v; want %#x, 1, %#x", widx, aa, sa, smax, err, addrAlign, fakeWinSize)
	}
	f.refuse("a misaligned translation", func() error { return d.MWSetTrans(widx, addrAlign/2, 4096) }, fabric.ErrInvalid)
	f.refuse("a window larger than its BAR", func() error { return d.MWSetTrans(widx, 0, 2*fakeWinSize) }, fabric.ErrBounds)
	f.refuse("a translation past the memory", func() error { return d.MWSetTrans(widx, fakeMemSize, 4096) }, fabric.ErrBounds)
	f.refuse("a size of 0", func() error { return d.MWSetTrans(widx, 0, 0) }, fabric.ErrInvalid)
	if b, err := d.PeerMW(widx); err != nil || len(b) != fakeWinSize {
		f.t.Errorf("PeerMW(%d) = %d bytes, %v", widx, len(b), err)
	}
}

func TestHWIntelGen1(t *testing.T) {
	f := newHWFake(t, 0x8086, 0x3c0d) // Sandy Bridge B2B
	f.put(0x48, 8, 0x90_0000_0008)    // SBAR23BASE (flags in the low bits)
	f.put(0x60, 2, 0x8005)            // PDOORBELL: link bit 15, bits 0 and 2
	f.put(0x88, 4, 0x1234)            // SPAD[2]
	f.put(0x100, 4, 0x77)             // B2B_SPAD[0]: not the path these parts take
	f.put(0x58, 4, 0x3)               // NTBCNTL: disabled, locked
	peer := f.win(4).b                // BAR 4: the peer's registers (Linux's b2b_mw_idx -1)
	putLE(peer[0x80:0x84], 0x99)      // the peer's SPAD[0], through it
	f.mustOpen(reg{0x62, 2, 0x7fff})  // PDBMSK: 15 bits on the window path
	d := f.dev
	if d.DBValidMask() != 0x7fff || d.MWCount() != 1 || d.PeerMWCount() != 1 || d.SpadCount() != 16 {
		t.Fatalf("geometry: mask %#x, %d windows (peer %d), %d scratchpads", d.DBValidMask(), d.MWCount(), d.PeerMWCount(), d.SpadCount())
	}
	if got := d.DBRead(); got != 0x5 {
		t.Errorf("DBRead = %#x, want 0x5 (the link bit is not a client bit)", got)
	}
	// The peer is rung and its scratchpads reached in BAR 4, at the
	// peer's own PDOORBELL (0x60) and SPAD (0x80): nothing in this
	// side's register BAR, neither B2B_DOORBELL nor B2B_SPAD.
	inPeer := func(what string, op func() error, off uint32, width int, want uint64) {
		t.Helper()
		before := bytes.Clone(peer)
		f.expect(what, op)
		if got := getLE(peer[off : off+uint32(width)]); got != want {
			t.Errorf("%s: the peer's register %#x holds %#x, want %#x", what, off, got, want)
		}
		for i := range peer {
			if peer[i] != before[i] && (uint32(i) < off || uint32(i) >= off+uint32(width)) {
				t.Errorf("%s: wrote byte %#x of the peer's registers", what, i)
			}
		}
	}
	inPeer("PeerDBSet", func() error { return d.PeerDBSet(0x4005) }, 0x60, 2, 0x4005) // bit 14 too
	inPeer("PeerSpadWrite", func() error { return d.PeerSpadWrite(15, 0xbeef) }, 0xbc, 4, 0xbeef)
	f.readSpad("PeerSpadRead(0)", func() (uint32, error) { return d.PeerSpadRead(0) }, 0x99)
	f.expect("DBClear", func() error { return d.DBClear(0x5) }, reg{0x60, 2, 0x5})
	f.expect("DBClearMask", func() error { return d.DBClearMask(0x3) }, reg{0x62, 2, 0x7ffc})
	f.expect("DBSetMask", func() error { return d.DBSetMask(0x1) }, reg{0x62, 2, 0x7ffd})
	f.expect("SpadWrite", func() error { return d.SpadWrite(3, 0xdead) }, reg{0x8c, 4, 0xdead})
	f.readSpad("SpadRead(2)", func() (uint32, error) { return d.SpadRead(2) }, 0x1234)
	// The translation is aligned to the BAR's size; a full window has
	// no limit (0), a part one ends at SBARnBASE + size. The one client
	// window is BAR 2's.
	f.expect("MWSetTrans full", func() error { return d.MWSetTrans(0, 0x100000, fakeWinSize) },
		reg{0x30, 8, fakeMemBus + 0x100000}, reg{0x20, 8, 0})
	f.expect("MWSetTrans part", func() error { return d.MWSetTrans(0, 0, 0x8000) },
		reg{0x30, 8, fakeMemBus}, reg{0x20, 8, 0x90_0000_8000})
	f.expect("MWClearTrans", func() error { return d.MWClearTrans(0) }, reg{0x30, 8, 0}, reg{0x20, 8, 0x90_0000_0000})
	f.refuse("MWSetTrans(1): BAR 4 is the peer's registers", func() error { return d.MWSetTrans(1, 0, 4096) }, fabric.ErrInvalid)
	f.windowRefusals(0, fakeWinSize)
	f.commonRefusals()
	// Link: PCIe link status in configuration space (0x1a2, bit 13).
	if d.LinkIsUp() {
		t.Error("link up with LNKSTS 0")
	}
	binary.LittleEndian.PutUint16(f.cfg[0x1a2:], 0x2041)
	if !d.LinkIsUp() {
		t.Error("link down with LNKSTS active")
	}
	f.expect("LinkEnable", d.LinkEnable, reg{0x58, 4, 0x154})
	f.expect("LinkDisable", d.LinkDisable, reg{0x58, 4, 0x3})
}

// TestHWIntelGen1Share: the B2B window's split is read from the
// configuration space, as the B2B set-up left it: SBAR45SZ one less than
// PBAR45SZ is Linux's b2b_mw_share (window 1 is BAR 4's second half, its
// limit computed from SBAR45BASE, which the set-up put half-way, and its
// translation aligned to the whole BAR); another split is refused.
func TestHWIntelGen1Share(t *testing.T) {
	f := newHWFake(t, 0x8086, 0x3c0d)
	f.cfg[0xd1], f.cfg[0xd3] = 20, 19 // PBAR45SZ: 1 MiB; SBAR45SZ: half
	const half = fakeWinSize / 2
	f.put(0x50, 8, 0x90_0008_000c)   // SBAR45BASE: the B2B address plus half
	f.mustOpen(reg{0x62, 2, 0x7fff}) // PDBMSK
	d := f.dev
	if d.MWCount() != 2 || d.PeerMWCount() != 2 {
		t.Fatalf("%d windows (peer %d), want 2", d.MWCount(), d.PeerMWCount())
	}
	aa, sa, smax, err := d.MWGetAlign(1)
	if err != nil || aa != fakeWinSize || sa != 1 || smax != half {
		t.Fatalf("MWGetAlign(1) = %#x, %#x, %#x, %v; want %#x, 1, %#x", aa, sa, smax, err, fakeWinSize, half)
	}
	f.expect("MWSetTrans whole half", func() error { return d.MWSetTrans(1, 0, half) }, reg{0x38, 8, fakeMemBus}, reg{0x28, 8, 0})
	f.expect("MWSetTrans part", func() error { return d.MWSetTrans(1, 0, 0x8000) }, reg{0x28, 8, 0x90_0008_8000})
	f.refuse("MWSetTrans past the half", func() error { return d.MWSetTrans(1, 0, half+4096) }, fabric.ErrBounds)
	w, err := d.PeerMW(1)
	if err != nil || len(w) != half || &w[0] != &f.win(4).b[half] {
		t.Fatalf("PeerMW(1): %d bytes, %v; want BAR 4's second half", len(w), err)
	}
	if err := d.PeerDBSet(0x1); err != nil || getLE(f.win(4).b[0x60:0x62]) != 0x1 {
		t.Fatalf("the ring does not reach BAR 4's first half: %v", err)
	}

	g := newHWFake(t, 0x8086, 0x3c0d)
	g.cfg[0xd1], g.cfg[0xd3] = 20, 20 // a secondary BAR as large as the primary: no B2B set-up for the registers
	if err := g.open(); !errors.Is(err, fabric.ErrNotSupported) {
		t.Fatalf("open with SBAR45SZ = PBAR45SZ: %v, want ErrNotSupported", err)
	}
}

func TestHWIntelGen3(t *testing.T) {
	f := newHWFake(t, 0x8086, 0x201c)
	f.put(0x40, 8, 0x1_0000_0005)    // IM_INT_STATUS: the link bit 32, bits 0 and 2
	f.put(0x4518, 8, 0xa0_0000_000c) // EMBAR1
	f.put(0x0, 4, 0x3)               // NTBCNTL
	f.mustOpen(reg{0x48, 8, 0xffffffff})
	d := f.dev
	if got := d.DBRead(); got != 0x5 {
		t.Errorf("DBRead = %#x", got)
	}
	// One register per bit, written 1.
	f.expect("PeerDBSet", func() error { return d.PeerDBSet(0x80000001) }, reg{0x100, 4, 1}, reg{0x17c, 4, 1})
	f.expect("DBClear", func() error { return d.DBClear(0x5) }, reg{0x40, 8, 0x5})
	f.expect("DBClearMask", func() error { return d.DBClearMask(0x10) }, reg{0x48, 8, 0xffffffef})
	f.expect("SpadWrite", func() error { return d.SpadWrite(1, 0xa) }, reg{0x84, 4, 0xa})
	f.expect("PeerSpadWrite", func() error { return d.PeerSpadWrite(1, 0xb) }, reg{0x184, 4, 0xb})
	// Limit: the BAR's base + size, and the external side's from EMBAR1.
	f.expect("MWSetTrans", func() error { return d.MWSetTrans(0, 0, 0x40000) },
		reg{0x10, 8, fakeMemBus}, reg{0x18, 8, fakeBARStart(2) + 0x40000}, reg{0x4018, 8, 0xa0_0004_0000})
	f.windowRefusals(1, fakeWinSize)
	f.commonRefusals()
	binary.LittleEndian.PutUint16(f.cfg[0x1a2:], 0x2000)
	if !d.LinkIsUp() {
		t.Error("link down with LNKSTS active")
	}
	f.expect("LinkEnable", d.LinkEnable, reg{0x0, 4, 0x154})
}

func TestHWIntelGen4(t *testing.T) {
	for _, rev := range []uint8{0x10, 0x4} { // Sapphire Rapids, Ice Lake
		t.Run(fmt.Sprintf("rev%#x", rev), func(t *testing.T) {
			f := newHWFake(t, 0x8086, 0x347e)
			f.rev = rev
			f.put(0x0, 4, 0xffff0003) // NTBCNTL
			f.put(0xb050, 2, 0x13)    // LINK_CTRL: link disabled
			f.put(0xb0d4, 4, 0x100)   // PPD0
			f.put(0xb052, 2, 0x2000)  // LINK_STATUS: active
			f.mustOpen(reg{0x48, 8, 0xffffffff})
			d := f.dev
			f.expect("PeerDBSet", func() error { return d.PeerDBSet(0x4) }, reg{0x108, 4, 1})
			f.expect("PeerSpadWrite", func() error { return d.PeerSpadWrite(2, 0xc) }, reg{0x8088, 4, 0xc})
			if rev == 0x10 {
				// Page alignment; no size index.
				f.expect("MWSetTrans", func() error { return d.MWSetTrans(0, 0x1000, 0x3000) },
					reg{0x10, 8, fakeMemBus + 0x1000}, reg{0x18, 8, fakeBARStart(2) + 0x3000})
				f.windowRefusals(1, 4096)
			} else {
				// Ice Lake: aligned to the window, log2(size) in IM45XBASEIDX.
				f.expect("MWSetTrans", func() error { return d.MWSetTrans(1, 0x100000, 0x80000) },
					reg{0x20, 8, fakeMemBus + 0x100000}, reg{0x28, 8, fakeBARStart(4) + 0x80000}, reg{0x76, 2, 19})
				f.windowRefusals(0, fakeWinSize)
			}
			f.commonRefusals()
			if !d.LinkIsUp() {
				t.Error("link down with LINK_STATUS active")
			}
			f.expect("LinkEnable", d.LinkEnable, reg{0x0, 4, 0x154}, reg{0xb050, 2, 0x3}, reg{0xb0d4, 4, 0x108})
			f.expect("LinkDisable", d.LinkDisable, reg{0x0, 4, 0x0}, reg{0xb050, 2, 0x13})
		})
	}
}

func TestHWAMD(t *testing.T) {
	for _, side := range []int{0, 1} {
		t.Run(fmt.Sprintf("side%d", side), func(t *testing.T) {
			f := newHWFake(t, 0x1022, 0x145b)
			f.put(0x408, 4, uint64(side)) // SIDEINFO: bit 0 is the secondary side
			f.put(0x460, 2, 0x3)          // DBSTAT
			f.put(0x200, 4, 0x1)          // CNTL
			f.put(0x808, 4, 0x2)          // the peer's SIDEINFO: ready
			f.mustOpen(reg{0x45c, 2, 0xffff})
			d := f.dev
			if d.MWCount() != 3 || d.SpadCount() != 8 || d.DBRead() != 0x3 {
				t.Fatalf("%d windows, %d scratchpads, doorbells %#x", d.MWCount(), d.SpadCount(), d.DBRead())
			}
			f.expect("PeerDBSet", func() error { return d.PeerDBSet(0x8001) }, reg{0x454, 2, 0x8001})
			f.expect("DBClear", func() error { return d.DBClear(0x1) }, reg{0x460, 2, 0x1})
			// The sixteen scratchpads are split: the primary has 0-7.
			mine, theirs := uint32(0x210), uint32(0x230)
			if side == 1 {
				mine, theirs = theirs, mine
			}
			f.expect("SpadWrite", func() error { return d.SpadWrite(7, 0x1) }, reg{mine + 28, 4, 0x1})
			f.expect("PeerSpadWrite", func() error { return d.PeerSpadWrite(0, 0x2) }, reg{theirs, 4, 0x2})
			// Translations in the peer's block (0x400 up), limit = size;
			// window 0 is BAR 1, whose limit is 32-bit.
			f.expect("MWSetTrans BAR1", func() error { return d.MWSetTrans(0, 0x1000, 0x2000) },
				reg{0x830, 8, fakeMemBus + 0x1000}, reg{0x814, 4, 0x2000})
			f.expect("MWSetTrans BAR4", func() error { return d.MWSetTrans(2, 0x2000, 0x10000) },
				reg{0x840, 8, fakeMemBus + 0x2000}, reg{0x820, 8, 0x10000})
			f.expect("MWClearTrans BAR4", func() error { return d.MWClearTrans(2) }, reg{0x840, 8, 0}, reg{0x820, 8, 0})
			f.windowRefusals(1, 4096)
			f.commonRefusals()
			if !d.LinkIsUp() {
				t.Error("link down with the peer ready")
			}
			f.expect("LinkEnable", d.LinkEnable, reg{0x200, 4, 0x300001}, reg{0x408, 4, uint64(side) | 0x2})
		})
	}
	// Later parts: windows in BARs 2 and 4.
	f := newHWFake(t, 0x1022, 0x14c0)
	f.put(0x408, 4, 0)
	f.mustOpen(reg{0x45c, 2, 0xffff})
	if f.dev.MWCount() != 2 {
		t.Fatalf("%d windows", f.dev.MWCount())
	}
	f.expect("MWSetTrans BAR2", func() error { return f.dev.MWSetTrans(0, 0, 0x1000) },
		reg{0x838, 8, fakeMemBus}, reg{0x818, 8, 0x1000})
}

// TestHWSwitchtec: over plain memory a Switchtec partition opens no
// further than its partition number (its doorbells, windows, scratchpads
// and link are tested over the model of the switch,
// hwdev_switchtec_test.go).
func TestHWSwitchtec(t *testing.T) {
	// A partition number read from the BAR is checked before use.
	var f *hwFake
	for _, c := range []struct {
		part, eps uint64
		want      error
	}{{200, 0x3, fabric.ErrMalformed}, {2, 0x4, fabric.ErrNotSupported}} {
		f = newHWFake(t, 0x11f8, 0x8531)
		f.put(0x10001, 1, c.part)
		f.put(0x10004, 4, c.eps)
		f.put(0x10008, 4, 0)
		f.refuse(fmt.Sprintf("open as partition %d of map %#x", c.part, c.eps), f.open, c.want)
	}
}

// TestHWBoundsChecked runs the gen4 driver over a register BAR too small
// for its link and peer registers (its size check lowered to let it
// open): they are refused as out of bounds, never read or written past
// the mapping.
func TestHWBoundsChecked(t *testing.T) {
	m, _ := hwmap.Lookup(0x8086, 0x347e)
	small := *m
	small.RegBARSize = 4096
	f := newHWFake(t, 0x8086, 0x347e)
	f.m = &small
	f.bar = f.bar[:4096]
	f.mustOpen(reg{0x48, 8, 0xffffffff})
	d := f.dev
	if d.LinkIsUp() {
		t.Error("a link register outside the BAR read as up")
	}
	f.refuse("LinkEnable past the BAR", d.LinkEnable, fabric.ErrBounds)
	f.refuse("PeerSpadWrite past the BAR", func() error { return d.PeerSpadWrite(0, 1) }, fabric.ErrBounds)
	f.refuse("PeerSpadRead past the BAR", func() error { _, err := d.PeerSpadRead(0); return err }, fabric.ErrBounds)

	// At its real size the check in newHWDevice refuses the small BAR.
	f = newHWFake(t, 0x8086, 0x347e)
	f.bar = f.bar[:4096]
	if err := f.open(); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("a 4 KiB register BAR for a 64 KiB map: %v", err)
	}
}

// TestHWWaitAndLinkEvents: DBWait polls the doorbell register, ignores
// masked bits, and honours ctx; the link poll reports changes.
func TestHWWaitAndLinkEvents(t *testing.T) {
	f := newHWFake(t, 0x1022, 0x148b) // AMD: 32-bit SIDEINFO, which the test can store atomically
	f.put(0x408, 4, 0)
	f.put(0x808, 4, 0)
	f.put(0x460, 2, 0)
	f.link = time.Millisecond
	f.mustOpen(reg{0x45c, 2, 0xffff})
	d := f.dev
	if err := d.DBClearMask(0x3); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(5 * time.Millisecond)
		shm.U32(f.bar, 0x460).Store(0x4 | 0x2) // bit 2 stays masked
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if got, err := d.DBWait(ctx, 0x7); err != nil || got != 0x2 {
		t.Fatalf("DBWait = %#x, %v; want 0x2", got, err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel2()
	if _, err := d.DBWait(short, 0x1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("DBWait past its context: %v", err)
	}
	shm.U32(f.bar, 0x808).Store(0x2) // the peer is ready
	select {
	case e := <-d.LinkEvents():
		if !e.Up || e.PeerIncarnation != 1 {
			t.Fatalf("event %+v", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no link-up event")
	}
	shm.U32(f.bar, 0x808).Store(0)
	select {
	case e := <-d.LinkEvents():
		if e.Up {
			t.Fatalf("event %+v", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no link-down event")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.DBWait(ctx, 1); !errors.Is(err, fabric.ErrClosed) {
		t.Fatalf("DBWait after Close: %v", err)
	}
	if err := d.PeerDBSet(1); !errors.Is(err, fabric.ErrClosed) {
		t.Fatalf("PeerDBSet after Close: %v", err)
	}
}

// fakeSysfsFunc lays out a PCI function in a fake sysfs tree, with a
// resource file per BAR of the given sizes (0: none).
func fakeSysfsFunc(t *testing.T, root, addr string, vendor, device uint16, sizes map[int]uint64) {
	t.Helper()
	dir := filepath.Join(root, "devices/pci0000:00", addr)
	for _, p := range []string{dir, filepath.Join(root, "bus/pci/devices")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(dir, filepath.Join(root, "bus/pci/devices", addr)); err != nil {
		t.Fatal(err)
	}
	res := ""
	for i := 0; i < 13; i++ {
		if s := sizes[i]; s != 0 {
			res += fmt.Sprintf("0x%016x 0x%016x 0x%016x\n", fakeBARStart(i), fakeBARStart(i)+s-1, pci.ResourceMem|pci.ResourceMem64)
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("resource%d", i)))
			if err != nil {
				t.Fatal(err)
			}
			f.Truncate(int64(s))
			f.Close()
		} else {
			res += "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
		}
	}
	for name, v := range map[string]string{"vendor": fmt.Sprintf("0x%04x", vendor), "device": fmt.Sprintf("0x%04x", device),
		"class": "0x068000", "revision": "0x04", "resource": res} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOpenHardwareFake opens bridges through the PCI layer in a fake
// sysfs tree: absent, unknown and wrongly sized functions are typed
// errors; a well-formed one works over its resource files.
func TestOpenHardwareFake(t *testing.T) {
	root := t.TempDir()
	bus := pci.Bus{Root: root}
	fakeSysfsFunc(t, root, "0000:03:00.0", 0x8086, 0x201c, map[int]uint64{0: 64 << 10, 2: 1 << 20, 4: 1 << 20})
	fakeSysfsFunc(t, root, "0000:04:00.0", 0x8086, 0x201c, map[int]uint64{0: 4 << 10, 2: 1 << 20, 4: 1 << 20})
	fakeSysfsFunc(t, root, "0000:05:00.0", 0x8086, 0x201c, map[int]uint64{0: 64 << 10, 2: 1 << 20})
	fakeSysfsFunc(t, root, "0000:00:05.0", 0x1af4, 0x1110, map[int]uint64{0: 4096, 2: 1 << 20})
	for _, c := range []struct {
		addr string
		want error
	}{
		{"0000:09:00.0", fabric.ErrNotSupported}, // absent
		{"not-an-address", fabric.ErrInvalid},
		{"0000:00:05.0", fabric.ErrNotSupported}, // ivshmem: no NTB map
		{"0000:04:00.0", fabric.ErrInvalid},      // register BAR of 4 KiB
		{"0000:05:00.0", fabric.ErrInvalid},      // no BAR 4 window
	} {
		if _, err := openHardware(bus, c.addr, HWConfig{}); !errors.Is(err, c.want) {
			t.Errorf("open %s: %v, want %v", c.addr, err, c.want)
		} else {
			t.Logf("open %s: %v", c.addr, err)
		}
	}
	if dev, err := OpenHardware("0000:ff:1f.7"); dev != nil || !errors.Is(err, fabric.ErrNotSupported) {
		t.Errorf("OpenHardware of an absent function = %v, %v", dev, err)
	}
	d, err := openHardware(bus, "03:00.0", HWConfig{Link: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.PeerDBSet(0x3); err != nil {
		t.Fatal(err)
	}
	if err := d.MWSetTrans(0, 0, 4096); !errors.Is(err, fabric.ErrNotSupported) {
		t.Errorf("MWSetTrans without DMA memory: %v", err)
	}
	w, err := d.PeerMW(1)
	if err != nil || len(w) != 1<<20 {
		t.Fatalf("PeerMW = %d bytes, %v", len(w), err)
	}
	copy(w[100:], "window")
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "devices/pci0000:00/0000:03:00.0")
	regs, _ := os.ReadFile(filepath.Join(dir, "resource0"))
	win, _ := os.ReadFile(filepath.Join(dir, "resource4"))
	// Doorbell bits 0 and 1 rang IM_DOORBELL[0] and [1]; Close masked
	// all of IM_INT_DISABLE.
	if getLE(regs[0x100:0x104]) != 1 || getLE(regs[0x104:0x108]) != 1 || getLE(regs[0x48:0x50]) != 0xffffffff {
		t.Errorf("registers in resource0: ring %#x %#x, mask %#x", getLE(regs[0x100:0x104]), getLE(regs[0x104:0x108]), getLE(regs[0x48:0x50]))
	}
	if string(win[100:106]) != "window" {
		t.Errorf("the window's store did not reach resource4")
	}
}

// TestHWLinkConfigWidth: a map whose link state is in configuration space
// reads 1 to 8 bytes there; a width outside that (a broken table) reads
// as down, never past its buffer.
func TestHWLinkConfigWidth(t *testing.T) {
	m, _ := hwmap.Lookup(0x8086, 0x3c0d) // gen1: the link status in configuration space
	for _, c := range []struct {
		width int
		up    bool
	}{{0, false}, {1, true}, {2, true}, {8, true}, {9, false}, {-1, false}} {
		mm := *m
		mm.Ops.Link.ConfigWidth, mm.Ops.Link.UpBits = c.width, 1
		f := newHWFake(t, 0x8086, 0x3c0d)
		f.m = &mm
		for i := range 16 {
			f.cfg[int(mm.Ops.Link.ConfigOff)+i] = 0xff
		}
		if err := f.open(); err != nil {
			t.Fatal(err)
		}
		if got := f.dev.LinkIsUp(); got != c.up {
			t.Errorf("link status %d bytes wide: up %v, want %v", c.width, got, c.up)
		}
	}
}
