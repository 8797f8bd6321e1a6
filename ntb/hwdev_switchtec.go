//go:build linux

package ntb

// Switchtec (Microsemi/Microchip PSX/PFX) in the generic HWDevice: what
// the family keeps outside plain registers. A partition's windows are
// configured by partition operations on the peer's control block (lock,
// write the BAR entry or lookup-table entry, configure, wait for the
// status); the scratchpads and the link state are a 64 KiB region of each
// side's memory that the peer reaches through lookup-table entry 0 of its
// first window BAR. The facts are Linux's (include/linux/switchtec.h,
// drivers/ntb/hw/mscc/ntb_hw_switchtec.c), written as data in package
// ntb/hw; ntb/internal/chipmodel models the switch for the tests.

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/shm"
	"github.com/weft-io/weft/internal/spin"
	hwmap "github.com/weft-io/weft/ntb/hw"
)

// defaultOpTimeout bounds a partition operation when HWConfig.OpTimeout
// is 0. Linux's driver polls for up to 50 s (1000 polls 50 ms apart); a
// switch that takes a second has failed for Weft's purposes.
const defaultOpTimeout = 2 * time.Second

// swState is a Switchtec partition's state beyond the register map.
type swState struct {
	selfCtl, peerCtl uint32 // added to partition 0's control registers
	peerDB           uint32 // added to partition 0's doorbell-block registers
	timeout          time.Duration

	shared     []byte // this side's shared region, in HWConfig.Memory
	sharedOff  int    // its offset there: Memory() is what precedes it
	sharedBus  uint64
	peerShared []byte // the peer's, through LUT entry 0 of window 0's BAR

	winOff, winSize []uint64 // each window's place in its BAR
	peerLUTs        int      // the peer's lookup-table entries in its window BAR

	opMu  sync.Mutex // one partition operation at a time from this side
	trans []bool     // windows this side translated (cleared at Close)
}

// regAt locates element idx of register name, add bytes up (another
// partition's block), checked against the BAR like reg.
func (d *HWDevice) regAt(name string, idx int, add uint32) (regLoc, error) {
	return d.locate(name, idx, uint64(add), false)
}

// swRegs locates several registers of one block; the first error wins.
type swRegs struct {
	d   *HWDevice
	add uint32
	err error
}

func (s *swRegs) at(name string, idx int) regLoc {
	if s.err != nil {
		return regLoc{}
	}
	r, err := s.d.regAt(name, idx, s.add)
	s.err = err
	return r
}

// swInit sets up a Switchtec partition after findSide, in the order of
// Linux's switchtec_ntb_add: the windows' geometry (init_mw), the
// requester IDs (init_req_id_table), the message routing (init_msgs),
// and the shared window (init_shared_mw). The doorbell masks are the
// generic driver's.
func (d *HWDevice) swInit(p hwParts, c HWConfig) error {
	pt := d.o.Partition
	s := &swState{selfCtl: d.part * pt.CtrlStride, peerCtl: d.peerPart * pt.CtrlStride, peerDB: d.peerPart * pt.DBStride,
		timeout: c.OpTimeout, trans: make([]bool, len(d.wins))}
	if s.timeout <= 0 {
		s.timeout = defaultOpTimeout
	}
	d.sw = s
	if err := d.swGeometry(); err != nil {
		return err
	}
	if err := d.swReqIDs(); err != nil {
		return err
	}
	if err := d.swMsgInit(); err != nil {
		return err
	}
	if d.mem == nil {
		return nil // doorbells and messages only: no memory for the shared window
	}
	return d.swShared()
}

