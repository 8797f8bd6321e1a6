//go:build linux

package ntb

// IDT 89HPES*NT* switches: what the generic driver does through the
// switch's global registers. Each NT function is one HWDevice with one
// peer NT function (another port, in another partition); a process may
// open several. The facts are Linux's drivers/ntb/hw/idt (see package
// ntb/hw); the register sequences beside Linux's are in the issue 27
// note.
//
// Translation: on IDT the translation of a window is a register of the
// NT function whose BAR it is, the outbound side (Linux sets it with
// ntb_peer_mw_set_trans, after the peer has sent its buffer's address by
// message). Weft's Device has the inbound side set it (MWSetTrans: "the
// peer's writes through its window land in my memory"), so here the side
// that owns the memory writes the peer NT function's BARSETUP (target
// partition), BARLTBASE/BARUTBASE and BARLIMIT, or its lookup-table
// entry, through the global address space, where every function's
// configuration registers are mapped. The two sides never write the same
// registers: each programs only its peer's windows, and only its own
// GASA pair.

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/weft-io/weft/fabric"
	hwmap "github.com/weft-io/weft/ntb/hw"
)

const allOnes32 = 0xffffffff

// idtState is what open found out about the switch.
type idtState struct {
	port, part         int
	peerPort, peerPart int
	peerBase           uint32            // the peer function's registers in the global space
	out, in            []hwmap.IDTWindow // this function's windows (outbound), the peer's (inbound)
	barMap             [6]Mapping        // outbound BARs mapped by PeerMW
	mtMu               sync.Mutex        // orders the NT mapping table's address/data pair
	ntParts            []int             // the active NT partitions, ascending (doorbell shares)
}

func (d *HWDevice) idtErr(err error, format string, args ...any) error {
	return fmt.Errorf("ntb: hardware %s: "+format+": %w", append(append([]any{d.name}, args...), err)...)
}

// nload and nstore access the function's own registers by name.
func (d *HWDevice) nload(name string, idx int) (uint32, error) {
	r, err := d.reg(name, idx, 0)
	if err != nil {
		return 0, err
	}
	return uint32(d.load(r)), nil
}

func (d *HWDevice) nstore(name string, idx int, v uint32) error {
	r, err := d.reg(name, idx, 0)
	if err != nil {
		return err
	}
	d.store(r, uint64(v))
	return nil
}

// gload and gstore access a switch-global register through the
// GASAADDR/GASADATA pair.
func (d *HWDevice) gload(addr uint32) (uint32, error) {
	a, dt, err := d.gasa(addr)
	if err != nil {
		return 0, err
	}
	d.gmu.Lock()
	defer d.gmu.Unlock()
	d.store(a, uint64(addr))
	return uint32(d.load(dt)), nil
}

func (d *HWDevice) gstore(addr, v uint32) error {
	a, dt, err := d.gasa(addr)
	if err != nil {
		return err
	}
	d.gmu.Lock()
	defer d.gmu.Unlock()
	d.store(a, uint64(addr))
	d.store(dt, uint64(v))
	return nil
}

func (d *HWDevice) gasa(addr uint32) (regLoc, regLoc, error) {
	g := d.o.Global
	if g == nil {
		return regLoc{}, regLoc{}, fmt.Errorf("ntb: hardware %s: no global registers: %w", d.name, fabric.ErrNotSupported)
	}
	if addr > g.Max || addr%4 != 0 {
		return regLoc{}, regLoc{}, fmt.Errorf("ntb: hardware %s: global register %#x (highest %#x, 4-aligned): %w", d.name, addr, g.Max, fabric.ErrBounds)
	}
	a, err := d.reg(g.Addr, 0, 0)
	if err != nil {
		return regLoc{}, regLoc{}, err
	}
	dt, err := d.reg(g.Data, 0, 0)
	return a, dt, err
}

