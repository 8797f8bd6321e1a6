package hw

import (
	"errors"
	"sort"
	"testing"

	"github.com/weft-io/weft/fabric"
)

type span struct {
	name     string
	lo, hi   uint32
	elemOf   string
	elemIdx  int
	elemSize uint8
}

// spans expands every register (and array element) of m into byte ranges.
func spans(m *Map) []span {
	var out []span
	for _, r := range m.Regs {
		for i := 0; i < max(r.Count, 1); i++ {
			off, _ := r.At(i)
			out = append(out, span{r.Name, off, off + uint32(r.Width), r.Name, i, r.Width})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].lo < out[j].lo })
	return out
}

func TestMapsConsistent(t *testing.T) {
	ids := map[[2]uint16]string{}
	for _, m := range Maps() {
		name := m.Family + " " + m.Gen
		if len(m.Regs) == 0 || len(m.Devices) == 0 || m.Source == "" {
			t.Errorf("%s: empty map", name)
			continue
		}
		// Unique PCI IDs across maps: the ID selects one map.
		for _, d := range m.Devices {
			k := [2]uint16{m.Vendor, d}
			if other, dup := ids[k]; dup {
				t.Errorf("%04x:%04x in %s and %s", m.Vendor, d, other, name)
			}
			ids[k] = name
			if got, err := Lookup(m.Vendor, d); err != nil || got != m {
				t.Errorf("Lookup(%04x:%04x) = %v, %v", m.Vendor, d, got, err)
			}
		}
		seen := map[string]bool{}
		for _, r := range m.Regs {
			if seen[r.Name] {
				t.Errorf("%s: %s twice", name, r.Name)
			}
			seen[r.Name] = true
			switch r.Width {
			case 1, 2, 4, 8:
			default:
				t.Errorf("%s: %s width %d", name, r.Name, r.Width)
			}
			// Naturally aligned.
			if r.Off%uint32(r.Width) != 0 || (r.Count > 1 && r.Stride%uint32(r.Width) != 0) {
				t.Errorf("%s: %s at %#x (stride %#x) is not %d-byte aligned", name, r.Name, r.Off, r.Stride, r.Width)
			}
			if r.Count > 1 && r.Stride < uint32(r.Width) {
				t.Errorf("%s: %s elements overlap (stride %d < width %d)", name, r.Name, r.Stride, r.Width)
			}
		}
		// No two registers share a byte.
		sp := spans(m)
		for i := 1; i < len(sp); i++ {
			if sp[i].lo < sp[i-1].hi {
				t.Errorf("%s: %s[%d] at %#x overlaps %s[%d] at %#x..%#x", name, sp[i].name, sp[i].elemIdx, sp[i].lo,
					sp[i-1].name, sp[i-1].elemIdx, sp[i-1].lo, sp[i-1].hi)
			}
		}
		// Doorbells: the client bits and the link bit fit the registers
		// that carry them, and the link bit is not a client bit.
		if m.DoorbellBits < 1 || m.DoorbellBits > 64 {
			t.Errorf("%s: %d doorbell bits", name, m.DoorbellBits)
		}
		if m.LinkBit >= 0 && m.DBValidMask()&(1<<m.LinkBit) != 0 {
			t.Errorf("%s: link bit %d inside the valid mask %#x", name, m.LinkBit, m.DBValidMask())
		}
		for _, db := range []string{m.Ops.DB.Status, m.Ops.DB.Mask} {
			if r, ok := m.Reg(db); ok {
				need := m.DoorbellBits
				if m.LinkBit >= need {
					need = m.LinkBit + 1
				}
				if m.Ops.DB.Shift[1].Local > 0 {
					need += int(m.Ops.DB.Shift[1].Local) // the higher side's bits
				}
				if int(r.Width)*8 < need {
					t.Errorf("%s: %s is %d bits, the doorbells need %d", name, db, 8*r.Width, need)
				}
			}
		}
		// Scratchpads (or messages): the array holds what the map claims
		// per side (AMD: half of a shared array).
		for _, sp := range []string{"SPAD", "IM_SPAD", "INMSG"} {
			if r, ok := m.Reg(sp); ok {
				per, want := r.Count, m.Scratchpads
				if m.Family == "amd" {
					per /= 2
				}
				if sp == "INMSG" {
					want = m.Ops.Msg.Count
				}
				if per != want {
					t.Errorf("%s: %s has %d entries per side, map says %d", name, sp, per, m.Scratchpads)
				}
			}
		}
	}
	if _, err := Lookup(0x1af4, 0x1110); !errors.Is(err, fabric.ErrNotSupported) {
		t.Fatalf("ivshmem is no NTB: %v", err)
	}
}

