//go:build linux

package ntb

// The generic hardware driver (HWDevice) over behavioural models of the
// bridges (package ntb/internal/chipmodel): two HWDevices, one per side of
// one modelled chip, with every register access going through the model.
// The model is written from the Linux drivers' and datasheets' behaviour
// with its own offsets; where it and Weft's maps (package ntb/hw) disagree
// these tests fail, and Linux's driver decides who is right. See
// docs/ntb-chipmodel.md for each operation's register sequence beside
// Linux's.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/testenv"
	hwmap "github.com/weft-io/weft/ntb/hw"
	"github.com/weft-io/weft/ntb/internal/chipmodel"
	"github.com/weft-io/weft/ntb/pci"
)

// noneMap is a register BAR no one may touch (PROT_NONE): with a model
// behind RegIO, a driver access that bypassed it would crash the test.
type noneMap struct{ b []byte }

func (m *noneMap) Bytes() []byte { return m.b }
func (m *noneMap) Close() error  { return nil } // unmapped by the test's cleanup

// modelRevision is the PCI revision the tests give gen4 (Sapphire
// Rapids: page-aligned translations); chipPair can take another.
const modelRevision = 0x10

// chipParts builds side s's hardware parts over the model.
func chipParts(t testing.TB, s *chipmodel.Side, rev uint8) hwParts {
	t.Helper()
	b, err := unix.Mmap(-1, 0, int(s.RegBARSize()), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	var bars [pci.NumBARs]pci.Resource
	for _, i := range append([]int{0}, s.WindowBARs()...) {
		start, size := s.BAR(i)
		bars[i] = pci.Resource{Start: start, End: start + size - 1, Flags: pci.ResourceMem | pci.ResourceMem64}
	}
	return hwParts{regs: &noneMap{b}, io: s, cfg: s.Config(), bars: bars, revision: rev,
		mapBAR: func(bar int) (Mapping, error) { return s.MapWindow(bar) }}
}

// chipPair builds a modelled chip of family f and an HWDevice on each
// side (link poll every millisecond). Cleanup closes the devices, checks
// that the model saw no malformed access, and closes the chip.
func chipPair(t testing.TB, f chipmodel.Family, rev uint8) (*chipmodel.Chip, [2]*HWDevice) {
	t.Helper()
	return chipPairPoll(t, f, rev, time.Millisecond)
}

// chipPairPoll is chipPair with a link poll of the given period.
func chipPairPoll(t testing.TB, f chipmodel.Family, rev uint8, poll time.Duration) (*chipmodel.Chip, [2]*HWDevice) {
	t.Helper()
	return chipPairWith(t, f, chipmodel.Config{}, nil, rev, poll)
}

// chipPairWith is chipPairPoll over a chip configured by cfg, with the
// map edited by edit (nil: the map as it is).
func chipPairWith(t testing.TB, f chipmodel.Family, cfg chipmodel.Config, edit func(*hwmap.Map), rev uint8, poll time.Duration) (*chipmodel.Chip, [2]*HWDevice) {
	t.Helper()
	c, err := chipmodel.New(f, cfg)
	if err != nil {
		t.Fatal(err)
	}
	vendor, device := f.PCIID()
	m, err := hwmap.Lookup(vendor, device)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	if edit != nil {
		mc := *m
		m = &mc
		edit(m)
	}
	var devs [2]*HWDevice
	for i := range devs {
		s := c.Side(i)
		d, err := newHWDevice(fmt.Sprintf("model %v side %d", f, i), m, chipParts(t, s, rev),
			HWConfig{Memory: s.Memory(), Link: poll})
		if err != nil {
			c.Close()
			t.Fatal(err)
		}
		devs[i] = d
	}
	t.Cleanup(func() {
		for _, d := range devs {
			d.Close()
		}
		for i := range 2 {
			for _, f := range c.Side(i).Faults() {
				t.Errorf("model fault: %s", f)
			}
		}
		c.Close()
	})
	return c, devs
}

// eventually waits for cond, failing the test after a deadline.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !testenv.Eventually(10*time.Second, cond) {
		t.Fatalf("%s: not within 10s", what)
	}
}

