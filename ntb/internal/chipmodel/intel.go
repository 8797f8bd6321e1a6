//go:build linux

package chipmodel

// Intel's NTBs, as Linux's drivers/ntb/hw/intel (ntb_hw_gen1.h/.c,
// ntb_hw_gen3.h/.c, ntb_hw_gen4.h/.c, ntb_hw_intel.h) describe them. The
// two sides are two Xeons, each with its own NTB function, joined
// back-to-back (B2B): each side's outbound window BAR is translated into
// the B2B address space, where it hits the peer's secondary (external)
// BAR, which the peer translates into its own memory.

import "math/bits"

// The B2B addresses Linux programs for the secondary BARs
// (XEON_B2B_BAR2_ADDR64, XEON_B2B_BAR4_ADDR64), with the BAR type bits a
// 64-bit prefetchable BAR reads back in its low nibble.
const (
	b2bBar2 = 0x2000_0000_0000_0000
	b2bBar4 = 0x4000_0000_0000_0000
	barType = 0xc
)

// PCIe Link Status: data link layer link active (bit 13), here with
// speed 3 and width x8.
const lnkUp = 0x2000 | 0x80 | 0x3

// intelLink is a change of an Intel chip's link: the link doorbell bit
// and, for gen1 and gen3, the PCIe link status in configuration space.
func intelLink(dbOff uint32, dbWidth uint8, linkBit uint64, cfg bool) func(s *Side, up bool) {
	return func(s *Side, up bool) {
		s.put(dbOff, dbWidth, s.get(dbOff, dbWidth)|linkBit)
		if cfg {
			v := uint64(0)
			if up {
				v = lnkUp
			}
			s.putCfg(0x1a2, 2, v) // LNKSTS
		}
	}
}

// NTBCNTL (gen1, gen3): bit 0 locks the configuration, bit 1 disables the
// link. A side has enabled the link when bit 1 is clear; the lock bit and
// the snoop bits are stored and have no other effect in the model.
const ntbCtlDisable = 1 << 1

func ntbctlEnabled(s *Side) bool { return s.get(0x58, 4)&ntbCtlDisable == 0 }

// Gen1 secondary BAR sizes in configuration space (log2 of the size; 0:
// the BAR is disabled): PBAR23SZ, PBAR45SZ, SBAR23SZ, SBAR45SZ.
const (
	cfgPBAR23SZ = 0xd0
	cfgSBAR23SZ = 0xd2
)

// gen1RegWindow is the part of the secondary register BAR (SB01BASE) the
// link side reaches: XEON_B2B_MIN_SIZE, 32 KiB.
const gen1RegWindow = 0x8000

