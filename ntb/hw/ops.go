package hw

// Ops says, as data, how a generic driver works a bridge through its map:
// which registers hold the doorbells, scratchpads, window translations
// and link state, and the arithmetic of each. Register names refer to
// Map.Regs. One driver (package ntb's hardware Device) reads these tables
// for every family; what a family does differently is a field here, not
// a copy of the driver. The facts come from the same public layouts as
// the maps (Linux's drivers/ntb/hw), and are as untested on hardware.
type Ops struct {
	DB      DoorbellOps
	Spad    SpadOps
	Windows []Window
	Link    LinkOps
	// Side tells which side of the bridge this function is, where the
	// two sides use the registers differently (AMD: the primary and
	// secondary split the scratchpads); nil: the sides are alike.
	Side *SideRule
	// Partition is set for a partition of a switch (Switchtec): the
	// doorbell registers repeat per partition, and the side is which of
	// the two partitions is the lower.
	Partition *PartitionOps
	// Msg locates message registers, where the bridge has them and the
	// driver offers them (package ntb's Messenger); nil: none.
	Msg *MsgOps
	// PeerRegs is set where the peer's doorbell and scratchpads are not
	// reached through registers of this side's BAR but through one of
	// the memory windows, whose translation lands on the peer's own
	// register BAR (Intel gen1 on the parts with the SDOORBELL lockup
	// erratum); nil: DB.Ring and Spad.Peer are this side's registers.
	PeerRegs *PeerRegWindow
	// Global, where set, is the indirect window into a switch's global
	// registers (IDT GASAADDR/GASADATA), through which a function reaches
	// the switch's port and partition registers and its peer's.
	Global *GlobalOps
	// BARScan: the windows are not fixed by the map but read at open
	// from each BAR's set-up register (IDT BARSETUP, IDTScanWindows);
	// Windows is then empty.
	BARScan bool
	// BarAlignRevs is the range of PCI revisions (inclusive) whose
	// windows need translations aligned to the window's size, with its
	// log2 written to each Window.Log2Reg (Intel Ice Lake); zero: none.
	BarAlignRevs [2]uint8
}

// DoorbellOps locates the doorbells.
type DoorbellOps struct {
	// Status holds the local doorbell bits: read them; write ones to
	// clear them.
	Status string
	// Mask masks local doorbell bits: a set bit masks, or with
	// MaskEnables (Switchtec) a set bit enables and the driver writes
	// the complement.
	Mask        string
	MaskEnables bool
	// Ring rings the peer: the bits are written to it; with RingPerBit
	// it is an array of one register per bit and ringing bit i writes 1
	// to element i (Intel gen3, gen4).
	Ring       string
	RingPerBit bool
	// RingMask, where set, gates the bits this side may ring; the
	// driver enables them there at open (Switchtec ODB_MASK).
	RingMask string
	// Shift places each side's bits in shared registers: on side s the
	// local bits sit Shift[s].Local bits up Status and Mask, and the
	// peer's Shift[s].Peer bits up Ring (Switchtec: the two partitions
	// share 64 bits, the lower partition taking the low half).
	Shift [2]struct{ Local, Peer uint }
}

