//go:build linux

package ntb

// The generic HWDevice over a behavioural model of a Switchtec switch
// with two partitions (ntb/internal/chipmodel): each operation's effect
// on the other side, the registers it leaves in the control blocks
// (offsets written here as literals from include/linux/switchtec.h, not
// taken from package ntb/hw), the transport and the conformance suite
// over it, and the values a broken switch reads back.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/shm"
	hwmap "github.com/weft-io/weft/ntb/hw"
	"github.com/weft-io/weft/ntb/internal/chipmodel"
	"github.com/weft-io/weft/ntb/pci"
)

// Literal offsets in the switch's global address space.
const (
	stCtrl0   = 0x14000 // partition 0's control block; 0x2000 each
	stDB0     = 0x74000 // partition 0's doorbell block; 0x4000 each
	stBarCtl  = 0x40    // BAR entry n's ctl at +16n, win_size +4, xlate +8
	stBarExt  = 0xa0
	stLUT     = 0x1000
	stReqID   = 0x400
	stPartCtl = 0x08
	stMsgMap  = 0x1060
	stIMsg    = 0x1088
)

func stCtrl(p int) uint32 { return stCtrl0 + uint32(p)*0x2000 }
func stDB(p int) uint32   { return stDB0 + uint32(p)*0x4000 }

// modelMap is a window BAR of the model as a Mapping (the model unmaps
// it).
type modelMap struct{ b []byte }

func (m *modelMap) Bytes() []byte { return m.b }
func (m *modelMap) Close() error  { return nil }

