package hw

import (
	"errors"
	"fmt"
	"testing"

	"github.com/weft-io/weft/fabric"
)

// Every bound this package owns, at each end, one below and one above:
// an index a driver computes from what a device reports (a partition, a
// port, a LUT entry, an array element) is refused before it becomes a
// register offset, and every value inside is taken. The rules are the
// package's own, so they are tested here, not only through package ntb's
// driver (issue 29).

// edge is one call at one value: want nil for a value the rule takes,
// else the sentinel the refusal must match.
type edge struct {
	what string
	call func() error
	want error
}

func checkEdges(t *testing.T, es []edge) {
	t.Helper()
	for _, e := range es {
		err := e.call()
		switch {
		case e.want == nil && err != nil:
			t.Errorf("%s: %v, want it taken", e.what, err)
		case e.want != nil && !errors.Is(err, e.want):
			t.Errorf("%s: %v, want %v", e.what, err, e.want)
		}
	}
}

// errOf drops a result, keeping the error.
func errOf[T any](_ T, err error) error { return err }

func TestIndexBounds(t *testing.T) {
	var es []edge
	for _, c := range []struct {
		name   string
		f      func(int) (uint32, error)
		lo, hi int // the first and last index taken
	}{
		{"SwitchtecCtrl", SwitchtecCtrl, 0, SwitchtecPartitions - 1},
		{"SwitchtecDBMsg", SwitchtecDBMsg, 0, SwitchtecPartitions - 1},
		{"IDTPortBase", IDTPortBase, 0, 23},
		{"IDTMappingEntry", func(p int) (uint32, error) { return IDTMappingEntry(0x0100, p) }, 0, 7},
		{"IDTLUTOffset(bar)", func(b int) (uint32, error) { return IDTLUTOffset(b, 5) }, 0, 7},
		{"IDTLUTOffset(index)", func(i int) (uint32, error) { return IDTLUTOffset(3, i) }, 0, 31},
		// Linux ntb_hw_idt.h: IDT_MAX_NR_PARTS 8 partitions, IDT_MAX_NR_PORTS
		// 24 ports, IDT_MSG_CNT 4 message registers (SWPxMSGCTL's REG
		// field is IDT_SWPxMSGCTL_REG_MASK 0x3), LUTUDATA's partition field.
		{"IDTSwPartSts", IDTSwPartSts, 0, IDTPartitions - 1},
		{"IDTSwPortSts", IDTSwPortSts, 0, 23},
		{"IDTSwMsgCtl(part)", func(p int) (uint32, error) { return IDTSwMsgCtl(p, 2) }, 0, 7},
		{"IDTSwMsgCtl(msg)", func(m int) (uint32, error) { return IDTSwMsgCtl(5, m) }, 0, 3},
		{"IDTMsgRoute(reg)", func(r int) (uint32, error) { return IDTMsgRoute(r, 6) }, 0, 3},
		{"IDTMsgRoute(part)", func(p int) (uint32, error) { return IDTMsgRoute(1, p) }, 0, 7},
		{"IDTLUTUData", IDTLUTUData, 0, 7},
	} {
		f := c.f
		for _, v := range []int{c.lo - 1, c.lo, c.lo + 1, c.hi - 1, c.hi, c.hi + 1} {
			var want error
			if v < c.lo || v > c.hi {
				want = fabric.ErrInvalid
			}
			es = append(es, edge{fmt.Sprintf("%s(%d)", c.name, v), func() error { return errOf(f(v)) }, want})
		}
	}
	checkEdges(t, es)

	// The offsets inside the bounds are where the layout puts them.
	for _, c := range []struct {
		what string
		got  func() (uint32, error)
		want uint32
	}{
		{"SwitchtecCtrl(47)", func() (uint32, error) { return SwitchtecCtrl(47) }, 0x10000 + 0x4000 + 47*0x2000},
		{"SwitchtecDBMsg(47)", func() (uint32, error) { return SwitchtecDBMsg(47) }, 0x10000 + 0x64000 + 47*0x4000},
		{"IDTPortBase(23)", func() (uint32, error) { return IDTPortBase(23) }, 0x1000 + 23*0x2000},
		{"IDTLUTOffset(7, 31)", func() (uint32, error) { return IDTLUTOffset(7, 31) }, 31 | 7<<8},
		{"IDTLUTOffset(0, 0)", func() (uint32, error) { return IDTLUTOffset(0, 0) }, 0},
		{"IDTMappingEntry(0xffff, 7)", func() (uint32, error) { return IDTMappingEntry(0xffff, 7) }, 1 | 0xffff<<1 | 7<<17},
		// ntb_hw_idt.h: SWPART0STS 0x3E104, SWPORTxSTS from 0x3E204 with a
		// 0x20 stride, SWP0MSGCTL0 0x3EE00; SWPxMSGCTL REG bits 1:0, PART
		// bits 6:4; LUTUDATA PART bits 3:0 and VALID bit 31.
		{"IDTSwPartSts(0)", func() (uint32, error) { return IDTSwPartSts(0) }, 0x3e104},
		{"IDTSwPortSts(23)", func() (uint32, error) { return IDTSwPortSts(23) }, 0x3e200 + 23*0x20 + 4},
		{"IDTSwMsgCtl(0, 0)", func() (uint32, error) { return IDTSwMsgCtl(0, 0) }, 0x3ee00},
		{"IDTMsgRoute(3, 7)", func() (uint32, error) { return IDTMsgRoute(3, 7) }, 0x73},
		{"IDTMsgRoute(0, 0)", func() (uint32, error) { return IDTMsgRoute(0, 0) }, 0},
		{"IDTLUTUData(0)", func() (uint32, error) { return IDTLUTUData(0) }, 0x80000000},
		{"IDTLUTUData(7)", func() (uint32, error) { return IDTLUTUData(7) }, 0x80000007},
	} {
		if v, err := c.got(); err != nil || v != c.want {
			t.Errorf("%s = %#x, %v; want %#x", c.what, v, err, c.want)
		}
	}
}

