package xsk

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// UMEMConfig configures a UMEM. The zero value selects every default.
type UMEMConfig struct {
	// FrameSize is the size of each frame (chunk): a power of two from
	// 2048 to the page size (0: 4096).
	FrameSize int
	// Frames is the number of frames (0: 4096).
	Frames int
	// Headroom is space the kernel leaves before each received packet,
	// for headers the application prepends (0: none).
	Headroom int
	// FillSize and CompletionSize are the sizes of the fill and
	// completion rings, powers of two (0: 2048).
	FillSize, CompletionSize int
	// Mem, if not nil, is caller memory to register instead of an
	// anonymous mapping. It must be page-aligned, at least
	// FrameSize*Frames bytes, and stay alive and unmoved until the UMEM
	// is closed (use memory from mmap, not the Go heap).
	Mem []byte
}

func (c *UMEMConfig) defaults() {
	if c.FrameSize == 0 {
		c.FrameSize = 4096
	}
	if c.Frames == 0 {
		c.Frames = 4096
	}
	if c.FillSize == 0 {
		c.FillSize = 2048
	}
	if c.CompletionSize == 0 {
		c.CompletionSize = 2048
	}
}

func pow2(n int) bool { return n > 0 && n&(n-1) == 0 }

// UMEM is the packet memory shared between user space and the kernel: a
// region of Frames frames of FrameSize bytes, registered on an AF_XDP
// socket, with a fill ring (frames for reception) and a completion ring
// (frames whose transmission finished).
//
// A UMEM is bound to the first Socket created on it; further sockets
// share it (XDP_SHARED_UMEM). Sockets on the same interface queue share
// its fill and completion rings; sockets on other queues or interfaces
// get rings of their own (Socket.Fill, Socket.Completion).
//
// The UMEM does not track frame ownership: that is the application's (or
// Queue's) job, as in libxdp.
type UMEM struct {
	cfg     UMEMConfig
	mem     []byte
	ownsMem bool
	fd      int
	offs    unix.XDPMmapOffsets
	fill    FillRing
	comp    CompletionRing
	fillMem []byte
	compMem []byte

	mu      sync.Mutex
	bound   bool // fd is bound by a socket
	ifindex int  // of the socket that owns fd
	queue   int
	refs    int // sockets alive, plus one for the UMEM itself
	// needWake and zc are the first socket's need_wakeup and zero-copy
	// settings, which sockets sharing the UMEM inherit.
	needWake bool
	zc       bool
	closed   bool
}

// NewUMEM allocates (or takes, with Mem) the packet memory, creates the
// AF_XDP socket it is registered on and maps its fill and completion
// rings.
func NewUMEM(c UMEMConfig) (*UMEM, error) {
	c.defaults()
	page := os.Getpagesize()
	switch {
	case !pow2(c.FrameSize) || c.FrameSize < 2048 || c.FrameSize > page:
		return nil, umemErr(fmt.Errorf("frame size %d: need a power of two in [2048, %d]: %w", c.FrameSize, page, errInvalid))
	case c.Frames <= 0:
		return nil, umemErr(fmt.Errorf("%d frames: %w", c.Frames, errInvalid))
	case c.Headroom < 0 || c.Headroom > c.FrameSize-256:
		return nil, umemErr(fmt.Errorf("headroom %d: %w", c.Headroom, errInvalid))
	case !pow2(c.FillSize) || !pow2(c.CompletionSize):
		return nil, umemErr(fmt.Errorf("ring sizes %d/%d: need powers of two: %w", c.FillSize, c.CompletionSize, errInvalid))
	}
	size := c.FrameSize * c.Frames
	u := &UMEM{cfg: c, fd: -1, refs: 1}
	if c.Mem != nil {
		if len(c.Mem) < size || uintptr(unsafe.Pointer(&c.Mem[0]))%uintptr(page) != 0 {
			return nil, umemErr(fmt.Errorf("caller memory of %d bytes, need %d page-aligned: %w", len(c.Mem), size, errInvalid))
		}
		u.mem = c.Mem[:size:size]
	} else {
		m, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
		if err != nil {
			return nil, umemErr(os.NewSyscallError("mmap", err))
		}
		u.mem, u.ownsMem = m, true
	}
	if err := u.setup(); err != nil {
		u.release()
		return nil, umemErr(err)
	}
	return u, nil
}

func umemErr(err error) error { return opErr("umem", err) }

