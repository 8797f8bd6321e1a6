package hw

import (
	"fmt"
	"math/bits"

	"github.com/weft-io/weft/fabric"
)

// Switchtec: the NTB registers start at SwitchtecNTBOffset in BAR 0 (the
// global address space). One control block per partition, then one
// doorbell/message block per partition.
const (
	SwitchtecNTBOffset   = 0x10000
	SwitchtecCtrlOffset  = 0x4000  // from the NTB base
	SwitchtecDBMsgOffset = 0x64000 // from the NTB base
	SwitchtecCtrlStride  = 0x2000  // bytes of one partition's control block
	SwitchtecDBMsgStride = 0x4000  // bytes of one partition's doorbell block
	SwitchtecPartitions  = 48
)

// SwitchtecCtrl returns the BAR 0 offset of partition p's control block.
func SwitchtecCtrl(p int) (uint32, error) {
	if p < 0 || p >= SwitchtecPartitions {
		return 0, fmt.Errorf("hw: switchtec partition %d: %w", p, fabric.ErrInvalid)
	}
	return SwitchtecNTBOffset + SwitchtecCtrlOffset + uint32(p)*SwitchtecCtrlStride, nil
}

// SwitchtecDBMsg returns the BAR 0 offset of partition p's doorbell and
// message block.
func SwitchtecDBMsg(p int) (uint32, error) {
	if p < 0 || p >= SwitchtecPartitions {
		return 0, fmt.Errorf("hw: switchtec partition %d: %w", p, fabric.ErrInvalid)
	}
	return SwitchtecNTBOffset + SwitchtecDBMsgOffset + uint32(p)*SwitchtecDBMsgStride, nil
}

// switchtecRegs lists partition 0's registers (info, control, doorbells
// and messages); other partitions' blocks follow at the strides above.
func switchtecRegs() []Reg {
	const b = SwitchtecNTBOffset
	const c = b + SwitchtecCtrlOffset
	const d = b + SwitchtecDBMsgOffset
	return []Reg{
		{Name: "INFO_PARTITION_COUNT", Off: b + 0x0, Width: 1},
		{Name: "INFO_PARTITION_ID", Off: b + 0x1, Width: 1},
		r32("INFO_EP_MAP_LO", b+0x4), r32("INFO_EP_MAP_HI", b+0x8), // a packed u64
		r16("INFO_REQUESTER_ID", b+0xc),
		// ntp_info[48]: per partition, crosslink and target vector.
		arr("NTP_XLINK", b+0x20, 4, SwitchtecPartitions, 16),
		arr("NTP_TARGET_LO", b+0x24, 4, SwitchtecPartitions, 16),
		arr("NTP_TARGET_HI", b+0x28, 4, SwitchtecPartitions, 16),
		r32("PARTITION_STATUS", c+0x00), r32("PARTITION_OP", c+0x04), r32("PARTITION_CTRL", c+0x08),
		r32("BAR_SETUP", c+0x0c), r32("BAR_ERROR", c+0x10),
		r16("LUT_TABLE_ENTRIES", c+0x14), r16("LUT_TABLE_OFFSET", c+0x16), r32("LUT_ERROR", c+0x18),
		r16("REQ_ID_TABLE_SIZE", c+0x1c), r16("REQ_ID_TABLE_OFFSET", c+0x1e), r32("REQ_ID_ERROR", c+0x20),
		arr("BAR_ENTRY_CTL", c+0x40, 4, 6, 16), arr("BAR_ENTRY_WIN_SIZE", c+0x44, 4, 6, 16),
		arr("BAR_ENTRY_XLATE_ADDR", c+0x48, 8, 6, 16),
		arr("BAR_EXT_WIN_SIZE", c+0xa0, 4, 6, 16),
		arr("REQ_ID_TABLE", c+0x400, 4, 512, 4),
		arr("LUT_ENTRY", c+0x1000, 8, 512, 8),
		r64("ODB", d+0x1000), r64("ODB_MASK", d+0x1008), r64("IDB", d+0x1010), r64("IDB_MASK", d+0x1018),
		arr("IDB_VEC_MAP", d+0x1020, 1, 64, 1),
		r32("MSG_MAP", d+0x1060),
		arr("OMSG_MSG", d+0x1068, 4, 4, 8), arr("OMSG_STATUS", d+0x106c, 4, 4, 8),
		arr("IMSG_MSG", d+0x1088, 4, 4, 8), arr("IMSG_STATUS", d+0x108c, 1, 4, 8),
		arr("IMSG_MASK", d+0x108d, 1, 4, 8), arr("IMSG_SRC", d+0x108e, 1, 4, 8),
		arr("MSIX_TABLE", d+0x2000, 1, 1024, 1),
		arr("PBA", d+0x3000, 1, 24, 1),
	}
}