// PeerRegWindow reserves a memory window through which this side works
// the peer's registers, as Linux's ntb_hw_gen1 does on every Xeon part it
// lists (xeon_init_dev sets NTB_HWERR_SDOORBELL_LOCKUP: a write to
// SDOORBELL or B2B_DOORBELL with inbound traffic to the NTB's registers
// may hang the system; xeon_init_ntb then uses the peer's own registers
// through b2b_mw_idx). The window's outbound translation points at the
// peer's secondary register BAR (SB01BASE), so offset o of the window is
// the peer's register at o: ringing the peer is writing its own doorbell
// status register, which a write from the link side sets rather than
// clears. The reserved window is no client's: the driver's windows are
// the others, in order (Linux decrements mw_count and skips b2b_idx).
//
// The B2B set-up that makes the window land there (the secondary BARs'
// sizes and bases, the outbound translation, B2B_XLAT) is not the
// driver's: it is the state Linux's probe (xeon_setup_b2b_mw) or the
// platform leaves, which HWDevice relies on.
type PeerRegWindow struct {
	// Window is the reserved window's index in Ops.Windows.
	Window int
	// Size is how many bytes at the window's start reach the peer's
	// registers (the secondary register BAR: XEON_B2B_MIN_SIZE, 32 KiB).
	Size uint64
	// Ring is the peer's register written with the bits to ring it, and
	// Spad the peer's scratchpad array, both at their offsets in the
	// map (the peer's own PDOORBELL and SPAD).
	Ring, Spad string
	// DoorbellBits is the number of doorbell bits a client may use on
	// this path: the peer's doorbell register is written directly, so
	// B2B_DOORBELL's bit-14 erratum does not apply (Linux: db_count =
	// XEON_DB_COUNT, 15).
	DoorbellBits int
	// SizeCfg and PrimarySizeCfg are the configuration-space bytes that
	// hold log2 of the window's secondary and primary BAR sizes (gen1
	// SBAR45SZ 0xd3, PBAR45SZ 0xd1). They tell how the B2B set-up split
	// the window (Linux's xeon_setup_b2b_mw): a secondary size of 0, the
	// whole window reaches the peer's registers (Linux's default); one
	// less than the primary, its first half does and its second half,
	// the peer's secondary BAR at the B2B address plus half, stays a
	// client window in its place (b2b_mw_share). Anything else is a
	// set-up the driver does not know, and it refuses to open. SizeCfg
	// 0: not read, the whole window.
	SizeCfg, PrimarySizeCfg int64
}

// SpadOps locates the scratchpads.
type SpadOps struct {
	// Local is the array this side's scratchpads are in, Peer the array
	// through which it reaches the peer's; "" where there is none.
	Local, Peer string
	// Halves: Local and Peer are one array that the sides split, side 0
	// taking the first Map.Scratchpads elements (AMD).
	Halves bool
}

// GlobalOps locates a global address space access pair: Addr takes the
// global register's address, then Data reads or writes it. Max is the
// highest address; global registers are 4 bytes wide and aligned.
type GlobalOps struct {
	Addr, Data string
	Max        uint32
}

// LimitRule is how a window's limit register is computed.
type LimitRule uint8

// Limit rules.
const (
	// LimitBasePlusSize: the window's base address plus the size (Intel
	// gen3, gen4).
	LimitBasePlusSize LimitRule = iota
	// LimitZeroWhenFull: base plus size, or 0 (no limit) when the size
	// is the whole window (Intel gen1).
	LimitZeroWhenFull
	// LimitSize: the size itself (AMD).
	LimitSize
)

// Window is one memory window: the BAR through which this side writes
// into the peer, and the registers that translate the peer's writes
// through its own window into this side's memory.
type Window struct {
	// BAR is the window's BAR.
	BAR int
	// Xlat takes the translated (bus) address; Limit ends the window by
	// Rule. An empty Xlat means this side cannot translate its inbound
	// window (IDT and Switchtec configure translation on the outbound
	// side or through switch-global operations).
	Xlat, Limit string
	Rule        LimitRule
	// Base is the register that holds the window's base address (its
	// low 4 bits are flags); "" means the window BAR's own bus address.
	Base string
	// AtPeer: Xlat and Limit are written in the peer's mirror of the
	// block, Map.PeerOffset up (AMD).
	AtPeer bool
	// MirrorLimit is a second limit set by the same rule from its own
	// base register MirrorBase (Intel gen3: the external side's limit).
	MirrorLimit, MirrorBase string
	// AddrAlign is the alignment of the translated address; 0 means the
	// window's size. SizeAlign is that of the size (0: 1).
	AddrAlign, SizeAlign uint64
	// Log2Reg takes log2 of the window's size on the revisions in
	// Ops.BarAlignRevs (Intel Ice Lake).
	Log2Reg string
}

// LinkOps locates the link state and the writes that enable or disable
// this side of the link.
type LinkOps struct {
	// Status is the register whose UpBits, all set, mean the link is up;
	// with Status empty and ConfigOff set, it is ConfigWidth bytes at
	// ConfigOff in the function's configuration space. Neither: the map
	// cannot tell (IDT, Switchtec: their link state is switch-global).
	Status      string
	ConfigOff   int64
	ConfigWidth int
	UpBits      uint64
	// AtPeer: Status is read in the peer's mirror (AMD: the peer's
	// SIDEINFO says it is ready).
	AtPeer bool
	// Enable and Disable are read-modify-writes, in order.
	Enable, Disable []Update
}