// gload1 is gload that refuses all ones: what an absent or hung device
// reads, never a valid value of the registers it is used on.
func (d *HWDevice) gload1(addr uint32, what string) (uint32, error) {
	v, err := d.gload(addr)
	if err == nil && v == allOnes32 {
		err = d.idtErr(fabric.ErrMalformed, "%s (global %#x) reads all ones: the switch is absent or hung", what, addr)
	}
	return v, err
}

// peerAddr is the global address of the peer function's register name.
func (d *HWDevice) peerAddr(name string, idx int) (uint32, error) {
	r, ok := d.m.Reg(name)
	if !ok {
		return 0, d.idtErr(fabric.ErrNotSupported, "no register %q", name)
	}
	off, err := r.At(idx)
	if err != nil {
		return 0, err
	}
	return d.idt.peerBase + off, nil
}

func (d *HWDevice) peerLoad(name string, idx int) (uint32, error) {
	a, err := d.peerAddr(name, idx)
	if err != nil {
		return 0, err
	}
	return d.gload(a)
}

func (d *HWDevice) peerStore(name string, idx int, v uint32) error {
	a, err := d.peerAddr(name, idx)
	if err != nil {
		return err
	}
	return d.gstore(a, v)
}

type idtPeer struct{ port, part int }

// idtOpen checks the NT function's set-up as Linux's probe does
// (idt_check_setup, idt_scan_ports, idt_scan_mws), picks the peer, shares
// out the doorbells and enables bus mastering (idt_init_pci). Every
// value read is checked before use: all ones (absent, hung) or a
// geometry no switch has is fabric.ErrMalformed.
func (d *HWDevice) idtOpen(p hwParts, c HWConfig) error {
	ports, ok := hwmap.IDTPorts[p.device]
	if !ok {
		return d.idtErr(fabric.ErrNotSupported, "IDT device %04x has no known NT port list", p.device)
	}
	s0, err := d.nload("BARSETUP", 0)
	if err != nil {
		return err
	}
	if s0 == allOnes32 {
		return d.idtErr(fabric.ErrMalformed, "BARSETUP0 reads all ones: the switch is absent or hung")
	}
	if bs := hwmap.DecodeIDTBarSetup(s0); !bs.Enable || !bs.ConfigSpace || bs.Size != 1<<hwmap.IDTBarSetupSizeCfg {
		return d.idtErr(fabric.ErrInvalid, "BAR 0 does not map the NT function's registers (BARSETUP0 %#08x)", s0)
	}
	lcap, err := d.nload("PCIELCAP", 0)
	if err != nil {
		return err
	}
	port := int(lcap >> hwmap.IDTPCIELCapPortFld)
	if lcap == allOnes32 || !slices.Contains(ports, port) {
		return d.idtErr(fabric.ErrMalformed, "PCIELCAP %#08x names port %d, not an NT port of this switch %v", lcap, port, ports)
	}
	st := &idtState{port: port}
	a, _ := hwmap.IDTSwPortSts(port)
	v, err := d.gload1(a, "this port's status")
	if err != nil {
		return err
	}
	ps := hwmap.DecodeIDTPortStatus(v)
	if !ps.NT() {
		return d.idtErr(fabric.ErrMalformed, "port %d status %#08x: mode %d has no NT function", port, v, ps.Mode)
	}
	st.part = ps.Partition
	var peers []idtPeer
	for _, q := range ports {
		if q == port {
			continue
		}
		a, _ := hwmap.IDTSwPortSts(q)
		v, err := d.gload1(a, "a port's status")
		if err != nil {
			return err
		}
		qs := hwmap.DecodeIDTPortStatus(v)
		if !qs.NT() {
			continue
		}
		a, _ = hwmap.IDTSwPartSts(qs.Partition)
		pv, err := d.gload1(a, "a partition's status")
		if err != nil {
			return err
		}
		if pv&hwmap.IDTPartStsStateMask != hwmap.IDTPartStsActive {
			continue
		}
		if qs.Partition == st.part {
			return d.idtErr(fabric.ErrMalformed, "ports %d and %d are NT functions of one partition %d", port, q, st.part)
		}
		peers = append(peers, idtPeer{q, qs.Partition})
	}
	i := slices.IndexFunc(peers, func(x idtPeer) bool { return c.PeerPort == 0 || x.port == c.PeerPort })
	if i < 0 {
		return d.idtErr(fabric.ErrNotSupported, "port %d (partition %d): no active NT peer (asked for port %d) among %v", port, st.part, c.PeerPort, peers)
	}
	st.peerPort, st.peerPart = peers[i].port, peers[i].part
	st.peerBase, _ = hwmap.IDTPortBase(st.peerPort)
	st.ntParts = []int{st.part}
	for _, x := range peers {
		if !slices.Contains(st.ntParts, x.part) {
			st.ntParts = append(st.ntParts, x.part)
		}
	}
	slices.Sort(st.ntParts)

	// Windows: this function's from its own BARSETUP, which must match
	// the BARs the OS sized; the peer's through the global space.
	var setup [6]uint32
	for b := range setup {
		if setup[b], err = d.nload("BARSETUP", b); err != nil {
			return err
		}
	}
	if st.out, err = hwmap.IDTScanWindows(setup); err != nil {
		return d.idtErr(err, "this function's BARs")
	}
	for _, w := range st.out {
		if r := p.bars[w.BAR]; !r.IsMem() || r.Size() != w.BARSize {
			return d.idtErr(fabric.ErrInvalid, "BAR %d is %#x bytes (flags %#x), its BARSETUP says %#x", w.BAR, r.Size(), r.Flags, w.BARSize)
		}
	}
	d.idt = st
	for b := range setup {
		if setup[b], err = d.peerLoad("BARSETUP", b); err != nil {
			d.idt = nil
			return err
		}
	}
	if st.in, err = hwmap.IDTScanWindows(setup); err != nil {
		d.idt = nil
		return d.idtErr(err, "the peer port %d's BARs", st.peerPort)
	}
	if err := d.idtDoorbells(); err != nil {
		d.idt = nil
		return err
	}
	cmd, err := d.nload("PCICMDSTS", 0)
	if err == nil {
		err = d.nstore("PCICMDSTS", 0, cmd&0xffff|hwmap.IDTPCICmdBME)
	}
	if err != nil {
		d.idt = nil
	}
	return err
}

