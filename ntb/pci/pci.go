//go:build linux

// Package pci finds PCI functions through sysfs and maps their BARs, the
// layer a hardware NTB device (or QEMU's ivshmem, which stands in for one
// between virtual machines) sits on.
//
// Discovery reads /sys/bus/pci/devices (Find, Lookup). A BAR is mapped
// through VFIO when the function is bound to vfio-pci (MapBAR opens its
// IOMMU group; Interrupts then delivers MSI/MSI-X vectors as eventfds read
// through Go's poller), and otherwise through sysfs: resourceN, or
// resourceN_wc for a write-combining mapping where the kernel offers one
// (prefetchable memory BARs), which for a memory window is the difference
// between one posted write per store and full bursts.
//
// Errors match fabric sentinels: a missing function is
// fabric.ErrNotSupported, a BAR that is absent, of I/O space or too small
// is fabric.ErrInvalid, permissions are fs.ErrPermission.
package pci

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/weft-io/weft/fabric"
)

// SysfsRoot is where sysfs is mounted. Tests point a Bus at a fake tree.
const SysfsRoot = "/sys"

// Resource flags from the kernel's IORESOURCE_* bits, as sysfs prints
// them in the resource file.
const (
	ResourceIO       = 0x00000100
	ResourceMem      = 0x00000200
	ResourcePrefetch = 0x00002000
	ResourceMem64    = 0x00100000
)

// NumBARs is the number of standard BARs of a PCI function.
const NumBARs = 6

// Resource is one line of a function's resource file: a BAR's bus
// address range and flags.
type Resource struct {
	Start, End, Flags uint64
}

// Size returns the length of the range, 0 for an unused BAR.
func (r Resource) Size() uint64 {
	if r.End < r.Start || (r.Start == 0 && r.End == 0) {
		return 0
	}
	return r.End - r.Start + 1
}

// IsMem reports whether the BAR is memory space (mappable).
func (r Resource) IsMem() bool { return r.Flags&ResourceMem != 0 }

// Prefetchable reports whether the BAR is prefetchable memory, which is
// what the kernel offers a write-combining mapping of.
func (r Resource) Prefetchable() bool { return r.Flags&ResourcePrefetch != 0 }

// Device is a PCI function as sysfs shows it.
type Device struct {
	// Addr is the domain:bus:device.function address, "0000:00:05.0".
	Addr string
	// Vendor, Device, SubVendor, SubDevice are the IDs; Class the class
	// code (0x050000: RAM controller, which ivshmem reports; 0x068000:
	// other bridge, which NTB functions report).
	Vendor, DeviceID, SubVendor, SubDevice uint16
	Class                                  uint32
	// Revision is the revision ID (0 where sysfs does not show it).
	Revision uint8
	// Driver is the bound kernel driver ("" when none, "vfio-pci").
	Driver string
	// IOMMUGroup is the function's IOMMU group number ("" without one).
	IOMMUGroup string
	// BARs are the six standard BARs from the resource file.
	BARs [NumBARs]Resource
	// Dir is the function's sysfs directory.
	Dir string
}

// Bus is a view of the PCI bus in a sysfs tree.
type Bus struct {
	// Root is the sysfs mount point (SysfsRoot, or a fake tree in tests).
	Root string
}

// Find returns the functions with the given vendor and device IDs (0
// matches any device of the vendor), ordered by address. No match is
// fabric.ErrNotSupported.
func Find(vendor, device uint16) ([]Device, error) {
	return Bus{SysfsRoot}.Find(vendor, device)
}

// Lookup returns the function at addr ("0000:00:05.0" or "00:05.0").
func Lookup(addr string) (Device, error) { return Bus{SysfsRoot}.Lookup(addr) }

