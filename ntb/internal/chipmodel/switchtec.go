//go:build linux

package chipmodel

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync"

	"unsafe"

	"golang.org/x/sys/unix"
)

// Switchtec's global address space (GAS), as Linux include/linux/
// switchtec.h lays it out: the NTB region at 0x10000 holds the info
// registers, then one control block per partition from 0x4000 (0x2000
// each), then one doorbell and message block per partition from 0x64000
// (0x4000 each).
const (
	swNTB      = 0x10000
	swCtrl     = swNTB + 0x4000
	swCtrlSize = 0x2000
	swDB       = swNTB + 0x64000
	swDBSize   = 0x4000
	swParts    = 48

	// ntb_info_regs
	swInfoCount  = swNTB + 0x0 // u8
	swInfoID     = swNTB + 0x1 // u8: the partition this view belongs to
	swInfoEPMap  = swNTB + 0x4 // u64 (packed): a bit per NT partition
	swInfoReqID  = swNTB + 0xc // u16
	swInfoNTP    = swNTB + 0x20
	swNTPStride  = 16
	swNTPTargLo  = 0x4
	swNTPTargHi  = 0x8
	swInfoNTPEnd = swInfoNTP + swParts*swNTPStride

	// ntb_ctrl_regs, from a control block's start
	swCStatus   = 0x00
	swCOp       = 0x04
	swCPartCtl  = 0x08
	swCBarSetup = 0x0c
	swCBarErr   = 0x10
	swCLUTN     = 0x14 // u16
	swCLUTOff   = 0x16 // u16
	swCLUTErr   = 0x18
	swCReqN     = 0x1c // u16
	swCReqOff   = 0x1e // u16
	swCReqErr   = 0x20
	swCBar      = 0x40 // 6 x {ctl u32, win_size u32, xlate_addr u64}
	swCBarExt   = 0xa0 // 6 x {win_size u32, 3 reserved}
	swCReqID    = 0x400
	swCLUT      = 0x1000 // 512 x u64

	// ntb_dbmsg_regs, from a doorbell block's start
	swDODB     = 0x1000
	swDODBMask = 0x1008
	swDIDB     = 0x1010
	swDIDBMask = 0x1018
	swDMsgMap  = 0x1060
	swDOMsg    = 0x1068 // 4 x {msg u32, status u32}
	swDIMsg    = 0x1088 // 4 x {msg u32, status u8, mask u8, src u8, rsvd}

	// Operations and statuses
	swOpLock, swOpCfg, swOpReset                       = 1, 2, 3
	swStNormal, swStLocked                             = 1, 2
	swStLocking, swStConfiguring, swStResetting        = 3, 4, 5
	swBarValid, swBarDir, swBarLUT                     = 1 << 0, 1 << 4, 1 << 5
	swReqIDs                                           = 16 // requester-ID entries the model offers
	swPage                                             = 4096
	swNoTarget                                         = -1
	swMsgs                                             = 4
	swWinBARs                                          = 6
	swDefaultMem, swDefaultBAR2, swDefaultBAR4         = 4 << 20, 2 << 20, 1 << 20
	swDefaultLUTs                                      = 16
	swStatusBusyMask                            uint32 = 0xffff
)

// SwitchtecConfig sets up a modelled switch. The zero value is two
// partitions, 0 and 1, each with 4 MiB of memory, BAR 2 of 2 MiB (16
// lookup-table entries of 64 KiB, then the direct window) and BAR 4 of
// 1 MiB.
type SwitchtecConfig struct {
	// IDs are the two partitions' numbers (both zero: 0 and 1).
	IDs [2]int
	// Target fills each partition's ntp_info target vector with the
	// other; without it the vectors are 0 and a driver falls back on the
	// endpoint map of a two-partition switch.
	Target bool
	// MemSize is each partition's memory (0: 4 MiB), a multiple of 4096.
	MemSize int
	// BAR2 and BAR4 are the window BARs' sizes (0: 2 MiB and 1 MiB),
	// powers of two.
	BAR2, BAR4 uint64
	// LUTEntries is LUT_TABLE_ENTRIES (0: 16; negative: 0).
	LUTEntries int
	// OpSteps is how many reads of PARTITION_STATUS show an operation in
	// progress before it completes (0: 1).
	OpSteps int
}

