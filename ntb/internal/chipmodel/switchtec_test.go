//go:build linux

package chipmodel

import "testing"

// swOp performs a partition operation on block id through view p and
// returns the status it ends in (reads bounded).
func swOp(t *testing.T, p *SwitchtecPartition, id int, code uint64) uint64 {
	t.Helper()
	cb := uint32(swCtrl + id*swCtrlSize)
	p.Store(cb+swCOp, 4, code)
	for range 100 {
		st := p.Load(cb+swCStatus, 4)
		if st < swStLocking {
			return st
		}
	}
	t.Fatalf("operation %d on block %d still in progress", code, id)
	return 0
}

func TestSwitchtecModelPartitionOps(t *testing.T) {
	s, err := NewSwitchtec(SwitchtecConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, b := s.Partition(0), s.Partition(1)
	cb := uint32(swCtrl) // partition 0's block
	bar2 := cb + swCBar + 2*16
	// Unlocked, configuration writes are dropped.
	b.Store(bar2+8, 8, 0x1234000)
	if v := s.Peek(bar2+8, 8); v != 0 {
		t.Fatalf("an unlocked write took: %#x", v)
	}
	if st := swOp(t, b, 0, swOpLock); st != swStLocked {
		t.Fatalf("lock: status %d", st)
	}
	// A requester ID, then a 64 KiB direct window at BAR 2's start into
	// partition 1's memory at 128 KiB.
	a.Store(cb+swCReqID, 4, 1)
	b.Store(bar2, 4, swBarDir)
	b.Store(bar2+4, 4, 16|64<<10)
	b.Store(bar2+8, 8, 1|(b.BusAddr()+128<<10))
	if st := swOp(t, b, 0, swOpCfg); st != swStNormal {
		t.Fatalf("configure: status %d, BAR error %#x", st, s.Peek(cb+swCBarErr, 4))
	}
	if v := s.Peek(bar2, 4); v != swBarValid|swBarDir {
		t.Errorf("ctl %#x: VALID is read only", v)
	}
	w, _ := a.MapBAR(2)
	copy(w[10:], "through")
	if string(b.Bytes()[128<<10+10:][:7]) != "through" {
		t.Fatal("the window does not land at the translation")
	}
	copy(w[64<<10:], "sink")
	if string(b.Bytes()[192<<10:][:4]) == "sink" {
		t.Fatal("beyond the window's size a write landed")
	}
	// A bad configuration is refused and left locked; reset restores.
	swOp(t, b, 0, swOpLock)
	b.Store(bar2+4, 4, 16|(4<<20)) // larger than the BAR
	if st := swOp(t, b, 0, swOpCfg); st != swStLocked || s.Peek(cb+swCBarErr, 4) != 1<<2 {
		t.Fatalf("a window beyond the BAR: status %d, BAR error %#x", st, s.Peek(cb+swCBarErr, 4))
	}
	if st := swOp(t, b, 0, swOpReset); st != swStNormal || s.Peek(bar2+4, 4) != 16|64<<10 {
		t.Fatalf("reset: status %d, win_size %#x", st, s.Peek(bar2+4, 4))
	}
	// Hung: the status stays in progress.
	s.SetHang(true)
	b.Store(cb+swCOp, 4, swOpLock)
	for range 10 {
		if st := b.Load(cb+swCStatus, 4); st != swStLocking {
			t.Fatalf("hung lock: status %d", st)
		}
	}
	s.SetHang(false)
	s.SetAllOnes(true)
	if v := a.Load(swInfoID, 1); v != 0xff {
		t.Errorf("all ones: %#x", v)
	}
}

func TestSwitchtecModelDoorbellsMessages(t *testing.T) {
	s, err := NewSwitchtec(SwitchtecConfig{IDs: [2]int{3, 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, b := s.Partition(0), s.Partition(1) // partitions 3 and 1
	da, db := a.dbBlock(), b.dbBlock()
	a.Store(da+swDODB, 8, 0xff)
	if s.Doorbells() != 0 {
		t.Fatal("ODB_MASK 0 let a doorbell through")
	}
	a.Store(da+swDODBMask, 8, 0x0f)
	a.Store(da+swDODB, 8, 0xff)
	if b.Load(db+swDIDB, 8) != 0x0f || a.Load(da+swDIDB, 8) != 0x0f {
		t.Fatalf("doorbells %#x", s.Doorbells())
	}
	b.Store(db+swDIDB, 8, 0x3)
	if s.Doorbells() != 0x0c {
		t.Fatalf("write one to clear: %#x", s.Doorbells())
	}
	if b.DoorbellIRQ() {
		t.Fatal("interrupt with IDB_MASK 0")
	}
	b.Store(db+swDIDBMask, 8, 0x4)
	if !b.DoorbellIRQ() {
		t.Fatal("no interrupt for an enabled doorbell")
	}
	// b routes its inbound register 1 from a's outbound 2.
	b.Store(db+swDMsgMap, 4, uint64(2|3<<2)<<8)
	a.Store(da+swDOMsg+8*2, 4, 0xabcd)
	if v := b.Load(db+swDIMsg+8, 8); v != 0xabcd|1<<32|3<<48 {
		t.Fatalf("imsg 1 = %#x", v)
	}
	a.Store(da+swDOMsg+8*2, 4, 0x1111)
	if v := b.Load(db+swDIMsg+8, 4); v != 0xabcd || a.Load(da+swDOMsg+8*2+4, 4) != 1 {
		t.Fatalf("a full register was overwritten: %#x", v)
	}
	b.Store(db+swDIMsg+8+4, 1, 1)
	if b.Load(db+swDIMsg+8+4, 1) != 0 {
		t.Fatal("status not cleared")
	}
}