// gen1: PDOORBELL is this side's W1C doorbell status (16 bits, bit 15 the
// link), PDBMSK its mask; SPAD are this side's 16 scratchpads.
//
// The peer is reached as Linux's ntb_hw_gen1 does on every part it lists
// (all of which have the SDOORBELL lockup erratum): through window BAR 4,
// whose outbound translation PBAR45XLAT hits the peer's secondary
// register BAR at SBAR0BASE, so the window's first 32 KiB are the peer's
// registers; a write there to the peer's PDOORBELL sets its bits (the
// link side rings, only the local side clears). B2B_DOORBELL and B2B_SPAD
// still carry to the peer (B2B_DOORBELL without bit 14,
// NTB_HWERR_B2BDOORBELL_BIT14), but every use of them is recorded as a
// fault: on these parts a write to B2BDOORBELL with inbound register
// traffic may hang the system (NTB_HWERR_SDOORBELL_LOCKUP), which is why
// Linux never takes that path.
//
// Window BAR 2 (4): the outbound side's PBAR23XLAT (PBAR45XLAT) puts the
// window at a B2B address, which must hit the peer's secondary BAR at
// SBAR23BASE (SBAR45BASE), enabled by its size (SBAR23SZ, SBAR45SZ in
// configuration space); PBAR23LMT, if not 0, ends the window at that host
// address; the peer's SBAR23LMT, if not 0, ends it at that B2B address;
// the peer's SBAR23XLAT is where the window's first byte lands in the
// peer's memory.
func gen1Spec() *spec {
	var rs []reg
	rs = append(rs,
		reg{name: "PDOORBELL", off: 0x60, width: 2, store: w1c(0x60, 2)},
		reg{name: "PDBMSK", off: 0x62, width: 2},
		reg{name: "B2B_DOORBELL", off: 0x140, width: 2, load: readZero, store: func(s *Side, v uint64) {
			s.fault("B2B_DOORBELL written (%#x): these parts have the SDOORBELL lockup erratum; Linux rings the peer through the B2B window", v)
			p := s.Peer()
			p.put(0x60, 2, p.get(0x60, 2)|v&0x3fff) // bits 0-13: 14 is the erratum, 15 the link
		}},
		reg{name: "NTBCNTL", off: 0x58, width: 4, effects: true},
	)
	for _, r := range []struct {
		name string
		off  uint32
	}{{"PBAR23LMT", 0x00}, {"PBAR45LMT", 0x08}, {"PBAR23XLAT", 0x10}, {"PBAR45XLAT", 0x18},
		{"SBAR23LMT", 0x20}, {"SBAR45LMT", 0x28}, {"SBAR23XLAT", 0x30}, {"SBAR45XLAT", 0x38},
		{"SBAR0BASE", 0x40}, {"SBAR23BASE", 0x48}, {"SBAR45BASE", 0x50}} {
		rs = append(rs, reg{name: r.name, off: r.off, width: 8, effects: true})
	}
	rs = append(rs, arrayRegs("SPAD", 0x80, 4, 16, 4, func(int) reg { return reg{} })...)
	rs = append(rs, arrayRegs("B2B_SPAD", 0x100, 4, 16, 4, func(i int) reg {
		off := 0x80 + uint32(i)*4
		return reg{load: func(s *Side) uint64 {
			s.fault("B2B_SPAD[%d] read: these parts have the SDOORBELL lockup erratum; Linux reaches the peer's SPAD through the B2B window", i)
			return s.Peer().get(off, 4)
		}, store: func(s *Side, v uint64) {
			s.fault("B2B_SPAD[%d] written: these parts have the SDOORBELL lockup erratum; Linux reaches the peer's SPAD through the B2B window", i)
			s.Peer().put(off, 4, v)
		}}
	})...)
	return &spec{
		regBAR:      64 << 10,
		winBARs:     []int{2, 4},
		regs:        rs,
		enabled:     ntbctlEnabled,
		linkChanged: intelLink(0x60, 2, 1<<15, true),
		reset: func(s *Side) {
			// What Linux's probe (xeon_setup_b2b_mw, default
			// b2b_mw_idx -1: BAR 4 whole for the peer's registers)
			// leaves: SBAR0BASE at BAR 4's B2B address, the secondary
			// BAR 45 disabled (SBAR45SZ 0) at the same address, the
			// secondary BAR 23 the size of the primary at its B2B
			// address; the secondary windows closed (limit == base), no
			// translation; the outbound translations pointing at the
			// peer's secondary BARs, without limits; B2B_XLAT at the
			// peer's BAR 4 address. The link disabled and locked; every
			// doorbell masked.
			// With Config.Gen1B2BShare (b2b_mw_share), SBAR45 is
			// half the primary's size and starts half-way: BAR 4's
			// first half reaches the peer's registers, its second half
			// is a memory window.
			sz := byte(bits.Len64(s.c.cfg.WindowSize) - 1)
			half := uint64(0)
			s.cfg[cfgPBAR23SZ], s.cfg[cfgPBAR23SZ+1] = sz, sz
			s.cfg[cfgSBAR23SZ], s.cfg[cfgSBAR23SZ+1] = sz, 0
			if s.c.cfg.Gen1B2BShare {
				half = s.c.cfg.WindowSize / 2
				s.cfg[cfgSBAR23SZ+1] = sz - 1
			}
			s.put(0x40, 8, b2bBar4)
			s.put(0x48, 8, b2bBar2|barType)
			s.put(0x50, 8, (b2bBar4+half)|barType)
			s.put(0x20, 8, b2bBar2)
			s.put(0x28, 8, b2bBar4+half)
			s.put(0x10, 8, b2bBar2)
			s.put(0x18, 8, b2bBar4)
			s.put(0x144, 4, b2bBar4&0xffffffff)
			s.put(0x148, 4, b2bBar4>>32)
			s.put(0x58, 4, 0x3)
			s.put(0x62, 2, 0xffff)
			s.cfg[0xd4] = 0x01 | byte(s.idx)<<4 // PPD: B2B, USD or DSD
		},
		route: func(src *Side, bar int) (uint64, uint64) {
			pxlat, plmt, sbase, slmt, sxlat, ssz := uint32(0x10), uint32(0x00), uint32(0x48), uint32(0x20), uint32(0x30), cfgSBAR23SZ
			if bar == 4 {
				pxlat, plmt, sbase, slmt, sxlat, ssz = 0x18, 0x08, 0x50, 0x28, 0x38, cfgSBAR23SZ+1
			}
			p := src.Peer()
			skip := gen1MemStart(src, bar)
			if p.cfg[ssz] == 0 || (skip == 0 && gen1HitsRegs(src, bar)) {
				return 0, 0 // a disabled BAR, or the peer's registers: no memory
			}
			start, size := src.BAR(bar)
			at, n := src.get(pxlat, 8)+skip, size-skip
			if olmt := src.get(plmt, 8); olmt != 0 {
				n = min(n, sub0(olmt, start+skip))
			}
			base := p.get(sbase, 8) &^ 0xf
			if at != base {
				return 0, 0 // the window misses the peer's BAR: master abort
			}
			if lmt := p.get(slmt, 8); lmt != 0 {
				n = min(n, sub0(lmt, base))
			}
			return p.get(sxlat, 8), min(n, uint64(1)<<min(p.cfg[ssz], 63))
		},
		memStart:  gen1MemStart,
		regWindow: gen1HitsRegs,
		linkWrite: func(p *Side, off uint32, width uint8, v uint64) bool {
			if off == 0x60 && width == 2 { // PDOORBELL: the link side sets bits
				p.put(0x60, 2, p.get(0x60, 2)|v)
				return true
			}
			return false
		},
	}
}

