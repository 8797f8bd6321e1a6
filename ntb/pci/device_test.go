package pci

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
)

// What the kernel tells this package about a device — sysfs files, VFIO's
// answers about regions and vectors — is input it checks: a function
// whose files are malformed is refused with ErrMalformed, a region or
// vector count smaller than asked is refused before anything is mapped
// or routed. The rules are this package's, tested here (issue 29).

// TestMalformedSysfs: a function whose ID or resource files are not what
// the kernel writes is not returned by Lookup, and Find skips it.
func TestMalformedSysfs(t *testing.T) {
	for _, c := range []struct {
		name, file, text string
	}{
		{"vendor not hex", "vendor", "1af4\n"},
		{"vendor garbage", "vendor", "0xzz\n"},
		{"device missing", "device", ""},
		{"class garbage", "class", "0x05000g\n"},
		{"resource of 5 lines", "resource", strings.Repeat("0x0 0x0 0x0\n", 5)},
		{"resource end before start", "resource", "0x2000 0x1fff 0x200\n" + strings.Repeat("0x0 0x0 0x0\n", 5)},
		{"resource missing", "resource", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			dir := fakeFunc(t, root, "0000:00:05.0", 0x1af4, 0x1110, ivshmemBARs(1<<20), nil)
			fakeFunc(t, root, "0000:00:06.0", 0x1af4, 0x1110, ivshmemBARs(1<<20), nil)
			p := filepath.Join(dir, c.file)
			if c.text == "" {
				must(t, os.Remove(p))
			} else {
				must(t, os.WriteFile(p, []byte(c.text), 0o644))
			}
			bus := Bus{root}
			d, err := bus.Lookup("0000:00:05.0")
			if err == nil {
				t.Fatalf("Lookup of a function with a bad %s file = %+v, want an error", c.file, d)
			}
			if c.text == "" && !errors.Is(err, fabric.ErrNotSupported) {
				t.Errorf("missing %s: %v, want ErrNotSupported", c.file, err)
			}
			if c.text != "" && !errors.Is(err, fabric.ErrMalformed) {
				t.Errorf("bad %s: %v, want ErrMalformed", c.file, err)
			}
			// Find skips the bad function and returns the good one.
			ds, err := bus.Find(0x1af4, 0x1110)
			if err != nil || len(ds) != 1 || ds[0].Addr != "0000:00:06.0" {
				t.Fatalf("Find = %+v, %v; want only 0000:00:06.0", ds, err)
			}
		})
	}
	// No bus at all: the cause is kept.
	if _, err := (Bus{t.TempDir()}).Find(0x1af4, 0); !errors.Is(err, fabric.ErrNotSupported) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Find without a bus: %v, want ErrNotSupported wrapping fs.ErrNotExist", err)
	}
}

// TestResourceBounds: a resource line's range at its edges. A range of
// one byte (end == start) is a BAR of one byte; end below start is
// malformed; all zeros is an unused BAR.
func TestResourceBounds(t *testing.T) {
	rest := strings.Repeat("0x0 0x0 0x0\n", 5)
	for _, c := range []struct {
		line string
		size uint64
		bad  bool
	}{
		{"0x1000 0x1000 0x200", 1, false},
		{"0x1000 0x1001 0x200", 2, false},
		{"0x1000 0x0fff 0x200", 0, true},
		{"0x0 0x0 0x0", 0, false},
		{"0x0 0xfff 0x200", 4096, false},
		{"0x0 0xffffffffffffffff 0x200", 0, false}, // wraps: no size, not a huge BAR
	} {
		r, err := ParseResources([]byte(c.line + "\n" + rest))
		switch {
		case c.bad && !errors.Is(err, fabric.ErrMalformed):
			t.Errorf("%q: %v, want ErrMalformed", c.line, err)
		case !c.bad && err != nil:
			t.Errorf("%q: %v", c.line, err)
		case !c.bad && r[0].Size() != c.size:
			t.Errorf("%q: size %d, want %d", c.line, r[0].Size(), c.size)
		}
	}
}

// fakeVFIO is the kernel's VFIO driver as this package sees it: its
// device nodes (regular files in a temporary directory) and its ioctls'
// answers, which a test sets. The device's regions are a regular file,
// so mappings of them work.
type fakeVFIO struct {
	t        *testing.T
	dir      string
	region   string // the file behind the device fd
	api      uintptr
	iommus   map[uintptr]bool
	viable   bool
	regions  map[uint32]regionInfo
	irqs     map[uint32]irqInfo
	fail     map[uintptr]unix.Errno // requests that fail
	setIRQs  [][]byte               // what VFIO_DEVICE_SET_IRQS received
	deviceFD int
}

