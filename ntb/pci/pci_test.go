package pci

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
)

// fakeFunc writes a function into a fake sysfs tree the way the kernel
// lays it out: the devices directory under /sys/devices and a symlink
// under /sys/bus/pci/devices.
func fakeFunc(t *testing.T, root, addr string, vendor, device uint16, bars map[int]Resource, files map[string]int64) string {
	t.Helper()
	dir := filepath.Join(root, "devices/pci0000:00", addr)
	must(t, os.MkdirAll(dir, 0o755))
	must(t, os.MkdirAll(filepath.Join(root, "bus/pci/devices"), 0o755))
	must(t, os.Symlink(dir, filepath.Join(root, "bus/pci/devices", addr)))
	write := func(name, v string) { must(t, os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644)) }
	write("vendor", fmt.Sprintf("0x%04x\n", vendor))
	write("device", fmt.Sprintf("0x%04x\n", device))
	write("class", "0x050000\n")
	write("subsystem_vendor", "0x1af4\n")
	write("subsystem_device", "0x1100\n")
	res := ""
	for i := 0; i < 13; i++ {
		r := bars[i]
		res += fmt.Sprintf("0x%016x 0x%016x 0x%016x\n", r.Start, r.End, r.Flags)
	}
	write("resource", res)
	for name, size := range files {
		f, err := os.Create(filepath.Join(dir, name))
		must(t, err)
		must(t, f.Truncate(size))
		f.Close()
	}
	return dir
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// ivshmemBARs is what QEMU's ivshmem-plain shows: BAR 0 registers (256
// bytes), BAR 2 shared memory, 64-bit prefetchable.
func ivshmemBARs(size uint64) map[int]Resource {
	return map[int]Resource{
		0: {0xfebf1000, 0xfebf10ff, 0x40200},
		2: {0xfc000000, 0xfc000000 + size - 1, 0x14220c},
	}
}

func TestFindLookupAndMap(t *testing.T) {
	root := t.TempDir()
	fakeFunc(t, root, "0000:00:05.0", 0x1af4, 0x1110, ivshmemBARs(1<<20),
		map[string]int64{"resource0": 256, "resource2": 1 << 20, "resource2_wc": 1 << 20})
	fakeFunc(t, root, "0000:00:03.0", 0x1af4, 0x1000, nil, nil) // virtio-net: no BARs here
	fakeFunc(t, root, "0000:00:04.0", 0x1af4, 0x1110, ivshmemBARs(1<<20), map[string]int64{"resource2": 1 << 20})
	bus := Bus{root}

	ds, err := bus.Find(0x1af4, 0x1110)
	if err != nil || len(ds) != 2 || ds[0].Addr != "0000:00:04.0" || ds[1].Addr != "0000:00:05.0" {
		t.Fatalf("Find = %+v, %v", ds, err)
	}
	if all, _ := bus.Find(0x1af4, 0); len(all) != 3 {
		t.Fatalf("Find(vendor, any) found %d", len(all))
	}
	if _, err := bus.Find(0x8086, 0x201c); !errors.Is(err, fabric.ErrNotSupported) {
		t.Fatalf("absent id: %v", err)
	}
	d, err := bus.Lookup("00:05.0")
	if err != nil {
		t.Fatal(err)
	}
	if d.Vendor != 0x1af4 || d.DeviceID != 0x1110 || d.Class != 0x050000 || d.SubDevice != 0x1100 ||
		d.BARs[2].Size() != 1<<20 || !d.BARs[2].Prefetchable() || !d.BARs[0].IsMem() || d.BARs[1].Size() != 0 {
		t.Fatalf("Lookup = %+v", d)
	}
	if _, err := bus.Lookup("0000:00:09.0"); !errors.Is(err, fabric.ErrNotSupported) {
		t.Fatalf("absent function: %v", err)
	}
	if _, err := bus.Lookup("05.0"); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("bad address: %v", err)
	}

	// A write-combining mapping where resource2_wc exists; the two files
	// are the same memory on a real function, distinct here.
	b, err := d.MapBAR(2, MapOptions{WC: true})
	if err != nil {
		t.Fatal(err)
	}
	if !b.WC() || b.Via() != "resource2_wc" || len(b.Bytes()) != 1<<20 {
		t.Fatalf("WC map: wc=%v via=%s len=%d", b.WC(), b.Via(), len(b.Bytes()))
	}
	stale := b.Bytes()
	stale[100] = 7
	b.Close()
	if stale[100] != 0 { // replaced by anonymous memory, not unmapped
		t.Fatal("stale slice still sees the BAR after Close")
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// Part of a BAR, uncached; stores reach the resource file.
	b, err = d.MapBAR(2, MapOptions{Offset: 64 << 10, Size: 8192})
	if err != nil {
		t.Fatal(err)
	}
	if b.WC() || b.Via() != "resource2" || len(b.Bytes()) != 8192 {
		t.Fatalf("UC map: wc=%v via=%s len=%d", b.WC(), b.Via(), len(b.Bytes()))
	}
	b.Bytes()[1] = 0x5a
	b.Close()
	raw, _ := os.ReadFile(filepath.Join(d.Dir, "resource2"))
	if raw[64<<10+1] != 0x5a {
		t.Fatal("store through the mapping did not reach the resource file")
	}
	// WC asked where it is not offered: uncached.
	d4, _ := bus.Lookup("0000:00:04.0")
	if b, err = d4.MapBAR(2, MapOptions{WC: true}); err != nil || b.WC() {
		t.Fatalf("WC fallback: %v", err)
	}
	b.Close()

	for _, c := range []struct {
		bar  int
		o    MapOptions
		want error
	}{
		{1, MapOptions{}, fabric.ErrInvalid},                // unimplemented BAR
		{7, MapOptions{}, fabric.ErrInvalid},                // no such BAR
		{2, MapOptions{Offset: 1 << 20}, fabric.ErrInvalid}, // past the end
		{2, MapOptions{Offset: 100}, fabric.ErrInvalid},     // misaligned
		{2, MapOptions{Size: 2 << 20}, fabric.ErrInvalid},   // larger than the BAR
		{2, MapOptions{Offset: 4096, Size: 1 << 20}, fabric.ErrInvalid},
	} {
		if _, err := d.MapBAR(c.bar, c.o); !errors.Is(err, c.want) {
			t.Errorf("MapBAR(%d, %+v) = %v, want %v", c.bar, c.o, err, c.want)
		}
	}
	// A BAR whose resource file is missing (unbound, or hidden).
	d3, _ := bus.Lookup("0000:00:03.0")
	d3.BARs[4] = Resource{0xfe000000, 0xfe003fff, 0x140204}
	if _, err := d3.MapBAR(4, MapOptions{}); !errors.Is(err, fabric.ErrNotSupported) {
		t.Fatalf("missing resource file: %v", err)
	}
	// A resource file shorter than the BAR claims.
	os.Truncate(filepath.Join(d4.Dir, "resource2"), 4096)
	if _, err := d4.MapBAR(2, MapOptions{}); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("short resource file: %v", err)
	}
	// vfio-pci without a VFIO group is a typed error, not a fault.
	d.Driver = "vfio-pci"
	if _, err := d.MapBAR(2, MapOptions{}); !errors.Is(err, fabric.ErrNotSupported) {
		t.Fatalf("vfio without group: %v", err)
	}
	if b, err := d.MapBAR(2, MapOptions{NoVFIO: true}); err != nil {
		t.Fatalf("NoVFIO: %v", err)
	} else {
		b.Close()
	}
}

