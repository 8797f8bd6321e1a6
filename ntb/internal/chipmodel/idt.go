//go:build linux

// The IDT switch model of package chipmodel (whose doc.go, shared with
// the Intel and AMD models, says what a model is): every NT port gets a
// register view with the chip's side effects (package ntb's RegIO method
// set: Load, Store), host memory on a memfd (ntb.DMAMemory's: Bytes,
// BusAddr) and window BARs that are real mappings of the memory a
// translation points at. Written from the chip's documented behaviour
// with its own offsets, never from Weft's map (ntb/hw), so a test of the
// driver over the model compares the two. A model is not hardware.

package chipmodel

import (
	"fmt"
	"math/bits"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The IDT 89HPES*NT* model: NT ports, each the only NT function of its
// own partition, behind one switch. Offsets and fields are the IDT
// user manual's as Linux's drivers/ntb/hw/idt/ntb_hw_idt.h names them
// (written out here as literals), and the global doorbell masks' as the
// manual lists them. What it models:
//
//   - each NT function's registers (its configuration space, BAR 0) and
//     the switch's global registers through GASAADDR/GASADATA, in which
//     every modelled port's function registers appear at 0x1000+0x2000*port;
//   - doorbells: OUTDBELLSET rings the global doorbell bits a
//     partition may ring (GODBELLMSKn clear for it), each reaching the NT
//     functions whose partition GIDBELLMSKn leaves clear; INDBELLSTS
//     clears on writing ones;
//   - messages: OUTMSGn goes where the sender partition's SWPxMSGCTLn
//     routes it; into a full inbound register (its MSGSTS bit set) it is
//     not delivered and the sender's MSGSTS failure bit n is set; MSGSTS
//     clears on writing ones;
//   - windows: BARSETUP (fixed by the EEPROM, only the target partition
//     field writable), BARLIMIT and BARLTBASE/BARUTBASE for a direct
//     window, and the lookup table (LUTOFFSET, LUTLDATA/MDATA/UDATA) for
//     a 12- or 24-entry one; a window BAR is a real mapping of the
//     target partition's memory at the translation, remapped whenever a
//     translation register is written; beyond the limit, an invalid
//     entry or the memory's end, a private sink (zeroed on each remap);
//   - the NT mapping table (64 entries, shared by the switch), NTCTL,
//     PCICMDSTS, REQIDCAP, PCIELCAP's port number, SWPORTxSTS (link up,
//     NT mode, partition), SWPARTxSTS (active) and SEGSIGSTS.
//
// Not modelled: interrupts (NTINTSTS), switch events other than the
// global signal status, the mapping table's and NTCTL's effect on
// traffic (a window moves data whatever the link), widths other than 4.

// IDTConfig configures an IDT switch model. Zero sizes take defaults.
type IDTConfig struct {
	// Ports are the modelled NT ports, each in its own partition.
	Ports []IDTPortConfig
	// MemSize is each port's host memory (default 4 MiB).
	MemSize int
	// BAR2Size is BAR 2's size, a 64-bit direct window (default 1 MiB);
	// BAR4Size BAR 4's (default 2 MiB), a 64-bit window translated by
	// BAR4Trans: 0 direct, 1 a 12-entry, 2 a 24-entry lookup table.
	BAR2Size, BAR4Size uint64
	BAR4Trans          uint8
}

// IDTPortConfig is one modelled NT port.
type IDTPortConfig struct {
	Port, Partition int
	ReqID           uint16 // the function's requester id (REQIDCAP)
}

// IDTSwitch is the switch model.
type IDTSwitch struct {
	mu       sync.Mutex
	ports    []*IDTPort
	mtbl     [64]uint32
	godb     [32]uint32
	gidb     [32]uint32
	gdb      uint32
	msgctl   [8][4]uint32
	segsig   uint32
	global   map[uint32]uint32
	override map[uint32]uint32
	pageSize uint64
}

// IDTPort is one NT port's function: Load and Store are its register BAR
// (ntb.RegIO), Memory its host memory, BAR a window BAR's mapping.
type IDTPort struct {
	sw       *IDTSwitch
	port     int
	part     int
	reqID    uint16
	linkUp   bool
	absent   bool
	regs     [1024]uint32
	override map[uint32]uint32

	cmd, ntctl, indb, indbMask, msgSts, msgMask uint32
	inMsg, inSrc, outMsg                        [4]uint32
	barSetup, barLimit, barLT, barUT            [6]uint32
	barReg                                      [6]uint32 // the PCI BAR registers
	barBus, barSize                             [6]uint64
	lut                                         [6][32][3]uint32
	lutOff, mtAddr, gasaAddr                    uint32

	memfd  int
	mem    []byte
	memBus uint64
	win    [6][]byte
	sunk   int // translations the model could not map (not page-aligned)
}

// NewIDTSwitch builds the model; Close releases its memory.
func NewIDTSwitch(c IDTConfig) (*IDTSwitch, error) {
	if c.MemSize == 0 {
		c.MemSize = 4 << 20
	}
	if c.BAR2Size == 0 {
		c.BAR2Size = 1 << 20
	}
	if c.BAR4Size == 0 {
		c.BAR4Size = 2 << 20
	}
	sw := &IDTSwitch{global: map[uint32]uint32{}, override: map[uint32]uint32{}, pageSize: uint64(os.Getpagesize())}
	for _, pc := range c.Ports {
		if pc.Port < 0 || pc.Port >= 24 || pc.Partition < 0 || pc.Partition >= 8 || sw.portOf(pc.Port) != nil || sw.partOf(pc.Partition) != nil {
			sw.Close()
			return nil, fmt.Errorf("chipmodel: IDT port %d partition %d: bad or taken", pc.Port, pc.Partition)
		}
		p, err := sw.newPort(pc, c)
		if err != nil {
			sw.Close()
			return nil, err
		}
		sw.ports = append(sw.ports, p)
	}
	for _, p := range sw.ports {
		for b := range 6 {
			p.remap(b)
		}
	}
	return sw, nil
}

func (sw *IDTSwitch) newPort(pc IDTPortConfig, c IDTConfig) (*IDTPort, error) {
	p := &IDTPort{sw: sw, port: pc.Port, part: pc.Partition, reqID: pc.ReqID, linkUp: true, override: map[uint32]uint32{}, memfd: -1}
	fd, err := unix.MemfdCreate(fmt.Sprintf("idt-port%d", pc.Port), unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("chipmodel: memfd: %w", err)
	}
	p.memfd = fd
	if err := unix.Ftruncate(fd, int64(c.MemSize)); err != nil {
		p.close()
		return nil, err
	}
	if p.mem, err = unix.Mmap(fd, 0, c.MemSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		p.close()
		return nil, err
	}
	p.memBus = 0x10_0000_0000 + uint64(pc.Port)<<32
	// BAR 0: the function's registers (configuration-space mode, 4 KiB).
	p.barSetup[0] = 0x80000000 | 0x400 | 12<<4
	p.barSize[0] = 4096
	lg := func(n uint64) uint32 { return uint32(bits.TrailingZeros64(n)) }
	p.barSetup[2] = 0x80000000 | 0x4 | 0x8 | lg(c.BAR2Size)<<4
	p.barSize[2] = c.BAR2Size
	p.barSetup[4] = 0x80000000 | 0x4 | 0x8 | lg(c.BAR4Size)<<4 | uint32(c.BAR4Trans&3)<<11
	p.barSize[4] = c.BAR4Size
	for _, b := range []int{0, 2, 4} {
		p.barBus[b] = 0x80_0000_0000 + uint64(pc.Port)<<32 + uint64(b)<<28
		if b == 0 {
			p.barReg[0] = uint32(p.barBus[0])
			continue
		}
		p.barReg[b] = uint32(p.barBus[b]) | 0xc // 64-bit, prefetchable
		p.barReg[b+1] = uint32(p.barBus[b] >> 32)
		if p.win[b], err = unix.Mmap(-1, 0, int(p.barSize[b]), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
			p.close()
			return nil, err
		}
	}
	return p, nil
}

// Close unmaps the model's memory and windows.
func (sw *IDTSwitch) Close() error {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	for _, p := range sw.ports {
		p.close()
	}
	sw.ports = nil
	return nil
}

func (p *IDTPort) close() {
	for b, w := range p.win {
		if w != nil {
			unix.Munmap(w)
			p.win[b] = nil
		}
	}
	if p.mem != nil {
		unix.Munmap(p.mem)
		p.mem = nil
	}
	if p.memfd >= 0 {
		unix.Close(p.memfd)
		p.memfd = -1
	}
}

// Port returns the modelled NT function at switch port n (nil: none).
func (sw *IDTSwitch) Port(n int) *IDTPort {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return sw.portOf(n)
}

func (sw *IDTSwitch) portOf(n int) *IDTPort {
	for _, p := range sw.ports {
		if p.port == n {
			return p
		}
	}
	return nil
}

func (sw *IDTSwitch) partOf(part int) *IDTPort {
	for _, p := range sw.ports {
		if p.part == part {
			return p
		}
	}
	return nil
}

// OverrideGlobal makes global register addr read v from now on (a
// register gone strange); SetAbsent makes a port read all ones.
func (sw *IDTSwitch) OverrideGlobal(addr, v uint32) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	sw.override[addr] = v
}