// newFakeVFIO installs a VFIO whose answers are those of a working
// function with an IOMMU group 7, region 2 of 64 KiB at file offset 1
// MiB (mappable, read-write) and 2 MSI-X vectors.
func newFakeVFIO(t *testing.T) (*fakeVFIO, Device) {
	f := &fakeVFIO{t: t, dir: t.TempDir(), api: vfioAPIVersion, viable: true,
		iommus:  map[uintptr]bool{vfioType1IOMMU: true},
		regions: map[uint32]regionInfo{2: {Size: 64 << 10, Offset: 1 << 20, Flags: vfioRegionRead | vfioRegionWrite | vfioRegionMmap}},
		irqs:    map[uint32]irqInfo{IRQMSIX: {Flags: vfioIRQEventfd, Count: 2}, IRQMSI: {Count: 1}},
		fail:    map[uintptr]unix.Errno{}}
	for _, n := range []string{"vfio", "7"} {
		must(t, os.WriteFile(filepath.Join(f.dir, n), nil, 0o644))
	}
	f.region = filepath.Join(f.dir, "device")
	must(t, os.WriteFile(f.region, make([]byte, 2<<20), 0o644))
	dir, ptr, val := vfioDir, vfioIoctlPtr, vfioIoctlVal
	vfioDir, vfioIoctlPtr, vfioIoctlVal = f.dir, f.ioctlPtr, f.ioctlVal
	t.Cleanup(func() { vfioDir, vfioIoctlPtr, vfioIoctlVal = dir, ptr, val })
	return f, Device{Addr: "0000:00:05.0", Driver: "vfio-pci", IOMMUGroup: "7",
		BARs: [NumBARs]Resource{2: {0xfc000000, 0xfc00ffff, ResourceMem | ResourcePrefetch}}}
}

func (f *fakeVFIO) errno(fd int, req uintptr) error {
	if fd < 0 {
		return unix.EBADF
	}
	if e, ok := f.fail[req]; ok {
		return e
	}
	return nil
}

func (f *fakeVFIO) ioctlVal(fd int, req, v uintptr) (uintptr, error) {
	if err := f.errno(fd, req); err != nil {
		return 0, err
	}
	switch req {
	case vfioGetAPIVersion:
		return f.api, nil
	case vfioCheckExtension:
		if f.iommus[v] {
			return 1, nil
		}
		return 0, nil
	case vfioSetIOMMU:
		return 0, nil
	case vfioGroupGetDeviceFD:
		fd, err := unix.Open(f.region, unix.O_RDWR|unix.O_CLOEXEC, 0)
		f.deviceFD = fd
		return uintptr(fd), err
	}
	f.t.Errorf("value ioctl %#x", req)
	return 0, unix.ENOTTY
}

func (f *fakeVFIO) ioctlPtr(fd int, req uintptr, p unsafe.Pointer) error {
	if err := f.errno(fd, req); err != nil {
		return err
	}
	switch req {
	case vfioGroupGetStatus:
		st := (*[2]uint32)(p)
		st[1] = 0
		if f.viable {
			st[1] = vfioGroupViable
		}
	case vfioGroupSetContain:
	case vfioDeviceGetRegion:
		ri := (*regionInfo)(p)
		r, ok := f.regions[ri.Index]
		if !ok {
			return unix.EINVAL
		}
		ri.Size, ri.Offset, ri.Flags = r.Size, r.Offset, r.Flags
	case vfioDeviceGetIRQInfo:
		ii := (*irqInfo)(p)
		q, ok := f.irqs[ii.Index]
		if !ok {
			return unix.EINVAL
		}
		ii.Flags, ii.Count = q.Flags, q.Count
	case vfioDeviceSetIRQs:
		n := *(*uint32)(p)
		f.setIRQs = append(f.setIRQs, append([]byte(nil), unsafe.Slice((*byte)(p), n)...))
	default:
		f.t.Errorf("pointer ioctl %#x", req)
		return unix.ENOTTY
	}
	return nil
}