// IDT 89HPES*NT*: a port's NT function registers are also reachable in
// the switch's global space at IDTPortBase(port) plus the function's own
// offset.
func IDTPortBase(port int) (uint32, error) {
	if port < 0 || port >= 24 {
		return 0, fmt.Errorf("hw: IDT port %d: %w", port, fabric.ErrInvalid)
	}
	return 0x1000 + 0x2000*uint32(port), nil
}

// IDTPorts lists the NT-capable ports of each IDT switch by PCI device
// ID: the 89HPES24NT6AG2 of PCIeLINK has six.
var IDTPorts = map[uint16][]int{
	0x8091: {0, 2, 4, 6, 8, 12},         // 89HPES24NT6AG2
	0x808f: {0, 2, 4, 6, 8, 12, 16, 20}, // 89HPES32NT8AG2
	0x8088: {0, 2, 4, 6, 8, 12, 16, 20}, // 89HPES32NT8BG2
	0x8092: {0, 8, 16},                  // 89HPES12NT12G2
	0x8090: {0, 8, 12, 16},              // 89HPES16NT16G2
	0x808e: {0, 2, 4, 6, 8, 12, 16, 20}, // 89HPES24NT24G2
	0x808c: {0, 2, 4, 6, 8, 12, 16, 20}, // 89HPES32NT24AG2
	0x808a: {0, 2, 4, 6, 8, 12, 16, 20}, // 89HPES32NT24BG2
}

// IDT BARSETUP fields.
const (
	IDTBarSetupType64   = 0x00000004
	IDTBarSetupPref     = 0x00000008
	IDTBarSetupSizeMask = 0x000003f0
	IDTBarSetupSizeFld  = 4
	IDTBarSetupModeCfg  = 0x00000400
	IDTBarSetupATRANMsk = 0x00001800
	IDTBarSetupATRANFld = 11
	IDTBarSetupTPartMsk = 0x0000e000
	IDTBarSetupTPartFld = 13
	IDTBarSetupEnable   = 0x80000000
)

// IDT address translation modes of a BAR (the ATRAN field).
const (
	IDTTransDirect = 0 // one window, direct translation
	IDTTransLUT12  = 1 // a 12-entry lookup table of windows
	IDTTransLUT24  = 2 // a 24-entry lookup table
)

// IDTBarSetup is a decoded BARSETUP register.
type IDTBarSetup struct {
	Enable, Type64, Prefetch, ConfigSpace bool
	// Size is the BAR's size in bytes, a power of two (log2 in the
	// register's SIZE field).
	Size uint64
	// Trans is IDTTransDirect, IDTTransLUT12 or IDTTransLUT24.
	Trans uint8
	// TargetPartition is the partition the window translates into.
	TargetPartition uint8
}

