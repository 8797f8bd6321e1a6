// Package hw holds the register maps of hardware non-transparent bridges
// as typed tables: where a bridge keeps its doorbells, scratchpads (or
// message registers), window limits and translations, and how its fields
// encode. The facts come from public documentation — the register
// layouts that Linux's drivers/ntb/hw drivers and include/linux/switchtec.h
// document, and the vendors' datasheets they cite — and are written here
// as data; no driver code is copied.
//
// Status: these maps are UNTESTED ON HARDWARE. Their tests check what can
// be checked without a bridge: that registers are aligned and do not
// overlap, that arrays fit, that mirrored blocks (the peer's view, a
// switch port's global copy) sit where the layout says, and that field
// encodings round-trip, and that the driver tables (Ops) name registers
// the map has. Package ntb's HWDevice, one driver over these tables, is
// as untested on hardware, and is run end to end over behavioural models
// of each family's chip (package ntb/internal/chipmodel).
package hw

import (
	"fmt"
	"sort"

	"github.com/weft-io/weft/fabric"
)

// Reg is one register, or an array of Count registers Stride bytes apart.
type Reg struct {
	Name  string
	Off   uint32 // byte offset in the register BAR
	Width uint8  // bytes: 1, 2, 4 or 8
	// Count and Stride describe an array (Count 0 or 1: one register).
	Count  int
	Stride uint32
}

// End returns the offset just past the register (or the array's last
// element).
func (r Reg) End() uint32 {
	n := max(r.Count, 1)
	return r.Off + uint32(n-1)*r.Stride + uint32(r.Width)
}

// At returns the offset of element i of an array register.
func (r Reg) At(i int) (uint32, error) {
	if i < 0 || i >= max(r.Count, 1) {
		return 0, fmt.Errorf("hw: %s[%d]: %w", r.Name, i, fabric.ErrInvalid)
	}
	return r.Off + uint32(i)*r.Stride, nil
}

// Map is the register map of one bridge family and generation.
type Map struct {
	// Family is "intel", "amd", "idt" or "switchtec"; Gen the generation
	// within it.
	Family, Gen string
	// Vendor and Devices are the PCI IDs that select this map.
	Vendor  uint16
	Devices []uint16
	// RegBAR is the BAR that holds the registers (-1: configuration
	// space, as for IDT's NT function registers, which are also reachable
	// through BAR 0 when it is set up for configuration-space mode).
	RegBAR int
	// Regs are the registers this package knows, by name.
	Regs []Reg
	// DoorbellBits is the number of doorbell bits a client may use;
	// LinkBit is the doorbell bit the hardware uses for link events
	// (-1: none).
	DoorbellBits, LinkBit int
	// Scratchpads per side (IDT has none: its message registers are
	// Ops.Msg).
	Scratchpads int
	// PeerOffset is where the peer's mirror of the local register block
	// starts, relative to the local one (0: no mirror in this BAR).
	PeerOffset uint32
	// RegBARSize is the size of register BAR the map needs: the registers
	// it lists (and their peer mirror) fit, rounded up to a power of two;
	// Intel's is the 64 KiB its BAR 0 has. A smaller BAR is the wrong
	// device.
	RegBARSize uint64
	// Ops is how a generic driver works the bridge through these
	// registers (package ntb's hardware Device).
	Ops Ops
	// Source names the public layout the facts come from.
	Source string
}

// regsFit is the power of two that holds every register of the map and
// the peer's mirror of it.
func (m *Map) regsFit() uint64 {
	var end uint64
	for _, r := range m.Regs {
		e := uint64(r.End())
		if m.PeerOffset != 0 && r.Off < m.PeerOffset {
			e += uint64(m.PeerOffset)
		}
		end = max(end, e)
	}
	n := uint64(4096)
	for n < end {
		n <<= 1
	}
	return n
}

// Reg returns the register called name.
func (m *Map) Reg(name string) (Reg, bool) {
	for _, r := range m.Regs {
		if r.Name == name {
			return r, true
		}
	}
	return Reg{}, false
}

// DBValidMask is the mask of the doorbell bits a client may use: the
// map's DoorbellBits, or Ops.PeerRegs' where the peer is rung through a
// window.
func (m *Map) DBValidMask() uint64 {
	n := m.DoorbellBits
	if pr := m.Ops.PeerRegs; pr != nil {
		n = pr.DoorbellBits
	}
	if n >= 64 {
		return ^uint64(0)
	}
	return 1<<n - 1
}

// Maps returns every known register map.
func Maps() []*Map { return maps }