// idtDoorbells shares the switch's 32 global doorbell bits between the
// active NT partitions: the k-th (ascending) receives bits
// [k*w, (k+1)*w), w = 32/n, and any NT partition may ring any of them.
// Every function computes the same layout from the same switch state, so
// the global masks they write agree. (Linux leaves these masks to the
// EEPROM; with them open, a doorbell also rings its sender.)
func (d *HWDevice) idtDoorbells() error {
	st := d.idt
	n := len(st.ntParts)
	w := 32 / n
	var nt uint32
	for _, p := range st.ntParts {
		nt |= 1 << p
	}
	for b := range 32 {
		in, out := uint32(allOnes32), uint32(allOnes32)
		if k := b / w; k < n {
			in, out = ^uint32(1<<st.ntParts[k]), ^nt
		}
		if err := d.gstore(hwmap.IDTGIDBELLMSK0+4*uint32(b), in); err != nil {
			return err
		}
		if err := d.gstore(hwmap.IDTGODBELLMSK0+4*uint32(b), out); err != nil {
			return err
		}
	}
	d.valid = 1<<w - 1
	d.dbLocal = uint(slices.Index(st.ntParts, st.part) * w)
	d.dbPeer = uint(slices.Index(st.ntParts, st.peerPart) * w)
	return nil
}