// Update is a read-modify-write of a register: v = v&^Clear | Set (Clear
// all ones writes Set whole). AtPeer writes the peer's mirror.
type Update struct {
	Reg        string
	Set, Clear uint64
	AtPeer     bool
}

// SideRule reads the side: side 1 when Reg has any of Bits.
type SideRule struct {
	Reg  string
	Bits uint64
}

// PartitionOps describes a switch partition (Switchtec).
type PartitionOps struct {
	// Self is the register holding this partition's number; EPMap (Lo
	// and Hi, a split 64-bit map) has a bit per partition with an NT
	// endpoint, the peer being the lowest other one.
	Self, EPMapLo, EPMapHi string
	// Count is the number of partitions; DBStride how far apart the
	// partitions' doorbell blocks are.
	Count    int
	DBStride uint32
	// TargetLo and TargetHi (a split 64-bit vector per partition,
	// TargetStride apart) name the partition this one's NT function
	// targets, where the switch's configuration says (Switchtec's
	// ntp_info); without a target the peer is the other endpoint of a
	// two-partition switch.
	TargetLo, TargetHi string
	TargetStride       uint32
	// CtrlStride is how far apart the partitions' control blocks are:
	// a window is configured in the peer's block (Switchtec).
	CtrlStride uint32
	// SharedWindow: the scratchpads and the link state are not
	// registers but a region of each side's memory that the peer reaches
	// through a lookup-table entry of its window, set up by partition
	// operations on the peer's control block (Switchtec; the layout and
	// operations are in switchtec.go).
	SharedWindow bool
}

// MsgOps locates message registers (Linux's ntb_msg_*): Count registers
// each way; In holds an inbound message, Out sends. Their status is kept
// one of two ways:
//
//   - per register (Switchtec): InStatus[i] holds Full while register i
//     holds a message (write Full to clear), InMask masks it; Route is
//     the receiving side's routing register (MSG_MAP: a byte per inbound
//     register naming the sending partition and outbound register), read
//     in the peer's block to find where a message will land before it is
//     sent, so a full register is never written;
//   - in one register (IDT): Status has a bit per inbound register that
//     holds a message at InShift up, and a bit per outbound register
//     whose last message was refused (the peer's register was full) at
//     OutShift up, both cleared by writing ones; Mask masks them; Src
//     holds the partition each inbound message came from. The sender
//     finds out after the write, from its failure bit.
type MsgOps struct {
	Count             int
	In, InStatus, Out string
	InMask            string
	Route             string
	Full              uint64
	Src               string
	Status, Mask      string
	InShift, OutShift uint
}

// PCIe Link Status "data link layer link active" (LNKSTS bit 13), as
// Intel's NTB reports it.
const linkActive = 0x2000

// Intel NTBCNTL bits (ntb_hw_intel.h).
const (
	intelCtlCfgLock = 1 << 0
	intelCtlDisable = 1 << 1
	intelSnoop24    = 1<<2 | 1<<4 | 1<<6 | 1<<8 // BAR2 and BAR4 snoop, both directions
)

// Gen1's secondary register BAR, reached through the B2B window
// (XEON_B2B_MIN_SIZE: "the peer ntb secondary config space is 32KB fixed
// size"), and the doorbell bits on the window path (XEON_DB_COUNT).
const (
	gen1B2BRegSize = 0x8000
	gen1DBCount    = 15
)

