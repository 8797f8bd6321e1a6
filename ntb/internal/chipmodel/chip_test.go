//go:build linux

package chipmodel

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

func newChip(t *testing.T, f Family) *Chip {
	t.Helper()
	c, err := New(f, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestFaults: an access of the wrong width, one straddling a register and
// one past the BAR are recorded, not taken silently.
func TestFaults(t *testing.T) {
	c := newChip(t, IntelGen1)
	s := c.Side(0)
	s.Store(0x60, 4, 1)   // PDOORBELL is 16 bits
	s.Load(0x61, 1)       // inside PDOORBELL
	s.Store(64<<10, 4, 1) // past the BAR
	s.Store(0x84, 8, 1)   // straddles SPAD[1] and SPAD[2]
	if f := s.Faults(); len(f) != 4 {
		t.Fatalf("faults %q, want 4", f)
	}
	if f := c.Side(1).Faults(); len(f) != 0 {
		t.Fatalf("the other side has faults %q", f)
	}
	if _, err := New(IntelGen1, Config{WindowSize: 3 << 20}); err == nil {
		t.Fatal("a window of 3 MiB accepted")
	}
}

// TestAMDMirror: 0x400 up is the peer's block, with the peer's behaviour;
// SIDEINFO's side bit is the chip's.
func TestAMDMirror(t *testing.T) {
	c := newChip(t, AMD)
	a, b := c.Side(0), c.Side(1)
	if a.Load(0x408, 4) != 0 || b.Load(0x408, 4) != 1 || a.Load(0x808, 4) != 1 {
		t.Fatalf("SIDEINFO: %#x %#x, mirror %#x", a.Load(0x408, 4), b.Load(0x408, 4), a.Load(0x808, 4))
	}
	a.Store(0x808, 4, 0x2) // b's ready bit, through a's mirror; bit 0 kept
	if b.Load(0x408, 4) != 0x3 || c.LinkUp() {
		t.Fatalf("b's SIDEINFO %#x, link %v", b.Load(0x408, 4), c.LinkUp())
	}
	a.Store(0x408, 4, 0x3) // bit 0 is not software's
	if a.Load(0x408, 4) != 0x2 || !c.LinkUp() {
		t.Fatalf("a's SIDEINFO %#x, link %v", a.Load(0x408, 4), c.LinkUp())
	}
	a.Store(0x454, 2, 0x8001) // DBREQ rings b
	if b.Load(0x460, 2) != 0x8001 || a.Load(0x460, 2) != 0 || a.Load(0x860, 2) != 0x8001 {
		t.Fatal("DBREQ did not set the peer's DBSTAT alone")
	}
	b.Store(0x460, 2, 0x1)
	if b.Load(0x460, 2) != 0x8000 {
		t.Fatal("DBSTAT is not write-one-to-clear")
	}
	b.Store(0x234, 4, 0x55) // shared scratchpads
	if a.Load(0x234, 4) != 0x55 || a.Load(0x634, 4) != 0x55 {
		t.Fatal("the scratchpads are not shared")
	}
}

// TestWindowRemap: a window is sink until the peer translates it, follows
// translation and limit writes live, and the link.
func TestWindowRemap(t *testing.T) {
	c := newChip(t, IntelGen4)
	a, b := c.Side(0), c.Side(1)
	w, err := a.MapWindow(2)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	mem := b.Memory().Bytes()
	start, size := b.BAR(2)
	b.Store(0x10, 8, b.Memory().BusAddr()+8192) // IM23XBASE
	b.Store(0x18, 8, start+size)                // IM23XLMT: the whole window
	w.Bytes()[0] = 1
	if mem[8192] != 0 {
		t.Fatal("a window reached the peer with the link down")
	}
	for _, s := range []*Side{a, b} {
		s.Store(0xb050, 2, 0)   // LINK_CTRL: enabled
		s.Store(0xb0d4, 4, 0x8) // PPD0: train
	}
	if !c.LinkUp() || b.Load(0xb052, 2)&0x2000 == 0 || b.Load(0x40, 8)&(1<<32) == 0 {
		t.Fatal("link not up, or not reported, with both sides trained")
	}
	w.Bytes()[1] = 2
	if mem[8193] != 2 {
		t.Fatal("the store did not land at the translation")
	}
	b.Store(0x18, 8, start+4096) // one page
	w.Bytes()[4095], w.Bytes()[4096] = 3, 4
	if mem[8192+4095] != 3 || bytes.IndexByte(mem, 4) >= 0 {
		t.Fatal("the limit did not bound the window")
	}
	if off, n := a.Route(2); off != 8192 || n != 4096 {
		t.Fatalf("route %#x+%#x", off, n)
	}
	a.Store(0xb050, 2, 0x10) // a disables: link down, window dropped
	if c.LinkUp() {
		t.Fatal("link up after a side disabled it")
	}
	w.Bytes()[2] = 5
	if mem[8194] == 5 {
		t.Fatal("a store landed with the link down")
	}
	var buf [4]byte
	if n, err := a.Config().ReadAt(buf[:], 4094); n != 2 || err != io.EOF {
		t.Fatalf("config read at the end: %d, %v", n, err)
	}
	if f := append(a.Faults(), b.Faults()...); len(f) != 0 {
		t.Fatalf("faults: %s", strings.Join(f, "; "))
	}
}

// gen1Up enables the link on both sides of a gen1 chip.
func gen1Up(t *testing.T, c *Chip) {
	t.Helper()
	for i := range 2 {
		c.Side(i).Store(0x58, 4, 0) // NTBCNTL: enabled
	}
	if !c.LinkUp() {
		t.Fatal("link not up with both sides enabled")
	}
}

// TestGen1B2BWindow: window BAR 4, translated onto the peer's SBAR0BASE,
// reaches the peer's registers: a doorbell write there sets the peer's
// PDOORBELL bits (bit 14 too), a scratchpad write lands in the peer's
// SPAD, and no memory is behind it. The old path (B2B_DOORBELL,
// B2B_SPAD) still carries but is recorded as a fault: the parts have the
// SDOORBELL lockup erratum.
func TestGen1B2BWindow(t *testing.T) {
	c := newChip(t, IntelGen1)
	a, b := c.Side(0), c.Side(1)
	w, err := a.MapWindow(4)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Store(0x60, 2, 0x1) // link down: dropped, and no fault
	if b.Load(0x60, 2) != 0 {
		t.Fatal("a ring through the window crossed a link that is down")
	}
	gen1Up(t, c)
	b.Store(0x60, 2, 0x8000) // the link-up bit, cleared
	w.Store(0x60, 2, 0x4001)
	w.Store(0x60, 2, 0x2)
	if got := b.Load(0x60, 2); got != 0x4003 || a.Load(0x60, 2)&0x7fff != 0 {
		t.Fatalf("the peer's PDOORBELL %#x after rings of 0x4001 and 0x2 through the window, want 0x4003", got)
	}
	w.Store(0x84, 4, 0x55)
	b.Store(0x88, 4, 0x66)
	if b.Load(0x84, 4) != 0x55 || w.Load(0x88, 4) != 0x66 || a.Load(0x84, 4) != 0 {
		t.Fatal("the window does not reach the peer's SPAD")
	}
	if _, n := a.Route(4); n != 0 {
		t.Fatalf("window BAR 4 reaches %#x bytes of memory; it is the peer's registers", n)
	}
	if f := append(a.Faults(), b.Faults()...); len(f) != 0 {
		t.Fatalf("faults on the window path: %s", strings.Join(f, "; "))
	}
	// BAR 2 does not reach registers: an access there is a fault.
	w2, err := a.MapWindow(2)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	w2.Store(0x60, 2, 1)
	if f := a.Faults(); len(f) != 1 || !strings.Contains(f[0], "does not reach the peer's registers") {
		t.Fatalf("faults %q, want one for a register store through BAR 2", f)
	}
	a.Store(0x140, 2, 0x4001) // B2B_DOORBELL: carried without bit 14, and a fault
	a.Store(0x104, 4, 0x77)   // B2B_SPAD[1]
	if b.Load(0x60, 2)&0x4001 != 0x4001 || b.Load(0x84, 4) != 0x77 {
		t.Fatal("the B2B registers no longer carry")
	}
	if f := a.Faults(); len(f) != 3 || !strings.Contains(f[1], "B2B_DOORBELL") || !strings.Contains(f[2], "B2B_SPAD[1]") {
		t.Fatalf("faults %q, want B2B_DOORBELL and B2B_SPAD recorded", f)
	}
}

// TestGen1B2BShare: with Linux's b2b_mw_share, window BAR 4's first half
// is the peer's registers and its second half a memory window, routed by
// the peer's SBAR45 (half-way up, half the size).
func TestGen1B2BShare(t *testing.T) {
	c, err := New(IntelGen1, Config{Gen1B2BShare: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, b := c.Side(0), c.Side(1)
	w, err := a.MapWindow(4)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	gen1Up(t, c)
	half := uint64(4<<20) / 2
	if s := a.MemStart(4); s != half {
		t.Fatalf("memory starts at %#x of BAR 4, want %#x", s, half)
	}
	b.Store(0x38, 8, b.Memory().BusAddr()) // SBAR45XLAT
	b.Store(0x28, 8, 0)                    // SBAR45LMT: none
	if off, n := a.Route(4); off != 0 || n != half {
		t.Fatalf("route %#x+%#x, want 0+%#x", off, n, half)
	}
	w.Bytes()[half+8] = 0x5a
	w.Store(0x80, 4, 0x99)
	if b.Memory().Bytes()[8] != 0x5a || b.Load(0x80, 4) != 0x99 {
		t.Fatal("the second half does not reach memory, or the first the registers")
	}
	w.Bytes()[8] = 0xa5 // the registers' half: no memory behind
	if bytes.IndexByte(b.Memory().Bytes(), 0xa5) >= 0 {
		t.Fatal("a store into the registers' half reached memory")
	}
	if f := append(a.Faults(), b.Faults()...); len(f) != 0 {
		t.Fatalf("faults: %s", strings.Join(f, "; "))
	}
}
