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