// TestVFIOFake maps a BAR through VFIO and routes its vectors, with the
// kernel's side faked: what the package asks and what it does with the
// answers.
func TestVFIOFake(t *testing.T) {
	f, d := newFakeVFIO(t)
	b, err := d.MapBAR(2, MapOptions{Offset: 4096, Size: 8192})
	if err != nil {
		t.Fatal(err)
	}
	if b.Via() != "vfio" || len(b.Bytes()) != 8192 {
		t.Fatalf("mapped via %s, %d bytes", b.Via(), len(b.Bytes()))
	}
	b.Bytes()[3] = 0xa5
	must(t, b.Close())
	raw, _ := os.ReadFile(f.region)
	if raw[1<<20+4096+3] != 0xa5 {
		t.Fatal("a store through the VFIO mapping did not land at the region's file offset plus the BAR offset")
	}
	if _, err := unix.FcntlInt(uintptr(f.deviceFD), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Errorf("the device fd is still open after the BAR's Close: %v", err)
	}

	v, err := OpenVFIO(d)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	// The region's bounds as the kernel reports them: up to its end is
	// mapped, a byte past it is not.
	for _, c := range []struct {
		off, size uint64
		ok        bool
	}{
		{0, 64 << 10, true},
		{60 << 10, 4 << 10, true},
		{60 << 10, 8 << 10, false},
		{0, 64<<10 + 4096, false},
		{64 << 10, 4096, false},
		{0, 0, false},
		{1 << 40, 4096, false},
	} {
		b, err := v.MapRegion(2, c.off, c.size)
		if c.ok != (err == nil) || (!c.ok && !errors.Is(err, fabric.ErrInvalid)) {
			t.Errorf("MapRegion(2, %#x, %#x) = %v, want ok=%v", c.off, c.size, err, c.ok)
		}
		if b != nil {
			b.Close()
		}
	}
	// A region the kernel does not let us map read-write is refused.
	for _, fl := range []uint32{vfioRegionRead | vfioRegionWrite, vfioRegionRead | vfioRegionMmap, vfioRegionWrite | vfioRegionMmap} {
		f.regions[3] = regionInfo{Size: 4096, Offset: 0, Flags: fl}
		if _, err := v.MapRegion(3, 0, 4096); !errors.Is(err, fabric.ErrNotSupported) {
			t.Errorf("region flags %#x: %v, want ErrNotSupported", fl, err)
		}
	}
	if _, err := v.MapRegion(4, 0, 4096); !errors.Is(err, unix.EINVAL) {
		t.Errorf("a region the kernel does not know: %v", err)
	}

	// Vectors: as many as the function has, not one more, not none.
	for _, n := range []int{0, 3, -1} {
		if _, err := v.Interrupts(IRQMSIX, n); !errors.Is(err, fabric.ErrNotSupported) {
			t.Errorf("Interrupts(MSI-X, %d) of 2: %v, want ErrNotSupported", n, err)
		}
	}
	if _, err := v.Interrupts(IRQMSI, 1); !errors.Is(err, fabric.ErrNotSupported) {
		t.Errorf("MSI without eventfd signalling: %v, want ErrNotSupported", err)
	}
	if len(f.setIRQs) != 0 {
		t.Fatalf("refused requests reached the kernel: %d VFIO_DEVICE_SET_IRQS", len(f.setIRQs))
	}
	irqs, err := v.Interrupts(IRQMSIX, 2)
	if err != nil || len(irqs) != 2 || len(f.setIRQs) != 1 {
		t.Fatalf("Interrupts(MSI-X, 2) = %d, %v (%d set calls)", len(irqs), err, len(f.setIRQs))
	}
	if n := *(*uint32)(unsafe.Pointer(&f.setIRQs[0][16])); n != 2 {
		t.Errorf("VFIO_DEVICE_SET_IRQS for %d vectors, want 2", n)
	}
	f.fail[vfioDeviceSetIRQs] = unix.EBUSY
	if _, err := v.Interrupts(IRQMSIX, 1); !errors.Is(err, unix.EBUSY) {
		t.Errorf("SET_IRQS failing: %v, want EBUSY", err)
	}
}