// TestMirrors checks blocks that the layout repeats: the peer's view of
// the local registers (Intel gen3/gen4, AMD) at PeerOffset.
func TestMirrors(t *testing.T) {
	pairs := map[string][][2]string{
		"intel gen3 (Skylake Xeon)": {{"IMBAR1XBASE", "EMBAR1XBASE"}, {"IMBAR1XLMT", "EMBAR1XLMT"}, {"IMBAR2XBASE", "EMBAR2XBASE"},
			{"IMBAR2XLMT", "EMBAR2XLMT"}, {"IM_INT_STATUS", "EM_INT_STATUS"}, {"IM_INT_DISABLE", "EM_INT_DISABLE"},
			{"IM_SPAD", "EM_SPAD"}, {"IM_DOORBELL", "EM_DOORBELL"}},
		"intel gen4 (Ice Lake / Sapphire Rapids Xeon)": {{"IM_SPAD", "EM_SPAD"}},
		"amd Zeppelin": {{"SPAD", "PSION"}}, // checked below by offset only
	}
	for _, m := range Maps() {
		ps, ok := pairs[m.Family+" "+m.Gen]
		if !ok || m.Family == "amd" {
			continue
		}
		for _, p := range ps {
			a, _ := m.Reg(p[0])
			b, _ := m.Reg(p[1])
			if b.Off-a.Off != m.PeerOffset || a.Width != b.Width || a.Count != b.Count {
				t.Errorf("%s: %s %#x and %s %#x are not %#x apart", m.Gen, p[0], a.Off, p[1], b.Off, m.PeerOffset)
			}
		}
	}
	// AMD: the peer's copy of the limit/translation/doorbell block (0x410
	// on) is read at +0x400 through the same BAR; it must not land on a
	// local register that this map lists below 0x800.
	amd, _ := Lookup(0x1022, 0x145b)
	for _, r := range amd.Regs {
		if r.Off >= 0x410 && r.End()+amd.PeerOffset > 0x1000 {
			t.Errorf("amd: %s's peer copy ends past the 4 KiB register page", r.Name)
		}
	}
}

func TestSwitchtecLayout(t *testing.T) {
	m, err := Lookup(0x11f8, 0x8531)
	if err != nil {
		t.Fatal(err)
	}
	// The per-partition control blocks tile exactly up to the doorbell
	// blocks.
	last, _ := SwitchtecCtrl(SwitchtecPartitions - 1)
	first, _ := SwitchtecDBMsg(0)
	if last+SwitchtecCtrlStride != first {
		t.Fatalf("control blocks end at %#x, doorbell blocks start at %#x", last+SwitchtecCtrlStride, first)
	}
	// Partition 0's registers stay inside its blocks.
	c0, _ := SwitchtecCtrl(0)
	d0, _ := SwitchtecDBMsg(0)
	for _, r := range m.Regs {
		switch {
		case r.Off < c0:
			if r.End() > SwitchtecNTBOffset+SwitchtecCtrlOffset {
				t.Errorf("%s spills from the info block", r.Name)
			}
		case r.Off < d0:
			if r.End() > c0+SwitchtecCtrlStride {
				t.Errorf("%s ends at %#x, past partition 0's control block", r.Name, r.End())
			}
		default:
			if r.End() > d0+SwitchtecDBMsgStride {
				t.Errorf("%s ends at %#x, past partition 0's doorbell block", r.Name, r.End())
			}
		}
	}
	lut, _ := m.Reg("LUT_ENTRY")
	if lut.End() != c0+SwitchtecCtrlStride {
		t.Errorf("the LUT ends at %#x, the control block at %#x", lut.End(), c0+SwitchtecCtrlStride)
	}
	pba, _ := m.Reg("PBA")
	if pba.End() > d0+SwitchtecDBMsgStride {
		t.Errorf("the PBA ends past the block")
	}
	for _, p := range []int{-1, SwitchtecPartitions} {
		if _, err := SwitchtecCtrl(p); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("SwitchtecCtrl(%d): %v", p, err)
		}
		if _, err := SwitchtecDBMsg(p); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("SwitchtecDBMsg(%d): %v", p, err)
		}
	}
}