// swGeometry reads where each window is: both partitions' BAR entries
// must be valid for the map's window BARs, and window 0 shares its BAR
// with the lookup-table windows, after them (Linux's
// switchtec_ntb_direct_get_addr): at LUTs*64 KiB, at most as large as
// that offset. Values that cannot be right are fabric.ErrMalformed.
func (d *HWDevice) swGeometry() error {
	s := d.sw
	luts := [2]int{}
	for i, add := range []uint32{s.selfCtl, s.peerCtl} {
		rs := swRegs{d: d, add: add}
		n := rs.at("LUT_TABLE_ENTRIES", 0)
		var ctls []regLoc
		for _, w := range d.o.Windows {
			ctls = append(ctls, rs.at("BAR_ENTRY_CTL", w.BAR))
		}
		if rs.err != nil {
			return rs.err
		}
		for j, r := range ctls {
			if v := d.load(r); v&hwmap.SwitchtecBarValid == 0 || v == widthMax(r.width) {
				return fmt.Errorf("ntb: hardware %s: partition %d's BAR entry %d (window %d) is not valid (%#x): %w",
					d.name, []uint32{d.part, d.peerPart}[i], d.o.Windows[j].BAR, j, v, fabric.ErrNotSupported)
			}
		}
		v := d.load(n)
		if v == 0 || v > 512 {
			return fmt.Errorf("ntb: hardware %s: partition %d has %d lookup-table entries, 1 to 512 needed for the shared window: %w",
				d.name, []uint32{d.part, d.peerPart}[i], v, fabric.ErrMalformed)
		}
		luts[i] = 1 << (bits.Len64(v) - 1) // rounded down to a power of two, as Linux does
	}
	s.peerLUTs = luts[1]
	for i := range d.wins {
		size := d.wins[i].Size()
		off := uint64(0)
		if i == 0 {
			off = uint64(luts[0]) * hwmap.SwitchtecLUTSize
			if off >= size {
				return fmt.Errorf("ntb: hardware %s: %d lookup-table windows of 64 KiB leave nothing of window 0's %#x-byte BAR: %w",
					d.name, luts[0], size, fabric.ErrMalformed)
			}
			size = min(size-off, off)
		}
		if size < 4096 {
			return fmt.Errorf("ntb: hardware %s: window %d of %#x bytes: %w", d.name, i, size, fabric.ErrMalformed)
		}
		s.winOff, s.winSize = append(s.winOff, off), append(s.winSize, size)
	}
	return nil
}

// partOp performs a partition operation on the control block add bytes
// up, as Linux's switchtec_ntb_part_op: write the operation, poll the
// status while it shows the operation in progress, and expect want. It
// gives up after the device's OpTimeout (an error wrapping
// os.ErrDeadlineExceeded, after asking for a reset); a status that is
// none of the documented ones (all ones: the device is gone) is
// fabric.ErrMalformed; another documented status is the switch refusing
// (fabric.ErrInvalid, with its error registers).
func (d *HWDevice) partOp(add uint32, op, want uint64) error {
	rs := swRegs{d: d, add: add}
	st, opr := rs.at("PARTITION_STATUS", 0), rs.at("PARTITION_OP", 0)
	barErr, lutErr := rs.at("BAR_ERROR", 0), rs.at("LUT_ERROR", 0)
	if rs.err != nil {
		return rs.err
	}
	busy := map[uint64]uint64{hwmap.SwitchtecOpLock: hwmap.SwitchtecStatusLocking,
		hwmap.SwitchtecOpCfg: hwmap.SwitchtecStatusConfiguring, hwmap.SwitchtecOpReset: hwmap.SwitchtecStatusResetting}[op]
	names := map[uint64]string{hwmap.SwitchtecOpLock: "lock", hwmap.SwitchtecOpCfg: "configure", hwmap.SwitchtecOpReset: "reset"}
	d.store(opr, op)
	ctx, cancel := context.WithTimeout(context.Background(), d.sw.timeout)
	defer cancel()
	w := spin.New(0)
	var ps uint64
	for {
		ps = d.load(st) & hwmap.SwitchtecStatusMask
		if ps != busy {
			break
		}
		if err := w.Wait(ctx); err != nil {
			d.store(opr, hwmap.SwitchtecOpReset) // not left locked by this side; not waited for
			return fmt.Errorf("ntb: hardware %s: partition operation %s on block %#x still in progress after %v: %w",
				d.name, names[op], add, d.sw.timeout, os.ErrDeadlineExceeded)
		}
	}
	switch {
	case ps == want:
		return nil
	case ps < hwmap.SwitchtecStatusNormal || ps > hwmap.SwitchtecStatusResetting:
		return fmt.Errorf("ntb: hardware %s: partition operation %s: status %#x is not a partition status: %w",
			d.name, names[op], ps, fabric.ErrMalformed)
	}
	return fmt.Errorf("ntb: hardware %s: partition operation %s ended in status %d, not %d (BAR error %#x, LUT error %#x): %w",
		d.name, names[op], ps, want, d.load(barErr), d.load(lutErr), fabric.ErrInvalid)
}