// TestRegAt: an array register's elements are 0..Count-1; a plain
// register (Count 0 or 1) has element 0 only.
func TestRegAt(t *testing.T) {
	a := Reg{Name: "A", Off: 0x100, Width: 4, Count: 16, Stride: 8}
	for i, want := range map[int]uint32{0: 0x100, 1: 0x108, 15: 0x100 + 15*8} {
		if off, err := a.At(i); err != nil || off != want {
			t.Errorf("A.At(%d) = %#x, %v; want %#x", i, off, err, want)
		}
	}
	for _, r := range []Reg{a, {Name: "P", Off: 0x40, Width: 4}, {Name: "One", Off: 0x40, Width: 4, Count: 1}} {
		n := max(r.Count, 1)
		for _, i := range []int{-1, n, n + 1} {
			if _, err := r.At(i); !errors.Is(err, fabric.ErrInvalid) {
				t.Errorf("%s.At(%d) of %d elements: %v, want ErrInvalid", r.Name, i, n, err)
			}
		}
		if off, err := r.At(n - 1); err != nil || off != r.Off+uint32(n-1)*r.Stride {
			t.Errorf("%s.At(%d), the last element: %#x, %v", r.Name, n-1, off, err)
		}
	}
}

// TestIDTBarSetupBounds: BARSETUP's size, mode and partition fields at
// their edges.
func TestIDTBarSetupBounds(t *testing.T) {
	enc := func(s IDTBarSetup) func() error { return func() error { return errOf(s.Encode()) } }
	checkEdges(t, []edge{
		{"size 1 (2^0)", enc(IDTBarSetup{Size: 1}), nil},
		{"size 2", enc(IDTBarSetup{Size: 2}), nil},
		{"size 3", enc(IDTBarSetup{Size: 3}), fabric.ErrInvalid},
		{"size 2^31+2^30", enc(IDTBarSetup{Size: 3 << 30}), fabric.ErrInvalid},
		{"32-bit size 2^31", enc(IDTBarSetup{Size: 1 << 31}), nil},
		{"32-bit size 2^32", enc(IDTBarSetup{Size: 1 << 32}), fabric.ErrInvalid},
		{"64-bit size 2^32", enc(IDTBarSetup{Size: 1 << 32, Type64: true}), nil},
		{"64-bit size 2^63", enc(IDTBarSetup{Size: 1 << 63, Type64: true}), nil},
		{"size 0", enc(IDTBarSetup{}), fabric.ErrInvalid},
		{"LUT24", enc(IDTBarSetup{Size: 4096, Trans: IDTTransLUT24}), nil},
		{"mode 3", enc(IDTBarSetup{Size: 4096, Trans: IDTTransLUT24 + 1}), fabric.ErrInvalid},
		{"partition 7", enc(IDTBarSetup{Size: 4096, TargetPartition: 7}), nil},
		{"partition 8", enc(IDTBarSetup{Size: 4096, TargetPartition: 8}), fabric.ErrInvalid},
		{"LUT24 partition 8", enc(IDTBarSetup{Size: 4096, Trans: IDTTransLUT24, TargetPartition: 8}), fabric.ErrInvalid},
	})
	// A value read from a device: a SIZE field of 0 means no size (not
	// 2^0), 1 is 2 bytes, 63 is 2^63.
	for fld, want := range map[uint32]uint64{0: 0, 1: 2, 31: 1 << 31, 63: 1 << 63} {
		if got := DecodeIDTBarSetup(fld << IDTBarSetupSizeFld).Size; got != want {
			t.Errorf("SIZE field %d decodes to %#x, want %#x", fld, got, want)
		}
	}
}