// Lookup returns the map for a PCI function's IDs; an unknown function is
// fabric.ErrNotSupported.
func Lookup(vendor, device uint16) (*Map, error) {
	for _, m := range maps {
		if m.Vendor != vendor {
			continue
		}
		for _, d := range m.Devices {
			if d == device {
				return m, nil
			}
		}
	}
	return nil, fmt.Errorf("hw: no NTB register map for %04x:%04x: %w", vendor, device, fabric.ErrNotSupported)
}

// sortRegs orders a map's registers by offset (init-time tidiness, so
// tests and dumps read in address order).
func sortRegs(m *Map) *Map {
	sort.SliceStable(m.Regs, func(i, j int) bool { return m.Regs[i].Off < m.Regs[j].Off })
	return m
}

func r32(name string, off uint32) Reg { return Reg{Name: name, Off: off, Width: 4} }
func r64(name string, off uint32) Reg { return Reg{Name: name, Off: off, Width: 8} }
func r16(name string, off uint32) Reg { return Reg{Name: name, Off: off, Width: 2} }
func arr(name string, off uint32, width uint8, n int, stride uint32) Reg {
	return Reg{Name: name, Off: off, Width: width, Count: n, Stride: stride}
}

var maps = []*Map{
	sortRegs(&Map{
		Family: "intel", Gen: "gen1 (Xeon JSF/SNB/IVT/HSX/BDX)", Vendor: 0x8086,
		Devices: []uint16{0x3725, 0x3726, 0x3727, 0x3c0d, 0x3c0e, 0x3c0f, 0x0e0d, 0x0e0e, 0x0e0f,
			0x2f0d, 0x2f0e, 0x2f0f, 0x6f0d, 0x6f0e, 0x6f0f},
		RegBAR: 0,
		Regs: []Reg{
			r64("PBAR23LMT", 0x00), r64("PBAR45LMT", 0x08),
			r64("PBAR23XLAT", 0x10), r64("PBAR45XLAT", 0x18),
			r64("SBAR23LMT", 0x20), r64("SBAR45LMT", 0x28),
			r64("SBAR23XLAT", 0x30), r64("SBAR45XLAT", 0x38),
			r64("SBAR0BASE", 0x40), r64("SBAR23BASE", 0x48), r64("SBAR45BASE", 0x50),
			r32("NTBCNTL", 0x58), r32("SBDF", 0x5c),
			r16("PDOORBELL", 0x60), r16("PDBMSK", 0x62), r16("SDOORBELL", 0x64), r16("SDBMSK", 0x66),
			r32("USMEMMISS", 0x70),
			arr("SPAD", 0x80, 4, 16, 4),
			arr("B2B_SPAD", 0x100, 4, 16, 4),
			r16("B2B_DOORBELL", 0x140), r32("B2B_XLAT_L", 0x144), r32("B2B_XLAT_U", 0x148),
		},
		// 15 doorbell bits, but bit 14 of B2B_DOORBELL is not mirrored
		// to the peer (NTB_HWERR_B2BDOORBELL_BIT14), so 14 on that path;
		// every part listed also has the SDOORBELL lockup erratum, for
		// which Linux rings the peer through a window instead, where all
		// 15 work (Ops.PeerRegs.DoorbellBits).
		DoorbellBits: 14, LinkBit: 15, Scratchpads: 16, RegBARSize: 64 << 10,
		Ops:    intelGen1Ops(),
		Source: "Linux drivers/ntb/hw/intel/ntb_hw_gen1.h, ntb_hw_gen1.c, ntb_hw_intel.h (device IDs)",
	}),
	sortRegs(&Map{
		Family: "intel", Gen: "gen3 (Skylake Xeon)", Vendor: 0x8086, Devices: []uint16{0x201c},
		RegBAR: 0,
		Regs: []Reg{
			r32("NTBCNTL", 0x0000),
			r64("IMBAR1XBASE", 0x0010), r64("IMBAR1XLMT", 0x0018),
			r64("IMBAR2XBASE", 0x0020), r64("IMBAR2XLMT", 0x0028),
			r64("IM_INT_STATUS", 0x0040), r64("IM_INT_DISABLE", 0x0048),
			r32("USMEMMISS", 0x0070),
			arr("IM_SPAD", 0x0080, 4, 16, 4),
			arr("IM_DOORBELL", 0x0100, 4, 32, 4), // one register per doorbell bit
			arr("B2B_SPAD", 0x0180, 4, 16, 4),
			r64("EMBAR0XBASE", 0x4008),
			r64("EMBAR1XBASE", 0x4010), r64("EMBAR1XLMT", 0x4018),
			r64("EMBAR2XBASE", 0x4020), r64("EMBAR2XLMT", 0x4028),
			r64("EM_INT_STATUS", 0x4040), r64("EM_INT_DISABLE", 0x4048),
			arr("EM_SPAD", 0x4080, 4, 16, 4),
			arr("EM_DOORBELL", 0x4100, 4, 32, 4),
			r16("SPCICMD", 0x4504),
			r64("EMBAR0", 0x4510), r64("EMBAR1", 0x4518), r64("EMBAR2", 0x4520),
		},
		DoorbellBits: 32, LinkBit: 32, Scratchpads: 16, PeerOffset: 0x4000, RegBARSize: 64 << 10,
		Ops:    intelGen3Ops(),
		Source: "Linux drivers/ntb/hw/intel/ntb_hw_gen3.h, ntb_hw_gen3.c",
	}),
	sortRegs(&Map{
		Family: "intel", Gen: "gen4 (Ice Lake / Sapphire Rapids Xeon)", Vendor: 0x8086, Devices: []uint16{0x347e},
		RegBAR: 0,
		Regs: []Reg{
			r32("NTBCNTL", 0x0000),
			r64("IM23XBASE", 0x0010), r64("IM23XLMT", 0x0018),
			r64("IM45XBASE", 0x0020), r64("IM45XLMT", 0x0028),
			r64("IM_INT_STATUS", 0x0040), r64("IM_INT_DISABLE", 0x0048),
			r16("IM23XBASEIDX", 0x0074), r16("IM45XBASEIDX", 0x0076),
			arr("IM_SPAD", 0x0080, 4, 16, 4),
			r32("IM_SPAD_SEM", 0x00c0), r32("IM_SPAD_STICKY", 0x00c4),
			arr("IM_DOORBELL", 0x0100, 4, 32, 4), // one register per doorbell bit
			arr("EM_SPAD", 0x8080, 4, 16, 4),
			r16("LINK_CTRL", 0xb050), r16("LINK_STATUS", 0xb052), r16("SLOTSTS", 0xb05a),
			r32("PPD0", 0xb0d4), r32("PPD1", 0xb4c0),
		},
		DoorbellBits: 32, LinkBit: 32, Scratchpads: 16, PeerOffset: 0x8000, RegBARSize: 64 << 10,
		Ops:    intelGen4Ops(),
		Source: "Linux drivers/ntb/hw/intel/ntb_hw_gen4.h, ntb_hw_gen4.c",
	}),
	sortRegs(&Map{
		Family: "amd", Gen: "Zeppelin", Vendor: 0x1022, Devices: []uint16{0x145b},
		RegBAR: 0, Regs: amdRegs(),
		// The 16 scratchpads are shared: each side uses half.
		DoorbellBits: 16, LinkBit: -1, Scratchpads: 8, PeerOffset: 0x400,
		Source: "Linux drivers/ntb/hw/amd/ntb_hw_amd.h, ntb_hw_amd.c (device IDs and windows)",
		Ops:    amdOps(1, 2, 4),
	}),
	sortRegs(&Map{
		Family: "amd", Gen: "later (148b, 14c0, 14c3)", Vendor: 0x1022, Devices: []uint16{0x148b, 0x14c0, 0x14c3},
		RegBAR: 0, Regs: amdRegs(),
		DoorbellBits: 16, LinkBit: -1, Scratchpads: 8, PeerOffset: 0x400,
		Source: "Linux drivers/ntb/hw/amd/ntb_hw_amd.h, ntb_hw_amd.c (device IDs and windows)",
		Ops:    amdOps(2, 4),
	}),
	sortRegs(&Map{
		Family: "amd", Gen: "Hygon", Vendor: 0x1d94, Devices: []uint16{0x145b},
		RegBAR: 0, Regs: amdRegs(),
		DoorbellBits: 16, LinkBit: -1, Scratchpads: 8, PeerOffset: 0x400,
		Source: "Linux drivers/ntb/hw/amd/ntb_hw_amd.c (device IDs): AMD's Zeppelin layout",
		Ops:    amdOps(1, 2, 4),
	}),
	sortRegs(&Map{
		Family: "idt", Gen: "89HPES*NT* (PCIe Gen2 switches)", Vendor: 0x111d,
		Devices: []uint16{0x8091, 0x808f, 0x8088, 0x8092, 0x8090, 0x808e, 0x808c, 0x808a},
		RegBAR:  0,
		Regs: []Reg{
			r32("PCICMDSTS", 0x004), arr("PCIBAR", 0x010, 4, 6, 4), r32("PCIELCAP", 0x04c), r32("PCIELCTLSTS", 0x050),
			r32("NTCTL", 0x400), r32("NTINTSTS", 0x404), r32("NTINTMSK", 0x408),
			r32("NTSDATA", 0x40c), r32("NTGSIGNAL", 0x410),
			r32("OUTDBELLSET", 0x420), r32("INDBELLSTS", 0x428), r32("INDBELLMSK", 0x42c),
			arr("OUTMSG", 0x430, 4, 4, 4), arr("INMSG", 0x440, 4, 4, 4), arr("INMSGSRC", 0x450, 4, 4, 4),
			r32("MSGSTS", 0x460), r32("MSGSTSMSK", 0x464),
			arr("BARSETUP", 0x470, 4, 6, 0x10), arr("BARLIMIT", 0x474, 4, 6, 0x10),
			arr("BARLTBASE", 0x478, 4, 6, 0x10), arr("BARUTBASE", 0x47c, 4, 6, 0x10),
			r32("NTMTBLADDR", 0x4d0), r32("NTMTBLSTS", 0x4d4), r32("NTMTBLDATA", 0x4d8), r32("REQIDCAP", 0x4dc),
			r32("LUTOFFSET", 0x4e0), r32("LUTLDATA", 0x4e4), r32("LUTMDATA", 0x4e8), r32("LUTUDATA", 0x4ec),
			r32("GASAADDR", 0xff8), r32("GASADATA", 0xffc),
		},
		// IDT has no scratchpads: four message registers per direction
		// (Ops.Msg). The 32 doorbell bits are global to the switch and
		// shared out between the NT partitions (package ntb's HWDevice).
		DoorbellBits: 32, LinkBit: -1, Scratchpads: 0,
		Ops:    idtOps(),
		Source: "Linux drivers/ntb/hw/idt/ntb_hw_idt.h, ntb_hw_idt.c; global doorbell masks: the 89HPES24NT6AG2 manual via T-Platforms' 2016 driver",
	}),
	sortRegs(&Map{
		Family: "switchtec", Gen: "PSX/PFX (Microsemi/Microchip)", Vendor: 0x11f8,
		// The NTB function is the switch's management endpoint; the
		// switchtec driver matches by class, so the IDs here are the
		// common Gen3 parts the driver lists.
		Devices: []uint16{0x8531, 0x8532, 0x8533, 0x8534, 0x8535, 0x8536, 0x8541, 0x8542, 0x8543, 0x8544, 0x8545, 0x8546,
			0x8551, 0x8552, 0x8553, 0x8554, 0x8555, 0x8556, 0x8561, 0x8562, 0x8563, 0x8564, 0x8565, 0x8566,
			0x8571, 0x8572, 0x8573, 0x8574, 0x8575, 0x8576},
		RegBAR: 0,
		Regs:   nil, // built by switchtecRegs
		// 64 doorbell bits shared by the two partitions, 32 each, of
		// which the top 4 are taken by message interrupts: 28. No
		// scratchpad registers: 128 are emulated in the shared window
		// (SwitchtecSharedSpads, Ops.Partition.SharedWindow).
		DoorbellBits: 28, LinkBit: -1, Scratchpads: 0,
		Ops:    switchtecOps(),
		Source: "Linux include/linux/switchtec.h (ntb_info_regs, ntb_ctrl_regs, ntb_dbmsg_regs), drivers/ntb/hw/mscc/ntb_hw_switchtec.c (shared window, partition operations)",
	}),
}

