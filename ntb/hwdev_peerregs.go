//go:build linux

package ntb

// The peer's registers through a memory window (hw.Ops.PeerRegs): Intel
// gen1's way around its SDOORBELL lockup erratum, as Linux's ntb_hw_gen1
// (xeon_init_ntb, xeon_setup_b2b_mw): one window is reserved, its
// outbound translation lands on the peer's secondary register BAR, and
// the peer's doorbell and scratchpads are worked there at their own
// offsets. The facts are in package ntb/hw; this is the generic driver's
// part of it.

import (
	"fmt"
	"unsafe"

	"github.com/weft-io/weft/fabric"
	hwmap "github.com/weft-io/weft/ntb/hw"
)

// regTarget is where register accesses go: a RegIO where set, else
// loads and stores on b.
type regTarget struct {
	io RegIO
	b  []byte
}

func (t regTarget) load(r regLoc) uint64     { return loadReg(t.io, t.b, r) }
func (t regTarget) store(r regLoc, v uint64) { storeReg(t.io, t.b, r, v) }

// peerRegs is the reserved window, mapped at open (Linux maps it at
// probe, pci_iomap of XEON_B2B_MIN_SIZE bytes).
type peerRegs struct {
	regTarget // b: the part of the window that reaches the peer's registers
	m         Mapping
}

// peerRegsShare reads how the B2B set-up split the reserved window
// (PeerRegWindow.SizeCfg): 0 when the peer's registers take all of it,
// else the offset of its second half, which stays a client window
// (Linux's b2b_mw_share). Sizes that are neither are a set-up this
// driver does not know: fabric.ErrNotSupported.
func peerRegsShare(name string, m *hwmap.Map, p hwParts) (uint64, error) {
	pr := m.Ops.PeerRegs
	if pr == nil || pr.SizeCfg == 0 || p.cfg == nil {
		return 0, nil
	}
	if pr.Window < 0 || pr.Window >= len(m.Ops.Windows) {
		return 0, fmt.Errorf("ntb: hardware %s: the peer's registers through window %d of %d: %w", name, pr.Window, len(m.Ops.Windows), fabric.ErrInvalid)
	}
	var sec, pri [1]byte
	if n, err := p.cfg.ReadAt(sec[:], pr.SizeCfg); n != 1 {
		return 0, fmt.Errorf("ntb: hardware %s: configuration byte %#x (the B2B window's secondary size): %v: %w", name, pr.SizeCfg, err, fabric.ErrNotSupported)
	}
	if n, err := p.cfg.ReadAt(pri[:], pr.PrimarySizeCfg); n != 1 {
		return 0, fmt.Errorf("ntb: hardware %s: configuration byte %#x (the B2B window's primary size): %v: %w", name, pr.PrimarySizeCfg, err, fabric.ErrNotSupported)
	}
	bar := p.bars[m.Ops.Windows[pr.Window].BAR]
	switch {
	case sec[0] == 0:
		return 0, nil
	case pri[0] > 0 && sec[0] == pri[0]-1 && pri[0] < 64 && bar.Size() == 1<<pri[0] && bar.Size()/2 >= pr.Size:
		return bar.Size() / 2, nil
	}
	return 0, fmt.Errorf("ntb: hardware %s: the B2B window (BAR %d, %#x bytes) has secondary size 2^%d against primary 2^%d: "+
		"neither reserved whole for the peer's registers (0) nor shared (one less); the B2B set-up is not one this driver knows: %w",
		name, m.Ops.Windows[pr.Window].BAR, bar.Size(), sec[0], pri[0], fabric.ErrNotSupported)
}

// mapPeerRegs maps the window the map reserves for the peer's registers.
// A mapping that itself implements RegIO (a chip model's window) performs
// the accesses; a plain one is loaded and stored, like the register BAR.
func (d *HWDevice) mapPeerRegs(p hwParts) error {
	pr := d.o.PeerRegs
	if pr == nil {
		return nil
	}
	if pr.Window < 0 || pr.Window >= len(d.o.Windows) {
		return fmt.Errorf("ntb: hardware %s: the peer's registers through window %d of %d: %w", d.name, pr.Window, len(d.o.Windows), fabric.ErrInvalid)
	}
	bar := d.o.Windows[pr.Window].BAR
	if sz := p.bars[bar].Size(); sz < pr.Size {
		return fmt.Errorf("ntb: hardware %s: BAR %d of %#x bytes cannot reach the peer's %#x bytes of registers: %w", d.name, bar, sz, pr.Size, fabric.ErrInvalid)
	}
	if p.mapBAR == nil {
		return fmt.Errorf("ntb: hardware %s: BAR %d (the peer's registers) cannot be mapped: %w", d.name, bar, fabric.ErrNotSupported)
	}
	m, err := p.mapBAR(bar)
	if err != nil {
		return fmt.Errorf("ntb: hardware %s: BAR %d (the peer's registers): %w", d.name, bar, err)
	}
	b := m.Bytes()
	if uint64(len(b)) < pr.Size || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 != 0 {
		m.Close()
		return fmt.Errorf("ntb: hardware %s: BAR %d maps %d bytes, the peer's registers need %#x: %w", d.name, bar, len(b), pr.Size, fabric.ErrInvalid)
	}
	t := regTarget{b: b[:pr.Size:pr.Size]}
	if io, ok := m.(RegIO); ok {
		t.io = io
	}
	d.pregs = &peerRegs{regTarget: t, m: m}
	return nil
}

// peerReg locates element idx of the peer's register name in the
// reserved window, checked against the part of it that reaches the
// peer's registers.
func (d *HWDevice) peerReg(name string, idx int) (regLoc, error) {
	return d.locate(name, idx, 0, true)
}