func forFamilies(t *testing.T, run func(t *testing.T, f chipmodel.Family)) {
	for _, f := range chipmodel.Families() {
		t.Run(f.String(), func(t *testing.T) { run(t, f) })
	}
}

// TestChipModelDoorbells: a ring sets the peer's inbound bits, not the
// ringer's; a clear clears them; the mask the driver writes is the one
// the chip applies (the model's pending interrupts), and DBWait honours
// it.
func TestChipModelDoorbells(t *testing.T) {
	forFamilies(t, func(t *testing.T, f chipmodel.Family) {
		c, d := chipPair(t, f, modelRevision)
		a, b := d[0], d[1]
		upBoth(t, d)
		valid := a.DBValidMask()
		if err := a.PeerDBSet(0x5); err != nil {
			t.Fatal(err)
		}
		if got := b.DBRead(); got != 0x5 {
			t.Fatalf("the peer's doorbells after a ring of 0x5: %#x", got)
		}
		if got := a.DBRead(); got != 0 {
			t.Fatalf("the ringer's own doorbells after its ring: %#x", got)
		}
		top := valid &^ (valid >> 1) // the highest client bit
		if err := b.PeerDBSet(top); err != nil || a.DBRead() != top {
			t.Fatalf("ring of the top bit %#x: %v, peer reads %#x", top, err, a.DBRead())
		}
		if err := b.DBClear(0x1); err != nil || b.DBRead() != 0x4 {
			t.Fatalf("clear of bit 0: %v, %#x left", err, b.DBRead())
		}
		// Every bit is masked at open: the chip raises nothing.
		if p := c.Side(1).Pending() & valid; p != 0 {
			t.Fatalf("pending %#x with every doorbell masked", p)
		}
		if err := b.DBClearMask(0x1); err != nil {
			t.Fatal(err)
		}
		if err := a.PeerDBSet(0x3); err != nil {
			t.Fatal(err)
		}
		if p := c.Side(1).Pending() & valid; p != 0x1 {
			t.Fatalf("pending %#x with 0x7 rung and only bit 0 unmasked, want 0x1", p)
		}
		short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if got, err := b.DBWait(short, 0x6); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("DBWait on masked bits = %#x, %v; want the deadline", got, err)
		}
		if err := b.DBClearMask(0x2); err != nil {
			t.Fatal(err)
		}
		ctx, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel2()
		if got, err := b.DBWait(ctx, 0x6); err != nil || got != 0x2 {
			t.Fatalf("DBWait after unmasking bit 1 = %#x, %v; want 0x2", got, err)
		}
	})
}

// TestChipModelScratchpads: a side's scratchpad write is what the peer's
// PeerSpadRead reads, and PeerSpadWrite lands in the peer's SpadRead
// (with the link up).
func TestChipModelScratchpads(t *testing.T) {
	forFamilies(t, func(t *testing.T, f chipmodel.Family) {
		_, d := chipPair(t, f, modelRevision)
		a, b := d[0], d[1]
		upBoth(t, d)
		n := a.SpadCount()
		if n < numSpads {
			t.Fatalf("%d scratchpads", n)
		}
		for i := range n {
			if err := a.SpadWrite(i, 0x1000+uint32(i)); err != nil {
				t.Fatal(err)
			}
			if err := b.PeerSpadWrite(i, 0x2000+uint32(i)); err != nil {
				t.Fatal(err)
			}
		}
		for i := range n {
			// b's writes into a's scratchpads came after a's own.
			if v, err := a.SpadRead(i); err != nil || v != 0x2000+uint32(i) {
				t.Errorf("a.SpadRead(%d) = %#x, %v; b wrote %#x", i, v, err, 0x2000+i)
			}
			if v, err := b.PeerSpadRead(i); err != nil || v != 0x2000+uint32(i) {
				t.Errorf("b.PeerSpadRead(%d) = %#x, %v", i, v, err)
			}
			if v, err := b.SpadRead(i); err != nil || v != 0 {
				t.Errorf("b.SpadRead(%d) = %#x, %v: written by no one", i, v, err)
			}
		}
		if err := b.SpadWrite(3, 0x77); err != nil {
			t.Fatal(err)
		}
		if v, _ := a.PeerSpadRead(3); v != 0x77 {
			t.Errorf("a.PeerSpadRead(3) = %#x after b.SpadWrite(3, 0x77)", v)
		}
	})
}

