package hw

// Switchtec's partition operations and shared window, as data. The
// facts are from Linux include/linux/switchtec.h (ntb_ctrl_regs and its
// enum of operations, statuses and bits; ntb_dbmsg_regs' message status
// bits) and drivers/ntb/hw/mscc/ntb_hw_switchtec.c (the shared window's
// layout, struct shared_mw, its magic and the 64 KiB lookup-table entry
// size). No code is copied.

// Partition operations, written to PARTITION_OP of a partition's control
// block (NTB_CTRL_PART_OP_*).
const (
	SwitchtecOpLock  = 0x1
	SwitchtecOpCfg   = 0x2
	SwitchtecOpReset = 0x3
)

// Partition statuses, read in the low 16 bits of PARTITION_STATUS
// (NTB_CTRL_PART_STATUS_*): an operation in progress shows Locking,
// Configuring or Resetting until it ends in Normal or Locked.
const (
	SwitchtecStatusNormal      = 0x1
	SwitchtecStatusLocked      = 0x2
	SwitchtecStatusLocking     = 0x3
	SwitchtecStatusConfiguring = 0x4
	SwitchtecStatusResetting   = 0x5
	SwitchtecStatusMask        = 0xffff
)

// BAR_ENTRY_CTL bits: the entry is a BAR of the partition's NT endpoint
// (read only), its direct window is enabled, its lookup-table windows are
// enabled; the lookup table's log2 entry size sits at bit 8, its entry
// count less one at bit 14.
const (
	SwitchtecBarValid      = 1 << 0
	SwitchtecBarDirWinEn   = 1 << 4
	SwitchtecBarLUTWinEn   = 1 << 5
	SwitchtecBarLUTSizeFld = 8
	SwitchtecBarLUTCntFld  = 14
	// SwitchtecBarKeep are the bits a lookup-table set-up keeps (Linux
	// keeps the low byte).
	SwitchtecBarKeep = 0xff
)

// Other control-block bits: a lookup-table entry or requester-ID entry is
// enabled by bit 0 (the LUT entry's target partition at bit 1, the
// requester ID at bit 16); PARTITION_CTRL's bit 0 turns off the
// requester-ID protection.
const (
	SwitchtecLUTEn        = 1 << 0
	SwitchtecLUTPartFld   = 1
	SwitchtecReqIDEn      = 1 << 0
	SwitchtecReqIDFld     = 16
	SwitchtecIDProtDis    = 1 << 0
	SwitchtecWinSizeLow   = 0xfffff000 // BAR_ENTRY_WIN_SIZE: the size's bits; below them log2 of the size
	SwitchtecXlatePartMsk = 0xfff      // BAR_ENTRY_XLATE_ADDR: the target partition below the 4 KiB-aligned address
)

// Message registers: the inbound status byte's bit 0 says the register
// holds a message (write 1 to clear); the mask byte's bit 0 is written
// with it at set-up. MSG_MAP has a byte per inbound register: the
// sending partition's outbound register index, and its partition number
// at bit 2.
const (
	SwitchtecMsgFull    = 1 << 0
	SwitchtecMsgMask    = 1 << 0
	SwitchtecMsgMapPart = 2
	SwitchtecMessages   = 4
)

// The shared window: Linux's driver gives each partition a 64 KiB buffer
// of its own memory that the peer reaches through lookup-table entry 0 of
// the peer's first window BAR. It holds a magic number, the link state
// this side sets, its partition number, the sizes of its windows and 128
// emulated scratchpads (struct shared_mw, naturally aligned).
const (
	SwitchtecLUTSize       = 64 << 10
	SwitchtecSharedMagic   = 0x45CC0001
	SwitchtecSharedMagicAt = 0x0   // u32; with LinkAt, one 64-bit load
	SwitchtecSharedLinkAt  = 0x4   // u32: nonzero when this side enabled the link
	SwitchtecSharedPartAt  = 0x8   // u32
	SwitchtecSharedMWAt    = 0x10  // u64 window sizes
	SwitchtecSharedMWs     = 128   // window sizes
	SwitchtecSharedSpadAt  = 0x410 // u32 scratchpads
	SwitchtecSharedSpads   = 128
)