// Switchtec is a modelled Switchtec switch with two NT partitions.
type Switchtec struct {
	mu     sync.Mutex
	cfg    SwitchtecConfig
	raw    []byte // the GAS: plain register storage
	parts  [2]*SwitchtecPartition
	ctl    map[int]*swCtl
	db     uint64 // the 64 doorbells, shared by the partitions
	hang   bool
	ones   bool
	reject bool
	closed bool
}

// swCtl is a control block's operation state.
type swCtl struct {
	status  uint32
	pending uint32
	left    int
	active  []byte // the block as the last configure (or reset) left it
}

// SwitchtecPartition is one partition's view of the switch: its register
// BAR (Load and Store, ntb.RegIO's methods), its memory (Bytes and
// BusAddr, ntb.DMAMemory's) and its window BARs (MapBAR).
type SwitchtecPartition struct {
	sw    *Switchtec
	idx   int
	id    int
	reqID uint16
	fd    int
	mem   []byte
	bus   uint64
	bars  [swWinBARs]*swBAR
}

// swBAR is a window BAR: a fixed reservation whose pages are remapped to
// the target partition's memory, or to a private sink.
type swBAR struct {
	size uint64
	b    []byte
	cur  []int64 // per page: memfd offset in the target's memory | target index<<48, or swNoTarget
}

// NewSwitchtec builds the model; Close releases its memory.
func NewSwitchtec(c SwitchtecConfig) (*Switchtec, error) {
	if c.IDs == [2]int{} {
		c.IDs = [2]int{0, 1}
	}
	if c.MemSize == 0 {
		c.MemSize = swDefaultMem
	}
	if c.BAR2 == 0 {
		c.BAR2 = swDefaultBAR2
	}
	if c.BAR4 == 0 {
		c.BAR4 = swDefaultBAR4
	}
	switch {
	case c.LUTEntries == 0:
		c.LUTEntries = swDefaultLUTs
	case c.LUTEntries < 0:
		c.LUTEntries = 0
	}
	if c.OpSteps == 0 {
		c.OpSteps = 1
	}
	for _, id := range c.IDs {
		if id < 0 || id >= swParts {
			return nil, fmt.Errorf("chipmodel: switchtec partition %d", id)
		}
	}
	if c.IDs[0] == c.IDs[1] || c.MemSize%swPage != 0 || c.MemSize <= 0 ||
		bits.OnesCount64(c.BAR2) != 1 || bits.OnesCount64(c.BAR4) != 1 || c.BAR2 < swPage || c.BAR4 < swPage {
		return nil, fmt.Errorf("chipmodel: switchtec config %+v", c)
	}
	top := max(c.IDs[0], c.IDs[1])
	size := uint64(0x80000)
	for size < uint64(swDB+(top+1)*swDBSize) {
		size <<= 1
	}
	s := &Switchtec{cfg: c, raw: make([]byte, size), ctl: map[int]*swCtl{}}
	s.raw[swInfoCount] = 2
	ep := uint64(1)<<c.IDs[0] | uint64(1)<<c.IDs[1]
	binary.LittleEndian.PutUint64(s.raw[swInfoEPMap:], ep)
	for i, id := range c.IDs {
		if c.Target {
			other := uint64(1) << c.IDs[1-i]
			binary.LittleEndian.PutUint32(s.raw[swInfoNTP+id*swNTPStride+swNTPTargLo:], uint32(other))
			binary.LittleEndian.PutUint32(s.raw[swInfoNTP+id*swNTPStride+swNTPTargHi:], uint32(other>>32))
		}
		cb := swCtrl + id*swCtrlSize
		binary.LittleEndian.PutUint32(s.raw[cb+swCStatus:], swStNormal)
		binary.LittleEndian.PutUint16(s.raw[cb+swCLUTN:], uint16(c.LUTEntries))
		binary.LittleEndian.PutUint16(s.raw[cb+swCLUTOff:], swCLUT)
		binary.LittleEndian.PutUint16(s.raw[cb+swCReqN:], swReqIDs)
		binary.LittleEndian.PutUint16(s.raw[cb+swCReqOff:], swCReqID)
		for _, b := range []int{2, 4} {
			binary.LittleEndian.PutUint32(s.raw[cb+swCBar+16*b:], swBarValid)
		}
		st := &swCtl{status: swStNormal}
		st.active = append([]byte(nil), s.raw[cb:cb+swCtrlSize]...)
		s.ctl[id] = st
	}
	for i, id := range c.IDs {
		p, err := s.newPartition(i, id)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.parts[i] = p
	}
	return s, nil
}

