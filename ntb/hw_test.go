package ntb

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
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
		testenv.SkipNoHardware(t, "ntb", fmt.Sprintf("no NTB hardware on this machine: %v", err))
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(hw) == 0 {
		t.Fatal("ProbeHardware found nothing and said nothing")
	}
	for _, h := range hw {
		if h.Addr == "" || h.Vendor == 0 || h.Family == "" {
			t.Errorf("incomplete probe result %+v", h)
		}
	}
	t.Logf("NTB hardware: %+v", hw)
}
