//go:build linux

package pci

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
)

// VFIO ioctls (linux/vfio.h): _IO(';', 100+n), no size or direction bits.
const (
	vfioGetAPIVersion    = 0x3b64
	vfioCheckExtension   = 0x3b65
	vfioSetIOMMU         = 0x3b66
	vfioGroupGetStatus   = 0x3b67
	vfioGroupSetContain  = 0x3b68
	vfioGroupGetDeviceFD = 0x3b6a
	vfioDeviceGetRegion  = 0x3b6c
	vfioDeviceGetIRQInfo = 0x3b6d
	vfioDeviceSetIRQs    = 0x3b6e

	vfioAPIVersion  = 0
	vfioType1IOMMU  = 1
	vfioNoIOMMU     = 8
	vfioGroupViable = 1

	vfioRegionRead  = 1
	vfioRegionWrite = 2
	vfioRegionMmap  = 4

	vfioIRQEventfd = 1 << 0 // VFIO_IRQ_INFO_EVENTFD
	irqDataEventfd = 1 << 2 // VFIO_IRQ_SET_DATA_EVENTFD
	irqDataNone    = 1 << 0 // VFIO_IRQ_SET_DATA_NONE
	irqActTrigger  = 1 << 5 // VFIO_IRQ_SET_ACTION_TRIGGER
)

// IRQ indices of a vfio-pci device.
const (
	IRQIntx = 0
	IRQMSI  = 1
	IRQMSIX = 2
)

// regionInfo is struct vfio_region_info.
type regionInfo struct {
	Argsz, Flags, Index, CapOffset uint32
	Size, Offset                   uint64
}

// irqInfo is struct vfio_irq_info.
type irqInfo struct {
	Argsz, Flags, Index, Count uint32
}

// VFIODevice is a function opened through VFIO: its container, group and
// device file descriptors.
type VFIODevice struct {
	container, group, fd int
	dev                  Device
	irqs                 []*os.File
}

// The kernel's VFIO interface: where its device nodes are and the
// ioctls that go to them. Tests put a fake VFIO driver here (a machine
// without an IOMMU has no /dev/vfio), so what this package does with the
// kernel's answers (region sizes and flags, vector counts) is tested
// without one.
var (
	vfioDir      = "/dev/vfio"
	vfioIoctlPtr = ioctlPtr
	vfioIoctlVal = ioctlVal
)

func ioctlPtr(fd int, req uintptr, p unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(p))
	if e != 0 {
		return e
	}
	return nil
}

func ioctlVal(fd int, req, v uintptr) (uintptr, error) {
	r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, v)
	if e != 0 {
		return 0, e
	}
	return r, nil
}