func (s *Switchtec) newPartition(idx, id int) (*SwitchtecPartition, error) {
	p := &SwitchtecPartition{sw: s, idx: idx, id: id, reqID: uint16(0x100 * (idx + 1)), fd: -1,
		bus: uint64(idx+1) << 32}
	fd, err := unix.MemfdCreate(fmt.Sprintf("switchtec-part%d", id), 0)
	if err != nil {
		return nil, fmt.Errorf("chipmodel: memfd: %w", err)
	}
	p.fd = fd
	if err := unix.Ftruncate(fd, int64(s.cfg.MemSize)); err != nil {
		return nil, fmt.Errorf("chipmodel: memfd: %w", err)
	}
	if p.mem, err = unix.Mmap(fd, 0, s.cfg.MemSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("chipmodel: mmap: %w", err)
	}
	for _, b := range []struct {
		bar  int
		size uint64
	}{{2, s.cfg.BAR2}, {4, s.cfg.BAR4}} {
		m, err := unix.Mmap(-1, 0, int(b.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return nil, fmt.Errorf("chipmodel: mmap: %w", err)
		}
		cur := make([]int64, b.size/swPage)
		for i := range cur {
			cur[i] = swNoTarget
		}
		p.bars[b.bar] = &swBAR{size: b.size, b: m, cur: cur}
	}
	return p, nil
}

// Partition returns partition view i (0 or 1).
func (s *Switchtec) Partition(i int) *SwitchtecPartition { return s.parts[i] }

// RegBARSize is the size of the register BAR (GAS) the model decodes.
func (s *Switchtec) RegBARSize() uint64 { return uint64(len(s.raw)) }

// SetHang makes partition operations stay in progress for ever (true)
// or complete again (false).
func (s *Switchtec) SetHang(on bool) { s.mu.Lock(); s.hang = on; s.mu.Unlock() }

// SetAllOnes makes every register read all ones and drops every store,
// as a device that has fallen off the bus.
func (s *Switchtec) SetAllOnes(on bool) { s.mu.Lock(); s.ones = on; s.mu.Unlock() }

// SetRejectConfig makes every configure operation fail, with BAR_ERROR
// set and the partition left locked.
func (s *Switchtec) SetRejectConfig(on bool) { s.mu.Lock(); s.reject = on; s.mu.Unlock() }

// Poke stores v into the register storage at off, bypassing every side
// effect (a test presets a register or corrupts one).
func (s *Switchtec) Poke(off uint32, width uint8, v uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if uint64(off)+uint64(width) <= uint64(len(s.raw)) {
		for i := range uint32(width) {
			s.raw[off+i] = byte(v >> (8 * i))
		}
	}
}

// Peek reads the register storage at off without side effects.
func (s *Switchtec) Peek(off uint32, width uint8) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.get(off, width)
}

func (s *Switchtec) get(off uint32, width uint8) uint64 {
	var v uint64
	if uint64(off)+uint64(width) > uint64(len(s.raw)) {
		return 0
	}
	for i := range uint32(width) {
		v |= uint64(s.raw[off+i]) << (8 * i)
	}
	return v
}

func (s *Switchtec) put(off uint32, width uint8, v uint64) {
	for i := range uint32(width) {
		s.raw[off+i] = byte(v >> (8 * i))
	}
}

// Doorbells returns the switch's 64 doorbell bits.
func (s *Switchtec) Doorbells() uint64 { s.mu.Lock(); defer s.mu.Unlock(); return s.db }