// partConfig locks the control block add bytes up, lets set write it,
// and configures it; it then reads back check and compares it with
// wantBack (a switch that did not take the writes, such as one locked by
// another agent, is fabric.ErrInvalid). On a refused configure it asks
// for a reset, so the staged writes are dropped.
func (d *HWDevice) partConfig(add uint32, set func(), check regLoc, wantBack uint64) error {
	if err := d.partOp(add, hwmap.SwitchtecOpLock, hwmap.SwitchtecStatusLocked); err != nil {
		return err
	}
	set()
	if err := d.partOp(add, hwmap.SwitchtecOpCfg, hwmap.SwitchtecStatusNormal); err != nil {
		if errors.Is(err, fabric.ErrInvalid) {
			d.partOp(add, hwmap.SwitchtecOpReset, hwmap.SwitchtecStatusNormal)
		}
		return err
	}
	if got := d.load(check); got != wantBack {
		return fmt.Errorf("ntb: hardware %s: the switch did not take %#x at %#x (read back %#x): %w",
			d.name, wantBack, check.off, got, fabric.ErrInvalid)
	}
	return nil
}

// swReqIDs lets this partition's requesters through the NT function, as
// Linux's config_req_id_table on its own control block: the root complex
// (0:00.0) and the host bridge the info registers name.
func (d *HWDevice) swReqIDs() error {
	s := d.sw
	rs := swRegs{d: d, add: s.selfCtl}
	size, ctl := rs.at("REQ_ID_TABLE_SIZE", 0), rs.at("PARTITION_CTRL", 0)
	e0, e1 := rs.at("REQ_ID_TABLE", 0), rs.at("REQ_ID_TABLE", 1)
	rid, err := d.regAt("INFO_REQUESTER_ID", 0, 0)
	if rs.err != nil || err != nil {
		return errors.Join(rs.err, err)
	}
	if n := d.load(size); n < 2 || n == widthMax(size.width) {
		return fmt.Errorf("ntb: hardware %s: %d requester-ID entries, 2 needed: %w", d.name, n, fabric.ErrMalformed)
	}
	host := d.load(rid)<<hwmap.SwitchtecReqIDFld | hwmap.SwitchtecReqIDEn
	s.opMu.Lock()
	defer s.opMu.Unlock()
	return d.partConfig(s.selfCtl, func() {
		d.store(ctl, hwmap.SwitchtecIDProtDis)
		d.store(e0, 0<<hwmap.SwitchtecReqIDFld|hwmap.SwitchtecReqIDEn)
		d.store(e1, host)
	}, e1, host)
}

// swMsgInit routes inbound message register i to the peer's outbound
// register i, and clears and masks each (Linux's init_msgs; the status
// and mask are written as bytes, not as one 64-bit store).
func (d *HWDevice) swMsgInit() error {
	mo := d.o.Msg
	if mo == nil {
		return nil
	}
	route, err := d.reg(mo.Route, 0, regDB)
	if err != nil {
		return err
	}
	var v uint64
	for i := range mo.Count {
		v |= (uint64(i) | uint64(d.peerPart)<<hwmap.SwitchtecMsgMapPart) << (8 * i)
	}
	var sts, masks []regLoc
	for i := range mo.Count {
		st, err := d.reg(mo.InStatus, i, regDB)
		if err != nil {
			return err
		}
		mk, err := d.reg(mo.InMask, i, regDB)
		if err != nil {
			return err
		}
		sts, masks = append(sts, st), append(masks, mk)
	}
	d.store(route, v)
	for i := range sts {
		d.store(sts[i], mo.Full)
		d.store(masks[i], hwmap.SwitchtecMsgMask)
	}
	return nil
}