func TestIDTLayout(t *testing.T) {
	m, err := Lookup(0x111d, 0x8091) // 89HPES24NT6AG2
	if err != nil {
		t.Fatal(err)
	}
	setup, _ := m.Reg("BARSETUP")
	for _, name := range []string{"BARLIMIT", "BARLTBASE", "BARUTBASE"} {
		r, _ := m.Reg(name)
		if r.Count != 6 || r.Stride != setup.Stride || r.Off-setup.Off >= setup.Stride {
			t.Errorf("%s is not in BARSETUP's 16-byte group", name)
		}
	}
	ntctl, _ := m.Reg("NTCTL")
	// Global-space copies listed in the datasheet layout: NTCTL and
	// BARSETUP0 of each NT port.
	for port, want := range map[int][2]uint32{0: {0x01400, 0x01470}, 2: {0x05400, 0x05470}, 4: {0x09400, 0x09470},
		6: {0x0d400, 0x0d470}, 8: {0x11400, 0x11470}, 12: {0x19400, 0x19470}, 16: {0x21400, 0x21470}, 20: {0x29400, 0x29470}} {
		base, err := IDTPortBase(port)
		if err != nil || base+ntctl.Off != want[0] || base+setup.Off != want[1] {
			t.Errorf("port %d: NTCTL %#x BARSETUP0 %#x, want %#x %#x", port, base+ntctl.Off, base+setup.Off, want[0], want[1])
		}
	}
	if _, err := IDTPortBase(24); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("port 24: %v", err)
	}
	// Every model's NT ports exist and are known to the map.
	for dev, ports := range IDTPorts {
		if _, err := Lookup(0x111d, dev); err != nil {
			t.Errorf("IDTPorts has %04x, the map does not", dev)
		}
		for _, p := range ports {
			if _, err := IDTPortBase(p); err != nil || p%2 != 0 {
				t.Errorf("%04x: port %d", dev, p)
			}
		}
	}
	if len(IDTPorts[0x8091]) != 6 {
		t.Errorf("the 24NT6AG2 has six NT ports")
	}
}

func TestIDTBarSetup(t *testing.T) {
	// The fields do not overlap.
	fields := []uint32{IDTBarSetupType64, IDTBarSetupPref, IDTBarSetupSizeMask, IDTBarSetupModeCfg,
		IDTBarSetupATRANMsk, IDTBarSetupTPartMsk, IDTBarSetupEnable}
	for i := range fields {
		for j := i + 1; j < len(fields); j++ {
			if fields[i]&fields[j] != 0 {
				t.Errorf("fields %#x and %#x overlap", fields[i], fields[j])
			}
		}
	}
	for _, s := range []IDTBarSetup{
		{Enable: true, Type64: true, Prefetch: true, Size: 1 << 30, Trans: IDTTransDirect, TargetPartition: 3},
		{Enable: true, Size: 1 << 20, Trans: IDTTransLUT24, TargetPartition: 7},
		{Size: 4096, Trans: IDTTransLUT12, ConfigSpace: true},
		{Type64: true, Size: 1 << 40},
	} {
		v, err := s.Encode()
		if err != nil {
			t.Fatalf("Encode(%+v): %v", s, err)
		}
		if got := DecodeIDTBarSetup(v); got != s {
			t.Errorf("round trip %+v -> %#x -> %+v", s, v, got)
		}
	}
	// A 1 GiB, 64-bit, prefetchable, enabled, direct window: log2 30 in
	// bits 4..9.
	v, _ := IDTBarSetup{Enable: true, Type64: true, Prefetch: true, Size: 1 << 30}.Encode()
	if v != 0x80000000|30<<4|0x4|0x8 {
		t.Errorf("encoding %#x", v)
	}
	for _, bad := range []IDTBarSetup{{Size: 3000}, {Size: 0}, {Size: 1 << 40}, {Size: 4096, Trans: 3}, {Size: 4096, TargetPartition: 8}} {
		if _, err := bad.Encode(); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("Encode(%+v) = %v", bad, err)
		}
	}
	if v, err := IDTLUTOffset(4, 23); err != nil || v != 23|4<<8 {
		t.Errorf("LUTOFFSET = %#x, %v", v, err)
	}
	if _, err := IDTLUTOffset(8, 0); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("LUTOFFSET bar 8: %v", err)
	}
	if v, err := IDTMappingEntry(0x0300, 2); err != nil || v != 1|0x0300<<1|2<<17 || v&0x1fffe != 0x0300<<1 {
		t.Errorf("NTMTBLDATA = %#x, %v", v, err)
	}
}

