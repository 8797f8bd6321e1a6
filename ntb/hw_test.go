package ntb

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/weft-io/weft/fabric"
)

func TestProbeHardwareFake(t *testing.T) {
	sys := t.TempDir()
	pci := filepath.Join(sys, "devices/pci0000:00/0000:03:00.0")
	os.MkdirAll(filepath.Join(pci, "ntb0"), 0o755)
	os.WriteFile(filepath.Join(pci, "vendor"), []byte("0x8086\n"), 0o644)
	os.WriteFile(filepath.Join(pci, "device"), []byte("0x201c\n"), 0o644)
	os.MkdirAll(filepath.Join(sys, "bus/ntb/devices"), 0o755)
	os.Symlink(filepath.Join(pci, "ntb0"), filepath.Join(sys, "bus/ntb/devices/ntb0"))
	hw, err := probeHardware(sys)
	if err != nil || len(hw) != 1 {
		t.Fatalf("probe = %v, %v", hw, err)
	}
	if h := hw[0]; h.Addr != "0000:03:00.0" || h.Vendor != 0x8086 || h.Device != 0x201c || h.Family != "intel" {
		t.Fatalf("probe = %+v", h)
	}
	if _, err := probeHardware(t.TempDir()); !errors.Is(err, fabric.ErrNotSupported) {
		t.Fatalf("empty sysfs: %v", err)
	}
}

func TestProbeHardwareHere(t *testing.T) {
	hw, err := ProbeHardware()
	if errors.Is(err, fabric.ErrNotSupported) {
		t.Logf("no NTB hardware on this machine: %v", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NTB hardware: %+v", hw)
}