// intelGen1Ops is Linux's B2B path on the parts with the SDOORBELL
// lockup erratum (all the gen1 parts it lists): the peer's PDOORBELL and
// SPAD through the last window (b2b_mw_idx -1, the default), whole or
// shared as the configuration space's BAR sizes say. DB.Ring and
// Spad.Peer name B2B_DOORBELL and B2B_SPAD, the path for parts without
// the erratum, which PeerRegs overrides.
func intelGen1Ops() Ops {
	return Ops{
		DB:   DoorbellOps{Status: "PDOORBELL", Mask: "PDBMSK", Ring: "B2B_DOORBELL"},
		Spad: SpadOps{Local: "SPAD", Peer: "B2B_SPAD"},
		PeerRegs: &PeerRegWindow{Window: 1, Size: gen1B2BRegSize, Ring: "PDOORBELL", Spad: "SPAD",
			DoorbellBits: gen1DBCount, SizeCfg: 0xd3, PrimarySizeCfg: 0xd1},
		Windows: []Window{
			{BAR: 2, Xlat: "SBAR23XLAT", Limit: "SBAR23LMT", Base: "SBAR23BASE", Rule: LimitZeroWhenFull},
			{BAR: 4, Xlat: "SBAR45XLAT", Limit: "SBAR45LMT", Base: "SBAR45BASE", Rule: LimitZeroWhenFull},
		},
		Link: LinkOps{ConfigOff: 0x1a2, ConfigWidth: 2, UpBits: linkActive,
			Enable:  []Update{{Reg: "NTBCNTL", Set: intelSnoop24, Clear: intelCtlDisable | intelCtlCfgLock}},
			Disable: []Update{{Reg: "NTBCNTL", Set: intelCtlDisable | intelCtlCfgLock, Clear: intelSnoop24}}},
	}
}

func intelGen3Ops() Ops {
	return Ops{
		DB:   DoorbellOps{Status: "IM_INT_STATUS", Mask: "IM_INT_DISABLE", Ring: "IM_DOORBELL", RingPerBit: true},
		Spad: SpadOps{Local: "IM_SPAD", Peer: "B2B_SPAD"},
		Windows: []Window{
			{BAR: 2, Xlat: "IMBAR1XBASE", Limit: "IMBAR1XLMT", MirrorLimit: "EMBAR1XLMT", MirrorBase: "EMBAR1"},
			{BAR: 4, Xlat: "IMBAR2XBASE", Limit: "IMBAR2XLMT", MirrorLimit: "EMBAR2XLMT", MirrorBase: "EMBAR2"},
		},
		Link: LinkOps{ConfigOff: 0x1a2, ConfigWidth: 2, UpBits: linkActive,
			Enable:  []Update{{Reg: "NTBCNTL", Set: intelSnoop24, Clear: intelCtlDisable | intelCtlCfgLock}},
			Disable: []Update{{Reg: "NTBCNTL", Set: intelCtlDisable | intelCtlCfgLock, Clear: intelSnoop24}}},
	}
}

// Gen4 NTBCNTL snoop bits (E2I/I2E for BAR23 and BAR45), LINK_CTRL's
// link-disable bit and PPD0's link-training bit (ntb_hw_gen4.h).
const (
	gen4Snoop       = 0x4 | 0x10 | 0x40 | 0x100
	gen4LinkDisable = 0x10
	gen4PPDLinkTrn  = 0x8
)

func intelGen4Ops() Ops {
	return Ops{
		DB:   DoorbellOps{Status: "IM_INT_STATUS", Mask: "IM_INT_DISABLE", Ring: "IM_DOORBELL", RingPerBit: true},
		Spad: SpadOps{Local: "IM_SPAD", Peer: "EM_SPAD"},
		Windows: []Window{
			{BAR: 2, Xlat: "IM23XBASE", Limit: "IM23XLMT", AddrAlign: 4096, Log2Reg: "IM23XBASEIDX"},
			{BAR: 4, Xlat: "IM45XBASE", Limit: "IM45XLMT", AddrAlign: 4096, Log2Reg: "IM45XBASEIDX"},
		},
		Link: LinkOps{Status: "LINK_STATUS", UpBits: linkActive,
			Enable: []Update{{Reg: "NTBCNTL", Set: gen4Snoop, Clear: ^uint64(0)},
				{Reg: "LINK_CTRL", Clear: gen4LinkDisable}, {Reg: "PPD0", Set: gen4PPDLinkTrn}},
			Disable: []Update{{Reg: "NTBCNTL", Clear: gen4Snoop}, {Reg: "LINK_CTRL", Set: gen4LinkDisable}}},
		// Ice Lake (revisions 2 to 0xf of 347e) aligns translations to
		// the window and takes its log2 in IMxxXBASEIDX.
		BarAlignRevs: [2]uint8{0x2, 0xf},
	}
}

