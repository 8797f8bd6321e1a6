package ntb

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/shm"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/ntb/pci"
)

// fastMapping is a MappingConfig with short periods for tests on one host.
func fastMapping(side int) MappingConfig {
	return MappingConfig{Side: side, Poll: 50 * time.Microsecond, Link: 2 * time.Millisecond, Dead: 100 * time.Millisecond}
}

func openMapped(t testing.TB, path string, off, size int64, c MappingConfig) *ShmDevice {
	t.Helper()
	m, err := MapFile(path, off, size)
	if err != nil {
		t.Fatal(err)
	}
	d, err := OpenMapping(path, m, c)
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestMappingSidesBusyAndDeath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bar")
	a := openMapped(t, path, 0, 4<<20, fastMapping(-1))
	b := openMapped(t, path, 0, 4<<20, fastMapping(-1))
	if a.Side() == b.Side() {
		t.Fatalf("both took side %d", a.Side())
	}
	// The geometry fills the mapping: (4 MiB - 4 KiB) / 2, page aligned.
	if want := (4<<20 - 4096) / 2 &^ 4095; len(a.Memory()) != want || len(b.Memory()) != want {
		t.Fatalf("memory %d, %d, want %d", len(a.Memory()), len(b.Memory()), want)
	}
	waitLink(t, a, true)
	waitLink(t, b, true)

	// Both sides alive: a third attacher is refused once Attach passes.
	m, _ := MapFile(path, 0, 4<<20)
	c := fastMapping(-1)
	c.Attach = 300 * time.Millisecond
	if _, err := OpenMapping(path, m, c); !errors.Is(err, ErrBusy) {
		t.Fatalf("third attach: %v, want ErrBusy", err)
	}
	m.Close()

	// Doorbells cross without a futex: the sleeper polls.
	got := make(chan uint64, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		bits, _ := b.DBWait(ctx, 4)
		got <- bits
	}()
	time.Sleep(5 * time.Millisecond)
	a.PeerDBSet(4)
	if bits := testenv.Recv(t, got, "the DBWait the peer's doorbell ends"); bits != 4 {
		t.Fatalf("DBWait = %#x, want 4", bits)
	}

	// b dies without detaching: its heartbeat stops, its owner word stays.
	b.closed.Store(true) // Close becomes a no-op: nothing detaches
	close(b.stop)
	b.wg.Wait()
	waitLink(t, a, false)
	// Its side is taken over once the heartbeat has been silent for Dead.
	start := time.Now()
	d := openMapped(t, path, 0, 4<<20, fastMapping(b.Side()))
	if time.Since(start) < 100*time.Millisecond {
		t.Fatalf("took a silent side after %v, before Dead", time.Since(start))
	}
	waitLink(t, a, true)
	waitLink(t, d, true)
	// A clean close frees the side at once.
	a.Close()
	waitLink(t, d, false)
	start = time.Now()
	e := openMapped(t, path, 0, 4<<20, fastMapping(-1))
	if e.Side() != 1-d.Side() || time.Since(start) > 50*time.Millisecond {
		t.Fatalf("side %d after %v", e.Side(), time.Since(start))
	}
	waitLink(t, d, true)
}

