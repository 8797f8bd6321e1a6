// Package chipmodel is a behavioural model of two-sided non-transparent
// bridges, for tests: the register semantics of each bridge family as
// the vendors' datasheets and Linux's drivers (drivers/ntb/hw) describe
// them, with the two sides joined, so that a driver worked against it
// sees what it would on the chip: a doorbell ring sets the peer's status
// bits, a status register clears on writing ones, a mask holds interrupts
// back, a scratchpad write shows on the other side, a translation write
// moves where the peer's outbound window lands and a limit bounds it, and
// the link comes up only when both sides have enabled it.
//
// The model is written from the documented behaviour with its own
// register offsets as literals. It deliberately does not import package
// ntb/hw: Weft's register maps are what it checks, so a disagreement
// between the two shows as a failing test (and Linux's driver decides
// who is right).
//
// Each Side offers the method sets package ntb needs to stand a
// hardware driver on it, without importing ntb: Load and Store (ntb.RegIO)
// for the register BAR, Memory (ntb.DMAMemory) for the host memory the
// side's inbound windows translate into, Config (an io.ReaderAt) for
// configuration space, and MapWindow for an outbound window BAR: a real
// mapping whose pages are the peer's memory at the peer's current
// translation, remapped in place whenever a translation, limit, base or
// link register changes. Window bytes that the translation and limits do
// not reach are a private sink: stores there are lost, as the chip drops
// them, and never reach the peer's memory.
//
// Registers the model gives no behaviour read back as written (0 after
// reset); write-only ring registers read as 0. Accesses that straddle a
// modelled register or use another width than the chip's are recorded as
// faults (Side.Faults), which tests check are empty.
//
// The model is Linux-only (memfd, MAP_FIXED).
package chipmodel
