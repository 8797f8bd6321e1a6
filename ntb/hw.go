package ntb

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/weft-io/weft/fabric"
	hwmap "github.com/weft-io/weft/ntb/hw"
)

// HWInfo describes a hardware NTB function found on the PCI bus.
type HWInfo struct {
	// Addr is the PCI address, such as "0000:03:00.0".
	Addr string
	// Vendor and Device are the PCI IDs.
	Vendor, Device uint16
	// Family names the register map: "intel", "amd", "idt", "switchtec".
	Family string
	// Driver is the kernel driver bound to it, if any (ntb_hw_intel, ...).
	Driver string
}

// ntbVendors maps PCI vendor IDs of NTB silicon to register-map families.
// Device IDs within a vendor vary by generation; the kernel's ntb_hw_*
// drivers list them.
var ntbVendors = map[uint16]string{
	0x8086: "intel",     // Xeon NTB (ntb_hw_intel)
	0x1022: "amd",       // AMD NTB (ntb_hw_amd)
	0x1d94: "amd",       // Hygon, AMD register map
	0x111d: "idt",       // IDT PCIe switches (ntb_hw_idt)
	0x11f8: "switchtec", // Microsemi Switchtec (ntb_hw_switchtec)
}

// ProbeHardware lists NTB functions: devices bound to the kernel's NTB
// bus (/sys/bus/ntb/devices) and their PCI identity. It returns
// fabric.ErrNotSupported when the machine has none, the feature-probe
// convention of this module.
func ProbeHardware() ([]HWInfo, error) {
	return probeHardware("/sys")
}

func probeHardware(sys string) ([]HWInfo, error) {
	devs, err := os.ReadDir(filepath.Join(sys, "bus/ntb/devices"))
	if err != nil || len(devs) == 0 {
		return nil, fmt.Errorf("ntb: no NTB hardware (no devices on %s/bus/ntb): %w", sys, fabric.ErrNotSupported)
	}
	var out []HWInfo
	for _, d := range devs {
		// Each NTB bus device's parent is the PCI function.
		link, err := filepath.EvalSymlinks(filepath.Join(sys, "bus/ntb/devices", d.Name()))
		if err != nil {
			continue
		}
		pci := filepath.Dir(link)
		info := HWInfo{Addr: filepath.Base(pci)}
		info.Vendor = uint16(readHex(filepath.Join(pci, "vendor")))
		info.Device = uint16(readHex(filepath.Join(pci, "device")))
		info.Family = ntbVendors[info.Vendor]
		if m, err := hwmap.Lookup(info.Vendor, info.Device); err == nil {
			info.Family = m.Family
		}
		if drv, err := os.Readlink(filepath.Join(pci, "driver")); err == nil {
			info.Driver = filepath.Base(drv)
		}
		out = append(out, info)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("ntb: no NTB hardware: %w", fabric.ErrNotSupported)
	}
	return out, nil
}

func readHex(path string) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	var v uint64
	fmt.Sscanf(strings.TrimSpace(string(b)), "0x%x", &v)
	return v
}
