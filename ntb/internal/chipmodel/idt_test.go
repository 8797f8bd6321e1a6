//go:build linux

package chipmodel

import "testing"

// The model driven by Linux's register sequences (ntb_hw_idt.c), with the
// offsets written out as literals: the referee for the model itself,
// independent of package ntb's driver.

func newPair(t *testing.T, c IDTConfig) (*IDTSwitch, *IDTPort, *IDTPort) {
	t.Helper()
	c.Ports = []IDTPortConfig{{Port: 0, Partition: 0, ReqID: 0x100}, {Port: 2, Partition: 1, ReqID: 0x200}}
	sw, err := NewIDTSwitch(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sw.Close() })
	return sw, sw.Port(0), sw.Port(2)
}

func gw(p *IDTPort, a, v uint32)          { p.Store(0xff8, 4, uint64(a)); p.Store(0xffc, 4, uint64(v)) }
func gr(p *IDTPort, a uint32) uint32      { p.Store(0xff8, 4, uint64(a)); return uint32(p.Load(0xffc, 4)) }
func rd(p *IDTPort, off uint32) uint32    { return uint32(p.Load(off, 4)) }
func wr(p *IDTPort, off uint32, v uint32) { p.Store(off, 4, uint64(v)) }

func TestIDTModelLinuxSequences(t *testing.T) {
	_, a, b := newPair(t, IDTConfig{BAR4Trans: 1})
	// idt_scan_ports: PCIELCAP's port, SWPORTxSTS's partition and mode,
	// SWPARTxSTS active.
	if rd(b, 0x4c)>>24 != 2 {
		t.Errorf("PCIELCAP port %d", rd(b, 0x4c)>>24)
	}
	if st := gr(a, 0x3e244); st&0x3c0 != 0xc0 || (st>>10)&7 != 1 || st&0x10 == 0 {
		t.Errorf("SWPORT2STS %#x", st)
	}
	if st := gr(a, 0x3e124); st&0x60 != 0x20 {
		t.Errorf("SWPART1STS %#x", st)
	}
	// Doorbells with the global masks open (the reset state): a ring
	// reaches every partition, the ringer too (Linux's "bounce back").
	wr(a, 0x420, 0x1)
	if rd(a, 0x428) != 1 || rd(b, 0x428) != 1 {
		t.Errorf("open masks: INDBELLSTS %#x %#x", rd(a, 0x428), rd(b, 0x428))
	}
	wr(a, 0x428, 1)
	wr(b, 0x428, 1)
	gw(a, 0x3ed80+4*3, ^uint32(1<<1)) // GIDBELLMSK3: only partition 1 receives bit 3
	gw(a, 0x3ed00+4*3, ^uint32(1<<1)) // GODBELLMSK3: only partition 1 may ring it
	wr(a, 0x420, 1<<3)
	if rd(b, 0x428) != 0 {
		t.Errorf("a ring the outbound mask forbids arrived: %#x", rd(b, 0x428))
	}
	wr(b, 0x420, 1<<3)
	if rd(b, 0x428) != 1<<3 || rd(a, 0x428) != 0 {
		t.Errorf("GIDBELLMSK: %#x %#x", rd(a, 0x428), rd(b, 0x428))
	}
	// idt_ntb_peer_msg_write: route, then OUTMSG; the receiver's MSGSTS
	// inbound bit, INMSG and INMSGSRC; a second message into the full
	// register fails and sets the sender's MSGSTS bit.
	gw(a, 0x3ee00+0x20*2, 3|1<<4) // SWP0MSGCTL2: to register 3 of partition 1
	wr(a, 0x438, 0xabcd)
	if rd(b, 0x460) != 1<<19 || rd(b, 0x44c) != 0xabcd || rd(b, 0x45c) != 0 {
		t.Errorf("delivery: MSGSTS %#x INMSG3 %#x SRC %d", rd(b, 0x460), rd(b, 0x44c), rd(b, 0x45c))
	}
	wr(a, 0x438, 0x1111)
	if rd(a, 0x460) != 1<<2 || rd(b, 0x44c) != 0xabcd {
		t.Errorf("full register: sender MSGSTS %#x, INMSG3 %#x", rd(a, 0x460), rd(b, 0x44c))
	}
	wr(b, 0x460, 1<<19)
	wr(a, 0x460, 1<<2)
	if rd(a, 0x460) != 0 || rd(b, 0x460) != 0 {
		t.Error("MSGSTS does not clear on writing ones")
	}
	// idt_ntb_local_link_enable: NTCTL, the mapping table entry by
	// partition, read back through the other function.
	wr(a, 0x400, 2)
	wr(a, 0x4d0, 0)
	wr(a, 0x4d8, 1|uint32(rd(a, 0x4dc))<<1)
	wr(b, 0x4d0, 0)
	if rd(b, 0x4d8) != 1|0x100<<1 {
		t.Errorf("mapping table entry 0 through port 2: %#x", rd(b, 0x4d8))
	}
	// idt_ntb_peer_mw_set_trans (DIR): port 2's BAR 2 into port 0's
	// memory at 64 KiB for 8 KiB.
	mem := a.Memory()
	wr(b, 0x490, rd(b, 0x490)&^0xe000|0<<13)
	wr(b, 0x498, uint32(mem.BusAddr()+0x10000))
	wr(b, 0x49c, uint32((mem.BusAddr()+0x10000)>>32))
	lim := b.BARBus(2) + 0x2000
	wr(b, 0x494, uint32(lim))
	wr(b, 0x4a4, uint32(lim>>32))
	w, _ := b.BAR(2)
	w[0], w[0x1fff], w[0x2000] = 7, 8, 9
	if m := mem.Bytes(); m[0x10000] != 7 || m[0x11fff] != 8 || m[0x12000] == 9 {
		t.Errorf("direct window: %d %d %d", m[0x10000], m[0x11fff], m[0x12000])
	}
	// idt_ntb_peer_mw_clear_trans: limit 0 closes it.
	wr(b, 0x494, 0)
	wr(b, 0x4a4, 0)
	w[0] = 70
	if mem.Bytes()[0x10000] == 70 {
		t.Error("a write through a closed window landed")
	}
	// LUT: entry 5 of BAR 4 into port 0's memory at 1 MiB.
	wr(b, 0x4e0, 5|4<<8)
	wr(b, 0x4e4, uint32(mem.BusAddr()+1<<20))
	wr(b, 0x4e8, uint32((mem.BusAddr()+1<<20)>>32))
	wr(b, 0x4ec, 0|0x80000000)
	w4, _ := b.BAR(4)
	slot := len(w4) / 16
	w4[5*slot] = 11
	w4[4*slot] = 12
	if m := mem.Bytes(); m[1<<20] != 11 || m[1<<20-slot] == 12 {
		t.Errorf("LUT entry 5: %d, entry 4 (invalid) %d", m[1<<20], m[1<<20-slot])
	}
	// Absent: all ones.
	b.SetAbsent(true)
	if rd(b, 0x428) != 0xffffffff || gr(a, 0x1000+0x2000*2+0x470) != 0xffffffff {
		t.Error("an absent function does not read all ones")
	}
}