// TestMappingStoppedProcess: a stop of the whole process (a loaded host
// or a paused VM) five Dead periods long is not the peer's death. Both
// sides are in the stopped process, so neither heartbeat moved during
// the stop; the first monitor poll after it took the link down (and a
// claim would have taken over a live side) before the other side's
// monitor could beat again.
func TestMappingStoppedProcess(t *testing.T) {
	testenv.RequireLinux(t)
	path := filepath.Join(t.TempDir(), "bar")
	a := openMapped(t, path, 0, 1<<20, fastMapping(-1))
	b := openMapped(t, path, 0, 1<<20, fastMapping(-1))
	waitLink(t, a, true)
	waitLink(t, b, true)
	for _, d := range []*ShmDevice{a, b} {
		select {
		case ev := <-d.LinkEvents(): // the link coming up
			if !ev.Up {
				t.Fatalf("side %d: first link event %+v", d.Side(), ev)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("side %d: no link-up event", d.Side())
		}
	}
	beats := func(d *ShmDevice) uint32 { return shm.U32(d.my, sideHeartbeat).Load() }
	for range 3 {
		testenv.StopProcess(t, 5*fastMapping(0).Dead)
		ha, hb := beats(a), beats(b)
		time.Sleep(2 * fastMapping(0).Dead) // the monitors' polls after it
		// Each monitor has beaten twice since the resume: a whole poll ran.
		if !testenv.Eventually(5*time.Second, func() bool { return beats(a)-ha >= 2 && beats(b)-hb >= 2 }) {
			t.Fatal("the monitors did not run after the stop")
		}
	}
	for _, d := range []*ShmDevice{a, b} {
		select {
		case ev := <-d.LinkEvents():
			t.Fatalf("side %d after the stops: link event %+v", d.Side(), ev)
		default:
		}
	}
}

func TestMappingBadInput(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bar")
	if err := os.WriteFile(path, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	// Garbage where a header should be.
	junk := make([]byte, 1<<20)
	for i := range junk {
		junk[i] = byte(i*7 + 1)
	}
	os.WriteFile(path, junk, 0o600)
	m, _ := MapFile(path, 0, 0)
	if _, err := OpenMapping(path, m, fastMapping(-1)); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("garbage: %v", err)
	}
	m.Close()
	// A header that claims more memory than the mapping holds.
	clear(junk)
	os.WriteFile(path, junk, 0o600)
	m, _ = MapFile(path, 0, 0)
	formatHeader(m.Bytes(), ShmConfig{MemSize: 1 << 20, MWs: 2, Spads: 16, DoorbellBits: 16})
	if _, err := OpenMapping(path, m, fastMapping(-1)); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("oversized header: %v", err)
	}
	m.Close()
	// Too small, a bad side, memory that does not fit.
	m, _ = MapFile(path, 0, 8192)
	if _, err := OpenMapping(path, m, fastMapping(-1)); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("tiny mapping: %v", err)
	}
	m.Close()
	m, _ = MapFile(filepath.Join(t.TempDir(), "b2"), 0, 1<<20)
	if _, err := OpenMapping(path, m, MappingConfig{Side: 2}); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("side 2: %v", err)
	}
	if _, err := OpenMapping(path, m, MappingConfig{Geometry: ShmConfig{MemSize: 1 << 20}}); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("memory too large: %v", err)
	}
	m.Close()
}

// TestConformanceMapping runs the suite over the register block in a
// shared mapping with heartbeat presence and polled doorbells: what two
// virtual machines sharing an ivshmem BAR run, here in one kernel.
func TestConformanceMapping(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		path := filepath.Join(t.TempDir(), "bar")
		return fabrictest.OpenPair(t, 20*time.Second, func(ctx context.Context, s fabrictest.Side) (fabric.Endpoint, error) {
			return fabric.Open(ctx, "ntb", "mem:"+path+"?size=16M&poll=50us&link=2ms&dead=200ms&side="+strconv.Itoa(int(s)), nil)
		})
	})
}

// FuzzMappingHeader opens a bridge over a mapping whose header and side
// blocks hold arbitrary bytes, as a broken or hostile peer on the other
// machine could leave them: it must fail with a typed error or open a
// device whose memory lies inside the mapping, and never panic.
func FuzzMappingHeader(f *testing.F) {
	good := make([]byte, shmHeaderSize)
	formatHeader(good, ShmConfig{MemSize: 64 << 10, MWs: 2, Spads: 16, DoorbellBits: 16})
	f.Add(good)
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, hdr []byte) {
		path := filepath.Join(t.TempDir(), "bar")
		m, err := MapFile(path, 0, 256<<10)
		if err != nil {
			t.Fatal(err)
		}
		copy(m.Bytes(), hdr)
		c := fastMapping(-1)
		c.Attach = 20 * time.Millisecond
		d, err := OpenMapping(path, m, c)
		if err != nil {
			if !errors.Is(err, fabric.ErrInvalid) && !errors.Is(err, ErrBusy) {
				t.Fatalf("untyped error %v", err)
			}
			m.Close()
			return
		}
		defer d.Close()
		lo, hi := uintptr(unsafe.Pointer(unsafe.SliceData(d.mem))), uintptr(unsafe.Pointer(unsafe.SliceData(d.mem)))+uintptr(len(d.mem))
		for _, b := range [][]byte{d.local, d.remote, d.my, d.per} {
			p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
			if p < lo || p+uintptr(len(b)) > hi {
				t.Fatalf("a slice lies outside the mapping")
			}
		}
		for w := 0; w < d.MWCount(); w++ {
			d.MWSetTrans(w, 0, uint64(len(d.local)))
			if pw, err := d.PeerMW(w); err == nil {
				p := uintptr(unsafe.Pointer(unsafe.SliceData(pw)))
				if p < lo || p+uintptr(len(pw)) > hi {
					t.Fatalf("peer window outside the mapping")
				}
			}
		}
	})
}