// Find is the package-level Find on this bus.
func (b Bus) Find(vendor, device uint16) ([]Device, error) {
	dir := filepath.Join(b.Root, "bus/pci/devices")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("pci: %s: %w: %w", dir, fabric.ErrNotSupported, err)
	}
	var out []Device
	for _, e := range ents {
		d, err := b.read(e.Name())
		if err != nil {
			continue // a function that vanished or that we cannot read
		}
		if d.Vendor == vendor && (device == 0 || d.DeviceID == device) {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("pci: no function %04x:%04x under %s: %w", vendor, device, dir, fabric.ErrNotSupported)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out, nil
}

var addrRE = regexp.MustCompile(`^([0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// NormalizeAddr checks a PCI address and adds the default domain 0000.
func NormalizeAddr(addr string) (string, error) {
	a := strings.ToLower(addr)
	if !addrRE.MatchString(a) {
		return "", fmt.Errorf("pci: %q is not a PCI address (DDDD:BB:DD.F): %w", addr, fabric.ErrInvalid)
	}
	if len(a) == 7 {
		a = "0000:" + a
	}
	return a, nil
}

// Lookup is the package-level Lookup on this bus.
func (b Bus) Lookup(addr string) (Device, error) {
	a, err := NormalizeAddr(addr)
	if err != nil {
		return Device{}, err
	}
	d, err := b.read(a)
	if errors.Is(err, fs.ErrNotExist) {
		return d, fmt.Errorf("pci: no function %s: %w", a, fabric.ErrNotSupported)
	}
	return d, err
}

func (b Bus) read(addr string) (Device, error) {
	dir := filepath.Join(b.Root, "bus/pci/devices", addr)
	d := Device{Addr: addr, Dir: dir}
	var err error
	id := func(name string) uint64 {
		if err != nil {
			return 0
		}
		var v uint64
		v, err = readHex(filepath.Join(dir, name))
		return v
	}
	d.Vendor = uint16(id("vendor"))
	d.DeviceID = uint16(id("device"))
	d.Class = uint32(id("class"))
	if err != nil {
		return d, fmt.Errorf("pci: %s: %w", addr, err)
	}
	// Subsystem IDs are optional in fake trees and some functions.
	if v, e := readHex(filepath.Join(dir, "subsystem_vendor")); e == nil {
		d.SubVendor = uint16(v)
	}
	if v, e := readHex(filepath.Join(dir, "subsystem_device")); e == nil {
		d.SubDevice = uint16(v)
	}
	if v, e := readHex(filepath.Join(dir, "revision")); e == nil {
		d.Revision = uint8(v)
	}
	if l, e := os.Readlink(filepath.Join(dir, "driver")); e == nil {
		d.Driver = filepath.Base(l)
	}
	if l, e := os.Readlink(filepath.Join(dir, "iommu_group")); e == nil {
		d.IOMMUGroup = filepath.Base(l)
	}
	raw, e := os.ReadFile(filepath.Join(dir, "resource"))
	if e != nil {
		return d, fmt.Errorf("pci: %s: %w", addr, e)
	}
	if d.BARs, e = ParseResources(raw); e != nil {
		return d, fmt.Errorf("pci: %s: %w", addr, e)
	}
	return d, nil
}

// ParseResources parses the text of a sysfs resource file: one line per
// resource of three hexadecimal fields (start, end, flags), the first six
// being the BARs. Malformed text is fabric.ErrMalformed.
func ParseResources(raw []byte) ([NumBARs]Resource, error) {
	var out [NumBARs]Resource
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if len(lines) < NumBARs {
		return out, fmt.Errorf("resource file of %d lines, want at least %d: %w", len(lines), NumBARs, fabric.ErrMalformed)
	}
	for i := 0; i < NumBARs; i++ {
		f := strings.Fields(lines[i])
		if len(f) != 3 {
			return out, fmt.Errorf("resource line %d %q: %w", i, lines[i], fabric.ErrMalformed)
		}
		var v [3]uint64
		for j := range f {
			n, err := strconv.ParseUint(strings.TrimPrefix(f[j], "0x"), 16, 64)
			if err != nil || !strings.HasPrefix(f[j], "0x") {
				return out, fmt.Errorf("resource line %d field %q: %w", i, f[j], fabric.ErrMalformed)
			}
			v[j] = n
		}
		r := Resource{Start: v[0], End: v[1], Flags: v[2]}
		if r.End < r.Start {
			return out, fmt.Errorf("resource line %d: end %#x before start %#x: %w", i, r.End, r.Start, fabric.ErrMalformed)
		}
		out[i] = r
	}
	return out, nil
}

func readHex(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if !strings.HasPrefix(s, "0x") {
		return 0, fmt.Errorf("%s: %q is not hexadecimal: %w", path, s, fabric.ErrMalformed)
	}
	v, err := strconv.ParseUint(s[2:], 16, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q: %w", path, s, fabric.ErrMalformed)
	}
	return v, nil
}