func TestIOBARRefused(t *testing.T) {
	root := t.TempDir()
	fakeFunc(t, root, "0000:00:06.0", 0x8086, 0x100e, map[int]Resource{1: {0xc000, 0xc03f, 0x40101}}, nil)
	d, err := Bus{root}.Lookup("0000:00:06.0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.MapBAR(1, MapOptions{}); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("I/O BAR: %v", err)
	}
}

func TestParseResources(t *testing.T) {
	good := "0x00000000febf1000 0x00000000febf10ff 0x0000000000040200\n" +
		"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" +
		"0x0000000fc0000000 0x0000000fc3ffffff 0x000000000014220c\n" +
		"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" +
		"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" +
		"0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
	r, err := ParseResources([]byte(good))
	if err != nil || r[2].Size() != 64<<20 || r[0].Size() != 256 || r[1].Size() != 0 {
		t.Fatalf("ParseResources = %+v, %v", r, err)
	}
	for _, bad := range []string{"", "0x1 0x2\n", good[:60], "0x10 0x1 0x200\n" + good[58:], "zz 0x1 0x2\n" + good[58:]} {
		if _, err := ParseResources([]byte(bad)); !errors.Is(err, fabric.ErrMalformed) {
			t.Errorf("ParseResources(%q) = %v, want ErrMalformed", bad, err)
		}
	}
}

func FuzzParseResources(f *testing.F) {
	f.Add([]byte("0x0 0x0 0x0\n0x0 0x0 0x0\n0x1000 0x1fff 0x200\n0x0 0x0 0x0\n0x0 0x0 0x0\n0x0 0x0 0x0\n"))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseResources(b)
		if err != nil {
			if !errors.Is(err, fabric.ErrMalformed) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		for _, x := range r {
			if x.End < x.Start {
				t.Fatalf("accepted end before start: %+v", x)
			}
		}
	})
}

func TestIRQSetEncoding(t *testing.T) {
	b := irqSetEventfds(IRQMSIX, []int32{7, 9})
	le := binary.NativeEndian
	if len(b) != 28 || le.Uint32(b) != 28 || le.Uint32(b[4:]) != 1<<2|1<<5 || le.Uint32(b[8:]) != 2 ||
		le.Uint32(b[12:]) != 0 || le.Uint32(b[16:]) != 2 || le.Uint32(b[20:]) != 7 || le.Uint32(b[24:]) != 9 {
		t.Fatalf("vfio_irq_set = % x", b)
	}
}