// TestPCIAddressErrors: a pci: address that names no function, or a
// function that is not shared memory, fails with a typed error before
// anything is mapped.
func TestPCIAddressErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for addr, want := range map[string]error{
		"pci:0000:7f:1f.7":            fabric.ErrNotSupported, // absent
		"pci:zz:00.0":                 fabric.ErrInvalid,      // not an address
		"pci:0000:00:05.0?side=2":     fabric.ErrInvalid,
		"pci:0000:00:05.0?poll=-1ms":  fabric.ErrInvalid,
		"pci:0000:00:05.0?listener=1": fabric.ErrNotSupported,
	} {
		if _, err := fabric.Open(ctx, "ntb", addr, nil); !errors.Is(err, want) {
			t.Errorf("Open(%q) = %v, want %v", addr, err, want)
		}
	}
	// A function that is not class 05h is refused, never mapped: on a
	// fake bus, so a broken check writes into a file, not into a real
	// device's registers.
	root := t.TempDir()
	fakeSysfsFunc(t, root, "0000:00:07.0", 0x8086, 0x201c, map[int]uint64{2: 1 << 20}) // class 0x068000
	fakeSysfsFunc(t, root, "0000:00:05.0", IvshmemVendor, IvshmemDevice, map[int]uint64{0: 4096, 2: 1 << 20})
	if err := os.WriteFile(filepath.Join(root, "devices/pci0000:00/0000:00:05.0/class"), []byte("0x050000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	saved := pciBus
	pciBus = pci.Bus{Root: root}
	defer func() { pciBus = saved }()
	for addr, want := range map[string]error{
		"pci:0000:00:07.0":       fabric.ErrNotSupported, // an NTB function: registers, not shared memory
		"pci:0000:00:05.0?bar=0": fabric.ErrInvalid,      // ivshmem's registers, not its memory
	} {
		if _, err := fabric.Open(ctx, "ntb", addr, nil); !errors.Is(err, want) {
			t.Errorf("Open(%q) = %v, want %v", addr, err, want)
		}
	}
	for _, f := range []string{"0000:00:07.0/resource2", "0000:00:05.0/resource0"} {
		b, err := os.ReadFile(filepath.Join(root, "devices/pci0000:00", f))
		if err != nil || !bytes.Equal(b, make([]byte, len(b))) {
			t.Errorf("%s was written (%v)", f, err)
		}
	}
	// Shared memory (class 05h) at BAR 2 opens, through the fake bus:
	// the bridge's header lands in the resource file.
	d, err := OpenIvshmem("", fastMapping(0))
	if err != nil {
		t.Fatalf("OpenIvshmem on the fake bus: %v", err)
	}
	d.Close()
	b, _ := os.ReadFile(filepath.Join(root, "devices/pci0000:00/0000:00:05.0/resource2"))
	if shm.Get32(b, hdrLayout) != shmLayout {
		t.Fatal("no bridge header in the ivshmem function's BAR 2")
	}
}

// TestMappingFreedSideTakenAtOnce: an attacher waiting for a side while
// both are owned takes one the moment its owner closes cleanly (its
// owner word back to 0), not after Dead, which is for owners that died.
func TestMappingFreedSideTakenAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bar")
	slow := fastMapping(-1)
	slow.Dead = 5 * time.Second
	a := openMapped(t, path, 0, 4<<20, slow)
	openMapped(t, path, 0, 4<<20, slow)
	type res struct {
		d   *ShmDevice
		err error
	}
	ch := make(chan res, 1)
	go func() {
		m, err := MapFile(path, 0, 4<<20)
		if err != nil {
			ch <- res{nil, err}
			return
		}
		c := slow
		c.Attach = 20 * time.Second
		d, err := OpenMapping(path, m, c)
		if err != nil {
			m.Close()
		}
		ch <- res{d, err}
	}()
	// The attacher is, all but surely, past its first look for a free
	// side and in its wait; if it were not, it would find a's side free
	// at its first look, and the test would pass as well.
	time.Sleep(100 * time.Millisecond)
	side := a.Side()
	closed := time.Now()
	a.Close()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("the waiting attacher: %v", r.err)
		}
		defer r.d.Close()
		if took := time.Since(closed); r.d.Side() != side || took >= slow.Dead {
			t.Fatalf("took side %d %v after side %d was freed, want it before Dead (%v)", r.d.Side(), took, side, slow.Dead)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting attacher did not take the freed side within 20 s")
	}
}

