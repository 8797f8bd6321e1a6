//go:build linux

package ntb

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/liveness"
	"github.com/weft-io/weft/internal/shm"
	"github.com/weft-io/weft/internal/wake"
)

// The emulated bridge is one file, shared by the two sides:
//
//	[0, 4096)                      header: geometry, then one block per side
//	[4096, 4096+mem)               side 0's host memory
//	[4096+mem, 4096+2*mem)         side 1's host memory
//
// Each side block holds that side's registers: state, incarnation,
// doorbell, doorbell mask, a wake sequence and waiter count for doorbell
// sleeps, the inbound
// window translations and the scratchpads. A side owns its block while it
// holds an open-file-description lock on byte 1+side of the file; the
// kernel drops the lock when the process dies, which is how the peer sees
// a crash as link-down.
const (
	shmMagic       = 0x01424e5446455700 // "\x00WEFTNB\x01" little-endian
	shmLayout      = 1
	shmHeaderSize  = 4096
	sideBlockOff   = 512
	sideBlockSize  = 1024
	maxMWs         = 4
	maxSpads       = 32
	hdrMagic       = 0
	hdrLayout      = 8
	hdrSpads       = 12
	hdrMemSize     = 16
	hdrMWs         = 24
	hdrDBValid     = 32
	hdrReady       = 40
	sideState      = 0
	sideIncarn     = 4
	sideDB         = 8
	sideDBMask     = 16
	sideDBSeq      = 24
	sideDBWaiters  = 28
	sideWakeGen    = 32
	sideHeartbeat  = 36 // u32: bumped by a polled side's monitor (mapping devices)
	sideOwner      = 40 // u32: token of the side's owner, 0 when free (mapping devices)
	sideMWTrans    = 64 // maxMWs × {addr, size, valid} at stride 32
	sideSpads      = 256
	stateDetached  = 0
	stateAttached  = 1
	stateEnabled   = 2
	lockInit       = 0
	mwAlign        = 4096
	linkPollPeriod = 2 * time.Millisecond
	shmFormatting  = 0x01424e5446455701 // the magic while a mapping is being formatted
)

// ShmConfig is the geometry of a new emulated bridge. The zero value is
// the default. The side that creates the file sets the geometry; the other
// side adopts it.
type ShmConfig struct {
	// MemSize is each side's host memory, a multiple of 4096 (0: 16 MiB).
	MemSize int
	// MWs is the number of memory windows in each direction (0: 2, max 4).
	MWs int
	// Spads is the number of scratchpads per side (0: 16, max 32).
	Spads int
	// DoorbellBits is the number of doorbell bits (0: 16, max 64).
	DoorbellBits int
}

// ShmDevice is an emulated NTB: two processes (or two goroutines) that open
// the same file are the two sides of a bridge. It implements Device.
type ShmDevice struct {
	path    string
	fd      int    // the bridge file; -1 for a mapping device
	mem     []byte // whole mapping
	side    int
	my, per []byte // side register blocks
	local   []byte // local host memory
	remote  []byte // peer host memory (reached only through the peer's translations)
	memSize uint64
	nMW     int
	nSpad   int
	dbValid uint64

	linkUp  atomic.Bool
	peerInc atomic.Uint32
	events  chan LinkEvent
	stop    chan struct{}
	nudge   chan struct{} // LinkEnable and LinkDisable: poll now
	wg      sync.WaitGroup
	closeMu sync.Mutex
	closed  atomic.Bool

	// Mapping devices (OpenMapping): the two sides need not share a
	// kernel, so presence is a heartbeat and doorbell sleeps poll.
	polled    bool
	pollEvery time.Duration // doorbell sleep poll interval
	linkEvery time.Duration // monitor period
	deadAfter time.Duration // heartbeat silence that means the peer is gone
	token     uint32        // our owner token in sideOwner
	mapping   Mapping
	peerHB    uint32          // monitor only: last peer heartbeat seen
	peerHBAt  int64           // monitor only: when it last changed (liveness.Now)
	stalls    liveness.Stalls // monitor only: for peerHBAt

	dmaMu  sync.Mutex
	dmaCfg EmuDMAConfig
	dma    *emuDMA

	// Doorbell sleeps of a file device park in Go's netpoller on a FIFO
	// next to the bridge file, one per side (bellPath); the peer rings
	// ours, we ring its. nil for a mapping device, whose peer may run in
	// another kernel, and where the FIFO could not be made (DBWait then
	// polls).
	bell     *wake.Parker
	peerBell *wake.Ringer
	sleeps   atomic.Uint64 // DBWait's parks, for tests
	// watch wakes a DBWait parked on bell when its context is done, one
	// per doorbell bit (the lowest of the wait's bits): an endpoint's
	// receive and send sides each have a bit, and their waits keep one
	// context (a connection's deadline, say) from sleep to sleep, which
	// then registers once (wake.CtxWatch), not once per sleep. Set with
	// bell.
	watch []wake.CtxWatch
}