// TestIRQWait drives an IRQ with a real eventfd, as VFIO signals one:
// the wait goes through Go's poller and honours its context.
func TestIRQWait(t *testing.T) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	q := NewIRQ(fd, "test")
	defer q.Close()
	go func() {
		time.Sleep(10 * time.Millisecond)
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		unix.Write(fd, one[:])
		unix.Write(fd, one[:])
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := q.Wait(ctx)
	for err == nil && n < 2 {
		var m uint64
		m, err = q.Wait(ctx)
		n += m
	}
	if err != nil || n != 2 {
		t.Fatalf("Wait = %d, %v", n, err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if _, err := q.Wait(ctx2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with nothing pending: %v", err)
	}
	ctx3, cancel3 := context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel3)
	if _, err := q.Wait(ctx3); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait cancelled: %v", err)
	}
}

// TestHostPCI looks for ivshmem on this machine: inside the rxe-vm guests
// (run.sh -i) it maps BAR 2 for real.
func TestHostPCI(t *testing.T) {
	ds, err := Find(0x1af4, 0x1110)
	if errors.Is(err, fabric.ErrNotSupported) {
		testenv.SkipNoHardware(t, "ivshmem", fmt.Sprintf("no ivshmem function here (the VM test maps one): %v", err))
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := ds[0].MapBAR(2, MapOptions{WC: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	t.Logf("%s BAR 2: %d bytes via %s", ds[0].Addr, len(b.Bytes()), b.Via())
}

// TestVFIOGuest runs on a machine (a VM with a vIOMMU, or a kernel with
// CONFIG_VFIO_NOIOMMU) whose ivshmem function is bound to vfio-pci, with
// WEFT_VFIO_GUEST=1: BAR 2 maps through VFIO, and what is stored through
// it is what the sysfs mapping of the same BAR reads. The rxe-vm guests
// cannot run it (no IOMMU, and Debian 12's kernel lacks the no-IOMMU
// mode).
func TestVFIOGuest(t *testing.T) {
	if os.Getenv("WEFT_VFIO_GUEST") != "1" {
		testenv.SkipNoHardware(t, "vfio", "set WEFT_VFIO_GUEST=1 where ivshmem is bound to vfio-pci")
	}
	ds, err := Find(0x1af4, 0x1110)
	if err != nil {
		t.Fatal(err)
	}
	d := ds[0]
	if d.Driver != "vfio-pci" || d.IOMMUGroup == "" {
		t.Fatalf("%s: driver %q group %q, want vfio-pci", d.Addr, d.Driver, d.IOMMUGroup)
	}
	const off = 500 << 20
	v, err := d.MapBAR(2, MapOptions{Offset: off, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if v.Via() != "vfio" {
		t.Fatalf("mapped via %s", v.Via())
	}
	s, err := d.MapBAR(2, MapOptions{Offset: off, Size: 1 << 20, NoVFIO: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < 4096; i++ {
		v.Bytes()[i] = byte(i*7 + 3)
	}
	for i := 0; i < 4096; i++ {
		if s.Bytes()[i] != byte(i*7+3) {
			t.Fatalf("byte %d: sysfs reads %#x, VFIO stored %#x", i, s.Bytes()[i], byte(i*7+3))
		}
	}
	vd, err := OpenVFIO(d)
	if err != nil {
		t.Fatal(err)
	}
	defer vd.Close()
	size, _, flags, err := vd.RegionInfo(2)
	if err != nil || size != d.BARs[2].Size() || flags&vfioRegionMmap == 0 {
		t.Fatalf("region 2: size %#x flags %#x, %v (BAR %#x)", size, flags, err, d.BARs[2].Size())
	}
	for _, idx := range []int{IRQIntx, IRQMSI, IRQMSIX} {
		n, err := vd.IRQCount(idx)
		if err != nil {
			t.Fatalf("irq index %d: %v", idx, err)
		}
		t.Logf("irq index %d: %d vectors", idx, n)
		// More vectors than the function has is a typed refusal.
		if _, err := vd.Interrupts(idx, n+1); !errors.Is(err, fabric.ErrNotSupported) {
			t.Fatalf("Interrupts(%d, %d) on a function with %d: %v", idx, n+1, n, err)
		}
		if n > 0 {
			irqs, err := vd.Interrupts(idx, 1)
			if err != nil {
				t.Fatalf("Interrupts(%d, 1): %v", idx, err)
			}
			t.Logf("irq index %d vector 0 routed to an eventfd (%v)", idx, irqs[0] != nil)
		}
	}
	t.Logf("%s: BAR 2 through VFIO (group %s) and sysfs agree", d.Addr, d.IOMMUGroup)
}