// upBoth enables the link on both sides and waits for it: the peer's
// registers are reached across it (Intel gen1's B2B window; a chip drops
// what it would carry with the link down).
func upBoth(t *testing.T, d [2]*HWDevice) {
	t.Helper()
	for _, x := range d {
		if err := x.LinkEnable(); err != nil {
			t.Fatal(err)
		}
	}
	linkBoth(t, d, true)
}

// linkBoth waits until both sides see the link as want.
func linkBoth(t *testing.T, d [2]*HWDevice, want bool) {
	t.Helper()
	eventually(t, fmt.Sprintf("link up=%v on both sides", want), func() bool { return d[0].LinkIsUp() == want && d[1].LinkIsUp() == want })
}

// TestChipModelLink: the link is up on both sides only once both have
// enabled it; a side that disables takes it down for its peer (for the
// Intel parts, on both sides: AMD's side sees only the peer's ready bit).
// The link poll reports the changes as events.
func TestChipModelLink(t *testing.T) {
	forFamilies(t, func(t *testing.T, f chipmodel.Family) {
		c, d := chipPair(t, f, modelRevision)
		a, b := d[0], d[1]
		if a.LinkIsUp() || b.LinkIsUp() || c.LinkUp() {
			t.Fatal("link up at reset")
		}
		if err := a.LinkEnable(); err != nil {
			t.Fatal(err)
		}
		if c.LinkUp() || (a.LinkIsUp() && b.LinkIsUp()) {
			t.Fatal("link up on both sides with one side enabled")
		}
		if a.LinkIsUp() {
			t.Fatal("the enabled side sees the link up before its peer enabled it")
		}
		if err := b.LinkEnable(); err != nil {
			t.Fatal(err)
		}
		if !c.LinkUp() {
			t.Fatal("the chip's link is down with both sides enabled")
		}
		linkBoth(t, d, true)
		for _, x := range d {
			select {
			case e := <-x.LinkEvents():
				if !e.Up {
					t.Fatalf("first event %+v", e)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no link-up event")
			}
		}
		if err := a.LinkDisable(); err != nil {
			t.Fatal(err)
		}
		if c.LinkUp() || b.LinkIsUp() {
			t.Fatal("link still up for the peer of a side that disabled it")
		}
		if f != chipmodel.AMD && a.LinkIsUp() {
			t.Fatal("link still up on the side that disabled it")
		}
		if err := a.LinkEnable(); err != nil {
			t.Fatal(err)
		}
		linkBoth(t, d, true)
		if err := b.LinkDisable(); err != nil {
			t.Fatal(err)
		}
		if a.LinkIsUp() {
			t.Fatal("link still up for the peer of the side that disabled it")
		}
	})
}

// TestChipModelIncarnation: once LinkIsUp has reported the link up,
// PeerIncarnation has counted it, even if the link poll has not run
// since: a transport that saw the link up, attached and then watches the
// incarnation is not torn down when the poll catches up (the conformance
// suite under the race detector lost sessions that way).
func TestChipModelIncarnation(t *testing.T) {
	forFamilies(t, func(t *testing.T, f chipmodel.Family) {
		_, d := chipPairPoll(t, f, modelRevision, time.Hour) // the poll never runs
		a, b := d[0], d[1]
		for _, x := range d {
			if err := x.LinkEnable(); err != nil {
				t.Fatal(err)
			}
		}
		if !a.LinkIsUp() {
			t.Fatal("link down with both sides enabled")
		}
		if inc := a.PeerIncarnation(); inc != 1 {
			t.Fatalf("PeerIncarnation %d after LinkIsUp first reported the link up, want 1", inc)
		}
		if err := b.LinkDisable(); err != nil {
			t.Fatal(err)
		}
		if a.LinkIsUp() {
			t.Fatal("link up after the peer disabled it")
		}
		if err := b.LinkEnable(); err != nil {
			t.Fatal(err)
		}
		if !a.LinkIsUp() || a.PeerIncarnation() != 2 {
			t.Fatalf("after the peer came back: up %v, incarnation %d, want 2", a.LinkIsUp(), a.PeerIncarnation())
		}
		for _, want := range []bool{true, false, true} {
			select {
			case e := <-a.LinkEvents():
				if e.Up != want {
					t.Fatalf("event %+v, want up=%v", e, want)
				}
			default:
				t.Fatalf("no event for up=%v", want)
			}
		}
	})
}

// TestChipModelWindows: a translation the receiving side sets is where
// the sender's window lands; a new translation moves the sender's live
// mapping; the limit bounds it (stores past it reach nothing); clearing
// the translation closes the window.
func TestChipModelWindows(t *testing.T) {
	forFamilies(t, func(t *testing.T, f chipmodel.Family) { testChipWindows(t, f, chipmodel.Config{}, modelRevision) })
	// Ice Lake (gen4 revisions 2 to 0xf): translations aligned to the
	// window, log2 of the size in IMxxXBASEIDX.
	t.Run("intel-gen4-icx", func(t *testing.T) { testChipWindows(t, chipmodel.IntelGen4, chipmodel.Config{}, 0x4) })
	// Gen1 with b2b_mw_share: BAR 4's second half is window 1.
	t.Run("intel-gen1-share", func(t *testing.T) { testChipWindows(t, chipmodel.IntelGen1, gen1Share, modelRevision) })
}

// gen1Share is the gen1 model set up as Linux's b2b_mw_share leaves it.
var gen1Share = chipmodel.Config{Gen1B2BShare: true}

func testChipWindows(t *testing.T, f chipmodel.Family, cfg chipmodel.Config, rev uint8) {
	c, d := chipPairWith(t, f, cfg, nil, rev, time.Millisecond)
	a, b := d[0], d[1]
	for _, x := range d {
		if err := x.LinkEnable(); err != nil {
			t.Fatal(err)
		}
	}
	linkBoth(t, d, true)
	bmem := b.Memory()
	for widx := range a.MWCount() {
		bar := a.wdefs[widx].BAR
		aa, _, smax, err := b.MWGetAlign(widx)
		if err != nil {
			t.Fatal(err)
		}
		w, err := a.PeerMW(widx)
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(w)) != smax {
			t.Fatalf("window %d: %d bytes mapped, the BAR has %d", widx, len(w), smax)
		}
		// Not translated yet: the sender's stores reach nothing.
		w[0] = 0xaa
		if _, n := c.Side(0).Route(bar); n != 0 || bytes.IndexByte(bmem, 0xaa) >= 0 {
			t.Fatalf("window %d reaches %d bytes of the peer before any translation", widx, n)
		}
		clear(bmem)
		// The whole window at 0.
		if err := b.MWSetTrans(widx, 0, smax); err != nil {
			t.Fatal(err)
		}
		if off, n := c.Side(0).Route(bar); off != 0 || n != smax {
			t.Fatalf("window %d after MWSetTrans(0, %#x): lands at %#x for %#x bytes", widx, smax, off, n)
		}
		binary.LittleEndian.PutUint64(w[8:], 0x1111)
		binary.LittleEndian.PutUint64(w[smax-8:], 0x2222)
		if binary.LittleEndian.Uint64(bmem[8:]) != 0x1111 || binary.LittleEndian.Uint64(bmem[smax-8:]) != 0x2222 {
			t.Fatalf("window %d: stores at 8 and at the end did not land", widx)
		}
		// Moved: the same mapping now writes elsewhere.
		move := aa
		if move+smax > uint64(len(bmem)) {
			move = 0
		}
		if move != 0 {
			if err := b.MWSetTrans(widx, move, smax); err != nil {
				t.Fatal(err)
			}
			binary.LittleEndian.PutUint64(w[16:], 0x3333)
			if binary.LittleEndian.Uint64(bmem[move+16:]) != 0x3333 || binary.LittleEndian.Uint64(bmem[16:]) != 0 {
				t.Fatalf("window %d: after moving the translation to %#x the store did not follow", widx, move)
			}
		}
		// Limited to 64 KiB: bytes past it fall into the sink.
		const lim = 64 << 10
		if err := b.MWSetTrans(widx, 0, lim); err != nil {
			t.Fatal(err)
		}
		if off, n := c.Side(0).Route(bar); off != 0 || n != lim {
			t.Fatalf("window %d limited to %#x: lands at %#x for %#x bytes", widx, lim, off, n)
		}
		clear(bmem)
		binary.LittleEndian.PutUint64(w[lim-8:], 0x4444)
		binary.LittleEndian.PutUint64(w[lim:], 0x5555)
		binary.LittleEndian.PutUint64(w[lim+4096:], 0x6666)
		if binary.LittleEndian.Uint64(bmem[lim-8:]) != 0x4444 {
			t.Fatalf("window %d: the store just inside the limit did not land", widx)
		}
		if i := bytes.IndexAny(bmem, "\x55\x66"); i >= 0 {
			t.Fatalf("window %d: a store past the limit reached the peer's memory at %#x", widx, i)
		}
		// Cleared: closed.
		if err := b.MWClearTrans(widx); err != nil {
			t.Fatal(err)
		}
		if _, n := c.Side(0).Route(bar); n != 0 {
			t.Fatalf("window %d still reaches %#x bytes after MWClearTrans", widx, n)
		}
		clear(bmem)
		w[0] = 0x77
		if bytes.IndexByte(bmem, 0x77) >= 0 {
			t.Fatalf("window %d: a store reached the peer after MWClearTrans", widx)
		}
	}
}