func TestCheckTranslation(t *testing.T) {
	for _, c := range []struct {
		addr, size, aa, sa, max uint64
		want                    error
	}{
		{0x100000, 0x100000, 4096, 4096, 1 << 30, nil},
		{0x100001, 0x100000, 4096, 4096, 1 << 30, fabric.ErrInvalid},
		{0x100000, 0x100001, 4096, 4096, 1 << 30, fabric.ErrInvalid},
		{0, 2 << 30, 4096, 4096, 1 << 30, fabric.ErrBounds},
		{^uint64(0) &^ 4095, 8192, 4096, 4096, 1 << 30, fabric.ErrBounds},
		{0, 4096, 3, 4096, 1 << 30, fabric.ErrInvalid},
		{0, 0, 4096, 4096, 1 << 30, fabric.ErrInvalid},
	} {
		err := CheckTranslation(c.addr, c.size, c.aa, c.sa, c.max)
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("CheckTranslation(%#x, %#x, %#x, %#x, %#x) = %v, want %v", c.addr, c.size, c.aa, c.sa, c.max, err, c.want)
		}
	}
}

func FuzzDecodeIDTBarSetup(f *testing.F) {
	f.Add(uint32(0x800003cc))
	f.Fuzz(func(t *testing.T, v uint32) {
		s := DecodeIDTBarSetup(v)
		if s.Size != 0 && s.Size&(s.Size-1) != 0 {
			t.Fatalf("decoded size %#x", s.Size)
		}
		if e, err := s.Encode(); err == nil {
			if DecodeIDTBarSetup(e) != s {
				t.Fatalf("re-encode of %#x differs", v)
			}
		}
	})
}