// idtRelease unmaps the outbound BARs and clears bus mastering
// (idt_deinit_pci); nil for other families.
func (d *HWDevice) idtRelease() error {
	if d.idt == nil {
		return nil
	}
	var errs []error
	if cmd, err := d.nload("PCICMDSTS", 0); err == nil {
		errs = append(errs, d.nstore("PCICMDSTS", 0, cmd&0xffff&^hwmap.IDTPCICmdBME))
	}
	d.mu.Lock()
	for i, m := range d.idt.barMap {
		if m != nil {
			errs = append(errs, m.Close())
			d.idt.barMap[i] = nil
		}
	}
	d.mu.Unlock()
	return errors.Join(errs...)
}

// Messages: message idx goes to the peer's inbound register idx
// (idt_ntb_peer_msg_write sets the route, then writes).
func (d *HWDevice) idtRoute(idx int) error {
	if d.idt == nil {
		return nil
	}
	a, err := hwmap.IDTSwMsgCtl(d.idt.part, idx)
	if err != nil {
		return err
	}
	v, err := hwmap.IDTMsgRoute(idx, d.idt.peerPart)
	if err != nil {
		return err
	}
	return d.gstore(a, v)
}

// Link (idt_ntb_local_link_enable/disable, idt_ntb_link_is_up).

func (d *HWDevice) idtLink(up bool) error {
	if d.closed.Load() {
		return d.errClosed()
	}
	st := d.idt
	var ctl, entry uint32
	if up {
		ctl = hwmap.IDTNTCtlCPEn
		reqid, err := d.nload("REQIDCAP", 0)
		if err != nil {
			return err
		}
		if entry, err = hwmap.IDTMappingEntry(uint16(reqid&hwmap.IDTReqIDMask), st.part); err != nil {
			return err
		}
	}
	if err := d.nstore("NTCTL", 0, ctl); err != nil {
		return err
	}
	st.mtMu.Lock()
	err := d.nstore("NTMTBLADDR", 0, uint32(st.part))
	if err == nil {
		err = d.nstore("NTMTBLDATA", 0, entry)
	}
	st.mtMu.Unlock()
	if err != nil {
		return err
	}
	// Signal the other partitions, as Linux does, so their drivers look
	// at the link again.
	if err := d.nstore("NTGSIGNAL", 0, hwmap.IDTNTGSignalSet); err != nil {
		return err
	}
	return d.gstore(hwmap.IDTSEGSIGSTS, 1<<st.part)
}

func (d *HWDevice) idtMapping(part int) (uint32, error) {
	d.idt.mtMu.Lock()
	defer d.idt.mtMu.Unlock()
	if err := d.nstore("NTMTBLADDR", 0, uint32(part)); err != nil {
		return 0, err
	}
	return d.nload("NTMTBLDATA", 0)
}

// idtLinkUp: this side's bus mastering, completion translation and
// mapping-table entry, and the peer port's PCIe link and the same three.
// A register reading all ones (absent, hung) is a link down.
func (d *HWDevice) idtLinkUp() bool {
	st := d.idt
	ok := true
	check := func(v uint32, err error, bit uint32) {
		if err != nil || v == allOnes32 || v&bit == 0 {
			ok = false
		}
	}
	v, err := d.nload("PCICMDSTS", 0)
	check(v, err, hwmap.IDTPCICmdBME)
	v, err = d.nload("NTCTL", 0)
	check(v, err, hwmap.IDTNTCtlCPEn)
	v, err = d.idtMapping(st.part)
	check(v, err, hwmap.IDTMTblValid)
	if !ok {
		return false
	}
	a, _ := hwmap.IDTSwPortSts(st.peerPort)
	v, err = d.gload(a)
	check(v, err, hwmap.IDTPortStsLinkUp)
	v, err = d.peerLoad("PCICMDSTS", 0)
	check(v, err, hwmap.IDTPCICmdBME)
	v, err = d.peerLoad("NTCTL", 0)
	check(v, err, hwmap.IDTNTCtlCPEn)
	v, err = d.idtMapping(st.peerPart)
	check(v, err, hwmap.IDTMTblValid)
	return ok
}

// Windows.

