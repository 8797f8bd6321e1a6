//go:build linux

package chipmodel

// AMD's Zeppelin NTB, as Linux's drivers/ntb/hw/amd/ntb_hw_amd.h and .c
// describe it. Both sides (the primary and the secondary) have the same
// register block at 0x200-0x4bf of BAR 0; each sees the other's block in
// a mirror 0x400 up (peer_mmio = self_mmio + 0x400), so [0x600, 0x8c0)
// of a side's BAR is the peer's [0x200, 0x4c0).
//
//   - SIDEINFO (0x408): bit 0 is set on the secondary side (read only);
//     bit 1 is the side's "ready" bit its driver sets. There is no
//     chip-level link in the model: a side's driver sees the link up when
//     the peer's ready bit (read through the mirror) is set.
//   - DBREQ (0x454) rings: the bits written are set in the peer's DBSTAT;
//     DBSTAT (0x460) clears on writing ones; DBMASK (0x45c) masks.
//   - SPAD (0x210, 16 registers) is one set of scratchpads shared by the
//     two sides, which split it in halves by side (Linux: the primary
//     uses 0-7, the secondary 8-15, each reaching the other's half).
//   - Windows: BAR1, BAR2(/3), BAR4(/5). A side's outbound window lands
//     in the peer's memory at this side's own BARnXLAT, for BARnLMT bytes
//     (a limit of 0: none reach): the peer writes both through its mirror
//     (amd_ntb_mw_set_trans writes peer_mmio).
//   - CNTL (0x200) holds the register-access enables (bits 20, 21),
//     stored and without other effect in the model.
func amdSpec() *spec {
	rs := []reg{
		{name: "SIDEINFO", off: 0x408, width: 4, effects: true, store: func(s *Side, v uint64) {
			s.put(0x408, 4, v&^1|uint64(s.idx)) // bit 0 is the chip's
		}},
		{name: "DBREQ", off: 0x454, width: 2, load: readZero, store: func(s *Side, v uint64) {
			p := s.Peer()
			p.put(0x460, 2, p.get(0x460, 2)|v)
		}},
		{name: "DBMASK", off: 0x45c, width: 2},
		{name: "DBSTAT", off: 0x460, width: 2, store: w1c(0x460, 2)},
		{name: "BAR1LMT", off: 0x414, width: 4, effects: true},
		{name: "BAR23LMT", off: 0x418, width: 8, effects: true},
		{name: "BAR45LMT", off: 0x420, width: 8, effects: true},
		{name: "BAR1XLAT", off: 0x430, width: 8, effects: true},
		{name: "BAR23XLAT", off: 0x438, width: 8, effects: true},
		{name: "BAR45XLAT", off: 0x440, width: 8, effects: true},
	}
	rs = append(rs, arrayRegs("SPAD", 0x210, 4, 16, 4, func(i int) reg {
		return reg{load: func(s *Side) uint64 { return uint64(s.c.shared[i]) },
			store: func(s *Side, v uint64) { s.c.shared[i] = uint32(v) }}
	})...)
	return &spec{
		regBAR:  4 << 10,
		winBARs: []int{1, 2, 4},
		regs:    rs,
		mirror:  [2]uint32{0x600, 0x8c0},
		reset: func(s *Side) {
			s.put(0x408, 4, uint64(s.idx))
			s.put(0x45c, 2, 0xffff)
		},
		route: func(src *Side, bar int) (uint64, uint64) {
			switch bar {
			case 1:
				return src.get(0x430, 8), src.get(0x414, 4)
			case 2:
				return src.get(0x438, 8), src.get(0x418, 8)
			default:
				return src.get(0x440, 8), src.get(0x420, 8)
			}
		},
	}
}

func amdReady(s *Side) bool { return s.get(0x408, 4)&2 != 0 }