// swShared sets up the shared window, as Linux's init_shared_mw: the
// last 64 KiB-aligned 64 KiB of HWConfig.Memory becomes this side's
// region (Memory() is what precedes it), filled with the magic, this
// partition's number and its windows' sizes; lookup-table entry 0 of the
// peer's window-0 BAR is pointed at it through the peer's control block;
// and window 0's BAR is mapped, whose first 64 KiB reach the peer's
// region once the peer has done the same.
func (d *HWDevice) swShared() error {
	s := d.sw
	mem, bus := d.mem.Bytes(), d.mem.BusAddr()
	const L = hwmap.SwitchtecLUTSize
	end := (bus + uint64(len(mem))) &^ (L - 1)
	if end < bus+L || end-L < bus {
		return fmt.Errorf("ntb: hardware %s: %d bytes of memory at %#x hold no 64 KiB-aligned 64 KiB for the shared window: %w",
			d.name, len(mem), bus, fabric.ErrInvalid)
	}
	s.sharedBus = end - L
	s.sharedOff = int(s.sharedBus - bus)
	s.shared = mem[s.sharedOff : s.sharedOff+L : s.sharedOff+L]
	clear(s.shared)
	shm.U32(s.shared, hwmap.SwitchtecSharedPartAt).Store(d.part)
	for i, sz := range s.winSize {
		shm.U64(s.shared, hwmap.SwitchtecSharedMWAt+8*i).Store(sz)
	}
	shm.U32(s.shared, hwmap.SwitchtecSharedMagicAt).Store(hwmap.SwitchtecSharedMagic)

	bar := d.o.Windows[0].BAR
	rs := swRegs{d: d, add: s.peerCtl}
	ctl, lut := rs.at("BAR_ENTRY_CTL", bar), rs.at("LUT_ENTRY", 0)
	if rs.err != nil {
		return rs.err
	}
	entry := hwmap.SwitchtecLUTEn | uint64(d.part)<<hwmap.SwitchtecLUTPartFld | s.sharedBus
	s.opMu.Lock()
	err := d.partConfig(s.peerCtl, func() {
		v := d.load(ctl)&hwmap.SwitchtecBarKeep | hwmap.SwitchtecBarLUTWinEn |
			uint64(bits.Len64(L)-1)<<hwmap.SwitchtecBarLUTSizeFld | uint64(s.peerLUTs-1)<<hwmap.SwitchtecBarLUTCntFld
		d.store(ctl, v)
		d.store(lut, entry)
	}, lut, entry)
	s.opMu.Unlock()
	if err != nil {
		return err
	}
	m, err := d.mapBAR(bar)
	if err != nil {
		return fmt.Errorf("ntb: hardware %s: window 0 (BAR %d): %w", d.name, bar, err)
	}
	if b := m.Bytes(); uint64(len(b)) < s.winOff[0]+s.winSize[0] || len(b) < L {
		m.Close()
		return fmt.Errorf("ntb: hardware %s: window 0's BAR maps %d bytes: %w", d.name, len(b), fabric.ErrInvalid)
	}
	d.peerWin[0] = m
	s.peerShared = m.Bytes()[:L:L]
	return nil
}

// swClose tells the peer this side is gone and undoes what it set in the
// peer's control block: the link state and magic are cleared, then the
// translations this side set and the shared window's LUT entry. Errors
// are returned but do not stop the close.
func (d *HWDevice) swClose() error {
	s := d.sw
	if s.shared != nil {
		shm.U32(s.shared, hwmap.SwitchtecSharedLinkAt).Store(0)
		shm.U32(s.shared, hwmap.SwitchtecSharedMagicAt).Store(0)
	}
	var errs []error
	for i, on := range s.trans {
		if on {
			errs = append(errs, d.swClearTrans(i))
		}
	}
	if s.shared != nil {
		rs := swRegs{d: d, add: s.peerCtl}
		lut := rs.at("LUT_ENTRY", 0)
		if rs.err == nil {
			s.opMu.Lock()
			errs = append(errs, d.partConfig(s.peerCtl, func() { d.store(lut, 0) }, lut, 0))
			s.opMu.Unlock()
		}
	}
	return errors.Join(errs...)
}

// Scratchpads: Linux's emulation in the shared window. SpadRead and
// SpadWrite work this side's region in its own memory; PeerSpadRead and
// PeerSpadWrite go across the bridge to the peer's.

