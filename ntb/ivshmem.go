//go:build linux

package ntb

import (
	"fmt"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/ntb/pci"
)

// QEMU's ivshmem-plain function: its BAR 2 is memory that every guest
// (and the host, as the backing file) shares.
const (
	IvshmemVendor = 0x1af4
	IvshmemDevice = 0x1110
	IvshmemBAR    = 2
)

// pciBus is the PCI bus that pci: addresses name: the machine's, or in
// tests a fake sysfs tree, so that the refusal of a function that is not
// shared memory is tested without a real device whose registers the
// broken code would write into.
var pciBus = pci.Bus{Root: pci.SysfsRoot}

// mapPCI maps part of a BAR of the PCI function at addr.
func mapPCI(addr string, bar int, wc bool, off, size uint64) (Mapping, error) {
	d, err := pciBus.Lookup(addr)
	if err != nil {
		return nil, err
	}
	if d.Vendor == IvshmemVendor && d.DeviceID == IvshmemDevice && bar != IvshmemBAR {
		return nil, fmt.Errorf("ntb: %s is ivshmem, whose shared memory is BAR %d, not %d: %w", addr, IvshmemBAR, bar, fabric.ErrInvalid)
	}
	// The bridge's registers are written into the BAR: only plain shared
	// memory may take them (class 05h, memory controller, which ivshmem
	// reports), never a device's register BAR — a hardware NTB's
	// registers are for its register map (OpenHardware, HWDevice).
	if d.Class>>16 != 0x05 {
		return nil, fmt.Errorf("ntb: %s (%04x:%04x, class %06x) is not shared memory: %w",
			addr, d.Vendor, d.DeviceID, d.Class, fabric.ErrNotSupported)
	}
	return asMapping(d.MapBAR(bar, pci.MapOptions{WC: wc, Offset: off, Size: size}))
}

// OpenIvshmem opens a bridge in the shared memory of the ivshmem function
// at addr ("" for the first one found): its BAR 2 holds the bridge's
// registers and both sides' memory, so two virtual machines that share it
// are the two sides of a bridge. See OpenMapping for c.
func OpenIvshmem(addr string, c MappingConfig) (*ShmDevice, error) {
	if addr == "" {
		ds, err := pciBus.Find(IvshmemVendor, IvshmemDevice)
		if err != nil {
			return nil, err
		}
		addr = ds[0].Addr
	}
	m, err := mapPCI(addr, IvshmemBAR, false, 0, 0)
	if err != nil {
		return nil, err
	}
	d, err := OpenMapping("pci:"+addr, m, c)
	if err != nil {
		m.Close()
		return nil, err
	}
	return d, nil
}