// gen1MemStart is where the memory part of src's outbound window on bar
// starts: past the peer's registers when the window reaches them and
// the peer's secondary BAR starts further in (b2b_mw_share: half-way);
// else 0.
func gen1MemStart(src *Side, bar int) uint64 {
	if !gen1HitsRegs(src, bar) {
		return 0
	}
	pxlat, sbase := uint32(0x10), uint32(0x48) // PBAR23XLAT, the peer's SBAR23BASE
	if bar == 4 {
		pxlat, sbase = 0x18, 0x50
	}
	_, size := src.BAR(bar)
	at, base := src.get(pxlat, 8)&^0xf, src.Peer().get(sbase, 8)&^0xf
	if base > at && base-at < size {
		return base - at
	}
	return 0
}

// gen1HitsRegs reports whether src's outbound window on bar lands on the
// peer's secondary register BAR: its outbound translation is the peer's
// SBAR0BASE (the secondary BARs decode SB01 first).
func gen1HitsRegs(src *Side, bar int) bool {
	pxlat := uint32(0x10)
	if bar == 4 {
		pxlat = 0x18
	}
	base := src.Peer().get(0x40, 8) &^ 0xf
	return base != 0 && src.get(pxlat, 8)&^0xf == base
}

// b2bRoute routes an outbound window through the B2B address space: the
// window starts at B2B address at, ends at the outbound limit olmt (a
// host address; 0: none), must hit the peer's secondary BAR at its base
// register, ends at the peer's limit (a B2B address; 0: none when
// zeroIsOpen, else closed) and lands at the peer's translation.
func b2bRoute(src *Side, bar int, at, olmt uint64, p *Side, baseOff, lmtOff, xlatOff uint32, zeroIsOpen bool) (uint64, uint64) {
	start, size := src.BAR(bar)
	n := size
	if olmt != 0 {
		n = min(n, sub0(olmt, start))
	}
	base := p.get(baseOff, 8) &^ 0xf
	if at != base {
		return 0, 0 // the window misses the peer's BAR: master abort
	}
	if lmt := p.get(lmtOff, 8); lmt != 0 || !zeroIsOpen {
		n = min(n, sub0(lmt, base))
	}
	return p.get(xlatOff, 8), n
}