// AMD CNTL's register-access enables (PMM_REG_CTL, SMM_REG_CTL) and
// SIDEINFO's bits (ntb_hw_amd.h).
const (
	amdRegCtl    = 1<<21 | 1<<20
	amdSideMask  = 1 << 0
	amdSideReady = 1 << 1
)

// amdOps gives the AMD operations for a part whose windows are bars.
func amdOps(bars ...int) Ops {
	o := Ops{
		DB:   DoorbellOps{Status: "DBSTAT", Mask: "DBMASK", Ring: "DBREQ"},
		Spad: SpadOps{Local: "SPAD", Peer: "SPAD", Halves: true},
		Link: LinkOps{Status: "SIDEINFO", UpBits: amdSideReady, AtPeer: true,
			Enable:  []Update{{Reg: "CNTL", Set: amdRegCtl}, {Reg: "SIDEINFO", Set: amdSideReady}},
			Disable: []Update{{Reg: "CNTL", Clear: amdRegCtl}, {Reg: "SIDEINFO", Clear: amdSideReady}}},
		Side: &SideRule{Reg: "SIDEINFO", Bits: amdSideMask},
	}
	for _, b := range bars {
		w := Window{BAR: b, Rule: LimitSize, AtPeer: true, AddrAlign: 4096}
		switch b {
		case 1:
			w.Xlat, w.Limit = "BAR1XLAT", "BAR1LMT"
		case 2:
			w.Xlat, w.Limit = "BAR23XLAT", "BAR23LMT"
		case 4:
			w.Xlat, w.Limit = "BAR45XLAT", "BAR45LMT"
		}
		o.Windows = append(o.Windows, w)
	}
	return o
}

// idtOps: doorbells in the NT function's own registers (their routing
// between partitions is switch-global, set up by the driver through
// Global: see package ntb's HWDevice); four message registers and no
// scratchpads; windows found from the BAR set-up; the link and the
// translations are worked on the switch's global registers.
func idtOps() Ops {
	return Ops{
		DB: DoorbellOps{Status: "INDBELLSTS", Mask: "INDBELLMSK", Ring: "OUTDBELLSET"},
		Msg: &MsgOps{Count: 4, In: "INMSG", Out: "OUTMSG", Src: "INMSGSRC", Status: "MSGSTS", Mask: "MSGSTSMSK",
			InShift: IDTMsgInShift, OutShift: IDTMsgOutShift},
		Global:  &GlobalOps{Addr: "GASAADDR", Data: "GASADATA", Max: IDTGlobalMax},
		BARScan: true,
	}
}

func switchtecOps() Ops {
	o := Ops{
		DB: DoorbellOps{Status: "IDB", Mask: "IDB_MASK", MaskEnables: true, Ring: "ODB", RingMask: "ODB_MASK"},
		// Direct windows in BAR 2 and 4; their translation is a
		// partition operation on the peer's control block.
		Windows: []Window{{BAR: 2}, {BAR: 4}},
		Partition: &PartitionOps{Self: "INFO_PARTITION_ID", EPMapLo: "INFO_EP_MAP_LO", EPMapHi: "INFO_EP_MAP_HI",
			Count: SwitchtecPartitions, DBStride: SwitchtecDBMsgStride,
			TargetLo: "NTP_TARGET_LO", TargetHi: "NTP_TARGET_HI", TargetStride: 16,
			CtrlStride: SwitchtecCtrlStride, SharedWindow: true},
		// Scratchpads are emulated in the shared window (SpadCount comes
		// from there, not from Spad).
		Msg: &MsgOps{Count: SwitchtecMessages, In: "IMSG_MSG", InStatus: "IMSG_STATUS", InMask: "IMSG_MASK",
			Out: "OMSG_MSG", Route: "MSG_MAP", Full: SwitchtecMsgFull},
	}
	o.DB.Shift[0].Peer = 32  // the lower partition: local bits low, the peer's high
	o.DB.Shift[1].Local = 32 // the higher: the reverse
	return o
}