// bellPath is the FIFO that wakes side's doorbell sleeps.
func bellPath(path string, side int) string { return fmt.Sprintf("%s.bell%d", path, side) }

var _ DMADevice = (*ShmDevice)(nil)

// ConfigureDMA sets the emulated engine's channels and depth. It must
// come before the first DMA call.
func (d *ShmDevice) ConfigureDMA(c EmuDMAConfig) error {
	d.dmaMu.Lock()
	defer d.dmaMu.Unlock()
	if d.dma != nil {
		return fmt.Errorf("ntb: the DMA engine is already running: %w", fabric.ErrInvalid)
	}
	d.dmaCfg = c
	return nil
}

// DMA implements DMADevice: the emulated engine, started on first use
// with ConfigureDMA's settings and stopped by Close. Its channels are
// goroutines that copy between local memory and the peer's windows; a
// descriptor is checked against the window's current translation before
// it is queued.
func (d *ShmDevice) DMA() (DMAEngine, error) {
	d.dmaMu.Lock()
	defer d.dmaMu.Unlock()
	if d.closed.Load() {
		return nil, os.ErrClosed
	}
	if d.dma == nil {
		d.dma = newEmuDMA(d, d.dmaCfg)
	}
	return d.dma, nil
}

// check applies the defaults of the windows, scratchpads and doorbells
// (MemSize is the caller's: a file and a mapped BAR size it differently)
// and refuses a geometry the register block cannot describe. OpenShm and
// the mappings of a BAR share it.
func (c *ShmConfig) check() error {
	if c.MWs == 0 {
		c.MWs = 2
	}
	if c.Spads == 0 {
		c.Spads = 16
	}
	if c.DoorbellBits == 0 {
		c.DoorbellBits = 16
	}
	// Each error names the field by its address key (mem, mws, spads,
	// dbbits), which is where a user wrote it.
	bad := func(key string, v int, want string) error {
		return fmt.Errorf("bridge geometry: %s=%d: want %s: %w", key, v, want, fabric.ErrInvalid)
	}
	switch {
	case c.MemSize < mwAlign || c.MemSize%mwAlign != 0:
		return bad("mem", c.MemSize, fmt.Sprintf("a multiple of %d", mwAlign))
	case c.MWs < 1 || c.MWs > maxMWs:
		return bad("mws", c.MWs, fmt.Sprintf("1 to %d windows", maxMWs))
	case c.Spads < 1 || c.Spads > maxSpads:
		return bad("spads", c.Spads, fmt.Sprintf("1 to %d scratchpads", maxSpads))
	case c.DoorbellBits < 1 || c.DoorbellBits > 64:
		return bad("dbbits", c.DoorbellBits, "1 to 64 doorbell bits")
	}
	return nil
}

// OpenShm attaches to the emulated bridge in the file at path, creating the
// file with geometry c if it does not exist. It takes whichever side is
// free and fails with ErrBusy if both are taken. The link comes up once
// both sides are attached and enabled; OpenShm enables the local side.
func OpenShm(path string, c ShmConfig) (*ShmDevice, error) {
	if c.MemSize == 0 {
		c.MemSize = 16 << 20
	}
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("ntb: %w", err)
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	d := &ShmDevice{path: path, fd: fd, events: make(chan LinkEvent, 16), stop: make(chan struct{}), nudge: make(chan struct{}, 1)}
	if err := d.init(c); err != nil {
		unix.Close(fd)
		return nil, err
	}
	d.wg.Add(1)
	go d.monitor()
	return d, nil
}