func (u *UMEM) setup() error {
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return notSupported(os.NewSyscallError("socket", err))
	}
	u.fd = fd
	reg := unix.XDPUmemReg{
		Addr:     uint64(uintptr(unsafe.Pointer(&u.mem[0]))),
		Len:      uint64(len(u.mem)),
		Size:     uint32(u.cfg.FrameSize),
		Headroom: uint32(u.cfg.Headroom),
	}
	if err := setsockoptPtr(fd, unix.SOL_XDP, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		// Older kernels take the struct without tx_metadata_len.
		if err := setsockoptPtr(fd, unix.SOL_XDP, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Offsetof(reg.Tx_metadata_len)); err != nil {
			return os.NewSyscallError("setsockopt XDP_UMEM_REG", err)
		}
	}
	fm, cm, err := mapUMEMRings(fd, u.cfg.FillSize, u.cfg.CompletionSize, &u.offs)
	if err != nil {
		return err
	}
	u.fillMem, u.compMem = fm, cm
	u.fill.setup(fm, &u.offs.Fr, uint32(u.cfg.FillSize))
	u.comp.setup(cm, &u.offs.Cr, uint32(u.cfg.CompletionSize))
	return nil
}

// mapUMEMRings sizes and maps a fill and a completion ring on fd, using
// the offsets the kernel reports (XDP_MMAP_OFFSETS).
func mapUMEMRings(fd, fillSize, compSize int, offs *unix.XDPMmapOffsets) (fm, cm []byte, err error) {
	if err := sockopt("XDP_UMEM_FILL_RING", fd, unix.SOL_XDP, unix.XDP_UMEM_FILL_RING, fillSize); err != nil {
		return nil, nil, err
	}
	if err := sockopt("XDP_UMEM_COMPLETION_RING", fd, unix.SOL_XDP, unix.XDP_UMEM_COMPLETION_RING, compSize); err != nil {
		return nil, nil, err
	}
	if err := getOffsets(fd, offs); err != nil {
		return nil, nil, err
	}
	fm, err = mmap(fd, unix.XDP_UMEM_PGOFF_FILL_RING, int(offs.Fr.Desc)+fillSize*8, "fill ring")
	if err != nil {
		return nil, nil, err
	}
	cm, err = mmap(fd, unix.XDP_UMEM_PGOFF_COMPLETION_RING, int(offs.Cr.Desc)+compSize*8, "completion ring")
	if err != nil {
		unix.Munmap(fm)
		return nil, nil, err
	}
	return fm, cm, nil
}

func getOffsets(fd int, offs *unix.XDPMmapOffsets) error {
	if err := getsockoptPtr(fd, unix.SOL_XDP, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(offs), unsafe.Sizeof(*offs)); err != nil {
		return os.NewSyscallError("getsockopt XDP_MMAP_OFFSETS", err)
	}
	return nil
}

// Bytes returns the whole packet memory.
func (u *UMEM) Bytes() []byte { return u.mem }

// FrameSize returns the frame (chunk) size.
func (u *UMEM) FrameSize() int { return u.cfg.FrameSize }

// Frames returns the number of frames.
func (u *UMEM) Frames() int { return u.cfg.Frames }

// Headroom returns the configured headroom.
func (u *UMEM) Headroom() int { return u.cfg.Headroom }

// FrameAddr returns the address of frame i (i*FrameSize).
func (u *UMEM) FrameAddr(i int) uint64 { return uint64(i) * uint64(u.cfg.FrameSize) }

// Frame returns the bytes from addr to the end of its frame. Use
// Frame(d.Addr)[:d.Len] to read a received packet.
func (u *UMEM) Frame(addr uint64) []byte {
	end := (addr | uint64(u.cfg.FrameSize-1)) + 1
	return u.mem[addr:end:end]
}

// Data returns the packet a descriptor names.
func (u *UMEM) Data(d *Desc) []byte {
	return u.mem[d.Addr : d.Addr+uint64(d.Len) : d.Addr+uint64(d.Len)]
}

// Fill returns the fill ring of the UMEM's own socket (the first socket
// bound on it and every socket on the same queue).
func (u *UMEM) Fill() *FillRing { return &u.fill }

// Completion returns the completion ring of the UMEM's own socket.
func (u *UMEM) Completion() *CompletionRing { return &u.comp }

// Close releases the UMEM. Sockets still open on it keep the memory
// mapped until they close; the memory is unmapped with the last of them.
// Close is idempotent.
func (u *UMEM) Close() error {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return nil
	}
	u.closed = true
	last := u.unrefLocked()
	u.mu.Unlock()
	if last {
		return u.release()
	}
	return nil
}

func (u *UMEM) unrefLocked() bool {
	u.refs--
	return u.refs == 0
}

func (u *UMEM) release() error {
	var errs []error
	// Rings and packet memory may still be read by a goroutine racing
	// with Close: replace them with empty pages rather than unmap them.
	retire(u, [][]byte{u.fillMem, u.compMem})
	u.fillMem, u.compMem = nil, nil
	if u.fd >= 0 {
		if err := unix.Close(u.fd); err != nil {
			errs = append(errs, os.NewSyscallError("close", err))
		}
		u.fd = -1
	}
	if u.ownsMem && u.mem != nil {
		// u.mem stays set: late readers see zero pages, not a nil slice.
		retire(u, [][]byte{u.mem})
	}
	return errors.Join(errs...)
}