// TestMappingExactFit: a mapping that holds exactly the bridge its header
// describes (header plus both sides' memory) opens; one page less does
// not.
func TestMappingExactFit(t *testing.T) {
	const mem = 1 << 20
	for _, c := range []struct {
		size int64
		ok   bool
	}{
		{shmHeaderSize + 2*mem, true},
		{shmHeaderSize + 2*mem + 4096, true},
		{shmHeaderSize + 2*mem - 4096, false},
	} {
		path := filepath.Join(t.TempDir(), "bar")
		m, err := MapFile(path, 0, shmHeaderSize+2*mem+4096)
		if err != nil {
			t.Fatal(err)
		}
		formatHeader(m.Bytes(), ShmConfig{MemSize: mem, MWs: 2, Spads: 16, DoorbellBits: 16})
		m.Close()
		m, err = MapFile(path, 0, c.size)
		if err != nil {
			t.Fatal(err)
		}
		d, err := OpenMapping(path, m, fastMapping(-1))
		if c.ok != (err == nil) || (!c.ok && !errors.Is(err, fabric.ErrInvalid)) {
			t.Errorf("a mapping of %d bytes for a bridge of %d: %v, want ok=%v", c.size, shmHeaderSize+2*mem, err, c.ok)
		}
		if err != nil {
			m.Close()
			continue
		}
		if len(d.Memory()) != mem {
			t.Errorf("memory of %d bytes, the header says %d", len(d.Memory()), mem)
		}
		d.Close()
	}
}

// TestMapFileNothingPastOffset: size 0 maps the rest of the file; with
// nothing past the offset that is a typed error, not an mmap of 0 bytes.
func TestMapFileNothingPastOffset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bar")
	if err := os.WriteFile(path, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	for off, ok := range map[int64]bool{0: true, 4096: true, 8192: false, 12288: false} {
		m, err := MapFile(path, off, 0)
		if ok != (err == nil) || (!ok && !errors.Is(err, fabric.ErrInvalid)) {
			t.Errorf("MapFile(8 KiB file, %d, 0) = %v, want ok=%v", off, err, ok)
		}
		if err == nil {
			if len(m.Bytes()) != int(8192-off) {
				t.Errorf("MapFile(8 KiB file, %d, 0) mapped %d bytes", off, len(m.Bytes()))
			}
			m.Close()
		}
	}
}