// dialModel dials the transport on both sides of a fresh modelled chip
// and returns queue 0's endpoints, each closing its transport.
func dialModel(t *testing.T, f chipmodel.Family, tc Config) (a, b *Endpoint) {
	t.Helper()
	return dialModelCfg(t, f, chipmodel.Config{}, tc)
}

// dialModelCfg is dialModel over a chip configured by cfg.
func dialModelCfg(t *testing.T, f chipmodel.Family, cfg chipmodel.Config, tc Config) (a, b *Endpoint) {
	t.Helper()
	_, d := chipPairWith(t, f, cfg, nil, modelRevision, time.Millisecond)
	return fabrictest.OpenPair(t, 30*time.Second, func(ctx context.Context, s fabrictest.Side) (*Endpoint, error) {
		dev := d[int(s)]
		tr, err := Dial(ctx, dev, tc) // Dial enables the link
		if err != nil {
			return nil, err
		}
		ep := tr.endpoints()[0]
		ep.owner = true
		return ep, nil
	})
}

// TestChipModelConformance runs the whole conformance suite over the
// transport on each modelled chip.
func TestChipModelConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("the suite over four chip models")
	}
	forFamilies(t, func(t *testing.T, f chipmodel.Family) {
		fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
			a, b := dialModel(t, f, Config{})
			return a, b
		})
	})
}

