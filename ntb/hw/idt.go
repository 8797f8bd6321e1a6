package hw

import (
	"fmt"

	"github.com/weft-io/weft/fabric"
)

// IDT 89HPES*NT* switch-global registers, reached through an NT
// function's GASAADDR/GASADATA pair (global address space access). The
// addresses and fields are those of Linux's drivers/ntb/hw/idt/
// ntb_hw_idt.h (IDT_SW_*); the global doorbell masks are from the IDT
// 89HPES24NT6AG2 user manual as T-Platforms' first IDT driver (2016,
// ntb_hw_idt_regmap.h) lists them. A port's NT function registers are
// also in the global space, at IDTPortBase(port) plus their own offset.
const (
	// IDTGlobalMax is the highest global register address (Linux
	// IDT_REG_SW_MAX); global registers are DWORDs, 4-byte aligned.
	IDTGlobalMax = 0x3fffc

	idtSwPartCtl0 = 0x3e100 // SWPART0CTL; SWPARTxSTS is 4 up
	idtSwPortCtl0 = 0x3e200 // SWPORT0CTL; SWPORTxSTS is 4 up
	idtSwStride   = 0x20    // per partition, per port number

	// IDTSEGSIGSTS is the switch event global signal status: a bit per
	// partition, written to notify the other partitions of a link change.
	IDTSEGSIGSTS = 0x3ec30
	// IDTGDBELLSTS is the global doorbell status.
	IDTGDBELLSTS = 0x3ec3c
	// IDTGODBELLMSK0 is the first of 32 global outbound doorbell masks
	// (one per doorbell bit, a bit per partition that may NOT ring it);
	// IDTGIDBELLMSK0 the first of 32 global inbound masks (a bit per
	// partition that does NOT receive it).
	IDTGODBELLMSK0 = 0x3ed00
	IDTGIDBELLMSK0 = 0x3ed80
	idtSwMsgCtl0   = 0x3ee00 // SWP0MSGCTL0: 4 per partition, 0x20 per message register
)

// IDT field values (ntb_hw_idt.h).
const (
	IDTPCICmdBME        = 0x4        // PCICMDSTS bus master enable
	IDTPCIELCapPortFld  = 24         // PCIELCAP: the port number, bits 31:24
	IDTNTCtlCPEn        = 0x2        // NTCTL completion translation enable
	IDTNTGSignalSet     = 0x1        // NTGSIGNAL: signal the other partitions
	IDTPortStsLinkUp    = 0x10       // SWPORTxSTS link up
	IDTPortStsModeMask  = 0x3c0      // SWPORTxSTS port mode
	IDTPortStsModeFld   = 6          //
	IDTPortStsPartMask  = 0x1c00     // SWPORTxSTS partition
	IDTPortStsPartFld   = 10         //
	IDTPartStsStateMask = 0x60       // SWPARTxSTS state
	IDTPartStsActive    = 0x20       // SWPARTxSTS state: active
	IDTMsgCtlRegMask    = 0x3        // SWPxMSGCTL: the peer's inbound register
	IDTMsgCtlPartFld    = 4          // SWPxMSGCTL: the peer partition, bits 6:4
	IDTLUTUDataValid    = 0x80000000 // LUTUDATA valid
	IDTLUTUDataPartMask = 0xf        // LUTUDATA partition
	IDTMTblValid        = 0x1        // NTMTBLDATA valid
	IDTReqIDMask        = 0xffff     // REQIDCAP requester id
	IDTBarSetupSizeCfg  = 12         // BAR 0 in configuration-space mode is 2^12 bytes
	IDTPartitions       = 8
	IDTMsgInShift       = 16 // MSGSTS: inbound message bits 19:16
	IDTMsgOutShift      = 0  // MSGSTS: outbound failure bits 3:0
)

// IDT port modes (SWPORTxSTS MODE): those with an NT function.
const (
	IDTModeNT      = 3
	IDTModeUSNT    = 4
	IDTModeUSNTDMA = 7
	IDTModeNTDMA   = 8
)

// IDTSwPartSts returns the global address of partition part's status
// register (SWPARTxSTS).
func IDTSwPartSts(part int) (uint32, error) {
	if part < 0 || part >= IDTPartitions {
		return 0, fmt.Errorf("hw: IDT partition %d: %w", part, fabric.ErrInvalid)
	}
	return idtSwPartCtl0 + idtSwStride*uint32(part) + 4, nil
}

// IDTSwPortSts returns the global address of port's status register
// (SWPORTxSTS).
func IDTSwPortSts(port int) (uint32, error) {
	if port < 0 || port >= 24 {
		return 0, fmt.Errorf("hw: IDT port %d: %w", port, fabric.ErrInvalid)
	}
	return idtSwPortCtl0 + idtSwStride*uint32(port) + 4, nil
}