// OpenVFIO opens d, which must be bound to vfio-pci, through its IOMMU
// group: a container with the type-1 IOMMU (or the no-IOMMU mode a
// kernel booted with vfio.enable_unsafe_noiommu_mode offers).
func OpenVFIO(d Device) (*VFIODevice, error) {
	if d.Driver != "vfio-pci" {
		return nil, fmt.Errorf("pci: %s is bound to %q, not vfio-pci: %w", d.Addr, d.Driver, fabric.ErrNotSupported)
	}
	if d.IOMMUGroup == "" {
		return nil, fmt.Errorf("pci: %s has no IOMMU group: %w", d.Addr, fabric.ErrNotSupported)
	}
	v := &VFIODevice{container: -1, group: -1, fd: -1, dev: d}
	fail := func(what string, err error) (*VFIODevice, error) {
		v.Close()
		return nil, fmt.Errorf("pci: vfio %s: %s: %w", d.Addr, what, err)
	}
	var err error
	if v.container, err = unix.Open(vfioDir+"/vfio", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
		return fail("open container", err)
	}
	if r, err := vfioIoctlVal(v.container, vfioGetAPIVersion, 0); err != nil || r != vfioAPIVersion {
		return fail("API version", errors.Join(err, fabric.ErrNotSupported))
	}
	// A group the kernel made for the no-IOMMU mode has a device node
	// of its own name.
	iommu := uintptr(vfioType1IOMMU)
	gpath := vfioDir + "/" + d.IOMMUGroup
	if _, err := os.Stat(vfioDir + "/noiommu-" + d.IOMMUGroup); err == nil {
		iommu, gpath = vfioNoIOMMU, vfioDir+"/noiommu-"+d.IOMMUGroup
	}
	if r, _ := vfioIoctlVal(v.container, vfioCheckExtension, iommu); r == 0 {
		return fail("IOMMU", fmt.Errorf("the container offers no IOMMU type %d: %w", iommu, fabric.ErrNotSupported))
	}
	if v.group, err = unix.Open(gpath, unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
		return fail("open group "+gpath, err)
	}
	var status [2]uint32 // struct vfio_group_status {argsz, flags}
	status[0] = 8
	if err := vfioIoctlPtr(v.group, vfioGroupGetStatus, unsafe.Pointer(&status)); err != nil {
		return fail("group status", err)
	}
	if status[1]&vfioGroupViable == 0 {
		return fail("group", fmt.Errorf("group %s is not viable (bind all its functions to vfio-pci): %w", d.IOMMUGroup, fabric.ErrNotSupported))
	}
	c := int32(v.container)
	if err := vfioIoctlPtr(v.group, vfioGroupSetContain, unsafe.Pointer(&c)); err != nil {
		return fail("set container", err)
	}
	if _, err := vfioIoctlVal(v.container, vfioSetIOMMU, iommu); err != nil {
		return fail("set IOMMU", err)
	}
	name := append([]byte(d.Addr), 0)
	fd, err := vfioIoctlVal(v.group, vfioGroupGetDeviceFD, uintptr(unsafe.Pointer(&name[0])))
	if err != nil {
		return fail("device fd", err)
	}
	v.fd = int(fd)
	return v, nil
}

// RegionInfo returns the size, file offset and flags of region i (BARs
// are regions 0..5).
func (v *VFIODevice) RegionInfo(i int) (size, offset uint64, flags uint32, err error) {
	ri := regionInfo{Argsz: uint32(unsafe.Sizeof(regionInfo{})), Index: uint32(i)}
	if err := vfioIoctlPtr(v.fd, vfioDeviceGetRegion, unsafe.Pointer(&ri)); err != nil {
		return 0, 0, 0, fmt.Errorf("pci: vfio %s region %d: %w", v.dev.Addr, i, err)
	}
	return ri.Size, ri.Offset, ri.Flags, nil
}

// MapRegion maps size bytes of region i from off.
func (v *VFIODevice) MapRegion(i int, off, size uint64) (*BAR, error) {
	rsize, roff, flags, err := v.RegionInfo(i)
	if err != nil {
		return nil, err
	}
	if flags&vfioRegionMmap == 0 || flags&(vfioRegionRead|vfioRegionWrite) != vfioRegionRead|vfioRegionWrite {
		return nil, fmt.Errorf("pci: vfio %s region %d cannot be mapped read-write (flags %#x): %w", v.dev.Addr, i, flags, fabric.ErrNotSupported)
	}
	if off >= rsize || size > rsize-off || size == 0 {
		return nil, fmt.Errorf("pci: vfio %s region %d: %#x+%#x outside %#x bytes: %w", v.dev.Addr, i, off, size, rsize, fabric.ErrInvalid)
	}
	mem, err := unix.Mmap(v.fd, int64(roff+off), int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("pci: vfio %s mmap region %d: %w", v.dev.Addr, i, err)
	}
	return &BAR{b: mem, via: "vfio"}, nil
}