// TestChipModelPingPong bounces messages between the two sides of each
// modelled chip: every byte crosses the model's windows and every wakeup
// is a modelled doorbell.
func TestChipModelPingPong(t *testing.T) {
	forFamilies(t, func(t *testing.T, f chipmodel.Family) { pingPong(t, f, chipmodel.Config{}) })
	t.Run("intel-gen1-share", func(t *testing.T) { pingPong(t, chipmodel.IntelGen1, gen1Share) })
}

func pingPong(t *testing.T, f chipmodel.Family, cfg chipmodel.Config) {
	// No spinning: every wait parks in DBWait, so each round needs the
	// doorbell to wake it (with the default spin, an answer that comes
	// within the spin is taken without one).
	a, b := dialModelCfg(t, f, cfg, Config{Spin: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	abuf, _ := a.Alloc(4096, fabric.AccessLocalWrite)
	bbuf, _ := b.Alloc(4096, fabric.AccessLocalWrite)
	errc := make(chan error, 1)
	const rounds = 500
	go func() {
		for i := range rounds {
			msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(bbuf)}}}
			if _, err := b.RecvWait(ctx, msgs); err != nil {
				errc <- fmt.Errorf("b recv %d: %w", i, err)
				return
			}
			if _, err := b.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: bbuf, Length: msgs[0].Len}}}}); err != nil {
				errc <- fmt.Errorf("b send %d: %w", i, err)
				return
			}
		}
		errc <- nil
	}()
	for i := range rounds {
		n := 1 + (i*97)%4096
		for j := range n {
			abuf.Bytes()[j] = byte(i + j)
		}
		if _, err := a.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: abuf, Length: n}}}}); err != nil {
			t.Fatalf("a send %d: %v", i, err)
		}
		clear(abuf.Bytes())
		msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(abuf)}}}
		if _, err := a.RecvWait(ctx, msgs); err != nil {
			t.Fatalf("a recv %d: %v", i, err)
		}
		if msgs[0].Len != n {
			t.Fatalf("round %d: echo of %d bytes came back as %d", i, n, msgs[0].Len)
		}
		for j := range n {
			if abuf.Bytes()[j] != byte(i+j) {
				t.Fatalf("round %d: byte %d of the echo differs", i, j)
			}
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestChipModelQueues runs three queues over each modelled chip: every
// queue's doorbell bits (2q, 2q+1) are unmasked and wake its receiver.
func TestChipModelQueues(t *testing.T) {
	forFamilies(t, func(t *testing.T, f chipmodel.Family) {
		_, d := chipPair(t, f, modelRevision)
		const nq = 3
		ta, tb := fabrictest.OpenPair(t, 30*time.Second, func(ctx context.Context, s fabrictest.Side) (*Transport, error) {
			dev := d[int(s)]
			if err := dev.LinkEnable(); err != nil {
				return nil, err
			}
			return Dial(ctx, dev, Config{Queues: nq, RingSize: 64 << 10, MaxMsgSize: 4096})
		})
		if ta.Queues() != nq || tb.Queues() != nq {
			t.Fatalf("%d and %d queues negotiated, want %d", ta.Queues(), tb.Queues(), nq)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for q := nq - 1; q >= 0; q-- {
			a, _ := ta.Endpoint(q)
			b, _ := tb.Endpoint(q)
			src, _ := a.Alloc(64, 0)
			dst, _ := b.Alloc(64, fabric.AccessLocalWrite)
			done := make(chan error, 1)
			go func() { // in RecvWait, which sleeps on queue q's doorbell once its spin is spent
				msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(dst)}}}
				_, err := b.RecvWait(ctx, msgs)
				if err == nil && string(dst.Bytes()[:msgs[0].Len]) != fmt.Sprintf("queue %d", q) {
					err = fmt.Errorf("received %q", dst.Bytes()[:msgs[0].Len])
				}
				done <- err
			}()
			n := copy(src.Bytes(), fmt.Sprintf("queue %d", q))
			if _, err := a.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: n}}}}); err != nil {
				t.Fatalf("queue %d: send: %v", q, err)
			}
			if err := <-done; err != nil {
				t.Fatalf("queue %d: %v", q, err)
			}
		}
	})
}