// Encode returns the register value. A size that is not a power of two
// (or beyond the field), or an unknown mode or partition, is
// fabric.ErrInvalid.
func (s IDTBarSetup) Encode() (uint32, error) {
	if s.Size == 0 || s.Size&(s.Size-1) != 0 {
		return 0, fmt.Errorf("hw: IDT BAR size %#x is not a power of two: %w", s.Size, fabric.ErrInvalid)
	}
	lg := uint32(bits.TrailingZeros64(s.Size))
	if lg > IDTBarSetupSizeMask>>IDTBarSetupSizeFld || (!s.Type64 && lg > 31) {
		return 0, fmt.Errorf("hw: IDT BAR size 2^%d does not fit: %w", lg, fabric.ErrInvalid)
	}
	if s.Trans > IDTTransLUT24 || s.TargetPartition > 7 {
		return 0, fmt.Errorf("hw: IDT BAR mode %d partition %d: %w", s.Trans, s.TargetPartition, fabric.ErrInvalid)
	}
	v := lg<<IDTBarSetupSizeFld | uint32(s.Trans)<<IDTBarSetupATRANFld | uint32(s.TargetPartition)<<IDTBarSetupTPartFld
	if s.Enable {
		v |= IDTBarSetupEnable
	}
	if s.Type64 {
		v |= IDTBarSetupType64
	}
	if s.Prefetch {
		v |= IDTBarSetupPref
	}
	if s.ConfigSpace {
		v |= IDTBarSetupModeCfg
	}
	return v, nil
}

// DecodeIDTBarSetup decodes a BARSETUP register value (as read from the
// device, so any value decodes; Size is 0 for a SIZE field of 0).
func DecodeIDTBarSetup(v uint32) IDTBarSetup {
	lg := (v & IDTBarSetupSizeMask) >> IDTBarSetupSizeFld
	s := IDTBarSetup{
		Enable: v&IDTBarSetupEnable != 0, Type64: v&IDTBarSetupType64 != 0, Prefetch: v&IDTBarSetupPref != 0,
		ConfigSpace: v&IDTBarSetupModeCfg != 0, Trans: uint8((v & IDTBarSetupATRANMsk) >> IDTBarSetupATRANFld),
		TargetPartition: uint8((v & IDTBarSetupTPartMsk) >> IDTBarSetupTPartFld),
	}
	if lg > 0 && lg < 64 {
		s.Size = 1 << lg
	}
	return s
}

// IDTLUTOffset encodes the LUTOFFSET register: which lookup-table entry
// of which BAR the LUT data registers address.
func IDTLUTOffset(bar, index int) (uint32, error) {
	if bar < 0 || bar > 7 || index < 0 || index > 31 {
		return 0, fmt.Errorf("hw: IDT LUT bar %d index %d: %w", bar, index, fabric.ErrInvalid)
	}
	return uint32(index) | uint32(bar)<<8, nil
}

// IDTMappingEntry encodes an NT mapping table (NTMTBLDATA) entry that
// lets requester id (bus:device.function) of partition part through.
func IDTMappingEntry(reqID uint16, part int) (uint32, error) {
	if part < 0 || part > 7 {
		return 0, fmt.Errorf("hw: IDT partition %d: %w", part, fabric.ErrInvalid)
	}
	return 1 | uint32(reqID)<<1 | uint32(part)<<17, nil
}

// CheckTranslation applies ntb.h's rules for an inbound window
// translation (ntb_mw_set_trans against ntb_mw_get_align): the address
// and size aligned, the size within the window's maximum.
func CheckTranslation(addr, size, addrAlign, sizeAlign, sizeMax uint64) error {
	switch {
	case addrAlign == 0 || addrAlign&(addrAlign-1) != 0 || sizeAlign == 0:
		return fmt.Errorf("hw: alignment %#x/%#x: %w", addrAlign, sizeAlign, fabric.ErrInvalid)
	case addr%addrAlign != 0:
		return fmt.Errorf("hw: translation %#x is not aligned to %#x: %w", addr, addrAlign, fabric.ErrInvalid)
	case size == 0 || size%sizeAlign != 0:
		return fmt.Errorf("hw: window size %#x is not a multiple of %#x: %w", size, sizeAlign, fabric.ErrInvalid)
	case size > sizeMax:
		return fmt.Errorf("hw: window size %#x above the maximum %#x: %w", size, sizeMax, fabric.ErrBounds)
	case addr+size < addr:
		return fmt.Errorf("hw: translation %#x+%#x wraps: %w", addr, size, fabric.ErrBounds)
	}
	return nil
}