// TestOpsTables checks the driver tables against their maps: every
// register an operation names exists and is wide enough, and each
// window's BAR is a window BAR.
func TestOpsTables(t *testing.T) {
	for _, m := range Maps() {
		name := m.Family + " " + m.Gen
		o := m.Ops
		need := func(what, reg string, minWidth uint8) Reg {
			t.Helper()
			if reg == "" {
				return Reg{}
			}
			r, ok := m.Reg(reg)
			if !ok {
				t.Errorf("%s: %s names %q, which the map lacks", name, what, reg)
			} else if r.Width < minWidth {
				t.Errorf("%s: %s %s is %d bytes, want at least %d", name, what, reg, r.Width, minWidth)
			}
			return r
		}
		if o.DB.Status == "" || o.DB.Mask == "" || o.DB.Ring == "" {
			t.Errorf("%s: doorbell registers missing: %+v", name, o.DB)
		}
		need("doorbell status", o.DB.Status, 2)
		need("doorbell mask", o.DB.Mask, 2)
		ring := need("doorbell ring", o.DB.Ring, 2)
		if o.DB.RingPerBit && ring.Count < m.DoorbellBits {
			t.Errorf("%s: %d ring registers for %d bits", name, ring.Count, m.DoorbellBits)
		}
		if !o.DB.RingPerBit && int(ring.Width)*8 < m.DoorbellBits+int(o.DB.Shift[0].Peer) {
			t.Errorf("%s: ring register too narrow", name)
		}
		loc, per := need("local scratchpads", o.Spad.Local, 4), need("peer scratchpads", o.Spad.Peer, 4)
		if o.Spad.Local != "" {
			n := m.Scratchpads
			if o.Spad.Halves {
				n *= 2
			}
			if loc.Count < n || per.Count < n {
				t.Errorf("%s: scratchpad arrays of %d and %d for %d", name, loc.Count, per.Count, n)
			}
		}
		if (len(o.Windows) == 0) != o.BARScan {
			t.Errorf("%s: %d windows, BARScan %v: the map must list its windows or scan for them", name, len(o.Windows), o.BARScan)
		}
		if mo := o.Msg; mo != nil {
			for _, r := range []string{mo.In, mo.Out, mo.Src} {
				if x := need("message register", r, 4); r != "" && x.Count < mo.Count {
					t.Errorf("%s: %s has %d entries for %d messages", name, r, x.Count, mo.Count)
				}
			}
			if (mo.Status == "") == (mo.InStatus == "") {
				t.Errorf("%s: message status both per register and in one register, or neither", name)
			}
			if mo.Status != "" {
				need("message status", mo.Status, 4)
				need("message mask", mo.Mask, 4)
				if mo.InShift+uint(mo.Count) > 32 || mo.OutShift+uint(mo.Count) > 32 {
					t.Errorf("%s: message status bits beyond 32", name)
				}
			}
		}
		if g := o.Global; g != nil {
			need("global address", g.Addr, 4)
			need("global data", g.Data, 4)
		}
		seen := map[int]bool{}
		for i, w := range o.Windows {
			if w.BAR <= 0 || w.BAR > 5 || w.BAR == m.RegBAR || seen[w.BAR] {
				t.Errorf("%s: window %d in BAR %d", name, i, w.BAR)
			}
			seen[w.BAR] = true
			need("translation", w.Xlat, 8)
			need("limit", w.Limit, 4)
			need("base", w.Base, 8)
			need("mirror limit", w.MirrorLimit, 8)
			need("mirror base", w.MirrorBase, 8)
			need("log2 of the size", w.Log2Reg, 2)
			if (w.Xlat == "") != (w.Limit == "") {
				t.Errorf("%s: window %d has a translation without a limit or the reverse", name, i)
			}
			if w.AddrAlign&(w.AddrAlign-1) != 0 {
				t.Errorf("%s: window %d alignment %#x", name, i, w.AddrAlign)
			}
		}
		if pr := o.PeerRegs; pr != nil {
			// The peer's registers through a reserved window: they sit in
			// the part of the window that reaches the peer's register BAR,
			// the ring is wide enough for the path's bits, and a window
			// remains for clients.
			if pr.Window < 0 || pr.Window >= len(o.Windows) || len(o.Windows) < 2 {
				t.Errorf("%s: peer registers through window %d of %d", name, pr.Window, len(o.Windows))
			}
			r, s := need("peer ring", pr.Ring, 2), need("peer scratchpads", pr.Spad, 4)
			if uint64(r.End()) > pr.Size || uint64(s.End()) > pr.Size || s.Count < m.Scratchpads {
				t.Errorf("%s: peer ring %s and scratchpads %s end past the %#x bytes the window reaches", name, pr.Ring, pr.Spad, pr.Size)
			}
			if pr.DoorbellBits < 1 || pr.DoorbellBits > int(r.Width)*8 || pr.DoorbellBits > m.LinkBit && m.LinkBit >= 0 {
				t.Errorf("%s: %d doorbell bits through a %d-byte ring (link bit %d)", name, pr.DoorbellBits, r.Width, m.LinkBit)
			}
		}
		need("link status", o.Link.Status, 2)
		for _, u := range append(append([]Update{}, o.Link.Enable...), o.Link.Disable...) {
			need("link update", u.Reg, 2)
		}
		if o.Side != nil {
			need("side", o.Side.Reg, 4)
		}
		if p := o.Partition; p != nil {
			need("partition", p.Self, 1)
			need("endpoint map", p.EPMapLo, 4)
			need("endpoint map", p.EPMapHi, 4)
			need("target vector", p.TargetLo, 4)
			need("target vector", p.TargetHi, 4)
			if p.SharedWindow {
				// The partition operations and the shared window's set-up
				// name these (package ntb's hwdev_switchtec.go).
				for _, r := range []string{"PARTITION_STATUS", "PARTITION_OP", "PARTITION_CTRL", "BAR_ERROR", "LUT_ERROR"} {
					need("partition operation", r, 4)
				}
				need("partition operation", "LUT_TABLE_ENTRIES", 2)
				need("partition operation", "REQ_ID_TABLE_SIZE", 2)
				need("partition operation", "REQ_ID_TABLE", 4)
				need("window", "BAR_ENTRY_CTL", 4)
				need("window", "BAR_ENTRY_WIN_SIZE", 4)
				need("window", "BAR_EXT_WIN_SIZE", 4)
				need("window", "BAR_ENTRY_XLATE_ADDR", 8)
				need("window", "LUT_ENTRY", 8)
				need("requester", "INFO_REQUESTER_ID", 2)
			}
		}
		if mo := o.Msg; mo != nil {
			need("message", mo.In, 4)
			need("message", mo.Out, 4)
			need("message status", mo.InStatus, 1)
			need("message mask", mo.InMask, 1)
			need("message route", mo.Route, 4)
			if mo.Count < 1 || mo.Count > 8 || (mo.InStatus != "" && mo.Full == 0) {
				t.Errorf("%s: %d message registers, full bit %#x", name, mo.Count, mo.Full)
			}
		}
		if m.RegBARSize < m.regsFit() || m.RegBARSize&(m.RegBARSize-1) != 0 {
			t.Errorf("%s: register BAR of %#x bytes, the registers need %#x", name, m.RegBARSize, m.regsFit())
		}
	}
}