// TestChipModelGen1B2B: Intel gen1 works the peer's doorbell and
// scratchpads through the reserved B2B window, as Linux on these parts:
// one client window (Linux's mw_count less the B2B one), 15 doorbell bits
// (bit 14 rings: the B2B_DOORBELL erratum does not apply); with
// b2b_mw_share, two windows, the second the half of BAR 4 past the peer's
// registers, aligned to the whole BAR. A driver on the old path
// (B2B_DOORBELL, B2B_SPAD) makes the model record faults.
func TestChipModelGen1B2B(t *testing.T) {
	const size = 4 << 20 // the model's default window BAR
	t.Run("whole", func(t *testing.T) {
		c, d := chipPair(t, chipmodel.IntelGen1, modelRevision)
		a, b := d[0], d[1]
		if a.MWCount() != 1 || a.PeerMWCount() != 1 || a.DBValidMask() != 0x7fff {
			t.Fatalf("%d windows (peer %d), doorbells %#x; want 1, 1, 0x7fff", a.MWCount(), a.PeerMWCount(), a.DBValidMask())
		}
		if a.wdefs[0].BAR != 2 {
			t.Fatalf("the client window is BAR %d, want 2 (BAR 4 is the peer's registers)", a.wdefs[0].BAR)
		}
		if _, _, _, err := a.MWGetAlign(1); !errors.Is(err, fabric.ErrInvalid) {
			t.Fatalf("MWGetAlign(1) on the B2B window: %v", err)
		}
		upBoth(t, d)
		if err := a.PeerDBSet(0x4000); err != nil || b.DBRead() != 0x4000 {
			t.Fatalf("ring of bit 14: %v, the peer reads %#x", err, b.DBRead())
		}
		if _, n := c.Side(0).Route(4); n != 0 {
			t.Fatalf("BAR 4 reaches %#x bytes of the peer's memory", n)
		}
	})
	t.Run("share", func(t *testing.T) {
		_, d := chipPairWith(t, chipmodel.IntelGen1, gen1Share, nil, modelRevision, time.Millisecond)
		a := d[0]
		if a.MWCount() != 2 || a.PeerMWCount() != 2 {
			t.Fatalf("%d windows (peer %d) with the B2B window shared, want 2", a.MWCount(), a.PeerMWCount())
		}
		aa, _, smax, err := a.MWGetAlign(1)
		if err != nil || aa != size || smax != size/2 {
			t.Fatalf("MWGetAlign(1) = %#x, _, %#x, %v; want %#x, %#x", aa, smax, err, size, size/2)
		}
		w, err := a.PeerMW(1)
		if err != nil || len(w) != size/2 {
			t.Fatalf("PeerMW(1) = %d bytes, %v; want %#x", len(w), err, size/2)
		}
	})
	t.Run("old-path-faults", func(t *testing.T) {
		// The map as it was before: no PeerRegs, so B2B_DOORBELL and
		// B2B_SPAD. The model must record it.
		c, err := chipmodel.New(chipmodel.IntelGen1, chipmodel.Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		m, _ := hwmap.Lookup(chipmodel.IntelGen1.PCIID())
		mc := *m
		mc.Ops.PeerRegs = nil
		var d [2]*HWDevice
		for i := range d {
			s := c.Side(i)
			if d[i], err = newHWDevice("old path", &mc, chipParts(t, s, modelRevision), HWConfig{Memory: s.Memory(), Link: -1}); err != nil {
				t.Fatal(err)
			}
			defer d[i].Close()
		}
		if err := d[0].PeerDBSet(0x1); err != nil {
			t.Fatal(err)
		}
		if err := d[0].PeerSpadWrite(0, 1); err != nil {
			t.Fatal(err)
		}
		f := c.Side(0).Faults()
		if len(f) != 2 || !strings.Contains(f[0], "B2B_DOORBELL") || !strings.Contains(f[1], "B2B_SPAD") {
			t.Fatalf("faults %q, want B2B_DOORBELL and B2B_SPAD recorded", f)
		}
	})
}