// TestCheckTranslationBounds: the window size exactly at its maximum is
// taken, one alignment unit over is refused; alignments must be powers
// of two.
func TestCheckTranslationBounds(t *testing.T) {
	const max = 1 << 20
	ct := func(addr, size, aa, sa uint64) func() error {
		return func() error { return CheckTranslation(addr, size, aa, sa, max) }
	}
	checkEdges(t, []edge{
		{"size at the maximum", ct(0, max, 4096, 4096), nil},
		{"size one unit below", ct(0, max-4096, 4096, 4096), nil},
		{"size one unit above", ct(0, max+4096, 4096, 4096), fabric.ErrBounds},
		{"size one sizeAlign", ct(0, 4096, 4096, 4096), nil},
		{"address alignment 0", ct(0, 4096, 0, 4096), fabric.ErrInvalid},
		{"address alignment 1", ct(4097, 4096, 1, 4096), nil},
		{"address alignment 6", ct(0, 4096, 6, 4096), fabric.ErrInvalid},
		{"size alignment 0", ct(0, 4096, 4096, 0), fabric.ErrInvalid},
		{"size not a multiple", ct(0, 4096+1, 4096, 4096), fabric.ErrInvalid},
		{"size 0", ct(0, 0, 4096, 4096), fabric.ErrInvalid},
		{"ends at 2^64", ct(^uint64(0)&^4095, 4096, 4096, 4096), fabric.ErrBounds},
		{"ends just below 2^64", ct(^uint64(0)&^8191, 4096, 4096, 4096), nil},
	})
}

// TestRegBARSize: a map without a mirror needs its registers' extent,
// rounded up to a power of two; one with a mirror needs the mirror too.
func TestRegBARSize(t *testing.T) {
	m := &Map{Regs: []Reg{r32("A", 0x10), r32("B", 0x1ffc)}}
	if got := m.regsFit(); got != 0x2000 {
		t.Errorf("no mirror: %#x, want 0x2000", got)
	}
	m.Regs = append(m.Regs, r32("C", 0x2000))
	if got := m.regsFit(); got != 0x4000 {
		t.Errorf("one byte past 8 KiB: %#x, want 0x4000", got)
	}
	m = &Map{Regs: []Reg{r32("A", 0x100), r32("Far", 0x3000)}, PeerOffset: 0x2000}
	// A's mirror ends at 0x2104; Far (above the mirror offset) is not
	// mirrored, and ends at 0x3004.
	if got := m.regsFit(); got != 0x4000 {
		t.Errorf("mirror: %#x, want 0x4000", got)
	}
	// A register exactly at PeerOffset is the mirror's first, not a
	// local register with a mirror of its own (AMD: the peer's block
	// starts at AMD_PEER_OFFSET 0x400, ntb_hw_amd.h): it ends at
	// 0x2004, not 0x4004.
	m = &Map{Regs: []Reg{r32("A", 0x100), r32("Mirror", 0x2000)}, PeerOffset: 0x2000}
	if got := m.regsFit(); got != 0x4000 {
		t.Errorf("a register at the mirror offset: %#x, want 0x4000", got)
	}
	// The last local register below the mirror is mirrored.
	m = &Map{Regs: []Reg{r32("A", 0x100), r32("Last", 0x1ffc)}, PeerOffset: 0x2000}
	if got := m.regsFit(); got != 0x4000 {
		t.Errorf("a register just below the mirror offset: %#x, want 0x4000", got)
	}
	m = &Map{Regs: []Reg{r32("A", 0xff0)}, PeerOffset: 0x1000}
	if got := m.regsFit(); got != 0x2000 {
		t.Errorf("a mirrored register at 0xff0 + 0x1000: %#x, want 0x2000", got)
	}
	for _, m := range Maps() {
		if r, ok := m.Reg(m.Ops.DB.Status); !ok || r.Name != m.Ops.DB.Status {
			t.Errorf("%s %s: Reg(%q) = %+v, %v", m.Family, m.Gen, m.Ops.DB.Status, r, ok)
		}
		if _, ok := m.Reg("NO SUCH REGISTER"); ok {
			t.Errorf("%s %s: found a register that is not there", m.Family, m.Gen)
		}
	}
}