// amdRegs lists AMD's register block (one copy per map).
func amdRegs() []Reg {
	return []Reg{
		r32("CNTL", 0x200), r32("STA", 0x204), r32("PGSLV", 0x208), r32("SPAD_MUX", 0x20c),
		arr("SPAD", 0x210, 4, 16, 4),
		r32("RSMU_HCID", 0x250), r32("RSMU_SIID", 0x254),
		r32("PSION", 0x300), r32("SSION", 0x330),
		r32("MMINDEX", 0x400), r32("MMDATA", 0x404), r32("SIDEINFO", 0x408),
		r32("ROMBARLMT", 0x410), r32("BAR1LMT", 0x414), r64("BAR23LMT", 0x418), r64("BAR45LMT", 0x420),
		r64("POMBARXLAT", 0x428), r64("BAR1XLAT", 0x430), r64("BAR23XLAT", 0x438), r64("BAR45XLAT", 0x440),
		r16("DBFM", 0x450), r16("DBREQ", 0x454), r16("MIRRDBSTAT", 0x458), r16("DBMASK", 0x45c), r16("DBSTAT", 0x460),
		r32("INTMASK", 0x470), r32("INTSTAT", 0x474),
		r32("PMESTAT", 0x480), r32("PMSGTRIG", 0x490), r32("LTRLATENCY", 0x494), r32("FLUSHTRIG", 0x498),
		r32("SMUACK", 0x4a0), r32("SINRST", 0x4a4), r32("RSPNUM", 0x4a8), r32("SMU_SPADMUTEX", 0x4b0), r32("SMU_SPADOFFSET", 0x4b4),
	}
}

func init() {
	for _, m := range maps {
		if m.Family == "switchtec" {
			m.Regs = switchtecRegs()
		}
		if m.RegBARSize == 0 {
			m.RegBARSize = m.regsFit()
		}
	}
}
