//go:build linux

package pci

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
)

// MapOptions selects how a BAR is mapped. The zero value maps all of it
// uncached, through VFIO if the function is bound to vfio-pci.
type MapOptions struct {
	// WC asks for a write-combining mapping (resourceN_wc). Where the
	// kernel offers none (a non-prefetchable BAR), the mapping is uncached
	// and BAR.WC reports false.
	WC bool
	// NoVFIO maps through sysfs even when the function is bound to
	// vfio-pci.
	NoVFIO bool
	// Offset and Size select a page-aligned part of the BAR (Size 0: to
	// its end).
	Offset, Size uint64
}

// BAR is a mapped memory BAR (or part of one).
type BAR struct {
	b   []byte
	wc  bool
	via string
	dev *VFIODevice // set when mapped through VFIO, which Close releases
}

// Bytes returns the mapped memory. Loads and stores go to the device.
func (b *BAR) Bytes() []byte { return b.b }

// WC reports whether the mapping is write-combining.
func (b *BAR) WC() bool { return b.wc }

// Via names the mapping path: "resourceN", "resourceN_wc" or "vfio".
func (b *BAR) Via() string { return b.via }

// Close releases the mapping. The range is first replaced by anonymous
// memory, so a stale slice of the BAR reads zeros instead of faulting.
func (b *BAR) Close() error {
	if b.b == nil {
		return nil
	}
	_, err := unix.MmapPtr(-1, 0, unsafe.Pointer(unsafe.SliceData(b.b)), uintptr(len(b.b)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED|unix.MAP_NORESERVE)
	if err != nil {
		err = unix.Munmap(b.b)
	}
	b.b = nil
	if b.dev != nil {
		if e := b.dev.Close(); err == nil {
			err = e
		}
		b.dev = nil
	}
	return err
}

// checkWindow validates a BAR index and the part of it to map.
func (d *Device) checkWindow(i int, o *MapOptions) (uint64, error) {
	if i < 0 || i >= NumBARs {
		return 0, fmt.Errorf("pci: %s: BAR %d: %w", d.Addr, i, fabric.ErrInvalid)
	}
	r := d.BARs[i]
	size := r.Size()
	switch {
	case size == 0:
		return 0, fmt.Errorf("pci: %s: BAR %d is not implemented: %w", d.Addr, i, fabric.ErrInvalid)
	case !r.IsMem():
		return 0, fmt.Errorf("pci: %s: BAR %d is not memory space (flags %#x): %w", d.Addr, i, r.Flags, fabric.ErrInvalid)
	}
	page := uint64(os.Getpagesize())
	if o.Size == 0 && o.Offset < size {
		o.Size = size - o.Offset
	}
	if o.Offset%page != 0 || o.Offset >= size || o.Size > size-o.Offset || o.Size == 0 {
		return 0, fmt.Errorf("pci: %s: BAR %d range %#x+%#x is outside its %#x bytes or not page aligned: %w",
			d.Addr, i, o.Offset, o.Size, size, fabric.ErrInvalid)
	}
	return size, nil
}

// MapBAR maps memory BAR i of the function: through VFIO when it is bound
// to vfio-pci (unless o.NoVFIO), else through its sysfs resource file.
func (d *Device) MapBAR(i int, o MapOptions) (*BAR, error) {
	if _, err := d.checkWindow(i, &o); err != nil {
		return nil, err
	}
	if d.Driver == "vfio-pci" && !o.NoVFIO {
		v, err := OpenVFIO(*d)
		if err != nil {
			return nil, err
		}
		b, err := v.MapRegion(i, o.Offset, o.Size)
		if err != nil {
			v.Close()
			return nil, err
		}
		b.dev = v
		return b, nil
	}
	name := fmt.Sprintf("resource%d", i)
	wc := false
	if o.WC {
		if _, err := os.Stat(filepath.Join(d.Dir, name+"_wc")); err == nil {
			name, wc = name+"_wc", true
		}
	}
	path := filepath.Join(d.Dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_SYNC, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("pci: %s: %w: %w", path, fabric.ErrNotSupported, err)
		}
		return nil, fmt.Errorf("pci: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() && st.Size() > 0 && uint64(st.Size()) < o.Offset+o.Size {
		return nil, fmt.Errorf("pci: %s is %d bytes, want %d: %w", path, st.Size(), o.Offset+o.Size, fabric.ErrInvalid)
	}
	mem, err := unix.Mmap(int(f.Fd()), int64(o.Offset), int(o.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("pci: mmap %s: %w", path, err)
	}
	return &BAR{b: mem, wc: wc, via: name}, nil
}