func lockRange(fd int, cmd int, typ int16, off int64) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: off, Len: 1}
	return unix.FcntlFlock(uintptr(fd), cmd, &lk)
}

func (d *ShmDevice) init(c ShmConfig) error {
	// Serialise creation and attachment with the init lock.
	if err := lockRange(d.fd, unix.F_OFD_SETLKW, unix.F_WRLCK, lockInit); err != nil {
		return fmt.Errorf("ntb: lock %s: %w", d.path, err)
	}
	defer lockRange(d.fd, unix.F_OFD_SETLK, unix.F_UNLCK, lockInit)

	var st unix.Stat_t
	if err := unix.Fstat(d.fd, &st); err != nil {
		return fmt.Errorf("ntb: stat %s: %w", d.path, err)
	}
	fresh := st.Size == 0
	if fresh {
		size := int64(shmHeaderSize) + 2*int64(c.MemSize)
		if err := unix.Ftruncate(d.fd, size); err != nil {
			return fmt.Errorf("ntb: size %s: %w", d.path, err)
		}
		st.Size = size
	}
	if st.Size < shmHeaderSize {
		return fmt.Errorf("ntb: %s is not an emulated bridge (size %d): %w", d.path, st.Size, fabric.ErrInvalid)
	}
	mem, err := unix.Mmap(d.fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("ntb: mmap %s: %w", d.path, err)
	}
	d.mem = mem
	if fresh {
		formatHeader(mem, c)
	}
	if err := d.readHeader(true); err != nil {
		d.unmap()
		return err
	}

	// Take a free side.
	d.side = -1
	for s := 0; s < 2; s++ {
		err := lockRange(d.fd, unix.F_OFD_SETLK, unix.F_WRLCK, int64(1+s))
		if err == nil {
			d.side = s
			break
		}
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES) {
			d.unmap()
			return fmt.Errorf("ntb: lock side %d of %s: %w", s, d.path, err)
		}
	}
	if d.side < 0 {
		d.unmap()
		return fmt.Errorf("ntb: %s: %w", d.path, ErrBusy)
	}
	d.takeSide()
	// A side without its FIFO still works: its sleeps poll (pollEvery).
	if bell, err := wake.ListenFIFO(bellPath(d.path, d.side)); err == nil {
		d.bell = bell
		d.watch = make([]wake.CtxWatch, bits.Len64(d.dbValid))
		for i := range d.watch {
			d.watch[i].Init(d.wakeCtx)
		}
	} else {
		d.pollEvery = fallbackPoll
	}
	d.peerBell = wake.NewRinger(bellPath(d.path, 1-d.side))
	return nil
}

// fallbackPoll is the doorbell sleep's step on a file device whose FIFO
// could not be made (a directory that refuses FIFOs): a wake then waits
// for the sleeper's next look.
const fallbackPoll = 200 * time.Microsecond

// formatHeader writes the geometry of a fresh bridge and publishes it with
// the magic, stored last.
func formatHeader(mem []byte, c ShmConfig) {
	shm.Put32(mem, hdrLayout, shmLayout)
	shm.Put32(mem, hdrSpads, uint32(c.Spads))
	shm.Put64(mem, hdrMemSize, uint64(c.MemSize))
	shm.Put32(mem, hdrMWs, uint32(c.MWs))
	valid := uint64(math.MaxUint64)
	if c.DoorbellBits < 64 {
		valid = 1<<c.DoorbellBits - 1
	}
	shm.Put64(mem, hdrDBValid, valid)
	shm.U64(mem, hdrMagic).Store(shmMagic)
}

// readHeader validates the header of d.mem, which the other side may
// have written, and adopts its geometry. A file holds exactly the bridge
// (exact); a mapping may be larger than the bridge it holds.
func (d *ShmDevice) readHeader(exact bool) error {
	mem := d.mem
	if shm.U64(mem, hdrMagic).Load() != shmMagic || shm.Get32(mem, hdrLayout) != shmLayout {
		return fmt.Errorf("ntb: %s is not an emulated bridge of layout %d: %w", d.path, shmLayout, fabric.ErrInvalid)
	}
	d.memSize = shm.Get64(mem, hdrMemSize)
	d.nMW = int(shm.Get32(mem, hdrMWs))
	d.nSpad = int(shm.Get32(mem, hdrSpads))
	d.dbValid = shm.Get64(mem, hdrDBValid)
	size := uint64(len(mem))
	fits := size >= shmHeaderSize && d.memSize <= (size-shmHeaderSize)/2
	if exact {
		fits = fits && size == shmHeaderSize+2*d.memSize
	}
	if d.memSize%mwAlign != 0 || d.memSize == 0 || !fits || d.dbValid == 0 ||
		d.nMW < 1 || d.nMW > maxMWs || d.nSpad < 1 || d.nSpad > maxSpads {
		return fmt.Errorf("ntb: %s has a corrupt header: %w", d.path, fabric.ErrInvalid)
	}
	return nil
}