func newSwitchtecModel(t testing.TB, c chipmodel.SwitchtecConfig) *chipmodel.Switchtec {
	t.Helper()
	s, err := chipmodel.NewSwitchtec(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// swOpen opens partition view i of s as a HWDevice.
func swOpen(t testing.TB, s *chipmodel.Switchtec, i int, c HWConfig) (*HWDevice, error) {
	t.Helper()
	m, err := hwmap.Lookup(0x11f8, 0x8531)
	if err != nil {
		t.Fatal(err)
	}
	p := s.Partition(i)
	var bars [pci.NumBARs]pci.Resource
	bars[0] = pci.Resource{Start: 0xd000_0000, End: 0xd000_0000 + s.RegBARSize() - 1, Flags: pci.ResourceMem}
	for _, b := range []int{2, 4} {
		st := fakeBARStart(b) + uint64(i)<<36
		bars[b] = pci.Resource{Start: st, End: st + p.BARSize(b) - 1, Flags: pci.ResourceMem | pci.ResourcePrefetch | pci.ResourceMem64}
	}
	parts := hwParts{regs: newAnon(t, s.RegBARSize()), bars: bars, io: p,
		mapBAR: func(bar int) (Mapping, error) {
			b, err := p.MapBAR(bar)
			if err != nil {
				return nil, err
			}
			return &modelMap{b}, nil
		}}
	if c.Memory == nil {
		c.Memory = p
	}
	d, err := newHWDevice(fmt.Sprintf("switchtec model partition %d", p.ID()), m, parts, c)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { d.Close() })
	return d, nil
}

func swPair(t testing.TB, s *chipmodel.Switchtec, c HWConfig) (a, b *HWDevice) {
	t.Helper()
	a, err := swOpen(t, s, 0, c)
	if err != nil {
		t.Fatal(err)
	}
	if b, err = swOpen(t, s, 1, c); err != nil {
		t.Fatal(err)
	}
	return a, b
}

func TestSwitchtecModelOpen(t *testing.T) {
	for _, c := range []chipmodel.SwitchtecConfig{{}, {IDs: [2]int{5, 2}, Target: true}} {
		t.Run(fmt.Sprint(c.IDs), func(t *testing.T) {
			s := newSwitchtecModel(t, c)
			a, b := swPair(t, s, HWConfig{Link: -1})
			ida, idb := s.Partition(0).ID(), s.Partition(1).ID()
			if (a.side == 1) != (ida > idb) || a.side == b.side || a.peerPart != uint32(idb) || b.peerPart != uint32(ida) {
				t.Fatalf("sides %d/%d, peers %d/%d", a.side, b.side, a.peerPart, b.peerPart)
			}
			for _, x := range []struct {
				d        *HWDevice
				self, pr int
			}{{a, ida, idb}, {b, idb, ida}} {
				// Requester IDs in its own block: the root complex and the
				// host bridge, protection off.
				if v := s.Peek(stCtrl(x.self)+stReqID, 4); v != 1 {
					t.Errorf("partition %d: requester ID 0 is %#x", x.self, v)
				}
				if v := s.Peek(stCtrl(x.self)+stReqID+4, 4); v&1 == 0 || v>>16 == 0 {
					t.Errorf("partition %d: requester ID 1 is %#x", x.self, v)
				}
				if v := s.Peek(stCtrl(x.self)+stPartCtl, 4); v != 1 {
					t.Errorf("partition %d: partition_ctrl %#x", x.self, v)
				}
				// Its message routing: inbound i from the peer's outbound i.
				want := uint64(0)
				for i := range 4 {
					want |= uint64(i|x.pr<<2) << (8 * i)
				}
				if v := s.Peek(stDB(x.self)+stMsgMap, 4); v != want {
					t.Errorf("partition %d: msg_map %#x, want %#x", x.self, v, want)
				}
				// The shared window: LUT entry 0 of the PEER's BAR 2 points at
				// this side's region, the last 64 KiB of its memory, and the
				// peer's BAR 2 has 16 LUT entries of 64 KiB.
				mem := s.Partition(map[bool]int{true: 0, false: 1}[x.d == a])
				bus := mem.BusAddr() + uint64(len(mem.Bytes())) - 64<<10
				if v := s.Peek(stCtrl(x.pr)+stLUT, 8); v != 1|uint64(x.self)<<1|bus {
					t.Errorf("partition %d's LUT entry 0: %#x, want %#x", x.pr, v, 1|uint64(x.self)<<1|bus)
				}
				if v := s.Peek(stCtrl(x.pr)+stBarCtl+2*16, 4); v != 1|1<<5|16<<8|15<<14 {
					t.Errorf("partition %d's BAR 2 ctl: %#x", x.pr, v)
				}
				if len(x.d.Memory()) != len(mem.Bytes())-64<<10 {
					t.Errorf("Memory() is %d bytes of %d", len(x.d.Memory()), len(mem.Bytes()))
				}
				if x.d.SpadCount() != 128 || x.d.MsgCount() != 4 {
					t.Errorf("%d scratchpads, %d message registers", x.d.SpadCount(), x.d.MsgCount())
				}
			}
		})
	}
}

func TestSwitchtecModelDoorbells(t *testing.T) {
	s := newSwitchtecModel(t, chipmodel.SwitchtecConfig{})
	a, b := swPair(t, s, HWConfig{Link: -1})
	if err := a.PeerDBSet(0x5); err != nil {
		t.Fatal(err)
	}
	// The lower partition rings the upper half of the shared doorbells.
	if s.Doorbells() != 0x5<<32 || b.DBRead() != 0x5 || a.DBRead() != 0 {
		t.Fatalf("doorbells %#x: b reads %#x, a %#x", s.Doorbells(), b.DBRead(), a.DBRead())
	}
	if s.Partition(1).DoorbellIRQ() {
		t.Error("a masked doorbell raised an interrupt")
	}
	if err := b.DBClearMask(0x4); err != nil {
		t.Fatal(err)
	}
	if !s.Partition(1).DoorbellIRQ() || s.Partition(0).DoorbellIRQ() {
		t.Error("an unmasked doorbell raised no interrupt, or the wrong side's")
	}
	if err := b.DBClear(0x4); err != nil {
		t.Fatal(err)
	}
	if b.DBRead() != 0x1 || s.Partition(1).DoorbellIRQ() {
		t.Errorf("after DBClear: %#x", b.DBRead())
	}
	if err := b.PeerDBSet(0x2); err != nil {
		t.Fatal(err)
	}
	if a.DBRead() != 0x2 || b.DBRead() != 0x1 {
		t.Errorf("the upper partition rang %#x, reads %#x", a.DBRead(), b.DBRead())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a.DBClearMask(0x2)
	if got, err := a.DBWait(ctx, 0x2); err != nil || got != 0x2 {
		t.Errorf("DBWait = %#x, %v", got, err)
	}
}

func TestSwitchtecModelSpadsAndLink(t *testing.T) {
	s := newSwitchtecModel(t, chipmodel.SwitchtecConfig{})
	a, b := swPair(t, s, HWConfig{Link: time.Millisecond})
	for i, d := range []*HWDevice{a, b} {
		if err := d.SpadWrite(3, uint32(0x100+i)); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := b.PeerSpadRead(3); err != nil || v != 0x100 {
		t.Errorf("b reads a's scratchpad 3: %#x, %v", v, err)
	}
	if err := a.PeerSpadWrite(7, 0xabc); err != nil {
		t.Fatal(err)
	}
	if v, err := b.SpadRead(7); err != nil || v != 0xabc {
		t.Errorf("b's scratchpad 7 after a's PeerSpadWrite: %#x, %v", v, err)
	}
	if _, err := a.SpadRead(128); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("scratchpad 128: %v", err)
	}
	if a.LinkIsUp() || b.LinkIsUp() {
		t.Fatal("link up before either side enabled it")
	}
	a.LinkEnable()
	if a.LinkIsUp() || b.LinkIsUp() {
		t.Fatal("link up with one side enabled")
	}
	b.LinkEnable()
	if !a.LinkIsUp() || !b.LinkIsUp() {
		t.Fatal("link down with both sides enabled")
	}
	select {
	case e := <-a.LinkEvents():
		if !e.Up {
			t.Errorf("event %+v", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no link event")
	}
	b.LinkDisable()
	if a.LinkIsUp() || b.LinkIsUp() {
		t.Fatal("link up after one side disabled it")
	}
	b.LinkEnable()
	// A peer whose shared region reads all ones (gone) is down.
	peer := s.Partition(1).Bytes()
	shm.U64(peer, len(peer)-64<<10).Store(^uint64(0))
	if a.LinkIsUp() {
		t.Error("link up with the peer's region all ones")
	}
	// Close takes the peer's view of this side away.
	shm.U64(peer, len(peer)-64<<10).Store(0x1_45CC0001)
	if !a.LinkIsUp() {
		t.Fatal("link not back up")
	}
	b.Close()
	if a.LinkIsUp() {
		t.Error("link up after the peer closed")
	}
	if v := s.Peek(stCtrl(0)+stLUT, 8); v != 0 {
		t.Errorf("the peer's closed shared window is still in this side's LUT: %#x", v)
	}
}

func TestSwitchtecModelTranslation(t *testing.T) {
	s := newSwitchtecModel(t, chipmodel.SwitchtecConfig{})
	a, b := swPair(t, s, HWConfig{Link: -1})
	if aa, sa, sm, err := b.MWGetAlign(0); err != nil || aa != 4096 || sa != 4096 || sm != 1<<20 {
		t.Fatalf("MWGetAlign(0) = %#x %#x %#x %v", aa, sa, sm, err)
	}
	if _, _, sm, _ := b.MWGetAlign(1); sm != 1<<20 {
		t.Fatalf("window 1's maximum %#x", sm)
	}
	win, err := a.PeerMW(0)
	if err != nil || len(win) != 1<<20 {
		t.Fatalf("PeerMW(0): %d bytes, %v", len(win), err)
	}
	mem := b.Memory()
	busB := s.Partition(1).BusAddr()
	check := func(what string, off int, wantAt int) {
		t.Helper()
		pat := []byte(what)
		copy(win[off:], pat)
		if wantAt >= 0 && !bytes.Equal(mem[wantAt:wantAt+len(pat)], pat) {
			t.Errorf("%s: not at %#x of the peer's memory", what, wantAt)
		}
		if wantAt < 0 && bytes.Contains(mem, pat) {
			t.Errorf("%s: reached the peer's memory", what)
		}
	}
	check("before any translation", 0, -1)
	if err := b.MWSetTrans(0, 0, 256<<10); err != nil {
		t.Fatal(err)
	}
	// The partition operation left a's BAR 2 entry (in a's control
	// block, which b wrote) translating into b's memory.
	if v := s.Peek(stCtrl(0)+stBarCtl+2*16, 4); v&(1<<4) == 0 {
		t.Errorf("BAR 2 ctl %#x: direct window not enabled", v)
	}
	if v := s.Peek(stCtrl(0)+stBarCtl+2*16+4, 4); v != 18|256<<10 {
		t.Errorf("BAR 2 win_size %#x", v)
	}
	if v := s.Peek(stCtrl(0)+stBarCtl+2*16+8, 8); v != 1|busB {
		t.Errorf("BAR 2 xlate %#x, want %#x", v, 1|busB)
	}
	check("translated at 0", 100, 100)
	check("beyond the size: the sink", 300<<10, -1)
	// The translation moves the window.
	if err := b.MWSetTrans(0, 512<<10, 256<<10); err != nil {
		t.Fatal(err)
	}
	check("moved to 512 KiB", 200, 512<<10+200)
	if err := b.MWSetTrans(1, 1<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
	win1, err := a.PeerMW(1)
	if err != nil || len(win1) != 1<<20 {
		t.Fatalf("PeerMW(1): %d, %v", len(win1), err)
	}
	copy(win1[4096:], "window one")
	if !bytes.Equal(mem[1<<20+4096:][:10], []byte("window one")) {
		t.Error("window 1 did not land at 1 MiB")
	}
	if err := b.MWClearTrans(0); err != nil {
		t.Fatal(err)
	}
	if v := s.Peek(stCtrl(0)+stBarCtl+2*16, 4); v&(1<<4) != 0 || s.Peek(stCtrl(0)+stBarCtl+2*16+8, 8) != 1 {
		t.Errorf("after MWClearTrans: ctl %#x", v)
	}
	check("after MWClearTrans", 64, -1)
	// Refusals, before any partition operation.
	before := s.Peek(stCtrl(0)+stBarCtl+2*16+8, 8)
	for _, c := range []struct {
		what       string
		widx       int
		addr, size uint64
		want       error
	}{
		{"misaligned for its size", 0, 4096, 256 << 10, fabric.ErrInvalid},
		{"not a page multiple", 0, 0, 5000, fabric.ErrInvalid},
		{"above the window", 0, 0, 2 << 20, fabric.ErrBounds},
		{"outside the memory", 1, uint64(len(mem)), 4096, fabric.ErrBounds},
		{"into the shared window", 1, uint64(len(mem)), 64 << 10, fabric.ErrBounds},
		{"no such window", 2, 0, 4096, fabric.ErrInvalid},
	} {
		if err := b.MWSetTrans(c.widx, c.addr, c.size); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, err, c.want)
		}
	}
	if s.Peek(stCtrl(0)+stBarCtl+2*16+8, 8) != before {
		t.Error("a refused MWSetTrans wrote the translation")
	}
}

func TestSwitchtecModelMessages(t *testing.T) {
	s := newSwitchtecModel(t, chipmodel.SwitchtecConfig{})
	a, b := swPair(t, s, HWConfig{Link: -1})
	var _ Messenger = a
	if err := a.PeerMsgWrite(2, 0xfeed); err != nil {
		t.Fatal(err)
	}
	if b.MsgStatus() != 1<<2 || a.MsgStatus() != 0 {
		t.Fatalf("status b %#x, a %#x", b.MsgStatus(), a.MsgStatus())
	}
	if v, err := b.MsgRead(2); err != nil || v != 0xfeed {
		t.Fatalf("MsgRead = %#x, %v", v, err)
	}
	if err := a.PeerMsgWrite(2, 0xbad); !errors.Is(err, ErrMsgBusy) {
		t.Fatalf("a second message into a full register: %v", err)
	}
	if v, _ := b.MsgRead(2); v != 0xfeed {
		t.Fatalf("the full register was overwritten: %#x", v)
	}
	if err := b.MsgClear(1 << 2); err != nil {
		t.Fatal(err)
	}
	if b.MsgStatus() != 0 {
		t.Fatalf("status after MsgClear %#x", b.MsgStatus())
	}
	if err := a.PeerMsgWrite(2, 0x600d); err != nil {
		t.Fatal(err)
	}
	if v, _ := b.MsgRead(2); v != 0x600d {
		t.Fatalf("MsgRead = %#x", v)
	}
	if err := b.PeerMsgWrite(0, 7); err != nil {
		t.Fatal(err)
	}
	if v, _ := a.MsgRead(0); v != 7 || a.MsgStatus() != 1 {
		t.Fatalf("a's message 0: %#x, status %#x", v, a.MsgStatus())
	}
	if err := b.MsgClear(1 << 4); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("MsgClear beyond the registers: %v", err)
	}
	if _, err := b.MsgRead(4); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("MsgRead(4): %v", err)
	}
}

// TestSwitchtecModelTransport runs the transport and the conformance
// suite over two HWDevices on the model.
func TestSwitchtecModelTransport(t *testing.T) {
	cfg := chipmodel.SwitchtecConfig{MemSize: 8 << 20, BAR2: 8 << 20, LUTEntries: 64}
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		s := newSwitchtecModel(t, cfg)
		a, b := swPair(t, s, HWConfig{Link: time.Millisecond})
		// Dial enables the link, as Linux's ntb_transport calls
		// ntb_link_enable.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var ta, tb *Transport
		var ea, eb error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); ta, ea = Dial(ctx, a, Config{}) }()
		go func() { defer wg.Done(); tb, eb = Dial(ctx, b, Config{}) }()
		wg.Wait()
		if ea != nil || eb != nil {
			t.Fatalf("Dial: %v / %v", ea, eb)
		}
		t.Cleanup(func() { ta.Close(); tb.Close() })
		x, err := ta.Endpoint(0)
		if err != nil {
			t.Fatal(err)
		}
		y, err := tb.Endpoint(0)
		if err != nil {
			t.Fatal(err)
		}
		// Each endpoint owns its transport and device, as DialShm's do:
		// closing it takes the link down for the peer.
		x.owner, y.owner = true, true
		return x, y
	})
}

// TestSwitchtecModelBadValues: a switch that reads all ones, partition
// operations that never complete or are refused, and geometry that
// cannot be right give typed errors within the operation timeout, never
// a crash or a hang.
func TestSwitchtecModelBadValues(t *testing.T) {
	const opTimeout = 50 * time.Millisecond
	bound := func(t *testing.T, what string, start time.Time) {
		t.Helper()
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%s took %v", what, d)
		}
	}
	t.Run("AllOnes", func(t *testing.T) {
		s := newSwitchtecModel(t, chipmodel.SwitchtecConfig{})
		s.SetAllOnes(true)
		if _, err := swOpen(t, s, 0, HWConfig{Link: -1, OpTimeout: opTimeout}); !errors.Is(err, fabric.ErrMalformed) {
			t.Errorf("open over all ones: %v", err)
		}
		s.SetAllOnes(false)
		a, b := swPair(t, s, HWConfig{Link: -1, OpTimeout: opTimeout})
		s.SetAllOnes(true)
		if err := b.MWSetTrans(0, 0, 4096); !errors.Is(err, fabric.ErrMalformed) {
			t.Errorf("MWSetTrans with status all ones: %v", err)
		}
		if err := a.PeerMsgWrite(0, 1); !errors.Is(err, fabric.ErrPeerGone) {
			t.Errorf("PeerMsgWrite with routes all ones: %v", err)
		}
		if a.MsgStatus() != 0xf || a.DBRead() != a.DBValidMask() {
			t.Errorf("all ones: message status %#x, doorbells %#x", a.MsgStatus(), a.DBRead())
		}
	})
	t.Run("Hang", func(t *testing.T) {
		s := newSwitchtecModel(t, chipmodel.SwitchtecConfig{})
		s.SetHang(true)
		start := time.Now()
		if _, err := swOpen(t, s, 0, HWConfig{Link: -1, OpTimeout: opTimeout}); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("open with partition operations hung: %v", err)
		}
		bound(t, "open", start)
		s = newSwitchtecModel(t, chipmodel.SwitchtecConfig{})
		_, b := swPair(t, s, HWConfig{Link: -1, OpTimeout: opTimeout})
		s.SetHang(true)
		start = time.Now()
		if err := b.MWSetTrans(0, 0, 4096); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("MWSetTrans with partition operations hung: %v", err)
		}
		bound(t, "MWSetTrans", start)
		start = time.Now()
		b.Close()
		bound(t, "Close", start)
	})
	t.Run("Refused", func(t *testing.T) {
		s := newSwitchtecModel(t, chipmodel.SwitchtecConfig{})
		_, b := swPair(t, s, HWConfig{Link: -1, OpTimeout: opTimeout})
		s.SetRejectConfig(true)
		if err := b.MWSetTrans(0, 0, 4096); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("a refused configure: %v", err)
		}
		if v := s.Peek(stCtrl(0)+stBarCtl+2*16, 4); v&(1<<4) != 0 {
			t.Errorf("a refused window is left enabled: ctl %#x", v)
		}
		s.SetRejectConfig(false)
		if err := b.MWSetTrans(0, 0, 4096); err != nil {
			t.Errorf("after the switch takes configurations again: %v", err)
		}
	})
	t.Run("Geometry", func(t *testing.T) {
		for _, c := range []struct {
			what string
			cfg  chipmodel.SwitchtecConfig
			poke func(s *chipmodel.Switchtec)
			want error
		}{
			{"no LUT entries", chipmodel.SwitchtecConfig{LUTEntries: -1}, nil, fabric.ErrMalformed},
			{"LUTs fill the BAR", chipmodel.SwitchtecConfig{LUTEntries: 32, BAR2: 2 << 20}, nil, fabric.ErrMalformed},
			{"LUT count all ones", chipmodel.SwitchtecConfig{}, func(s *chipmodel.Switchtec) { s.Poke(stCtrl(0)+0x14, 2, 0xffff) }, fabric.ErrMalformed},
			{"window BAR not valid", chipmodel.SwitchtecConfig{}, func(s *chipmodel.Switchtec) { s.Poke(stCtrl(1)+stBarCtl+4*16, 4, 0) }, fabric.ErrNotSupported},
			{"partition id out of range", chipmodel.SwitchtecConfig{}, func(s *chipmodel.Switchtec) { s.Poke(0x10004, 4, 0) }, fabric.ErrNotSupported},
			{"two targets", chipmodel.SwitchtecConfig{}, func(s *chipmodel.Switchtec) { s.Poke(0x10020+4, 4, 0x6) }, fabric.ErrNotSupported},
			{"no requester IDs", chipmodel.SwitchtecConfig{}, func(s *chipmodel.Switchtec) { s.Poke(stCtrl(0)+0x1c, 2, 0) }, fabric.ErrMalformed},
		} {
			s := newSwitchtecModel(t, c.cfg)
			if c.poke != nil {
				c.poke(s)
			}
			if _, err := swOpen(t, s, 0, HWConfig{Link: -1, OpTimeout: opTimeout}); !errors.Is(err, c.want) {
				t.Errorf("%s: %v, want %v", c.what, err, c.want)
			}
		}
	})
}

// FuzzSwitchtecPeerRegs: whatever the peer's side holds where this side
// reads it (its MSG_MAP and inbound message status, its shared window's
// magic, link state and scratchpads), the operations that read it give a
// value or a typed error, never a panic.
func FuzzSwitchtecPeerRegs(f *testing.F) {
	f.Add(uint32(0x07060504), uint8(1), uint64(0x1_45CC0001), uint32(7), uint8(2))
	f.Add(uint32(0xffffffff), uint8(0xff), ^uint64(0), uint32(0xffffffff), uint8(0))
	f.Add(uint32(0), uint8(0), uint64(0), uint32(0), uint8(3))
	s := newSwitchtecModel(f, chipmodel.SwitchtecConfig{})
	a, b := swPair(f, s, HWConfig{Link: -1})
	a.LinkEnable()
	peerShared := s.Partition(1).Bytes()[len(s.Partition(1).Bytes())-64<<10:]
	f.Fuzz(func(t *testing.T, route uint32, status uint8, head uint64, spad uint32, idx uint8) {
		s.Poke(stDB(1)+stMsgMap, 4, uint64(route))
		for i := range uint32(4) {
			s.Poke(stDB(1)+stIMsg+4+8*i, 1, uint64(status))
		}
		shm.U64(peerShared, 0).Store(head)
		shm.U32(peerShared, 0x410+4*int(idx%128)).Store(spad)
		err := a.PeerMsgWrite(int(idx%4), spad)
		if err != nil && !errors.Is(err, ErrMsgBusy) && !errors.Is(err, fabric.ErrPeerGone) {
			t.Fatalf("PeerMsgWrite: %v", err)
		}
		up := a.LinkIsUp()
		if want := uint32(head) == 0x45CC0001 && head>>32 != 0; up != want {
			t.Fatalf("LinkIsUp = %v over %#x", up, head)
		}
		if v, err := a.PeerSpadRead(int(idx % 128)); err != nil || v != spad {
			t.Fatalf("PeerSpadRead = %#x, %v", v, err)
		}
		b.MsgStatus()
		b.MsgClear(0xf)
	})
}