// SetAbsent makes the port's function read all ones and drop writes, as
// a function that is gone or hung does.
func (p *IDTPort) SetAbsent(absent bool) {
	p.sw.mu.Lock()
	defer p.sw.mu.Unlock()
	p.absent = absent
}

// Override makes the function's register at off read v from now on.
func (p *IDTPort) Override(off, v uint32) {
	p.sw.mu.Lock()
	defer p.sw.mu.Unlock()
	p.override[off] = v
}

// SetLinkUp sets the port's PCIe link state (SWPORTxSTS link up).
func (p *IDTPort) SetLinkUp(up bool) {
	p.sw.mu.Lock()
	defer p.sw.mu.Unlock()
	p.linkUp = up
}

// IDTMemory is a port's host memory as a bridge sees it.
type IDTMemory struct {
	b   []byte
	bus uint64
}

// Bytes is the memory.
func (m *IDTMemory) Bytes() []byte { return m.b }

// BusAddr is its first byte's bus address.
func (m *IDTMemory) BusAddr() uint64 { return m.bus }

// Memory returns the port's host memory.
func (p *IDTPort) Memory() *IDTMemory { return &IDTMemory{p.mem, p.memBus} }

// BARBus and BARSize give a BAR's bus address and size (0: none).
func (p *IDTPort) BARBus(b int) uint64 { return p.barBus[b] }