// takeSide points the device at its side's registers and memory and
// resets the registers a previous owner of the side left behind.
func (d *ShmDevice) takeSide() {
	mem := d.mem
	d.my = mem[sideBlockOff+d.side*sideBlockSize : sideBlockOff+(d.side+1)*sideBlockSize]
	d.per = mem[sideBlockOff+(1-d.side)*sideBlockSize : sideBlockOff+(2-d.side)*sideBlockSize]
	base := uint64(shmHeaderSize)
	d.local = mem[base+uint64(d.side)*d.memSize : base+uint64(d.side+1)*d.memSize]
	d.remote = mem[base+uint64(1-d.side)*d.memSize : base+uint64(2-d.side)*d.memSize]

	shm.U32(d.my, sideState).Store(stateAttached)
	for i := 0; i < maxSpads; i++ {
		shm.U32(d.my, sideSpads+4*i).Store(0)
	}
	for w := 0; w < maxMWs; w++ {
		shm.U64(d.my, sideMWTrans+32*w+16).Store(0)
	}
	shm.U64(d.my, sideDB).Store(0)
	shm.U64(d.my, sideDBMask).Store(0)
	shm.U32(d.my, sideIncarn).Store(randUint32() | 1)
	shm.U32(d.my, sideState).Store(stateEnabled)
}

func (d *ShmDevice) unmap() {
	if d.mapping != nil {
		d.mapping.Close()
		d.mem = nil
		return
	}
	if d.mem != nil {
		unix.Munmap(d.mem)
		d.mem = nil
	}
}

// Side returns which side of the bridge this device is (0 or 1).
func (d *ShmDevice) Side() int { return d.side }

// Path returns the file of the bridge.
func (d *ShmDevice) Path() string { return d.path }

// peerAttached reports whether the peer holds its side lock and has
// enabled its link.
func (d *ShmDevice) peerAttached() bool {
	if d.polled {
		return d.peerAlive()
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: int64(2 - d.side), Len: 1}
	if err := unix.FcntlFlock(uintptr(d.fd), unix.F_OFD_GETLK, &lk); err != nil {
		return false
	}
	if lk.Type == unix.F_UNLCK {
		return false
	}
	return shm.U32(d.per, sideState).Load() == stateEnabled
}

func (d *ShmDevice) monitor() {
	defer d.wg.Done()
	// A polled device's heartbeat is bumped at a fixed period, which
	// its peer's silence timer counts on; a file device's poll backs off.
	p := pollPeriod{fast: linkPollPeriod, slow: monitorSlow}
	if d.polled {
		p = pollPeriod{fast: d.linkEvery, slow: d.linkEvery}
	}
	t := time.NewTimer(p.next(true))
	defer t.Stop()
	for {
		if d.polled {
			shm.U32(d.my, sideHeartbeat).Add(1)
			// Time the monitor did not run is not the peer's silence.
			now := liveness.Now()
			if st := d.stalls.Check(now); st > 0 {
				liveness.Forward(&d.peerHBAt, st, now)
			}
		}
		up := shm.U32(d.my, sideState).Load() == stateEnabled && d.peerAttached()
		inc := uint32(0)
		if up {
			inc = shm.U32(d.per, sideIncarn).Load()
		}
		oldInc := d.peerInc.Load()
		changed := up != d.linkUp.Load() || (up && inc != oldInc)
		if changed {
			if up && d.linkUp.Load() && inc != oldInc {
				// The peer restarted between two polls: report the
				// down edge first.
				d.linkUp.Store(false)
				d.emit(LinkEvent{Up: false, PeerIncarnation: oldInc})
			}
			d.peerInc.Store(inc)
			d.linkUp.Store(up)
			d.emit(LinkEvent{Up: up, PeerIncarnation: inc})
			d.WakeLocal()
		}
		// While the link is down a peer may attach any moment: poll fast.
		t.Reset(p.next(changed || !up))
		select {
		case <-d.stop:
			return
		case <-t.C:
		case <-d.nudge:
			t.Stop()
			p.next(true)
		}
	}
}