// IRQCount returns how many vectors interrupt index idx (IRQMSI, ...)
// has, 0 when it cannot signal an eventfd.
func (v *VFIODevice) IRQCount(idx int) (int, error) {
	ii := irqInfo{Argsz: uint32(unsafe.Sizeof(irqInfo{})), Index: uint32(idx)}
	if err := vfioIoctlPtr(v.fd, vfioDeviceGetIRQInfo, unsafe.Pointer(&ii)); err != nil {
		return 0, fmt.Errorf("pci: vfio %s irq info %d: %w", v.dev.Addr, idx, err)
	}
	if ii.Flags&vfioIRQEventfd == 0 {
		return 0, nil
	}
	return int(ii.Count), nil
}

// irqSetEventfds encodes struct vfio_irq_set with one eventfd per vector.
func irqSetEventfds(idx int, fds []int32) []byte {
	b := make([]byte, 20+4*len(fds))
	binary.NativeEndian.PutUint32(b[0:], uint32(len(b)))
	binary.NativeEndian.PutUint32(b[4:], irqDataEventfd|irqActTrigger)
	binary.NativeEndian.PutUint32(b[8:], uint32(idx))
	binary.NativeEndian.PutUint32(b[12:], 0)
	binary.NativeEndian.PutUint32(b[16:], uint32(len(fds)))
	for i, fd := range fds {
		binary.NativeEndian.PutUint32(b[20+4*i:], uint32(fd))
	}
	return b
}

// Interrupts routes n vectors of interrupt index idx to eventfds and
// returns one IRQ per vector. They are released by Close.
func (v *VFIODevice) Interrupts(idx, n int) ([]*IRQ, error) {
	have, err := v.IRQCount(idx)
	if err != nil {
		return nil, err
	}
	if n < 1 || n > have {
		return nil, fmt.Errorf("pci: vfio %s: %d vectors of index %d, it has %d: %w", v.dev.Addr, n, idx, have, fabric.ErrNotSupported)
	}
	fds := make([]int32, n)
	irqs := make([]*IRQ, n)
	for i := range fds {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			for _, q := range irqs[:i] {
				q.f.Close()
			}
			return nil, fmt.Errorf("pci: eventfd: %w", err)
		}
		fds[i] = int32(fd)
		irqs[i] = &IRQ{f: os.NewFile(uintptr(fd), fmt.Sprintf("vfio-irq-%s-%d-%d", v.dev.Addr, idx, i))}
	}
	set := irqSetEventfds(idx, fds)
	if err := vfioIoctlPtr(v.fd, vfioDeviceSetIRQs, unsafe.Pointer(&set[0])); err != nil {
		for _, q := range irqs {
			q.f.Close()
		}
		return nil, fmt.Errorf("pci: vfio %s set irqs: %w", v.dev.Addr, err)
	}
	for _, q := range irqs {
		v.irqs = append(v.irqs, q.f)
	}
	return irqs, nil
}

// IRQ is one interrupt vector delivered to an eventfd, which Go's poller
// waits on (no thread is parked in a read).
type IRQ struct {
	f *os.File
}

// NewIRQ wraps an eventfd (nonblocking) as an IRQ; tests and software
// doorbells use it directly.
func NewIRQ(fd int, name string) *IRQ { return &IRQ{f: os.NewFile(uintptr(fd), name)} }

// Wait blocks until the vector fires at least once or ctx is done, and
// returns how many times it fired since the last Wait.
func (q *IRQ) Wait(ctx context.Context) (uint64, error) {
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { q.f.SetReadDeadline(aLongTimeAgo) })
		defer stop()
	}
	var b [8]byte
	_, err := q.f.Read(b[:])
	q.f.SetReadDeadline(noDeadline)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, err
	}
	return binary.NativeEndian.Uint64(b[:]), nil
}

// Close releases the eventfd.
func (q *IRQ) Close() error { return q.f.Close() }

// Close releases the interrupts and the device, group and container.
func (v *VFIODevice) Close() error {
	for _, f := range v.irqs {
		f.Close()
	}
	v.irqs = nil
	for _, fd := range []*int{&v.fd, &v.group, &v.container} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
	return nil
}

var (
	aLongTimeAgo = time.Unix(1, 0)
	noDeadline   time.Time
)