func (d *HWDevice) swSpad(idx int, peer bool) (*atomic.Uint32, error) {
	s := d.sw
	if d.closed.Load() {
		return nil, d.errClosed()
	}
	if s.shared == nil {
		return nil, fmt.Errorf("ntb: hardware %s: no shared window (HWConfig.Memory) for the scratchpads: %w", d.name, fabric.ErrNotSupported)
	}
	if idx < 0 || idx >= hwmap.SwitchtecSharedSpads {
		return nil, fmt.Errorf("ntb: hardware %s: scratchpad %d of %d: %w", d.name, idx, hwmap.SwitchtecSharedSpads, fabric.ErrInvalid)
	}
	b := s.shared
	if peer {
		b = s.peerShared
	}
	return shm.U32(b, hwmap.SwitchtecSharedSpadAt+4*idx), nil
}

// swLinkSet writes this side's link state in its shared region.
func (d *HWDevice) swLinkSet(up bool) error {
	if d.closed.Load() {
		return d.errClosed()
	}
	if d.sw.shared == nil {
		return fmt.Errorf("ntb: hardware %s: no shared window (HWConfig.Memory) for the link state: %w", d.name, fabric.ErrNotSupported)
	}
	v := uint32(0)
	if up {
		v = 1
	}
	shm.U32(d.sw.shared, hwmap.SwitchtecSharedLinkAt).Store(v)
	return nil
}

// swLinkUp is Linux's link_status_update: up when this side enabled the
// link and the peer's region, read as one 64-bit load across the bridge,
// has the magic and a nonzero link state.
func (d *HWDevice) swLinkUp() bool {
	s := d.sw
	if s.shared == nil || shm.U32(s.shared, hwmap.SwitchtecSharedLinkAt).Load() == 0 {
		return false
	}
	v := shm.U64(s.peerShared, hwmap.SwitchtecSharedMagicAt).Load() // magic, then the link state
	return uint32(v) == hwmap.SwitchtecSharedMagic && v>>32 != 0
}

// Windows.

func (d *HWDevice) swWindow(widx int) error {
	if widx < 0 || widx >= len(d.wins) {
		return fmt.Errorf("ntb: hardware %s: memory window %d of %d: %w", d.name, widx, len(d.wins), fabric.ErrInvalid)
	}
	if d.closed.Load() {
		return d.errClosed()
	}
	return nil
}

// swSetTrans is MWSetTrans by a partition operation on the peer's
// control block (Linux's switchtec_ntb_mw_set_trans and mw_set_direct):
// the BAR entry's direct window enabled, its size with log2 of the size
// below it (the upper half in the extended entry), and the translation
// with this partition's number in its low bits. The bus address must be
// aligned to the size's power of two, as the switch replaces that many
// low bits.
func (d *HWDevice) swSetTrans(widx int, addr, size uint64) error {
	if err := d.swWindow(widx); err != nil {
		return err
	}
	s := d.sw
	if s.shared == nil {
		return fmt.Errorf("ntb: hardware %s: window %d: no DMA memory to translate into (HWConfig.Memory): %w", d.name, widx, fabric.ErrNotSupported)
	}
	if n := uint64(s.sharedOff); addr > n || size > n-addr {
		return fmt.Errorf("ntb: hardware %s: window %d: %#x+%#x outside %#x bytes of memory: %w", d.name, widx, addr, size, n, fabric.ErrBounds)
	}
	bus := d.mem.BusAddr() + addr
	if err := hwmap.CheckTranslation(bus, size, 4096, 4096, s.winSize[widx]); err != nil {
		return fmt.Errorf("ntb: hardware %s: window %d: %w", d.name, widx, err)
	}
	pos := bits.Len64(size) - 1
	if bus&(1<<pos-1) != 0 {
		return fmt.Errorf("ntb: hardware %s: window %d: translation %#x is not aligned to 2^%d, the size's power of two: %w",
			d.name, widx, bus, pos, fabric.ErrInvalid)
	}
	return d.swDirect(widx, true, uint64(pos)|size&hwmap.SwitchtecWinSizeLow, size>>32, uint64(d.part)|bus)
}