func (d *HWDevice) idtWindow(ws []hwmap.IDTWindow, widx int) (hwmap.IDTWindow, error) {
	if widx < 0 || widx >= len(ws) {
		return hwmap.IDTWindow{}, fmt.Errorf("ntb: hardware %s: memory window %d of %d: %w", d.name, widx, len(ws), fabric.ErrInvalid)
	}
	if d.closed.Load() {
		return hwmap.IDTWindow{}, d.errClosed()
	}
	return ws[widx], nil
}

// idtAlign is Linux's idt_scan_mws: translations 4-byte aligned, a
// direct window of any size up to its BAR's, a lookup-table window of
// exactly its slot.
func idtAlign(w hwmap.IDTWindow) (addrAlign, sizeAlign, sizeMax uint64) {
	if w.Trans == hwmap.IDTTransDirect {
		return 4, 1, w.Size
	}
	return 4, w.Size, w.Size
}

func (d *HWDevice) idtGetAlign(widx int) (uint64, uint64, uint64, error) {
	w, err := d.idtWindow(d.idt.in, widx)
	if err != nil {
		return 0, 0, 0, err
	}
	a, s, m := idtAlign(w)
	return a, s, m, nil
}

// idtSetTrans: the peer's outbound window widx lands in this side's
// memory at addr. Arguments are checked before any register is written.
func (d *HWDevice) idtSetTrans(widx int, addr, size uint64) error {
	w, err := d.idtWindow(d.idt.in, widx)
	if err != nil {
		return err
	}
	bus, err := d.memBus(widx, addr, size)
	if err != nil {
		return err
	}
	aa, sa, smax := idtAlign(w)
	if err := hwmap.CheckTranslation(bus, size, aa, sa, smax); err != nil {
		return fmt.Errorf("ntb: hardware %s: window %d: %w", d.name, widx, err)
	}
	return d.idtTrans(widx, w, bus, size)
}

func (d *HWDevice) idtClearTrans(widx int) error {
	w, err := d.idtWindow(d.idt.in, widx)
	if err != nil {
		return err
	}
	return d.idtTrans(widx, w, 0, 0)
}

// idtTrans writes the peer function's translation of window w: a direct
// window's target partition, base and limit (idt_ntb_peer_mw_set_trans;
// size 0 closes it with a zero limit, as idt_ntb_peer_mw_clear_trans),
// or a lookup-table entry.
func (d *HWDevice) idtTrans(widx int, w hwmap.IDTWindow, bus, size uint64) error {
	st := d.idt
	d.mu.Lock()
	defer d.mu.Unlock()
	if w.Trans != hwmap.IDTTransDirect {
		off, err := hwmap.IDTLUTOffset(w.BAR, w.Index)
		if err != nil {
			return err
		}
		var ud uint32
		if size != 0 {
			// The window lands in this side's partition.
			if ud, err = hwmap.IDTLUTUData(st.part); err != nil {
				return err
			}
		} else {
			bus = 0
		}
		for _, x := range []struct {
			r string
			v uint32
		}{{"LUTOFFSET", off}, {"LUTLDATA", uint32(bus)}, {"LUTMDATA", uint32(bus >> 32)}, {"LUTUDATA", ud}} {
			if err := d.peerStore(x.r, 0, x.v); err != nil {
				return err
			}
		}
		return nil
	}
	limit := func(v uint64) error {
		if err := d.peerStore("BARLIMIT", w.BAR, uint32(v)); err != nil {
			return err
		}
		if w.Type64 {
			return d.peerStore("BARLIMIT", w.BAR+1, uint32(v>>32))
		}
		return nil
	}
	if size == 0 {
		return limit(0)
	}
	setup, err := d.peerLoad("BARSETUP", w.BAR)
	if err != nil {
		return err
	}
	if setup == allOnes32 || setup&hwmap.IDTBarSetupEnable == 0 {
		return d.idtErr(fabric.ErrMalformed, "window %d: the peer's BARSETUP%d reads %#08x", widx, w.BAR, setup)
	}
	base, err := d.peerLoad("PCIBAR", w.BAR)
	if err != nil {
		return err
	}
	barBus := uint64(base &^ 0xf)
	if w.Type64 {
		hi, err := d.peerLoad("PCIBAR", w.BAR+1)
		if err != nil {
			return err
		}
		barBus |= uint64(hi) << 32
	}
	lim := barBus + size
	if lim < barBus || (!w.Type64 && lim > allOnes32) || barBus%w.BARSize != 0 {
		return d.idtErr(fabric.ErrMalformed, "window %d: the peer's BAR %d at %#x cannot hold %#x bytes", widx, w.BAR, barBus, size)
	}
	setup = setup&^hwmap.IDTBarSetupTPartMsk | uint32(st.part)<<hwmap.IDTBarSetupTPartFld
	if err := d.peerStore("BARSETUP", w.BAR, setup); err != nil {
		return err
	}
	if err := d.peerStore("BARLTBASE", w.BAR, uint32(bus)); err != nil {
		return err
	}
	if err := d.peerStore("BARUTBASE", w.BAR, uint32(bus>>32)); err != nil {
		return err
	}
	lo, err1 := d.peerLoad("BARLTBASE", w.BAR)
	hi, err2 := d.peerLoad("BARUTBASE", w.BAR)
	if got := uint64(hi)<<32 | uint64(lo); err1 != nil || err2 != nil || got != bus {
		limit(0)
		return d.idtErr(fabric.ErrInvalid, "window %d: the switch did not take the translation %#x (read back %#x)", widx, bus, got)
	}
	return limit(lim)
}