// BARSize gives a BAR's size.
func (p *IDTPort) BARSize(b int) uint64 { return p.barSize[b] }

// BAR returns window BAR b's mapping: stores through it land where the
// function's translation sends them. It stays valid until Close.
func (p *IDTPort) BAR(b int) ([]byte, error) {
	if b < 0 || b >= 6 || p.win[b] == nil {
		return nil, fmt.Errorf("chipmodel: IDT port %d has no window BAR %d", p.port, b)
	}
	return p.win[b], nil
}

// Unmapped counts translations the model sent to the sink because they
// were not page-aligned (the chip takes 4-byte alignment).
func (p *IDTPort) Unmapped() int {
	p.sw.mu.Lock()
	defer p.sw.mu.Unlock()
	return p.sunk
}

// Load implements ntb.RegIO.
func (p *IDTPort) Load(off uint32, width uint8) uint64 {
	p.sw.mu.Lock()
	defer p.sw.mu.Unlock()
	if p.absent || width != 4 || off%4 != 0 || off >= 0x1000 {
		return 1<<(8*uint(width)) - 1
	}
	if v, ok := p.override[off]; ok {
		return uint64(v)
	}
	return uint64(p.load(off, true))
}

// Store implements ntb.RegIO.
func (p *IDTPort) Store(off uint32, width uint8, v uint64) {
	p.sw.mu.Lock()
	defer p.sw.mu.Unlock()
	if p.absent || width != 4 || off%4 != 0 || off >= 0x1000 {
		return
	}
	p.store(off, uint32(v), true)
}

// load reads register off; gasa false: reached through the global space,
// where the GASA pair itself does not recurse.
func (p *IDTPort) load(off uint32, gasa bool) uint32 {
	sw := p.sw
	switch {
	case off == 0x004:
		return p.cmd
	case off >= 0x010 && off < 0x028:
		return p.barReg[(off-0x10)/4]
	case off == 0x04c:
		return uint32(p.port) << 24
	case off == 0x400:
		return p.ntctl
	case off == 0x410 || off == 0x420:
		return 0
	case off == 0x428:
		return p.indb
	case off == 0x42c:
		return p.indbMask
	case off >= 0x430 && off < 0x440:
		return p.outMsg[(off-0x430)/4]
	case off >= 0x440 && off < 0x450:
		return p.inMsg[(off-0x440)/4]
	case off >= 0x450 && off < 0x460:
		return p.inSrc[(off-0x450)/4]
	case off == 0x460:
		return p.msgSts
	case off == 0x464:
		return p.msgMask
	case off >= 0x470 && off < 0x4d0:
		b, r := (off-0x470)/16, (off-0x470)%16/4
		return [4]*[6]uint32{&p.barSetup, &p.barLimit, &p.barLT, &p.barUT}[r][b]
	case off == 0x4d0:
		return p.mtAddr
	case off == 0x4d4:
		return 0
	case off == 0x4d8:
		return sw.mtbl[p.mtAddr%64]
	case off == 0x4dc:
		return uint32(p.reqID)
	case off == 0x4e0:
		return p.lutOff
	case off >= 0x4e4 && off < 0x4f0:
		if e := p.lutEntry(); e != nil {
			return e[(off-0x4e4)/4]
		}
		return 0
	case off == 0xff8 && gasa:
		return p.gasaAddr
	case off == 0xffc && gasa:
		return sw.gload(p.gasaAddr)
	}
	return p.regs[off/4]
}