// TestHeaderBounds: the geometry in a bridge's header is what the side
// that formatted it wrote (across machines, the other machine): each
// count is taken from 1 to its maximum and refused at 0 and one above,
// before anything is laid out from it.
func TestHeaderBounds(t *testing.T) {
	const mem = 64 << 10
	base := ShmConfig{MemSize: mem, MWs: 2, Spads: 16, DoorbellBits: 16}
	for _, c := range []struct {
		name string
		edit func(*ShmConfig)
		ok   bool
	}{
		{"AsIs", func(*ShmConfig) {}, true},
		{"NoWindows", func(c *ShmConfig) { c.MWs = 0 }, false},
		{"OneWindow", func(c *ShmConfig) { c.MWs = 1 }, true},
		{"MaxWindows", func(c *ShmConfig) { c.MWs = maxMWs }, true},
		{"WindowsAboveMax", func(c *ShmConfig) { c.MWs = maxMWs + 1 }, false},
		{"NoScratchpads", func(c *ShmConfig) { c.Spads = 0 }, false},
		{"OneScratchpad", func(c *ShmConfig) { c.Spads = 1 }, true},
		{"MaxScratchpads", func(c *ShmConfig) { c.Spads = maxSpads }, true},
		{"ScratchpadsAboveMax", func(c *ShmConfig) { c.Spads = maxSpads + 1 }, false},
		{"NoDoorbells", func(c *ShmConfig) { c.DoorbellBits = 0 }, false},
		{"OneDoorbell", func(c *ShmConfig) { c.DoorbellBits = 1 }, true},
		{"AllDoorbells", func(c *ShmConfig) { c.DoorbellBits = 64 }, true},
		{"NoMemory", func(c *ShmConfig) { c.MemSize = 0 }, false},
		{"MemoryNotPages", func(c *ShmConfig) { c.MemSize = mem - 2048 }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := base
			c.edit(&g)
			path := filepath.Join(t.TempDir(), "bar")
			m, err := MapFile(path, 0, shmHeaderSize+2*mem)
			if err != nil {
				t.Fatal(err)
			}
			formatHeader(m.Bytes(), g)
			d, err := OpenMapping(path, m, fastMapping(-1))
			if c.ok != (err == nil) || (!c.ok && !errors.Is(err, fabric.ErrInvalid)) {
				t.Fatalf("header %+v: %v, want ok=%v", g, err, c.ok)
			}
			if err != nil {
				m.Close()
				return
			}
			defer d.Close()
			if d.MWCount() != g.MWs || d.SpadCount() != g.Spads || bitsCount(d.DBValidMask()) != g.DoorbellBits {
				t.Fatalf("opened with %d windows, %d scratchpads, %d doorbells; the header says %+v",
					d.MWCount(), d.SpadCount(), bitsCount(d.DBValidMask()), g)
			}
			if err := d.PeerSpadWrite(g.Spads-1, 1); err != nil {
				t.Fatalf("the last scratchpad: %v", err)
			}
			if err := d.PeerSpadWrite(g.Spads, 1); err == nil {
				t.Fatalf("scratchpad %d of %d written", g.Spads, g.Spads)
			}
		})
	}
}

// TestMappingFormatWait: a side that finds the header being formatted
// waits for the formatter. OpenMapping gives up after Attach with
// ErrBusy; an Open with a context waits until the context ends, so a
// formatter stalled for longer than Attach (an emulated guest, a host
// writing back the file behind the BAR) still gets its peer.
func TestMappingFormatWait(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bar")
	m, err := MapFile(path, 0, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	magic := shm.U64(m.Bytes(), hdrMagic)
	magic.Store(shmFormatting) // a formatter between its first and last store

	m2, _ := MapFile(path, 0, 4<<20)
	c := fastMapping(-1)
	c.Attach = 50 * time.Millisecond
	if _, err := OpenMapping(path, m2, c); !errors.Is(err, ErrBusy) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("OpenMapping over a header being formatted: %v, want ErrBusy and not the caller's deadline", err)
	}
	m2.Close()

	// Attach is dead+1s = 1.01s; the formatter finishes after 1.5s.
	addr := func(side int) string {
		return "mem:" + path + "?size=4M&poll=50us&link=2ms&dead=10ms&side=" + strconv.Itoa(side)
	}
	ctx := testenv.Context(t)
	type result struct {
		ep  fabric.Endpoint
		err error
	}
	done := make(chan result, 1)
	go func() {
		ep, err := fabric.Open(ctx, "ntb", addr(0), nil)
		done <- result{ep, err}
	}()
	time.Sleep(1500 * time.Millisecond)
	formatHeader(m.Bytes(), ShmConfig{MemSize: (4<<20 - 4096) / 2 &^ 4095, MWs: 2, Spads: 16, DoorbellBits: 16})
	other := make(chan result, 1)
	go func() {
		ep, err := fabric.Open(ctx, "ntb", addr(1), nil)
		other <- result{ep, err}
	}()
	// Side 0 first: if it gave up, side 1 would wait for it in vain.
	r := testenv.Recv(t, done, "side 0's Open")
	if r.err != nil {
		t.Fatalf("side 0's Open, whose formatter took longer than Attach: %v", r.err)
	}
	defer r.ep.Close()
	r1 := testenv.Recv(t, other, "side 1's Open")
	if r1.err != nil {
		t.Fatalf("open side 1: %v", r1.err)
	}
	r1.ep.Close()
}