func sub0(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// gen3 (Skylake): IM_INT_STATUS is the W1C doorbell status (bit 32 the
// link), IM_INT_DISABLE its mask; IM_DOORBELL is one register per bit,
// and writing 1 to element i rings bit i of the peer's IM_INT_STATUS;
// IM_SPAD are this side's scratchpads, B2B_SPAD the peer's. The external
// BARs EMBAR1 and EMBAR2 (the secondary BARs) sit at the B2B addresses;
// the outbound side's EMBAR1XBASE (EMBAR2XBASE) puts its window there.
// Inbound, the peer's window lands at IMBAR1XBASE (IMBAR2XBASE) and is
// bounded twice, as Linux's intel_ntb3_mw_set_trans sets both: by
// IMBAR1XLMT, a limit on this side's own BAR 2 address plus the offset,
// and by EMBAR1XLMT, a limit on EMBAR1's B2B address plus the offset. A
// limit at or below its base closes the window.
func gen3Spec() *spec {
	rs := []reg{
		{name: "NTBCNTL", off: 0x0, width: 4, effects: true},
		{name: "IM_INT_STATUS", off: 0x40, width: 8, store: w1c(0x40, 8)},
		{name: "IM_INT_DISABLE", off: 0x48, width: 8},
	}
	for _, r := range []struct {
		name string
		off  uint32
	}{{"IMBAR1XBASE", 0x10}, {"IMBAR1XLMT", 0x18}, {"IMBAR2XBASE", 0x20}, {"IMBAR2XLMT", 0x28},
		{"EMBAR1XBASE", 0x4010}, {"EMBAR1XLMT", 0x4018}, {"EMBAR2XBASE", 0x4020}, {"EMBAR2XLMT", 0x4028},
		{"EMBAR1", 0x4518}, {"EMBAR2", 0x4520}} {
		rs = append(rs, reg{name: r.name, off: r.off, width: 8, effects: true})
	}
	rs = append(rs, imDoorbells(0x100)...)
	rs = append(rs, arrayRegs("IM_SPAD", 0x80, 4, 16, 4, func(int) reg { return reg{} })...)
	rs = append(rs, peerSpads("B2B_SPAD", 0x180)...)
	return &spec{
		regBAR:      64 << 10,
		winBARs:     []int{2, 4},
		regs:        rs,
		enabled:     func(s *Side) bool { return s.get(0x0, 4)&ntbCtlDisable == 0 },
		linkChanged: intelLink(0x40, 8, 1<<32, true),
		reset: func(s *Side) {
			s.put(0x4518, 8, b2bBar2|barType)
			s.put(0x4520, 8, b2bBar4|barType)
			s.put(0x4018, 8, b2bBar2) // external limits at their bases: closed
			s.put(0x4028, 8, b2bBar4)
			s.put(0x18, 8, barStart(s.idx, 2)) // internal limits at their bases
			s.put(0x28, 8, barStart(s.idx, 4))
			s.put(0x4010, 8, b2bBar2) // outbound translations to the peer's EMBARs
			s.put(0x4020, 8, b2bBar4)
			s.put(0x0, 4, 0x3)
			s.put(0x48, 8, ^uint64(0))
			s.cfg[0xd4] = 0x01 | byte(s.idx)<<4
		},
		route: func(src *Side, bar int) (uint64, uint64) {
			k := uint32(0)
			if bar == 4 {
				k = 0x10
			}
			p := src.Peer()
			bus, n := b2bRoute(src, bar, src.get(0x4010+k, 8), 0, p, 0x4518+k/2, 0x4018+k, 0x10+k, false)
			pstart, _ := p.BAR(bar)
			return bus, min(n, sub0(p.get(0x18+k, 8), pstart))
		},
	}
}

// imDoorbells is IM_DOORBELL: 32 registers, writing 1 to element i rings
// bit i of the peer's IM_INT_STATUS; they read as 0.
func imDoorbells(off uint32) []reg {
	return arrayRegs("IM_DOORBELL", off, 4, 32, 4, func(i int) reg {
		return reg{load: readZero, store: func(s *Side, v uint64) {
			if v&1 != 0 {
				p := s.Peer()
				p.put(0x40, 8, p.get(0x40, 8)|1<<i)
			}
		}}
	})
}

// peerSpads is an array that reaches the peer's IM_SPAD (at 0x80).
func peerSpads(name string, off uint32) []reg {
	return arrayRegs(name, off, 4, 16, 4, func(i int) reg {
		o := 0x80 + uint32(i)*4
		return reg{load: func(s *Side) uint64 { return s.Peer().get(o, 4) },
			store: func(s *Side, v uint64) { s.Peer().put(o, 4, v) }}
	})
}

// gen4 (Ice Lake, Sapphire Rapids): doorbells as gen3; EM_SPAD (0x8080)
// reaches the peer's scratchpads. Inbound, the peer's window lands at
// IM23XBASE (IM45XBASE), bounded by IM23XLMT, a limit on this side's own
// BAR 2 address plus the offset (Linux's intel_ntb4_mw_set_trans); the
// outbound translation is not software's (Linux programs none). The link
// (LINK_STATUS, in the BAR at 0xb052) is up when both sides have cleared
// LINK_CTRL's link-disable bit (0x10) and set PPD0's link-training bit
// (0x8); LINK_STATUS reads only. IM23XBASEIDX and IM45XBASEIDX (Ice Lake's
// window size, log2) are stored; the model bounds windows by the limit.
func gen4Spec() *spec {
	rs := []reg{
		{name: "NTBCNTL", off: 0x0, width: 4},
		{name: "IM_INT_STATUS", off: 0x40, width: 8, store: w1c(0x40, 8)},
		{name: "IM_INT_DISABLE", off: 0x48, width: 8},
		{name: "IM23XBASEIDX", off: 0x74, width: 2},
		{name: "IM45XBASEIDX", off: 0x76, width: 2},
		{name: "LINK_CTRL", off: 0xb050, width: 2, effects: true},
		{name: "LINK_STATUS", off: 0xb052, width: 2, load: func(s *Side) uint64 {
			if s.c.linkUp {
				return lnkUp
			}
			return 0
		}, store: func(*Side, uint64) {}},
		{name: "SLOTSTS", off: 0xb05a, width: 2, store: w1c(0xb05a, 2)},
		{name: "PPD0", off: 0xb0d4, width: 4, effects: true},
		{name: "PPD1", off: 0xb4c0, width: 4, store: func(*Side, uint64) {}},
	}
	for _, r := range []struct {
		name string
		off  uint32
	}{{"IM23XBASE", 0x10}, {"IM23XLMT", 0x18}, {"IM45XBASE", 0x20}, {"IM45XLMT", 0x28}} {
		rs = append(rs, reg{name: r.name, off: r.off, width: 8, effects: true})
	}
	rs = append(rs, imDoorbells(0x100)...)
	rs = append(rs, arrayRegs("IM_SPAD", 0x80, 4, 16, 4, func(int) reg { return reg{} })...)
	rs = append(rs, peerSpads("EM_SPAD", 0x8080)...)
	return &spec{
		regBAR:  64 << 10,
		winBARs: []int{2, 4},
		regs:    rs,
		enabled: func(s *Side) bool { return s.get(0xb050, 2)&0x10 == 0 && s.get(0xb0d4, 4)&0x8 != 0 },
		linkChanged: func(s *Side, up bool) {
			s.put(0x40, 8, s.get(0x40, 8)|1<<32)
			s.put(0xb05a, 2, s.get(0xb05a, 2)|0x100) // SLOTSTS: data link layer state changed
		},
		reset: func(s *Side) {
			s.put(0x18, 8, barStart(s.idx, 2))
			s.put(0x28, 8, barStart(s.idx, 4))
			s.put(0xb050, 2, 0x10)
			s.put(0xb4c0, 4, 0x200|uint64(s.idx)<<12) // PPD1: B2B, USD or DSD
			s.put(0x48, 8, ^uint64(0))
		},
		route: func(src *Side, bar int) (uint64, uint64) {
			k := uint32(0)
			if bar == 4 {
				k = 0x10
			}
			p := src.Peer()
			pstart, size := p.BAR(bar)
			return p.get(0x10+k, 8), min(size, sub0(p.get(0x18+k, 8), pstart))
		},
	}
}