func (d *ShmDevice) emit(e LinkEvent) {
	select {
	case d.events <- e:
	default:
	}
}

// LinkIsUp implements Device.
func (d *ShmDevice) LinkIsUp() bool { return d.linkUp.Load() }

// LinkEnable implements Device.
func (d *ShmDevice) LinkEnable() error {
	if d.closed.Load() {
		return os.ErrClosed
	}
	shm.U32(d.my, sideState).Store(stateEnabled)
	d.nudgeMonitor()
	return nil
}

// nudgeMonitor makes the monitor poll now, at its fast period: a local
// link change is seen at once, not after a backed-off period.
func (d *ShmDevice) nudgeMonitor() {
	select {
	case d.nudge <- struct{}{}:
	default:
	}
}

// LinkDisable implements Device.
func (d *ShmDevice) LinkDisable() error {
	if d.closed.Load() {
		return os.ErrClosed
	}
	shm.U32(d.my, sideState).Store(stateAttached)
	d.nudgeMonitor()
	return nil
}

// LinkEvents implements Device.
func (d *ShmDevice) LinkEvents() <-chan LinkEvent { return d.events }

// PeerIncarnation implements Device.
func (d *ShmDevice) PeerIncarnation() uint32 { return shm.U32(d.per, sideIncarn).Load() }

// Memory implements Device.
func (d *ShmDevice) Memory() []byte { return d.local }

// MWCount implements Device.
func (d *ShmDevice) MWCount() int { return d.nMW }

// PeerMWCount implements Device.
func (d *ShmDevice) PeerMWCount() int { return d.nMW }

// MWGetAlign implements Device.
func (d *ShmDevice) MWGetAlign(widx int) (addrAlign, sizeAlign, sizeMax uint64, err error) {
	if widx < 0 || widx >= d.nMW {
		return 0, 0, 0, fmt.Errorf("ntb: memory window %d: %w", widx, errBadIndex)
	}
	return mwAlign, mwAlign, d.memSize, nil
}

var errBadIndex = errors.New("index out of range")

// MWSetTrans implements Device.
func (d *ShmDevice) MWSetTrans(widx int, addr, size uint64) error {
	if widx < 0 || widx >= d.nMW {
		return fmt.Errorf("ntb: memory window %d: %w", widx, errBadIndex)
	}
	if addr%mwAlign != 0 || size%mwAlign != 0 || size == 0 || addr > d.memSize || size > d.memSize-addr {
		return fmt.Errorf("ntb: window %d translation %#x+%#x: misaligned or outside %#x bytes of memory: %w",
			widx, addr, size, d.memSize, fabric.ErrInvalid)
	}
	t := sideMWTrans + 32*widx
	shm.U64(d.my, t+16).Store(0)
	shm.U64(d.my, t).Store(addr)
	shm.U64(d.my, t+8).Store(size)
	shm.U64(d.my, t+16).Store(1)
	return nil
}

// MWClearTrans implements Device.
func (d *ShmDevice) MWClearTrans(widx int) error {
	if widx < 0 || widx >= d.nMW {
		return fmt.Errorf("ntb: memory window %d: %w", widx, errBadIndex)
	}
	shm.U64(d.my, sideMWTrans+32*widx+16).Store(0)
	return nil
}

// PeerMW implements Device. The translation comes from the peer's
// registers, so it is bounds-checked against the peer's memory.
func (d *ShmDevice) PeerMW(widx int) ([]byte, error) {
	if widx < 0 || widx >= d.nMW {
		return nil, fmt.Errorf("ntb: peer memory window %d: %w", widx, errBadIndex)
	}
	t := sideMWTrans + 32*widx
	if shm.U64(d.per, t+16).Load() != 1 {
		return nil, fmt.Errorf("ntb: peer memory window %d has no translation: %w", widx, fabric.ErrInvalid)
	}
	addr, size := shm.U64(d.per, t).Load(), shm.U64(d.per, t+8).Load()
	if addr > d.memSize || size > d.memSize-addr || size == 0 {
		return nil, fmt.Errorf("ntb: peer memory window %d translation %#x+%#x is outside its memory: %w", widx, addr, size, fabric.ErrInvalid)
	}
	return d.remote[addr : addr+size : addr+size], nil
}