// IDTSwMsgCtl returns the global address of partition part's routing
// register for its outbound message register msg (SWPxMSGCTLy).
func IDTSwMsgCtl(part, msg int) (uint32, error) {
	if part < 0 || part >= IDTPartitions || msg < 0 || msg > 3 {
		return 0, fmt.Errorf("hw: IDT partition %d message %d: %w", part, msg, fabric.ErrInvalid)
	}
	return idtSwMsgCtl0 + 4*uint32(part) + 0x20*uint32(msg), nil
}

// IDTMsgRoute encodes a SWPxMSGCTL value: the outbound message goes to
// inbound register reg of partition part.
func IDTMsgRoute(reg, part int) (uint32, error) {
	if reg < 0 || reg > IDTMsgCtlRegMask || part < 0 || part >= IDTPartitions {
		return 0, fmt.Errorf("hw: IDT message route to register %d of partition %d: %w", reg, part, fabric.ErrInvalid)
	}
	return uint32(reg) | uint32(part)<<IDTMsgCtlPartFld, nil
}

// IDTLUTUData encodes a valid LUTUDATA value translating into partition
// part.
func IDTLUTUData(part int) (uint32, error) {
	if part < 0 || part >= IDTPartitions {
		return 0, fmt.Errorf("hw: IDT LUT partition %d: %w", part, fabric.ErrInvalid)
	}
	return uint32(part) | IDTLUTUDataValid, nil
}

// IDTPortStatus is a decoded SWPORTxSTS.
type IDTPortStatus struct {
	LinkUp    bool
	Mode      uint8
	Partition int
}

// DecodeIDTPortStatus decodes a SWPORTxSTS value (any value decodes).
func DecodeIDTPortStatus(v uint32) IDTPortStatus {
	return IDTPortStatus{LinkUp: v&IDTPortStsLinkUp != 0, Mode: uint8((v & IDTPortStsModeMask) >> IDTPortStsModeFld),
		Partition: int((v & IDTPortStsPartMask) >> IDTPortStsPartFld)}
}

// NT reports whether the port's mode has an NT function.
func (s IDTPortStatus) NT() bool {
	switch s.Mode {
	case IDTModeNT, IDTModeUSNT, IDTModeUSNTDMA, IDTModeNTDMA:
		return true
	}
	return false
}

// IDTWindow is one memory window of an NT function, as a BAR's set-up
// gives it: a direct window is the whole BAR, a lookup-table BAR holds
// 12 or 24 windows of a 16th or a 32nd of it each.
type IDTWindow struct {
	BAR, Index int
	Trans      uint8 // IDTTransDirect, IDTTransLUT12, IDTTransLUT24
	Type64     bool
	// Size is the window's size (its largest translation); BARSize the
	// BAR's.
	Size, BARSize uint64
}

// IDTWindowsMax is the most windows one NT function can have (Linux
// IDT_MAX_NR_MWS).
const IDTWindowsMax = 29

// IDTScanWindows lists the memory windows that the six BARSETUP values
// set up (Linux idt_scan_mws): disabled BARs and BAR 0's configuration
// space are skipped, a 64-bit BAR takes the next one as its upper half.
// A set-up no switch can have (an unknown translation mode, a BAR below
// 4 KiB or beyond its addressing, a 64-bit BAR 5, a lookup table in a
// BAR other than 2 or 4) is fabric.ErrMalformed: a register read from an
// absent or hung device (all ones) gives it.
func IDTScanWindows(setup [6]uint32) ([]IDTWindow, error) {
	var ws []IDTWindow
	for b := 0; b < 6; b++ {
		v := setup[b]
		if v == 0xffffffff {
			return nil, fmt.Errorf("hw: IDT BARSETUP%d reads all ones (device absent or hung): %w", b, fabric.ErrMalformed)
		}
		if v&IDTBarSetupEnable == 0 {
			continue
		}
		s := DecodeIDTBarSetup(v)
		lg := (v & IDTBarSetupSizeMask) >> IDTBarSetupSizeFld
		bad := func(why string) ([]IDTWindow, error) {
			return nil, fmt.Errorf("hw: IDT BARSETUP%d %#08x: %s: %w", b, v, why, fabric.ErrMalformed)
		}
		if s.Type64 && b == 5 {
			return bad("a 64-bit BAR 5 has no upper half")
		}
		if s.ConfigSpace {
			if s.Type64 {
				b++
			}
			continue
		}
		switch {
		case s.Trans > IDTTransLUT24:
			return bad("unknown translation mode")
		case lg < 12 || (!s.Type64 && lg > 31) || lg > 62:
			return bad("impossible size")
		case s.Trans != IDTTransDirect && b != 2 && b != 4:
			return bad("a lookup table outside BAR 2 and 4")
		}
		n, div := 1, uint64(1)
		switch s.Trans {
		case IDTTransLUT12:
			n, div = 12, 16
		case IDTTransLUT24:
			n, div = 24, 32
		}
		for i := range n {
			if len(ws) >= IDTWindowsMax {
				return bad("more windows than an NT function has")
			}
			ws = append(ws, IDTWindow{BAR: b, Index: i, Trans: s.Trans, Type64: s.Type64, Size: s.Size / div, BARSize: s.Size})
		}
		if s.Type64 {
			b++
		}
	}
	return ws, nil
}