// Close unmaps the memories and window BARs. Mappings handed out are
// invalid afterwards.
func (s *Switchtec) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for _, p := range s.parts {
		if p == nil {
			continue
		}
		for _, b := range p.bars {
			if b != nil {
				unix.Munmap(b.b)
			}
		}
		if p.mem != nil {
			unix.Munmap(p.mem)
		}
		if p.fd >= 0 {
			unix.Close(p.fd)
		}
	}
	return nil
}

// ID is the partition's number.
func (p *SwitchtecPartition) ID() int { return p.id }

// Bytes is the partition's memory (ntb.DMAMemory).
func (p *SwitchtecPartition) Bytes() []byte { return p.mem }

// BusAddr is the bus address of the memory's first byte.
func (p *SwitchtecPartition) BusAddr() uint64 { return p.bus }

// BARSize is the size of window BAR bar (0: none).
func (p *SwitchtecPartition) BARSize(bar int) uint64 {
	if bar < 0 || bar >= swWinBARs || p.bars[bar] == nil {
		return 0
	}
	return p.bars[bar].size
}

// MapBAR returns window BAR bar: stores land where the partition's
// control block, as last configured, translates them. The slice stays
// valid until the model is closed; translations remap it in place.
func (p *SwitchtecPartition) MapBAR(bar int) ([]byte, error) {
	if bar < 0 || bar >= swWinBARs || p.bars[bar] == nil {
		return nil, fmt.Errorf("chipmodel: partition %d has no window BAR %d", p.id, bar)
	}
	return p.bars[bar].b, nil
}

// DoorbellIRQ reports whether a doorbell interrupt is pending for the
// partition: a set doorbell bit that its IDB_MASK enables.
func (p *SwitchtecPartition) DoorbellIRQ() bool {
	s := p.sw
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.db&s.get(p.dbBlock()+swDIDBMask, 8) != 0
}

func (p *SwitchtecPartition) dbBlock() uint32            { return uint32(swDB + p.id*swDBSize) }
func (p *SwitchtecPartition) ctlBlock() uint32           { return uint32(swCtrl + p.id*swCtrlSize) }
func (p *SwitchtecPartition) other() *SwitchtecPartition { return p.sw.parts[1-p.idx] }

func swWidthOK(s *Switchtec, off uint32, width uint8) bool {
	switch width {
	case 1, 2, 4, 8:
	default:
		return false
	}
	return off%uint32(width) == 0 && uint64(off)+uint64(width) <= uint64(len(s.raw))
}

func swAllOnes(width uint8) uint64 {
	if width >= 8 {
		return ^uint64(0)
	}
	return 1<<(8*width) - 1
}

// covers reports whether [off, off+width) holds all of [reg, reg+n).
func swCovers(off uint32, width uint8, reg, n uint32) bool {
	return off <= reg && off+uint32(width) >= reg+n
}

// Load implements ntb.RegIO: a register read in this partition's view.
func (p *SwitchtecPartition) Load(off uint32, width uint8) uint64 {
	s := p.sw
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ones || s.closed || !swWidthOK(s, off, width) {
		return swAllOnes(width)
	}
	// A read of a control block's status advances its operation.
	if off >= swCtrl && off < swCtrl+swParts*swCtrlSize {
		id := int(off-swCtrl) / swCtrlSize
		if st := s.ctl[id]; st != nil && swCovers(off, width, uint32(swCtrl+id*swCtrlSize+swCStatus), 4) {
			s.advance(id, st)
		}
	}
	var v uint64
	for i := range uint32(width) {
		v |= uint64(p.loadByte(off+i)) << (8 * i)
	}
	return v
}

func (p *SwitchtecPartition) loadByte(a uint32) byte {
	s := p.sw
	switch {
	case a == swInfoID:
		return byte(p.id)
	case a >= swInfoReqID && a < swInfoReqID+2:
		return byte(p.reqID >> (8 * (a - swInfoReqID)))
	case a >= swCtrl && a < swCtrl+swParts*swCtrlSize:
		id := int(a-swCtrl) / swCtrlSize
		r := (a - swCtrl) % swCtrlSize
		if st := s.ctl[id]; st != nil && r < swCStatus+4 {
			return byte(st.status >> (8 * r))
		}
	case a >= swDB && a < swDB+swParts*swDBSize:
		r := (a - swDB) % swDBSize
		switch {
		case r >= swDODB && r < swDODB+8:
			return 0 // write only
		case r >= swDIDB && r < swDIDB+8:
			return byte(s.db >> (8 * (r - swDIDB)))
		}
	}
	return s.raw[a]
}