// DBValidMask implements Device.
func (d *ShmDevice) DBValidMask() uint64 { return d.dbValid }

// DBRead implements Device.
func (d *ShmDevice) DBRead() uint64 { return shm.U64(d.my, sideDB).Load() & d.dbValid }

// DBClear implements Device.
func (d *ShmDevice) DBClear(bits uint64) error {
	shm.U64(d.my, sideDB).And(^bits)
	return nil
}

// DBSetMask implements Device.
func (d *ShmDevice) DBSetMask(bits uint64) error {
	shm.U64(d.my, sideDBMask).Or(bits & d.dbValid)
	return nil
}

// DBClearMask implements Device.
func (d *ShmDevice) DBClearMask(bits uint64) error {
	shm.U64(d.my, sideDBMask).And(^bits)
	d.WakeLocal()
	return nil
}

// DBReadMask implements Device.
func (d *ShmDevice) DBReadMask() uint64 { return shm.U64(d.my, sideDBMask).Load() }

// PeerDBSet implements Device. It costs a system call only if the peer is
// asleep in DBWait.
func (d *ShmDevice) PeerDBSet(bits uint64) error {
	if bits&^d.dbValid != 0 {
		return fmt.Errorf("ntb: doorbell bits %#x outside valid mask %#x: %w", bits, d.dbValid, fabric.ErrInvalid)
	}
	shm.U64(d.per, sideDB).Or(bits)
	shm.U32(d.per, sideDBSeq).Add(1)
	if d.peerBell != nil && shm.U32(d.per, sideDBWaiters).Load() != 0 {
		d.peerBell.Ring()
	}
	return nil
}

// WakeLocal implements Device.
func (d *ShmDevice) WakeLocal() {
	shm.U32(d.my, sideWakeGen).Add(1)
	shm.U32(d.my, sideDBSeq).Add(1)
	if d.bell != nil && shm.U32(d.my, sideDBWaiters).Load() != 0 {
		d.bell.Ring()
	}
}