// FuzzIDTScanWindows: any six BARSETUP values give windows a switch can
// have, or fabric.ErrMalformed.
func FuzzIDTScanWindows(f *testing.F) {
	f.Add(uint32(0x80000000|0x400|12<<4), uint32(0), uint32(0x8000000c|20<<4), uint32(0), uint32(0x8000000c|21<<4|1<<11), uint32(0))
	f.Add(uint32(0xffffffff), uint32(0), uint32(0), uint32(0), uint32(0), uint32(0))
	f.Add(uint32(0x80000004|40<<4), uint32(0), uint32(0), uint32(0), uint32(0), uint32(0x80000004|20<<4))
	f.Fuzz(func(t *testing.T, s0, s1, s2, s3, s4, s5 uint32) {
		ws, err := IDTScanWindows([6]uint32{s0, s1, s2, s3, s4, s5})
		if err != nil {
			if !errors.Is(err, fabric.ErrMalformed) || ws != nil {
				t.Fatalf("%v with %d windows", err, len(ws))
			}
			return
		}
		if len(ws) > IDTWindowsMax {
			t.Fatalf("%d windows", len(ws))
		}
		for _, w := range ws {
			if w.BAR < 0 || w.BAR > 5 || w.Size == 0 || w.Size&(w.Size-1) != 0 || w.BARSize < 4096 ||
				uint64(w.Index+1)*w.Size > w.BARSize || (w.Trans != IDTTransDirect && w.BAR != 2 && w.BAR != 4) ||
				(w.Type64 && w.BAR == 5) || (!w.Type64 && w.BARSize > 1<<31) {
				t.Fatalf("impossible window %+v", w)
			}
		}
	})
}

func TestIDTGlobalAddresses(t *testing.T) {
	for _, c := range []struct {
		name string
		f    func() (uint32, error)
		want uint32
	}{
		{"SWPORT0STS", func() (uint32, error) { return IDTSwPortSts(0) }, 0x3e204},
		{"SWPORT20STS", func() (uint32, error) { return IDTSwPortSts(20) }, 0x3e484},
		{"SWPART7STS", func() (uint32, error) { return IDTSwPartSts(7) }, 0x3e1e4},
		{"SWP3MSGCTL2", func() (uint32, error) { return IDTSwMsgCtl(3, 2) }, 0x3ee4c},
		{"SWP7MSGCTL3", func() (uint32, error) { return IDTSwMsgCtl(7, 3) }, 0x3ee7c},
		{"route to register 2 of partition 5", func() (uint32, error) { return IDTMsgRoute(2, 5) }, 0x52},
		{"LUTUDATA partition 3", func() (uint32, error) { return IDTLUTUData(3) }, 0x80000003},
	} {
		if got, err := c.f(); got != c.want || err != nil {
			t.Errorf("%s = %#x, %v; want %#x", c.name, got, err, c.want)
		}
	}
	for _, f := range []func() (uint32, error){
		func() (uint32, error) { return IDTSwPortSts(24) }, func() (uint32, error) { return IDTSwPortSts(-1) },
		func() (uint32, error) { return IDTSwPartSts(8) }, func() (uint32, error) { return IDTSwMsgCtl(0, 4) },
		func() (uint32, error) { return IDTSwMsgCtl(8, 0) }, func() (uint32, error) { return IDTMsgRoute(4, 0) },
		func() (uint32, error) { return IDTMsgRoute(0, 8) }, func() (uint32, error) { return IDTLUTUData(-1) },
	} {
		if _, err := f(); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("out of range: %v", err)
		}
	}
	if s := DecodeIDTPortStatus(0x10 | 3<<6 | 5<<10); !s.LinkUp || !s.NT() || s.Partition != 5 {
		t.Errorf("decode %+v", s)
	}
}