// Store implements ntb.RegIO: a register write in this partition's
// view, with its side effects.
func (p *SwitchtecPartition) Store(off uint32, width uint8, v uint64) {
	s := p.sw
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ones || s.closed || !swWidthOK(s, off, width) {
		return
	}
	for i := range uint32(width) {
		p.storeByte(off+i, byte(v>>(8*i)))
	}
	switch {
	case off >= swCtrl && off < swCtrl+swParts*swCtrlSize:
		id := int(off-swCtrl) / swCtrlSize
		if st := s.ctl[id]; st != nil && swCovers(off, width, uint32(swCtrl+id*swCtrlSize+swCOp), 4) {
			s.startOp(id, st, uint32(s.get(uint32(swCtrl+id*swCtrlSize+swCOp), 4)))
		}
	case off >= swDB && off < swDB+swParts*swDBSize:
		if int(off-swDB)/swDBSize != p.id {
			return
		}
		for k := range uint32(swMsgs) {
			if swCovers(off, width, p.dbBlock()+swDOMsg+8*k, 4) {
				p.send(k)
			}
		}
	}
}

func (p *SwitchtecPartition) storeByte(a uint32, b byte) {
	s := p.sw
	switch {
	case a < swNTB+0x4000:
		return // info registers: read only
	case a >= swCtrl && a < swCtrl+swParts*swCtrlSize:
		id := int(a-swCtrl) / swCtrlSize
		r := (a - swCtrl) % swCtrlSize
		st := s.ctl[id]
		switch {
		case st == nil:
			return
		case r >= swCOp && r < swCOp+4:
			s.raw[a] = b
		case r < swCBar: // status, errors, table sizes: read only; partition_ctrl staged
			if r >= swCPartCtl && r < swCPartCtl+4 && st.status == swStLocked {
				s.raw[a] = b
			}
		case st.status != swStLocked:
			return // configuration writes need the partition locked
		case r >= swCBar && r < swCBarExt && (r-swCBar)%16 == 0:
			s.raw[a] = b&^swBarValid | s.raw[a]&swBarValid // VALID is read only
		default:
			s.raw[a] = b
		}
	case a >= swDB && a < swDB+swParts*swDBSize:
		id := int(a-swDB) / swDBSize
		if id != p.id {
			return // another partition's doorbells are not this one's to ring
		}
		r := (a - swDB) % swDBSize
		switch {
		case r >= swDODB && r < swDODB+8:
			k := r - swDODB
			gate := s.raw[a-swDODB+swDODBMask]
			s.db |= uint64(b&gate) << (8 * k)
		case r >= swDIDB && r < swDIDB+8:
			s.db &^= uint64(b) << (8 * (r - swDIDB)) // write one to clear
		case r >= swDOMsg && r < swDIMsg:
			if (r-swDOMsg)%8 < 4 {
				s.raw[a] = b // msg; the status is read only
			}
		case r >= swDIMsg && r < swDIMsg+8*swMsgs:
			switch (r - swDIMsg) % 8 {
			case 4: // status: write one to clear
				s.raw[a] &^= b & 1
			case 5: // mask
				s.raw[a] = b
			}
		default:
			s.raw[a] = b
		}
	default:
		s.raw[a] = b
	}
}

// send delivers outbound message k of p to each partition whose MSG_MAP
// routes it there; a register still full refuses it (the sender's
// OMSG status reads 1) rather than being overwritten.
func (p *SwitchtecPartition) send(k uint32) {
	s := p.sw
	msg := s.get(p.dbBlock()+swDOMsg+8*k, 4)
	dropped := uint64(0)
	q := p.other()
	for i := range uint32(swMsgs) {
		if s.raw[q.dbBlock()+swDMsgMap+i] != byte(k)|byte(p.id)<<2 {
			continue
		}
		in := q.dbBlock() + swDIMsg + 8*i
		if s.raw[in+4]&1 != 0 {
			dropped = 1
			continue
		}
		s.put(in, 4, msg)
		s.raw[in+4] |= 1
		s.raw[in+6] = byte(p.id)
	}
	s.put(p.dbBlock()+swDOMsg+8*k+4, 4, dropped)
}