func (p *IDTPort) lutEntry() *[3]uint32 {
	b, i := (p.lutOff>>8)&7, p.lutOff&31
	if b >= 6 {
		return nil
	}
	return &p.lut[b][i]
}

func (p *IDTPort) store(off, v uint32, gasa bool) {
	sw := p.sw
	switch {
	case off == 0x004:
		p.cmd = v & 0xffff
	case off >= 0x010 && off < 0x028, off == 0x04c, off >= 0x440 && off < 0x460, off == 0x4d4, off == 0x4dc:
		// read-only here
	case off == 0x400:
		p.ntctl = v
	case off == 0x410:
		if v&1 != 0 {
			sw.segsig |= 1 << p.part
		}
	case off == 0x420:
		sw.ring(p, v)
	case off == 0x428:
		p.indb &^= v
	case off == 0x42c:
		p.indbMask = v
	case off >= 0x430 && off < 0x440:
		n := (off - 0x430) / 4
		p.outMsg[n] = v
		sw.send(p, int(n), v)
	case off == 0x460:
		p.msgSts &^= v
	case off == 0x464:
		p.msgMask = v
	case off >= 0x470 && off < 0x4d0:
		b, r := int(off-0x470)/16, (off-0x470)%16/4
		switch r {
		case 0: // the EEPROM fixes all but the target partition
			p.barSetup[b] = p.barSetup[b]&^0xe000 | v&0xe000
		case 1:
			p.barLimit[b] = v
		case 2:
			p.barLT[b] = v
		case 3:
			p.barUT[b] = v
		}
		if b > 0 && p.barSetup[b] == 0 && p.barSetup[b-1]&0x4 != 0 {
			b-- // the upper half of a 64-bit BAR
		}
		p.remap(b)
	case off == 0x4d0:
		p.mtAddr = v & 0x7f
	case off == 0x4d8:
		sw.mtbl[p.mtAddr%64] = v
	case off == 0x4e0:
		p.lutOff = v & 0x71f
	case off >= 0x4e4 && off < 0x4f0:
		if e := p.lutEntry(); e != nil {
			e[(off-0x4e4)/4] = v
			p.remap(int(p.lutOff>>8) & 7)
		}
	case off == 0xff8 && gasa:
		p.gasaAddr = v
	case off == 0xffc && gasa:
		sw.gstore(p.gasaAddr, v)
	default:
		p.regs[off/4] = v
	}
}

// Global registers.

func (sw *IDTSwitch) gload(a uint32) uint32 {
	a &^= 3
	if v, ok := sw.override[a]; ok {
		return v
	}
	switch {
	case a >= 0x1000 && a < 0x31000:
		if p := sw.portOf(int(a-0x1000) / 0x2000); p != nil && (a-0x1000)%0x2000 < 0x1000 {
			if p.absent {
				return 0xffffffff
			}
			if v, ok := p.override[(a-0x1000)%0x2000]; ok {
				return v
			}
			return p.load((a-0x1000)%0x2000, false)
		}
		return 0
	case a >= 0x3e100 && a < 0x3e200 && a%0x20 == 4: // SWPARTxSTS
		if sw.partOf(int(a-0x3e100)/0x20) != nil {
			return 0x20 | 0x4000 // active, with an NT function
		}
		return 0
	case a >= 0x3e200 && a < 0x3e500 && a%0x20 == 4: // SWPORTxSTS
		p := sw.portOf(int(a-0x3e200) / 0x20)
		if p == nil {
			return 0
		}
		v := uint32(3)<<6 | uint32(p.part)<<10 // NT mode
		if p.linkUp {
			v |= 0x10
		}
		return v
	case a == 0x3ec30:
		return sw.segsig
	case a == 0x3ec3c:
		return sw.gdb
	case a >= 0x3ed00 && a < 0x3ed80:
		return sw.godb[(a-0x3ed00)/4]
	case a >= 0x3ed80 && a < 0x3ee00:
		return sw.gidb[(a-0x3ed80)/4]
	case a >= 0x3ee00 && a < 0x3ee80:
		return sw.msgctl[(a-0x3ee00)%0x20/4][(a-0x3ee00)/0x20]
	}
	return sw.global[a]
}