// TestIDTScanWindows: the BAR set-ups an NT function can have, at the
// edges of each rule IDTScanWindows documents. The fields are Linux's
// ntb_hw_idt.h (IDT_BARSETUP_*: EN bit 31, TYPE_64 bit 2, SIZE bits 9:4
// as log2, MODE_CFG bit 10, ATRAN bits 12:11); the walk is idt_scan_mws
// (ntb_hw_idt.c): a disabled BAR is skipped, a 64-bit BAR's next
// BARSETUP is its upper half, a configuration-space BAR is no window,
// ATRAN gives 1, 12 or 24 windows (idt_get_mw_count), a lookup-table
// window is a 16th or a 32nd of the BAR, and the scan fails when the
// count would pass IDT_MAX_NR_MWS (29).
func TestIDTScanWindows(t *testing.T) {
	const (
		en    = IDTBarSetupEnable
		b64   = IDTBarSetupType64
		cfg   = IDTBarSetupModeCfg
		lut12 = IDTTransLUT12 << IDTBarSetupATRANFld
		lut24 = IDTTransLUT24 << IDTBarSetupATRANFld
	)
	sz := func(lg uint32) uint32 { return lg << IDTBarSetupSizeFld }
	at := func(b int, v uint32) [6]uint32 { var s [6]uint32; s[b] = v; return s }
	for _, c := range []struct {
		what  string
		setup [6]uint32
		want  int // windows; -1: fabric.ErrMalformed
	}{
		{"nothing enabled", [6]uint32{}, 0},
		// A disabled BAR is skipped whatever its other fields say (a
		// size of 0 here would be malformed if it were enabled).
		{"disabled, size 0", at(2, lut24), 0},
		{"disabled, all but EN", at(2, ^uint32(en)), 0},
		{"direct BAR 2", at(2, en|sz(20)), 1},
		{"all ones (absent or hung)", at(3, 0xffffffff), -1},
		{"all ones but EN", at(3, 0x7fffffff), 0},
		// Configuration-space BARs (BAR 0 in Linux's set-up, SIZE_CFG
		// 2^12) are no window; a 64-bit one still takes BAR 1 as its
		// upper half.
		{"config-space BAR 0", at(0, en|cfg|sz(IDTBarSetupSizeCfg)), 0},
		{"64-bit config-space BAR 0, BAR 1 its upper half",
			[6]uint32{en | cfg | b64 | sz(IDTBarSetupSizeCfg), en | sz(20)}, 0},
		// 64-bit BARs: BAR 4 takes BAR 5; BAR 5 has no BAR 6.
		{"64-bit BAR 4", [6]uint32{4: en | b64 | sz(40), 5: en | sz(20)}, 1},
		{"64-bit BAR 0", at(0, en|b64|sz(40)), 1},
		{"64-bit BAR 2", at(2, en|b64|sz(40)), 1},
		{"32-bit BAR 5", at(5, en|sz(20)), 1},
		{"64-bit BAR 5", at(5, en|b64|sz(20)), -1},
		// ATRAN: 0, 1 and 2 are the modes (IDT_BARSETUP_ATRAN_DIR,
		// _LUT12, _LUT24); 3 is none.
		{"LUT12 in BAR 2", at(2, en|lut12|sz(20)), 12},
		{"LUT24 in BAR 2", at(2, en|lut24|sz(20)), 24},
		{"LUT24 in BAR 4", at(4, en|lut24|sz(20)), 24},
		{"ATRAN 3", at(2, en|3<<IDTBarSetupATRANFld|sz(20)), -1},
		// Lookup tables are in BAR 2 and 4 only, as IDTScanWindows
		// documents it (the IDT user manual's rule as this package
		// states it; Linux does not check it); direct windows are in any.
		{"LUT12 in BAR 0", at(0, en|lut12|sz(20)), -1},
		{"LUT12 in BAR 1", at(1, en|lut12|sz(20)), -1},
		{"LUT24 in BAR 3", at(3, en|lut24|sz(20)), -1},
		{"LUT12 in BAR 5", at(5, en|lut12|sz(20)), -1},
		{"direct BAR 0", at(0, en|sz(20)), 1},
		{"direct BAR 3", at(3, en|sz(20)), 1},
		// Sizes: a BAR is at least 4 KiB (2^12, SIZE_CFG, the smallest
		// the driver maps); a 32-bit BAR at most 2^31 (it must fit below
		// 4 GiB, aligned to its size); a 64-bit one at most 2^62 (one of
		// 2^63 would end at 2^64, past a 64-bit address).
		{"2^11", at(2, en|sz(11)), -1},
		{"2^12", at(2, en|sz(12)), 1},
		{"32-bit 2^31", at(2, en|sz(31)), 1},
		{"32-bit 2^32", at(2, en|sz(32)), -1},
		{"64-bit 2^11", at(2, en|b64|sz(11)), -1},
		{"64-bit 2^32", at(2, en|b64|sz(32)), 1},
		{"64-bit 2^62", at(2, en|b64|sz(62)), 1},
		{"64-bit 2^63", at(2, en|b64|sz(63)), -1},
		// IDT_MAX_NR_MWS: 29 windows (a 24-entry table and five direct
		// BARs) are taken; a 24- and a 12-entry table (36) are not. No
		// set-up gives 30 to 35: BAR 2 and 4 give 0, 1, 12 or 24 each,
		// the other four BARs one at most.
		{"29 windows", [6]uint32{en | sz(20), en | sz(20), en | lut24 | sz(20), en | sz(20), en | sz(20), en | sz(20)}, 29},
		{"36 windows", [6]uint32{2: en | lut24 | sz(20), 4: en | lut12 | sz(20)}, -1},
	} {
		ws, err := IDTScanWindows(c.setup)
		if c.want < 0 {
			if !errors.Is(err, fabric.ErrMalformed) || ws != nil {
				t.Errorf("%s: %d windows, %v; want fabric.ErrMalformed", c.what, len(ws), err)
			}
			continue
		}
		if err != nil || len(ws) != c.want {
			t.Errorf("%s: %d windows, %v; want %d", c.what, len(ws), err, c.want)
		}
	}

	// What the windows are: a 64-bit direct BAR 2 of 1 MiB (BAR 3, its
	// upper half, is not a set-up: read as one it would be malformed),
	// then BAR 4's 24-entry table of 32 MiB (each entry 1 MiB, a 32nd),
	// in order.
	ws, err := IDTScanWindows([6]uint32{2: en | b64 | sz(20), 3: en | lut24 | sz(11), 4: en | lut24 | sz(25)})
	if err != nil || len(ws) != 25 {
		t.Fatalf("direct + LUT24: %d windows, %v", len(ws), err)
	}
	if w := ws[0]; w != (IDTWindow{BAR: 2, Index: 0, Trans: IDTTransDirect, Type64: true, Size: 1 << 20, BARSize: 1 << 20}) {
		t.Errorf("window 0: %+v", w)
	}
	for i, w := range ws[1:] {
		if w != (IDTWindow{BAR: 4, Index: i, Trans: IDTTransLUT24, Size: 1 << 20, BARSize: 1 << 25}) {
			t.Errorf("window %d: %+v", i+1, w)
		}
	}
	// A 12-entry table's windows are a 16th of the BAR.
	if ws, err := IDTScanWindows(at(2, en|lut12|sz(24))); err != nil || len(ws) != 12 || ws[11].Size != 1<<20 || ws[11].Index != 11 {
		t.Errorf("LUT12 of 16 MiB: %+v, %v", ws, err)
	}
}