// TestVFIOOpenRefusals: every step of OpenVFIO that the kernel can
// refuse ends it with the kernel's reason (or ErrNotSupported where the
// setup cannot work), and a function not set up for VFIO is refused
// before anything is opened.
func TestVFIOOpenRefusals(t *testing.T) {
	open := func(t *testing.T, d Device) error {
		v, err := OpenVFIO(d)
		if err == nil {
			v.Close()
		}
		return err
	}
	t.Run("NotVFIO", func(t *testing.T) {
		_, d := newFakeVFIO(t)
		d.Driver = "ntb_hw_intel"
		if err := open(t, d); !errors.Is(err, fabric.ErrNotSupported) {
			t.Fatalf("a function bound to %s: %v", d.Driver, err)
		}
	})
	t.Run("NoGroup", func(t *testing.T) {
		_, d := newFakeVFIO(t)
		d.IOMMUGroup = ""
		if err := open(t, d); !errors.Is(err, fabric.ErrNotSupported) {
			t.Fatalf("no IOMMU group: %v", err)
		}
	})
	t.Run("NoContainer", func(t *testing.T) {
		f, d := newFakeVFIO(t)
		must(t, os.Remove(filepath.Join(f.dir, "vfio")))
		if err := open(t, d); !errors.Is(err, unix.ENOENT) {
			t.Fatalf("no /dev/vfio/vfio: %v, want ENOENT", err)
		}
	})
	t.Run("NoGroupNode", func(t *testing.T) {
		f, d := newFakeVFIO(t)
		must(t, os.Remove(filepath.Join(f.dir, "7")))
		if err := open(t, d); !errors.Is(err, unix.ENOENT) {
			t.Fatalf("no group node: %v, want ENOENT", err)
		}
	})
	t.Run("APIVersion", func(t *testing.T) {
		f, d := newFakeVFIO(t)
		f.api = 1
		if err := open(t, d); !errors.Is(err, fabric.ErrNotSupported) {
			t.Fatalf("API version 1: %v, want ErrNotSupported", err)
		}
	})
	t.Run("NoIOMMUType", func(t *testing.T) {
		f, d := newFakeVFIO(t)
		f.iommus = nil
		if err := open(t, d); !errors.Is(err, fabric.ErrNotSupported) {
			t.Fatalf("no IOMMU type: %v, want ErrNotSupported", err)
		}
	})
	t.Run("NoIOMMUMode", func(t *testing.T) {
		// The group of the no-IOMMU mode has its own node, and needs its
		// own IOMMU type.
		f, d := newFakeVFIO(t)
		must(t, os.Rename(filepath.Join(f.dir, "7"), filepath.Join(f.dir, "noiommu-7")))
		if err := open(t, d); !errors.Is(err, fabric.ErrNotSupported) {
			t.Fatalf("no-IOMMU group, type 1 offered only: %v, want ErrNotSupported", err)
		}
		f.iommus[vfioNoIOMMU] = true
		if err := open(t, d); err != nil {
			t.Fatalf("no-IOMMU group: %v", err)
		}
	})
	t.Run("NotViable", func(t *testing.T) {
		f, d := newFakeVFIO(t)
		f.viable = false
		if err := open(t, d); !errors.Is(err, fabric.ErrNotSupported) {
			t.Fatalf("a group that is not viable: %v, want ErrNotSupported", err)
		}
	})
	for req, name := range map[uintptr]string{vfioGroupGetStatus: "GroupStatus", vfioGroupSetContain: "SetContainer",
		vfioSetIOMMU: "SetIOMMU", vfioGroupGetDeviceFD: "DeviceFD"} {
		t.Run(name+"Fails", func(t *testing.T) {
			f, d := newFakeVFIO(t)
			f.fail[req] = unix.EPERM
			if err := open(t, d); !errors.Is(err, unix.EPERM) {
				t.Fatalf("%s failing with EPERM: %v", name, err)
			}
		})
	}
}

// TestVFIOInterruptsOutOfFiles: when the process runs out of file
// descriptors half way through the vectors, the eventfds already made
// are closed and the error is the kernel's.
func TestVFIOInterruptsOutOfFiles(t *testing.T) {
	_, d := newFakeVFIO(t)
	v, err := OpenVFIO(d)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	var old unix.Rlimit
	must(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &old))
	// The lowest free descriptor: with the limit one above it, one
	// eventfd can be made and the second cannot.
	low, err := unix.Dup(0)
	must(t, err)
	unix.Close(low)
	lim := old
	lim.Cur = uint64(low) + 1
	must(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &lim))
	irqs, err := v.Interrupts(IRQMSIX, 2)
	must(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &old))
	if !errors.Is(err, unix.EMFILE) || irqs != nil {
		t.Fatalf("Interrupts out of descriptors = %v, %v; want EMFILE", irqs, err)
	}
	// The first eventfd was closed: the lowest free descriptor is free
	// again.
	again, err := unix.Dup(0)
	must(t, err)
	unix.Close(again)
	if again != low {
		t.Fatalf("descriptor %d still taken after the failed Interrupts (lowest free now %d)", low, again)
	}
}

// TestIoctl: the ioctl wrappers report the kernel's errno, and no error
// when it succeeds.
func TestIoctl(t *testing.T) {
	f, err := os.Open(os.DevNull)
	must(t, err)
	defer f.Close()
	fd := int(f.Fd())
	if _, err := ioctlVal(fd, 0x5451 /* FIOCLEX */, 0); err != nil {
		t.Fatalf("FIOCLEX: %v", err)
	}
	if _, err := ioctlVal(fd, vfioGetAPIVersion, 0); !errors.Is(err, unix.ENOTTY) {
		t.Fatalf("a VFIO ioctl on /dev/null: %v, want ENOTTY", err)
	}
	var fds [2]int
	must(t, unix.Pipe(fds[:]))
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	unix.Write(fds[1], []byte("abc"))
	var n int32
	if err := ioctlPtr(fds[0], unix.TIOCINQ, unsafe.Pointer(&n)); err != nil || n != 3 {
		t.Fatalf("FIONREAD = %d, %v", n, err)
	}
	if err := ioctlPtr(fd, vfioGroupGetStatus, unsafe.Pointer(&n)); !errors.Is(err, unix.ENOTTY) {
		t.Fatalf("a VFIO ioctl on /dev/null: %v, want ENOTTY", err)
	}
}