func (sw *IDTSwitch) gstore(a, v uint32) {
	a &^= 3
	switch {
	case a >= 0x1000 && a < 0x31000:
		if p := sw.portOf(int(a-0x1000) / 0x2000); p != nil && (a-0x1000)%0x2000 < 0x1000 && !p.absent {
			p.store((a-0x1000)%0x2000, v, false)
		}
	case a == 0x3ec30:
		sw.segsig &^= v
	case a >= 0x3ed00 && a < 0x3ed80:
		sw.godb[(a-0x3ed00)/4] = v
	case a >= 0x3ed80 && a < 0x3ee00:
		sw.gidb[(a-0x3ed80)/4] = v
	case a >= 0x3ee00 && a < 0x3ee80:
		sw.msgctl[(a-0x3ee00)%0x20/4][(a-0x3ee00)/0x20] = v
	default:
		sw.global[a] = v
	}
}

// ring: the global doorbell bits the sender's partition may ring set
// the inbound bits of every function whose partition receives them.
func (sw *IDTSwitch) ring(from *IDTPort, v uint32) {
	for b := range 32 {
		if v&(1<<b) == 0 || sw.godb[b]&(1<<from.part) != 0 {
			continue
		}
		sw.gdb |= 1 << b
		for _, q := range sw.ports {
			if sw.gidb[b]&(1<<q.part) == 0 {
				q.indb |= 1 << b
			}
		}
	}
}

// send delivers outbound message n by the sender partition's route, or
// sets the sender's failure bit.
func (sw *IDTSwitch) send(from *IDTPort, n int, v uint32) {
	route := sw.msgctl[from.part][n]
	reg, part := route&3, int(route>>4)&7
	q := sw.partOf(part)
	if q == nil || q.absent || q.msgSts&(1<<(16+reg)) != 0 {
		from.msgSts |= 1 << n
		return
	}
	q.inMsg[reg], q.inSrc[reg] = v, uint32(from.part)
	q.msgSts |= 1 << (16 + reg)
}

// Windows.

// remap maps window BAR b afresh from its translation: a sink over the
// whole BAR, then each translated slot's memory over it.
func (p *IDTPort) remap(b int) {
	w := p.win[b]
	if w == nil {
		return
	}
	size := uint64(len(w))
	base := unsafe.Pointer(unsafe.SliceData(w))
	if _, err := unix.MmapPtr(-1, 0, base, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED); err != nil {
		panic(fmt.Sprintf("chipmodel: remapping the sink of a window BAR: %v", err)) // the reserved range is ours: cannot fail
	}
	setup := p.barSetup[b]
	if setup&0x80000000 == 0 {
		return
	}
	slot, n := size, 1
	switch (setup >> 11) & 3 {
	case 1:
		slot, n = size/16, 12
	case 2:
		slot, n = size/32, 24
	}
	for i := range n {
		var part int
		var xlat, usable uint64
		if n == 1 {
			part = int(setup>>13) & 7
			xlat = uint64(p.barUT[b])<<32 | uint64(p.barLT[b])
			lim := uint64(p.barLimit[b])
			if setup&0x4 != 0 && b < 5 {
				lim |= uint64(p.barLimit[b+1]) << 32
			}
			if lim > p.barBus[b] {
				usable = min(lim-p.barBus[b], slot)
			}
		} else {
			e := p.lut[b][i]
			if e[2]&0x80000000 == 0 {
				continue
			}
			part, xlat, usable = int(e[2]&0xf), uint64(e[1])<<32|uint64(e[0]), slot
		}
		q := p.sw.partOf(part)
		if q == nil || q.mem == nil || xlat < q.memBus || usable == 0 {
			continue
		}
		moff := xlat - q.memBus
		if moff%p.sw.pageSize != 0 {
			p.sunk++
			continue
		}
		if moff >= uint64(len(q.mem)) {
			continue
		}
		m := min(usable, uint64(len(q.mem))-moff) / p.sw.pageSize * p.sw.pageSize
		if m == 0 {
			continue
		}
		at := unsafe.Add(base, uint64(i)*slot)
		if _, err := unix.MmapPtr(q.memfd, int64(moff), at, uintptr(m), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
			panic(fmt.Sprintf("chipmodel: mapping a window onto memory: %v", err))
		}
	}
}