// startOp begins a partition operation on control block id.
func (s *Switchtec) startOp(id int, st *swCtl, op uint32) {
	if st.pending != 0 {
		return // one at a time
	}
	switch op {
	case swOpLock:
		st.status = swStLocking
	case swOpCfg:
		st.status = swStConfiguring
	case swOpReset:
		st.status = swStResetting
	default:
		return
	}
	st.pending, st.left = op, s.cfg.OpSteps
}

// advance counts a status read against the operation in progress and
// completes it when its steps are done.
func (s *Switchtec) advance(id int, st *swCtl) {
	if st.pending == 0 || s.hang {
		return
	}
	if st.left > 0 {
		st.left--
		return
	}
	op := st.pending
	st.pending = 0
	cb := uint32(swCtrl + id*swCtrlSize)
	block := s.raw[cb : cb+swCtrlSize]
	switch op {
	case swOpLock:
		st.status = swStLocked
	case swOpReset:
		copy(block[swCPartCtl:], st.active[swCPartCtl:])
		s.put(cb+swCBarErr, 4, 0)
		s.put(cb+swCLUTErr, 4, 0)
		st.status = swStNormal
	case swOpCfg:
		if st.status != swStConfiguring {
			return
		}
		barErr, lutErr := s.validate(id, block)
		if s.reject {
			barErr |= 1
		}
		s.put(cb+swCBarErr, 4, uint64(barErr))
		s.put(cb+swCLUTErr, 4, uint64(lutErr))
		if barErr != 0 || lutErr != 0 {
			st.status = swStLocked
			return
		}
		copy(st.active, block)
		st.status = swStNormal
		for _, p := range s.parts {
			if p.id == id {
				p.remap()
			}
		}
	}
}

// part returns the modelled partition numbered id, or nil.
func (s *Switchtec) part(id uint64) *SwitchtecPartition {
	for _, p := range s.parts {
		if p != nil && uint64(p.id) == id {
			return p
		}
	}
	return nil
}

// swWin is a window BAR's configuration decoded from a control block.
type swWin struct {
	lut, dir    bool
	lutSize     uint64
	lutN        int
	start       uint64 // the direct window's offset in the BAR
	size        uint64
	pos         uint
	part, xlate uint64
	entries     []uint64
}

func swDecodeWin(block []byte, bar int, lutMax int) swWin {
	le32 := func(o int) uint64 { return uint64(binary.LittleEndian.Uint32(block[o:])) }
	ctl := le32(swCBar + 16*bar)
	w := swWin{lut: ctl&swBarLUT != 0, dir: ctl&swBarDir != 0}
	if w.lut {
		lg := (ctl >> 8) & 0x3f
		w.lutSize = 1 << lg
		w.lutN = int((ctl>>14)&0x1ff) + 1
		w.start = uint64(w.lutN) * w.lutSize
		for i := range min(w.lutN, lutMax) {
			w.entries = append(w.entries, binary.LittleEndian.Uint64(block[swCLUT+8*i:]))
		}
	}
	ws := le32(swCBar + 16*bar + 4)
	w.size = ws&0xfffff000 | le32(swCBarExt+16*bar)<<32
	w.pos = uint(ws & 0xfff)
	x := binary.LittleEndian.Uint64(block[swCBar+16*bar+8:])
	w.part, w.xlate = x&0xfff, x&^0xfff
	return w
}

// validate checks a control block's staged configuration as the
// configure operation does: a bit per bad BAR entry, per bad LUT entry.
func (s *Switchtec) validate(id int, block []byte) (barErr, lutErr uint32) {
	p := s.part(uint64(id))
	for bar := range swWinBARs {
		ctl := binary.LittleEndian.Uint32(block[swCBar+16*bar:])
		if ctl&(swBarDir|swBarLUT) == 0 {
			continue
		}
		if ctl&swBarValid == 0 || p == nil || p.bars[bar] == nil {
			barErr |= 1 << bar
			continue
		}
		size := p.bars[bar].size
		w := swDecodeWin(block, bar, s.cfg.LUTEntries)
		if w.lut {
			if w.lutSize < swPage || w.lutN > s.cfg.LUTEntries || w.start > size {
				barErr |= 1 << bar
				continue
			}
			for i, e := range w.entries {
				if e&1 != 0 && (s.part((e>>1)&0x3f) == nil || e&(w.lutSize-1)&^0x7f != 0) {
					lutErr |= 1 << min(i, 31)
				}
			}
		}
		if w.dir {
			start := uint64(0)
			if w.lut {
				start = w.start
			}
			if w.size == 0 || w.size%swPage != 0 || w.pos < 12 || w.pos > 63 || start+w.size > size || s.part(w.part) == nil {
				barErr |= 1 << bar
			}
		}
	}
	return barErr, lutErr
}

// remap brings p's window BARs in line with its control block's active
// configuration: each page maps the target partition's memory where a
// translation covers it, else a private sink. Only pages whose target
// changed are remapped, so a window in use is not disturbed by another
// one's set-up.
func (p *SwitchtecPartition) remap() {
	s := p.sw
	st := s.ctl[p.id]
	reqOK := false
	for i := range swReqIDs {
		if binary.LittleEndian.Uint32(st.active[swCReqID+4*i:])&1 != 0 {
			reqOK = true
		}
	}
	for bar, b := range p.bars {
		if b == nil {
			continue
		}
		want := make([]int64, len(b.cur))
		for i := range want {
			want[i] = swNoTarget
		}
		target := func(part, addr uint64) int64 {
			q := s.part(part)
			if q == nil || addr < q.bus || addr-q.bus >= uint64(len(q.mem)) || addr%swPage != 0 {
				return swNoTarget
			}
			return int64(addr-q.bus) | int64(q.idx)<<48
		}
		w := swDecodeWin(st.active, bar, s.cfg.LUTEntries)
		if reqOK && w.lut {
			for i, e := range w.entries {
				if e&1 == 0 {
					continue
				}
				for o := uint64(0); o < w.lutSize; o += swPage {
					pg := (uint64(i)*w.lutSize + o) / swPage
					if pg < uint64(len(want)) {
						want[pg] = target((e>>1)&0x3f, e&^(w.lutSize-1)+o)
					}
				}
			}
		}
		if reqOK && w.dir && w.pos >= 12 && w.pos <= 63 {
			start := uint64(0)
			if w.lut {
				start = w.start
			}
			mask := uint64(1)<<w.pos - 1
			for o := uint64(0); o < w.size; o += swPage {
				pg := (start + o) / swPage
				if pg < uint64(len(want)) {
					want[pg] = target(w.part, w.xlate&^mask|o&mask)
				}
			}
		}
		for pg := range want {
			if want[pg] == b.cur[pg] {
				continue
			}
			if want[pg] == swNoTarget {
				swMmapFixed(b.b, pg, -1, 0)
			} else {
				q := s.parts[want[pg]>>48]
				swMmapFixed(b.b, pg, q.fd, want[pg]&(1<<48-1))
			}
			b.cur[pg] = want[pg]
		}
	}
}

// swMmapFixed replaces page pg of b in place: with page off of the memfd
// fd, or (fd < 0) with a fresh private page, the sink.
func swMmapFixed(b []byte, pg int, fd int, off int64) {
	at := unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), pg*swPage)
	flags := unix.MAP_FIXED | unix.MAP_SHARED
	if fd < 0 {
		flags = unix.MAP_FIXED | unix.MAP_PRIVATE | unix.MAP_ANONYMOUS
		off = 0
	}
	if _, err := unix.MmapPtr(fd, off, at, swPage, unix.PROT_READ|unix.PROT_WRITE, flags); err != nil {
		panic(fmt.Sprintf("chipmodel: remapping a window page: %v", err)) // the model's own mapping: a bug, not input
	}
}