// idtPeerMW maps this function's outbound window widx: its slot of the
// BAR, and of a direct window only as far as the limit the peer set
// (none set: fabric.ErrInvalid).
func (d *HWDevice) idtPeerMW(widx int) ([]byte, error) {
	w, err := d.idtWindow(d.idt.out, widx)
	if err != nil {
		return nil, err
	}
	n := w.Size
	if w.Trans == hwmap.IDTTransDirect {
		lim, err := d.nload("BARLIMIT", w.BAR)
		if err != nil {
			return nil, err
		}
		base, err := d.nload("PCIBAR", w.BAR)
		if err != nil {
			return nil, err
		}
		if base == allOnes32 || base&1 != 0 {
			return nil, d.idtErr(fabric.ErrMalformed, "window %d: BAR %d reads %#08x, not a memory BAR (absent or hung?)", widx, w.BAR, base)
		}
		l, b := uint64(lim), uint64(base&^0xf)
		if w.Type64 {
			lh, err1 := d.nload("BARLIMIT", w.BAR+1)
			bh, err2 := d.nload("PCIBAR", w.BAR+1)
			if err := errors.Join(err1, err2); err != nil {
				return nil, err
			}
			l, b = l|uint64(lh)<<32, b|uint64(bh)<<32
		}
		if l <= b {
			return nil, fmt.Errorf("ntb: hardware %s: peer memory window %d has no translation (limit %#x, BAR at %#x): %w", d.name, widx, l, b, fabric.ErrInvalid)
		}
		n = min(n, l-b)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.idt.barMap[w.BAR]
	if m == nil {
		if m, err = d.mapBAR(w.BAR); err != nil {
			return nil, fmt.Errorf("ntb: hardware %s: window %d (BAR %d): %w", d.name, widx, w.BAR, err)
		}
		d.idt.barMap[w.BAR] = m
	}
	b := m.Bytes()
	lo := uint64(w.Index) * w.Size
	if uint64(len(b)) < lo+w.Size {
		return nil, fmt.Errorf("ntb: hardware %s: window %d: BAR %d mapping of %#x bytes, the window ends at %#x: %w", d.name, widx, w.BAR, len(b), lo+w.Size, fabric.ErrBounds)
	}
	return b[lo : lo+n : lo+n], nil
}