// DBWait implements Device. It parks the goroutine in Go's netpoller on
// this side's FIFO (no OS thread blocks), which a PeerDBSet from the
// other process rings when it sees a sleeper: the sleeper counts itself
// in the shared file, then re-checks the wake sequence, so no doorbell is
// lost between the check and the park. It returns with no bits set when
// WakeLocal was called (Close, link changes). On a mapping device
// (OpenMapping) the two sides may run in different kernels, where no
// descriptor reaches the peer: there it sleeps in steps of
// MappingConfig.Poll and re-checks the doorbell after each.
func (d *ShmDevice) DBWait(ctx context.Context, bits uint64) (uint64, error) {
	db, mask := shm.U64(d.my, sideDB), shm.U64(d.my, sideDBMask)
	seq, waiters, gen := shm.U32(d.my, sideDBSeq), shm.U32(d.my, sideDBWaiters), shm.U32(d.my, sideWakeGen)
	pending := func() uint64 { return db.Load() & bits &^ mask.Load() }
	g := gen.Load()
	var hold wake.Hold
	held := false
	defer func() {
		if held {
			hold.Release()
		}
	}()
	for {
		if set := pending(); set != 0 {
			return set, nil
		}
		if d.closed.Load() {
			return 0, os.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if gen.Load() != g {
			return 0, nil
		}
		s := seq.Load()
		if set := pending(); set != 0 {
			return set, nil
		}
		if d.bell == nil {
			time.Sleep(d.pollEvery) // then sees ctx done
			continue
		}
		if !held {
			hold, held = d.watchFor(bits).Hold(ctx), true
		}
		waiters.Add(1)
		d.sleeps.Add(1)
		// Only this wait's bits (or a local wake-up) end the park: other
		// queues' doorbells on the bridge re-check here, without a trip
		// through the caller's loop.
		err := d.bell.Wait(func() bool {
			return seq.Load() != s && (pending() != 0 || gen.Load() != g || d.closed.Load() || ctx.Err() != nil)
		})
		waiters.Add(^uint32(0))
		if err != nil {
			return 0, os.ErrClosed
		}
	}
}

// watchFor returns the context watch of a DBWait on bits: its lowest
// valid bit's.
func (d *ShmDevice) watchFor(b uint64) *wake.CtxWatch {
	return &d.watch[bits.TrailingZeros64(b&d.dbValid|1<<63)%len(d.watch)]
}

// wakeCtx wakes this side's DBWaits to re-check their contexts (a
// wake.CtxWatch's function): unlike WakeLocal, the others go on waiting.
func (d *ShmDevice) wakeCtx() {
	shm.U32(d.my, sideDBSeq).Add(1)
	d.bell.Ring()
}

// armDB counts a wait set's sleeper on this side, so that the peer's
// PeerDBSet rings the FIFO, and returns the FIFO's descriptor for the set
// to watch: -1 (and nothing counted) on a device without one.
func (d *ShmDevice) armDB() int {
	if d.bell == nil || d.closed.Load() {
		return -1
	}
	shm.U32(d.my, sideDBWaiters).Add(1)
	return d.bell.FD()
}

// disarmDB undoes armDB and consumes the FIFO's wake-ups (unless a DBWait
// is parked on it, which consumes them itself).
func (d *ShmDevice) disarmDB() {
	shm.U32(d.my, sideDBWaiters).Add(^uint32(0))
	d.bell.Drain()
}

func (d *ShmDevice) spad(block []byte, idx int) (*atomic.Uint32, error) {
	if idx < 0 || idx >= d.nSpad {
		return nil, fmt.Errorf("ntb: scratchpad %d: %w", idx, errBadIndex)
	}
	return shm.U32(block, sideSpads+4*idx), nil
}

// SpadCount implements Device.
func (d *ShmDevice) SpadCount() int { return d.nSpad }

// SpadRead implements Device.
func (d *ShmDevice) SpadRead(idx int) (uint32, error) {
	p, err := d.spad(d.my, idx)
	if err != nil {
		return 0, err
	}
	return p.Load(), nil
}

// SpadWrite implements Device.
func (d *ShmDevice) SpadWrite(idx int, v uint32) error {
	p, err := d.spad(d.my, idx)
	if err != nil {
		return err
	}
	p.Store(v)
	return nil
}

// PeerSpadRead implements Device.
func (d *ShmDevice) PeerSpadRead(idx int) (uint32, error) {
	p, err := d.spad(d.per, idx)
	if err != nil {
		return 0, err
	}
	return p.Load(), nil
}

// PeerSpadWrite implements Device.
func (d *ShmDevice) PeerSpadWrite(idx int, v uint32) error {
	p, err := d.spad(d.per, idx)
	if err != nil {
		return err
	}
	p.Store(v)
	return nil
}

// Close implements Device. It detaches the side, so the peer sees the link
// go down, and releases the file. The mapping is replaced in place by private anonymous
// memory rather than unmapped, so a stale slice of window memory that the
// application still holds reads zeros instead of crashing the process.
func (d *ShmDevice) Close() error {
	d.closeMu.Lock()
	defer d.closeMu.Unlock()
	if d.closed.Swap(true) {
		return nil
	}
	close(d.stop)
	d.wg.Wait()
	d.dmaMu.Lock()
	if d.dma != nil {
		d.dma.close()
	}
	d.dmaMu.Unlock()
	shm.U32(d.my, sideState).Store(stateDetached)
	d.linkUp.Store(false)
	d.WakeLocal()
	if d.bell != nil {
		d.bell.Close()
		for i := range d.watch {
			d.watch[i].Stop()
		}
	}
	if d.peerBell != nil {
		d.peerBell.Close()
	}
	if d.mapping != nil {
		shm.U32(d.my, sideOwner).CompareAndSwap(d.token, 0)
		return d.mapping.Close()
	}
	// Replace the shared mapping in place with private anonymous memory.
	_, err := unix.MmapPtr(-1, 0, unsafePointer(d.mem), uintptr(len(d.mem)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED|unix.MAP_NORESERVE)
	if err != nil {
		unix.Munmap(d.mem)
	}
	return unix.Close(d.fd)
}

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }
