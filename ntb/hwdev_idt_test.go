//go:build linux

package ntb

// The generic HWDevice over a behavioural model of an IDT switch
// (ntb/internal/chipmodel): two and four NT ports, each its own
// partition, one HWDevice per NT function. The model is written from the
// chip's documented behaviour with its own offsets; these tests check
// each operation's effect on the other side, and that register values
// no working switch gives are typed errors.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	hwmap "github.com/weft-io/weft/ntb/hw"
	"github.com/weft-io/weft/ntb/internal/chipmodel"
	"github.com/weft-io/weft/ntb/pci"
)

const idt24NT6 = 0x8091 // 89HPES24NT6AG2: NT ports 0, 2, 4, 6, 8, 12

// The model's port is a register BAR and its memory DMA memory.
var (
	_ RegIO     = (*chipmodel.IDTPort)(nil)
	_ DMAMemory = (*chipmodel.IDTMemory)(nil)
)

func idtModel(t testing.TB, ports ...int) *chipmodel.IDTSwitch {
	t.Helper()
	c := chipmodel.IDTConfig{BAR4Trans: 1}
	for i, p := range ports {
		c.Ports = append(c.Ports, chipmodel.IDTPortConfig{Port: p, Partition: i, ReqID: uint16(0x0100 + i)})
	}
	sw, err := chipmodel.NewIDTSwitch(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sw.Close() })
	return sw
}

// idtParts is the PCI function of port's NT function in the model.
func idtParts(t testing.TB, sw *chipmodel.IDTSwitch, port int) hwParts {
	p := sw.Port(port)
	var bars [pci.NumBARs]pci.Resource
	for b := range 6 {
		if s := p.BARSize(b); s != 0 {
			fl := uint64(pci.ResourceMem)
			if b > 0 {
				fl |= pci.ResourceMem64 | pci.ResourcePrefetch
			}
			bars[b] = pci.Resource{Start: p.BARBus(b), End: p.BARBus(b) + s - 1, Flags: fl}
		}
	}
	return hwParts{regs: newAnon(t, 4096), bars: bars, device: idt24NT6, io: p,
		mapBAR: func(bar int) (Mapping, error) {
			b, err := p.BAR(bar)
			if err != nil {
				return nil, err
			}
			return &anonMap{b}, nil
		}}
}

func idtOpenPort(t testing.TB, sw *chipmodel.IDTSwitch, port, peer int) (*HWDevice, error) {
	t.Helper()
	m, err := hwmap.Lookup(0x111d, idt24NT6)
	if err != nil {
		t.Fatal(err)
	}
	d, err := newHWDevice(fmt.Sprintf("idt port %d", port), m, idtParts(t, sw, port),
		HWConfig{Memory: sw.Port(port).Memory(), Link: -1, PeerPort: peer})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { d.Close() })
	return d, nil
}

func idtMust(t testing.TB, sw *chipmodel.IDTSwitch, port, peer int) *HWDevice {
	t.Helper()
	d, err := idtOpenPort(t, sw, port, peer)
	if err != nil {
		t.Fatalf("open port %d: %v", port, err)
	}
	return d
}

// idtDoorbells: a rings b, and only b; a mask holds DBWait back.
func idtDoorbells(t *testing.T, a, b *HWDevice, what string) {
	t.Helper()
	if err := a.PeerDBSet(0x5); err != nil {
		t.Fatal(err)
	}
	if got := b.DBRead(); got != 0x5 {
		t.Errorf("%s: peer's DBRead after ringing 0x5 = %#x", what, got)
	}
	if got := a.DBRead(); got != 0 {
		t.Errorf("%s: the ringer's own DBRead = %#x: the doorbell bounced back", what, got)
	}
	if err := b.DBClear(0x5); err != nil || b.DBRead() != 0 {
		t.Errorf("%s: DBClear: %v, left %#x", what, err, b.DBRead())
	}
	// Masked: the bit latches but does not wake DBWait.
	if err := b.DBSetMask(0x2); err != nil {
		t.Fatal(err)
	}
	a.PeerDBSet(0x2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got, err := b.DBWait(ctx, 0x2); got != 0 || !errors.Is(err, context.Canceled) || b.DBRead() != 0x2 {
		t.Errorf("%s: masked doorbell: DBWait %#x, %v; DBRead %#x", what, got, err, b.DBRead())
	}
	b.DBClearMask(0x2)
	// The bit is set already: DBWait returns at once (the deadline only
	// bounds a broken driver).
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := b.DBWait(ctx, 0x2); got != 0x2 || err != nil {
		t.Errorf("%s: unmasked doorbell: DBWait %#x, %v", what, got, err)
	}
	b.DBClear(0x2)
}

// idtMessages: delivered exactly once, refused while full.
func idtMessages(t *testing.T, a, b *HWDevice, what string) {
	t.Helper()
	if err := a.PeerMsgWrite(0, 0x1234); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if st := b.MsgStatus(); st != 1 {
		t.Errorf("%s: status after one message %#x", what, st)
	}
	if v, err := b.MsgRead(0); v != 0x1234 || err != nil {
		t.Errorf("%s: MsgRead = %#x, %v", what, v, err)
	}
	if err := a.PeerMsgWrite(0, 0x5678); !errors.Is(err, ErrMsgBusy) {
		t.Errorf("%s: a message into a full register: %v, want ErrMsgBusy", what, err)
	}
	if v, _ := b.MsgRead(0); v != 0x1234 {
		t.Errorf("%s: the refused message overwrote the held one: %#x", what, v)
	}
	if err := a.PeerMsgWrite(3, 0x9abc); err != nil {
		t.Errorf("%s: register 3 while 0 is full: %v", what, err)
	}
	if st := b.MsgStatus(); st != 0x9 {
		t.Errorf("%s: status %#x, want registers 0 and 3", what, st)
	}
	if err := b.MsgClear(0x9); err != nil || b.MsgStatus() != 0 {
		t.Errorf("%s: MsgClear: %v, status %#x", what, err, b.MsgStatus())
	}
	if err := a.PeerMsgWrite(0, 0x5678); err != nil {
		t.Errorf("%s: after the clear: %v", what, err)
	}
	if v, _ := b.MsgRead(0); v != 0x5678 || b.MsgStatus() != 1 || a.MsgStatus() != 0 {
		t.Errorf("%s: second message %#x, status %#x, sender's %#x", what, v, b.MsgStatus(), a.MsgStatus())
	}
	b.MsgClear(1)
}

// idtWindows: a's translation makes b's window land in a's memory; a
// new translation moves it; the limit bounds it; clearing closes it.
func idtWindows(t *testing.T, sw *chipmodel.IDTSwitch, a, b *HWDevice, bport int, what string) {
	t.Helper()
	if _, err := b.PeerMW(0); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("%s: PeerMW before any translation: %v", what, err)
	}
	if n := a.MWCount(); n != 13 || b.PeerMWCount() != 13 {
		t.Fatalf("%s: %d inbound windows, %d outbound; want 1 direct + 12 LUT", what, n, b.PeerMWCount())
	}
	if aa, sa, sm, err := a.MWGetAlign(0); aa != 4 || sa != 1 || sm != 1<<20 || err != nil {
		t.Errorf("%s: direct window alignment %#x %#x %#x %v", what, aa, sa, sm, err)
	}
	mem := a.Memory()
	for _, at := range []uint64{0x10000, 0x40000} {
		if err := a.MWSetTrans(0, at, 0x8000); err != nil {
			t.Fatalf("%s: MWSetTrans at %#x: %v", what, at, err)
		}
		w, err := b.PeerMW(0)
		if err != nil || len(w) != 0x8000 {
			t.Fatalf("%s: PeerMW: %d bytes, %v", what, len(w), err)
		}
		copy(w, fmt.Sprintf("landed at %#x", at))
		if want := fmt.Sprintf("landed at %#x", at); string(mem[at:at+uint64(len(want))]) != want {
			t.Errorf("%s: a write through the window did not land at %#x", what, at)
		}
	}
	// The move: a write now lands at the new place only.
	w, _ := b.PeerMW(0)
	w[0x100] = 0x77
	if mem[0x40100] != 0x77 || mem[0x10100] == 0x77 {
		t.Errorf("%s: after the move a write landed at %#x (new) / %#x (old)", what, mem[0x40100], mem[0x10100])
	}
	// Beyond the limit: the BAR's next byte reaches a sink, not memory.
	bar, _ := sw.Port(bport).BAR(2)
	bar[0x8000] = 0xa5
	if mem[0x40000+0x8000] == 0xa5 {
		t.Errorf("%s: a write past the limit reached the memory", what)
	}
	// A lookup-table window: exactly its slot (2 MiB / 16).
	const slot = 2 << 20 / 16
	if err := a.MWSetTrans(1, 0x100000, slot/2); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("%s: LUT window of half a slot: %v", what, err)
	}
	if err := a.MWSetTrans(1, 0x100000, slot); err != nil {
		t.Fatalf("%s: LUT MWSetTrans: %v", what, err)
	}
	w, err := b.PeerMW(1)
	if err != nil || len(w) != slot {
		t.Fatalf("%s: LUT PeerMW: %d, %v", what, len(w), err)
	}
	w[slot-1] = 0x5a
	if mem[0x100000+slot-1] != 0x5a {
		t.Errorf("%s: the LUT window did not land", what)
	}
	if err := a.MWClearTrans(0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.PeerMW(0); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("%s: PeerMW after MWClearTrans: %v", what, err)
	}
	if err := a.MWSetTrans(0, 0, 2<<20); !errors.Is(err, fabric.ErrBounds) {
		t.Errorf("%s: a window beyond its BAR: %v", what, err)
	}
	if err := a.MWSetTrans(0, 3, 4096); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("%s: a translation not 4-byte aligned: %v", what, err)
	}
}

func idtLink(t *testing.T, sw *chipmodel.IDTSwitch, a, b *HWDevice, bport int, what string) {
	t.Helper()
	if a.LinkIsUp() || b.LinkIsUp() {
		t.Fatalf("%s: link up before enable", what)
	}
	if err := a.LinkEnable(); err != nil {
		t.Fatal(err)
	}
	if a.LinkIsUp() || b.LinkIsUp() {
		t.Errorf("%s: link up with one side enabled", what)
	}
	if err := b.LinkEnable(); err != nil {
		t.Fatal(err)
	}
	if !a.LinkIsUp() || !b.LinkIsUp() {
		t.Errorf("%s: link down after both enabled: %v %v", what, a.LinkIsUp(), b.LinkIsUp())
	}
	sw.Port(bport).SetLinkUp(false)
	if a.LinkIsUp() {
		t.Errorf("%s: link up with the peer port's PCIe link down", what)
	}
	sw.Port(bport).SetLinkUp(true)
	if err := b.LinkDisable(); err != nil {
		t.Fatal(err)
	}
	if a.LinkIsUp() || b.LinkIsUp() {
		t.Errorf("%s: link up after one side disabled", what)
	}
	b.LinkEnable()
}

func TestIDTModelPair(t *testing.T) {
	sw := idtModel(t, 0, 2)
	a, b := idtMust(t, sw, 0, 0), idtMust(t, sw, 2, 0)
	if a.DBValidMask() != 0xffff || b.DBValidMask() != 0xffff {
		t.Errorf("two NT partitions share 32 doorbells: masks %#x %#x", a.DBValidMask(), b.DBValidMask())
	}
	if a.SpadCount() != 0 || a.MsgCount() != 4 {
		t.Errorf("IDT: %d scratchpads, %d message registers", a.SpadCount(), a.MsgCount())
	}
	idtDoorbells(t, a, b, "0 to 2")
	idtDoorbells(t, b, a, "2 to 0")
	idtMessages(t, a, b, "0 to 2")
	idtMessages(t, b, a, "2 to 0")
	idtWindows(t, sw, a, b, 2, "0's memory through 2's window")
	idtWindows(t, sw, b, a, 0, "2's memory through 0's window")
	idtLink(t, sw, a, b, 2, "0 and 2")
	if _, err := a.MsgRead(4); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("MsgRead(4): %v", err)
	}
	if err := a.MsgClear(1 << 4); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("MsgClear(1<<4): %v", err)
	}
	if err := a.PeerDBSet(1 << 16); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("PeerDBSet of the peer's share: %v", err)
	}
}

// TestIDTModelFourPorts: four NT functions in one process, as two pairs:
// each pair's doorbells, messages and windows reach its peer only.
func TestIDTModelFourPorts(t *testing.T) {
	sw := idtModel(t, 0, 2, 4, 6)
	d := map[int]*HWDevice{}
	for _, pr := range [][2]int{{0, 2}, {2, 0}, {4, 6}, {6, 4}} {
		d[pr[0]] = idtMust(t, sw, pr[0], pr[1])
	}
	for _, x := range d {
		if x.DBValidMask() != 0xff {
			t.Errorf("four NT partitions: doorbell mask %#x, want 8 bits each", x.DBValidMask())
		}
	}
	for _, pr := range [][2]int{{0, 2}, {2, 0}, {4, 6}, {6, 4}} {
		what := fmt.Sprintf("%d to %d", pr[0], pr[1])
		a, b := d[pr[0]], d[pr[1]]
		idtDoorbells(t, a, b, what)
		for port, o := range d {
			if o.DBRead() != 0 {
				t.Errorf("%s: port %d's doorbells %#x", what, port, o.DBRead())
			}
		}
		idtMessages(t, a, b, what)
		idtWindows(t, sw, a, b, pr[1], what)
	}
	idtLink(t, sw, d[0], d[2], 2, "0 and 2")
	idtLink(t, sw, d[4], d[6], 6, "4 and 6")
}

// TestIDTModelBadRegisters: what an absent, hung or misconfigured switch
// reads back is a typed error at open, and after it a link down or a
// typed error; never a crash.
func TestIDTModelBadRegisters(t *testing.T) {
	type setup func(sw *chipmodel.IDTSwitch)
	sts0, _ := hwmap.IDTSwPortSts(0)
	sts2, _ := hwmap.IDTSwPortSts(2)
	for _, c := range []struct {
		name string
		set  setup
		want error
	}{
		{"own function absent", func(sw *chipmodel.IDTSwitch) { sw.Port(0).SetAbsent(true) }, fabric.ErrMalformed},
		{"peer function absent", func(sw *chipmodel.IDTSwitch) { sw.Port(2).SetAbsent(true) }, fabric.ErrMalformed},
		{"own port status all ones", func(sw *chipmodel.IDTSwitch) { sw.OverrideGlobal(sts0, 0xffffffff) }, fabric.ErrMalformed},
		{"peer port status all ones", func(sw *chipmodel.IDTSwitch) { sw.OverrideGlobal(sts2, 0xffffffff) }, fabric.ErrMalformed},
		{"own port not NT", func(sw *chipmodel.IDTSwitch) { sw.OverrideGlobal(sts0, 1<<6) }, fabric.ErrMalformed},
		{"peer in our partition", func(sw *chipmodel.IDTSwitch) { sw.OverrideGlobal(sts2, 3<<6|0x10) }, fabric.ErrMalformed},
		{"no peer", func(sw *chipmodel.IDTSwitch) { sw.OverrideGlobal(sts2, 0) }, fabric.ErrNotSupported},
		{"port number not an NT port", func(sw *chipmodel.IDTSwitch) { sw.Port(0).Override(0x04c, 1<<24) }, fabric.ErrMalformed},
		{"BAR 0 not the registers", func(sw *chipmodel.IDTSwitch) { sw.Port(0).Override(0x470, 0x80000000|20<<4) }, fabric.ErrInvalid},
		{"BAR 2 of 2^5 bytes", func(sw *chipmodel.IDTSwitch) { sw.Port(0).Override(0x490, 0x80000004|5<<4) }, fabric.ErrMalformed},
		{"32-bit BAR 2 of 2^40", func(sw *chipmodel.IDTSwitch) { sw.Port(0).Override(0x490, 0x80000000|40<<4) }, fabric.ErrMalformed},
		{"unknown translation mode", func(sw *chipmodel.IDTSwitch) { sw.Port(0).Override(0x490, 0x80000004|20<<4|3<<11) }, fabric.ErrMalformed},
		{"64-bit BAR 5", func(sw *chipmodel.IDTSwitch) {
			sw.Port(0).Override(0x4b0, 0)
			sw.Port(0).Override(0x4c0, 0x80000004|20<<4)
		}, fabric.ErrMalformed},
		{"peer's lookup table in BAR 1", func(sw *chipmodel.IDTSwitch) { sw.Port(2).Override(0x480, 0x80000000|20<<4|1<<11) }, fabric.ErrMalformed},
		{"BAR 2 bigger than the OS sized it", func(sw *chipmodel.IDTSwitch) { sw.Port(0).Override(0x490, 0x80000004|21<<4) }, fabric.ErrInvalid},
	} {
		t.Run(c.name, func(t *testing.T) {
			sw := idtModel(t, 0, 2)
			c.set(sw)
			if _, err := idtOpenPort(t, sw, 0, 0); !errors.Is(err, c.want) {
				t.Errorf("open: %v, want %v", err, c.want)
			}
		})
	}

	// After open: the peer goes away, then this function.
	sw := idtModel(t, 0, 2)
	a, b := idtMust(t, sw, 0, 0), idtMust(t, sw, 2, 0)
	a.LinkEnable()
	b.LinkEnable()
	if !a.LinkIsUp() {
		t.Fatal("link down")
	}
	sw.Port(2).SetAbsent(true)
	if a.LinkIsUp() {
		t.Error("link up with the peer reading all ones")
	}
	if err := a.MWSetTrans(0, 0, 4096); !errors.Is(err, fabric.ErrMalformed) {
		t.Errorf("MWSetTrans into an absent peer: %v", err)
	}
	if err := a.PeerMsgWrite(0, 1); !errors.Is(err, ErrMsgBusy) {
		t.Errorf("a message to an absent peer: %v, want not delivered (ErrMsgBusy)", err)
	}
	sw.Port(0).SetAbsent(true)
	if a.LinkIsUp() || a.MsgStatus() != 0 {
		t.Errorf("own function absent: link %v, message status %#x", a.LinkIsUp(), a.MsgStatus())
	}
	if err := a.PeerMsgWrite(0, 1); !errors.Is(err, fabric.ErrMalformed) {
		t.Errorf("PeerMsgWrite on an absent function: %v", err)
	}
	if _, err := a.PeerMW(0); !errors.Is(err, fabric.ErrMalformed) {
		t.Errorf("PeerMW on an absent function: %v", err)
	}
}

// TestIDTModelLUT24: a 24-entry lookup table gives 24 windows of a 32nd
// of the BAR each; the last one lands too.
func TestIDTModelLUT24(t *testing.T) {
	sw, err := chipmodel.NewIDTSwitch(chipmodel.IDTConfig{BAR4Trans: 2,
		Ports: []chipmodel.IDTPortConfig{{Port: 0, Partition: 0}, {Port: 2, Partition: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sw.Close() })
	a, b := idtMust(t, sw, 0, 0), idtMust(t, sw, 2, 0)
	if a.MWCount() != 25 || b.PeerMWCount() != 25 {
		t.Fatalf("windows %d/%d, want 1 direct + 24", a.MWCount(), b.PeerMWCount())
	}
	const slot = 2 << 20 / 32
	if _, _, sm, _ := a.MWGetAlign(24); sm != slot {
		t.Errorf("LUT24 window of %#x bytes, want %#x", sm, slot)
	}
	if err := a.MWSetTrans(24, 3*slot, slot); err != nil {
		t.Fatal(err)
	}
	w, err := b.PeerMW(24)
	if err != nil || len(w) != slot {
		t.Fatalf("PeerMW(24): %d, %v", len(w), err)
	}
	w[0], w[slot-1] = 1, 2
	if m := a.Memory(); m[3*slot] != 1 || m[4*slot-1] != 2 {
		t.Error("the last LUT24 window did not land")
	}
	if _, _, _, err := a.MWGetAlign(25); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("window 25: %v", err)
	}
}

// TestIDTModelMessagesOnce: a sender retrying on ErrMsgBusy and a
// receiver taking each message and clearing its status: every message
// arrives exactly once and in order.
func TestIDTModelMessagesOnce(t *testing.T) {
	sw := idtModel(t, 0, 2)
	a, b := idtMust(t, sw, 0, 0), idtMust(t, sw, 2, 0)
	const n = 2000
	deadline := time.Now().Add(30 * time.Second)
	errc := make(chan error, 1)
	go func() {
		for i := uint32(1); i <= n; {
			switch err := a.PeerMsgWrite(1, i); {
			case err == nil:
				i++
			case errors.Is(err, ErrMsgBusy):
				if time.Now().After(deadline) {
					errc <- fmt.Errorf("message %d still refused at the deadline", i)
					return
				}
			default:
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for want := uint32(1); want <= n; {
		if time.Now().After(deadline) {
			t.Fatalf("message %d not received by the deadline", want)
		}
		if b.MsgStatus()&2 == 0 {
			continue
		}
		v, err := b.MsgRead(1)
		if err != nil || v != want {
			t.Fatalf("message %d: read %d, %v", want, v, err)
		}
		b.MsgClear(2)
		want++
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if b.MsgStatus() != 0 {
		t.Errorf("a message beyond the last: status %#x", b.MsgStatus())
	}
}

// TestIDTModelLinkEvents: the link poll reports the link coming up when
// both sides enable it, and going down when one disables it.
func TestIDTModelLinkEvents(t *testing.T) {
	sw := idtModel(t, 0, 2)
	m, _ := hwmap.Lookup(0x111d, idt24NT6)
	a, err := newHWDevice("idt port 0", m, idtParts(t, sw, 0), HWConfig{Memory: sw.Port(0).Memory(), Link: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b := idtMust(t, sw, 2, 0)
	wait := func(up bool) {
		t.Helper()
		timer := time.NewTimer(30 * time.Second)
		defer timer.Stop()
		for {
			select {
			case ev := <-a.LinkEvents():
				if ev.Up == up {
					return
				}
			case <-timer.C:
				t.Fatalf("no link event up=%v", up)
			}
		}
	}
	a.LinkEnable()
	b.LinkEnable()
	wait(true)
	if a.PeerIncarnation() != 1 {
		t.Errorf("incarnation %d after the first link up", a.PeerIncarnation())
	}
	b.LinkDisable()
	wait(false)
}