// swClearTrans is Linux's mw_clr_direct: the direct window disabled, its
// sizes zero, the translation this partition's number alone.
func (d *HWDevice) swClearTrans(widx int) error {
	if err := d.swWindow(widx); err != nil {
		return err
	}
	return d.swDirect(widx, false, 0, 0, uint64(d.part))
}

func (d *HWDevice) swDirect(widx int, on bool, winSize, ext, xlate uint64) error {
	s := d.sw
	bar := d.o.Windows[widx].BAR
	rs := swRegs{d: d, add: s.peerCtl}
	ctl, ws, wx, xa := rs.at("BAR_ENTRY_CTL", bar), rs.at("BAR_ENTRY_WIN_SIZE", bar), rs.at("BAR_EXT_WIN_SIZE", bar), rs.at("BAR_ENTRY_XLATE_ADDR", bar)
	if rs.err != nil {
		return rs.err
	}
	if winSize > widthMax(ws.width) || ext > widthMax(wx.width) {
		return fmt.Errorf("ntb: hardware %s: window %d: size does not fit its register: %w", d.name, widx, fabric.ErrBounds)
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	err := d.partConfig(s.peerCtl, func() {
		v := d.load(ctl)
		if on {
			v |= hwmap.SwitchtecBarDirWinEn
		} else {
			v &^= hwmap.SwitchtecBarDirWinEn
		}
		d.store(ctl, v)
		d.store(ws, winSize)
		d.store(wx, ext)
		d.store(xa, xlate)
	}, xa, xlate)
	if err != nil && on && errors.Is(err, fabric.ErrInvalid) {
		// As Linux after a refused configure: clear the entry and
		// configure again, so no half-set window stays.
		d.partConfig(s.peerCtl, func() {
			d.store(ctl, d.load(ctl)&^hwmap.SwitchtecBarDirWinEn)
			d.store(ws, 0)
			d.store(wx, 0)
			d.store(xa, uint64(d.part))
		}, xa, uint64(d.part))
		on = false
	}
	if err == nil || !on {
		s.trans[widx] = on && err == nil
	}
	return err
}

// swPeerMW maps window widx: its part of the BAR (window 0 after the
// lookup-table windows).
func (d *HWDevice) swPeerMW(widx int) ([]byte, error) {
	if err := d.swWindow(widx); err != nil {
		return nil, err
	}
	s := d.sw
	bar := d.o.Windows[widx].BAR
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.peerWin[widx] == nil {
		m, err := d.mapBAR(bar)
		if err != nil {
			return nil, fmt.Errorf("ntb: hardware %s: window %d (BAR %d): %w", d.name, widx, bar, err)
		}
		d.peerWin[widx] = m
	}
	b := d.peerWin[widx].Bytes()
	off, size := s.winOff[widx], s.winSize[widx]
	if uint64(len(b)) < off+size {
		return nil, fmt.Errorf("ntb: hardware %s: window %d's BAR maps %d bytes, the window ends at %#x: %w", d.name, widx, len(b), off+size, fabric.ErrInvalid)
	}
	return b[off : off+size : off+size], nil
}

// swPeerMsgFull finds the peer's inbound register that this side's
// outbound register idx reaches (the peer's MSG_MAP) and reads whether
// it still holds a message. No route is fabric.ErrPeerGone: the peer has
// not set up its messages.
func (d *HWDevice) swPeerMsgFull(idx int) (bool, error) {
	mo := d.o.Msg
	route, err := d.regAt(mo.Route, 0, d.sw.peerDB)
	if err != nil {
		return false, err
	}
	v := d.load(route)
	want := uint64(idx) | uint64(d.part)<<hwmap.SwitchtecMsgMapPart
	for j := range min(mo.Count, int(route.width)) {
		if v>>(8*j)&0xff != want {
			continue
		}
		st, err := d.regAt(mo.InStatus, j, d.sw.peerDB)
		if err != nil {
			return false, err
		}
		return d.load(st)&mo.Full != 0, nil
	}
	return false, fmt.Errorf("ntb: hardware %s: the peer routes no inbound message register to outbound register %d (map %#x): %w",
		d.name, idx, v, fabric.ErrPeerGone)
}
